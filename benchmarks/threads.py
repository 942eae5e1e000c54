"""bmq's posting and consuming patterns from 1, 2, 4 and 8 threads on one session, on several
Python builds side by side in the same run: the free-threaded build (3.13t, ``PYTHON_GIL=0``) against the
GIL build (issue 41, docs/free-threading.md).

Patterns (100-byte messages, the same as ``benchmarks/e2e.py``'s, each thread on the one
session's one queue, ``--messages`` in all split between the threads):

* ``post``: blocking ``post()`` in every thread (e2e's ``post_8_threads`` with N threads);
* ``post_async_window``: every thread keeps 100 ``post_async`` in flight (e2e's pattern, per thread);
* ``post_many``: every thread posts blocking ``post_many`` of 1,000 (e2e's pattern, per thread);
* ``consume_get_confirm``: every thread takes messages with ``get()`` and confirms each from one
  queue filled beforehand (e2e's pattern, per thread; the clock starts once it is filled and open).

Every measurement runs in a fresh child process of the interpreter under test (``--python
PATH[:VAR=VALUE,...]``, repeatable; each needs bmq built for it), against one embedded broker in
its own process started by this script with its own interpreter, so that every build posts to
the same broker. The builds alternate within each (pattern, threads) cell. Figures: messages per
second, the client's CPU microseconds per message (the child's, from after its session
connected), the broker's, and the 1-minute load average before the cell (the machine is
shared: read the figures with it).

Usage: ``python benchmarks/threads.py --python /venv313/bin/python --python
/venv313t/bin/python:PYTHON_GIL=0 [--threads 1,2,4,8] [--patterns ...] [--messages N] [--repeat N]
[--json FILE]``
"""
from __future__ import annotations

import json
import os
import queue as stdqueue
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bmq  # noqa: E402
from _report import BrokerProcess, emit, fill_queue, make_parser  # noqa: E402
from e2e import BATCH, CONSUME_WINDOW, PAYLOAD, WINDOW, _in_threads, _session, fresh_uri  # noqa: E402

PATTERNS = ("post", "post_async_window", "post_many", "consume_get_confirm")


def run_pattern(address: str, pattern: str, threads: int, count: int) -> Dict[str, float]:
    """In the child: ``count`` messages of ``pattern`` from ``threads`` threads; its figures."""
    uri = fresh_uri(f"threads-{pattern}")
    if pattern == "consume_get_confirm":
        fill_queue(address, uri, count, PAYLOAD)
    with _session(address) as session:
        body: Callable[[], Any]
        if pattern == "consume_get_confirm":
            queue = session.open_queue(uri, read=True,
                                       options=bmq.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
            calls = count

            def body() -> None:
                message = queue.get(timeout=60)
                if message is None:
                    raise RuntimeError("the consumer stalled")
                message.confirm()
        else:
            queue = session.open_queue(uri, write=True)
        if pattern == "post":
            calls, body = count, lambda: queue.post(PAYLOAD)
        elif pattern == "post_many":
            calls, body = max(threads, count // BATCH), lambda: queue.post_many([PAYLOAD] * BATCH)
        elif pattern == "post_async_window":
            calls = threads

            def body() -> None:
                window: "stdqueue.SimpleQueue[Any]" = stdqueue.SimpleQueue()
                for i in range(count // threads):
                    if i >= WINDOW:
                        window.get().result(60)
                    window.put(queue.post_async(PAYLOAD))
                while not window.empty():
                    window.get().result(60)
        per_call = {"post_many": BATCH, "post_async_window": count // threads}.get(pattern, 1)
        sent = calls // threads * threads * per_call  # what _in_threads runs: calls // threads each
        cpu0, t0 = time.process_time(), time.perf_counter()
        _in_threads(body, calls, threads)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return {"messages": sent, "msgs_per_s": sent / elapsed, "client_cpu_us_per_msg": cpu / sent * 1e6}


def child_main(argv: List[str]) -> None:
    address, pattern, threads, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    figures = run_pattern(address, pattern, threads, count)
    print(json.dumps({**figures, "gil": gil}))


def parse_python(spec: str) -> Tuple[str, Dict[str, str], str]:
    """``PATH[:VAR=VALUE,...]`` as (path, environment additions, label)."""
    path, _, extra = spec.partition(":")
    env = dict(item.split("=", 1) for item in extra.split(",") if item)
    version = subprocess.run([path, "-c", "import sys, sysconfig; print(sys.version.split()[0] + "
                              "('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    label = version + "".join(f" {k}={v}" for k, v in env.items())
    return path, env, label


def measure_child(python: str, env: Dict[str, str], broker: BrokerProcess, pattern: str, threads: int,
                  count: int) -> Dict[str, Any]:
    root = Path(__file__).resolve().parents[1]
    child_env = dict(os.environ, **env, PYTHONPATH=str(root))
    broker0 = broker.cpu_seconds()
    done = subprocess.run([python, __file__, "--child", broker.address, pattern, str(threads), str(count)],
                          capture_output=True, text=True, env=child_env, timeout=600, cwd=root)
    if done.returncode:
        raise RuntimeError(f"{python} {pattern} x{threads} failed:\n{done.stderr[-2000:]}")
    figures: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # The broker's CPU over the whole child run (its connect and queue open included: small).
    figures["broker_cpu_us_per_msg"] = (broker.cpu_seconds() - broker0) / figures["messages"] * 1e6
    return figures


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, metavar="PATH[:VAR=VALUE,...]",
                        help="an interpreter to measure (with environment additions); repeatable")
    parser.add_argument("--threads", default="1,2,4,8", help="comma-separated thread counts")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help="comma-separated patterns")
    parser.add_argument("--messages", type=int, default=20000, help="messages per measurement")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell (figures are medians)")
    args = parser.parse_args(argv)
    pythons = [parse_python(spec) for spec in args.python]
    thread_counts = [int(t) for t in args.threads.split(",")]
    patterns = [p for p in args.patterns.split(",") if p]
    unknown = sorted(set(patterns) - set(PATTERNS))
    if unknown:
        parser.error(f"unknown patterns {unknown}; known: {', '.join(PATTERNS)}")
    broker = BrokerProcess()
    results: Dict[str, Any] = {}
    rows = []
    try:
        for pattern in patterns:
            for threads in thread_counts:
                load = os.getloadavg()[0]
                runs: Dict[str, List[Dict[str, Any]]] = {label: [] for _, _, label in pythons}
                for r in range(args.repeat):
                    order = pythons if r % 2 == 0 else pythons[::-1]
                    for python, env, label in order:
                        runs[label].append(measure_child(python, env, broker, pattern, threads, args.messages))
                row: List[Any] = [pattern, threads, f"{load:.1f}"]
                for _, _, label in pythons:
                    median = {key: statistics.median(run[key] for run in runs[label])
                              for key in ("msgs_per_s", "client_cpu_us_per_msg", "broker_cpu_us_per_msg")}
                    for key, value in median.items():
                        results[f"{pattern}.{threads}.{label}.{key}"] = round(value, 1)
                    results[f"{pattern}.{threads}.load"] = round(load, 1)
                    row += [f"{median['msgs_per_s']:,.0f}", f"{median['client_cpu_us_per_msg']:.1f}",
                            f"{median['broker_cpu_us_per_msg']:.1f}"]
                rows.append(row)
                print(" | ".join(str(c) for c in row), flush=True)
    finally:
        broker.stop()
    headers = ["pattern", "threads", "load"]
    for _, _, label in pythons:
        headers += [f"{label} msg/s", "client us/msg", "broker us/msg"]
    emit("bmq posting from N threads: Python builds side by side (embedded broker, own process)",
         headers, rows, results, args.json)
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        main()
