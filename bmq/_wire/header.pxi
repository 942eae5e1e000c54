# EventHeader (§1.2), stream framing (§1.1) and heartbeats (§1.3).

cdef int write_event_header(unsigned char *p, int event_type, int64_t length, int type_specific) except -1:
    if event_type < 1 or event_type > 63:
        raise ValueError(f"event type {event_type} outside 1..63")
    if length < C_EVENT_HEADER_SIZE or length > C_MAX_EVENT_LENGTH:
        raise MessageTooLargeError(f"event length {length} outside 8..{C_MAX_EVENT_LENGTH}")
    if type_specific < 0 or type_specific > 255:
        raise ValueError(f"type-specific byte {type_specific} outside 0..255")
    bmq_store_be32(p, <uint32_t>length)
    p[4] = <unsigned char>((C_PROTOCOL_VERSION << 6) | event_type)
    p[5] = 2
    p[6] = <unsigned char>type_specific
    p[7] = 0
    return 0


cdef int open_event(Reader *r, const unsigned char *data, Py_ssize_t size, int expected_type) except -1:
    """Validate the EventHeader at ``data`` and point ``r`` at its body.

    ``expected_type`` 0 accepts any type; ``r.end`` becomes the header's length (trailing
    bytes after the event are ignored), ``r.pos`` the end of the header (HeaderWords).
    """
    cdef uint32_t word
    cdef Py_ssize_t length, header_size
    cdef int event_type
    r.base = data
    r.pos = 0
    r.end = size
    r.event_type = expected_type
    if size < C_EVENT_HEADER_SIZE:
        _protocol_error(f"event of {size} bytes is shorter than an EventHeader", expected_type, 0)
    word = bmq_load_be32(data)
    if word & 0x80000000u:
        _protocol_error("fragment bit set", expected_type, 0)
    length = word
    event_type = data[4] & 0x3F
    r.event_type = event_type
    if length < C_EVENT_HEADER_SIZE:
        _protocol_error(f"event length {length} < 8", event_type, 0)
    if length > size:
        _protocol_error(f"event length {length} but only {size} bytes", event_type, 0)
    if (data[4] >> 6) != C_PROTOCOL_VERSION:
        _protocol_error(f"protocol version {data[4] >> 6}", event_type, 4)
    if event_type == 0:
        _protocol_error("event type 0 (UNDEFINED)", event_type, 4)
    header_size = data[5] * 4
    if header_size < C_EVENT_HEADER_SIZE or header_size > length:
        _protocol_error(f"EventHeader of {header_size} bytes in a {length}-byte event", event_type, 5)
    if expected_type and event_type != expected_type:
        _protocol_error(f"expected event type {expected_type}, got {event_type}", event_type, 4)
    r.end = length
    r.pos = header_size
    return 0


def pack_event_header(int event_type, int64_t length, int type_specific=0):
    """An 8-byte EventHeader (PV 1, HeaderWords 2) for an event of ``length`` total bytes."""
    cdef bytes out = new_bytes(C_EVENT_HEADER_SIZE)
    write_event_header(<unsigned char *>PyBytes_AS_STRING(out), event_type, length, type_specific)
    return out


def unpack_event_header(event):
    """``(length, event_type, header_words, type_specific)`` of the event at the start of
    ``event``, validated per §1.2."""
    cdef Input inp
    cdef Reader r
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, 0)
        return (r.end, r.event_type, inp.data[5], inp.data[6])
    finally:
        in_release(&inp)


HEARTBEAT_REQ = pack_event_header(C_EVENT_HEARTBEAT_REQ, C_EVENT_HEADER_SIZE)
HEARTBEAT_RSP = pack_event_header(C_EVENT_HEARTBEAT_RSP, C_EVENT_HEADER_SIZE)


cdef class FrameReader:
    """Splits a TCP byte stream into whole events (§1.1).

    Only the length word is checked here; each event's header is validated by whichever
    decoder handles it, so one bad event can be dropped without losing the stream.

    Thread-safety: not thread-safe; one reader thread owns an instance.
    """

    cdef bytearray _buf
    cdef Py_ssize_t _max
    cdef bint _broken

    def __init__(self, Py_ssize_t max_event_size=C_MAX_EVENT_SIZE):
        if max_event_size < C_EVENT_HEADER_SIZE or max_event_size > C_MAX_EVENT_LENGTH:
            raise ValueError(f"max_event_size {max_event_size} outside 8..{C_MAX_EVENT_LENGTH}")
        self._buf = bytearray()
        self._max = max_event_size
        self._broken = False

    @property
    def buffered(self):
        """Bytes held for an incomplete event."""
        return len(self._buf)

    cdef Py_ssize_t _split(self, const unsigned char *p, Py_ssize_t n, list out) except -1:
        """Append every whole event in ``p[:n]`` to ``out``; return the bytes consumed."""
        cdef Py_ssize_t pos = 0
        cdef uint32_t length
        while n - pos >= 4:
            length = bmq_load_be32(p + pos)
            if length < C_EVENT_HEADER_SIZE or length > <uint32_t>self._max:
                self._broken = True
                raise ProtocolError(
                    f"framing: event length word 0x{length:08x} outside 8..{self._max}", None, pos
                )
            if n - pos < length:
                break
            out.append(PyBytes_FromStringAndSize(<const char *>p + pos, length))
            pos += length
        return pos

    def feed(self, data):
        """Append ``data``; return every event now complete, each as its own ``bytes``.

        Raises:
            ProtocolError: a length word < 8 or > max_event_size; the stream is unusable
                afterwards (the caller closes the connection).
        """
        cdef Input inp
        cdef Py_ssize_t used
        cdef list out = []
        if self._broken:
            raise ProtocolError("framing already failed on this stream")
        if not self._buf:
            # Common case: whole events straight from the socket chunk, no staging copy.
            in_acquire(&inp, data)
            try:
                used = self._split(inp.data, inp.size, out)
                if used < inp.size:
                    self._buf += (<const char *>inp.data)[used:inp.size]
            finally:
                in_release(&inp)
            return out
        self._buf += data
        used = self._split(<const unsigned char *><char *>self._buf, len(self._buf), out)
        if used:
            del self._buf[:used]
        return out


# ---- coalescing outgoing events ----------------------------------------------------------
# A PUT event is its messages back to back, a CONFIRM event a ConfirmHeader and its records:
# consecutive ones can become one event (as the C++ SDK's builders make them). The broker's
# cost is largely per event, so what a stream of single posts or confirms queued meanwhile is
# written as one event each way.

cdef enum:
    C_CONFIRM_HEADER_SIZE = 4


cdef inline Py_ssize_t _merge_skip(const unsigned char *e, Py_ssize_t length) noexcept nogil:
    """Bytes of this event's head to drop when it joins the previous one of its type: 8 for a
    standard PUT, 12 for a standard CONFIRM (their layouts are checked), 0 if it cannot join."""
    cdef int event_type = e[4] & 0x3F
    if (e[4] >> 6) != C_PROTOCOL_VERSION or e[5] != 2 or e[6] != 0 or e[7] != 0:
        return 0
    if event_type == C_EVENT_PUT and length > C_EVENT_HEADER_SIZE:
        return C_EVENT_HEADER_SIZE
    if (event_type == C_EVENT_CONFIRM and length > C_EVENT_HEADER_SIZE + C_CONFIRM_HEADER_SIZE
            and e[8] == 0x16 and e[9] == 0 and e[10] == 0 and e[11] == 0):
        return C_EVENT_HEADER_SIZE + C_CONFIRM_HEADER_SIZE
    return 0


cdef inline int _check_room(Py_ssize_t end, Py_ssize_t capacity) except -1:
    # A buffer that grew since it was measured (another thread's doing) is never written
    # past the output.
    if end > capacity:
        raise RuntimeError("an event changed size while being coalesced")
    return 0


cdef Py_ssize_t _coalesce(tuple items, unsigned char *out, Py_ssize_t capacity) except -1:
    """Lay ``items`` out with consecutive PUT (or CONFIRM) events joined; write them at ``out``
    (``capacity`` bytes) unless it is NULL. Returns the bytes laid out. Bytes that are no whole
    event (never expected: the session writes whole events) are kept as they are."""
    cdef Input inp
    cdef Py_ssize_t total = 0, pos, length, skip, run_start = 0, run_length = 0
    cdef int run_type = 0, event_type
    cdef uint32_t word
    cdef const unsigned char *e
    for item in items:
        in_acquire(&inp, item)
        try:
            pos = 0
            while pos < inp.size:
                e = inp.data + pos
                length = inp.size - pos  # unless a whole event starts here: the rest, as it is
                skip = 0
                if length >= C_EVENT_HEADER_SIZE:
                    word = bmq_load_be32(e)
                    if not (word >> 31) and C_EVENT_HEADER_SIZE <= <Py_ssize_t>word <= length:
                        length = word
                        skip = _merge_skip(e, length)
                event_type = e[4] & 0x3F if skip else 0
                if (skip and event_type == run_type
                        and run_length + length - skip <= C_MAX_PUT_EVENT_SIZE):
                    if out != NULL:
                        _check_room(total + length - skip, capacity)
                        memcpy(out + total, e + skip, length - skip)
                        run_length += length - skip
                        bmq_store_be32(out + run_start, <uint32_t>run_length)
                    else:
                        run_length += length - skip
                    total += length - skip
                else:
                    if out != NULL:
                        _check_room(total + length, capacity)
                        memcpy(out + total, e, length)
                    run_start, run_length = total, length
                    run_type = event_type
                    total += length
                pos += length
        finally:
            in_release(&inp)
    return total


def coalesce_events(items):
    """The events of ``items`` (each bytes-like, whole events back to back) as one bytes
    object, in order, consecutive standard PUT events joined into one PUT event and
    consecutive CONFIRM events into one CONFIRM event (at most 66 MiB each)."""
    cdef tuple parts = tuple(items)  # measured and then written: the same items both times
    cdef Py_ssize_t size = _coalesce(parts, NULL, 0)
    cdef bytes out = new_bytes(size)
    if _coalesce(parts, <unsigned char *>PyBytes_AS_STRING(out), size) != size:
        raise RuntimeError("an event changed size while being coalesced")
    return out
