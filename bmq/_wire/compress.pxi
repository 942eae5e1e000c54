# zlib compression (§2.6) and splitting appData into properties + payload (§4.4).

import zlib as _zlib

# Decompressed output is capped like the broker does (512 MiB) so a zlib bomb in a hostile
# event ends in ProtocolError, not MemoryError.
cdef Py_ssize_t C_MAX_DECOMPRESSED = C_MAX_EVENT_SIZE


cdef bytes zlib_compress(const unsigned char *p, Py_ssize_t n):
    """zlib stream of ``p[:n]`` with the C++ SDK's parameters (level default, Z_FILTERED)."""
    cdef object c = _zlib.compressobj(-1, _zlib.DEFLATED, 15, 8, _zlib.Z_FILTERED)
    cdef object view = PyMemoryView_FromMemory(<char *>p, n, PyBUF_READ)
    return c.compress(view) + c.flush()


cdef bytes zlib_decompress(Reader *r, const unsigned char *p, Py_ssize_t n, Py_ssize_t offset):
    cdef object d = _zlib.decompressobj()
    cdef object view = PyMemoryView_FromMemory(<char *>p, n, PyBUF_READ)
    cdef bytes out
    try:
        out = d.decompress(view, C_MAX_DECOMPRESSED)
    except _zlib.error as e:
        raise ProtocolError(f"zlib: {e}", r.event_type or None, offset) from e
    if d.unconsumed_tail:
        _protocol_error(f"decompressed data exceeds {C_MAX_DECOMPRESSED} bytes", r.event_type, offset)
    if not d.eof:
        _protocol_error("truncated zlib stream", r.event_type, offset)
    return out


cdef tuple split_payload(Reader *r, const unsigned char *p, Py_ssize_t n, int flags, int compression,
                         int schema_wire_id, Py_ssize_t offset):
    """``(properties_area or None, payload)`` of appData ``p[:n]`` (§4.4)."""
    cdef bytes plain
    cdef Py_ssize_t size
    cdef bint has_props = flags & C_PUT_MESSAGE_PROPERTIES
    if compression == C_COMPRESSION_NONE:
        if not has_props:
            return None, PyBytes_FromStringAndSize(<const char *>p, n)
        size = area_size(r, p, n, offset)
        return (PyBytes_FromStringAndSize(<const char *>p, size),
                PyBytes_FromStringAndSize(<const char *>p + size, n - size))
    if compression != C_COMPRESSION_ZLIB:
        _protocol_error(f"unknown compression type {compression}", r.event_type, offset)
    if not has_props:
        return None, zlib_decompress(r, p, n, offset)
    if schema_wire_id != 0:
        # New-style properties stay in clear in front of the compressed payload.
        size = area_size(r, p, n, offset)
        return (PyBytes_FromStringAndSize(<const char *>p, size),
                zlib_decompress(r, p + size, n - size, offset + size))
    plain = zlib_decompress(r, p, n, offset)
    size = area_size(r, <const unsigned char *>PyBytes_AS_STRING(plain), len(plain), offset)
    return plain[:size], plain[size:]


def split_app_data(app_data, int flags, int compression, int schema_wire_id):
    """``(properties_area or None, payload)`` from a message's appData (§4.4).

    Decompresses as needed; flags bit 0x2 is MESSAGE_PROPERTIES for both PUT and PUSH.

    Raises:
        ProtocolError: bad properties header, unknown compression, corrupt zlib data.
    """
    cdef Input inp
    cdef Reader r
    in_acquire(&inp, app_data)
    try:
        r.base = inp.data
        r.pos = 0
        r.end = inp.size
        r.event_type = 0
        return split_payload(&r, inp.data, inp.size, flags, compression, schema_wire_id, 0)
    finally:
        in_release(&inp)
