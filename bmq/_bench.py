"""Producer → broker → consumer throughput and latency, as ``bmq bench`` reports it.

Each payload starts with the producer's ``time.perf_counter_ns()`` at posting time, so a
consumer in the same process measures end-to-end latency without clock skew. The same
workload can run through the official ``blazingmq`` SDK for a side-by-side comparison.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from concurrent.futures import wait
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Union

logger = logging.getLogger(__name__)

_STAMP = struct.Struct(">Q")
MIN_PAYLOAD_SIZE = _STAMP.size
_TIMELINE_STEP_S = 0.1


@dataclass
class BenchResult:
    """What one side (bmq or the official SDK) measured."""

    client: str
    messages: int
    size: int
    producers: int
    consumers: int
    acked: int = 0
    nacked: int = 0
    received: int = 0
    post_seconds: float = 0.0
    total_seconds: float = 0.0
    post_msgs_per_s: float = 0.0
    e2e_msgs_per_s: float = 0.0
    e2e_mb_per_s: float = 0.0
    latency_us: dict = field(default_factory=dict)
    timeline: List[int] = field(default_factory=list)
    latencies_sample_us: List[float] = field(default_factory=list)

    def as_dict(self, with_samples: bool = False) -> dict:
        data = asdict(self)
        if not with_samples:
            data.pop("latencies_sample_us")
        return data


def percentiles(values_ns: Sequence[int]) -> dict:
    """p50/p90/p99/p99.9/max of nanosecond samples, in microseconds."""
    if not values_ns:
        return {}
    ordered = sorted(values_ns)
    last = len(ordered) - 1

    def pick(q: float) -> float:
        return round(ordered[min(last, int(q * len(ordered)))] / 1000.0, 1)

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "p99.9": pick(0.999),
            "max": round(ordered[-1] / 1000.0, 1)}


def make_payload(size: int) -> bytearray:
    """A reusable payload buffer of ``size`` bytes; the first 8 get the send timestamp.

    Raises:
        ValueError: ``size`` is below 8 bytes or above the protocol's 64 MiB payload limit.
    """
    from . import MAX_PAYLOAD_SIZE

    if not MIN_PAYLOAD_SIZE <= size <= MAX_PAYLOAD_SIZE:
        raise ValueError(f"--size must be between {MIN_PAYLOAD_SIZE} (the latency timestamp) and "
                         f"{MAX_PAYLOAD_SIZE} bytes (BlazingMQ's payload limit), not {size}")
    return bytearray(b"b" * size)


def stamped(template: bytearray) -> bytes:
    _STAMP.pack_into(template, 0, time.perf_counter_ns())
    return bytes(template)


class _Collector:
    """Thread-safe receive bookkeeping shared by the consumers of one run."""

    def __init__(self, expected: int, start_ns: int):
        self.expected = expected
        self.start_ns = start_ns
        self.lock = threading.Lock()
        self.latencies: List[int] = []
        self.timeline: List[int] = []
        self.done = threading.Event()
        self.last_ns = start_ns

    def record(self, payloads: Sequence[bytes]) -> None:
        now = time.perf_counter_ns()
        with self.lock:
            for payload in payloads:
                self.latencies.append(now - _STAMP.unpack_from(payload)[0])
            slot = int((now - self.start_ns) / 1e9 / _TIMELINE_STEP_S)
            if slot >= len(self.timeline):
                self.timeline.extend([0] * (slot + 1 - len(self.timeline)))
            self.timeline[slot] += len(payloads)
            self.last_ns = now
            if len(self.latencies) >= self.expected:
                self.done.set()


def _finish(result: BenchResult, collector: _Collector, post_end_ns: int, timeout_hit: bool) -> BenchResult:
    result.received = len(collector.latencies)
    result.post_seconds = (post_end_ns - collector.start_ns) / 1e9
    result.total_seconds = (collector.last_ns - collector.start_ns) / 1e9
    if result.post_seconds > 0:
        result.post_msgs_per_s = round(result.acked / result.post_seconds)
    if result.total_seconds > 0:
        result.e2e_msgs_per_s = round(result.received / result.total_seconds)
        result.e2e_mb_per_s = round(result.received * result.size / result.total_seconds / 1e6, 2)
    result.latency_us = percentiles(collector.latencies)
    result.timeline = [round(n / _TIMELINE_STEP_S) for n in collector.timeline]
    step = max(1, len(collector.latencies) // 20000)
    result.latencies_sample_us = [ns / 1000.0 for ns in collector.latencies[::step]]
    if timeout_hit:
        logger.warning("%s: only %d of %d messages arrived before the timeout", result.client,
                       result.received, result.messages)
    return result


class _Workers:
    """Threads of one run; the first exception in any of them wakes the run and is re-raised."""

    def __init__(self, collector: _Collector):
        self.collector = collector
        self.threads: List[threading.Thread] = []
        self.error: Optional[BaseException] = None

    def start(self, name: str, target: Callable, *args) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # re-raised by the caller's thread in raise_if_failed
                if self.error is None:
                    self.error = exc
                self.collector.done.set()  # nobody waits for messages that will not come

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


def _split(total: int, parts: int) -> List[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_bmq(broker: Union[str, Sequence[str]], uri: str, *, size: int, count: int, producers: int = 1,
            consumers: int = 1, batch: int = 1000, timeout: float = 120.0,
            progress: Optional[Callable[[int], None]] = None, options: Any = None,
            final_stats: Optional[List[Any]] = None) -> BenchResult:
    """Run the workload through bmq's client; one Session per producer and per consumer
    (with ``options``, a ``bmq.SessionOptions``, e.g. a credential). ``final_stats``: a list
    that gets each session's last :meth:`bmq.Session.stats`, producers first."""
    import bmq

    result = BenchResult("bmq", count, size, producers, consumers)
    template = make_payload(size)
    readers = []
    sessions = []
    try:
        for _ in range(consumers):
            session = bmq.Session(broker=broker, options=options)
            sessions.append(session)
            readers.append(session.open_queue(uri, read=True, options=bmq.QueueOptions(
                max_unconfirmed_messages=max(1000, 4 * batch))))
        collector = _Collector(count, time.perf_counter_ns())
        consumers_ = _Workers(collector)
        producers_ = _Workers(collector)
        stop = threading.Event()

        def consume(session, reader) -> None:
            pending = []
            while not stop.is_set():
                msg = reader.get(timeout=0.05)
                if msg is not None:
                    pending.append(msg)
                if pending and (msg is None or len(pending) >= 256):
                    collector.record([m.data for m in pending])
                    session.confirm_many(pending)
                    if progress:
                        progress(len(pending))
                    pending = []

        for i, (session, reader) in enumerate(zip(sessions, readers)):
            consumers_.start(f"bmq-bench-consumer-{i}", consume, session, reader)
        lock = threading.Lock()

        def produce(share: int) -> None:
            with bmq.Session(broker=broker, options=options) as session:
                writer = session.open_queue(uri, write=True)
                in_flight: list = []
                sent = 0
                while sent < share and producers_.error is None:
                    n = min(batch, share - sent)
                    in_flight.extend(writer.post_many_async([stamped(template) for _ in range(n)]))
                    sent += n
                    if len(in_flight) >= 8 * batch:
                        _count(in_flight[: 4 * batch])
                        del in_flight[: 4 * batch]
                _count(in_flight)
                if final_stats is not None:
                    final_stats.append(session.stats())

        def _count(futures) -> None:
            wait(futures, timeout=timeout)
            ok = sum(1 for f in futures if f.done() and f.result().status == bmq.AckStatus.SUCCESS)
            with lock:
                result.acked += ok
                result.nacked += len(futures) - ok

        for i, share in enumerate(_split(count, producers)):
            producers_.start(f"bmq-bench-producer-{i}", produce, share)
        producers_.join(timeout)
        post_end = time.perf_counter_ns()
        finished = collector.done.wait(timeout)
        stop.set()
        consumers_.join(5)
        producers_.raise_if_failed()
        consumers_.raise_if_failed()
    finally:
        for session in sessions:
            if final_stats is not None and session.is_running:
                final_stats.append(session.stats())
            session.stop()
    return _finish(result, collector, post_end, not finished)


def run_official(broker: str, uri: str, *, size: int, count: int, producers: int = 1, consumers: int = 1,
                 timeout: float = 120.0, progress: Optional[Callable[[int], None]] = None) -> BenchResult:
    """The same workload through the official ``blazingmq`` SDK (callbacks; acks via on_ack)."""
    import blazingmq

    result = BenchResult("blazingmq", count, size, producers, consumers)
    template = make_payload(size)
    collector = _Collector(count, time.perf_counter_ns())
    sessions = []

    stopping = threading.Event()

    def on_message(message, handle) -> None:
        if stopping.is_set():  # late deliveries while the sessions shut down
            return
        collector.record([message.data])
        handle.confirm()
        if progress:
            progress(1)

    lock = threading.Lock()
    acked = threading.Semaphore(0)

    def on_ack(ack) -> None:
        with lock:
            if ack.status == blazingmq.AckStatus.SUCCESS:
                result.acked += 1
            else:
                result.nacked += 1
        acked.release()

    def ignore(_event) -> None:
        return None

    try:
        for _ in range(consumers):
            session = blazingmq.Session(ignore, on_message=on_message, broker=broker)
            sessions.append(session)
            session.open_queue(uri, read=True)
        collector.start_ns = time.perf_counter_ns()

        def produce(share: int) -> None:
            session = blazingmq.Session(ignore, broker=broker)
            sessions.append(session)
            session.open_queue(uri, write=True)
            for _ in range(share):
                session.post(uri, stamped(template), on_ack=on_ack)
            for _ in range(share):
                acked.acquire(timeout=timeout)

        producers_ = _Workers(collector)
        for i, share in enumerate(_split(count, producers)):
            producers_.start(f"bmq-bench-official-producer-{i}", produce, share)
        producers_.join(timeout)
        post_end = time.perf_counter_ns()
        finished = collector.done.wait(timeout)
        producers_.raise_if_failed()
    finally:
        stopping.set()
        for session in reversed(sessions):  # producers first: nothing new for the consumers
            session.stop()
    return _finish(result, collector, post_end, not finished)
