"""Subscriptions end to end, on the embedded broker and on bmqbrkr: expressions are checked
before anything is sent, and what the brokers do with the texts they are sent anyway."""
from __future__ import annotations

import uuid

import pytest

import bmq
from bmq import _codec
from bmq.broker import Broker
from bmq.broker._rawclient import RawClient

pytestmark = pytest.mark.timeout(60)


def fresh() -> str:
    return f"bmq://bmq.test.mem.priority/subs-{uuid.uuid4().hex[:12]}"


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.mark.parametrize("text, offset, words", [
    ("n >>> 5", 3, "syntax error"),
    ("false", 0, "uses no property"),
    ("n > 1 && n > 2 && n > 3 && n > 4", 0, "too complex"),
    ('n + "a" > 1', 2, "type error"),
])
def test_open_and_configure_refuse_a_wrong_expression_before_sending(session: bmq.Session, text: str, offset: int,
                                                                     words: str) -> None:
    uri = fresh()
    with pytest.raises(bmq.InvalidArgumentError) as info:
        session.open_queue(uri, read=True, options=bmq.QueueOptions(subscriptions=[text]))
    assert repr(text) in str(info.value) and f"offset {offset}" in str(info.value) and words in str(info.value)
    queue = session.open_queue(uri, read=True, write=True, options=bmq.QueueOptions(subscriptions=["n > 5"]))
    with pytest.raises(bmq.InvalidArgumentError):
        session.configure_queue(uri, bmq.QueueOptions(subscriptions=["n > 5", text]))
    queue.post(b"7", properties={"n": 7})  # the queue kept its subscription
    assert queue.get(timeout=10).data == b"7"


@pytest.mark.parametrize("text, code", [("n >>> 5", -100), ("false", -101), ("n > 1 && n > 2 && n > 3 && n > 4", -102)])
def test_a_text_the_broker_cannot_compile_is_accepted_and_receives_every_message(broker_address: str, text: str,
                                                                                 code: int) -> None:
    # bmqbrkr 0.95.14 (measured): ConfigureStream succeeds, #BMQ_SUBSCRIPTION_FAILURE with rc
    # -100/-101/-102 is logged, and the subscription then gets every message. The embedded
    # broker does the same (bmq never sends such a text; a raw client can).
    uri = fresh()
    with RawClient(port_of(broker_address)) as client:
        assert client.open(uri, 1, read=True, write=True)[0] == "openQueueResponse"
        assert client.configure(1, subscriptions=[(7, text, 0)])[0] == "configureStreamResponse"
        client.put(1, [b"a", b"b"], properties={"other": (_codec.PROPERTY_STRING, "x")})
        assert sorted((p[2], p[6]) for p in client.pushes(2)) == [((7,), b"a"), ((7,), b"b")]


def test_the_embedded_broker_logs_what_bmqbrkr_logs(broker: Broker, caplog) -> None:
    with RawClient(broker.port) as client:
        client.open(fresh(), 1, read=True)
        with caplog.at_level("WARNING", logger="bmq.broker._queues"):
            assert client.configure(1, subscriptions=[(7, "false", 0)])[0] == "configureStreamResponse"
    assert '#BMQ_SUBSCRIPTION_FAILURE' in caplog.text and 'expression: "false", rc: -101' in caplog.text
