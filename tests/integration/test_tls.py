"""TLS to the broker, on both brokers: the embedded broker's own TLS (``Broker(tls=...)``) and
the real bmqbrkr behind a real TLS terminator (stunnel4), as deployments run it today.

Every API path round-trips over TLS; a client certificate is presented where one is required;
BASIC authentication runs inside TLS; the session survives connection cuts on the TLS side
(every reconnect handshakes again) with nothing lost; and each way TLS can go wrong is a clear
``bmq`` error within ``connect_timeout``. Certificates are made by the tests (tests/tlsutil.py).
"""
from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional

import pytest

import bmq
from bmq import events
from bmq.broker import Broker, tls_server_context
from proxy import Proxy
from realbroker import etc_with
from support import drain, fresh_uri, ha_options, wait_event

SECRET = "password1"
AUTHENTICATION = {
    "authenticators": [{"name": "BasicAuthenticator", "settings": [{"key": "user1", "value": {"stringVal": SECRET}}]}],
    "anonymousCredential": {"disallow": {}},
}
TIMEOUTS = dict(connect_timeout=5.0, open_queue_timeout=10.0)


class Endpoint(NamedTuple):
    """A TLS address (``address``) and the plaintext address of the broker behind it."""

    address: str
    plaintext: str


def _endpoint(request: pytest.FixtureRequest, certificates: Dict[str, Path], *, client_ca: Optional[Path] = None,
              authentication: bool = False) -> Iterator[Endpoint]:
    if request.param == "embedded":
        kwargs = dict(authenticators={"BASIC": {"user1": SECRET}}, allow_anonymous=False) if authentication else {}
        with Broker(**kwargs) as plain, Broker(tls=tls_server_context(
                certificates["server"], certificates["server.key"], client_ca_file=client_ca), **kwargs) as broker:
            # The plaintext broker is another one: only what it is (not its data) is used.
            yield Endpoint(broker.address, plain.address)
        return
    if authentication:
        home, tmp_path = request.getfixturevalue("bmqbrkr_home"), request.getfixturevalue("tmp_path")
        real = request.getfixturevalue("make_bmqbrkr")(etc=etc_with(home, tmp_path / "etc", AUTHENTICATION))
    else:
        real = request.getfixturevalue("bmqbrkr")
    terminator = request.getfixturevalue("make_stunnel")(real.address, certificates["server"],
                                                        certificates["server.key"], client_ca)
    yield Endpoint(terminator.address, real.address)


@pytest.fixture(params=["embedded", "bmqbrkr"])
def tls_broker(request: pytest.FixtureRequest, certificates: Dict[str, Path]) -> Iterator[Endpoint]:
    """A TLS endpoint: the embedded broker's own, or stunnel in front of the run's bmqbrkr."""
    yield from _endpoint(request, certificates)


@pytest.fixture(params=["embedded", "bmqbrkr"])
def mutual_tls_broker(request: pytest.FixtureRequest, certificates: Dict[str, Path]) -> Iterator[Endpoint]:
    """A TLS endpoint that requires a client certificate from ``ca.pem``."""
    yield from _endpoint(request, certificates, client_ca=certificates["ca"])


@pytest.fixture(params=["embedded", "bmqbrkr"])
def secured_tls_broker(request: pytest.FixtureRequest, certificates: Dict[str, Path]) -> Iterator[Endpoint]:
    """A TLS endpoint of a broker that requires BASIC authentication."""
    yield from _endpoint(request, certificates, authentication=True)


def _options(certificates: Dict[str, Path], **kwargs) -> bmq.SessionOptions:
    kwargs.setdefault("tls", bmq.tls_context(certificates["ca"]))
    return bmq.SessionOptions(**{**TIMEOUTS, **kwargs})


def test_every_api_path_round_trips_over_tls(tls_broker, certificates):
    with bmq.Session(tls_broker.address, _options(certificates)) as session:
        uri = fresh_uri(prefix="tls")
        queue = session.open_queue(uri, read=True, write=True)
        assert queue.post(b"one", properties={"n": 1}).status is bmq.AckStatus.SUCCESS
        assert queue.post_async(b"two").result(10).status is bmq.AckStatus.SUCCESS
        acks = queue.post_many([b"big" * 30_000, b"four"], compression="zlib")  # records of 16 KiB and more
        assert [a.status for a in acks] == [bmq.AckStatus.SUCCESS] * 2
        session.post_async(uri, b"five")
        got = drain(queue, 5)
        assert sorted(m.data for m in got) == sorted([b"one", b"two", b"big" * 30_000, b"four", b"five"])
        assert next(m for m in got if m.data == b"one").properties == {"n": 1}
        session.confirm_many(got)

        batches = session.open_queue(fresh_uri(prefix="tls-batch"), read=True, write=True, batches=True)
        batches.post_many([b"row %d" % i for i in range(2000)])
        rows: List[bytes] = []
        deadline = time.monotonic() + 20
        while len(rows) < 2000 and time.monotonic() < deadline:
            batch = batches.get_batch(max_messages=5000, timeout=5)
            rows += [batch.payload(i) for i in range(len(batch))]
            batch.confirm()
        assert sorted(rows) == sorted(b"row %d" % i for i in range(2000))

        received = threading.Event()
        seen: List[bytes] = []

        def on_message(message: bmq.Message) -> None:
            seen.append(message.data)
            message.confirm()
            received.set()

        pushed = session.open_queue(fresh_uri(prefix="tls-cb"), read=True, write=True, on_message=on_message)
        pushed.post(b"callback")
        assert received.wait(10) and seen == [b"callback"]
        stats = session.stats()
        assert stats.bytes_in > 0 and stats.bytes_out > 0


def test_a_client_certificate_is_presented_where_one_is_required(mutual_tls_broker, certificates):
    tls = bmq.tls_context(certificates["ca"], cert_file=certificates["client"], key_file=certificates["client.key"])
    with bmq.Session(mutual_tls_broker.address, _options(certificates, tls=tls)) as session:
        queue = session.open_queue(fresh_uri(prefix="mtls"), read=True, write=True)
        assert queue.post(b"mutual").status is bmq.AckStatus.SUCCESS
        assert drain(queue, 1)[0].data == b"mutual"


@pytest.mark.parametrize("client", [None, "stranger"])
def test_a_missing_or_refused_client_certificate_is_a_tls_error(mutual_tls_broker, certificates, client):
    tls = bmq.tls_context(certificates["ca"], cert_file=certificates.get(client or ""),
                          key_file=certificates.get(f"{client}.key"))
    started = time.monotonic()
    # With TLS 1.3 the server judges the client's certificate after the client's handshake is
    # over: the client learns it from the alert (a TLSError naming it), or, when the server's
    # reset beat the alert, from the connection closing during negotiation (a ClosedByBroker
    # that says a refused certificate does this).
    with pytest.raises(bmq.ConnectionError) as caught:
        bmq.Session(mutual_tls_broker.address, _options(certificates, tls=tls))
    assert time.monotonic() - started < TIMEOUTS["connect_timeout"] + 2
    assert isinstance(caught.value, (bmq.TLSError, bmq.ClosedByBroker)) and "certificate" in str(caught.value)


def test_basic_authentication_inside_tls(secured_tls_broker, certificates):
    options = _options(certificates, credential=("BASIC", f"user1:{SECRET}"))
    with bmq.Session(secured_tls_broker.address, options) as session:
        queue = session.open_queue(fresh_uri(prefix="tls-authn"), read=True, write=True)
        assert queue.post(b"secret stuff").status is bmq.AckStatus.SUCCESS
        assert drain(queue, 1)[0].data == b"secret stuff"
    # AuthenticationError where the refusal arrives; bmqbrkr resets the connection after it, and
    # stunnel then loses it: the client is told the broker closed in answer to its credential.
    with pytest.raises(bmq.ClosedByBroker, match="BASIC authentication"):
        bmq.Session(secured_tls_broker.address, _options(certificates, credential=("BASIC", "user1:wrong")))


@pytest.mark.parametrize("ca, server_name, reason", [
    ("other-ca", None, "unable to get local issuer certificate"),
    ("ca", "wrong-host", "mismatch, certificate is not valid for '127.0.0.1'"),
    ("ca", "expired", "certificate has expired"),
])
def test_a_certificate_that_does_not_verify_is_named(certificates, ca, server_name, reason):
    server = server_name or "server"
    with Broker(tls=tls_server_context(certificates[server], certificates[f"{server}.key"])) as broker:
        with pytest.raises(bmq.TLSError, match="certificate verification failed") as caught:
            bmq.Session(broker.address, _options(certificates, tls=bmq.tls_context(certificates[ca])))
        assert reason in str(caught.value)


def test_tls_to_a_plaintext_broker_fails_within_the_connect_timeout(tls_broker, certificates):
    started = time.monotonic()
    # A plaintext broker waits for the rest of what it takes for an event: no answer comes.
    with pytest.raises((bmq.TLSError, bmq.TimeoutError)) as caught:
        bmq.Session(tls_broker.plaintext, _options(certificates, connect_timeout=2.0))
    assert time.monotonic() - started < 2.0 + 2
    assert "TLS" in str(caught.value)


def test_plaintext_to_a_tls_endpoint_says_so(tls_broker, certificates):
    started = time.monotonic()
    with pytest.raises(bmq.ConnectionError) as caught:
        bmq.Session(tls_broker.address, _options(certificates, tls=None, connect_timeout=2.0))
    assert time.monotonic() - started < 2.0 + 2
    assert "TLS" in str(caught.value) or "tls=" in str(caught.value)


def test_ha_over_tls_every_reconnect_handshakes_again_and_nothing_is_lost(tls_broker, certificates):
    uri = fresh_uri(prefix="tls-ha")
    with Proxy(tls_broker.address) as proxy:
        options = ha_options(**TIMEOUTS, tls=bmq.tls_context(certificates["ca"]))
        # The certificate names 127.0.0.1, and the proxy is on 127.0.0.1 too.
        with bmq.Session(proxy.address, options) as session:
            queue = session.open_queue(uri, write=True)
            acked: List[bytes] = []
            for cut in range(3):
                futures = [queue.post_async(b"m%d-%d" % (cut, i)) for i in range(300)]
                proxy.cut()
                wait_event(session, events.StateRestored, timeout=20.0)
                acks = [f.result(20) for f in futures]
                assert {a.status for a in acks} == {bmq.AckStatus.SUCCESS}
                acked += [b"m%d-%d" % (cut, i) for i in range(300)]
            assert session.stats().connections >= 4
    with bmq.Session(tls_broker.address, _options(certificates)) as reader:
        queue = reader.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=10_000))
        got = drain(queue, len(acked), timeout=20)
        extra = queue.get(timeout=0.3)
        assert extra is None, extra
        reader.confirm_many(got)
    assert sorted(m.data for m in got) == sorted(acked)


def test_a_server_context_is_refused_as_the_client_side(certificates):
    server = tls_server_context(certificates["server"], certificates["server.key"])
    with pytest.raises(bmq.InvalidArgumentError, match="client context"):
        bmq.SessionOptions(tls=server)
    with pytest.raises(TypeError):
        bmq.SessionOptions(tls="yes")


def test_tls_context_checks_its_files(certificates, tmp_path):
    with pytest.raises(bmq.InvalidArgumentError, match="CA certificates"):
        bmq.tls_context(tmp_path / "missing.pem")
    with pytest.raises(bmq.InvalidArgumentError, match="without cert_file"):
        bmq.tls_context(certificates["ca"], key_file=certificates["client.key"])
    with pytest.raises(bmq.InvalidArgumentError, match="TLS"):
        bmq.tls_context(certificates["ca"], minimum_version="TLSv1.1")
    context = bmq.tls_context(certificates["ca"])
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_admin_commands_over_tls(tls_broker, certificates):
    with bmq.Admin(tls_broker.address, tls=bmq.tls_context(certificates["ca"]), timeout=10) as admin:
        assert admin.help()  # the broker's command list came back through TLS
    with pytest.raises(bmq.ConnectionError):
        bmq.Admin(tls_broker.address, timeout=2)  # plaintext to a TLS endpoint
