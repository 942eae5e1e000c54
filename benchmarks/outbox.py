"""Durable outbox throughput: append + remove of 100-byte records per fsync policy vs raw writes.

Each batch of 1,000 records (16-byte GUID, 100 random bytes of payload, a 20-character URI)
is appended with one ``Outbox.append`` call and removed with one ``Outbox.remove`` call, as a
session does for ``post_many`` followed by its ACKs. The "lagging" row removes each batch
only after the next 8 were appended, so removals become tombstone frames instead of emptying
the segment being written.

The limit, measured in the same run on the same file system, is a plain file receiving the
same uncompressed record bytes with one ``os.write`` per batch, followed by one fdatasync per
batch (the limit of "always"/"batch") or none (the limit of "never"). Random payloads do not
compress, so zstd costs time without saving bytes: this is the outbox's worst case.

Usage: ``python benchmarks/outbox.py [--json FILE] [--batches N] [--dir DIR]``.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections import deque
from typing import Callable, List

from bmq._outbox import FSYNC_POLICIES, Outbox, OutboxRecord, _encode_frames
from _report import emit, make_parser

BATCH = 1000
PAYLOAD = 100
LAG = 8
URI = "bmq://bmq.test/queue1"


def make_batches(count: int) -> List[List[OutboxRecord]]:
    """``count`` batches of distinct GUIDs over a pool of random 100-byte payloads."""
    pool = [os.urandom(PAYLOAD) for _ in range(4096)]
    return [[OutboxRecord(struct.pack(">QQ", b, i), URI, pool[(b * BATCH + i) % len(pool)])
             for i in range(BATCH)] for b in range(count)]


def timed_in_fresh_dir(parent: str, run: Callable[[str], None], repeat: int = 3) -> float:
    """Best wall-clock time of ``run(directory)`` over ``repeat`` runs, each in an empty directory."""
    best = float("inf")
    for _ in range(repeat):
        directory = tempfile.mkdtemp(prefix="bmq-outbox-bench-", dir=parent)
        try:
            start = time.perf_counter()
            run(directory)
            best = min(best, time.perf_counter() - start)
        finally:
            shutil.rmtree(directory)
    return best


def outbox_run(batches: List[List[OutboxRecord]], fsync: str, lag: int) -> Callable[[str], None]:
    guid_lists = [[r.guid for r in batch] for batch in batches]

    def run(directory: str) -> None:
        with Outbox(directory, fsync=fsync) as box:
            unacked: deque = deque()
            for batch, guids in zip(batches, guid_lists):
                box.append(batch)
                unacked.append(guids)
                if len(unacked) > lag:
                    box.remove(unacked.popleft())
            while unacked:
                box.remove(unacked.popleft())

    return run


def raw_run(blobs: List[bytes], sync: bool) -> Callable[[str], None]:
    def run(directory: str) -> None:
        fd = os.open(os.path.join(directory, "raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for blob in blobs:
                os.write(fd, blob)
                if sync:
                    os.fdatasync(fd)
        finally:
            os.close(fd)

    return run


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="batches of 1,000 records per run")
    parser.add_argument("--dir", default=None, help="parent directory of the test files (default: system temp)")
    args = parser.parse_args()
    batches = make_batches(args.batches)
    blobs = [b"".join(_encode_frames(batch)[0]) for batch in batches]
    messages = args.batches * BATCH

    raw = {sync: messages / timed_in_fresh_dir(args.dir, raw_run(blobs, sync)) for sync in (True, False)}
    results = {
        "record_bytes": len(blobs[0]) // BATCH,
        "batch_records": BATCH,
        "raw_fdatasync_msgs_per_s": raw[True],
        "raw_nosync_msgs_per_s": raw[False],
    }
    rows = [["raw write + fdatasync per batch (limit)", raw[True], 1.0],
            ["raw write, no sync (limit)", raw[False], 1.0]]
    cases = [(policy, 0) for policy in FSYNC_POLICIES] + [("batch", LAG)]
    for policy, lag in cases:
        rate = messages / timed_in_fresh_dir(args.dir, outbox_run(batches, policy, lag))
        limit = raw[policy != "never"]
        key = f"outbox_{policy}{'_lagging' if lag else ''}"
        results[f"{key}_msgs_per_s"] = rate
        results[f"{key}_vs_limit"] = rate / limit
        label = f"outbox fsync={policy}" + (f", removal {lag} batches behind" if lag else "")
        rows.append([label, rate, rate / limit])
    emit(__doc__.splitlines()[0], ["case", "msgs/s", "vs limit"], rows, results, args.json)


if __name__ == "__main__":
    main()
