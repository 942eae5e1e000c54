# Bulk producers' helpers: payloads out of Arrow-layout buffers and GUIDs derived by the
# thousand, each in one call (the Spark sink posts columns, not Python objects).


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: a bijection of the 64-bit integers (each step is invertible), so
    # distinct indexes give distinct words, spread over all bits.
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL
    return x ^ (x >> 31)


def derived_guids(key, Py_ssize_t first, Py_ssize_t count):
    """The GUIDs of positions ``first .. first + count - 1`` under ``key``, concatenated.

    Position ``i``'s GUID depends only on ``(key, i)``: the first 8 bytes are those of
    :func:`deterministic_guid` of ``key``; the last 8 are a bijection of the second half of that
    digest plus ``i``. So within one key every position has its own GUID, and a retried
    producer reproduces them without hashing anything per message.

    Raises:
        ValueError: a negative ``first`` or ``count``.
    """
    cdef bytes base = deterministic_guid(key)
    cdef bytes out
    cdef unsigned char *p
    cdef const unsigned char *b = <const unsigned char *>PyBytes_AS_STRING(base)
    cdef uint64_t low = bmq_load_be64(b + 8)
    cdef Py_ssize_t i
    if first < 0 or count < 0:
        raise ValueError(f"negative first ({first}) or count ({count})")
    out = new_bytes(C_GUID_SIZE * count)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    with nogil:
        for i in range(count):
            memcpy(p, b, 8)
            bmq_store_be64(p + 8, mix64(low + <uint64_t>(first + i)))
            p += C_GUID_SIZE
    return out


def binary_values(offsets, data, Py_ssize_t first, Py_ssize_t count, int offset_size=4):
    """Values ``first .. first + count - 1`` of an Arrow binary/string column, as bytes.

    Args:
        offsets: the column's offsets buffer (native-endian int32, or int64 with
            ``offset_size`` 8), ``first + count + 1`` of them at least.
        data: the column's data buffer.
        first: the array's offset into the buffers (``Array.offset``).
        count: the number of values.

    Raises:
        ValueError: buffers too short for ``count`` values, or offsets out of order or
            beyond ``data``.
    """
    cdef Input off_in, data_in
    cdef Py_ssize_t i, start, end
    cdef const int32_t *ends32 = NULL
    cdef const int64_t *ends64 = NULL
    cdef list out
    if offset_size != 4 and offset_size != 8:
        raise ValueError(f"offset_size is 4 or 8, not {offset_size}")
    if first < 0 or count < 0:
        raise ValueError(f"negative first ({first}) or count ({count})")
    in_acquire(&off_in, offsets)
    try:
        in_acquire(&data_in, data)
        try:
            if off_in.size < (first + count + 1) * offset_size:
                raise ValueError(f"{off_in.size} bytes of offsets for {count} values from {first}")
            if offset_size == 4:
                ends32 = <const int32_t *>off_in.data + first
            else:
                ends64 = <const int64_t *>off_in.data + first
            out = PyList_New(count)
            start = ends32[0] if ends32 != NULL else ends64[0]
            for i in range(count):
                end = ends32[i + 1] if ends32 != NULL else ends64[i + 1]
                if start < 0 or end < start or end > data_in.size:
                    raise ValueError(f"value {i}: offsets {start}..{end} outside 0..{data_in.size}")
                v = PyBytes_FromStringAndSize(<const char *>data_in.data + start, end - start)
                Py_INCREF(v)
                PyList_SET_ITEM_RAW(out, i, <PyObject *>v)
                start = end
            return out
        finally:
            in_release(&data_in)
    finally:
        in_release(&off_in)
