"""A TCP proxy on 127.0.0.1 that tests put between a client and a broker to cut, stall and
resume connections, so that HA scenarios run against brokers without a fault API (bmqbrkr).

Each accepted connection gets a connection to the upstream broker and two pump threads (one
per direction). :meth:`Proxy.cut` closes every current connection at once (both sockets, as
a lost network path would look to each side); :meth:`Proxy.stall` stops forwarding in both
directions (or one: ``stall("down")`` holds the broker's answers, such as its ACKs, while the
client's bytes still reach it) while keeping the sockets open, and :meth:`Proxy.resume` lets the
held bytes go.

:meth:`Proxy.tamper` makes it hostile: each chunk it forwards (what one ``recv`` brought) may
have bits flipped, be dropped, be sent twice, or be cut short with the connection closed
after it, in either direction; :meth:`Proxy.honest` stops that. :attr:`Proxy.tampered`
counts what was done, per direction and kind.

:meth:`Proxy.corrupt` is the deterministic counterpart: the proxy follows the BlazingMQ
framing of each stream it forwards (the 4-byte length word that starts every event, the type
in the fifth byte) and XORs one byte at a chosen offset of the next event of a chosen type.
"""
from __future__ import annotations

import collections
import random
import socket
import threading
from typing import Counter, Dict, List, NamedTuple, Optional, Tuple

#: The ways :meth:`Proxy.tamper` mistreats a chunk.
TAMPER_KINDS = ("flip", "drop", "duplicate", "truncate")
#: The directions bytes flow: client to broker, broker to client.
DIRECTIONS = ("up", "down")
#: What of an event's header :meth:`Proxy.corrupt` reads: the length word and the type byte.
_HEADER_SEEN = 5


class _Corruption(NamedTuple):
    direction: str
    event_type: int
    offset: int
    xor: int
    anchor: bytes
    done: threading.Event


class _Framing:
    """Where the events of one forwarded stream start (the stream as received, honest)."""

    def __init__(self) -> None:
        self.position = 0  # bytes of the stream seen before the current chunk
        self.next_start = 0  # where the next event starts
        self.start = 0  # where the current event started
        self.header = bytearray()  # its first bytes, up to _HEADER_SEEN

    def events(self, chunk: bytes):
        """Yield ``(start, type)`` of each event whose type byte is in ``chunk`` (``start``: its
        offset in the stream)."""
        base, end = self.position, self.position + len(chunk)
        at = base
        while at < end:
            if at == self.next_start:
                self.start, self.header = at, bytearray()
            if len(self.header) < _HEADER_SEEN:
                take = min(_HEADER_SEEN - len(self.header), end - at)
                self.header += chunk[at - base:at - base + take]
                at += take
                if len(self.header) == _HEADER_SEEN:
                    length = int.from_bytes(self.header[:4], "big") & 0x7FFFFFFF
                    self.next_start = self.start + max(length, _HEADER_SEEN)
                    yield self.start, self.header[4] & 0x3F
                continue
            at = min(end, self.next_start)
        self.position = end


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` (``tcp://host:port`` or ``(host, port)``)."""

    def __init__(self, upstream) -> None:
        if isinstance(upstream, str):
            host, port = upstream.split("://", 1)[-1].rsplit(":", 1)
            upstream = (host, int(port))
        self.upstream: Tuple[str, int] = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: List[Tuple[socket.socket, socket.socket]] = []
        self._flowing = {direction: threading.Event() for direction in DIRECTIONS}
        for flowing in self._flowing.values():
            flowing.set()
        self._closed = False
        self.connections = 0  # accepted so far
        self._tamper: Optional[Dict[str, float]] = None  # kind -> probability per chunk
        self._rng = random.Random(0)
        self.tampered: Counter[Tuple[str, str]] = collections.Counter()  # (direction, kind) -> chunks
        self._corruption: Optional[_Corruption] = None
        self._acceptor = threading.Thread(target=self._accept_loop, name="test-proxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def cut(self) -> int:
        """Close every connection now; return how many there were. New ones are accepted."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)
        return len(pairs)

    def stall(self, direction: Optional[str] = None) -> None:
        """Stop forwarding in ``direction`` ("up": client to broker, "down"; None: both); the
        sockets stay open."""
        if direction is not None and direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}: use one of {DIRECTIONS} or None")
        for name in DIRECTIONS if direction is None else (direction,):
            self._flowing[name].clear()

    def resume(self) -> None:
        """Forward again (both directions), starting with what was held back."""
        for flowing in self._flowing.values():
            flowing.set()

    def tamper(self, seed: int = 0, **probabilities: float) -> None:
        """From now on mistreat each forwarded chunk, in both directions ("up": client to
        broker, "down"), with the given probabilities (``flip=0.02, drop=0.01, ...``, keys
        from TAMPER_KINDS; at most one kind per chunk); ``seed`` makes the choices repeatable."""
        unknown = set(probabilities) - set(TAMPER_KINDS)
        if unknown:
            raise ValueError(f"unknown tamper kinds {sorted(unknown)}: use {TAMPER_KINDS}")
        with self._lock:
            self._rng = random.Random(seed)
            self._tamper = dict(probabilities)

    def corrupt(self, direction: str, event_type: int, offset: int, xor: int, anchor: bytes = b"") -> threading.Event:
        """XOR one byte of the next event of ``event_type`` (``_codec.EVENT_*``) forwarded in
        ``direction`` ("up": client to broker, "down"), on whichever connection carries it
        first; once. The byte is at ``offset`` from the event's start, or, given ``anchor``,
        from where ``anchor`` starts in it (events without it are passed over). Returns an
        event set once the corrupted byte is sent on. What is searched, and the byte, must come
        in the chunk that brings the event's type byte or later."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction {direction!r}: 'up' or 'down'")
        done = threading.Event()
        with self._lock:
            self._corruption = _Corruption(direction, event_type, offset, xor, anchor, done)
        return done

    def honest(self) -> None:
        """Forward every byte as received again (connections stay as they are)."""
        with self._lock:
            self._tamper = None

    def close(self) -> None:
        self._closed = True
        self.resume()
        try:
            # Closing alone would leave the socket listening while the acceptor thread sits in
            # accept(); shutting it down wakes that thread and refuses new connections.
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        self.cut()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, server))
                self.connections += 1
            for source, target, name in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(source, target, name), name=f"test-proxy-{name}",
                                 daemon=True).start()

    def _mistreat(self, data: bytes, direction: str) -> Tuple[List[bytes], bool]:
        """What to send for ``data`` received in ``direction``, and whether to close after it."""
        with self._lock:
            tamper, rng = self._tamper, self._rng
            if not tamper:
                return [data], False
            roll = rng.random()
            kind = None
            for name, probability in tamper.items():
                if roll < probability:
                    kind = name
                    break
                roll -= probability
            if kind is None:
                return [data], False
            self.tampered[(direction, kind)] += 1
            if kind == "flip":
                flipped = bytearray(data)
                for _ in range(rng.randint(1, 3)):
                    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
                return [bytes(flipped)], False
            if kind == "drop":
                return [], False
            if kind == "duplicate":
                return [data, data], False
            return [data[:rng.randrange(len(data))]], True  # truncate: part of it, then the end

    def _corrupt(self, data: bytes, direction: str, framing: _Framing,
                 armed: List[Tuple[int, int, threading.Event]]) -> Tuple[bytes, List[threading.Event]]:
        """``data`` with the armed corruption applied where it falls in it, and the events of
        the corruptions applied (to set once sent). ``armed``: this stream's bytes still to
        corrupt, as (stream offset, xor, event)."""
        base = framing.position
        with self._lock:
            corruption = self._corruption
            for start, event_type in framing.events(data):
                if corruption is None or (direction, event_type) != corruption[:2]:
                    continue
                at = start
                if corruption.anchor:
                    found = data.find(corruption.anchor, max(0, start - base), framing.next_start - base)
                    if found < 0:
                        continue
                    at = base + found
                armed.append((at + corruption.offset, corruption.xor, corruption.done))
                self._corruption = corruption = None  # once, on the first stream to carry one
        hits = [item for item in armed if base <= item[0] < base + len(data)]
        if not hits:
            return data, []
        changed = bytearray(data)
        for item in hits:
            changed[item[0] - base] ^= item[1]
            armed.remove(item)
        return bytes(changed), [item[2] for item in hits]

    def _pump(self, source: socket.socket, target: socket.socket, direction: str) -> None:
        framing = _Framing()
        armed: List[Tuple[int, int, threading.Event]] = []
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                self._flowing[direction].wait()
                data, corrupted = self._corrupt(data, direction, framing, armed)
                chunks, close = self._mistreat(data, direction)
                for chunk in chunks:
                    target.sendall(chunk)
                for done in corrupted:
                    done.set()
                if close:
                    break
        except OSError:
            pass
        _close(source, target)
        with self._lock:  # gone: a later cut() counts (and closes) only live connections
            self._pairs = [pair for pair in self._pairs if source not in pair]


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass
