"""The ``bmq`` command line (also ``python -m bmq``).

Subcommands: ``broker`` (run the embedded broker), ``post``, ``consume``, ``bench`` and ``admin``
(admin commands: ``bmq admin --broker ADDR CLUSTERS LIST``, or a helper flag such as
``--queue-stats URI``). The user guide is docs/cli.md.

``post``, ``consume`` and ``admin`` connect to ``--broker ADDR`` (post and consume take it
several times for a session that fails over between them), else to the address in the
environment variable ``BMQ_BROKER_URI``, else to ``tcp://localhost:30114``, as
``bmq.Session()`` and the official SDK do: messages posted go to a broker that keeps them.
``--embedded`` starts a temporary embedded broker for the one command instead (whatever it
holds is gone when the command ends). ``bench`` is self-contained: without ``--broker`` it
measures through an embedded broker in a child process, and its first line says which broker
it uses.

Errors are one line on stderr and exit code 2 for bad input or an unreachable broker (1 for
other failures, 130 after Ctrl-C), unless ``--debug`` asks for the traceback.

``--tls-ca FILE [--tls-cert FILE --tls-key FILE]`` connects with TLS (a TLS terminator in front
of the broker, or the embedded broker's ``--tls-cert``). ``--auth MECHANISM`` authenticates with
a broker that requires it; the secret comes from the
environment variable ``BMQ_AUTH_DATA`` (for BASIC: ``user:password``), never from the command
line, where other users of the machine could read it.

``bmq --version`` prints the installed version (``bmq.__version__``).
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import wait
from typing import (IO, TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, Union,
                    cast)

if TYPE_CHECKING:  # pragma: no cover
    import bmq

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

DEFAULT_URI = "bmq://bmq.test.mem.priority/bmq-cli"
AUTH_DATA_VARIABLE = "BMQ_AUTH_DATA"
BROKER_VARIABLE = "BMQ_BROKER_URI"  # the official SDK's
DEFAULT_BROKER = "tcp://localhost:30114"  # bmq.Session()'s and the official SDK's
EXIT_INTERRUPTED = 130  # a shell's code for a command ended by SIGINT
EXIT_BROKEN_PIPE = 141  # ... and by SIGPIPE (the reader of its output went away)
EMBEDDED_HELP = ("start a temporary embedded broker in this process for this one command (what it holds is "
                 "gone when the command ends)")
_PROPERTY_TYPES = ("bool", "char", "short", "int32", "int64", "string", "binary")


class CommandError(Exception):
    """A user error detected by the CLI itself (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error style: one line on stderr, exit code 2."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, minimum: float, inclusive: bool) -> Callable[[str], float]:
    bound = f">= {minimum}" if inclusive else f"> {minimum}"

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{text} must be {bound}")
        return value

    convert.__name__ = kind.__name__  # what argparse names in "invalid <name> value"
    return convert


_positive_int = _number(int, 0, inclusive=False)
_positive_float = _number(float, 0, inclusive=False)
_non_negative_float = _number(float, 0, inclusive=True)


class Progress:
    """A one-line live progress bar on a terminal; silent when the stream is not a TTY."""

    def __init__(self, label: str, total: int, stream: IO[str] = sys.stderr):
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = total > 0 and hasattr(stream, "isatty") and stream.isatty()
        self.done = 0
        self.start = time.monotonic()
        self._last_draw = 0.0
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            if not self.enabled:
                return
            now = time.monotonic()
            if now - self._last_draw < 0.1 and self.done < self.total:
                return
            self._last_draw = now
            elapsed = max(now - self.start, 1e-9)
            rate = self.done / elapsed
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                              f"{self.done}/{self.total} {rate:,.0f} msg/s ETA {eta:4.0f}s ")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def broker_choice(args: argparse.Namespace) -> Tuple[Optional[List[str]], str]:
    """Where a client command connects, and how that was chosen (for messages): ``--broker``,
    else ``$BMQ_BROKER_URI``, else ``tcp://localhost:30114``; None with ``--embedded``."""
    if getattr(args, "embedded", False):
        return None, "--embedded"
    given = args.broker
    if given:
        return ([given] if isinstance(given, str) else list(given)), "--broker"
    from_environment = os.environ.get(BROKER_VARIABLE, "").strip()
    if from_environment:
        return [from_environment], f"${BROKER_VARIABLE}"
    return [DEFAULT_BROKER], f"the default: no --broker, ${BROKER_VARIABLE} unset; --embedded starts a temporary broker"


@contextlib.contextmanager
def chosen_broker(args: argparse.Namespace) -> Iterator[Union[str, Sequence[str]]]:
    """The address (or addresses) a client command connects to, per :func:`broker_choice`; with
    ``--embedded``, an embedded broker's, running in this process for the block. How the
    address was chosen goes to ``args.broker_source``, for :func:`main`'s error message."""
    from .broker import broker_address

    addresses, args.broker_source = broker_choice(args)
    if addresses is None:
        with broker_address(None) as address:
            yield address
    else:
        yield addresses[0] if len(addresses) == 1 else addresses


def session_options(args: argparse.Namespace) -> "bmq.SessionOptions":
    """The SessionOptions of a client command: a credential with ``--auth`` (its data read
    from ``BMQ_AUTH_DATA`` at each connect, so a rotated secret is picked up), and TLS with
    ``--tls-ca`` (plus ``--tls-cert``/``--tls-key`` for a client certificate)."""
    import bmq

    options: Dict[str, Any] = {}
    tls_ca, tls_cert, tls_key = (getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))
    if tls_ca or tls_cert or tls_key:
        if not tls_ca:
            raise CommandError("--tls-cert and --tls-key need --tls-ca (the CA that signed the broker's certificate)")
        try:
            options["tls"] = bmq.tls_context(tls_ca, cert_file=tls_cert, key_file=tls_key)
        except bmq.InvalidArgumentError as exc:
            raise CommandError(str(exc)) from None
    mechanism = getattr(args, "auth", None)
    if mechanism:
        if mechanism.upper() != "ANONYMOUS" and AUTH_DATA_VARIABLE not in os.environ:
            raise CommandError(f"--auth {mechanism} needs its secret in the environment variable "
                               f"{AUTH_DATA_VARIABLE} (e.g. user:password for BASIC); it is never taken from the "
                               f"command line")

        def credential() -> Tuple[str, str]:
            return mechanism, os.environ.get(AUTH_DATA_VARIABLE, "")

        options["credential"] = credential
    connect_timeout = getattr(args, "connect_timeout", None)
    if connect_timeout is not None:
        options["connect_timeout"] = connect_timeout
    return bmq.SessionOptions(**options)


def parse_property(text: str) -> Tuple[str, object, str]:
    """``name=value`` (a string) or ``name:type=value`` with type one of bool, char, short,
    int32, int64, string, binary (binary values in hex, with or without ``0x``: ``00ff10``,
    ``0x00FF10``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise CommandError(f"--property {text!r}: expected name=value or name:type=value")
    name, _, type_name = key.partition(":")
    type_name = type_name.lower() or "string"
    if type_name not in _PROPERTY_TYPES:
        raise CommandError(f"--property {text!r}: unknown type {type_name!r} (one of {', '.join(_PROPERTY_TYPES)})")
    try:
        if type_name == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            value: object = raw.lower() in ("true", "1")
        elif type_name in ("short", "int32", "int64"):
            value = int(raw, 0)
        elif type_name == "char":
            value = raw.encode("latin-1")
        elif type_name == "binary":
            digits = raw[2:] if raw[:2].lower() == "0x" else raw
            try:
                value = bytes.fromhex(digits)
            except ValueError:
                raise ValueError("binary values are hex digits, with or without 0x (e.g. 0x00ff10)") from None
        else:
            value = raw
    except ValueError as exc:
        raise CommandError(f"--property {text!r}: {exc}") from None
    return name, value, type_name.upper()


def _properties(args: argparse.Namespace) -> Tuple[Optional[dict], Optional[dict]]:
    import bmq

    if not args.property:
        return None, None
    values: Dict[str, object] = {}
    types: Dict[str, object] = {}
    for text in args.property:
        name, value, type_name = parse_property(text)
        values[name] = value
        types[name] = getattr(bmq.PropertyType, type_name)
    return values, types


def _payloads(args: argparse.Namespace) -> Tuple[List[bytes], int]:
    """The distinct payloads to post and how many messages in total."""
    if args.stdin:
        lines = [line.rstrip(b"\n") for line in sys.stdin.buffer]
        payloads = [line for line in lines if line]
        if not payloads:
            raise CommandError("--stdin: no non-empty lines to post")
        return payloads, len(payloads) if args.count is None else args.count
    if args.file:
        try:
            with open(args.file, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise CommandError(f"--file: {exc.strerror}: {args.file}") from None
        if not data:
            raise CommandError(f"--file: {args.file} is empty (BlazingMQ refuses empty payloads)")
        return [data], 1 if args.count is None else args.count
    count = 1 if args.count is None else args.count
    return [(b"%010d" % i).ljust(args.size, b".")[: args.size] for i in range(min(count, 1000))], count


def cmd_post(args: argparse.Namespace) -> int:
    import bmq

    payloads, count = _payloads(args)
    properties, property_types = _properties(args)
    statuses: Dict[str, int] = {}
    acked_bytes = [0]  # one cell shared by the posting threads, under ``lock``
    lock = threading.Lock()
    progress = Progress("post", count)
    per_thread_rate = args.rate / args.threads if args.rate else None
    errors: List[BaseException] = []
    interrupted = threading.Event()  # Ctrl-C: the posting threads post no more

    def worker(index: int, share: int, queue) -> None:
        start = time.monotonic()
        sent = 0
        try:
            while sent < share and not interrupted.is_set():
                n = min(args.batch, share - sent)
                if per_thread_rate:
                    n = min(n, max(1, int(per_thread_rate / 10)))
                    delay = start + sent / per_thread_rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # pacing the send rate, not synchronisation
                batch = [payloads[(index + (sent + i) * args.threads) % len(payloads)] for i in range(n)]
                futures = queue.post_many_async(batch, properties=properties, property_types=property_types,
                                                compression=args.compression)
                wait(futures, timeout=args.timeout)
                with lock:
                    for future, payload in zip(futures, batch):
                        name = future.result().status.name if future.done() else "TIMEOUT"
                        statuses[name] = statuses.get(name, 0) + 1
                        if name == "SUCCESS":
                            acked_bytes[0] += len(payload)
                progress.advance(n)
                sent += n
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with chosen_broker(args) as address, bmq.Session(broker=address, options=session_options(args)) as session:
        queue = session.open_queue(args.uri, write=True)
        shares = [count // args.threads + (1 if i < count % args.threads else 0) for i in range(args.threads)]
        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i, share, queue), name=f"bmq-cli-post-{i}", daemon=True)
                   for i, share in enumerate(shares)]
        for thread in threads:
            thread.start()
        figures = None  # the queue's statistics when interrupted
        try:
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:
            interrupted.set()
            # The broker's answers so far; leaving the block stops the session, which fails
            # (locally) the posts still waiting for theirs.
            figures = session.stats().queues.get(queue.uri)
        elapsed = max(time.monotonic() - started, 1e-9)
        final_stats = session.stats() if args.stats else None
    progress.close()
    if interrupted.is_set():
        acked_so_far = figures.acked.get("SUCCESS", 0) if figures is not None else 0
        unanswered = figures.in_flight if figures is not None else 0
        print(f"bmq post: interrupted: {acked_so_far} of {count} messages acknowledged by the broker"
              + (f", {unanswered} posted without an answer yet (the broker may have stored them)" if unanswered else ""),
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if final_stats is not None:
        print(final_stats.table(), file=sys.stderr)
    if errors:
        raise errors[0]
    acked = statuses.pop("SUCCESS", 0)
    failed = sum(statuses.values())
    print(f"posted {count} to {args.uri}: {acked} acked, {failed} failed"
          + (f" {statuses}" if failed else "")
          + f", {acked / elapsed:,.0f} msg/s, {acked_bytes[0] / elapsed / 1e6:.2f} MB/s")
    return EXIT_OK if failed == 0 else EXIT_FAILURE


def _jsonable(value: object) -> object:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def message_record(msg) -> dict:
    """A consumed message as one JSON-serialisable dict (bytes as base64)."""
    try:
        data: object = msg.data.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        data, encoding = _jsonable(msg.data), "base64"
    props = msg.properties
    types = getattr(msg, "property_types", None) or {}
    return {"guid": msg.guid.hex().upper(), "queue": msg.queue_uri, "data": data, "encoding": encoding,
            "properties": {k: _jsonable(v) for k, v in props.items()},
            "property_types": {k: getattr(t, "name", str(t)) for k, t in types.items()}}


def cmd_consume(args: argparse.Namespace) -> int:
    import bmq

    out = sys.stdout.buffer
    received = 0
    pending: list = []
    progress = Progress("consume", args.count or 0)
    raw = args.output == "raw"
    with chosen_broker(args) as address, bmq.Session(broker=address, options=session_options(args)) as session:
        # Raw payloads are written back to back, so they are taken in batches: one write and
        # one confirm per batch, no object per message.
        queue = session.open_queue(args.uri, read=True, batches=raw, options=bmq.QueueOptions(
            max_unconfirmed_messages=args.max_unconfirmed))
        if raw:
            while args.count is None or received < args.count:
                left = args.max_unconfirmed if args.count is None else args.count - received
                batch = queue.get_batch(left, timeout=args.timeout)
                if batch is None:
                    break
                received += len(batch)
                out.write(batch.payloads)
                if not args.no_confirm:
                    out.flush()  # confirmed once written out: a closed pipe leaves them in the queue
                    batch.confirm()
                progress.advance(len(batch))
        else:
            while args.count is None or received < args.count:
                msg = queue.get(timeout=args.timeout)
                if msg is None:
                    break
                received += 1
                out.write(json.dumps(message_record(msg), separators=(",", ":")).encode() + b"\n")
                if not args.no_confirm:
                    pending.append(msg)
                    if len(pending) >= 256:
                        out.flush()  # as above
                        session.confirm_many(pending)
                        pending = []
                progress.advance()
        out.flush()
        if pending:
            session.confirm_many(pending)
        final_stats = session.stats() if args.stats else None
    progress.close()
    if final_stats is not None:
        print(final_stats.table(), file=sys.stderr)
    if args.count is not None and received < args.count:
        print(f"bmq consume: received {received} of {args.count} messages before a {args.timeout}s silence",
              file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _format_row(result) -> str:
    lat = result.latency_us
    return (f"{result.client:<10} {result.acked:>9,} {result.received:>9,} {result.post_msgs_per_s:>12,.0f} "
            f"{result.e2e_msgs_per_s:>12,.0f} {result.e2e_mb_per_s:>8.1f} "
            + " ".join(f"{lat.get(k, float('nan')):>9.0f}" for k in ("p50", "p90", "p99", "p99.9")))


def cmd_bench(args: argparse.Namespace) -> int:
    from . import _bench
    from .broker import broker_address

    try:
        _bench.make_payload(args.size)  # validates --size before anything starts
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.plot:
        _pyplot()  # not a whole run to learn at the end that matplotlib is missing
    results = []
    # A broker in this process would share the GIL with the client being measured.
    with broker_address(args.broker, separate_process=True) as address:
        # First, on stdout with the results: which broker the numbers are about.
        where = (f"broker {', '.join(args.broker)} (--broker)" if args.broker else
                 f"a temporary embedded broker at {address} (a child process; --broker ADDR measures another)")
        print(f"bmq bench: via {where}", flush=True)
        print(f"bmq bench: {args.count:,} messages of {args.size} B, {args.producers} producer(s), "
              f"{args.consumers} consumer(s)", file=sys.stderr)
        progress = Progress("bmq      ", args.count)
        final_stats: Optional[List[Any]] = [] if args.stats else None
        results.append(_bench.run_bmq(address, args.uri, size=args.size, count=args.count,
                                      producers=args.producers, consumers=args.consumers,
                                      batch=args.batch, timeout=args.timeout, progress=progress.advance,
                                      options=session_options(args), final_stats=final_stats))
        progress.close()
        for stats in final_stats or ():
            print(stats.table(), file=sys.stderr)
        if args.official:
            try:
                import blazingmq  # noqa: F401
            except ImportError:
                print("bmq bench: --official skipped: the blazingmq package is not installed "
                      "(pip install 'bmq[bench]')", file=sys.stderr)
            else:
                progress = Progress("blazingmq", args.count)
                # The official SDK takes one address: the first.
                first = address if isinstance(address, str) else address[0]
                results.append(_bench.run_official(first, args.uri + "-official", size=args.size,
                                                   count=args.count, producers=args.producers,
                                                   consumers=args.consumers, timeout=args.timeout,
                                                   progress=progress.advance))
                progress.close()
    print(f"{'client':<10} {'acked':>9} {'received':>9} {'post msg/s':>12} {'e2e msg/s':>12} {'MB/s':>8} "
          f"{'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'p99.9 us':>9}")
    for result in results:
        print(_format_row(result))
    if len(results) == 2 and results[1].e2e_msgs_per_s:
        print(f"bmq / blazingmq end-to-end throughput: {results[0].e2e_msgs_per_s / results[1].e2e_msgs_per_s:.2f}x")
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": _machine(), "broker": where,
              "results": [r.as_dict() for r in results]}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    if args.plot:
        _plot(results, args.plot)
    ok = all(r.received == r.messages and r.nacked == 0 for r in results)
    return EXIT_OK if ok else EXIT_FAILURE


def _machine() -> dict:
    import platform

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files.

    Raises:
        CommandError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommandError("--plot needs matplotlib: pip install 'bmq[bench]'") from None
    return plt


def _plot(results, path: str) -> None:
    fig, (hist, line) = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        hist.hist(result.latencies_sample_us, bins=100, alpha=0.6, label=result.client)
        line.plot([i * 0.1 for i in range(len(result.timeline))], result.timeline, label=result.client)
    hist.set(title="end-to-end latency", xlabel="microseconds", ylabel="messages", xscale="linear")
    line.set(title="throughput", xlabel="seconds", ylabel="messages/s")
    hist.legend()
    line.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _admin_record(value: Any) -> Any:
    """A helper's result as JSON-serialisable data (dataclasses without their raw answer)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _admin_record(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "raw"}
    if isinstance(value, (list, tuple)):
        return [_admin_record(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _admin_record(v) for k, v in value.items()}
    return value


def _admin_text(args: argparse.Namespace, result: Any) -> List[str]:
    """A helper's result as lines for people."""
    if args.queue_stats:
        lines = [f"{result.uri}: {result.messages} messages, {result.bytes} bytes, partition {result.partition_id}"]
        lines += [f"  {app.app_id}: {app.messages} messages, {app.consumers} consumers" for app in result.apps.values()]
        return lines
    if args.purge:
        return [f"purged {result.messages} messages ({result.bytes} bytes) from {result.uri}"
                + (f" for appId {result.app_id}" if result.app_id else "")]
    if args.cluster_status is not None:
        where = f"proxy using {result.active_node}" if result.is_proxy else f"node {result.self_node}"
        lines = [f"cluster {result.name} as seen by {where}: "
                 + (f"leader {result.leader} ({result.leader_status}), " if not result.is_proxy else "")
                 + ("healthy" if result.healthy else "NOT healthy")]
        for node in result.nodes:
            primary = f", primary of {', '.join(map(str, node.primary_for))}" if node.primary_for else ""
            lines.append(f"  {node.name} [{node.node_id}] {node.status}{primary}")
        lines += [f"  partition {p.partition_id}: primary {p.primary or '-'} ({p.primary_status})"
                  for p in result.partitions]
        return lines
    return [str(item) for item in result]  # --domains, --queues: names


def cmd_admin(args: argparse.Namespace) -> int:
    import bmq

    helpers = [args.domains, args.queues is not None, bool(args.queue_stats), bool(args.purge),
               args.cluster_status is not None]
    if sum(helpers) + bool(args.words) != 1:
        raise CommandError("give either an admin command (e.g. bmq admin HELP) or one of --domains, --queues, "
                           "--queue-stats, --purge, --cluster-status")
    options = session_options(args)
    with chosen_broker(args) as address, bmq.Admin(cast(str, address), credential=options.credential, tls=options.tls,
                                                    timeout=args.connect_timeout or args.timeout) as admin:
        admin.timeout = args.timeout  # for each answer
        if args.words:
            command = " ".join(args.words)
            if args.json and args.words[0].upper() != "ENCODING":
                command = f"ENCODING JSON_PRETTY {command}"
            print(admin.command(command).rstrip("\n"))
            return EXIT_OK
        result: Any
        if args.domains:
            result = admin.domains()
        elif args.queues is not None:
            result = admin.queues(args.queues or None)
        elif args.queue_stats:
            result = admin.queue_stats(args.queue_stats)
        elif args.purge:
            result = admin.purge(args.purge)
        else:
            result = admin.cluster_status(args.cluster_status or None)
    if args.json:
        print(json.dumps(_admin_record(result), indent=2))
    else:
        for line in _admin_text(args, result):
            print(line)
    return EXIT_OK


def cmd_broker(args: argparse.Namespace) -> int:
    from .broker import cli as broker_cli

    return broker_cli.run(args)


def connection_arguments(command: argparse.ArgumentParser) -> None:
    """The options every command that connects to a broker takes: ``--auth`` and TLS (read by
    :func:`session_options`)."""
    command.add_argument("--auth", metavar="MECHANISM",
                         help=f"authenticate with MECHANISM (e.g. BASIC); the secret is read from ${AUTH_DATA_VARIABLE}")
    command.add_argument("--tls-ca", metavar="FILE",
                         help="connect with TLS, verifying the broker's certificate against this CA file (PEM)")
    command.add_argument("--tls-cert", metavar="FILE", help="with --tls-ca: a client certificate (PEM)")
    command.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    command.add_argument("--connect-timeout", type=_positive_float, metavar="SECONDS",
                         help="seconds to connect and negotiate with each broker address (default 30; "
                              "admin: its --timeout)")
    command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    import bmq

    parser = _Parser(prog="bmq", description="BlazingMQ from Python: post, consume, "
                                     "benchmark, or run an embedded broker.")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG and show tracebacks")
    parser.add_argument("--version", action="version", version=f"bmq {bmq.__version__}",
                        help="print bmq's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def client_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=help_text)
        where = command.add_mutually_exclusive_group()
        if name == "bench":
            where.add_argument("--broker", metavar="ADDR", action="append",
                               help="measure through this broker, e.g. tcp://localhost:30114 (default: a temporary "
                                    "embedded broker in a child process)")
        else:
            where.add_argument("--broker", metavar="ADDR", action="append",
                               help=f"broker address; give it several times to fail over between them, in that "
                                    f"order (default: ${BROKER_VARIABLE}, else {DEFAULT_BROKER})")
            where.add_argument("--embedded", action="store_true", help=EMBEDDED_HELP)
        connection_arguments(command)
        command.add_argument("--stats", action="store_true",
                             help="print the final statistics of every bmq session on stderr")
        return command

    from .broker import cli as broker_cli

    broker = sub.add_parser("broker", help="run the embedded BlazingMQ broker until Ctrl-C")
    broker.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    broker_cli.add_arguments(broker)
    broker.set_defaults(func=cmd_broker)

    post = client_command("post", "post messages to a queue and wait for every ACK")
    post.add_argument("uri", help="queue URI, e.g. bmq://bmq.test.mem.priority/orders")
    post.add_argument("--count", type=_positive_int, help="messages to post (default 1, or one per --stdin line)")
    source = post.add_mutually_exclusive_group()
    source.add_argument("--size", type=_positive_int, default=100, help="payload size in bytes (default 100)")
    source.add_argument("--file", help="post this file's content")
    source.add_argument("--stdin", action="store_true", help="post each line of standard input")
    post.add_argument("--property", action="append", metavar="NAME[:TYPE]=VALUE",
                      help=f"message property; TYPE one of {', '.join(_PROPERTY_TYPES)} (default string); "
                           f"binary values in hex, with or without 0x (e.g. blob:binary=0x00ff10)")
    post.add_argument("--compression", choices=["none", "zlib"], default="none")
    post.add_argument("--rate", type=_positive_float, help="messages per second in total (default: as fast as possible)")
    post.add_argument("--threads", type=_positive_int, default=1, help="posting threads (default 1)")
    post.add_argument("--batch", type=_positive_int, default=1000, help=argparse.SUPPRESS)
    post.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds to wait for ACKs of a batch")
    post.set_defaults(func=cmd_post)

    consume = client_command("consume", "print messages from a queue (JSON lines) and confirm them")
    consume.add_argument("uri", help="queue URI; fan-out consumers add ?id=APPID")
    consume.add_argument("--count", type=_positive_int, help="stop after this many messages")
    consume.add_argument("--timeout", type=_non_negative_float, default=5.0,
                         help="stop after this many seconds without a message (default 5)")
    consume.add_argument("--no-confirm", action="store_true", help="do not confirm (the broker will redeliver)")
    consume.add_argument("--output", choices=["jsonl", "raw"], default="jsonl",
                         help="jsonl: one JSON object per message (default); raw: the payload bytes exactly, "
                              "back to back (e.g. --count 1 to save one message as a file)")
    consume.add_argument("--max-unconfirmed", type=_positive_int, default=1000, help=argparse.SUPPRESS)
    consume.set_defaults(func=cmd_consume)

    bench = client_command("bench", "measure producer→broker→consumer throughput and latency")
    bench.add_argument("--uri", default=DEFAULT_URI, help=f"queue to use (default {DEFAULT_URI})")
    bench.add_argument("--size", type=_positive_int, default=100, help="payload bytes (default 100, minimum 8)")
    bench.add_argument("--count", type=_positive_int, default=100_000, help="messages (default 100000)")
    bench.add_argument("--producers", type=_positive_int, default=1)
    bench.add_argument("--consumers", type=_positive_int, default=1)
    bench.add_argument("--batch", type=_positive_int, default=1000, help="messages per post_many call (default 1000)")
    bench.add_argument("--timeout", type=_positive_float, default=120.0, help=argparse.SUPPRESS)
    bench.add_argument("--official", action="store_true",
                       help="also run the official blazingmq SDK on the same broker, side by side")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    bench.add_argument("--plot", metavar="PNG", help="draw latency histogram and throughput timeline (matplotlib)")
    bench.set_defaults(func=cmd_bench)

    admin_help = "send an admin command to a broker (e.g. bmq admin CLUSTERS LIST), or ask it with a helper flag"
    admin = sub.add_parser("admin", help=admin_help, description=admin_help + ". The words of COMMAND are joined "
                           "into one command; bmq admin HELP lists the broker's commands.")
    admin.add_argument("words", nargs="*", metavar="COMMAND", help="the admin command, e.g. STAT SHOW")
    where = admin.add_mutually_exclusive_group()
    where.add_argument("--broker", metavar="ADDR",
                       help=f"broker address (default: ${BROKER_VARIABLE}, else {DEFAULT_BROKER})")
    where.add_argument("--embedded", action="store_true", help=EMBEDDED_HELP)
    connection_arguments(admin)
    admin.add_argument("--json", action="store_true",
                       help="JSON output: pretty JSON from the broker for a COMMAND, the result of a helper as JSON")
    admin.add_argument("--timeout", type=_positive_float, default=10.0,
                       help="seconds to wait for the answer, and to connect unless --connect-timeout (default 10)")
    helpers = admin.add_mutually_exclusive_group()
    helpers.add_argument("--domains", action="store_true", help="list the domains the broker has loaded")
    helpers.add_argument("--queues", nargs="?", const="", metavar="DOMAIN",
                         help="list the active queues (of DOMAIN, or of every domain)")
    helpers.add_argument("--queue-stats", metavar="URI", help="messages and consumers the broker holds for a queue")
    helpers.add_argument("--purge", metavar="URI",
                         help="drop every message of a queue (URI?id=APPID: of one appId)")
    helpers.add_argument("--cluster-status", nargs="?", const="", metavar="CLUSTER",
                         help="leader, primaries and nodes of a cluster (default: the broker's first)")
    admin.set_defaults(func=cmd_admin)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CommandError) else f"{type(exc).__name__}: {text}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``bmq`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "broker":
        logging.getLogger("bmq.broker").setLevel(logging.INFO)
    if getattr(args, "compression", None) == "none":
        args.compression = None
    try:
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe found by the final flush is handled below, not at exit
        return status
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (``bmq admin ... | head``): stop quietly, as a
        # command killed by SIGPIPE would; stdout goes to /dev/null so that the interpreter's
        # final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if args.debug:
            raise
        import bmq

        text = _one_line(exc)
        source = getattr(args, "broker_source", "--broker")
        if source != "--broker" and isinstance(exc, (bmq.ConnectionError, bmq.TimeoutError)) \
                and not isinstance(exc, bmq.ClosedByBroker):
            text += f" (broker address from {source})"
        print(f"bmq {args.command}: error: {text}", file=sys.stderr)
        usage = (CommandError, bmq.InvalidURIError, bmq.ConnectionError, bmq.TimeoutError, ValueError)
        return EXIT_USAGE if isinstance(exc, usage) else EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
