"""A TCP proxy on 127.0.0.1 that tests put between a client and a broker to cut, stall and
resume connections, so that HA scenarios run against brokers without a fault API (bmqbrkr).

Each accepted connection gets a connection to the upstream broker and two pump threads (one
per direction). :meth:`Proxy.cut` closes every current connection at once (both sockets, as
a lost network path would look to each side); :meth:`Proxy.stall` stops forwarding in both
directions while keeping the sockets open, and :meth:`Proxy.resume` lets the held bytes go.
"""
from __future__ import annotations

import socket
import threading
from typing import List, Tuple


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
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self.connections = 0  # accepted so far
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

    def stall(self) -> None:
        """Stop forwarding (both directions); the sockets stay open."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, starting with what was held back."""
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
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
                threading.Thread(target=self._pump, args=(source, target), name=f"test-proxy-{name}",
                                 daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                self._flowing.wait()
                target.sendall(data)
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
