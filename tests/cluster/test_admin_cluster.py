"""bmq.Admin against the real 3-node cluster with two proxies (``tests/realcluster.py``): the
cluster's status as each node and each proxy reports it agrees with what the brokers' logs say
(``cluster.logged_leader()``), and follows a replica's crash and restart.

A node answers ``CLUSTERS CLUSTER local STATUS`` with the elector (leader) and the partitions
(primaries); a proxy with the nodes and the one it uses, once a client opened a queue through
it (before that it knows no cluster).
"""
from __future__ import annotations

import time
from typing import Callable

import pytest

import bmq
from realcluster import RealCluster
from support import fresh_uri

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

PRIORITY = "bmq.test.persistent.priority"
CLUSTER = "local"
#: Interval of re-asking a broker's view while it catches up with a crash or restart.
POLL = 0.1


def wait_for_status(admin: bmq.Admin, condition: Callable[[bmq.ClusterStatus], bool], timeout: float,
                    what: str) -> bmq.ClusterStatus:
    """Ask ``admin`` for the cluster's status until ``condition`` holds (AssertionError with the
    last status after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status = admin.cluster_status(CLUSTER)
        if condition(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s: {status}")
        time.sleep(POLL)  # polling a broker's view of its peers: it signals nothing to wait on


def test_cluster_status_through_every_node(cluster: RealCluster):
    leader = cluster.logged_leader()
    for name in cluster.nodes:
        with bmq.Admin(cluster.node_address(name), timeout=10.0) as admin:
            # Right after the cluster's start a node may still be learning its peers' status.
            status = wait_for_status(admin, lambda s: all(n.available for n in s.nodes), 30.0,
                                     "every node available as this node sees it")
            assert [c.name for c in admin.clusters()] == [CLUSTER]
        assert (status.name, status.is_proxy, status.self_node) == (CLUSTER, False, name)
        assert status.leader == leader and status.leader_status == "ACTIVE"
        assert status.elector_state == ("LEADER" if name == leader else "FOLLOWER")
        assert [n.name for n in status.nodes] == cluster.nodes
        # E_LEADER_IS_MASTER_ALL: the leader is the primary of every partition.
        assert status.partitions and set(status.primaries.values()) == {leader}
        assert all(p.primary_status == "ACTIVE" for p in status.partitions)
        assert status.node(leader).primary_for == tuple(p.partition_id for p in status.partitions)
        assert status.healthy


def test_cluster_status_through_both_proxies(cluster: RealCluster):
    for address in (cluster.proxy_address, cluster.proxy2_address):
        # A proxy knows the cluster once a client opened a queue through it.
        with bmq.Session(address) as session:
            session.open_queue(fresh_uri(PRIORITY), write=True).post(b"hello")
        with bmq.Admin(address, timeout=10.0) as admin:
            assert [(c.name, c.locality) for c in admin.clusters()] == [(CLUSTER, "remote")]
            # A proxy a previous test killed and restarted learns each node's status from the
            # nodes over some time (seen: a node E_UNKNOWN though connected): ask until it has.
            status = wait_for_status(admin, lambda s: all(n.available and n.connected for n in s.nodes), 30.0,
                                     "every node available and connected as the proxy sees it")
        assert status.is_proxy and status.name == CLUSTER
        assert status.leader is None and status.partitions == () and status.self_node is None
        assert [n.name for n in status.nodes] == cluster.nodes
        assert status.active_node in cluster.nodes
        assert status.healthy


def test_cluster_status_follows_a_replica_crash_and_restart(cluster: RealCluster):
    leader = cluster.logged_leader()
    replica = cluster.replica()
    with bmq.Admin(cluster.node_address(leader), timeout=10.0) as admin:
        assert admin.cluster_status(CLUSTER).healthy
        cluster.kill(replica)
        down = wait_for_status(admin, lambda s: not s.node(replica).available, 30.0, f"{replica} down")
        assert down.node(replica).connected is False and not down.healthy
        assert down.leader == leader and set(down.primaries.values()) == {leader}
        cluster.start(replica)
        up = wait_for_status(admin, lambda s: s.healthy, 30.0, "a healthy cluster again")
    assert up.leader == cluster.logged_leader() == leader
    assert all(n.available for n in up.nodes)
    with bmq.Admin(cluster.node_address(replica), timeout=10.0) as admin:
        status = wait_for_status(admin, lambda s: s.healthy, 30.0, f"{replica} seeing a healthy cluster")
    assert status.self_node == replica and status.leader == leader and status.elector_state == "FOLLOWER"


def test_admin_connection_to_a_killed_node_fails_clearly(cluster: RealCluster):
    replica = cluster.replica()
    with bmq.Admin(cluster.node_address(replica), timeout=10.0) as admin:
        cluster.kill(replica)
        started = time.monotonic()
        with pytest.raises((bmq.ConnectionLost, bmq.TimeoutError)):
            admin.cluster_status(CLUSTER)
        assert time.monotonic() - started < 11.0
    with pytest.raises(bmq.ConnectionError):
        bmq.Admin(cluster.node_address(replica), timeout=5.0)
    cluster.start(replica)


def test_queue_stats_and_purge_on_the_primary(cluster: RealCluster):
    """The primary (the leader) holds a queue's storage and executes a purge, which its replicas
    follow; a replica refuses to purge ("queue is NOT local"); a consumer then gets nothing."""
    uri = fresh_uri("bmq.test.persistent.fanout")
    leader = cluster.logged_leader()
    replica = cluster.replica()
    with bmq.Session(cluster.proxy_address) as session:
        writer = session.open_queue(uri, write=True)
        for i in range(5):
            writer.post(b"message %d" % i)
        with bmq.Admin(cluster.node_address(leader), timeout=10.0) as primary:
            stats = primary.queue_stats(uri)
            assert (stats.uri, stats.messages, stats.bytes) == (uri, 5, 5 * 9)
            assert {app: s.messages for app, s in stats.apps.items()} == {"foo": 5, "bar": 5, "baz": 5}
            assert uri in primary.queues("bmq.test.persistent.fanout")
            with bmq.Admin(cluster.node_address(replica), timeout=10.0) as other:
                with pytest.raises(bmq.AdminCommandError, match="NOT local"):
                    other.purge(uri)
            assert primary.purge(uri + "?id=foo").messages == 5
            assert primary.purge(uri).messages == 5  # bar's and baz's, stored once
            assert primary.queue_stats(uri).messages == 0
        reader = session.open_queue(uri + "?id=bar", read=True)
        assert reader.get(timeout=1.0) is None
