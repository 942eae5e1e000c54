"""Durable outbox: unacknowledged PUTs on disk, so a killed process loses nothing.

Layout: ``<outbox_dir>/segment-<n>.zst`` files, each a sequence of records
``u32 length (big-endian) + one zstd frame``; a frame decompresses to log entries:

* ``b"A" + guid(16) + u16 uri length + uri + u32 properties length (0xFFFFFFFF = none) +
  properties area + u8 compression + u32 payload length + payload`` — a message posted;
* ``b"D" + guid(16)`` — its final answer arrived (ACK, NACK, TIMEOUT or CANCELED).

Entries are appended before the PUT is handed to the socket and a "done" entry after its
ACK. A new segment starts past :data:`SEGMENT_BYTES`; segments are deleted oldest first once
they and every older one hold nothing pending (a newer segment may hold the "done" entries
that cancel an older one's messages, so it must outlive them). Recovery replays the
segments in order and ignores a torn last record (the process died mid-write).

Durability: without ``fsync`` every record is written with one ``write()`` before the PUT
is sent, so it survives the process being killed (the OS has it) but not a power loss or
kernel crash. With ``fsync=True`` each record is also ``os.fsync``-ed: safe against power
loss, at the cost of one disk flush per post call (typically 0.1-10 ms, so batch with
``post_many``). Messages still unacknowledged when a session stops normally stay in the
outbox and are re-sent by the next session that opens their queue for writing.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import zstandard

__all__ = ["Outbox", "OutboxEntry"]

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 64 * 1024 * 1024
_PREFIX = "segment-"
_SUFFIX = ".zst"
_LENGTH = struct.Struct(">I")
_NO_PROPERTIES = 0xFFFFFFFF


class OutboxEntry(NamedTuple):
    """One message recovered from disk."""

    guid: bytes
    queue_uri: str
    properties: Optional[bytes]
    compression: int
    payload: bytes


def _encode_add(guid: bytes, uri: bytes, properties: Optional[bytes], compression: int, payload: bytes) -> bytes:
    props = b"" if properties is None else properties
    return b"".join(
        (
            b"A",
            guid,
            struct.pack(">H", len(uri)),
            uri,
            _LENGTH.pack(_NO_PROPERTIES if properties is None else len(props)),
            props,
            struct.pack(">BI", compression, len(payload)),
            payload,
        )
    )


def _parse(log: bytes) -> Iterable[Tuple[bytes, bytes, Optional[OutboxEntry]]]:
    """``(kind, guid, entry or None)`` for every entry of a decompressed frame."""
    offset, end = 0, len(log)
    while offset < end:
        kind, guid = log[offset:offset + 1], bytes(log[offset + 1:offset + 17])
        offset += 17
        if kind == b"D":
            yield kind, guid, None
            continue
        if kind != b"A":
            raise ValueError(f"unknown outbox entry kind {kind!r}")
        (uri_len,) = struct.unpack_from(">H", log, offset)
        uri = log[offset + 2:offset + 2 + uri_len].decode()
        offset += 2 + uri_len
        (props_len,) = _LENGTH.unpack_from(log, offset)
        offset += 4
        properties = None
        if props_len != _NO_PROPERTIES:
            properties = bytes(log[offset:offset + props_len])
            offset += props_len
        compression, payload_len = struct.unpack_from(">BI", log, offset)
        offset += 5
        payload = bytes(log[offset:offset + payload_len])
        offset += payload_len
        yield kind, guid, OutboxEntry(guid, uri, properties, compression, payload)


class Outbox:
    """The on-disk log of one session's unacknowledged messages.

    Args:
        directory: created if missing; one session at a time may use it.
        fsync: flush every record to stable storage (see the module docstring).

    Thread-safety: thread-safe (one internal lock).
    """

    def __init__(self, directory: str, fsync: bool = False) -> None:
        self.directory = directory
        self._fsync = fsync
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._compressor = zstandard.ZstdCompressor(level=1)
        self._where: Dict[bytes, int] = {}  # guid -> segment number
        self._live: Dict[int, int] = {}  # segment number -> messages not done
        self.recovered: List[OutboxEntry] = self._recover()
        self._segment = max(self._segments(), default=0) + 1
        self._file = open(self._path(self._segment), "ab")
        self._size = 0
        self._live[self._segment] = 0
        self._collect()

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, f"{_PREFIX}{number:08d}{_SUFFIX}")

    def _segments(self) -> List[int]:
        numbers = []
        for name in os.listdir(self.directory):
            if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
                try:
                    numbers.append(int(name[len(_PREFIX):-len(_SUFFIX)]))
                except ValueError:
                    continue
        return sorted(numbers)

    def _recover(self) -> List[OutboxEntry]:
        pending: Dict[bytes, Tuple[int, OutboxEntry]] = {}
        decompressor = zstandard.ZstdDecompressor()
        for number in self._segments():
            with open(self._path(number), "rb") as f:
                data = f.read()
            offset = 0
            while offset + 4 <= len(data):
                (length,) = _LENGTH.unpack_from(data, offset)
                frame = data[offset + 4:offset + 4 + length]
                if len(frame) < length:
                    logger.warning("outbox %s: torn last record ignored", self._path(number))
                    break
                offset += 4 + length
                try:
                    entries = list(_parse(decompressor.decompress(frame)))
                except (zstandard.ZstdError, ValueError, struct.error, UnicodeDecodeError) as e:
                    logger.warning("outbox %s: unreadable record skipped: %s", self._path(number), e)
                    continue
                for kind, guid, entry in entries:
                    if entry is not None:
                        pending[guid] = (number, entry)
                    else:
                        pending.pop(guid, None)
        self._live = {number: 0 for number in self._segments()}
        for guid, (number, _) in pending.items():
            self._where[guid] = number
            self._live[number] += 1
        if pending:
            logger.warning("outbox %s: %d unacknowledged message(s) recovered", self.directory, len(pending))
        return [entry for _, entry in pending.values()]

    def _collect(self, include_current: bool = False) -> None:
        """Caller holds the lock (or is the constructor): delete finished segments, oldest first."""
        for number in sorted(self._live):
            if self._live[number] or (number == self._segment and not include_current):
                return
            del self._live[number]
            try:
                os.remove(self._path(number))
            except FileNotFoundError:
                pass

    def _append(self, log: bytes) -> None:
        """Caller holds the lock."""
        frame = self._compressor.compress(log)
        self._file.write(_LENGTH.pack(len(frame)) + frame)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._size += 4 + len(frame)

    def _rotate(self) -> None:
        """Caller holds the lock: start a new segment."""
        self._file.close()
        self._segment += 1
        self._file = open(self._path(self._segment), "ab")
        self._size = 0
        self._live[self._segment] = 0
        self._collect()

    def add(
        self,
        queue_uri: str,
        guids: bytes,
        payloads: Sequence[bytes],
        properties: Sequence[Optional[bytes]],
        compression: int,
    ) -> None:
        """Record messages about to be sent (``guids``: 16 bytes each, concatenated)."""
        uri = queue_uri.encode()
        keys = [guids[i:i + 16] for i in range(0, len(guids), 16)]
        log = b"".join(
            _encode_add(key, uri, props, compression, bytes(payload))
            for key, payload, props in zip(keys, payloads, properties)
        )
        with self._lock:
            if self._file.closed:
                return
            self._append(log)
            segment = self._segment
            for key in keys:
                self._where[key] = segment
            self._live[segment] += len(keys)
            if self._size >= SEGMENT_BYTES:
                self._rotate()

    def done(self, guids: Iterable[bytes]) -> None:
        """Record final answers; delete segments with nothing left to send."""
        with self._lock:
            if self._file.closed:
                return
            found = [guid for guid in guids if guid in self._where]
            if not found:
                return
            self._append(b"".join(b"D" + guid for guid in found))
            for guid in found:
                self._live[self._where.pop(guid)] -= 1
            self._collect()

    def close(self) -> None:
        """Close the current segment; delete every segment if nothing is pending."""
        with self._lock:
            if self._file.closed:
                return
            self._file.close()
            self._collect(include_current=True)

    @property
    def pending(self) -> int:
        """Messages recorded and not yet done."""
        with self._lock:
            return len(self._where)
