"""The ring that keeps a queue's latest post->ACK latencies (bmq._stats): the latest samples,
oldest first, in 8 bytes each, and nothing for a queue that never posts."""
from __future__ import annotations

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
