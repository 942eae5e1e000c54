# Socket calls that keep the interpreter lock (the transport's reads and writes).
#
# Python's socket methods release the interpreter lock around every system call. A
# non-blocking send of a small event takes a few microseconds, but releasing and re-taking
# the lock while other threads want it (posters, the reader) costs each side a wake-up and a
# context switch: more than the write itself. These calls never block.

from libc.errno cimport errno, EAGAIN, EINTR
from os import strerror as _os_strerror

cdef extern from "bmq_sockio.h" nogil:
    ssize_t c_send "send"(int fd, const void *buf, size_t n, int flags)
    ssize_t c_recv "recv"(int fd, void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL

# Above this size the copy into the kernel takes long enough that other threads should run.
cdef Py_ssize_t SEND_NOW_MAX = 64 * 1024


def send_now(int fd, data):
    """Write what socket ``fd`` takes at once of ``data`` without waiting, keeping the
    interpreter lock; returns the bytes written (0 when the socket buffer is full).

    Events larger than 64 KiB are written with the lock released, as a Python socket would.

    Raises:
        OSError: the write failed (the connection is broken).
    """
    cdef Input inp
    cdef ssize_t n
    in_acquire(&inp, data)
    try:
        if inp.size > SEND_NOW_MAX:
            with nogil:
                n = c_send(fd, inp.data, <size_t>inp.size, MSG_DONTWAIT | MSG_NOSIGNAL)
        else:
            n = c_send(fd, inp.data, <size_t>inp.size, MSG_DONTWAIT | MSG_NOSIGNAL)
        if n < 0:
            if errno == EAGAIN or errno == EINTR:
                return 0
            raise OSError(errno, _os_strerror(errno))
        return n
    finally:
        in_release(&inp)


def recv_now(int fd, buffer):
    """Read what socket ``fd`` holds into writable ``buffer`` without waiting, keeping the
    interpreter lock (call it once ``select`` said the socket is readable); returns the
    bytes read, 0 at the end of the stream, -1 when nothing was there after all.

    Raises:
        OSError: the read failed (the connection is broken).
    """
    cdef Py_buffer view
    cdef ssize_t n
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
    try:
        n = c_recv(fd, view.buf, <size_t>view.len, MSG_DONTWAIT)
        if n < 0:
            if errno == EAGAIN or errno == EINTR:
                return -1
            raise OSError(errno, _os_strerror(errno))
        return n
    finally:
        PyBuffer_Release(&view)
