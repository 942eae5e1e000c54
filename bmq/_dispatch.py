"""The dispatcher thread (user callbacks), the session event queue, and the helpers that make
and resolve futures.

What a callback raises (``on_message``, ``on_ack``, ``on_event``, ``on_stats``, a function
given to ``call_soon``) is reported once, by :func:`report_callback_error`, and the dispatcher
goes on with the next callback; docs/observability.md ("Callback errors") is the user's view.
"""
from __future__ import annotations

import collections
import logging
import operator
import os
import queue as _stdqueue
import sys
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, RUNNING
from itertools import groupby
from typing import Any, Callable, Deque, Iterable, List, Optional, Sequence, Tuple

from . import events as ev

__all__ = ["Dispatcher", "EventQueue", "PostFuture", "new_futures", "thread_condition", "resolve_future",
           "resolve_futures", "fail_future", "report_callback_error", "logging_configured"]

logger = logging.getLogger(__name__)

_STOP = object()
_DONE_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_condition_of = operator.attrgetter("_condition")
_first = operator.itemgetter(0)
# How long a post future's result() may read in the reader's place when given no timeout (it
# then goes on waiting on its condition): Transport.wait_for takes seconds.
_READ_FOREVER = 1e9

# How a thread waiting for a post's answer waits while reading the socket in the reader
# thread's place where the connection lets it: PendingPuts.await_answer(latch, timeout).
AwaitAnswer = Callable[[Any, float], bool]


class _KickingCondition(threading.Condition):
    """The condition of post futures. While a thread waiting for one of them waits for the
    socket in the reader thread's place (see :class:`FutureLatch`), ``notify_all`` also writes
    the eventfd ``kick_fd`` in that epoll set, so that a future resolved by another thread (the
    reader thread, an ACK timeout, the session stopping) wakes it there."""

    kick_fd = -1  # set and read under the condition's lock

    def notify_all(self) -> None:
        super().notify_all()
        if self.kick_fd >= 0:
            try:
                os.eventfd_write(self.kick_fd, 1)
            except OSError:  # closed by its transport, whose reader gave up waiting for the waiter
                pass  # the waiter looks at its future after every read, then waits on this condition


class FutureLatch:
    """A post future as :meth:`bmq._transport.Transport.wait_for` waits for a latch: set once
    the future is done; ``kick_to`` registers the eventfd with the future's condition.
    ``wait`` does not wait: the future waits on its condition after ``wait_for`` returns."""

    __slots__ = ("_future",)

    def __init__(self, future: "PostFuture") -> None:
        self._future = future

    def kick_to(self, kick_fd: int) -> bool:
        """From now on resolving the future writes ``kick_fd`` (-1: stop); True if done already."""
        condition = self._future._condition
        with condition:
            condition.kick_fd = kick_fd  # type: ignore[attr-defined]
            return self.is_set()

    def is_set(self) -> bool:
        return self._future._state in _DONE_STATES  # type: ignore[attr-defined]

    def wait(self, timeout: float) -> bool:
        return self.is_set()


class PostFuture(Future):  # type: ignore[type-arg]
    """A standard Future whose condition is shared with other futures: those of one post call,
    or the single-post futures made in one thread.

    A Future's own Condition (with its lock and waiter deque) costs more than the rest of
    posting a small message, and keeps the garbage collector busy while many are pending.
    Sharing one per batch is safe because :meth:`result` and :meth:`exception` here re-check
    their own state after every wake-up; ``concurrent.futures.wait`` / ``as_completed``
    work unchanged (the shared lock is re-entrant).

    Its state is in slots and its waiter and callback lists are made on first use (by
    ``concurrent.futures.wait``, ``as_completed``, ``add_done_callback``), in one slot: a
    buffered post's future is 112 bytes rather than 240 (issue 29's memory bound). ``_exception`` is a class
    default, set on the instance only by ``set_exception``.

    Given ``await_answer``, :meth:`result` and :meth:`exception` wait through it first: on
    Linux a thread alone waiting for the session's answers reads the socket itself, so the ACK
    wakes it rather than the reader thread, which would then have to wake it (see
    Transport.wait_for). ``concurrent.futures.wait`` and ``as_completed`` do not read.
    """

    __slots__ = ("_condition", "_state", "_result", "_await_answer", "_lists")
    _exception: Optional[BaseException] = None

    def __init__(self, condition: threading.Condition, await_answer: Optional[AwaitAnswer] = None) -> None:
        # Future.__init__ is not called: it would make a Condition and two lists.
        self._condition = condition
        self._await_answer = await_answer
        # Born running, as new_futures promises; nobody else holds it yet, so no notify.
        self._state = RUNNING
        self._result = None
        self._lists: Optional[Tuple[List[Any], List[Any]]] = None  # (waiters, done callbacks)

    def _made_lists(self) -> Tuple[List[Any], List[Any]]:
        lists = self._lists
        if lists is None:
            lists = self._lists = ([], [])
        return lists

    @property
    def _waiters(self) -> List[Any]:  # type: ignore[override]
        """Future's list of ``concurrent.futures`` waiters, made when first asked for."""
        return self._made_lists()[0]

    @property
    def _done_callbacks(self) -> List[Any]:  # type: ignore[override]
        """Future's list of done callbacks, made when first asked for."""
        return self._made_lists()[1]

    def _wait_done(self, timeout: Optional[float]) -> None:
        if self._state in _DONE_STATES:
            return
        if self._await_answer is not None:
            started = time.monotonic()
            self._await_answer(FutureLatch(self), _READ_FOREVER if timeout is None else timeout)
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        with self._condition:
            self._condition.wait_for(lambda: self._state in _DONE_STATES, timeout)

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._state == FINISHED and self._exception is None:
            return self._result  # set before the state, under the lock: nothing to wait for
        self._wait_done(timeout)
        return super().result(0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait_done(timeout)
        return super().exception(0)


def new_futures(count: int, await_answer: Optional[AwaitAnswer] = None) -> "List[Future[Any]]":
    """``count`` fresh futures in the RUNNING state (the single place futures for posts are made);
    their waits go through ``await_answer`` when given (see :class:`PostFuture`).

    A post is on its way once accepted, so its future cannot be cancelled (``cancel()``
    returns False); a cancellable one would also never be noticed by
    ``concurrent.futures.wait`` because nothing would call ``set_running_or_notify_cancel``.
    """
    if count == 1:
        return [PostFuture(thread_condition(), await_answer)]
    condition = _KickingCondition()
    return [PostFuture(condition, await_answer) for _ in range(count)]


_per_thread = threading.local()


def thread_condition() -> threading.Condition:
    """The condition shared by the single-post futures made in the calling thread.

    A post_async future's own Condition would be most of the cost of posting a small
    message. The thread that posts is usually the one that waits, so sharing per thread
    wakes no other poster's waiters (a sharing per session would wake every thread's).
    """
    try:
        condition: threading.Condition = _per_thread.condition
    except AttributeError:
        condition = _per_thread.condition = _KickingCondition()
    return condition


def resolve_future(future: "Future[Any]", value: Any) -> None:
    """Set the result unless the caller cancelled the future."""
    try:
        future.set_result(value)
    except InvalidStateError:  # the caller cancelled it
        pass


def resolve_futures(futures: "Sequence[Future[Any]]", values: Iterable[Any]) -> None:
    """Set the results of futures made by :func:`new_futures` (those the caller cancelled
    stay so), as ``set_result`` would, but taking each shared condition once for a run of
    futures that share it, with one wake-up: a post call's futures, or one thread's single posts.

    Done again with the same futures it wakes their waiters again and changes nothing else: how
    an exception part-way (a KeyboardInterrupt in a main thread) is made good (see
    ``PendingPuts._hand_over``). Each condition is held in a ``with`` block, which an
    interrupt cannot leave held.
    """
    done: List[Any] = []
    for condition, run in groupby(zip(map(_condition_of, futures), futures, values), _first):
        with condition:
            for _, future, value in run:
                if future._state not in _DONE_STATES:  # type: ignore[attr-defined]
                    future._result = value  # type: ignore[attr-defined]
                    future._state = FINISHED  # type: ignore[attr-defined]
                    lists = future._lists  # type: ignore[attr-defined]
                    if lists is not None:
                        for waiter in lists[0]:
                            waiter.add_result(future)
                        if lists[1]:
                            done.append(future)
            condition.notify_all()
    for future in done:
        future._invoke_callbacks()  # type: ignore[attr-defined]


def fail_future(future: "Future[Any]", exc: BaseException) -> None:
    """Set the exception unless the caller cancelled the future."""
    try:
        future.set_exception(exc)
    except InvalidStateError:
        pass


def logging_configured(log: logging.Logger) -> bool:
    """Whether a record of ``log`` reaches a handler the application installed: a handler
    other than a ``NullHandler`` on ``log`` or on an ancestor it propagates to (``bmq`` itself
    has only a ``NullHandler``, so this is False until the application configures logging).

    Thread-safety: any thread (it reads the loggers' handler lists, as logging itself does).
    """
    current: Optional[logging.Logger] = log
    while current is not None:
        if any(not isinstance(handler, logging.NullHandler) for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def report_callback_error(fn: Callable[..., Any], exc: BaseException) -> None:
    """Report what callback ``fn`` raised, once: as an ERROR record of the ``bmq._dispatch``
    logger (with the traceback) when :func:`logging_configured`, else on ``sys.stderr`` with
    the traceback, as ``threading.excepthook`` reports an exception that ends a thread. So it
    is never silent, and never reported twice.

    A ``SystemExit`` or ``KeyboardInterrupt`` is reported the same way: raised in the dispatcher
    thread it could not end the process anyway (only the main thread's can), and ending the
    dispatcher would strand every later callback. The report says so.

    Args:
        fn: the callback (named in the report by its qualified name).
        exc: what it raised.

    Thread-safety: any thread (the dispatcher's, in practice); never raises.
    """
    name = getattr(fn, "__qualname__", None) or repr(fn)
    text = f"bmq callback {name} raised {type(exc).__name__} in thread {threading.current_thread().name}; " \
           f"the session goes on"
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        text += (" (a callback's SystemExit or KeyboardInterrupt does not end the program: only the main thread's "
                 "does; have the main thread stop, e.g. by an Event it waits on, or call _thread.interrupt_main())")
    try:
        if logging_configured(logger):
            logger.error("%s", text, exc_info=exc)
        elif sys.stderr is not None:  # None under pythonw: nowhere to report to
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            sys.stderr.write(f"Exception: {text}:\n{''.join(lines)}")
            sys.stderr.flush()
    except Exception:  # noqa: B902 - a broken stderr or handler must not end the dispatcher either
        pass


class Dispatcher:
    """The thread that runs user callbacks, in submission order.

    An exception a callback raises (any ``BaseException``, ``SystemExit`` and
    ``KeyboardInterrupt`` included) is reported by :func:`report_callback_error` and the thread
    goes on with the next callback: it ends only on :meth:`stop`.

    Args:
        name: the thread's name.
        high: queued callbacks above which ``on_slow(True)`` is called (once).
        low: ... at or below which ``on_slow(False)`` follows.
        on_slow: told when the backlog crosses the watermarks.

    Thread-safety: :meth:`submit` and :meth:`stop` may be called from any thread.
    """

    def __init__(self, name: str, high: int, low: int, on_slow: Callable[[bool], None]) -> None:
        self._queue: "_stdqueue.SimpleQueue[Any]" = _stdqueue.SimpleQueue()
        self._high, self._low = high, low
        self._on_slow = on_slow
        self._slow = False
        # Turns _slow over and tells on_slow in one step: the submitters and the dispatcher
        # thread change it at once (without an interpreter lock, two submitters both saw it
        # False and told "slow" twice; a "normal" could overtake the "slow" before it).
        self._slow_lock = threading.RLock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread (not in ``__init__``: its owner starts it once it holds the
        dispatcher, so that whatever stops the owner's start stops the thread too)."""
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the dispatcher thread after everything submitted before."""
        self._queue.put((fn, args))
        if not self._slow and self._queue.qsize() > self._high:
            self._turn_slow(True)

    def _turn_slow(self, slow: bool) -> None:
        """Set the backlog's state to ``slow`` and tell on_slow, unless it is so already or the
        backlog has crossed back meanwhile."""
        with self._slow_lock:
            size = self._queue.qsize()
            if self._slow == slow or (size <= self._high if slow else size > self._low):
                return
            self._slow = slow
            self._on_slow(slow)

    def stop(self) -> None:
        """Exit the thread once everything submitted before has run."""
        self._queue.put(_STOP)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # noqa: B902 - user code: report it and go on (see the class doc)
                report_callback_error(fn, exc)
            if self._slow and self._queue.qsize() <= self._low:
                self._turn_slow(False)


class EventQueue:
    """A session's events: logged, kept for :meth:`next` (the newest ``backlog``), and given to
    ``on_event`` on the dispatcher thread.

    Thread-safety: any thread; each event goes to one :meth:`next` caller.
    """

    _WARNINGS = (ev.ConnectionLost, ev.Error, ev.QueueReopenFailed)
    _logger = logging.getLogger("bmq._session")  # with the rest of the session's log

    def __init__(self, dispatcher: Dispatcher, on_event: Optional[Callable[[ev.SessionEvent], None]],
                 backlog: int) -> None:
        self._dispatcher = dispatcher
        self._on_event = on_event
        self._events: Deque[ev.SessionEvent] = collections.deque(maxlen=backlog)
        self._ready = threading.Condition(threading.Lock())
        self._closed = False

    def emit(self, event: ev.SessionEvent) -> None:
        self._logger.log(logging.WARNING if isinstance(event, self._WARNINGS) else logging.INFO, "session event: %r", event)
        with self._ready:
            self._events.append(event)
            self._ready.notify()
        if self._on_event is not None:
            self._dispatcher.submit(self._on_event, event)

    def next(self, timeout: Optional[float]) -> Optional[ev.SessionEvent]:
        """The oldest event not yet returned; None after ``timeout`` or once closed and empty."""
        with self._ready:
            if not self._events:
                self._ready.wait_for(lambda: bool(self._events) or self._closed, timeout)
            return self._events.popleft() if self._events else None

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """No event will come any more: wake the waiters (what is left can still be taken)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
