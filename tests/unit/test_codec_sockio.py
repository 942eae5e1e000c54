"""send_now / recv_now: the transport's socket calls that keep the interpreter lock.

They must never wait, say exactly how much moved, and turn a broken connection into OSError
(never a signal, never a silent loss)."""
import socket

import pytest

from bmq import _codec


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_send_now_writes_everything_that_fits(pair):
    a, b = pair
    assert _codec.send_now(a.fileno(), b"hello") == 5
    assert _codec.send_now(a.fileno(), memoryview(b"world")) == 5
    assert b.recv(16) == b"helloworld"


def test_send_now_returns_zero_when_the_socket_is_full_instead_of_waiting(pair):
    a, b = pair
    chunk = b"x" * 65536
    total = 0
    while True:
        sent = _codec.send_now(a.fileno(), chunk)
        if sent == 0:
            break
        total += sent
    # Large writes (above 64 KiB the lock is released) report a partial count the same way.
    assert _codec.send_now(a.fileno(), b"y" * 200_000) == 0
    received = 0
    b.setblocking(False)
    while received < total:
        received += len(b.recv(1 << 20))
    assert received == total


def test_send_now_on_a_closed_peer_raises_oserror_not_sigpipe(pair):
    a, b = pair
    b.close()
    with pytest.raises(OSError):
        for _ in range(3):  # the first write may still be accepted before the reset is seen
            _codec.send_now(a.fileno(), b"data")


def test_send_now_on_a_bad_descriptor_raises_oserror():
    with pytest.raises(OSError):
        _codec.send_now(-1, b"data")


def test_recv_now_reads_what_is_there_and_never_waits(pair):
    a, b = pair
    buffer = bytearray(8)
    assert _codec.recv_now(b.fileno(), buffer) == -1  # nothing yet: no wait
    a.sendall(b"abcdefghij")
    assert _codec.recv_now(b.fileno(), buffer) == 8
    assert buffer == b"abcdefgh"
    assert _codec.recv_now(b.fileno(), memoryview(buffer)[2:]) == 2
    assert buffer == b"abijefgh"


def test_recv_now_says_zero_at_the_end_of_the_stream(pair):
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    assert _codec.recv_now(b.fileno(), bytearray(4)) == 0


def test_recv_now_refuses_a_read_only_buffer(pair):
    _, b = pair
    with pytest.raises((BufferError, TypeError)):
        _codec.recv_now(b.fileno(), b"immutable")
