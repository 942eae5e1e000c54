"""bmq and the official ``blazingmq`` SDK through the embedded broker and through the real
bmqbrkr, both directions: payloads, all seven property types and zlib-compressed messages
arrive identical. What only the embedded broker can show (how a message was stored, that the
queue emptied) is asserted against it alone."""
from __future__ import annotations

import itertools
import json
import queue as stdqueue
import subprocess
import sys
import threading
import time

import pytest

import bmq
from bmq.broker import Broker

blazingmq = pytest.importorskip("blazingmq", reason="the official blazingmq SDK is not installed")

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

_names = itertools.count()
BIG = b"0123456789abcdef" * 256  # 4 KiB: over the 1 KiB compression threshold
ALL_TYPES = {"b": True, "c": b"\x07", "sh": 300, "i32": -5, "i64": 2**40, "s": "text", "bin": b"\x00\x01\x02"}
BMQ_TYPES = {
    "b": bmq.PropertyType.BOOL,
    "c": bmq.PropertyType.CHAR,
    "sh": bmq.PropertyType.SHORT,
    "i32": bmq.PropertyType.INT32,
    "i64": bmq.PropertyType.INT64,
    "s": bmq.PropertyType.STRING,
    "bin": bmq.PropertyType.BINARY,
}


def official_types():
    return {name: getattr(blazingmq.PropertyType, kind.name) for name, kind in BMQ_TYPES.items()}


def same_value(expected, received):
    # The official SDK may hand a CHAR back as an int; compare the byte it stands for.
    if isinstance(expected, bytes) and len(expected) == 1 and isinstance(received, int):
        return expected[0] == received % 256
    return expected == received


@pytest.fixture(scope="module", params=["embedded", "bmqbrkr"])
def broker(request):
    """The embedded broker (with its inspection API) or the run's real bmqbrkr (address only)."""
    if request.param == "bmqbrkr":
        yield request.getfixturevalue("bmqbrkr")
        return
    with Broker() as b:
        yield b


def embedded(broker) -> bool:
    return isinstance(broker, Broker)


def fresh() -> str:
    return f"bmq://bmq.test.mem.priority/interop{next(_names)}-{time.monotonic_ns() % 10**9}"


def official_session(broker, on_message=None, compression=None):
    kwargs = {}
    if compression is not None:
        kwargs["message_compression_algorithm"] = compression
    return blazingmq.Session(lambda event: None, on_message=on_message, broker=broker.address, **kwargs)


def test_official_producer_to_bmq_consumer(broker):
    uri = fresh()
    with bmq.Session(broker.address) as session:
        reader = session.open_queue(uri, read=True)
        producer = official_session(broker, compression=blazingmq.CompressionAlgorithmType.ZLIB)
        try:
            producer.open_queue(uri, write=True)
            acks: "stdqueue.Queue" = stdqueue.Queue()
            producer.post(uri, b"plain", on_ack=acks.put)
            producer.post(uri, b"typed", properties=ALL_TYPES, property_type_overrides=official_types(),
                          on_ack=acks.put)
            producer.post(uri, BIG, properties={"kind": "zlib"}, on_ack=acks.put)
            for _ in range(3):
                assert acks.get(timeout=10.0).status == blazingmq.AckStatus.SUCCESS
        finally:
            producer.stop()
        messages = [reader.get(timeout=10.0) for _ in range(3)]
        assert [m.data for m in messages] == [b"plain", b"typed", BIG]
        assert messages[0].properties == {}
        assert messages[1].properties == ALL_TYPES
        assert messages[1].property_types == BMQ_TYPES
        assert messages[2].properties == {"kind": "zlib"}
        if embedded(broker):
            stored = broker.queue_messages(uri)
            assert any(m.compression == 1 for m in stored), "the official SDK compressed the big message"
        session.confirm_many(messages)


def test_bmq_producer_to_official_consumer(broker):
    uri = fresh()
    received: "stdqueue.Queue" = stdqueue.Queue()

    def on_message(message, handle):
        # Until it is confirmed the broker still holds the message: look at how it stored it.
        stored = {m.payload: m.compression for m in broker.queue_messages(uri)} if embedded(broker) else {}
        received.put((message.data, dict(message.properties), dict(message.property_types), stored.get(message.data)))
        handle.confirm()

    consumer = official_session(broker, on_message=on_message)
    try:
        consumer.open_queue(uri, read=True)
        with bmq.Session(broker.address) as session:
            writer = session.open_queue(uri, write=True)
            writer.post(b"plain")
            writer.post(b"typed", ALL_TYPES, property_types=BMQ_TYPES)
            writer.post(BIG, {"kind": "zlib"}, compression="zlib")
            got = [received.get(timeout=10.0) for _ in range(3)]
    finally:
        consumer.stop()
    assert [data for data, *_ in got] == [b"plain", b"typed", BIG]
    if embedded(broker):
        assert [compression for *_, compression in got] == [0, 0, 1], "bmq stored the big message zlib-compressed"
    assert got[0][1] == {}
    typed_values, typed_types = got[1][1], got[1][2]
    assert set(typed_values) == set(ALL_TYPES)
    assert all(same_value(ALL_TYPES[name], typed_values[name]) for name in ALL_TYPES), typed_values
    assert {name: kind.name for name, kind in typed_types.items()} == {n: k.name for n, k in BMQ_TYPES.items()}
    assert got[2][1] == {"kind": "zlib"}


def test_many_messages_both_ways_keep_order_and_count(broker):
    uri = fresh()
    count = 500
    received: "stdqueue.Queue" = stdqueue.Queue()
    done = threading.Event()

    def on_message(message, handle):
        received.put(message.data)
        handle.confirm()
        if received.qsize() >= count:
            done.set()

    consumer = official_session(broker, on_message=on_message)
    try:
        consumer.open_queue(uri, read=True)
        with bmq.Session(broker.address) as session:
            session.open_queue(uri, write=True).post_many([b"n%d" % i for i in range(count)])
            assert done.wait(20.0)
    finally:
        consumer.stop()
    assert [received.get_nowait() for _ in range(count)] == [b"n%d" % i for i in range(count)]


# The official consumer runs in a child process: should libbmq crash (it used to segfault on a
# PUSH that overtook the configure response), the suite survives and reports the signal.
_OFFICIAL_CONSUMER = """
import json, sys, threading
import blazingmq

address, uri, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
received, done = [], threading.Event()

def on_message(message, handle):
    received.append([message.data.decode(), dict(message.properties)])
    handle.confirm()
    if len(received) >= count:
        done.set()

session = blazingmq.Session(lambda event: None, on_message=on_message, broker=address)
session.open_queue(uri, read=True)
complete = done.wait(20.0)
session.close_queue(uri)
session.stop()
print(json.dumps({"complete": complete, "received": received}))
"""


def post_with_bmq(broker, uri, payloads):
    with bmq.Session(broker.address) as session:
        writer = session.open_queue(uri, write=True)
        for index, payload in enumerate(payloads):
            writer.post(payload, {"i": index})  # returns once the broker ACKed it


def post_with_official(broker, uri, payloads):
    producer = official_session(broker)
    try:
        producer.open_queue(uri, write=True)
        acks: "stdqueue.Queue" = stdqueue.Queue()
        for index, payload in enumerate(payloads):
            producer.post(uri, payload, properties={"i": index}, on_ack=acks.put)
        assert all(acks.get(timeout=10.0).status == blazingmq.AckStatus.SUCCESS for _ in payloads)
    finally:
        producer.stop()


@pytest.mark.parametrize("post", [post_with_bmq, post_with_official], ids=["bmq", "official"])
def test_official_consumer_drains_a_queue_filled_before_it_opened(broker, post):
    uri = fresh()
    payloads = [b"m%d" % i for i in range(50)]
    post(broker, uri, payloads)
    if embedded(broker):
        assert [m.payload for m in broker.queue_messages(uri)] == payloads
    child = subprocess.run(
        [sys.executable, "-c", _OFFICIAL_CONSUMER, broker.address, uri, str(len(payloads))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, f"official consumer exited with {child.returncode}: {child.stderr[-2000:]}"
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["complete"], report
    assert report["received"] == [[p.decode(), {"i": i}] for i, p in enumerate(payloads)]
    if embedded(broker):
        assert broker.wait_for(lambda: not broker.queue_messages(uri), 10.0), "every message was confirmed"
