"""open_queue() of a URI whose open is under way in another thread: the same arguments wait
for it and share its handle, other ones are refused with the difference named; a post by URI
made meanwhile waits for the open. The open under way is held by a hook until the second call
waits for it (no timing)."""
from __future__ import annotations

import itertools
import threading
from typing import Any, Iterator, List

import pytest

import bmq

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()


class _AnnouncingEvent(threading.Event):
    """An event that says when a thread starts waiting on it."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self._waiting = waiting

    def wait(self, timeout: Any = None) -> bool:
        self._waiting.set()
        return super().wait(timeout)


def _hold_the_open(session: bmq.Session, waiting: threading.Event, inside: threading.Event) -> None:
    """The next open_queue() of ``session`` goes on only once a thread waits for it."""
    handles = session._handles
    real_open = handles.open

    def held_open(queue: Any, timeout: float, buffered: bool = False) -> None:
        queue.opened = _AnnouncingEvent(waiting)
        inside.set()
        assert waiting.wait(30.0)
        handles.open = real_open  # type: ignore[method-assign]
        real_open(queue, timeout, buffered=buffered)

    handles.open = held_open  # type: ignore[method-assign]


class _OpenUnderWay:
    """``open_queue(uri, write=True)`` in another thread, held by :func:`_hold_the_open` until
    a thread waits for it or :meth:`release` lets it go on."""

    def __init__(self, session: bmq.Session) -> None:
        self.uri = f"bmq://bmq.test.mem.priority/concurrent-open-{next(_names)}-{id(session)}"
        self._waiting, inside = threading.Event(), threading.Event()
        _hold_the_open(session, self._waiting, inside)
        self._opened: List[Any] = []
        self._thread = threading.Thread(
            target=lambda: self._opened.append(session.open_queue(self.uri, write=True)), daemon=True)
        self._thread.start()
        assert inside.wait(30.0)

    def release(self) -> None:
        """Let the held open go on (as a thread waiting for it would)."""
        self._waiting.set()

    def result(self) -> Any:
        """The queue the thread's open_queue() returned, once it has."""
        self._thread.join(30.0)
        assert len(self._opened) == 1
        return self._opened[0]

    def close(self) -> None:
        """Let the open go on and wait for its thread (after the test, whatever it did)."""
        self.release()
        self._thread.join(30.0)


@pytest.fixture
def open_under_way(session: bmq.Session) -> Iterator[_OpenUnderWay]:
    """An open of a fresh queue under way in another thread, held until a thread waits for it."""
    under_way = _OpenUnderWay(session)
    yield under_way
    under_way.close()


def test_an_open_with_the_same_arguments_waits_and_shares_the_handle(session, open_under_way):
    queue = session.open_queue(open_under_way.uri, write=True)  # waits for the first open
    assert open_under_way.result() is queue and queue.state is bmq.QueueState.OPEN
    assert queue.post(b"shared").status is bmq.AckStatus.SUCCESS


def test_an_open_with_other_arguments_is_refused_naming_the_difference(session, open_under_way):
    with pytest.raises(bmq.QueueStateError, match=r"already open .*read=False \(asked: True\)"):
        session.open_queue(open_under_way.uri, read=True, write=True)
    open_under_way.release()  # let the first open go on
    assert open_under_way.result().state is bmq.QueueState.OPEN
    with pytest.raises(bmq.QueueStateError, match=r"options=.*\(asked: "):
        session.open_queue(open_under_way.uri, write=True, options=bmq.QueueOptions(max_unconfirmed_messages=7))


def test_a_post_by_uri_during_the_open_waits_for_it(session, open_under_way):
    future = session.post_async(open_under_way.uri, b"posted while opening")  # waits for the open, then posts
    assert future.result(30.0).status is bmq.AckStatus.SUCCESS
    assert open_under_way.result().state is bmq.QueueState.OPEN
