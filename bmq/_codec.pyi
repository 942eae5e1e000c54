"""Type stub for bmq._codec: the BlazingMQ binary wire format, compiled with Cython.

No sockets, no threads, no sessions: bytes in, bytes out. Every decoder raises only
:class:`bmq.exceptions.ProtocolError` on bad input; encoders raise ``ValueError`` subclasses
(:class:`~bmq.exceptions.PropertyError`, :class:`~bmq.exceptions.MessageTooLargeError`) or
``TypeError``. Section numbers (§) refer to docs/protocol.md.

Thread-safety: every function is safe from any thread; a :class:`FrameReader` or a
:class:`GuidGenerator` instance may be shared only under the caller's lock (the generator
is internally locked, the frame reader is not).
"""
from typing import Any, Dict, Final, Mapping, Optional, Sequence, Tuple, Union, overload
from .exceptions import ProtocolError

Buffer = Union[bytes, bytearray, memoryview]

# Event types (§1.3)
EVENT_CONTROL: Final[int]  # 1
EVENT_PUT: Final[int]  # 2
EVENT_CONFIRM: Final[int]  # 3
EVENT_PUSH: Final[int]  # 4
EVENT_ACK: Final[int]  # 5
EVENT_HEARTBEAT_REQ: Final[int]  # 11
EVENT_HEARTBEAT_RSP: Final[int]  # 12
EVENT_AUTHENTICATION: Final[int]  # 15

# Control-event encodings (§8.2): EventHeader byte 6 bits 7-5
ENCODING_BER: Final[int]  # 0
ENCODING_JSON: Final[int]  # 1

# PutHeader flags (§2.2) and PushHeader flags (§4.2)
PUT_ACK_REQUESTED: Final[int]  # 1
PUT_MESSAGE_PROPERTIES: Final[int]  # 2
PUSH_IMPLICIT_PAYLOAD: Final[int]  # 1
PUSH_MESSAGE_PROPERTIES: Final[int]  # 2
PUSH_OUT_OF_ORDER: Final[int]  # 4

# Compression algorithm types (§2.6)
COMPRESSION_NONE: Final[int]  # 0
COMPRESSION_ZLIB: Final[int]  # 1
COMPRESSION_THRESHOLD: Final[int]  # 1024: compress only when the input is at least this big

# Property types (§6.2)
PROPERTY_BOOL: Final[int]  # 1, value: bool
PROPERTY_CHAR: Final[int]  # 2, value: bytes of length 1 (an int -128..127 is accepted on encode)
PROPERTY_SHORT: Final[int]  # 3, value: int
PROPERTY_INT32: Final[int]  # 4, value: int
PROPERTY_INT64: Final[int]  # 5, value: int
PROPERTY_STRING: Final[int]  # 6, value: str (UTF-8 on the wire)
PROPERTY_BINARY: Final[int]  # 7, value: bytes

# Limits (§12.5)
MAX_PAYLOAD_SIZE: Final[int]  # 64 MiB of application data per message
MAX_PUT_EVENT_SIZE: Final[int]  # 66 MiB: build_put_events splits events below this
MAX_EVENT_SIZE: Final[int]  # 512 MiB: default FrameReader / PUSH builder limit
MAX_PROPERTIES: Final[int]  # 255
MAX_PROPERTY_NAME_LENGTH: Final[int]  # 4095
MAX_PROPERTY_VALUE_LENGTH: Final[int]  # 67104745

HEARTBEAT_REQ: Final[bytes]  # 00 00 00 08 4B 02 00 00
HEARTBEAT_RSP: Final[bytes]  # 00 00 00 08 4C 02 00 00

def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``; hardware-accelerated when
    the CPU has SSE4.2. ``crc32c(b"123456789") == 0xE3069283``."""

def _crc32c_portable(data: Buffer, crc: int = 0) -> int:
    """:func:`crc32c` by the portable table engine, whatever the CPU (the tests compare both)."""

def _crc32c_hardware() -> bool:
    """Whether the SSE4.2 engine is in use on this CPU."""

def padding_length(unpadded: int) -> int:
    """Bytes of padding (1..4, each holding this count) after ``unpadded`` bytes (§1.4)."""

# ---- framing (§1) -------------------------------------------------------------------
def coalesce_events(items: Sequence[Buffer]) -> bytes:
    """The events of ``items`` in order, consecutive PUT (and CONFIRM) events joined into one."""
def pack_event_header(event_type: int, length: int, type_specific: int = 0) -> bytes:
    """An 8-byte EventHeader (PV 1, HeaderWords 2) for an event of ``length`` total bytes."""

def unpack_event_header(event: Buffer) -> Tuple[int, int, int, int]:
    """``(length, event_type, header_words, type_specific)`` of the event at the start of
    ``event``; validated per §1.2 (length >= 8 and <= len(event), fragment bit 0, PV 1,
    HeaderWords*4 in 8..length, type != 0)."""

class FrameReader:
    """Splits a TCP byte stream into whole events (§1.1). Not thread-safe."""

    def __init__(self, max_event_size: int = ...) -> None: ...
    def feed(self, data: Buffer) -> list[bytes]:
        """Append ``data``; return every event now complete, each as its own ``bytes``
        (header included). Raises ProtocolError on a length word < 8 or > max_event_size;
        the stream is unusable afterwards (the caller closes the connection)."""
    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete event."""

# ---- control / authentication events (§8.1) ------------------------------------------
def encode_control_event(body: Buffer, encoding: int, event_type: int = ...) -> bytes:
    """EventHeader (encoding in byte 6) + ``body`` + padding."""

def decode_control_event(event: Buffer) -> Tuple[int, bytes]:
    """``(encoding, body)`` with the header and padding stripped."""

# ---- message properties (§6) --------------------------------------------------------
PropertyMap = Mapping[str, Tuple[int, Any]]

def encode_properties(properties: PropertyMap, new_style: bool = True) -> bytes:
    """The padded properties area for ``{name: (PROPERTY_*, value)}`` in insertion order.

    ``new_style`` selects the MESSAGE_PROPERTIES_EX (offset) encoding, else the old
    (length) one. Raises PropertyError naming the property for: empty/too-long names, a
    value of the wrong Python type or out of range for its type, a name or STRING value
    that is not strict UTF-8 (e.g. a lone surrogate), an oversized value or area, more
    than 255 properties, an empty mapping."""

def decode_properties(area: Buffer, new_style: bool) -> dict[str, Tuple[int, Any]]:
    """Inverse of :func:`encode_properties` (``area`` may have trailing bytes after the
    padded area; MPAW decides). STRING values decode as ``str`` (UTF-8,
    ``surrogateescape`` for invalid bytes), CHAR as ``bytes`` of length 1."""

# ---- GUIDs (§7) ---------------------------------------------------------------------
class GuidGenerator:
    """C++-SDK-compatible MessageGUIDs: version 1, 22-bit counter, 56-bit nanosecond tick,
    6-byte client id from MD5(host/ip, creation time, pid, session id). Unique across
    threads (internally locked) and processes. Thread-safe."""

    def __init__(self, session_id: int = 1) -> None: ...
    @property
    def client_id(self) -> bytes: ...  # 6 bytes
    @property
    def client_id_hex(self) -> str: ...  # 12 upper-case hex chars, for ClientIdentity.guidInfo
    @property
    def nanoseconds_from_epoch(self) -> int: ...
    def next(self) -> bytes:
        """One 16-byte GUID."""
    def generate(self, count: int) -> bytes:
        """``count`` GUIDs concatenated (16*count bytes), all distinct."""

def split_guids(guids: Buffer) -> list[bytes]:
    """The 16-byte GUIDs of a buffer of GUIDs back to back."""
def deterministic_guid(key: Buffer) -> bytes:
    """A version-1-shaped GUID derived only from ``key`` (same key, same GUID): used where a
    retried producer must reproduce its GUIDs so the broker de-duplicates (Spark sink)."""

def derived_guids(key: Buffer, first: int, count: int) -> bytes:
    """The GUIDs of positions ``first .. first + count - 1`` under ``key``, concatenated: each a
    function of ``(key, position)`` only, distinct within one key (bulk producers' retries)."""
class PayloadColumn(Sequence[bytes]):
    """Values ``first .. first + count - 1`` of an Arrow binary/string column (its offsets and
    data buffers), held in place: ``post_many``'s payloads with no object per value; indexing
    copies one out. ValueError for buffers that do not hold them."""
    nbytes: int
    first_empty: int
    def __init__(self, offsets: Buffer, data: Buffer, first: int, count: int, offset_size: int = 4) -> None: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> "PayloadColumn": ...
    def nbytes_of(self, first: int, count: int) -> int:
        """Bytes of values ``first .. first + count - 1``."""

def guid_to_hex(guid: Buffer) -> str: ...
def guid_from_hex(text: str) -> bytes: ...

# ---- PUT (§2) -----------------------------------------------------------------------
def build_put_events(
    queue_ids: Union[int, Sequence[int]],
    guids: Buffer,
    payloads: Union[Sequence[Buffer], PayloadColumn],
    properties: Union[None, bytes, Sequence[Optional[bytes]]] = None,
    *,
    flags: int = ...,
    compression: int = ...,
    new_style_properties: Union[bool, Sequence[bool]] = True,
    max_event_size: int = ...,
    target_event_size: int = 0,
    joined: bool = False,
    check_only: bool = False,
) -> list[bytes]:
    """PUT events for ``len(payloads)`` messages, packed back to back and split so that no
    event exceeds ``max_event_size`` (nor ``target_event_size``, unless one message does);
    ``joined``: all of them back to back in one bytes object.

    ``queue_ids``: one qId for all messages or one per message. ``guids``: 16 bytes per
    message (a legacy 24-bit correlation id goes in as ``b"\\0" + id.to_bytes(3) + 12*b"\\0"``).
    ``properties``: None, one encoded area (from :func:`encode_properties`, matching
    ``new_style_properties``) shared by all, or one area/None per message; MESSAGE_PROPERTIES
    is set per message where an area is present. ``flags``: PUT_ACK_REQUESTED or 0.
    ``compression``: COMPRESSION_ZLIB compresses per message when the bytes to compress are
    >= 1024 and the result is strictly smaller (else CAT 0), payload only for new-style
    properties, properties+payload for old-style (§2.6). SchemaId is 1 with new-style
    properties, else 0 (``new_style_properties``: one bool for all messages or one per message).
    CRC32-C covers the unpadded appData as sent (§2.5).
    Raises MessageTooLargeError (appData > MAX_PAYLOAD_SIZE) or ValueError (empty payload,
    wrong guids length) before building anything. ``check_only``: make those checks, build
    nothing, return []."""

PutMessage = Tuple[int, int, bytes, int, int, int, bytes, bytes]

def iter_put_messages(event: Buffer) -> list[PutMessage]:
    """Every message of a PUT event as
    ``(flags, queue_id, guid, crc32c, compression, schema_wire_id, options, app_data)``,
    ``app_data`` unpadded and as on the wire (possibly compressed). Honours HeaderWords of
    the EventHeader and of each PutHeader (>= 8 words). Raises ProtocolError for any
    malformed message (§12.2)."""

def split_app_data(app_data: Buffer, flags: int, compression: int, schema_wire_id: int) -> Tuple[Optional[bytes], bytes]:
    """``(properties_area or None, payload)`` from a message's appData, decompressing as
    §4.4 says (flags bit 0x2 = MESSAGE_PROPERTIES for both PUT and PUSH)."""

# ---- PUSH (§4) ----------------------------------------------------------------------
PushSpec = Tuple[int, bytes, Sequence[int], Buffer, int, int, int]

def build_push_events(messages: Sequence[PushSpec], max_event_size: int = ...) -> list[bytes]:
    """PUSH events for ``(queue_id, guid, sub_queue_ids, app_data, flags, compression,
    schema_wire_id)`` tuples; ``app_data`` unpadded as received in the PUT; a non-empty
    ``sub_queue_ids`` becomes a SUB_QUEUE_IDS_OLD option, as the broker sends to SDK clients."""

PushMessage = Tuple[int, bytes, Tuple[int, ...], int, Optional[bytes], bool, bytes]

def iter_push_messages(event: Buffer, undecodable: Optional[list[Tuple[bytes, ProtocolError]]] = None,
                       ) -> list[PushMessage]:
    """Every message of a PUSH event as ``(queue_id, guid, sub_queue_ids, flags,
    properties_area or None, new_style_properties, payload)``; payload decompressed.
    sub_queue_ids from SUB_QUEUE_INFOS (packed or not), else SUB_QUEUE_IDS_OLD, else (0,).
    Accepts PushHeader HeaderWords >= 7. IMPLICIT_PAYLOAD gives payload b"".
    With ``undecodable`` a list, a soundly framed message whose payload or properties do not
    decode is appended to it as ``(guid, ProtocolError)`` and skipped instead of raising."""

# (queue_id, sub_queue_ids, count, guids, payloads, offsets, areas); areas: {index: (area, new_style)}
PushRun = Tuple[int, Tuple[int, ...], int, bytes, bytes, bytes, Optional[Dict[int, Tuple[bytes, bool]]]]

def push_columns(event: Buffer) -> list[PushRun]:
    """The messages of a PUSH event column by column, in runs of consecutive messages for
    one queue id and sub-queue ids: GUIDs back to back, payloads (decompressed) back to
    back, ``count + 1`` native int32 payload offsets from 0 (Arrow's binary layout), and the
    properties areas of the messages that have some. Same checks as iter_push_messages."""

def join_offsets(parts: Sequence[Buffer]) -> bytes:
    """Offsets of several runs end to end; each part is ``count + 1`` int32 from any base."""

# ---- ACK (§3) and CONFIRM (§5) -------------------------------------------------------
AckSpec = Tuple[int, int, bytes, int]  # (status, correlation_id, guid, queue_id)

def build_ack_event(acks: Sequence[AckSpec]) -> bytes: ...
def iter_acks(event: Buffer) -> list[AckSpec]:
    """Honours AckHeader HeaderWords / PerMessageWords (both may grow)."""

ConfirmSpec = Tuple[int, bytes, int]  # (queue_id, guid, sub_queue_id)

def make_acks(ack_type: type, status_by_wire: Tuple[Any, ...], guids: list[bytes], statuses: list[int],
              queue_uri: str) -> list[Any]:
    """``ack_type((status_by_wire[statuses[i]], guids[i], queue_uri))`` for every i."""
def build_confirm_event(confirms: Sequence[ConfirmSpec]) -> bytes: ...
def iter_confirms(event: Buffer) -> list[ConfirmSpec]: ...
def build_confirm_run(queue_id: int, guids: Buffer, sub_queue_id: int) -> bytes:
    """A CONFIRM event for every 16-byte GUID of ``guids``, all of one queue and sub-queue."""

# ---- socket calls that keep the interpreter lock ------------------------------------
def send_now(fd: int, data: Buffer) -> int:
    """Bytes of ``data`` socket ``fd`` took at once (0 when full); never waits."""
def recv_now(fd: int, buffer: Union[bytearray, memoryview]) -> int:
    """Bytes read into ``buffer``; 0 at the end of the stream, -1 when nothing was there."""

# ---- waking blocked threads after letting go of the interpreter lock ----------------
class SampleRing:
    """The latest ``size`` samples appended, as C doubles (allocated at the first append)."""
    def __init__(self, size: int) -> None: ...
    def append(self, sample: float) -> None: ...
    def __len__(self) -> int: ...
    def values(self) -> list[float]:
        """The samples kept, oldest first."""

class Latch:
    """A one-shot flag waited on with the interpreter lock released; safe from any thread."""
    def set(self) -> None: ...
    def kick_to(self, kick_fd: int) -> bool:
        """Setting the latch will also write eventfd ``kick_fd`` (-1: not); True if set already."""
    def is_set(self) -> bool: ...
    def wait(self, timeout: float) -> bool:
        """True once set, False after ``timeout`` seconds; signal handlers run meanwhile."""

class Lead:
    """A lock that a thread can also wait to see free without taking it (the transport's
    reader thread, for a poster reading in its place)."""
    def acquire(self, timeout: float = 0.0) -> bool:
        """Take it, waiting up to ``timeout`` seconds (0: not at all); True if taken."""
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def wait_free(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until nobody holds it; True if nobody does."""
    def set_reader_waiting(self, waiting: bool) -> None:
        """The reader thread is (or no longer is) waiting in its epoll set."""
    def reader_waiting(self) -> bool:
        """Whether the reader thread waits in its epoll set (a poster taking the lead kicks it out)."""

def wait_readable(fd: int, timeout: float, woken: list[Latch]) -> bool:
    """Release the interpreter lock, set and remove ``woken``'s latches, then wait up to
    ``timeout`` seconds for ``fd`` to be readable."""
def set_latches(woken: list[Latch]) -> None:
    """Set and remove every latch of ``woken``."""

SIGNAL_CHECK_SECONDS: Final[float]  # how often a waiting thread looks at signals
READY_SOCKET: Final[int]
READY_KICKED: Final[int]
READY_HANDED: Final[int]
READY_SPUN: Final[int]
READY_LEFT: Final[int]

def wait_lead_then_ready(lead: Lead, epfd: int, sock_fd: int, timeout: float) -> int:
    """The reader thread's wait while a poster holds ``lead``, without the interpreter lock:
    until the lead is free and the socket has data (READY_SOCKET), or 0 after ``timeout``."""
def wait_ready(epfd: int, sock_fd: int, timeout: float, woken: list[Latch], spin: float = 0.0,
               lead: Optional[Lead] = None) -> int:
    """Release the interpreter lock, set and remove ``woken``'s latches, then wait up to
    ``timeout`` on edge-triggered epoll set ``epfd`` (socket ``sock_fd`` and a kick eventfd),
    polling it without sleeping for the first ``spin`` seconds: READY_SOCKET | READY_KICKED
    bits (with READY_SPUN if one came while polling), or READY_HANDED at once (no wait) if
    setting a latch wrote its kick descriptor. Given the ``lead`` the caller holds, a wait that
    ends with nothing (time up, or a signal) releases it first and returns READY_LEFT."""
