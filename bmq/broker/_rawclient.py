"""A minimal blocking BlazingMQ client made of the codec and the schema, for broker tests.

It does exactly what it is told, byte for byte, so tests can drive the broker into any
corner (legacy PUT ids, BER or JSON control messages, bad CRCs, malformed frames) and see
its raw answers. It is not the bmq client and has no recovery logic.

Thread-safety: none; one test thread per instance.
"""
from __future__ import annotations

import collections
import itertools
import os
import socket
import ssl
import time
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from .. import _codec, _schema
from .._protocol import DEFAULT_APP_ID, FEATURE_MESSAGE_PROPERTIES, MESSAGE_PROPERTIES_EX, queue_flags

__all__ = ["RawClient"]

INT_MIN = -(2**31)


class RawClient:
    """One TCP connection to a broker speaking the protocol by hand.

    Args:
        port: broker port on 127.0.0.1.
        encoding: control encoding to send (and advertise): ENCODING_JSON or ENCODING_BER.
        guid_generating: advertise guidInfo.clientId and put GUIDs in PUTs (C++ style);
            False sends 24-bit correlation ids (legacy / Java style).
        negotiate: send the ClientIdentity and read the BrokerResponse now.
        answer_heartbeats: reply HEARTBEAT_REQ automatically while reading.
        timeout: default seconds for every read.
        tls: a client ``ssl.SSLContext``: the connection is an ``ssl.SSLSocket`` (its
            handshake done here), for a TLS listener.

    Thread-safety: not thread-safe.
    """

    def __init__(
        self,
        port: int,
        *,
        encoding: int = _codec.ENCODING_JSON,
        guid_generating: bool = True,
        negotiate: bool = True,
        answer_heartbeats: bool = True,
        timeout: float = 5.0,
        identity: Optional[Dict[str, Any]] = None,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.encoding = encoding
        self.guid_generating = guid_generating
        self.answer_heartbeats = answer_heartbeats
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.guids = _codec.GuidGenerator()
        self._frames = _codec.FrameReader()
        self._backlog: Deque[bytes] = collections.deque()
        # Types of the latest events in the order they arrived (answered heartbeats excluded),
        # for tests of the broker's ordering across event types; bounded for long runs.
        self.arrivals: Deque[int] = collections.deque(maxlen=1024)
        self._rids = itertools.count(1)
        self._correlation_ids = itertools.count(1)
        self.heartbeat_requests = 0
        self.broker_response: Dict[str, Any] = {}
        self.response_encoding: Optional[int] = None
        self.identity = identity or self.default_identity()
        if negotiate:
            self.negotiate()

    def default_identity(self) -> Dict[str, Any]:
        encodings = "BER,JSON" if self.encoding == _codec.ENCODING_BER else "JSON"
        identity: Dict[str, Any] = {
            "protocolVersion": 1,
            "sdkVersion": 999999,
            "clientType": "E_TCPCLIENT",
            "processName": "rawclient",
            "pid": os.getpid(),
            "sessionId": 1,
            "hostName": "",
            "features": f"PROTOCOL_ENCODING:{encodings};{FEATURE_MESSAGE_PROPERTIES}:{MESSAGE_PROPERTIES_EX}",
            "clusterName": "",
            "clusterNodeId": -1,
            "sdkLanguage": "E_UNKNOWN",
        }
        if self.guid_generating:
            identity["guidInfo"] = {"clientId": self.guids.client_id_hex, "nanoSecondsFromEpoch": self.guids.nanoseconds_from_epoch}
        return identity

    # ---- raw I/O ---------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read_more(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no event from the broker in time")
        self.sock.settimeout(remaining)
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        for event in self._frames.feed(data):
            event_type = _codec.unpack_event_header(event)[1]
            if event_type == _codec.EVENT_HEARTBEAT_REQ:
                self.heartbeat_requests += 1
                if self.answer_heartbeats:
                    self.send(_codec.HEARTBEAT_RSP)
                    continue
            self.arrivals.append(event_type)
            self._backlog.append(event)
        return True

    def next_event(self, event_type: Optional[int] = None, timeout: Optional[float] = None) -> bytes:
        """The next event (of ``event_type`` if given; others stay queued in order).

        Raises:
            TimeoutError: nothing matching in time.
            ConnectionError: the broker closed the connection.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            for index, event in enumerate(self._backlog):
                if event_type is None or _codec.unpack_event_header(event)[1] == event_type:
                    del self._backlog[index]
                    return event
            if not self._read_more(deadline):
                raise ConnectionError("broker closed the connection")

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Read (answering heartbeats) until the broker closes; False on timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            while self._read_more(deadline):
                pass
        except TimeoutError:
            return False
        except OSError:
            pass
        return True

    def expect_silence(self, event_type: int, timeout: float) -> bool:
        """True if no event of ``event_type`` arrives within ``timeout`` seconds."""
        try:
            self.next_event(event_type, timeout)
        except TimeoutError:
            return True
        return False

    # ---- control ---------------------------------------------------------------------
    def authenticate(self, mechanism: str, data: bytes = b"", timeout: Optional[float] = None) -> Dict[str, Any]:
        """Send an AuthenticationRequest and return the AuthenticationResponse (a dict with
        ``status`` and maybe ``lifetimeMs``)."""
        request = {"authenticationRequest": {"mechanism": mechanism, "data": data}}
        self.send(_schema.encode_event(request, self.encoding, "authentication"))
        message, _ = _schema.decode_event(self.next_event(_codec.EVENT_AUTHENTICATION, timeout), "authentication")
        return message["authenticationResponse"]

    def negotiate(self) -> Dict[str, Any]:
        self.send(_schema.encode_event({"clientIdentity": self.identity}, self.encoding, "negotiation"))
        message, self.response_encoding = _schema.decode_event(self.next_event(_codec.EVENT_CONTROL), "negotiation")
        self.broker_response = message["brokerResponse"]
        return self.broker_response

    def control(self, message: Dict[str, Any]) -> None:
        self.send(_schema.encode_event(message, self.encoding, "control"))

    def request(self, choice: str, body: Dict[str, Any], timeout: Optional[float] = None) -> Tuple[str, Dict[str, Any], int]:
        """Send a request with a fresh rId; ``(reply choice, reply body, rId)``."""
        rid = next(self._rids)
        self.control({"rId": rid, choice: body})
        message, _ = _schema.decode_event(self.next_event(_codec.EVENT_CONTROL, timeout), "control")
        assert message.get("rId") == rid, message
        reply = _schema.message_kind_of(message)
        return reply, message[reply], rid

    def open(self, uri: str, q_id: int, *, read: bool = False, write: bool = False, sub_id: int = 0, app_id: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
        params = self.handle_parameters(uri, q_id, read=read, write=write, sub_id=sub_id, app_id=app_id)
        reply, body, _ = self.request("openQueue", {"handleParameters": params})
        return reply, body

    @staticmethod
    def handle_parameters(uri: str, q_id: int, *, read: bool = False, write: bool = False, sub_id: int = 0, app_id: Optional[str] = None) -> Dict[str, Any]:
        params: Dict[str, Any] = {
            "uri": uri,
            "qId": q_id,
            "flags": queue_flags(read, write),
            "readCount": int(read),
            "writeCount": int(write),
            "adminCount": 0,
        }
        if app_id is not None:
            params["subIdInfo"] = {"subId": sub_id, "appId": app_id}
        return params

    def configure(
        self,
        q_id: int,
        *,
        app_id: str = DEFAULT_APP_ID,
        subscriptions: Sequence[Tuple[int, str, int]] = ((0, "", 0),),
        max_messages: int = 1000,
        max_bytes: int = 32 * 1024 * 1024,
    ) -> Tuple[str, Dict[str, Any]]:
        """ConfigureStream with ``(sId, expression, priority)`` subscriptions (none = deconfigure)."""
        subs = [
            {
                "sId": sid,
                "expression": {"version": "E_VERSION_1" if text else "E_UNDEFINED", "text": text},
                "consumers": [
                    {
                        "maxUnconfirmedMessages": max_messages,
                        "maxUnconfirmedBytes": max_bytes,
                        "consumerPriority": priority,
                        "consumerPriorityCount": 1,
                    }
                ],
            }
            for sid, text, priority in subscriptions
        ]
        params: Dict[str, Any] = {"appId": app_id}
        if subs:
            params["subscriptions"] = subs
        reply, body, _ = self.request("configureStream", {"qId": q_id, "streamParameters": params})
        return reply, body

    def configure_old(self, q_id: int, *, max_messages: int = 1000, max_bytes: int = 32 * 1024 * 1024, priority: int = 0, sub_id: Optional[int] = None, app_id: str = DEFAULT_APP_ID) -> Tuple[str, Dict[str, Any]]:
        """The older ConfigureQueueStream."""
        params: Dict[str, Any] = {
            "maxUnconfirmedMessages": max_messages,
            "maxUnconfirmedBytes": max_bytes,
            "consumerPriority": priority,
            "consumerPriorityCount": 0 if priority == INT_MIN else 1,
        }
        if sub_id is not None:
            params["subIdInfo"] = {"subId": sub_id, "appId": app_id}
        reply, body, _ = self.request("configureQueueStream", {"qId": q_id, "streamParameters": params})
        return reply, body

    def close_queue(self, uri: str, q_id: int, *, read: bool = False, write: bool = False, sub_id: int = 0, app_id: Optional[str] = None, final: bool = True) -> Tuple[str, Dict[str, Any]]:
        params = self.handle_parameters(uri, q_id, read=read, write=write, sub_id=sub_id, app_id=app_id)
        reply, body, _ = self.request("closeQueue", {"handleParameters": params, "isFinal": final})
        return reply, body

    def disconnect(self) -> Tuple[str, Dict[str, Any]]:
        reply, body, _ = self.request("disconnect", {})
        return reply, body

    # ---- data ------------------------------------------------------------------------
    def put_ids(self, count: int) -> bytes:
        """``count`` PUT identities: GUIDs, or legacy correlation ids in the GUID field."""
        if self.guid_generating:
            return self.guids.generate(count)
        return b"".join(b"\0" + next(self._correlation_ids).to_bytes(3, "big") + bytes(12) for _ in range(count))

    def put(
        self,
        q_id: int,
        payloads: Sequence[bytes],
        *,
        properties: Optional[Dict[str, Tuple[int, Any]]] = None,
        ack: bool = True,
        guids: Optional[bytes] = None,
    ) -> List[bytes]:
        """Post ``payloads`` in one or more PUT events; the 16-byte ids used, in order."""
        ids = guids if guids is not None else self.put_ids(len(payloads))
        area = _codec.encode_properties(properties) if properties else None
        for event in _codec.build_put_events(q_id, ids, payloads, area, flags=_codec.PUT_ACK_REQUESTED if ack else 0):
            self.send(event)
        return _codec.split_guids(ids)

    def acks(self, count: int, timeout: Optional[float] = None) -> List[Tuple[int, int, bytes, int]]:
        out: List[Tuple[int, int, bytes, int]] = []
        while len(out) < count:
            out.extend(_codec.iter_acks(self.next_event(_codec.EVENT_ACK, timeout)))
        return out

    def pushes(self, count: int, timeout: Optional[float] = None) -> List[Tuple[Any, ...]]:
        out: List[Tuple[Any, ...]] = []
        while len(out) < count:
            out.extend(_codec.iter_push_messages(self.next_event(_codec.EVENT_PUSH, timeout)))
        return out

    def confirm(self, q_id: int, guids: Sequence[bytes], sub_id: int = 0) -> None:
        self.send(_codec.build_confirm_event([(q_id, guid, sub_id) for guid in guids]))

