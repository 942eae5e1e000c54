"""``bmq broker``: run the embedded broker in the foreground until Ctrl-C.

The lead's ``bmq/cli.py`` mounts this with :func:`add_arguments` and :func:`run`;
``python -m bmq.broker`` runs it stand-alone.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import time
from typing import Callable, Iterator, List, Optional, Set

from .._tls import server_context as tls_server_context
from ..exceptions import InvalidArgumentError
from ._server import Broker

__all__ = ["add_arguments", "run", "main"]

DEFAULT_PORT = 30114  # the port bmqbrkr and the SDKs use by default
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOP_POLL = 0.2  # where the stop signals cannot be blocked and waited for (see _stop_signals)


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
    with _stop_signals() as wait_for_stop:
        try:
            broker.start()
        except OSError as exc:
            logging.getLogger(__name__).error("cannot listen on %s:%d: %s", args.host, args.port, exc)
            return 1
        try:
            print(f"bmq broker listening on {broker.address}{' with TLS' if tls else ''} (Ctrl-C to stop)",
                  flush=True)
            wait_for_stop()
        finally:
            broker.stop()
    return 0


@contextlib.contextmanager
def _stop_signals() -> Iterator[Callable[[], None]]:
    """Take the stop signals (SIGINT, SIGTERM) from here on; yield a function that waits for
    the first. A second one while stopping is taken too. Handlers and mask restored on exit.

    Where the system has them (POSIX), the signals are blocked in every thread (the broker's
    inherit the mask) and taken by sigwait() in this one: nothing is lost whenever they arrive.
    A Python handler was not enough: one landing just before the main thread's wait began (a
    SIGTERM right after the banner, 1 time in 10 on 3.14) left it waiting, and one that set an
    Event could deadlock. Elsewhere (Windows) the handler records the signal and the main
    thread looks every _STOP_POLL seconds. An explicit handler meanwhile either way: a shell
    starts background jobs with SIGINT ignored.
    """
    taken: List[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: taken.append(signum)) for sig in _STOP_SIGNALS}
    blocking = hasattr(signal, "pthread_sigmask")
    before: Set[int] = set()
    if blocking:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # type: ignore[assignment]

    def wait_for_stop() -> None:
        if blocking:
            signal.sigwait(_STOP_SIGNALS)
            return
        while not taken:
            time.sleep(_STOP_POLL)

    try:
        yield wait_for_stop
    finally:
        if blocking:
            # A second Ctrl-C while stopping: taken here, not raised once unblocked (sigpending
            # and sigwait rather than sigtimedwait, which macOS lacks).
            while set(_STOP_SIGNALS) & signal.sigpending():
                signal.sigwait(_STOP_SIGNALS)
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Optional[List[str]] = None) -> int:
    """Stand-alone entry point (``python -m bmq.broker``)."""
    parser = argparse.ArgumentParser(prog="bmq broker", description="Run the embedded BlazingMQ broker.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
