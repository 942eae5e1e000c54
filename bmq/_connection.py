"""Connection establishment: one transport to the broker, negotiated before the session uses it.

:meth:`Connection.establish` connects the transport, sends the ClientIdentity and waits for the
BrokerResponse (protocol §8.4), then applies what the broker announced (property encoding,
heartbeats). With a credential it first authenticates (protocol §8.7): an AuthenticationRequest
before the ClientIdentity; when the broker gives the credential a lifetime, the connection
re-authenticates on its own ahead of expiry (at the earlier of 90% of the lifetime and the
lifetime less 5 s, as the C++ SDK does), and a refused re-authentication fails the connection,
so that the session reconnects (authenticating afresh) under its reconnect policy. The session
adopts a connection only once it is established, and reconnects by establishing a new one.

Thread-safety: :meth:`establish` runs on one thread (the constructor's or the supervisor's);
the event callbacks run on the transport's reader thread; re-authentication runs on a timer
thread of its own (``bmq-reauth-N``); :meth:`abort` and :meth:`close` may be called from any
thread.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _codec, _schema
from ._dispatch import fail_future, resolve_future
from ._options import Credential, check_credential
from ._protocol import CLIENT_FEATURES, FEATURE_MESSAGE_PROPERTIES, MESSAGE_PROPERTIES_EX
from ._transport import Transport, parse_broker_address
from ._version import __version__
from .exceptions import (
    AuthenticationError, ClosedByBroker, ConnectionLost, Error, InvalidArgumentError, ProtocolError,
    SessionClosedError, TimeoutError, TLSError,
)

__all__ = ["BrokerAddresses", "Connection", "Endpoint", "client_identity"]

logger = logging.getLogger(__name__)

# ClientIdentity.sdkVersion: major*10000 + minor*100 + patch.
SDK_VERSION = sum(int(part) * scale for part, scale in zip(__version__.split(".")[:3], (10000, 100, 1)))
_JSON = _codec.ENCODING_JSON
_EVENT_ACK = _codec.EVENT_ACK
_EVENT_PUSH = _codec.EVENT_PUSH
_EVENT_CONTROL = _codec.EVENT_CONTROL
_EVENT_AUTHENTICATION = _codec.EVENT_AUTHENTICATION

CredentialSource = Union[Credential, Callable[[], Credential]]


def client_identity(session_id: int, guids: Any, user_agent: str, client_type: str = "E_TCPCLIENT") -> Dict[str, Any]:
    """The NegotiationMessage bmq opens every connection with (``guids``: the session's
    GuidGenerator, whose client id the broker learns here; None for a client that posts
    nothing, such as an admin client, ``client_type`` ``"E_TCPADMIN"``)."""
    return {
        "clientIdentity": {
            "protocolVersion": 1,
            "sdkVersion": SDK_VERSION,
            "clientType": client_type,
            "processName": os.path.basename(sys.argv[0] or "python")[:64] or "python",
            "pid": os.getpid(),
            "sessionId": session_id,
            "hostName": "",
            "features": CLIENT_FEATURES,
            "clusterName": "",
            "clusterNodeId": -1,
            "sdkLanguage": "E_UNKNOWN",
            "guidInfo": {
                "clientId": guids.client_id_hex if guids is not None else "",
                "nanoSecondsFromEpoch": guids.nanoseconds_from_epoch if guids is not None else 0,
            },
            "userAgent": f"{user_agent} bmq-python:{__version__}".strip(),
        }
    }


class Endpoint(NamedTuple):
    """One place to connect to: ``address`` is ``tcp://HOST:PORT`` as connected (the IP address
    when a host name resolved to several), ``configured`` the address it came from and ``name``
    its host (what a TLS certificate must name)."""

    address: str
    host: str
    port: int
    configured: str
    name: str


class BrokerAddresses:
    """The broker addresses a session may connect to, in order of preference.

    Each is ``tcp://HOST:PORT``; a host name that resolves to several IP addresses stands for
    each of them, in the resolver's order (resolved anew before every round of attempts, so a
    changed DNS entry is seen on the next reconnect). A name that does not resolve stays one
    endpoint, whose connect attempt then reports the resolver's error.

    Args:
        brokers: one address or a non-empty sequence of them.

    Raises:
        InvalidArgumentError: an empty sequence, or not strings. InvalidURIError: a malformed
            address.

    Thread-safety: immutable once built; :meth:`rotation` may be called from any thread.
    """

    def __init__(self, brokers: Union[str, Sequence[str]]) -> None:
        given = (brokers,) if isinstance(brokers, str) else tuple(brokers)
        if not given:
            raise InvalidArgumentError("no broker address given: pass 'tcp://HOST:PORT' or a list of them")
        wrong = [b for b in given if not isinstance(b, str)]
        if wrong:
            raise InvalidArgumentError(f"broker addresses must be strings like 'tcp://HOST:PORT', got {wrong[0]!r}")
        self.configured: Tuple[str, ...] = given
        self._parsed = [(text, *parse_broker_address(text)) for text in given]

    def __len__(self) -> int:
        return len(self._parsed)

    @property
    def first(self) -> Endpoint:
        """The first configured address, unresolved (what to name before any connection)."""
        text, host, port = self._parsed[0]
        return Endpoint(_tcp(host, port), host, port, text, host)

    def endpoints(self) -> List[Endpoint]:
        """Every endpoint in order of preference, host names resolved now."""
        out: List[Endpoint] = []
        for text, host, port in self._parsed:
            for ip in _resolve(host, port):
                endpoint = Endpoint(_tcp(ip, port), ip, port, text, host)
                if endpoint not in out:
                    out.append(endpoint)
        return out

    def rotation(self, after: Optional[Endpoint] = None) -> List[Endpoint]:
        """:meth:`endpoints` starting with the one after ``after`` and ending with ``after``
        itself (the one just lost is tried last), or in their order when ``after`` is None
        or no longer among them."""
        endpoints = self.endpoints()
        if after is None or after not in endpoints:
            return endpoints
        index = endpoints.index(after) + 1
        return endpoints[index:] + endpoints[:index]


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _resolve(host: str, port: int) -> List[str]:
    """``host`` itself when it is an IP address, does not resolve or resolves to one address;
    else every address it resolves to, each once, in the resolver's order."""
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return [host]  # the connect attempt reports it
    ips: List[str] = []
    for info in infos:
        ip = str(info[4][0])
        if ip not in ips:
            ips.append(ip)
    return ips if len(ips) > 1 else [host]


class Connection:
    """One transport and what the broker told us on it.

    Args:
        address: ``(host, port)``.
        high_watermark: the transport's outgoing high watermark, bytes.
        name: suffix of the transport's thread names.
        on_acks: called on the reader thread with ACK events, several at once when they arrived
            together (see :class:`Transport`); returns the latches of blocking posts to wake.
        on_push, on_control: called on the reader thread with each PUSH and (after
            negotiation) CONTROL event.
        on_failure: called once with this connection and the error when it dies.
        busy_poll: the transport's busy polling, seconds (see :class:`Transport`).
        endpoint: where ``address`` came from (see :class:`BrokerAddresses`), if anywhere.
        tls: a client ``ssl.SSLContext`` for TLS (see :class:`Transport`), or None.
    """

    def __init__(self, address: Tuple[str, int], high_watermark: int, name: str,
                 on_acks: Callable[[List[bytes]], List[_codec.Latch]], on_push: Callable[[bytes], None],
                 on_control: Callable[[bytes], None],
                 on_failure: Callable[["Connection", BaseException], None], busy_poll: float = 0.0,
                 endpoint: Optional[Endpoint] = None, tls: Optional[ssl.SSLContext] = None) -> None:
        self.endpoint = endpoint
        self.negotiation: "Future[Dict[str, Any]]" = Future()
        self.new_style_properties = True  # the broker reads MESSAGE_PROPERTIES_EX
        self.lifetime: Optional[float] = None  # seconds the last authentication holds, if limited
        self._authentication: "Optional[Future[Dict[str, Any]]]" = None
        self._reauth_timer: Optional[threading.Timer] = None
        self._name = name
        self._on_acks, self._on_push, self._on_control, self._on_failure = on_acks, on_push, on_control, on_failure
        self.transport = Transport(address, self._on_events, self._on_transport_failure, high_watermark, name,
                                   busy_poll, tls, endpoint.name if endpoint is not None else None)

    def establish(self, identity: Dict[str, Any], broker: str, timeout: float,
                  credential: Optional[CredentialSource] = None) -> None:
        """Connect, authenticate (with a ``credential``) and negotiate within ``timeout`` seconds;
        on any failure the transport is closed.

        Raises:
            ConnectionError: the broker cannot be reached. AuthenticationError: it refused the
            credential. ClosedByBroker: it refused the session (also what a broker that requires
            authentication does to a client without a credential). TimeoutError: no answer in
            time. ProtocolError: a malformed answer.
        """
        deadline = time.monotonic() + timeout
        transport = self.transport
        try:
            transport.connect(timeout)
            if credential is not None:
                self._authenticate(credential, broker, deadline)
            transport.send_control(_schema.encode_event(identity, _JSON, "negotiation"))
            try:
                message = self.negotiation.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeoutError:
                raise TimeoutError(f"no negotiation response from {broker} within {timeout:g} s") from None
            except ConnectionLost as exc:
                if credential is not None:
                    raise
                # What a broker that requires authentication does to a client without a credential
                # (and a TLS endpoint to a plaintext client that sent no TLS alert back).
                hint = ("; over TLS, a terminator that refuses this client's certificate does this too"
                        if transport.tls is not None else "; if it is a TLS endpoint, set SessionOptions(tls=...)")
                raise ClosedByBroker(f"broker {broker} closed the connection during negotiation; if it requires "
                                     f"authentication, set SessionOptions(credential=...){hint}") from exc
            response = message.get("brokerResponse")
            if response is None:
                raise ProtocolError(f"expected a brokerResponse, got {sorted(message)}")
            result = response.get("result", {})
            if result.get("category") != "E_SUCCESS":
                raise ClosedByBroker(
                    f"broker {broker} refused the session: {result.get('category')} "
                    f"{result.get('code')} {result.get('message', '')!r}"
                )
            features = _schema.parse_features(response.get("brokerIdentity", {}).get("features", ""))
            self.new_style_properties = MESSAGE_PROPERTIES_EX in features.get(FEATURE_MESSAGE_PROPERTIES, ())
            interval = response.get("heartbeatIntervalMs", 3000) / 1000.0
            transport.set_heartbeat(interval, int(response.get("maxMissedHeartbeats", 10)))
        except BaseException as exc:
            transport.close()
            transport.join(1.0)
            if isinstance(exc, ConnectionLost) and isinstance(transport.failure, TLSError):
                # E.g. a TLS 1.3 terminator refusing this client's certificate once the client
                # thought the handshake done: the alert, not "closed", says what happened.
                raise transport.failure from exc
            raise

    def _authenticate(self, credential: CredentialSource, broker: str, deadline: float) -> None:
        """One AuthenticationRequest/Response exchange; sets :attr:`lifetime`."""
        mechanism, data = check_credential(credential() if callable(credential) else credential)
        future: "Future[Dict[str, Any]]" = Future()
        self._authentication = future
        request = {"authenticationRequest": {"mechanism": mechanism, "data": data}}
        self.transport.send_control(_schema.encode_event(request, _JSON, "authentication"))
        try:
            message = future.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeoutError:
            raise TimeoutError(f"no response from {broker} to {mechanism} authentication in time") from None
        except ConnectionLost as exc:
            # A broker refusing the credential answers, then closes; a TLS terminator in front
            # of it may lose the answer as the broker resets the connection.
            raise ClosedByBroker(f"broker {broker} closed the connection in answer to {mechanism} authentication "
                                 f"(a refused credential?): {exc}") from exc
        response = message.get("authenticationResponse")
        if response is None:
            raise ProtocolError(f"expected an authenticationResponse, got {sorted(message)}")
        status = response.get("status", {})
        if status.get("category") != "E_SUCCESS":
            text = status.get("message", "")
            raise AuthenticationError(
                f"broker {broker} refused {mechanism} authentication: {status.get('category')} "
                f"{status.get('code')} {text!r}", mechanism, status.get("category", "E_UNKNOWN"),
                int(status.get("code", 0)), text)
        lifetime_ms = response.get("lifetimeMs")
        self.lifetime = lifetime_ms / 1000.0 if lifetime_ms else None
        logger.info("authenticated to %s with %s%s", broker, mechanism,
                    f" for {self.lifetime:g} s" if self.lifetime else "")

    def keep_authenticated(self, credential: CredentialSource, broker: str, timeout: float,
                           on_refused: Callable[[BaseException], None]) -> None:
        """Re-authenticate ahead of each expiry of the credential's lifetime, if it has one.
        ``on_refused`` is told (from the timer thread) when a re-authentication fails; the
        connection then fails as lost."""
        if self.lifetime is None or self.transport.closed:
            return
        delay = min(0.9 * self.lifetime, self.lifetime - 5.0)
        if delay <= 0:
            delay = 0.9 * self.lifetime
        timer = threading.Timer(delay, self._reauthenticate, (credential, broker, timeout, on_refused))
        timer.name = f"bmq-reauth-{self._name}"
        timer.daemon = True
        self._reauth_timer = timer
        timer.start()

    def _reauthenticate(self, credential: CredentialSource, broker: str, timeout: float,
                        on_refused: Callable[[BaseException], None]) -> None:
        if self.transport.closed:
            return
        try:
            self._authenticate(credential, broker, time.monotonic() + timeout)
        except (Error, OSError) as exc:
            if isinstance(exc, ConnectionLost) and self.transport.closed:
                return  # the connection went first: the session is already reconnecting
            logger.warning("re-authentication to %s failed: %s", broker, exc)
            on_refused(exc)
            self.transport.close()
            self._on_failure(self, ConnectionLost(f"re-authentication failed: {exc}"))
            return
        self.keep_authenticated(credential, broker, timeout, on_refused)

    def close(self) -> None:
        """Close the transport and stop re-authenticating (no failure is reported)."""
        timer = self._reauth_timer
        if timer is not None:
            timer.cancel()
        self.transport.close()

    def abort(self) -> None:
        """Close a connection that is still negotiating (the session is stopping)."""
        self.close()
        fail_future(self.negotiation, SessionClosedError("the session stopped while connecting"))

    def _on_events(self, event_type: int, events: List[bytes]) -> Optional[List[_codec.Latch]]:
        if event_type == _EVENT_ACK:
            return self._on_acks(events)  # blocking posters to wake
        if event_type == _EVENT_PUSH:
            for event in events:
                self._on_push(event)
        else:
            for event in events:
                self._on_event(event_type, event)
        return None

    def _on_event(self, event_type: int, event: bytes) -> None:
        if event_type == _EVENT_AUTHENTICATION:
            message, _ = _schema.decode_event(event, "authentication")
            if self._authentication is not None:
                resolve_future(self._authentication, message)
        elif event_type == _EVENT_CONTROL:
            if self.negotiation.done():
                self._on_control(event)
            else:
                message, _ = _schema.decode_event(event, "negotiation")
                resolve_future(self.negotiation, message)
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug("ignoring event of type %d (%d bytes)", event_type, len(event))

    def _on_transport_failure(self, exc: BaseException) -> None:
        if self._reauth_timer is not None:
            self._reauth_timer.cancel()
        for pending in (self.negotiation, self._authentication):
            if pending is not None and not pending.done():
                fail_future(pending, exc)
        self._on_failure(self, exc)
