"""Authentication against both brokers configured alike: BASIC user1/password1, anonymous
clients disallowed (bmqbrkr: ``appConfig.authentication`` with a BasicAuthenticator and
``anonymousCredential: disallow``; embedded: ``Broker(authenticators=..., allow_anonymous=False)``)."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

import bmq
from bmq import events
from bmq.broker import Broker
from proxy import Proxy
from realbroker import RealBroker, etc_with
from support import fresh_uri, ha_options, wait_event

SECRET = "password1"
GOOD = ("BASIC", f"user1:{SECRET}")
AUTHENTICATION = {
    "authenticators": [{"name": "BasicAuthenticator", "settings": [{"key": "user1", "value": {"stringVal": SECRET}}]}],
    "anonymousCredential": {"disallow": {}},
}


@pytest.fixture(params=["embedded", "bmqbrkr"])
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """A broker that requires BASIC authentication."""
    if request.param == "embedded":
        with Broker(authenticators={"BASIC": {"user1": SECRET}}, allow_anonymous=False) as broker:
            yield broker
    else:
        home = request.getfixturevalue("bmqbrkr_home")
        make = request.getfixturevalue("make_bmqbrkr")
        yield make(etc=etc_with(home, tmp_path / "etc", AUTHENTICATION))


def _round_trip(session: bmq.Session) -> None:
    queue = session.open_queue(fresh_uri(prefix="authn"), read=True, write=True)
    assert queue.post(b"authenticated").status is bmq.AckStatus.SUCCESS
    message = queue.get(timeout=10.0)
    assert message is not None and message.data == b"authenticated"
    message.confirm()


def test_the_right_credential_posts_and_consumes(secured):
    with bmq.Session(secured.address, bmq.SessionOptions(credential=GOOD)) as session:
        _round_trip(session)


def test_a_wrong_password_is_a_clear_error_without_the_secret(secured):
    with pytest.raises(bmq.AuthenticationError) as caught:
        bmq.Session(secured.address, bmq.SessionOptions(credential=("BASIC", "user1:wrong-secret"), connect_timeout=10))
    error = caught.value
    assert (error.mechanism, error.category, error.code) == ("BASIC", "E_REFUSED", -11)
    assert "refused BASIC authentication" in str(error) and "Invalid username or password" in str(error)
    assert "wrong-secret" not in str(error) and "wrong-secret" not in repr(error)


def test_no_credential_is_a_clear_error(secured):
    with pytest.raises(bmq.ClosedByBroker, match=r"closed the connection during negotiation.*credential="):
        bmq.Session(secured.address, bmq.SessionOptions(connect_timeout=10))


def test_the_credential_never_reaches_logs_or_reprs(secured, caplog):
    caplog.set_level(logging.DEBUG, logger="bmq")
    options = bmq.SessionOptions(credential=GOOD)
    with bmq.Session(secured.address, options) as session:
        _round_trip(session)
        texts = [repr(options), str(options), repr(session)]
    with pytest.raises(bmq.AuthenticationError) as caught:
        bmq.Session(secured.address, bmq.SessionOptions(credential=("BASIC", "user1:other-secret")))
    texts += [str(caught.value), caplog.text]
    assert not [text for text in texts if SECRET in text or "other-secret" in text]


def test_a_reconnect_authenticates_again_with_a_fresh_credential(secured):
    calls: List[int] = []

    def rotating() -> tuple:
        calls.append(1)
        return GOOD

    with Proxy(secured.address) as proxy:
        with bmq.Session(proxy.address, ha_options(credential=rotating)) as session:
            queue = session.open_queue(fresh_uri(prefix="authn-reconnect"), write=True)
            assert queue.post(b"before").status is bmq.AckStatus.SUCCESS
            assert proxy.cut() == 1
            wait_event(session, events.StateRestored, timeout=30.0)
            assert queue.post(b"after").status is bmq.AckStatus.SUCCESS
    assert len(calls) >= 2 and proxy.connections >= 2


def test_the_real_broker_accepts_a_reauthentication_on_the_live_connection(make_bmqbrkr, bmqbrkr_home, tmp_path):
    # bmqbrkr gives BASIC credentials 10 minutes: renew one now instead of waiting for it.
    broker = make_bmqbrkr(etc=etc_with(bmqbrkr_home, tmp_path / "etc", AUTHENTICATION))
    with bmq.Session(broker.address, bmq.SessionOptions(credential=GOOD)) as session:
        connection = session._link.current
        assert connection is not None and connection.lifetime == 600.0
        connection._authenticate(GOOD, broker.address, deadline=time.monotonic() + 10)
        _round_trip(session)


def test_a_session_outlives_several_lifetimes_by_reauthenticating():
    renewals: List[int] = []
    lost = threading.Event()

    def on_event(event: events.SessionEvent) -> None:
        if isinstance(event, (events.ConnectionLost, events.AuthenticationFailed)):
            lost.set()

    def credential() -> tuple:
        renewals.append(1)
        return GOOD

    with Broker(authenticators={"BASIC": {"user1": SECRET}}, allow_anonymous=False) as broker:
        # 2 s: renewed every 1.8 s, 200 ms ahead (a 0.6 s lifetime left 60 ms, and CI's
        # free-threaded job, at nice 5 beside the main suite, once missed it).
        broker.faults.expire_authentication_after(2000)
        with bmq.Session(broker.address, bmq.SessionOptions(credential=credential, on_event=on_event)) as session:
            queue = session.open_queue(fresh_uri(prefix="authn-lifetimes"), write=True)
            # Two lifetimes: each would end the connection unless renewed.
            assert not lost.wait(4.0)
            assert queue.post(b"still here").status is bmq.AckStatus.SUCCESS
    assert len(renewals) >= 3  # the first authentication, then a renewal each lifetime


def test_a_refused_reauthentication_is_an_event_and_the_session_reconnects():
    with Broker(authenticators={"BASIC": {"user1": SECRET}}, allow_anonymous=False) as broker:
        broker.faults.expire_authentication_after(600)
        with bmq.Session(broker.address, ha_options(credential=GOOD)) as session:
            queue = session.open_queue(fresh_uri(prefix="authn-refused"), write=True)
            broker.faults.refuse_authentication(1)
            seen = wait_event(session, events.StateRestored, timeout=30.0)
            kinds = [type(event) for event in seen]
            assert events.AuthenticationFailed in kinds and events.ConnectionLost in kinds
            refused = next(e for e in seen if isinstance(e, events.AuthenticationFailed))
            assert "BASIC" in refused.message and SECRET not in refused.message
            assert queue.post(b"after").status is bmq.AckStatus.SUCCESS


_OFFICIAL = """
import sys
import blazingmq
try:
    session = blazingmq.Session(lambda event: None, broker=sys.argv[1],
                                timeout=blazingmq.Timeouts(connect_timeout=5.0))
except Exception as exc:
    print("refused", type(exc).__name__)
else:
    session.stop()
    print("accepted")
"""


@pytest.mark.interop
def test_the_official_sdk_without_a_credential_is_refused_then_accepted_when_anonymous_is_allowed(
        secured, request, bmqbrkr_home, tmp_path):
    pytest.importorskip("blazingmq", reason="the official blazingmq SDK is not installed")

    def official(address: str) -> str:
        result = subprocess.run([sys.executable, "-c", _OFFICIAL, address], capture_output=True, text=True,
                                timeout=120)
        return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else f"crashed: {result.returncode}"

    assert official(secured.address).startswith("refused")
    if isinstance(secured, RealBroker):
        allowing = request.getfixturevalue("make_bmqbrkr")(etc=etc_with(
            bmqbrkr_home, tmp_path / "etc-anonymous", {"authenticators": AUTHENTICATION["authenticators"]}))
        assert official(allowing.address) == "accepted"
    else:
        with Broker(authenticators={"BASIC": {"user1": SECRET}}) as allowing:
            assert official(allowing.address) == "accepted"


def test_a_slow_authentication_answer_is_a_timeout_not_a_hang():
    with Broker(authenticators={"BASIC": {"user1": SECRET}}, allow_anonymous=False) as broker:
        broker.faults.delay_authentication(5.0)
        with pytest.raises(bmq.TimeoutError, match="no response .* to BASIC authentication in time"):
            bmq.Session(broker.address, bmq.SessionOptions(credential=GOOD, connect_timeout=0.5))
