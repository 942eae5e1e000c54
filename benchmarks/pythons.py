"""bmq's speed on each supported CPython, in one run: the codec (``benchmarks/codec.py``) and the
``post_many`` and blocking ``post`` patterns of ``benchmarks/e2e.py`` against the real bmqbrkr
(one broker binary for every version, so only the client's interpreter differs).

The versions run interleaved, round after round (3.11, 3.12, ..., then again), and each figure is
the median of the rounds: a shared machine's drift then touches every version alike. The load
average is printed at the start and at the end. Each interpreter is given as ``VERSION=COMMAND``
(``COMMAND`` starts a Python with bmq installed, e.g. a venv's python, or ``chroot DIR
/venv/bin/python``); this script then runs itself with ``--one`` under each.

Usage: ``python benchmarks/pythons.py 3.11=/venv311/bin/python 3.14="chroot /c /venv/bin/python"
[--rounds 3] [--messages N] [--posts N] [--json FILE]``; ``--one`` (internal) measures the
running interpreter and prints its figures as one JSON line.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from _report import RealBrokerProcess, emit, make_parser, measure

HERE = Path(__file__).resolve().parent
#: The codec figures reported (codec.py's names).
CODEC_KEYS = ("put_build_100B_msgs_per_s", "push_iter_100B_msgs_per_s", "push_columns_100B_msgs_per_s",
              "put_build_1MiB_msgs_per_s")


def one(messages: int, posts: int, codec_messages: int) -> Dict[str, float]:
    """The running interpreter's figures: codec.py's (in a child, it prints its own table) and
    e2e.py's post_many and post against a fresh bmqbrkr each."""
    import e2e  # beside this file; it imports bmq

    figures: Dict[str, float] = {}
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bmq-pythons-codec-{os.getpid()}.json"
    subprocess.run([sys.executable, str(HERE / "codec.py"), "--messages", str(codec_messages), "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    codec = json.loads(out.read_text())["results"]  # emit()'s record: benchmark, machine, results
    out.unlink()
    figures.update({key: codec[key] for key in CODEC_KEYS if key in codec})
    home = Path(os.environ.get("BMQ_SHARED_DIR", HERE.parents[1] / "shared")) / "bmqbrkr"
    for pattern, produce, count in (("post_many", e2e.bmq_post_many, messages), ("post", e2e.bmq_post, posts)):
        broker = RealBrokerProcess(home)
        try:
            result = measure(broker, functools.partial(produce, broker.address, count), count)
        finally:
            broker.stop()
        figures[f"{pattern}_msgs_per_s"] = result["msgs_per_s"]
        if "p50_us" in result:
            figures[f"{pattern}_p50_us"] = result["p50_us"]
    return figures


def load() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("interpreters", nargs="*", metavar="VERSION=COMMAND")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are their medians")
    parser.add_argument("--messages", type=int, default=20000, help="messages for post_many")
    parser.add_argument("--posts", type=int, default=2000, help="blocking posts")
    parser.add_argument("--codec-messages", type=int, default=200_000, help="codec.py --messages")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.messages, args.posts, args.codec_messages)))
        return
    interpreters = dict(item.split("=", 1) for item in args.interpreters)
    if "3.11" not in interpreters:
        parser.error("3.11 is the reference: give 3.11=COMMAND")
    load_before = load()
    runs: Dict[str, List[Dict[str, float]]] = {version: [] for version in interpreters}
    for round_ in range(args.rounds):
        for version, command in interpreters.items():
            output = subprocess.run([*shlex.split(command), str(Path(__file__).resolve()), "--one",
                                     "--messages", str(args.messages), "--posts", str(args.posts),
                                     "--codec-messages", str(args.codec_messages)],
                                    check=True, capture_output=True, text=True).stdout
            runs[version].append(json.loads(output.strip().splitlines()[-1]))
            print(f"round {round_ + 1}, CPython {version}: done (load {load()})", file=sys.stderr, flush=True)
    medians = {version: {key: statistics.median(run[key] for run in done) for key in done[0]}
               for version, done in runs.items()}
    # On a loaded machine a round's throughput drops whenever the scheduler parks the client or
    # the broker, so each round's best (highest msg/s, lowest latency) is shown too: closer to what
    # the interpreter can do, where the median says what the shared machine gave.
    bests = {version: {key: (min if key.endswith("_us") else max)(run[key] for run in done) for key in done[0]}
             for version, done in runs.items()}
    rows: List[List[Any]] = []
    for name, figures in (("median", medians), ("best", bests)):
        reference = figures["3.11"]
        for key in reference:
            label = f"{key} ({name}{', lower is better' if key.endswith('_us') else ''})"
            rows.append([label, *(figures[version][key] for version in interpreters),
                         *(f"{figures[version][key] / reference[key]:.2f}x" for version in interpreters
                           if version != "3.11")])
    results: Dict[str, Any] = {"medians": medians, "bests": bests, "runs": runs, "rounds": args.rounds,
                               "load_before": load_before, "load_after": load()}
    emit(f"bmq per CPython version, median of {args.rounds} interleaved rounds (load average 1/5/15 min: "
         f"{load_before} before, {results['load_after']} after)",
         ["figure", *interpreters, *(f"{v} vs 3.11" for v in interpreters if v != "3.11")], rows, results, args.json)


if __name__ == "__main__":
    main()
