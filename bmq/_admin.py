"""Admin commands: a connection that negotiates as an admin client (``E_TCPADMIN``) and sends
the broker's text commands (``adminCommand {command}``, answered by ``adminCommandResponse
{text}``), with typed helpers for what operators and tests reach for.

The broker answers each command in plain text, or in JSON when the command starts with
``ENCODING JSON_COMPACT`` (or ``JSON_PRETTY``); the helpers always ask for JSON and parse it
into the small frozen dataclasses below. An error is ``{"error": {"message": ...}}`` in JSON
and a bare sentence in plain text, except for a command the broker cannot parse, which it
answers with ``Unable to decode command (...)`` in either encoding.

Thread-safety: :class:`Admin` may be used from several threads at once (each command waits
for the answer carrying its own request id); callbacks run on the transport's reader thread.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import ssl
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _codec, _schema
from ._connection import Connection, CredentialSource, client_identity
from ._dispatch import fail_future, resolve_future
from ._options import tls_context_of
from ._transport import parse_broker_address
from ._uri import parse_uri
from .exceptions import (
    AdminCommandError, ArgumentTypeError, ConnectionLost, InvalidArgumentError, ProtocolError, SessionClosedError,
    TimeoutError,
)

__all__ = [
    "Admin",
    "AppStats",
    "BrokerQueueStats",
    "ClusterInfo",
    "ClusterNode",
    "ClusterStatus",
    "DomainInfo",
    "PartitionStatus",
    "PurgeResult",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
_JSON = _codec.ENCODING_JSON
_admin_ids = itertools.count(1)
_NODE = re.compile(r"^\[(?P<name>.*), (?P<id>-?\d+)\]$")
_UNDECODABLE = "Unable to decode command"
_SNAPSHOT_RETRY = 0.25


# ---- results ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterNode:
    """One node of a cluster as a broker sees it.

    Attributes:
        name: the node's host name in the cluster configuration, e.g. ``"node1"``.
        node_id: its id in the cluster configuration.
        status: the broker's node status, e.g. ``"E_AVAILABLE"``, ``"E_STARTING"``,
            ``"E_STOPPING"``, ``"E_UNAVAILABLE"``.
        connected: whether the answering broker has a connection to it (None for itself, or
            when the broker did not say).
        primary_for: the partitions whose primary it is.
    """

    name: str
    node_id: int
    status: str
    connected: Optional[bool] = None
    primary_for: Tuple[int, ...] = ()

    @property
    def available(self) -> bool:
        """True when the node's status is ``E_AVAILABLE``."""
        return self.status == "E_AVAILABLE"


@dataclass(frozen=True)
class PartitionStatus:
    """One storage partition of a cluster.

    Attributes:
        partition_id: its number, from 0.
        primary: the name of its primary node, or None while it has none.
        primary_status: ``"ACTIVE"``, ``"PASSIVE"`` or ``"UNDEFINED"``.
        lease_id: the primary's lease id.
        queues_mapped: queues assigned to the partition.
        active_queues: of those, the queues in use.
    """

    partition_id: int
    primary: Optional[str]
    primary_status: str
    lease_id: int = 0
    queues_mapped: int = 0
    active_queues: int = 0


@dataclass(frozen=True)
class ClusterStatus:
    """``CLUSTERS CLUSTER <name> STATUS`` of a cluster node, or of a proxy (``is_proxy``).

    A proxy knows the nodes and the one it uses (``active_node``), not the elector or the
    partitions: ``leader`` is None and ``partitions`` empty there.

    Attributes:
        name: the cluster's name.
        is_proxy: whether the answering broker is a proxy of the cluster, not a member.
        self_node: the answering node's name (None on a proxy).
        leader: the leader's node name, as the answering broker knows it (None if none).
        elector_state: the answering node's elector state: ``"LEADER"``, ``"FOLLOWER"``,
            ``"CANDIDATE"`` or ``"DORMANT"`` (``""`` on a proxy).
        leader_status: ``"ACTIVE"``, ``"PASSIVE"`` or ``"UNDEFINED"`` (``""`` on a proxy).
        active_node: the node a proxy sends its traffic to (None on a node).
        nodes: every node of the cluster.
        partitions: every partition (empty on a proxy).
        broker_healthy: the broker's own ``isHealthy`` flag. bmqbrkr's cluster monitor keeps
            it ``false`` for a while after the broker starts (seen 15 s and more after a
            3-node cluster was ready), so prefer :attr:`healthy`.
    """

    name: str
    is_proxy: bool
    self_node: Optional[str]
    leader: Optional[str]
    elector_state: str
    leader_status: str
    active_node: Optional[str]
    nodes: Tuple[ClusterNode, ...]
    partitions: Tuple[PartitionStatus, ...]
    broker_healthy: bool
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def primaries(self) -> Dict[int, Optional[str]]:
        """Partition id -> the name of its primary node (None while it has none)."""
        return {p.partition_id: p.primary for p in self.partitions}

    @property
    def healthy(self) -> bool:
        """Every node available and, on a cluster node, an active leader and an active
        primary for every partition (what bmqbrkr's cluster monitor checks)."""
        if not self.nodes or not all(node.available for node in self.nodes):
            return False
        if self.is_proxy:
            return True
        return (self.leader is not None and self.leader_status == "ACTIVE"
                and all(p.primary is not None and p.primary_status == "ACTIVE" for p in self.partitions))

    def node(self, name: str) -> ClusterNode:
        """The node called ``name``.

        Args:
            name: a node name, e.g. ``"node2"``.

        Returns:
            Its :class:`ClusterNode`.

        Raises:
            KeyError: the cluster has no such node.
        """
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


@dataclass(frozen=True)
class ClusterInfo:
    """One cluster a broker knows (``CLUSTERS LIST``).

    Attributes:
        name: the cluster's name.
        locality: ``"local"`` (the broker is a member) or ``"remote"`` (a proxy of it).
        nodes: ``(host name, node id, data center)`` of every node.
    """

    name: str
    locality: str
    nodes: Tuple[Tuple[str, int, str], ...]


@dataclass(frozen=True)
class DomainInfo:
    """``DOMAINS DOMAIN <name> INFOS``.

    Attributes:
        name: the domain's name.
        cluster: the cluster that serves it.
        queues: URIs of its active queues.
        messages: messages stored in the domain (all its queues).
        bytes: their bytes.
        config: the domain's configuration as the broker holds it.
    """

    name: str
    cluster: str
    queues: Tuple[str, ...]
    messages: int
    bytes: int
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class AppStats:
    """One appId of a queue (``"__default"`` for a priority or broadcast queue).

    Attributes:
        app_id: the appId.
        messages: messages still held for it (not confirmed yet).
        consumers: consumers attached for it on the answering broker.
    """

    app_id: str
    messages: int
    consumers: int


@dataclass(frozen=True)
class BrokerQueueStats:
    """What a broker holds for one queue (``DOMAINS DOMAIN <d> QUEUE <q> INTERNALS``).

    Attributes:
        uri: the queue's URI.
        partition_id: the storage partition it lives in.
        messages: messages stored (each counted once, whatever the appIds holding it).
        bytes: their application data bytes.
        apps: appId -> :class:`AppStats`.
        raw: the broker's whole answer, for anything else it reports.
    """

    uri: str
    partition_id: int
    messages: int
    bytes: int
    apps: Mapping[str, AppStats]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def consumers(self) -> int:
        """Consumers of every appId together."""
        return sum(app.consumers for app in self.apps.values())


@dataclass(frozen=True)
class PurgeResult:
    """What one purge removed from one queue.

    Attributes:
        uri: the queue's URI.
        app_id: the appId purged, or None when the whole queue was.
        messages: messages removed.
        bytes: their bytes.
    """

    uri: str
    app_id: Optional[str]
    messages: int
    bytes: int


# ---- the client ---------------------------------------------------------------------------
class Admin:
    """An admin connection to one broker: text commands and typed helpers.

    ::

        with bmq.Admin("tcp://localhost:30114") as admin:
            print(admin.command("HELP"))
            print(admin.queue_stats("bmq://bmq.test.mem.priority/orders").messages)
            admin.purge("bmq://bmq.test.mem.priority/orders")

    Args:
        broker: the broker's address, ``tcp://HOST:PORT``.
        timeout: seconds to connect and negotiate, and the default wait for each answer.
        credential: as :attr:`SessionOptions.credential`, for a broker that requires
            authentication.
        tls: as :attr:`SessionOptions.tls`: a client ``ssl.SSLContext`` (or True) for a TLS
            endpoint.

    Raises:
        InvalidURIError: a malformed ``broker`` address.
        ConnectionError: the broker cannot be reached.
        TLSError: the TLS handshake failed, and why.
        ClosedByBroker: it refused the admin connection.
        AuthenticationError: it refused the credential.
        TimeoutError: no negotiation answer within ``timeout``.

    Thread-safety: every method may be called from any thread, several at once.
    """

    def __init__(self, broker: str, *, timeout: float = DEFAULT_TIMEOUT,
                 credential: Optional[CredentialSource] = None, tls: Union[bool, ssl.SSLContext, None] = None) -> None:
        self.broker = broker
        self.timeout = timeout
        address = parse_broker_address(broker)
        self._id = next(_admin_ids)
        self._lock = threading.Lock()
        self._pending: Dict[int, "Future[Dict[str, Any]]"] = {}
        self._request_ids = itertools.count(1)
        self._failure: Optional[BaseException] = None
        self._closed = False
        self._connection = Connection(address, 1 << 20, f"admin-{self._id}", on_acks=lambda events: [],
                                      on_push=self._on_unexpected, on_control=self._on_control,
                                      on_failure=self._on_failure, tls=tls_context_of(tls))
        identity = client_identity(self._id, None, "bmq-admin", client_type="E_TCPADMIN")
        self._connection.establish(identity, broker, timeout, credential)
        logger.info("admin connection %d to %s established", self._id, broker)

    def __repr__(self) -> str:
        return f"Admin({self.broker!r}{', closed' if self._closed else ''})"

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the connection was lost."""
        return self._closed or self._failure is not None

    def close(self) -> None:
        """Close the connection (idempotent); commands waiting for an answer fail with
        :class:`SessionClosedError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
        self._connection.close()
        self._connection.transport.join(1.0)
        for future in pending.values():
            fail_future(future, SessionClosedError("the admin connection was closed"))

    # ---- raw commands ----------------------------------------------------------------
    def command(self, text: str, *, timeout: Optional[float] = None) -> str:
        """Send one admin command and return the broker's answer as it is.

        Args:
            text: the command, e.g. ``"CLUSTERS LIST"`` or ``"ENCODING JSON_PRETTY STAT SHOW"``
                (see ``HELP``); words are case-insensitive.
            timeout: seconds to wait for the answer (default: the constructor's ``timeout``).

        Returns:
            The answer text (JSON when the command asked for an ``ENCODING``).

        Raises:
            AdminCommandError: the broker could not parse the command, or answered a JSON
                error (a plain-text answer cannot be told from an error in general: ask for
                JSON, or use the helpers, to have every error raised).
            TimeoutError: no answer within ``timeout``.
            ConnectionLost: the connection went away.
            SessionClosedError: :meth:`close` was called.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"an admin command is a str, not a {type(text).__name__}")
        answer = self._request(text, self.timeout if timeout is None else timeout)
        _check_answer(text, answer)
        return answer

    def command_json(self, text: str, *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Send one admin command asking for a JSON answer, and return it parsed.

        Args:
            text: the command without an ``ENCODING`` prefix, e.g. ``"CLUSTERS LIST"``.
            timeout: seconds to wait for the answer (default: the constructor's ``timeout``).

        Returns:
            The answer's JSON object, e.g. ``{"clusterList": {...}}``.

        Raises:
            AdminCommandError: the broker answered an error.
            ProtocolError: the answer is not JSON.
            TimeoutError, ConnectionLost, SessionClosedError: as :meth:`command`.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"an admin command is a str, not a {type(text).__name__}")
        answer = self._request(f"ENCODING JSON_COMPACT {text}", self.timeout if timeout is None else timeout)
        _check_answer(text, answer)
        try:
            value = json.loads(answer)
        except ValueError:
            raise ProtocolError(f"admin command {text!r}: the broker's answer is not JSON: {answer[:200]!r}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"admin command {text!r}: expected a JSON object, got {answer[:200]!r}")
        return value

    # ---- helpers -----------------------------------------------------------------------
    def help(self) -> Dict[str, str]:
        """The commands the broker supports (``HELP``).

        Returns:
            Command syntax -> description, in the broker's order.

        Raises:
            AdminCommandError, TimeoutError, ConnectionLost: as :meth:`command`.
        """
        answer = self.command_json("HELP")
        commands = _get(answer, "help", "commands", default=[])
        return {str(c.get("command", "")): str(c.get("description", "")) for c in commands}

    def clusters(self) -> List[ClusterInfo]:
        """The clusters the broker knows (``CLUSTERS LIST``). A proxy lists a cluster only
        once a client opened a queue through it.

        Returns:
            One :class:`ClusterInfo` per cluster.

        Raises:
            AdminCommandError, TimeoutError, ConnectionLost: as :meth:`command`.
        """
        answer = self.command_json("CLUSTERS LIST")
        return [
            ClusterInfo(
                name=str(c.get("name", "")), locality=str(c.get("locality", "")),
                nodes=tuple((str(n.get("hostName", "")), int(n.get("nodeId", 0)), str(n.get("dataCenter", "")))
                            for n in c.get("nodes", ())),
            )
            for c in _get(answer, "clusterList", "clusters", default=[])
        ]

    def cluster_status(self, cluster: Optional[str] = None) -> ClusterStatus:
        """The status of a cluster (``CLUSTERS CLUSTER <name> STATUS``) as the answering broker
        sees it: a node reports the elector (leader) and partitions (primaries); a proxy
        reports the nodes and the one it uses.

        Args:
            cluster: the cluster's name (default: the first cluster the broker lists).

        Returns:
            The :class:`ClusterStatus`.

        Raises:
            AdminCommandError: no such cluster (also a proxy no client used yet).
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        if cluster is None:
            known = self.clusters()
            if not known:
                raise AdminCommandError(f"broker {self.broker} knows no cluster (a proxy learns of one when a "
                                        f"client opens a queue through it)", command="CLUSTERS LIST")
            cluster = known[0].name
        answer = self.command_json(f"CLUSTERS CLUSTER {_word(cluster, 'cluster')} STATUS")
        return _cluster_status(cluster, answer)

    def domains(self) -> List[str]:
        """The domains the broker has loaded (those with a queue opened since it started), as
        its statistics list them (``STAT SHOW``; bmqbrkr answers a few per second, and this
        retries a refusal for being too frequent until the timeout).

        Returns:
            Domain names, sorted.

        Raises:
            AdminCommandError, TimeoutError, ConnectionLost: as :meth:`command`.
        """
        return sorted(self._domain_queues())

    def queues(self, domain: Optional[str] = None) -> List[str]:
        """The active queues of one domain (``DOMAINS DOMAIN <name> INFOS``), or of every
        domain of :meth:`domains`.

        Args:
            domain: a domain name, or None for all.

        Returns:
            Queue URIs, sorted.

        Raises:
            AdminCommandError: an unknown domain.
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        names = [domain] if domain is not None else self.domains()
        return sorted(uri for name in names for uri in self.domain_info(name).queues)

    def domain_info(self, domain: str) -> DomainInfo:
        """A domain's queues, content and configuration (``DOMAINS DOMAIN <name> INFOS``;
        a cluster node answers it, a proxy does not).

        Args:
            domain: the domain's name.

        Returns:
            The :class:`DomainInfo`.

        Raises:
            AdminCommandError: the broker does not know the domain (it loads one when a queue
                of it is first opened).
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        answer = self.command_json(f"DOMAINS DOMAIN {_word(domain, 'domain')} INFOS")
        info = _get(answer, "domainInfo", default={})
        meter = info.get("capacityMeter", {})
        try:
            config = json.loads(info.get("configJson") or "{}")
        except ValueError:
            config = {}
        return DomainInfo(name=str(info.get("name", domain)), cluster=str(info.get("clusterName", "")),
                          queues=tuple(info.get("queueUris", ())), messages=int(meter.get("numMessages", 0)),
                          bytes=int(meter.get("numBytes", 0)), config=config)

    def queue_stats(self, uri: str) -> BrokerQueueStats:
        """What the broker holds for a queue (``DOMAINS DOMAIN <d> QUEUE <q> INTERNALS``):
        messages and bytes stored, and per appId the messages held and consumers attached.
        In a cluster, ask the queue's primary: a replica reports the storage it replicates but
        no consumers, a node that never saw the queue does not know it, and a proxy's answer
        is partial.

        Args:
            uri: the queue URI (an ``?id=`` part is ignored).

        Returns:
            The :class:`BrokerQueueStats`.

        Raises:
            InvalidURIError: a malformed URI.
            AdminCommandError: the broker does not know the queue (it forgets an unused queue
                after a while).
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        parsed = parse_uri(uri)
        answer = self.command_json(f"DOMAINS DOMAIN {_word(parsed.domain, 'domain')} QUEUE "
                                   f"{_word(parsed.queue, 'queue')} INTERNALS")
        internals = _get(answer, "queueInternals", default={})
        state = internals.get("state", {})
        storage = state.get("storage", {})
        consumers: Dict[str, int] = {}
        engine = _get(internals, "queue", "localQueue", "queueEngine", default={})
        for kind in engine.values():
            for consumer in (kind.get("consumerStates", ()) if isinstance(kind, dict) else ()):
                app_state = consumer.get("appState", {})
                consumers[str(consumer.get("appId", ""))] = int(app_state.get("numConsumers", 0))
        apps: Dict[str, AppStats] = {}
        virtual = storage.get("virtualStorages") or ()
        for app in virtual:
            app_id = str(app.get("appId", ""))
            apps[app_id] = AppStats(app_id, int(app.get("numMessages", 0)), consumers.get(app_id, 0))
        if not virtual:  # a priority or broadcast queue: one default appId
            apps["__default"] = AppStats("__default", int(storage.get("numMessages", 0)),
                                         consumers.get("__default", 0))
        return BrokerQueueStats(uri=str(state.get("uri", parsed.canonical)),
                                partition_id=int(state.get("partitionId", 0)),
                                messages=int(storage.get("numMessages", 0)), bytes=int(storage.get("numBytes", 0)),
                                apps=apps, raw=answer)

    def purge(self, uri: str, app_id: Optional[str] = None) -> PurgeResult:
        """Remove every message of a queue, or of one of its appIds
        (``DOMAINS DOMAIN <d> QUEUE <q> PURGE <appId|*>``). Messages delivered but not
        confirmed go too: their confirms are then ignored. In a cluster only the queue's
        primary purges (its replicas follow); another node or a proxy refuses.

        Args:
            uri: the queue URI; its ``?id=`` part names the appId unless ``app_id`` does.
            app_id: the appId to purge (default: the whole queue, every appId).

        Returns:
            What was removed.

        Raises:
            InvalidURIError: a malformed URI.
            AdminCommandError: an unknown queue or appId.
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        parsed = parse_uri(uri)
        app = app_id if app_id is not None else parsed.app_id
        answer = self.command_json(f"DOMAINS DOMAIN {_word(parsed.domain, 'domain')} QUEUE "
                                   f"{_word(parsed.queue, 'queue')} PURGE {_word(app, 'appId') if app else '*'}")
        results = _purged(answer, f"purge of {uri}")
        if len(results) != 1:
            raise ProtocolError(f"purge of {uri}: expected one purged queue, got {len(results)}")
        return results[0]

    def purge_domain(self, domain: str) -> List[PurgeResult]:
        """Remove every message of every queue of a domain (``DOMAINS DOMAIN <name> PURGE``).

        Args:
            domain: the domain's name.

        Returns:
            What was removed, one :class:`PurgeResult` per queue.

        Raises:
            AdminCommandError: an unknown domain.
            TimeoutError, ConnectionLost: as :meth:`command`.
        """
        answer = self.command_json(f"DOMAINS DOMAIN {_word(domain, 'domain')} PURGE")
        return _purged(answer, f"purge of domain {domain}")

    def broker_config(self) -> Dict[str, Any]:
        """The broker's configuration (``BROKERCONFIG DUMP``).

        Returns:
            The configuration as a JSON object.

        Raises:
            AdminCommandError, TimeoutError, ConnectionLost: as :meth:`command`.
        """
        answer = self.command_json("BROKERCONFIG DUMP")
        text = _get(answer, "brokerConfig", "asJSON", default="{}")
        try:
            config = json.loads(text)
        except ValueError:
            raise ProtocolError(f"BROKERCONFIG DUMP: the configuration is not JSON: {text[:200]!r}") from None
        return config if isinstance(config, dict) else {}

    def stats(self) -> Dict[str, Any]:
        """The broker's statistics of domains and queues (``STAT SHOW``): per domain, per
        queue URI, ``{"values": {"queue_put_msgs": ..., ...}, "appIds": {...}}``, as of its
        last statistics snapshot. (bmqbrkr reports the queues a client no longer uses by
        their last values, which may be zeros.)

        Returns:
            The ``domainQueues`` object of the broker's statistics.

        Raises:
            AdminCommandError, TimeoutError, ConnectionLost: as :meth:`command`.
        """
        return {"domains": self._domain_queues()}

    # ---- internals ---------------------------------------------------------------------
    def _domain_queues(self) -> Dict[str, Any]:
        # bmqbrkr takes a statistics snapshot for each JSON STAT SHOW, at most 4 per snapshot
        # interval (1 s by default) counting its own, and refuses more ("... too often"): such a
        # refusal is retried after a quarter of a second, until the timeout.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = self.command_json("STAT SHOW", timeout=max(0.0, deadline - time.monotonic()))
                break
            except AdminCommandError as exc:
                if "too often" not in exc.broker_message or time.monotonic() + _SNAPSHOT_RETRY > deadline:
                    raise
                logger.debug("admin connection %d: STAT SHOW throttled, retrying", self._id)
                time.sleep(_SNAPSHOT_RETRY)  # the broker's throttle refills with time: nothing to wait on
        stats = answer.get("stats", "{}")
        try:
            parsed = json.loads(stats) if isinstance(stats, str) else stats
        except ValueError:
            raise ProtocolError(f"STAT SHOW: the statistics are not JSON: {str(stats)[:200]!r}") from None
        domains = _get(parsed, "domainQueues", "domains", default={})
        return domains if isinstance(domains, dict) else {}

    def _request(self, text: str, timeout: float) -> str:
        future: "Future[Dict[str, Any]]" = Future()
        with self._lock:
            if self._closed:
                raise SessionClosedError("the admin connection is closed")
            if self._failure is not None:
                raise ConnectionLost(f"the admin connection to {self.broker} was lost: {self._failure}")
            rid = next(self._request_ids)
            self._pending[rid] = future
        try:
            event = _schema.encode_event({"rId": rid, "adminCommand": {"command": text}}, _JSON, "control")
            self._connection.transport.send_control(event)
            try:
                message = future.result(timeout)
            except FutureTimeoutError:
                raise TimeoutError(f"no answer from {self.broker} to admin command {text!r} within {timeout:g} s") \
                    from None
        finally:
            with self._lock:
                self._pending.pop(rid, None)
        response = message.get("adminCommandResponse")
        if response is None:
            status = message.get("status")
            if isinstance(status, dict):  # not bmqbrkr's way, but a broker may answer so
                raise AdminCommandError(f"broker {self.broker} refused admin command {text!r}: "
                                        f"{status.get('category')} {status.get('message', '')!r}",
                                        command=text, broker_message=str(status.get("message", "")),
                                        category=str(status.get("category", "E_UNKNOWN")),
                                        code=int(status.get("code", 0)))
            raise ProtocolError(f"expected an adminCommandResponse, got {sorted(message)}")
        return str(response.get("text", ""))

    def _on_control(self, event: bytes) -> None:
        try:
            message, _ = _schema.decode_event(event, "control")
        except (ProtocolError, ValueError) as exc:
            logger.warning("admin connection %d: dropping an undecodable control message: %s", self._id, exc)
            return
        rid = message.get("rId")
        with self._lock:
            future = self._pending.get(rid) if isinstance(rid, int) else None
        if future is None:
            logger.debug("admin connection %d: answer to rId %s, which nobody waits for", self._id, rid)
            return
        resolve_future(future, message)

    def _on_unexpected(self, event: bytes) -> None:
        logger.debug("admin connection %d: ignoring a PUSH event", self._id)

    def _on_failure(self, connection: Connection, exc: BaseException) -> None:
        with self._lock:
            if self._closed:
                return
            self._failure = exc
            pending, self._pending = self._pending, {}
        # While connecting, the caller of the constructor gets the error itself.
        negotiated = connection.negotiation.done() and connection.negotiation.exception() is None
        logger.log(logging.WARNING if negotiated else logging.INFO, "admin connection %d to %s lost: %s",
                   self._id, self.broker, exc)
        lost = exc if isinstance(exc, ConnectionLost) else ConnectionLost(f"the admin connection to {self.broker} "
                                                                          f"was lost: {exc}")
        for future in pending.values():
            fail_future(future, lost)


# ---- parsing --------------------------------------------------------------------------------
def _get(value: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def _word(text: str, what: str) -> str:
    """A command argument: one word (the broker splits commands at spaces)."""
    if not isinstance(text, str) or not text or any(c.isspace() for c in text):
        raise InvalidArgumentError(f"bad {what} {text!r}: expected one word without spaces")
    return text


def _check_answer(command: str, answer: str) -> None:
    """Raise AdminCommandError when ``answer`` is an error."""
    if answer.startswith(_UNDECODABLE):
        # "Unable to decode command (rc: -1, error: '...')": keep the broker's reason.
        match = re.search(r"error: '(.*)'\)\s*$", answer, re.S)
        reason = match.group(1) if match else answer
        raise AdminCommandError(f"the broker cannot parse admin command {command!r}: {reason}",
                                command=command, broker_message=reason)
    stripped = answer.lstrip()
    if stripped.startswith("{") and '"error"' in stripped[:64]:
        try:
            value = json.loads(stripped)
        except ValueError:
            return
        if isinstance(value, dict) and list(value) == ["error"]:
            reason = str(_get(value, "error", "message", default=""))
            raise AdminCommandError(f"admin command {command!r} failed: {reason}", command=command,
                                    broker_message=reason)


def _node_name(description: Optional[str]) -> Optional[str]:
    """``"[node1, 1]"`` -> ``"node1"``; None for anything else (a node that knows no leader
    yet reports ``" ** NA **"``)."""
    match = _NODE.match(description or "")
    return match.group("name") if match else None


def _cluster_status(cluster: str, answer: Dict[str, Any]) -> ClusterStatus:
    proxy = "clusterProxyStatus" in answer
    status = answer.get("clusterProxyStatus" if proxy else "clusterStatus")
    if not isinstance(status, dict):
        raise ProtocolError(f"cluster status of {cluster}: expected clusterStatus or clusterProxyStatus, "
                            f"got {sorted(answer)}")
    nodes = []
    for node in _get(status, "nodeStatuses", "nodes", default=[]):
        description = str(node.get("description", ""))
        match = _NODE.match(description)
        connected = node.get("isAvailable")
        nodes.append(ClusterNode(
            name=match.group("name") if match else description, node_id=int(match.group("id")) if match else -1,
            status=str(node.get("status", "")), connected=None if connected is None else bool(connected),
            primary_for=tuple(int(p) for p in node.get("primaryForPartitionIds", ())),
        ))
    partitions = tuple(
        PartitionStatus(partition_id=i, primary=_node_name(p.get("primaryNode")),
                        primary_status=str(p.get("primaryStatus", "")), lease_id=int(p.get("primaryLeaseId", 0)),
                        queues_mapped=int(p.get("numQueuesMapped", 0)), active_queues=int(p.get("numActiveQueues", 0)))
        for i, p in enumerate(_get(status, "partitionsInfo", "partitions", default=[]))
    )
    elector = status.get("electorInfo", {}) if not proxy else {}
    return ClusterStatus(
        name=str(status.get("name", cluster)), is_proxy=proxy,
        self_node=None if proxy else _node_name(status.get("selfNodeDescription")),
        leader=_node_name(elector.get("leaderNode")), elector_state=str(elector.get("electorState", "")),
        leader_status=str(elector.get("leaderStatus", "")),
        active_node=_node_name(status.get("activeNodeDescription")) if proxy else None,
        nodes=tuple(sorted(nodes, key=lambda n: (n.node_id, n.name))), partitions=partitions,
        broker_healthy=bool(status.get("isHealthy", False)), raw=answer,
    )


def _purged(answer: Dict[str, Any], what: str) -> List[PurgeResult]:
    results = []
    for entry in _get(answer, "purgedQueues", "queues", default=[]):
        if "error" in entry:
            reason = str(_get(entry, "error", "message", default=""))
            raise AdminCommandError(f"{what} failed: {reason}", command=what, broker_message=reason)
        queue = entry.get("queue", {})
        results.append(PurgeResult(uri=str(queue.get("queueUri", "")), app_id=str(queue.get("appId", "")) or None,
                                   messages=int(queue.get("numMessagesPurged", 0)),
                                   bytes=int(queue.get("numBytesPurged", 0))))
    return results
