"""Durable outbox: unacknowledged PUTs kept on disk so a new process can re-send them.

The session appends every message it is about to send (:meth:`Outbox.append`) and removes it
when the broker acknowledges it (:meth:`Outbox.remove`). After a crash, a new
:class:`Outbox` on the same directory returns, through :meth:`Outbox.pending`, every record
that was appended and never removed, with its original GUID, so re-sending is de-duplicated
by the broker. See ``docs/outbox.md`` for durability per fsync policy and its measured cost.

On-disk format (version 1, all integers little-endian)
------------------------------------------------------
The directory holds a lock file ``LOCK`` (``flock``-ed while an Outbox is open; it contains
the owner's pid), and for each segment number ``N`` (16 lower-case hex digits):

* ``N.seg`` — the records. A 16-byte file header (magic ``b"BMQOBSEG"``, u32 version = 1,
  u32 reserved = 0) followed by frames.
* ``N.ack`` — tombstones: the GUIDs of segment ``N``'s records that were acknowledged. Same
  16-byte header with magic ``b"BMQOBACK"``, then frames. Absent until the first removal.
* ``N.seg.tmp`` — a compaction in progress; a leftover one is deleted on open.

A frame is a 12-byte header ``(u32 length, u32 raw_length, u32 crc)`` then ``length`` bytes
holding one zstd frame that decompresses to ``raw_length`` bytes. ``crc`` is the CRC32-C of
the header's first 8 bytes followed by the compressed bytes, so a torn or garbled tail is
detected: reading stops at the first frame that is incomplete or does not check, and every
frame before it is kept. Each :meth:`Outbox.append` call writes one frame (batches over
64 MiB are split into several), each :meth:`Outbox.remove` at most one frame per segment.

Decompressed, a segment frame is a sequence of records::

    u8 flags (bit 0: has properties, bit 1: new-style properties)  u8 compression
    u16 uri length  u32 payload length  u32 properties length  16-byte GUID
    uri (UTF-8)  payload  properties

and a tombstone frame is a sequence of 16-byte GUIDs.

Thread-safety: :class:`Outbox` is safe to use from any thread; one internal lock serialises
every method (fsyncs included).
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import crc32c
import zstandard

from .exceptions import OutboxError, OutboxLockedError

__all__ = ["OutboxRecord", "Outbox", "OutboxError", "OutboxLockedError", "FSYNC_POLICIES"]

logger = logging.getLogger(__name__)

FSYNC_POLICIES = ("always", "batch", "never")

_VERSION = 1
_SEG_MAGIC = b"BMQOBSEG"
_ACK_MAGIC = b"BMQOBACK"
_FILE_HEADER = struct.Struct("<8sII")
_FRAME_HEADER = struct.Struct("<III")
_FRAME_LENGTHS = struct.Struct("<II")  # the part of the frame header its CRC covers
_CRC = struct.Struct("<I")
_RECORD_HEADER = struct.Struct("<BBHII16s")
_GUID_LEN = 16
_HAS_PROPERTIES = 0x01
_NEW_STYLE = 0x02
# Caps the memory a single frame needs to write or read back; bigger batches span frames.
_FRAME_RAW_LIMIT = 64 << 20
_LOCK_NAME = "LOCK"
_SEG_SUFFIX = ".seg"
_ACK_SUFFIX = ".ack"
_TMP_SUFFIX = ".seg.tmp"
_FILE_NAME = re.compile(r"([0-9a-f]{16})(\.seg|\.ack|\.seg\.tmp)")
# A sealed segment is rewritten once less than this fraction of its record bytes is live.
_COMPACT_LIVE_FRACTION = 0.25


@dataclass(frozen=True)
class OutboxRecord:
    """One message waiting for its ACK.

    Attributes:
        guid: the 16-byte message GUID (the record's unique key).
        queue_uri: the queue the message is posted to.
        payload: the message payload.
        properties: the encoded message-properties area, or None (opaque to the outbox).
        new_style_properties: whether ``properties`` uses the new-style encoding.
        compression: the payload's compression type (0 none, 1 zlib; opaque to the outbox).
    """

    guid: bytes
    queue_uri: str
    payload: bytes
    properties: Optional[bytes] = None
    new_style_properties: bool = False
    compression: int = 0


def _encode_frames(records: Iterable[OutboxRecord]) -> Tuple[List[bytes], List[int]]:
    """Encodes records into frame bodies of at most 64 MiB (or one bigger record).

    Returns:
        The frame bodies and the encoded size of each record.

    Raises:
        ValueError: a GUID is not 16 bytes or a field is over the format's limits.
    """
    bodies: List[bytes] = []
    sizes: List[int] = []
    parts: List[bytes] = []
    body_size = 0
    uris: Dict[str, bytes] = {}  # a batch usually goes to one queue: encode its URI once
    pack = _RECORD_HEADER.pack
    for record in records:
        guid, payload, properties = record.guid, record.payload, record.properties
        if len(guid) != _GUID_LEN:
            raise ValueError(f"GUID must be {_GUID_LEN} bytes, got {len(guid)}")
        uri = uris.get(record.queue_uri)
        if uri is None:
            uri = uris[record.queue_uri] = record.queue_uri.encode("utf-8")
        flags = _NEW_STYLE if record.new_style_properties else 0
        if properties is None:
            properties = b""
        else:
            flags |= _HAS_PROPERTIES
        uri_len, payload_len, properties_len = len(uri), len(payload), len(properties)
        try:
            header = pack(flags, record.compression, uri_len, payload_len, properties_len, guid)
        except struct.error as e:
            raise ValueError(f"record {bytes(guid).hex()} does not fit the outbox format: {e}") from e
        size = _RECORD_HEADER.size + uri_len + payload_len + properties_len
        if parts and body_size + size > _FRAME_RAW_LIMIT:
            bodies.append(b"".join(parts))
            parts, body_size = [], 0
        parts += (header, uri, payload, properties)
        body_size += size
        sizes.append(size)
    if parts:
        bodies.append(b"".join(parts))
    return bodies, sizes


def _decode_records(raw: bytes) -> Iterator[Tuple[OutboxRecord, int]]:
    """Yields ``(record, encoded size)`` for each record of a decompressed segment frame.

    Raises:
        ValueError: a record runs past the end of ``raw`` or its URI is not UTF-8.
    """
    view = memoryview(raw)
    offset = 0
    end = len(raw)
    while offset < end:
        if end - offset < _RECORD_HEADER.size:
            raise ValueError(f"truncated record header at offset {offset}")
        flags, compression, uri_len, payload_len, props_len, guid = _RECORD_HEADER.unpack_from(raw, offset)
        start = offset + _RECORD_HEADER.size
        stop = start + uri_len + payload_len + props_len
        if stop > end:
            raise ValueError(f"record at offset {offset} runs past the frame end")
        uri = str(view[start:start + uri_len], "utf-8")
        payload = bytes(view[start + uri_len:start + uri_len + payload_len])
        properties = bytes(view[stop - props_len:stop]) if flags & _HAS_PROPERTIES else None
        yield OutboxRecord(guid, uri, payload, properties, bool(flags & _NEW_STYLE), compression), stop - offset
        offset = stop


def _decode_guids(raw: bytes) -> List[bytes]:
    if len(raw) % _GUID_LEN:
        raise ValueError(f"tombstone frame of {len(raw)} bytes is not a whole number of GUIDs")
    return [raw[i:i + _GUID_LEN] for i in range(0, len(raw), _GUID_LEN)]


def _file_header(magic: bytes) -> bytes:
    return _FILE_HEADER.pack(magic, _VERSION, 0)


def _frame(raw: bytes, compressor: zstandard.ZstdCompressor) -> bytes:
    body = compressor.compress(raw)
    lengths = _FRAME_LENGTHS.pack(len(body), len(raw))
    return b"".join((lengths, _CRC.pack(crc32c.crc32c(body, crc32c.crc32c(lengths))), body))


def _read_frames(data: bytes, magic: bytes, name: str) -> Tuple[List[bytes], int]:
    """The decompressed frames of a segment or tombstone file and the length of its valid prefix.

    A file whose header is not ``magic`` version 1 has no frames and a valid prefix of 0.
    Reading stops at the first torn or corrupt frame (logged at WARNING), keeping those before.
    """
    if len(data) < _FILE_HEADER.size:
        if data:
            logger.warning("outbox file %s: %d-byte header is incomplete, ignoring it", name, len(data))
        return [], 0
    file_magic, version, _ = _FILE_HEADER.unpack_from(data)
    if file_magic != magic or version != _VERSION:
        logger.warning("outbox file %s: not an outbox %s file of version %d, ignoring it",
                       name, magic.decode(), _VERSION)
        return [], 0
    frames = []
    offset = _FILE_HEADER.size
    decompressor = zstandard.ZstdDecompressor()
    while offset < len(data):
        problem = None
        if len(data) - offset < _FRAME_HEADER.size:
            problem = "incomplete frame header"
        else:
            length, raw_length, crc = _FRAME_HEADER.unpack_from(data, offset)
            body_start = offset + _FRAME_HEADER.size
            body = data[body_start:body_start + length]
            if len(body) < length:
                problem = "incomplete frame"
            elif crc32c.crc32c(body, crc32c.crc32c(data[offset:offset + _FRAME_LENGTHS.size])) != crc:
                problem = "frame checksum mismatch"
            else:
                try:
                    raw = decompressor.decompress(body, max_output_size=raw_length)
                except zstandard.ZstdError as e:
                    problem = f"frame does not decompress ({e})"
                else:
                    if len(raw) != raw_length:
                        problem = "frame decompresses to the wrong length"
        if problem is not None:
            logger.warning("outbox file %s: %s at offset %d, ignoring its last %d bytes",
                           name, problem, offset, len(data) - offset)
            break
        frames.append(raw)
        offset = body_start + length
    return frames, offset


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if sys.platform == "darwin" and hasattr(fcntl, "F_FULLFSYNC"):  # pragma: no cover - macOS only
    def _sync(fd: int) -> None:
        # macOS fsync() leaves data in the drive's cache; F_FULLFSYNC flushes it.
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
else:
    _sync = getattr(os, "fdatasync", os.fsync)


class _Segment:
    """Book-keeping of one ``N.seg``/``N.ack`` pair (sizes in bytes; raw = decompressed)."""

    __slots__ = ("number", "seg_path", "ack_path", "fd", "ack_fd", "size", "ack_size", "live",
                 "live_raw", "total_raw", "torn")

    def __init__(self, directory: Path, number: int) -> None:
        self.number = number
        self.seg_path = directory / f"{number:016x}{_SEG_SUFFIX}"
        self.ack_path = directory / f"{number:016x}{_ACK_SUFFIX}"
        self.fd: Optional[int] = None  # open only while this is the segment being appended to
        self.ack_fd: Optional[int] = None
        self.size = 0
        self.ack_size = 0  # 0: no tombstone file
        self.live = 0
        self.live_raw = 0
        self.total_raw = 0
        self.torn = False  # a failed write left bytes that could not be cut off

    def close_fds(self) -> None:
        for fd in (self.fd, self.ack_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.ack_fd = None


class Outbox:
    """Unacknowledged PUTs in zstd-compressed, checksummed segment files.

    Args:
        directory: where the files live; created if missing. One Outbox at a time may use it.
        fsync: ``"always"``: every :meth:`append` and every :meth:`remove` is fsynced (file and,
            when files were created or deleted, the directory) before it returns;
            ``"batch"``: every :meth:`append` call is fsynced, but tombstones and deletions
            written by :meth:`remove` are left to the OS (a machine crash can only make acked
            messages come back, and the broker de-duplicates them by GUID); ``"never"``: no
            fsync, data reaches the OS page cache at once (survives a process kill, not a
            machine crash).
        segment_bytes: a new segment file is started once the current one reaches this size.
        compression_level: the zstd level of the frames.

    Raises:
        ValueError: unknown ``fsync`` policy or a non-positive ``segment_bytes``.
        OutboxLockedError: another open Outbox holds the directory.
        OutboxError: the directory cannot be created, locked or read (names it and the OS reason).

    Thread-safety: every method may be called from any thread. One lock serialises them (file
    writes and fsyncs included); :meth:`append` encodes and compresses before taking it, so
    that work overlaps with other threads' writes.
    """

    def __init__(self, directory: Union[str, os.PathLike], *, fsync: str = "batch",
                 segment_bytes: int = 64 << 20, compression_level: int = 1) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, not {segment_bytes}")
        self._directory = Path(directory)
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._compression_level = compression_level
        self._compressors = threading.local()  # a ZstdCompressor is not thread-safe
        self._lock = threading.Lock()
        self._segments: Dict[int, _Segment] = {}  # in segment-number order
        self._index: Dict[bytes, Tuple[_Segment, int]] = {}  # live GUID -> (segment, raw size)
        self._active: Optional[_Segment] = None
        self._next_number = 0
        self._closed = True  # until the directory is locked and loaded
        # What remove() changed and left to the OS (under "batch") until close() syncs it.
        self._unsynced_tombstones: Set[int] = set()
        self._directory_unsynced = False
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._acquire_lock()
            try:
                self._load()
            except BaseException:
                self._release()
                raise
        except OSError as e:
            # The raw OSError names a parent or a file inside; say which outbox_dir is unusable.
            reason = e.strerror or str(e)
            where = f" ({e.filename})" if e.filename is not None and str(e.filename) != str(directory) else ""
            raise OutboxError(f"cannot use outbox directory {str(directory)!r}: {reason}{where}") from e
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The outbox directory."""
        return self._directory

    @property
    def fsync(self) -> str:
        """The fsync policy: ``"always"``, ``"batch"`` or ``"never"``."""
        return self._fsync

    def append(self, records: Sequence[OutboxRecord]) -> None:
        """Stores ``records`` (durably per the fsync policy when this returns).

        A record whose GUID is already pending is skipped: it is stored already.

        Args:
            records: the messages about to be sent.

        Raises:
            ValueError: a GUID is not 16 bytes or a field is over the format's limits.
            OutboxError: the outbox is closed.
            OSError: the write or fsync failed (a failed write leaves nothing of this call behind).
        """
        fresh: Dict[bytes, OutboxRecord] = {}
        for record in records:
            fresh.setdefault(record.guid, record)
        # Encoding and compressing outside the lock overlaps with another thread's fsync.
        frames, sizes = self._encode(fresh.values())
        with self._lock:
            self._check_open()
            if any(guid in self._index for guid in fresh):
                fresh = {guid: record for guid, record in fresh.items() if guid not in self._index}
                frames, sizes = self._encode(fresh.values())
            if not fresh:
                return
            segment = self._writable_segment()
            created = segment.size == 0
            fd = self._open_file(segment, records=True)
            start = segment.size
            self._append_frame(fd, segment, "size", frames)
            index = self._index
            for guid, size in zip(fresh, sizes):
                index[guid] = (segment, size)
            raw_total = sum(sizes)
            segment.live += len(sizes)
            segment.live_raw += raw_total
            segment.total_raw += raw_total
            if self._fsync != "never":
                _sync(fd)
                if created:
                    self._sync_directory()
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("outbox: appended %d records (%d bytes) to segment %x at offset %d",
                             len(sizes), segment.size - start, segment.number, start)

    def remove(self, guids: Iterable[bytes]) -> None:
        """Forgets acknowledged messages: they are never returned by :meth:`pending` again.

        Unknown GUIDs are ignored. A segment left with no pending record is deleted (or, for
        the one being appended to, emptied); a mostly acknowledged one is rewritten. On a
        closed outbox this does nothing: an ACK that races with closing leaves its record
        pending, to be re-sent and de-duplicated by the broker, rather than failing the
        reader thread that delivered it.

        Args:
            guids: GUIDs of acknowledged messages.

        Raises:
            OSError: writing the tombstones failed.
        """
        with self._lock:
            if self._closed:
                return
            by_segment: Dict[_Segment, List[bytes]] = {}
            for guid in guids:
                entry = self._index.pop(guid, None)
                if entry is None:
                    continue
                segment, size = entry
                segment.live -= 1
                segment.live_raw -= size
                by_segment.setdefault(segment, []).append(guid)
            for segment, dead in by_segment.items():
                self._retire(segment, dead)
            if self._fsync == "always":
                self._sync_unsynced()

    def pending(self) -> List[OutboxRecord]:
        """Every record appended and not removed, in append order (read back from disk).

        Returns:
            The pending records, each GUID once.

        Raises:
            OutboxError: the outbox is closed.
            OSError: a segment file cannot be read.
        """
        with self._lock:
            self._check_open()
            result: List[OutboxRecord] = []
            for segment in self._segments.values():
                if segment.live:
                    result.extend(record for record, _ in self._live_records(segment))
            return result

    def close(self) -> None:
        """Flushes per the policy, deletes a fully acknowledged directory's files, unlocks.

        Idempotent.

        Raises:
            OSError: the final fsync failed (the outbox is closed regardless).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                active = self._active
                if active is not None and active.live == 0:
                    self._delete(active)
                if self._fsync != "never":
                    self._sync_unsynced()
            finally:
                self._release()

    def __del__(self) -> None:
        # Like a file object: an outbox dropped without close() still gives back its
        # descriptors and the directory lock (nothing is lost: every write already happened).
        if not getattr(self, "_closed", True):
            self._closed = True
            self._release()

    def __len__(self) -> int:
        """The number of pending (unacknowledged) records."""
        with self._lock:
            return len(self._index)

    def __enter__(self) -> "Outbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._index)} pending"
        return f"<Outbox {str(self._directory)!r} fsync={self._fsync} {state}>"

    # -- opening --------------------------------------------------------------------------

    def _acquire_lock(self) -> int:
        path = self._directory / _LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutboxLockedError(
                    f"outbox directory {self._directory} is in use by another Outbox (pid {owner}); "
                    "close it first or give each session its own outbox_dir") from e
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        return fd

    def _release(self) -> None:
        for segment in self._segments.values():
            segment.close_fds()
        os.close(self._lock_fd)  # closing the descriptor drops the flock

    def _load(self) -> None:
        numbers = []
        for entry in sorted(os.listdir(self._directory)):
            if entry == _LOCK_NAME:
                continue
            match = _FILE_NAME.fullmatch(entry)
            if match is None:
                logger.warning("outbox: ignoring foreign file %s in %s", entry, self._directory)
                continue
            number = int(match.group(1), 16)
            self._next_number = max(self._next_number, number + 1)
            kind = match.group(2)
            if kind == _TMP_SUFFIX:
                logger.warning("outbox: deleting %s, left by an interrupted compaction", entry)
                os.unlink(self._directory / entry)
            elif kind == _SEG_SUFFIX:
                numbers.append(number)
            elif not (self._directory / f"{match.group(1)}{_SEG_SUFFIX}").exists():
                # A segment is deleted before its tombstones: these outlived it.
                os.unlink(self._directory / entry)
        for number in numbers:
            self._load_segment(_Segment(self._directory, number))
        if self._index:
            logger.warning("outbox %s: %d unacknowledged records in %d segments to re-send",
                           self._directory, len(self._index), len(self._segments))

    def _load_segment(self, segment: _Segment) -> None:
        data = segment.seg_path.read_bytes()
        self._segments[segment.number] = segment
        if len(data) < _FILE_HEADER.size and _file_header(_SEG_MAGIC).startswith(data):
            self._delete(segment)  # killed while creating it: nothing was stored
            return
        frames, valid = _read_frames(data, _SEG_MAGIC, segment.seg_path.name)
        if valid == 0:
            del self._segments[segment.number]  # not ours: leave it alone
            return
        dead = set(self._load_tombstones(segment))
        segment.size = len(data)
        for raw in frames:
            try:
                for record, size in _decode_records(raw):
                    segment.total_raw += size
                    if record.guid in dead or record.guid in self._index:
                        continue
                    self._index[record.guid] = (segment, size)
                    segment.live += 1
                    segment.live_raw += size
            except ValueError as e:  # a checksummed frame we cannot parse: written by a stranger
                logger.warning("outbox file %s: undecodable frame (%s), skipping the rest of it",
                               segment.seg_path.name, e)
        if segment.live == 0:
            self._delete(segment)
        else:
            self._maybe_compact(segment)

    def _load_tombstones(self, segment: _Segment) -> List[bytes]:
        try:
            data = segment.ack_path.read_bytes()
        except FileNotFoundError:
            return []
        frames, valid = _read_frames(data, _ACK_MAGIC, segment.ack_path.name)
        guids = []
        for raw in frames:
            try:
                guids.extend(_decode_guids(raw))
            except ValueError as e:
                logger.warning("outbox file %s: %s", segment.ack_path.name, e)
        if valid < len(data):
            # New tombstones are appended; behind a torn tail they could never be read.
            with open(segment.ack_path, "r+b") as f:
                f.truncate(valid)
        segment.ack_size = valid
        return guids

    # -- writing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OutboxError(f"outbox {self._directory} is closed")

    def _compressor(self) -> zstandard.ZstdCompressor:
        compressor = getattr(self._compressors, "compressor", None)
        if compressor is None:
            compressor = self._compressors.compressor = zstandard.ZstdCompressor(level=self._compression_level)
        return compressor

    def _encode(self, records: Iterable[OutboxRecord]) -> Tuple[bytes, List[int]]:
        """The frames holding ``records`` and the encoded size of each record."""
        bodies, sizes = _encode_frames(records)
        compressor = self._compressor()
        return b"".join([_frame(body, compressor) for body in bodies]), sizes

    def _writable_segment(self) -> _Segment:
        active = self._active
        if active is not None and active.size < self._segment_bytes and not active.torn:
            return active
        if active is not None:
            self._seal(active)
        segment = _Segment(self._directory, self._next_number)
        self._next_number += 1
        self._segments[segment.number] = segment
        self._active = segment
        return segment

    def _seal(self, segment: _Segment) -> None:
        segment.close_fds()
        self._active = None
        if segment.live == 0:
            self._delete(segment)
        else:
            self._maybe_compact(segment)

    def _open_file(self, segment: _Segment, records: bool) -> int:
        """The descriptor to append to ``segment``'s records (or tombstones), opened if needed."""
        fd_attr, size_attr = ("fd", "size") if records else ("ack_fd", "ack_size")
        fd = getattr(segment, fd_attr)
        if fd is None:
            path = segment.seg_path if records else segment.ack_path
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            setattr(segment, fd_attr, fd)
        if getattr(segment, size_attr) == 0:
            self._append_frame(fd, segment, size_attr, _file_header(_SEG_MAGIC if records else _ACK_MAGIC))
        return fd

    def _append_frame(self, fd: int, segment: _Segment, size_attr: str, data: bytes) -> None:
        """Writes ``data`` at the end of ``fd``; on failure cuts the file back to its old size."""
        size = getattr(segment, size_attr)
        try:
            _write_all(fd, data)
        except BaseException:
            try:
                os.ftruncate(fd, size)
            except OSError:
                # Frames appended behind a partial one could never be read back: start afresh.
                logger.warning("outbox: cannot cut %s back to %d bytes after a failed write",
                               segment.seg_path.name, size, exc_info=True)
                segment.torn = True
            raise
        setattr(segment, size_attr, size + len(data))

    def _retire(self, segment: _Segment, dead: List[bytes]) -> None:
        """Records that ``dead`` (GUIDs of ``segment``) are acked."""
        if segment.live == 0 and segment is not self._active:
            self._delete(segment)
        elif segment.live == 0:
            # The segment being appended to is emptied in place rather than re-created.
            fd = segment.fd
            assert fd is not None, "the active segment is open for appending"
            os.ftruncate(fd, _FILE_HEADER.size)
            segment.size = _FILE_HEADER.size
            segment.total_raw = 0
            if self._fsync == "always":
                _sync(fd)
            # Only once the records are gone: stale tombstones are harmless, missing ones not.
            if segment.ack_size:
                os.ftruncate(self._ack_fd(segment), _FILE_HEADER.size)
                segment.ack_size = _FILE_HEADER.size
        else:
            fd = self._ack_fd(segment)
            try:
                self._append_frame(fd, segment, "ack_size", _frame(b"".join(dead), self._compressor()))
            finally:
                if segment is not self._active:
                    os.close(fd)
                    segment.ack_fd = None
            self._unsynced_tombstones.add(segment.number)
            if segment is not self._active:
                self._maybe_compact(segment)

    def _ack_fd(self, segment: _Segment) -> int:
        if segment.ack_fd is None and not segment.ack_size:
            self._directory_unsynced = True
        return self._open_file(segment, records=False)

    def _delete(self, segment: _Segment) -> None:
        segment.close_fds()
        # Records first: tombstones that outlive their segment are harmless, the reverse is not.
        for path in (segment.seg_path, segment.ack_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        del self._segments[segment.number]
        self._unsynced_tombstones.discard(segment.number)
        self._directory_unsynced = True
        if segment is self._active:
            self._active = None
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("outbox: deleted fully acknowledged segment %x", segment.number)

    def _maybe_compact(self, segment: _Segment) -> None:
        if segment.live_raw >= segment.total_raw * _COMPACT_LIVE_FRACTION:
            return
        frames, _ = self._encode([record for record, _ in self._live_records(segment)])
        tmp = segment.seg_path.with_name(segment.seg_path.name[:-len(_SEG_SUFFIX)] + _TMP_SUFFIX)
        body = _file_header(_SEG_MAGIC) + frames
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, body)
            if self._fsync != "never":
                _sync(fd)
        finally:
            os.close(fd)
        # Same number, atomic replace: the append order is kept and no record exists twice.
        os.replace(tmp, segment.seg_path)
        if self._fsync != "never":
            self._sync_directory()
        try:
            segment.ack_path.unlink()
        except FileNotFoundError:
            pass
        self._unsynced_tombstones.discard(segment.number)
        self._directory_unsynced = True
        old_size = segment.size
        segment.size = len(body)
        segment.ack_size = 0
        segment.total_raw = segment.live_raw
        logger.info("outbox: compacted segment %x from %d to %d bytes (%d records pending)",
                    segment.number, old_size, segment.size, segment.live)

    def _live_records(self, segment: _Segment) -> Iterator[Tuple[OutboxRecord, int]]:
        frames, _ = _read_frames(segment.seg_path.read_bytes(), _SEG_MAGIC, segment.seg_path.name)
        seen = set()
        for raw in frames:
            try:
                for record, size in _decode_records(raw):
                    entry = self._index.get(record.guid)
                    if entry is not None and entry[0] is segment and record.guid not in seen:
                        seen.add(record.guid)
                        yield record, size
            except ValueError:
                pass  # reported when the segment was loaded

    def _sync_unsynced(self) -> None:
        for number in sorted(self._unsynced_tombstones):
            fd = os.open(self._segments[number].ack_path, os.O_RDONLY)
            try:
                _sync(fd)
            finally:
                os.close(fd)
        self._unsynced_tombstones.clear()
        if self._directory_unsynced:
            self._sync_directory()

    def _sync_directory(self) -> None:
        fd = os.open(self._directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._directory_unsynced = False
