"""Property-based round trips: every builder/encoder against its iterator/decoder."""
from __future__ import annotations

import zlib

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmq import _codec as codec

EXAMPLES = settings(max_examples=200, deadline=None)

int32 = st.integers(-(2**31), 2**31 - 1)
guids = st.binary(min_size=16, max_size=16)
# Payloads that zlib can shrink (repeats) as well as ones it cannot (random bytes).
payloads = st.one_of(
    st.binary(min_size=1, max_size=300),
    st.builds(lambda chunk, n: (chunk * n)[: 4000], st.binary(min_size=1, max_size=40), st.integers(1, 200)),
    st.binary(min_size=1000, max_size=1100),
)

VALUE_STRATEGIES = {
    codec.PROPERTY_BOOL: st.booleans(),
    codec.PROPERTY_CHAR: st.binary(min_size=1, max_size=1),
    codec.PROPERTY_SHORT: st.integers(-(2**15), 2**15 - 1),
    codec.PROPERTY_INT32: int32,
    codec.PROPERTY_INT64: st.integers(-(2**63), 2**63 - 1),
    codec.PROPERTY_STRING: st.text(max_size=40),
    codec.PROPERTY_BINARY: st.binary(max_size=40),
}
property_specs = st.sampled_from(sorted(VALUE_STRATEGIES)).flatmap(
    lambda t: st.tuples(st.just(t), VALUE_STRATEGIES[t])
)
property_maps = st.dictionaries(st.text(min_size=1, max_size=20), property_specs, min_size=1, max_size=12)


def zlib_wins(data: bytes) -> bool:
    """The C++ rule: compress only from 1024 bytes and only if strictly smaller."""
    if len(data) < codec.COMPRESSION_THRESHOLD:
        return False
    c = zlib.compressobj(-1, zlib.DEFLATED, 15, 8, zlib.Z_FILTERED)
    return len(c.compress(data) + c.flush()) < len(data)


@EXAMPLES
@given(property_maps, st.booleans())
def test_properties_round_trip(props, new_style):
    area = codec.encode_properties(props, new_style)
    assert len(area) % 4 == 0
    assert codec.decode_properties(area, new_style) == props
    assert list(codec.decode_properties(area + b"trailing", new_style)) == list(props)


@EXAMPLES
@given(
    st.lists(st.tuples(payloads, st.one_of(st.none(), property_maps), st.booleans(), int32), min_size=1, max_size=8),
    st.sampled_from([0, codec.PUT_ACK_REQUESTED]),
    st.sampled_from([codec.COMPRESSION_NONE, codec.COMPRESSION_ZLIB]),
    st.sampled_from([200, 700, 5000, codec.MAX_PUT_EVENT_SIZE]),
    st.data(),
)
def test_put_round_trip(messages, flags, compression, max_event_size, data):
    areas = [None if p is None else codec.encode_properties(p, style) for _, p, style, _ in messages]
    sizes = [36 + len(pay) + len(a or b"") + 4 for (pay, _, _, _), a in zip(messages, areas)]
    max_event_size = max(max_event_size, 8 + max(sizes))
    ids = data.draw(st.binary(min_size=16 * len(messages), max_size=16 * len(messages)))
    events = codec.build_put_events(
        [q for *_, q in messages], ids, [m[0] for m in messages], areas,
        flags=flags, compression=compression, new_style_properties=[m[2] for m in messages],
        max_event_size=max_event_size,
    )
    decoded = []
    for event in events:
        assert len(event) <= max_event_size
        assert codec.unpack_event_header(event)[:2] == (len(event), codec.EVENT_PUT)
        decoded.extend(codec.iter_put_messages(event))
    assert len(decoded) == len(messages)
    for i, ((payload, props, style, qid), area, got) in enumerate(zip(messages, areas, decoded)):
        m_flags, m_qid, m_guid, m_crc, m_cat, m_schema, m_options, app = got
        assert m_flags == flags | (codec.PUT_MESSAGE_PROPERTIES if area else 0)
        assert (m_qid, m_guid, m_options) == (qid, ids[16 * i : 16 * i + 16], b"")
        assert m_crc == crc32c.crc32c(app)
        assert m_schema == (1 if area and style else 0)
        compressed_part = payload if (area is None or style) else area + payload
        expect_cat = int(compression == codec.COMPRESSION_ZLIB and zlib_wins(compressed_part))
        assert m_cat == expect_cat
        got_area, got_payload = codec.split_app_data(app, m_flags, m_cat, m_schema)
        assert (got_area, got_payload) == (area, payload)
        if area is not None:
            assert codec.decode_properties(got_area, style) == props


def push_app_data(area, payload, compression, schema):
    if compression == codec.COMPRESSION_NONE:
        return (area or b"") + payload
    if area is not None and schema:
        return area + zlib.compress(payload)
    return zlib.compress((area or b"") + payload)


@EXAMPLES
@given(
    st.lists(
        st.tuples(
            int32, guids, st.lists(st.integers(0, 2**32 - 1), max_size=4), payloads,
            st.one_of(st.none(), property_maps), st.booleans(),
            st.sampled_from([codec.COMPRESSION_NONE, codec.COMPRESSION_ZLIB]),
            st.booleans(),
        ),
        min_size=1, max_size=8,
    ),
    st.sampled_from([300, 2000, codec.MAX_EVENT_SIZE]),
)
def test_push_round_trip(messages, max_event_size):
    specs, expected = [], []
    for qid, guid, sub_ids, payload, props, style, compression, out_of_order in messages:
        area = None if props is None else codec.encode_properties(props, style)
        schema = 3 if area is not None and style else 0
        flags = (codec.PUSH_MESSAGE_PROPERTIES if area else 0) | (codec.PUSH_OUT_OF_ORDER if out_of_order else 0)
        app = push_app_data(area, payload, compression, schema)
        specs.append((qid, guid, sub_ids, app, flags, compression, schema))
        expected.append((qid, guid, tuple(sub_ids) or (0,), flags, area, schema != 0, payload))
    biggest = max(32 + 4 * (len(s[2]) + 1) + len(s[3]) + 4 for s in specs)
    events = codec.build_push_events(specs, max(max_event_size, biggest + 8))
    decoded = [m for event in events for m in codec.iter_push_messages(event)]
    assert decoded == expected


@EXAMPLES
@given(st.lists(st.tuples(int32, guids), min_size=1, max_size=6))
def test_push_implicit_payload(messages):
    specs = [(q, g, (), b"", codec.PUSH_IMPLICIT_PAYLOAD, 0, 0) for q, g in messages]
    decoded = codec.iter_push_messages(codec.build_push_events(specs)[0])
    assert decoded == [(q, g, (0,), codec.PUSH_IMPLICIT_PAYLOAD, None, False, b"") for q, g in messages]


@EXAMPLES
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 2**24 - 1), guids, int32), min_size=1, max_size=50))
def test_ack_round_trip(acks):
    event = codec.build_ack_event(acks)
    assert len(event) == 12 + 24 * len(acks)
    assert codec.iter_acks(event) == acks


@EXAMPLES
@given(st.lists(st.tuples(int32, guids, int32), min_size=1, max_size=50))
def test_confirm_round_trip(confirms):
    event = codec.build_confirm_event(confirms)
    assert codec.iter_confirms(event) == confirms


@EXAMPLES
@given(st.binary(max_size=600), st.sampled_from([codec.ENCODING_BER, codec.ENCODING_JSON]),
       st.sampled_from([codec.EVENT_CONTROL, codec.EVENT_AUTHENTICATION]))
def test_control_round_trip(body, encoding, event_type):
    event = codec.encode_control_event(body, encoding, event_type)
    assert len(event) % 4 == 0
    assert codec.unpack_event_header(event) == (len(event), event_type, 2, encoding << 5)
    assert codec.decode_control_event(event) == (encoding, body)


@EXAMPLES
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=10), st.lists(st.integers(1, 97), min_size=1))
def test_frame_reader_reassembles_any_chunking(bodies, cuts):
    events = [codec.encode_control_event(b, codec.ENCODING_JSON) for b in bodies] + [codec.HEARTBEAT_REQ]
    stream = b"".join(events)
    reader = codec.FrameReader()
    out, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        out.extend(reader.feed(memoryview(stream)[pos : pos + step]))
        pos += step
        i += 1
    assert out == events
    assert reader.buffered == 0


@EXAMPLES
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_crc32c_matches_reference(data, seed, offset):
    assert codec.crc32c(data) == crc32c.crc32c(data)
    assert codec.crc32c(memoryview(data)[offset:]) == crc32c.crc32c(data[offset:])
    assert codec.crc32c(data, seed) == crc32c.crc32c(data, seed) == codec._crc32c_portable(data, seed)


def test_confirm_run_is_one_record_per_guid_of_one_queue():
    guids = bytes(range(16)) + b"\xff" * 16
    event = codec.build_confirm_run(-3, guids, 7)
    assert codec.iter_confirms(event) == [(-3, bytes(range(16)), 7), (-3, b"\xff" * 16, 7)]
    assert event == codec.build_confirm_event([(-3, bytes(range(16)), 7), (-3, b"\xff" * 16, 7)])
    for bad in (b"", b"x" * 17):
        with pytest.raises(ValueError, match="multiple of 16"):
            codec.build_confirm_run(1, bad, 0)


def test_join_offsets_rebases_each_part_to_follow_the_previous():
    import array

    def i32(*values: int) -> bytes:
        return array.array("i", values).tobytes()

    joined = codec.join_offsets([i32(0, 2, 5), memoryview(i32(10, 11, 20)).cast("i"), i32(4)])
    assert array.array("i", joined).tolist() == [0, 2, 5, 6, 15]
    assert array.array("i", codec.join_offsets([i32(3, 4)])).tolist() == [0, 1]
    with pytest.raises(ValueError, match="int32"):
        codec.join_offsets([b"\0\0\0"])
    with pytest.raises(ValueError, match="2 GiB"):
        codec.join_offsets([i32(0, 2**31 - 1), i32(0, 1)])
