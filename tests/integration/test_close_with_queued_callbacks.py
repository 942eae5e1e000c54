"""Messages still waiting for ``on_message`` when their queue closes are left to the broker.

A callback that is slow (or the dispatcher busy) when ``stop()`` or ``close_queue()`` comes has
messages queued behind it. They can no longer be confirmed, so handing them over would make the
application handle each twice (here and after the broker delivers it again) and its
``confirm()`` raise. They are not handed over, and nothing is lost: a next consumer gets them.
"""
from __future__ import annotations

import logging
import threading

import pytest

import bmq
from tests.support import drain, fresh_uri, until

COUNT = 5


@pytest.mark.parametrize("close", ["stop", "close_queue"])
def test_messages_queued_for_the_callback_are_not_handed_over_after_close(
        broker_address: str, close: str, caplog: pytest.LogCaptureFixture) -> None:
    uri = fresh_uri()
    with bmq.Session(broker_address) as producer:
        writer = producer.open_queue(uri, write=True)
        for i in range(COUNT):
            writer.post(b"message %d" % i)

    handled = []
    entered, release = threading.Event(), threading.Event()

    def on_message(message: bmq.Message) -> None:
        handled.append(message.data)
        if len(handled) == 1:
            entered.set()
            release.wait(30)  # the others queue up behind this callback

    caplog.set_level(logging.INFO, logger="bmq")
    consumer = bmq.Session(broker_address)
    try:
        reader = consumer.open_queue(uri, read=True, on_message=on_message)
        assert entered.wait(10)
        assert until(lambda: consumer.stats().queues[uri].pushed == COUNT, 10)
        closing = threading.Thread(target=getattr(consumer, close), args=(() if close == "stop" else (uri,)))
        closing.start()
        assert until(lambda: not reader.is_open, 10)
        release.set()
        closing.join(30)
        assert not closing.is_alive()
    finally:
        release.set()
        consumer.stop()

    assert handled == [b"message 0"]
    assert any("not handed to it" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    with bmq.Session(broker_address) as again:  # none was confirmed: all are delivered again
        received = drain(again.open_queue(uri, read=True), COUNT)
    assert sorted(m.data for m in received) == [b"message %d" % i for i in range(COUNT)]
