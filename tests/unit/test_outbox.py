"""The durable outbox: round trips, tombstones, segment life cycle, torn tails, foreign files,
locking, a real SIGKILL mid-run, and concurrent use."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bmq._outbox as outbox_module
from bmq.exceptions import Error
from bmq._outbox import (FSYNC_POLICIES, Outbox, OutboxError, OutboxLockedError, OutboxRecord,
                         _decode_records, _encode_frames, _frame, _read_frames)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def guid(batch: int, index: int) -> bytes:
    return struct.pack(">QQ", batch, index)


def make_batch(batch: int, count: int, size: int = 100) -> list:
    return [
        OutboxRecord(guid(batch, i), f"bmq://bmq.test/q{batch % 3}", bytes([batch % 251, i % 251]) * (size // 2),
                     None if i % 2 else b"\x01props" * (i % 4), bool(i % 3 == 0), i % 2)
        for i in range(count)
    ]


def seg_files(directory: Path) -> list:
    return sorted(p.name for p in directory.iterdir() if p.name != "LOCK")


records_strategy = st.builds(
    OutboxRecord,
    guid=st.binary(min_size=16, max_size=16),
    queue_uri=st.text(max_size=80),
    payload=st.binary(max_size=300),
    properties=st.none() | st.binary(max_size=100),
    new_style_properties=st.booleans(),
    compression=st.integers(0, 255),
)


SEG_HEADER = outbox_module._file_header(b"BMQOBSEG")


def frame(raw: bytes) -> bytes:
    return _frame(raw, outbox_module.zstandard.ZstdCompressor())


@settings(max_examples=200, deadline=None)
@given(st.lists(records_strategy, max_size=20))
def test_record_encoding_round_trip(records):
    bodies, sizes = _encode_frames(records)
    body = b"".join(bodies)
    assert len(bodies) == (1 if records else 0)
    assert list(_decode_records(body)) == list(zip(records, sizes))
    assert _read_frames(SEG_HEADER + frame(body), b"BMQOBSEG", "test") == ([body], 16 + len(frame(body)))


@settings(max_examples=300, deadline=None)
@given(st.lists(records_strategy, max_size=3), st.binary(max_size=200))
def test_garbage_after_a_frame_never_raises_and_keeps_the_frame(records, tail):
    body = b"".join(_encode_frames(records)[0])
    first = frame(body)
    frames, valid = _read_frames(SEG_HEADER + first + tail, b"BMQOBSEG", "fuzz")
    assert frames[0] == body
    assert 16 + len(first) <= valid <= 16 + len(first) + len(tail)
    for raw in frames[1:]:  # a frame that passes the CRC by chance may still not be records
        try:
            list(_decode_records(raw))
        except ValueError:
            pass


def test_round_trip_and_reopen(tmp_path):
    first, second = make_batch(1, 10), make_batch(2, 5)
    with Outbox(tmp_path) as box:
        box.append(first)
        box.append(second)
        assert len(box) == 15
        assert box.pending() == first + second
    with Outbox(tmp_path) as box:
        assert box.pending() == first + second


@pytest.mark.parametrize("fsync", FSYNC_POLICIES)
def test_remove_is_never_recovered(tmp_path, fsync):
    records = make_batch(1, 20)
    with Outbox(tmp_path, fsync=fsync) as box:
        box.append(records)
        box.remove([r.guid for r in records[::2]] + [b"\xff" * 16])  # unknown GUIDs are ignored
        assert len(box) == 10
        assert box.pending() == records[1::2]
    with Outbox(tmp_path, fsync=fsync) as box:
        assert box.pending() == records[1::2]
        box.remove([r.guid for r in records])
        assert len(box) == 0 and box.pending() == []
    assert seg_files(tmp_path) == []  # a fully acked outbox leaves no segment behind


def test_append_is_idempotent_per_guid(tmp_path):
    records = make_batch(1, 4)
    with Outbox(tmp_path) as box:
        box.append(records + records[:2])
        box.append(records[1:])
        assert box.pending() == records


def test_segments_roll_and_fully_acked_ones_are_deleted(tmp_path):
    batches = [make_batch(b, 10) for b in range(3)]
    with Outbox(tmp_path, segment_bytes=64) as box:
        for batch in batches:
            box.append(batch)
        assert seg_files(tmp_path) == [f"{n:016x}.seg" for n in range(3)]
        box.remove(r.guid for r in batches[0])
        assert seg_files(tmp_path) == [f"{n:016x}.seg" for n in (1, 2)]
        box.remove(r.guid for r in batches[2])  # the segment being appended to is emptied, not deleted
        assert (tmp_path / f"{2:016x}.seg").stat().st_size == 16
        assert box.pending() == batches[1]
    assert seg_files(tmp_path) == [f"{1:016x}.seg"]
    with Outbox(tmp_path) as box:
        assert box.pending() == batches[1]


def test_mostly_acked_segment_is_rewritten(tmp_path):
    old, new = make_batch(1, 40), make_batch(2, 2)
    with Outbox(tmp_path, segment_bytes=64) as box:
        box.append(old)
        box.append(new)  # seals segment 0
        box.remove(r.guid for r in old[:20])
        seg0 = tmp_path / f"{0:016x}.seg"
        size_before = seg0.stat().st_size
        assert (tmp_path / f"{0:016x}.ack").exists()
        box.remove(r.guid for r in old[20:35])  # 5 of 40 left: under a quarter live
        assert not (tmp_path / f"{0:016x}.ack").exists()
        assert seg0.stat().st_size < size_before
        assert box.pending() == old[35:] + new
    with Outbox(tmp_path) as box:
        assert box.pending() == old[35:] + new


def test_torn_segment_tail_keeps_every_earlier_frame(tmp_path):
    source = tmp_path / "source"
    first, last = make_batch(1, 6), make_batch(2, 6)
    with Outbox(source, fsync="never") as box:
        box.append(first)
        frame_start = (source / f"{0:016x}.seg").stat().st_size
        box.append(last)
    data = (source / f"{0:016x}.seg").read_bytes()
    assert frame_start < len(data)
    for cut in range(frame_start, len(data) + 1):
        target = tmp_path / f"cut{cut}"
        target.mkdir()
        (target / f"{0:016x}.seg").write_bytes(data[:cut])
        with Outbox(target, fsync="never") as box:
            expected = first + last if cut == len(data) else first
            assert box.pending() == expected, cut
            box.append(make_batch(3, 1))  # new frames go to a fresh segment, never behind a torn tail
        with Outbox(target) as box:
            assert box.pending() == expected + make_batch(3, 1), cut
        shutil.rmtree(target)


@pytest.mark.parametrize("cut", range(0, 16))
def test_segment_torn_inside_its_header_is_empty(tmp_path, cut):
    with Outbox(tmp_path / "source") as box:
        box.append(make_batch(1, 1))
    data = (tmp_path / "source" / f"{0:016x}.seg").read_bytes()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / f"{0:016x}.seg").write_bytes(data[:cut])
    with Outbox(tmp_path / "t") as box:
        assert box.pending() == []
    assert seg_files(tmp_path / "t") == []


def test_torn_tombstone_tail_resurrects_at_most_the_torn_removal(tmp_path):
    source = tmp_path / "source"
    records, tail = make_batch(1, 12), make_batch(2, 1)
    with Outbox(source, segment_bytes=64) as box:
        box.append(records)
        box.append(tail)  # seals segment 0 so its removals are tombstones
        box.remove(r.guid for r in records[:2])
        ack = source / f"{0:016x}.ack"
        frame_start = ack.stat().st_size
        box.remove(r.guid for r in records[2:4])
    seg, data = (source / f"{0:016x}.seg").read_bytes(), ack.read_bytes()
    for cut in range(frame_start, len(data)):
        target = tmp_path / f"cut{cut}"
        target.mkdir()
        (target / f"{0:016x}.seg").write_bytes(seg)
        (target / f"{0:016x}.ack").write_bytes(data[:cut])
        with Outbox(target) as box:
            assert box.pending() == records[2:]  # at-least-once: the torn removal comes back
            box.remove([records[2].guid])  # and later tombstones are readable again
        with Outbox(target) as box:
            assert box.pending() == records[3:], cut
        shutil.rmtree(target)


def test_garbage_and_foreign_files_are_skipped_with_a_warning(tmp_path, caplog):
    records = make_batch(1, 5)
    with Outbox(tmp_path) as box:
        box.append(records)
    foreign_seg = os.urandom(200)
    (tmp_path / f"{7:016x}.seg").write_bytes(foreign_seg)
    (tmp_path / f"{0:016x}.ack").write_bytes(b"BMQOBACK" + os.urandom(60))
    (tmp_path / f"{3:016x}.ack").write_bytes(b"orphan")
    (tmp_path / f"{4:016x}.seg.tmp").write_bytes(b"half a compaction")
    (tmp_path / "notes.txt").write_text("not ours")
    caplog.set_level(logging.WARNING, logger="bmq._outbox")
    with Outbox(tmp_path) as box:
        assert box.pending() == records
        box.append(make_batch(2, 1))
        box.remove([records[0].guid])
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{7:016x}.seg" in messages and "notes.txt" in messages and f"{4:016x}.seg.tmp" in messages
    assert (tmp_path / f"{7:016x}.seg").read_bytes() == foreign_seg  # not ours: left alone
    assert not (tmp_path / f"{3:016x}.ack").exists() and not (tmp_path / f"{4:016x}.seg.tmp").exists()
    assert (tmp_path / f"{8:016x}.seg").exists()  # new segments never reuse a number on disk
    with Outbox(tmp_path) as box:
        assert box.pending() == records[1:] + make_batch(2, 1)


@pytest.mark.parametrize("fail_on_new_segment", [False, True])
def test_a_failed_write_is_cut_back_and_later_appends_survive(tmp_path, monkeypatch, fail_on_new_segment):
    first, failed, later = make_batch(1, 3), make_batch(2, 3), make_batch(3, 3)
    real_write_all = outbox_module._write_all

    def half_then_fail(fd, data):
        os.write(fd, data[:len(data) // 2])
        raise OSError(28, "No space left on device")

    with Outbox(tmp_path) as box:
        if not fail_on_new_segment:
            box.append(first)
        monkeypatch.setattr(outbox_module, "_write_all", half_then_fail)
        with pytest.raises(OSError, match="No space"):
            box.append(failed)
        monkeypatch.setattr(outbox_module, "_write_all", real_write_all)
        assert len(box) == (0 if fail_on_new_segment else 3)
        box.append(later)
    expected = later if fail_on_new_segment else first + later
    with Outbox(tmp_path) as box:
        assert box.pending() == expected


def test_second_outbox_on_the_directory_is_refused(tmp_path):
    box = Outbox(tmp_path)
    try:
        with pytest.raises(OutboxLockedError, match="in use by another Outbox") as info:
            Outbox(tmp_path)
        assert isinstance(info.value, Error)
    finally:
        box.close()
    with Outbox(tmp_path) as again:
        assert len(again) == 0


def test_a_dropped_outbox_releases_the_directory(tmp_path):
    Outbox(tmp_path).append(make_batch(1, 2))  # never closed
    with Outbox(tmp_path) as box:
        assert box.pending() == make_batch(1, 2)


def test_closed_outbox_and_bad_arguments(tmp_path):
    box = Outbox(tmp_path)
    with pytest.raises(ValueError, match="16 bytes"):
        box.append([OutboxRecord(b"short", "bmq://d/q", b"")])
    box.append(make_batch(1, 2))
    box.close()
    box.close()
    with pytest.raises(OutboxError, match="closed"):
        box.append(make_batch(2, 1))
    with pytest.raises(OutboxError, match="closed"):
        box.pending()
    box.remove([guid(1, 0)])  # a late ACK after close: ignored, the record stays pending
    with Outbox(tmp_path) as again:
        assert again.pending() == make_batch(1, 2)
    with pytest.raises(ValueError, match="fsync"):
        Outbox(tmp_path, fsync="sometimes")


CHILD = r"""
import struct, sys
from bmq._outbox import Outbox, OutboxRecord
directory, fsync, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
def report(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
def batch(n):
    return [OutboxRecord(struct.pack(">QQ", n, i), "bmq://bmq.test/q", struct.pack(">QQ", n, i) * 6)
            for i in range(batch_size)]
with Outbox(directory, fsync=fsync, segment_bytes=8192) as box:
    n = 0
    while True:
        box.append(batch(n))
        report(f"A {n}")
        if n:
            # most batches are acked soon after, every fifth one only half: segments roll,
            # get deleted, emptied or compacted while the parent may kill us
            step = 2 if (n - 1) % 5 == 0 else 1
            box.remove([struct.pack(">QQ", n - 1, i) for i in range(0, batch_size, step)])
            report(f"R {n - 1} {step}")
        n += 1
"""


@pytest.mark.parametrize("fsync, kill_after", [
    ("never", 0), ("never", 3), ("never", 41), ("never", 150), ("never", 400), ("batch", 25), ("always", 10)])
def test_sigkill_mid_run_loses_no_reported_append(tmp_path, fsync, kill_after):
    batch_size = 40
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), fsync, str(batch_size)],
                             stdout=subprocess.PIPE, text=True, cwd=str(ROOT), env=env)
    lines = []
    try:
        for line in child.stdout:
            lines.append(line)
            if line == f"A {kill_after}\n":
                break
        child.send_signal(signal.SIGKILL)
        lines.extend(child.stdout)  # progress reported before it died
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    reports = [line.split() for line in lines if line.endswith("\n")]  # not a line cut by the kill
    appended = {int(words[1]) for words in reports if words[0] == "A"}
    removed = {int(words[1]): int(words[2]) for words in reports if words[0] == "R"}
    assert max(appended) >= kill_after
    with Outbox(tmp_path) as box:  # the kill released the lock
        pending = [r.guid for r in box.pending()]
        assert len(pending) == len(set(pending)) == len(box)
        pending_set = set(pending)
        last = max(appended)
        # The child removes batch n after appending n + 1, so only batch last - 1 may have
        # had its removal in flight, and batch last + 1 its append.
        assert all(n in removed for n in appended if n < last - 1)
        for n in appended:
            step = 2 if n % 5 == 0 else 1
            assert removed.get(n, step) == step
            for i in range(batch_size):
                if i % step:
                    assert guid(n, i) in pending_set, (n, i)  # never acked
                elif n in removed:
                    assert guid(n, i) not in pending_set, f"acked record {(n, i)} recovered"
                elif n != last - 1:
                    assert guid(n, i) in pending_set, (n, i)
        for g in pending_set:
            n, i = struct.unpack(">QQ", g)
            assert n <= last + 1 and i < batch_size
        assert all(r.payload == r.guid * 6 for r in box.pending())
    with Outbox(tmp_path) as box:  # recovery left the directory consistent
        assert {r.guid for r in box.pending()} == pending_set


def test_threads_append_and_remove_concurrently(tmp_path):
    threads_count, batches, size = 8, 30, 20
    barrier = threading.Barrier(threads_count)
    errors = []
    expected = set()
    expected_lock = threading.Lock()

    def worker(box, t):
        try:
            barrier.wait(timeout=10)
            for b in range(batches):
                n = t * 1000 + b
                box.append(make_batch(n, size, size=30))
                keep = [guid(n, i) for i in range(size) if (i + b) % 4 == 0]
                box.remove(guid(n, i) for i in range(size) if (i + b) % 4)
                if b % 7 == 3:
                    box.pending()  # reads interleave with writes
                with expected_lock:
                    expected.update(keep)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    with Outbox(tmp_path, fsync="never", segment_bytes=4096) as box:
        workers = [threading.Thread(target=worker, args=(box, t)) for t in range(threads_count)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=30)
        assert not errors and not any(w.is_alive() for w in workers)
        pending = [r.guid for r in box.pending()]
        assert len(pending) == len(box) == len(expected)
        assert set(pending) == expected
    with Outbox(tmp_path) as box:
        assert {r.guid for r in box.pending()} == expected
