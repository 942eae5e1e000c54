"""bmq against a real 3-node BlazingMQ cluster with two proxies (``tests/realcluster.py``):
round trips through a proxy and directly to a replica, and the leader (through a proxy, or
under a client connected to it) or a proxy SIGKILLed while several threads post to a priority
or a fanout queue or a consumer reads.

Every test counts per message: each poster records the GUID of every ACKed payload, and a
consumer then drains the queue, confirming as it goes. What BlazingMQ promises and these tests
assert: every post resolves SUCCESS (after a failover too: a PUT whose primary died is sent on
to the new one by the cluster, or again by bmq with its GUID); every acknowledged message is
delivered, with the GUID its ACK named; a persistent queue stores each message once (a PUT
re-sent with its GUID is de-duplicated), so a consumer that confirms reads it once (on a fanout
queue, once per app).
What it does not promise: that a consumer whose confirms died with the primary gets no
message twice (the failover consumer test asserts at-least-once and reports the redeliveries);
and, in a domain of eventual consistency such as ``bmq.test.persistent.priority``, that a
message acknowledged just before the primary crashed was replicated at all (BlazingMQ's
"Consistency Levels": the primary ACKs before replicating). So the tests that kill the primary
use the strong-consistency domains (``.sc``), whose primary ACKs only what a majority stored;
the others use the eventual one.

The leader (primary of every partition) changes as tests kill it; each test asks the cluster
for it. The cluster serves only the persistent domains and ``bmq.test.mem.broadcast`` here.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Dict, List, Set, Tuple

import pytest

import bmq
from bmq import events
from realcluster import RealCluster
from support import fresh_uri, ha_options

pytestmark = pytest.mark.cluster

#: Eventual consistency: the primary ACKs a PUT once in its own storage, before replicating it.
PRIORITY = "bmq.test.persistent.priority"
#: Strong consistency: the primary ACKs a PUT once a majority of the nodes stored it. The tests
#: that kill the primary use these: only they promise that no acknowledged message is lost.
PRIORITY_SC = "bmq.test.persistent.priority.sc"
FANOUT_SC = "bmq.test.persistent.fanout.sc"
APPS = ("foo", "bar", "baz")  # the fanout domains' app ids
#: Fast reconnects, and timeouts that a failover (an election of ~0.2-3 s) stays well within.
OPTIONS = ha_options(connect_timeout=10.0, open_queue_timeout=20.0, configure_queue_timeout=20.0,
                     close_queue_timeout=10.0, disconnect_timeout=2.0, ack_timeout=30.0)
#: Seconds of silence after the last expected message in which a duplicate would show up
#: (the consumer's window is wide open: anything stored is pushed right behind the rest).
QUIET = 1.0
#: ACKs that must follow a fault before the posters stop: the stream flows again afterwards.
AFTER = 1000


class Posters:
    """``threads`` threads posting distinct payloads until :meth:`finish`: ``queue.post()`` one
    by one when ``chunk`` is 1, else ``queue.post_many()`` batches of ``chunk``. ``acked`` maps
    each acknowledged payload to its ACK's GUID; ``issued`` counts the payloads handed to a
    post call. Posting on until told (rather than a fixed count) keeps a fault injected after
    some ACKs in the middle of the stream however fast or slow the stream runs."""

    def __init__(self, queue: bmq.Queue, threads: int, chunk: int = 1) -> None:
        self.acked: Dict[bytes, str] = {}
        self.issued = 0
        self.failures: List[BaseException] = []
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._threads = [threading.Thread(target=self._post, args=(queue, t, chunk), name=f"poster-{t}",
                                          daemon=True) for t in range(threads)]

    def start(self) -> "Posters":
        for thread in self._threads:
            thread.start()
        return self

    def _post(self, queue: bmq.Queue, index: int, chunk: int) -> None:
        try:
            first = 0
            while not self._stop.is_set():
                payloads = [b"%d-%d" % (index, i) for i in range(first, first + chunk)]
                first += chunk
                with self._progress:
                    self.issued += chunk
                if chunk == 1:
                    acks = [queue.post(payloads[0], timeout=60.0)]
                else:
                    acks = queue.post_many(payloads, timeout=60.0)
                with self._progress:
                    for payload, ack in zip(payloads, acks):
                        assert ack.status is bmq.AckStatus.SUCCESS, ack
                        self.acked[payload] = ack.guid_hex
                    self._progress.notify_all()
        except BaseException as exc:  # reported by wait_acked() and finish()
            with self._progress:
                self.failures.append(exc)
                self._progress.notify_all()

    @property
    def count(self) -> int:
        with self._progress:
            return len(self.acked)

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        with self._progress:
            reached = self._progress.wait_for(lambda: len(self.acked) >= count or self.failures, timeout)
            assert not self.failures, self.failures[:3]
            assert reached, f"only {len(self.acked)} of {count} posts acknowledged within {timeout} s"

    def finish(self, timeout: float = 60.0) -> None:
        """Stop posting; wait for the posts under way; check every one was acknowledged."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), f"posters still blocked after {timeout} s"
        assert not self.failures, self.failures[:3]
        assert len(self.acked) == self.issued


def drain(address: str, uri: str, expected: Dict[bytes, str], timeout: float = 30.0) -> List[Tuple[bytes, str]]:
    """Every ``(payload, guid_hex)`` delivered to one consumer, confirmed as it comes, until all
    of ``expected`` arrived and then :data:`QUIET` seconds passed without a delivery."""
    deliveries: List[Tuple[bytes, str]] = []
    with bmq.Session(address, OPTIONS) as session:
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=10_000))
        seen: Set[bytes] = set()
        deadline = time.monotonic() + timeout
        while not expected.keys() <= seen and time.monotonic() < deadline:
            message = queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None:
                deliveries.append((message.data, message.guid_hex))
                seen.add(message.data)
                message.confirm()
        for message in queue.messages(timeout=QUIET):
            deliveries.append((message.data, message.guid_hex))
            message.confirm()
    return deliveries


def check_exactly_once(expected: Dict[bytes, str], deliveries: List[Tuple[bytes, str]], what: str) -> None:
    """Each acknowledged payload delivered exactly once, with its ACK's GUID, and nothing else."""
    received = [payload for payload, _ in deliveries]
    missing = expected.keys() - set(received)
    duplicates = len(received) - len(set(received))
    unknown = set(received) - expected.keys()
    wrong_guid = [(p, g, expected[p]) for p, g in deliveries if p in expected and g != expected[p]]
    print(f"\n[{what}] acked={len(expected)} delivered={len(received)} missing={len(missing)} "
          f"duplicates={duplicates}")
    assert not missing, f"{what}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert not unknown, f"{what}: delivered but never acknowledged: {sorted(unknown)[:5]}"
    assert not wrong_guid, f"{what}: delivered under another GUID than acknowledged: {wrong_guid[:3]}"
    assert duplicates == 0, f"{what}: {duplicates} messages stored twice"


def session_events(session: bmq.Session) -> List[events.SessionEvent]:
    """The session's events so far (connection lost, reconnected, queues reopened...)."""
    seen: List[events.SessionEvent] = []
    while True:
        event = session.next_event(0)
        if event is None:
            return seen
        seen.append(event)


# ---- round trips ---------------------------------------------------------------------------

@pytest.mark.timeout(90)  # the test that runs first also waits for the cluster to start
def test_round_trip_through_one_proxy_and_out_of_the_other(cluster: RealCluster):
    """Posted (one by one and in a batch) through ``proxy``, read through ``proxy2``: two
    independent entry points to the same replicated queue."""
    uri = fresh_uri(PRIORITY, prefix="proxy")
    with bmq.Session(cluster.proxy_address, OPTIONS) as session:
        queue = session.open_queue(uri, write=True)
        acks = [queue.post(b"one-%d" % i) for i in range(100)]
        payloads = [b"many-%d" % i for i in range(400)]
        acks += queue.post_many(payloads)
    expected = {ack_payload: ack.guid_hex for ack_payload, ack in
                zip([b"one-%d" % i for i in range(100)] + payloads, acks)}
    assert len(set(expected.values())) == 500  # one GUID per message
    check_exactly_once(expected, drain(cluster.proxy2_address, uri, expected), "proxy -> proxy2")


@pytest.mark.timeout(90)
def test_round_trip_directly_to_a_replica(cluster: RealCluster):
    """A client of a node that is not the primary: the node forwards PUTs to the primary and
    relays ACKs and deliveries back."""
    replica = cluster.replica()
    uri = fresh_uri(PRIORITY, prefix="replica")
    with bmq.Session(cluster.node_address(replica), OPTIONS) as session:
        queue = session.open_queue(uri, write=True)
        payloads = [b"r-%d" % i for i in range(500)]
        acks = [queue.post(p) for p in payloads[:100]] + queue.post_many(payloads[100:])
    expected = {p: ack.guid_hex for p, ack in zip(payloads, acks)}
    assert cluster.leader() != replica  # the round trip did cross nodes
    check_exactly_once(expected, drain(cluster.node_address(replica), uri, expected), f"replica {replica}")


# ---- the leader killed ---------------------------------------------------------------------

def _posts_through_the_proxy_across_a_leader_kill(cluster: RealCluster, prefix: str, chunk: int,
                                                  kill_at: int) -> None:
    uri = fresh_uri(PRIORITY_SC, prefix=prefix)
    leader = cluster.leader()
    with bmq.Session(cluster.proxy_address, OPTIONS) as session:
        queue = session.open_queue(uri, write=True)
        upstream = cluster.proxy_upstream()
        posters = Posters(queue, 4, chunk).start()
        posters.wait_acked(kill_at)
        cluster.kill(leader)
        killed, at_kill = time.monotonic(), posters.count
        posters.wait_acked(at_kill + AFTER)  # flowing again, through the new primary
        resumed = time.monotonic()
        posters.finish()
    new_leader = cluster.leader()
    print(f"\n[{prefix}] killed leader {leader} (the proxy's active node: {upstream}) after {at_kill} ACKs; "
          f"{AFTER} more in {resumed - killed:.2f} s; new leader {new_leader}; {len(posters.acked)} in all")
    assert new_leader != leader
    cluster.start(leader)  # it rejoins as a replica and resyncs from the new primary
    cluster.wait_healthy()
    check_exactly_once(posters.acked, drain(cluster.proxy_address, uri, posters.acked), prefix)


@pytest.mark.timeout(120)
def test_blocking_posts_from_4_threads_survive_a_leader_kill(cluster: RealCluster):
    _posts_through_the_proxy_across_a_leader_kill(cluster, "leader-post", chunk=1, kill_at=300)


@pytest.mark.timeout(120)
def test_post_many_from_4_threads_survives_a_leader_kill(cluster: RealCluster):
    _posts_through_the_proxy_across_a_leader_kill(cluster, "leader-many", chunk=50, kill_at=600)


@pytest.mark.timeout(120)
def test_blocking_posts_to_the_leader_itself_survive_its_kill_and_restart(cluster: RealCluster):
    """The client is connected to the primary itself: its connection dies with it, and bmq
    reconnects once the node is back (now a replica) and re-sends what was not acknowledged."""
    leader = cluster.leader()
    uri = fresh_uri(PRIORITY_SC, prefix="leader-direct")
    with bmq.Session(cluster.node_address(leader), OPTIONS) as session:
        posters = Posters(session.open_queue(uri, write=True), 4).start()
        posters.wait_acked(300)
        cluster.kill(leader)
        at_kill = posters.count
        cluster.start(leader)
        posters.wait_acked(at_kill + AFTER)
        posters.finish()
        seen = session_events(session)
    print(f"\n[leader-direct] killed {leader} after {at_kill} ACKs, {len(posters.acked)} in all; events {seen}")
    assert any(isinstance(e, events.ConnectionLost) for e in seen), seen
    assert any(isinstance(e, events.Reconnected) for e in seen), seen
    cluster.wait_healthy()
    check_exactly_once(posters.acked, drain(cluster.proxy_address, uri, posters.acked), "leader-direct")


@pytest.mark.timeout(120)
def test_fanout_posts_survive_a_leader_kill_for_every_app(cluster: RealCluster):
    """A replicated fanout queue: each of its apps (foo, bar, baz) gets every acknowledged
    message once, whichever primary stored it."""
    uri = fresh_uri(FANOUT_SC, prefix="fanout")
    leader = cluster.leader()
    with bmq.Session(cluster.proxy_address, OPTIONS) as session:
        posters = Posters(session.open_queue(uri, write=True), 4, chunk=10).start()
        posters.wait_acked(300)
        cluster.kill(leader)
        at_kill = posters.count
        posters.wait_acked(at_kill + AFTER)
        posters.finish()
    print(f"\n[fanout] killed leader {leader} after {at_kill} ACKs, {len(posters.acked)} in all")
    cluster.start(leader)
    cluster.wait_healthy()
    for app in APPS:
        check_exactly_once(posters.acked, drain(cluster.proxy2_address, f"{uri}?id={app}", posters.acked),
                           f"fanout app {app}")


# ---- the proxy killed ----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_posts_from_4_threads_survive_a_proxy_kill_and_restart(cluster: RealCluster):
    """The client's only entry point dies: bmq reconnects once the proxy is back and re-sends
    what was not acknowledged, with the original GUIDs (the primary de-duplicates them)."""
    uri = fresh_uri(PRIORITY, prefix="proxykill")
    with bmq.Session(cluster.proxy_address, OPTIONS) as session:
        posters = Posters(session.open_queue(uri, write=True), 4).start()
        posters.wait_acked(300)
        cluster.kill("proxy")
        at_kill = posters.count
        cluster.start("proxy")
        posters.wait_acked(at_kill + AFTER)
        posters.finish()
        seen = session_events(session)
    print(f"\n[proxykill] proxy killed after {at_kill} ACKs, {len(posters.acked)} in all; events {seen}")
    assert any(isinstance(e, events.ConnectionLost) for e in seen), seen
    assert any(isinstance(e, events.Reconnected) for e in seen), seen
    check_exactly_once(posters.acked, drain(cluster.proxy2_address, uri, posters.acked), "proxykill")


@pytest.mark.timeout(120)
def test_posting_fails_over_to_the_other_proxy_when_the_one_in_use_dies(cluster: RealCluster):
    """A session given both proxies: the one in use SIGKILLed mid-stream, posting goes on
    through the other at once (the reconnect policy's first delay is 30 s: a failover seen
    sooner did not back off), nothing acknowledged lost, nothing stored twice (PUTs re-sent
    through the other proxy keep their GUIDs, and the primary de-duplicates them)."""
    uri = fresh_uri(PRIORITY, prefix="twoproxies")
    options = dataclasses.replace(OPTIONS, reconnect=bmq.ReconnectPolicy(initial_delay=30.0, max_delay=30.0,
                                                                          jitter=0.0))
    names = {cluster.proxy_address: "proxy", cluster.proxy2_address: "proxy2"}
    with bmq.Session(list(names), options) as session:
        first = session.broker
        posters = Posters(session.open_queue(uri, write=True), 4).start()
        posters.wait_acked(300)
        killed_at = time.monotonic()
        cluster.kill(names[first])
        at_kill = posters.count
        # Beyond the blocking posts that were in flight at the kill (one per thread): posting resumed.
        posters.wait_acked(at_kill + 8, timeout=30.0)
        resumed_in = time.monotonic() - killed_at
        posters.wait_acked(at_kill + AFTER)
        posters.finish()
        now = session.broker
        assert session.stats().broker == now
    print(f"\n[twoproxies] {names[first]} killed after {at_kill} ACKs; posting resumed through {names.get(now)} "
          f"{resumed_in * 1000:.0f} ms later; {len(posters.acked)} ACKs in all")
    assert now in names and now != first
    assert resumed_in < 10.0  # far below the 30 s a backoff would have taken
    check_exactly_once(posters.acked, drain(now, uri, posters.acked), "twoproxies")


# ---- a consumer across a failover ----------------------------------------------------------

@pytest.mark.timeout(120)
def test_consumer_through_a_proxy_receives_everything_across_a_leader_kill(cluster: RealCluster):
    """At-least-once: confirms on their way to the dead primary may be lost, and the new primary
    then delivers those messages again; none may be missing."""
    uri = fresh_uri(PRIORITY_SC, prefix="consumer")
    payloads = [b"c-%d" % i for i in range(1500)]
    with bmq.Session(cluster.proxy2_address, OPTIONS) as session:
        acks = session.open_queue(uri, write=True).post_many(payloads)
    expected = {p: ack.guid_hex for p, ack in zip(payloads, acks)}
    leader = cluster.leader()
    deliveries: List[Tuple[bytes, str]] = []
    at_kill = None
    with bmq.Session(cluster.proxy_address, OPTIONS) as session:
        # A narrow window: the primary holds most messages back until confirms free it, so the
        # kill comes in the middle of the deliveries, not after they all reached the client.
        queue = session.open_queue(uri, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=50))
        seen: Set[bytes] = set()
        deadline = time.monotonic() + 60.0
        while not expected.keys() <= seen and time.monotonic() < deadline:
            message = queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if message is None:
                continue
            deliveries.append((message.data, message.guid_hex))
            seen.add(message.data)
            message.confirm()
            if at_kill is None and len(seen) >= 400:
                cluster.kill(leader)
                at_kill = len(seen)
        for message in queue.messages(timeout=QUIET):
            deliveries.append((message.data, message.guid_hex))
            message.confirm()
    cluster.start(leader)
    cluster.wait_healthy()
    received = [p for p, _ in deliveries]
    missing = expected.keys() - set(received)
    redeliveries = len(received) - len(set(received))
    wrong_guid = [(p, g) for p, g in deliveries if p in expected and g != expected[p]]
    report = (f"leader {leader} killed after {at_kill} of {len(expected)} messages; "
              f"delivered {len(received)}, missing {len(missing)}, redeliveries {redeliveries}")
    print(f"\n[consumer failover] {report}")
    assert at_kill is not None and at_kill < len(expected), report
    assert not missing, f"{report}; e.g. missing {sorted(missing)[:5]}"
    assert set(received) <= expected.keys(), report
    assert not wrong_guid, f"{report}; delivered under another GUID: {wrong_guid[:3]}"

