"""Retry-safe posts: a timed-out post says it is still in flight and carries its GUIDs; posting
it again with them stores each message once, on either broker. A NACKed post_many's PostError
holds every Ack and the indexes of the failed ones.

The timeouts are provoked by a proxy holding the broker's bytes back (its ACKs among them) while
the client's reach it: ``timeout=0.0`` alone is a race the client can win, as it did with the
GIL off (the reader thread, running in parallel, read the ACK within the post call)."""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import List

import pytest

import bmq
from proxy import Proxy

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()


def _uri(what: str) -> str:
    return f"bmq://bmq.test.mem.priority/retries-{what}-{next(_names)}-{id(_names)}"


def _drain(address: str, uri: str) -> List[bytes]:
    """Every message stored in ``uri``, confirmed (the wait for none more is bounded)."""
    with bmq.Session(address) as session:
        reader = session.open_queue(uri, read=True)
        got = []
        message = reader.get(timeout=10.0)
        while message is not None:
            got.append(message.data)
            message.confirm()
            message = reader.get(timeout=1.0)
        return got


def test_a_timed_out_post_retried_with_its_guid_is_stored_once(broker_address):
    uri = _uri("post")
    with Proxy(broker_address) as proxy, bmq.Session(proxy.address) as session:
        queue = session.open_queue(uri, write=True)
        proxy.stall("down")  # the PUT reaches the broker, its ACK is held back
        with pytest.raises(bmq.TimeoutError, match="still in flight") as raised:
            queue.post(b"once", timeout=0.0)
        proxy.resume()
        (guid,) = raised.value.guids
        assert isinstance(guid, bytes) and len(guid) == 16
        assert session.flush(30.0) == 0  # the broker answered the first post meanwhile
        ack = queue.post(b"once", guid=guid)
        assert ack.status is bmq.AckStatus.SUCCESS and ack.guid == guid
    assert _drain(broker_address, uri) == [b"once"]


def test_a_timed_out_post_many_retried_with_its_guids_is_stored_once(broker_address):
    uri = _uri("many")
    payloads = [b"m%d" % i for i in range(5)]
    with Proxy(broker_address) as proxy, bmq.Session(proxy.address) as session:
        queue = session.open_queue(uri, write=True)
        proxy.stall("down")
        with pytest.raises(bmq.TimeoutError, match="still in flight") as raised:
            queue.post_many(payloads, timeout=0.0)
        proxy.resume()
        guids = raised.value.guids
        assert len(guids) == 5 and len(set(guids)) == 5
        assert session.flush(30.0) == 0
        acks = queue.post_many(payloads, guids=b"".join(guids))
        assert [ack.guid for ack in acks] == list(guids)
    assert sorted(_drain(broker_address, uri)) == payloads


def test_post_async_takes_the_callers_guid(broker_address):
    guid = bmq._codec.GuidGenerator(99).generate(1)
    with bmq.Session(broker_address) as session:
        queue = session.open_queue(_uri("async"), write=True)
        ack = queue.post_async(b"x", guid=guid).result(30.0)
        assert ack.status is bmq.AckStatus.SUCCESS and ack.guid == guid
        with pytest.raises(bmq.InvalidArgumentError, match="16 bytes"):
            queue.post(b"x", guid=b"short")
        with pytest.raises(bmq.ArgumentTypeError, match="16 bytes"):
            queue.post(b"x", guid="0" * 16)  # type: ignore[arg-type]


def test_a_nacked_post_many_names_every_ack_and_the_failed_ones(broker):
    uri = _uri("nack")
    with bmq.Session(broker.address) as session:
        queue = session.open_queue(uri, write=True)
        broker.faults.nack_next(2)
        with pytest.raises(bmq.PostError, match="NACKed") as raised:
            queue.post_many([b"a", b"b", b"c"])
    error = raised.value
    assert len(error.acks) == 3 and len(error.guids) == 3
    assert [ack.guid for ack in error.acks] == error.guids
    assert error.failed == [i for i, ack in enumerate(error.acks) if ack.status is not bmq.AckStatus.SUCCESS]
    assert len(error.failed) == 2 and error.ack is error.acks[error.failed[0]]


def test_the_example_of_docs_retries_md_runs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "retries.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(block, "docs/retries.md", "exec"), {"__name__": "__retries__"})


def test_session_post_by_uri_is_deprecated_in_favour_of_post_async(broker_address):
    uri = _uri("by-uri")
    with bmq.Session(broker_address) as session:
        session.open_queue(uri, write=True)
        assert session.post_async(uri, b"a").result(30.0).status is bmq.AckStatus.SUCCESS
        with pytest.warns(DeprecationWarning, match="post_async"):
            future = session.post(uri, b"b")  # still the old meaning: a Future
        assert future.result(30.0).status is bmq.AckStatus.SUCCESS
