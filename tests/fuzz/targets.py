"""The fuzz targets: every bmq entry point that takes bytes (or text) from outside.

Each target is a function of one ``bytes`` input that feeds it to one entry point the way
bmq does at run time and lets through only the errors that entry point documents for bad
input (ProtocolError for wire data, the named ``ValueError`` subclasses for text). Any
other exception, a sanitizer report, or an input taking over a second is a finding.

Used by ``scripts/fuzz.py`` (coverage-guided, atheris/libFuzzer, the codec built with
AddressSanitizer and UndefinedBehaviorSanitizer) and by ``tests/fuzz/test_corpus.py``
(every input of the kept corpus and every past crash, replayed through the normal build in
the default test run). Importing this module needs bmq only; atheris is not needed.

Where a target needs parameters beside the bytes (a flag, a split point), it takes them
from the first byte(s) of the input, so that libFuzzer can mutate them too.
"""
from __future__ import annotations

import socket
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from bmq import _codec as codec
from bmq import _expression, _schema, _uri
from bmq._transport import parse_broker_address
from bmq.exceptions import InvalidArgumentError, InvalidURIError, OutboxError, ProtocolError



class Target(NamedTuple):
    """A fuzz target: ``run(data)`` and the seed inputs it is built from (see seeds.py)."""

    run: Callable[[bytes], None]
    what: str


def _params(data: bytes, count: int) -> Tuple[bytes, bytes]:
    """The first ``count`` bytes (parameters, zero-padded) and the rest (the input proper)."""
    head = data[:count]
    return head + bytes(count - len(head)), data[count:]


# ---- the wire codec: framing and each event type --------------------------------------------


def event_header(data: bytes) -> None:
    """EventHeader validation (§1.2), which every event goes through first; heartbeats are
    EventHeaders alone."""
    try:
        length, event_type, words, _ = codec.unpack_event_header(data)
    except ProtocolError:
        return
    assert 8 <= words * 4 <= length <= len(data), (length, words, len(data))
    assert event_type != 0


def frame_reader(data: bytes) -> None:
    """FrameReader.feed (§1.1): a TCP byte stream cut into events, fed in two pieces at a
    point and with a size limit taken from the input."""
    (cut_byte, limit_byte), stream = _params(data, 2)
    limit = (64, 4096, 1 << 20, codec.MAX_EVENT_SIZE)[limit_byte & 3]
    reader = codec.FrameReader(max_event_size=limit)
    cut = (cut_byte * len(stream)) // 256
    events: List[bytes] = []
    try:
        events += reader.feed(stream[:cut])
        events += reader.feed(memoryview(stream)[cut:])
    except ProtocolError:
        return
    assert sum(map(len, events)) + reader.buffered == len(stream)
    for event in events:
        assert 8 <= len(event) <= limit
        assert int.from_bytes(event[:4], "big") & 0x7FFFFFFF == len(event)


def put(data: bytes) -> None:
    """A PUT event as the embedded broker reads it (§2): every message, its CRC32-C over the
    appData as sent, then its properties and payload split out (zlib decompressed, bounded)."""
    try:
        messages = codec.iter_put_messages(data)
    except ProtocolError:
        return
    for flags, _, guid, _, compression, schema, _, app_data in messages:
        assert len(guid) == 16
        codec.crc32c(app_data)  # checked as the broker checks it (a mismatch is valid input: NACKed)
        try:
            area, _ = codec.split_app_data(app_data, flags, compression, schema)
        except ProtocolError:
            continue
        if area is not None:
            _decode_area(area, schema != 0)


def push(data: bytes) -> None:
    """A PUSH event (§4) through both client decoders, which must agree message for message."""
    try:
        messages = codec.iter_push_messages(data)
    except ProtocolError:
        try:
            codec.push_columns(data)
        except ProtocolError:
            return
        raise AssertionError("push_columns accepted what iter_push_messages refused")
    runs = codec.push_columns(data)  # must accept what iter_push_messages accepted
    assert sum(run[2] for run in runs) == len(messages)
    index = 0
    for queue_id, sub_ids, count, guids, payloads, offsets, areas in runs:
        ends = memoryview(offsets).cast("i")
        for i in range(count):
            q, guid, subs, _, area, new_style, payload = messages[index]
            assert (q, subs, guid) == (queue_id, sub_ids, guids[16 * i:16 * i + 16])
            assert payload == payloads[ends[i]:ends[i + 1]]
            assert (area, new_style) == (areas or {}).get(i, (None, new_style))
            if area is not None:
                _decode_area(area, new_style)
            index += 1


def ack(data: bytes) -> None:
    """An ACK event (§3)."""
    try:
        acks = codec.iter_acks(data)
    except ProtocolError:
        return
    for status, _, guid, _ in acks:
        assert 0 <= status < 16 and len(guid) == 16


def confirm(data: bytes) -> None:
    """A CONFIRM event (§5), as the embedded broker reads it."""
    try:
        confirms = codec.iter_confirms(data)
    except ProtocolError:
        return
    for _, guid, _ in confirms:
        assert len(guid) == 16


def _decode_area(area: bytes, new_style: bool) -> None:
    try:
        codec.decode_properties(area, new_style)
    except ProtocolError:
        pass


def properties(data: bytes) -> None:
    """A message-properties area (§6), old style (lengths) or new (offsets) by the first
    byte; what decodes must encode back to an area that decodes the same."""
    (style,), area = _params(data, 1)
    new_style = bool(style & 1)
    try:
        decoded = codec.decode_properties(area, new_style)
    except ProtocolError:
        return
    if not decoded:
        return
    try:
        again = codec.encode_properties(decoded, new_style)
    except ValueError:  # e.g. a STRING not valid UTF-8 (kept with surrogateescape): not re-encodable
        return
    assert codec.decode_properties(again, new_style) == decoded


def app_data(data: bytes) -> None:
    """A message's appData split into properties and payload (§4.4): zlib decompression
    (bounded at MAX_EVENT_SIZE) and the properties area found in or before it."""
    (flags, compression, schema), rest = _params(data, 3)
    try:
        area, payload = codec.split_app_data(rest, flags & 0x3, compression & 0x3, schema & 1)
    except ProtocolError:
        return
    if area is not None:
        _decode_area(area, bool(schema & 1))


def zlib_bomb(data: bytes) -> None:
    """zlib decompression of what the input compresses to, repeated: a payload that inflates
    far beyond its size must decompress or fail with ProtocolError, never exhaust memory."""
    (repeat,), rest = _params(data, 1)
    compressed = zlib.compress(rest * (1 + repeat * 64), 9)
    _, payload = codec.split_app_data(compressed, 0, codec.COMPRESSION_ZLIB, 0)
    assert len(payload) == len(rest) * (1 + repeat * 64)


def crc32c(data: bytes) -> None:
    """CRC32-C (§2.5): the hardware engine, the portable one, any split of the input, and
    the ``crc32c`` package all agree."""
    (cut_byte,), rest = _params(data, 1)
    import crc32c as reference

    whole = codec.crc32c(rest)
    cut = (cut_byte * len(rest)) // 256
    assert codec.crc32c(rest[cut:], codec.crc32c(rest[:cut])) == whole
    assert codec._crc32c_portable(rest) == whole  # noqa: SLF001 - the engine under test
    assert reference.crc32c(rest) == whole


def padding(data: bytes) -> None:
    """Padding (§1.4), on a CONTROL event's body: the input's last byte is the count, 1..4
    and within the input, and only those bytes are stripped (as the C++ SDK, bmq reads the
    count from the last byte alone)."""
    event = codec.pack_event_header(codec.EVENT_CONTROL, 8 + len(data)) + data
    try:
        encoding, body = codec.decode_control_event(event)
    except ProtocolError:
        assert not data or not 1 <= data[-1] <= min(4, len(data))
        return
    assert 1 <= data[-1] <= 4 and body == data[:len(data) - data[-1]]
    assert encoding == codec.ENCODING_BER
    assert codec.padding_length(len(body)) in range(1, 5)


# ---- control messages ------------------------------------------------------------------------

_KINDS = ("negotiation", "control", "authentication")


def control_event(data: bytes) -> None:
    """A whole CONTROL or AUTHENTICATION event (§8): header, padding, encoding bits, then the
    body as each kind of message, as the client and the embedded broker decode it."""
    for kind in _KINDS:
        try:
            _schema.decode_event(data, kind)
        except ProtocolError:
            pass


def _body(data: bytes, encoding: int) -> None:
    (which,), body = _params(data, 1)
    try:
        message = _schema.decode_body(body, encoding, _KINDS[which % 3])
    except ProtocolError:
        return
    assert isinstance(message, dict)


def ber(data: bytes) -> None:
    """A BER control-message body (§8.3), as the official SDKs send them to the embedded
    broker; the kind (negotiation, control, authentication) from the first byte."""
    _body(data, codec.ENCODING_BER)


def json_control(data: bytes) -> None:
    """A JSON control-message body (§8.2), as bmqbrkr sends to bmq; the kind from the first byte."""
    _body(data, codec.ENCODING_JSON)


def features(data: bytes) -> None:
    """The peer's ``features`` string of a negotiation (§8.4) and the encoding chosen from it."""
    text = data.decode("utf-8", "surrogateescape")
    parsed = _schema.parse_features(text)
    assert all(isinstance(v, list) for v in parsed.values())
    _schema.best_encoding(text)


# ---- text from configuration or from a peer --------------------------------------------------


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def expression(data: bytes) -> None:
    """A subscription expression (as a consumer sends it and the embedded broker compiles it),
    then evaluated against properties of every type."""
    text = _text(data)
    try:
        compiled = _expression.parse(text)
    except InvalidArgumentError:
        return
    values = {"b": (codec.PROPERTY_BOOL, True), "c": (codec.PROPERTY_CHAR, b"x"), "s": (codec.PROPERTY_SHORT, 7),
              "i": (codec.PROPERTY_INT32, -3), "l": (codec.PROPERTY_INT64, 2**40), "x": (codec.PROPERTY_STRING, "x"),
              "y": (codec.PROPERTY_BINARY, b"y")}
    compiled.evaluate(lambda name: values.get(name[:1]))
    compiled.evaluate(lambda name: None)
    try:
        _expression.check(text)
    except InvalidArgumentError:
        pass


def queue_uri(data: bytes) -> None:
    """A queue URI (from an application, or in a peer's OpenQueue)."""
    try:
        parsed = _uri.parse_uri(_text(data))
    except InvalidURIError:
        return
    assert parsed.domain and parsed.queue


def broker_address(data: bytes) -> None:
    """A broker address (``tcp://host:port``, from configuration or the command line)."""
    try:
        host, port = parse_broker_address(_text(data))
    except InvalidURIError:
        return
    assert host and 0 < port < 65536


# ---- the outbox's files -----------------------------------------------------------------------


def outbox(data: bytes) -> None:
    """The durable outbox's on-disk records read back by a new process: a segment whose one
    checksummed frame holds the input (records as written by a stranger or a bug), a
    tombstone file holding the input's GUIDs, and a torn tail of raw input."""
    import zstandard

    from bmq import _outbox

    (mode,), raw = _params(data, 1)
    compressor = zstandard.ZstdCompressor()
    with tempfile.TemporaryDirectory(prefix="bmq-fuzz-outbox-") as tmp:
        directory = Path(tmp)
        name = f"{1:016x}"
        segment = _outbox._file_header(_outbox._SEG_MAGIC) + _outbox._frame(raw, compressor)  # noqa: SLF001
        if mode & 1:
            segment += raw  # a torn or garbled tail after the good frame
        (directory / f"{name}{_outbox._SEG_SUFFIX}").write_bytes(segment)  # noqa: SLF001
        if mode & 2:
            tombstones = _outbox._file_header(_outbox._ACK_MAGIC) + _outbox._frame(  # noqa: SLF001
                raw[: len(raw) // 16 * 16] if mode & 4 else raw, compressor)
            (directory / f"{name}{_outbox._ACK_SUFFIX}").write_bytes(tombstones)  # noqa: SLF001
        try:
            box = _outbox.Outbox(directory, fsync="never")
        except OutboxError:
            return
        try:
            for record in box.pending():
                assert len(record.guid) == 16
        finally:
            box.close()


# ---- the embedded broker ----------------------------------------------------------------------


def broker_session(data: bytes) -> None:
    """The embedded broker reading a client's TCP stream from its first byte: framing,
    negotiation (JSON or BER), authentication, control requests, PUTs and CONFIRMs, as its
    reader thread does, on a fresh broker each time (nothing sent back leaves the process)."""
    from bmq.broker import Broker
    from bmq.broker._connection import ClientSession

    (cut_byte,), stream = _params(data, 1)
    broker = Broker(max_event_size=1 << 20)
    ours, theirs = socket.socketpair()
    try:
        session = ClientSession(broker, ours, "fuzz", 1)
        session.send = lambda data, block=False: not session._closing  # type: ignore[method-assign]  # noqa: SLF001
        broker._sessions[1] = session  # noqa: SLF001 - as the acceptor registers it
        cut = (cut_byte * len(stream)) // 256
        try:
            for piece in (stream[:cut], stream[cut:]):
                broker._handle_events(session, session._frames.feed(piece))  # noqa: SLF001
                if not session.is_open:
                    break
        except ProtocolError:
            pass  # the reader closes the connection
        broker._session_gone(session)  # noqa: SLF001
    finally:
        ours.close()
        theirs.close()


# ---- the client ---------------------------------------------------------------------------


class _FakeBroker:
    """A listening socket that answers each connection with given bytes, then closes it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"

    def serve(self, stream: bytes) -> threading.Thread:
        """Accept one connection on a thread, send ``stream``, then read until the client leaves."""

        def run() -> None:
            self.listener.settimeout(2.0)
            try:
                conn, _ = self.listener.accept()
            except OSError:  # the client gave up before connecting: nothing to serve
                return
            with conn:
                conn.settimeout(2.0)
                try:
                    conn.sendall(stream)
                    while conn.recv(1 << 16):
                        pass
                except OSError:
                    pass

        thread = threading.Thread(target=run, name="fuzz-fake-broker", daemon=True)
        thread.start()
        return thread


_FAKE_BROKER: List[_FakeBroker] = []


def client_session(data: bytes) -> None:
    """A bmq session reading a hostile broker's bytes from the first: negotiation, then an
    open queue (read and write) answered by whatever follows, a post and a stop. Every
    failure must be a bmq error; the timeouts are short, so an input over a second is a hang."""
    import bmq

    if not _FAKE_BROKER:
        _FAKE_BROKER.append(_FakeBroker())
    broker = _FAKE_BROKER[0]
    server = broker.serve(data)
    options = bmq.SessionOptions(connect_timeout=0.2, open_queue_timeout=0.2, close_queue_timeout=0.1,
                                 configure_queue_timeout=0.1, disconnect_timeout=0.1, ack_timeout=0.1,
                                 reconnect=bmq.ReconnectPolicy(enabled=False))
    try:
        session = bmq.Session(broker.address, options)
    except bmq.Error:
        server.join()
        return
    try:
        queue = session.open_queue("bmq://bmq.test.mem.priority/fuzz", read=True, write=True)
        queue.post_async(b"fuzz")
        queue.get(timeout=0)
    except bmq.Error:
        pass
    finally:
        session.stop()
        server.join()


TARGETS: Dict[str, Target] = {
    "event_header": Target(event_header, "EventHeader check (every event; heartbeats)"),
    "frame_reader": Target(frame_reader, "FrameReader: a byte stream into events"),
    "put": Target(put, "PUT events, CRC32-C, properties, zlib"),
    "push": Target(push, "PUSH events, both decoders agreeing"),
    "ack": Target(ack, "ACK events"),
    "confirm": Target(confirm, "CONFIRM events"),
    "properties": Target(properties, "message properties, old and new style"),
    "app_data": Target(app_data, "appData split, zlib decompression"),
    "zlib_bomb": Target(zlib_bomb, "zlib: payloads that inflate far"),
    "crc32c": Target(crc32c, "CRC32-C engines against each other"),
    "padding": Target(padding, "padding checks"),
    "control_event": Target(control_event, "CONTROL/AUTHENTICATION events, every kind"),
    "ber": Target(ber, "BER control messages"),
    "json_control": Target(json_control, "JSON control messages"),
    "features": Target(features, "negotiation features strings"),
    "expression": Target(expression, "subscription expressions"),
    "queue_uri": Target(queue_uri, "queue URIs"),
    "broker_address": Target(broker_address, "broker addresses"),
    "outbox": Target(outbox, "the outbox's on-disk records"),
    "broker_session": Target(broker_session, "embedded broker: a client's bytes from the first"),
    "client_session": Target(client_session, "a session: a broker's bytes from the first"),
}

#: The directory of each target's kept corpus (small, minimized) and past crashes.
CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
CRASHES_DIR = Path(__file__).resolve().parent / "crashes"


#: Crashes found whose fix is outside this suite's reach (``crashes/<target>/<file>`` -> what
#: is wrong and where the fix goes): replayed by a strict xfail test until fixed, then removed here.
OPEN_FINDINGS: Dict[str, str] = {}


def corpus_files(name: str, open_findings: bool = False) -> List[Path]:
    """The kept corpus and the fixed past crashes of target ``name``; with ``open_findings``,
    its crashes listed in OPEN_FINDINGS instead."""
    paths = sorted(p for d in (CORPUS_DIR / name, CRASHES_DIR / name) if d.is_dir() for p in d.iterdir()
                   if p.is_file())
    return [p for p in paths if (f"{name}/{p.name}" in OPEN_FINDINGS and p.parent.parent == CRASHES_DIR)
            == open_findings]


def replay(name: str, paths: Optional[List[Path]] = None) -> int:
    """Run target ``name`` on each of ``paths`` (default: its corpus and crashes); how many."""
    run = TARGETS[name].run
    paths = corpus_files(name) if paths is None else paths
    for path in paths:
        run(path.read_bytes())
    return len(paths)

