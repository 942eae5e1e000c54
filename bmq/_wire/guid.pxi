# MessageGUID generation (§7) and textual forms.

import hashlib as _hashlib
import os as _os
import socket as _socket
import threading as _threading
import time as _time

cdef extern from "bmq_guid.h" nogil:
    uint32_t bmq_counter_reserve(uint32_t *counter, uint32_t count)
    unsigned long bmq_forks_load(unsigned long *forks)
    void bmq_forks_store(unsigned long *forks, unsigned long value)

cdef enum:
    C_GUID_SIZE = 16
    C_COUNTER_MASK = 0x3FFFFF


# Forks seen by this process: a generator re-derives its client id when this moved on since it
# derived it. Counted by an os.register_at_fork hook rather than asking getpid() per GUID,
# which is a system call on every post.
cdef unsigned long _forks = 0


def _count_fork():
    global _forks
    _forks += 1


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_count_fork)


cdef inline int64_t monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef class GuidGenerator:
    """C++-SDK-compatible MessageGUIDs (§7).

    Version 1, a 22-bit counter, a 56-bit nanosecond tick since creation and a 6-byte client
    id = MD5(host name, creation time in ns, pid, session id)[:6]. The host name stands in for
    the IPv4 address (the SDK's own fallback) so that no DNS lookup happens here. After a fork
    (``os.fork``, which runs Python's at-fork hooks: multiprocessing, subprocess) the child
    re-derives its client id on first use, so parent and child never collide.

    Args:
        session_id: mixed into the client id (the SDK uses its session counter).

    Thread-safety: thread-safe, with or without the interpreter lock: each call reserves
    its counter values with one atomic add (``bmq_guid.h``), so threads posting at once get
    distinct GUIDs on a free-threaded build too.
    """

    cdef unsigned char _client_id[6]
    cdef int64_t _epoch_ns
    cdef int64_t _start_tick
    cdef uint32_t _counter  # only through bmq_counter_reserve (atomic)
    cdef unsigned long _forks  # only through bmq_forks_load/store (acquire/release)
    cdef int32_t _session_id
    cdef object _lock

    def __init__(self, int32_t session_id=1):
        self._lock = _threading.Lock()
        self._session_id = session_id
        self._derive()

    cdef _derive(self):
        cdef bytes digest
        cdef long pid = getpid()
        self._epoch_ns = _time.time_ns()
        self._start_tick = monotonic_ns()
        # The counter goes on from where it was: after a fork the new client id alone keeps
        # the child's GUIDs apart from the parent's.
        digest = _hashlib.md5(
            _socket.gethostname().encode("utf-8", "surrogateescape")
            + (<object>self._epoch_ns).to_bytes(8, "big", signed=True)
            + (<object>pid).to_bytes(4, "big", signed=True)
            + (<object>self._session_id).to_bytes(4, "big", signed=True)
        ).digest()
        memcpy(self._client_id, PyBytes_AS_STRING(digest), 6)
        # Last, with release order: a thread that sees the new count also sees the new id.
        bmq_forks_store(&self._forks, _forks)

    cdef inline int _check_fork(self) except -1:
        # Counter values are reserved atomically in _fill; only re-deriving after a fork
        # (which calls Python code) takes the lock. After a fork the child has one thread
        # until it starts others, which then see the new count with the id derived before it.
        if _forks != bmq_forks_load(&self._forks):
            with self._lock:
                if _forks != bmq_forks_load(&self._forks):
                    self._derive()
        return 0

    @property
    def client_id(self):
        """The 6-byte client id (bytes 10-15 of every GUID)."""
        self._check_fork()
        return PyBytes_FromStringAndSize(<char *>self._client_id, 6)

    @property
    def client_id_hex(self):
        """The client id as 12 upper-case hex characters, for ClientIdentity.guidInfo."""
        return self.client_id.hex().upper()

    @property
    def nanoseconds_from_epoch(self):
        """Wall-clock creation time in ns (ClientIdentity.guidInfo.nanoSecondsFromEpoch)."""
        self._check_fork()
        return self._epoch_ns

    cdef void _fill(self, unsigned char *p, Py_ssize_t count) noexcept nogil:
        cdef Py_ssize_t i
        # This call's counter values, reserved at once: concurrent callers never share one
        # (they wrap at 2**22 as the SDK's do; the tick then tells GUIDs apart).
        cdef uint32_t counter = bmq_counter_reserve(&self._counter, <uint32_t>count)
        cdef uint64_t tick
        for i in range(count):
            counter = (counter + 1) & C_COUNTER_MASK
            tick = <uint64_t>(monotonic_ns() - self._start_tick)
            # Bytes 3-9 hold the low 56 bits of the tick: store it shifted so the top byte
            # (written at p+2) is then overwritten by the counter's low byte.
            bmq_store_be64(p + 2, tick & 0x00FFFFFFFFFFFFFFull)
            p[0] = <unsigned char>(0x40 | (counter >> 16))
            p[1] = <unsigned char>(counter >> 8)
            p[2] = <unsigned char>counter
            memcpy(p + 10, self._client_id, 6)
            p += C_GUID_SIZE

    def next(self):
        """One 16-byte GUID."""
        cdef bytes out = new_bytes(C_GUID_SIZE)
        self._check_fork()
        self._fill(<unsigned char *>PyBytes_AS_STRING(out), 1)
        return out

    def generate(self, Py_ssize_t count):
        """``count`` GUIDs concatenated (16*count bytes), all distinct."""
        cdef bytes out
        if count < 0:
            raise ValueError(f"negative GUID count {count}")
        out = new_bytes(C_GUID_SIZE * count)
        self._check_fork()
        self._fill(<unsigned char *>PyBytes_AS_STRING(out), count)
        return out


def split_guids(guids):
    """The GUIDs of ``guids`` (16 bytes each, back to back) as a list of 16-byte bytes.

    Raises:
        ValueError: the length is not a multiple of 16.
    """
    cdef Input inp
    cdef Py_ssize_t n, i
    cdef list out
    in_acquire(&inp, guids)
    try:
        if inp.size % C_GUID_SIZE:
            raise ValueError(f"GUIDs are 16 bytes each: {inp.size} bytes")
        n = inp.size // C_GUID_SIZE
        out = PyList_New(n)
        for i in range(n):
            v = PyBytes_FromStringAndSize(<const char *>inp.data + i * C_GUID_SIZE, C_GUID_SIZE)
            Py_INCREF(v)
            PyList_SET_ITEM_RAW(out, i, <PyObject *>v)
        return out
    finally:
        in_release(&inp)


def deterministic_guid(key):
    """A version-1-shaped GUID derived only from ``key`` (same key, same GUID).

    Used where a retried producer must reproduce its GUIDs so that the broker
    de-duplicates them (Spark sink). Never all-zero (the version bits are set).
    """
    cdef bytearray digest = bytearray(_hashlib.blake2b(bytes(key), digest_size=16).digest())
    digest[0] = 0x40 | (digest[0] & 0x3F)
    return bytes(digest)


def guid_to_hex(guid):
    """The 32 upper-case hex characters of a 16-byte GUID, in wire order."""
    return guid_bytes(guid).hex().upper()


def guid_from_hex(str text):
    """The 16-byte GUID spelled by 32 hex characters (either case)."""
    cdef bytes out
    if len(text) != 32:
        raise ValueError(f"a GUID is 32 hex characters, got {len(text)}")
    out = bytes.fromhex(text)
    if len(out) != C_GUID_SIZE:
        raise ValueError(f"{text!r} is not 32 hex digits")
    return out
