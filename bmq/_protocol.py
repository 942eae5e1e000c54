"""BlazingMQ protocol values shared by the client and the embedded broker.

The binary layouts live in the codec (``bmq/_wire``) and the control-message fields in
:mod:`bmq._schema`; this module holds the named values both sides put into them, so that a
value is written once (references are to docs/protocol.md).
"""
from __future__ import annotations

from typing import Final

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
