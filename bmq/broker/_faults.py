"""Fault injection for tests: ``broker.faults``.

Every method takes effect immediately for all clients unless a ``client_id`` (see
:meth:`bmq.broker.Broker.clients`) narrows it, and stays in effect until undone or
:meth:`Faults.reset` is called. Nothing here is persisted across :meth:`Broker.restart`
except the switches (heartbeats, ACK policy, negotiation refusal, delays).

Thread-safety: all methods may be called from any thread, including while clients run.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, List, Optional

from .._protocol import ACK_UNKNOWN

if TYPE_CHECKING:  # pragma: no cover
    from ._server import Broker, ClientSession

__all__ = ["Faults"]


class Faults:
    """Switches that make the embedded broker misbehave in controlled ways.

    The broker reads the attributes below; change them through the methods.

    Attributes:
        acks_withheld: ACKs (and NACKs) are kept back until :meth:`release_acks`.
        ack_delay: seconds every ACK event is delayed by.
        control_delay: seconds every control response (including the BrokerResponse) is
            delayed by.
        refusing_negotiation: ClientIdentity is answered with an E_REFUSED BrokerResponse
            and the connection closed.
        heartbeats_stopped: the broker neither sends HEARTBEAT_REQ nor answers them (and
            drops nobody for missing heartbeats), so clients see a silent, dead link.
        authentication_delay: seconds every AuthenticationResponse is delayed by.
        authentication_lifetime_ms: when set, the lifetime given to every credential instead of
            the authenticator's (a credential that expires early).

    Thread-safety: safe from any thread.
    """

    def __init__(self, broker: "Broker") -> None:
        self._broker = broker
        self._lock = threading.Lock()
        self.acks_withheld = False
        self.ack_delay = 0.0
        self.control_delay = 0.0
        self.refusing_negotiation = False
        self.heartbeats_stopped = False
        self._nack_remaining = 0
        self._nack_status = ACK_UNKNOWN
        self.authentication_delay = 0.0
        self.authentication_lifetime_ms: Optional[int] = None
        self._authentication_refusals = 0
        self._configure_refusals = 0

    def _sessions(self, client_id: Optional[int]) -> List["ClientSession"]:
        sessions = self._broker._sessions_snapshot()
        if client_id is None:
            return sessions
        chosen = [s for s in sessions if s.id == client_id]
        if not chosen:
            raise KeyError(f"no connected client with id {client_id}")
        return chosen

    def drop_connections(self, client_id: Optional[int] = None) -> int:
        """Close the TCP connection of one client (or all) at once, without any goodbye.

        Their queue handles are released and unconfirmed messages redelivered to others.

        Args:
            client_id: the client to drop; None drops every client.

        Returns:
            The number of connections dropped.

        Raises:
            KeyError: no connected client has ``client_id``.
        """
        sessions = self._sessions(client_id)
        for session in sessions:
            session.close()
        return len(sessions)

    def pause_reading(self, client_id: Optional[int] = None) -> None:
        """Stop reading from a client's socket so that TCP backpressure builds up.

        Raises:
            KeyError: no connected client has ``client_id``.
        """
        for session in self._sessions(client_id):
            session.pause_reading()

    def resume_reading(self, client_id: Optional[int] = None) -> None:
        """Undo :meth:`pause_reading`.

        Raises:
            KeyError: no connected client has ``client_id``.
        """
        for session in self._sessions(client_id):
            session.resume_reading()

    def withhold_acks(self) -> None:
        """Keep every ACK/NACK event back (messages are still stored and delivered)."""
        self.acks_withheld = True

    def release_acks(self) -> int:
        """Stop withholding and send every withheld ACK event, in order.

        Returns:
            The number of ACK events sent.
        """
        self.acks_withheld = False
        return sum(session.release_acks() for session in self._broker._sessions_snapshot())

    def delay_acks(self, seconds: float) -> None:
        """Send every ACK event ``seconds`` late (0 restores prompt ACKs)."""
        self.ack_delay = max(0.0, float(seconds))

    def nack_next(self, n: int, status: int = ACK_UNKNOWN) -> None:
        """NACK the next ``n`` PUT messages (any client) with wire ``status`` without storing them.

        Args:
            n: how many messages.
            status: ACK wire status, e.g. 1 LIMIT_MESSAGES, 2 LIMIT_BYTES, 5 UNKNOWN,
                6 STORAGE_FAILURE, 7 NOT_READY.

        Raises:
            ValueError: ``status`` is 0 or outside 1..15.
        """
        if not 1 <= int(status) <= 15:
            raise ValueError("a NACK status is a wire code 1..15")
        with self._lock:
            self._nack_remaining = int(n)
            self._nack_status = int(status)

    def take_nack(self) -> int:
        """The status to NACK the current PUT with, or 0 (used by the broker)."""
        if not self._nack_remaining:
            return 0
        with self._lock:
            if not self._nack_remaining:
                return 0
            self._nack_remaining -= 1
            return self._nack_status

    def refuse_negotiation(self, enabled: bool = True) -> None:
        """Refuse new sessions (E_REFUSED BrokerResponse, then close) while ``enabled``."""
        self.refusing_negotiation = bool(enabled)

    def delay_control_responses(self, seconds: float) -> None:
        """Send every control response ``seconds`` late (0 restores prompt responses)."""
        self.control_delay = max(0.0, float(seconds))

    def refuse_authentication(self, n: int = 1) -> None:
        """Refuse the next ``n`` AuthenticationRequests whatever their credential (as a wrong
        password is refused: E_REFUSED, then the connection is closed)."""
        with self._lock:
            self._authentication_refusals = max(0, int(n))

    def take_authentication_refusal(self) -> bool:
        """Broker-internal: whether this AuthenticationRequest is to be refused."""
        return self._take("_authentication_refusals")

    def refuse_configure(self, n: int = 1) -> None:
        """Refuse the next ``n`` ConfigureStream requests (any client) with E_REFUSED, as a broker
        refuses a reader's stream parameters: the open before it stays done."""
        with self._lock:
            self._configure_refusals = max(0, int(n))

    def take_configure_refusal(self) -> bool:
        """Broker-internal: whether this ConfigureStream is to be refused."""
        return self._take("_configure_refusals")

    def _take(self, counter: str) -> bool:
        """Use up one of the refusals counted in attribute ``counter``, if any is left."""
        with self._lock:
            left = getattr(self, counter)
            if left <= 0:
                return False
            setattr(self, counter, left - 1)
            return True

    def delay_authentication(self, seconds: float) -> None:
        """Answer every AuthenticationRequest ``seconds`` late (0 restores prompt answers)."""
        self.authentication_delay = max(0.0, float(seconds))

    def expire_authentication_after(self, lifetime_ms: Optional[int]) -> None:
        """Give every credential this lifetime (None: the authenticator's own)."""
        self.authentication_lifetime_ms = lifetime_ms

    def stop_heartbeats(self) -> None:
        """Neither send nor answer heartbeats, so clients must detect the dead link."""
        self.heartbeats_stopped = True

    def resume_heartbeats(self) -> None:
        """Undo :meth:`stop_heartbeats` (every client starts with a clean missed count)."""
        self._broker._reset_heartbeat_counters()
        self.heartbeats_stopped = False

    def send_raw(self, client_id: int, data: bytes) -> None:
        """Queue arbitrary bytes to one client, in order with everything else sent to it.

        Raises:
            KeyError: no connected client has ``client_id``.
        """
        for session in self._sessions(client_id):
            session.send(bytes(data))

    def reset(self) -> None:
        """Undo every switch and send anything withheld."""
        self.ack_delay = 0.0
        self.control_delay = 0.0
        self.refusing_negotiation = False
        self.authentication_delay = 0.0
        self.authentication_lifetime_ms = None
        with self._lock:
            self._nack_remaining = 0
            self._authentication_refusals = 0
            self._configure_refusals = 0
        self.resume_heartbeats()
        self.release_acks()
        self.resume_reading()
