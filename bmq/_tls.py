"""TLS over a socket that bmq reads and writes itself: an ``ssl.SSLObject`` between two memory
buffers, for the client's transport and the embedded broker alike.

Why not ``ssl.SSLSocket``: both sides read the socket on one thread and write it from others
(the client writes from whichever thread posts, without waiting, keeping the interpreter lock:
see ``_codec.send_now``), and an SSLSocket may not be read and written at once from two
threads. Here the socket stays a plain non-blocking descriptor; :meth:`TLSChannel.encrypt` turns
plaintext into the bytes to write and :meth:`TLSChannel.decrypt` received bytes into plaintext,
each under a lock of the channel's, so the transport's threads keep their roles. TLS starts with
the first byte of the TCP connection, as behind a TLS terminator (stunnel, HAProxy) and with the
broker's own TLS listener (BlazingMQ pull request #1600): :meth:`TLSChannel.handshake` runs
before anything of BlazingMQ's is sent.

What is verified by default (:func:`client_context`): the broker's certificate chain against the
given CA file (the system's CAs without one) and its name against the host the session connects
to; TLS 1.2 at least, 1.3 preferred.

Thread-safety: a :class:`TLSChannel` may be used from any thread (its lock orders
:meth:`~TLSChannel.encrypt` and :meth:`~TLSChannel.decrypt`); the caller keeps the bytes
:meth:`~TLSChannel.encrypt` returns in the order the calls returned.
"""
from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from typing import List, Optional, Union

from ._protocol import check_first_answer, looks_like_tls
from .exceptions import InvalidArgumentError, TLSError
from .exceptions import TimeoutError as BmqTimeoutError

__all__ = ["TLSChannel", "client_context", "server_context", "looks_like_tls"]

_HANDSHAKE_READ = 64 * 1024
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
PathLike = Union[str, "os.PathLike[str]"]


def _version(value: Union[str, ssl.TLSVersion]) -> ssl.TLSVersion:
    if isinstance(value, ssl.TLSVersion):
        version = value
    elif value in _VERSIONS:
        version = _VERSIONS[value]
    else:
        raise InvalidArgumentError(f"minimum_version must be 'TLSv1.2' or 'TLSv1.3', got {value!r}")
    if version < ssl.TLSVersion.TLSv1_2:
        raise InvalidArgumentError(f"TLS below 1.2 is not offered, got {version.name}")
    return version


def _load(what: str, load: "object", *args: Optional[PathLike]) -> None:
    try:
        load(*args)  # type: ignore[operator]
    except (OSError, ssl.SSLError) as exc:
        named = ", ".join(str(arg) for arg in args if arg is not None)
        raise InvalidArgumentError(f"cannot load the {what} from {named}: {exc}") from exc


def client_context(ca_file: Optional[PathLike] = None, *, cert_file: Optional[PathLike] = None,
                   key_file: Optional[PathLike] = None,
                   minimum_version: Union[str, ssl.TLSVersion] = "TLSv1.2") -> ssl.SSLContext:
    """An ``ssl.SSLContext`` for ``SessionOptions(tls=...)``, for the common case.

    The broker's certificate must chain to ``ca_file`` (PEM; the system's CAs when None) and
    name the host connected to; TLS 1.2 at least, 1.3 preferred.

    Args:
        ca_file: the CA certificate(s) the broker's certificate is checked against.
        cert_file: a client certificate (PEM), for brokers or terminators that require one.
        key_file: its private key (PEM; None when it is in ``cert_file``).
        minimum_version: ``"TLSv1.2"`` or ``"TLSv1.3"``.

    Returns:
        A client context with certificate and host name verification on.

    Raises:
        InvalidArgumentError: a file that cannot be read or is not what it should be, a key
            without a certificate, or a version below TLS 1.2.
    """
    if key_file is not None and cert_file is None:
        raise InvalidArgumentError("key_file was given without cert_file")
    if ca_file is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # the system's CAs
    else:
        # Only the given CAs are trusted (the default context would load the system's: 20 ms).
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load("CA certificates", context.load_verify_locations, ca_file)
    context.minimum_version = _version(minimum_version)
    if cert_file is not None:
        _load("client certificate", context.load_cert_chain, cert_file, key_file)
    return context


def server_context(cert_file: PathLike, key_file: Optional[PathLike] = None, *,
                   client_ca_file: Optional[PathLike] = None,
                   minimum_version: Union[str, ssl.TLSVersion] = "TLSv1.2") -> ssl.SSLContext:
    """An ``ssl.SSLContext`` for a TLS listener (the embedded broker's ``Broker(tls=...)``).

    Args:
        cert_file: the server's certificate chain (PEM).
        key_file: its private key (PEM; None when it is in ``cert_file``).
        client_ca_file: when given, clients must present a certificate that chains to it.
        minimum_version: ``"TLSv1.2"`` or ``"TLSv1.3"``.

    Returns:
        A server context.

    Raises:
        InvalidArgumentError: a file that cannot be read, or a version below TLS 1.2.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(minimum_version)
    _load("server certificate", context.load_cert_chain, cert_file, key_file)
    if client_ca_file is not None:
        _load("client CA certificates", context.load_verify_locations, client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class TLSChannel:
    """The TLS state of one connection (see the module docstring).

    Args:
        context: a client or server ``ssl.SSLContext``.
        server_side: True for a listener's end.
        server_hostname: the host name (or IP address) the client connected to: checked
            against the broker's certificate when the context checks host names, and sent
            in SNI when it is a name.
        peer: ``host:port`` of the other end, for messages.
    """

    def __init__(self, context: ssl.SSLContext, *, server_side: bool = False,
                 server_hostname: Optional[str] = None, peer: str = "") -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        try:
            self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                         server_hostname=None if server_side else server_hostname)
        except ValueError as exc:  # e.g. check_hostname without a host name
            raise InvalidArgumentError(f"cannot start TLS with {peer}: {exc}") from exc
        self._lock = threading.Lock()
        self._peer = peer
        self._answer_unchecked = not server_side  # a client checks the broker's first plaintext
        self.peer_closed = False
        """The peer ended the TLS stream (close_notify): what came before it was decrypted, and
        the connection is over even while its TCP socket stays open (a terminator waits for
        the client's close_notify)."""

    @property
    def version(self) -> Optional[str]:
        """The negotiated protocol (``"TLSv1.3"``), None before the handshake."""
        return self._tls.version()

    @property
    def cipher(self) -> Optional[str]:
        """The negotiated cipher suite's name, None before the handshake."""
        found = self._tls.cipher()
        return found[0] if found else None

    def handshake(self, sock: socket.socket, timeout: float) -> None:
        """Run the handshake on blocking ``sock`` within ``timeout`` seconds.

        Raises:
            TLSError: the peer's certificate failed verification (the message says why), the
                peer refused ours or the handshake, or closed the connection meanwhile (as a
                plaintext broker does). TimeoutError: no answer in time (a plaintext listener
                waiting for more bytes looks like this).
        """
        deadline = time.monotonic() + timeout
        tls = self._tls
        first = True
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._send_pending(sock, deadline)
                    data = self._receive(sock, deadline)
                    if first and not looks_like_tls(data):
                        raise TLSError(f"{self._peer} answered the TLS handshake with plaintext: it is not a TLS "
                                       f"endpoint")
                    first = False
                    self._incoming.write(data)
            self._send_pending(sock, deadline)
        except ssl.SSLCertVerificationError as exc:
            self._send_alert(sock)
            raise TLSError(f"TLS handshake with {self._peer} failed: certificate verification failed: "
                           f"{exc.verify_message}") from exc
        except ssl.SSLError as exc:
            self._send_alert(sock)
            raise TLSError(f"TLS handshake with {self._peer} failed: {_reason(exc)}") from exc

    def _send_alert(self, sock: socket.socket) -> None:
        """Best effort: the alert a failed handshake left to send, so the peer learns why."""
        data = self._outgoing.read()
        if data:
            try:
                sock.settimeout(1.0)
                sock.sendall(data)
            except OSError:
                pass

    def _send_pending(self, sock: socket.socket, deadline: float) -> None:
        data = self._outgoing.read()
        if data:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock.sendall(data)
            except socket.timeout:
                raise BmqTimeoutError(f"TLS handshake with {self._peer}: could not write in time") from None
            except OSError as exc:
                raise TLSError(f"TLS handshake with {self._peer} failed: {exc}") from exc

    def _receive(self, sock: socket.socket, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BmqTimeoutError(f"no TLS handshake answer from {self._peer} in time: is it a TLS endpoint?")
        sock.settimeout(remaining)
        try:
            data = sock.recv(_HANDSHAKE_READ)
        except socket.timeout:
            raise BmqTimeoutError(f"no TLS handshake answer from {self._peer} in time: is it a TLS "
                                  f"endpoint?") from None
        except OSError as exc:
            raise TLSError(f"TLS handshake with {self._peer} failed: {exc}") from exc
        if not data:
            raise TLSError(f"{self._peer} closed the connection during the TLS handshake: is it a TLS endpoint, "
                           f"and does it accept this client (certificate, TLS version)?")
        return data

    def encrypt(self, data: Union[bytes, bytearray, memoryview]) -> bytes:
        """The bytes to write for ``data`` (with any TLS records a read left to send).

        Raises:
            TLSError: the TLS connection failed earlier.
        """
        with self._lock:
            if data:
                try:
                    self._tls.write(data)
                except ssl.SSLError as exc:
                    raise TLSError(f"TLS error towards {self._peer}: {_reason(exc)}") from exc
            return self._outgoing.read()

    def decrypt(self, data: Union[bytes, bytearray, memoryview]) -> bytes:
        """The plaintext of received ``data`` (a partial record waits for the rest); after the
        peer's close_notify, :attr:`peer_closed` is set.

        Raises:
            TLSError: a record failed (tampered with, or an alert from the peer: e.g. a client
                certificate refused after a TLS 1.3 handshake).
            ProtocolError: on a client's end, the first plaintext is not a BlazingMQ event: the
                peer is not a BlazingMQ broker (e.g. an HTTPS server); see
                :func:`bmq._protocol.check_first_answer`.
        """
        chunks: List[bytes] = []
        with self._lock:
            incoming, tls = self._incoming, self._tls
            incoming.write(data)
            read = tls.read
            try:
                # Read while received bytes wait: the usual read ends on a record's boundary, and
                # stopping there spares the SSLWantReadError a further read raises. (A read takes
                # a whole record, less than it asks for, so the TLS object keeps no plaintext
                # back; its pending() is not asked: like every call into the ssl module it lets go
                # of the interpreter lock, which a waiting thread then takes: a context switch.)
                while incoming.pending:
                    chunk = read(_HANDSHAKE_READ)
                    if not chunk:  # the peer's close_notify (Python returns b"" for it)
                        self.peer_closed = True
                        break
                    chunks.append(chunk)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                self.peer_closed = True  # its close_notify: it sends nothing more
            except ssl.SSLError as exc:
                raise TLSError(_read_error(self._peer, exc)) from exc
        plain = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._answer_unchecked and plain:
            self._answer_unchecked = False
            check_first_answer(plain, self._peer, over_tls=True)
        return plain


def _read_error(peer: str, exc: ssl.SSLError) -> str:
    """What a failed read says: an alert from the peer after the handshake is, with TLS 1.3, how
    a server refuses the client's certificate (the client's handshake was already over)."""
    reason = str(getattr(exc, "reason", "") or "")
    if "ALERT" in reason:
        alert = reason.split("ALERT_", 1)[-1].replace("_", " ").lower()
        return (f"TLS alert {alert!r} from {peer}: it refused this client's certificate (missing, or not "
                f"trusted there) or its TLS parameters")
    return f"TLS error from {peer}: {_reason(exc)}"


def _reason(exc: ssl.SSLError) -> str:
    reason = getattr(exc, "reason", None)
    text = str(exc)
    if reason and reason.lower().replace("_", " ") not in text.lower():
        return f"{reason}: {text}"
    return text
