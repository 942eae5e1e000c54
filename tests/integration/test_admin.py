"""bmq.Admin: admin commands against the embedded broker and bmqbrkr (tests taking ``session``
or ``broker_address`` run against both and must observe the same), and its failures."""
from __future__ import annotations

import itertools
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

import bmq
from bmq.broker import Broker
from realbroker import free_port

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()


def fresh(domain: str) -> str:
    """A queue URI no other test (or earlier run on the same bmqbrkr) used."""
    return f"bmq://{domain}/admin-{uuid.uuid4().hex[:8]}-{next(_names)}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests taking only ``admin`` run against both brokers too (conftest.py does it for
    ``session`` and ``broker_address``)."""
    arguments = metafunc.fixturenames
    if "admin" in arguments and not {"session", "broker_address", "broker"} & set(metafunc.function.__code__.co_varnames):
        metafunc.parametrize("broker_kind", ("embedded", "bmqbrkr"), indirect=True)


@pytest.fixture
def admin(broker_address: str) -> Iterator[bmq.Admin]:
    with bmq.Admin(broker_address, timeout=10.0) as connection:
        yield connection


def post(session: bmq.Session, uri: str, payloads) -> None:
    queue = session.open_queue(uri, write=True)
    for payload in payloads:
        queue.post(payload)
    queue.close()


def test_raw_command_and_help(admin):
    text = admin.command("HELP")
    assert "DOMAINS DOMAIN <name> QUEUE" in text and "STAT SHOW" in text
    commands = admin.help()
    assert "HELP" in commands and "STAT SHOW" in commands
    assert any(c.startswith("DOMAINS DOMAIN <name> QUEUE <queue") and c.endswith("PURGE <appId>") for c in commands)
    # Words are case-insensitive; an explicit encoding is passed through as it is.
    assert admin.command("ENCODING JSON_PRETTY help").lstrip().startswith("{")


def test_lists_domains_and_queues(session, admin):
    uri = fresh("bmq.test.mem.priority")
    other = fresh("bmq.test.persistent.fanout")
    post(session, uri, [b"a"])
    post(session, other, [b"b"])
    assert {"bmq.test.mem.priority", "bmq.test.persistent.fanout"} <= set(admin.domains())
    assert uri in admin.queues("bmq.test.mem.priority")
    assert other not in admin.queues("bmq.test.mem.priority")
    assert {uri, other} <= set(admin.queues())
    info = admin.domain_info("bmq.test.mem.priority")
    assert info.name == "bmq.test.mem.priority" and uri in info.queues
    assert info.messages >= 1 and info.bytes >= 1
    assert admin.stats()["domains"]["bmq.test.persistent.fanout"][other]["values"]


def test_queue_stats_after_posting(session, admin):
    uri = fresh("bmq.test.mem.priority")
    payloads = [b"x" * (10 + i) for i in range(7)]
    post(session, uri, payloads)
    stats = admin.queue_stats(uri)
    assert (stats.uri, stats.messages, stats.bytes) == (uri, 7, sum(map(len, payloads)))
    assert stats.apps["__default"].messages == 7 and stats.consumers == 0


def test_fanout_queue_stats_per_app_and_consumers(session, admin):
    uri = fresh("bmq.test.mem.fanout")
    post(session, uri, [b"one", b"two", b"three"])
    reader = session.open_queue(uri + "?id=foo", read=True)  # returns once the broker configured it
    assert reader.get(timeout=10.0) is not None  # delivered, not confirmed: still held
    stats = admin.queue_stats(uri)
    assert stats.messages == 3 and stats.consumers == 1
    assert {app: s.messages for app, s in stats.apps.items()} == {"foo": 3, "bar": 3, "baz": 3}
    assert {app: s.consumers for app, s in stats.apps.items()} == {"foo": 1, "bar": 0, "baz": 0}


def test_purge_queue_then_a_consumer_receives_nothing(session, admin, broker_address):
    uri = fresh("bmq.test.mem.priority")
    post(session, uri, [b"m%d" % i for i in range(5)])
    purged = admin.purge(uri)
    assert (purged.uri, purged.app_id, purged.messages, purged.bytes) == (uri, None, 5, 10)
    assert admin.queue_stats(uri).messages == 0
    reader = session.open_queue(uri, read=True)
    assert reader.get(timeout=0.5) is None
    # The queue still works: a message posted after the purge arrives.
    with bmq.Session(broker_address) as producer:
        post(producer, uri, [b"after"])
    message = reader.get(timeout=10.0)
    assert message is not None and message.data == b"after"
    message.confirm()


def test_purge_one_app_id_of_a_fanout_queue(session, admin):
    uri = fresh("bmq.test.mem.fanout")
    post(session, uri, [b"one", b"two"])
    purged = admin.purge(uri + "?id=foo")
    assert (purged.app_id, purged.messages, purged.bytes) == ("foo", 2, 6)
    stats = admin.queue_stats(uri)
    assert {app: s.messages for app, s in stats.apps.items()} == {"foo": 0, "bar": 2, "baz": 2}
    foo = session.open_queue(uri + "?id=foo", read=True)
    bar = session.open_queue(uri + "?id=bar", read=True)
    assert foo.get(timeout=0.5) is None
    got = [bar.get(timeout=10.0), bar.get(timeout=10.0)]
    assert sorted(m.data for m in got if m is not None) == [b"one", b"two"]
    for m in got:
        m.confirm()
    assert admin.purge(uri, app_id="baz").messages == 2


def test_purge_while_delivered_drops_unconfirmed_messages(session, admin):
    uri = fresh("bmq.test.mem.priority")
    post(session, uri, [b"held"])
    reader = session.open_queue(uri, read=True)
    message = reader.get(timeout=10.0)
    assert message is not None
    assert admin.purge(uri).messages == 1
    message.confirm()  # the broker ignores the confirm of a purged message
    assert admin.queue_stats(uri).messages == 0
    reader.close()
    again = session.open_queue(uri, read=True)
    assert again.get(timeout=0.5) is None


def test_errors_are_admin_command_errors_with_the_brokers_reason(admin, broker_kind):
    with pytest.raises(bmq.AdminCommandError) as caught:
        admin.command("NO SUCH COMMAND")
    assert caught.value.command == "NO SUCH COMMAND" and caught.value.broker_message
    assert isinstance(caught.value, bmq.BrokerError) and isinstance(caught.value, bmq.Error)
    with pytest.raises(bmq.AdminCommandError, match="no.such.domain"):
        admin.domain_info("no.such.domain")
    with pytest.raises(bmq.AdminCommandError, match="never-opened"):
        admin.queue_stats("bmq://bmq.test.mem.priority/never-opened")
    with pytest.raises(bmq.InvalidArgumentError):
        admin.domain_info("two words")
    with pytest.raises(bmq.InvalidURIError):
        admin.purge("not a uri")


def test_purge_of_an_unknown_app_id_raises(session, admin):
    uri = fresh("bmq.test.mem.fanout")
    post(session, uri, [b"x"])
    with pytest.raises(bmq.AdminCommandError, match="nosuchapp"):
        admin.purge(uri + "?id=nosuchapp")
    assert admin.queue_stats(uri).messages == 1


def test_commands_from_several_threads_get_their_own_answers(session, admin):
    uris = [fresh("bmq.test.mem.priority") for _ in range(4)]
    for n, uri in enumerate(uris, 1):
        post(session, uri, [b"p"] * n)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda uri: admin.queue_stats(uri), uris * 5))
    assert [r.messages for r in results] == [1, 2, 3, 4] * 5
    assert [r.uri for r in results] == uris * 5


def test_closed_admin_refuses_commands(broker_address):
    admin = bmq.Admin(broker_address)
    assert not admin.closed
    admin.close()
    admin.close()
    assert admin.closed
    with pytest.raises(bmq.SessionClosedError):
        admin.command("HELP")


def test_cluster_status_of_a_single_node_bmqbrkr(bmqbrkr):
    with bmq.Admin(bmqbrkr.address) as admin:
        [cluster] = admin.clusters()
        status = admin.cluster_status()
    assert status.name == cluster.name == "local" and not status.is_proxy
    assert status.leader == status.self_node == cluster.nodes[0][0]
    assert status.elector_state == "LEADER" and status.healthy
    assert status.primaries == {0: status.leader}
    assert [n.available for n in status.nodes] == [True]


def test_cluster_commands_are_refused_by_the_embedded_broker(broker):
    with bmq.Admin(broker.address) as admin:
        with pytest.raises(bmq.AdminCommandError, match="embedded broker.*does not support"):
            admin.cluster_status("local")
        with pytest.raises(bmq.AdminCommandError, match="does not support"):
            admin.command("CLUSTERS LIST")


# ---- connection failures ------------------------------------------------------------------
def test_nothing_listening_is_a_connection_error():
    started = time.monotonic()
    with pytest.raises(bmq.ConnectionError, match="cannot connect"):
        bmq.Admin(f"tcp://127.0.0.1:{free_port()}", timeout=5.0)
    assert time.monotonic() - started < 5.0


def test_a_silent_listener_times_out_negotiating():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.monotonic()
        with pytest.raises(bmq.TimeoutError, match="negotiation"):
            bmq.Admin(f"tcp://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        assert time.monotonic() - started < 5.0


def test_an_unanswered_command_times_out_and_the_connection_stays_usable():
    with Broker() as broker, bmq.Admin(broker.address) as admin:
        broker.faults.delay_control_responses(2.0)
        started = time.monotonic()
        with pytest.raises(bmq.TimeoutError, match="HELP"):
            admin.command("HELP", timeout=0.3)
        assert time.monotonic() - started < 2.0
        broker.faults.delay_control_responses(0)
        assert "STAT SHOW" in admin.help()  # the late answer to the first is dropped


def test_embedded_broker_gone_fails_waiting_and_later_commands():
    broker = Broker().start()
    admin = bmq.Admin(broker.address)
    try:
        broker.faults.delay_control_responses(30.0)
        failure: list = []
        done = threading.Event()

        def waiting() -> None:
            try:
                admin.command("HELP", timeout=20.0)
            except BaseException as exc:  # checked below
                failure.append(exc)
            done.set()

        thread = threading.Thread(target=waiting)
        thread.start()
        broker.wait_for(lambda: any(s.admin for s in broker.clients()), 5.0)
        broker.stop()
        assert done.wait(10.0)
        thread.join(5.0)
        assert isinstance(failure[0], bmq.ConnectionLost)
        with pytest.raises(bmq.ConnectionLost):
            admin.command("HELP")
        assert admin.closed
    finally:
        admin.close()
        broker.stop()


def test_bmqbrkr_killed_fails_the_next_command_within_its_timeout(make_bmqbrkr):
    real = make_bmqbrkr()
    with bmq.Admin(real.address) as admin:
        assert "HELP" in admin.help()
        real.kill()
        started = time.monotonic()
        with pytest.raises((bmq.ConnectionLost, bmq.TimeoutError)):
            # The loss may show before the command is sent (ConnectionLost at once) or while
            # it waits (ConnectionLost as the reader sees the socket close).
            admin.command("HELP", timeout=5.0)
        assert time.monotonic() - started < 6.0


def test_admin_authenticates_with_a_credential():
    with Broker(authenticators={"BASIC": {"ops": "s3cret"}}, allow_anonymous=False) as broker:
        with bmq.Admin(broker.address, credential=("BASIC", "ops:s3cret")) as admin:
            assert "HELP" in admin.help()
        with pytest.raises(bmq.AuthenticationError):
            bmq.Admin(broker.address, credential=("BASIC", "ops:wrong"))
        with pytest.raises(bmq.ClosedByBroker):
            bmq.Admin(broker.address, timeout=5.0)


def test_embedded_broker_drops_what_an_admin_client_may_not_send(broker):
    from bmq import _codec, _schema

    uri = fresh("bmq.test.mem.priority")
    with bmq.Admin(broker.address) as admin:
        transport = admin._connection.transport
        open_queue = {"rId": 999, "openQueue": {"handleParameters": {
            "uri": uri, "qId": 1, "flags": 4, "readCount": 0, "writeCount": 1, "adminCount": 0}}}
        transport.send_control(_schema.encode_event(open_queue, _codec.ENCODING_JSON, "control"))
        # Answered in order: once HELP is, the open was dropped, not executed.
        assert "HELP" in admin.help()
        with pytest.raises(bmq.AdminCommandError):
            admin.queue_stats(uri)


def test_domains_asked_in_a_burst(session, admin):
    # bmqbrkr refuses a JSON STAT SHOW beyond 4 per second ("too often"); Admin retries those.
    uri = fresh("bmq.test.mem.broadcast")
    post(session, uri, [b"x"])
    for _ in range(8):
        assert "bmq.test.mem.broadcast" in admin.domains()
