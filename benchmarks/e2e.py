"""End-to-end speed of bmq against the official ``blazingmq`` SDK, same broker, same run.

Workloads (each on a fresh queue, both clients measured back to back):

* ``post_many``: N messages posted as fast as the client allows, timed until every ACK is in
  (bmq: blocking ``Queue.post_many`` of 1,000 messages at a time; official: ``Session.post``
  with an ``on_ack`` each, then wait for the last ACK).
* ``post``: M single blocking posts (bmq: ``Queue.post``; official: ``post`` + wait for its
  ACK), giving the post->ACK latency percentiles too.
* ``consume``: N messages received and confirmed (bmq: ``get`` + ``confirm_many``; official:
  ``on_message`` + ``confirm``). The same bmq producer fills the queue first; the clock runs
  from opening the reader to the last confirm, so only consumption is timed.

Usage: ``python benchmarks/e2e.py [--broker ADDR] [--json FILE] [--messages N]``; without
``--broker`` an embedded broker runs in a child process (its own GIL; its cost is part of
every figure, for both clients alike). Targets: post_many >= 3x, post >= 1x, consume >= 2x
the official SDK.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Dict, List, Optional

import bmq
from bmq.broker import broker_address
from _report import emit, make_parser

try:
    import blazingmq
except ImportError:  # pragma: no cover - the comparison needs it
    blazingmq = None

PAYLOAD_SIZE = 100
BATCH = 1000
CONSUME_WINDOW = 1000
_names = itertools.count()


def fresh_uri(tag: str) -> str:
    return f"bmq://bmq.test.mem.priority/bench-{tag}-{next(_names)}-{time.monotonic_ns() % 10**9}"


def percentiles(samples: List[float]) -> Dict[str, float]:
    """p50 / p99 (microseconds) of latency samples in seconds."""
    ordered = sorted(samples)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan")}
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6  # noqa: E731
    return {"p50": pick(0.50), "p99": pick(0.99)}


# ---- bmq --------------------------------------------------------------------------------
def bmq_post_many(address: str, count: int, payload: bytes) -> float:
    with bmq.Session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-many"), write=True)
        start = time.perf_counter()
        for offset in range(0, count, BATCH):
            queue.post_many([payload] * min(BATCH, count - offset))  # raises unless all SUCCESS
        return count / (time.perf_counter() - start)


def bmq_post(address: str, count: int, payload: bytes) -> Dict[str, float]:
    with bmq.Session(address) as session:
        queue = session.open_queue(fresh_uri("bmq-one"), write=True)
        latencies = []
        start = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter()
            queue.post(payload)
            latencies.append(time.perf_counter() - t0)
        rate = count / (time.perf_counter() - start)
    return {"msgs_per_s": rate, **percentiles(latencies)}


def bmq_consume(address: str, uri: str, count: int) -> float:
    with bmq.Session(address) as session:
        start = time.perf_counter()
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        received = 0
        batch = []
        while received < count:
            message = queue.get(timeout=30.0)
            if message is None:
                raise RuntimeError(f"bmq consumer stalled at {received}/{count}")
            batch.append(message)
            received += 1
            if len(batch) >= 100:
                session.confirm_many(batch)
                batch.clear()
        session.confirm_many(batch)
        return count / (time.perf_counter() - start)


def fill(address: str, uri: str, count: int, payload: bytes) -> None:
    """Post ``count`` messages to ``uri`` with bmq; returns once every one is ACKed."""
    with bmq.Session(address) as session:
        queue = session.open_queue(uri, write=True)
        for offset in range(0, count, BATCH):
            queue.post_many([payload] * min(BATCH, count - offset))


# ---- the official SDK -------------------------------------------------------------------
def official_session(address: str, on_message: Any = None) -> Any:
    return blazingmq.Session(lambda event: None, on_message=on_message, broker=address)


def official_post_many(address: str, count: int, payload: bytes) -> float:
    session = official_session(address)
    try:
        uri = fresh_uri("official-many")
        session.open_queue(uri, write=True)
        done = threading.Event()
        acked = [0]
        lock = threading.Lock()

        def on_ack(ack: Any) -> None:
            with lock:
                acked[0] += 1
                if acked[0] == count:
                    done.set()

        start = time.perf_counter()
        for _ in range(count):
            session.post(uri, payload, on_ack=on_ack)
        if not done.wait(120):
            raise RuntimeError("official SDK: ACKs missing")
        return count / (time.perf_counter() - start)
    finally:
        session.stop()


def official_post(address: str, count: int, payload: bytes) -> Dict[str, float]:
    session = official_session(address)
    try:
        uri = fresh_uri("official-one")
        session.open_queue(uri, write=True)
        acked = threading.Event()
        latencies = []
        start = time.perf_counter()
        for _ in range(count):
            acked.clear()
            t0 = time.perf_counter()
            session.post(uri, payload, on_ack=lambda ack: acked.set())
            if not acked.wait(30):
                raise RuntimeError("official SDK: ACK missing")
            latencies.append(time.perf_counter() - t0)
        rate = count / (time.perf_counter() - start)
    finally:
        session.stop()
    return {"msgs_per_s": rate, **percentiles(latencies)}


def official_consume(address: str, uri: str, count: int) -> float:
    done = threading.Event()
    received = [0]

    def on_message(message: Any, handle: Any) -> None:
        handle.confirm()
        received[0] += 1
        if received[0] == count:
            done.set()

    session = official_session(address, on_message)
    try:
        start = time.perf_counter()
        session.open_queue(uri, read=True, options=blazingmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        if not done.wait(120):
            raise RuntimeError(f"official consumer stalled at {received[0]}/{count}")
        return count / (time.perf_counter() - start)
    finally:
        session.stop()


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = make_parser("bmq vs the official blazingmq SDK, end to end")
    parser.add_argument("--broker", help="broker address (default: an embedded broker)")
    parser.add_argument("--messages", type=int, default=20000, help="messages for post_many and consume")
    parser.add_argument("--posts", type=int, default=2000, help="single blocking posts")
    args = parser.parse_args(argv)
    if blazingmq is None:
        parser.error("the official SDK is needed for the comparison: pip install blazingmq")
    payload = b"x" * PAYLOAD_SIZE
    results: Dict[str, Any] = {"payload_bytes": PAYLOAD_SIZE, "messages": args.messages, "posts": args.posts}
    # A broker in this process would share the GIL with the clients being measured.
    with broker_address(args.broker, separate_process=True) as address:
        results["bmq_post_many_msgs_per_s"] = bmq_post_many(address, args.messages, payload)
        results["official_post_many_msgs_per_s"] = official_post_many(address, args.messages, payload)
        for name, run in (("bmq", bmq_post), ("official", official_post)):
            single = run(address, args.posts, payload)
            results[f"{name}_post_msgs_per_s"] = single["msgs_per_s"]
            results[f"{name}_post_ack_latency_p50_us"] = single["p50"]
            results[f"{name}_post_ack_latency_p99_us"] = single["p99"]
        for name, run in (("bmq", bmq_consume), ("official", official_consume)):
            uri = fresh_uri(f"{name}-consume")
            fill(address, uri, args.messages, payload)
            results[f"{name}_consume_msgs_per_s"] = run(address, uri, args.messages)
    for workload in ("post_many", "post", "consume"):
        results[f"{workload}_ratio_vs_official"] = (
            results[f"bmq_{workload}_msgs_per_s"] / results[f"official_{workload}_msgs_per_s"]
        )
    rows = [
        [w, results[f"bmq_{w}_msgs_per_s"], results[f"official_{w}_msgs_per_s"], results[f"{w}_ratio_vs_official"]]
        for w in ("post_many", "post", "consume")
    ]
    rows += [
        [f"post->ACK {p} (us)", results[f"bmq_post_ack_latency_{p}_us"], results[f"official_post_ack_latency_{p}_us"],
         results[f"official_post_ack_latency_{p}_us"] / results[f"bmq_post_ack_latency_{p}_us"]]
        for p in ("p50", "p99")
    ]
    where = args.broker or "embedded broker"
    emit(f"bmq end to end vs official SDK ({where}, {PAYLOAD_SIZE}-byte messages)",
         ["workload", "bmq msg/s", "official msg/s", "ratio"], rows, results, args.json)
    return results


if __name__ == "__main__":
    main()
