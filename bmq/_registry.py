"""The queue-handle registry: a session's open Queue objects and the ids the broker knows them by.

BlazingMQ gives one qId to every handle of a canonical URI in a session (a writer and the
fan-out readers ``?id=foo``, ``?id=bar`` share it; each reader has its own subId), and a
ConfigureStream names the subscription ids a PUSH will carry. The registry hands out those ids,
counts the handles of each qId (only the last handle's close is ``isFinal``, protocol §8.5) and
maps ``(qId, subscription id)`` back to the Queue a PUSH is for.

Thread-safety: the caller holds the session's lock, except for lookups in :attr:`readers`,
which the reader thread does on the hot path without it (single dict reads).
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from .exceptions import QueueStateError

if TYPE_CHECKING:  # pragma: no cover
    from ._queue import Queue
    from ._uri import QueueUri

__all__ = ["QueueRegistry"]


class QueueRegistry:
    """Open queues by URI, qIds by canonical URI, readers by (qId, subscription id)."""

    def __init__(self) -> None:
        self._by_uri: Dict[str, "Queue"] = {}
        self._queue_ids: Dict[str, Tuple[int, int]] = {}  # canonical URI -> (qId, open handles)
        self._next_queue_id = 0
        self._next_sub_ids: Dict[str, int] = {}  # canonical URI -> next subId of a fan-out reader
        self._subscription_ids = itertools.count(1)
        #: (qId, subscription id) -> Queue; the reader thread reads it without the lock.
        self.readers: Dict[Tuple[int, int], "Queue"] = {}
        #: Open queues taking MessageBatches: while any is, PUSH events are decoded by columns
        #: (the reader thread reads it without the lock).
        self.batch_queues = 0

    def __iter__(self) -> Iterator["Queue"]:
        return iter(list(self._by_uri.values()))

    def get(self, uri: str) -> Optional["Queue"]:
        return self._by_uri.get(uri)

    def register(self, queue: "Queue") -> None:
        """Record ``queue`` as a new handle of its URI, counted as open until :meth:`forget`,
        giving it its ``(queue_id, sub_id)``.

        The handle is recorded by one statement without a call, which an exception from a
        signal handler (a Ctrl-C in ``open_queue``) cannot split: either whole, and
        :meth:`forget` undoes it, or not at all.

        Raises:
            QueueStateError: its URI is already open in this session.
        """
        uri, parsed = queue.uri, queue.parsed
        if uri in self._by_uri:
            raise QueueStateError(f"{uri} is already open in this session")
        canonical = parsed.canonical
        queue_id, handles = self._queue_ids.get(canonical, (None, 0))
        # New ids first: one an exception leaves unused is only skipped.
        if queue_id is None:
            queue_id = self._next_queue_id
            self._next_queue_id += 1
        sub_id = 0
        if parsed.app_id is not None:
            sub_id = self._next_sub_ids.get(canonical, 1)
            self._next_sub_ids[canonical] = sub_id + 1
        queue.queue_id, queue.sub_id, self._by_uri[uri], self._queue_ids[canonical], self.batch_queues = (
            queue_id, sub_id, queue, (queue_id, handles + 1), self.batch_queues + queue.batches)

    def is_last_handle(self, queue: "Queue") -> bool:
        """Whether closing ``queue`` leaves no other handle on its qId (a final close)."""
        _, handles = self._queue_ids.get(queue.parsed.canonical, (None, 1))
        return handles <= 1

    def forget(self, queue: "Queue") -> None:
        """``queue`` is closed: release its URI, its handle count and its readers."""
        uri = queue.uri
        if uri in self._by_uri and self._by_uri[uri] is queue:  # no call: see below
            canonical = queue.parsed.canonical
            queue_id, handles = self._queue_ids[canonical]
            # No call from the test above on, where a signal handler's exception could come: see register.
            del self._by_uri[uri]
            self.batch_queues -= queue.batches
            if handles > 1:
                self._queue_ids[canonical] = (queue_id, handles - 1)
            else:
                del self._queue_ids[canonical]
        for key in [key for key, reader in self.readers.items() if reader is queue]:
            del self.readers[key]

    def subscribe(self, queue: "Queue", count: int) -> List[int]:
        """``count`` fresh subscription ids, routed to ``queue`` from now on (registered before
        the ConfigureStream goes out, so that a PUSH right behind its response finds the queue)."""
        ids = [next(self._subscription_ids) for _ in range(count)]
        for sid in ids:
            self.readers[(queue.queue_id, sid)] = queue
        return ids

    def unsubscribe(self, queue: "Queue", ids: List[int]) -> None:
        for sid in ids:
            self.readers.pop((queue.queue_id, sid), None)

    def replace_subscriptions(self, queue: "Queue", ids: List[int]) -> None:
        """The broker applied ``ids``: the queue's previous subscription ids route nothing more."""
        self.unsubscribe(queue, queue.subscription_ids)
        # Messages of the previous configure may still be read: their sIds stay known.
        kept = set(queue.subscription_ids) | set(ids)
        queue.subscription_of = {sid: entry for sid, entry in queue.subscription_of.items() if sid in kept}
        queue.subscription_ids = ids

    def sole_reader(self, queue_id: int) -> Optional["Queue"]:
        """The only reader on ``queue_id``, if there is exactly one (for a PUSH whose subscription
        id is unknown, as an older broker may send)."""
        found = {id(q): q for (qid, _), q in self.readers.items() if qid == queue_id}
        return next(iter(found.values())) if len(found) == 1 else None

    def clear(self) -> List["Queue"]:
        """The session stops: every open queue, the registry left empty."""
        queues = list(self._by_uri.values())
        self._by_uri.clear()
        self.readers.clear()
        self.batch_queues = 0
        return queues
