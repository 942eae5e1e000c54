"""Replay recorded client sessions with a real bmqbrkr against the embedded broker.

Every client → broker event of a capture is sent as recorded; every broker → client event
the real broker sent is compared with what the embedded broker answers: control answers
byte for byte (BER and JSON), except the BrokerResponse's machine-specific identity fields;
ACKs exactly; PUSHes message by message (GUID, subscription ids, properties, payload).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from bmq import _codec, _schema
from bmq.broker import Broker
from bmq.broker._rawclient import RawClient

pytestmark = pytest.mark.timeout(30)

# Fields of brokerIdentity that name the machine/process, not the protocol.
_MACHINE_FIELDS = ("processName", "pid", "sessionId", "hostName", "userAgent")


def _events(folder: Path, conn: int) -> List[Dict[str, Any]]:
    streams = {d: (folder / f"conn{conn}.{d}.bin").read_bytes() for d in ("c2b", "b2c")}
    out = []
    for line in (folder / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["conn"] == conn:
            entry["bytes"] = streams[entry["dir"]][entry["offset"] : entry["offset"] + entry["len"]]
            out.append(entry)
    return out


def _without_machine_fields(message: Dict[str, Any]) -> Dict[str, Any]:
    response = dict(message["brokerResponse"])
    response["brokerIdentity"] = {
        k: v for k, v in response["brokerIdentity"].items() if k not in _MACHINE_FIELDS
    }
    return response


def _push_view(message: tuple) -> tuple:
    q_id, guid, sub_ids, flags, area, new_style, payload = message
    props = _codec.decode_properties(area, new_style) if area is not None else None
    return q_id, guid, sub_ids, flags & _codec.PUSH_MESSAGE_PROPERTIES, props, payload


def replay(broker: Broker, folder: Path, conn: int) -> int:
    """Replay one connection; returns the number of broker events compared."""
    client = RawClient(broker.port, negotiate=False)
    compared = 0
    posted = set()
    try:
        entries = _events(folder, conn)
        index = 0
        while index < len(entries):
            entry = entries[index]
            index += 1
            kind = entry["type"]
            if entry["dir"] == "c2b":
                if kind == "PUT":
                    posted.update(m[2] for m in _codec.iter_put_messages(entry["bytes"]))
                if kind != "HEARTBEAT_RSP":  # answered the real broker's timing-driven REQ
                    client.send(entry["bytes"])
                continue
            if kind == "HEARTBEAT_REQ":
                continue
            if kind == "HEARTBEAT_RSP":
                assert client.next_event(_codec.EVENT_HEARTBEAT_RSP) == entry["bytes"]
            elif kind == "CONTROL":
                ours = client.next_event(_codec.EVENT_CONTROL)
                if compared == 0:
                    expected, _ = _schema.decode_event(entry["bytes"], "negotiation")
                    actual, encoding = _schema.decode_event(ours, "negotiation")
                    assert encoding == _codec.decode_control_event(entry["bytes"])[0]
                    assert _without_machine_fields(actual) == _without_machine_fields(expected)
                else:
                    assert ours == entry["bytes"], (
                        _schema.decode_event(ours, "control")[0],
                        _schema.decode_event(entry["bytes"], "control")[0],
                    )
            elif kind == "ACK":
                expected_acks = _codec.iter_acks(entry["bytes"])
                assert client.acks(len(expected_acks)) == expected_acks
            elif kind == "PUSH":
                # Only messages posted in this session: the real queue also redelivered a
                # leftover from an earlier recording session.
                expected_pushes = [_push_view(m) for m in _codec.iter_push_messages(entry["bytes"]) if m[1] in posted]
                if not expected_pushes:
                    continue
                assert [_push_view(m) for m in client.pushes(len(expected_pushes))] == expected_pushes
            else:  # pragma: no cover - captures hold only the kinds above
                pytest.fail(f"unexpected broker event {kind}")
            compared += 1
    finally:
        client.close()
    return compared


@pytest.fixture
def broker():
    with Broker() as running:
        yield running


def test_json_client_session_matches_bmqbrkr(broker: Broker, captures_dir: Path) -> None:
    assert replay(broker, captures_dir / "json-client", 1) == 9


@pytest.mark.parametrize("conn", [1, 2])
def test_official_sdk_session_matches_bmqbrkr(broker: Broker, captures_dir: Path, conn: int) -> None:
    assert replay(broker, captures_dir / "official-sdk", conn) >= 8


def test_broker_response_json_shape_matches_capture(broker: Broker, captures_dir: Path) -> None:
    [first] = [e for e in _events(captures_dir / "json-client", 1) if e["dir"] == "b2c"][:1]
    with RawClient(broker.port) as client:
        ours = client.broker_response
    theirs = _schema.decode_event(first["bytes"], "negotiation")[0]["brokerResponse"]
    assert list(ours) == list(theirs)
    assert list(ours["brokerIdentity"]) == list(theirs["brokerIdentity"])
