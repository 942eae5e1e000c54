"""The control-message schema as data: the part of ``bmqp_ctrlmsg.xsd`` that a client or a
single-node broker uses, compiled for the JSON codec (:mod:`bmq._schema`) and the BER codec
(:mod:`bmq._ber`), which both walk it, plus the encoding-independent checks they share.

Thread-safety: immutable tables and pure functions.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from ._protocol import DEFAULT_APP_ID

KIND_NEGOTIATION = "negotiation"
KIND_CONTROL = "control"
KIND_AUTHENTICATION = "authentication"

# ---------------------------------------------------------------------------------------
# The schema (bmqp_ctrlmsg.xsd, the part a client or a single-node broker uses).
#
# A sequence is a list of elements in XSD order; an element's position is its BER context
# tag. Each element is (name, type, default) where default is REQUIRED (no XSD default:
# a default-constructed value is assumed by with_defaults), OPTIONAL (minOccurs=0) or the
# XSD default value. A type ending in "[]" is an unbounded array. A name of None marks an
# anonymous choice, whose selection appears flattened in JSON.
# ---------------------------------------------------------------------------------------
REQUIRED = object()
OPTIONAL = object()

ENUMS: Dict[str, Dict[str, int]] = {
    "StatusCategory": {
        "E_SUCCESS": 0, "E_UNKNOWN": -1, "E_TIMEOUT": -2, "E_NOT_CONNECTED": -3,
        "E_CANCELED": -4, "E_NOT_SUPPORTED": -5, "E_REFUSED": -6,
        "E_INVALID_ARGUMENT": -7, "E_NOT_READY": -8,
    },
    "ClientType": {"E_UNKNOWN": 0, "E_TCPCLIENT": 1, "E_TCPBROKER": 2, "E_TCPADMIN": 3},
    "ClientLanguage": {"E_UNKNOWN": 0, "E_CPP": 1, "E_JAVA": 2},
    "ExpressionVersion": {"E_UNDEFINED": 0, "E_VERSION_1": 1},
}

SEQUENCES: Dict[str, List[Tuple[Optional[str], str, Any]]] = {
    # top-level messages
    "NegotiationMessage": [(None, "NegotiationChoice", REQUIRED)],
    "ControlMessage": [("rId", "int", OPTIONAL), (None, "ControlChoice", REQUIRED)],
    "AuthenticationMessage": [(None, "AuthenticationChoice", REQUIRED)],
    # negotiation
    "ClientIdentity": [
        ("protocolVersion", "int", REQUIRED), ("sdkVersion", "int", 999999),
        ("clientType", "ClientType", REQUIRED), ("processName", "string", ""),
        ("pid", "int", 0), ("sessionId", "int", 1), ("hostName", "string", ""),
        ("features", "string", ""), ("clusterName", "string", ""),
        ("clusterNodeId", "int", -1), ("sdkLanguage", "ClientLanguage", "E_CPP"),
        ("guidInfo", "GuidInfo", REQUIRED), ("userAgent", "string", ""),
    ],
    "GuidInfo": [("clientId", "string", ""), ("nanoSecondsFromEpoch", "long", 0)],
    "BrokerResponse": [
        ("result", "Status", REQUIRED), ("protocolVersion", "int", REQUIRED),
        ("brokerVersion", "int", REQUIRED), ("isDeprecatedSdk", "boolean", False),
        ("brokerIdentity", "ClientIdentity", REQUIRED),
        ("heartbeatIntervalMs", "int", 3000), ("maxMissedHeartbeats", "int", 10),
    ],
    "DummyType": [],
    # control
    "Status": [
        ("category", "StatusCategory", REQUIRED), ("code", "int", REQUIRED),
        ("message", "string", ""),
    ],
    "Disconnect": [],
    "DisconnectResponse": [],
    "AdminCommand": [("command", "string", REQUIRED)],
    "AdminCommandResponse": [("text", "string", REQUIRED)],
    "OpenQueue": [("handleParameters", "QueueHandleParameters", REQUIRED)],
    "OpenQueueResponse": [
        ("originalRequest", "OpenQueue", REQUIRED),
        ("routingConfiguration", "RoutingConfiguration", REQUIRED),
        ("deduplicationTimeMs", "int", 300000),
    ],
    "CloseQueue": [
        ("handleParameters", "QueueHandleParameters", REQUIRED),
        ("isFinal", "boolean", False),
    ],
    "CloseQueueResponse": [],
    "ConfigureQueueStream": [
        ("qId", "unsignedInt", REQUIRED),
        ("streamParameters", "QueueStreamParameters", REQUIRED),
    ],
    "ConfigureQueueStreamResponse": [("request", "ConfigureQueueStream", REQUIRED)],
    "ConfigureStream": [
        ("qId", "unsignedInt", REQUIRED), ("streamParameters", "StreamParameters", REQUIRED),
    ],
    "ConfigureStreamResponse": [("request", "ConfigureStream", REQUIRED)],
    "QueueHandleParameters": [
        ("uri", "string", REQUIRED), ("qId", "unsignedInt", REQUIRED),
        ("subIdInfo", "SubQueueIdInfo", OPTIONAL), ("flags", "unsignedLong", REQUIRED),
        ("readCount", "int", 0), ("writeCount", "int", 0), ("adminCount", "int", 0),
    ],
    "SubQueueIdInfo": [("subId", "unsignedInt", 0), ("appId", "string", DEFAULT_APP_ID)],
    "RoutingConfiguration": [("flags", "unsignedLong", REQUIRED)],
    "QueueStreamParameters": [
        ("subIdInfo", "SubQueueIdInfo", OPTIONAL), ("maxUnconfirmedMessages", "long", 0),
        ("maxUnconfirmedBytes", "long", 0), ("consumerPriority", "int", -2147483648),
        ("consumerPriorityCount", "int", 0),
    ],
    "StreamParameters": [
        ("appId", "string", DEFAULT_APP_ID), ("subscriptions", "Subscription[]", REQUIRED),
    ],
    "Subscription": [
        ("sId", "unsignedInt", REQUIRED), ("expression", "Expression", REQUIRED),
        ("consumers", "ConsumerInfo[]", REQUIRED),
    ],
    "Expression": [("version", "ExpressionVersion", "E_UNDEFINED"), ("text", "string", REQUIRED)],
    "ConsumerInfo": [
        ("maxUnconfirmedMessages", "long", 0), ("maxUnconfirmedBytes", "long", 0),
        ("consumerPriority", "int", -2147483648), ("consumerPriorityCount", "int", 0),
    ],
    # authentication
    "AuthenticationRequest": [("mechanism", "string", REQUIRED), ("data", "base64Binary", OPTIONAL)],
    "AuthenticationResponse": [("status", "Status", REQUIRED), ("lifetimeMs", "unsignedLong", OPTIONAL)],
}

# Choices: {selection id (BER tag): (name, type)}. Ids 3-6 of ControlChoice are retired and
# 9 (clusterMessage) is broker-to-broker only: a decoder reports them as unsupported.
CHOICES: Dict[str, Dict[int, Tuple[str, str]]] = {
    "NegotiationChoice": {
        0: ("clientIdentity", "ClientIdentity"), 1: ("brokerResponse", "BrokerResponse"),
        2: ("placeHolder", "DummyType"),
    },
    "ControlChoice": {
        0: ("status", "Status"), 1: ("disconnect", "Disconnect"),
        2: ("disconnectResponse", "DisconnectResponse"), 7: ("adminCommand", "AdminCommand"),
        8: ("adminCommandResponse", "AdminCommandResponse"), 10: ("openQueue", "OpenQueue"),
        11: ("openQueueResponse", "OpenQueueResponse"), 12: ("closeQueue", "CloseQueue"),
        13: ("closeQueueResponse", "CloseQueueResponse"),
        14: ("configureQueueStream", "ConfigureQueueStream"),
        15: ("configureQueueStreamResponse", "ConfigureQueueStreamResponse"),
        16: ("configureStream", "ConfigureStream"),
        17: ("configureStreamResponse", "ConfigureStreamResponse"),
    },
    "AuthenticationChoice": {
        0: ("authenticationRequest", "AuthenticationRequest"),
        1: ("authenticationResponse", "AuthenticationResponse"),
    },
}

TOP_TYPES = {
    KIND_NEGOTIATION: "NegotiationMessage",
    KIND_CONTROL: "ControlMessage",
    KIND_AUTHENTICATION: "AuthenticationMessage",
}

# Primitive integer types: (min, max). Booleans, strings and bytes are handled by name.
INT_RANGES = {
    "int": (-(1 << 31), (1 << 31) - 1),
    "unsignedInt": (0, (1 << 32) - 1),
    "long": (-(1 << 63), (1 << 63) - 1),
    "unsignedLong": (0, (1 << 64) - 1),
}
PYTHON_TYPES: Dict[str, Any] = {"boolean": bool, "string": str, "base64Binary": (bytes, bytearray, memoryview)}


class Field:
    """One compiled sequence element."""

    __slots__ = ("name", "tag", "type", "array", "default", "optional")

    def __init__(self, name: Optional[str], tag: int, type_name: str, default: Any):
        self.name = name
        self.tag = tag
        self.array = type_name.endswith("[]")
        self.type = type_name[:-2] if self.array else type_name
        self.optional = default is OPTIONAL
        self.default = None if (self.optional or default is REQUIRED) else default


def _compile() -> Tuple[Dict[str, List[Field]], Dict[str, Dict[str, Tuple[int, str]]], Dict[str, Dict[int, str]]]:
    fields = {
        name: [Field(n, tag, t, d) for tag, (n, t, d) in enumerate(elements)]
        for name, elements in SEQUENCES.items()
    }
    by_name = {c: {n: (sel, t) for sel, (n, t) in sels.items()} for c, sels in CHOICES.items()}
    enum_names = {e: {v: n for n, v in values.items()} for e, values in ENUMS.items()}
    return fields, by_name, enum_names


FIELDS, CHOICE_BY_NAME, ENUM_BY_VALUE = _compile()
ALL_SELECTIONS = {name: c for c, sels in CHOICE_BY_NAME.items() for name in sels}


def check_kind(kind: str) -> str:
    try:
        return TOP_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown control message kind {kind!r}") from None


# ---------------------------------------------------------------------------------------
# Encoding-independent helpers
# ---------------------------------------------------------------------------------------
def selection_of(msg: Mapping, choice: str) -> Tuple[str, Any]:
    """The (name, value) of the one selection of anonymous ``choice`` present in ``msg``."""
    found = [k for k in msg if k in CHOICE_BY_NAME[choice]]
    if len(found) != 1:
        raise ValueError(f"expected exactly one of {sorted(CHOICE_BY_NAME[choice])}, got {found}")
    return found[0], msg[found[0]]


def check_keys(msg: Any, seq: str) -> None:
    if not isinstance(msg, Mapping):
        raise TypeError(f"{seq} must be a mapping, not {type(msg).__name__}")
    allowed: Set[str] = set()
    for f in FIELDS[seq]:
        if f.name is None:
            allowed.update(CHOICE_BY_NAME[f.type])
        else:
            allowed.add(f.name)
    unknown = [k for k in msg if k not in allowed]
    if unknown:
        raise ValueError(f"unknown element(s) {unknown} in {seq}")


def check_int(value: Any, type_name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {type_name} must be an int, not {type(value).__name__}")
    low, high = INT_RANGES[type_name]
    if not low <= value <= high:
        raise ValueError(f"{where}: {value} out of range for {type_name}")
    return value


def check_scalar(value: Any, type_name: str, where: str) -> Any:
    """Validate a non-sequence value for encoding; returns it unchanged."""
    if type_name in INT_RANGES:
        return check_int(value, type_name, where)
    if type_name in ENUMS:
        if not isinstance(value, str) or value not in ENUMS[type_name]:
            raise ValueError(f"{where}: {value!r} is not a {type_name}")
    elif not isinstance(value, PYTHON_TYPES[type_name]) or (type_name == "boolean") != isinstance(value, bool):
        raise TypeError(f"{where}: {type_name} must be {PYTHON_TYPES[type_name]}, not {type(value).__name__}")
    return value
