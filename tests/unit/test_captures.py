"""Replay of the real bmqbrkr sessions in ../shared/protocol/captures (see its README.md).

Every event is framed and checked against index.jsonl; every control event (BER from the
official SDK, JSON from the JSON client) decodes and re-encodes byte for byte; the broker's
answers are reproduced from their decoded content by ``with_defaults``. With the compiled
codec, the PUT/PUSH/ACK/CONFIRM events are decoded and their content checked too.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from bmq import _schema as schema

EVENT_TYPES = {"CONTROL": 1, "PUT": 2, "CONFIRM": 3, "PUSH": 4, "ACK": 5, "HEARTBEAT_REQ": 11, "HEARTBEAT_RSP": 12}
ENCODINGS = {"BER": schema.ENCODING_BER, "JSON": schema.ENCODING_JSON}
FOLDERS = ["official-sdk", "json-client"]
MiB = 1 << 20


class Event:
    """One indexed event of a capture with its raw bytes."""

    def __init__(self, entry: dict, raw: bytes):
        self.entry = entry
        self.raw = raw
        self.conn: int = entry["conn"]
        self.dir: str = entry["dir"]
        self.type: str = entry["type"]

    @property
    def body(self) -> bytes:
        """A control event's body: after HeaderWords*4, padding stripped by its last byte."""
        body = self.raw[4 * self.raw[5]:]
        return body[:-body[-1]]


def frame(stream: bytes) -> List[Tuple[int, bytes]]:
    """Split a TCP stream into (offset, event) by each EventHeader's length word (§1.1)."""
    events, pos = [], 0
    while pos < len(stream):
        length = int.from_bytes(stream[pos:pos + 4], "big")
        assert 8 <= length <= len(stream) - pos, f"bad length {length} at {pos}"
        events.append((pos, stream[pos:pos + length]))
        pos += length
    return events


def load(folder: Path) -> List[Event]:
    """Every event of a capture folder in index (time) order."""
    streams: Dict[Tuple[int, str], Dict[int, bytes]] = {}
    for path in folder.glob("conn*.*.bin"):
        conn, direction = int(path.name[4:path.name.index(".")]), path.name.split(".")[1]
        streams[conn, direction] = dict(frame(path.read_bytes()))
    events = []
    for line in (folder / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        raw = streams[entry["conn"], entry["dir"]].pop(entry["offset"])
        events.append(Event(entry, raw))
    assert all(not rest for rest in streams.values()), "events in the streams missing from the index"
    return events


def control_messages(events: List[Event]) -> List[Tuple[Event, str, dict]]:
    """(event, kind, message) for each control event: the first one each way per
    connection is the negotiation."""
    out, negotiated = [], set()
    for event in events:
        if event.type != "CONTROL":
            continue
        key = (event.conn, event.dir)
        kind = schema.KIND_CONTROL if key in negotiated else schema.KIND_NEGOTIATION
        negotiated.add(key)
        out.append((event, kind, schema.decode_body(event.body, event.raw[6] >> 5, kind)))
    return out


@pytest.fixture(scope="module", params=FOLDERS)
def capture(request, captures_dir) -> Tuple[str, List[Event]]:
    return request.param, load(captures_dir / request.param)


@pytest.fixture(scope="module")
def official(captures_dir) -> List[Event]:
    return load(captures_dir / "official-sdk")


@pytest.fixture(scope="module")
def json_client(captures_dir) -> List[Event]:
    return load(captures_dir / "json-client")


def test_index_matches_streams(capture):
    _, events = capture
    for event in events:
        entry = event.entry
        assert len(event.raw) == entry["len"]
        assert event.raw[4] == 0x40 | EVENT_TYPES[entry["type"]]
        assert event.raw[5] == 2
        if entry["type"] == "CONTROL":
            assert event.raw[6] >> 5 == ENCODINGS[entry["encoding"]]
        else:
            assert event.raw[6] == 0
            assert "encoding" not in entry


def test_every_control_event_reencodes_byte_for_byte(capture):
    folder, events = capture
    messages = control_messages(events)
    assert len(messages) == {"official-sdk": 30, "json-client": 12}[folder]
    for event, kind, msg in messages:
        encoding = event.raw[6] >> 5
        if "json" in event.entry:
            assert msg == event.entry["json"]
        body = schema.encode_body(msg, encoding, kind)
        if folder == "json-client" and event.dir == "c2b":
            # this hand-written client does not escape "/" as baljsn does
            body = body.replace(b"\\/", b"/")
        assert body == event.body, event.entry


def test_broker_answers_are_reproduced_by_with_defaults(capture):
    """What the embedded broker does: fill defaults, encode in the §8.2 encoding."""
    _, events = capture
    messages = control_messages(events)
    client_features = {}
    for event, kind, msg in messages:
        if event.dir == "c2b" and kind == schema.KIND_NEGOTIATION:
            client_features[event.conn] = msg["clientIdentity"]["features"]
    for event, kind, msg in messages:
        if event.dir != "b2c":
            continue
        encoding = schema.best_encoding(client_features[event.conn])
        assert event.raw[6] >> 5 == encoding
        assert schema.encode_body(schema.with_defaults(msg, kind), encoding, kind) == event.body


def test_responses_echo_request_ids(capture):
    _, events = capture
    pending: Dict[int, Dict[int, str]] = {}
    answers = {"openQueue": "openQueueResponse", "closeQueue": "closeQueueResponse",
               "configureStream": "configureStreamResponse", "disconnect": "disconnectResponse",
               "configureQueueStream": "configureQueueStreamResponse"}
    answered = 0
    for event, kind, msg in control_messages(events):
        if kind != schema.KIND_CONTROL:
            continue
        requests = pending.setdefault(event.conn, {})
        if event.dir == "c2b":
            assert msg["rId"] not in requests
            requests[msg["rId"]] = schema.message_kind_of(msg)
        else:
            assert schema.message_kind_of(msg) == answers[requests.pop(msg["rId"])]
            answered += 1
    assert answered and not any(pending.values())


def test_official_sdk_negotiation(official):
    messages = control_messages(official)
    nego = [(e, m) for e, kind, m in messages if kind == schema.KIND_NEGOTIATION]
    assert len(nego) == 4
    for event, msg in nego:
        if event.dir == "c2b":
            identity = msg["clientIdentity"]
            assert identity["features"] == "PROTOCOL_ENCODING:BER,JSON;MPS:MESSAGE_PROPERTIES_EX"
            assert identity["sdkLanguage"] == "E_CPP" and identity["clientType"] == "E_TCPCLIENT"
            assert identity["hostName"] == "" and identity["sessionId"] == event.conn
            client_id = identity["guidInfo"]["clientId"]
            assert len(client_id) == 12 and client_id == client_id.upper()
            int(client_id, 16)
        else:
            response = msg["brokerResponse"]
            assert response["result"] == {"category": "E_SUCCESS", "code": 0, "message": ""}
            assert (response["heartbeatIntervalMs"], response["maxMissedHeartbeats"]) == (3000, 10)
            broker = response["brokerIdentity"]
            features = schema.parse_features(broker["features"])
            assert features["SUBSCRIPTIONS"] == ["CONFIGURE_STREAM"]
            assert features["MPS"] == ["MESSAGE_PROPERTIES_EX"]
            assert broker["userAgent"] == "bmqbrkr:99.99.99"


def _requests(events: List[Event], conn: int, selection: str) -> List[dict]:
    return [m for e, _, m in control_messages(events)
            if e.conn == conn and e.dir == "c2b" and selection in m]


def test_official_sdk_configure_values(official):
    configures = [m["configureStream"]["streamParameters"] for m in _requests(official, 1, "configureStream")]
    assert len(configures) == 3
    first, second, deconfigure = configures
    (sub,) = first["subscriptions"]
    assert sub["expression"] == {"version": "E_UNDEFINED", "text": ""}
    assert sub["consumers"] == [{"maxUnconfirmedMessages": 1000, "maxUnconfirmedBytes": 32 * MiB,
                                 "consumerPriority": 0, "consumerPriorityCount": 1}]
    (sub2,) = second["subscriptions"]
    assert sub2["sId"] == sub["sId"] + 1  # a fresh session-wide sId per configure
    assert sub2["consumers"] == [{"maxUnconfirmedMessages": 50, "maxUnconfirmedBytes": MiB,
                                  "consumerPriority": 5, "consumerPriorityCount": 1}]
    assert deconfigure == {"appId": "__default", "subscriptions": []}
    (close,) = _requests(official, 1, "closeQueue")
    assert close["closeQueue"]["isFinal"] is True
    assert close["closeQueue"]["handleParameters"]["flags"] == 6  # READ | WRITE


def test_official_sdk_fanout_open(official):
    reader, writer = _requests(official, 2, "openQueue")
    params = reader["openQueue"]["handleParameters"]
    assert params["uri"] == "bmq://bmq.test.mem.fanout/capture?id=foo"
    assert params["subIdInfo"] == {"subId": 1, "appId": "foo"}
    assert (params["flags"], params["readCount"], params["writeCount"]) == (2, 1, 0)
    assert "subIdInfo" not in writer["openQueue"]["handleParameters"]
    responses = [m["openQueueResponse"] for e, _, m in control_messages(official)
                 if e.conn == 2 and "openQueueResponse" in m]
    assert [r["routingConfiguration"]["flags"] for r in responses] == [10, 10]  # fanout
    assert all(r["deduplicationTimeMs"] == 300000 for r in responses)
    configure = _requests(official, 2, "configureStream")[0]["configureStream"]["streamParameters"]
    assert configure["appId"] == "foo"


def test_json_client_session(json_client):
    messages = control_messages(json_client)
    identity = messages[0][2]["clientIdentity"]
    assert schema.best_encoding(identity["features"]) == schema.ENCODING_JSON
    assert all(e.raw[6] >> 5 == schema.ENCODING_JSON for e, _, _ in messages)
    (response,) = [m for _, _, m in messages if "openQueueResponse" in m]
    assert response["openQueueResponse"]["routingConfiguration"] == {"flags": 2}  # priority


def test_frame_reader_agrees_with_local_framing(captures_dir):
    codec = pytest.importorskip("bmq._codec")
    for path in sorted(captures_dir.glob("*/conn*.bin")):
        stream = path.read_bytes()
        reader = codec.FrameReader()
        got = []
        for i in range(0, len(stream), 7):  # odd chunks split headers too
            got.extend(reader.feed(stream[i:i + 7]))
        assert got == [event for _, event in frame(stream)]
        assert reader.buffered == 0


def test_control_events_through_codec(capture):
    pytest.importorskip("bmq._codec")
    _, events = capture
    for event, kind, msg in control_messages(events):
        decoded, encoding = schema.decode_event(event.raw, kind)
        assert decoded == msg and encoding == event.raw[6] >> 5
        if not (event.dir == "c2b" and encoding == schema.ENCODING_JSON):
            assert schema.encode_event(msg, encoding, kind) == event.raw


ALL_TYPES = {
    "b": (1, True), "c": (2, b"\x07"), "sh": (3, 300), "i32": (4, -5), "i64": (5, 1 << 40),
    "s": (6, "text"), "bin": (7, b"\x00\x01\x02"),
}
ZLIB_PAYLOAD = b"0123456789abcdef" * 256


def _data(events: List[Event], conn: int, kind: str) -> List[Event]:
    return [e for e in events if e.conn == conn and e.type == kind]


def _puts(codec, events: List[Event], conn: int) -> list:
    """(guid, flags, queue_id, properties or None, payload, compression) per PUT message,
    after checking its CRC32-C over the appData as sent (§2.5)."""
    out = []
    for event in _data(events, conn, "PUT"):
        for flags, qid, guid, crc, cat, schema_id, options, app_data in codec.iter_put_messages(event.raw):
            assert codec.crc32c(app_data) == crc
            assert options == b""
            area, payload = codec.split_app_data(app_data, flags, cat, schema_id)
            props = codec.decode_properties(area, schema_id != 0) if area is not None else None
            out.append((guid, flags, qid, props, payload, cat))
    return out


def test_official_conn1_data_events(official):
    codec = pytest.importorskip("bmq._codec")
    puts = _puts(codec, official, 1)
    assert [(p[4], p[3]) for p in puts] == [(b"all property types", ALL_TYPES), (b"no properties", None)]
    assert [p[1] for p in puts] == [codec.PUT_ACK_REQUESTED | codec.PUT_MESSAGE_PROPERTIES, codec.PUT_ACK_REQUESTED]
    guids = [p[0] for p in puts]
    assert all(0x40 <= g[0] <= 0x7F for g in guids)  # version-1 GUIDs made by the SDK
    (push_event,) = _data(official, 1, "PUSH")
    pushes = codec.iter_push_messages(push_event.raw)
    assert [p[1] for p in pushes] == guids
    assert [p[6] for p in pushes] == [b"all property types", b"no properties"]
    assert codec.decode_properties(pushes[0][4], pushes[0][5]) == ALL_TYPES
    assert pushes[1][4] is None
    assert all(p[2] == (1,) for p in pushes)  # the subscription id of the first configure
    (ack_event,) = _data(official, 1, "ACK")
    assert codec.iter_acks(ack_event.raw) == [(0, 0, g, 0) for g in guids]
    confirms = [c for e in _data(official, 1, "CONFIRM") for c in codec.iter_confirms(e.raw)]
    assert confirms == [(0, g, 0) for g in guids]


def test_official_conn2_zlib_fanout(official):
    codec = pytest.importorskip("bmq._codec")
    (put,) = _puts(codec, official, 2)
    guid, flags, qid, props, payload, cat = put
    assert cat == codec.COMPRESSION_ZLIB and payload == ZLIB_PAYLOAD
    assert props == {"kind": (codec.PROPERTY_STRING, "zlib")}
    (ack_event,) = _data(official, 2, "ACK")
    assert codec.iter_acks(ack_event.raw) == [(0, 0, guid, qid)]
    (push_event,) = _data(official, 2, "PUSH")
    ((push_qid, push_guid, sub_ids, _, area, new_style, push_payload),) = codec.iter_push_messages(push_event.raw)
    assert (push_guid, sub_ids, push_payload) == (guid, (1,), ZLIB_PAYLOAD)
    assert codec.decode_properties(area, new_style) == {"kind": (codec.PROPERTY_STRING, "zlib")}
    (confirm_event,) = _data(official, 2, "CONFIRM")
    assert codec.iter_confirms(confirm_event.raw) == [(push_qid, guid, 1)]  # the reader's subQueueId


def test_json_client_data_events(json_client):
    codec = pytest.importorskip("bmq._codec")
    ((guid, flags, qid, props, payload, cat),) = _puts(codec, json_client, 1)
    assert (flags, props, payload, cat) == (codec.PUT_ACK_REQUESTED, None, b"hello from a raw JSON client", 0)
    assert guid[10:].hex().upper() == "5DFE9E7D628F"  # guidInfo.clientId of the negotiation
    redelivered, fresh = [m for e in _data(json_client, 1, "PUSH") for m in codec.iter_push_messages(e.raw)]
    assert redelivered[3] & codec.PUSH_OUT_OF_ORDER  # left over from an earlier session
    assert fresh[1] == guid and fresh[2] == (0,) and fresh[6] == payload
    (ack_event,) = _data(json_client, 1, "ACK")
    assert codec.iter_acks(ack_event.raw) == [(0, 0, guid, qid)]
    (confirm_event,) = _data(json_client, 1, "CONFIRM")
    assert codec.iter_confirms(confirm_event.raw) == [(qid, guid, 0)]
