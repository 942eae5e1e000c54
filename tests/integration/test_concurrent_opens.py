"""open_queue() of a URI whose open is under way in another thread: the same arguments wait
for it and share its handle, other ones are refused with the difference named; a post by URI
made meanwhile waits for the open. The open under way is held by a hook until the second call
waits for it (no timing)."""
from __future__ import annotations

import itertools
import threading
from typing import Any, List

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


def _open_in_thread(session: bmq.Session, uri: str, **kwargs: Any) -> "tuple[threading.Thread, List[Any]]":
    opened: List[Any] = []
    thread = threading.Thread(target=lambda: opened.append(session.open_queue(uri, **kwargs)), daemon=True)
    thread.start()
    return thread, opened


def test_an_open_with_the_same_arguments_waits_and_shares_the_handle(session):
    uri = f"bmq://bmq.test.mem.priority/concurrent-open-{next(_names)}-{id(session)}"
    waiting, inside = threading.Event(), threading.Event()
    _hold_the_open(session, waiting, inside)
    thread, opened = _open_in_thread(session, uri, write=True)
    assert inside.wait(30.0)
    queue = session.open_queue(uri, write=True)  # waits for the first open
    thread.join(30.0)
    assert opened == [queue] and queue.state is bmq.QueueState.OPEN
    assert queue.post(b"shared").status is bmq.AckStatus.SUCCESS


def test_an_open_with_other_arguments_is_refused_naming_the_difference(session):
    uri = f"bmq://bmq.test.mem.priority/concurrent-open-{next(_names)}-{id(session)}"
    waiting, inside = threading.Event(), threading.Event()
    _hold_the_open(session, waiting, inside)
    thread, opened = _open_in_thread(session, uri, write=True)
    assert inside.wait(30.0)
    with pytest.raises(bmq.QueueStateError, match=r"already open .*read=False \(asked: True\)"):
        session.open_queue(uri, read=True, write=True)
    waiting.set()  # let the first open go on
    thread.join(30.0)
    assert opened and opened[0].state is bmq.QueueState.OPEN
    with pytest.raises(bmq.QueueStateError, match=r"options=.*\(asked: "):
        session.open_queue(uri, write=True, options=bmq.QueueOptions(max_unconfirmed_messages=7))


def test_a_post_by_uri_during_the_open_waits_for_it(session):
    uri = f"bmq://bmq.test.mem.priority/concurrent-open-{next(_names)}-{id(session)}"
    waiting, inside = threading.Event(), threading.Event()
    _hold_the_open(session, waiting, inside)
    thread, opened = _open_in_thread(session, uri, write=True)
    assert inside.wait(30.0)
    future = session.post_async(uri, b"posted while opening")  # waits for the open, then posts
    assert future.result(30.0).status is bmq.AckStatus.SUCCESS
    thread.join(30.0)
    assert opened and opened[0].state is bmq.QueueState.OPEN
