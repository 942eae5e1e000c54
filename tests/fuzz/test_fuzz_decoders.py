"""Seeded fuzzing of every decoder: only ProtocolError may ever escape.

Each decoder gets ``BMQ_FUZZ_ITERATIONS`` (default 100,000) purely random frames (with and
without a plausible EventHeader so the body parsers are reached) AND as many mutations of valid
events (bit flips, truncation, extension, byte splices and length-field tweaks). The seed is
fixed per decoder, so a failure reproduces; the failing frame is printed in hex.

Long run (e.g. before a release; about 9 s per million iterations per decoder on one core,
so 10,000,000 takes roughly 15 minutes)::

    BMQ_FUZZ_ITERATIONS=10000000 python -m pytest -q tests/fuzz

Set ``BMQ_FUZZ_SEED`` to explore other seeds.
"""
from __future__ import annotations

import os
import random
import zlib
from typing import List

import pytest

from bmq import _codec as codec
from bmq.exceptions import ProtocolError
from support import expand_columns, messages_of_push

ITERATIONS = int(os.environ.get("BMQ_FUZZ_ITERATIONS", "100000"))
SEED = int(os.environ.get("BMQ_FUZZ_SEED", "20261121"))
GUID = bytes(range(0x40, 0x50))
INTERESTING_WORDS = [0, 1, 2, 3, 4, 7, 8, 9, 0x7F, 0xFF, 0x100, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                     0x0FFFFFFF, 0x1B000010, 0x04000002]


def _areas() -> List[bytes]:
    props = {
        "b": (codec.PROPERTY_BOOL, True), "c": (codec.PROPERTY_CHAR, b"\x07"), "sh": (codec.PROPERTY_SHORT, 300),
        "i": (codec.PROPERTY_INT32, -5), "l": (codec.PROPERTY_INT64, 2**40), "s": (codec.PROPERTY_STRING, "text"),
        "bin": (codec.PROPERTY_BINARY, b"\0\1\2"),
    }
    return [codec.encode_properties(props, True), codec.encode_properties(props, False)]


NEW_AREA, OLD_AREA = _areas()
BIG = b"0123456789abcdef" * 100


def push_with_option(option: bytes) -> bytes:
    """A one-message PUSH event whose options area is ``option`` (payload b"data")."""
    app = b"data\x04\x04\x04\x04"
    words = (32 + len(option) + len(app)) // 4
    header = words.to_bytes(4, "big") + (((len(option) // 4) << 8) | 8).to_bytes(4, "big")
    message = header + (1).to_bytes(4, "big") + GUID + bytes(4) + option + app
    return codec.pack_event_header(codec.EVENT_PUSH, 8 + len(message)) + message


def _corpus() -> dict:
    puts = codec.build_put_events(
        [1, 2, 3, 4], GUID * 4, [b"abc", BIG, BIG, b"x" * 40], [NEW_AREA, OLD_AREA, NEW_AREA, None],
        flags=codec.PUT_ACK_REQUESTED, compression=codec.COMPRESSION_ZLIB,
        new_style_properties=[True, False, True, False],
    )
    pushes = codec.build_push_events([
        (1, GUID, (1, 2), NEW_AREA + b"payload", codec.PUSH_MESSAGE_PROPERTIES, 0, 2),
        (2, GUID, (), NEW_AREA + zlib.compress(BIG), codec.PUSH_MESSAGE_PROPERTIES, 1, 2),
        (3, GUID, (7,), zlib.compress(OLD_AREA + BIG), codec.PUSH_MESSAGE_PROPERTIES, 1, 0),
        (4, GUID, (), zlib.compress(BIG), 0, 1, 0),
        (5, GUID, (), b"", codec.PUSH_IMPLICIT_PAYLOAD, 0, 0),
    ])
    # SUB_QUEUE_INFOS options (non-packed and packed), which the builder does not emit.
    infos = push_with_option(bytes.fromhex("0C400005") + (3).to_bytes(4, "big") + b"\x85\0\0\0"
                             + (9).to_bytes(4, "big") + b"\x01\0\0\0")
    packed = push_with_option(bytes.fromhex("0E000080"))
    acks = codec.build_ack_event([(i % 16, i, GUID, i) for i in range(5)])
    confirms = codec.build_confirm_event([(i, GUID, i + 1) for i in range(5)])
    control = [codec.encode_control_event(b'{"rId":1,"status":{"code":0}}', 1),
               codec.encode_control_event(bytes.fromhex("3080a180a08080010000000000"), 0, codec.EVENT_AUTHENTICATION)]
    every = puts + pushes + [infos, packed, acks, confirms, codec.HEARTBEAT_REQ] + control
    return {
        "header": every,
        "frames": [b"".join(every[:4]), b"".join(every[4:])],
        "put": puts,
        "push": pushes + [infos, packed],
        "ack": [acks],
        "confirm": [confirms],
        "control": control,
        "properties": [NEW_AREA, OLD_AREA],
        "app_data": [NEW_AREA + b"pay", zlib.compress(OLD_AREA + BIG), NEW_AREA + zlib.compress(BIG), zlib.compress(BIG)],
    }


CORPUS = _corpus()
EVENT_TYPE_BYTES = [0x41, 0x42, 0x43, 0x44, 0x45, 0x4B, 0x4C, 0x4F, 0x40, 0x00, 0xC2]


def random_frame(rng: random.Random) -> bytes:
    body = rng.randbytes(rng.choice((0, 1, 3, 4, 8, 16, 40, 100, 300)))
    if rng.random() < 0.5:
        return rng.randbytes(rng.randrange(0, 12)) + body
    # A plausible EventHeader so the decoders get past it and into the body.
    length = 8 + len(body) + rng.choice((0, 0, 0, -1, 1, 4))
    header = max(length, 0).to_bytes(4, "big") + bytes([rng.choice(EVENT_TYPE_BYTES), rng.choice((2, 2, 2, 3, 1, 0, 255)),
                                                        rng.choice((0, 0x20, 0x40, 0xE0)), 0])
    return header + body


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(7)
        if op == 0 and data:  # bit flips
            for _ in range(rng.randrange(1, 4)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # truncation
            del data[rng.randrange(len(data)) :]
        elif op == 2:  # extension
            data += rng.randbytes(rng.randrange(1, 9))
        elif op == 3 and len(data) >= 4:  # a length/size word set to an interesting value
            i = rng.randrange(0, len(data) - 3) & ~3 if rng.random() < 0.7 else rng.randrange(len(data) - 3)
            value = rng.choice(INTERESTING_WORDS) if rng.random() < 0.5 else (
                int.from_bytes(data[i : i + 4], "big") + rng.randrange(-8, 9)) & 0xFFFFFFFF
            data[i : i + 4] = value.to_bytes(4, "big")
        elif op == 4 and data:  # one byte set to an interesting value
            data[rng.randrange(len(data))] = rng.choice((0, 1, 2, 3, 4, 5, 0x7F, 0x80, 0xFF))
        elif op == 5 and data:  # byte splice
            i = rng.randrange(len(data))
            data[i : i + rng.randrange(0, 8)] = rng.randbytes(rng.randrange(0, 8))
        elif op == 6 and len(data) > 8:  # keep the EventHeader consistent with a changed body
            data[0:4] = len(data).to_bytes(4, "big")
    return bytes(data)


def _frame_reader(data: bytes, rng: random.Random) -> None:
    reader = codec.FrameReader(max_event_size=rng.choice((64, 4096, codec.MAX_EVENT_SIZE)))
    cut = rng.randrange(len(data) + 1)
    reader.feed(data[:cut])
    reader.feed(memoryview(data)[cut:])


DECODERS: dict = {
    "unpack_event_header": ("header", lambda d, r: codec.unpack_event_header(d)),
    "FrameReader.feed": ("frames", _frame_reader),
    "iter_put_messages": ("put", lambda d, r: codec.iter_put_messages(d)),
    "iter_push_messages": ("push", lambda d, r: codec.iter_push_messages(d)),
    "push_columns": ("push", lambda d, r: codec.push_columns(d)),
    "iter_acks": ("ack", lambda d, r: codec.iter_acks(d)),
    "iter_confirms": ("confirm", lambda d, r: codec.iter_confirms(d)),
    "decode_control_event": ("control", lambda d, r: codec.decode_control_event(d)),
    "decode_properties": ("properties", lambda d, r: codec.decode_properties(d, r.random() < 0.5)),
    "split_app_data": ("app_data", lambda d, r: codec.split_app_data(
        d, r.randrange(16), r.choice((0, 1, 1, 2, 7)), r.choice((0, 0, 1, 2, 0xFFFF)))),
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_only_protocol_error_escapes(name):
    corpus_key, decode = DECODERS[name]
    seeds: List[bytes] = CORPUS[corpus_key]
    rng = random.Random(f"{SEED}:{name}")
    accepted = rejected = 0
    for iteration in range(ITERATIONS):
        for data in (random_frame(rng), mutate(rng, rng.choice(seeds))):
            try:
                decode(data, rng)
                accepted += 1
            except ProtocolError:
                rejected += 1
            except Exception as e:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{name}: {type(e).__name__}: {e} at iteration {iteration} (seed {SEED})\n{data.hex()}")
    assert accepted + rejected == 2 * ITERATIONS
    assert rejected > 0 and accepted > 0
    if corpus_key not in ("properties", "app_data"):  # their decoders take random flags
        for seed in seeds:  # the unmutated corpus must decode, else the mutations prove little
            decode(seed, random.Random(0))


def test_push_columns_agrees_with_iter_push_messages_on_every_input():
    """The batch decoder accepts exactly what the per-message one accepts, with the same content."""
    rng = random.Random(f"{SEED}:push_columns-equivalence")
    agreed = 0
    for _ in range(max(ITERATIONS // 10, 1000)):
        data = mutate(rng, rng.choice(CORPUS["push"]))
        try:
            expected = messages_of_push(data)
        except ProtocolError:
            with pytest.raises(ProtocolError):
                codec.push_columns(data)
            continue
        assert expand_columns(codec.push_columns(data)) == expected, data.hex()
        agreed += 1
    assert agreed > 0
