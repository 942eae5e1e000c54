# PUSH events (§4): builder (for the embedded broker) and iterator (client hot path).

cdef enum:
    C_PUSH_HEADER_SIZE = 32
    C_PUSH_HEADER_WORDS = 8
    C_PUSH_MIN_HEADER_WORDS = 7
    C_PUSH_VALID_FLAGS = 0x7
    C_OPT_SUB_QUEUE_IDS_OLD = 1
    C_OPT_SUB_QUEUE_INFOS = 3
    C_MAX_OPTION_WORDS = 0x1FFFFF

# The overwhelmingly common "no option" answer, shared instead of allocated per message.
cdef tuple DEFAULT_SUB_QUEUE_IDS = (0,)


cdef void fill_push(PutItem *it, Py_ssize_t count, unsigned char *p) noexcept nogil:
    # Reuses PutItem: `props` holds the option area (already encoded), `body` the appData.
    cdef Py_ssize_t i
    cdef unsigned char *app
    for i in range(count):
        bmq_store_be32(p, (<uint32_t>it.flags << 28) | (it.size >> 2))
        bmq_store_be32(p + 4, (<uint32_t>(it.props_len >> 2) << 8) | (<uint32_t>it.cat << 5) | C_PUSH_HEADER_WORDS)
        bmq_store_be32(p + 8, it.queue_id)
        memcpy(p + 12, it.guid, 16)
        bmq_store_be16(p + 28, it.schema)
        bmq_store_be16(p + 30, 0)
        app = p + C_PUSH_HEADER_SIZE
        if it.props_len:
            memcpy(app, it.props, it.props_len)
        app += it.props_len
        if it.body_len:
            memcpy(app, it.body, it.body_len)
            write_padding(app, it.body_len)
        p += it.size
        it += 1


cdef bytes sub_queue_option(object ids):
    """A SUB_QUEUE_IDS_OLD option carrying ``ids`` (what brokers send to SDK clients)."""
    cdef Py_ssize_t n = len(ids), i
    cdef bytes out
    cdef unsigned char *p
    if n + 1 > C_MAX_OPTION_WORDS:
        raise MessageTooLargeError(f"{n} sub-queue ids do not fit in one option")
    out = new_bytes(4 * (n + 1))
    p = <unsigned char *>PyBytes_AS_STRING(out)
    bmq_store_be32(p, (C_OPT_SUB_QUEUE_IDS_OLD << 26) | <uint32_t>(n + 1))
    for i in range(n):
        bmq_store_be32(p + 4 * (i + 1), <uint32_t>as_uint32_or_int32(ids[i], "sub-queue id"))
    return out


def build_push_events(messages, Py_ssize_t max_event_size=C_MAX_EVENT_SIZE):
    """PUSH events for ``(queue_id, guid, sub_queue_ids, app_data, flags, compression,
    schema_wire_id)`` tuples.

    ``app_data`` is unpadded, as received in the PUT; a non-empty ``sub_queue_ids`` becomes a
    SUB_QUEUE_IDS_OLD option. With PUSH_IMPLICIT_PAYLOAD ``app_data`` must be empty.

    Raises:
        ValueError: malformed tuple, bad flags/compression/GUID, empty appData.
        MessageTooLargeError: a message that cannot fit in ``max_event_size``.
    """
    cdef object seq = PySequence_Fast(messages, "messages must be a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i
    cdef PutItem *items = NULL
    cdef PutItem *it
    cdef list keep = []
    cdef bytes guid, app, option
    cdef int flags, compression, schema
    if max_event_size < 64 or max_event_size > C_MAX_EVENT_LENGTH:
        raise ValueError(f"max_event_size {max_event_size} outside 64..{C_MAX_EVENT_LENGTH}")
    items = <PutItem *>malloc(max(n, 1) * sizeof(PutItem))
    if items == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            it = items + i
            queue_id, guid_obj, sub_ids, app_obj, flags, compression, schema = <object>PySequence_Fast_ITEMS(seq)[i]
            if flags & ~C_PUSH_VALID_FLAGS:
                raise ValueError(f"message {i}: PUSH flags 0x{flags:x}")
            if compression != C_COMPRESSION_NONE and compression != C_COMPRESSION_ZLIB:
                raise ValueError(f"message {i}: unknown compression type {compression}")
            if not 0 <= schema <= 0xFFFF:
                raise ValueError(f"message {i}: SchemaId {schema} outside 16 bits")
            guid = guid_bytes(guid_obj)
            app = as_bytes(app_obj)
            option = sub_queue_option(sub_ids) if sub_ids else b""
            keep.append((guid, app, option))
            if flags & C_PUSH_IMPLICIT_PAYLOAD:
                if len(app):
                    raise ValueError(f"message {i}: IMPLICIT_PAYLOAD with appData")
            elif not len(app):
                raise ValueError(f"message {i}: empty appData")
            it.queue_id = <uint32_t>as_uint32_or_int32(queue_id, "queue id")
            it.guid = <const unsigned char *>PyBytes_AS_STRING(guid)
            it.flags = <uint8_t>flags
            it.cat = <uint8_t>compression
            it.schema = <uint16_t>schema
            it.props = <const unsigned char *>PyBytes_AS_STRING(option)
            it.props_len = len(option)
            it.body = <const unsigned char *>PyBytes_AS_STRING(app)
            it.body_len = len(app)
            if it.body_len + it.props_len > 4 * <Py_ssize_t>C_MAX_MESSAGE_WORDS - C_PUSH_HEADER_SIZE - 4:
                raise MessageTooLargeError(f"message {i}: {it.body_len} bytes of appData")
            it.size = <uint32_t>(C_PUSH_HEADER_SIZE + it.props_len
                                 + (it.body_len + pad_len(it.body_len) if it.body_len else 0))
            if it.size + C_EVENT_HEADER_SIZE > max_event_size:
                raise MessageTooLargeError(f"message {i} of {it.size} bytes does not fit in a "
                                           f"{max_event_size}-byte event")
        return pack_events(items, n, max_event_size, C_EVENT_PUSH, fill_push)
    finally:
        free(items)


cdef tuple parse_options(Reader *r, const unsigned char *p, Py_ssize_t n, Py_ssize_t offset):
    """Sub-queue ids from a PUSH options area (§4.3): SUB_QUEUE_INFOS, else
    SUB_QUEUE_IDS_OLD, else the default (0,)."""
    cdef Py_ssize_t pos = 0, size, item, count, i
    cdef uint32_t w
    cdef int otype, seen = 0
    cdef tuple old_ids = None, infos = None
    while pos < n:
        if n - pos < 4:
            _protocol_error("truncated OptionHeader", r.event_type, offset + pos)
        w = bmq_load_be32(p + pos)
        otype = w >> 26
        if otype < C_OPT_SUB_QUEUE_IDS_OLD or otype > C_OPT_SUB_QUEUE_INFOS:
            _protocol_error(f"unknown option type {otype}", r.event_type, offset + pos)
        if seen & (1 << otype):
            _protocol_error(f"option type {otype} twice", r.event_type, offset + pos)
        seen |= 1 << otype
        if w & (1 << 25):
            # Packed: no content; for SUB_QUEUE_INFOS it means "the default sub-queue".
            if otype == C_OPT_SUB_QUEUE_INFOS:
                infos = DEFAULT_SUB_QUEUE_IDS
            pos += 4
            continue
        size = 4 * <Py_ssize_t>(w & C_MAX_OPTION_WORDS)
        if size < 8 or size > n - pos:
            _protocol_error(f"option of {size} bytes in {n - pos}", r.event_type, offset + pos)
        if otype == C_OPT_SUB_QUEUE_IDS_OLD:
            item = 4
        elif otype == C_OPT_SUB_QUEUE_INFOS:
            item = 4 * ((w >> 21) & 0xF)
            if item < 4 or (size - 4) % item:
                _protocol_error(f"SubQueueInfo items of {item} bytes", r.event_type, offset + pos)
        else:
            # MSG_GROUP_ID (2): carries no sub-queue ids; the feature is disabled anyway.
            pos += size
            continue
        count = (size - 4) // item
        ids = PyTuple_New(count)
        for i in range(count):
            v = PyLong_FromUnsignedLong(bmq_load_be32(p + pos + 4 + i * item))
            Py_INCREF(v)
            PyTuple_SET_ITEM_RAW(ids, i, <PyObject *>v)
        if otype == C_OPT_SUB_QUEUE_IDS_OLD:
            old_ids = ids
        else:
            infos = ids
        pos += size
    if infos is not None:
        return infos
    if old_ids is not None:
        return old_ids
    return DEFAULT_SUB_QUEUE_IDS


def iter_push_messages(event):
    """Every message of a PUSH event as ``(queue_id, guid, sub_queue_ids, flags,
    properties_area or None, new_style_properties, payload)``, payload decompressed.

    Accepts PushHeader HeaderWords >= 7 (no SchemaId below 8). IMPLICIT_PAYLOAD gives
    payload b"".

    Raises:
        ProtocolError: for any malformed message, option or compressed payload.
    """
    cdef Input inp
    cdef Reader r
    cdef list out = []
    cdef const unsigned char *h
    cdef Py_ssize_t start, msg_len, header_len, options_len, app_len, app_at
    cdef uint32_t w0, w1
    cdef int flags, cat, schema
    cdef tuple ids, split
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, C_EVENT_PUSH)
        if r.pos == r.end:
            _protocol_error("PUSH event without messages", r.event_type, r.pos)
        while r.pos < r.end:
            start = r.pos
            h = rd_take(&r, 8, "PushHeader")
            w0 = bmq_load_be32(h)
            w1 = bmq_load_be32(h + 4)
            flags = w0 >> 28
            msg_len = 4 * <Py_ssize_t>(w0 & C_MAX_MESSAGE_WORDS)
            options_len = 4 * <Py_ssize_t>(w1 >> 8)
            cat = (w1 >> 5) & 7
            header_len = 4 * <Py_ssize_t>(w1 & 0x1F)
            if header_len < 4 * C_PUSH_MIN_HEADER_WORDS:
                _protocol_error(f"PushHeader of {header_len} bytes", r.event_type, start + 4)
            if msg_len > r.end - start or header_len + options_len > msg_len:
                _protocol_error(f"PUSH message of {msg_len} bytes overruns the event", r.event_type, start)
            if flags & ~C_PUSH_VALID_FLAGS:
                _protocol_error(f"PUSH flags 0x{flags:x}", r.event_type, start)
            if cat > C_COMPRESSION_ZLIB:
                _protocol_error(f"unknown compression type {cat}", r.event_type, start + 7)
            schema = bmq_load_be16(h + 28) if header_len >= C_PUSH_HEADER_SIZE else 0
            ids = parse_options(&r, h + header_len, options_len, start + header_len) if options_len \
                else DEFAULT_SUB_QUEUE_IDS
            app_at = header_len + options_len
            if flags & C_PUSH_IMPLICIT_PAYLOAD:
                split = (None, b"")
            else:
                app_len = unpadded_len(&r, h + app_at, msg_len - app_at, start + app_at)
                split = split_payload(&r, h + app_at, app_len, flags, cat, schema, start + app_at)
            out.append((<int32_t>bmq_load_be32(h + 8), PyBytes_FromStringAndSize(<const char *>h + 12, 16),
                        ids, flags, split[0], schema != 0, split[1]))
            r.pos = start + msg_len
        return out
    finally:
        in_release(&inp)
