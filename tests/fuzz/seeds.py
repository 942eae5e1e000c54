"""Seed inputs for each fuzz target (``targets.py``), from the protocol vectors and the
recorded sessions in ``../shared/protocol`` and from bmq's own encoders.

``scripts/fuzz.py --seed`` runs these through libFuzzer's merge, which keeps only the inputs
that add coverage, into ``tests/fuzz/corpus/<target>/`` (kept in the repository, small);
the fuzzing itself starts from that corpus.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from bmq import _codec as codec

GUID = bytes(range(0x40, 0x50))
BIG = b"0123456789abcdef" * 100


def _events(stream: bytes) -> List[bytes]:
    reader = codec.FrameReader()
    return reader.feed(stream)


def _shared_streams(shared: Path) -> Iterator[Tuple[str, bytes]]:
    """``(direction, stream)`` of every recorded connection (c2b: client to broker)."""
    for path in sorted((shared / "protocol" / "captures").glob("*/conn*.bin")):
        yield path.name.split(".")[1], path.read_bytes()


def _vectors(shared: Path) -> List[bytes]:
    return [p.read_bytes() for p in sorted((shared / "protocol" / "vectors").glob("*.bin"))]


def _properties_areas() -> List[bytes]:
    props = {
        "b": (codec.PROPERTY_BOOL, True), "c": (codec.PROPERTY_CHAR, b"\x07"), "sh": (codec.PROPERTY_SHORT, 300),
        "i": (codec.PROPERTY_INT32, -5), "l": (codec.PROPERTY_INT64, 2**40), "s": (codec.PROPERTY_STRING, "text"),
        "bin": (codec.PROPERTY_BINARY, b"\0\1\2"),
    }
    return [codec.encode_properties(props, True), codec.encode_properties(props, False)]


def _built_events() -> List[bytes]:
    """Events of every type from bmq's encoders, with the options the builders do not emit."""
    new, old = _properties_areas()
    puts = codec.build_put_events(
        [1, 2, 3, 4], GUID * 4, [b"abc", BIG, BIG, b"x" * 40], [new, old, new, None],
        flags=codec.PUT_ACK_REQUESTED, compression=codec.COMPRESSION_ZLIB,
        new_style_properties=[True, False, True, False])
    pushes = codec.build_push_events([
        (1, GUID, (1, 2), new + b"payload", codec.PUSH_MESSAGE_PROPERTIES, 0, 2),
        (2, GUID, (), new + zlib.compress(BIG), codec.PUSH_MESSAGE_PROPERTIES, 1, 2),
        (3, GUID, (7,), zlib.compress(old + BIG), codec.PUSH_MESSAGE_PROPERTIES, 1, 0),
        (4, GUID, (), zlib.compress(BIG), 0, 1, 0),
        (5, GUID, (), b"", codec.PUSH_IMPLICIT_PAYLOAD, 0, 0),
    ])
    acks = codec.build_ack_event([(i % 16, i, GUID, i) for i in range(5)])
    confirms = codec.build_confirm_event([(i, GUID, i + 1) for i in range(5)])
    return puts + pushes + [acks, confirms, codec.HEARTBEAT_REQ, codec.HEARTBEAT_RSP]


def seeds(shared: Path) -> Dict[str, List[bytes]]:
    """Seed inputs per target name (``shared``: the ``../shared`` directory)."""
    events: List[bytes] = []
    streams: List[Tuple[str, bytes]] = list(_shared_streams(shared))
    for _, stream in streams:
        events += _events(stream)
    for vector in _vectors(shared):
        try:
            codec.unpack_event_header(vector)
            events.append(vector)
        except Exception:  # noqa: BLE001 - the properties areas are vectors too
            pass
    events += _built_events()
    by_type: Dict[int, List[bytes]] = {}
    for event in events:
        by_type.setdefault(event[4] & 0x3F, []).append(event)
    control = by_type.get(codec.EVENT_CONTROL, []) + by_type.get(codec.EVENT_AUTHENTICATION, [])
    areas = _properties_areas() + [v for p, v in ((p, p.read_bytes()) for p in
                                   sorted((shared / "protocol" / "vectors").glob("msg_props*.bin")))]
    bodies: List[bytes] = []
    for event in control:
        encoding, body = codec.decode_control_event(event)
        for kind in range(3):
            bodies.append(bytes([encoding << 7 | kind]) + body)  # the top bit says which target
    app_data = []
    for event in by_type.get(codec.EVENT_PUT, []):
        for flags, _, _, _, compression, schema, _, data in codec.iter_put_messages(event):
            app_data.append(bytes([flags, compression, schema]) + data)
    features = [b"PROTOCOL_ENCODING:BER,JSON;MPS:MESSAGE_PROPERTIES_EX",
                b"PROTOCOL_ENCODING:JSON;HA:GRACEFUL_SHUTDOWN,GRACEFUL_SHUTDOWN_V2;SUBSCRIPTIONS:CONFIGURE_STREAM"]
    outbox_raw = []
    from bmq import _outbox

    bodies_, _ = _outbox._encode_frames([  # noqa: SLF001 - the records exactly as the outbox writes them
        _outbox.OutboxRecord(GUID, "bmq://bmq.test.mem.priority/q", b"payload"),
        _outbox.OutboxRecord(GUID[::-1], "bmq://d/q", b"p" * 40, _properties_areas()[0], True, 1)])
    for body in bodies_:
        outbox_raw += [bytes([mode]) + body for mode in (0, 1, 2, 6)]
    return {
        "event_header": events,
        "frame_reader": [bytes([cut, 3]) + stream for _, stream in streams for cut in (0, 100)],
        "put": by_type.get(codec.EVENT_PUT, []),
        "push": by_type.get(codec.EVENT_PUSH, []),
        "ack": by_type.get(codec.EVENT_ACK, []),
        "confirm": by_type.get(codec.EVENT_CONFIRM, []),
        "properties": [bytes([style]) + area for area in areas for style in (0, 1)],
        "app_data": app_data,
        "zlib_bomb": [b"\x00a", b"\x10" + BIG[:64]],
        "crc32c": [b"\x80123456789", b"\x10" + BIG],
        "padding": [b"{}\x02\x02", b"\x30\x80\x00\x00\x01"],
        "control_event": control,
        "ber": [bytes([b[0] & 3]) + b[1:] for b in bodies if not b[0] & 0x80],
        "json_control": [bytes([b[0] & 3]) + b[1:] for b in bodies if b[0] & 0x80],
        "features": features,
        "expression": [b"a > 1 && b == \"x\"", b"!(x || y) && z >= -5 % 3", b"s != 'q' || i * 2 + 1 < l / 4",
                       b"exists(name) && c == 7"],
        "queue_uri": [b"bmq://bmq.test.mem.fanout/orders?id=foo", b"bmq://d.~tier/q"],
        "broker_address": [b"tcp://127.0.0.1:30114", b"[::1]:30114", b"localhost:1"],
        "outbox": outbox_raw,
        "broker_session": [bytes([cut]) + stream for direction, stream in streams if direction == "c2b"
                           for cut in (0, 128)],
        "client_session": [stream for direction, stream in streams if direction == "b2c"],
    }
