"""Client memory per message buffered while the broker is unreachable (issue 29), per API and
payload size, against the official ``blazingmq`` SDK in the same scenario; then what a poster
sees at the buffer's bound, and that nothing it accepted is lost once the broker returns.

Scenario, the same for every client: the embedded broker runs in its own process; the client
connects and opens a queue for writing; the broker process is stopped, and once the client has
seen the connection go, it posts N messages with fresh payloads (which it does not keep, as an
application would not). The figure is the growth of the process's resident memory (RSS) per
message minus the size of the payload object (``sys.getsizeof``: 133 bytes for 100 bytes of
data): what buffering one message costs beyond the payload the application handed over, which
bmq keeps as it is (the official SDK copies it; subtracting the same from its figure favours
it by the 33 bytes of the object's header). The raw growth per message is in the JSON too. Each
measurement runs in a fresh process, so that nothing measured before weighs on it.

* ``post_async`` and ``post_many_async`` (1,000 per call): the caller keeps the futures, as one
  that wants their answers does (what the caller's list of them costs is included).
* ``post_many``: blocking calls of 1,000 messages, one thread each, measured while all of them
  wait for their ACKs.
* ``post``: one blocking call per thread; the threads are started (and waiting) before the
  first reading, so the figure is the post's, not its thread's.
* official SDK and ``bmq.compat``: ``session.post(uri, payload, on_ack=callback)``, the same code
  on both (the official SDK's only way to post).

Goal (issue 29): at most 400 bytes per message for ``post_async`` and 200 for ``post_many``
(100-byte payloads).

The bound: a session with ``max_pending_bytes`` = 1 MiB and ``channel_write_timeout`` = 1 s
posts 100-byte messages with ``post_async`` into the gap until a post fails; printed are the
messages accepted, how long the failing post waited and its error; then a broker is started on
the same port, and every accepted message must be acknowledged and stored exactly once.

Usage: ``python benchmarks/memory.py [--messages N] [--json FILE]``. The machine's other work
changes RSS little; these figures are about bytes, not time.
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import bmq  # noqa: E402
import bmq.compat  # noqa: E402
import bmq.events  # noqa: E402
from _report import HAVE_OFFICIAL, BrokerProcess, emit, make_parser  # noqa: E402
from endurance import rss_mb  # noqa: E402  (the soak's reader of /proc)

if HAVE_OFFICIAL:  # else the comparison is refused in main()
    import blazingmq

URI = "bmq://bmq.test.mem.priority/memory"
SMALL, LARGE = 100, 10 * 1024
CHUNK = 1000  # messages per post_many call
# (client, API): the bmq APIs, then the same application code on the official SDK and bmq.compat.
CASES: List[Tuple[str, str]] = [("bmq", "post_async"), ("bmq", "post_many_async"), ("bmq", "post_many"),
                                ("bmq", "post"), ("blazingmq", "post(on_ack)"), ("bmq.compat", "post(on_ack)")]
BLOCKING_POSTS = 1000  # one thread each


def rss() -> int:
    """This process's resident memory, bytes (after a garbage collection)."""
    gc.collect()
    return round(rss_mb() * 1024 * 1024)


def fresh_payloads(first: int, count: int, size: int) -> List[bytes]:
    """``count`` distinct payloads of ``size`` bytes, new objects (numbered from ``first``)."""
    filler = b"x" * (size - 8)
    return [i.to_bytes(8, "big") + filler for i in range(first, first + count)]


def figures(before: int, after: int, count: int, size: int) -> Dict[str, Any]:
    """RSS growth per message, raw and beyond the payload object."""
    raw = (after - before) / count
    return {"messages": count, "rss_per_message": raw, "bytes_per_message": raw - sys.getsizeof(b"x" * size)}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---- one measurement, in its own process --------------------------------------------------------
def measure_bmq(api: str, size: int, count: int) -> Dict[str, Any]:
    """Bytes per buffered message beyond its payload for one bmq API."""
    broker = BrokerProcess()
    # Nothing expires while we measure, and no reconnection attempt allocates its buffers then (a
    # 1 MiB receive buffer is 1 KiB per message over 1,000 blocking posts).
    options = bmq.SessionOptions(ack_timeout=3600.0, reconnect=bmq.ReconnectPolicy(initial_delay=3600.0,
                                                                                   max_delay=3600.0))
    session = bmq.Session(broker.address, options)
    queue = session.open_queue(URI, write=True)
    broker.stop()
    while not isinstance(session.next_event(10.0), bmq.events.ConnectionLost):
        pass
    kept: List[Any] = []
    threads: List[threading.Thread] = []
    go = threading.Event()
    if api == "post":
        count = min(count, BLOCKING_POSTS)
    if api in ("post", "post_many"):
        posters = count if api == "post" else max(1, count // CHUNK)

        def blocked(first: int, share: int) -> None:
            go.wait()
            try:
                if api == "post":
                    queue.post(fresh_payloads(first, 1, size)[0])
                else:
                    queue.post_many(fresh_payloads(first, share, size))
            except bmq.Error:
                pass  # the session stops once measured

        share = count // posters
        threads = [threading.Thread(target=blocked, args=(i * share, share)) for i in range(posters)]
        for thread in threads:
            thread.start()
        count = share * posters
    before = rss()
    if api == "post_async":
        for first in range(0, count, CHUNK):
            kept.extend(map(queue.post_async, fresh_payloads(first, min(CHUNK, count - first), size)))
    elif api == "post_many_async":
        for first in range(0, count, CHUNK):
            kept.extend(queue.post_many_async(fresh_payloads(first, min(CHUNK, count - first), size)))
    else:
        go.set()
        wait_until(lambda: session.stats().queues[URI].in_flight == count, "every blocking post to be buffered")
    after = rss()
    session.stop()
    for thread in threads:
        thread.join()
    return figures(before, after, count, size)


def measure_official_api(module: Any, size: int, count: int) -> Dict[str, Any]:
    """Bytes per buffered message beyond its payload for ``session.post(..., on_ack=...)`` on
    ``module`` (the official SDK or bmq.compat)."""
    broker = BrokerProcess()
    lost = threading.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, module.session_events.ConnectionLost):
            lost.set()

    acks: List[Any] = []
    session = module.Session(on_event, broker=broker.address)
    session.open_queue(URI, write=True)
    broker.stop()
    if not lost.wait(30.0):
        raise RuntimeError(f"{module.__name__} did not see the connection go")
    before = rss()
    errors = 0
    filler = b"x" * (size - 8)
    for i in range(count):
        try:
            session.post(URI, i.to_bytes(8, "big") + filler, on_ack=acks.append)
        except module.Error:
            errors += 1
    after = rss()
    session.stop()
    return {**figures(before, after, count, size), "errors": errors}


def child(client: str, api: str, size: int, count: int) -> None:
    """Run one measurement and print it as a JSON line (the parent reads the last line)."""
    if client == "bmq":
        result = measure_bmq(api, size, count)
    else:
        result = measure_official_api(blazingmq if client == "blazingmq" else bmq.compat, size, count)
    print(json.dumps(result), flush=True)


def run_child(client: str, api: str, size: int, count: int) -> Dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", client, api, str(size), str(count)],
                          capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"{client} {api} {size}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# ---- the bound ----------------------------------------------------------------------------------
def at_the_bound() -> Dict[str, Any]:
    """Post into the gap until the buffer's bound refuses; then bring a broker back on the same
    port and check that every accepted message is acknowledged and stored once."""
    broker = BrokerProcess()
    options = bmq.SessionOptions(max_pending_bytes=1 << 20, channel_write_timeout=1.0, ack_timeout=300.0)
    accepted: Dict[bytes, Any] = {}
    with bmq.Session(broker.address, options) as session:
        queue = session.open_queue(URI, write=True)
        broker.stop()
        while not isinstance(session.next_event(10.0), bmq.events.ConnectionLost):
            pass
        error: Optional[BaseException] = None
        waited = 0.0
        for payload in fresh_payloads(0, 20000, SMALL):
            started = time.monotonic()
            try:
                accepted[payload] = queue.post_async(payload)
            except bmq.BandwidthLimitError as e:
                error, waited = e, time.monotonic() - started
                break
        if error is None:
            raise RuntimeError("posting never reached the bound")
        returned = BrokerProcess(["--port", str(broker.port)])
        try:
            statuses = [future.result(60.0).status for future in accepted.values()]
            with bmq.Session(returned.address) as reader_session:
                reader = reader_session.open_queue(URI, read=True)
                stored: List[bytes] = []
                while True:
                    message = reader.get(timeout=2.0)
                    if message is None:
                        break
                    stored.append(message.data)
                    message.confirm()
        finally:
            returned.stop()
    acked = statuses.count(bmq.AckStatus.SUCCESS)
    return {"accepted": len(accepted), "failing_post_waited_s": round(waited, 2), "error": str(error),
            "acknowledged": acked, "stored": len(stored), "stored_distinct": len(set(stored)),
            "lost": len(set(accepted) - set(stored))}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = make_parser("client memory per message buffered while the broker is unreachable")
    parser.add_argument("--messages", type=int, default=100_000,
                        help="messages per measurement with 100-byte payloads (a tenth with 10 KiB)")
    parser.add_argument("--child", nargs=4, metavar=("CLIENT", "API", "SIZE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        client, api, size, count = args.child
        child(client, api, int(size), int(count))
        return {}
    if not HAVE_OFFICIAL:
        parser.error("the official blazingmq SDK is not installed (pip install blazingmq)")
    results: Dict[str, Any] = {"messages": args.messages}
    rows = []
    for size in (SMALL, LARGE):
        count = args.messages if size == SMALL else args.messages // 10
        figures = {(client, api): run_child(client, api, size, count) for client, api in CASES}
        official = figures[("blazingmq", "post(on_ack)")]["bytes_per_message"]
        for (client, api), figure in figures.items():
            per_message = figure["bytes_per_message"]
            results[f"{client}.{api}.{size}.bytes_per_message"] = round(per_message, 1)
            results[f"{client}.{api}.{size}.messages"] = figure["messages"]
            results[f"{client}.{api}.{size}.rss_per_message"] = round(figure["rss_per_message"], 1)
            rows.append([client, api, size, figure["messages"], round(figure["rss_per_message"]), round(per_message),
                         f"{official / per_message:.1f}x"])
    bound = at_the_bound()
    results.update({f"bound.{key}": value for key, value in bound.items()})
    emit("Client memory per message buffered while the broker is down (RSS growth, bytes per message)",
         ["client", "API", "payload B", "messages", "RSS/message", "beyond payload", "official SDK / this"], rows,
         results, args.json)
    print(f"\nAt the bound (max_pending_bytes 1 MiB, channel_write_timeout 1 s): {bound['accepted']:,} posts "
          f"accepted; the next waited {bound['failing_post_waited_s']} s, then raised BandwidthLimitError: "
          f"{bound['error']}\nBroker back: {bound['acknowledged']:,} acknowledged SUCCESS, {bound['stored']:,} "
          f"stored ({bound['stored_distinct']:,} distinct), {bound['lost']} lost.")
    return results


if __name__ == "__main__":
    main()
