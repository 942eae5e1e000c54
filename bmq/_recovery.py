"""Recovery: the session's two background threads, and what a lost connection sets off.

The supervisor thread sleeps until the session is RECONNECTING, then reconnects with the
session's :class:`~bmq.ReconnectPolicy` (backoff with jitter), re-sends the buffered control
requests, reopens every queue that was open (with its latest options), re-sends the configures
held back for those queues, and finally lets :meth:`PendingPuts.restore` retransmit every
unacknowledged PUT with its GUID. Only then is the state restored (events ``Reconnected`` →
``QueueReopened``/``QueueReopenFailed`` → ``StateRestored``). The ACK timer thread resolves PUTs
whose ACK did not come within ``ack_timeout`` (a thread of its own so that ACKs expire on time
even while the supervisor blocks in a reconnect), has the connection make sure that the broker
still hears it when an answer is overdue (:meth:`Transport.check_heard`), and emits the
periodic statistics report.

:meth:`Recovery.connection_lost` is what the reader/writer threads call when the current
connection dies: it fails what cannot wait, marks open queues PENDING and wakes the supervisor.

Recovery works on the session's units, given to it (requests, registry, handles, PUT path,
events), on its state machine (:class:`~bmq._state.ConnectionState`: every state change is one of
its named transitions) and on a few services of the session (:class:`SessionServices`). A
failure inside its threads stops the session rather than leaving callers waiting.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, NamedTuple, Optional, Tuple

from . import events as ev
from ._connection import Connection
from ._dispatch import EventQueue, fail_future
from ._handles import QueueHandles
from ._puts import PendingPuts
from ._queue import Queue
from ._registry import QueueRegistry
from ._requests import ControlRequests, Request
from ._state import ConnectionState
from ._transport import Transport
from ._types import AckStatus, QueueState
from .exceptions import ConnectionError, ConnectionLost, Error, QueueStateError, SessionClosedError, TimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from ._connection import BrokerAddresses, Endpoint
    from ._options import SessionOptions
    from ._stats import SessionStats

__all__ = ["Recovery"]

logger = logging.getLogger("bmq._session")  # the session's logger: one place to look

_ACK_EXPIRY_TICK = 0.1
_stats_logger = logging.getLogger("bmq.stats")


class SessionServices(NamedTuple):
    """What Recovery asks of the session besides its units and its state machine."""

    id: int  # the session's number, in thread names
    options: "SessionOptions"
    brokers: "BrokerAddresses"
    connect: Callable[[float, Optional["Endpoint"]], Connection]  # a new negotiated connection, not adopted
    forget_queue: Callable[[Queue, AckStatus], None]  # a queue that could not be reopened
    dispatch: Callable[..., None]  # run a callback on the dispatcher thread
    stats: Callable[[], "SessionStats"]
    stop: Callable[[], Any]


class Recovery:
    """The supervisor and ACK-timer threads of one session (see the module docstring)."""

    def __init__(self, link: ConnectionState, requests: ControlRequests, registry: QueueRegistry,
                 handles: QueueHandles, puts: PendingPuts, events: EventQueue, session: SessionServices) -> None:
        self._link = link
        self._session = session
        self._requests = requests
        self._registry = registry
        self._handles = handles
        self._puts = puts
        self._events = events
        self._supervisor = threading.Thread(target=self._guarded, args=(self._supervise,),
                                            name=f"bmq-supervisor-{session.id}", daemon=True)
        self._ack_timer = threading.Thread(target=self._guarded, args=(self._expire_acks,),
                                           name=f"bmq-ack-timer-{session.id}", daemon=True)

    @property
    def threads(self) -> Tuple[threading.Thread, threading.Thread]:
        return self._supervisor, self._ack_timer

    def start(self) -> None:
        self._supervisor.start()
        self._ack_timer.start()

    def connection_lost(self, conn: Connection, exc: BaseException) -> None:
        """Reader/writer thread: ``conn`` died. If it was the current connection, unbuffered
        requests fail, PUTs wait, open queues become PENDING and the supervisor wakes up."""
        link = self._link
        with link.lock:
            if not link.lost(conn):
                return  # not the current one, or the session is stopping: nothing to report
            lost = ConnectionLost(f"connection to {link.endpoint.address} lost: {exc}")
            for request in self._requests.drop_unbuffered():
                fail_future(request.future, lost)
            for queue in self._registry:
                if queue.state == QueueState.OPEN:
                    queue.state = QueueState.PENDING
        if not isinstance(exc, ConnectionError):
            self._events.emit(ev.Error(f"bad data from the broker, connection dropped: {exc!r}"))
        self._events.emit(ev.ConnectionLost(str(exc)))

    def replace(self, conn: Connection, exc: BaseException) -> None:
        """Drop ``conn`` if it is still the current connection, and reconnect as after a lost
        one (``exc`` says why): for a connection whose broker left a request unanswered.
        Any thread."""
        with self._link.lock:
            if self._link.current is conn:
                # Closing reports nothing (only a failure does): run the failure path here.
                conn.close()
                self.connection_lost(conn, exc)

    def _guarded(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except Exception:  # a bug here must not leave callers hanging
            logger.exception("session thread %s crashed; stopping the session", threading.current_thread().name)
            self._stop_in_background()

    def _stop_in_background(self) -> None:
        threading.Thread(target=self._session.stop, name=f"bmq-stopper-{self._session.id}", daemon=True).start()

    def _supervise(self) -> None:
        while self._link.wait_until_reconnecting():
            self._reconnect()

    def _expire_acks(self) -> None:
        s = self._session
        interval = s.options.stats_interval
        next_report = time.monotonic() + interval if interval else None
        while True:
            if not self._link.pause(_ACK_EXPIRY_TICK):
                return
            self._puts.expire()
            self._check_heard()
            if next_report is not None and time.monotonic() >= next_report:
                next_report += interval  # type: ignore[operator]
                self._report(s.stats())

    def _check_heard(self) -> None:
        """Have the current connection make sure that the broker hears it while an answer it
        waits for (an ACK, a control response) is overdue (:meth:`Transport.check_heard`): one
        desynchronized on its way to the broker is then replaced, PUTs re-sent with their GUIDs."""
        link = self._link
        with link.lock:
            conn = link.current
            if conn is None:
                return
            oldest = min((since for since in (self._puts.waiting_since(), self._requests.waiting_since()) if since),
                         default=0.0)
        conn.transport.check_heard(oldest)

    def _report(self, snapshot: "SessionStats") -> None:
        """The periodic statistics report: a table in the log, the snapshot to ``on_stats``."""
        s = self._session
        _stats_logger.info("%s", snapshot.table())
        if s.options.on_stats is not None:
            s.dispatch(s.options.on_stats, snapshot)

    def _reconnect(self) -> None:
        """Reconnect in rounds, each trying every broker address once, starting after the one
        just lost (:meth:`BrokerAddresses.rotation`). With several addresses the first round
        starts at once; every later round (every round, with one address) waits the policy's
        delay first, so backing off starts only once every address has failed. The policy's
        ``max_attempts`` counts rounds."""
        s = self._session
        link = self._link
        policy = s.options.reconnect
        several = len(s.brokers) > 1
        where = link.endpoint.address if not several else ", ".join(s.brokers.configured)
        rounds = 0  # rounds in which every address failed
        while True:
            if not policy.enabled or (policy.max_attempts is not None and rounds >= policy.max_attempts):
                logger.warning("giving up reconnecting to %s after %d attempt(s)", where, rounds)
                self._events.emit(ev.Error(f"could not reconnect to {where}; session stopped"))
                link.give_up()
                self._stop_in_background()
                return
            backoff = rounds - 1 if several else rounds
            if backoff >= 0:
                if not link.pause(policy.delay(backoff)):
                    return
            elif link.stopping:
                return
            rounds += 1
            try:
                conn = s.connect(s.options.connect_timeout, link.endpoint)
            except SessionClosedError:
                return
            except (Error, OSError) as e:
                logger.info("reconnect attempt %d to %s failed: %s", rounds, where, e)
                continue
            with link.lock:
                try:
                    link.adopt(conn)
                except SessionClosedError:
                    conn.close()
                    return
                except ConnectionLost:
                    continue
                to_reopen = [queue for queue in self._registry if queue.state == QueueState.PENDING]
                # A configure buffered for a queue being reopened names a qId the new
                # connection does not know yet: it goes after the reopen (so its options win).
                buffered, deferred = self._requests.for_new_connection({id(queue) for queue in to_reopen})
            logger.warning("reconnected to %s", link.endpoint.address)
            self._events.emit(ev.Reconnected(address=link.endpoint.address))
            transport = conn.transport
            assert transport is not None
            try:
                for data in buffered:
                    transport.send_control(data)
                for queue in to_reopen:
                    self._reopen(queue, conn)
                self._resend_configures(deferred, transport)
                link.restored(conn)
            except (ConnectionLost, TimeoutError) as e:
                logger.warning("connection lost again while restoring state: %s", e)
                if isinstance(e, TimeoutError):
                    # The broker is slow, it sent no bad data: say so, then start over.
                    self._events.emit(ev.Error(f"could not restore the session state after reconnecting to "
                                               f"{link.endpoint.address}: {e}; reconnecting again"))
                    e = ConnectionLost(f"reconnecting again: {e}")
                self.replace(conn, e)
                rounds = 1 if several else 0  # back off as after a first failed attempt
                continue
            self._events.emit(ev.StateRestored())
            return

    def _resend_configures(self, deferred: List[Request], transport: Transport) -> None:
        """Re-send the configures held back until their queues were reopened; those whose
        queue could not be reopened fail (their caller has not given up waiting yet)."""
        for request in deferred:
            queue = request.queue
            assert queue is not None
            with self._link.lock:
                if not self._requests.is_pending(request):
                    continue  # its caller timed out meanwhile
                reopened = queue.state == QueueState.OPEN
                if not reopened:
                    self._requests.discard(request.future)
            if reopened:
                transport.send_control(request.data)
            else:
                fail_future(request.future, QueueStateError(f"{queue.uri} could not be reopened: not configured"))

    def _reopen(self, queue: Queue, conn: Connection) -> None:
        """Reopen ``queue`` on ``conn``; QueueReopenFailed (the queue forgotten) if the broker
        refuses it.

        Raises:
            ConnectionLost, TimeoutError: ``conn`` failed meanwhile (the queue stays PENDING, for
                the next connection to reopen).
        """
        s = self._session
        try:
            self._handles.reopen(queue, s.options.open_queue_timeout, s.options.configure_queue_timeout)
        except (ConnectionLost, TimeoutError):
            raise
        except Error as e:
            logger.warning("reopening %s failed: %s", queue.uri, e)
            s.forget_queue(queue, AckStatus.UNKNOWN)
            self._events.emit(ev.QueueReopenFailed(queue.uri, str(e)))
            return
        with self._link.lock:
            # Lost between the broker's answer and here, ``conn`` found the queue PENDING and
            # left it so: marked OPEN now, no later connection would reopen it.
            if self._link.current is not conn:
                raise ConnectionLost("connection lost while restoring state")
            if queue.state == QueueState.PENDING:
                queue.state = QueueState.OPEN
        self._events.emit(ev.QueueReopened(queue.uri))
