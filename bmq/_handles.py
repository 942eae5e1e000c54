"""Queue handles on the wire: the OpenQueue / ConfigureStream / CloseQueue sequences of one handle.

What goes out for a handle, and in which order, is the same for an application's
``open_queue`` / ``configure`` / ``close``, for the reopen after a reconnect and for host-health
suspension, so it lives here once. This unit never touches a socket: it speaks through a ``call``
function (the session's: send a control request, wait for its response or raise), which is all a
test needs to fake.

Thread-safety: any thread; the registry is only touched under the session's ``lock``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._options import QueueOptions, Subscription
from ._protocol import DEFAULT_APP_ID
from ._queue import Queue
from ._registry import QueueRegistry
from .exceptions import BrokerError, ConnectionLost, Error, TimeoutError

__all__ = ["QueueHandles", "stream_parameters"]

logger = logging.getLogger("bmq._session")  # the session's logger: one place to look

#: ``call(body, timeout, what, buffered=..., queue=...)`` → the response message.
Call = Callable[..., Dict[str, Any]]


def stream_parameters(queue: Queue, options: QueueOptions, ids: List[int]) -> Dict[str, Any]:
    """The ``streamParameters`` of a ConfigureStream: one subscription per entry of
    ``options.subscriptions`` (or one matching everything), each with its consumer's
    flow-control limits and priority (the entry's own, else the options')."""
    def consumer(entry: Any) -> Dict[str, Any]:
        priority, messages, size = options.consumer_of(entry)
        return {"maxUnconfirmedMessages": messages, "maxUnconfirmedBytes": size, "consumerPriority": priority,
                "consumerPriorityCount": 1}

    subscriptions = []
    for sid, entry in zip(ids, options.subscriptions or (None,)):
        if entry is None:
            expression = {"version": "E_UNDEFINED", "text": ""}
        else:
            text = entry.expression if isinstance(entry, Subscription) else entry
            expression = {"version": "E_VERSION_1", "text": text}
        subscriptions.append({"sId": sid, "expression": expression, "consumers": [consumer(entry)]})
    return {"appId": queue.app_id or DEFAULT_APP_ID, "subscriptions": subscriptions}


class QueueHandles:
    """The request sequences of queue handles (see the module docstring).

    Args:
        call: sends a control request and returns its response (raises BrokerError,
            TimeoutError, ConnectionLost).
        lock: the session's lock, guarding ``registry``.
        registry: where subscription ids are registered before a ConfigureStream goes out.
    """

    def __init__(self, call: Call, lock: "threading.RLock", registry: QueueRegistry) -> None:
        self._call = call
        self._lock = lock
        self._registry = registry
        #: The host health last applied: queues with ``suspends_on_bad_host_health`` open suspended
        #: while it is False.
        self.host_healthy = True

    def open(self, queue: Queue, timeout: float, *, buffered: bool) -> None:
        """OpenQueue, then (readers) ConfigureStream — an empty one while the queue is to be
        suspended for bad host health.

        A reader whose configure fails is closed again before the error is raised: the broker
        holds the opened handle otherwise.
        """
        deadline = time.monotonic() + timeout
        suspended = queue.options.suspends_on_bad_host_health and not self.host_healthy
        self._call({"openQueue": {"handleParameters": queue.handle_parameters()}}, timeout, f"open {queue.uri}",
                   buffered=buffered)
        if not queue.read:
            return
        try:
            self.configure(queue, queue.options, _left(deadline), buffered=buffered, deconfigure=suspended)
        except (BrokerError, TimeoutError):
            # Best effort, within what is left of the caller's timeout (the close is sent regardless).
            try:
                self._call(self.close_request(queue), _left(deadline), f"close {queue.uri}", buffered=False)
            except Error as e:
                logger.info("closing %s after a failed configure failed too: %s", queue.uri, e)
            raise
        queue.suspended = suspended

    def configure(
        self, queue: Queue, options: QueueOptions, timeout: float, *, buffered: bool, deconfigure: bool = False
    ) -> None:
        """ConfigureStream with fresh subscription ids, registered before the request so that
        a PUSH following the response on the stream finds its queue; ``deconfigure`` sends
        none (the broker stops delivering)."""
        with self._lock:
            ids = self._registry.subscribe(queue, 0 if deconfigure else max(1, len(options.subscriptions)))
            queue.subscription_of.update(zip(ids, options.subscriptions or (None,)))
        params = stream_parameters(queue, options, ids)
        try:
            self._call({"configureStream": {"qId": queue.queue_id, "streamParameters": params}}, timeout,
                       f"configure {queue.uri}", buffered=buffered, queue=queue)
        except BaseException:
            with self._lock:
                self._registry.unsubscribe(queue, ids)
            raise
        with self._lock:
            self._registry.replace_subscriptions(queue, ids)

    def reopen(self, queue: Queue, open_timeout: float, configure_timeout: float) -> None:
        """Open a handle again on a new connection, nothing buffered; a ``configure_queue`` that
        ran meanwhile is caught up with (its options win)."""
        applied = queue.options
        self.open(queue, open_timeout, buffered=False)
        if queue.read and queue.options is not applied and not queue.suspended:
            self.configure(queue, queue.options, configure_timeout, buffered=False)

    def close(self, queue: Queue, timeout: float) -> None:
        """Deconfigure (a subscribed reader) then CloseQueue, never buffered: a lost connection
        closes the handle on the broker's side anyway, so ConnectionLost is not an error here."""
        deadline = time.monotonic() + timeout
        try:
            if queue.read and queue.subscription_ids:
                self.configure(queue, queue.options, timeout, buffered=False, deconfigure=True)
            self._call(self.close_request(queue), _left(deadline), f"close {queue.uri}", buffered=False)
        except ConnectionLost:
            pass

    def close_request(self, queue: Queue) -> Dict[str, Any]:
        """CloseQueue for one handle: its own counts, and ``isFinal`` only when no other handle
        of the canonical URI stays open in this session (protocol §8.5); a final close of a shared
        qId would make the broker drop the other handles (writer, other appIds)."""
        with self._lock:
            final = self._registry.is_last_handle(queue)
        return {"closeQueue": {"handleParameters": queue.handle_parameters(), "isFinal": final}}

    def apply_host_health(self, healthy: bool, timeout: float) -> List[Tuple[Queue, Optional[Error]]]:
        """Suspend (unhealthy) or resume (healthy) the queues opened with
        ``suspends_on_bad_host_health``: a reader is deconfigured, or configured again with its
        options; a writer only changes state (posts are refused while suspended).

        Returns:
            Each queue whose state was to change, with the error that kept it from changing.
        """
        with self._lock:
            self.host_healthy = healthy
            # Only queues whose state changes: a queue opened while unhealthy started suspended,
            # and one that never was suspended must not be reported resumed.
            queues = [q for q in self._registry
                      if q.options.suspends_on_bad_host_health and q.is_open and q.suspended == healthy]
        outcomes: List[Tuple[Queue, Optional[Error]]] = []
        for queue in queues:
            try:
                if queue.read:
                    self.configure(queue, queue.options, timeout, buffered=False, deconfigure=not healthy)
                queue.suspended = not healthy
                outcomes.append((queue, None))
            except Error as e:
                outcomes.append((queue, e))
        return outcomes


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
