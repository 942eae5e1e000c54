"""Speed of the Cython wire codec, each figure set against a limit measured in the same run.

The limit for a workload is what the same bytes cost at the memory/CRC floor: the ``crc32c``
PyPI package over the payload bytes (one call per payload, as a codec must do) plus a
``bytes`` join (copy) of the same total size. 100-byte payloads come from a pool of 1,024
distinct random ones, so the list of a million stays small. A
ratio of 1.0 means the codec adds nothing on top of touching every byte once plus its CRC.

Usage: ``python benchmarks/codec.py [--json FILE] [--messages N]`` (one thread).
Targets: PUT build (GUIDs included) >= 2,000,000 msg/s, PUSH iteration >= 3,000,000 msg/s and
PUSH decoding column by column (``push_columns``, what ``Queue.get_batch`` takes) >= 10,000,000
msg/s for 100-byte messages; 1 MiB payloads built within 1.3x the limit.
"""
from __future__ import annotations

import os
from typing import List

import crc32c

from bmq import _codec as codec
from _report import best_time, emit, make_parser

SMALL = 100
LARGE = 1 << 20


def limit_seconds(payloads: List[bytes]) -> float:
    """CRC32-C (PyPI package) of every payload + one join of them all."""

    def floor() -> None:
        for payload in payloads:
            crc32c.crc32c(payload)
        b"".join(payloads)

    return best_time(floor)


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="100-byte messages per run")
    parser.add_argument("--large", type=int, default=64, help="1 MiB messages per run")
    args = parser.parse_args()
    n = args.messages
    pool = [os.urandom(SMALL) for _ in range(1024)]
    small = [pool[i % len(pool)] for i in range(n)]
    generator = codec.GuidGenerator()

    put_s = best_time(lambda: codec.build_put_events(7, generator.generate(n), small, flags=1))
    small_limit = limit_seconds(small)

    # PUSH: iterate realistic 64 KiB events (one SUB_QUEUE_IDS_OLD option each, as a broker
    # sends) holding `batch` distinct messages, re-read until n messages were decoded.
    batch = min(n, 100_000)
    guids = generator.generate(batch)
    push_events = codec.build_push_events(
        [(7, guids[16 * i : 16 * i + 16], (1,), small[i], 0, 0, 0) for i in range(batch)],
        max_event_size=64 * 1024,
    )
    rounds = max(1, n // batch)

    def iterate() -> None:
        for _ in range(rounds):
            for event in push_events:
                codec.iter_push_messages(event)

    def columns() -> None:  # the same events decoded column by column (Queue.get_batch)
        for _ in range(rounds):
            for event in push_events:
                codec.push_columns(event)

    push_s = best_time(iterate)
    columns_s = best_time(columns)
    push_n = rounds * batch

    large = [os.urandom(LARGE) for _ in range(args.large)]
    large_guids = generator.generate(len(large))
    large_s = best_time(lambda: codec.build_put_events(7, large_guids, large))
    large_limit = limit_seconds(large)

    results = {
        "put_build_100B_msgs_per_s": n / put_s,
        "put_build_100B_ratio_to_limit": put_s / small_limit,
        "push_iter_100B_msgs_per_s": push_n / push_s,
        "push_iter_100B_ratio_to_limit": push_s / (small_limit * push_n / n),
        "push_columns_100B_msgs_per_s": push_n / columns_s,
        "push_columns_100B_ratio_to_limit": columns_s / (small_limit * push_n / n),
        "put_build_1MiB_msgs_per_s": len(large) / large_s,
        "put_build_1MiB_ratio_to_limit": large_s / large_limit,
        "crc32c_hardware": codec._crc32c_hardware(),
    }
    rows = [
        ("PUT build, 100 B (GUIDs incl.)", n, n / put_s, put_s, small_limit, put_s / small_limit, ">= 2,000,000 msg/s"),
        ("PUSH iterate, 100 B", push_n, push_n / push_s, push_s, small_limit * push_n / n,
         results["push_iter_100B_ratio_to_limit"], ">= 3,000,000 msg/s"),
        ("PUSH columns (get_batch), 100 B", push_n, push_n / columns_s, columns_s, small_limit * push_n / n,
         results["push_columns_100B_ratio_to_limit"], ">= 10,000,000 msg/s"),
        ("PUT build, 1 MiB", len(large), len(large) / large_s, large_s, large_limit, large_s / large_limit,
         "<= 1.3x limit"),
    ]
    emit("bmq codec benchmark (one thread)",
         ("workload", "messages", "msg/s", "seconds", "limit s", "ratio", "target"), rows, results, args.json)


if __name__ == "__main__":
    main()
