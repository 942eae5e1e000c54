"""Acked PUT throughput of the embedded broker: one producer of 100-byte messages.

The broker runs in its own process (``python -m bmq.broker``) so that producer and broker do
not share a GIL, as in any real deployment. Producers measured:

* ``raw``: bmq's codec on a bare socket (PUT events of ``--batch`` messages, a bounded window
  of unacknowledged messages), the cheapest possible client: the broker's own ceiling.
* ``official``: the official BlazingMQ SDK (``blazingmq``, C++ inside), ``post`` with an
  ``on_ack`` callback per message.
* ``bmq``: bmq's own client (``bmq.Session``), when it is importable.

Throughput = messages / (time from the first post to the last ACK). Target: >= 200,000 msg/s.
The broker process's CPU time per message is reported too: when it is well below
1e6 / throughput, the producer, not the broker, is the limit.

Usage: ``python benchmarks/broker.py [--json FILE] [--messages N] [--producers raw,official,bmq]``.
JSON key: ``acked_put_msgs_per_s`` (the best producer), plus one key per producer.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Dict, Optional

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


PRODUCERS: Dict[str, Callable[[BrokerProcess, int], Optional[float]]] = {
    "raw": run_raw,
    "official": run_official,
    "bmq": run_bmq,
}


def main() -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per producer (default: %(default)s)")
    parser.add_argument("--producers", default="raw,official,bmq", help="comma-separated subset of raw,official,bmq")
    args = parser.parse_args()
    rows = []
    results: Dict[str, float] = {}
    for name in args.producers.split(","):
        broker = BrokerProcess()  # a fresh broker per producer: no queue left from the last
        try:
            cpu_before = broker.cpu_seconds()
            elapsed = PRODUCERS[name](broker, args.messages)
            broker_cpu = broker.cpu_seconds() - cpu_before
        finally:
            broker.stop()
        if elapsed is None:
            rows.append((name, "n/a", "n/a", "not available"))
            continue
        rate = args.messages / elapsed
        cpu_us = broker_cpu / args.messages * 1e6
        results[f"acked_put_msgs_per_s_{name}"] = round(rate)
        results[f"broker_cpu_us_per_msg_{name}"] = round(cpu_us, 2)
        rows.append((name, round(rate), round(cpu_us, 2), f"{elapsed:.2f} s for {args.messages:,} msgs"))
    if results:
        results["acked_put_msgs_per_s"] = max(results.values())
    results["target_msgs_per_s"] = 200_000
    emit(
        "Embedded broker: acked PUT throughput, one producer, 100-byte messages",
        ["producer", "msgs/s", "broker CPU us/msg", "detail"],
        rows,
        results,
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
