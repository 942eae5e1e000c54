"""Encoder limits and errors (§6.3, §12.5): every refusal happens before anything is built."""
from __future__ import annotations

import pytest

from bmq import _codec as codec
from bmq.exceptions import MessageTooLargeError, PropertyError, ProtocolError

GUID = bytes(range(16))


def put(payloads, **kwargs):
    return codec.build_put_events(1, GUID * len(payloads), payloads, **kwargs)


def test_empty_payload_is_value_error():
    with pytest.raises(ValueError, match="message 1: empty payload"):
        put([b"x", b""])


def test_payload_over_64_mib_is_too_large():
    with pytest.raises(MessageTooLargeError):
        put([b"x", bytes(codec.MAX_PAYLOAD_SIZE + 1)])


def test_properties_count_toward_the_64_mib_limit():
    area = codec.encode_properties({"p": (codec.PROPERTY_BINARY, bytes(4096))})
    with pytest.raises(MessageTooLargeError):
        put([bytes(codec.MAX_PAYLOAD_SIZE - 100)], properties=area)


def test_exactly_64_mib_payload_builds():
    (event,) = put([bytes(codec.MAX_PAYLOAD_SIZE)])
    ((_, _, _, crc, _, _, _, app),) = codec.iter_put_messages(event)
    assert len(app) == codec.MAX_PAYLOAD_SIZE
    assert crc == codec.crc32c(app)


def test_guids_length_must_match():
    with pytest.raises(ValueError, match="GUIDs"):
        codec.build_put_events(1, GUID, [b"a", b"b"])


@pytest.mark.parametrize("kwargs", [{"flags": codec.PUT_MESSAGE_PROPERTIES}, {"flags": 8}, {"compression": 2},
                                    {"max_event_size": 10}])
def test_bad_put_arguments(kwargs):
    with pytest.raises(ValueError):
        put([b"a"], **kwargs)


def test_per_message_lists_must_match_length():
    with pytest.raises(ValueError):
        codec.build_put_events([1, 2, 3], GUID * 2, [b"a", b"b"])
    with pytest.raises(ValueError):
        codec.build_put_events(1, GUID * 2, [b"a", b"b"], [None])


def test_bad_properties_area_is_refused():
    with pytest.raises(ValueError):
        put([b"a"], properties=b"\x1b\x00\x00")


def test_events_split_at_max_event_size():
    payloads = [bytes([i]) * (50 + i) for i in range(100)]
    guids = b"".join(i.to_bytes(16, "big") for i in range(100))
    events = codec.build_put_events(5, guids, payloads, max_event_size=1000)
    assert len(events) > 1
    assert all(len(e) <= 1000 for e in events)
    # Greedy packing: each event but the last could not take the next message.
    messages = [m for e in events for m in codec.iter_put_messages(e)]
    assert [m[7] for m in messages] == payloads
    assert [m[2] for m in messages] == [i.to_bytes(16, "big") for i in range(100)]
    first_of_next = 0
    for event in events[:-1]:
        first_of_next += len(codec.iter_put_messages(event))
        nxt = 36 + len(payloads[first_of_next]) + codec.padding_length(len(payloads[first_of_next]))
        assert len(event) + nxt > 1000


def test_message_that_cannot_fit_in_an_event():
    with pytest.raises(MessageTooLargeError):
        put([bytes(200)], max_event_size=100)
    with pytest.raises(MessageTooLargeError):
        codec.build_push_events([(1, GUID, (), bytes(200), 0, 0, 0)], max_event_size=100)


def test_default_put_event_limit_is_66_mib():
    events = put([bytes(40 * 1024 * 1024), bytes(40 * 1024 * 1024)])
    assert len(events) == 2
    assert all(len(e) <= codec.MAX_PUT_EVENT_SIZE for e in events)


def test_256_properties_names_the_extra_one():
    props = {f"p{i}": (codec.PROPERTY_INT32, i) for i in range(256)}
    with pytest.raises(PropertyError) as info:
        codec.encode_properties(props)
    assert info.value.name == "p255"
    assert "p255" in str(info.value)
    del props["p255"]
    assert len(codec.decode_properties(codec.encode_properties(props), True)) == 255


@pytest.mark.parametrize(
    "name,spec",
    [
        ("b", (codec.PROPERTY_BOOL, 1)),
        ("c", (codec.PROPERTY_CHAR, b"ab")),
        ("c2", (codec.PROPERTY_CHAR, 128)),
        ("s", (codec.PROPERTY_SHORT, 2**15)),
        ("s2", (codec.PROPERTY_SHORT, "1")),
        ("i", (codec.PROPERTY_INT32, -(2**31) - 1)),
        ("i2", (codec.PROPERTY_INT32, True)),
        ("l", (codec.PROPERTY_INT64, 2**63)),
        ("l2", (codec.PROPERTY_INT64, 1.0)),
        ("str", (codec.PROPERTY_STRING, b"bytes")),
        ("bin", (codec.PROPERTY_BINARY, "text")),
        ("t", (0, 1)),
        ("t2", (8, 1)),
        ("shape", (codec.PROPERTY_INT32,)),
        ("shape2", 5),
        ("x" * 4096, (codec.PROPERTY_INT32, 1)),
        ("", (codec.PROPERTY_INT32, 1)),
    ],
)
def test_bad_property_is_named(name, spec):
    with pytest.raises(PropertyError) as info:
        codec.encode_properties({"ok": (codec.PROPERTY_BOOL, True), name: spec})
    assert info.value.name == name


def test_property_limits_at_the_edges():
    ok = {
        "x" * 4095: (codec.PROPERTY_INT32, 1),
        "c": (codec.PROPERTY_CHAR, -1),
        "s": (codec.PROPERTY_SHORT, -(2**15)),
        "empty": (codec.PROPERTY_STRING, ""),
    }
    decoded = codec.decode_properties(codec.encode_properties(ok, False), False)
    assert decoded["c"] == (codec.PROPERTY_CHAR, b"\xff")
    assert decoded["x" * 4095] == (codec.PROPERTY_INT32, 1)
    assert decoded["empty"] == (codec.PROPERTY_STRING, "")


def test_oversized_property_value_is_property_error():
    with pytest.raises(PropertyError) as info:
        codec.encode_properties({"big": (codec.PROPERTY_BINARY, bytes(codec.MAX_PROPERTY_VALUE_LENGTH + 1))})
    assert info.value.name == "big"


def test_property_area_limit_is_property_error():
    chunk = bytes(codec.MAX_PROPERTY_VALUE_LENGTH)
    with pytest.raises(PropertyError) as info:
        codec.encode_properties({"a": (codec.PROPERTY_BINARY, chunk), "b": (codec.PROPERTY_BINARY, bytes(5000))})
    assert info.value.name == "b"


def test_empty_and_non_str_properties():
    with pytest.raises(PropertyError):
        codec.encode_properties({})
    with pytest.raises(PropertyError):
        codec.encode_properties({1: (codec.PROPERTY_INT32, 1)})


def test_non_utf8_string_decodes_leniently_but_is_never_encoded():
    area = codec.encode_properties({"s": (codec.PROPERTY_BINARY, b"\xff")}, True)
    # Re-type the value as STRING on the wire: invalid UTF-8 must still decode.
    patched = bytearray(area)
    patched[6] = (codec.PROPERTY_STRING << 2)
    value = codec.decode_properties(bytes(patched), True)["s"][1]
    assert value == "\udcff"
    # Sending it back would put invalid UTF-8 on the wire, which other clients drop.
    with pytest.raises(PropertyError, match="'s'") as info:
        codec.encode_properties({"s": (codec.PROPERTY_STRING, value)})
    assert info.value.name == "s"
    with pytest.raises(PropertyError) as info:
        codec.encode_properties({"n\udc80": (codec.PROPERTY_BOOL, True)})
    assert info.value.name == "n\udc80"


def test_decode_properties_rejects_duplicates():
    area = bytearray(codec.encode_properties({"ab": (codec.PROPERTY_BOOL, True), "ac": (codec.PROPERTY_BOOL, False)}))
    name2 = area.index(b"ac")
    area[name2 + 1] = ord("b")
    with pytest.raises(ProtocolError, match="duplicate"):
        codec.decode_properties(bytes(area), True)


def test_ack_and_confirm_limits():
    with pytest.raises(ValueError):
        codec.build_ack_event([])
    with pytest.raises(ValueError):
        codec.build_ack_event([(16, 0, GUID, 0)])
    with pytest.raises(ValueError):
        codec.build_ack_event([(0, 2**24, GUID, 0)])
    with pytest.raises(ValueError):
        codec.build_ack_event([(0, 0, GUID[:15], 0)])
    with pytest.raises(ValueError):
        codec.build_confirm_event([(2**32, GUID, 0)])
    with pytest.raises(TypeError):
        codec.build_confirm_event([("1", GUID, 0)])


def test_push_builder_refusals():
    with pytest.raises(ValueError):
        codec.build_push_events([(1, GUID, (), b"", 0, 0, 0)])
    with pytest.raises(ValueError):
        codec.build_push_events([(1, GUID, (), b"x", codec.PUSH_IMPLICIT_PAYLOAD, 0, 0)])
    with pytest.raises(ValueError):
        codec.build_push_events([(1, GUID, (), b"x", 8, 0, 0)])
    with pytest.raises(ValueError):
        codec.build_push_events([(1, GUID, (), b"x", 0, 3, 0)])
    with pytest.raises(ValueError):
        codec.build_push_events([(1, GUID, (2**32,), b"x", 0, 0, 0)])


def test_header_and_control_refusals():
    with pytest.raises(ValueError):
        codec.pack_event_header(0, 8)
    with pytest.raises(ValueError):
        codec.pack_event_header(64, 8)
    with pytest.raises(MessageTooLargeError):
        codec.pack_event_header(1, 2**31)
    with pytest.raises(ValueError):
        codec.pack_event_header(1, 8, 256)
    with pytest.raises(ValueError):
        codec.encode_control_event(b"{}", 2)
    with pytest.raises(ValueError):
        codec.encode_control_event(b"{}", 1, codec.EVENT_PUT)
    with pytest.raises(ValueError):
        codec.FrameReader(4)
    with pytest.raises(ValueError):
        codec.padding_length(-1)


def test_padding_rule():
    assert [codec.padding_length(n) for n in range(9)] == [4, 3, 2, 1, 4, 3, 2, 1, 4]
