"""End-to-end speed of bmq against the official ``blazingmq`` SDK, pattern by pattern: the same
pattern on each side, the same broker, the same run.

Patterns (100-byte messages, each on a fresh queue, both clients back to back):

* ``post_many``: N messages as fast as the client allows, timed until the last ACK (bmq:
  blocking ``post_many`` of 1,000; official: it has no batch call, so ``post`` with ``on_ack``
  for every message, then wait for the last ACK: its fastest way to post).
* ``post``: blocking ``post()`` from one thread (official: ``post`` + wait for its ACK), with
  post->ACK latency percentiles; and its floor, the same on a bare socket (one thread writes a
  PUT and polls the socket for its ACK, no client library): no client can do better than the
  broker's round trip, so ``post_floor_ratio_vs_official`` bounds every client's ratio.
* ``post_8_threads``: blocking ``post()`` from 8 threads at once on one session.
* ``post_async_window``: ``post_async`` keeping a window of 100 posts in flight (official: ``post``
  with ``on_ack`` and the same window).
* ``consume_get_confirm``: per message ``get()`` + ``confirm()`` (official: it has no pull API, so
  its ``on_message`` hands each message to the consuming thread through a ``queue.Queue`` and
  that thread confirms it).
* ``consume_on_message_confirm``: per message ``on_message`` + ``confirm()`` on the callback thread.
* ``consume_batch``: ``messages()`` + ``confirm_many`` (bmq only: the official SDK has no batch
  confirm, so no ratio).
* ``consume_get_batch``: ``get_batch()`` + ``MessageBatch.confirm()`` on a queue opened with
  ``batches=True`` (bmq only): no Python object per message.

Consumers drain a queue filled beforehand (by bmq); the clock runs from opening the reader to
the last confirm. Each figure has the client's CPU seconds per message (this process) and the
broker's (its process), so that where the time goes is visible.

Usage: ``python benchmarks/e2e.py [--bmqbrkr | --cluster | --broker ADDR] [--tls] [--patterns p1,p2]
[--repeat N] [--json FILE]``; ``--tls`` measures each bmq pattern over TLS beside plaintext on the
same path instead of against the official SDK (see :func:`run_tls`);
with ``--repeat N`` every figure is the median of N runs, the two clients alternating, and each
pattern's ratio of every run (bmq over the official SDK run right after it) is reported too.
By default the embedded broker runs in its own process; ``--bmqbrkr`` starts the real broker
from ``../shared/bmqbrkr``; ``--cluster`` starts three bmqbrkr nodes and a proxy (``run-cluster``)
and goes through the proxy to the persistent domain, as production deployments do (every ACK
waits for the primary's replication; the broker CPU column is all four brokers'). Each pattern gets a freshly started broker:
bmqbrkr keeps every PUT's GUID for its 300 s de-duplication window and every message until its
TTL, and after the earlier patterns' million messages its CPU per PUT in ``post_async_window``
was 5.5-5.7 us instead of 2.8-3.3 (both clients slower, bmq 35%, the official SDK 20%): a
pattern's figures would depend on what ran before it. Goals (issue 11, against bmqbrkr): every
pattern >= 2x the official SDK; blocking post p50 and p99 <= 0.5x.
"""
from __future__ import annotations

import functools
import itertools
import queue as stdqueue
import ssl
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import bmq
from _report import (HAVE_OFFICIAL, BrokerProcess, ClusterProcess, RealBrokerProcess, add_broker_options,
                     broker_starter, drain_batches, drain_in_batches, emit, fill_queue, make_parser, measure, medians)

if HAVE_OFFICIAL:  # else the comparison is refused in main()
    import blazingmq

PAYLOAD = b"x" * 100
BATCH = 1000
WINDOW = 100
THREADS = 8
CONSUME_WINDOW = 1000
_names = itertools.count()


#: The domain of every queue; ``--cluster`` switches to a persistent one (a multi-node cluster
#: serves no in-memory priority domain).
DOMAIN = "bmq.test.mem.priority"


def fresh_uri(tag: str) -> str:
    return f"bmq://{DOMAIN}/e2e-{tag}-{next(_names)}-{time.monotonic_ns() % 10**9}"


#: Session options by broker address: ``--tls`` registers its TLS addresses' (a client context).
SESSION_OPTIONS: Dict[str, "bmq.SessionOptions"] = {}


def _session(address: str) -> bmq.Session:
    return bmq.Session(address, SESSION_OPTIONS.get(address))


def percentiles(samples: List[float]) -> Dict[str, float]:
    """p50 / p90 / p99 in microseconds of latency samples in seconds."""
    ordered = sorted(samples)
    if not ordered:
        return {}
    return {f"p{q}_us": ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1e6 for q in (50, 90, 99)}


# ---- bmq --------------------------------------------------------------------------------
def bmq_post_many(address: str, count: int) -> Dict[str, float]:
    with _session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-many"), write=True)
        for offset in range(0, count, BATCH):
            queue.post_many([PAYLOAD] * min(BATCH, count - offset))  # raises unless all SUCCESS
    return {}


def bmq_post(address: str, count: int) -> Dict[str, float]:
    latencies = []
    with _session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-one"), write=True)
        for _ in range(count):
            t0 = time.perf_counter()
            queue.post(PAYLOAD)
            latencies.append(time.perf_counter() - t0)
    return percentiles(latencies)


def floor_post(address: str, count: int, pause: float = 0.0) -> Dict[str, float]:
    """The physical limit of blocking posts: one thread writes a PUT and reads its ACK on a
    bare socket (opened by bmq's test client; then no threads, no pending table, no futures),
    polling the socket without ever sleeping (sleeping until the ACK comes took about twice
    as long: the thread's wake-up is a large part of a round trip on this machine). No client
    can post one message at a time faster than the broker answers this.

    ``pause``: seconds of busy work between an ACK and the next PUT, as any caller has (see
    :data:`FLOOR_PAUSE`); latencies are the round trips alone."""
    from bmq import _codec
    from bmq.broker._rawclient import RawClient  # the broker's test client, not bmq's API

    latencies = []
    options = SESSION_OPTIONS.get(address)
    # SessionOptions holds its TLS as a client context (it turns True into the default one).
    tls = options.tls if options and isinstance(options.tls, ssl.SSLContext) else None
    with RawClient(int(address.rsplit(":", 1)[1]), tls=tls) as client:
        uri = fresh_uri("floor-one")
        client.open(uri, 1, write=True)
        sock = client.sock
        sock.setblocking(False)  # a 100-byte PUT always fits the socket's buffer
        frames = _codec.FrameReader()
        buffer = bytearray(1 << 16)
        view = memoryview(buffer)
        for _ in range(count):
            t0 = time.perf_counter()
            client.put(1, (PAYLOAD,))
            deadline = t0 + client.timeout
            acks: List[Any] = []
            while not acks:
                try:
                    size = sock.recv_into(buffer)
                except (BlockingIOError, ssl.SSLWantReadError):  # (a TLS socket: no whole record yet)
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"bare socket post: no ACK within {client.timeout:g} s") from None
                    continue
                if not size:
                    raise RuntimeError("bare socket post: the broker closed the connection")
                for event in frames.feed(view[:size]):
                    if _codec.unpack_event_header(event)[1] == _codec.EVENT_ACK:
                        acks += _codec.iter_acks(event)
            done = time.perf_counter()
            latencies.append(done - t0)
            if acks[0][0] != 0:
                raise RuntimeError(f"bare socket post: ACK status {acks[0][0]}")
            while time.perf_counter() - done < pause:
                pass
        sock.setblocking(True)
    return percentiles(latencies)


def bmq_post_threads(address: str, count: int) -> Dict[str, float]:
    with _session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-threads"), write=True)
        _in_threads(lambda: queue.post(PAYLOAD), count)
    return {}


def bmq_post_async_window(address: str, count: int) -> Dict[str, float]:
    with _session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-window"), write=True)
        window: "stdqueue.SimpleQueue" = stdqueue.SimpleQueue()
        for i in range(count):
            if i >= WINDOW:
                window.get().result(30)
            window.put(queue.post_async(PAYLOAD))
        while not window.empty():
            window.get().result(30)
    return {}


def bmq_consume_get_confirm(address: str, uri: str, count: int) -> None:
    with _session(address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        for received in range(count):
            message = queue.get(timeout=30.0)
            if message is None:
                raise RuntimeError(f"bmq consumer stalled at {received}/{count}")
            message.confirm()


def bmq_consume_on_message(address: str, uri: str, count: int) -> None:
    done = threading.Event()
    received = itertools.count(1)

    def on_message(message: bmq.Message) -> None:
        message.confirm()
        if next(received) == count:
            done.set()

    with _session(address) as session:
        session.open_queue(uri, read=True, on_message=on_message,
                           options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        if not done.wait(120):
            raise RuntimeError("bmq on_message consumer stalled")


def bmq_consume_batch(address: str, uri: str, count: int) -> None:
    with _session(address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        drain_in_batches(session, queue, count, 500)


def bmq_consume_get_batch(address: str, uri: str, count: int) -> None:
    with _session(address) as session:
        queue = session.open_queue(uri, read=True, batches=True,
                                   options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        drain_batches(queue, count, CONSUME_WINDOW)


def _in_threads(post: Callable[[], Any], count: int, threads_count: int = THREADS) -> None:
    """``post()`` ``count`` times in all from ``threads_count`` threads at once; the first error
    of any thread is raised once all have ended."""
    errors: List[BaseException] = []

    def run(n: int) -> None:
        try:
            for _ in range(n):
                post()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(count // threads_count,)) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


# ---- the official SDK -------------------------------------------------------------------
def official_session(address: str, on_message: Any = None) -> Any:
    return blazingmq.Session(lambda event: None, on_message=on_message, broker=address)


def _official_writer(address: str, tag: str) -> Tuple[Any, str]:
    session = official_session(address)
    uri = fresh_uri(tag)
    session.open_queue(uri, write=True)
    return session, uri


def _check(ack: Any) -> None:
    if ack.status != blazingmq.AckStatus.SUCCESS:
        raise RuntimeError(f"official SDK: NACK {ack.status}")


def official_post_many(address: str, count: int) -> Dict[str, float]:
    session, uri = _official_writer(address, "official-many")
    try:
        left = [count]
        done = threading.Event()
        lock = threading.Lock()

        def on_ack(ack: Any) -> None:
            _check(ack)
            with lock:
                left[0] -= 1
                if not left[0]:
                    done.set()

        for _ in range(count):
            session.post(uri, PAYLOAD, on_ack=on_ack)
        if not done.wait(120):
            raise RuntimeError("official SDK: ACKs missing")
    finally:
        session.stop()
    return {}


def _official_blocking_post(session: Any, uri: str) -> None:
    acked = threading.Event()
    result: List[Any] = []

    def on_ack(ack: Any) -> None:
        result.append(ack)
        acked.set()

    session.post(uri, PAYLOAD, on_ack=on_ack)
    if not acked.wait(30):
        raise RuntimeError("official SDK: ACK missing")
    _check(result[0])


def official_post(address: str, count: int) -> Dict[str, float]:
    session, uri = _official_writer(address, "official-one")
    latencies = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            _official_blocking_post(session, uri)
            latencies.append(time.perf_counter() - t0)
    finally:
        session.stop()
    return percentiles(latencies)


def official_post_threads(address: str, count: int) -> Dict[str, float]:
    session, uri = _official_writer(address, "official-threads")
    try:
        _in_threads(lambda: _official_blocking_post(session, uri), count)
    finally:
        session.stop()
    return {}


def official_post_async_window(address: str, count: int) -> Dict[str, float]:
    session, uri = _official_writer(address, "official-window")
    room = threading.Semaphore(WINDOW)

    def on_ack(ack: Any) -> None:
        _check(ack)
        room.release()

    try:
        for _ in range(count):
            if not room.acquire(timeout=30):
                raise RuntimeError("official SDK: ACKs missing")
            session.post(uri, PAYLOAD, on_ack=on_ack)
        for _ in range(WINDOW):
            if not room.acquire(timeout=30):
                raise RuntimeError("official SDK: ACKs missing")
    finally:
        session.stop()
    return {}


def official_consume_get_confirm(address: str, uri: str, count: int) -> None:
    handoff: "stdqueue.SimpleQueue" = stdqueue.SimpleQueue()
    session = official_session(address, lambda message, handle: handoff.put(message))
    try:
        session.open_queue(uri, read=True, options=blazingmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        for received in range(count):
            try:
                message = handoff.get(timeout=30.0)
            except stdqueue.Empty:
                raise RuntimeError(f"official consumer stalled at {received}/{count}") from None
            session.confirm(message)
    finally:
        session.stop()


def official_consume_on_message(address: str, uri: str, count: int) -> None:
    done = threading.Event()
    received = itertools.count(1)

    def on_message(message: Any, handle: Any) -> None:
        handle.confirm()
        if next(received) == count:
            done.set()

    session = official_session(address, on_message)
    try:
        session.open_queue(uri, read=True, options=blazingmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        if not done.wait(120):
            raise RuntimeError("official on_message consumer stalled")
    finally:
        session.stop()


# ---- measuring --------------------------------------------------------------------------
#: A posting pattern: (broker address, messages) -> its extra figures (latency percentiles).
Producer = Callable[[str, int], Dict[str, float]]
#: A consuming pattern: (broker address, URI of a filled queue, messages).
Consumer = Callable[[str, str, int], None]

#: Pattern -> (bmq's, the official SDK's, the option giving its message count).
PRODUCE: Dict[str, Tuple[Producer, Producer, str]] = {
    "post_many": (bmq_post_many, official_post_many, "messages"),
    "post": (bmq_post, official_post, "posts"),
    "post_8_threads": (bmq_post_threads, official_post_threads, "posts"),
    "post_async_window": (bmq_post_async_window, official_post_async_window, "messages"),
}
# Patterns with a physical limit measured in the same run (see floor_post).
FLOOR: Dict[str, Producer] = {"post": floor_post}
#: The floor again, its thread busy this long between an ACK and the next PUT: the least a
#: caller does between posts (bmq's own post takes about 20 us of Python there). Where an idle
#: CPU halts at once (see _report.idle_regime), the broker's CPU halts in such a pause and its
#: wake-up lengthens every round trip: on the 2-vCPU development VM, 5 us of pause took a bare
#: TLS socket through stunnel from 80 to 111 us per round trip. This row shows how much of a
#: client's distance to the floor is that, not the client's own work.
FLOOR_PAUSE = 5e-6
FLOOR_PAUSED: Dict[str, Producer] = {"post": functools.partial(floor_post, pause=FLOOR_PAUSE)}
#: Pattern -> (bmq's, the official SDK's or None where it has no such API).
CONSUME: Dict[str, Tuple[Consumer, Optional[Consumer]]] = {
    "consume_get_confirm": (bmq_consume_get_confirm, official_consume_get_confirm),
    "consume_on_message_confirm": (bmq_consume_on_message, official_consume_on_message),
    "consume_batch": (bmq_consume_batch, None),
    "consume_get_batch": (bmq_consume_get_batch, None),
}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = make_parser("bmq vs the official blazingmq SDK, pattern by pattern")
    add_broker_options(parser, cluster=True)
    parser.add_argument("--tls", action="store_true",
                        help="each bmq pattern over TLS beside the same in plaintext (the embedded broker's own TLS, "
                             "or stunnel4 in front of bmqbrkr), and the bare-socket floor of both paths")
    parser.add_argument("--messages", type=int, default=20000, help="messages per throughput pattern")
    parser.add_argument("--posts", type=int, default=4000, help="blocking posts per post pattern")
    parser.add_argument("--patterns", default=",".join([*PRODUCE, *CONSUME]), help="comma-separated patterns")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each pattern this many times, the two clients alternating, and report "
                             "medians (a shared machine's noise exceeds most differences)")
    args = parser.parse_args(argv)
    if not HAVE_OFFICIAL and not args.tls:
        parser.error("the official SDK is needed for the comparison: pip install blazingmq")
    patterns = [p.strip() for p in args.patterns.split(",") if p.strip()]
    unknown = sorted(set(patterns) - set(PRODUCE) - set(CONSUME))
    if unknown:
        parser.error(f"unknown pattern(s) {unknown}; known: {', '.join([*PRODUCE, *CONSUME])}")

    global DOMAIN
    if args.cluster:
        DOMAIN = ClusterProcess.domain
    if args.tls:
        if args.broker or args.cluster:
            parser.error("--tls runs on the embedded broker or with --bmqbrkr")
        return run_tls(args, patterns)

    _, start_broker = broker_starter(args)

    results: Dict[str, Any] = {"payload_bytes": len(PAYLOAD), "messages": args.messages,
                               "posts": args.posts, "repeat": args.repeat}
    rows = []
    for pattern in patterns:
        broker = start_broker()  # a fresh one per pattern (see the module's docstring)
        results["broker"] = broker.name
        try:
            runs: Dict[str, List[Dict[str, float]]] = {}
            for _ in range(args.repeat):
                if pattern in PRODUCE:
                    ours, theirs, size = PRODUCE[pattern]
                    count = getattr(args, size)
                    for name, produce in (("bmq", ours), ("official", theirs), ("floor", FLOOR.get(pattern)),
                                          ("floor_paused", FLOOR_PAUSED.get(pattern))):
                        if produce is None:
                            continue
                        runs.setdefault(name, []).append(
                            measure(broker, functools.partial(produce, broker.address, count), count))
                else:
                    bmq_consume, official_consume = CONSUME[pattern]
                    count = args.messages
                    for name, consume in (("bmq", bmq_consume), ("official", official_consume)):
                        if consume is None:
                            continue
                        uri = fresh_uri(f"{name}-{pattern}")
                        fill_queue(broker.address, uri, count, PAYLOAD, BATCH)
                        runs.setdefault(name, []).append(
                            measure(broker, functools.partial(consume, broker.address, uri, count), count))
            figures = medians(runs)
            for name, values in figures.items():
                results.update({f"{name}_{pattern}_{key}": value for key, value in values.items()})
            official = figures.get("official")
            ratio = figures["bmq"]["msgs_per_s"] / official["msgs_per_s"] if official else None
            if ratio is not None:
                results[f"{pattern}_ratio_vs_official"] = ratio
            rows.append([pattern, figures["bmq"]["msgs_per_s"], official["msgs_per_s"] if official else "-",
                         ratio if ratio is not None else "-",
                         figures["bmq"]["client_cpu_us_per_msg"],
                         official["client_cpu_us_per_msg"] if official else "-",
                         figures["bmq"]["broker_cpu_us_per_msg"]])
            if official and args.repeat > 1:
                # Each repeat ran the two clients back to back: their ratio is spared most of the
                # machine's drift between repeats, and its spread says how firm the median is.
                paired = [ours["msgs_per_s"] / theirs["msgs_per_s"]
                          for ours, theirs in zip(runs["bmq"], runs["official"])]
                results[f"{pattern}_ratio_vs_official_per_run"] = paired
                rows.append([f"  {pattern} ratio per run: min / median / max", "", "",
                             f"{min(paired):.2f} / {statistics.median(paired):.2f} / {max(paired):.2f}", "", "", ""])
            floor = figures.get("floor")
            if floor:
                # What any client could reach at best: the bare socket against the official SDK.
                results[f"{pattern}_ratio_vs_floor"] = figures["bmq"]["msgs_per_s"] / floor["msgs_per_s"]
                if official:
                    results[f"{pattern}_floor_ratio_vs_official"] = floor["msgs_per_s"] / official["msgs_per_s"]
                rows.append([f"  {pattern} floor: bare socket, one thread", floor["msgs_per_s"],
                             official["msgs_per_s"] if official else "-",
                             floor["msgs_per_s"] / official["msgs_per_s"] if official else "-",
                             floor["client_cpu_us_per_msg"], "", floor["broker_cpu_us_per_msg"]])
                paused = figures["floor_paused"]
                results[f"{pattern}_ratio_vs_paused_floor"] = figures["bmq"]["msgs_per_s"] / paused["msgs_per_s"]
                rows.append([f"  {pattern} floor pausing {FLOOR_PAUSE * 1e6:g} us between posts", paused["msgs_per_s"],
                             official["msgs_per_s"] if official else "-",
                             paused["msgs_per_s"] / official["msgs_per_s"] if official else "-",
                             paused["client_cpu_us_per_msg"], "", paused["broker_cpu_us_per_msg"]])
            for q in ("p50", "p90", "p99"):
                if f"{q}_us" in figures["bmq"] and official:
                    ours_q, theirs_q = figures["bmq"][f"{q}_us"], official[f"{q}_us"]
                    results[f"{pattern}_{q}_latency_ratio_vs_official"] = ours_q / theirs_q
                    rows.append([f"  {pattern} {q} latency (us)", ours_q, theirs_q, ours_q / theirs_q, "", "", ""])
                    if floor:
                        results[f"{pattern}_{q}_floor_latency_ratio_vs_official"] = floor[f"{q}_us"] / theirs_q
                        rows.append([f"  {pattern} {q} floor latency (us)", floor[f"{q}_us"], theirs_q,
                                     floor[f"{q}_us"] / theirs_q, "", "", ""])
        finally:
            broker.stop()
    emit(f"bmq vs official SDK, pattern by pattern ({results.get('broker', '-')}, {len(PAYLOAD)}-byte messages)",
         ["pattern", "bmq msg/s", "official msg/s", "ratio", "bmq CPU us/msg", "official CPU us/msg",
          "broker CPU us/msg (bmq run)"], rows, results, args.json)
    return results


def run_tls(args: Any, patterns: List[str]) -> Dict[str, Any]:
    """``--tls``: each bmq pattern in plaintext and over TLS on the same path, in the same run.

    Embedded broker: two broker processes alike but for TLS (the broker's own, no extra hop).
    bmqbrkr: plaintext straight to it, TLS through stunnel4 in front of it (a hop more): there
    a blocking post is judged against the floor of that path, a bare TLS socket's PUT -> ACK
    loop through the same terminator. The certificates are made for the run by openssl."""
    import shutil
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tlsutil import Stunnel, make_certificates, stunnel_binary  # the tests' TLS tools, not bmq's API

    workdir = Path(tempfile.mkdtemp(prefix="bmq-e2e-tls-"))
    try:
        certificates = make_certificates(workdir / "certificates")
        tls_options = bmq.SessionOptions(tls=bmq.tls_context(certificates["ca"]))
        results: Dict[str, Any] = {"payload_bytes": len(PAYLOAD), "messages": args.messages, "posts": args.posts,
                                   "repeat": args.repeat, "tls": True}
        rows = []
        for pattern in patterns:
            terminator = None
            plain: BrokerProcess
            secure: BrokerProcess
            if args.bmqbrkr:
                plain = RealBrokerProcess(Path(args.bmqbrkr))
                binary = stunnel_binary()
                if binary is None:
                    plain.stop()
                    raise SystemExit("--tls --bmqbrkr needs stunnel4 (apt-get install stunnel4)")
                terminator = Stunnel(binary, workdir / f"stunnel-{pattern}", plain.address, certificates["server"],
                                     certificates["server.key"]).start()
                secure, tls_address = plain, terminator.address
                results["broker"] = "bmqbrkr (TLS through stunnel4)"
            else:
                plain = BrokerProcess()
                secure = BrokerProcess(["--tls-cert", str(certificates["server"]), "--tls-key",
                                        str(certificates["server.key"])])
                tls_address = secure.address
                results["broker"] = "embedded broker (own process; its own TLS)"
            SESSION_OPTIONS[tls_address] = tls_options
            try:
                paths = [("plain", plain, plain.address), ("tls", secure, tls_address)]
                runs: Dict[str, List[Dict[str, float]]] = {}
                for _ in range(args.repeat):
                    for label, broker, address in paths:
                        if pattern in PRODUCE:
                            ours, _, size = PRODUCE[pattern]
                            count = getattr(args, size)
                            for name, produce in ((label, ours), (f"floor_{label}", FLOOR.get(pattern)),
                                                  (f"floor_paused_{label}", FLOOR_PAUSED.get(pattern))):
                                if produce is not None:
                                    runs.setdefault(name, []).append(
                                        measure(broker, functools.partial(produce, address, count), count))
                        else:
                            consume, _ = CONSUME[pattern]
                            count = args.messages
                            uri = fresh_uri(f"{label}-{pattern}")
                            fill_queue(address, uri, count, PAYLOAD, BATCH, SESSION_OPTIONS.get(address))
                            runs.setdefault(label, []).append(
                                measure(broker, functools.partial(consume, address, uri, count), count))
                figures = medians(runs)
                for name, values in figures.items():
                    results.update({f"{name}_{pattern}_{key}": value for key, value in values.items()})
                ratio = figures["tls"]["msgs_per_s"] / figures["plain"]["msgs_per_s"]
                results[f"{pattern}_tls_ratio_vs_plaintext"] = ratio
                rows.append([pattern, figures["plain"]["msgs_per_s"], figures["tls"]["msgs_per_s"], ratio,
                             figures["plain"]["client_cpu_us_per_msg"], figures["tls"]["client_cpu_us_per_msg"],
                             figures["tls"]["broker_cpu_us_per_msg"]])
                if "floor_tls" in figures:
                    floor_plain, floor_tls = figures["floor_plain"], figures["floor_tls"]
                    vs_floor = figures["tls"]["msgs_per_s"] / floor_tls["msgs_per_s"]
                    results[f"{pattern}_tls_ratio_vs_tls_floor"] = vs_floor
                    rows.append([f"  {pattern} floor: bare socket, one thread", floor_plain["msgs_per_s"],
                                 floor_tls["msgs_per_s"], floor_tls["msgs_per_s"] / floor_plain["msgs_per_s"],
                                 floor_plain["client_cpu_us_per_msg"], floor_tls["client_cpu_us_per_msg"], ""])
                    rows.append([f"  {pattern} over TLS / its bare TLS socket floor", "", "", vs_floor, "", "", ""])
                    paused_plain, paused_tls = figures["floor_paused_plain"], figures["floor_paused_tls"]
                    vs_paused = figures["tls"]["msgs_per_s"] / paused_tls["msgs_per_s"]
                    results[f"{pattern}_tls_ratio_vs_paused_tls_floor"] = vs_paused
                    rows.append([f"  {pattern} floor pausing {FLOOR_PAUSE * 1e6:g} us between posts",
                                 paused_plain["msgs_per_s"], paused_tls["msgs_per_s"],
                                 paused_tls["msgs_per_s"] / paused_plain["msgs_per_s"],
                                 paused_plain["client_cpu_us_per_msg"], paused_tls["client_cpu_us_per_msg"], ""])
                    rows.append([f"  {pattern} over TLS / that paused TLS floor", "", "", vs_paused, "", "", ""])
                    for q in ("p50", "p99"):
                        rows.append([f"  {pattern} {q} latency (us)", figures["plain"][f"{q}_us"],
                                     figures["tls"][f"{q}_us"],
                                     figures["tls"][f"{q}_us"] / figures["plain"][f"{q}_us"], "", "", ""])
            finally:
                if terminator is not None:
                    terminator.stop()
                plain.stop()
                if secure is not plain:
                    secure.stop()
                SESSION_OPTIONS.pop(tls_address, None)
        emit(f"bmq over TLS vs plaintext, pattern by pattern ({results['broker']}, {len(PAYLOAD)}-byte messages)",
             ["pattern", "plaintext msg/s", "TLS msg/s", "TLS / plaintext", "plaintext CPU us/msg", "TLS CPU us/msg",
              "broker CPU us/msg (TLS run)"], rows, results, args.json)
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # the run's certificates and stunnel files


if __name__ == "__main__":
    main()
