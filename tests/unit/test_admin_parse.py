"""bmq.Admin's reading of the broker's answers, on answers shaped as bmqbrkr v0.95.14 gives them
(seen with a single node, a 3-node cluster and its proxy)."""
from __future__ import annotations

import pytest

import bmq
from bmq import _admin


@pytest.mark.parametrize("answer, reason", [
    ("Unable to decode command (rc: -1, error: 'Invalid command word: FOO')", "Invalid command word: FOO"),
    ('{"error":{"message":"Domain \'x\' doesn\'t exist"}}', "Domain 'x' doesn't exist"),
    ('{\n    "error": {\n        "message": "gone"\n    }\n}\n', "gone"),
])
def test_error_answers_raise_with_the_brokers_reason(answer, reason):
    with pytest.raises(bmq.AdminCommandError) as caught:
        _admin._check_answer("CMD", answer)
    assert caught.value.broker_message == reason and caught.value.command == "CMD"
    assert reason in str(caught.value)


@pytest.mark.parametrize("answer", [
    "Domain 'x' doesn't exist",  # plain text: indistinguishable from an answer, passed through
    '{"purgedQueues":{"queues":[{"error":{"message":"no app"}}]}}',  # the helper checks this one
    '{"help":{"commands":[]}}',
    "",
])
def test_other_answers_pass(answer):
    _admin._check_answer("CMD", answer)


def test_purge_errors_inside_the_answer_raise():
    with pytest.raises(bmq.AdminCommandError, match="no app"):
        _admin._purged({"purgedQueues": {"queues": [{"error": {"message": "no app"}}]}}, "purge")
    [result] = _admin._purged({"purgedQueues": {"queues": [{"queue": {
        "queueUri": "bmq://d/q", "appId": "", "appKey": "0000000000", "numMessagesPurged": 3,
        "numBytesPurged": 18}}]}}, "purge")
    assert result == bmq.PurgeResult("bmq://d/q", None, 3, 18)


FOLLOWER = {"clusterStatus": {
    "name": "local", "description": "Cluster (local)", "selfNodeDescription": "[node2, 2]", "isHealthy": False,
    "nodeStatuses": {"nodes": [
        {"description": "[node3, 3]", "isAvailable": True, "status": "E_AVAILABLE"},
        {"description": "[node1, 1]", "isAvailable": False, "status": "E_UNAVAILABLE"},
        {"description": "[node2, 2]", "status": "E_AVAILABLE", "primaryForPartitionIds": [0, 1]},
    ]},
    "electorInfo": {"electorState": "FOLLOWER", "leaderNode": "[node2, 2]",
                    "leaderMessageSequence": {"electorTerm": 2, "sequenceNumber": 1}, "leaderStatus": "ACTIVE"},
    "partitionsInfo": {"partitions": [
        {"numQueuesMapped": 1, "numActiveQueues": 1, "primaryNode": "[node2, 2]", "primaryLeaseId": 2,
         "primaryStatus": "ACTIVE"},
        {"numQueuesMapped": 0, "numActiveQueues": 0, "primaryNode": "[node2, 2]", "primaryLeaseId": 2,
         "primaryStatus": "ACTIVE"},
    ]},
    "queuesInfo": {}, "clusterStorageSummary": {},
}}


def test_cluster_status_of_a_node():
    status = _admin._cluster_status("local", FOLLOWER)
    assert (status.name, status.is_proxy, status.self_node, status.leader) == ("local", False, "node2", "node2")
    assert [(n.name, n.node_id, n.status, n.connected) for n in status.nodes] == [
        ("node1", 1, "E_UNAVAILABLE", False), ("node2", 2, "E_AVAILABLE", None), ("node3", 3, "E_AVAILABLE", True)]
    assert status.node("node2").primary_for == (0, 1)
    assert status.primaries == {0: "node2", 1: "node2"}
    assert not status.healthy and not status.broker_healthy  # node1 is down
    with pytest.raises(KeyError):
        status.node("node9")


def test_cluster_status_of_a_starting_node_knows_no_leader():
    starting = {"clusterStatus": dict(FOLLOWER["clusterStatus"], electorInfo={
        "electorState": "FOLLOWER", "leaderNode": " ** NA **", "leaderStatus": "UNDEFINED"},
        partitionsInfo={"partitions": [{"numQueuesMapped": 0, "numActiveQueues": 0, "primaryLeaseId": 0,
                                        "primaryStatus": "UNDEFINED"}]})}
    status = _admin._cluster_status("local", starting)
    assert status.leader is None and status.primaries == {0: None} and not status.healthy


def test_cluster_status_of_a_proxy():
    status = _admin._cluster_status("local", {"clusterProxyStatus": {
        "description": "ClusterProxy (local)", "activeNodeDescription": "[node1, 1]", "isHealthy": False,
        "nodeStatuses": {"nodes": [{"description": f"[node{i}, {i}]", "isAvailable": True, "status": "E_AVAILABLE"}
                                   for i in (1, 2, 3)]},
        "queuesInfo": {}}})
    assert status.is_proxy and status.active_node == "node1" and status.leader is None
    assert status.partitions == () and status.healthy and not status.broker_healthy


def test_an_unexpected_answer_is_a_protocol_error():
    with pytest.raises(bmq.ProtocolError):
        _admin._cluster_status("local", {"clusterList": {}})
