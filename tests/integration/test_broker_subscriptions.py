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


def drain(queue: bmq.Queue, count: int, timeout: float = 10.0) -> list:
    got = []
    while len(got) < count:
        message = queue.get(timeout=timeout)
        assert message is not None, f"{len(got)} of {count} messages"
        got.append(message)
    return got


def test_the_highest_priority_matching_subscription_takes_a_message(session: bmq.Session,
                                                                    broker_address: str) -> None:
    uri = fresh()
    with bmq.Session(broker_address) as other:
        high = other.open_queue(uri, read=True, options=bmq.QueueOptions(
            subscriptions=[bmq.Subscription("n > 5", consumer_priority=2)]))
        low = session.open_queue(uri, read=True, write=True, options=bmq.QueueOptions(
            subscriptions=[bmq.Subscription("n > 0", consumer_priority=1)]))
        low.post_many([b"%d" % n for n in (7, 3, 9, 1)], [{"n": n} for n in (7, 3, 9, 1)])
        assert sorted(m.data for m in drain(high, 2)) == [b"7", b"9"]
        assert sorted(m.data for m in drain(low, 2)) == [b"1", b"3"]
        assert high.get(timeout=0.2) is None and low.get(timeout=0.2) is None


def test_a_subscription_keeps_its_own_unconfirmed_limit(session: bmq.Session) -> None:
    limited = bmq.Subscription("n > 5", max_unconfirmed_messages=2)
    queue = session.open_queue(fresh(), read=True, write=True, options=bmq.QueueOptions(
        subscriptions=[limited, "n <= 5"]))
    queue.post_many([b"%d" % n for n in (1, 7, 2, 8, 9, 3)], [{"n": n} for n in (1, 7, 2, 8, 9, 3)])
    # 9 matches the full subscription: it waits; 3, behind it, goes to "n <= 5" (same priority).
    first = drain(queue, 5)
    assert [(m.data, m.subscription) for m in first] == [
        (b"1", "n <= 5"), (b"7", limited), (b"2", "n <= 5"), (b"8", limited), (b"3", "n <= 5")]
    assert queue.get(timeout=0.3) is None
    first[1].confirm()
    assert [(m.data, m.subscription) for m in drain(queue, 1)] == [(b"9", limited)]


def test_a_full_subscription_holds_back_lower_priorities(session: bmq.Session) -> None:
    # bmqbrkr's router: a message whose highest matching subscription is full waits, lower
    # priorities do not take it, and when every subscription it met was full the messages
    # behind it wait too.
    limited = bmq.Subscription("n > 5", max_unconfirmed_messages=1, consumer_priority=2)
    queue = session.open_queue(fresh(), read=True, write=True, options=bmq.QueueOptions(
        subscriptions=[limited, bmq.Subscription("n > 0", consumer_priority=1)]))
    queue.post_many([b"%d" % n for n in (7, 3, 8, 2)], [{"n": n} for n in (7, 3, 8, 2)])
    first = drain(queue, 2)
    assert [(m.data, m.subscription) for m in first] == [(b"7", limited), (b"3", queue.options.subscriptions[1])]
    assert queue.get(timeout=0.3) is None
    first[0].confirm()
    assert [m.data for m in drain(queue, 2)] == [b"8", b"2"]


def test_configure_reroutes_pending_messages_and_loses_none(session: bmq.Session) -> None:
    uri = fresh()
    queue = session.open_queue(uri, read=True, write=True, options=bmq.QueueOptions(subscriptions=["n > 5"]))
    queue.post_many([b"%d" % n for n in (1, 7, 2, 8)], [{"n": n} for n in (1, 7, 2, 8)])
    delivered = drain(queue, 1)
    assert [(m.data, m.subscription) for m in delivered] == [(b"7", "n > 5")]
    # 8 may be on its way or already in the inbox: it stays readable after the configure.
    session.configure_queue(uri, bmq.QueueOptions(subscriptions=["n < 5", "n == 8"]))
    rest = drain(queue, 3)
    assert sorted(m.data for m in rest) == [b"1", b"2", b"8"]
    assert {m.data: m.subscription for m in rest}[b"1"] == "n < 5"
    for message in delivered + rest:
        message.confirm()
    assert queue.get(timeout=0.3) is None


def test_a_queue_without_subscriptions_reports_none(session: bmq.Session) -> None:
    queue = session.open_queue(fresh(), read=True, write=True)
    queue.post(b"x", properties={"n": 1})
    assert queue.get(timeout=10).subscription is None


def test_batch_readers_know_each_message_s_subscription(session: bmq.Session) -> None:
    queue = session.open_queue(fresh(), read=True, write=True, batches=True,
                               options=bmq.QueueOptions(subscriptions=["n % 2 == 0", "n % 2 == 1"]))
    queue.post_many([b"%d" % n for n in range(10)], [{"n": n} for n in range(10)])
    got: list = []
    while len(got) < 10:
        batch = queue.get_batch(max_messages=100, timeout=10)
        assert batch is not None
        got += batch.messages()
    assert sorted((m.data, m.subscription) for m in got) == sorted(
        (b"%d" % n, "n % 2 == 0" if n % 2 == 0 else "n % 2 == 1") for n in range(10))


def _pushes_until_quiet(client: RawClient, quiet: float = 0.4) -> list:
    """Every PUSH until none came for ``quiet`` seconds (the end of a burst: nothing else to wait on)."""
    out: list = []
    try:
        while True:
            out += client.pushes(1, timeout=quiet)
    except TimeoutError:
        return [(p[6], p[2]) for p in out]


def test_routing_among_consumers_is_bmqbrkr_s(broker_address: str) -> None:
    # Measured on bmqbrkr 0.95.14 and required of the embedded broker: consumers of one
    # expression take turns; a higher-priority consumer of an expression keeps its messages
    # from the lower one even when full, until it goes away.
    port = port_of(broker_address)
    uri = fresh()
    with RawClient(port) as writer, RawClient(port) as a, RawClient(port) as b:
        writer.open(uri, 1, write=True)
        a.open(uri, 1, read=True)
        a.configure(1, subscriptions=[(1, "n > 0", 0)])
        b.open(uri, 1, read=True)
        b.configure(1, subscriptions=[(1, "n > 0", 0), (2, "n < 0", 0)])
        for n in (1, 2, -1, 3, 4, -2, 5, 6):
            writer.put(1, [b"%d" % n], properties={"n": (_codec.PROPERTY_INT32, n)})
        writer.acks(8)
        assert _pushes_until_quiet(a) == [(b"1", (1,)), (b"3", (1,)), (b"5", (1,))]
        assert _pushes_until_quiet(b) == [(b"2", (1,)), (b"-1", (2,)), (b"4", (1,)), (b"-2", (2,)), (b"6", (1,))]
    uri = fresh()
    with RawClient(port) as writer, RawClient(port) as high, RawClient(port) as low:
        writer.open(uri, 1, write=True)
        high.open(uri, 1, read=True)
        high.configure(1, subscriptions=[(1, "n > 0", 5)], max_messages=1)
        low.open(uri, 1, read=True)
        low.configure(1, subscriptions=[(1, "n > 0", 1)])
        for n in (1, 2, 3):
            writer.put(1, [b"%d" % n], properties={"n": (_codec.PROPERTY_INT32, n)})
        writer.acks(3)
        assert _pushes_until_quiet(high) == [(b"1", (1,))]
        assert _pushes_until_quiet(low, 0.1) == []
        high.close_queue(uri, 1, read=True)
        assert _pushes_until_quiet(low) == [(b"1", (1,)), (b"2", (1,)), (b"3", (1,))]


def test_each_fanout_app_routes_its_copy_by_its_own_subscriptions(broker_address: str) -> None:
    port = port_of(broker_address)
    uri = fresh().replace("mem.priority", "mem.fanout")
    with RawClient(port) as writer, RawClient(port) as foo, RawClient(port) as bar:
        writer.open(uri, 1, write=True)
        foo.open(uri + "?id=foo", 1, read=True, sub_id=1, app_id="foo")
        foo.configure(1, app_id="foo", subscriptions=[(1, "n > 2", 0)])
        bar.open(uri + "?id=bar", 1, read=True, sub_id=1, app_id="bar")
        bar.configure(1, app_id="bar", subscriptions=[(3, "n % 2 == 0", 0), (4, "n == 1", 0)])
        for n in range(1, 6):
            writer.put(1, [b"%d" % n], properties={"n": (_codec.PROPERTY_INT32, n)})
        writer.acks(5)
        assert _pushes_until_quiet(foo) == [(b"3", (1,)), (b"4", (1,)), (b"5", (1,))]
        assert _pushes_until_quiet(bar) == [(b"1", (4,)), (b"2", (3,)), (b"4", (3,))]


def test_broadcast_gives_each_stream_one_copy_for_its_first_matching_subscription(broker_address: str) -> None:
    # bmqbrkr: priorities rank subscriptions of one expression only; a stream whose several
    # subscriptions match gets the message once, for the first (highest priority) of them.
    port = port_of(broker_address)
    uri = fresh().replace("mem.priority", "mem.broadcast")
    with RawClient(port) as writer, RawClient(port) as a, RawClient(port) as b, RawClient(port) as c:
        writer.open(uri, 1, write=True)
        for reader, subscriptions in ((a, [(1, "n > 2", 0)]), (b, [(3, "n % 2 == 0", 0), (4, "n < 3", 0)]),
                                      (c, [(5, "n == 4", 2)])):
            reader.open(uri, 1, read=True)
            reader.configure(1, subscriptions=subscriptions)
        for n in range(1, 6):
            writer.put(1, [b"%d" % n], properties={"n": (_codec.PROPERTY_INT32, n)})
        writer.acks(5)
        assert _pushes_until_quiet(a) == [(b"3", (1,)), (b"4", (1,)), (b"5", (1,))]
        assert _pushes_until_quiet(b) == [(b"1", (4,)), (b"2", (3,)), (b"4", (3,))]
        assert _pushes_until_quiet(c) == [(b"4", (5,))]
