"""What the callbacks receive: ``Message`` with its ``MessageHandle``, and ``Ack``.

None has a public constructor: the session makes them. A Message wraps the :class:`bmq.Message`
bmq delivered, and decodes its properties only when they are read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import bmq

from .exceptions import Error

if TYPE_CHECKING:  # pragma: no cover
    from ._ext import ExtSession

__all__ = ["Ack", "Message", "MessageHandle"]


class Message:
    """A message delivered to ``on_message`` (queues opened with ``read=True``).

    Attributes:
        data: the payload (bytes).
        guid: the message's 16-byte GUID.
        queue_uri: the URI of the queue, as given to ``open_queue``.

    Thread-safety: a value; confirm it from any thread (``Session.confirm``).
    """

    __slots__ = ("data", "guid", "queue_uri", "_inner")

    data: bytes
    guid: bytes
    queue_uri: str
    _inner: bmq.Message

    def __init__(self) -> None:
        raise Error("Message objects are made by the session; there is no public constructor")

    @property
    def properties(self) -> Dict[str, Any]:
        """``{name: value}``: ``bool``, ``int``, ``str`` or ``bytes`` (BINARY, and CHAR as one byte)."""
        return self._inner.properties

    @property
    def property_types(self) -> Dict[str, bmq.PropertyType]:
        """``{name: PropertyType}``, a key for every property."""
        return self._inner.property_types

    def __repr__(self) -> str:
        return f"<Message[{self.guid.hex().upper()}] for {self.queue_uri}>"


def make_message(inner: bmq.Message, queue_uri: str) -> Message:
    """A :class:`Message` for the bmq message ``inner`` received on ``queue_uri``."""
    message = Message.__new__(Message)
    message.data = inner.data
    message.guid = inner.guid
    message.queue_uri = queue_uri
    message._inner = inner
    return message


class MessageHandle:
    """Given to ``on_message`` with each :class:`Message`: confirms it.

    Thread-safety: :meth:`confirm` may be called from any thread.
    """

    __slots__ = ("_message", "_ext")

    _message: Message
    _ext: "ExtSession"

    def __init__(self) -> None:
        raise Error("MessageHandle objects are made by the session; there is no public constructor")

    def confirm(self) -> None:
        """Confirm the message: the broker will not deliver it again.

        Raises:
            Error: the session is stopped, or the confirm could not be sent (the text says why).
        """
        self._ext.confirm(self._message)

    def __repr__(self) -> str:
        return f"<MessageHandle[{self._message.guid.hex().upper()}] for {self._message.queue_uri}>"


def make_handle(message: Message, ext: "ExtSession") -> MessageHandle:
    """The :class:`MessageHandle` of ``message`` received by ``ext``."""
    handle = MessageHandle.__new__(MessageHandle)
    handle._message = message
    handle._ext = ext
    return handle


class Ack:
    """The broker's answer to a posted message, given to the post's ``on_ack``.

    Attributes:
        guid: the message's 16-byte GUID (None when the message never got one).
        status: an :class:`bmq.compat.AckStatus`; anything but ``SUCCESS`` is a failure.
        queue_uri: the URI of the queue, as given to ``post``.

    Thread-safety: a value.
    """

    __slots__ = ("guid", "status", "queue_uri")

    guid: Optional[bytes]
    status: bmq.AckStatus
    queue_uri: str

    def __init__(self) -> None:
        raise Error("Ack objects are made by the session; there is no public constructor")

    def __repr__(self) -> str:
        guid = "" if self.guid is None else f"[{self.guid.hex().upper()}]"
        return f"<Ack{guid} {self.status.name} for {self.queue_uri}>"


def make_ack(inner: bmq.Ack, queue_uri: str) -> Ack:
    """An :class:`Ack` for bmq's ``inner`` of a message posted to ``queue_uri``."""
    ack = Ack.__new__(Ack)
    ack.guid = inner.guid
    ack.status = inner.status
    ack.queue_uri = queue_uri
    return ack
