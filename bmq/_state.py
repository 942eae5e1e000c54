"""The one owner of a session's connection state: the session state, the current connection
and its generation, and the hand-over of the connection's transport to the PUT path.

Every change is one of the named transitions below, made under :attr:`ConnectionState.lock`
(which the session's units also hold to keep their own state in step with it)::

    STARTING --adopt--> STARTED --lost--> RECONNECTING --adopt, restored--> STARTED
    STARTING, STARTED, RECONNECTING --begin_stop--> STOPPING --finish_stop--> STOPPED
    RECONNECTING --give_up--> STOPPING (the reconnect policy is exhausted)

The PUT path gets the transport only in :meth:`ConnectionState.restored`: the re-sends of every
unacknowledged PUT are queued on the new connection and only then are new posts let through,
in one critical section (a post let through first would overtake older messages of its queue).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Tuple
from contextlib import contextmanager

from ._types import SessionState
from .exceptions import ConnectionLost, SessionClosedError

if TYPE_CHECKING:  # pragma: no cover
    from ._connection import Connection, Endpoint
    from ._puts import PendingPuts

__all__ = ["ConnectionState"]

_STOPPING = (SessionState.STOPPING, SessionState.STOPPED)


class ConnectionState:
    """A session's state machine (see the module docstring).

    Args:
        puts: the session's PUT path: suspended when the connection is lost, given the new
            transport once the state is restored.
        endpoint: the first address configured (what :attr:`endpoint` says before any connection).
        on_adopt: called under the lock with every connection adopted (the session starts its
            credential renewal, points telemetry at the new address).

    Thread-safety: every method may be called from any thread; ``lock`` is reentrant, and the
    lock order is this lock, then the PUT path's, then a transport's.
    """

    def __init__(self, puts: "PendingPuts", endpoint: "Endpoint", on_adopt: Callable[["Connection"], None]) -> None:
        self.lock = threading.RLock()
        self._wake = threading.Condition(self.lock)
        self._puts = puts
        self._on_adopt = on_adopt
        self._state = SessionState.STARTING
        self._stop_started = False
        # Plain attributes, not properties: posts and confirms read them (only the transitions
        # below write them). ``current``: the negotiated connection control traffic and posts go
        # to, None while disconnected; ``new_style_properties``: the property encoding it (or
        # the last one) negotiated.
        self.current: Optional["Connection"] = None
        self.new_style_properties = True
        self.negotiating: Optional["Connection"] = None  # being negotiated: stop() aborts it
        #: The thread whose stop() began the stop (it ends it: Session.stop), once one did.
        self.stopper: Optional[threading.Thread] = None
        self._generation = 0  # connections adopted so far
        self._endpoint = endpoint  # of the current (or last) connection

    # ---- what the state is -----------------------------------------------------------
    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def generation(self) -> int:
        """How many connections were adopted so far (a reconnect makes a new one)."""
        return self._generation

    @property
    def endpoint(self) -> "Endpoint":
        """The address of the current connection, or of the last one (the first configured before any)."""
        return self._endpoint

    @property
    def stopping(self) -> bool:
        """True once :meth:`begin_stop` (or :meth:`give_up`) was called."""
        return self._state in _STOPPING

    def check_running(self) -> None:
        """Raises:
            SessionClosedError: the session is stopping or stopped."""
        if self._state in _STOPPING:
            raise SessionClosedError(f"session to {self._endpoint.address} is stopped")

    # ---- transitions -------------------------------------------------------------------
    @contextmanager
    def connecting(self, conn: "Connection") -> Iterator[None]:
        """While ``conn`` negotiates, and once negotiated until :meth:`adopt` takes it:
        :meth:`finish_stop` aborts it (a Ctrl-C between the two must not leave its threads
        running with nobody to close it).

        Raises:
            SessionClosedError: the session is stopping.
        """
        with self.lock:
            self.check_running()
            self.negotiating = conn
        try:
            yield
        except BaseException:
            with self.lock:
                if self.negotiating is conn:
                    self.negotiating = None
            conn.close()  # idempotent: a failed negotiation closed it already, a Ctrl-C after it did not
            raise

    def adopt(self, conn: "Connection") -> None:
        """Make the negotiated ``conn`` the current connection (STARTING becomes STARTED; while
        RECONNECTING it stays so until :meth:`restored`).

        Raises:
            ConnectionLost: ``conn`` closed right after negotiating.
            SessionClosedError: the session is stopping (the caller closes ``conn``).
        """
        with self.lock:
            self.check_running()
            if conn.transport.closed:
                raise ConnectionLost(f"connection to {self._endpoint.address} lost right after negotiation")
            self.current = conn
            if self.negotiating is conn:
                self.negotiating = None
            if conn.endpoint is not None:
                self._endpoint = conn.endpoint
            self._generation += 1
            self.new_style_properties = conn.new_style_properties
            if self._state == SessionState.STARTING:
                self._state = SessionState.STARTED
            self._on_adopt(conn)

    def restored(self, conn: "Connection") -> None:
        """Every queue of ``conn`` is reopened: queue the re-sends of every unacknowledged PUT on
        it, then let posts through (one critical section); RECONNECTING becomes STARTED.

        Raises:
            ConnectionLost: ``conn`` is no longer the current connection.
        """
        with self.lock:
            if conn is not self.current:
                raise ConnectionLost("connection lost while restoring state")
            self._puts.restore(conn.transport)
            if self._state == SessionState.RECONNECTING:
                self._state = SessionState.STARTED

    def lost(self, conn: "Connection") -> bool:
        """``conn`` died: if it was the current connection, posts are held until
        :meth:`restored` and STARTED becomes RECONNECTING. True if the caller has a loss to
        report (it was current and the session is not stopping); the caller holds the lock
        to keep its own units in step.
        """
        with self.lock:
            if conn is not self.current:
                return False
            self.current = None
            self._puts.suspend()
            if self._state in _STOPPING:
                return False  # e.g. the broker closing after our Disconnect
            if self._state == SessionState.STARTED:
                self._state = SessionState.RECONNECTING
            self._wake.notify_all()
            return True

    def give_up(self) -> None:
        """The reconnect policy is exhausted: RECONNECTING becomes STOPPING (stop() follows)."""
        with self.lock:
            if self._state == SessionState.RECONNECTING:
                self._state = SessionState.STOPPING
            self._wake.notify_all()

    def begin_stop(self) -> Tuple[bool, Optional["Connection"]]:
        """stop() begins: STOPPING (unless STOPPED). Returns whether this is the first stop()
        and the connection to say Disconnect on (None unless STARTED)."""
        with self.lock:
            first = not self._stop_started
            if first:  # one statement without a call: see Session.stop
                self._stop_started, self.stopper = True, threading.current_thread()
            conn = self.current if self._state == SessionState.STARTED else None
            if self._state != SessionState.STOPPED:
                self._state = SessionState.STOPPING
            self._wake.notify_all()
            return first, conn

    def finish_stop(self) -> None:
        """STOPPED: a negotiation under way is aborted, the current connection let go (the
        caller, holding the lock, took it to close, and its own units' state, in the same step)."""
        with self.lock:
            self._state = SessionState.STOPPED
            if self.negotiating is not None:
                self.negotiating.abort()
            self.current = None
            self._wake.notify_all()

    # ---- waiting -----------------------------------------------------------------------
    def wait_until_reconnecting(self) -> bool:
        """Wait until the connection is lost (True) or the session stops (False)."""
        with self.lock:
            while self._state not in (SessionState.RECONNECTING, *_STOPPING):
                self._wake.wait()
            return self._state not in _STOPPING

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` or until the session stops; True unless it is stopping."""
        with self.lock:
            if self._state not in _STOPPING:
                self._wake.wait(seconds)
            return self._state not in _STOPPING
