# PUT events (§2): batched builder and iterator.

cdef enum:
    C_PUT_HEADER_SIZE = 36
    C_PUT_HEADER_WORDS = 9
    C_PUT_MIN_HEADER_WORDS = 8
    C_PUT_VALID_FLAGS = 0x3


cdef struct PutItem:
    # One message, resolved to C pointers into objects kept alive by the builder.
    const unsigned char *props      # NULL when absent or compressed into `body`
    Py_ssize_t props_len
    const unsigned char *body       # payload, compressed payload, or compressed props+payload
    Py_ssize_t body_len
    const unsigned char *guid
    uint32_t queue_id
    uint32_t size                   # whole message, header and padding included
    uint16_t schema
    uint8_t flags
    uint8_t cat


cdef object per_message(object value, Py_ssize_t n, str what):
    """``value`` if it is one of ``n`` per-message values, else None (a shared value)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{n} payloads but {len(value)} {what}")
        return fast_items(value, "per-message values must be a sequence")
    return None


cdef bytes as_bytes(object obj):
    # Non-bytes buffers are copied once so that nothing can mutate them mid-build.
    return obj if PyBytes_Check(obj) else bytes(obj)


cdef int check_area(bytes area, Py_ssize_t i) except -1:
    if len(area) < 8 or len(area) & 3:
        raise ValueError(f"message {i}: a properties area is word aligned and >= 8 bytes, got {len(area)}")
    return 0


cdef void fill_put(PutItem *it, Py_ssize_t count, unsigned char *p) noexcept nogil:
    cdef Py_ssize_t i, app_len
    cdef unsigned char *app
    for i in range(count):
        app_len = it.props_len + it.body_len
        bmq_store_be32(p, (<uint32_t>it.flags << 28) | (it.size >> 2))
        bmq_store_be32(p + 4, (<uint32_t>it.cat << 5) | C_PUT_HEADER_WORDS)
        bmq_store_be32(p + 8, it.queue_id)
        memcpy(p + 12, it.guid, 16)
        app = p + C_PUT_HEADER_SIZE
        if it.props_len:
            memcpy(app, it.props, it.props_len)
        memcpy(app + it.props_len, it.body, it.body_len)
        bmq_store_be32(p + 28, bmq_crc32c(0, app, app_len))
        bmq_store_be16(p + 32, it.schema)
        bmq_store_be16(p + 34, 0)
        write_padding(app, app_len)
        p += it.size
        it += 1


cdef Py_ssize_t event_span(PutItem *items, Py_ssize_t n, Py_ssize_t *i, Py_ssize_t max_event_size,
                           Py_ssize_t target_size) noexcept:
    """The length of the event that starts at ``items[i[0]]``; moves ``i[0]`` past its messages.
    Its first message may take up to ``max_event_size``, the next ones up to ``target_size``."""
    cdef Py_ssize_t total = C_EVENT_HEADER_SIZE, start = i[0]
    while i[0] < n and total + items[i[0]].size <= (max_event_size if i[0] == start else target_size):
        total += items[i[0]].size
        i[0] += 1
    return total


cdef list pack_events(PutItem *items, Py_ssize_t n, Py_ssize_t max_event_size, int event_type,
                      void (*fill)(PutItem *, Py_ssize_t, unsigned char *) noexcept nogil,
                      Py_ssize_t target_size=0, bint joined=False):
    """Greedily pack ``items`` into events of at most ``max_event_size`` bytes, closing an event
    before it passes ``target_size`` (0: no target) unless its one message is larger.
    ``joined``: one bytes object holding the events back to back (a list of it)."""
    cdef list out = []
    cdef Py_ssize_t i = 0, start, total, whole = 0
    cdef bytes event
    cdef unsigned char *p
    cdef unsigned char *next_event = NULL
    if target_size <= 0 or target_size > max_event_size:
        target_size = max_event_size
    if joined and n:
        while i < n:
            whole += event_span(items, n, &i, max_event_size, target_size)
        event = new_bytes(whole)
        next_event = <unsigned char *>PyBytes_AS_STRING(event)
        out.append(event)
        i = 0
    while i < n:
        start = i
        total = event_span(items, n, &i, max_event_size, target_size)
        if joined:
            p = next_event
            next_event += total
        else:
            event = new_bytes(total)
            p = <unsigned char *>PyBytes_AS_STRING(event)
            out.append(event)
        write_event_header(p, event_type, total, 0)
        if total >= NOGIL_THRESHOLD:
            with nogil:
                fill(items + start, i - start, p + C_EVENT_HEADER_SIZE)
        else:
            fill(items + start, i - start, p + C_EVENT_HEADER_SIZE)
    return out


def build_put_events(queue_ids, guids, payloads, properties=None, *, int flags=0,
                     int compression=C_COMPRESSION_NONE, new_style_properties=True,
                     Py_ssize_t max_event_size=C_MAX_PUT_EVENT_SIZE, Py_ssize_t target_event_size=0,
                     bint joined=False, bint check_only=False):
    """PUT events for ``len(payloads)`` messages, split below ``max_event_size`` (§2).

    Args:
        queue_ids: one qId for all messages or one per message.
        guids: 16 bytes per message (a legacy 24-bit correlation id is
            ``b"\\0" + id.to_bytes(3, "big") + 12 * b"\\0"``).
        payloads: the message payloads (non-empty): a sequence of bytes-like objects, or a
            :class:`PayloadColumn` (copied straight from its buffer).
        properties: None, one area from :func:`encode_properties` shared by all messages,
            or one area/None per message.
        flags: PUT_ACK_REQUESTED or 0 (MESSAGE_PROPERTIES is set where an area is present).
        compression: COMPRESSION_ZLIB compresses a message when the bytes to compress are
            >= 1024 and the result is strictly smaller (§2.6), else it goes out plain.
        new_style_properties: whether the areas use the EX encoding (SchemaId 1) or the old
            one (SchemaId 0); one bool for all or one per message.
        max_event_size: upper bound of each event's length.
        target_event_size: close an event before it passes this many bytes, unless its one
            message is larger (0: only ``max_event_size`` bounds them).
        joined: return the events back to back in one bytes object (a list of it): what a
            socket takes, without joining them afterwards.
        check_only: make every check, build nothing (returns []): a session that keeps its
            posts while disconnected builds their events only once it can send them.

    Returns:
        The events, in message order.

    Raises:
        ValueError: empty payload, wrong guids length, bad flags/compression/area.
        MessageTooLargeError: a message's appData > MAX_PAYLOAD_SIZE, or a message that
            cannot fit in ``max_event_size``.
    """
    cdef Py_ssize_t n, i, plain_len
    cdef Input guid_in
    cdef PutItem *items = NULL
    cdef PutItem *it
    cdef PayloadColumn column = None
    cdef object pay_seq, qid_seq, prop_seq, style_seq, obj, area, packed
    cdef PyObject **pay_items = NULL
    cdef list keep = []
    cdef uint32_t shared_qid = 0
    cdef bint new_style
    cdef bytes payload, props
    if flags & ~C_PUT_ACK_REQUESTED:
        raise ValueError(f"PUT flags {flags}: only PUT_ACK_REQUESTED may be given")
    if compression != C_COMPRESSION_NONE and compression != C_COMPRESSION_ZLIB:
        raise ValueError(f"unknown compression type {compression}")
    if max_event_size < 64 or max_event_size > C_MAX_EVENT_LENGTH:
        raise ValueError(f"max_event_size {max_event_size} outside 64..{C_MAX_EVENT_LENGTH}")
    if target_event_size < 0:
        raise ValueError(f"negative target_event_size {target_event_size}")
    if isinstance(payloads, PayloadColumn):
        column = payloads
        n = column._count
    else:
        pay_seq = fast_items(payloads, "payloads must be a sequence")
        n = PySequence_Fast_GET_SIZE(pay_seq)
        pay_items = PySequence_Fast_ITEMS(pay_seq)
    qid_seq = per_message(queue_ids, n, "queue ids")
    if qid_seq is None:
        shared_qid = <uint32_t>as_uint32_or_int32(queue_ids, "queue id")
    style_seq = per_message(new_style_properties, n, "property styles")
    if properties is None or PyBytes_Check(properties) or isinstance(properties, (bytearray, memoryview)):
        prop_seq = None
        if properties is not None:
            properties = as_bytes(properties)
            check_area(properties, 0)
    else:
        prop_seq = per_message(properties, n, "properties")
        if prop_seq is None:
            raise TypeError("properties must be None, bytes or a list of areas")
    in_acquire(&guid_in, guids)
    try:
        if guid_in.size != 16 * n:
            raise ValueError(f"{n} payloads need {16 * n} bytes of GUIDs, got {guid_in.size}")
        items = <PutItem *>malloc(max(n, 1) * sizeof(PutItem))
        if items == NULL:
            raise MemoryError()
        for i in range(n):
            it = items + i
            if column is not None:
                it.body = column._value(i, &it.body_len)
            else:
                payload = as_bytes(<object>pay_items[i])
                if payload is not <object>pay_items[i]:
                    keep.append(payload)
                it.body = <const unsigned char *>PyBytes_AS_STRING(payload)
                it.body_len = PyBytes_GET_SIZE(payload)
            if it.body_len == 0:
                raise ValueError(f"message {i}: empty payload")
            area = properties if prop_seq is None else <object>PySequence_Fast_ITEMS(prop_seq)[i]
            if area is not None and prop_seq is not None:
                area = as_bytes(area)
                check_area(area, i)
                keep.append(area)
            new_style = new_style_properties if style_seq is None else <object>PySequence_Fast_ITEMS(style_seq)[i]
            it.queue_id = shared_qid if qid_seq is None else <uint32_t>as_uint32_or_int32(
                <object>PySequence_Fast_ITEMS(qid_seq)[i], "queue id")
            it.guid = guid_in.data + 16 * i
            it.flags = <uint8_t>flags
            it.cat = C_COMPRESSION_NONE
            it.schema = 0
            it.props = NULL
            it.props_len = 0
            if area is not None:
                props = <bytes>area
                it.flags |= C_PUT_MESSAGE_PROPERTIES
                it.props = <const unsigned char *>PyBytes_AS_STRING(props)
                it.props_len = PyBytes_GET_SIZE(props)
                if new_style:
                    it.schema = 1
            plain_len = it.props_len + it.body_len
            if plain_len > C_MAX_PAYLOAD_SIZE:
                raise MessageTooLargeError(f"message {i}: {plain_len} bytes of appData > {C_MAX_PAYLOAD_SIZE}")
            if compression == C_COMPRESSION_ZLIB:
                compress_item(it, new_style, keep)
            it.size = <uint32_t>(C_PUT_HEADER_SIZE + it.props_len + it.body_len
                                 + pad_len(it.props_len + it.body_len))
            if it.size + C_EVENT_HEADER_SIZE > max_event_size:
                raise MessageTooLargeError(f"message {i} of {it.size} bytes does not fit in a "
                                           f"{max_event_size}-byte event")
        if check_only:
            return []
        return pack_events(items, n, max_event_size, C_EVENT_PUT, fill_put, target_event_size, joined)
    finally:
        free(items)
        in_release(&guid_in)


cdef int compress_item(PutItem *it, bint new_style, list keep) except -1:
    """Switch ``it`` to CAT=ZLIB when that pays off (C++ rule: >= 1024 in, strictly smaller out)."""
    cdef bytes packed
    cdef bytes plain
    if it.props_len and not new_style:
        # Old-style properties are compressed together with the payload.
        if it.props_len + it.body_len < C_COMPRESSION_THRESHOLD:
            return 0
        plain = new_bytes(it.props_len + it.body_len)
        memcpy(PyBytes_AS_STRING(plain), it.props, it.props_len)
        memcpy(PyBytes_AS_STRING(plain) + it.props_len, it.body, it.body_len)
        packed = zlib_compress(<const unsigned char *>PyBytes_AS_STRING(plain), len(plain))
        if len(packed) >= len(plain):
            return 0
        it.props = NULL
        it.props_len = 0
    else:
        if it.body_len < C_COMPRESSION_THRESHOLD:
            return 0
        packed = zlib_compress(it.body, it.body_len)
        if len(packed) >= it.body_len:
            return 0
    keep.append(packed)
    it.body = <const unsigned char *>PyBytes_AS_STRING(packed)
    it.body_len = len(packed)
    it.cat = C_COMPRESSION_ZLIB
    return 0


def iter_put_messages(event):
    """Every message of a PUT event as ``(flags, queue_id, guid, crc32c, compression,
    schema_wire_id, options, app_data)``, ``app_data`` unpadded and as on the wire.

    Raises:
        ProtocolError: for any malformed message (§12.2).
    """
    cdef Input inp
    cdef Reader r
    cdef list out = []
    cdef const unsigned char *h
    cdef Py_ssize_t start, msg_len, header_len, options_len, app_len
    cdef uint32_t w0, w1
    cdef int flags, cat, schema
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, C_EVENT_PUT)
        if r.pos == r.end:
            _protocol_error("PUT event without messages", r.event_type, r.pos)
        while r.pos < r.end:
            start = r.pos
            h = rd_take(&r, 8, "PutHeader")
            w0 = bmq_load_be32(h)
            w1 = bmq_load_be32(h + 4)
            flags = w0 >> 28
            msg_len = 4 * <Py_ssize_t>(w0 & C_MAX_MESSAGE_WORDS)
            options_len = 4 * <Py_ssize_t>(w1 >> 8)
            cat = (w1 >> 5) & 7
            header_len = 4 * <Py_ssize_t>(w1 & 0x1F)
            if header_len < 4 * C_PUT_MIN_HEADER_WORDS:
                _protocol_error(f"PutHeader of {header_len} bytes", r.event_type, start + 4)
            if msg_len > r.end - start:
                _protocol_error(f"PUT message of {msg_len} bytes overruns the event", r.event_type, start)
            if header_len + options_len >= msg_len:
                _protocol_error("PUT message without appData", r.event_type, start)
            if flags & ~C_PUT_VALID_FLAGS:
                _protocol_error(f"PUT flags 0x{flags:x}", r.event_type, start)
            if cat > C_COMPRESSION_ZLIB:
                _protocol_error(f"unknown compression type {cat}", r.event_type, start + 7)
            schema = bmq_load_be16(h + 32) if header_len >= C_PUT_HEADER_SIZE else 0
            if schema and not flags & C_PUT_MESSAGE_PROPERTIES:
                _protocol_error("SchemaId without MESSAGE_PROPERTIES", r.event_type, start + 32)
            app_len = unpadded_len(&r, h + header_len + options_len, msg_len - header_len - options_len,
                                   start + header_len + options_len)
            if app_len == 0:
                _protocol_error("PUT message with empty appData", r.event_type, start)
            out.append((
                flags,
                <int32_t>bmq_load_be32(h + 8),
                PyBytes_FromStringAndSize(<const char *>h + 12, 16),
                bmq_load_be32(h + 28),
                cat,
                schema,
                PyBytes_FromStringAndSize(<const char *>h + header_len, options_len),
                PyBytes_FromStringAndSize(<const char *>h + header_len + options_len, app_len),
            ))
            r.pos = start + msg_len
        return out
    finally:
        in_release(&inp)
