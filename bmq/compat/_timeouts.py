"""``Timeouts``: per-operation timeouts of a session, all optional."""
from __future__ import annotations

from typing import Any, Optional, Tuple

__all__ = ["Timeouts", "OptionalFields"]

_FIELDS = ("connect_timeout", "disconnect_timeout", "open_queue_timeout", "configure_queue_timeout",
           "close_queue_timeout")


class OptionalFields:
    """A plain value of optional fields, named in ``_FIELDS``: equal to another of its class
    when every field is, shown with the fields that were given (the official package's option
    classes behave so)."""

    _FIELDS: Tuple[str, ...] = ()

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self)) and self._values() == other._values()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        given = (f"{name}={getattr(self, name)!r}" for name in self._FIELDS if getattr(self, name) is not None)
        return f"{type(self).__name__}({', '.join(given)})"


class Timeouts(OptionalFields):
    """Seconds to wait for each kind of request; None leaves the session's default.

    Attributes may be set after construction too. Two instances are equal when every field is.

    Args:
        connect_timeout: connecting and negotiating with the broker.
        disconnect_timeout: the broker's answer to a disconnect when the session stops.
        open_queue_timeout: opening a queue.
        configure_queue_timeout: configuring a queue.
        close_queue_timeout: closing a queue.

    Thread-safety: a plain value; do not change one that another thread is using.
    """

    _FIELDS = _FIELDS

    def __init__(
        self,
        connect_timeout: Optional[float] = None,
        disconnect_timeout: Optional[float] = None,
        open_queue_timeout: Optional[float] = None,
        configure_queue_timeout: Optional[float] = None,
        close_queue_timeout: Optional[float] = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.disconnect_timeout = disconnect_timeout
        self.open_queue_timeout = open_queue_timeout
        self.configure_queue_timeout = configure_queue_timeout
        self.close_queue_timeout = close_queue_timeout
