"""``bmq broker``: run the embedded broker in the foreground until Ctrl-C.

The lead's ``bmq/cli.py`` mounts this with :func:`add_arguments` and :func:`run`;
``python -m bmq.broker`` runs it stand-alone.
"""
from __future__ import annotations

import argparse
import logging
import signal
import time
from typing import Any, Callable, Dict, List, Optional

from .._tls import server_context as tls_server_context
from ..exceptions import InvalidArgumentError
from ._server import Broker

__all__ = ["add_arguments", "run", "main"]

DEFAULT_PORT = 30114  # the port bmqbrkr and the SDKs use by default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bmq broker`` options to ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default: %(default)s; 0 = any free port)")
    parser.add_argument("--heartbeat-interval-ms", type=int, default=3000, help="heartbeat period (default: %(default)s)")
    parser.add_argument("--max-missed-heartbeats", type=int, default=10, help="drop a client after this many (default: %(default)s)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM; default: in that file)")
    parser.add_argument("--tls-client-ca", metavar="FILE",
                        help="require client certificates that chain to these CAs (PEM)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every frame (DEBUG)")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; one log line per connect/disconnect and queue open/close.

    Returns:
        The process exit code.
    """
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    tls = None
    if args.tls_cert:
        try:
            tls = tls_server_context(args.tls_cert, args.tls_key, client_ca_file=args.tls_client_ca)
        except InvalidArgumentError as exc:
            logging.getLogger(__name__).error("%s", exc)
            return 2
    elif args.tls_key or args.tls_client_ca:
        logging.getLogger(__name__).error("--tls-key and --tls-client-ca need --tls-cert")
        return 2
    broker = Broker(
        args.host,
        args.port,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_missed_heartbeats=args.max_missed_heartbeats,
        tls=tls,
    )
    try:
        broker.start()
    except OSError as exc:
        logging.getLogger(__name__).error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    previous: Dict[int, Any] = {}
    try:
        # Explicit handlers (a shell starts background jobs with SIGINT ignored, and an inherited
        # "ignore" would make Ctrl-C / kill -INT do nothing), installed before the banner that
        # tells a script the broker is up. They raise rather than set an Event: a handler runs in
        # the main thread between two bytecodes, and Event.set() there, while the main thread was
        # inside Event.wait() holding the event's lock, deadlocked: the broker never stopped
        # (seen once in CI, a SIGINT sent right after start-up).
        handler = _stop_once()
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        print(f"bmq broker listening on {broker.address}{' with TLS' if tls else ''} (Ctrl-C to stop)", flush=True)
        while True:
            time.sleep(3600)
    except (_Stop, KeyboardInterrupt):  # KeyboardInterrupt: Ctrl-C before the handlers were in
        pass
    finally:
        broker.stop()
        for signum, previous_handler in previous.items():
            signal.signal(signum, previous_handler)
    return 0


class _Stop(Exception):
    """SIGINT or SIGTERM arrived: stop serving."""


def _stop_once() -> Callable[[int, Any], None]:
    """A signal handler that raises :class:`_Stop` the first time only: a second Ctrl-C while the
    broker stops (bounded by its timeouts) cannot cut that short."""
    raised: List[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not raised:
            raised.append(signum)
            raise _Stop(signal.Signals(signum).name)

    return handler


def main(argv: Optional[List[str]] = None) -> int:
    """Stand-alone entry point (``python -m bmq.broker``)."""
    parser = argparse.ArgumentParser(prog="bmq broker", description="Run the embedded BlazingMQ broker.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
