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
    cdef object seq = fast_items(messages, "messages must be a sequence")
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


cdef struct PushView:
    # One PUSH message whose header was checked by read_push (offsets into the event).
    const unsigned char *h
    Py_ssize_t start
    Py_ssize_t app_at
    Py_ssize_t app_len  # unpadded appData length (0 with IMPLICIT_PAYLOAD)
    int flags
    int cat
    int schema


cdef tuple read_push(Reader *r, PushView *m):
    """Check the PUSH message at the cursor, fill ``m``, move past it; its sub-queue ids."""
    cdef Py_ssize_t msg_len, header_len, options_len
    cdef uint32_t w0, w1
    cdef tuple ids
    m.start = r.pos
    m.h = rd_take(r, 8, "PushHeader")
    w0 = bmq_load_be32(m.h)
    w1 = bmq_load_be32(m.h + 4)
    m.flags = w0 >> 28
    msg_len = 4 * <Py_ssize_t>(w0 & C_MAX_MESSAGE_WORDS)
    options_len = 4 * <Py_ssize_t>(w1 >> 8)
    m.cat = (w1 >> 5) & 7
    header_len = 4 * <Py_ssize_t>(w1 & 0x1F)
    if header_len < 4 * C_PUSH_MIN_HEADER_WORDS:
        _protocol_error(f"PushHeader of {header_len} bytes", r.event_type, m.start + 4)
    if msg_len > r.end - m.start or header_len + options_len > msg_len:
        _protocol_error(f"PUSH message of {msg_len} bytes overruns the event", r.event_type, m.start)
    if m.flags & ~C_PUSH_VALID_FLAGS:
        _protocol_error(f"PUSH flags 0x{m.flags:x}", r.event_type, m.start)
    if m.cat > C_COMPRESSION_ZLIB:
        _protocol_error(f"unknown compression type {m.cat}", r.event_type, m.start + 7)
    m.schema = bmq_load_be16(m.h + 28) if header_len >= C_PUSH_HEADER_SIZE else 0
    ids = parse_options(r, m.h + header_len, options_len, m.start + header_len) if options_len \
        else DEFAULT_SUB_QUEUE_IDS
    m.app_at = header_len + options_len
    if m.flags & C_PUSH_IMPLICIT_PAYLOAD:
        m.app_len = 0
    else:
        m.app_len = unpadded_len(r, m.h + m.app_at, msg_len - m.app_at, m.start + m.app_at)
    r.pos = m.start + msg_len
    return ids


cdef inline tuple push_split(Reader *r, PushView *m):
    """``(properties_area or None, payload)`` of a message read by read_push."""
    if m.flags & C_PUSH_IMPLICIT_PAYLOAD:
        return (None, b"")
    return split_payload(r, m.h + m.app_at, m.app_len, m.flags, m.cat, m.schema, m.start + m.app_at)


def iter_push_messages(event, list undecodable=None):
    """Every message of a PUSH event as ``(queue_id, guid, sub_queue_ids, flags,
    properties_area or None, new_style_properties, payload)``, payload decompressed.

    Accepts PushHeader HeaderWords >= 7 (no SchemaId below 8). IMPLICIT_PAYLOAD gives
    payload b"".

    ``undecodable``: a list, to have a message whose framing is sound but whose content is not
    (a payload that does not decompress, properties that do not parse) appended to it as
    ``(guid, ProtocolError)`` and skipped, rather than the whole event refused: the broker
    delivers such a message again and again, and the others of its event must still arrive.

    Raises:
        ProtocolError: for any malformed message or option, or compressed payload (unless
            ``undecodable`` is given).
    """
    cdef Input inp
    cdef Reader r
    cdef PushView m
    cdef list out = []
    cdef tuple ids, split
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, C_EVENT_PUSH)
        if r.pos == r.end:
            _protocol_error("PUSH event without messages", r.event_type, r.pos)
        while r.pos < r.end:
            ids = read_push(&r, &m)  # the framing: r is at the next message from here on
            try:
                split = push_split(&r, &m)
            except ProtocolError as exc:
                if undecodable is None:
                    raise
                undecodable.append((PyBytes_FromStringAndSize(<const char *>m.h + 12, 16), exc))
                continue
            out.append((<int32_t>bmq_load_be32(m.h + 8), PyBytes_FromStringAndSize(<const char *>m.h + 12, 16),
                        ids, m.flags, split[0], m.schema != 0, split[1]))
        return out
    finally:
        in_release(&inp)


cdef struct ColumnBuffer:
    # A growing malloc'd byte buffer (payloads, GUIDs or offsets of a PUSH event).
    unsigned char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int cb_append(ColumnBuffer *b, const void *p, Py_ssize_t n) except -1:
    cdef Py_ssize_t capacity
    cdef unsigned char *grown
    if b.size + n > b.capacity:
        capacity = max(2 * b.capacity, b.size + n, 256)
        grown = <unsigned char *>realloc(b.data, capacity)
        if grown == NULL:
            raise MemoryError()
        b.data, b.capacity = grown, capacity
    if n:
        memcpy(b.data + b.size, p, n)
    b.size += n
    return 0


cdef tuple close_run(int32_t queue_id, tuple ids, ColumnBuffer *guids, ColumnBuffer *payloads,
                     ColumnBuffer *ends, Py_ssize_t first, Py_ssize_t last, dict areas):
    """The run of messages ``first..last-1`` of the event's columns, offsets rebased to 0."""
    cdef Py_ssize_t count = last - first, i
    cdef const int32_t *src = <const int32_t *>ends.data
    cdef int32_t base = src[first]
    cdef bytes offsets = new_bytes(4 * (count + 1))
    cdef int32_t *dst = <int32_t *>PyBytes_AS_STRING(offsets)
    for i in range(count + 1):
        dst[i] = src[first + i] - base
    return (queue_id, ids, count,
            PyBytes_FromStringAndSize(<const char *>guids.data + 16 * first, 16 * count),
            PyBytes_FromStringAndSize(<const char *>payloads.data + base, src[last] - base),
            offsets, areas)


def push_columns(event):
    """The messages of a PUSH event column by column, in runs of consecutive messages for
    the same queue id and sub-queue ids: ``(queue_id, sub_queue_ids, count, guids,
    payloads, offsets, areas)`` per run.

    ``guids`` holds the 16-byte GUIDs back to back; ``payloads`` the payloads back to back
    (decompressed), message ``i``'s at ``payloads[offsets[i]:offsets[i + 1]]``, with
    ``offsets`` native-endian int32 (``count + 1`` of them, from 0: an Arrow binary column's
    offsets); ``areas`` maps the index of each message with properties to
    ``(properties_area, new_style_properties)``, and is None when none has any. The same
    checks as :func:`iter_push_messages`.

    Raises:
        ProtocolError: for any malformed message, option or compressed payload.
        ValueError: an event whose payloads total 2 GiB or more.
    """
    cdef Input inp
    cdef Reader r
    cdef PushView m
    cdef ColumnBuffer guids, payloads, ends
    cdef list out = []
    cdef tuple ids, split, run_ids = None
    cdef dict areas = None
    cdef int32_t queue_id, run_queue_id = 0
    cdef Py_ssize_t index = 0, run_first = 0
    cdef int32_t end = 0
    cdef bytes payload
    memset(&guids, 0, sizeof(ColumnBuffer))
    memset(&payloads, 0, sizeof(ColumnBuffer))
    memset(&ends, 0, sizeof(ColumnBuffer))
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, C_EVENT_PUSH)
        if r.pos == r.end:
            _protocol_error("PUSH event without messages", r.event_type, r.pos)
        cb_append(&ends, &end, 4)
        while r.pos < r.end:
            ids = read_push(&r, &m)
            queue_id = <int32_t>bmq_load_be32(m.h + 8)
            if run_ids is not None and (queue_id != run_queue_id or (ids is not run_ids and ids != run_ids)):
                out.append(close_run(run_queue_id, run_ids, &guids, &payloads, &ends, run_first, index, areas))
                run_first, areas = index, None
            run_queue_id, run_ids = queue_id, ids
            cb_append(&guids, m.h + 12, 16)
            if m.cat == C_COMPRESSION_NONE and not (m.flags & (C_PUT_MESSAGE_PROPERTIES | C_PUSH_IMPLICIT_PAYLOAD)):
                cb_append(&payloads, m.h + m.app_at, m.app_len)  # the common case: copied in place
            else:
                split = push_split(&r, &m)
                if split[0] is not None:
                    if areas is None:
                        areas = {}
                    areas[index - run_first] = (split[0], m.schema != 0)
                payload = split[1]
                cb_append(&payloads, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))
            if payloads.size > 0x7FFFFFFF:
                raise ValueError("PUSH event whose payloads exceed 2 GiB")
            end = <int32_t>payloads.size
            cb_append(&ends, &end, 4)
            index += 1
        out.append(close_run(run_queue_id, run_ids, &guids, &payloads, &ends, run_first, index, areas))
        return out
    finally:
        in_release(&inp)
        free(guids.data)
        free(payloads.data)
        free(ends.data)


def join_offsets(parts):
    """Payload offsets (native int32, see :func:`push_columns`) of several runs put end to
    end: each part is a buffer of ``count + 1`` offsets from any base; the result starts at 0.

    Raises:
        ValueError: an empty part, a part not made of int32, offsets past 2 GiB.
    """
    cdef object seq = fast_items(parts, "parts must be a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i, j, count, total = 1, left
    cdef Input inp
    cdef const int32_t *src
    cdef int32_t *dst
    cdef int64_t base = 0, last = 0
    cdef bytes out
    for i in range(n):
        size = memoryview(<object>PySequence_Fast_ITEMS(seq)[i]).nbytes
        if size < 4 or size % 4:
            raise ValueError(f"offsets part {i} of {size} bytes: need 1 or more int32")
        total += size // 4 - 1
    out = new_bytes(4 * total)
    dst = <int32_t *>PyBytes_AS_STRING(out)
    dst[0] = 0
    dst += 1
    left = total - 1
    for i in range(n):
        in_acquire(&inp, <object>PySequence_Fast_ITEMS(seq)[i])
        try:
            src = <const int32_t *>inp.data
            count = inp.size // 4 - 1
            if count > left:  # resized by another thread since it was measured
                raise RuntimeError(f"offsets part {i} changed size while being joined")
            left -= count
            for j in range(count):
                last = base + src[j + 1] - src[0]
                if last > 0x7FFFFFFF:
                    raise ValueError("joined payloads exceed 2 GiB")
                dst[j] = <int32_t>last
            if count:
                base = last
            dst += count
        finally:
            in_release(&inp)
    if left:
        raise RuntimeError("an offsets part changed size while being joined")
    return out
