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


cdef class PayloadColumn:
    """The values of an Arrow binary/string column, read in place: the payloads of one
    ``post_many`` with no Python object per value.

    A sequence of ``bytes`` (indexing or slicing copies out what is asked for: a retransmission
    or an error message); :func:`build_put_events` copies each value once, from the column's
    data buffer straight into the PUT event. It holds the buffers (views of them) until it is
    dropped, which a post does once every message is acknowledged. Arrow buffers are
    immutable; a writable one is copied first, so that a re-send sends what was posted.

    Args:
        offsets: the column's offsets buffer (native-endian int32, or int64 with
            ``offset_size`` 8), ``first + count + 1`` of them at least.
        data: the column's data buffer.
        first: the array's offset into the buffers (``Array.offset``).
        count: the number of values.

    Attributes:
        nbytes: bytes of all the values together.
        first_empty: the index of the first empty value (-1: none is empty).

    Raises:
        ValueError: buffers too short for ``count`` values, offsets out of order or
            beyond ``data``, or an ``offset_size`` other than 4 and 8.

    Thread-safety: immutable once made.
    """

    cdef object _offsets_obj, _data_obj
    cdef Input _off, _data
    cdef bint _acquired_off, _acquired_data
    cdef const int32_t *_ends32
    cdef const int64_t *_ends64
    cdef Py_ssize_t _first, _count
    cdef int _offset_size
    cdef readonly Py_ssize_t nbytes, first_empty

    def __cinit__(self, offsets, data, Py_ssize_t first, Py_ssize_t count, int offset_size=4):
        cdef Py_ssize_t i, start, end, available
        if offset_size != 4 and offset_size != 8:
            raise ValueError(f"offset_size is 4 or 8, not {offset_size}")
        if first < 0 or count < 0:
            raise ValueError(f"negative first ({first}) or count ({count})")
        self._offsets_obj = _frozen(offsets)
        self._data_obj = _frozen(data)
        in_acquire(&self._off, self._offsets_obj)
        self._acquired_off = True
        in_acquire(&self._data, self._data_obj)
        self._acquired_data = True
        available = self._off.size // offset_size  # offsets the buffer holds
        if first >= available or count > available - 1 - first:
            raise ValueError(f"{self._off.size} bytes of offsets for {count} values from {first}")
        if offset_size == 4:
            self._ends32 = <const int32_t *>self._off.data + first
        else:
            self._ends64 = <const int64_t *>self._off.data + first
        self._first, self._count, self._offset_size = first, count, offset_size
        self.first_empty = -1
        start = self._end(0)
        for i in range(count):
            end = self._end(i + 1)
            if start < 0 or end < start or end > self._data.size:
                raise ValueError(f"value {i}: offsets {start}..{end} outside 0..{self._data.size}")
            if end == start and self.first_empty < 0:
                self.first_empty = i
            start = end
        self.nbytes = self._end(count) - self._end(0)

    def __dealloc__(self):
        if self._acquired_data:
            in_release(&self._data)
        if self._acquired_off:
            in_release(&self._off)

    cdef inline Py_ssize_t _end(self, Py_ssize_t i) noexcept nogil:
        return self._ends32[i] if self._ends32 != NULL else <Py_ssize_t>self._ends64[i]

    cdef inline const unsigned char *_value(self, Py_ssize_t i, Py_ssize_t *size) noexcept nogil:
        cdef Py_ssize_t start = self._end(i)
        size[0] = self._end(i + 1) - start
        return self._data.data + start

    def __len__(self):
        return self._count

    def __getitem__(self, index):
        cdef Py_ssize_t i, size
        cdef const unsigned char *p
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                raise ValueError("a PayloadColumn slice takes no step")
            return PayloadColumn(self._offsets_obj, self._data_obj, self._first + start,
                                 max(0, stop - start), self._offset_size)
        i = index
        if i < 0:
            i += self._count
        if i < 0 or i >= self._count:
            raise IndexError(f"value {index} of {self._count}")
        p = self._value(i, &size)
        return PyBytes_FromStringAndSize(<const char *>p, size)

    def nbytes_of(self, Py_ssize_t first, Py_ssize_t count):
        """Bytes of values ``first .. first + count - 1``.

        Raises:
            IndexError: not values of this column.
        """
        if first < 0 or count < 0 or first > self._count or count > self._count - first:
            raise IndexError(f"values {first}..{first + count - 1} of {self._count}")
        return self._end(first + count) - self._end(first)


cdef object _frozen(object buffer):
    """``buffer``, or a copy of it if it is writable (a value must not change once posted)."""
    cdef Py_buffer view
    if PyBytes_Check(buffer):
        return buffer
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        return buffer if view.readonly else PyBytes_FromStringAndSize(<const char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
