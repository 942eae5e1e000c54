# CRC-32C entry points (the C engines are in bmq_crc32c.h) and the padding rule.

cdef extern from "bmq_crc32c.h" nogil:
    void bmq_crc32c_init()
    uint32_t bmq_crc32c(uint32_t crc, const void *data, size_t n)
    uint32_t bmq_crc32c_ex(uint32_t crc, const void *data, size_t n, int force_sw)
    int bmq_crc32c_have_hw

bmq_crc32c_init()

# Below this size releasing and re-taking the GIL costs more than the CRC itself.
cdef Py_ssize_t NOGIL_THRESHOLD = 64 * 1024


cdef uint32_t crc_of(const unsigned char *p, Py_ssize_t n, uint32_t crc=0, int force_sw=0):
    if n >= NOGIL_THRESHOLD:
        with nogil:
            return bmq_crc32c_ex(crc, p, <size_t>n, force_sw)
    return bmq_crc32c_ex(crc, p, <size_t>n, force_sw)


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc`` (§2.5)."""
    cdef Input inp
    cdef uint32_t c = crc
    in_acquire(&inp, data)
    try:
        return crc_of(inp.data, inp.size, c)
    finally:
        in_release(&inp)


def _crc32c_portable(data, crc=0):
    """CRC-32C by the table-driven fallback engine only (lets tests cross-check it)."""
    cdef Input inp
    cdef uint32_t c = crc
    in_acquire(&inp, data)
    try:
        return crc_of(inp.data, inp.size, c, 1)
    finally:
        in_release(&inp)


def _crc32c_hardware():
    """Whether the SSE4.2 engine is in use on this CPU."""
    return bool(bmq_crc32c_have_hw)


def padding_length(Py_ssize_t unpadded):
    """Bytes of padding (1..4, each holding this count) after ``unpadded`` bytes (§1.4)."""
    if unpadded < 0:
        raise ValueError(f"negative length {unpadded}")
    return pad_len(unpadded)
