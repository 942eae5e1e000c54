"""The same application code under the official ``blazingmq`` SDK and under ``bmq.compat``, in
one run: each pattern's throughput, CPU per message (client and broker) and the ratio.

The code of each pattern is written once against the official API and given the module to run
on (``blazingmq`` or ``bmq.compat``), as an application switched with ``bmq.compat.install()``
would run it:

* ``post_on_ack``: ``session.post(uri, payload, on_ack=...)`` for every message, then wait for
  the last ``on_ack`` (the official SDK's fastest way to post with acknowledgements).
* ``consume_on_message_confirm``: ``on_message`` calls ``handle.confirm()`` for each message of
  a queue filled beforehand (by bmq); timed from ``open_queue`` to the last callback.

100-byte messages, each pattern and client on a fresh queue of a freshly started broker
(bmqbrkr keeps every GUID for its de-duplication window: what ran before would weigh on what
follows). With ``--repeat N`` the two clients alternate and every figure is the median of N
runs, with each run's ratio listed. Goal (issue 31): bmq.compat >= 2x the official SDK on both
patterns against bmqbrkr.

Usage: ``python benchmarks/compat.py [--bmqbrkr [HOME] | --broker ADDR] [--messages N]
[--repeat N] [--json FILE]``. Without ``--bmqbrkr`` or ``--broker`` the embedded broker runs in
its own process.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import bmq.compat
from _report import (HAVE_OFFICIAL, BrokerProcess, add_broker_options, broker_starter, emit, fill_queue,
                     make_parser, measure, medians)

if HAVE_OFFICIAL:  # else the comparison is refused in main()
    import blazingmq

PAYLOAD = b"x" * 100
CONSUME_WINDOW = 1000
_names = itertools.count()


def fresh_uri(tag: str) -> str:
    return f"bmq://bmq.test.mem.priority/compat-{tag}-{next(_names)}-{time.monotonic_ns() % 10**9}"


# ---- the application code, written once against the official API -----------------------------
def post_on_ack(api: Any, address: str, uri: str, count: int) -> None:
    """Post ``count`` messages with an ``on_ack`` each; return after the last ACK."""
    left = [count]
    lock = threading.Lock()
    done = threading.Event()
    failed: List[Any] = []

    def on_ack(ack: Any) -> None:
        if ack.status != api.AckStatus.SUCCESS:
            failed.append(ack)
        with lock:
            left[0] -= 1
            if not left[0]:
                done.set()

    with api.Session(lambda event: None, broker=address) as session:
        session.open_queue(uri, write=True)
        for _ in range(count):
            session.post(uri, PAYLOAD, on_ack=on_ack)
        if not done.wait(120):
            raise RuntimeError(f"{api.__name__}: {left[0]} ACKs missing")
    if failed:
        raise RuntimeError(f"{api.__name__}: {len(failed)} NACKs, e.g. {failed[0]!r}")


def consume_on_message_confirm(api: Any, address: str, uri: str, count: int) -> None:
    """Receive ``count`` messages with ``on_message``, confirming each with its handle."""
    received = itertools.count(1)
    done = threading.Event()

    def on_message(message: Any, handle: Any) -> None:
        handle.confirm()
        if next(received) == count:
            done.set()

    with api.Session(lambda event: None, on_message, broker=address) as session:
        session.open_queue(uri, read=True, options=api.QueueOptions(max_unconfirmed_messages=CONSUME_WINDOW))
        if not done.wait(120):
            raise RuntimeError(f"{api.__name__}: consumer stalled")


def run_once(start_broker: Callable[[], BrokerProcess], pattern: str, api: Any, count: int) -> Dict[str, float]:
    broker = start_broker()
    try:
        uri = fresh_uri(pattern)
        if pattern == "post_on_ack":
            return measure(broker, lambda: post_on_ack(api, broker.address, uri, count), count)
        fill_queue(broker.address, uri, count, PAYLOAD)
        return measure(broker, lambda: consume_on_message_confirm(api, broker.address, uri, count), count)
    finally:
        broker.stop()


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = make_parser("the same code under blazingmq and under bmq.compat")
    add_broker_options(parser)
    parser.add_argument("--messages", type=int, default=20000, help="messages per pattern and run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per client and pattern (median reported)")
    parser.add_argument("--patterns", default="post_on_ack,consume_on_message_confirm")
    args = parser.parse_args(argv)
    if not HAVE_OFFICIAL:
        parser.error("the official blazingmq SDK is not installed (pip install blazingmq)")
    where_name, start_broker = broker_starter(args)
    clients = {"blazingmq": blazingmq, "bmq.compat": bmq.compat}
    results: Dict[str, Any] = {"broker": where_name, "messages": args.messages, "repeat": args.repeat}
    rows = []
    for pattern in args.patterns.split(","):
        runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in clients}
        for _ in range(args.repeat):
            for name, api in clients.items():  # alternating: a drift in the machine hits both
                runs[name].append(run_once(start_broker, pattern, api, args.messages))
        figures = medians(runs)
        ratios = [c["msgs_per_s"] / o["msgs_per_s"] for c, o in zip(runs["bmq.compat"], runs["blazingmq"])]
        ratio = figures["bmq.compat"]["msgs_per_s"] / figures["blazingmq"]["msgs_per_s"]
        for name, values in figures.items():
            for key, value in values.items():
                results[f"{pattern}.{name}.{key}"] = round(value, 3)
        results[f"{pattern}.ratio"] = round(ratio, 2)
        results[f"{pattern}.ratios_per_run"] = [round(r, 2) for r in ratios]
        official, compat = figures["blazingmq"], figures["bmq.compat"]
        rows.append([pattern, f"{official['msgs_per_s']:,.0f}", f"{compat['msgs_per_s']:,.0f}", f"{ratio:.2f}x",
                     f"{official['client_cpu_us_per_msg']:.1f} / {compat['client_cpu_us_per_msg']:.1f}",
                     f"{official['broker_cpu_us_per_msg']:.1f} / {compat['broker_cpu_us_per_msg']:.1f}",
                     " ".join(f"{r:.2f}" for r in ratios)])
    emit(f"The same code under blazingmq and bmq.compat ({where_name}, {args.messages:,} x 100 B, "
         f"median of {args.repeat})",
         ["pattern", "blazingmq msg/s", "bmq.compat msg/s", "ratio", "client CPU us/msg (official / compat)",
          "broker CPU us/msg", "ratio per run"], rows, results, args.json)
    return results


if __name__ == "__main__":
    main()
