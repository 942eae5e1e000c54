"""The soak engine: hours (or, in the test suite, seconds) of mixed traffic through faults,
with the client's resources sampled over time and every message accounted for.

One implementation for both users: ``benchmarks/soak.py`` (minutes, JSON and a picture) and
``tests/fault/test_soak.py`` (about 35 s per broker in the default run). :func:`run_soak`
drives, against one broker (a real ``bmqbrkr`` or the embedded broker, each in its own
process so this process holds only the client):

* patterns, each with its own session, all through a TCP proxy (``tests/proxy.py``): blocking
  ``post()`` from 4 threads (persistent domain), ``post_async`` with a window (in-memory
  domain), ``post_many`` with a durable outbox (persistent), ``post_many`` to a fan-out queue
  (persistent) read by two app ids; an ``on_message`` consumer and a ``get_batch`` consumer;
* faults in turn: the proxy cuts every connection; the proxy stalls them for a few seconds;
  the broker crashes (bmqbrkr: SIGKILL and restart on its storage; embedded: ``restart()``,
  then its ``Faults``: dropped connections, withheld ACKs); every session is closed and
  reopened;
* every ``interval`` seconds a sample: throughput per pattern, blocking-post and
  ``post_async`` latency p50/p99, RSS, threads, open fds, writer-queue bytes, outbox
  messages, messages in flight.

Every message carries ``stream:seq`` in its payload; one bit per message records that it was
acknowledged and, per reader, delivered (a few MB for hours: the ledger must not be what
grows). :class:`SoakResult` holds the samples, the faults, and the checks made at the end.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import bmq
from bmq import events

#: Reconnect quickly: a soak wants to measure recovery, not back-off.
RECONNECT = bmq.ReconnectPolicy(initial_delay=0.02, max_delay=0.5, jitter=0.2)
#: Bound on any wait for a condition (drains, reopen hand-overs, the final deliveries).
WAIT_TIMEOUT = 60.0
#: Payload size of every message (its ``stream:seq:`` prefix padded with dots).
PAYLOAD_SIZE = 100
#: Allowed RSS growth (MB) between the end of the warm-up and the end of the run.
RSS_GROWTH_LIMIT_MB = 20.0

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
    #: After a fault ends, duplicates and errors within this many seconds are its doing.
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


# ---- the ledger ---------------------------------------------------------------------------


class _Bits:
    """A growable bitmap of message sequence numbers."""

    __slots__ = ("data", "count")

    def __init__(self) -> None:
        self.data = bytearray(4096)
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

    def as_int(self) -> int:
        return int.from_bytes(self.data, "little")


def _popcount(value: int) -> int:
    return bin(value).count("1")


@dataclasses.dataclass
class _Stream:
    """The messages of one producer thread: posted/acked, and delivered per reader."""

    name: str
    pattern: str
    in_memory: bool
    readers: Tuple[str, ...]
    acked: _Bits = dataclasses.field(default_factory=_Bits)
    received: Dict[str, _Bits] = dataclasses.field(default_factory=dict)
    posted: int = 0
    lost_to_crash: Dict[str, int] = dataclasses.field(default_factory=dict)  # reader -> candidates (bits)

    def __post_init__(self) -> None:
        self.received = {reader: _Bits() for reader in self.readers}
        self.lost_to_crash = {reader: 0 for reader in self.readers}


class Ledger:
    """What was acknowledged and what was delivered, per stream and reader; duplicates with
    their time. Thread-safe; :attr:`changed` is notified on every delivery."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.streams: Dict[str, _Stream] = {}
        self.duplicates: List[Tuple[float, str, str, int]] = []  # (time, stream, reader, seq)

    def add(self, name: str, pattern: str, in_memory: bool, readers: Tuple[str, ...]) -> _Stream:
        stream = self.streams[name] = _Stream(name, pattern, in_memory, readers)
        return stream

    def acked(self, stream: _Stream, seqs: Sequence[int]) -> None:
        with self._lock:
            for seq in seqs:
                stream.acked.set(seq)

    def delivered(self, reader: str, payloads: Sequence[bytes], now: float) -> None:
        with self._lock:
            for payload in payloads:
                name, seq_text, _ = bytes(payload).split(b":", 2)
                seq = int(seq_text)
                stream = self.streams[name.decode()]
                if not stream.received[reader].set(seq):
                    self.duplicates.append((now, stream.name, reader, seq))
            self.changed.notify_all()

    def counts(self) -> Dict[str, int]:
        """Acked messages per pattern and delivered messages per reader (for throughput)."""
        out: Dict[str, int] = {}
        with self._lock:
            for stream in self.streams.values():
                out[stream.pattern] = out.get(stream.pattern, 0) + stream.acked.count
                for reader, bits in stream.received.items():
                    out[f"deliver:{reader}"] = out.get(f"deliver:{reader}", 0) + bits.count
        return out

    def note_crash(self, received_before: Dict[Tuple[str, str], bytes]) -> None:
        """A broker crash lost its in-memory queues: the in-memory messages acked by now and not
        delivered before the crash (``received_before``, taken when it died) are its doing."""
        with self._lock:
            for stream in self.streams.values():
                if not stream.in_memory:
                    continue
                acked = stream.acked.as_int()
                for reader in stream.readers:
                    before = int.from_bytes(received_before[(stream.name, reader)], "little")
                    stream.lost_to_crash[reader] |= acked & ~before

    def nbytes(self) -> int:
        """Memory the ledger holds (its bitmaps, crash bookkeeping and duplicates): the soak's own,
        sampled so that it is not mistaken for the client's."""
        with self._lock:
            total = sys.getsizeof(self.duplicates) + sum(map(sys.getsizeof, self.duplicates))
            for stream in self.streams.values():
                total += sys.getsizeof(stream.acked.data) + sum(sys.getsizeof(b.data) for b in stream.received.values())
                total += sum(map(sys.getsizeof, stream.lost_to_crash.values()))
            return total

    def snapshot_received(self) -> Dict[Tuple[str, str], bytes]:
        with self._lock:
            return {(s.name, r): bytes(bits.data) for s in self.streams.values() for r, bits in s.received.items()}

    def all_delivered(self) -> bool:
        """Every acked message delivered to each of its readers (or lost with a crashed broker's
        memory). Call with :attr:`changed` held."""
        for stream in self.streams.values():
            acked = stream.acked.as_int()
            for reader, bits in stream.received.items():
                if acked & ~bits.as_int() & ~stream.lost_to_crash[reader]:
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
        """Wait until open; False once finished (the worker should exit)."""
        with self._cond:
            while self._closed and not self._finished:
                self._cond.wait()
            if self._finished:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    def close(self, finish: bool = False) -> None:
        with self._cond:
            self._closed = True
            self._finished = self._finished or finish
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._inside == 0, WAIT_TIMEOUT):
                raise TimeoutError(f"workers still busy after {WAIT_TIMEOUT} s")

    def open(self) -> None:
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
        return bmq.SessionOptions(reconnect=RECONNECT, on_event=self.soak.on_event)

    def open(self) -> None:
        """Open ``self.session`` and its queues."""
        raise NotImplementedError

    def work(self, index: int) -> None:
        """One unit of work of worker ``index`` (called with the gate entered)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Wait for what is in flight before the session closes."""

    def start(self) -> None:
        self.open()
        self._workers = [threading.Thread(target=self._loop, args=(i,), name=f"soak-{self.name}-{i}", daemon=True)
                         for i in range(self.threads)]
        for worker in self._workers:
            worker.start()

    def _loop(self, index: int) -> None:
        while self._gate.enter():
            try:
                self.work(index)
            except Exception as exc:  # noqa: BLE001 - every error is recorded and judged at the end
                self.soak.error(f"{self.name}[{index}]", exc)
                self.stopping.wait(0.05)  # do not spin on a persistent failure
            finally:
                self._gate.leave()

    def pause(self, finish: bool = False) -> None:
        """Stop the workers between units, then let in-flight work finish."""
        self._gate.close(finish)
        self.drain()

    def reopen(self) -> None:
        self.pause()
        self.close_session()
        self.open()
        self._gate.open()

    def close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.stop()

    def finish(self) -> None:
        """Stop the workers for good (the session stays open: consumers still deliver)."""
        self.pause(finish=True)
        for worker in self._workers:
            worker.join(WAIT_TIMEOUT)


class _Paced:
    """Keeps a worker at ``rate`` units per second, without bursts after a hold-up."""

    def __init__(self, rate: float, stopping: threading.Event) -> None:
        self.period = 1.0 / rate
        self.next = time.monotonic()
        self.stopping = stopping

    def wait(self) -> None:
        self.next += self.period
        now = time.monotonic()
        if self.next < now - 1.0:
            self.next = now  # a fault held us up: resume the rate, do not catch up
        elif self.next > now:
            self.stopping.wait(self.next - now)  # the soak's pace: time passing is the point


def _payload(stream: _Stream, seq: int) -> bytes:
    head = b"%s:%d:" % (stream.name.encode(), seq)
    return head + b"." * (PAYLOAD_SIZE - len(head))


class _BlockingPoster(_Role):
    """``post()`` from several threads, one stream each; latency of every call."""

    def __init__(self, soak: "_Soak", uri: str, threads: int, rate: float) -> None:
        super().__init__(soak, "post")
        self.uri = uri
        self.threads = threads
        self.streams = [soak.ledger.add(f"post{i}", "post", False, ("callback",)) for i in range(threads)]
        self._paced = [_Paced(rate, self.stopping) for _ in range(threads)]
        self.latencies: List[float] = []

    def open(self) -> None:
        self.session = bmq.Session(self.soak.address, self.options())
        self.queue = self.session.open_queue(self.uri, write=True)

    def work(self, index: int) -> None:
        stream = self.streams[index]
        seq = stream.posted
        stream.posted += 1
        start = time.perf_counter()
        try:
            self.queue.post(_payload(stream, seq))
            self.latencies.append(time.perf_counter() - start)  # list.append is atomic
            self.soak.ledger.acked(stream, (seq,))
        finally:
            self._paced[index].wait()


class _AsyncPoster(_Role):
    """``post_async`` with at most ``window`` messages unanswered."""

    threads = 1
    UNIT = 20  # posts per paced unit

    def __init__(self, soak: "_Soak", uri: str, rate: float, window: int) -> None:
        super().__init__(soak, "post_async")
        self.uri = uri
        self.window = window
        self.stream = soak.ledger.add("async", "post_async", True, ("callback-async",))
        self._paced = _Paced(rate / self.UNIT, self.stopping)
        self._cond = threading.Condition()
        self._in_flight = 0
        self.latencies: List[float] = []

    def open(self) -> None:
        self.session = bmq.Session(self.soak.address, self.options())
        self.queue = self.session.open_queue(self.uri, write=True)

    def work(self, index: int) -> None:
        for _ in range(self.UNIT):
            with self._cond:
                if not self._cond.wait_for(lambda: self._in_flight < self.window, WAIT_TIMEOUT):
                    raise TimeoutError(f"post_async window full for {WAIT_TIMEOUT} s")
                self._in_flight += 1
            seq = self.stream.posted
            self.stream.posted += 1
            start = time.perf_counter()
            try:
                future = self.queue.post_async(_payload(self.stream, seq))
            except BaseException:
                self._answered()
                raise
            future.add_done_callback(lambda f, seq=seq, start=start: self._done(f, seq, start))
        self._paced.wait()

    def _done(self, future: Any, seq: int, start: float) -> None:
        """On the reader thread: record the answer (no blocking here)."""
        ack = future.result()
        if ack.ok:
            self.latencies.append(time.perf_counter() - start)
            self.soak.ledger.acked(self.stream, (seq,))
        else:
            self.soak.error(self.name, bmq.PostError(f"post_async answered {ack.status.name}", [ack]))
        self._answered()

    def _answered(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_flight == 0, WAIT_TIMEOUT):
                raise TimeoutError(f"{self._in_flight} post_async unanswered after {WAIT_TIMEOUT} s")


class _ManyPoster(_Role):
    """``post_many`` of ``chunk`` messages per call; optionally with a durable outbox."""

    threads = 1

    def __init__(self, soak: "_Soak", name: str, uri: str, rate: float, chunk: int, readers: Tuple[str, ...],
                 outbox: Optional[Path] = None) -> None:
        super().__init__(soak, name)
        self.uri = uri
        self.chunk = chunk
        self.outbox = outbox
        self.stream = soak.ledger.add(name, name, False, readers)
        self._paced = _Paced(rate / chunk, self.stopping)

    def options(self) -> bmq.SessionOptions:
        if self.outbox is None:
            return super().options()
        return dataclasses.replace(super().options(), outbox_dir=str(self.outbox))

    def open(self) -> None:
        self.session = bmq.Session(self.soak.address, self.options())
        self.queue = self.session.open_queue(self.uri, write=True)

    def work(self, index: int) -> None:
        first = self.stream.posted
        seqs = range(first, first + self.chunk)
        self.stream.posted += self.chunk
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

    def open(self) -> None:
        self.session = session = bmq.Session(self.soak.address, self.options())
        self.queues = [session.open_queue(self.uris[reader], read=True, batches=True) for reader in self.readers]

    def work(self, index: int) -> None:
        batch = self.queues[index].get_batch(max_messages=2000, timeout=0.2)
        if batch is None:
            return
        payloads, offsets = batch.payloads, batch.offsets
        self.soak.ledger.delivered(self.readers[index],
                                   [payloads[offsets[i]:offsets[i + 1]] for i in range(len(batch))],
                                   time.monotonic())
        batch.confirm()


# ---- the broker side: broker and proxy in their own process --------------------------------


def _serve_faults(upstream: Optional[str]) -> None:
    """Child process: the proxy (and the embedded broker when ``upstream`` is None); prints
    the proxy's address, then obeys one fault command per stdin line (answering one line
    each) until ``stop`` or end of input."""
    from bmq.broker import Broker
    from proxy import Proxy

    broker = Broker().start() if upstream is None else None
    proxy = Proxy(upstream or broker.address)  # type: ignore[union-attr]
    print(proxy.address, flush=True)
    actions: Dict[str, Callable[[], Any]] = {"cut": proxy.cut, "stall": proxy.stall, "resume": proxy.resume}
    if broker is not None:
        actions.update(restart=broker.restart, drop=broker.faults.drop_connections,
                       withhold=broker.faults.withhold_acks, release=broker.faults.release_acks)
    for line in sys.stdin:
        command = line.strip()
        if command == "stop":
            break
        print(actions[command](), flush=True)
    proxy.close()
    if broker is not None:
        broker.stop()


class _FaultHost:
    """The child process of :func:`_serve_faults` (this file run as a script, importing the
    same bmq as this process); :meth:`do` runs one command there."""

    def __init__(self, upstream: Optional[str]) -> None:
        root = str(Path(bmq.__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self._process = subprocess.Popen([sys.executable, __file__, upstream or "embedded"], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.address = self._answer()
        if not self.address.startswith("tcp://"):
            self.close()
            raise RuntimeError(f"the soak's broker-side process did not start: {self.address!r}")

    def _answer(self) -> str:
        return self._process.stdout.readline().strip()  # type: ignore[union-attr]

    def do(self, command: str) -> str:
        self._process.stdin.write(command + "\n")  # type: ignore[union-attr]
        self._process.stdin.flush()  # type: ignore[union-attr]
        return self._answer()

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._process.stdin.write("stop\n")  # type: ignore[union-attr]
                self._process.stdin.close()  # type: ignore[union-attr]
                self._process.wait(WAIT_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._process.stdout.close()  # type: ignore[union-attr]


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
        return all(check.ok for check in self.checks)

    def as_dict(self) -> Dict[str, Any]:
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
        self.ledger = Ledger()
        self.stopping = threading.Event()
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.errors: List[Tuple[float, str, str]] = []  # (time, where, what)
        self.event_counts: Dict[str, int] = {}

    def error(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self.errors.append((time.monotonic(), where, f"{type(exc).__name__}: {exc}"))

    def on_event(self, event: events.SessionEvent) -> None:
        name = type(event).__name__
        with self._lock:
            self.event_counts[name] = self.event_counts.get(name, 0) + 1
            if isinstance(event, _ERROR_EVENTS):
                self.errors.append((time.monotonic(), "session event", repr(event)))


def _fault_kinds(real: bool) -> List[str]:
    if real:
        return ["cut", "stall", "crash", "reopen"]
    return ["cut", "stall", "restart", "reopen", "drop", "withhold"]


def run_soak(config: SoakConfig) -> SoakResult:
    """Run the soak of ``config`` and return its samples, faults and checks."""
    with tempfile.TemporaryDirectory(prefix="bmq-soak-") as scratch:
        workdir = Path(config.workdir or scratch)
        real = None
        if config.bmqbrkr_home is not None:
            from realbroker import RealBroker

            real = RealBroker(config.bmqbrkr_home, workdir / "bmqbrkr").start()
        try:
            host = _FaultHost(real.address if real else None)
            try:
                return _run(config, host, real, workdir)
            finally:
                host.close()
        finally:
            if real is not None:
                real.stop()


def _run(config: SoakConfig, host: _FaultHost, real: Any, workdir: Path) -> SoakResult:
    log = config.log
    baseline = {"threads": thread_count(), "fds": fd_count(), "rss_mb": rss_mb()}
    soak = _Soak(config, host.address)
    tag = f"soak{os.getpid()}-{time.monotonic_ns() % 10**9}"
    fanout = f"bmq://bmq.test.persistent.fanout/{tag}-fanout"
    blocking = _BlockingPoster(soak, f"bmq://bmq.test.persistent.priority/{tag}-post", config.blocking_threads,
                               config.blocking_rate)
    posting_async = _AsyncPoster(soak, f"bmq://bmq.test.mem.priority/{tag}-async", config.async_rate,
                                 config.async_window)
    many = _ManyPoster(soak, "post_many", f"bmq://bmq.test.persistent.priority/{tag}-many", config.many_rate,
                       config.many_chunk, ("get_batch",), outbox=workdir / "outbox")
    fan = _ManyPoster(soak, "fanout", fanout, config.fanout_rate, config.fanout_chunk, ("foo", "bar"))
    callback = _CallbackConsumer(soak, {"callback": blocking.uri, "callback-async": posting_async.uri,
                                        "foo": f"{fanout}?id=foo"})
    batch = _BatchConsumer(soak, {"get_batch": many.uri, "bar": f"{fanout}?id=bar"})
    consumers: List[_Role] = [callback, batch]
    producers: List[_Role] = [blocking, posting_async, many, fan]
    roles = consumers + producers
    for role in roles:
        role.start()
    log(f"soak: {config.seconds:.0f} s against {'bmqbrkr' if real else 'the embedded broker'} via {host.address}")

    samples: List[Dict[str, Any]] = []
    faults: List[Dict[str, Any]] = []
    previous = {"t": 0.0, "counts": soak.ledger.counts()}

    def sample() -> None:
        now = time.monotonic() - soak.t0
        counts = soak.ledger.counts()
        elapsed = max(1e-6, now - previous["t"])
        stats = [role.session.stats() for role in roles if role.session is not None]
        post_lat, blocking.latencies = blocking.latencies, []
        async_lat, posting_async.latencies = posting_async.latencies, []
        in_use, free = malloc_mb()
        samples.append({
            "t": round(now, 2),
            "rate": {k: round((v - previous["counts"].get(k, 0)) / elapsed, 1) for k, v in counts.items()},
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
        })
        previous.update(t=now, counts=counts)

    def sampler() -> None:
        while not soak.stopping.wait(config.interval):
            try:
                sample()
            except Exception as exc:  # noqa: BLE001 - a sampling failure is an error to report
                soak.error("sampler", exc)

    sampling = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
    sampling.start()

    kinds = _fault_kinds(real is not None)
    next_fault = config.first_fault
    end = config.seconds
    while True:
        now = time.monotonic() - soak.t0
        if now >= end:
            break
        if now < next_fault:
            soak.stopping.wait(min(next_fault, end) - now)  # the run's length: time passing is the point
            continue
        kind = kinds[len(faults) % len(kinds)]
        start = time.monotonic()
        detail = _inject(kind, host, real, soak, roles, config)
        faults.append({"kind": kind, "start": round(start - soak.t0, 2), "end": round(time.monotonic() - soak.t0, 2),
                       "detail": detail})
        log(f"  t={start - soak.t0:6.1f}s fault {kind}: {detail}")
        next_fault += config.fault_every

    # Stop posting, let every post be answered, then wait for every acked message to arrive.
    for role in producers:
        role.finish()
    producing_until = time.monotonic() - soak.t0
    drain_start = time.monotonic()
    with soak.ledger.changed:
        delivered = soak.ledger.changed.wait_for(soak.ledger.all_delivered, WAIT_TIMEOUT)
    drain_seconds = time.monotonic() - drain_start
    soak.stopping.set()
    sampling.join(WAIT_TIMEOUT)
    sample()  # the last, with every session still open
    for role in consumers:
        role.finish()
    for role in roles:
        role.close_session()
    end_threads, end_fds = _settle(baseline)
    return _judge(config, soak, samples, faults, baseline, {"threads": end_threads, "fds": end_fds},
                  delivered, drain_seconds, producing_until, real is not None)


def _inject(kind: str, host: _FaultHost, real: Any, soak: _Soak, roles: List[_Role], config: SoakConfig) -> str:
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
        received = soak.ledger.snapshot_received()
        real.start()
        soak.ledger.note_crash(received)
        return f"bmqbrkr SIGKILLed and restarted on its storage (pid {real.pid})"
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


def _settle(baseline: Dict[str, float]) -> Tuple[int, int]:
    """Threads and fds once they are back to ``baseline`` (or after WAIT_TIMEOUT): exiting
    threads and closing sockets finish a moment after ``stop()`` returns."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while True:
        threads, fds = thread_count(), fd_count()
        if (threads <= baseline["threads"] and fds <= baseline["fds"]) or time.monotonic() > deadline:
            return threads, fds
        threading.Event().wait(0.05)  # OS state with nothing to wait on: look again shortly


def _judge(config: SoakConfig, soak: _Soak, samples: List[Dict[str, Any]], faults: List[Dict[str, Any]],
           baseline: Dict[str, float], end: Dict[str, int], delivered: bool, drain_seconds: float,
           producing_until: float, real: bool) -> SoakResult:
    """The end-of-run checks."""
    t0 = soak.t0

    def fault_at(t: float) -> Optional[str]:
        for fault in reversed(faults):
            if fault["start"] <= t - t0 <= fault["end"] + config.grace:
                return fault["kind"]
        return None

    ledger = soak.ledger
    per_stream: Dict[str, Dict[str, Any]] = {}
    missing_total = lost_total = 0
    for stream in ledger.streams.values():
        acked = stream.acked.as_int()
        entry: Dict[str, Any] = {"pattern": stream.pattern, "posted": stream.posted, "acked": stream.acked.count,
                                 "domain": "in-memory" if stream.in_memory else "persistent"}
        for reader, bits in stream.received.items():
            missing = acked & ~bits.as_int()
            lost = missing & stream.lost_to_crash[reader]
            unexplained = _popcount(missing & ~lost)
            entry[reader] = {"delivered": bits.count, "missing": unexplained, "lost_with_crashed_memory": _popcount(lost)}
            missing_total += unexplained
            lost_total += _popcount(lost)
        per_stream[stream.name] = entry
    dup_by_fault: Dict[str, int] = {}
    for t, *_ in ledger.duplicates:
        cause = fault_at(t) or "unexplained"
        dup_by_fault[cause] = dup_by_fault.get(cause, 0) + 1
    errors_by_fault: Dict[str, int] = {}
    unexplained_errors: List[str] = []
    for t, where, what in soak.errors:
        cause = fault_at(t)
        errors_by_fault[cause or "unexplained"] = errors_by_fault.get(cause or "unexplained", 0) + 1
        if cause is None:
            unexplained_errors.append(f"t={t - t0:.1f}s {where}: {what}")
    warm = next((s for s in samples if s["t"] >= config.warmup), samples[0] if samples else None)
    last = samples[-1] if samples else None
    rss_growth = (last["rss_mb"] - warm["rss_mb"]) if warm and last else 0.0
    ledger_growth = (last["ledger_mb"] - warm["ledger_mb"]) if warm and last else 0.0
    rss_max_after = max((s["rss_mb"] for s in samples if warm and s["t"] >= warm["t"]), default=0.0)
    quiet_stalls = _stalled_intervals([s for s in samples if s["t"] <= producing_until], faults, config, ledger)
    checks = [
        Check("every acknowledged message delivered", delivered and missing_total == 0,
              f"missing {missing_total} of {sum(s.acked.count for s in ledger.streams.values())} acked"
              + (f"; {lost_total} in-memory messages acked before a bmqbrkr SIGKILL and lost with its memory"
                 if lost_total else "") + f"; final drain {drain_seconds:.1f} s"),
        Check("duplicates explained by faults", dup_by_fault.get("unexplained", 0) == 0,
              f"{len(ledger.duplicates)} duplicates: {dup_by_fault or 'none'}"),
        Check(f"RSS growth after {warm['t'] if warm else 0:.0f} s <= {RSS_GROWTH_LIMIT_MB:g} MB",
              rss_growth <= RSS_GROWTH_LIMIT_MB,
              f"{warm['rss_mb'] if warm else 0:.1f} MB -> {last['rss_mb'] if last else 0:.1f} MB "
              f"(+{rss_growth:.1f}, max {rss_max_after:.1f}; of it the soak's own ledger +{ledger_growth:.1f})"),
        Check("threads back to baseline", end["threads"] <= baseline["threads"],
              f"baseline {baseline['threads']}, after closing {end['threads']}"),
        Check("file descriptors back to baseline", end["fds"] <= baseline["fds"],
              f"baseline {baseline['fds']}, after closing {end['fds']}"),
        Check("no error but those the faults explain", not unexplained_errors,
              f"{len(soak.errors)} errors: {errors_by_fault or 'none'}"
              + (f"; unexplained: {unexplained_errors[:5]}" if unexplained_errors else "")),
        Check("every pattern moved in every interval without a fault", not quiet_stalls,
              f"stalled: {quiet_stalls[:5]}" if quiet_stalls else "yes"),
        Check("faults injected", bool(faults),
              ", ".join(f"{k} x{sum(f['kind'] == k for f in faults)}" for k in _fault_kinds(real)
                        if any(f["kind"] == k for f in faults))),
    ]
    totals = {"streams": per_stream, "duplicates": len(ledger.duplicates), "duplicates_by_fault": dup_by_fault,
              "errors": [(round(t - t0, 2), w, e) for t, w, e in soak.errors[:200]], "errors_by_fault": errors_by_fault,
              "events": soak.event_counts, "baseline": baseline, "end": end, "drain_seconds": round(drain_seconds, 2),
              "rss_warm_mb": warm["rss_mb"] if warm else None, "rss_end_mb": last["rss_mb"] if last else None}
    return SoakResult("bmqbrkr" if real else "embedded", config.seconds, samples, faults, totals, checks)


def _stalled_intervals(samples: List[Dict[str, Any]], faults: List[Dict[str, Any]], config: SoakConfig,
                       ledger: Ledger) -> List[str]:
    """Sample intervals touching no fault window in which some pattern acked nothing."""
    patterns = {stream.pattern for stream in ledger.streams.values()}
    stalled = []
    for before, after in zip(samples, samples[1:]):
        if any(f["start"] <= after["t"] and before["t"] <= f["end"] + config.grace for f in faults):
            continue
        for pattern in sorted(patterns):
            if after["total"].get(pattern, 0) == before["total"].get(pattern, 0):
                stalled.append(f"{pattern} {before['t']:.0f}-{after['t']:.0f}s")
    return stalled


if __name__ == "__main__":
    _serve_faults(None if sys.argv[1] == "embedded" else sys.argv[1])
