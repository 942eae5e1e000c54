"""bmq._schema against the control-message vectors (protocol §14.2/§14.3) and the §8 rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from bmq import _ctrlmsg as ctrlmsg
from bmq import _schema as schema
from bmq.exceptions import ProtocolError

BER, JSON = schema.ENCODING_BER, schema.ENCODING_JSON
NEGO, CONTROL, AUTH = schema.KIND_NEGOTIATION, schema.KIND_CONTROL, schema.KIND_AUTHENTICATION

JAVA_IDENTITY = {
    "protocolVersion": 1, "sdkVersion": 999999, "clientType": "E_TCPCLIENT",
    "processName": "proc_name", "pid": 9999, "sessionId": 123, "hostName": "host_name",
    "features": "", "clusterName": "", "clusterNodeId": -1, "sdkLanguage": "E_JAVA",
}
OLD_IDENTITY = {k: v for k, v in JAVA_IDENTITY.items() if k != "sdkLanguage"}
HANDLE = {
    "uri": "bmq://bmq.tutorial.hello/test-queue", "qId": 0, "flags": 12,
    "readCount": 0, "writeCount": 1, "adminCount": 0,
}
OPEN = {"openQueue": {"handleParameters": HANDLE}}
OPEN_RESPONSE = {"openQueueResponse": {"originalRequest": {"handleParameters": HANDLE},
                                       "routingConfiguration": {"flags": 1}}}
STATUS = {"status": {"category": "E_SUCCESS", "code": 123, "message": "Test"}}
SUCCESS = {"category": "E_SUCCESS", "code": 0, "message": ""}

# (file, kind, encoding, expected message, expected body length)
VECTORS = [
    ("msg_control_nego_client_04042018.bin", NEGO, BER, {"clientIdentity": OLD_IDENTITY}, 59),
    ("msg_control_nego_client_a326573a-2c1e-42a2-afdc-da184456c118.bin", NEGO, JSON,
     {"clientIdentity": JAVA_IDENTITY}, 236),
    ("msg_control_nego_client_broker_response_623ff064-7d51-4bd8-988d-826ccfd458a8.bin", NEGO, JSON,
     {"brokerResponse": {"result": SUCCESS, "protocolVersion": 1, "brokerVersion": 3, "isDeprecatedSdk": False,
                         "brokerIdentity": dict(JAVA_IDENTITY, clusterName="cluster_name")}}, 385),
    ("broker_response_20032018.bin", NEGO, BER,
     {"brokerResponse": {"result": SUCCESS, "protocolVersion": 1, "brokerVersion": 999999, "isDeprecatedSdk": True,
                         "brokerIdentity": {"protocolVersion": 1, "sdkVersion": 999999, "clientType": "E_TCPBROKER",
                                            "processName": "./bmqbrkr.tsk", "pid": 1987, "sessionId": 39,
                                            "hostName": "nyteknavodev4", "features": "", "clusterName": "",
                                            "clusterNodeId": -1}}}, 94),
    ("msg_control_open_queue_06042018.bin", CONTROL, BER, OPEN, 68),
    ("msg_control_open_queue_5e110b7c-e332-4f5b-8313-c419ad0fbf48.bin", CONTROL, JSON, OPEN, 146),
    ("msg_control_open_queue_json_with_id_05092018.bin", CONTROL, JSON, dict(rId=1, **OPEN), 154),
    ("msg_control_open_queue_response_9950845d-d1dc-418f-811a-1b620c73e589.bin", CONTROL, JSON, OPEN_RESPONSE, 209),
    ("msg_control_open_queue_response_id_json_06092018.bin", CONTROL, JSON, dict(rId=1, **OPEN_RESPONSE), 217),
    ("msg_control_status_27032018.bin", CONTROL, BER, STATUS, 24),
    ("msg_control_status_53121b03-f45d-46b2-95d0-f2df8a1a2cb2.bin", CONTROL, JSON, STATUS, 63),
    ("msg_control_status_rid_json_05092018.bin", CONTROL, JSON, dict(rId=7, **STATUS), 71),
]


def vector_body(path: Path) -> tuple[bytes, int]:
    """(unpadded body, encoding) of a vector file, trusting EventHeader.length (§14.1)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:4], "big")
    event = data[:length]
    body = event[4 * event[5]:]
    if len(event) == length:
        body = body[:-body[-1]]
    else:  # broker_response_20032018.bin lacks its 2 padding bytes
        assert length - len(event) == 2
    return body, event[6] >> 5


@pytest.mark.parametrize("name,kind,encoding,expected,size", VECTORS, ids=[v[0][:40] for v in VECTORS])
def test_vector_decodes_and_reencodes(vectors_dir, name, kind, encoding, expected, size):
    body, wire_encoding = vector_body(vectors_dir / name)
    assert wire_encoding == encoding
    assert len(body) == size
    message = schema.decode_body(body, encoding, kind)
    assert message == expected
    assert list(message) == list(expected)  # XSD order on decode
    assert schema.encode_body(message, encoding, kind) == body
    assert schema.message_kind_of(message) == [k for k in expected if k != "rId"][0]


def test_schema_table_is_closed():
    known = set(ctrlmsg.FIELDS) | set(ctrlmsg.CHOICES) | set(ctrlmsg.ENUMS) | set(ctrlmsg.INT_RANGES)
    known |= set(ctrlmsg.PYTHON_TYPES)
    types = [f.type for fields in ctrlmsg.FIELDS.values() for f in fields]
    types += [t for sels in ctrlmsg.CHOICES.values() for _, t in sels.values()]
    assert set(types) <= known
    assert all(0 in values.values() for values in ctrlmsg.ENUMS.values())  # with_defaults relies on it


def test_ber_status_bytes_from_facts():
    body = bytes.fromhex("3080a180a080800100") + b"\x81\x01\x7b\x82\x04Test" + bytes(6)
    assert schema.encode_body(STATUS, BER, CONTROL) == body


def test_ber_rid_and_anonymous_choice():
    body = schema.encode_body({"rId": 6, "disconnect": {}}, BER, CONTROL)
    assert body == bytes.fromhex("3080" "800106" "a180" "a1800000" "0000" "0000")
    assert schema.decode_body(body, BER, CONTROL) == {"rId": 6, "disconnect": {}}


@pytest.mark.parametrize("value,octets", [
    (0, "00"), (127, "7f"), (128, "0080"), (-1, "ff"), (-128, "80"), (-129, "ff7f"),
    (999999, "0f423f"), (2**31 - 1, "7fffffff"), (-2**31, "80000000"),
])
def test_ber_int_minimal(value, octets):
    body = schema.encode_body({"status": {"category": "E_SUCCESS", "code": value}}, BER, CONTROL)
    content = bytes.fromhex(octets)
    assert bytes((0x81, len(content))) + content in body
    assert schema.decode_body(body, BER, CONTROL)["status"]["code"] == value


def test_ber_unsigned_gets_leading_zero_and_long_lengths_decode():
    msg = {"rId": 1, "openQueue": {"handleParameters": {"uri": "u" * 200, "qId": 2**32 - 1, "flags": 2**64 - 1}}}
    body = schema.encode_body(msg, BER, CONTROL)
    assert b"\x81\x05\x00\xff\xff\xff\xff" in body  # qId
    assert b"\x83\x09\x00" + b"\xff" * 8 in body  # flags
    assert b"\x80\x81\xc8" + b"u" * 200 in body  # long-form length, minimal
    assert schema.decode_body(body, BER, CONTROL) == msg


def test_ber_accepts_definite_lengths_and_skips_unknown_tags():
    # Same status as the vector, written with definite lengths and unknown elements: a
    # context [5] primitive in Status, a [9] constructed (nested) in ControlMessage and a
    # high-tag-number element.
    status = b"\x80\x01\x00\x81\x01\x7b\x85\x02zz\x82\x04Test\x9f\x81\x00\x01q"
    sel = b"\xa0" + bytes((len(status),)) + status
    choice = b"\xa1" + bytes((len(sel),)) + sel
    unknown = b"\xa9\x80\xa0\x80\x80\x01\x01\x00\x00\x00\x00"
    top = unknown + b"\x80\x01\x07" + choice
    body = b"\x30" + bytes((len(top),)) + top
    assert schema.decode_body(body, BER, CONTROL) == dict(rId=7, **STATUS)


def test_ber_empty_array_encoded_and_json_omits_it():
    msg = {"rId": 4, "configureStream": {"qId": 0, "streamParameters": {"appId": "__default", "subscriptions": []}}}
    ber = schema.encode_body(msg, BER, CONTROL)
    assert b"\xa1\x80\x00\x00" in ber
    assert schema.decode_body(ber, BER, CONTROL) == msg
    text = schema.encode_body(msg, JSON, CONTROL)
    assert text == b'{"rId":4,"configureStream":{"qId":0,"streamParameters":{"appId":"__default"}}}'


def test_json_escapes_like_baljsn():
    msg = {"status": {"category": "E_UNKNOWN", "code": -1, "message": 'a/b"c\\d\n\t\x01\x1f\x7fé€'}}
    body = schema.encode_body(msg, JSON, CONTROL)
    assert body == ('{"status":{"category":"E_UNKNOWN","code":-1,"message":'
                    '"a\\/b\\"c\\\\d\\n\\t\\u0001\\u001f\x7fé€"}}').encode("utf-8")
    assert schema.decode_body(body, JSON, CONTROL) == msg


def test_json_constructed_examples_from_facts():
    fanout = {"rId": 2, "openQueue": {"handleParameters": {
        "uri": "bmq://bmq.test.mem.fanout/q?id=foo", "qId": 1, "subIdInfo": {"subId": 1, "appId": "foo"},
        "flags": 2, "readCount": 1, "writeCount": 0, "adminCount": 0}}}
    assert schema.encode_body(fanout, JSON, CONTROL) == (
        b'{"rId":2,"openQueue":{"handleParameters":{"uri":"bmq:\\/\\/bmq.test.mem.fanout\\/q?id=foo","qId":1,'
        b'"subIdInfo":{"subId":1,"appId":"foo"},"flags":2,"readCount":1,"writeCount":0,"adminCount":0}}}')
    auth = {"authenticationRequest": {"mechanism": "Basic", "data": b"user:pass"}}
    body = schema.encode_body(auth, JSON, AUTH)
    assert body == b'{"authenticationRequest":{"mechanism":"Basic","data":"dXNlcjpwYXNz"}}'
    assert schema.decode_body(body, JSON, AUTH) == auth
    assert schema.decode_body(schema.encode_body(auth, BER, AUTH), BER, AUTH) == auth


def test_json_decode_any_order_unknown_keys_and_nulls():
    text = (b'{"openQueue":{"extra":[1,{"x":null}],"handleParameters":{"adminCount":0,"flags":12,"qId":0,'
            b'"uri":"bmq://bmq.tutorial.hello/test-queue","readCount":0,"writeCount":1,"subIdInfo":null}},'
            b'"rId":null,"unknown":true}')
    assert schema.decode_body(text, JSON, CONTROL) == OPEN


@pytest.mark.parametrize("text", [
    b'{"rId":true,"disconnect":{}}',  # bool is not an int
    b'{"rId":1.0,"disconnect":{}}',
    b'{"rId":"1","disconnect":{}}',
    b'{"rId":2147483648,"disconnect":{}}',
    b'{"rId":1}',  # no selection
    b'{"rId":1,"disconnect":{},"status":{}}',  # two selections
    b'{"status":{"category":"E_NOPE","code":0}}',
    b'{"status":{"category":0,"code":0}}',
    b'{"closeQueue":{"isFinal":1}}',
    b'{"configureStream":{"streamParameters":{"subscriptions":{}}}}',
    b'{"openQueue":[]}',
    b'[]',
    b'{"disconnect":{}} x',
    b'{"rId":NaN,"disconnect":{}}',
    b'{"rId":' + b"9" * 5000 + b',"disconnect":{}}',
    b'\xff{}',
    b"[" * 100000,
])
def test_json_decode_rejects(text):
    with pytest.raises(ProtocolError):
        schema.decode_body(text, JSON, CONTROL)


def test_auth_base64_must_be_valid():
    with pytest.raises(ProtocolError):
        schema.decode_body(b'{"authenticationRequest":{"mechanism":"x","data":"@@"}}', JSON, AUTH)


@pytest.mark.parametrize("hexbody", [
    "", "30", "3080", "308000", "3000", "3180a180a180000000000000",  # not a SEQUENCE
    "3080a180a1800000000000000000",  # trailing bytes
    "3080a180ad80000000",  # truncated
    "3080a180a38000000000",  # retired selection 3
    "3080a180a1800000a28000000000",  # two selections
    "3080a1800000" "0000",  # empty choice
    "30800000",  # no selection at all
    "3080a180a080800109000000000000",  # enum value 9 unknown (StatusCategory)
    "3080a180a0808000000000000000",  # empty integer
    "3080a180ac8081020000000000000000",  # bool of 2 octets (isFinal)
    "308081850000000001010000",  # 5 length octets
    "308080ff01",  # length past the end
    "3080a080a08080800000",  # indefinite primitive
    "3080a180b080a180800100",  # unterminated nesting
    "3080" + "a080" * 40 + "0000" * 40 + "0000",  # unknown nesting deeper than the bound
])
def test_ber_decode_rejects(hexbody):
    with pytest.raises(ProtocolError):
        schema.decode_body(bytes.fromhex(hexbody), BER, CONTROL)


def test_ber_rejects_out_of_range_and_negative_unsigned():
    body = schema.encode_body({"openQueue": {"handleParameters": {"uri": "", "qId": 0, "flags": 0}}}, BER, CONTROL)
    negative_qid = body.replace(b"\x81\x01\x00", b"\x81\x01\xff", 1)
    with pytest.raises(ProtocolError):
        schema.decode_body(negative_qid, BER, CONTROL)
    big_rid = bytes.fromhex("3080" "800500ffffffff" "a180a1800000" "0000" "0000")
    with pytest.raises(ProtocolError):
        schema.decode_body(big_rid, BER, CONTROL)


def test_encode_rejects_bad_input():
    with pytest.raises(ValueError):
        schema.encode_body({"rId": 1}, JSON, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body({"disconnect": {}, "status": STATUS["status"]}, BER, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body({"disconnect": {"bogus": 1}}, JSON, CONTROL)
    with pytest.raises(TypeError):
        schema.encode_body({"rId": True, "disconnect": {}}, BER, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body({"rId": 2**31, "disconnect": {}}, JSON, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body({"status": {"category": "E_NOPE", "code": 0}}, BER, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body(OPEN, 7, CONTROL)
    with pytest.raises(ValueError):
        schema.encode_body(OPEN, JSON, "bogus")
    with pytest.raises(ProtocolError):
        schema.decode_body(b"{}", 7, CONTROL)


def test_with_defaults_fills_like_the_broker():
    filled = schema.with_defaults({"rId": 3, "openQueueResponse": {
        "originalRequest": {"handleParameters": {"uri": "bmq://d/q", "qId": 0, "flags": 2, "readCount": 1}},
        "routingConfiguration": {"flags": 2}}}, CONTROL)
    assert filled == {"rId": 3, "openQueueResponse": {
        "originalRequest": {"handleParameters": {"uri": "bmq://d/q", "qId": 0, "flags": 2, "readCount": 1,
                                                 "writeCount": 0, "adminCount": 0}},
        "routingConfiguration": {"flags": 2}, "deduplicationTimeMs": 300000}}
    identity = schema.with_defaults({"clientIdentity": {"protocolVersion": 1, "clientType": "E_TCPCLIENT"}}, NEGO)
    assert identity["clientIdentity"] == {
        "protocolVersion": 1, "sdkVersion": 999999, "clientType": "E_TCPCLIENT", "processName": "", "pid": 0,
        "sessionId": 1, "hostName": "", "features": "", "clusterName": "", "clusterNodeId": -1,
        "sdkLanguage": "E_CPP", "guidInfo": {"clientId": "", "nanoSecondsFromEpoch": 0}, "userAgent": ""}
    stream = schema.with_defaults({"configureStream": {"qId": 1, "streamParameters": {}}}, CONTROL)
    assert stream["configureStream"]["streamParameters"] == {"appId": "__default", "subscriptions": []}
    status = schema.with_defaults({"status": {}}, CONTROL)
    assert status == {"status": {"category": "E_SUCCESS", "code": 0, "message": ""}}
    auth = schema.with_defaults({"authenticationResponse": {"status": {"category": "E_SUCCESS"}}}, AUTH)
    assert auth == {"authenticationResponse": {"status": {"category": "E_SUCCESS", "code": 0, "message": ""}}}


def test_facts_dev_broker_response_json_is_byte_exact():
    expected = (
        b'{"brokerResponse":{"result":{"category":"E_SUCCESS","code":0,"message":""},"protocolVersion":1,'
        b'"brokerVersion":999999,"isDeprecatedSdk":false,"brokerIdentity":{"protocolVersion":1,"sdkVersion":999999,'
        b'"clientType":"E_TCPBROKER","processName":"bmqbrkr.tsk","pid":4711,"sessionId":1,"hostName":"myhost",'
        b'"features":"PROTOCOL_ENCODING:BER,JSON;HA:GRACEFUL_SHUTDOWN,GRACEFUL_SHUTDOWN_V2,BROADCAST_TO_PROXIES;'
        b'MPS:MESSAGE_PROPERTIES_EX;SUBSCRIPTIONS:CONFIGURE_STREAM","clusterName":"","clusterNodeId":-1,'
        b'"sdkLanguage":"E_CPP","guidInfo":{"clientId":"","nanoSecondsFromEpoch":0},"userAgent":"bmqbrkr:99.99.99"},'
        b'"heartbeatIntervalMs":3000,"maxMissedHeartbeats":10}}')
    sparse = {"brokerResponse": {
        "result": {"category": "E_SUCCESS"}, "protocolVersion": 1, "brokerVersion": 999999,
        "brokerIdentity": {
            "protocolVersion": 1, "clientType": "E_TCPBROKER", "processName": "bmqbrkr.tsk", "pid": 4711,
            "hostName": "myhost", "features": schema.format_features({
                "PROTOCOL_ENCODING": ["BER", "JSON"],
                "HA": ["GRACEFUL_SHUTDOWN", "GRACEFUL_SHUTDOWN_V2", "BROADCAST_TO_PROXIES"],
                "MPS": ["MESSAGE_PROPERTIES_EX"], "SUBSCRIPTIONS": ["CONFIGURE_STREAM"]}),
            "userAgent": "bmqbrkr:99.99.99"}}}
    assert schema.encode_body(schema.with_defaults(sparse, NEGO), JSON, NEGO) == expected


@pytest.mark.parametrize("text,expected", [
    ("", {}),
    ("PROTOCOL_ENCODING:BER,JSON;MPS:MESSAGE_PROPERTIES_EX",
     {"PROTOCOL_ENCODING": ["BER", "JSON"], "MPS": ["MESSAGE_PROPERTIES_EX"]}),
    (";A:x,,y;;B;A:z", {"A": ["x", "y"], "B": []}),
    ("A:x;B:;C:y", {"A": ["x"]}),  # the broker's parser gives up at "B:"
])
def test_parse_features(text, expected):
    assert schema.parse_features(text) == expected


def test_format_features_round_trip():
    features = {"PROTOCOL_ENCODING": ["JSON"], "MPS": ["MESSAGE_PROPERTIES_EX"], "X": []}
    text = schema.format_features(features)
    assert text == "PROTOCOL_ENCODING:JSON;MPS:MESSAGE_PROPERTIES_EX;X"
    assert schema.parse_features(text) == features


@pytest.mark.parametrize("features,encoding", [
    ("", BER), ("MPS:MESSAGE_PROPERTIES_EX", BER), ("PROTOCOL_ENCODING:BER,JSON", BER),
    ("PROTOCOL_ENCODING:JSON,BER", BER), ("PROTOCOL_ENCODING:JSON;MPS:MESSAGE_PROPERTIES_EX", JSON),
    ("MPS:MESSAGE_PROPERTIES_EX;PROTOCOL_ENCODING:JSON", JSON), ("PROTOCOL_ENCODING:XML", BER),
    ("PROTOCOL_ENCODING", BER),
])
def test_best_encoding(features, encoding):
    assert schema.best_encoding(features) == encoding


def test_message_kind_of():
    assert schema.message_kind_of({"rId": 1, "configureStreamResponse": {}}) == "configureStreamResponse"
    assert schema.message_kind_of({"authenticationResponse": {}}) == "authenticationResponse"
    with pytest.raises(ValueError):
        schema.message_kind_of({"rId": 1})


def test_encoding_constants_match_codec():
    codec = pytest.importorskip("bmq._codec")
    assert (schema.ENCODING_BER, schema.ENCODING_JSON) == (codec.ENCODING_BER, codec.ENCODING_JSON)


def test_event_round_trip_through_codec():
    codec = pytest.importorskip("bmq._codec")
    for kind, msg in ((CONTROL, dict(rId=7, **STATUS)), (NEGO, {"clientIdentity": JAVA_IDENTITY}),
                      (AUTH, {"authenticationRequest": {"mechanism": "Basic"}})):
        for encoding in (BER, JSON):
            event = schema.encode_event(msg, encoding, kind)
            expected_type = codec.EVENT_AUTHENTICATION if kind == AUTH else codec.EVENT_CONTROL
            assert event[4] == 0x40 | expected_type
            assert event[6] == encoding << 5
            assert schema.decode_event(event, kind) == (msg, encoding)


def test_decode_event_checks_the_event_type():
    pytest.importorskip("bmq._codec")
    control = schema.encode_event({"authenticationRequest": {"mechanism": "Basic"}}, JSON, AUTH)
    with pytest.raises(ProtocolError):
        schema.decode_event(control, CONTROL)
    with pytest.raises(ProtocolError):
        schema.decode_event(schema.encode_event(dict(rId=7, **STATUS), BER, CONTROL), AUTH)
