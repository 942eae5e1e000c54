"""One session hammered from many threads at once, on the GIL build and on a free-threaded one
(``PYTHON_GIL=0`` on 3.13t: see docs/free-threading.md), with the invariants checked:

- every post (``post``, ``post_async``, ``post_many``) gets exactly one Ack, SUCCESS, and an
  ``on_ack`` callback runs once per message; no two messages share a GUID;
- the consumers (``get`` + ``confirm`` from several threads) receive every posted payload
  exactly once;
- queues opened and closed meanwhile by another thread do not disturb the others;
- ``stop()`` called while every thread posts ends every call with a documented outcome: an Ack
  (SUCCESS, NOT_CONNECTED, CANCELED; a PostError carrying the failed ones) or
  SessionClosedError / QueueStateError / ConnectionLost from the call itself, and no thread
  hangs.

The threads run for ``BMQ_STRESS_SECONDS`` (default 4 s) of posting per broker, then drain.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import Future
from typing import Callable, Dict, List, Tuple

import pytest

import bmq

SECONDS = float(os.environ.get("BMQ_STRESS_SECONDS", "4"))
WAIT = 120.0  # bound of every join and drain: generous for a loaded 2-core machine
DOCUMENTED_ON_STOP = (bmq.SessionClosedError, bmq.QueueStateError, bmq.ConnectionLost)
ENDED_BY_STOP = {bmq.AckStatus.SUCCESS, bmq.AckStatus.NOT_CONNECTED, bmq.AckStatus.CANCELED}


def gil_state() -> str:
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return "gil" if is_enabled is None or is_enabled() else "free-threaded"


class Run:
    """What the threads did, collected under one lock (the checks read it after joins)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.posted: List[bytes] = []  # payloads whose post was accepted
        self.acks: List[bmq.Ack] = []  # every Ack returned or resolved
        self.callback_guids: List[bytes] = []  # every on_ack call
        self.received: List[bytes] = []
        self.errors: List[BaseException] = []  # anything a thread raised

    def record(self, payloads: List[bytes], acks: List[bmq.Ack]) -> None:
        with self.lock:
            self.posted += payloads
            self.acks += acks
            self.lock.notify_all()

    def wait_for_acks(self, count: int) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.acks) >= count or self.errors, WAIT)

    def on_ack(self, ack: bmq.Ack) -> None:
        with self.lock:
            self.callback_guids.append(ack.guid)


def run_threads(targets: Dict[str, Callable[[], None]], run: Run) -> List[threading.Thread]:
    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def main() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: B902 - reported by the test, not lost
                with run.lock:
                    run.errors.append(exc)
                    run.lock.notify_all()
        return main

    threads = [threading.Thread(target=guarded(body), name=f"stress-{name}", daemon=True)
               for name, body in targets.items()]
    for t in threads:
        t.start()
    return threads


def join_all(threads: List[threading.Thread], state: Callable[[], str] = lambda: "") -> None:
    """Join ``threads`` within WAIT; a thread still running fails the test with its stack and
    ``state()`` (what the threads did so far: a hang is a bug to find, not only to count)."""
    deadline = time.monotonic() + WAIT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    frames = sys._current_frames()
    assert [t.name for t in stuck] == [], "\n".join(
        [f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}" for t in stuck if t.ident in frames]
        + [state()])


def posters(queue: bmq.Queue, run: Run, until: Callable[[], bool]) -> Dict[str, Callable[[], None]]:
    """Two threads each of post, post_async (with on_ack) and post_many."""
    def blocking(tag: str) -> Callable[[], None]:
        def body() -> None:
            i = 0
            while not until():
                payload = f"{tag}-{i}".encode()
                run.record([payload], [queue.post(payload)])
                i += 1
        return body

    def asynchronous(tag: str) -> Callable[[], None]:
        def body() -> None:
            futures: List[Future[bmq.Ack]] = []
            payloads: List[bytes] = []
            i = 0
            try:
                while not until():
                    payload = f"{tag}-{i}".encode()
                    futures.append(queue.post_async(payload, on_ack=run.on_ack))
                    payloads.append(payload)
                    i += 1
                    if len(futures) >= 64:  # bounded in flight, as an application keeps it
                        run.record(payloads, [f.result(WAIT) for f in futures])
                        futures, payloads = [], []
            finally:  # also when stop() ended the loop: what was accepted gets its Ack
                run.record(payloads, [f.result(WAIT) for f in futures])
        return body

    def many(tag: str) -> Callable[[], None]:
        def body() -> None:
            i = 0
            while not until():
                payloads = [f"{tag}-{i}-{j}".encode() for j in range(25)]
                run.record(payloads, queue.post_many(payloads))
                i += 1
        return body

    return {"post-0": blocking("post-0"), "post-1": blocking("post-1"),
            "async-0": asynchronous("async-0"), "async-1": asynchronous("async-1"),
            "many-0": many("many-0"), "many-1": many("many-1")}


def test_one_session_from_many_threads_loses_and_duplicates_nothing(broker_address: str) -> None:
    run = Run()
    uri = f"bmq://bmq.test.mem.priority/stress-{gil_state()}-{os.getpid()}"
    with bmq.Session(broker_address) as session:
        queue = session.open_queue(uri, read=True, write=True)
        posting_done = threading.Event()
        gets: Counter[Tuple[str, str]] = Counter()  # (consumer, what get() returned): for a failure report

        def consumer() -> None:
            name = threading.current_thread().name
            while True:
                message = queue.get(timeout=0.05)
                gets[name, "none" if message is None else "message"] += 1
                if message is None:
                    with run.lock:
                        if run.errors or posting_done.is_set() and len(run.received) >= len(run.posted):
                            return  # all in (or a thread failed: the checks below report it)
                    continue
                message.confirm() if len(message.data) % 2 else session.confirm(message)
                with run.lock:
                    run.received.append(bytes(message.data))

        def churner() -> None:
            # Opens and closes other queues (a write handle posting once, a read handle) while
            # the rest post and consume: request ids, queue ids and the registry are shared.
            n = 0
            while not run.stop.is_set():
                other = session.open_queue(f"{uri}-churn-{n % 3}", write=True, read=bool(n % 2))
                assert other.post(b"churn").ok
                other.close()
                n += 1

        deadline = time.monotonic() + SECONDS
        targets = posters(queue, run, lambda: time.monotonic() >= deadline)
        targets.update({"consumer-0": consumer, "consumer-1": consumer})
        threads = run_threads(targets, run)
        churn = run_threads({"churner": churner}, run)
        join_all(threads[:6])  # the posters
        run.stop.set()
        join_all(churn)
        posting_done.set()
        join_all(threads[6:], lambda: (
            f"posted {len(run.posted)}, received {len(run.received)} ({len(set(run.received))} distinct, "
            f"{len(set(run.posted) - set(run.received))} missing), errors {run.errors!r}, gets {dict(gets)}, "
            f"{session.stats().queues[uri]}"))
        stats = session.stats().queues[uri]

    assert run.errors == []
    assert run.posted, "nothing was posted"
    assert [a.status for a in run.acks if not a.ok] == []
    guids = [a.guid for a in run.acks]
    assert len(guids) == len(run.posted) and len(set(guids)) == len(guids)
    # Every on_ack ran once, for a message posted with post_async.
    async_guids = [a.guid for p, a in zip(run.posted, run.acks) if p.startswith(b"async")]
    assert Counter(run.callback_guids) == Counter(async_guids)
    assert Counter(run.received) == Counter(run.posted)  # nothing lost, nothing twice
    assert stats.posted == len(run.posted) and stats.acked == {"SUCCESS": len(run.posted)}
    assert stats.in_flight == 0 and stats.confirmed == stats.pushed == len(run.posted)


def test_stop_while_threads_post_ends_every_call_with_a_documented_outcome(broker_address: str) -> None:
    run = Run()
    uri = f"bmq://bmq.test.mem.priority/stress-stop-{gil_state()}-{os.getpid()}"
    session = bmq.Session(broker_address)
    queue = session.open_queue(uri, write=True)
    started = threading.Barrier(7, timeout=WAIT)
    stopped = threading.Event()

    def post_until_stopped(body: Callable[[], None]) -> Callable[[], None]:
        def main() -> None:
            started.wait()
            while True:
                try:
                    body()
                except bmq.PostError as exc:  # post/post_many: the failed Acks (NOT_CONNECTED...)
                    run.record([], exc.acks)
                    if stopped.is_set() or not session.is_running:
                        return
                    raise
                except DOCUMENTED_ON_STOP:
                    if stopped.is_set() or not session.is_running:
                        return
                    raise
        return main

    targets = {name: post_until_stopped(body)
               for name, body in posters(queue, run, lambda: False).items()}
    threads = run_threads(targets, run)
    started.wait()
    run.wait_for_acks(200)  # every kind of post is under way
    session.stop()
    stopped.set()
    join_all(threads)

    assert run.errors == []
    statuses = Counter(a.status for a in run.acks)
    assert set(statuses) <= ENDED_BY_STOP, statuses
    assert statuses[bmq.AckStatus.SUCCESS] >= 200
    guids = [a.guid for a in run.acks]
    assert len(set(guids)) == len(guids)
    assert len(set(run.callback_guids)) == len(run.callback_guids)
