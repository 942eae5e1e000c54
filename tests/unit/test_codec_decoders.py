"""Decoders on hand-made events: longer headers are skipped (not misread), every option format
of §4.3 is understood, and malformed input ends in ProtocolError with a location."""
from __future__ import annotations

import gc
import zlib

import pytest

from bmq import _codec as codec
from bmq.exceptions import ProtocolError

GUID = bytes.fromhex("40000100000000018B15AF816E342015")
PAYLOAD = b"hello world"


def event(event_type: int, body: bytes, header_words: int = 2, type_specific: int = 0) -> bytes:
    """An event with an EventHeader of ``header_words`` words (extra words filled with 0xEE)."""
    length = 4 * header_words + len(body)
    header = codec.pack_event_header(event_type, length, type_specific)
    return header[:5] + bytes([header_words]) + header[6:] + b"\xee" * (4 * header_words - 8) + body


def padded(data: bytes) -> bytes:
    n = codec.padding_length(len(data))
    return data + bytes([n]) * n


def push_message(app: bytes, options: bytes = b"", header_words: int = 8, flags: int = 0, cat: int = 0,
                 schema: int = 0, queue_id: int = 3) -> bytes:
    app = padded(app) if app else b""
    header_len = 4 * header_words
    words = (header_len + len(options) + len(app)) // 4
    head = ((flags << 28) | words).to_bytes(4, "big")
    head += (((len(options) // 4) << 8) | (cat << 5) | header_words).to_bytes(4, "big")
    head += queue_id.to_bytes(4, "big") + GUID
    if header_words >= 8:
        head += schema.to_bytes(2, "big") + b"\0\0"
    head += b"\xee" * (header_len - len(head))
    return head + options + app


def put_message(app: bytes, header_words: int = 9, flags: int = 0, schema: int = 0, cat: int = 0) -> bytes:
    app_padded = padded(app)
    header_len = 4 * header_words
    words = (header_len + len(app_padded)) // 4
    head = ((flags << 28) | words).to_bytes(4, "big") + ((cat << 5) | header_words).to_bytes(4, "big")
    head += (9).to_bytes(4, "big") + GUID + codec.crc32c(app).to_bytes(4, "big")
    if header_words >= 9:
        head += schema.to_bytes(2, "big") + b"\0\0"
    head += b"\xee" * (header_len - len(head))
    return head + app_padded


def option(otype: int, content: bytes = b"", packed: bool = False, ts: int = 0, words: int | None = None) -> bytes:
    if words is None:
        words = 1 + len(content) // 4
    return ((otype << 26) | (int(packed) << 25) | (ts << 21) | words).to_bytes(4, "big") + content


def ids(*values: int) -> bytes:
    return b"".join(v.to_bytes(4, "big") for v in values)


def infos(*values: int) -> bytes:
    return b"".join(v.to_bytes(4, "big") + b"\x85\0\0\0" for v in values)


def test_longer_event_header_is_skipped():
    ev = event(codec.EVENT_CONTROL, padded(b'{"a":1}'), header_words=4, type_specific=0x20)
    assert codec.unpack_event_header(ev) == (len(ev), codec.EVENT_CONTROL, 4, 0x20)
    assert codec.decode_control_event(ev) == (codec.ENCODING_JSON, b'{"a":1}')
    ack = event(codec.EVENT_ACK, b"\x16\0\0\0" + b"\x01\x00\x00\x07" + GUID + ids(5), header_words=3)
    assert codec.iter_acks(ack) == [(1, 7, GUID, 5)]


def test_put_header_words_8_9_and_10():
    for words, schema in ((8, 0), (9, 0), (10, 1)):
        msg = put_message(b"abc", header_words=words, flags=codec.PUT_MESSAGE_PROPERTIES if schema else 0,
                          schema=schema)
        if schema:
            # make the appData a real properties area so the message is consistent
            area = codec.encode_properties({"k": (codec.PROPERTY_BOOL, True)})
            msg = put_message(area + b"abc", header_words=words, flags=codec.PUT_MESSAGE_PROPERTIES, schema=1)
        ((flags, qid, guid, crc, cat, got_schema, options, app),) = codec.iter_put_messages(event(codec.EVENT_PUT, msg))
        assert (qid, guid, cat, got_schema, options) == (9, GUID, 0, schema, b"")
        assert crc == codec.crc32c(app)


def test_push_header_words_7_8_and_9():
    for words in (7, 8, 9):
        ev = event(codec.EVENT_PUSH, push_message(PAYLOAD, header_words=words, schema=5))
        ((qid, guid, sub, flags, props, new_style, payload),) = codec.iter_push_messages(ev)
        assert (qid, guid, sub, props, payload) == (3, GUID, (0,), None, PAYLOAD)
        assert new_style == (words >= 8)


@pytest.mark.parametrize(
    "options,expected",
    [
        (option(1, ids(4)), (4,)),
        (option(1, ids(1, 2, 3)), (1, 2, 3)),
        (option(3, infos(9), ts=2), (9,)),
        (option(3, infos(9, 10), ts=2), (9, 10)),
        (option(3, packed=True, words=0x80), (0,)),
        (option(1, ids(4)) + option(3, infos(8), ts=2), (8,)),
        (option(3, packed=True, words=0x85) + option(1, ids(6)), (0,)),
        (option(2, padded(b"group")), (0,)),
        (option(2, padded(b"group")) + option(1, ids(2)), (2,)),
    ],
)
def test_push_options(options, expected):
    ev = event(codec.EVENT_PUSH, push_message(PAYLOAD, options))
    assert codec.iter_push_messages(ev)[0][2] == expected


@pytest.mark.parametrize(
    "options",
    [
        option(0, ids(1)),
        option(4, ids(1)),
        option(1, ids(1)) + option(1, ids(2)),
        option(1, words=1),
        option(1, ids(1), words=3),
        option(3, infos(1), ts=0),
        option(3, infos(1) + b"\0\0\0\0", ts=2),
        b"\0\0",
    ],
)
def test_bad_push_options(options):
    options += b"\0" * (-len(options) % 4)
    with pytest.raises(ProtocolError) as info:
        codec.iter_push_messages(event(codec.EVENT_PUSH, push_message(PAYLOAD, options)))
    assert info.value.event_type == codec.EVENT_PUSH
    assert info.value.offset is not None


def test_push_properties_and_compression_cases():
    area = codec.encode_properties({"k": (codec.PROPERTY_STRING, "v")}, True)
    old = codec.encode_properties({"k": (codec.PROPERTY_STRING, "v")}, False)
    big = b"z" * 5000
    cases = [
        (area + big, codec.PUSH_MESSAGE_PROPERTIES, 0, 2, area, True),
        (area + zlib.compress(big), codec.PUSH_MESSAGE_PROPERTIES, 1, 2, area, True),
        (zlib.compress(old + big), codec.PUSH_MESSAGE_PROPERTIES, 1, 0, old, False),
        (zlib.compress(big), 0, 1, 0, None, False),
    ]
    for app, flags, cat, schema, props, new_style in cases:
        ev = event(codec.EVENT_PUSH, push_message(app, flags=flags, cat=cat, schema=schema))
        ((_, _, _, got_flags, got_props, got_style, payload),) = codec.iter_push_messages(ev)
        assert (got_flags, got_props, got_style, payload) == (flags, props, new_style, big)
        assert codec.split_app_data(app, flags, cat, schema) == (props, big)


def test_ack_with_bigger_records_and_header():
    body = bytes([0x27, 0, 0, 0]) + b"\xee" * 4 + (b"\x02\x00\x00\x09" + GUID + ids(4) + b"\xee" * 4) * 2
    assert codec.iter_acks(event(codec.EVENT_ACK, body)) == [(2, 9, GUID, 4)] * 2
    conf = bytes([0x17, 0, 0, 0]) + (ids(1) + GUID + ids(2) + b"\xee" * 4) * 3
    assert codec.iter_confirms(event(codec.EVENT_CONFIRM, conf)) == [(1, GUID, 2)] * 3


def test_negative_ids_round_trip_signed():
    ev = codec.build_confirm_event([(-1, GUID, -2), (0xFFFFFFFF, GUID, 0x80000000)])
    assert codec.iter_confirms(ev) == [(-1, GUID, -2), (-1, GUID, -(2**31))]


@pytest.mark.parametrize(
    "data,decoder",
    [
        (b"", codec.unpack_event_header),
        (b"\0\0\0\x08\x42\x02\0", codec.unpack_event_header),
        (b"\x80\0\0\x08\x42\x02\0\0", codec.unpack_event_header),
        (b"\0\0\0\x07\x42\x02\0\0", codec.unpack_event_header),
        (b"\0\0\0\x10\x42\x02\0\0", codec.unpack_event_header),
        (b"\0\0\0\x08\x82\x02\0\0", codec.unpack_event_header),
        (b"\0\0\0\x08\x40\x02\0\0", codec.unpack_event_header),
        (b"\0\0\0\x08\x42\x01\0\0", codec.unpack_event_header),
        (b"\0\0\0\x08\x42\x03\0\0", codec.unpack_event_header),
        (codec.HEARTBEAT_REQ, codec.iter_put_messages),
        (codec.pack_event_header(codec.EVENT_PUT, 8), codec.iter_put_messages),
        (codec.pack_event_header(codec.EVENT_PUSH, 8), codec.iter_push_messages),
        (codec.pack_event_header(codec.EVENT_ACK, 8), codec.iter_acks),
        (codec.pack_event_header(codec.EVENT_ACK, 14) + b"\x16\0\0\0\0\0", codec.iter_acks),
        (codec.pack_event_header(codec.EVENT_ACK, 12) + b"\x15\0\0\0", codec.iter_acks),
        (codec.pack_event_header(codec.EVENT_CONFIRM, 12) + b"\x06\0\0\0", codec.iter_confirms),
        (codec.pack_event_header(codec.EVENT_CONTROL, 8), codec.decode_control_event),
        (codec.pack_event_header(codec.EVENT_CONTROL, 12) + b"abc\x05", codec.decode_control_event),
        (codec.pack_event_header(codec.EVENT_CONTROL, 12, 0x40) + b"abc\x01", codec.decode_control_event),
        (codec.pack_event_header(codec.EVENT_PUT, 12) + b"abc\x01", codec.decode_control_event),
    ],
)
def test_malformed_events(data, decoder):
    with pytest.raises(ProtocolError):
        decoder(data)


def test_malformed_put_messages():
    good = put_message(PAYLOAD)
    cases = {
        "flags": bytes([good[0] | 0x40]) + good[1:],
        "schema without properties": put_message(PAYLOAD, schema=1),
        "cat": put_message(PAYLOAD, cat=2),
        "short header": put_message(PAYLOAD, header_words=7),
        "bad padding": good[:-1] + b"\x07",
        "overrun": good[:3] + bytes([good[3] + 1]) + good[4:],
        "no appData": (9).to_bytes(4, "big") + good[4:36],
    }
    for name, msg in cases.items():
        with pytest.raises(ProtocolError):
            codec.iter_put_messages(event(codec.EVENT_PUT, msg))
            pytest.fail(name)


def test_frame_reader_rejects_bad_lengths_and_stays_broken():
    for word in (b"\0\0\0\x04", b"\x80\0\0\x10", b"\x7f\xff\xff\xff"):
        reader = codec.FrameReader(max_event_size=1 << 20)
        assert reader.feed(codec.HEARTBEAT_REQ) == [codec.HEARTBEAT_REQ]
        with pytest.raises(ProtocolError):
            reader.feed(word + b"\0" * 4)
        with pytest.raises(ProtocolError):
            reader.feed(codec.HEARTBEAT_REQ)


def test_frame_reader_buffers_partial_events():
    reader = codec.FrameReader()
    assert reader.feed(codec.HEARTBEAT_REQ[:3]) == []
    assert reader.buffered == 3
    assert reader.feed(bytearray(codec.HEARTBEAT_REQ[3:] + codec.HEARTBEAT_RSP[:6])) == [codec.HEARTBEAT_REQ]
    assert reader.buffered == 6
    assert reader.feed(codec.HEARTBEAT_RSP[6:]) == [codec.HEARTBEAT_RSP]
    assert reader.buffered == 0


def test_split_app_data_errors():
    area = codec.encode_properties({"k": (codec.PROPERTY_BOOL, True)})
    with pytest.raises(ProtocolError):
        codec.split_app_data(area[:5], codec.PUT_MESSAGE_PROPERTIES, 0, 0)
    with pytest.raises(ProtocolError):
        codec.split_app_data(area, codec.PUT_MESSAGE_PROPERTIES, 2, 0)
    with pytest.raises(ProtocolError):
        codec.split_app_data(zlib.compress(b"x" * 100)[:-3], 0, 1, 0)
    assert codec.split_app_data(b"raw", 0, 0, 0) == (None, b"raw")


def test_make_acks_builds_the_named_tuples_and_refuses_bad_input():
    from bmq._types import ACK_STATUS_FROM_WIRE, Ack, AckStatus

    guids = [b"a" * 16, b"b" * 16]
    acks = codec.make_acks(Ack, ACK_STATUS_FROM_WIRE, guids, [0, 1], "bmq://d/q")
    assert acks == [Ack(AckStatus.SUCCESS, guids[0], "bmq://d/q"), Ack(AckStatus.LIMIT_MESSAGES, guids[1], "bmq://d/q")]
    assert all(type(ack) is Ack for ack in acks)
    # Untracked by the collector (they hold nothing that could refer back): a post_many's
    # thousands of Acks must not set off full collections.
    assert not any(map(gc.is_tracked, acks))
    assert codec.make_acks(Ack, ACK_STATUS_FROM_WIRE, [], [], "u") == []
    with pytest.raises(ValueError):
        codec.make_acks(Ack, ACK_STATUS_FROM_WIRE, guids, [0], "u")
    with pytest.raises(ValueError):
        codec.make_acks(Ack, ACK_STATUS_FROM_WIRE[:2], guids, [0, 5], "u")  # no entry: no crash
    with pytest.raises(TypeError):
        codec.make_acks(dict, ACK_STATUS_FROM_WIRE, guids, [0, 1], "u")
