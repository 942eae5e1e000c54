"""Message properties at post time: property_types with messages of different shapes, and str
values that must be valid UTF-8 on the wire."""
from __future__ import annotations

import pytest

import bmq
from bmq import _codec, _properties
from support import fresh_uri as fresh

pytestmark = pytest.mark.timeout(60)


# ---- property_types with per-message properties of different shapes -----------------------
def test_property_types_apply_only_to_messages_having_the_name():
    areas = _properties.encode_each([{"c": b"\x01"}, {"other": 1}, None], {"c": bmq.PropertyType.CHAR})
    assert _codec.decode_properties(areas[0], True) == {"c": (_codec.PROPERTY_CHAR, b"\x01")}
    assert _codec.decode_properties(areas[1], True) == {"other": (_codec.PROPERTY_INT32, 1)}
    assert areas[2] is None


def test_property_types_naming_a_property_no_message_has_is_an_error():
    with pytest.raises(bmq.PropertyError, match="typo") as info:
        _properties.encode_each([{"c": b"\x01"}, {"other": 1}], {"c": bmq.PropertyType.CHAR, "typo": 1})
    assert info.value.name == "typo"
    with pytest.raises(bmq.PropertyError, match="c"):
        _properties.encode_each([None, {}], {"c": bmq.PropertyType.CHAR})
    with pytest.raises(bmq.PropertyError):
        _properties.encode({"other": 1}, {"c": bmq.PropertyType.CHAR})  # one mapping: still strict


def test_post_many_with_heterogeneous_properties_and_types(session):
    writer = reader = session.open_queue(fresh(), read=True, write=True)
    acks = writer.post_many([b"a", b"b"], properties=[{"c": b"\x01"}, {"other": 1}],
                            property_types={"c": bmq.PropertyType.CHAR})
    assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 2
    got = {m.data: m for m in (reader.get(timeout=5), reader.get(timeout=5)) if m is not None}
    assert got[b"a"].property_types == {"c": bmq.PropertyType.CHAR}
    assert got[b"b"].properties == {"other": 1}


# ---- str properties must be valid UTF-8 on the wire ---------------------------------------
@pytest.mark.parametrize("properties, name", [
    ({"x": "\udc80", "y": "ok"}, "x"),
    ({"n\udc80": "value"}, "n\udc80"),
])
def test_str_property_that_is_not_utf8_is_refused_at_post_time(session, properties, name):
    writer = reader = session.open_queue(fresh(), read=True, write=True)
    with pytest.raises(bmq.PropertyError) as info:
        writer.post(b"bad", properties=properties)
    assert info.value.name == name
    assert writer.post(b"good", properties={"y": "ok"}).status is bmq.AckStatus.SUCCESS
    message = reader.get(timeout=5)
    assert message is not None and message.data == b"good" and message.properties == {"y": "ok"}
    assert reader.get(timeout=0.2) is None  # the refused post sent nothing
