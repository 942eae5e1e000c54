"""Latch / wait_readable: how the reader thread wakes blocking posters.

A latch is set once and stays set; waiting releases the interpreter lock, honours its timeout
and lets signal handlers run. wait_readable sets the latches it is given (emptying the list)
and reports whether the socket has something to read."""
import os
import select
import signal
import socket
import threading
import time
from typing import List

import pytest

from bmq import _codec
from support import Interrupted, sigusr1_raises, until as _until


def test_a_latch_waits_out_its_timeout_until_set_then_stays_set():
    latch = _codec.Latch()
    assert not latch.is_set()
    assert latch.wait(0.01) is False
    assert latch.wait(0) is False and latch.wait(-1) is False
    latch.set()
    assert latch.is_set() and latch.wait(0) is True
    latch.set()  # setting twice is harmless
    assert latch.wait(5) is True


def test_a_latch_set_from_another_thread_wakes_its_waiter():
    latch = _codec.Latch()
    started = threading.Event()
    results = []

    def waiter() -> None:
        started.set()
        results.append(latch.wait(30))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(5)
    latch.set()
    thread.join(10)
    assert results == [True]


def test_a_signal_handler_ends_a_wait_in_the_main_thread():
    with sigusr1_raises():
        sender = threading.Thread(target=signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGUSR1))
        with pytest.raises(Interrupted):
            sender.start()
            _codec.Latch().wait(60)
        sender.join(5)


def test_wait_readable_sets_and_removes_the_latches_and_reports_readability():
    a, b = socket.socketpair()
    try:
        latches = [_codec.Latch(), _codec.Latch()]
        woken = list(latches)
        assert _codec.wait_readable(a.fileno(), 0.01, woken) is False  # nothing to read
        assert woken == [] and all(latch.is_set() for latch in latches)
        b.send(b"x")
        assert _codec.wait_readable(a.fileno(), 10, []) is True
        assert a.recv(1) == b"x"
        b.close()
        assert _codec.wait_readable(a.fileno(), 10, []) is True  # the end of the stream is readable
    finally:
        a.close()
        b.close()


def test_wait_readable_refuses_what_is_not_a_latch():
    a, b = socket.socketpair()
    try:
        latch = _codec.Latch()
        with pytest.raises(TypeError):
            _codec.wait_readable(a.fileno(), 0, [latch, object()])
        assert not latch.is_set()
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not (hasattr(select, "epoll") and hasattr(os, "eventfd")), reason="epoll and eventfd: Linux")
def test_wait_ready_reports_the_socket_and_kicks_and_never_takes_a_kick_it_wrote():
    a, b = socket.socketpair()
    epoll = select.epoll()
    kick = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        epoll.register(a.fileno(), select.EPOLLIN | select.EPOLLET)
        epoll.register(kick, select.EPOLLIN | select.EPOLLET)
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 0.01, []) == 0
        b.send(b"x")
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 10, []) == _codec.READY_SOCKET
        latch = _codec.Latch()
        assert latch.kick_to(kick) is False
        woken = [latch]
        # Setting a latch that kicks returns at once, leaving the kick for its waiter.
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 60, woken) == _codec.READY_HANDED
        assert latch.is_set() and woken == []
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 10, []) == _codec.READY_KICKED
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 0.01, []) == 0  # the kick was drained
        assert latch.kick_to(-1) is True  # set already
        other = _codec.Latch()
        woken = [other]
        _codec.set_latches(woken)
        assert other.is_set() and woken == []
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 0.01, []) == 0  # it kicked nobody
    finally:
        epoll.close()
        os.close(kick)
        a.close()
        b.close()


@pytest.mark.skipif(not hasattr(select, "epoll"), reason="epoll: Linux")
def test_wait_ready_polls_for_its_spin_then_sleeps_until_its_timeout():
    a, b = socket.socketpair()
    epoll = select.epoll()
    try:
        epoll.register(a.fileno(), select.EPOLLIN | select.EPOLLET)
        b.send(b"x")
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 10, [], 5.0) == _codec.READY_SOCKET | _codec.READY_SPUN
        # Nothing comes: the spin is part of the timeout, which is waited out whole.
        started = time.monotonic()
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 0.05, [], 0.01) == 0
        assert 0.049 <= time.monotonic() - started < 5.0
        # A spin longer than the timeout ends with it.
        started = time.monotonic()
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 0.02, [], 30.0) == 0
        assert time.monotonic() - started < 5.0
        # Data that comes after the spin wakes the sleeping thread, not counted as caught polling.
        timer = threading.Timer(0.5, b.send, (b"y",))
        timer.start()
        assert _codec.wait_ready(epoll.fileno(), a.fileno(), 30.0, [], 0.001) == _codec.READY_SOCKET
        timer.join()
        # Setting latches still comes first: one whose kick was written returns at once.
        kick = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            latch = _codec.Latch()
            latch.kick_to(kick)
            assert _codec.wait_ready(epoll.fileno(), a.fileno(), 10, [latch], 5.0) == _codec.READY_HANDED
        finally:
            os.close(kick)
    finally:
        epoll.close()
        a.close()
        b.close()


def test_a_lead_is_held_by_one_thread_and_waiting_for_it_to_be_free_does_not_take_it():
    lead = _codec.Lead()
    assert not lead.locked() and lead.wait_free(0) is True
    assert lead.acquire() is True and lead.locked()
    assert lead.acquire() is False and lead.acquire(0.01) is False  # held: not again
    assert lead.wait_free(0.01) is False
    freed = threading.Event()
    results = []

    def waiter() -> None:
        freed.set()
        results.append(lead.wait_free(30.0))
        # Free, and still not taken by this wait: the next taker gets it at once.
        results.append(lead.acquire())

    thread = threading.Thread(target=waiter)
    thread.start()
    assert freed.wait(10)
    lead.release()  # from another thread than the one that will take it next
    thread.join(30)
    assert results == [True, True] and lead.locked()
    taker = threading.Thread(target=lambda: results.append(lead.acquire(30.0)))
    taker.start()
    lead.release()  # wakes the thread waiting to take it
    taker.join(30)
    assert results[-1] is True and lead.locked()
    lead.release()
    assert not lead.locked()


@pytest.mark.skipif(not (hasattr(select, "epoll") and hasattr(os, "eventfd")), reason="epoll and eventfd: Linux")
def test_the_reader_waits_through_lead_releases_until_data_and_a_taker_kicks_it_back_to_the_lead():
    a, b = socket.socketpair()
    epoll = select.epoll()
    kick = os.eventfd(0, os.EFD_NONBLOCK)
    lead = _codec.Lead()
    try:
        epoll.register(a.fileno(), select.EPOLLIN | select.EPOLLET)
        epoll.register(kick, select.EPOLLIN | select.EPOLLET)
        assert lead.acquire()
        assert _codec.wait_lead_then_ready(lead, epoll.fileno(), a.fileno(), 0.05) == 0  # held all along
        b.send(b"the holder's answer")  # arrives while the lead is held: not the reader's
        got: List[int] = []
        reader = threading.Thread(target=lambda: got.append(
            _codec.wait_lead_then_ready(lead, epoll.fileno(), a.fileno(), 30.0)))
        reader.start()
        a.recv(100)  # the holder reads its answer
        lead.release()  # and leaves nothing: the reader goes on waiting, in its set
        assert _until(lead.reader_waiting, 10)
        assert lead.acquire()  # a poster takes the lead: out of its set, and kicked
        os.eventfd_write(kick, 1)
        assert _until(lambda: not lead.reader_waiting(), 10)
        b.send(b"left unread")  # the holder leaves data behind: the reader reads it once free
        lead.release()
        reader.join(10)
        assert got == [_codec.READY_SOCKET]
    finally:
        epoll.close()
        os.close(kick)
        a.close()
        b.close()
