"""Control-message schema codec: NegotiationMessage, ControlMessage and
AuthenticationMessage (protocol §8) as plain dicts, encoded as JSON or BER.

Messages are dicts in the JSON shape: XSD element names as keys, enumerations as their
names (``"E_SUCCESS"``), integers as ``int``, booleans as ``bool``, strings as ``str`` and
base64Binary as ``bytes``. A ControlMessage carries its choice next to ``rId``:
``{"rId": 3, "openQueue": {...}}``; the other two kinds are one-key dicts.

The schema is one declarative table (:mod:`bmq._ctrlmsg`) that this JSON codec and the BER
codec (:mod:`bmq._ber`) both walk; neither imports the other's internals. Encoders write exactly the elements present in the dict (callers decide
defaults; :func:`with_defaults` fills them the way bmqbrkr does). Decoders return only the
elements present on the wire and raise only :class:`~bmq.exceptions.ProtocolError`.

Thread-safety: every function is pure and safe to call from any thread.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from ._ber import decode as _ber_decode, encode as _ber_encode
from ._ctrlmsg import (
    Field,
    KIND_AUTHENTICATION, KIND_CONTROL, KIND_NEGOTIATION, ALL_SELECTIONS, CHOICE_BY_NAME, ENUMS, ENUM_BY_VALUE,
    FIELDS, INT_RANGES, check_int, check_keys, check_kind, check_scalar, selection_of,
)
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


# Same values as bmq._codec.ENCODING_*; repeated here so that the schema layer works (and
# is testable) without the compiled extension.
ENCODING_BER = 0
ENCODING_JSON = 1

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
    return _fill_sequence(message, check_kind(kind))


def _fill_sequence(msg: Mapping, seq: str) -> dict:
    check_keys(msg, seq)
    out: dict = {}
    for f in FIELDS[seq]:
        if f.name is None:
            name, value = selection_of(msg, f.type)
            out[name] = _fill_value(value, CHOICE_BY_NAME[f.type][name][1], False)
        elif f.name in msg and msg[f.name] is not None:
            out[f.name] = _fill_value(msg[f.name], f.type, f.array)
        elif not f.optional:
            out[f.name] = _zero(f)
    return out


def _fill_value(value: Any, type_name: str, array: bool) -> Any:
    if array:
        return [_fill_value(v, type_name, False) for v in value]
    if type_name in FIELDS:
        return _fill_sequence(value, type_name)
    return value


def _zero(f: Field) -> Any:
    if f.array:
        return []
    if f.default is not None:
        return f.default
    if f.type in FIELDS:
        return _fill_sequence({}, f.type)
    if f.type in ENUMS:  # a default-constructed C++ enum holds 0; every enum here has one
        return ENUM_BY_VALUE[f.type][0]
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
        if key in ALL_SELECTIONS:
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
    top = check_kind(kind)
    if encoding == ENCODING_JSON:
        out: List[str] = []
        _json_sequence(out, message, top)
        try:
            return "".join(out).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"string is not valid Unicode: {e}") from e
    if encoding == ENCODING_BER:
        return _ber_encode(message, top)
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
    top = check_kind(kind)
    data = bytes(body)
    if encoding == ENCODING_JSON:
        message = _json_decode(data, top)
    elif encoding == ENCODING_BER:
        message = _ber_decode(data, top)
    else:
        raise ProtocolError(f"unknown control message encoding {encoding!r}")
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("decoded %s message (encoding %d): %r", kind, encoding, _redacted(message))
    return message


def _redacted(message: dict) -> dict:
    """``message`` fit for a log: an AuthenticationRequest's data (a secret) is left out."""
    request = message.get("authenticationRequest")
    if not isinstance(request, Mapping) or "data" not in request:
        return message
    return {"authenticationRequest": dict(request, data=f"<{len(request['data'])} bytes, not logged>")}


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
    check_keys(msg, seq)
    out.append("{")
    first = True
    for f in FIELDS[seq]:
        if f.name is None:
            name, value = selection_of(msg, f.type)
            type_name, array = CHOICE_BY_NAME[f.type][name][1], False
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
    if type_name in FIELDS:
        _json_sequence(out, value, type_name)
        return
    value = check_scalar(value, type_name, where)
    if type_name == "boolean":
        out.append("true" if value else "false")
    elif type_name == "string":
        out.append(_json_string(value))
    elif type_name == "base64Binary":
        out.append('"' + base64.b64encode(bytes(value)).decode("ascii") + '"')
    elif type_name in ENUMS:
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
    for f in FIELDS[seq]:
        if f.name is None:
            sels = CHOICE_BY_NAME[f.type]
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
    if type_name in FIELDS:
        return _json_sequence_from(value, type_name, where)
    if type_name in INT_RANGES:
        try:
            return check_int(value, type_name, where)
        except (TypeError, ValueError) as e:
            raise ProtocolError(str(e)) from None
    if type_name in ENUMS:
        if not isinstance(value, str) or value not in ENUMS[type_name]:
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
