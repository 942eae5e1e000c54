"""Embedded broker throughput: acked PUTs from one producer, per-message CONFIRM consumption.

The broker runs in its own process (``python -m bmq.broker``) so that producer and broker do
not share a GIL, as in any real deployment. Producers measured:

* ``raw``: bmq's codec on a bare socket (PUT events of 512 messages, a bounded window
  of unacknowledged messages), the cheapest possible client: the broker's own ceiling.
* ``official``: the official BlazingMQ SDK (``blazingmq``, C++ inside), ``post`` with an
  ``on_ack`` callback per message.
* ``bmq``: bmq's own client (``bmq.Session``), when it is importable.

Throughput = messages / (time from the first post to the last ACK). Target: >= 300,000 msg/s.

Consumer measured (``--consumers``):

* ``raw_confirm``: bmq's codec on a bare socket, reading a queue filled beforehand with a window
  of 1,000 unconfirmed messages and sending one CONFIRM event per message, as a per-message
  ``confirm()`` does: the broker's ceiling for that pattern. Target: >= 50,000 msg/s.

The broker process's CPU time per message is reported too: when it is well below
1e6 / throughput, the client, not the broker, is the limit.

Usage: ``python benchmarks/broker.py [--json FILE] [--messages N] [--producers raw,official,bmq]
[--consumers raw_confirm] [--repeat N]``. JSON keys: ``acked_put_msgs_per_s`` (the best producer),
``confirm_msgs_per_s``, plus one key per producer/consumer (medians over ``--repeat`` runs).
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from bmq import _codec
from bmq.broker._rawclient import RawClient
from _report import BrokerProcess, emit, make_parser


PAYLOAD = b"x" * 100
URI = "bmq://bmq.test.mem.priority/bench-{}"


def run_raw(broker: BrokerProcess, count: int, batch: int = 512, window: int = 64 * 1024) -> float:
    """bmq codec producer on a bare socket; returns seconds from first PUT to last ACK."""
    client = RawClient(broker.port, timeout=60)
    client.open(URI.format("raw"), 0, write=True)
    acked = 0
    space = threading.Semaphore(window // batch)
    done = threading.Event()

    def read_acks() -> None:
        nonlocal acked
        frames = _codec.FrameReader()
        sock = client.sock
        sock.settimeout(60)
        pending = 0
        while acked < count:
            data = sock.recv(1 << 20)
            if not data:
                break
            for event in frames.feed(data):
                if _codec.unpack_event_header(event)[1] == _codec.EVENT_ACK:
                    n = len(_codec.iter_acks(event))
                    acked += n
                    pending += n
                    while pending >= batch:
                        pending -= batch
                        space.release()
        done.set()

    events = []
    for first in range(0, count, batch):
        size = min(batch, count - first)
        events.extend(_codec.build_put_events(0, client.guids.generate(size), [PAYLOAD] * size, flags=_codec.PUT_ACK_REQUESTED))
    reader = threading.Thread(target=read_acks, daemon=True)
    start = time.perf_counter()
    reader.start()
    for event in events:
        space.acquire()
        client.sock.sendall(event)
    done.wait(120)
    elapsed = time.perf_counter() - start
    client.close()
    if acked < count:
        raise RuntimeError(f"raw producer: only {acked} acks")
    return elapsed


def run_official(broker: BrokerProcess, count: int) -> Optional[float]:
    """The official SDK as producer; None when it is not installed."""
    try:
        import blazingmq
    except ImportError:
        return None
    uri = URI.format("official")
    acked = [0]
    done = threading.Event()

    def on_ack(ack: object) -> None:
        acked[0] += 1
        if acked[0] == count:
            done.set()

    session = blazingmq.Session(lambda event: None, broker=broker.address)
    try:
        session.open_queue(uri, write=True)
        post = session.post
        start = time.perf_counter()
        for _ in range(count):
            post(uri, PAYLOAD, on_ack=on_ack)
        if not done.wait(120):
            raise RuntimeError(f"official SDK: only {acked[0]} acks")
        return time.perf_counter() - start
    finally:
        session.stop()


def run_bmq(broker: BrokerProcess, count: int, batch: int = 1000) -> Optional[float]:
    """bmq's own client (``post_many_async`` in batches); None if this checkout has none."""
    try:
        from bmq import Session
    except ImportError:
        return None
    uri = URI.format("bmq")
    with Session(broker.address) as session:
        queue = session.open_queue(uri, write=True)
        futures = []
        start = time.perf_counter()
        for first in range(0, count, batch):
            futures.extend(queue.post_many_async([PAYLOAD] * min(batch, count - first)))
        for future in futures:
            future.result(120)
        return time.perf_counter() - start


def run_raw_confirm(broker: BrokerProcess, count: int, window: int = 1000, chunk: int = 10_000) -> Tuple[float, float]:
    """Per-message CONFIRM consumer on a bare socket; returns (seconds from the configure to
    the last PUSH, broker CPU seconds in that time). The queue is filled beforehand."""
    uri = URI.format("confirm")
    with RawClient(broker.port, timeout=60) as producer:
        producer.open(uri, 0, write=True)
        for first in range(0, count, chunk):
            size = min(chunk, count - first)
            producer.put(0, [PAYLOAD] * size)
            producer.acks(size)
    with RawClient(broker.port, timeout=60) as consumer:
        consumer.open(uri, 0, read=True)
        cpu_before = broker.cpu_seconds()
        start = time.perf_counter()
        consumer.configure(0, max_messages=window)
        received = 0
        while received < count:
            for q_id, guid, sub_ids, *_ in _codec.iter_push_messages(consumer.next_event(_codec.EVENT_PUSH)):
                consumer.send(_codec.build_confirm_event(((q_id, guid, sub_ids[0]),)))
                received += 1
        elapsed = time.perf_counter() - start
        return elapsed, broker.cpu_seconds() - cpu_before


PRODUCERS: Dict[str, Callable[[BrokerProcess, int], Optional[float]]] = {
    "raw": run_raw,
    "official": run_official,
    "bmq": run_bmq,
}
CONSUMERS: Dict[str, Callable[[BrokerProcess, int], Tuple[float, float]]] = {
    "raw_confirm": run_raw_confirm,
}


def measure(name: str, count: int) -> Optional[Tuple[float, float]]:
    """(seconds, broker CPU seconds) of one run of producer or consumer ``name`` against a fresh
    broker (no queue left from the last run); None when that client is not available."""
    broker = BrokerProcess()
    try:
        if name in CONSUMERS:
            return CONSUMERS[name](broker, count)
        cpu_before = broker.cpu_seconds()
        elapsed = PRODUCERS[name](broker, count)
        return None if elapsed is None else (elapsed, broker.cpu_seconds() - cpu_before)
    finally:
        broker.stop()


def main() -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per run (default: %(default)s)")
    parser.add_argument("--producers", default="raw,official,bmq", help="comma-separated subset of raw,official,bmq")
    parser.add_argument("--consumers", default="raw_confirm", help="comma-separated subset of raw_confirm")
    parser.add_argument("--repeat", type=int, default=1, help="runs per client, reported as the median (default: %(default)s)")
    args = parser.parse_args()
    names = [n for n in (*args.producers.split(","), *args.consumers.split(",")) if n]
    unknown = sorted(set(names) - set(PRODUCERS) - set(CONSUMERS))
    if unknown:
        parser.error(f"unknown client(s) {unknown}")
    runs: Dict[str, List[Tuple[float, float]]] = {name: [] for name in names}
    for _ in range(args.repeat):  # interleaved, so that machine noise spreads over every client
        for name in names:
            result = measure(name, args.messages)
            if result is not None:
                runs[name].append(result)
    rows = []
    results: Dict[str, float] = {}
    for name in names:
        if not runs[name]:
            rows.append((name, "n/a", "n/a", "not available"))
            continue
        rates = [args.messages / elapsed for elapsed, _ in runs[name]]
        rate = statistics.median(rates)
        cpu_us = statistics.median(cpu for _, cpu in runs[name]) / args.messages * 1e6
        kind = "confirm" if name in CONSUMERS else "acked_put"
        results[f"{kind}_msgs_per_s_{name}"] = round(rate)
        results[f"broker_cpu_us_per_msg_{name}"] = round(cpu_us, 2)
        spread = f"{min(rates):,.0f}-{max(rates):,.0f} msg/s over {len(rates)} runs" if len(rates) > 1 else ""
        rows.append((name, round(rate), round(cpu_us, 2), f"{args.messages:,} msgs {spread}".strip()))
    for kind, target in (("acked_put", 300_000), ("confirm", 50_000)):
        rates = [v for k, v in results.items() if k.startswith(f"{kind}_msgs_per_s_")]
        if rates:
            results[f"{kind}_msgs_per_s"] = max(rates)
            results[f"{kind}_target_msgs_per_s"] = target
    emit(
        "Embedded broker: acked PUTs from one producer, per-message CONFIRM consumption, 100-byte messages",
        ["client", "msgs/s", "broker CPU us/msg", "detail"],
        rows,
        results,
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
