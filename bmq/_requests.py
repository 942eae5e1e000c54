"""The control-request table: every control request from sending until its response, by rId.

The twin of :class:`bmq._puts.PendingPuts` for control traffic. A *buffered* request (open,
configure) survives a lost connection and is re-sent after the reconnect; the others (close,
disconnect, the requests of a reopen) fail with :class:`~bmq.exceptions.ConnectionLost`. A
ConfigureStream names the queue it is for: while that queue is being reopened its qId does not
exist on the new connection yet, so it waits until the reopen is done (:meth:`deferred_for`).

Thread-safety: every method expects the caller to hold the session's lock, except
:meth:`settle`, which resolves a future and must run without it.
"""
from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from . import _codec, _schema
from ._dispatch import fail_future, resolve_future
from .exceptions import BrokerError

if TYPE_CHECKING:  # pragma: no cover
    from ._queue import Queue

__all__ = ["ControlRequests", "Request"]

_JSON = _codec.ENCODING_JSON


class Request:
    """A control request waiting for its response.

    Attributes:
        future: gets the response message, or the error.
        data: the encoded CONTROL event (kept for a re-send).
        buffered: re-sent after a reconnect instead of failing.
        queue: the queue a ConfigureStream is for, else None.
        made: when it was made (``time.monotonic()``).
    """

    __slots__ = ("future", "data", "buffered", "queue", "made")

    def __init__(self, future: "Future[Dict[str, Any]]", data: bytes, buffered: bool,
                 queue: Optional["Queue"] = None) -> None:
        self.future = future
        self.data = data
        self.buffered = buffered
        self.queue = queue
        self.made = time.monotonic()


class ControlRequests:
    """Pending control requests by rId (see the module docstring)."""

    def __init__(self) -> None:
        self._rids = itertools.count(1)
        self._pending: Dict[int, Request] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, body: Dict[str, Any], buffered: bool, queue: Optional["Queue"] = None,
            future: "Optional[Future[Dict[str, Any]]]" = None) -> Request:
        """Register ``body`` under a new rId and encode it (JSON) for sending; its response
        goes to ``future`` (a new one if None: the caller's own lets it :meth:`discard` the
        request even if an exception came before it got the request back)."""
        rid = next(self._rids)
        message: Dict[str, Any] = {"rId": rid}
        message.update(body)
        request = Request(future or Future(), _schema.encode_event(message, _JSON, "control"), buffered, queue)
        self._pending[rid] = request
        return request

    def discard(self, future: "Future[Dict[str, Any]]") -> None:
        """Forget the request whose response goes to ``future`` (its caller stopped waiting):
        not re-sent after a reconnect, a late response ignored."""
        for rid, pending in list(self._pending.items()):
            if pending.future is future:
                del self._pending[rid]

    def take(self, message: Dict[str, Any]) -> Optional[Request]:
        """The request a response ``message`` answers (removed from the table), or None."""
        rid = message.get("rId")
        return self._pending.pop(rid, None) if rid is not None else None

    def is_pending(self, request: Request) -> bool:
        return any(pending is request for pending in self._pending.values())

    def waiting_since(self) -> float:
        """When the oldest request still waiting for its response was made, or 0.0 if none waits."""
        return min((request.made for request in self._pending.values()), default=0.0)

    def drop_unbuffered(self) -> List[Request]:
        """The connection is lost: remove and return the requests that do not survive it."""
        dropped = [(rid, r) for rid, r in self._pending.items() if not r.buffered]
        for rid, _ in dropped:
            del self._pending[rid]
        return [request for _, request in dropped]

    def for_new_connection(self, reopening: Set[int]) -> Tuple[List[bytes], List[Request]]:
        """What to send on a new connection: the encoded requests to re-send at once, and the
        configures deferred until their queue (``id()`` in ``reopening``) is reopened."""
        deferred = [r for r in self._pending.values() if r.queue is not None and id(r.queue) in reopening]
        now = [r.data for r in self._pending.values() if r.queue is None or id(r.queue) not in reopening]
        return now, deferred

    def take_all(self) -> List[Request]:
        """The session stops: every pending request, the table left empty."""
        requests, self._pending = list(self._pending.values()), {}
        return requests

    @staticmethod
    def settle(request: Request, message: Dict[str, Any]) -> None:
        """Resolve ``request`` with its response: the message, or a BrokerError for a failure status."""
        status = message.get("status")
        if status is not None and status.get("category") != "E_SUCCESS":
            fail_future(
                request.future,
                BrokerError(
                    f"broker replied {status.get('category')}: {status.get('message', '')}",
                    status.get("category", "E_UNKNOWN"),
                    int(status.get("code", 0)),
                    status.get("message", ""),
                ),
            )
        else:
            resolve_future(request.future, message)
