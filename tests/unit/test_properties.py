"""Property type inference and overrides (protocol §6)."""
import pytest

from bmq import PropertyError, PropertyType
from bmq import _codec
from bmq._properties import encode, infer_type


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, PropertyType.BOOL),
        (False, PropertyType.BOOL),
        (0, PropertyType.INT32),
        (2**31 - 1, PropertyType.INT32),
        (-(2**31), PropertyType.INT32),
        (2**31, PropertyType.INT64),
        (-(2**31) - 1, PropertyType.INT64),
        (2**63 - 1, PropertyType.INT64),
        ("text", PropertyType.STRING),
        (b"\x00\x01", PropertyType.BINARY),
        (bytearray(b"x"), PropertyType.BINARY),
    ],
)
def test_inference_follows_python_types(value, expected):
    assert infer_type("p", value) == expected


@pytest.mark.parametrize("value", [1.5, None, [1], 2**63, -(2**63) - 1])
def test_values_without_a_type_are_refused_with_the_name(value):
    with pytest.raises(PropertyError) as info:
        infer_type("price", value)
    assert info.value.name == "price"


def test_encode_round_trips_all_seven_types_with_overrides():
    props = {"b": True, "c": b"\x07", "sh": 300, "i32": -5, "i64": 2**40, "s": "text", "bin": b"\x00\x01\x02"}
    area = encode(props, {"c": PropertyType.CHAR, "sh": PropertyType.SHORT})
    decoded = _codec.decode_properties(area, True)
    assert {k: v for k, (_, v) in decoded.items()} == props
    assert {k: PropertyType(t) for k, (t, _) in decoded.items()} == {
        "b": PropertyType.BOOL,
        "c": PropertyType.CHAR,
        "sh": PropertyType.SHORT,
        "i32": PropertyType.INT32,
        "i64": PropertyType.INT64,
        "s": PropertyType.STRING,
        "bin": PropertyType.BINARY,
    }


def test_override_widens_a_small_int():
    area = encode({"n": 7}, {"n": PropertyType.INT64})
    assert _codec.decode_properties(area, True) == {"n": (_codec.PROPERTY_INT64, 7)}


def test_old_style_encoding_is_selectable():
    area = encode({"n": 7}, None, new_style=False)
    assert _codec.decode_properties(area, False) == {"n": (_codec.PROPERTY_INT32, 7)}


def test_no_properties_encode_to_none():
    assert encode(None) is None
    assert encode({}) is None


def test_override_for_unknown_name_is_refused():
    with pytest.raises(PropertyError, match="unknown"):
        encode({"a": 1}, {"b": PropertyType.INT64})


def test_override_must_be_a_property_type():
    with pytest.raises(PropertyError, match="PropertyType"):
        encode({"a": 1}, {"a": "INT64"})  # type: ignore[dict-item]


def test_out_of_range_override_is_a_property_error():
    with pytest.raises(PropertyError):
        encode({"a": 70000}, {"a": PropertyType.SHORT})


def test_too_many_properties_is_a_property_error():
    with pytest.raises(PropertyError):
        encode({f"p{i}": i for i in range(256)})
