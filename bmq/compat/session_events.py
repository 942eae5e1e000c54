"""Session events of :mod:`bmq.compat`, as the official ``blazingmq.session_events`` module.

Each event is given to the session's ``on_session_event`` callback on the session's
dispatcher thread. An event carries an optional text (``None`` when all went well); events of
one queue also carry its ``queue_uri``. Two events are equal when they are of the same class
with the same text (and queue): ``Connected(None) == Connected(None)``.

:func:`log_session_event` logs on the ``blazingmq.session_events`` logger, the official
package's, so that an application's logging configuration keeps working after the switch.
"""
from __future__ import annotations

import logging
from typing import Optional

__all__ = [
    "SessionEvent",
    "QueueEvent",
    "Connected",
    "Disconnected",
    "ConnectionLost",
    "Reconnected",
    "StateRestored",
    "ConnectionTimeout",
    "HostUnhealthy",
    "HostHealthRestored",
    "QueueSuspended",
    "QueueSuspendFailed",
    "QueueResumed",
    "QueueResumeFailed",
    "QueueReopened",
    "QueueReopenFailed",
    "SlowConsumerNormal",
    "SlowConsumerHighWaterMark",
    "Error",
    "InterfaceError",
    "log_session_event",
]

LOGGER = logging.getLogger("blazingmq.session_events")


class SessionEvent:
    """Base class of the session events.

    Args:
        message: what went wrong, or None.

    Thread-safety: a plain value.
    """

    def __init__(self, message: Optional[str]) -> None:
        self._message = message

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"<{name}: {self._message}>" if self._message else f"<{name}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionEvent):
            return False
        return type(self) is type(other) and self._message == other._message

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # mutable value, like the official events


class QueueEvent(SessionEvent):
    """Base class of the events about one queue.

    Args:
        queue_uri: the queue's URI.
        message: what went wrong, or None.

    Attributes:
        queue_uri: the queue's URI.
    """

    def __init__(self, queue_uri: str, message: Optional[str] = None) -> None:
        self.queue_uri = queue_uri
        super().__init__(message)

    def __repr__(self) -> str:
        name = type(self).__name__
        if self._message:
            return f"<{name}: {self.queue_uri} {self._message}>"
        return f"<{name}: {self.queue_uri}>"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, QueueEvent)
        return self._message == other._message and self.queue_uri == other.queue_uri


class Connected(SessionEvent):
    """The session connected to the broker."""


class Disconnected(SessionEvent):
    """The session stopped and disconnected; no event follows."""


class ConnectionLost(SessionEvent):
    """The connection was lost; the session reconnects by itself."""


class Reconnected(SessionEvent):
    """A lost connection was re-established; the queues are being reopened."""


class StateRestored(SessionEvent):
    """After a reconnection, every queue has been reopened (or failed to)."""


class ConnectionTimeout(SessionEvent):
    """The connection could not be made in time (bmq.compat raises instead: see the docs)."""


class HostUnhealthy(SessionEvent):
    """The host health monitor reported the host unhealthy (also first thing when it was
    unhealthy as the session started)."""


class HostHealthRestored(SessionEvent):
    """The host is healthy again; the queues suspended meanwhile have been resumed first."""


class QueueSuspended(QueueEvent):
    """A queue opened with ``suspends_on_bad_host_health=True`` was suspended (a writer's
    posts raise, a reader receives nothing) because the host became unhealthy."""


class QueueSuspendFailed(QueueEvent):
    """A queue could not be suspended."""


class QueueResumed(QueueEvent):
    """A suspended queue resumed because the host is healthy again."""


class QueueResumeFailed(QueueEvent):
    """A suspended queue could not be resumed."""


class QueueReopened(QueueEvent):
    """A queue was reopened after a reconnection."""


class QueueReopenFailed(QueueEvent):
    """A queue could not be reopened after a reconnection."""


class SlowConsumerNormal(SessionEvent):
    """The callbacks caught up with what the broker sends."""


class SlowConsumerHighWaterMark(SessionEvent):
    """Callbacks are piling up: the application consumes slower than the broker delivers."""


class Error(SessionEvent):
    """Something went wrong that the session handled."""


class InterfaceError(SessionEvent):
    """The client library met something it did not expect."""


_INFO = (Connected, Disconnected, StateRestored, SlowConsumerNormal, QueueReopened, HostUnhealthy,
         HostHealthRestored, QueueSuspended, QueueResumed)
_WARNING = (ConnectionLost, Reconnected, SlowConsumerHighWaterMark)


def log_session_event(event: SessionEvent) -> None:
    """Log ``event``: routine events at INFO, reconnections and slow consumption at WARNING,
    anything else (a failure) at ERROR. Usable as a session's ``on_session_event``.

    Args:
        event: the event to log.
    """
    if isinstance(event, _INFO):
        level = logging.INFO
    elif isinstance(event, _WARNING):
        level = logging.WARNING
    else:
        level = logging.ERROR
    LOGGER.log(level, "Received session event: %s", event)
