"""A peer that is not a BlazingMQ broker (an HTTP server, a TLS endpoint to a plaintext
client, random bytes) is named as such, with what it sent, at once (well within
``connect_timeout``), rather than as a framing error or a negotiation timeout (issue 37)."""
from __future__ import annotations

import random
import socket
import ssl
import threading
import time
from typing import Iterator, Optional

import pytest

import bmq
from bmq import _codec, _schema
from bmq._protocol import check_first_answer
from bmq.broker import Broker, tls_server_context

HTTP_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x46"  # TLS 1.2 record: fatal alert, protocol_version
CONNECT_TIMEOUT = 30.0  # the bound the error must come well within
PROMPTLY = 15.0  # on a loaded machine; a timeout would take CONNECT_TIMEOUT


class AnsweringServer:
    """A server on 127.0.0.1 that reads what a client sends first and answers ``answer`` (inside
    TLS when given ``tls``), then waits for the client to close: not a BlazingMQ broker."""

    def __init__(self, answer: bytes, tls: Optional[ssl.SSLContext] = None) -> None:
        self.answer, self.tls = answer, tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, name="not-a-broker", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                try:
                    if self.tls is not None:
                        conn = self.tls.wrap_socket(conn, server_side=True)
                    conn.recv(4096)
                    conn.sendall(self.answer)
                    while conn.recv(4096):  # until the client closes
                        pass
                except OSError:  # what the client's ending does to this end: expected
                    pass

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (closing alone does not)
        self._listener.close()
        self._thread.join(10)


@pytest.fixture
def http_server() -> Iterator[AnsweringServer]:
    server = AnsweringServer(HTTP_ANSWER)
    yield server
    server.close()


def connect_error(address: str, admin: bool = False) -> BaseException:
    started = time.monotonic()
    with pytest.raises(bmq.Error) as caught:
        if admin:
            bmq.Admin(address, timeout=CONNECT_TIMEOUT)
        else:
            bmq.Session(address, bmq.SessionOptions(connect_timeout=CONNECT_TIMEOUT))
    assert time.monotonic() - started < PROMPTLY
    return caught.value


@pytest.mark.parametrize("admin", [False, True], ids=["session", "admin"])
def test_an_http_server_is_not_a_blazingmq_broker(http_server, admin):
    error = connect_error(http_server.address, admin)
    assert isinstance(error, bmq.ProtocolError)
    assert "not a BlazingMQ broker" in str(error) and "HTTP/1.1 400 Bad Request" in str(error)
    assert http_server.address.split("//")[1] in str(error)


def test_random_bytes_are_not_a_blazingmq_broker():
    answer = random.Random(37).randbytes(200)
    server = AnsweringServer(answer)
    try:
        error = connect_error(server.address)
    finally:
        server.close()
    assert isinstance(error, bmq.ProtocolError) and "not a BlazingMQ broker" in str(error)
    assert repr(answer[:16])[2:-1] in str(error)  # what came back, printably (an excerpt of 64 bytes)
    assert str(error).count("...") == 1


def test_a_tls_alert_to_a_plaintext_client_is_named():
    server = AnsweringServer(TLS_ALERT)
    try:
        error = connect_error(server.address)
    finally:
        server.close()
    assert isinstance(error, bmq.TLSError), repr(error)
    assert "not a BlazingMQ broker speaking plaintext" in str(error) and repr(TLS_ALERT) in str(error)
    assert "SessionOptions(tls=...)" in str(error)


@pytest.mark.parametrize("server", ["embedded broker", "ssl module"])
def test_a_tls_endpoint_closing_on_a_plaintext_client_says_tls(certificates, server):
    # These close without an alert (OpenSSL sends none for a record it cannot parse): nothing
    # came back to show, and the error says what to try.
    context = tls_server_context(certificates["server"], certificates["server.key"])
    if server == "embedded broker":
        with Broker(tls=context) as broker:
            error = connect_error(broker.address)
    else:
        tls_server = AnsweringServer(b"never sent", tls=context)
        try:
            error = connect_error(tls_server.address)
        finally:
            tls_server.close()
    assert isinstance(error, bmq.ConnectionError), repr(error)
    assert "SessionOptions(tls=...)" in str(error), str(error)


def test_an_https_server_reached_with_tls_is_not_a_blazingmq_broker(certificates):
    server = AnsweringServer(HTTP_ANSWER, tls=tls_server_context(certificates["server"], certificates["server.key"]))
    started = time.monotonic()
    try:
        with pytest.raises(bmq.ProtocolError) as caught:
            bmq.Session(server.address, bmq.SessionOptions(connect_timeout=CONNECT_TIMEOUT,
                                                           tls=bmq.tls_context(certificates["ca"])))
    finally:
        server.close()
    assert time.monotonic() - started < PROMPTLY
    assert "not a BlazingMQ broker" in str(caught.value) and "HTTP/1.1 400 Bad Request" in str(caught.value)


def test_a_brokers_first_answer_passes_the_check():
    negotiation = _schema.encode_event({"brokerResponse": {"result": {"category": "E_SUCCESS"}}}, 1, "negotiation")
    check_first_answer(negotiation, "broker:1")
    check_first_answer(_codec.HEARTBEAT_RSP, "broker:1")
    for cut in range(1, len(negotiation)):  # a first read may hold only part of the header
        check_first_answer(negotiation[:cut], "broker:1")
