"""BlazingMQ protocol values shared by the client and the embedded broker.

The binary layouts live in the codec (``bmq/_wire``) and the control-message fields in
:mod:`bmq._schema`; this module holds the named values both sides put into them, so that a
value is written once (references are to docs/protocol.md).
"""
from __future__ import annotations

from typing import Final, Union

from . import _codec
from .exceptions import ProtocolError, TLSError

# Queue flags, ``handleParameters.flags`` (bmqt::QueueFlags; protocol §9.1).
QUEUE_FLAG_ADMIN: Final = 1
QUEUE_FLAG_READ: Final = 2
QUEUE_FLAG_WRITE: Final = 4
QUEUE_FLAG_ACK: Final = 8  # the writer wants ACKs; every bmq writer does

#: The appId of every queue that is not fan-out, and what an absent ``subIdInfo`` means.
DEFAULT_APP_ID: Final = "__default"

# ACK status on the wire, 4 bits of each AckMessage (protocol §3.3).
ACK_SUCCESS: Final = 0
ACK_LIMIT_MESSAGES: Final = 1
ACK_LIMIT_BYTES: Final = 2
ACK_UNKNOWN: Final = 5  # also what a refused or invalid PUT gets
ACK_STORAGE_FAILURE: Final = 6
ACK_NOT_READY: Final = 7

# Negotiation features (protocol §8.4): "KEY:VALUE,VALUE;KEY:..." in ClientIdentity.features.
FEATURE_MESSAGE_PROPERTIES: Final = "MPS"
MESSAGE_PROPERTIES_EX: Final = "MESSAGE_PROPERTIES_EX"  # new-style property areas
#: What bmq announces: JSON control messages, and it reads new-style properties.
CLIENT_FEATURES: Final = f"PROTOCOL_ENCODING:JSON;{FEATURE_MESSAGE_PROPERTIES}:{MESSAGE_PROPERTIES_EX}"


def queue_flags(read: bool, write: bool) -> int:
    """``handleParameters.flags`` of a handle that reads and/or writes (writers want ACKs)."""
    return (QUEUE_FLAG_READ if read else 0) | (QUEUE_FLAG_WRITE | QUEUE_FLAG_ACK if write else 0)


# What the first bytes from a broker must look like (protocol §1.2): an event header whose length
# word has the fragment bit clear and a length the codec accepts, protocol version 1, a type a
# client receives (§1.3), and a header of at least 2 words within the event.
_EVENT_HEADER_SIZE: Final = 8
_PROTOCOL_VERSION: Final = 1
_CLIENT_EVENT_TYPES: Final = frozenset((_codec.EVENT_CONTROL, _codec.EVENT_PUSH, _codec.EVENT_ACK,
                                        _codec.EVENT_HEARTBEAT_REQ, _codec.EVENT_HEARTBEAT_RSP,
                                        _codec.EVENT_AUTHENTICATION))
_EXCERPT_SIZE: Final = 64  # bytes of what came back shown in the error


def looks_like_tls(data: Union[bytes, bytearray, memoryview]) -> bool:
    """Whether ``data`` starts like a TLS record (a handshake or an alert, TLS 1.x): what a TLS
    endpoint sends to a plaintext client, and what a TLS client sends to a plaintext server."""
    return len(data) >= 3 and data[0] in (0x15, 0x16) and data[1] == 3 and data[2] <= 4


def _not_an_event(data: Union[bytes, bytearray, memoryview]) -> str:
    """Why ``data`` (possibly fewer than 8 bytes) cannot start an event to a client; "" if it can."""
    if len(data) >= 4:
        word = int.from_bytes(data[:4], "big")
        if word >> 31 or not _EVENT_HEADER_SIZE <= word <= _codec.MAX_EVENT_SIZE:
            return f"length word 0x{word:08x}"
    if len(data) >= 5:
        if data[4] >> 6 != _PROTOCOL_VERSION:
            return f"protocol version {data[4] >> 6}"
        if data[4] & 0x3F not in _CLIENT_EVENT_TYPES:
            return f"event type {data[4] & 0x3F}"
    if len(data) >= 6 and not 2 <= data[5] <= int.from_bytes(data[:4], "big") // 4:
        return f"header words {data[5]}"
    return ""


def check_first_answer(data: Union[bytes, bytearray, memoryview], peer: str, *, over_tls: bool = False) -> None:
    """Check the first bytes read from a broker: a peer that is not a BlazingMQ broker (an HTTP
    server, a TLS endpoint to a plaintext client, anything else) is named as such, with what
    it sent, at once rather than as a framing error or a negotiation timeout.

    Args:
        data: the first bytes read on the connection (one read; possibly fewer than a header);
            over TLS, the first plaintext.
        peer: ``host:port``, for the message.
        over_tls: ``data`` came through TLS (then a TLS record in it is not taken for a TLS
            endpoint).

    Raises:
        TLSError: on a plaintext connection, ``data`` is a TLS record: the peer is a TLS endpoint.
        ProtocolError: ``data`` cannot start a BlazingMQ event; the message says
            ``not a BlazingMQ broker`` and shows (printably) the first bytes it sent.

    Thread-safety: a pure function.
    """
    shown = bytes(data[:_EXCERPT_SIZE])
    excerpt = f"{shown!r}{'...' if len(data) > _EXCERPT_SIZE else ''}"
    if not over_tls and looks_like_tls(data):
        raise TLSError(f"{peer} is not a BlazingMQ broker speaking plaintext: it answered with TLS ({excerpt}): it is "
                       f"a TLS endpoint, set SessionOptions(tls=...)")
    reason = _not_an_event(data)
    if reason:
        raise ProtocolError(f"{peer} is not a BlazingMQ broker: it answered {excerpt}, which does not start a "
                            f"BlazingMQ event ({reason})")
