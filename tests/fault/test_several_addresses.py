"""A session given several broker addresses (proxies in front of one cluster): it connects to
the first that answers, fails over to the next at once when its connection is lost, and backs
off only once every address has failed; nothing posted is lost or stored twice on the way.

Two test proxies (tests/proxy.py) in front of one broker stand for two proxies in front of one
cluster: closing one (its listener too, as a killed proxy process) is the loss of that proxy.
The reconnect policy's first delay is far longer than the tests wait, so a failover that
happens in time cannot have waited for it.
"""
from __future__ import annotations

import threading
import time
from typing import List, Set

import pytest

import bmq
from bmq import events
from proxy import Proxy
from realbroker import free_port
from support import drain, fresh_uri, wait_event

# Backing off would take 30 s: a failover seen sooner went to the next address at once.
NO_QUICK_RETRY = bmq.ReconnectPolicy(initial_delay=30.0, max_delay=30.0, jitter=0.0)


def _dead_address() -> str:
    """An address on 127.0.0.1 where nothing listens (connects are refused at once)."""
    return f"tcp://127.0.0.1:{free_port()}"


def test_connects_to_the_first_address_that_answers(broker):
    dead = _dead_address()
    with bmq.Session([dead, broker.address]) as session:
        assert session.broker == broker.address
        assert session.brokers.configured == (dead, broker.address)
        assert session.stats().broker == broker.address
        connected = session.next_event(5.0)
        assert connected == events.Connected() and connected.address == broker.address
        queue = session.open_queue(fresh_uri(), write=True)
        assert queue.post(b"x").status is bmq.AckStatus.SUCCESS


def test_no_address_answering_names_each_failure():
    first, second = _dead_address(), _dead_address()
    with pytest.raises(bmq.ConnectionError) as caught:
        bmq.Session([first, second], bmq.SessionOptions(connect_timeout=2.0))
    assert first in str(caught.value) and second in str(caught.value)


@pytest.mark.parametrize("brokers, error", [
    ([], bmq.InvalidArgumentError),
    (["tcp://127.0.0.1:1", 5], bmq.InvalidArgumentError),
    (["tcp://127.0.0.1:1", "http://127.0.0.1:2"], bmq.InvalidURIError),
])
def test_bad_address_lists_are_refused_before_connecting(brokers, error):
    with pytest.raises(error):
        bmq.Session(brokers)


class _Posters:
    """``threads`` threads each posting ``per_thread`` messages with blocking ``post()``."""

    def __init__(self, queue: bmq.Queue, threads: int, per_thread: int) -> None:
        self.expected: Set[bytes] = {b"%d-%d" % (t, i) for t in range(threads) for i in range(per_thread)}
        self.acked: List[bytes] = []
        self.failures: List[BaseException] = []
        self._lock = threading.Condition()
        self._threads = [threading.Thread(target=self._run, args=(queue, t, per_thread), name=f"poster-{t}")
                         for t in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, queue: bmq.Queue, index: int, per_thread: int) -> None:
        try:
            for i in range(per_thread):
                payload = b"%d-%d" % (index, i)
                ack = queue.post(payload)
                assert ack.status is bmq.AckStatus.SUCCESS, ack
                with self._lock:
                    self.acked.append(payload)
                    self._lock.notify_all()
        except BaseException as exc:  # reported by join()
            with self._lock:
                self.failures.append(exc)
                self._lock.notify_all()

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        with self._lock:
            assert self._lock.wait_for(lambda: len(self.acked) >= count or self.failures, timeout), len(self.acked)
        assert not self.failures, self.failures[:3]

    def join(self, timeout: float = 60.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
        assert not self.failures, self.failures[:3]
        assert sorted(self.acked) == sorted(self.expected)


@pytest.mark.parametrize("broker_kind", ["embedded", "bmqbrkr"])
def test_losing_the_address_in_use_fails_over_to_the_next_at_once(broker_kind, request):
    target = request.getfixturevalue("broker" if broker_kind == "embedded" else "bmqbrkr").address
    uri = fresh_uri()
    with Proxy(target) as first, Proxy(target) as second:
        options = bmq.SessionOptions(reconnect=NO_QUICK_RETRY)
        with bmq.Session([first.address, second.address], options) as session:
            queue = session.open_queue(uri, write=True)
            posters = _Posters(queue, threads=4, per_thread=250)
            posters.wait_acked(200)
            lost_at = time.monotonic()
            first.close()  # the proxy in use dies: its connections and its listener
            seen = wait_event(session, events.StateRestored, timeout=10.0)
            restored_in = time.monotonic() - lost_at
            posters.join()
            reconnected = next(e for e in seen if isinstance(e, events.Reconnected))
            assert reconnected.address == second.address and session.broker == second.address
            assert session.stats().broker == second.address
            assert restored_in < 10.0  # the policy's first delay is 30 s
    # Every acknowledged message is stored once: re-sent PUTs kept their GUIDs.
    assert sorted(_drain(target, uri, len(posters.expected))) == sorted(posters.expected)


def _drain(address: str, uri: str, count: int, quiet: float = 0.3) -> List[bytes]:
    """Every message one consumer gets (confirming each) until ``count`` came and then none for
    ``quiet`` seconds (a duplicate would come meanwhile)."""
    with bmq.Session(address) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=10_000))
        received = [m for m in drain(queue, count, timeout=20.0)]
        extra = queue.get(timeout=quiet)
        while extra is not None:
            received.append(extra)
            extra = queue.get(timeout=quiet)
        session.confirm_many(received)
        return [m.data for m in received]


def test_giving_up_names_every_address_once_all_failed_each_attempt(broker):
    with Proxy(broker.address) as first, Proxy(broker.address) as second:
        policy = bmq.ReconnectPolicy(initial_delay=0.01, max_delay=0.05, max_attempts=2)
        session = bmq.Session([first.address, second.address], bmq.SessionOptions(reconnect=policy))
        try:
            second.close()  # not in use: the session does not notice
            first.close()
            seen = wait_event(session, events.Disconnected, timeout=20.0)
            error = next(e for e in seen if isinstance(e, events.Error))
            assert first.address in error.message and second.address in error.message
            assert not session.is_running
        finally:
            session.stop()
