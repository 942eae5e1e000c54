"""The codec's bulk helpers for producers posting columns (the Spark sink)."""
import array
import itertools
from typing import Any, List, Tuple

import pytest

from bmq import _codec as codec


def test_derived_guids_are_a_function_of_key_and_position() -> None:
    run = codec.derived_guids(b"write/0", 0, 1000)
    guids = [run[i : i + 16] for i in range(0, len(run), 16)]
    assert len(set(guids)) == 1000
    # A later call for positions 600.. (a retry resumed mid-way) gives the same GUIDs.
    assert codec.derived_guids(b"write/0", 600, 400) == run[600 * 16 :]
    assert codec.derived_guids(b"write/1", 0, 1000) != run
    # Version-1 shaped, the first half shared with the key's own deterministic GUID.
    assert all(guid[:8] == codec.deterministic_guid(b"write/0")[:8] for guid in guids)
    assert all(guid[0] >> 6 == 1 for guid in guids)
    assert codec.derived_guids(b"k", 5, 0) == b""
    with pytest.raises(ValueError, match="negative"):
        codec.derived_guids(b"k", -1, 3)


def _column(values: List[bytes], offset_type: str = "i") -> Tuple[bytes, bytes]:
    """The offsets and data buffers of a column of ``values``, laid out as Arrow lays out a binary
    (``"i"``: 32-bit offsets) or large binary (``"q"``) column."""
    offsets = array.array(offset_type, [0, *itertools.accumulate(len(value) for value in values)])
    return offsets.tobytes(), b"".join(values)


def test_payload_column_reads_the_values_of_a_column_in_place() -> None:
    # Arrow's own buffers (what the Spark sink hands over); pyarrow comes with the spark extra.
    pa: Any = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bmq[spark]')")
    column = pa.array([b"ab", b"", b"xyz", b"q"], pa.binary()).slice(1)
    _, offsets, data = column.buffers()
    values = codec.PayloadColumn(offsets, data, column.offset, len(column))
    assert list(values) == [b"", b"xyz", b"q"]
    assert len(values) == 3 and values[-1] == b"q" and values.nbytes == 4 and values.first_empty == 0
    assert list(values[1:]) == [b"xyz", b"q"] and values[1:].first_empty == -1
    assert values.nbytes_of(1, 2) == 4 and values.nbytes_of(0, 0) == 0
    with pytest.raises(IndexError):
        values[3]
    for first, count in ((2, 2), (-1, 1), (1, -1), (2**62, 2**62)):
        with pytest.raises(IndexError):
            values.nbytes_of(first, count)
    column = pa.array(["é", "long" * 100], pa.large_string())
    _, offsets, data = column.buffers()
    assert list(codec.PayloadColumn(offsets, data, 0, 2, 8)) == ["é".encode(), b"long" * 100]
    assert list(codec.PayloadColumn(array.array("i", [5]).tobytes(), b"", 0, 0)) == []
    offsets, data = _column(["é".encode(), b"long" * 100], "q")
    assert list(codec.PayloadColumn(offsets, data, 0, 2, 8)) == ["é".encode(), b"long" * 100]


def test_payload_column_copies_a_writable_buffer_so_a_posted_value_stays_as_posted() -> None:
    data = bytearray(b"abcd")
    values = codec.PayloadColumn(array.array("i", [0, 2, 4]).tobytes(), data, 0, 2)
    data[:] = b"zzzz"
    assert list(values) == [b"ab", b"cd"]


def test_build_put_events_from_a_column_equals_building_from_bytes() -> None:
    payloads = [b"x" * 1024, b"y", "é".encode() * 300, b"z" * 7]
    offsets, data = _column(payloads)
    guids = codec.derived_guids(b"k", 0, len(payloads))
    old_style = codec.encode_properties({"a": (codec.PROPERTY_INT32, 1)}, new_style=False)
    for compression in (codec.COMPRESSION_NONE, codec.COMPRESSION_ZLIB):
        for properties, new_style in ((None, True), (old_style, False)):
            kwargs = dict(flags=codec.PUT_ACK_REQUESTED, compression=compression, new_style_properties=new_style,
                          max_event_size=1200)
            expected = codec.build_put_events(7, guids, payloads, properties, **kwargs)
            assert codec.build_put_events(7, guids, codec.PayloadColumn(offsets, data, 0, 4), properties,
                                          **kwargs) == expected
            # Uncompressed, the 1,024-byte and 600-byte payloads need events of their own.
            assert len(expected) > 1 or compression == codec.COMPRESSION_ZLIB


def test_build_put_events_refuses_an_empty_value_of_a_column() -> None:
    offsets, data = _column([b"a", b""])
    with pytest.raises(ValueError, match="message 1: empty payload"):
        codec.build_put_events(1, bytes(32), codec.PayloadColumn(offsets, data, 0, 2))


@pytest.mark.parametrize(
    "ends, first, count, text",
    [
        ([0, 2, 9], 0, 2, "outside"),  # beyond the data
        ([0, 2, 1], 0, 2, "outside"),  # not monotonic
        ([-4, 2, 3], 0, 2, "outside"),  # negative
        ([0, -1, 3], 0, 2, "outside"),
        ([0, 1], 0, 2, "bytes of offsets"),  # too few offsets
        ([0, 1, 2], 2, 1, "bytes of offsets"),
        ([0, 1, 2], 1, 2**62, "bytes of offsets"),  # would overflow first + count + 1
        ([0, 1], -1, 1, "negative"),
        ([0, 1], 0, -1, "negative"),
    ],
)
def test_payload_column_refuses_buffers_that_do_not_hold_the_values(ends: list, first: int, count: int,
                                                                     text: str) -> None:
    with pytest.raises(ValueError, match=text):
        codec.PayloadColumn(array.array("i", ends).tobytes(), b"abcd", first, count)
    with pytest.raises(ValueError, match="outside"):
        codec.PayloadColumn(array.array("q", [0, 2**40]).tobytes(), b"abcd", 0, 1, 8)
    with pytest.raises(ValueError, match="offset_size"):
        codec.PayloadColumn(array.array("i", [0, 1]).tobytes(), b"a", 0, 1, 2)


def test_put_events_close_at_the_target_size_and_can_come_joined() -> None:
    payloads = [b"x" * 1000] * 5
    guids = codec.derived_guids(b"k", 0, 5)
    events = codec.build_put_events(1, guids, payloads, target_event_size=2200)
    assert [len(event) for event in events] == [8 + 2 * 1040, 8 + 2 * 1040, 8 + 1040]
    assert codec.build_put_events(1, guids, payloads, target_event_size=2200, joined=True) == [b"".join(events)]
    # A message larger than the target goes alone, still bounded by max_event_size.
    assert len(codec.build_put_events(1, guids, payloads, target_event_size=100)) == 5
    assert codec.build_put_events(1, b"", [], joined=True) == []
    messages = [app for event in events for *_, app in codec.iter_put_messages(event)]
    assert messages == payloads
    with pytest.raises(ValueError, match="negative target_event_size"):
        codec.build_put_events(1, guids, payloads, target_event_size=-1)
