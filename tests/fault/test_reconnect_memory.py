"""A session that reconnects for hours keeps its memory flat.

Each connection's transport reads into a 1 MiB buffer. Allocated with malloc, freeing the first
one raised glibc's dynamic mmap threshold, so every later buffer came from the heap instead, and
a heap fragmented by the rest of each connection's objects did not give it back: about 130 KB of
RSS per reconnect, +13 MB over 100 reconnects of one session (found by ``benchmarks/soak.py``:
+34 MB in 150 s of faults over six sessions). The buffer is its own mapping now, returned to the
system when the connection goes.

The broker runs in its own process (the soak's broker side), so the RSS measured is the client's.
"""
from __future__ import annotations

import gc

import bmq
from bmq import events
from endurance import rss_mb
from faulthost import FaultHost
from support import ha_options, wait_event

WARM_UP = 20
RECONNECTS = 100
#: Before the fix the 100 reconnects cost 13 MB; after it, 0.1 MB.
LIMIT_MB = 4.0
DROPS = 20


def test_100_reconnects_leave_rss_flat(caplog):
    caplog.set_level("ERROR", logger="bmq")  # the captured reconnect logs would be growth of the test's own
    host = FaultHost(None)
    try:
        with bmq.Session(host.address, ha_options()) as session:
            queue = session.open_queue("bmq://bmq.test.mem.priority/reconnect-memory", write=True)

            def reconnect_and_post() -> None:
                assert host.do("drop") == "1"
                wait_event(session, events.StateRestored)
                queue.post_many([b"x" * 100] * 100)  # traffic on each connection, as in service

            for _ in range(WARM_UP):
                reconnect_and_post()
            before = rss_mb()
            for _ in range(RECONNECTS):
                reconnect_and_post()
            growth = rss_mb() - before
            print(f"\nRSS {before:.1f} MB -> +{growth:.2f} MB over {RECONNECTS} reconnects")
            assert session.stats().reconnects == WARM_UP + RECONNECTS
            assert growth < LIMIT_MB
    finally:
        host.close()


def _receive_mappings() -> int:
    """Live transport receive buffers: each is an anonymous shared mapping (/dev/zero in maps)."""
    with open("/proc/self/maps", encoding="ascii") as maps:
        return sum("/dev/zero" in line for line in maps)


def test_a_dropped_connection_is_freed_without_the_cycle_collector(caplog):
    """A dead transport was kept in reference cycles (the Connection's callbacks, its failure's
    traceback) until the collector's rare full pass: 45 of them, mappings and all, after 12
    minutes of the soak's faults. Reference counting alone must free it."""
    caplog.set_level("ERROR", logger="bmq")
    host = FaultHost(None)
    gc.collect()
    gc.disable()
    try:
        with bmq.Session(host.address, ha_options()) as session:
            queue = session.open_queue("bmq://bmq.test.mem.priority/reconnect-cycles", write=True)
            before = _receive_mappings()
            for _ in range(DROPS):
                assert host.do("drop") == "1"
                wait_event(session, events.StateRestored)
                queue.post_many([b"x" * 100] * 100)
            # Before the fix: one more per drop (20); the reader of the last dropped one may
            # still be finishing.
            assert _receive_mappings() <= before + 1
    finally:
        gc.enable()
        host.close()
