"""The ring that keeps a queue's latest post->ACK latencies (bmq._stats): the latest samples,
oldest first, in 8 bytes each, and nothing for a queue that never posts."""
from __future__ import annotations

import threading
import tracemalloc

import pytest

from bmq import _codec
from bmq._stats import LATENCY_WINDOW, QueueCounters


def test_the_ring_keeps_the_latest_samples_oldest_first():
    ring = _codec.SampleRing(4)
    assert len(ring) == 0 and ring.values() == []
    for sample in (0.5, 1.5, 2.5):
        ring.append(sample)
    assert ring.values() == [0.5, 1.5, 2.5]
    for sample in range(3, 10):
        ring.append(sample)
    assert len(ring) == 4 and ring.values() == [6.0, 7.0, 8.0, 9.0]


@pytest.mark.parametrize("size", [0, -1])
def test_a_ring_needs_a_positive_size(size):
    with pytest.raises(ValueError, match="size must be positive"):
        _codec.SampleRing(size)


def test_a_ring_takes_only_numbers():
    with pytest.raises(TypeError):
        _codec.SampleRing(4).append("1")  # type: ignore[arg-type]


def test_a_queue_keeps_8_bytes_per_latency_and_none_before_it_posts():
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        counters = [QueueCounters() for _ in range(50)]
        idle = tracemalloc.get_traced_memory()[0] - before
        for queue in counters:
            for i in range(LATENCY_WINDOW + 10):
                queue.latencies.append(i * 1e-6)
        full = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert idle / 50 < 1024  # no samples, no ring storage
    # A deque of Python floats took 32 bytes per sample (133 KB per queue).
    assert (full - idle) / 50 <= 8 * LATENCY_WINDOW + 256
    assert counters[0].snapshot("bmq://d/q").ack_latency_us["max"] == pytest.approx((LATENCY_WINDOW + 9) * 1.0)


def test_threads_appending_at_once_keep_the_ring_whole():
    # Appends take the ring's mutex: without it, on a free-threaded build two appends could
    # both move the write position past the end and write outside the ring.
    ring = _codec.SampleRing(64)
    start = threading.Barrier(8)
    seen: list[int] = []  # the lengths read meanwhile (list.append is atomic on every build)

    def work(base: float) -> None:
        start.wait(timeout=10)
        for i in range(20_000):
            ring.append(base + i)
            if i % 1000 == 0:
                seen.append(len(ring.values()))

    threads = [threading.Thread(target=work, args=(k * 1e6,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    values = ring.values()
    assert len(ring) == len(values) == 64
    assert len(seen) == 8 * 20 and max(seen) <= 64
    # Each thread's samples come in its order: the ring holds, per thread, an increasing run.
    for k in range(8):
        mine = [v for v in values if k * 1e6 <= v < (k + 1) * 1e6]
        assert mine == sorted(mine)
