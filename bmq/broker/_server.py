"""The embedded broker: TCP listener and the protocol (negotiation, control, PUT, CONFIRM).

Threads (all daemon, named ``bmq-broker-*``):

* ``bmq-broker-accept``: accepts connections and starts a session for each.
* per client ``bmq-broker-read-N`` reads and handles events (negotiation, control, PUT,
  CONFIRM, heartbeats) and ``bmq-broker-write-N`` writes what that client's socket did not
  take at once (see :meth:`ClientSession.send`), so a slow client never blocks the others.
* ``bmq-broker-timer``: heartbeat monitor and delayed sends (fault injection).

Connection I/O lives in :mod:`bmq.broker._connection`, routing in :mod:`bmq.broker._queues`.
All queue and routing state lives under one lock (``Broker._lock``); readers hold it only
while they update state and hand the resulting PUSH bytes to the sessions, which never
blocks (at most a non-blocking write).

A reader handles what one ``recv`` brought as a whole: consecutive PUT and CONFIRM events
under one hold of the lock with one PUSH event per consumer, then one ACK event.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .. import _codec, _schema
from .._protocol import ACK_UNKNOWN, DEFAULT_APP_ID, FEATURE_MESSAGE_PROPERTIES, MESSAGE_PROPERTIES_EX
from ..exceptions import ProtocolError
from . import _admin
from ._connection import ClientSession, Scheduler, shutdown_socket
from ._authn import Authenticators
from ._faults import Faults
from ._queues import (
    DEFAULT_DOMAINS,
    Domain,
    Queue,
    QueueHandle,
    StatusError,
    StoredMessage,
    SubStream,
    make_consumers,
    parse_uri,
)

__all__ = ["Broker"]

logger = logging.getLogger(__name__)

BROKER_VERSION = 999999  # what a dev bmqbrkr reports; it unlocks every SDK feature gate
FEATURES = (
    "PROTOCOL_ENCODING:BER,JSON;HA:GRACEFUL_SHUTDOWN,GRACEFUL_SHUTDOWN_V2,BROADCAST_TO_PROXIES;"
    "MPS:MESSAGE_PROPERTIES_EX;SUBSCRIPTIONS:CONFIGURE_STREAM"
)
# Minimum and recommended SDK versions per language (protocol §8.4).
_SDK_GATES = {"E_CPP": (10500, 10900), "E_JAVA": (2, 2)}
_QUEUE_READ, _QUEUE_WRITE = 2, 4
_RESERVED_QUEUE_ID = 4294967286
_ZERO_GUID = bytes(16)
_PROPERTIES = _codec.PUT_MESSAGE_PROPERTIES
_ACK_REQUESTED = _codec.PUT_ACK_REQUESTED
_DATA_EVENTS = frozenset((_codec.EVENT_PUT, _codec.EVENT_CONFIRM))
_clock = time.monotonic  # the dedup window's clock (tests replace it)


class Broker:
    """An in-process BlazingMQ broker speaking the real protocol on loopback.

    Args:
        host: address to bind; only this one is ever bound (default loopback).
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        domains: domain name -> :class:`Domain`; default :data:`DEFAULT_DOMAINS`.
        heartbeat_interval_ms: heartbeat period announced to clients and used to monitor them.
        max_missed_heartbeats: silent periods after which a client is dropped (0 disables
            the monitor; requests are still answered).
        max_event_size: largest event accepted; a longer length word closes the connection.
        check_crc: verify the CRC32-C of every PUT and NACK (status 5) a mismatch; the real
            broker does not check it (protocol §2.5), a test broker should.
        authenticators: mechanism -> settings of the credentials accepted, as bmqbrkr's
            built-in authenticators: ``{"BASIC": {"user": "password"}}`` (see
            :mod:`bmq.broker._authn`); none by default.
        allow_anonymous: whether a client may negotiate without authenticating (False is
            bmqbrkr's ``anonymousCredential: disallow``: such a client's connection is closed).
        tls: a server ``ssl.SSLContext`` (:func:`bmq.broker.tls_server_context` makes one,
            optionally requiring client certificates): every connection starts with a TLS
            handshake (within 10 s), as a TLS terminator in front of bmqbrkr would; a client
            that fails it is logged and dropped. None: plaintext.

    Attributes:
        faults: the fault-injection switches (:class:`~bmq.broker.Faults`).
        domains: the domain configuration; change it only before :meth:`start`.

    Inspection for tests: :attr:`address`, :attr:`port`, :meth:`clients`,
    :meth:`queue_messages`, :meth:`wait_for`.

    Thread-safety: every public method is safe from any thread.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        domains: Optional[Mapping[str, Domain]] = None,
        *,
        heartbeat_interval_ms: int = 3000,
        max_missed_heartbeats: int = 10,
        max_event_size: int = _codec.MAX_EVENT_SIZE,
        check_crc: bool = True,
        authenticators: Optional[Mapping[str, Mapping[str, str]]] = None,
        allow_anonymous: bool = True,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise TypeError(f"tls must be a server ssl.SSLContext (see bmq.broker.tls_server_context), "
                            f"not {type(tls).__name__}")
        self.tls = tls
        self.host = host
        self._requested_port = port
        self.domains: Dict[str, Domain] = dict(DEFAULT_DOMAINS if domains is None else domains)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_missed_heartbeats = max_missed_heartbeats
        self.max_event_size = max_event_size
        self.check_crc = check_crc
        self.authenticators = Authenticators(authenticators, allow_anonymous=allow_anonymous)
        self.faults = Faults(self)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._waiters = 0  # threads in wait_for: skip notify_all on the hot path otherwise
        # While a PUT event is handled, deliveries collect here (session -> PUSH specs) so that
        # each consumer gets one PUSH event per PUT event rather than one per message.
        self._push_batch: Optional[Dict[ClientSession, List[tuple]]] = None
        self._queues: Dict[str, Queue] = {}
        self._sessions: Dict[int, ClientSession] = {}
        self._session_ids = itertools.count(1)
        self._guids = _codec.GuidGenerator()
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[threading.Thread] = None
        self._scheduler: Optional[Scheduler] = None
        self._port = 0
        self._running = False
        self._hostname = socket.gethostname()

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound TCP port (0 before :meth:`start`)."""
        return self._port

    @property
    def address(self) -> str:
        """``"tcp://HOST:PORT"``, what a client's ``broker`` option takes."""
        return f"tcp://{self.host}:{self._port}"

    def start(self) -> "Broker":
        """Bind and start serving in background threads.

        Returns:
            self, so ``Broker().start()`` chains.

        Raises:
            OSError: the address cannot be bound.
            RuntimeError: already running.
        """
        if self._running:
            raise RuntimeError("broker already running")
        self._listen(self._port or self._requested_port)
        self._scheduler = Scheduler()
        self._running = True
        self._schedule_heartbeat()
        logger.info("broker listening on %s", self.address)
        return self

    def _listen(self, port: int) -> None:
        listener = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, port))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        listener.settimeout(0.5)  # bounded accept() so a stop never hangs on any platform
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, args=(listener,), name="bmq-broker-accept", daemon=True)
        self._acceptor.start()

    def _stop_listening(self, timeout: float) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            shutdown_socket(listener)
            listener.close()
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout)
        self._acceptor = None

    def _drop_all(self, timeout: float) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.close()
        deadline = time.monotonic() + timeout
        for session in sessions:
            session.join(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: close the listener and every connection, end all threads.

        Idempotent and bounded by ``timeout`` (seconds) overall.
        """
        if not self._running:
            return
        self._running = False
        self._stop_listening(timeout)
        self._drop_all(timeout)
        if self._scheduler is not None:
            self._scheduler.stop(timeout)
            self._scheduler = None
        logger.info("broker on port %d stopped", self._port)

    def restart(self, keep_queues: bool = True, timeout: float = 5.0) -> None:
        """Stop listening, drop every client, and listen again on the same port.

        Args:
            keep_queues: keep queue contents (unconfirmed messages become deliverable
                again); False starts with empty queues and an empty dedup window.
            timeout: bound on waiting for the old connections' threads.
        """
        self._stop_listening(timeout)
        self._drop_all(timeout)
        if not keep_queues:
            with self._lock:
                self._queues.clear()
        self._listen(self._port)
        logger.info("broker restarted on %s (queues %s)", self.address, "kept" if keep_queues else "dropped")

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, address = listener.accept()
            except socket.timeout:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return
            if self._listener is not listener:
                sock.close()
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = ClientSession(self, sock, f"{address[0]}:{address[1]}", next(self._session_ids), self.tls)
            with self._lock:
                self._sessions[session.id] = session
                self._notify()
            logger.info("client %d connected from %s", session.id, session.peer)
            session.start()

    # ---- inspection (tests) ----------------------------------------------------------
    def _sessions_snapshot(self) -> List[ClientSession]:
        with self._lock:
            return [s for s in self._sessions.values() if s.is_open]

    def clients(self) -> List[ClientSession]:
        """Connected clients (objects with ``.id``, ``.peer``, ``.client_identity``).

        A connection being closed is no longer listed, even while its threads wind down.
        """
        return self._sessions_snapshot()

    def queue_messages(self, uri: str, app_id: Optional[str] = None) -> List[StoredMessage]:
        """Messages the queue currently holds (delivered-but-unconfirmed included).

        Args:
            uri: the queue URI (a ``?id=`` part is ignored).
            app_id: for fan-out queues, only the messages still held for this appId.

        Returns:
            Oldest first; empty if the queue was never opened.

        Raises:
            KeyError: ``app_id`` is not an appId of the queue.
        """
        with self._lock:
            queue = self._queues.get(uri.split("?", 1)[0])
            return [] if queue is None else queue.held_messages(app_id)

    def wait_for(self, predicate: Callable[[], Any], timeout: float) -> bool:
        """Wait until ``predicate()`` is true, re-checking after every state change.

        ``predicate`` runs with the broker's state lock held: keep it to inspection calls
        (:meth:`clients`, :meth:`queue_messages`), never blocking I/O.

        Returns:
            Whether it became true within ``timeout`` seconds.
        """
        with self._changed:
            self._waiters += 1
            try:
                return bool(self._changed.wait_for(predicate, timeout))
            finally:
                self._waiters -= 1

    def _notify(self) -> None:
        """Wake :meth:`wait_for` callers; call with the lock held."""
        if self._waiters:
            self._changed.notify_all()

    # ---- heartbeats ------------------------------------------------------------------
    def _schedule_heartbeat(self) -> None:
        if self._scheduler is not None and self.heartbeat_interval_ms > 0:
            self._scheduler.call_later(self.heartbeat_interval_ms / 1000.0, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        if not self._running:
            return
        limit = self.max_missed_heartbeats
        if limit > 0 and not self.faults.heartbeats_stopped:
            for session in self._sessions_snapshot():
                if not session.negotiated:
                    continue
                if session.heard_since_last_check():
                    session.missed_heartbeats = 0
                    if session.reader_busy:
                        # Its reader cannot answer the client's heartbeats now: tell the
                        # client that the broker is alive from here instead.
                        session.send(_codec.HEARTBEAT_REQ)
                    continue
                if session.missed_heartbeats < limit:
                    session.send(_codec.HEARTBEAT_REQ)
                else:
                    logger.warning("client %d (%s) missed %d heartbeats, dropping it", session.id, session.peer, limit)
                    session.close()
                session.missed_heartbeats += 1
        self._schedule_heartbeat()

    def _reset_heartbeat_counters(self) -> None:
        for session in self._sessions_snapshot():
            session.alive = True
            session.missed_heartbeats = 0

    # ---- event handling (reader threads) ---------------------------------------------
    def _handle_events(self, session: ClientSession, events: List[bytes]) -> None:
        """Handle the events of one ``recv``, then send their ACKs as one ACK event.

        Consecutive PUT and CONFIRM events are handled together (see :meth:`_on_data`); any
        other event ends such a run and is handled on its own, in order.
        """
        run: List[bytes] = []
        for event in events:
            # The type byte without a full header check: _on_data validates each event.
            if event[4] & 0x3F in _DATA_EVENTS and session.negotiated and not session.disconnected \
                    and not session.admin:  # an admin client's are dropped, as bmqbrkr does
                run.append(event)
                continue
            if run:
                self._on_data(session, run)
                run = []
            self._handle_event(session, event)
            if not session.is_open:
                break
        else:
            if run:
                self._on_data(session, run)
        self._flush_acks(session)

    def _handle_event(self, session: ClientSession, event: bytes) -> None:
        """Handle one event that is not part of a PUT/CONFIRM run (see :meth:`_handle_events`)."""
        try:
            _, event_type, _, _ = _codec.unpack_event_header(event)
        except ProtocolError as exc:
            logger.warning("client %s: dropping invalid event: %s", session.peer, exc)
            return
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("client %s: event type %d, %d bytes", session.peer, event_type, len(event))
        if event_type == _codec.EVENT_HEARTBEAT_REQ:
            if not self.faults.heartbeats_stopped:
                session.send(_codec.HEARTBEAT_RSP)
            return
        if event_type == _codec.EVENT_HEARTBEAT_RSP:
            return
        if event_type == _codec.EVENT_AUTHENTICATION:  # before negotiating, or a renewal after
            self._authenticate(session, event)
            return
        if not session.negotiated:
            self._negotiate(session, event, event_type)
            return
        if session.disconnected:
            return
        if event_type == _codec.EVENT_CONTROL:
            self._flush_acks(session)  # a close/disconnect answer must not overtake ACKs
            self._on_control(session, event)
        else:
            logger.warning("client %s: dropping unexpected event type %d", session.peer, event_type)

    def _send_control(
        self,
        session: ClientSession,
        message: Dict[str, Any],
        kind: str = "control",
        encoding: Optional[int] = None,
        then: Sequence[bytes] = (),
    ) -> None:
        """Send a control message, then the events in ``then`` (delayed with it, if at all)."""
        data = _schema.encode_event(_schema.with_defaults(message, kind), session.encoding if encoding is None else encoding, kind)
        delay = self.faults.control_delay
        if delay > 0 and self._scheduler is not None:
            self._scheduler.call_later(delay, _send_all, session, [data, *then])
        else:
            _send_all(session, [data, *then])

    # ---- negotiation -------------------------------------------------------------------
    def _negotiate(self, session: ClientSession, event: bytes, event_type: int) -> None:
        try:
            if event_type != _codec.EVENT_CONTROL:
                raise ProtocolError("first event is not a negotiation message", event_type)
            message, _ = _schema.decode_event(event, "negotiation")
            identity = message.get("clientIdentity")
            if not isinstance(identity, dict):
                raise ProtocolError("first message is not a ClientIdentity", event_type)
        except (ProtocolError, ValueError) as exc:
            logger.warning("client %s: negotiation failed, closing: %s", session.peer, exc)
            session.close()
            return
        if not session.authenticated and not self.authenticators.allow_anonymous:
            logger.warning("client %s negotiated without authenticating (anonymous clients are disallowed), "
                           "closing", session.peer)
            session.close()
            return
        identity = _schema.with_defaults({"clientIdentity": identity}, "negotiation")["clientIdentity"]
        if identity.get("clientType") == "E_UNKNOWN":
            logger.warning("client %s: clientType E_UNKNOWN, closing", session.peer)
            session.close()
            return
        features = identity.get("features", "") or ""
        session.client_identity = identity
        session.admin = identity.get("clientType") == "E_TCPADMIN"
        session.encoding = _schema.best_encoding(features)
        session.reads_new_properties = MESSAGE_PROPERTIES_EX in _schema.parse_features(features).get(
            FEATURE_MESSAGE_PROPERTIES, ())
        session.guid_generating = bool((identity.get("guidInfo") or {}).get("clientId"))
        status, deprecated = _version_status(identity)
        if self.faults.refusing_negotiation:
            status = ("E_REFUSED", -1, "Connection not authorized")
        self._send_control(session, self._broker_response(session, status, deprecated), "negotiation")
        if status[0] != "E_SUCCESS":
            logger.info("client %d (%s) refused: %s", session.id, session.peer, status[2])
            session.close(flush=True)
            return
        session.negotiated = True
        logger.debug(
            "client %d (%s) negotiated: %s pid %s, %s",
            session.id,
            session.peer,
            identity.get("processName", ""),
            identity.get("pid", 0),
            identity.get("sdkLanguage", ""),
        )

    def _authenticate(self, session: ClientSession, event: bytes) -> None:
        try:
            message, encoding = _schema.decode_event(event, "authentication")
        except (ProtocolError, ValueError) as exc:
            logger.warning("client %s: bad authentication message, closing: %s", session.peer, exc)
            session.close()
            return
        request = message.get("authenticationRequest")
        if request is None:
            session.close()
            return
        given = str(request.get("mechanism", ""))
        if session.auth_mechanism is not None and given != session.auth_mechanism:
            # bmqbrkr: one mechanism for the life of a connection; a change ends it unanswered.
            logger.warning("client %s changed its authentication mechanism, closing", session.peer)
            session.close()
            return
        mechanism = given.upper()
        category, code, text, lifetime_ms = self.authenticators.check(mechanism, bytes(request.get("data", b"")))
        if category == "E_SUCCESS" and self.faults.take_authentication_refusal():
            category, code, text, lifetime_ms = "E_REFUSED", -11, f"Failed to authenticate with mechanism " \
                f"'{mechanism}'. (rc = -1). Detailed error: refused by fault injection", None
        if category == "E_SUCCESS" and lifetime_ms is not None and self.faults.authentication_lifetime_ms:
            lifetime_ms = self.faults.authentication_lifetime_ms
        response: Dict[str, Any] = {"status": {"category": category, "code": code, "message": text}}
        if lifetime_ms is not None:
            response["lifetimeMs"] = lifetime_ms
        data = _schema.encode_event({"authenticationResponse": response}, encoding, "authentication")
        refused = category != "E_SUCCESS"
        generation = session.authenticate(refused, given)
        if refused:
            logger.info("client %d (%s): %s authentication refused: %s", session.id, session.peer, mechanism, text)
        elif lifetime_ms is not None and self._scheduler is not None:
            # A credential not renewed within its lifetime ends the connection, as in bmqbrkr.
            self._scheduler.call_later(lifetime_ms / 1000.0, session.expire_authentication, generation)
        delay = self.faults.authentication_delay
        if delay > 0 and self._scheduler is not None:
            self._scheduler.call_later(delay, session.send_then_close if refused else _send_all,
                                       *((data,) if refused else (session, [data])))
        elif refused:
            session.send_then_close(data)
        else:
            session.send(data)

    def _broker_response(self, session: ClientSession, status: Tuple[str, int, str], deprecated: bool) -> Dict[str, Any]:
        return {
            "brokerResponse": {
                "result": {"category": status[0], "code": status[1], "message": status[2]},
                "protocolVersion": 1,
                "brokerVersion": BROKER_VERSION,
                "isDeprecatedSdk": deprecated,
                "brokerIdentity": {
                    "protocolVersion": 1,
                    "sdkVersion": BROKER_VERSION,
                    "clientType": "E_TCPBROKER",
                    "processName": "bmq.broker",
                    "pid": os.getpid(),
                    "sessionId": session.id,
                    "hostName": self._hostname,
                    "features": FEATURES,
                    "clusterName": "",
                    "clusterNodeId": -1,
                    "sdkLanguage": "E_CPP",
                    "guidInfo": {"clientId": "", "nanoSecondsFromEpoch": 0},
                    "userAgent": "bmqbrkr:99.99.99",
                },
                "heartbeatIntervalMs": self.heartbeat_interval_ms,
                # bmqbrkr announces no dead-link detection to an admin client.
                "maxMissedHeartbeats": 0 if session.admin else self.max_missed_heartbeats,
            }
        }

    # ---- control requests ----------------------------------------------------------------
    def _on_control(self, session: ClientSession, event: bytes) -> None:
        try:
            message, _ = _schema.decode_event(event, "control")
            # A BER string need not be UTF-8 (it decodes with surrogates in its place), and the
            # answer echoing it (an appId, a URI) could not be encoded in JSON: refused before
            # anything is done, rather than done and never answered.
            _schema.encode_body(message, _schema.ENCODING_JSON, "control")
        except (ProtocolError, ValueError) as exc:
            logger.warning("client %s: dropping undecodable control message: %s", session.peer, exc)
            return
        rid = message.get("rId")
        choice = next((key for key in message if key != "rId"), None)
        if session.admin or choice == "adminCommand":
            self._on_admin_command(session, rid, choice, message.get(choice or ""))
            return
        handler = self._REQUESTS.get(choice or "")
        if rid is None or rid < 0 or handler is None:
            logger.warning("client %s: dropping control message %s (rId %s)", session.peer, choice, rid)
            return
        with self._lock, self._batched_pushes() as batch:
            try:
                reply = handler(self, session, message[choice])
            except StatusError as exc:
                logger.info("client %d: %s failed: %s %s", session.id, choice, exc.category, exc.message)
                reply = ("status", exc.as_status())
            self._notify()
            # bmqbrkr answers a request before delivering what it released (a configure of a
            # queue that already holds messages); the official SDK crashes on a PUSH for a
            # subscription whose configure it has not seen answered. Sent under the lock, so
            # no PUSH from another reader thread can slip in between either.
            pushes = self._push_events(session, batch.pop(session, []))
            self._send_control(session, {"rId": rid, reply[0]: reply[1]}, then=pushes)

    def _on_admin_command(self, session: ClientSession, rid: Any, choice: Optional[str], request: Any) -> None:
        """An admin client's command (see :mod:`bmq.broker._admin`); as bmqbrkr, an admin client
        sends nothing else and a regular client no admin command: those are dropped."""
        if not session.admin or choice != "adminCommand" or not isinstance(rid, int) or rid < 0:
            logger.warning("client %s (%s): dropping control message %s (rId %s)", session.peer,
                           "admin" if session.admin else "not an admin client", choice, rid)
            return
        command = str((request or {}).get("command", ""))
        with self._lock:
            text = _admin.execute(command, self.domains, self._queues, self._sessions_snapshot())
            self._notify()
        logger.info("admin client %d: %r", session.id, command)
        self._send_control(session, {"rId": rid, "adminCommandResponse": {"text": text}})

    def _open_queue(self, session: ClientSession, request: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        params = request.get("handleParameters") or {}
        uri = params.get("uri", "")
        q_id = int(params.get("qId", 0))
        flags = int(params.get("flags", 0))
        reads, writes = int(params.get("readCount", 0)), int(params.get("writeCount", 0))
        if reads <= 0 and writes <= 0:
            raise StatusError("E_INVALID_ARGUMENT", "At least one of ([read|write]) Count must be >0")
        if int(params.get("adminCount", 0)) != 0:
            raise StatusError("E_INVALID_ARGUMENT", "adminCount must be 0")
        if bool(flags & _QUEUE_READ) != (reads > 0):
            raise StatusError("E_INVALID_ARGUMENT", "READ flag and readCount disagree")
        if bool(flags & _QUEUE_WRITE) != (writes > 0):
            raise StatusError("E_INVALID_ARGUMENT", "WRITE flag and writeCount disagree")
        if q_id >= _RESERVED_QUEUE_ID:
            raise StatusError("E_INVALID_ARGUMENT", f"qId {q_id} is reserved")
        domain_name, canonical, _ = parse_uri(uri)
        sub_info = params.get("subIdInfo") or {}
        sub_id = int(sub_info.get("subId", 0))
        app_id = sub_info.get("appId", DEFAULT_APP_ID) or DEFAULT_APP_ID
        if writes > 0 and reads == 0 and app_id != DEFAULT_APP_ID:
            raise StatusError("E_INVALID_ARGUMENT", "a writer cannot have an appId")
        domain = self.domains.get(domain_name)
        if domain is None:
            raise StatusError("E_UNKNOWN", f"Domain file 'etc/domains/{domain_name}.json' doesn't exist", -1)
        queue = self._queues.get(canonical)
        if queue is None:
            queue = self._queues[canonical] = Queue(canonical, domain_name, domain, self._send_pushes)
        # bmqbrkr's checks, with its categories and texts (mqbblp::RootQueueEngine).
        if domain.mode == "fanout" and reads > 0 and app_id == DEFAULT_APP_ID:
            raise StatusError("E_UNKNOWN", "Reader of a fanout queue requires an appId to be specified.", -1)
        if domain.mode != "fanout" and app_id != DEFAULT_APP_ID:
            raise StatusError("E_UNKNOWN", "AppId should not be specified when opening a non-fanout queue", -1)
        if reads > 0 and queue.app(app_id) is None:
            raise StatusError("E_REFUSED", f"appId '{app_id}' is not configured for the queue '{canonical}'", -1)
        handle = session.handles.get(q_id)
        if handle is not None and handle.uri != canonical:
            raise StatusError("E_INVALID_ARGUMENT", f"qId {q_id} is already used for '{handle.uri}'")
        if handle is None:
            handle = session.handles[q_id] = QueueHandle(session, q_id, queue, canonical)
            session.closed_queue_ids.discard(q_id)
        handle.write_count += writes
        if reads > 0:
            stream = handle.substreams.get(sub_id)
            if stream is None:
                stream = handle.substreams[sub_id] = SubStream(handle, sub_id, app_id)
            stream.read_count += reads
        logger.info("client %d opened %s (qId %d, flags %d)", session.id, uri, q_id, flags)
        return "openQueueResponse", {
            "originalRequest": request,
            "routingConfiguration": {"flags": domain.routing_flags},
            "deduplicationTimeMs": domain.deduplication_time_ms,
        }

    def _handle_for(self, session: ClientSession, q_id: int, after_close: str) -> QueueHandle:
        handle = session.handles.get(q_id)
        if handle is None:
            if q_id in session.closed_queue_ids:
                raise StatusError("E_UNKNOWN", after_close)
            raise StatusError("E_UNKNOWN", "No queue with specified Id")
        return handle

    def _configure(self, session: ClientSession, q_id: int, app_id: str, subscriptions: List[Dict[str, Any]]) -> None:
        if self.faults.take_configure_refusal():
            raise StatusError("E_REFUSED", "configure refused (fault injected)")
        handle = self._handle_for(session, q_id, "Unexpected configureQueue request")
        stream = handle.stream_for_app(app_id)
        if stream is None:
            raise StatusError("E_UNKNOWN", "No queue with specified appId")
        handle.queue.set_consumers(stream, make_consumers(stream, subscriptions))

    def _configure_stream(self, session: ClientSession, request: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        params = request.get("streamParameters") or {}
        self._configure(
            session,
            int(request.get("qId", 0)),
            params.get("appId", DEFAULT_APP_ID) or DEFAULT_APP_ID,
            list(params.get("subscriptions") or ()),
        )
        return "configureStreamResponse", {"request": request}

    def _configure_queue_stream(self, session: ClientSession, request: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        params = request.get("streamParameters") or {}
        sub_info = params.get("subIdInfo") or {}
        # The old message is one consumer whose PUSH id is the subQueueId (protocol §8.5).
        subscription = {"sId": int(sub_info.get("subId", 0)), "consumers": [params]}
        self._configure(
            session,
            int(request.get("qId", 0)),
            sub_info.get("appId", DEFAULT_APP_ID) or DEFAULT_APP_ID,
            [subscription],
        )
        return "configureQueueStreamResponse", {"request": request}

    def _close_queue(self, session: ClientSession, request: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        params = request.get("handleParameters") or {}
        q_id = int(params.get("qId", 0))
        handle = self._handle_for(session, q_id, "Duplicate closeQueue request")
        reads, writes = int(params.get("readCount", 0)), int(params.get("writeCount", 0))
        if reads <= 0 and writes <= 0 and int(params.get("adminCount", 0)) <= 0:
            raise StatusError("E_INVALID_ARGUMENT", "At least one of ([read|write|admin]) Count must be >0")
        if reads > 0:
            sub_id = int((params.get("subIdInfo") or {}).get("subId", 0))
            stream = handle.substreams.get(sub_id)
            if stream is None:
                raise StatusError("E_UNKNOWN", "No subStream of the queue with specified subId")
            stream.read_count -= reads
            if stream.read_count <= 0:
                del handle.substreams[sub_id]
                handle.queue.remove_stream(stream)
        handle.write_count = max(0, handle.write_count - writes)
        if request.get("isFinal") or (not handle.substreams and handle.write_count == 0):
            self._release_handle(session, handle)
        logger.info("client %d closed %s (qId %d)", session.id, params.get("uri", handle.uri), q_id)
        return "closeQueueResponse", {}

    def _release_handle(self, session: ClientSession, handle: QueueHandle) -> None:
        for stream in handle.substreams.values():
            handle.queue.remove_stream(stream)
        handle.substreams.clear()
        del session.handles[handle.q_id]
        session.closed_queue_ids.add(handle.q_id)

    def _disconnect(self, session: ClientSession, request: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        for handle in list(session.handles.values()):
            self._release_handle(session, handle)
        session.disconnected = True
        logger.debug("client %d (%s) disconnecting", session.id, session.peer)
        return "disconnectResponse", {}

    _REQUESTS: Dict[str, Callable[["Broker", ClientSession, Dict[str, Any]], Tuple[str, Dict[str, Any]]]] = {
        "openQueue": _open_queue,
        "configureStream": _configure_stream,
        "configureQueueStream": _configure_queue_stream,
        "closeQueue": _close_queue,
        "disconnect": _disconnect,
    }

    # ---- data path ---------------------------------------------------------------------
    def _on_data(self, session: ClientSession, events: List[bytes]) -> None:
        """Handle a run of PUT and CONFIRM events in order, under one hold of the lock.

        Deliveries they make collect in a batch and go out at the end, still under the lock
        (so that they stay ordered across reader threads): one PUSH event per consumer session
        for the whole run rather than one per event. Consecutive CONFIRM events are handled as
        one; their ACKs go to ``session.pending_acks``.
        """
        debug = logger.isEnabledFor(logging.DEBUG)
        confirms: List[tuple] = []
        batch: Dict[ClientSession, List[tuple]] = {}
        with self._lock:
            self._push_batch = batch
            try:
                for event in events:
                    if debug:
                        logger.debug("client %s: event type %d, %d bytes", session.peer, event[4] & 0x3F, len(event))
                    try:
                        if event[4] & 0x3F == _codec.EVENT_CONFIRM:
                            confirms += _codec.iter_confirms(event)
                            continue
                        messages = _codec.iter_put_messages(event)
                    except ProtocolError as exc:
                        kind = "CONFIRM" if event[4] & 0x3F == _codec.EVENT_CONFIRM else "PUT"
                        logger.warning("client %s: dropping malformed %s event: %s", session.peer, kind, exc)
                        continue
                    if confirms:
                        self._confirm(session, confirms)
                        confirms = []
                    self._store_puts(session, messages)
                if confirms:
                    self._confirm(session, confirms)
                self._notify()
            finally:
                self._push_batch = None
                for target, specs in batch.items():
                    _send_all(target, self._push_events(target, specs))

    @contextlib.contextmanager
    def _batched_pushes(self) -> Iterator[Dict[ClientSession, List[tuple]]]:
        """Collect deliveries made inside the block; send one PUSH event per session at the end.

        Call with the broker lock held (deliveries stay ordered across reader threads).

        Yields:
            The batch (session -> PUSH specs); a session the block removes from it is left to
            the block to serve.
        """
        self._push_batch = {}
        try:
            yield self._push_batch
        finally:
            batch, self._push_batch = self._push_batch, None
            for session, specs in batch.items():
                self._send_pushes(session, specs)

    def _store_puts(self, session: ClientSession, messages: List[tuple]) -> None:
        """Validate, store and route PUT messages; their ACKs go to ``session.pending_acks``."""
        append_ack = session.pending_acks.append
        now = _clock()
        check_crc = self.check_crc
        take_nack = self.faults.take_nack
        handles = session.handles
        guid_generating = session.guid_generating
        crc32c = _codec.crc32c
        last_q_id = None
        queue = None
        for flags, q_id, guid, crc, compression, schema_id, _options, app_data in messages:
            if q_id != last_q_id:  # the handle, once per run of one queue's messages
                if queue is not None:
                    queue.deliver()
                last_q_id = q_id
                handle = handles.get(q_id)
                queue = handle.queue if handle is not None and handle.write_count > 0 else None
                if queue is not None:
                    queue.expire_dedup(now)
            if guid_generating:
                correlation_id = 0
                wants_ack = flags & _ACK_REQUESTED
            else:
                # Legacy client: the GUID field carries a 24-bit correlation id, whose
                # presence (not the flag) decides whether an ACK is wanted (protocol §2.3);
                # the broker names the message.
                correlation_id = int.from_bytes(guid[1:4], "big")
                wants_ack = correlation_id != 0
                guid = _ZERO_GUID if queue is None else self._guids.next()
            if queue is None or guid == _ZERO_GUID:
                status = ACK_UNKNOWN
            elif check_crc and crc32c(app_data) != crc:
                logger.warning("client %s: PUT %s has a bad CRC32-C, NACKing", session.peer, guid.hex())
                status = ACK_UNKNOWN
            else:
                status = take_nack()
                if status == 0:
                    if compression and not schema_id and flags & _PROPERTIES:
                        app_data, compression = _decompress_old_style(app_data, flags, compression)
                    status = queue.put((guid, app_data, flags & _PROPERTIES, compression, schema_id), now)
            if status or wants_ack:
                append_ack((status, correlation_id, guid, q_id))
        if queue is not None:
            queue.deliver()

    def _flush_acks(self, session: ClientSession) -> None:
        acks = session.pending_acks
        if not acks:
            return
        session.pending_acks = []
        event = _codec.build_ack_event(acks)
        faults = self.faults
        if faults.acks_withheld:
            session.withhold(event)
        elif faults.ack_delay > 0 and self._scheduler is not None:
            self._scheduler.call_later(faults.ack_delay, session.send, event)
        else:
            session.send(event, block=True)

    def _confirm(self, session: ClientSession, confirms: List[tuple]) -> None:
        """Confirm ``(q_id, guid, sub_id)`` records from ``session``; call with the lock held."""
        by_stream: Dict[SubStream, List[bytes]] = {}
        handles = session.handles
        last_q_id = last_sub_id = None
        guids: Optional[List[bytes]] = None
        for q_id, guid, sub_id in confirms:
            if q_id != last_q_id or sub_id != last_sub_id:  # the stream, once per run of one
                last_q_id, last_sub_id = q_id, sub_id
                handle = handles.get(q_id)
                stream = None if handle is None else handle.substreams.get(sub_id)
                if stream is None or handle.queue.domain.mode == "broadcast":  # type: ignore[union-attr]
                    guids = None
                else:
                    guids = by_stream.get(stream)
                    if guids is None:
                        guids = by_stream[stream] = []
            if guids is None:
                logger.warning("client %s: dropping CONFIRM for qId %d subId %d", session.peer, q_id, sub_id)
                continue
            guids.append(guid)
        for stream, guids in by_stream.items():
            for guid in stream.handle.queue.confirm(stream, guids):
                logger.warning("client %s: CONFIRM of unknown GUID %s", session.peer, guid.hex())

    def _send_pushes(self, session: ClientSession, specs: List[tuple]) -> None:
        batch = self._push_batch
        if batch is not None:
            batch.setdefault(session, []).extend(specs)
            return
        _send_all(session, self._push_events(session, specs))

    @staticmethod
    def _push_events(session: ClientSession, specs: List[tuple]) -> List[bytes]:
        """PUSH events carrying ``specs``, in the properties style ``session`` reads."""
        if not specs:
            return []
        if not session.reads_new_properties:
            specs = [_old_style_push(spec) for spec in specs]
        return _codec.build_push_events(specs)

    def _session_gone(self, session: ClientSession) -> None:
        with self._lock:
            for handle in list(session.handles.values()):
                self._release_handle(session, handle)
            self._sessions.pop(session.id, None)
            self._notify()
        logger.info("client %d (%s) disconnected", session.id, session.peer)


def _send_all(session: ClientSession, events: Sequence[bytes]) -> None:
    for event in events:
        session.send(event)


def _version_status(identity: Mapping[str, Any]) -> Tuple[Tuple[str, int, str], bool]:
    """(status, isDeprecatedSdk) for a ClientIdentity, per the broker's SDK version gates."""
    gate = _SDK_GATES.get(identity.get("sdkLanguage", "E_CPP"))
    if gate is None:
        return ("E_SUCCESS", 0, ""), False
    version = int(identity.get("sdkVersion", BROKER_VERSION))
    if version < gate[0]:
        return ("E_NOT_SUPPORTED", -1, f"Client version {version} is not supported"), False
    return ("E_SUCCESS", 0, ""), version < gate[1]


def _decompress_old_style(app_data: bytes, flags: int, compression: int) -> Tuple[bytes, int]:
    """Old-style properties compressed with the payload are stored decompressed (protocol §2.6)."""
    area, payload = _codec.split_app_data(app_data, flags, compression, 0)
    return (area or b"") + payload, _codec.COMPRESSION_NONE


def _old_style_push(spec: tuple) -> tuple:
    """A PUSH spec rewritten for a client that cannot read MESSAGE_PROPERTIES_EX (protocol §4.4)."""
    q_id, guid, sub_ids, app_data, flags, compression, schema_id = spec
    if not schema_id or not flags & _codec.PUSH_MESSAGE_PROPERTIES:
        return spec
    area, payload = _codec.split_app_data(app_data, flags, compression, schema_id)
    old_area = _codec.encode_properties(_codec.decode_properties(area or b"", True), new_style=False)
    return (q_id, guid, sub_ids, old_area + payload, flags, _codec.COMPRESSION_NONE, 0)
