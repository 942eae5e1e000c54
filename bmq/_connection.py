"""Connection establishment: one transport to the broker, negotiated before the session uses it.

:meth:`Connection.establish` connects the transport, sends the ClientIdentity and waits for the
BrokerResponse (protocol §8.4), then applies what the broker announced (property encoding,
heartbeats). Any step that must happen before negotiation (authentication, protocol §8.7)
belongs in :meth:`Connection.establish`, between ``connect`` and the ClientIdentity.
The session adopts a connection only once it is established, and reconnects by establishing a
new one.

Thread-safety: :meth:`establish` runs on one thread (the constructor's or the supervisor's);
the event callbacks run on the transport's reader thread; :meth:`abort` may be called from any
thread to interrupt a negotiation.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable, Dict, Tuple

from . import _codec, _schema
from ._dispatch import fail_future, resolve_future
from ._protocol import CLIENT_FEATURES, FEATURE_MESSAGE_PROPERTIES, MESSAGE_PROPERTIES_EX
from ._transport import Transport
from ._version import __version__
from .exceptions import ClosedByBroker, ProtocolError, SessionClosedError, TimeoutError

__all__ = ["Connection", "client_identity"]

logger = logging.getLogger(__name__)

# ClientIdentity.sdkVersion: major*10000 + minor*100 + patch.
SDK_VERSION = sum(int(part) * scale for part, scale in zip(__version__.split(".")[:3], (10000, 100, 1)))
_JSON = _codec.ENCODING_JSON
_EVENT_ACK = _codec.EVENT_ACK
_EVENT_PUSH = _codec.EVENT_PUSH
_EVENT_CONTROL = _codec.EVENT_CONTROL


def client_identity(session_id: int, guids: Any, user_agent: str) -> Dict[str, Any]:
    """The NegotiationMessage bmq opens every connection with (``guids``: the session's
    GuidGenerator, whose client id the broker learns here)."""
    return {
        "clientIdentity": {
            "protocolVersion": 1,
            "sdkVersion": SDK_VERSION,
            "clientType": "E_TCPCLIENT",
            "processName": os.path.basename(sys.argv[0] or "python")[:64] or "python",
            "pid": os.getpid(),
            "sessionId": session_id,
            "hostName": "",
            "features": CLIENT_FEATURES,
            "clusterName": "",
            "clusterNodeId": -1,
            "sdkLanguage": "E_UNKNOWN",
            "guidInfo": {
                "clientId": guids.client_id_hex,
                "nanoSecondsFromEpoch": guids.nanoseconds_from_epoch,
            },
            "userAgent": f"{user_agent} bmq-python:{__version__}".strip(),
        }
    }


class Connection:
    """One transport and what the broker told us on it.

    Args:
        address: ``(host, port)``.
        high_watermark: the transport's outgoing high watermark, bytes.
        name: suffix of the transport's thread names.
        on_ack, on_push, on_control: called on the reader thread with each ACK, PUSH and
            (after negotiation) CONTROL event.
        on_failure: called once with this connection and the error when it dies.
    """

    def __init__(self, address: Tuple[str, int], high_watermark: int, name: str,
                 on_ack: Callable[[bytes], None], on_push: Callable[[bytes], None],
                 on_control: Callable[[bytes], None],
                 on_failure: Callable[["Connection", BaseException], None]) -> None:
        self.negotiation: "Future[Dict[str, Any]]" = Future()
        self.new_style_properties = True  # the broker reads MESSAGE_PROPERTIES_EX
        self._on_ack, self._on_push, self._on_control, self._on_failure = on_ack, on_push, on_control, on_failure
        self.transport = Transport(address, self._on_event, self._on_transport_failure, high_watermark, name)

    def establish(self, identity: Dict[str, Any], broker: str, timeout: float) -> None:
        """Connect and negotiate within ``timeout`` seconds; on any failure the transport is closed.

        Raises:
            ConnectionError: the broker cannot be reached. ClosedByBroker: it refused the session.
            TimeoutError: no negotiation response in time. ProtocolError: a malformed answer.
        """
        deadline = time.monotonic() + timeout
        transport = self.transport
        try:
            transport.connect(timeout)
            transport.send_control(_schema.encode_event(identity, _JSON, "negotiation"))
            try:
                message = self.negotiation.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeoutError:
                raise TimeoutError(f"no negotiation response from {broker} within {timeout:g} s") from None
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
        except BaseException:
            transport.close()
            transport.join(1.0)
            raise

    def abort(self) -> None:
        """Close a connection that is still negotiating (the session is stopping)."""
        self.transport.close()
        fail_future(self.negotiation, SessionClosedError("the session stopped while connecting"))

    def _on_event(self, event_type: int, event: bytes) -> None:
        if event_type == _EVENT_ACK:
            self._on_ack(event)
        elif event_type == _EVENT_PUSH:
            self._on_push(event)
        elif event_type == _EVENT_CONTROL:
            if self.negotiation.done():
                self._on_control(event)
            else:
                message, _ = _schema.decode_event(event, "negotiation")
                resolve_future(self.negotiation, message)
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug("ignoring event of type %d (%d bytes)", event_type, len(event))

    def _on_transport_failure(self, exc: BaseException) -> None:
        if not self.negotiation.done():
            fail_future(self.negotiation, exc)
        self._on_failure(self, exc)
