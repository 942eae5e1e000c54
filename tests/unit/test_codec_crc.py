"""CRC-32C engines (SSE4.2 three-stream and portable tables) against the crc32c package, across
the sizes where the hardware loop switches strategy (3 x 8 KiB and 3 x 256 B blocks)."""
from __future__ import annotations

import random

import crc32c
import pytest

from bmq import _codec as codec

SIZES = [0, 1, 7, 8, 9, 255, 767, 768, 769, 3 * 256 * 5 + 13, 24575, 24576, 24577, 3 * 24576 + 1000, 1 << 20]


def test_check_value():
    assert codec.crc32c(b"123456789") == 0xE3069283
    assert codec._crc32c_portable(b"123456789") == 0xE3069283


@pytest.mark.parametrize("size", SIZES)
def test_engines_agree_with_reference(size):
    rng = random.Random(size)
    data = rng.randbytes(size + 8)
    for offset in (0, 1, 3, 7):
        view = memoryview(data)[offset : offset + size]
        expected = crc32c.crc32c(bytes(view))
        assert codec.crc32c(view) == expected
        assert codec._crc32c_portable(view) == expected


def test_continuation_equals_one_shot():
    data = random.Random(1).randbytes(100_000)
    for cut in (0, 1, 4095, 50_000, 99_999, 100_000):
        assert codec.crc32c(data[cut:], codec.crc32c(data[:cut])) == crc32c.crc32c(data)


def test_accepts_any_buffer():
    data = b"blazingmq" * 100
    assert codec.crc32c(bytearray(data)) == codec.crc32c(memoryview(data)) == crc32c.crc32c(data)
    with pytest.raises(TypeError):
        codec.crc32c("text")
