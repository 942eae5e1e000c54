"""The control-request table without a socket: rIds, responses, what a lost connection keeps."""
from __future__ import annotations

import pytest

from bmq import _schema
from bmq._requests import ControlRequests
from bmq.exceptions import BrokerError


class _Queue:
    pass


def _rid(request) -> int:
    message, _ = _schema.decode_event(request.data, "control")
    return message["rId"]


def test_each_request_gets_its_own_rid_and_its_response():
    table = ControlRequests()
    first = table.add({"openQueue": {"handleParameters": {"uri": "bmq://d/q", "qId": 0, "flags": 2,
                                                          "readCount": 1, "writeCount": 0, "adminCount": 0}}}, True)
    second = table.add({"disconnect": {}}, False)
    assert _rid(first) != _rid(second) and len(table) == 2
    table.settle(table.take({"rId": _rid(second), "disconnectResponse": {}}), {"disconnectResponse": {}})
    assert second.future.result(0) == {"disconnectResponse": {}}
    assert table.take({"rId": _rid(second)}) is None, "answered once"
    failure = {"rId": _rid(first), "status": {"category": "E_REFUSED", "code": -1, "message": "no"}}
    table.settle(table.take(failure), failure)
    with pytest.raises(BrokerError, match="E_REFUSED: no"):
        first.future.result(0)
    assert len(table) == 0


def test_a_lost_connection_drops_unbuffered_requests_and_defers_configures_of_reopening_queues():
    table = ControlRequests()
    reopening, other = _Queue(), _Queue()
    close = table.add({"disconnect": {}}, False)
    opening = table.add({"disconnect": {}}, True)
    configure_reopening = table.add({"disconnect": {}}, True, reopening)
    configure_other = table.add({"disconnect": {}}, True, other)
    assert table.drop_unbuffered() == [close]
    now, deferred = table.for_new_connection({id(reopening)})
    assert now == [opening.data, configure_other.data] and deferred == [configure_reopening]
    table.discard(configure_reopening.future)
    assert not table.is_pending(configure_reopening) and table.is_pending(configure_other)
    assert set(map(id, table.take_all())) == {id(opening), id(configure_other)} and len(table) == 0
