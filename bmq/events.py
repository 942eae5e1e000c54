"""Session events: what happened to the connection and queues, in order.

Delivered to ``SessionOptions(on_event=...)`` on the dispatcher thread and returned by
:meth:`bmq.Session.next_event`. After a lost connection the order is ConnectionLost ->
Reconnected -> QueueReopened / QueueReopenFailed (one per queue) -> StateRestored.

Thread-safety: event objects are immutable and may be shared between threads.
"""
from __future__ import annotations

from typing import Optional

__all__ = [
    "SessionEvent",
    "QueueEvent",
    "Connected",
    "Disconnected",
    "ConnectionLost",
    "AuthenticationFailed",
    "Reconnected",
    "StateRestored",
    "QueueReopened",
    "QueueReopenFailed",
    "QueueSuspended",
    "QueueSuspendFailed",
    "QueueResumed",
    "QueueResumeFailed",
    "HostUnhealthy",
    "HostHealthRestored",
    "SlowConsumerHighWaterMark",
    "SlowConsumerNormal",
    "Error",
]


class SessionEvent:
    """Base class of every session event.

    Attributes:
        message: human-readable detail, or None.

    Thread-safety: immutable.
    """

    __slots__ = ("message",)

    def __init__(self, message: Optional[str] = None) -> None:
        self.message = message

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def _key(self) -> tuple:
        return (self.message,)

    def __repr__(self) -> str:
        detail = f"({self.message!r})" if self.message else "()"
        return f"<{type(self).__name__}{detail}>"


class QueueEvent(SessionEvent):
    """An event about one queue.

    Attributes:
        queue_uri: the queue's URI.

    Thread-safety: immutable.
    """

    __slots__ = ("queue_uri",)

    def __init__(self, queue_uri: str, message: Optional[str] = None) -> None:
        super().__init__(message)
        self.queue_uri = queue_uri

    def _key(self) -> tuple:
        return (self.queue_uri, self.message)

    def __repr__(self) -> str:
        detail = f", {self.message!r}" if self.message else ""
        return f"<{type(self).__name__}({self.queue_uri!r}{detail})>"


class _BrokerEvent(SessionEvent):
    """An event about a connection to one broker address.

    Attributes:
        address: the address connected to (``tcp://HOST:PORT``), or None. Informational: events
            compare equal by type and message alone, so ``event == Connected()`` holds whichever
            address a session uses.
    """

    __slots__ = ("address",)

    def __init__(self, message: Optional[str] = None, *, address: Optional[str] = None) -> None:
        super().__init__(message)
        self.address = address

    def __repr__(self) -> str:
        detail = [repr(self.message)] if self.message else []
        if self.address is not None:
            detail.append(f"address={self.address!r}")
        return f"<{type(self).__name__}({', '.join(detail)})>"


class Connected(_BrokerEvent):
    """The session connected and negotiated with the broker (``address``: which one)."""

    __slots__ = ()


class Disconnected(SessionEvent):
    """The session stopped; no more events follow."""

    __slots__ = ()


class ConnectionLost(SessionEvent):
    """The connection went away; the session reconnects per its ReconnectPolicy."""

    __slots__ = ()



class AuthenticationFailed(SessionEvent):
    """A re-authentication on the live connection was refused (or got no answer): the
    connection is dropped and the session reconnects, authenticating again. ``message`` names
    the mechanism and the broker's status, never the credential."""

    __slots__ = ()


class Reconnected(_BrokerEvent):
    """A new connection is negotiated (``address``: with which broker address); queues are
    being reopened."""

    __slots__ = ()


class StateRestored(SessionEvent):
    """Every queue is reopened (or failed to) and buffered messages are re-sent."""

    __slots__ = ()


class QueueReopened(QueueEvent):
    """A queue was reopened with its last options after a reconnect."""

    __slots__ = ()


class QueueReopenFailed(QueueEvent):
    """A queue could not be reopened after a reconnect; it is closed."""

    __slots__ = ()


class QueueSuspended(QueueEvent):
    """A queue was suspended because the host became unhealthy."""

    __slots__ = ()


class QueueSuspendFailed(QueueEvent):
    """Suspending a queue failed."""

    __slots__ = ()


class QueueResumed(QueueEvent):
    """A suspended queue resumed because the host is healthy again."""

    __slots__ = ()


class QueueResumeFailed(QueueEvent):
    """Resuming a queue failed."""

    __slots__ = ()


class HostUnhealthy(SessionEvent):
    """The host health monitor reported the host unhealthy."""

    __slots__ = ()


class HostHealthRestored(SessionEvent):
    """The host is healthy again and every suspended queue resumed."""

    __slots__ = ()


class SlowConsumerHighWaterMark(SessionEvent):
    """Callbacks are piling up on the dispatcher (user code is slower than the broker)."""

    __slots__ = ()


class SlowConsumerNormal(SessionEvent):
    """The dispatcher caught up after a SlowConsumerHighWaterMark."""

    __slots__ = ()


class Error(SessionEvent):
    """Something went wrong that the session handled (e.g. malformed bytes from the broker:
    the connection was dropped and is being re-established)."""

    __slots__ = ()
