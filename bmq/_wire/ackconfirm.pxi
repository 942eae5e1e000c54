# ACK (§3) and CONFIRM (§5) events: a one-word header + fixed-size records, no padding.

cdef enum:
    C_RECORD_SIZE = 24
    C_ACK_CONFIRM_HEADER = 0x16   # HeaderWords 1, PerMessageWords 6


cdef bytes new_record_event(int event_type, Py_ssize_t count, unsigned char **records):
    """An ACK/CONFIRM event for ``count`` records; ``records`` receives where they go."""
    cdef Py_ssize_t total = C_EVENT_HEADER_SIZE + 4 + C_RECORD_SIZE * count
    cdef bytes out
    cdef unsigned char *p
    if count == 0:
        raise ValueError("an ACK/CONFIRM event needs at least one record")
    if total > C_MAX_EVENT_LENGTH:
        raise MessageTooLargeError(f"{count} records do not fit in one event")
    out = new_bytes(total)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    write_event_header(p, event_type, total, 0)
    bmq_store_be32(p + C_EVENT_HEADER_SIZE, <uint32_t>C_ACK_CONFIRM_HEADER << 24)
    records[0] = p + C_EVENT_HEADER_SIZE + 4
    return out


cdef Py_ssize_t open_records(Reader *r, const unsigned char *data, Py_ssize_t size, int event_type,
                             Py_ssize_t *stride) except -1:
    """Validate an ACK/CONFIRM event; return its record count, ``r.pos`` at the first one."""
    cdef const unsigned char *h
    cdef Py_ssize_t header_len, body
    open_event(r, data, size, event_type)
    h = rd_take(r, 4, "ACK/CONFIRM header")
    header_len = 4 * (h[0] >> 4)
    stride[0] = 4 * (h[0] & 0xF)
    if header_len < 4 or stride[0] < C_RECORD_SIZE:
        _protocol_error(f"header of {header_len} bytes, records of {stride[0]}", r.event_type, r.pos - 4)
    r.pos += header_len - 4
    body = r.end - r.pos
    if body < 0 or body % stride[0]:
        _protocol_error(f"{body} bytes is not a whole number of {stride[0]}-byte records",
                        r.event_type, r.pos)
    return body // stride[0]


def build_ack_event(acks):
    """An ACK event for ``(status, correlation_id, guid, queue_id)`` tuples (§3).

    Raises:
        ValueError: no acks, status outside 0..15, correlation id outside 24 bits, bad GUID.
    """
    cdef object seq = fast_items(acks, "acks must be a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i
    cdef unsigned char *p
    cdef bytes out = new_record_event(C_EVENT_ACK, n, &p)
    for i in range(n):
        status, correlation_id, guid, queue_id = <object>PySequence_Fast_ITEMS(seq)[i]
        if not 0 <= status <= 15:
            raise ValueError(f"ack {i}: status {status} outside 0..15")
        if not 0 <= correlation_id <= 0xFFFFFF:
            raise ValueError(f"ack {i}: correlation id {correlation_id} outside 24 bits")
        bmq_store_be32(p, (<uint32_t>status << 24) | <uint32_t>correlation_id)
        memcpy(p + 4, PyBytes_AS_STRING(guid_bytes(guid)), 16)
        bmq_store_be32(p + 20, <uint32_t>as_uint32_or_int32(queue_id, "queue id"))
        p += C_RECORD_SIZE
    return out


def iter_acks(event):
    """``(status, correlation_id, guid, queue_id)`` of every record of an ACK event.

    Honours AckHeader HeaderWords / PerMessageWords (both may grow).

    Raises:
        ProtocolError: bad header or a partial record.
    """
    cdef Input inp
    cdef Reader r
    cdef Py_ssize_t n, i, stride
    cdef const unsigned char *p
    cdef list out
    in_acquire(&inp, event)
    try:
        n = open_records(&r, inp.data, inp.size, C_EVENT_ACK, &stride)
        out = PyList_New(n)
        p = inp.data + r.pos
        for i in range(n):
            v = ((p[0] & 0xF), bmq_load_be32(p) & 0xFFFFFF,
                 PyBytes_FromStringAndSize(<const char *>p + 4, 16), <int32_t>bmq_load_be32(p + 20))
            Py_INCREF(v)
            PyList_SET_ITEM_RAW(out, i, <PyObject *>v)
            p += stride
        return out
    finally:
        in_release(&inp)


cdef extern from "Python.h":
    object PyType_GenericAlloc(type cls, Py_ssize_t items)


def make_acks(type ack_type, tuple status_by_wire, list guids, list statuses, queue_uri):
    """``ack_type((status_by_wire[statuses[i]], guids[i], queue_uri))`` for every i: the Acks
    of a run of ACK records, made without a Python call per record.

    ``ack_type`` must be a tuple subclass with three fields and no ``__new__`` logic that
    matters (a NamedTuple). The Acks are left out of the garbage collector's tracking, as
    CPython does for a tuple of atomic values: what they hold (a status, bytes, a str) cannot
    refer back to them. Tracked, a post_many's Acks, alive until it returns, reach the oldest
    generation and set off full collections: a quarter of a posting process's CPU (post_many
    of 1 KiB payloads: 1.54 -> 1.16 µs per message).

    Raises:
        ValueError: ``guids`` and ``statuses`` differ in length, or a status has no entry.
    """
    cdef Py_ssize_t n = len(guids), i, wire, known = len(status_by_wire)
    cdef list out
    cdef object status
    if not issubclass(ack_type, tuple):
        raise TypeError("ack_type must be a tuple subclass")
    if len(statuses) != n:
        raise ValueError(f"{n} GUIDs but {len(statuses)} statuses")
    out = []
    for i in range(n):
        wire = statuses[i]
        if not 0 <= wire < known:
            raise ValueError(f"ACK status {wire} has no entry")
        status = status_by_wire[wire]
        ack = PyType_GenericAlloc(ack_type, 3)
        Py_INCREF(status)
        PyTuple_SET_ITEM_RAW(ack, 0, <PyObject *>status)
        guid = guids[i]
        Py_INCREF(guid)
        PyTuple_SET_ITEM_RAW(ack, 1, <PyObject *>guid)
        Py_INCREF(queue_uri)
        PyTuple_SET_ITEM_RAW(ack, 2, <PyObject *>queue_uri)
        PyObject_GC_UnTrack(ack)
        out.append(ack)
    return out


def build_confirm_event(confirms):
    """A CONFIRM event for ``(queue_id, guid, sub_queue_id)`` tuples (§5).

    Raises:
        ValueError: no confirms, ids outside 32 bits, bad GUID.
    """
    cdef object seq = fast_items(confirms, "confirms must be a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i
    cdef unsigned char *p
    cdef bytes out = new_record_event(C_EVENT_CONFIRM, n, &p)
    for i in range(n):
        queue_id, guid, sub_queue_id = <object>PySequence_Fast_ITEMS(seq)[i]
        bmq_store_be32(p, <uint32_t>as_uint32_or_int32(queue_id, "queue id"))
        memcpy(p + 4, PyBytes_AS_STRING(guid_bytes(guid)), 16)
        bmq_store_be32(p + 20, <uint32_t>as_uint32_or_int32(sub_queue_id, "sub-queue id"))
        p += C_RECORD_SIZE
    return out


def build_confirm_run(int64_t queue_id, guids, int64_t sub_queue_id):
    """A CONFIRM event for every 16-byte GUID in ``guids`` (back to back), all of one queue
    id and sub-queue id (§5): a batch of received messages confirmed without a tuple each.

    Raises:
        ValueError: ``guids`` empty or not a multiple of 16 bytes, ids outside 32 bits.
    """
    cdef Input inp
    cdef Py_ssize_t n, i
    cdef unsigned char *p
    cdef bytes out
    cdef uint32_t qid = <uint32_t>as_uint32_or_int32(queue_id, "queue id")
    cdef uint32_t sid = <uint32_t>as_uint32_or_int32(sub_queue_id, "sub-queue id")
    in_acquire(&inp, guids)
    try:
        if inp.size == 0 or inp.size % 16:
            raise ValueError(f"guids of {inp.size} bytes: need a positive multiple of 16")
        n = inp.size // 16
        out = new_record_event(C_EVENT_CONFIRM, n, &p)
        for i in range(n):
            bmq_store_be32(p, qid)
            memcpy(p + 4, inp.data + 16 * i, 16)
            bmq_store_be32(p + 20, sid)
            p += C_RECORD_SIZE
        return out
    finally:
        in_release(&inp)


def iter_confirms(event):
    """``(queue_id, guid, sub_queue_id)`` of every record of a CONFIRM event.

    Raises:
        ProtocolError: bad header or a partial record.
    """
    cdef Input inp
    cdef Reader r
    cdef Py_ssize_t n, i, stride
    cdef const unsigned char *p
    cdef list out
    in_acquire(&inp, event)
    try:
        n = open_records(&r, inp.data, inp.size, C_EVENT_CONFIRM, &stride)
        out = PyList_New(n)
        p = inp.data + r.pos
        for i in range(n):
            v = (<int32_t>bmq_load_be32(p), PyBytes_FromStringAndSize(<const char *>p + 4, 16),
                 <int32_t>bmq_load_be32(p + 20))
            Py_INCREF(v)
            PyList_SET_ITEM_RAW(out, i, <PyObject *>v)
            p += stride
        return out
    finally:
        in_release(&inp)
