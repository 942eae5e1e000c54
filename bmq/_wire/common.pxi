# Shared C helpers, constants and input handling for every part of the codec.

cdef extern from "bmq_endian.h" nogil:
    uint16_t bmq_load_be16(const unsigned char *p)
    uint32_t bmq_load_be32(const unsigned char *p)
    uint64_t bmq_load_be64(const unsigned char *p)
    void bmq_store_be16(unsigned char *p, uint16_t v)
    void bmq_store_be32(unsigned char *p, uint32_t v)
    void bmq_store_be64(unsigned char *p, uint64_t v)

cdef extern from "Python.h":
    # Declared here with a borrowed-reference-free signature so hot loops fill tuples and
    # lists without Cython's reference juggling; callers INCREF what they store.
    void PyTuple_SET_ITEM_RAW "PyTuple_SET_ITEM" (object t, Py_ssize_t i, PyObject *o)
    void PyList_SET_ITEM_RAW "PyList_SET_ITEM" (object l, Py_ssize_t i, PyObject *o)
    object PyBytes_FromStringAndSize_NULL "PyBytes_FromStringAndSize" (char *s, Py_ssize_t n)
    PyObject **PySequence_Fast_ITEMS(object seq)
    object PyList_AsTuple(object l)
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ
    void PyObject_GC_UnTrack(object o)

from bmq.exceptions import MessageTooLargeError, PropertyError, ProtocolError

EVENT_CONTROL = 1
EVENT_PUT = 2
EVENT_CONFIRM = 3
EVENT_PUSH = 4
EVENT_ACK = 5
EVENT_HEARTBEAT_REQ = 11
EVENT_HEARTBEAT_RSP = 12
EVENT_AUTHENTICATION = 15

ENCODING_BER = 0
ENCODING_JSON = 1

PUT_ACK_REQUESTED = 1
PUT_MESSAGE_PROPERTIES = 2
PUSH_IMPLICIT_PAYLOAD = 1
PUSH_MESSAGE_PROPERTIES = 2
PUSH_OUT_OF_ORDER = 4

COMPRESSION_NONE = 0
COMPRESSION_ZLIB = 1
COMPRESSION_THRESHOLD = 1024

PROPERTY_BOOL = 1
PROPERTY_CHAR = 2
PROPERTY_SHORT = 3
PROPERTY_INT32 = 4
PROPERTY_INT64 = 5
PROPERTY_STRING = 6
PROPERTY_BINARY = 7

MAX_PAYLOAD_SIZE = 64 * 1024 * 1024
MAX_PUT_EVENT_SIZE = 66 * 1024 * 1024
MAX_EVENT_SIZE = 512 * 1024 * 1024
MAX_PROPERTIES = 255
MAX_PROPERTY_NAME_LENGTH = 4095
MAX_PROPERTY_VALUE_LENGTH = 67104745


cdef enum:
    C_PUT_ACK_REQUESTED = 1
    C_PUT_MESSAGE_PROPERTIES = 2
    C_PUSH_IMPLICIT_PAYLOAD = 1
    C_COMPRESSION_NONE = 0
    C_COMPRESSION_ZLIB = 1
    C_COMPRESSION_THRESHOLD = 1024
    C_PROPERTY_BOOL = 1
    C_PROPERTY_CHAR = 2
    C_PROPERTY_SHORT = 3
    C_PROPERTY_INT32 = 4
    C_PROPERTY_INT64 = 5
    C_PROPERTY_STRING = 6
    C_PROPERTY_BINARY = 7

cdef enum:
    C_EVENT_CONTROL = 1
    C_EVENT_PUT = 2
    C_EVENT_CONFIRM = 3
    C_EVENT_PUSH = 4
    C_EVENT_ACK = 5
    C_EVENT_HEARTBEAT_REQ = 11
    C_EVENT_HEARTBEAT_RSP = 12
    C_EVENT_AUTHENTICATION = 15
    C_EVENT_HEADER_SIZE = 8
    C_MAX_PAYLOAD_SIZE = 64 * 1024 * 1024
    C_MAX_PUT_EVENT_SIZE = 66 * 1024 * 1024
    C_MAX_EVENT_SIZE = 512 * 1024 * 1024
    C_MAX_MESSAGE_WORDS = 0x0FFFFFFF
    C_PROTOCOL_VERSION = 1

# Largest value the 31-bit event length can hold (protocol §1.2).
cdef int64_t C_MAX_EVENT_LENGTH = 0x7FFFFFFF


cdef struct Reader:
    # A window over caller-owned bytes; `pos` only moves forward through rd_take().
    const unsigned char *base
    Py_ssize_t end
    Py_ssize_t pos
    int event_type


cdef inline const unsigned char *rd_take(Reader *r, Py_ssize_t n, const char *what) except NULL:
    """``n`` bytes at the cursor, advancing it; ProtocolError if fewer remain."""
    cdef const unsigned char *p
    if n < 0 or r.end - r.pos < n:
        _raise_truncated(r, n, what)
    p = r.base + r.pos
    r.pos += n
    return p


cdef int _raise_truncated(Reader *r, Py_ssize_t n, const char *what) except -1:
    raise ProtocolError(
        f"{what.decode()}: need {n} bytes, {r.end - r.pos} left", r.event_type, r.pos
    )


cdef inline int _protocol_error(str message, int event_type, Py_ssize_t offset) except -1:
    raise ProtocolError(message, event_type if event_type else None, offset)


cdef struct Input:
    # A caller buffer: bytes are read in place, anything else through the buffer protocol
    # (the view is released by in_release).
    const unsigned char *data
    Py_ssize_t size
    Py_buffer view
    bint has_view


cdef inline int in_acquire(Input *inp, object obj) except -1:
    if PyBytes_Check(obj):
        inp.data = <const unsigned char *>PyBytes_AS_STRING(obj)
        inp.size = PyBytes_GET_SIZE(obj)
        inp.has_view = False
        return 0
    PyObject_GetBuffer(obj, &inp.view, PyBUF_SIMPLE)
    inp.has_view = True
    inp.data = <const unsigned char *>inp.view.buf
    inp.size = inp.view.len
    return 0


cdef inline void in_release(Input *inp):
    if inp.has_view:
        inp.has_view = False
        PyBuffer_Release(&inp.view)


cdef inline Py_ssize_t pad_len(Py_ssize_t unpadded) noexcept nogil:
    return 4 - (unpadded & 3)


cdef inline void write_padding(unsigned char *p, Py_ssize_t unpadded) noexcept nogil:
    cdef Py_ssize_t n = pad_len(unpadded)
    memset(p + unpadded, <int>n, n)


cdef inline Py_ssize_t unpadded_len(Reader *r, const unsigned char *p, Py_ssize_t padded, Py_ssize_t offset) except -1:
    """Length of ``padded`` bytes at ``p`` once the §1.4 padding is stripped."""
    cdef unsigned char n
    if padded <= 0:
        _protocol_error("empty padded area", r.event_type, offset)
    n = p[padded - 1]
    if n < 1 or n > 4 or n > padded:
        _protocol_error(f"bad padding byte {n}", r.event_type, offset + padded - 1)
    return padded - n


cdef inline object fast_items(object seq, const char *message):
    """``seq`` as a tuple or a private list, for PySequence_Fast_ITEMS: a caller's list is
    copied to a tuple (atomically: PyList_AsTuple holds the list's lock on a free-threaded
    build), so another thread changing it meanwhile cannot free an item read in place. The
    interpreter lock no longer rules that out, and neither did it where building calls Python
    (``bytes(x)``, zlib, which let it go)."""
    if isinstance(seq, list):  # subclasses too: PySequence_Fast would return them as they are
        return PyList_AsTuple(seq)
    return PySequence_Fast(seq, message)


cdef inline bytes new_bytes(Py_ssize_t n):
    """An uninitialised bytes object of ``n`` bytes, to be filled before anyone sees it."""
    return PyBytes_FromStringAndSize_NULL(NULL, n)


cdef inline int64_t as_uint32_or_int32(object value, str what) except -1:
    """``value`` as a 32-bit wire word: signed or unsigned 32-bit ints are both accepted."""
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not -0x80000000 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{what} {value} does not fit in 32 bits")
    return <int64_t>value & 0xFFFFFFFF


cdef inline bytes guid_bytes(object guid):
    if not PyBytes_Check(guid):
        guid = bytes(guid)
    if PyBytes_GET_SIZE(guid) != 16:
        raise ValueError(f"a GUID is 16 bytes, got {len(guid)}")
    return guid
