"""Every protocol test vector (protocol §14) decoded field by field, and re-encoded byte for
byte wherever the encoding is deterministic."""
from __future__ import annotations

import json
from pathlib import Path

import crc32c
import pytest

from bmq import _codec as codec
from bmq.exceptions import ProtocolError
from support import expand_columns, messages_of_push

ALPHABET = b"abcdefghijklmnopqrstuvwxyz"
PUSH_GUID = bytes.fromhex("ABCDEF0123456789ABCDEF0123456789")
ACK_GUID = bytes.fromhex("0000000000003039CD8101000000270F")
LEGACY_1234 = b"\0" + (1234).to_bytes(3, "big") + 12 * b"\0"
PROPERTIES = {
    "encoding": (codec.PROPERTY_INT32, 3),
    "timestamp": (codec.PROPERTY_INT64, 1234567890),
    "id": (codec.PROPERTY_STRING, "myCoolId"),
}

# file -> (header length, type, type-specific byte, unpadded body length, padding byte)
CONTROL = {
    "broker_response_20032018.bin": (104, 1, 0x00, 94, 2),
    "msg_control_nego_client_04042018.bin": (68, 1, 0x00, 59, 1),
    "msg_control_nego_client_a326573a-2c1e-42a2-afdc-da184456c118.bin": (248, 1, 0x20, 236, 4),
    "msg_control_nego_client_broker_response_623ff064-7d51-4bd8-988d-826ccfd458a8.bin": (396, 1, 0x20, 385, 3),
    "msg_control_open_queue_06042018.bin": (80, 1, 0x00, 68, 4),
    "msg_control_open_queue_5e110b7c-e332-4f5b-8313-c419ad0fbf48.bin": (156, 1, 0x20, 146, 2),
    "msg_control_open_queue_json_with_id_05092018.bin": (164, 1, 0x20, 154, 2),
    "msg_control_open_queue_response_9950845d-d1dc-418f-811a-1b620c73e589.bin": (220, 1, 0x20, 209, 3),
    "msg_control_open_queue_response_id_json_06092018.bin": (228, 1, 0x20, 217, 3),
    "msg_control_status_27032018.bin": (36, 1, 0x00, 24, 4),
    "msg_control_status_53121b03-f45d-46b2-95d0-f2df8a1a2cb2.bin": (72, 1, 0x20, 63, 1),
    "msg_control_status_rid_json_05092018.bin": (80, 1, 0x20, 71, 1),
}
JSON_TOP_LEVEL = {
    "msg_control_nego_client_a326573a-2c1e-42a2-afdc-da184456c118.bin": ("clientIdentity", None),
    "msg_control_nego_client_broker_response_623ff064-7d51-4bd8-988d-826ccfd458a8.bin": ("brokerResponse", None),
    "msg_control_open_queue_5e110b7c-e332-4f5b-8313-c419ad0fbf48.bin": ("openQueue", None),
    "msg_control_open_queue_json_with_id_05092018.bin": ("openQueue", 1),
    "msg_control_open_queue_response_9950845d-d1dc-418f-811a-1b620c73e589.bin": ("openQueueResponse", None),
    "msg_control_open_queue_response_id_json_06092018.bin": ("openQueueResponse", 1),
    "msg_control_status_53121b03-f45d-46b2-95d0-f2df8a1a2cb2.bin": ("status", None),
    "msg_control_status_rid_json_05092018.bin": ("status", 7),
}
BER_BODIES = {
    "msg_control_status_27032018.bin": bytes.fromhex("3080a180a080800100" "81017b" "8204") + b"Test" + bytes(6),
}


def read(vectors_dir: Path, name: str) -> bytes:
    return (vectors_dir / name).read_bytes()


def whole_event(data: bytes) -> bytes:
    """The event at the start of a vector file (several have trailing bytes)."""
    return data[: int.from_bytes(data[:4], "big")]


def test_every_vector_is_covered(vectors_dir):
    covered = set(CONTROL) | {
        "msg_ack_20072018.bin", "msg_confirm_15082018.bin", "msg_props.bin", "msg_props_old.bin",
        "msg_push_multi.bin", "msg_push_zlib.bin", "msg_put_multi.bin", "msg_put_multi_07082018.txt",
        "NOTICE.txt",
    }
    assert {p.name for p in vectors_dir.iterdir()} == covered


@pytest.mark.parametrize("name", sorted(CONTROL))
def test_control_vector(vectors_dir, name):
    length, event_type, type_specific, body_len, pad = CONTROL[name]
    data = read(vectors_dir, name)
    if len(data) < length:
        # broker_response_20032018.bin lost its 2 padding bytes: the truncated event must be
        # refused, the completed one must decode.
        with pytest.raises(ProtocolError):
            codec.decode_control_event(data)
        data = data + bytes([pad]) * (length - len(data))
    assert codec.unpack_event_header(data) == (length, event_type, 2, type_specific)
    encoding, body = codec.decode_control_event(data)
    assert encoding == type_specific >> 5
    assert len(body) == body_len
    assert data[8 + body_len : length] == bytes([pad]) * pad
    assert body == data[8 : 8 + body_len]
    assert codec.encode_control_event(body, encoding) == whole_event(data)
    if name in JSON_TOP_LEVEL:
        key, rid = JSON_TOP_LEVEL[name]
        decoded = json.loads(body)
        assert key in decoded
        assert decoded.get("rId") == rid
    else:
        assert body[:2] == b"\x30\x80"  # BER universal SEQUENCE, indefinite length
    if name in BER_BODIES:
        assert body == BER_BODIES[name]


def test_put_multi(vectors_dir):
    data = read(vectors_dir, "msg_put_multi.bin")
    assert codec.unpack_event_header(data) == (264, codec.EVENT_PUT, 2, 0)
    old_area = read(vectors_dir, "msg_props_old.bin")
    new_area = read(vectors_dir, "msg_props.bin")
    messages = codec.iter_put_messages(data)
    expected = [(3469549003, 0, old_area, False), (340340870, 1, new_area, True)]
    assert len(messages) == 2
    for message, (crc, schema, area, new_style) in zip(messages, expected):
        flags, queue_id, guid, crc_field, cat, schema_id, options, app_data = message
        assert flags == codec.PUT_ACK_REQUESTED | codec.PUT_MESSAGE_PROPERTIES
        assert queue_id == 9876
        assert guid == LEGACY_1234
        assert int.from_bytes(guid[1:4], "big") == 1234
        assert crc_field == crc == crc32c.crc32c(app_data) == codec.crc32c(app_data)
        assert (cat, schema_id, options) == (codec.COMPRESSION_NONE, schema, b"")
        assert len(app_data) == 90
        assert codec.split_app_data(app_data, flags, cat, schema_id) == (area, ALPHABET)
        assert codec.decode_properties(area, new_style) == PROPERTIES
    rebuilt = codec.build_put_events(
        9876, LEGACY_1234 * 2, [ALPHABET, ALPHABET], [old_area, new_area],
        flags=codec.PUT_ACK_REQUESTED, new_style_properties=[False, True],
    )
    assert rebuilt == [data]


def test_put_multi_text_dump_documents_8_word_header(vectors_dir):
    text = read(vectors_dir, "msg_put_multi_07082018.txt").decode()
    assert "9876" in text and "3469549003" in text


@pytest.mark.parametrize("name,new_style", [("msg_props_old.bin", False), ("msg_props.bin", True)])
def test_properties_vectors(vectors_dir, name, new_style):
    area = read(vectors_dir, name)
    assert len(area) == 64
    decoded = codec.decode_properties(area, new_style)
    assert decoded == PROPERTIES
    assert list(decoded) == ["encoding", "timestamp", "id"]
    assert codec.encode_properties(PROPERTIES, new_style) == area


def test_push_multi(vectors_dir):
    data = read(vectors_dir, "msg_push_multi.bin")
    assert codec.unpack_event_header(data) == (256, codec.EVENT_PUSH, 2, 0)
    old_area = read(vectors_dir, "msg_props_old.bin")
    new_area = read(vectors_dir, "msg_props.bin")
    messages = codec.iter_push_messages(data)
    assert messages == [
        (9876, PUSH_GUID, (0,), codec.PUSH_MESSAGE_PROPERTIES, old_area, False, ALPHABET),
        (9876, PUSH_GUID, (0,), codec.PUSH_MESSAGE_PROPERTIES, new_area, True, ALPHABET),
    ]
    rebuilt = codec.build_push_events([
        (9876, PUSH_GUID, (), old_area + ALPHABET, codec.PUSH_MESSAGE_PROPERTIES, 0, 0),
        (9876, PUSH_GUID, (), new_area + ALPHABET, codec.PUSH_MESSAGE_PROPERTIES, 0, 1),
    ])
    assert rebuilt == [data]


def test_push_zlib_header_parses_but_payload_does_not_decompress(vectors_dir):
    data = read(vectors_dir, "msg_push_zlib.bin")
    assert codec.unpack_event_header(data) == (64, codec.EVENT_PUSH, 2, 0)
    word0, word1 = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
    assert (word0 >> 28, word0 & 0x0FFFFFFF) == (0, 14)
    assert (word1 >> 8, (word1 >> 5) & 7, word1 & 0x1F) == (0, codec.COMPRESSION_ZLIB, 7)
    assert data[36:62] == ALPHABET
    with pytest.raises(ProtocolError) as info:
        codec.iter_push_messages(data)
    assert info.value.event_type == codec.EVENT_PUSH
    assert info.value.offset == 36
    with pytest.raises(ProtocolError):
        codec.split_app_data(ALPHABET, 0, codec.COMPRESSION_ZLIB, 0)


def test_ack_vector(vectors_dir):
    data = read(vectors_dir, "msg_ack_20072018.bin")
    assert codec.unpack_event_header(data) == (252, codec.EVENT_ACK, 2, 0)
    assert data[8:12] == b"\x16\x00\x00\x00"
    acks = codec.iter_acks(data)
    assert acks == [(i % 3, i * i, ACK_GUID, i) for i in range(10)]
    assert codec.build_ack_event(acks) == whole_event(data)


def test_confirm_vector(vectors_dir):
    data = read(vectors_dir, "msg_confirm_15082018.bin")
    assert codec.unpack_event_header(data) == (252, codec.EVENT_CONFIRM, 2, 0)
    confirms = codec.iter_confirms(data)
    assert confirms == [(3 * i, ACK_GUID, 3 * i + 1) for i in range(10)]
    assert codec.build_confirm_event(confirms) == whole_event(data)


def test_heartbeats():
    assert codec.HEARTBEAT_REQ == bytes.fromhex("000000084B020000")
    assert codec.HEARTBEAT_RSP == bytes.fromhex("000000084C020000")
    assert codec.unpack_event_header(codec.HEARTBEAT_REQ) == (8, codec.EVENT_HEARTBEAT_REQ, 2, 0)
    assert codec.unpack_event_header(codec.HEARTBEAT_RSP) == (8, codec.EVENT_HEARTBEAT_RSP, 2, 0)


def _capture_events(captures_dir: Path):
    for folder in ("official-sdk", "json-client"):
        for line in (captures_dir / folder / "index.jsonl").read_text().splitlines():
            entry = json.loads(line)
            stream = captures_dir / folder / f"conn{entry['conn']}.{entry['dir']}.bin"
            yield entry, stream


def test_capture_streams_frame_and_decode(captures_dir):
    """Every recorded real-broker stream splits into the indexed events, and each data event
    decodes with the matching iterator."""
    streams: dict[Path, list[bytes]] = {}
    entries = list(_capture_events(captures_dir))
    for _, stream in entries:
        if stream not in streams:
            reader = codec.FrameReader()
            streams[stream] = reader.feed(stream.read_bytes())
            assert reader.buffered == 0
    decoders = {
        codec.EVENT_PUT: codec.iter_put_messages,
        codec.EVENT_PUSH: codec.iter_push_messages,
        codec.EVENT_ACK: codec.iter_acks,
        codec.EVENT_CONFIRM: codec.iter_confirms,
        codec.EVENT_CONTROL: codec.decode_control_event,
    }
    counts = dict.fromkeys(decoders, 0)
    offsets: dict[Path, int] = {}
    for entry, stream in entries:
        index = offsets.get(stream, 0)
        event = streams[stream][index]
        offsets[stream] = index + 1
        assert len(event) == entry["len"]
        length, event_type, _, _ = codec.unpack_event_header(event)
        assert length == entry["len"]
        if event_type in decoders:
            assert decoders[event_type](event)
            counts[event_type] += 1
    assert all(counts.values()), counts


def test_push_columns_decode_every_real_push_like_iter_push_messages(vectors_dir, captures_dir):
    """The batch decoder (MessageBatch) reads the Java SDK's vectors and every PUSH a real
    bmqbrkr sent (properties old and new, zlib, fan-out) exactly as the per-message one."""
    pushes = [read(vectors_dir, "msg_push_multi.bin")]
    for stream in sorted({stream for _, stream in _capture_events(captures_dir) if stream.name.endswith("b2c.bin")}):
        pushes.extend(e for e in codec.FrameReader().feed(stream.read_bytes())
                      if codec.unpack_event_header(e)[1] == codec.EVENT_PUSH)
    assert len(pushes) > 3
    for event in pushes:
        assert expand_columns(codec.push_columns(event)) == messages_of_push(event)


def test_capture_put_crc_and_compressed_push(captures_dir):
    """Real C++-SDK PUTs carry CRCs we reproduce, and the zlib PUSH from conn2 inflates."""
    stream = (captures_dir / "official-sdk" / "conn2.c2b.bin").read_bytes()
    puts = [e for e in codec.FrameReader().feed(stream) if codec.unpack_event_header(e)[1] == codec.EVENT_PUT]
    assert puts
    compressed = 0
    for event in puts:
        for flags, _, guid, crc, cat, schema, _, app_data in codec.iter_put_messages(event):
            assert crc == codec.crc32c(app_data)
            assert 0x40 <= guid[0] <= 0x7F
            props, payload = codec.split_app_data(app_data, flags, cat, schema)
            if cat == codec.COMPRESSION_ZLIB:
                compressed += 1
                assert payload == b"0123456789abcdef" * 256
                assert codec.decode_properties(props, schema != 0) == {"kind": (codec.PROPERTY_STRING, "zlib")}
    assert compressed == 1
    b2c = (captures_dir / "official-sdk" / "conn2.b2c.bin").read_bytes()
    pushes = [e for e in codec.FrameReader().feed(b2c) if codec.unpack_event_header(e)[1] == codec.EVENT_PUSH]
    payloads = [m[6] for e in pushes for m in codec.iter_push_messages(e)]
    assert b"0123456789abcdef" * 256 in payloads
