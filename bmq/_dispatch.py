"""The dispatcher thread (user callbacks) and the helpers that make and resolve futures."""
from __future__ import annotations

import logging
import queue as _stdqueue
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, List

__all__ = ["Dispatcher", "new_futures", "resolve_future", "fail_future"]

logger = logging.getLogger(__name__)

_STOP = object()


def new_futures(count: int) -> "List[Future[Any]]":
    """``count`` fresh futures (the single place futures for posts are made)."""
    return [Future() for _ in range(count)]


def resolve_future(future: "Future[Any]", value: Any) -> None:
    """Set the result unless the caller cancelled the future."""
    try:
        future.set_result(value)
    except InvalidStateError:  # the caller cancelled it
        pass


def fail_future(future: "Future[Any]", exc: BaseException) -> None:
    """Set the exception unless the caller cancelled the future."""
    try:
        future.set_exception(exc)
    except InvalidStateError:
        pass


class Dispatcher:
    """The thread that runs user callbacks, in submission order.

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
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the dispatcher thread after everything submitted before."""
        self._queue.put((fn, args))
        if not self._slow and self._queue.qsize() > self._high:
            self._slow = True
            self._on_slow(True)

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
            except Exception:  # user code: log, keep dispatching
                logger.exception("callback %r raised", fn)
            if self._slow and self._queue.qsize() <= self._low:
                self._slow = False
                self._on_slow(False)
