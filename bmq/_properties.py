"""Message properties from Python values: type inference and per-call overrides (protocol §6)."""
from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Sequence, Set

from . import _codec
from ._types import PropertyType
from .exceptions import PropertyError

__all__ = ["encode", "encode_each"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def infer_type(name: str, value: Any) -> int:
    """The wire property type for a Python value.

    bool -> BOOL, int -> INT32 when it fits else INT64, str -> STRING, bytes-like -> BINARY.

    Raises:
        PropertyError: no type fits (another Python type, or an int beyond 64 bits).
    """
    # bool first: it is an int subclass.
    if isinstance(value, bool):
        return _codec.PROPERTY_BOOL
    if isinstance(value, int):
        if _INT32_MIN <= value <= _INT32_MAX:
            return _codec.PROPERTY_INT32
        if _INT64_MIN <= value <= _INT64_MAX:
            return _codec.PROPERTY_INT64
        raise PropertyError(f"property {name!r}: int {value} does not fit in 64 bits", name)
    if isinstance(value, str):
        return _codec.PROPERTY_STRING
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _codec.PROPERTY_BINARY
    raise PropertyError(
        f"property {name!r}: cannot infer a property type for {type(value).__name__}; "
        "use bool, int, str or bytes (or give property_types)",
        name,
    )


def encode(
    properties: Optional[Mapping[str, Any]],
    property_types: Optional[Mapping[str, PropertyType]] = None,
    new_style: bool = True,
) -> Optional[bytes]:
    """The encoded properties area for ``properties``, or None when there are none.

    Args:
        properties: ``{name: value}``.
        property_types: ``{name: PropertyType}`` overriding the inferred type of some names.
        new_style: MESSAGE_PROPERTIES_EX encoding (what the broker negotiated).

    Returns:
        The padded area (bytes) or None for no/empty properties.

    Raises:
        PropertyError: a name, type or value the protocol cannot carry, or ``property_types``
            naming a property that ``properties`` lacks.
    """
    _check_typed_names(property_types, properties or {})
    return _encode(properties, property_types or {}, new_style)


def encode_each(
    items: Sequence[Optional[Mapping[str, Any]]],
    property_types: Optional[Mapping[str, PropertyType]] = None,
    new_style: bool = True,
) -> List[Optional[bytes]]:
    """One encoded area (or None) per message for per-message properties.

    ``property_types`` applies to the messages that have those names; a message lacking a
    typed name simply has no such property.

    Raises:
        PropertyError: as :func:`encode`; ``property_types`` naming a property that no
            message has (a typo would otherwise be silently ignored).
    """
    overrides = property_types or {}
    if overrides:
        present: Set[str] = set()
        for item in items:
            if item:
                present.update(item)
        _check_typed_names(overrides, present)
    return [_encode(item, overrides, new_style) for item in items]


def _check_typed_names(property_types: Optional[Mapping[str, PropertyType]], names: Iterable[Any]) -> None:
    if not property_types:
        return
    unknown = sorted(set(property_types).difference(names), key=str)
    if unknown:
        raise PropertyError(f"property_types names unknown properties: {unknown}", unknown[0])


def _encode(properties: Optional[Mapping[str, Any]], overrides: Mapping[str, PropertyType],
            new_style: bool) -> Optional[bytes]:
    if not properties:
        return None
    typed = {}
    for name, value in properties.items():
        if not isinstance(name, str):
            raise PropertyError(f"property names must be str, not {type(name).__name__}")
        kind = overrides.get(name)
        if kind is None:
            code = infer_type(name, value)
        elif isinstance(kind, PropertyType):
            code = int(kind)
        else:
            raise PropertyError(f"property {name!r}: type override must be a bmq.PropertyType, not {kind!r}", name)
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        typed[name] = (code, value)
    try:
        return _codec.encode_properties(typed, new_style)
    except TypeError as e:
        raise PropertyError(str(e)) from e
