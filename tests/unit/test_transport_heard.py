"""Transport.check_heard: while an answer is overdue, the connection asks the broker for a
heartbeat response, and fails once a broker that keeps sending its own heartbeats (so the
silence rule never fires) neither answers that request nor what was waiting."""
from __future__ import annotations

import socket
import threading
import time
from typing import List

import pytest

from bmq import _codec
from bmq._transport import Transport
from bmq.exceptions import ConnectionLost

pytestmark = pytest.mark.timeout(60)

INTERVAL = 0.05
MAX_MISSED = 10


class _Broker:
    """Sends a heartbeat request every half interval (the client always hears it); answers the
    client's heartbeat requests only while ``answering``; counts those it got."""

    def __init__(self, answering: bool) -> None:
        self.answering = answering
        self.requests = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        conn.settimeout(INTERVAL / 2)
        frames = _codec.FrameReader()
        with conn:
            while not self._stop.is_set():
                try:
                    conn.sendall(_codec.HEARTBEAT_REQ)
                    chunk = conn.recv(1 << 16)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                for event in frames.feed(chunk):
                    if _codec.unpack_event_header(event)[1] == _codec.EVENT_HEARTBEAT_REQ:
                        self.requests += 1
                        if self.answering:
                            conn.sendall(_codec.HEARTBEAT_RSP)

    def close(self) -> None:
        self._stop.set()
        self.server.close()


def _connected(broker: _Broker, failures: List[BaseException]) -> Transport:
    transport = Transport(broker.server.getsockname(), lambda event_type, events: None, failures.append, 1 << 20,
                          name="heard")
    transport.connect(5.0)
    transport.set_heartbeat(INTERVAL, MAX_MISSED)
    return transport


def _check_for(transport: Transport, seconds: float, oldest) -> None:
    """Call check_heard as the session's ACK timer does (every 10 ms here) for ``seconds``, or
    until the transport closes; ``oldest()`` gives the oldest wait at each call."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not transport.closed:
        transport.check_heard(oldest())
        threading.Event().wait(0.01)  # the timer's tick: time passing is the point


@pytest.mark.parametrize("answering", [False, True], ids=["deaf", "hearing"])
def test_an_overdue_answer_fails_only_a_connection_the_broker_does_not_hear(answering):
    broker = _Broker(answering)
    failures: List[BaseException] = []
    transport = _connected(broker, failures)
    try:
        waiting = time.monotonic()
        _check_for(transport, 60 * INTERVAL, lambda: waiting)
        assert broker.requests >= 1
        if answering:
            assert not transport.closed and not failures
        else:
            assert transport.closed
            assert len(failures) == 1 and isinstance(failures[0], ConnectionLost)
            assert "does not hear this connection" in str(failures[0])
    finally:
        transport.close()
        transport.join(5.0)
        broker.close()


def test_answers_that_keep_coming_are_proof_enough():
    """A busy broker that answers in order but not the heartbeat request in time: the oldest
    wait changes, so the connection stays."""
    broker = _Broker(answering=False)
    failures: List[BaseException] = []
    transport = _connected(broker, failures)
    try:
        start = time.monotonic()
        # The oldest wait is always a little over an interval old, and a newer one every tick.
        _check_for(transport, 60 * INTERVAL, lambda: max(start, time.monotonic() - 1.5 * INTERVAL))
        assert broker.requests >= 1
        assert not transport.closed and not failures
    finally:
        transport.close()
        transport.join(5.0)
        broker.close()


def test_nothing_waiting_sends_nothing():
    broker = _Broker(answering=False)
    failures: List[BaseException] = []
    transport = _connected(broker, failures)
    try:
        _check_for(transport, 10 * INTERVAL, lambda: 0.0)
        assert broker.requests == 0 and not transport.closed
    finally:
        transport.close()
        transport.join(5.0)
        broker.close()
