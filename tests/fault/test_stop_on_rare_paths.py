"""stop() on rare paths: from a signal handler while the main thread waits for an ACK (reading
in the reader thread's place), and with an outbox whose final fsync fails."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Iterator, List

import pytest

import bmq
from bmq import _outbox
from bmq._transport import Transport

pytestmark = pytest.mark.timeout(120)

# x86_64 numbers of the calls a thread waiting in an epoll set makes (epoll_wait, epoll_pwait,
# epoll_pwait2): /proc tells when the main thread is blocked in one.
_EPOLL_WAITS = {"232", "281", "441"}


def _blocked_in_epoll(native_id: int) -> bool:
    try:
        with open(f"/proc/self/task/{native_id}/syscall") as f:
            return f.read().split(" ", 1)[0] in _EPOLL_WAITS
    except OSError:
        return False


@pytest.mark.skipif(not hasattr(os, "eventfd") or os.uname().machine != "x86_64",
                    reason="the main thread reads in the reader's place with epoll (Linux); syscall numbers of x86_64")
def test_stop_from_a_signal_handler_while_the_main_thread_waits_for_an_ack(broker):
    """The embedded broker only: bmqbrkr cannot be made to hold an ACK back for as long as the
    signal takes to come."""
    session = bmq.Session(broker.address, bmq.SessionOptions(busy_poll=0.0, disconnect_timeout=5.0))
    queue = session.open_queue("bmq://bmq.test.mem.priority/stop-in-handler", write=True)
    queue.post(b"warm-up")  # the main thread has read in the reader's place
    broker.faults.withhold_acks()
    took: List[float] = []

    def handler(signum: int, frame: Any) -> None:
        started = time.monotonic()
        session.stop()
        took.append(time.monotonic() - started)

    main = threading.main_thread()

    def send_when_waiting() -> None:
        # Once the main thread holds the lead and sleeps in its epoll set: a signal then finds
        # it there (the interleaving of the defect), not in Python code.
        transport = session._link.current.transport  # type: ignore[union-attr]
        while not (transport._lead.locked() and _blocked_in_epoll(main.native_id)):
            time.sleep(0.001)
        signal.pthread_kill(main.ident, signal.SIGALRM)  # type: ignore[arg-type]

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        threading.Thread(target=send_when_waiting, daemon=True).start()
        with pytest.raises(bmq.Error):
            queue.post(b"never acknowledged", timeout=30.0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        session.stop()
    assert took and took[0] < 2.5, took  # main: 10 s (nobody read the Disconnect response)


class _FsyncFails:
    """Outbox fsyncs fail, as on a disk that went away."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def failing(*_: Any) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(_outbox.Outbox, "_sync_unsynced", failing)


@pytest.fixture(params=["embedded", "bmqbrkr"])
def address(request: pytest.FixtureRequest, broker: Any) -> Iterator[str]:
    yield broker.address if request.param == "embedded" else request.getfixturevalue("bmqbrkr").address


def test_stop_completes_when_the_outboxs_final_fsync_fails(address, tmp_path, monkeypatch):
    session = bmq.Session(address, bmq.SessionOptions(outbox_dir=str(tmp_path)))
    queue = session.open_queue("bmq://bmq.test.mem.priority/stop-fsync-fails", write=True)
    queue.post(b"acknowledged")
    _FsyncFails(monkeypatch)
    with pytest.raises(bmq.OutboxError, match="Input/output error"):
        session.stop()
    events = []
    with pytest.raises(bmq.SessionClosedError):
        while True:  # main: no Disconnected, and no end (next_event() without timeout hung)
            events.append(session.next_event(timeout=30.0))
    assert isinstance(events[-1], bmq.events.Disconnected)
    assert not [t for t in threading.enumerate() if t.name.endswith(f"-{session._id}") and t.is_alive()]
    started = time.monotonic()
    session.stop(timeout=30.0)  # main: waited out its timeout
    assert time.monotonic() - started < 5.0


def test_the_wait_sets_stay_open_while_a_thread_is_still_waiting_in_them(monkeypatch):
    """The reader thread ends (the peer closed) while a thread is inside wait_for, having let go
    of the lead (as it does before a signal handler runs): the kick eventfds are closed only once
    it has left, so no latch writes to a descriptor number that may have been reused."""
    server = __import__("socket").create_server(("127.0.0.1", 0))
    peer: List[Any] = []
    threading.Thread(target=lambda: peer.append(server.accept()[0]), daemon=True).start()
    transport = Transport(server.getsockname(), lambda *_: None, lambda exc: None, 1 << 20, "sets")
    transport.connect(5.0)
    inside, leave = threading.Event(), threading.Event()

    def read_until(latch: Any, deadline: float, woken: Any) -> bool:
        transport._lead.release()  # as a wait that ended with nothing does
        inside.set()
        leave.wait(30.0)
        return False

    monkeypatch.setattr(transport, "_read_until", read_until)
    kick = os.fstat(transport._kick)
    latch = bmq._codec.Latch()
    waiter = threading.Thread(target=transport.wait_for, args=(latch, 30.0), daemon=True)
    waiter.start()
    assert inside.wait(30.0)
    while not peer:
        time.sleep(0.001)
    peer[0].close()
    transport._reader.join(30.0)  # type: ignore[union-attr]
    assert not transport._reader.is_alive()  # type: ignore[union-attr]
    still = os.fstat(transport._kick)  # main: closed (EBADF, or another file's)
    assert (still.st_ino, still.st_dev) == (kick.st_ino, kick.st_dev)
    latch.set()
    leave.set()
    waiter.join(30.0)
    assert transport._kick == -1  # closed by the last one out
    server.close()
