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
Subscription expressions are evaluated by bmq's one implementation of BlazingMQ's language
(``bmq._expression``, exported here as :class:`Expression`), with bmqbrkr's rules; the
fault-injection API is :class:`Faults` (``broker.faults``) plus :meth:`Broker.restart`.

Known differences from bmqbrkr, all deliberate:

* PUT CRC32-C is verified (mismatch: NACK status 5); bmqbrkr only stores it.
* An event longer than ``max_event_size`` (default 512 MiB) closes the connection.
* The heartbeat monitor starts counting at once, without bmqbrkr's ~3 minute grace period
  for new connections, so tests can use short intervals.
* Messages never expire (no TTL) and nothing is persisted; "persistent" domains are in memory.
* Flow control (maxUnconfirmedMessages/Bytes) applies per subscription consumer.
* Authentication has bmqbrkr's BASIC and ANONYMOUS authenticators only (no plugins), and the
  fault switches ``refuse_authentication``, ``delay_authentication`` and
  ``expire_authentication_after``.
* Subscriptions: ``!=`` with a boolean literal follows the fixed semantics (upstream PR
  #1551), not 0.95.14's (issue #1523: there ``b != false`` behaves as ``b == false``). The
  rest is bmqbrkr's, measured against it: a text it cannot compile (syntax, no property,
  too complex, too long) is answered with success, logged at WARNING as
  ``#BMQ_SUBSCRIPTION_FAILURE`` with bmqbrkr's rc, and matches every message (bmq and the
  official SDK refuse such texts before sending them); routing follows bmqbrkr's
  round-robin router, except that a group found full is retried at each delivery pass, where
  bmqbrkr waits for a consumer to report capacity.
* A reader's open with an appId the fan-out domain does not configure is refused
  (``E_REFUSED``); bmqbrkr opens it and routes it nothing until such an app exists
  (dynamic appIds, which the embedded broker does not have), so a typo shows at once here.
* TLS (``Broker(tls=...)``) is the broker's own, from the first byte of the connection, as
  behind a TLS terminator; bmqbrkr v0.95 has none (its TLS listener is upstream work).
* Admin clients get the domain, queue, purge and statistics commands only, always answered in
  JSON (see :mod:`bmq.broker._admin`); cluster commands are refused with an error.
* A client is alive while it sends bytes, as in bmqbrkr, but bytes still waiting in the
  kernel while its reader thread is busy count too (bmqbrkr's I/O threads never lag).
"""
from ._faults import Faults
from ._local import broker_address
from ._queues import DEFAULT_DOMAINS, Domain, StoredMessage
from ._connection import ClientSession
from ._server import Broker
from .._expression import Expression, ExpressionError
from .._tls import server_context as tls_server_context

__all__ = [
    "Broker",
    "broker_address",
    "tls_server_context",
    "ClientSession",
    "DEFAULT_DOMAINS",
    "Domain",
    "Expression",
    "ExpressionError",
    "Faults",
    "StoredMessage",
]
