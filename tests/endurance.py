"""The soak engine: hours (or, in the test suite, seconds) of mixed traffic through faults,
with the client's resources sampled over time and every message accounted for.

One implementation for both users: ``benchmarks/soak.py`` (minutes, JSON and a picture) and
``tests/fault/test_soak.py`` (about 35 s per broker in the default run). :func:`run_soak`
drives, against one broker (a real ``bmqbrkr`` or the embedded broker, each in its own
process, ``tests/faulthost.py``, so this process holds only the client):

* patterns, each with its own session, all through a TCP proxy (``tests/proxy.py``): blocking
  ``post()`` from 4 threads (persistent domain), ``post_async`` with a window (in-memory
  domain), ``post_many`` with a durable outbox (persistent), ``post_many`` to a fan-out queue
  (persistent) read by two app ids; an ``on_message`` consumer and a ``get_batch`` consumer;
* faults in turn: the proxy cuts every connection; the proxy stalls them for a few seconds;
  the broker crashes (bmqbrkr: SIGKILL and restart on its storage, the fault lasting until the
  broker serves a new session; embedded: ``restart()``, then its ``Faults``: dropped
  connections, withheld ACKs); every session is closed and reopened;
* every ``interval`` seconds a sample: throughput per pattern, blocking-post and
  ``post_async`` latency p50/p99, RSS, threads, open fds, writer-queue bytes, outbox
  messages, messages in flight.

Every message carries ``stream:seq`` in its payload; one bit per message records that it was
acknowledged and, per reader, delivered (a few MB for hours: the ledger must not be what
grows). The bitmaps are allocated for the whole run at the start, and the bookkeeping of a
broker crash works through them in small slices: bitmaps that doubled as they filled, and
multi-MB integers made at every crash, left the allocator with free-but-kept memory that
grew RSS by ~0.13 MB/min over two hours with no client at all (``tests/endurance.py``'s own
doing, not bmq's). :class:`SoakResult` holds the samples, the faults, and the checks made at
the end.
"""
from __future__ import annotations

import array
import collections
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import bmq
from bmq import events
from faulthost import FaultHost

#: Reconnect quickly: a soak wants to measure recovery, not back-off.
RECONNECT = bmq.ReconnectPolicy(initial_delay=0.02, max_delay=0.5, jitter=0.2)
#: Bound on any wait for a condition (drains, reopen hand-overs, the final deliveries).
WAIT_TIMEOUT = 60.0
#: Payload size of every message (its ``stream:seq:`` prefix padded with dots).
PAYLOAD_SIZE = 100
#: Allowed RSS growth (MB) between the end of the warm-up and the end of the run.
RSS_GROWTH_LIMIT_MB = 20.0
#: Duplicate deliveries kept with their evidence for the end-of-run check (and the JSON); past
#: this many a run has gone so wrong that the rest are only counted, and fail the check.
MAX_DUPLICATE_RECORDS = 100_000
#: What explains a duplicate whose PUT was outstanding (sent, not yet acknowledged) while a fault
#: was under way or a session lost its connection: the client sent it again after reconnecting
#: (same GUID), and the broker may store such a PUT twice (``../shared/protocol/FACTS.md`` 11.3).
RESENT = "PUT outstanding in a fault (sent again)"
#: The moment a session lost its connection with no fault under way (a loaded machine's missed
#: heartbeats): at-least-once delivery allows the same redeliveries as after an injected cut.
CONNECTION_LOST = "connection lost outside a fault"

_ERROR_EVENTS = (events.Error, events.QueueReopenFailed, events.QueueSuspendFailed, events.QueueResumeFailed,
                 events.AuthenticationFailed)


@dataclasses.dataclass
class SoakConfig:
    """What to run: duration, broker, fault and sample cadence, rates (messages per second)."""

    seconds: float = 600.0
    bmqbrkr_home: Optional[Path] = None  # None: the embedded broker
    interval: float = 5.0  # between samples
    fault_every: float = 30.0
    first_fault: float = 15.0
    stall_seconds: float = 3.0
    #: After a fault ends, errors within this many seconds are its doing, and a pattern standing
    #: still is not judged (duplicates are judged by what came between their deliveries).
    grace: float = 15.0
    #: RSS growth is measured from the first sample at or after this time (s).
    warmup: float = 60.0
    blocking_threads: int = 4
    blocking_rate: float = 200.0  # per thread
    async_rate: float = 1500.0
    async_window: int = 100
    many_rate: float = 2000.0
    many_chunk: int = 100
    fanout_rate: float = 300.0
    fanout_chunk: int = 10
    workdir: Optional[Path] = None  # bmqbrkr's directory and the outbox (default: a temporary one)
    log: Callable[[str], None] = print
    #: Opt-in: append a JSON line of what grows (see :class:`Diagnostics`) every ``diag_every`` s.
    diag_path: Optional[Path] = None
    diag_every: float = 300.0
    #: With ``diag_path``: trace Python allocations with this many frames (0: off; it costs
    #: CPU and memory of its own, so the RSS of such a run is not the client's alone).
    tracemalloc_frames: int = 0
    #: A diagnostic: glibc's malloc_trim(0) after every fault, giving the allocator's free
    #: pages back, so that RSS shows what is live rather than what the allocator keeps.
    malloc_trim: bool = False


# ---- the ledger ---------------------------------------------------------------------------


#: Bytes of bitmap per step when combining bitmaps: the integers made stay far below glibc's
#: mmap threshold, so they come and go without leaving the heap fragmented.
_SLICE = 1 << 14


class _Bits:
    """A bitmap of message sequence numbers, allocated for ``capacity`` of them (grows, by
    doubling, only past that)."""

    __slots__ = ("data", "count")

    def __init__(self, capacity: int = 0) -> None:
        self.data = bytearray(_bitmap_bytes(capacity))
        self.count = 0

    def set(self, seq: int) -> bool:
        """Set bit ``seq``; False when it was already set."""
        index, mask = seq >> 3, 1 << (seq & 7)
        data = self.data
        if index >= len(data):
            data.extend(bytes(max(len(data), index + 1 - len(data))))
        if data[index] & mask:
            return False
        data[index] |= mask
        self.count += 1
        return True

    def __contains__(self, seq: int) -> bool:
        return _bit(self.data, seq)

    def as_int(self) -> int:
        """The bitmap as one integer (bit ``seq`` set for each recorded ``seq``)."""
        return int.from_bytes(self.data, "little")


def _bitmap_bytes(capacity: int) -> int:
    """Bytes of a bitmap allocated for ``capacity`` sequence numbers."""
    return max(4096, capacity // 8 + 1)


def _bit(data: bytearray, seq: int) -> bool:
    """Whether bit ``seq`` of bitmap ``data`` is set (False past its end)."""
    index = seq >> 3
    return index < len(data) and bool(data[index] & (1 << (seq & 7)))


def _copy_into(kept: bytearray, data: bytearray) -> None:
    """Copy bitmap ``data`` into ``kept``, a buffer allocated once (grown only if ``data`` grew)."""
    if len(kept) != len(data):
        kept.extend(bytes(len(data) - len(kept)))
    kept[:] = data


def _popcount(value: int) -> int:
    """The number of bits set in ``value``."""
    return bin(value).count("1")


@dataclasses.dataclass
class _Stream:
    """The messages of one producer thread: posted/acked, and delivered per reader."""

    name: str
    pattern: str
    in_memory: bool
    readers: Tuple[str, ...]
    capacity: int = 0  # messages the bitmaps are allocated for
    acked: _Bits = dataclasses.field(init=False)
    received: Dict[str, _Bits] = dataclasses.field(init=False)
    posted: int = 0
    # reader -> acked, not delivered when a broker crash lost its memory (bitmaps; in-memory
    # streams only), and what the reader had received at the crash (scratch, reused)
    lost_to_crash: Dict[str, _Bits] = dataclasses.field(init=False)
    received_at_crash: Dict[str, bytearray] = dataclasses.field(init=False)
    # The evidence for duplicates (see Ledger.fault_began): acked messages whose PUT was
    # outstanding at a fault or connection loss; per reader, what it had received by the end of
    # the latest one; and how many messages had been taken for posting by then.
    resent: _Bits = dataclasses.field(init=False)
    received_at_fault: Dict[str, bytearray] = dataclasses.field(init=False)
    posted_at_fault: int = 0

    def __post_init__(self) -> None:
        self.acked = _Bits(self.capacity)
        self.received = {reader: _Bits(self.capacity) for reader in self.readers}
        self.resent = _Bits(self.capacity)
        self.received_at_fault = {reader: bytearray(_bitmap_bytes(self.capacity)) for reader in self.readers}
        crash_capacity = self.capacity if self.in_memory else 0
        self.lost_to_crash = {reader: _Bits(crash_capacity) for reader in self.readers}
        self.received_at_crash = {reader: bytearray(_bitmap_bytes(crash_capacity)) for reader in self.readers}

    def take(self, count: int) -> range:
        """The next ``count`` sequence numbers to post (one producer thread per stream: no lock)."""
        first = self.posted
        self.posted += count
        return range(first, first + count)


class Duplicates:
    """Duplicate deliveries, each with its evidence, in arrays (no object per duplicate): its
    time, stream and reader, sequence number, and what happened between its two deliveries
    (an index in :attr:`causes`, -1 for nothing). Past MAX_DUPLICATE_RECORDS only counted."""

    def __init__(self) -> None:
        self.count = 0
        self.times = array.array("d")
        self.where = array.array("H")  # index in self.places
        self.seqs = array.array("q")
        self.between = array.array("h")  # index in self.causes, -1: no fault or loss between
        self.places: List[Tuple[str, str]] = []  # (stream, reader)
        self.causes: List[str] = []

    def add(self, t: float, stream: str, reader: str, seq: int, between: Optional[str]) -> None:
        """Record a duplicate delivery of ``seq`` of ``stream`` to ``reader`` at ``t``, after
        ``between`` (the fault or loss since its earlier delivery; None: nothing)."""
        self.count += 1
        if len(self.times) >= MAX_DUPLICATE_RECORDS:
            return
        self.times.append(t)
        self.where.append(_index(self.places, (stream, reader)))
        self.seqs.append(seq)
        self.between.append(-1 if between is None else _index(self.causes, between))

    def __len__(self) -> int:
        return self.count

    def nbytes(self) -> int:
        """Memory of the arrays (the soak's own)."""
        return sum(map(sys.getsizeof, (self.times, self.where, self.seqs, self.between)))

    def records(self, t0: float, streams: Dict[str, "_Stream"]) -> List[Dict[str, Any]]:
        """The kept duplicates as plain data for :func:`judge_duplicates` and the JSON: seconds
        into the run, stream, reader, seq, ``between`` (a fault's kind, CONNECTION_LOST or
        None) and ``resent`` (its PUT was outstanding at a fault or loss)."""
        out = []
        for t, where, seq, between in zip(self.times, self.where, self.seqs, self.between):
            stream, reader = self.places[where]
            out.append({"t": round(t - t0, 2), "stream": stream, "reader": reader, "seq": seq,
                        "between": None if between < 0 else self.causes[between],
                        "resent": seq in streams[stream].resent})
        return out


def _index(names: List[Any], name: Any) -> int:
    """The index of ``name`` in ``names``, appended if new (a handful of names per run)."""
    try:
        return names.index(name)
    except ValueError:
        names.append(name)
        return len(names) - 1


class Ledger:
    """What was acknowledged and what was delivered, per stream and reader; duplicates with the
    evidence that may explain them (:meth:`fault_began`). Thread-safe; :attr:`changed` is
    notified on every delivery. A connection lost within ``grace`` seconds of a fault's end is
    that fault's doing."""

    def __init__(self, grace: float = SoakConfig.grace) -> None:
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.streams: Dict[str, _Stream] = {}
        self.duplicates = Duplicates()
        self._grace = grace
        self._fault: Optional[str] = None  # the latest fault or connection loss
        self._under_way = False  # a fault began and has not ended
        self._fault_ended_at = float("-inf")  # monotonic

    def add(self, name: str, pattern: str, in_memory: bool, readers: Tuple[str, ...], capacity: int = 0
            ) -> _Stream:
        """A new stream ``name`` of ``pattern``, read by each of ``readers``, with bitmaps for
        ``capacity`` messages (before traffic starts)."""
        stream = self.streams[name] = _Stream(name, pattern, in_memory, readers, capacity)
        return stream

    def acked(self, stream: _Stream, seqs: Sequence[int]) -> None:
        """Record that the broker acknowledged ``seqs`` of ``stream``; those posted before the
        latest fault or loss ended (and acknowledged after it began, being acknowledged now)
        were outstanding during it: the client may have sent them again."""
        with self._lock:
            outstanding_below = stream.posted if self._under_way else stream.posted_at_fault
            for seq in seqs:
                stream.acked.set(seq)
                if seq < outstanding_below:
                    stream.resent.set(seq)

    def fault_began(self, kind: str) -> None:
        """A fault of ``kind`` begins: until :meth:`fault_ended`, a duplicate delivery is its
        doing, and so is the PUT of a message acknowledged meanwhile (the evidence
        :func:`judge_duplicates` judges on)."""
        with self._lock:
            self._fault, self._under_way = kind, True

    def fault_ended(self) -> None:
        """The fault begun by :meth:`fault_began` is over: keep what each reader has received
        and how much each stream has posted by now (copied into buffers allocated once)."""
        with self._lock:
            self._under_way = False
            self._fault_ended_at = time.monotonic()
            self._mark()

    def connection_lost(self, at: float, streams: Sequence[str] = (), readers: Sequence[str] = ()) -> None:
        """A session lost its connection at ``at`` (monotonic): a moment like a fault's end for
        the PUTs of its ``streams`` (a producer's, by name), or for its ``readers`` (a consumer's, once
        they have taken what the session had received before the loss). During a fault or
        within ``grace`` seconds of its end it is that fault's doing, else CONNECTION_LOST."""
        with self._lock:
            if readers and not self._under_way and at - self._fault_ended_at > self._grace:
                self._fault = CONNECTION_LOST
            self._mark(streams, readers)

    def _mark(self, streams: Optional[Sequence[str]] = None, readers: Optional[Sequence[str]] = None) -> None:
        """Keep how much ``streams`` posted and what ``readers`` received by now (None: all)."""
        for stream in self.streams.values():
            if streams is None or stream.name in streams:
                stream.posted_at_fault = stream.posted
            for reader, bits in stream.received.items():
                if readers is None or reader in readers:
                    _copy_into(stream.received_at_fault[reader], bits.data)

    def _between(self, stream: _Stream, reader: str, seq: int) -> Optional[str]:
        """The fault (or loss) between the earlier delivery of ``seq`` to ``reader`` and now:
        the one under way, or the latest if the reader had it by its end; else None."""
        if self._under_way or _bit(stream.received_at_fault[reader], seq):
            return self._fault
        return None

    def delivered(self, reader: str, payloads: Sequence[bytes], now: float) -> None:
        """Record that ``reader`` received ``payloads`` (``stream:seq:...`` each) at ``now``
        (monotonic); one seen before is a duplicate."""
        with self._lock:
            for payload in payloads:
                name, seq_text, _ = bytes(payload).split(b":", 2)
                seq = int(seq_text)
                stream = self.streams[name.decode()]
                if not stream.received[reader].set(seq):
                    self.duplicates.add(now, stream.name, reader, seq, self._between(stream, reader, seq))
            self.changed.notify_all()

    def counts(self) -> Dict[str, int]:
        """Acked messages per pattern and delivered messages per reader (for throughput)."""
        out: Dict[str, int] = {}
        with self._lock:
            for stream in self.streams.values():
                out[stream.pattern] = out.get(stream.pattern, 0) + stream.acked.count
                for reader, bits in stream.received.items():
                    key = sys.intern(f"deliver:{reader}")  # one string for every sample's keys
                    out[key] = out.get(key, 0) + bits.count
        return out

    def note_crash(self) -> None:
        """A broker crash lost its in-memory queues: the in-memory messages acked by now and not
        delivered before the crash (what :meth:`snapshot_received` took when it died) are its doing.

        Call once the broker is back: ACKs it sent just before dying are still read from the
        socket after the kill, and their messages died with it too.
        """
        with self._lock:
            for stream in self.streams.values():
                if not stream.in_memory:
                    continue
                acked = stream.acked.data
                for reader in stream.readers:
                    before, lost = stream.received_at_crash[reader], stream.lost_to_crash[reader]
                    if len(lost.data) < len(acked):
                        lost.data.extend(bytes(len(acked) - len(lost.data)))
                    for i in range(0, len(acked), _SLICE):
                        j = i + _SLICE
                        candidates = int.from_bytes(acked[i:j], "little") & ~int.from_bytes(before[i:j], "little")
                        if candidates:
                            merged = int.from_bytes(lost.data[i:j], "little") | candidates
                            lost.data[i:j] = merged.to_bytes(len(lost.data[i:j]), "little")

    def nbytes(self) -> int:
        """Memory the ledger holds (its bitmaps, crash bookkeeping and duplicates): the soak's own,
        sampled so that it is not mistaken for the client's."""
        with self._lock:
            total = self.duplicates.nbytes()
            for stream in self.streams.values():
                total += sys.getsizeof(stream.acked.data) + sum(sys.getsizeof(b.data) for b in stream.received.values())
                total += sys.getsizeof(stream.resent.data) + sum(map(sys.getsizeof, stream.received_at_fault.values()))
                total += sum(sys.getsizeof(b.data) for b in stream.lost_to_crash.values())
                total += sum(map(sys.getsizeof, stream.received_at_crash.values()))
            return total

    def snapshot_received(self) -> None:
        """Keep what each reader of an in-memory stream has received so far, for :meth:`note_crash`
        (copied into buffers allocated once)."""
        with self._lock:
            for stream in self.streams.values():
                if not stream.in_memory:
                    continue
                for reader, bits in stream.received.items():
                    _copy_into(stream.received_at_crash[reader], bits.data)

    def all_delivered(self) -> bool:
        """Every acked message delivered to each of its readers (or lost with a crashed broker's
        memory). Call with :attr:`changed` held."""
        for stream in self.streams.values():
            acked = stream.acked.as_int()
            for reader, bits in stream.received.items():
                if acked & ~bits.as_int() & ~stream.lost_to_crash[reader].as_int():
                    return False
        return True


# ---- roles: a session and the threads using it ---------------------------------------------


class _Gate:
    """Lets workers do units of work unless closed; :meth:`close` waits for those inside."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._finished = False
        self._inside = 0

    def enter(self) -> bool:
        """Wait until open; False once finished (the worker should exit).

        Raises:
            TimeoutError: closed for WAIT_TIMEOUT without being reopened or finished.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: not self._closed or self._finished, WAIT_TIMEOUT):
                raise TimeoutError(f"gate closed for {WAIT_TIMEOUT} s")
            if self._finished:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        """The end of a unit begun by a successful :meth:`enter`."""
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    def close(self, finish: bool = False) -> None:
        """Let no worker in (for good with ``finish``) and wait for those inside to leave.

        Raises:
            TimeoutError: a worker still inside after WAIT_TIMEOUT.
        """
        with self._cond:
            self._closed = True
            self._finished = self._finished or finish
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._inside == 0, WAIT_TIMEOUT):
                raise TimeoutError(f"workers still busy after {WAIT_TIMEOUT} s")

    def open(self) -> None:
        """Let workers in again."""
        with self._cond:
            self._closed = False
            self._cond.notify_all()


class _Role:
    """One session and ``threads`` workers doing :meth:`work` units; :meth:`reopen` closes the
    session between units and opens a new one (workers wait at the gate meanwhile)."""

    threads = 0

    def __init__(self, soak: "_Soak", name: str) -> None:
        self.soak = soak
        self.name = name
        self.session: Optional[bmq.Session] = None
        self._gate = _Gate()
        self._workers: List[threading.Thread] = []
        self.stopping = soak.stopping

    def options(self) -> bmq.SessionOptions:
        """The options of every session of this role."""
        return bmq.SessionOptions(reconnect=RECONNECT, on_event=self.on_event)

    def on_event(self, event: events.SessionEvent) -> None:
        """The session's ``on_event``: counted by the soak; a lost connection is evidence for
        the duplicates (:meth:`connection_lost`)."""
        self.soak.on_event(event)
        if isinstance(event, events.ConnectionLost):
            self.connection_lost(time.monotonic())

    def connection_lost(self, at: float) -> None:
        """Tell the ledger that this role's session lost its connection at ``at``."""
        raise NotImplementedError

    def open(self) -> None:
        """Open ``self.session`` and its queues."""
        raise NotImplementedError

    def work(self, index: int) -> None:
        """One unit of work of worker ``index`` (called with the gate entered)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Wait for what is in flight before the session closes."""

    def start(self) -> None:
        """Open the session and start the workers."""
        self.open()
        self._workers = [threading.Thread(target=self._loop, args=(i,), name=f"soak-{self.name}-{i}", daemon=True)
                         for i in range(self.threads)]
        for worker in self._workers:
            worker.start()

    def _loop(self, index: int) -> None:
        where = f"{self.name}[{index}]"
        while True:
            try:
                if not self._gate.enter():
                    return
            except TimeoutError as exc:  # a reopen that never ended: the worker gives up
                self.soak.error(where, exc)
                return
            try:
                self.work(index)
            except Exception as exc:  # noqa: BLE001 - every error is recorded and judged at the end
                self.soak.error(where, exc)
                self.stopping.wait(0.05)  # do not spin on a persistent failure
            finally:
                self._gate.leave()

    def pause(self, finish: bool = False) -> None:
        """Stop the workers between units, then let in-flight work finish."""
        self._gate.close(finish)
        self.drain()

    def reopen(self) -> None:
        """Close the session between units of work and open a new one, trying again while the
        broker refuses it (a bmqbrkr still recovering its storage after a crash closes new
        connections during negotiation); each refusal is an error, judged against the faults.

        Raises:
            bmq.Error: the broker still refused a new session after WAIT_TIMEOUT.
        """
        self.pause()
        self.close_session()
        deadline = time.monotonic() + WAIT_TIMEOUT
        while True:
            try:
                self.open()
                break
            except bmq.Error as exc:
                self.soak.error(f"{self.name} reopen", exc)
                self.close_session()  # a session whose queue did not open
                if time.monotonic() > deadline:
                    raise
                self.stopping.wait(0.5)  # before asking the broker again
        self._gate.open()

    def close_session(self) -> None:
        """Stop the session (idempotent)."""
        session, self.session = self.session, None
        if session is not None:
            session.stop()

    def finish(self) -> None:
        """Stop the workers for good (the session stays open: consumers still deliver);
        idempotent. A worker that does not exit is recorded as an error."""
        self.pause(finish=True)
        for worker in self._workers:
            worker.join(WAIT_TIMEOUT)
            if worker.is_alive():
                self.soak.error(self.name, TimeoutError(f"{worker.name} still running after {WAIT_TIMEOUT} s"))


class _Paced:
    """Keeps a worker at ``rate`` units per second, without bursts after a hold-up."""

    def __init__(self, rate: float, stopping: threading.Event) -> None:
        self.period = 1.0 / rate
        self.next = time.monotonic()
        self.stopping = stopping

    def wait(self) -> None:
        """Wait until the next unit is due (at once when behind by more than a second)."""
        self.next += self.period
        now = time.monotonic()
        if self.next < now - 1.0:
            self.next = now  # a fault held us up: resume the rate, do not catch up
        elif self.next > now:
            self.stopping.wait(self.next - now)  # the soak's pace: time passing is the point


def _payload(stream: _Stream, seq: int) -> bytes:
    """Message ``seq`` of ``stream``: ``name:seq:`` padded to PAYLOAD_SIZE."""
    head = b"%s:%d:" % (stream.name.encode(), seq)
    return head + b"." * (PAYLOAD_SIZE - len(head))


class _Producer(_Role):
    """A role whose session opens one queue, ``uri``, for writing; post latencies (where the
    role measures them) are taken by the sampler."""

    def __init__(self, soak: "_Soak", name: str, uri: str) -> None:
        super().__init__(soak, name)
        self.uri = uri
        self.latencies: List[float] = []  # seconds; appended by workers or the reader thread
        self.streams: List[_Stream] = []  # what it posts

    def connection_lost(self, at: float) -> None:
        """Its PUTs outstanding at the loss may be sent again."""
        self.soak.ledger.connection_lost(at, streams=[stream.name for stream in self.streams])

    def open(self) -> None:
        self.session = bmq.Session(self.soak.address, self.options())
        self.queue = self.session.open_queue(self.uri, write=True)

    def take_latencies(self) -> List[float]:
        """The latencies recorded since the last call."""
        taken, self.latencies = self.latencies, []
        return taken


class _BlockingPoster(_Producer):
    """``post()`` from several threads, one stream each; latency of every call."""

    def __init__(self, soak: "_Soak", uri: str, threads: int, rate: float) -> None:
        super().__init__(soak, "post", uri)
        self.threads = threads
        self.streams = [soak.ledger.add(f"post{i}", "post", False, ("callback",), soak.capacity(rate))
                        for i in range(threads)]
        self._paced = [_Paced(rate, self.stopping) for _ in range(threads)]

    def work(self, index: int) -> None:
        stream = self.streams[index]
        seqs = stream.take(1)
        start = time.perf_counter()
        try:
            self.queue.post(_payload(stream, seqs[0]))
            self.latencies.append(time.perf_counter() - start)  # list.append is atomic
            self.soak.ledger.acked(stream, seqs)
        finally:
            self._paced[index].wait()


class _AsyncPoster(_Producer):
    """``post_async`` with at most ``window`` messages unanswered."""

    threads = 1
    UNIT = 20  # posts per paced unit

    def __init__(self, soak: "_Soak", uri: str, rate: float, window: int) -> None:
        super().__init__(soak, "post_async", uri)
        self.window = window
        self.stream = soak.ledger.add("async", "post_async", True, ("callback-async",), soak.capacity(rate))
        self.streams = [self.stream]
        self._paced = _Paced(rate / self.UNIT, self.stopping)
        self._cond = threading.Condition()
        self._in_flight = 0

    def work(self, index: int) -> None:
        for _ in range(self.UNIT):
            with self._cond:
                if not self._cond.wait_for(lambda: self._in_flight < self.window, WAIT_TIMEOUT):
                    raise TimeoutError(f"post_async window full for {WAIT_TIMEOUT} s")
                self._in_flight += 1
            seq = self.stream.take(1)[0]
            start = time.perf_counter()
            try:
                future = self.queue.post_async(_payload(self.stream, seq))
            except BaseException:
                self._answered()
                raise
            future.add_done_callback(functools.partial(self._done, seq=seq, start=start))
        self._paced.wait()

    def _done(self, future: Any, seq: int, start: float) -> None:
        """On the reader thread: record the answer (no blocking here). Whatever it is, the post
        leaves the window: a future failed with an exception must not hold :meth:`drain`."""
        try:
            ack = future.result()
            if ack.ok:
                self.latencies.append(time.perf_counter() - start)
                self.soak.ledger.acked(self.stream, (seq,))
            else:
                self.soak.error(self.name, bmq.PostError(f"post_async answered {ack.status.name}", [ack]))
        except Exception as exc:  # noqa: BLE001 - recorded and judged at the end
            self.soak.error(self.name, exc)
        finally:
            self._answered()

    def _answered(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_flight == 0, WAIT_TIMEOUT):
                raise TimeoutError(f"{self._in_flight} post_async unanswered after {WAIT_TIMEOUT} s")


class _ManyPoster(_Producer):
    """``post_many`` of ``chunk`` messages per call; optionally with a durable outbox."""

    threads = 1

    def __init__(self, soak: "_Soak", name: str, uri: str, rate: float, chunk: int, readers: Tuple[str, ...],
                 outbox: Optional[Path] = None) -> None:
        super().__init__(soak, name, uri)
        self.chunk = chunk
        self.outbox = outbox
        self.stream = soak.ledger.add(name, name, False, readers, soak.capacity(rate))
        self.streams = [self.stream]
        self._paced = _Paced(rate / chunk, self.stopping)

    def options(self) -> bmq.SessionOptions:
        if self.outbox is None:
            return super().options()
        return dataclasses.replace(super().options(), outbox_dir=str(self.outbox))

    def work(self, index: int) -> None:
        seqs = self.stream.take(self.chunk)
        try:
            self.queue.post_many([_payload(self.stream, seq) for seq in seqs])  # raises unless all SUCCESS
            self.soak.ledger.acked(self.stream, seqs)
        finally:
            self._paced.wait()


class _CallbackConsumer(_Role):
    """``on_message`` on the dispatcher thread: record, then confirm each message."""

    def __init__(self, soak: "_Soak", uris: Dict[str, str]) -> None:
        super().__init__(soak, "callback")
        self.uris = uris  # reader name -> URI

    def connection_lost(self, at: float) -> None:
        """On the dispatcher thread, which ran the callbacks of every message received before
        the loss first: its readers have them."""
        self.soak.ledger.connection_lost(at, readers=tuple(self.uris))

    def open(self) -> None:
        self.session = session = bmq.Session(self.soak.address, self.options())
        for reader, uri in self.uris.items():
            session.open_queue(uri, read=True, on_message=self._handler(reader))

    def _handler(self, reader: str) -> Callable[[bmq.Message], None]:
        ledger = self.soak.ledger

        def on_message(message: bmq.Message) -> None:
            ledger.delivered(reader, (message.data,), time.monotonic())
            message.confirm()

        return on_message


class _BatchConsumer(_Role):
    """``get_batch`` + ``MessageBatch.confirm()``, one thread per queue."""

    def __init__(self, soak: "_Soak", uris: Dict[str, str]) -> None:
        super().__init__(soak, "get_batch")
        self.readers = list(uris)
        self.uris = uris
        self.threads = len(uris)
        self._lost_at: List[Optional[float]] = [None] * self.threads  # per worker: a loss not yet told

    def connection_lost(self, at: float) -> None:
        """Each worker tells the ledger after its next batch: what the session had received
        before the loss waits in the queue's inbox (up to its 1,000 unconfirmed messages) until
        a ``get_batch`` of up to 2,000 begun after the loss takes it."""
        self._lost_at = [at] * self.threads

    def open(self) -> None:
        self.session = session = bmq.Session(self.soak.address, self.options())
        self.queues = [session.open_queue(self.uris[reader], read=True, batches=True) for reader in self.readers]

    def work(self, index: int) -> None:
        lost_at, self._lost_at[index] = self._lost_at[index], None
        batch = self.queues[index].get_batch(max_messages=2000, timeout=0.2)
        if batch is not None:
            payloads, offsets = batch.payloads, batch.offsets
            self.soak.ledger.delivered(self.readers[index],
                                       [payloads[offsets[i]:offsets[i + 1]] for i in range(len(batch))],
                                       time.monotonic())
            batch.confirm()
        if lost_at is not None:
            self.soak.ledger.connection_lost(lost_at, readers=(self.readers[index],))


class _Traffic:
    """The roles of one run: four producers, each pattern on its own queue, and two consumers
    reading them all (see the module's docstring)."""

    def __init__(self, soak: "_Soak", config: SoakConfig, workdir: Path) -> None:
        tag = f"soak{os.getpid()}-{time.monotonic_ns() % 10**9}"
        fanout = f"bmq://bmq.test.persistent.fanout/{tag}-fanout"
        self.blocking = _BlockingPoster(soak, f"bmq://bmq.test.persistent.priority/{tag}-post",
                                        config.blocking_threads, config.blocking_rate)
        self.posting_async = _AsyncPoster(soak, f"bmq://bmq.test.mem.priority/{tag}-async", config.async_rate,
                                          config.async_window)
        many = _ManyPoster(soak, "post_many", f"bmq://bmq.test.persistent.priority/{tag}-many", config.many_rate,
                           config.many_chunk, ("get_batch",), outbox=workdir / "outbox")
        fan = _ManyPoster(soak, "fanout", fanout, config.fanout_rate, config.fanout_chunk, ("foo", "bar"))
        callback = _CallbackConsumer(soak, {"callback": self.blocking.uri, "callback-async": self.posting_async.uri,
                                            "foo": f"{fanout}?id=foo"})
        batch = _BatchConsumer(soak, {"get_batch": many.uri, "bar": f"{fanout}?id=bar"})
        self.consumers: List[_Role] = [callback, batch]
        self.producers: List[_Role] = [self.blocking, self.posting_async, many, fan]
        self.roles = self.consumers + self.producers


# ---- process resources -----------------------------------------------------------------------


def rss_mb() -> float:
    """This process's resident set size in MB (Linux /proc)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def thread_count() -> int:
    """OS threads of this process (Python's and any other)."""
    return len(os.listdir("/proc/self/task"))


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


def _load_mallinfo2() -> Optional[Callable[[], _Mallinfo2]]:
    name = ctypes.util.find_library("c")
    mallinfo2 = getattr(ctypes.CDLL(name), "mallinfo2", None) if name else None  # glibc >= 2.33
    if mallinfo2 is not None:
        mallinfo2.restype = _Mallinfo2
    return mallinfo2


_MALLINFO2 = _load_mallinfo2()


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: give every arena's free pages back to the system; False
    without glibc."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is None:
        return False
    trim(0)
    return True


def mallinfo() -> Dict[str, int]:
    """glibc's mallinfo2() fields (empty without glibc)."""
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {field[0]: getattr(info, field[0]) for field in _Mallinfo2._fields_}


def _proc_kb(path: str, keys: Tuple[str, ...]) -> Dict[str, int]:
    """The ``key: N kB`` lines of ``path`` (a /proc file) named in ``keys``."""
    out: Dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


class Diagnostics:
    """What grows, for finding a leak (opt-in, ``SoakConfig.diag_path``): one JSON line per
    :meth:`record` with RSS split by kind (``/proc/self/smaps_rollup``), the number of memory
    mappings, glibc's mallinfo2, Python's allocated blocks, the gc-tracked objects per type
    that changed since the previous record and since the first, and (with
    ``tracemalloc_frames``) the allocation sites that grew most since the first record.
    glibc's per-arena ``malloc_info`` XML is appended to ``<diag_path>.malloc_info.xml``.

    Costs a walk of the gc-tracked objects per record (tens of ms), so records are minutes
    apart; tracemalloc costs more and is off unless asked for.
    """

    TOP = 25

    def __init__(self, path: Path, frames: int) -> None:
        self.path = path
        self.frames = frames
        self._first_types: Optional[collections.Counter] = None
        self._previous_types: Optional[collections.Counter] = None
        self._first_trace: Optional[tracemalloc.Snapshot] = None
        if frames:
            tracemalloc.start(frames)
        libc_name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(libc_name) if libc_name else None
        self._libc = libc if libc is not None and hasattr(libc, "malloc_info") else None
        if self._libc is not None:
            self._libc.fopen.restype = ctypes.c_void_p
            self._libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
            self._libc.fclose.argtypes = (ctypes.c_void_p,)
            self._libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)

    def record(self, t: float, faults: Sequence[Dict[str, Any]]) -> None:
        """Append one record, at ``t`` seconds into the run, after ``faults`` so far."""
        started = time.perf_counter()
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        entry: Dict[str, Any] = {
            "t": round(t, 1), "faults": len(faults), "rss_mb": round(rss_mb(), 2),
            "smaps_kb": _proc_kb("/proc/self/smaps_rollup", ("Rss", "Anonymous", "Private_Dirty", "Shared_Clean",
                                                               "Private_Clean")),
            "mappings": _count_lines("/proc/self/maps"), "threads": thread_count(), "mallinfo": mallinfo(),
            "python_blocks": sys.getallocatedblocks(), "gc_objects": sum(types.values()),
            "types_since_previous": _top_changes(types, self._previous_types, self.TOP),
            "types_since_first": _top_changes(types, self._first_types, self.TOP),
        }
        self._previous_types = types
        if self._first_types is None:
            self._first_types = types
        if self.frames:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                (tracemalloc.Filter(False, tracemalloc.__file__),))
            entry["tracemalloc_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
            if self._first_trace is None:
                self._first_trace = snapshot
            else:
                entry["tracemalloc_since_first"] = [
                    {"kb": round(d.size_diff / 1024, 1), "count": d.count_diff,
                     "where": [f"{f.filename}:{f.lineno}" for f in d.traceback]}
                    for d in snapshot.compare_to(self._first_trace, "traceback")[:self.TOP]]
        entry["cost_s"] = round(time.perf_counter() - started, 3)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        if self._libc is not None:
            fp = self._libc.fopen(f"{self.path}.malloc_info.xml".encode(), b"a")
            if fp:
                self._libc.malloc_info(0, fp)
                self._libc.fclose(fp)

    def close(self) -> None:
        """Stop tracing (when this started it)."""
        if self.frames and tracemalloc.is_tracing():
            tracemalloc.stop()


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _top_changes(now: collections.Counter, before: Optional[collections.Counter], top: int) -> Dict[str, int]:
    """The ``top`` largest changes in count per key from ``before`` to ``now``."""
    if before is None:
        return {}
    diff = collections.Counter(now)
    diff.subtract(before)
    return dict(sorted(((k, v) for k, v in diff.items() if v), key=lambda kv: -abs(kv[1]))[:top])


def malloc_mb() -> Tuple[Optional[float], Optional[float]]:
    """glibc malloc's (in use, free but kept) MB over all arenas, mmapped chunks counted in use;
    (None, None) without glibc. RSS growing with these flat is fragmentation or mappings, not
    live allocations."""
    if _MALLINFO2 is None:
        return None, None
    info = _MALLINFO2()
    return round((info.uordblks + info.hblkhd) / 2**20, 2), round(info.fordblks / 2**20, 2)


def _percentile_ms(samples: List[float], q: float) -> Optional[float]:
    if not samples:
        return None
    samples = sorted(samples)
    return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000.0, 3)


# ---- the run -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Check:
    """One end-of-run check: its name, whether it passed, and the numbers behind it."""

    name: str
    ok: bool
    detail: str


@dataclasses.dataclass
class SoakResult:
    """Everything a soak run produced (``as_dict`` for JSON)."""

    broker: str
    seconds: float
    samples: List[Dict[str, Any]]
    faults: List[Dict[str, Any]]
    totals: Dict[str, Any]
    checks: List[Check]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(check.ok for check in self.checks)

    def as_dict(self) -> Dict[str, Any]:
        """The result as plain data (for ``json.dump``)."""
        return dataclasses.asdict(self)

    def report(self) -> str:
        """The checks, one line each, then PASS or FAIL."""
        lines = [f"[{'ok' if c.ok else 'FAILED'}] {c.name}: {c.detail}" for c in self.checks]
        return "\n".join(lines + ["PASS" if self.ok else "FAIL"])


class _Soak:
    """State shared by the roles of one run (see :func:`run_soak`)."""

    def __init__(self, config: SoakConfig, address: str) -> None:
        self.config = config
        self.address = address
        self.ledger = Ledger(config.grace)
        self.stopping = threading.Event()
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.errors: List[Tuple[float, str, str]] = []  # (time, where, what)
        self.event_counts: Dict[str, int] = {}
        self.faults: List[Dict[str, Any]] = []  # appended by the fault injector as they happen

    def capacity(self, rate: float) -> int:
        """Messages a stream posting at ``rate`` per second sends in the whole run (with room
        to spare): its bitmaps' size."""
        return int(rate * self.config.seconds * 1.25) + 8192

    def error(self, where: str, exc: BaseException) -> None:
        """Record ``exc``, raised in ``where``, with its time (judged against the faults)."""
        with self._lock:
            self.errors.append((time.monotonic(), where, f"{type(exc).__name__}: {exc}"))

    def on_event(self, event: events.SessionEvent) -> None:
        """Every session's ``on_event``: count the events; the failures are errors."""
        name = type(event).__name__
        with self._lock:
            self.event_counts[name] = self.event_counts.get(name, 0) + 1
            if isinstance(event, _ERROR_EVENTS):
                self.errors.append((time.monotonic(), "session event", repr(event)))


class _Sampler:
    """A sample of throughput, latency and the process's resources every ``interval`` seconds
    on its own thread until ``soak.stopping`` is set; :meth:`sample` takes one more."""

    def __init__(self, soak: _Soak, traffic: _Traffic) -> None:
        self.soak = soak
        self.traffic = traffic
        self.samples: List[Dict[str, Any]] = []
        self._previous_t = 0.0
        self._previous_counts = soak.ledger.counts()
        self._samples_bytes = sys.getsizeof(self.samples)  # the samples are the soak's own memory too
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)
        config = soak.config
        self._diagnostics = Diagnostics(config.diag_path, config.tracemalloc_frames) if config.diag_path else None
        self._next_diag = 0.0

    def start(self) -> None:
        """Start sampling every ``config.interval`` seconds."""
        self._thread.start()

    def join(self) -> None:
        """Wait for the sampling thread to end (after ``soak.stopping`` is set)."""
        if self._thread.is_alive():
            self._thread.join(WAIT_TIMEOUT)
            if self._thread.is_alive():
                self.soak.error("sampler", TimeoutError(f"still sampling after {WAIT_TIMEOUT} s"))
        if self._diagnostics is not None:
            self._diagnostics.close()

    def _loop(self) -> None:
        while not self.soak.stopping.wait(self.soak.config.interval):  # the cadence: time passing is the point
            try:
                self.sample()
                self._diagnose()
            except Exception as exc:  # noqa: BLE001 - a sampling failure is an error to report
                self.soak.error("sampler", exc)

    def _diagnose(self) -> None:
        """A diagnostics record when one is due (never before the warm-up ends)."""
        now = time.monotonic() - self.soak.t0
        if self._diagnostics is None or now < max(self._next_diag, self.soak.config.warmup):
            return
        self._diagnostics.record(now, self.soak.faults)
        self._next_diag = now + self.soak.config.diag_every

    def sample(self) -> None:
        """Append one sample: rates since the previous one and the state now."""
        soak, traffic = self.soak, self.traffic
        now = time.monotonic() - soak.t0
        counts = soak.ledger.counts()
        elapsed = max(1e-6, now - self._previous_t)
        # role.session is read once: a reopen on the main thread may set it to None meanwhile.
        stats = [session.stats() for session in (role.session for role in traffic.roles) if session is not None]
        post_lat = traffic.blocking.take_latencies()
        async_lat = traffic.posting_async.take_latencies()
        in_use, free = malloc_mb()
        sample = {
            "t": round(now, 2),
            "rate": {k: round((v - self._previous_counts.get(k, 0)) / elapsed, 1) for k, v in counts.items()},
            "total": counts,
            "post_p50_ms": _percentile_ms(post_lat, 0.50), "post_p99_ms": _percentile_ms(post_lat, 0.99),
            "async_p50_ms": _percentile_ms(async_lat, 0.50), "async_p99_ms": _percentile_ms(async_lat, 0.99),
            "rss_mb": round(rss_mb(), 2), "threads": thread_count(), "fds": fd_count(),
            "malloc_in_use_mb": in_use, "malloc_free_mb": free, "python_blocks": sys.getallocatedblocks(),
            "ledger_mb": round(soak.ledger.nbytes() / 2**20, 2),
            "writer_queue_bytes": sum(s.writer_queue_bytes for s in stats),
            "outbox_messages": sum(s.outbox_messages for s in stats),
            "in_flight": sum(q.in_flight for s in stats for q in s.queues.values()),
            "reconnects": sum(s.reconnects for s in stats),
        }
        self._samples_bytes += _deep_size(sample) - sys.getsizeof(self.samples)
        self.samples.append(sample)
        self._samples_bytes += sys.getsizeof(self.samples)
        sample["samples_mb"] = round(self._samples_bytes / 2**20, 3)
        self._previous_t, self._previous_counts = now, counts


def _deep_size(value: Any) -> int:
    """Bytes of ``value`` with what it holds (dicts, lists, tuples of scalars and strings);
    dict keys, one string shared by every sample, are not counted."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(map(_deep_size, value.values()))
    elif isinstance(value, (list, tuple)):
        size += sum(map(_deep_size, value))
    return size


def _fault_kinds(real: bool) -> List[str]:
    """The faults, in the order they come round: bmqbrkr's, or the embedded broker's."""
    if real:
        return ["cut", "stall", "crash", "reopen"]
    return ["cut", "stall", "restart", "reopen", "drop", "withhold"]


def run_soak(config: SoakConfig) -> SoakResult:
    """Run the soak of ``config`` and return its samples, faults and checks.

    Raises:
        RuntimeError: a broker or the broker-side process did not start or answer.
        TimeoutError: a pause for a fault (draining, workers leaving) took over WAIT_TIMEOUT.
    """
    with tempfile.TemporaryDirectory(prefix="bmq-soak-") as scratch:
        workdir = Path(config.workdir or scratch)
        real = None
        if config.bmqbrkr_home is not None:
            from realbroker import RealBroker

            real = RealBroker(config.bmqbrkr_home, workdir / "bmqbrkr").start()
        try:
            host = FaultHost(real.address if real else None)
            try:
                return _run(config, host, real, workdir)
            finally:
                host.close()
        finally:
            if real is not None:
                real.stop()


def _run(config: SoakConfig, host: FaultHost, real: Any, workdir: Path) -> SoakResult:
    """Traffic through the faults for ``config.seconds``, then the final drain and the checks.
    Every session and thread of the run is stopped before it returns or raises."""
    baseline = {"threads": thread_count(), "fds": fd_count(), "rss_mb": rss_mb()}
    soak = _Soak(config, host.address)
    traffic = _Traffic(soak, config, workdir)
    sampler = _Sampler(soak, traffic)
    try:
        for role in traffic.roles:
            role.start()
        config.log(f"soak: {config.seconds:.0f} s against {'bmqbrkr' if real else 'the embedded broker'} "
                   f"via {host.address}")
        sampler.start()
        faults = _inject_faults(config, host, real, soak, traffic.roles)
        # Stop posting, let every post be answered, then wait for every acked message to arrive.
        for role in traffic.producers:
            role.finish()
        producing_until = time.monotonic() - soak.t0
        drain_start = time.monotonic()
        with soak.ledger.changed:
            delivered = soak.ledger.changed.wait_for(soak.ledger.all_delivered, WAIT_TIMEOUT)
        drain_seconds = time.monotonic() - drain_start
        soak.stopping.set()
        sampler.join()
        sampler.sample()  # the last, with every session still open
    finally:
        _stop_traffic(soak, traffic, sampler)
    end_threads, end_fds = _settle(baseline)
    return _judge(config, soak, sampler.samples, faults, baseline, {"threads": end_threads, "fds": end_fds},
                  delivered, drain_seconds, producing_until, real is not None)


def _inject_faults(config: SoakConfig, host: FaultHost, real: Any, soak: _Soak, roles: List[_Role]
                   ) -> List[Dict[str, Any]]:
    """Inject the faults in turn, from ``config.first_fault`` every ``config.fault_every``
    seconds, until ``config.seconds``; return each one's kind, start, end and detail."""
    faults = soak.faults
    kinds = _fault_kinds(real is not None)
    next_fault = config.first_fault
    while True:
        now = time.monotonic() - soak.t0
        if now >= config.seconds:
            return faults
        if now < next_fault:
            soak.stopping.wait(min(next_fault, config.seconds) - now)  # the run's length: time passing is the point
            continue
        kind = kinds[len(faults) % len(kinds)]
        start = time.monotonic()
        soak.ledger.fault_began(kind)
        try:
            detail = _inject(kind, host, real, soak, roles, config)
        finally:
            soak.ledger.fault_ended()
        faults.append({"kind": kind, "start": round(start - soak.t0, 2), "end": round(time.monotonic() - soak.t0, 2),
                       "detail": detail})
        config.log(f"  t={start - soak.t0:6.1f}s fault {kind}: {detail}")
        if config.malloc_trim:
            malloc_trim()
        next_fault += config.fault_every


def _stop_traffic(soak: _Soak, traffic: _Traffic, sampler: _Sampler) -> None:
    """Stop the sampler, every role's workers and every session, whatever state the run is in
    (idempotent); a failure is recorded and the rest still stopped."""
    soak.stopping.set()
    sampler.join()
    for role in traffic.consumers + traffic.producers:
        try:
            role.finish()
        except Exception as exc:  # noqa: BLE001 - recorded; the other roles must still stop
            soak.error(f"{role.name} finish", exc)
    for role in traffic.roles:
        try:
            role.close_session()
        except Exception as exc:  # noqa: BLE001 - recorded; the other sessions must still stop
            soak.error(f"{role.name} stop", exc)


def _inject(kind: str, host: FaultHost, real: Any, soak: _Soak, roles: List[_Role], config: SoakConfig) -> str:
    """Do fault ``kind`` now; return what it did."""
    if kind == "cut":
        return f"proxy cut {host.do('cut')} connections"
    if kind == "stall":
        host.do("stall")
        soak.stopping.wait(config.stall_seconds)  # the fault is a stretch of silence
        host.do("resume")
        return f"proxy stalled {config.stall_seconds:g} s"
    if kind == "crash":
        real.kill()
        soak.ledger.snapshot_received()
        real.start()
        soak.ledger.note_crash()
        serving = _until_serving(real.address, soak)
        return (f"bmqbrkr SIGKILLed and restarted on its storage (pid {real.pid}), serving a new session "
                f"after {serving:.1f} s")
    if kind == "restart":
        host.do("restart")
        return "embedded broker restart() (every client dropped, queues kept)"
    if kind == "drop":
        return f"embedded broker faults.drop_connections(): {host.do('drop')}"
    if kind == "withhold":
        host.do("withhold")
        soak.stopping.wait(config.stall_seconds)  # ACKs held back for this long
        return f"embedded broker withheld ACKs {config.stall_seconds:g} s, released {host.do('release')} events"
    if kind == "reopen":
        for role in roles:
            role.reopen()
        return f"{len(roles)} sessions closed and reopened"
    raise ValueError(kind)


def _until_serving(address: str, soak: _Soak) -> float:
    """Seconds until a new session straight to ``address`` (not through the proxy) has a post
    to a persistent queue acknowledged and its message back. A restarted bmqbrkr listens (which
    is all ``RealBroker.start`` waits for) before it has recovered its storage, and a client
    waits meanwhile: that is the crash's time, not the clients'; a client still stalled after it
    is judged.

    Raises:
        bmq.Error: still not served after WAIT_TIMEOUT (each refusal recorded as an error).
    """
    start = time.monotonic()
    uri = f"bmq://bmq.test.persistent.priority/soak-probe-{os.getpid()}"
    while True:
        try:
            with bmq.Session(address, bmq.SessionOptions(connect_timeout=WAIT_TIMEOUT)) as session:
                queue = session.open_queue(uri, read=True, write=True, timeout=WAIT_TIMEOUT)
                queue.post(b"probe")
                message = queue.get(timeout=WAIT_TIMEOUT)
                if message is None:
                    raise bmq.TimeoutError(f"the probe's message did not come back within {WAIT_TIMEOUT} s")
                message.confirm()
            return time.monotonic() - start
        except bmq.Error as exc:
            soak.error("crash probe", exc)
            if time.monotonic() - start > WAIT_TIMEOUT:
                raise
        soak.stopping.wait(0.5)  # before asking the restarted broker again


def _settle(baseline: Dict[str, float]) -> Tuple[int, int]:
    """Threads and fds once they are back to ``baseline`` (or after WAIT_TIMEOUT): exiting
    threads and closing sockets finish a moment after ``stop()`` returns."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while True:
        threads, fds = thread_count(), fd_count()
        if (threads <= baseline["threads"] and fds <= baseline["fds"]) or time.monotonic() > deadline:
            return threads, fds
        time.sleep(0.05)  # polling /proc: the OS signals nothing to wait on


def _fault_overlapping(faults: List[Dict[str, Any]], start: float, end: float, grace: float) -> Optional[str]:
    """The kind of the latest fault whose window (from its start to ``grace`` seconds after its
    end) overlaps [``start``, ``end``] (seconds into the run), or None."""
    for fault in reversed(faults):
        if fault["start"] <= end and start <= fault["end"] + grace:
            return fault["kind"]
    return None


def _account(ledger: Ledger) -> Tuple[Dict[str, Dict[str, Any]], int, int]:
    """Per stream: posted, acked, and per reader delivered, missing (unexplained) and lost with
    a crashed broker's memory; with the totals of missing and of lost."""
    per_stream: Dict[str, Dict[str, Any]] = {}
    missing_total = lost_total = 0
    for stream in ledger.streams.values():
        acked = stream.acked.as_int()
        entry: Dict[str, Any] = {"pattern": stream.pattern, "posted": stream.posted, "acked": stream.acked.count,
                                 "domain": "in-memory" if stream.in_memory else "persistent"}
        for reader, bits in stream.received.items():
            missing = acked & ~bits.as_int()
            lost = _popcount(missing & stream.lost_to_crash[reader].as_int())
            unexplained = _popcount(missing) - lost
            entry[reader] = {"delivered": bits.count, "missing": unexplained, "lost_with_crashed_memory": lost}
            missing_total += unexplained
            lost_total += lost
        per_stream[stream.name] = entry
    return per_stream, missing_total, lost_total


def _judge(config: SoakConfig, soak: _Soak, samples: List[Dict[str, Any]], faults: List[Dict[str, Any]],
           baseline: Dict[str, float], end: Dict[str, int], delivered: bool, drain_seconds: float,
           producing_until: float, real: bool) -> SoakResult:
    """The end-of-run checks."""
    t0, ledger = soak.t0, soak.ledger

    def cause(t: float) -> str:
        return _fault_overlapping(faults, t - t0, t - t0, config.grace) or "unexplained"

    per_stream, missing_total, lost_total = _account(ledger)
    duplicates = ledger.duplicates.records(t0, ledger.streams)
    duplicates_check, dup_by_cause = judge_duplicates(duplicates, len(ledger.duplicates))
    errors_by_fault = dict(collections.Counter(cause(t) for t, *_ in soak.errors))
    unexplained_errors = [f"t={t - t0:.1f}s {where}: {what}" for t, where, what in soak.errors
                          if cause(t) == "unexplained"]
    warm = next((s for s in samples if s["t"] >= config.warmup), samples[0] if samples else None)
    last = samples[-1] if samples else None
    rss_growth = (last["rss_mb"] - warm["rss_mb"]) if warm and last else 0.0
    ledger_growth = (last["ledger_mb"] - warm["ledger_mb"]) if warm and last else 0.0
    samples_growth = (last.get("samples_mb", 0) - warm.get("samples_mb", 0)) if warm and last else 0.0
    rss_max_after = max((s["rss_mb"] for s in samples if warm and s["t"] >= warm["t"]), default=0.0)
    # The slope over the second half of the run (its last hour at most): what still grows
    # once start-up and the allocator's filling are behind.
    late = slopes(samples, min(3600.0, (samples[-1]["t"] if samples else 0.0) / 2))
    patterns = sorted({stream.pattern for stream in ledger.streams.values()})
    checks = [
        Check("every acknowledged message delivered", delivered and missing_total == 0,
              f"missing {missing_total} of {sum(s.acked.count for s in ledger.streams.values())} acked"
              + (f"; {lost_total} in-memory messages acked before a bmqbrkr SIGKILL and lost with its memory"
                 if lost_total else "") + f"; final drain {drain_seconds:.1f} s"),
        duplicates_check,
        Check(f"RSS growth after {warm['t'] if warm else 0:.0f} s <= {RSS_GROWTH_LIMIT_MB:g} MB",
              rss_growth <= RSS_GROWTH_LIMIT_MB,
              f"{warm['rss_mb'] if warm else 0:.1f} MB -> {last['rss_mb'] if last else 0:.1f} MB "
              f"(+{rss_growth:.1f}, max {rss_max_after:.1f}; of it the soak's own ledger +{ledger_growth:.1f} "
              f"and samples +{samples_growth:.1f}); over the last {late.get('minutes', 0):g} min "
              f"{late.get('rss_mb', 0):+.3f} MB/min, {late.get('beyond_own', 0):+.3f} beyond the soak's own"),
        Check("threads back to baseline", end["threads"] <= baseline["threads"],
              f"baseline {baseline['threads']}, after closing {end['threads']}"),
        Check("file descriptors back to baseline", end["fds"] <= baseline["fds"],
              f"baseline {baseline['fds']}, after closing {end['fds']}"),
        Check("no error but those the faults explain", not unexplained_errors,
              f"{len(soak.errors)} errors: {errors_by_fault or 'none'}"
              + (f"; unexplained: {unexplained_errors[:5]}" if unexplained_errors else "")),
        judge_stalls(samples, faults, patterns, config.grace, producing_until),
        Check("faults injected", bool(faults),
              ", ".join(f"{k} x{sum(f['kind'] == k for f in faults)}" for k in _fault_kinds(real)
                        if any(f["kind"] == k for f in faults))),
    ]
    totals = {"streams": per_stream, "duplicates": len(ledger.duplicates), "duplicates_by_fault": dup_by_cause,
              "duplicate_records": duplicates, "grace": config.grace, "producing_until": round(producing_until, 2),
              "errors": [(round(t - t0, 2), w, e) for t, w, e in soak.errors[:200]], "errors_by_fault": errors_by_fault,
              "events": soak.event_counts, "baseline": baseline, "end": end, "drain_seconds": round(drain_seconds, 2),
              "rss_warm_mb": warm["rss_mb"] if warm else None, "rss_end_mb": last["rss_mb"] if last else None,
              "late_slopes_mb_per_min": late}
    return SoakResult("bmqbrkr" if real else "embedded", config.seconds, samples, faults, totals, checks)


def slopes(samples: List[Dict[str, Any]], window: float) -> Dict[str, float]:
    """MB per minute (least squares) of RSS, glibc's in-use and free-but-kept bytes, and the
    soak's own ledger and samples, over the samples of the last ``window`` seconds; ``beyond_own``
    is the RSS slope less the ledger's and the samples'."""
    if not samples:
        return {}
    chosen = [s for s in samples if s["t"] >= samples[-1]["t"] - window]
    out: Dict[str, float] = {}
    for key in ("rss_mb", "malloc_in_use_mb", "malloc_free_mb", "ledger_mb", "samples_mb"):
        points = [(s["t"] / 60.0, s[key]) for s in chosen if s.get(key) is not None]
        if len(points) < 2:
            continue
        mean_t = sum(t for t, _ in points) / len(points)
        mean_v = sum(v for _, v in points) / len(points)
        spread = sum((t - mean_t) ** 2 for t, _ in points)
        out[key] = round(sum((t - mean_t) * (v - mean_v) for t, v in points) / spread, 4) if spread else 0.0
    out["beyond_own"] = round(out.get("rss_mb", 0.0) - out.get("ledger_mb", 0.0) - out.get("samples_mb", 0.0), 4)
    out["minutes"] = round((chosen[-1]["t"] - chosen[0]["t"]) / 60.0, 1)
    return out


def judge_duplicates(records: List[Dict[str, Any]], count: int) -> Tuple[Check, Dict[str, int]]:
    """The duplicates check, from :meth:`Duplicates.records` (``count``: every duplicate, kept
    or not), with the number per cause.

    BlazingMQ delivers at least once: a message comes again only if its consumer's connection
    or session went away, or the broker restarted, before the broker had its confirmation; or
    if the client sent its PUT again after a reconnect. So a duplicate is explained when a
    fault or a connection loss came between its two deliveries (``between``: its kind), or
    while its PUT was outstanding (``resent``), whenever the redelivery comes; one with neither
    is a real finding. Duplicates past the ones kept are not judged and fail the check.
    """
    causes = collections.Counter(record["between"] or (RESENT if record["resent"] else "unexplained")
                                 for record in records)
    if count > len(records):
        causes["not judged (past the ones kept)"] = count - len(records)
    unexplained = [f"{r['stream']}:{r['seq']} to {r['reader']} at {r['t']:.1f}s" for r in records
                   if not r["between"] and not r["resent"]]
    detail = (f"{count} duplicates: {dict(causes) or 'none'}"
              + (f"; with no fault or connection loss between their deliveries or during their PUT: "
                 f"{unexplained[:5]}" if unexplained else ""))
    return Check("duplicates explained by faults", count == len(records) and not unexplained, detail), dict(causes)


def judge_stalls(samples: List[Dict[str, Any]], faults: List[Dict[str, Any]], patterns: Sequence[str],
                 grace: float, producing_until: float) -> Check:
    """The stalls check, over the sample intervals touching no fault window (up to
    ``producing_until``). Each pattern has its own session and threads: one that acknowledged
    nothing while another moved stalled on its own. An interval in which every pattern stood
    still is the machine's doing only if the soak's own sampler came late too (over 1.5 times
    the usual interval: the whole process was held up); with the sampler on time, everything
    stopped while the client's process ran: the broker or bmq as a whole. That fails too,
    naming the latest fault before each such interval (the evidence to look at)."""
    gaps = sorted(after["t"] - before["t"] for before, after in zip(samples, samples[1:]))
    usual = gaps[len(gaps) // 2] if gaps else 0.0
    own: List[str] = []
    together: List[str] = []
    held_up: List[str] = []
    chosen = [sample for sample in samples if sample["t"] <= producing_until]
    for before, after in zip(chosen, chosen[1:]):
        if _fault_overlapping(faults, before["t"], after["t"], grace) is not None:
            continue
        span = f"{before['t']:.0f}-{after['t']:.0f}s"
        still = [p for p in patterns if after["total"].get(p, 0) == before["total"].get(p, 0)]
        if len(patterns) < 2 or len(still) < len(patterns):
            own.extend(f"{pattern} {span}" for pattern in still)
        elif after["t"] - before["t"] > 1.5 * usual:
            held_up.append(span)
        else:
            latest = next((fault for fault in reversed(faults) if fault["start"] <= before["t"]), None)
            since = f" ({before['t'] - latest['end']:.0f} s after a {latest['kind']})" if latest else ""
            together.append(span + since)
    parts = [f"stalled while the others moved: {own[:5]}"] if own else []
    if together:
        parts.append(f"every pattern at once while the soak's sampler ran on time (the broker or bmq as a whole, "
                     f"not the machine) in {len(together)} intervals: {together[:5]}")
    if held_up:
        parts.append(f"every pattern at once with the soak's process held up too (the machine, not judged) in "
                     f"{len(held_up)} intervals: {held_up[:5]}")
    return Check("no stall outside a fault window but the machine's", not own and not together,
                 "; ".join(parts) or "yes")
