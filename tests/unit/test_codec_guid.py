"""MessageGUID generation (§7): layout, uniqueness across threads and processes, forks."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time

import pytest

from bmq import _codec as codec


def fields(guid: bytes):
    """(version, counter, tick, client id) of a generated GUID."""
    return guid[0] >> 6, int.from_bytes(guid[:3], "big") & 0x3FFFFF, int.from_bytes(guid[3:10], "big"), guid[10:]


def test_layout_counter_tick_and_client_id():
    gen = codec.GuidGenerator(session_id=7)
    block = gen.generate(50)
    guids = [gen.next() for _ in range(50)] + [block[i * 16 : i * 16 + 16] for i in range(50)]
    parsed = [fields(g) for g in guids]
    assert all(len(g) == 16 for g in guids)
    assert {p[0] for p in parsed} == {1}
    assert sorted(p[1] for p in parsed) == list(range(1, 101))
    ticks = [p[2] for p in parsed[50:]] + [p[2] for p in parsed[:50]]
    assert ticks == sorted(ticks)
    assert {p[3] for p in parsed} == {gen.client_id}
    assert gen.client_id_hex == gen.client_id.hex().upper()
    assert len(gen.client_id_hex) == 12
    assert abs(gen.nanoseconds_from_epoch - time.time_ns()) < 60 * 10**9


def test_generate_edge_counts():
    gen = codec.GuidGenerator()
    assert gen.generate(0) == b""
    with pytest.raises(ValueError):
        gen.generate(-1)


def test_generators_have_distinct_client_ids():
    assert codec.GuidGenerator(1).client_id != codec.GuidGenerator(1).client_id


def test_unique_across_8_threads():
    gen = codec.GuidGenerator()
    results: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def work(slot: list[bytes]) -> None:
        start.wait(timeout=10)
        for i in range(1000):
            if i % 2:
                slot.append(gen.next())
            block = gen.generate(199)
            slot.extend(block[j : j + 16] for j in range(0, len(block), 16))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    everything = [g for r in results for g in r]
    assert len(everything) == 8 * (1000 * 199 + 500)
    assert len(set(everything)) == len(everything)


def test_threads_generating_at_once_never_share_a_counter_value():
    # Each call reserves its counter values at once (an atomic add): on a free-threaded build,
    # where nothing else serialises the threads, two reading the same counter would differ
    # only by their nanosecond tick. Below 2**22 GUIDs, the counters are exactly 1..N.
    gen = codec.GuidGenerator()
    threads_count, calls, per_call = 8, 2000, 17
    results: list[bytes] = [b""] * threads_count
    start = threading.Barrier(threads_count)

    def work(slot: int) -> None:
        start.wait(timeout=10)
        results[slot] = b"".join(gen.generate(per_call) if i % 2 else gen.next() for i in range(calls))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    blob = b"".join(results)
    counters = sorted(fields(blob[i : i + 16])[1] for i in range(0, len(blob), 16))
    total = threads_count * (calls // 2) * (per_call + 1)
    assert counters == list(range(1, total + 1))


def _child(conn, gen) -> None:
    mine = gen if gen is not None else codec.GuidGenerator()
    conn.send((mine.client_id, mine.generate(100_000)))
    conn.close()


def _collect(ctx, gen) -> list[tuple[bytes, bytes]]:
    out = []
    procs = []
    for _ in range(2):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, gen))
        proc.start()
        procs.append((proc, parent))
    for proc, parent in procs:
        assert parent.poll(60)
        out.append(parent.recv())
        proc.join(60)
        assert proc.exitcode == 0
    return out


def _assert_disjoint(results, extra=b""):
    blobs = [blob for _, blob in results] + [extra]
    guids = [b[i : i + 16] for b in blobs for i in range(0, len(b), 16)]
    assert len(set(guids)) == len(guids)
    assert len({cid for cid, _ in results}) == len(results)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_unique_across_forked_processes_sharing_a_generator():
    gen = codec.GuidGenerator()
    parent_blob = gen.generate(1000)
    results = _collect(multiprocessing.get_context("fork"), gen)
    assert all(cid != gen.client_id for cid, _ in results)
    _assert_disjoint(results, parent_blob + gen.generate(1000))


def test_unique_across_spawned_processes():
    _assert_disjoint(_collect(multiprocessing.get_context("spawn"), None))


def test_deterministic_guid_is_stable():
    first = codec.deterministic_guid(b"partition-3/offset-17")
    assert first == codec.deterministic_guid(bytearray(b"partition-3/offset-17"))
    assert first != codec.deterministic_guid(b"partition-3/offset-18")
    assert len(first) == 16 and first[0] >> 6 == 1
    # Pinned: a change here would break de-duplication of retried Spark writes.
    digest = hashlib.blake2b(b"bmq", digest_size=16).digest()
    assert codec.deterministic_guid(b"bmq") == bytes([0x40 | (digest[0] & 0x3F)]) + digest[1:]
    assert codec.deterministic_guid(b"") != bytes(16)


def test_hex_forms():
    guid = bytes.fromhex("ABCDEF0123456789ABCDEF0123456789")
    assert codec.guid_to_hex(guid) == "ABCDEF0123456789ABCDEF0123456789"
    assert codec.guid_from_hex("abcdef0123456789abcdef0123456789") == guid
    for bad in ("ABCD", "ZZCDEF0123456789ABCDEF0123456789", "AB CDEF0123456789ABCDEF012345678"):
        with pytest.raises(ValueError):
            codec.guid_from_hex(bad)
    with pytest.raises(ValueError):
        codec.guid_to_hex(b"short")


def test_split_guids_gives_each_16_byte_guid_in_order():
    guids = codec.GuidGenerator(3).generate(100)
    assert codec.split_guids(guids) == [guids[i:i + 16] for i in range(0, len(guids), 16)]
    assert codec.split_guids(memoryview(guids)[:32]) == [guids[:16], guids[16:32]]
    assert codec.split_guids(b"") == []
    with pytest.raises(ValueError, match="16 bytes"):
        codec.split_guids(guids[:-1])
