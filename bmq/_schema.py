"""Control-message schema codec: NegotiationMessage, ControlMessage and
AuthenticationMessage (FACTS §8) as plain dicts, encoded as JSON or BER.

Messages are dicts in the JSON shape: XSD element names as keys, enumerations as their
names (``"E_SUCCESS"``), integers as ``int``, booleans as ``bool``, strings as ``str`` and
base64Binary as ``bytes``. A ControlMessage carries its choice next to ``rId``:
``{"rId": 3, "openQueue": {...}}``; the other two kinds are one-key dicts.

The schema is one declarative table (``_SEQUENCES``/``_CHOICES``/``_ENUMS``) that both
encodings walk. Encoders write exactly the elements present in the dict (callers decide
defaults; :func:`with_defaults` fills them the way bmqbrkr does). Decoders return only the
elements present on the wire and raise only :class:`~bmq.exceptions.ProtocolError`.

Thread-safety: every function is pure and safe to call from any thread.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._protocol import DEFAULT_APP_ID
from .exceptions import ProtocolError

__all__ = [
    "KIND_NEGOTIATION",
    "KIND_CONTROL",
    "KIND_AUTHENTICATION",
    "ENCODING_BER",
    "ENCODING_JSON",
    "encode_body",
    "decode_body",
    "encode_event",
    "decode_event",
    "with_defaults",
    "parse_features",
    "format_features",
    "best_encoding",
    "message_kind_of",
]

_log = logging.getLogger(__name__)

KIND_NEGOTIATION = "negotiation"
KIND_CONTROL = "control"
KIND_AUTHENTICATION = "authentication"

# Same values as bmq._codec.ENCODING_*; repeated here so that the schema layer works (and
# is testable) without the compiled extension.
ENCODING_BER = 0
ENCODING_JSON = 1

# ---------------------------------------------------------------------------------------
# The schema (bmqp_ctrlmsg.xsd, the part a client or a single-node broker uses).
#
# A sequence is a list of elements in XSD order; an element's position is its BER context
# tag. Each element is (name, type, default) where default is _REQUIRED (no XSD default:
# a default-constructed value is assumed by with_defaults), _OPTIONAL (minOccurs=0) or the
# XSD default value. A type ending in "[]" is an unbounded array. A name of None marks an
# anonymous choice, whose selection appears flattened in JSON.
# ---------------------------------------------------------------------------------------
_REQUIRED = object()
_OPTIONAL = object()

_ENUMS: Dict[str, Dict[str, int]] = {
    "StatusCategory": {
        "E_SUCCESS": 0, "E_UNKNOWN": -1, "E_TIMEOUT": -2, "E_NOT_CONNECTED": -3,
        "E_CANCELED": -4, "E_NOT_SUPPORTED": -5, "E_REFUSED": -6,
        "E_INVALID_ARGUMENT": -7, "E_NOT_READY": -8,
    },
    "ClientType": {"E_UNKNOWN": 0, "E_TCPCLIENT": 1, "E_TCPBROKER": 2, "E_TCPADMIN": 3},
    "ClientLanguage": {"E_UNKNOWN": 0, "E_CPP": 1, "E_JAVA": 2},
    "ExpressionVersion": {"E_UNDEFINED": 0, "E_VERSION_1": 1},
}

_SEQUENCES: Dict[str, List[Tuple[Optional[str], str, Any]]] = {
    # top-level messages
    "NegotiationMessage": [(None, "NegotiationChoice", _REQUIRED)],
    "ControlMessage": [("rId", "int", _OPTIONAL), (None, "ControlChoice", _REQUIRED)],
    "AuthenticationMessage": [(None, "AuthenticationChoice", _REQUIRED)],
    # negotiation
    "ClientIdentity": [
        ("protocolVersion", "int", _REQUIRED), ("sdkVersion", "int", 999999),
        ("clientType", "ClientType", _REQUIRED), ("processName", "string", ""),
        ("pid", "int", 0), ("sessionId", "int", 1), ("hostName", "string", ""),
        ("features", "string", ""), ("clusterName", "string", ""),
        ("clusterNodeId", "int", -1), ("sdkLanguage", "ClientLanguage", "E_CPP"),
        ("guidInfo", "GuidInfo", _REQUIRED), ("userAgent", "string", ""),
    ],
    "GuidInfo": [("clientId", "string", ""), ("nanoSecondsFromEpoch", "long", 0)],
    "BrokerResponse": [
        ("result", "Status", _REQUIRED), ("protocolVersion", "int", _REQUIRED),
        ("brokerVersion", "int", _REQUIRED), ("isDeprecatedSdk", "boolean", False),
        ("brokerIdentity", "ClientIdentity", _REQUIRED),
        ("heartbeatIntervalMs", "int", 3000), ("maxMissedHeartbeats", "int", 10),
    ],
    "DummyType": [],
    # control
    "Status": [
        ("category", "StatusCategory", _REQUIRED), ("code", "int", _REQUIRED),
        ("message", "string", ""),
    ],
    "Disconnect": [],
    "DisconnectResponse": [],
    "AdminCommand": [("command", "string", _REQUIRED)],
    "AdminCommandResponse": [("text", "string", _REQUIRED)],
    "OpenQueue": [("handleParameters", "QueueHandleParameters", _REQUIRED)],
    "OpenQueueResponse": [
        ("originalRequest", "OpenQueue", _REQUIRED),
        ("routingConfiguration", "RoutingConfiguration", _REQUIRED),
        ("deduplicationTimeMs", "int", 300000),
    ],
    "CloseQueue": [
        ("handleParameters", "QueueHandleParameters", _REQUIRED),
        ("isFinal", "boolean", False),
    ],
    "CloseQueueResponse": [],
    "ConfigureQueueStream": [
        ("qId", "unsignedInt", _REQUIRED),
        ("streamParameters", "QueueStreamParameters", _REQUIRED),
    ],
    "ConfigureQueueStreamResponse": [("request", "ConfigureQueueStream", _REQUIRED)],
    "ConfigureStream": [
        ("qId", "unsignedInt", _REQUIRED), ("streamParameters", "StreamParameters", _REQUIRED),
    ],
    "ConfigureStreamResponse": [("request", "ConfigureStream", _REQUIRED)],
    "QueueHandleParameters": [
        ("uri", "string", _REQUIRED), ("qId", "unsignedInt", _REQUIRED),
        ("subIdInfo", "SubQueueIdInfo", _OPTIONAL), ("flags", "unsignedLong", _REQUIRED),
        ("readCount", "int", 0), ("writeCount", "int", 0), ("adminCount", "int", 0),
    ],
    "SubQueueIdInfo": [("subId", "unsignedInt", 0), ("appId", "string", DEFAULT_APP_ID)],
    "RoutingConfiguration": [("flags", "unsignedLong", _REQUIRED)],
    "QueueStreamParameters": [
        ("subIdInfo", "SubQueueIdInfo", _OPTIONAL), ("maxUnconfirmedMessages", "long", 0),
        ("maxUnconfirmedBytes", "long", 0), ("consumerPriority", "int", -2147483648),
        ("consumerPriorityCount", "int", 0),
    ],
    "StreamParameters": [
        ("appId", "string", DEFAULT_APP_ID), ("subscriptions", "Subscription[]", _REQUIRED),
    ],
    "Subscription": [
        ("sId", "unsignedInt", _REQUIRED), ("expression", "Expression", _REQUIRED),
        ("consumers", "ConsumerInfo[]", _REQUIRED),
    ],
    "Expression": [("version", "ExpressionVersion", "E_UNDEFINED"), ("text", "string", _REQUIRED)],
    "ConsumerInfo": [
        ("maxUnconfirmedMessages", "long", 0), ("maxUnconfirmedBytes", "long", 0),
        ("consumerPriority", "int", -2147483648), ("consumerPriorityCount", "int", 0),
    ],
    # authentication
    "AuthenticationRequest": [("mechanism", "string", _REQUIRED), ("data", "base64Binary", _OPTIONAL)],
    "AuthenticationResponse": [("status", "Status", _REQUIRED), ("lifetimeMs", "unsignedLong", _OPTIONAL)],
}

# Choices: {selection id (BER tag): (name, type)}. Ids 3-6 of ControlChoice are retired and
# 9 (clusterMessage) is broker-to-broker only: a decoder reports them as unsupported.
_CHOICES: Dict[str, Dict[int, Tuple[str, str]]] = {
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

_TOP_TYPES = {
    KIND_NEGOTIATION: "NegotiationMessage",
    KIND_CONTROL: "ControlMessage",
    KIND_AUTHENTICATION: "AuthenticationMessage",
}

# Primitive integer types: (min, max). Booleans, strings and bytes are handled by name.
_INT_RANGES = {
    "int": (-(1 << 31), (1 << 31) - 1),
    "unsignedInt": (0, (1 << 32) - 1),
    "long": (-(1 << 63), (1 << 63) - 1),
    "unsignedLong": (0, (1 << 64) - 1),
}
_PYTHON_TYPES: Dict[str, Any] = {"boolean": bool, "string": str, "base64Binary": (bytes, bytearray, memoryview)}


class _Field:
    """One compiled sequence element."""

    __slots__ = ("name", "tag", "type", "array", "default", "optional")

    def __init__(self, name: Optional[str], tag: int, type_name: str, default: Any):
        self.name = name
        self.tag = tag
        self.array = type_name.endswith("[]")
        self.type = type_name[:-2] if self.array else type_name
        self.optional = default is _OPTIONAL
        self.default = None if (self.optional or default is _REQUIRED) else default


def _compile() -> Tuple[Dict[str, List[_Field]], Dict[str, Dict[str, Tuple[int, str]]], Dict[str, Dict[int, str]]]:
    fields = {
        name: [_Field(n, tag, t, d) for tag, (n, t, d) in enumerate(elements)]
        for name, elements in _SEQUENCES.items()
    }
    by_name = {c: {n: (sel, t) for sel, (n, t) in sels.items()} for c, sels in _CHOICES.items()}
    enum_names = {e: {v: n for n, v in values.items()} for e, values in _ENUMS.items()}
    return fields, by_name, enum_names


_FIELDS, _CHOICE_BY_NAME, _ENUM_BY_VALUE = _compile()
_ALL_SELECTIONS = {name: c for c, sels in _CHOICE_BY_NAME.items() for name in sels}


def _check_kind(kind: str) -> str:
    try:
        return _TOP_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown control message kind {kind!r}") from None


# ---------------------------------------------------------------------------------------
# Encoding-independent helpers
# ---------------------------------------------------------------------------------------
def _selection_of(msg: Mapping, choice: str) -> Tuple[str, Any]:
    """The (name, value) of the one selection of anonymous ``choice`` present in ``msg``."""
    found = [k for k in msg if k in _CHOICE_BY_NAME[choice]]
    if len(found) != 1:
        raise ValueError(f"expected exactly one of {sorted(_CHOICE_BY_NAME[choice])}, got {found}")
    return found[0], msg[found[0]]


def _check_keys(msg: Any, seq: str) -> None:
    if not isinstance(msg, Mapping):
        raise TypeError(f"{seq} must be a mapping, not {type(msg).__name__}")
    allowed = set()
    for f in _FIELDS[seq]:
        if f.name is None:
            allowed.update(_CHOICE_BY_NAME[f.type])
        else:
            allowed.add(f.name)
    unknown = [k for k in msg if k not in allowed]
    if unknown:
        raise ValueError(f"unknown element(s) {unknown} in {seq}")


def _check_int(value: Any, type_name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {type_name} must be an int, not {type(value).__name__}")
    low, high = _INT_RANGES[type_name]
    if not low <= value <= high:
        raise ValueError(f"{where}: {value} out of range for {type_name}")
    return value


def _check_scalar(value: Any, type_name: str, where: str) -> Any:
    """Validate a non-sequence value for encoding; returns it unchanged."""
    if type_name in _INT_RANGES:
        return _check_int(value, type_name, where)
    if type_name in _ENUMS:
        if not isinstance(value, str) or value not in _ENUMS[type_name]:
            raise ValueError(f"{where}: {value!r} is not a {type_name}")
    elif not isinstance(value, _PYTHON_TYPES[type_name]) or (type_name == "boolean") != isinstance(value, bool):
        raise TypeError(f"{where}: {type_name} must be {_PYTHON_TYPES[type_name]}, not {type(value).__name__}")
    return value


def with_defaults(message: Mapping, kind: str) -> dict:
    """A copy of ``message`` with every non-optional element filled in, as bmqbrkr emits it.

    Elements with an XSD default get it; required elements without one get the value of a
    default-constructed C++ object (0, "", False, the enumerator numbered 0, a filled
    sub-sequence, an empty array). Optional elements (``rId``, ``subIdInfo``, ...) are left
    absent unless present. Encoding the result as JSON omits empty arrays; as BER it writes
    them as empty constructed elements, both as the broker does.

    Args:
        message: a message dict of the given kind.
        kind: KIND_NEGOTIATION, KIND_CONTROL or KIND_AUTHENTICATION.

    Returns:
        A new dict; ``message`` is not modified.

    Raises:
        ValueError: unknown kind, unknown elements or no choice selection.
        TypeError: a sub-message that is not a mapping.
    """
    return _fill_sequence(message, _check_kind(kind))


def _fill_sequence(msg: Mapping, seq: str) -> dict:
    _check_keys(msg, seq)
    out: dict = {}
    for f in _FIELDS[seq]:
        if f.name is None:
            name, value = _selection_of(msg, f.type)
            out[name] = _fill_value(value, _CHOICE_BY_NAME[f.type][name][1], False)
        elif f.name in msg and msg[f.name] is not None:
            out[f.name] = _fill_value(msg[f.name], f.type, f.array)
        elif not f.optional:
            out[f.name] = _zero(f)
    return out


def _fill_value(value: Any, type_name: str, array: bool) -> Any:
    if array:
        return [_fill_value(v, type_name, False) for v in value]
    if type_name in _FIELDS:
        return _fill_sequence(value, type_name)
    return value


def _zero(f: _Field) -> Any:
    if f.array:
        return []
    if f.default is not None:
        return f.default
    if f.type in _FIELDS:
        return _fill_sequence({}, f.type)
    if f.type in _ENUMS:  # a default-constructed C++ enum holds 0; every enum here has one
        return _ENUM_BY_VALUE[f.type][0]
    return {"boolean": False, "string": "", "base64Binary": b""}.get(f.type, 0)


def message_kind_of(msg: Mapping) -> str:
    """The name of the selected choice of a message, e.g. ``"openQueue"``, ``"clientIdentity"``.

    Args:
        msg: a message dict of any kind.

    Returns:
        The selection's element name.

    Raises:
        ValueError: ``msg`` has no known selection.
    """
    for key in msg:
        if key in _ALL_SELECTIONS:
            return key
    raise ValueError(f"no control-message selection among {list(msg)}")


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------
def encode_body(message: Mapping, encoding: int, kind: str) -> bytes:
    """Encode a message as a CONTROL/AUTHENTICATION event body (no header, no padding).

    Args:
        message: the message dict (only the elements present are written).
        encoding: ENCODING_BER or ENCODING_JSON.
        kind: KIND_NEGOTIATION, KIND_CONTROL or KIND_AUTHENTICATION.

    Returns:
        The encoded body.

    Raises:
        ValueError: unknown kind/encoding/element, a value out of range, not exactly one
            choice selection, or a string that is not valid Unicode.
        TypeError: a value of the wrong Python type.
    """
    top = _check_kind(kind)
    if encoding == ENCODING_JSON:
        out: List[str] = []
        _json_sequence(out, message, top)
        try:
            return "".join(out).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"string is not valid Unicode: {e}") from e
    if encoding == ENCODING_BER:
        from ._ber import encode

        return encode(message, top)
    raise ValueError(f"unknown encoding {encoding!r}")


def decode_body(body: Union[bytes, bytearray, memoryview], encoding: int, kind: str) -> dict:
    """Decode a CONTROL/AUTHENTICATION event body (padding already stripped).

    Args:
        body: the encoded message.
        encoding: ENCODING_BER or ENCODING_JSON (from the event header).
        kind: KIND_NEGOTIATION, KIND_CONTROL or KIND_AUTHENTICATION.

    Returns:
        The message dict with exactly the elements present on the wire (unknown ones
        skipped).

    Raises:
        ProtocolError: malformed input, a wrong value type, an unknown enumerator or
            selection, or an unknown encoding.
        ValueError: unknown kind.
    """
    top = _check_kind(kind)
    data = bytes(body)
    if encoding == ENCODING_JSON:
        message = _json_decode(data, top)
    elif encoding == ENCODING_BER:
        from ._ber import decode

        message = decode(data, top)
    else:
        raise ProtocolError(f"unknown control message encoding {encoding!r}")
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("decoded %s message (encoding %d): %r", kind, encoding, message)
    return message


def encode_event(message: Mapping, encoding: int, kind: str) -> bytes:
    """A whole padded CONTROL event (AUTHENTICATION for KIND_AUTHENTICATION).

    Args:
        message: the message dict.
        encoding: ENCODING_BER or ENCODING_JSON.
        kind: KIND_NEGOTIATION, KIND_CONTROL or KIND_AUTHENTICATION.

    Returns:
        The event bytes, header included.

    Raises:
        ValueError, TypeError: as :func:`encode_body`.
    """
    from . import _codec

    body = encode_body(message, encoding, kind)
    return _codec.encode_control_event(body, encoding, _event_type(_codec, kind))


def _event_type(codec: Any, kind: str) -> int:
    return codec.EVENT_AUTHENTICATION if kind == KIND_AUTHENTICATION else codec.EVENT_CONTROL


def decode_event(event: Union[bytes, bytearray, memoryview], kind: str) -> Tuple[dict, int]:
    """Decode a whole CONTROL/AUTHENTICATION event.

    Args:
        event: the event bytes, header included.
        kind: KIND_NEGOTIATION, KIND_CONTROL or KIND_AUTHENTICATION.

    Returns:
        ``(message, encoding)``.

    Raises:
        ProtocolError: a malformed event or body, or an event type that does not carry
            ``kind`` (AUTHENTICATION for KIND_AUTHENTICATION, else CONTROL).
    """
    from . import _codec

    encoding, body = _codec.decode_control_event(event)
    event_type = event[4] & 0x3F
    if event_type != _event_type(_codec, kind):
        raise ProtocolError(f"a {kind} message cannot travel in an event of type {event_type}", event_type)
    return decode_body(body, encoding, kind), encoding


# ---------------------------------------------------------------------------------------
# Features (§8.4) and encoding choice (§8.2)
# ---------------------------------------------------------------------------------------
_ENCODING_FIELD = "PROTOCOL_ENCODING"


def parse_features(text: str) -> Dict[str, List[str]]:
    """Parse a features string ``"NAME:v1,v2;NAME2:v3"`` into ``{name: [values]}``.

    Parses like bmqbrkr: empty fields and values are skipped, a field without ``:`` has no
    values, the first occurrence of a name wins, and a field ending in ``:`` stops parsing
    (the broker's parser gives up there, so later fields are never seen).

    Args:
        text: the features string.

    Returns:
        The fields in order of appearance.
    """
    out: Dict[str, List[str]] = {}
    for field in text.split(";"):
        if not field:
            continue
        name, colon, values = field.partition(":")
        if colon and not values:
            break
        out.setdefault(name, [v for v in values.split(",") if v])
    return out


def format_features(features: Mapping[str, Sequence[str]]) -> str:
    """Inverse of :func:`parse_features`: ``{"A": ["x", "y"]} -> "A:x,y"``.

    Args:
        features: field name to values, in the order to write.

    Returns:
        The features string.
    """
    return ";".join(f"{name}:{','.join(values)}" if values else name for name, values in features.items())


def best_encoding(client_features: str) -> int:
    """The encoding bmqbrkr uses towards a client with these features (§8.2).

    BER unless the ``PROTOCOL_ENCODING`` field lists JSON and not BER.

    Args:
        client_features: the client's ClientIdentity ``features``.

    Returns:
        ENCODING_BER or ENCODING_JSON.
    """
    values = parse_features(client_features).get(_ENCODING_FIELD, [])
    if "JSON" in values and "BER" not in values:
        return ENCODING_JSON
    return ENCODING_BER


# ---------------------------------------------------------------------------------------
# JSON (as baljsn writes it, §8.3)
# ---------------------------------------------------------------------------------------
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_JSON_ESCAPES.update({chr(c): f"\\u{c:04x}" for c in range(0x20) if chr(c) not in _JSON_ESCAPES})
# baljsn leaves non-ASCII UTF-8 as it is and escapes only these characters.
_JSON_TRANSLATE = str.maketrans(_JSON_ESCAPES)


def _json_string(value: str) -> str:
    return '"' + value.translate(_JSON_TRANSLATE) + '"'


def _json_sequence(out: List[str], msg: Mapping, seq: str) -> None:
    _check_keys(msg, seq)
    out.append("{")
    first = True
    for f in _FIELDS[seq]:
        if f.name is None:
            name, value = _selection_of(msg, f.type)
            type_name, array = _CHOICE_BY_NAME[f.type][name][1], False
        else:
            name, value, type_name, array = f.name, msg.get(f.name), f.type, f.array
            # baljsn omits null elements and empty arrays
            if value is None or (array and not value):
                continue
        if not first:
            out.append(",")
        first = False
        out.append(_json_string(name) + ":")
        if array:
            if isinstance(value, (str, bytes, Mapping)):
                raise TypeError(f"{name} must be a sequence")
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _json_value(out, item, type_name, name)
            out.append("]")
        else:
            _json_value(out, value, type_name, name)
    out.append("}")


def _json_value(out: List[str], value: Any, type_name: str, where: str) -> None:
    if type_name in _FIELDS:
        _json_sequence(out, value, type_name)
        return
    value = _check_scalar(value, type_name, where)
    if type_name == "boolean":
        out.append("true" if value else "false")
    elif type_name == "string":
        out.append(_json_string(value))
    elif type_name == "base64Binary":
        out.append('"' + base64.b64encode(bytes(value)).decode("ascii") + '"')
    elif type_name in _ENUMS:
        out.append(f'"{value}"')
    else:
        out.append(str(value))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_decode(data: bytes, top: str) -> dict:
    try:
        tree = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise ProtocolError(f"invalid JSON control message: {e}") from None
    return _json_sequence_from(tree, top, top)


def _json_sequence_from(tree: Any, seq: str, path: str) -> dict:
    if not isinstance(tree, dict):
        raise ProtocolError(f"{path}: expected a JSON object")
    out: dict = {}
    for f in _FIELDS[seq]:
        if f.name is None:
            sels = _CHOICE_BY_NAME[f.type]
            found = [k for k in tree if k in sels and tree[k] is not None]
            if len(found) != 1:
                raise ProtocolError(f"{path}: expected one selection of {f.type}, got {found}")
            name = found[0]
            out[name] = _json_value_from(tree[name], sels[name][1], f"{path}.{name}")
            continue
        value = tree.get(f.name)
        if value is None:
            continue
        where = f"{path}.{f.name}"
        if f.array:
            if not isinstance(value, list):
                raise ProtocolError(f"{where}: expected a JSON array")
            out[f.name] = [_json_value_from(v, f.type, where) for v in value]
        else:
            out[f.name] = _json_value_from(value, f.type, where)
    return out


def _json_value_from(value: Any, type_name: str, where: str) -> Any:
    if type_name in _FIELDS:
        return _json_sequence_from(value, type_name, where)
    if type_name in _INT_RANGES:
        try:
            return _check_int(value, type_name, where)
        except (TypeError, ValueError) as e:
            raise ProtocolError(str(e)) from None
    if type_name in _ENUMS:
        if not isinstance(value, str) or value not in _ENUMS[type_name]:
            raise ProtocolError(f"{where}: {value!r} is not a {type_name}")
        return value
    if type_name == "boolean":
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true/false")
        return value
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: expected a JSON string")
    if type_name == "string":
        return value
    try:  # base64Binary
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, binascii.Error) as e:
        raise ProtocolError(f"{where}: invalid base64: {e}") from None
