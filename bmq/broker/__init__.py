"""An embedded BlazingMQ broker speaking the real protocol on loopback.

Used by the test suite, by ``bmq``'s command line when no broker address is given, and to
inject the faults the client's HA and reliability code must survive::

    from bmq.broker import Broker

    with Broker() as broker:          # binds 127.0.0.1 on a free port
        url = broker.address          # "tcp://127.0.0.1:PORT"
        ...
        broker.faults.drop_connections()

Protocol-faithful enough that the official BlazingMQ SDK cannot tell it from a single-node
``bmqbrkr`` (control messages in BER or JSON, PUT/ACK/PUSH/CONFIRM, heartbeats). It is not a
production broker: everything lives in memory and nothing is replicated. Unlike ``bmqbrkr``
it verifies the CRC32-C of every PUT and NACKs a mismatch with status 5 (UNKNOWN).

Default domains (:data:`DEFAULT_DOMAINS`): ``bmq.test.mem.priority``,
``bmq.test.mem.fanout`` (appIds foo, bar, baz), ``bmq.test.mem.broadcast``, and
``bmq.test.persistent.priority`` / ``bmq.test.persistent.fanout`` (same, in memory).
Subscription expressions follow the grammar in :mod:`bmq.broker._subscriptions`.
"""
from ._faults import Faults
from ._queues import DEFAULT_DOMAINS, Domain, StoredMessage
from ._server import Broker, ClientSession
from ._subscriptions import Expression, ExpressionError

__all__ = [
    "Broker",
    "ClientSession",
    "DEFAULT_DOMAINS",
    "Domain",
    "Expression",
    "ExpressionError",
    "Faults",
    "StoredMessage",
]
