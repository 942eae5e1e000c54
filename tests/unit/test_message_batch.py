"""MessageBatch without a broker: joining, splitting at limits, properties of any message."""
from __future__ import annotations

import array
from typing import Dict, List, Optional

import pytest

import bmq
from bmq import _codec
from bmq._types import MessageBatch


class FakeQueue:
    uri = "bmq://bmq.test.mem.priority/batch-unit"


def make(queue: object, payloads: List[bytes], first_guid: int = 0,
         properties: Optional[Dict[int, dict]] = None) -> MessageBatch:
    offsets = [0]
    for payload in payloads:
        offsets.append(offsets[-1] + len(payload))
    areas = {index: (_codec.encode_properties({k: (int(bmq.PropertyType.INT32), v) for k, v in props.items()}), True)
             for index, props in (properties or {}).items()}
    guids = b"".join((first_guid + i).to_bytes(16, "big") for i in range(len(payloads)))
    return MessageBatch(queue, guids, b"".join(payloads), array.array("i", offsets).tobytes(), areas or None)  # type: ignore[arg-type]


def contents(batch: MessageBatch) -> list:
    return [(batch.payload(i), int.from_bytes(batch.guid(i), "big"), batch.properties(i)) for i in range(len(batch))]


def test_join_keeps_order_and_moves_properties_with_their_messages():
    queue = FakeQueue()
    first = make(queue, [b"a", b"bb"], 0, {1: {"n": 1}})
    second = make(queue, [b"ccc"], 2, {0: {"n": 2}})
    joined = MessageBatch.join([first, second])
    assert contents(joined) == [(b"a", 0, {}), (b"bb", 1, {"n": 1}), (b"ccc", 2, {"n": 2})]
    assert joined.offsets.tolist() == [0, 1, 3, 6] and joined.has_properties
    assert MessageBatch.join([first]) is first
    with pytest.raises(ValueError, match="at least one"):
        MessageBatch.join([])
    with pytest.raises(ValueError, match="different queues"):
        MessageBatch.join([first, make(FakeQueue(), [b"x"])])


def test_split_and_byte_limits_cut_between_messages():
    batch = make(FakeQueue(), [b"a", b"bb", b"ccc", b"dddd"], 10, {0: {"n": 0}, 3: {"n": 3}})
    head, tail = batch._split(2)
    assert contents(head) == [(b"a", 10, {"n": 0}), (b"bb", 11, {})]
    assert contents(tail) == [(b"ccc", 12, {}), (b"dddd", 13, {"n": 3})]
    assert tail.offsets.tolist() == [0, 3, 7]
    assert contents(MessageBatch.join([head, tail])) == contents(batch)
    assert [batch._count_within(size) for size in (0, 1, 2, 3, 6, 9, 10, 99)] == [0, 1, 1, 2, 3, 3, 4, 4]


def test_messages_and_indexes():
    batch = make(FakeQueue(), [b"a", b"bb"], 0, {1: {"n": 5}})
    messages = batch.messages()
    assert [(m.data, m.guid, m.properties, m.queue_uri) for m in messages] == [
        (b"a", bytes(16), {}, FakeQueue.uri), (b"bb", (1).to_bytes(16, "big"), {"n": 5}, FakeQueue.uri)]
    assert batch.payload(-1) == b"bb" and batch.guid(-2) == bytes(16)
    assert batch.all_properties() == [{}, {"n": 5}]
    for bad in (2, -3):
        with pytest.raises(IndexError):
            batch.payload(bad)
    assert "messages=2" in repr(batch)


def test_each_message_keeps_the_subscription_it_came_for_across_join_and_split():
    queue = FakeQueue()
    queue.subscription_of = {1: "n > 1", 2: "n < 0"}  # type: ignore[attr-defined]

    def part(count: int, sid: int) -> MessageBatch:
        batch = make(queue, [b"x"] * count)
        return MessageBatch(queue, batch.guids, batch.payloads, batch._offsets, None, ((0, sid),))  # type: ignore[arg-type]

    joined = MessageBatch.join([part(2, 1), part(3, 2), part(1, 2), part(2, 1)])
    expected = ["n > 1"] * 2 + ["n < 0"] * 4 + ["n > 1"] * 2
    assert [m.subscription for m in joined.messages()] == expected
    for count in range(1, len(joined)):
        head, tail = joined._split(count)
        assert [m.subscription for m in head.messages() + tail.messages()] == expected
