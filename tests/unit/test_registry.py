"""The queue-handle registry without a socket: shared qIds, subIds, final closes, PUSH routing."""
from __future__ import annotations

import pytest

import bmq
from bmq._registry import QueueRegistry


class _Queue:
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.parsed = bmq.parse_uri(uri)
        self.queue_id, self.sub_id = -1, 0
        self.subscription_ids = []
        self.subscription_of = {}
        self.batches = False


def _open(registry: QueueRegistry, uri: str) -> _Queue:
    queue = _Queue(uri)
    registry.register(queue)
    return queue


def test_handles_of_one_canonical_uri_share_a_qid_and_only_the_last_close_is_final():
    registry = QueueRegistry()
    writer = _open(registry, "bmq://bmq.test.mem.fanout/q")
    foo = _open(registry, "bmq://bmq.test.mem.fanout/q?id=foo")
    bar = _open(registry, "bmq://bmq.test.mem.fanout/q?id=bar")
    other = _open(registry, "bmq://bmq.test.mem.fanout/other")
    assert writer.queue_id == foo.queue_id == bar.queue_id != other.queue_id
    assert (writer.sub_id, foo.sub_id, bar.sub_id) == (0, 1, 2)
    with pytest.raises(bmq.QueueStateError, match="already open"):
        registry.register(_Queue(foo.uri))
    assert not registry.is_last_handle(foo)
    registry.forget(foo)
    registry.forget(writer)
    assert registry.is_last_handle(bar) and registry.get(foo.uri) is None


def test_pushes_route_by_subscription_id_and_old_ids_stop_routing():
    registry = QueueRegistry()
    queue = _open(registry, "bmq://bmq.test.mem.priority/q")
    first = registry.subscribe(queue, 2)
    registry.replace_subscriptions(queue, first)
    assert all(registry.readers[(queue.queue_id, sid)] is queue for sid in first)
    second = registry.subscribe(queue, 1)
    registry.replace_subscriptions(queue, second)
    assert queue.subscription_ids == second
    assert not any((queue.queue_id, sid) in registry.readers for sid in first)
    assert registry.sole_reader(queue.queue_id) is queue
    registry.forget(queue)
    assert not registry.readers and registry.sole_reader(queue.queue_id) is None
