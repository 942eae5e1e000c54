"""Every exception bmq raises, all under :class:`bmq.Error`.

Where a builtin exception has the same meaning (``ValueError``, ``TimeoutError``,
``ConnectionError``), the bmq class subclasses it too, so ``except TimeoutError`` keeps working
for code that does not know bmq.

Misuse: an argument of the right type but a bad value (an empty payload, an unknown
compression name, ``open_queue`` with neither read nor write...) raises
:class:`InvalidArgumentError` (a ``bmq.Error`` and a ``ValueError``). An argument of the wrong
*type* (``post(5)``, ``post_many(b"abc")``) stays a ``TypeError``, as in any Python function:
bmq raises :class:`ArgumentTypeError`, a ``TypeError`` that is also a ``bmq.Error``, so both
``except TypeError`` and ``except bmq.Error`` catch it.
"""
from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from ._types import Ack

__all__ = [
    "Error",
    "ProtocolError",
    "PropertyError",
    "MessageTooLargeError",
    "InvalidURIError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "ConnectionError",
    "ConnectionLost",
    "ClosedByBroker",
    "AuthenticationError",
    "TLSError",
    "TimeoutError",
    "BrokerError",
    "AdminCommandError",
    "PostError",
    "BandwidthLimitError",
    "SessionClosedError",
    "QueueStateError",
    "OutboxError",
    "OutboxLockedError",
]


class Error(Exception):
    """Base class of every bmq exception."""


class ProtocolError(Error, ValueError):
    """Bytes that do not follow the BlazingMQ wire format.

    Raised by every decoder in :mod:`bmq._codec` (and by the control-message schema) on
    truncated, oversized or inconsistent input. ``event_type`` and ``offset`` say where.
    """

    def __init__(self, message: str, event_type: Optional[int] = None, offset: Optional[int] = None):
        details = []
        if event_type is not None:
            details.append(f"event type {event_type}")
        if offset is not None:
            details.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(details)})" if details else message)
        self.event_type = event_type
        self.offset = offset


class PropertyError(Error, ValueError):
    """A message property that cannot be encoded: bad name, type, value or too many."""

    def __init__(self, message: str, name: Optional[str] = None):
        super().__init__(message)
        self.name = name


class MessageTooLargeError(Error, ValueError):
    """A payload, property area or event over the protocol's limits."""


class InvalidURIError(Error, ValueError):
    """A queue URI that does not follow ``bmq://domain[.~tier]/queue[?id=appId]``."""


class InvalidArgumentError(Error, ValueError):
    """An argument of an acceptable type whose value the API does not allow (e.g. an empty
    payload or an unknown compression name)."""


class ArgumentTypeError(Error, TypeError):
    """An argument of the wrong type (e.g. an int where a bytes-like payload belongs)."""


class ConnectionError(Error, builtins.ConnectionError):
    """The broker cannot be reached or the connection failed."""


class ConnectionLost(ConnectionError):
    """An established connection to the broker went away."""


class ClosedByBroker(ConnectionError):
    """The broker refused or closed the session."""


class TLSError(ConnectionError):
    """TLS to the broker failed: its certificate did not verify (the message names the
    verification failure), it refused the handshake or this client's certificate, a TLS
    record failed, or the endpoint does not speak TLS (or speaks only TLS) as configured."""


class AuthenticationError(ClosedByBroker):
    """The broker refused the session's credential (it then closes the connection).

    The text names the mechanism and the broker's status, never the credential's data.

    Attributes:
        mechanism: the mechanism the credential used, e.g. ``"BASIC"``.
        category: the status category name, e.g. ``"E_REFUSED"``.
        code: the broker's numeric code.
        broker_message: the broker's text.
    """

    def __init__(self, message: str, mechanism: str, category: str = "E_UNKNOWN", code: int = 0,
                 broker_message: str = ""):
        super().__init__(message)
        self.mechanism = mechanism
        self.category = category
        self.code = code
        self.broker_message = broker_message


class TimeoutError(Error, builtins.TimeoutError):
    """An operation did not complete within its timeout.

    Attributes:
        guids: raised by a post (``Queue.post``, ``Queue.post_many``): the GUID of every
            message of the call (16-byte ``bytes``, in input order). Those messages are still in
            flight: posting them again with these GUIDs (``guid=``, ``guids=``) cannot store
            them twice (see docs/retries.md). Empty for other operations.
    """

    guids: Tuple[bytes, ...] = ()


class BrokerError(Error):
    """The broker answered a request with a failure status.

    Attributes:
        category: the status category name, e.g. ``"E_REFUSED"``.
        code: the broker's numeric code.
        broker_message: the broker's text.
    """

    def __init__(self, message: str, category: str = "E_UNKNOWN", code: int = 0, broker_message: str = ""):
        super().__init__(message)
        self.category = category
        self.code = code
        self.broker_message = broker_message


class AdminCommandError(BrokerError):
    """The broker refused an admin command or could not execute it (see :class:`bmq.Admin`).

    Attributes:
        command: the command sent.
        broker_message: the broker's reason, e.g. ``"Domain 'x' doesn't exist"``.
    """

    def __init__(self, message: str, command: str = "", broker_message: str = "", category: str = "E_UNKNOWN",
                 code: int = 0):
        super().__init__(message, category, code, broker_message)
        self.command = command


class PostError(Error):
    """One or more posted messages were not acknowledged with SUCCESS.

    Attributes:
        acks: every Ack of the call, in input order (one for :meth:`Queue.post`).
        failed: the indexes in ``acks`` of those that are not SUCCESS.
    """

    def __init__(self, message: str, acks: Sequence["Ack"]):
        super().__init__(message)
        self.acks = list(acks)
        self.failed = [i for i, ack in enumerate(self.acks) if ack.status.name != "SUCCESS"]

    @property
    def ack(self) -> "Ack":
        """The first Ack that is not SUCCESS."""
        return self.acks[self.failed[0] if self.failed else 0]

    @property
    def guids(self) -> List[bytes]:
        """The GUID of every message of the call (16-byte ``bytes``, input order)."""
        return [ack.guid for ack in self.acks]


class BandwidthLimitError(Error):
    """The connection stayed above its high watermark for the whole channel write timeout.

    Nothing was sent; the caller may retry. Mirrors the SDKs' ``BW_LIMIT`` result.
    """


class SessionClosedError(Error, RuntimeError):
    """A call on a session (or queue) that is stopped or closed."""


class QueueStateError(Error, RuntimeError):
    """A call that the queue's open mode or state does not allow (e.g. post on a reader)."""


class OutboxError(Error):
    """A durable outbox that cannot be used: closed, or its directory held by another outbox."""


class OutboxLockedError(OutboxError):
    """Another live outbox (in this or another process) holds the directory.

    Two sessions must not share ``SessionOptions.outbox_dir`` at the same time.
    """
