"""The codec's bulk helpers for producers posting columns (the Spark sink)."""
import array

import pyarrow as pa
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


def test_binary_values_slice_the_buffers_of_a_column() -> None:
    column = pa.array([b"ab", b"", b"xyz", b"q"], pa.binary()).slice(1)
    _, offsets, data = column.buffers()
    assert codec.binary_values(offsets, data, column.offset, len(column)) == [b"", b"xyz", b"q"]
    large = pa.array(["é", "long" * 100], pa.large_string())
    _, offsets, data = large.buffers()
    assert codec.binary_values(offsets, data, 0, 2, 8) == ["é".encode(), b"long" * 100]


@pytest.mark.parametrize(
    "ends, count, text",
    [([0, 2, 9], 2, "outside"), ([0, 2, 1], 2, "outside"), ([0, 1], 2, "bytes of offsets")],
)
def test_binary_values_refuse_buffers_that_do_not_hold_the_values(ends: list, count: int, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        codec.binary_values(array.array("i", ends).tobytes(), b"abcd", 0, count)
    with pytest.raises(ValueError, match="offset_size"):
        codec.binary_values(array.array("i", [0, 1]).tobytes(), b"a", 0, 1, 2)
