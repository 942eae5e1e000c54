"""The Queue handle returned by :meth:`bmq.Session.open_queue`."""
from __future__ import annotations

import collections
import logging
import queue as _stdqueue
import sys
import threading
import time
from concurrent.futures import Future
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol, Sequence,
                    Tuple, Union, cast)

from ._dispatch import report_callback_error
from ._protocol import queue_flags
from ._puts import Completion, PostRequest
from ._stats import QueueCounters
from ._options import QueueOptions
from ._types import (Ack, AckStatus, CompressionAlgorithmType, Message, MessageBatch, PropertyType, QUEUE_CLOSED,
                     QUEUE_CLOSING, QueueState)
from ._uri import QueueUri
from .exceptions import ArgumentTypeError, InvalidArgumentError, PostError, QueueStateError

if TYPE_CHECKING:  # pragma: no cover
    from ._puts import Batch, Record
    from ._session import Session

__all__ = ["Queue"]


_CLOSED_SENTINEL = object()
_FUTURES = Completion.FUTURES
# A PostRequest of its eight fields in order, at C speed (a NamedTuple's constructor is Python
# code, which every one-message post would pay).
_new_request = tuple.__new__
_LATCH = Completion.LATCH
# Enum members bound once and compared by identity: a read through the enum class costs ~50 ns
# on 3.11, and get() and confirm() pay it per message.
logger = logging.getLogger("bmq._session")  # the session's logger: one place to look
# get() and messages() let one thread at a time wait in the inbox on CPython 3.10-3.12 only (see
# Queue._take): 3.13 rewrote SimpleQueue without that bug, and there several consumer threads
# wait in the inbox at once and take messages as they come, where one taker at a time hands every
# message from thread to thread (8 threads calling get() on 3.13: 3.1 instead of 19.5 us of CPU a
# message, docs/threads.md).
_ONE_TAKER = sys.version_info < (3, 13)

Payload = Union[bytes, bytearray, memoryview]
Properties = Optional[Mapping[str, Any]]
PropertyTypes = Optional[Mapping[str, PropertyType]]
Compression = Union[CompressionAlgorithmType, str, None]
OnMessage = Callable[[Message], None]


def raise_for_failures(acks: Sequence[Ack]) -> None:
    """Raise PostError carrying every ack (``failed``: the indexes of those not SUCCESS), if
    any is not SUCCESS."""
    failed = [ack for ack in acks if ack.status is not AckStatus.SUCCESS]
    if failed:
        counts = collections.Counter(ack.status.name for ack in failed)
        statuses = ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(counts.items()))
        raise PostError(f"{len(failed)} of {len(acks)} message(s) NACKed or not acknowledged: {statuses}", acks)


def _one_guid(guid: Any) -> Optional[bytes]:
    """A caller's GUID for a one-message post, as bytes (None: make one).

    Raises:
        ArgumentTypeError: not bytes-like. InvalidArgumentError: not 16 bytes.
    """
    if guid is None:
        return None
    if not isinstance(guid, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"guid must be 16 bytes, not {type(guid).__name__}")
    guid = bytes(guid)
    if len(guid) != 16:
        raise InvalidArgumentError(f"guid must be 16 bytes, not {len(guid)}")
    return guid


def _check_payload_sequence(payloads: Any) -> None:
    """Refuse one payload given where a sequence of payloads belongs: iterating ``b"abc"``
    would post three messages of 97, 98 and 99 NUL bytes."""
    if isinstance(payloads, (bytes, bytearray, memoryview, str)):
        raise ArgumentTypeError(
            f"post_many takes a sequence of payloads (e.g. [b'...']), not one {type(payloads).__name__} object"
        )


class QueueOwner(Protocol):
    """What a Queue asks of its session, by name (``bmq._session.QueueServices``)."""

    session: "Session"

    def post(self, request: PostRequest) -> "Record": ...

    def ack_wait_limit(self, timeout: Optional[float]) -> float: ...

    def configure(self, queue: "Queue", options: QueueOptions, timeout: Optional[float]) -> None: ...

    def close(self, queue: "Queue", timeout: Optional[float]) -> None: ...

    def dispatch(self, fn: Callable[..., Any], *args: Any) -> None: ...


class Queue:
    """An open queue: post to it (``write=True``) and/or receive from it (``read=True``).

    Obtained from :meth:`bmq.Session.open_queue`; also a context manager that closes it.

    Attributes:
        uri: the queue URI as opened.
        read: opened for reading.
        write: opened for writing.
        queue_id: the qId used on the wire (one per canonical URI in the session).
        sub_id: the subQueueId (non-zero for a fan-out reader with ``?id=``).
        state: a :class:`bmq.QueueState` (a ``str`` enum: ``"opening"``, ``"open"``, ``"pending"``
            (waiting for a reopen), ``"closing"`` or ``"closed"``).
        suspended: True while suspended for bad host health.
        subscription_ids: the subscription ids (sIds) of the last configure.
        subscription_of: sId -> the entry of ``QueueOptions.subscriptions`` it was made for
            (None: the default subscription), for the last two configures.

    Thread-safety: every method may be called from any thread, including callbacks; the
    attributes are maintained by the session. What is marked *session side* (``deliver``,
    ``deliver_batch``, ``mark_closed``, ``keep_options``, ``handle_parameters``, and the
    ``counters``, ``parsed``, ``on_message``, ``opened`` and ``opened_with`` attributes) is how the session's units reach
    the queue: not public API, it may change in any release.
    """

    def __init__(
        self,
        owner: QueueOwner,
        parsed: QueueUri,
        *,
        read: bool,
        write: bool,
        options: QueueOptions,
        on_message: Optional[OnMessage],
        queue_id: int,
        sub_id: int,
        batches: bool = False,
    ) -> None:
        self._owner = owner
        self.parsed = parsed
        self.uri = parsed.uri
        self.read = read
        self.write = write
        self._options = options
        self.on_message = on_message
        self._dropped_on_close = False  # logged once: messages left for the broker at close
        self.queue_id = queue_id
        self.sub_id = sub_id
        self.counters = QueueCounters()  # bmq.Session.stats(); see bmq/_stats.py
        self.state = QueueState.OPENING
        self.suspended = False
        self.subscription_ids: List[int] = []
        self.subscription_of: Dict[int, Any] = {}
        self._inbox: "_stdqueue.SimpleQueue[Any]" = _stdqueue.SimpleQueue()
        #: Messages arrive as MessageBatch objects (get_batch), not one Message each.
        self.batches = batches
        # Session side: set once the open succeeded or failed; the arguments it was opened with.
        self.opened = threading.Event()
        self.opened_with: Dict[str, Any] = {}
        # One taker of the inbox at a time for get_batch (it keeps _rest), one waiting in it for
        # get and messages on CPython 3.10-3.12, whose SimpleQueue can block get(timeout=...)
        # until the next put() when another thread takes the item that woke it (_take). The
        # holder of _take_lock sets _taker_waiting, under its own lock, while it waits there.
        self._take_lock = threading.RLock()  # an RLock for its owner: see _take
        self._taker_waiting_lock = threading.Lock()
        self._taker_waiting = False
        self._rest: Optional[MessageBatch] = None  # what get_batch took beyond its limits

    def __repr__(self) -> str:
        mode = "".join(flag for flag, on in (("r", self.read), ("w", self.write)) if on)
        return f"Queue({self.uri!r}, mode={mode!r}, state={self.state})"

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.state != QueueState.CLOSED:
            self.close()

    @property
    def session(self) -> "Session":
        """The :class:`bmq.Session` this queue was opened in."""
        return self._owner.session

    @property
    def _session(self) -> "Session":
        return self._owner.session

    @property
    def options(self) -> QueueOptions:
        """The options last applied to this queue."""
        return self._options

    @property
    def is_open(self) -> bool:
        """True until the queue is closed (also while it is being reopened after a reconnect)."""
        return self.state in (QueueState.OPEN, QueueState.PENDING)

    @property
    def app_id(self) -> Optional[str]:
        """The fan-out appId from the URI's ``?id=``, or None."""
        return self.parsed.app_id

    def handle_parameters(self) -> Dict[str, Any]:
        """Session side (not public API): the QueueHandleParameters of this handle (protocol
        §8.5, §9.1)."""
        flags = queue_flags(self.read, self.write)
        params: Dict[str, Any] = {
            "uri": self.uri,
            "qId": self.queue_id,
            "flags": flags,
            "readCount": int(self.read),
            "writeCount": int(self.write),
            "adminCount": 0,
        }
        if self.parsed.app_id is not None:
            params["subIdInfo"] = {"subId": self.sub_id, "appId": self.parsed.app_id}
        return params

    # ---- posting ------------------------------------------------------------------
    def post_async(
        self,
        data: Payload,
        properties: Properties = None,
        *,
        property_types: PropertyTypes = None,
        compression: Compression = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
        guid: Optional[bytes] = None,
    ) -> "Future[Ack]":
        """Post one message; return at once with a future of its :class:`Ack`.

        The future resolves on the thread reading the socket (the session's reader thread,
        or on Linux a thread alone waiting in :meth:`post` or in such a future's ``result()``,
        which reads in its place: its answer then wakes it directly): a callback added with
        ``add_done_callback`` must not block; ``on_ack`` runs on the dispatcher thread and
        may call any session method. A signal handler's exception (Ctrl-C) raised while
        ``result()`` reads in the main thread drops the connection, as during :meth:`post`:
        the session reconnects and re-sends what is unanswered, with the same GUIDs.

        Args:
            data: the payload (not empty, at most 64 MiB).
            properties: ``{name: value}``; types inferred (bool, int -> INT32/INT64, str, bytes).
            property_types: ``{name: bmq.PropertyType}`` overriding inferred types.
            compression: ``"zlib"``/``"none"``/enum; the session default when None.
            on_ack: called with the Ack on the dispatcher thread.
            guid: the message's GUID (16 bytes) instead of a new one: a retry of a post that
                timed out, with that post's GUID, is stored once (see docs/retries.md).

        Returns:
            A Future resolving to the Ack (never raising): SUCCESS, a broker NACK, TIMEOUT
            after ``ack_timeout``, NOT_CONNECTED when the session stops first, CANCELED when the
            queue is closed first. It is already running: a post cannot be cancelled once
            accepted (``cancel()`` returns False), close the queue instead.

        Raises:
            QueueStateError: the queue is not open for writing (or is suspended).
            SessionClosedError: the session is stopped.
            ArgumentTypeError (a TypeError): ``data`` is not bytes, bytearray or memoryview.
            InvalidArgumentError: empty payload, unknown compression, a ``guid`` that is not
                16 bytes or is still waiting for its ACK in this session.
            MessageTooLargeError, PropertyError: over limits.
            BandwidthLimitError: the connection stayed above its high watermark (or the
                retransmission buffer full) for ``channel_write_timeout``; nothing was sent.
        """
        # An asynchronous one-message post is its own future (bmq._puts.OnePost).
        completion = _FUTURES if on_ack is None else Completion.futures(on_ack)
        return self._owner.post(_new_request(PostRequest, (  # type: ignore[return-value]
            self, (data,), completion, properties, property_types, compression,
            None if guid is None else _one_guid(guid), True)))

    def post(
        self,
        data: Payload,
        properties: Properties = None,
        *,
        property_types: PropertyTypes = None,
        compression: Compression = None,
        timeout: Optional[float] = None,
        guid: Optional[bytes] = None,
    ) -> Ack:
        """Post one message and block until it is acknowledged.

        Args:
            data, properties, property_types, compression, guid: as :meth:`post_async`.
            timeout: seconds to wait for the ACK; default ``ack_timeout`` (+ a margin).

        Returns:
            The SUCCESS Ack.

        Raises:
            PostError: the Ack was not SUCCESS (``error.ack`` holds it).
            TimeoutError: no result within ``timeout``: the message is still in flight;
                ``error.guids`` holds its GUID, to post it again without a duplicate.
            Error: the other errors of :meth:`post_async`.
        """
        batch = self._owner.post(_new_request(PostRequest, (self, (data,), _LATCH, properties, property_types,
                                                            compression, None if guid is None else _one_guid(guid),
                                                            True)))
        acks = cast("Batch", batch).wait(self._owner.ack_wait_limit(timeout))
        raise_for_failures(acks)
        return acks[0]

    def post_many_async(
        self,
        payloads: Sequence[Payload],
        properties: Union[Properties, Sequence[Properties]] = None,
        *,
        property_types: PropertyTypes = None,
        compression: Compression = None,
        guids: Optional[bytes] = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
    ) -> "List[Future[Ack]]":
        """Post many messages in as few PUT events as possible; one future per message.

        Args:
            payloads: the payloads, in order.
            properties: one mapping for every message, or one mapping (or None) per message.
            property_types: ``{name: bmq.PropertyType}`` overriding inferred types, for every
                message that has the name (one lacking it just has no such property); a name
                that no message of the call has raises PropertyError.
            compression: as :meth:`post_async`.
            guids: 16 bytes per message, concatenated, to use instead of generated GUIDs (a
                retried batch with the same GUIDs is de-duplicated by the broker).
            on_ack: called once per Ack on the dispatcher thread.

        Returns:
            One future per payload, as :meth:`post_async`.

        Raises:
            InvalidArgumentError: a wrong ``guids`` length.
            ArgumentTypeError: (a TypeError) ``payloads`` is one bytes/str object, not a sequence.
            Error: the other errors of :meth:`post_async`.
        """
        _check_payload_sequence(payloads)
        if not payloads:
            return []
        batch = self._owner.post(PostRequest(self, payloads, Completion.futures(on_ack), properties, property_types,
                                             compression, guids))
        return batch.futures  # type: ignore[return-value]

    def post_many_callback(
        self,
        payloads: Sequence[Payload],
        on_done: Callable[[List[Ack]], None],
        properties: Union[Properties, Sequence[Properties]] = None,
        *,
        property_types: PropertyTypes = None,
        compression: Compression = None,
    ) -> None:
        """Post many messages as :meth:`post_many_async` does, with one callback for the whole
        call rather than a future per message: the lightest way to post many asynchronously
        (no future per message: less memory while buffered, less CPU per message).

        Args:
            payloads: the payloads, in order (at least one).
            on_done: called once on the dispatcher thread with every message's Ack, in the
                order of ``payloads``, when the last one is answered (by the broker, or locally:
                TIMEOUT after ``ack_timeout``, CANCELED, NOT_CONNECTED when the session stops).
            properties, property_types, compression: as :meth:`post_many_async`.

        Raises:
            InvalidArgumentError: an empty ``payloads``.
            Error: the errors of :meth:`post_many_async` (nothing was sent then, and ``on_done``
                will not be called).
        """
        _check_payload_sequence(payloads)
        if not payloads:
            raise InvalidArgumentError("post_many_callback needs at least one payload")
        self._owner.post(PostRequest(self, payloads, Completion.callback(on_done), properties, property_types,
                                     compression))

    def post_many(
        self,
        payloads: Sequence[Payload],
        properties: Union[Properties, Sequence[Properties]] = None,
        *,
        property_types: PropertyTypes = None,
        compression: Compression = None,
        guids: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> List[Ack]:
        """Post many messages and block until every one is acknowledged.

        Returns:
            The Acks, in payload order (all SUCCESS).

        Raises:
            PostError: some Acks were not SUCCESS; ``error.acks`` holds every Ack in payload
                order, ``error.failed`` the indexes of those that are not.
            TimeoutError: not all results within ``timeout`` (default ``ack_timeout`` + margin):
                those messages are still in flight; ``error.guids`` holds every GUID of the
                call, to post it again (``guids=``) without duplicates.
            Error: the other errors of :meth:`post_many_async`.
        """
        _check_payload_sequence(payloads)
        if not payloads:
            return []
        batch = self._owner.post(PostRequest(self, payloads, Completion.LATCH, properties, property_types, compression,
                                             guids))
        acks = cast("Batch", batch).wait(self._owner.ack_wait_limit(timeout))
        raise_for_failures(acks)
        return acks

    # ---- consuming ----------------------------------------------------------------
    def get(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message (pull mode), or None when nothing arrives within ``timeout``.

        Args:
            timeout: seconds to wait; None waits until a message arrives or the queue closes.

        Raises:
            QueueStateError: not a reader, opened with ``on_message``, or closed.
        """
        self._check_pull("get()")
        if self.state is QUEUE_CLOSED:
            raise QueueStateError(f"{self.uri} is closed")
        message: Optional[Message] = self._take(timeout)
        return message

    def _check_pull(self, call: str, batches: bool = False) -> None:
        if not self.read or self.on_message is not None:
            raise QueueStateError(f"{self.uri}: {call} needs a queue opened with read=True and no on_message")
        if self.batches != batches:
            needs = "opened with batches=True" if batches else "opened without batches=True (use get_batch())"
            raise QueueStateError(f"{self.uri}: {call} needs a queue {needs}")

    def _take(self, timeout: Optional[float]) -> Any:
        """The next message from the inbox (a MessageBatch on a ``batches`` queue), None after
        ``timeout`` (waiting for another taker included).

        One waiting taker at a time on CPython 3.10-3.12 (_ONE_TAKER): there
        ``SimpleQueue.get(timeout=...)`` woken by a ``put()`` whose item another thread's ``get``
        takes first, and getting the interpreter lock back after its deadline, waits on the
        queue's lock again with the negative time left, that is until the next ``put()``: a
        consumer's ``get(timeout=0.05)`` hung for good once every message was in
        (tests/integration/test_threads_stress.py, twice in CI under load). So the thread holding
        ``_take_lock`` alone may wait in the inbox, and says so (``_taker_waiting``) under a lock
        of its own; the others take what is there without waiting (``get_nowait``, which cannot
        hang) while it does not, and else wait for ``_take_lock``. Taking strictly in turn handed
        every message from thread to thread (8 consumer threads on 3.11: 19.8 us of CPU a message).

        Raises:
            QueueStateError: the queue closed.
        """
        if not _ONE_TAKER:
            return self._take_held(timeout)
        # None while not known: a signal handler's exception (a Ctrl-C in a consumer loop) can
        # come right after the lock is taken, before the call's result is stored; the finally
        # then asks the lock whether this thread holds it (an RLock knows its owner).
        locked: Optional[bool] = None
        try:
            locked = self._take_lock.acquire(False)
            if not locked:
                # Another taker: unless it waits in the inbox (it could be robbed), take what is there.
                with self._taker_waiting_lock:
                    if not self._taker_waiting:
                        try:
                            return self._opened(self._inbox.get_nowait())
                        except _stdqueue.Empty:
                            pass
                locked = None
                locked, timeout = self._lock_taking(timeout)
                if not locked:
                    return None
            try:
                return self._opened(self._inbox.get_nowait())
            except _stdqueue.Empty:
                if timeout is not None and timeout <= 0:
                    return None
            try:
                with self._taker_waiting_lock:
                    self._taker_waiting = True
                # Looks in the inbox again: a put() since, whose item another taker took before
                # the flag was up, would have left the stale signal _take_held clears.
                return self._take_held(timeout)
            finally:
                with self._taker_waiting_lock:
                    self._taker_waiting = False
        finally:
            if locked is None:
                locked = self._take_lock._is_owned()  # type: ignore[attr-defined]
            if locked:
                self._take_lock.release()

    def _opened(self, item: Any) -> Any:
        """``item`` taken from the inbox, unless it is the closed queue's sentinel."""
        if item is _CLOSED_SENTINEL:
            self._inbox.put(item)  # wake every other getter too
            raise QueueStateError(f"{self.uri} is closed")
        return item

    def _lock_taking(self, timeout: Optional[float]) -> Tuple[bool, Optional[float]]:
        """Acquire ``_take_lock`` within ``timeout`` (None: no bound); whether it was, and the
        time left of ``timeout``."""
        if self._take_lock.acquire(False):  # the usual case, one taker: no clock to read
            return True, None if timeout is None else max(0.0, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._take_lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return False, 0.0
        return True, None if deadline is None else max(0.0, deadline - time.monotonic())

    def _take_held(self, timeout: Optional[float]) -> Any:
        """:meth:`_take` for a caller holding ``_take_lock`` (or needing none: not _ONE_TAKER).

        ``get_nowait()`` first, then ``get(timeout=...)`` only for a time left: on CPython 3.10
        a ``SimpleQueue.get(timeout=...)`` on an empty inbox whose lock a ``put()`` had left
        free (a new inbox, or one whose last item was taken without waiting) takes that lock,
        finds nothing, and when its deadline passed meanwhile (always so for timeout 0, given a
        microsecond's preemption) waits with the negative time left, that is until the next
        ``put()``: ``get_batch(timeout=0)`` hung in CI under load. ``get_nowait()`` on an empty
        inbox takes that stale signal without waiting, so the wait after it starts clean.
        """
        try:
            item = self._inbox.get_nowait()
        except _stdqueue.Empty:
            if timeout is not None and timeout <= 0:
                return None
            try:
                item = self._inbox.get(timeout=timeout)
            except _stdqueue.Empty:
                return None
        return self._opened(item)

    def messages(self, timeout: Optional[float] = None) -> Iterator[Message]:
        """Iterate over incoming messages until none arrives within ``timeout`` (or the queue
        closes).

        Args:
            timeout: seconds of silence that end the iteration; None never ends it by time.
        """
        self._check_pull("messages()")  # once, not per message as get() would
        while self.state is not QUEUE_CLOSED:
            try:
                message = self._take(timeout)
            except QueueStateError:
                return
            if message is None:
                return
            yield message

    def get_batch(
        self,
        max_messages: int = 10_000,
        timeout: Optional[float] = None,
        *,
        max_bytes: Optional[int] = None,
    ) -> Optional[MessageBatch]:
        """The messages that have arrived, as one :class:`bmq.MessageBatch` (a queue opened
        with ``batches=True``), or None when none arrives within ``timeout``.

        Waits for a first message, then takes what has already arrived, without waiting more,
        up to ``max_messages`` and ``max_bytes`` of payload (at least one message, whatever its
        size). Messages beyond the limits stay for the next call, in order.

        Args:
            max_messages: most messages to return.
            timeout: seconds to wait for a first message; None waits until one arrives.
            max_bytes: most payload bytes to return; None for no limit.

        Raises:
            QueueStateError: not opened with ``batches=True``, or closed.
            InvalidArgumentError: ``max_messages`` or ``max_bytes`` not positive.
        """
        self._check_pull("get_batch()", batches=True)
        if max_messages <= 0 or (max_bytes is not None and max_bytes <= 0):
            raise InvalidArgumentError(f"get_batch: max_messages ({max_messages}) and max_bytes ({max_bytes}) "
                                       "must be positive")
        if self.state is QUEUE_CLOSED:
            raise QueueStateError(f"{self.uri} is closed")
        # Another thread may hold the lock while it waits for a first message: the timeout
        # covers waiting for the lock too.
        locked: Optional[bool] = None  # None while not known: see _take
        try:
            locked, left = self._lock_taking(timeout)
            if not locked:
                return None
            first, self._rest = self._rest, None
            if first is None:
                first = self._take_held(left)
                if first is None:
                    return None
            parts = [first]
            count, size = len(first), len(first.payloads)
            while count < max_messages and (max_bytes is None or size < max_bytes):
                try:
                    part = self._inbox.get_nowait()
                except _stdqueue.Empty:
                    break
                if part is _CLOSED_SENTINEL:
                    self._inbox.put(part)  # for the next call (and every other getter)
                    break
                parts.append(part)
                count, size = count + len(part), size + len(part.payloads)
            batch = MessageBatch.join(parts)
            keep = min(max_messages, batch._count_within(max_bytes) if max_bytes is not None else count) or 1
            if keep < len(batch):
                batch, self._rest = batch._split(keep)
            return batch
        finally:
            if locked is None:
                locked = self._take_lock._is_owned()  # type: ignore[attr-defined]
            if locked:
                self._take_lock.release()

    def confirm_many(self, messages: Iterable[Message]) -> None:
        """Confirm messages of this queue in one CONFIRM event (see :meth:`Message.confirm`)."""
        self._confirm(tuple(messages))

    def _confirm(self, messages: Sequence[Message]) -> None:
        self._owner.session.confirm_many(messages)

    def deliver(self, messages: List[Message]) -> None:
        """Session side (not public API), reader thread: hand messages to get() or to the
        on_message callback, in order."""
        self.counters.pushed += len(messages)
        if self.on_message is None:
            put = self._inbox.put
            for message in messages:
                put(message)
        else:
            dispatch, hand_over = self._owner.dispatch, self._hand_over
            for message in messages:
                dispatch(hand_over, message)

    def _hand_over(self, message: Message) -> None:
        """Dispatcher thread: give ``message`` to the on_message callback, unless the queue began
        closing since it arrived (``close_queue()`` or ``stop()`` while it waited behind other
        callbacks): the application asked for no more, and a confirm may no longer reach the
        broker. It is left unconfirmed for the broker to deliver again, rather than handled
        twice (here and after that redelivery) by a callback whose confirm raises."""
        state = self.state
        if state is QUEUE_CLOSED or state is QUEUE_CLOSING:
            if not self._dropped_on_close:
                self._dropped_on_close = True
                logger.info("%s closed: messages still waiting for on_message are not handed to it (unconfirmed, "
                            "the broker delivers them again)", self.uri)
            return
        try:
            self.on_message(message)  # type: ignore[misc]
        except BaseException as exc:  # noqa: B902 - reported as the dispatcher does, naming the callback
            report_callback_error(self.on_message, exc)  # type: ignore[arg-type]

    def deliver_batch(self, batch: MessageBatch) -> None:
        """Session side (not public API), reader thread: hand a batch to get_batch()."""
        self.counters.pushed += len(batch)
        self._inbox.put(batch)

    def mark_closed(self) -> None:
        """Session side (not public API): the queue is closed (a blocked :meth:`get` returns)."""
        self.state = QueueState.CLOSED
        self.opened.set()
        self._inbox.put(_CLOSED_SENTINEL)

    # ---- lifecycle ----------------------------------------------------------------
    def configure(self, options: QueueOptions, timeout: Optional[float] = None) -> None:
        """Apply new options (see :meth:`bmq.Session.configure_queue`)."""
        self._owner.configure(self, options, timeout)

    def keep_options(self, options: QueueOptions) -> None:
        """Session side (not public API; applications call :meth:`configure`): ``options`` are
        applied, or will be by the next reopen or resume; :attr:`options` says them from now on."""
        self._options = options

    def close(self, timeout: Optional[float] = None) -> None:
        """Close the queue (see :meth:`bmq.Session.close_queue`)."""
        self._owner.close(self, timeout)

