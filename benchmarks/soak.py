"""Endurance: minutes to hours of mixed traffic through faults, with the client's memory,
threads, file descriptors, latency and throughput over time, and every message accounted for.

    python benchmarks/soak.py [--minutes M] [--bmqbrkr] [--json FILE] [--png FILE]
                              [--diag FILE [--diag-every S] [--tracemalloc FRAMES]] [--malloc-trim]
    python benchmarks/soak.py --analyse FILE.json   # memory slopes per stretch, RSS per fault kind,
                                                    # the duplicates and stalls checks again

Against the embedded broker (in its own process) by default, ``--bmqbrkr`` against the real
broker from ``../shared/bmqbrkr`` (SIGKILLed and restarted on its storage as one of the
faults). The engine is ``tests/endurance.py``, which the test suite runs for ~35 s per broker
(``tests/fault/test_soak.py``); see its docstring for the traffic and the faults. Prints the
checks and exits 1 when one fails. The picture needs matplotlib (``pip install ".[bench]"``);
without it the JSON is still written.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _report import default_bmqbrkr_home, machine_info, make_parser  # noqa: E402
from endurance import SoakConfig, SoakResult, judge_duplicates, judge_stalls, run_soak, slopes  # noqa: E402


def plot(result: SoakResult, path: str) -> bool:
    """Draw the samples over time, faults marked, into ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install matplotlib, or the bench extra): {path} not drawn",
              file=sys.stderr)
        return False
    samples = result.samples
    t = [s["t"] for s in samples]
    panels: List[Dict[str, Any]] = [
        {"title": "messages/s (acked per pattern, delivered per reader)",
         "lines": {name: [s["rate"].get(name, 0) for s in samples] for name in samples[-1]["rate"]}},
        {"title": "latency ms (p50, p99)",
         "lines": {key: [s[key] for s in samples] for key in ("post_p50_ms", "post_p99_ms", "async_p50_ms",
                                                               "async_p99_ms")}, "log": True},
        {"title": "MB: RSS; glibc malloc in use and free-but-kept; the soak's own ledger and samples",
         "lines": {k: [s.get(k) for s in samples] for k in ("rss_mb", "malloc_in_use_mb", "malloc_free_mb",
                                                              "ledger_mb", "samples_mb")}},
        {"title": "threads, open fds", "lines": {k: [s[k] for s in samples] for k in ("threads", "fds")}},
        {"title": "writer queue KB, outbox and in-flight messages",
         "lines": {"writer_queue_kb": [s["writer_queue_bytes"] / 1024 for s in samples],
                   "outbox_messages": [s["outbox_messages"] for s in samples],
                   "in_flight": [s["in_flight"] for s in samples]}},
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3 * len(panels)), sharex=True)
    colours = {"cut": "tab:red", "stall": "tab:orange", "crash": "black", "restart": "black", "reopen": "tab:green",
               "drop": "tab:purple", "withhold": "tab:brown"}
    for ax, panel in zip(axes, panels):
        for name, values in panel["lines"].items():
            ax.plot(t, [float("nan") if v is None else v for v in values], label=name, linewidth=1)
        if panel.get("log"):
            ax.set_yscale("log")
        for fault in result.faults:
            ax.axvspan(fault["start"], max(fault["end"], fault["start"] + 0.5), color=colours[fault["kind"]],
                       alpha=0.25, linewidth=0)
        ax.set_title(panel["title"], fontsize=9)
        ax.legend(fontsize=7, loc="upper left", ncol=4)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.4) for k, c in colours.items()
               if any(f["kind"] == k for f in result.faults)]
    labels = [k for k in colours if any(f["kind"] == k for f in result.faults)]
    fig.legend(handles, labels, loc="upper right", title="faults", fontsize=8)
    fig.suptitle(f"bmq soak against {result.broker}: {result.seconds / 60:.0f} min, "
                 f"{'PASS' if result.ok else 'FAIL'}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.93, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def rejudge(run: Dict[str, Any]) -> List[str]:
    """The duplicates and stalls checks made again from a saved run (``as_dict`` JSON), one
    line each; a run saved before the checks kept what they need says what is missing."""
    totals, samples, faults = run["totals"], run["samples"], run["faults"]
    recorded = {check["name"]: check for check in run["checks"]}
    lines = []
    records = totals.get("duplicate_records")
    if records is None:
        old = recorded.get("duplicates explained by faults", {})
        lines.append(f"[not re-judged] duplicates: this run kept only counts by time window "
                     f"({totals.get('duplicates_by_fault')}), not each duplicate's evidence (the fault or "
                     f"connection loss between its two deliveries, whether its PUT was outstanding in one: "
                     f"totals.duplicate_records); its own verdict: {'ok' if old.get('ok') else 'FAILED'}")
    else:
        check, _ = judge_duplicates(records, totals["duplicates"])
        lines.append(f"[{'ok' if check.ok else 'FAILED'}] {check.name}: {check.detail}")
    patterns = sorted({key for sample in samples for key in sample["total"] if not key.startswith("deliver:")})
    # A run saved before they were kept: the default grace (benchmarks/soak.py has no option
    # for it) and the end of the fault schedule (producing stopped a moment later).
    grace = totals.get("grace", SoakConfig().grace)
    producing_until = totals.get("producing_until", run["seconds"])
    check = judge_stalls(samples, faults, patterns, grace, producing_until)
    assumed = ("" if "grace" in totals else
               f" (this run kept neither its grace nor the end of its posting: taken as {grace:g} s and its length)")
    lines.append(f"[{'ok' if check.ok else 'FAILED'}] {check.name}: {check.detail}{assumed}")
    return lines


def analyse(path: str, stretch: float = 1800.0) -> None:
    """Print a run's memory slopes (MB/min) per ``stretch`` seconds and over its last hour, the
    RSS change across each kind of fault against the quiet stretches between faults, and the
    duplicates and stalls checks made again (:func:`rejudge`)."""
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    samples, faults = run["samples"], run["faults"]
    keys = ("rss_mb", "malloc_in_use_mb", "malloc_free_mb", "ledger_mb", "samples_mb", "beyond_own")
    print(f"{'stretch (min)':>14} " + " ".join(f"{k:>16}" for k in keys))
    end = samples[-1]["t"]
    starts = [t for t in range(0, int(end), int(stretch))]
    for start in starts:
        part = [s for s in samples if start <= s["t"] <= start + stretch]
        late = slopes(part, stretch)
        print(f"{start / 60:>6.0f}-{min(end, start + stretch) / 60:<7.0f} " + " ".join(
            f"{late.get(k, float('nan')):>+16.3f}" for k in keys))
    last = slopes(samples, 3600.0)
    print(f"{'last hour':>14} " + " ".join(f"{last.get(k, float('nan')):>+16.3f}" for k in keys))

    def at(t: float) -> Dict[str, Any]:
        return min(samples, key=lambda s: abs(s["t"] - t))

    deltas: Dict[str, List[float]] = {}
    for fault in faults:  # from just before it to when its reconnects are over
        deltas.setdefault(fault["kind"], []).append(at(fault["end"] + 12)["rss_mb"] - at(fault["start"] - 2)["rss_mb"])
    for before, after in zip(faults, faults[1:]):
        deltas.setdefault("quiet", []).append(at(after["start"] - 2)["rss_mb"] - at(before["end"] + 12)["rss_mb"])
    for kind, values in deltas.items():
        print(f"RSS across {kind:>8}: n={len(values):3} mean {sum(values) / len(values):+.3f} MB, "
              f"total {sum(values):+.2f} MB")
    print("\n".join(rejudge(run)))


def main() -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default: %(default)s)")
    parser.add_argument("--bmqbrkr", action="store_true", help="against the real broker (../shared/bmqbrkr)")
    parser.add_argument("--png", metavar="FILE", help="draw the samples over time, faults marked")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default: %(default)s)")
    parser.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults (default: %(default)s)")
    parser.add_argument("--diag", metavar="FILE", type=Path,
                        help="append what grows (RSS by kind, malloc, object counts per type) as JSON lines")
    parser.add_argument("--diag-every", type=float, default=300.0,
                        help="seconds between --diag records (default: %(default)s)")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="with --diag: trace Python allocations, FRAMES deep (costs CPU and memory)")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="diagnostic: glibc malloc_trim(0) after every fault (RSS then shows what is live)")
    parser.add_argument("--analyse", metavar="FILE", help="analyse the JSON of an earlier run instead of running")
    args = parser.parse_args()
    if args.analyse:
        analyse(args.analyse)
        return 0
    home = None
    if args.bmqbrkr:
        home = default_bmqbrkr_home()
        if not (home / "run").exists():
            parser.error(f"--bmqbrkr: {home}/run not found")
    config = SoakConfig(seconds=args.minutes * 60, bmqbrkr_home=home, interval=args.interval,
                        fault_every=args.fault_every, diag_path=args.diag, diag_every=args.diag_every,
                        tracemalloc_frames=args.tracemalloc, malloc_trim=args.malloc_trim)
    result = run_soak(config)
    totals = result.totals
    print()
    for name, stream in totals["streams"].items():
        readers = {k: v for k, v in stream.items() if isinstance(v, dict)}
        print(f"{name:>10} ({stream['pattern']}, {stream['domain']}): posted {stream['posted']:,}, "
              f"acked {stream['acked']:,}; " + "; ".join(
                  f"{r}: delivered {v['delivered']:,}, missing {v['missing']}, lost with crashed memory "
                  f"{v['lost_with_crashed_memory']}" for r, v in readers.items()))
    print(f"session events: {totals['events']}")
    print(result.report())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"benchmark": "soak", "machine": machine_info(), **result.as_dict()}, f, indent=1)
            f.write("\n")
    if args.png:
        plot(result, args.png)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
