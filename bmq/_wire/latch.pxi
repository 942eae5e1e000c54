# Waking a blocked thread after letting go of the interpreter lock.
#
# A thread woken while the waker still holds the interpreter lock runs at once into that lock
# and sleeps again until the waker lets go: two wake-ups (two context switches) where one
# would do. The reader thread settles a blocking post's ACK and then waits for the socket;
# with these latches it wakes the poster only once it has released the lock to wait.

from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.math cimport ceil

cdef extern from "bmq_latch.h" nogil:
    ctypedef struct bmq_latch:
        pass
    int bmq_latch_init(bmq_latch *latch)
    void bmq_latch_destroy(bmq_latch *latch)
    int bmq_latch_set(bmq_latch *latch)
    int bmq_latch_wait(bmq_latch *latch, double seconds)
    int bmq_latch_kick_to(bmq_latch *latch, int kick_fd)
    int bmq_lead_acquire(bmq_latch *lead, double seconds)
    void bmq_lead_release(bmq_latch *lead)
    int bmq_lead_wait_free(bmq_latch *lead, double seconds)
    void bmq_flag_store(int *flag, int value)
    int bmq_flag_load(int *flag)
    int bmq_epoll_wait(int epfd, int timeout_ms, int *fds, int max_fds)
    int bmq_kick(int fd)
    void bmq_drain(int fd)

cdef extern from "sched.h" nogil:
    int sched_yield()

cdef extern from "poll.h" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int c_poll "poll"(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

# A waiting thread looks at signals this often: Ctrl-C interrupts a blocking post in the main
# thread as it would a lock's acquire (the transport's reading poster uses it too).
cdef double SIGNAL_CHECK = 0.05
SIGNAL_CHECK_SECONDS = SIGNAL_CHECK


cdef inline int wait_ms(double timeout) noexcept nogil:
    """``timeout`` seconds as poll/epoll milliseconds: rounded up, within an int."""
    cdef double ms = ceil(timeout * 1000.0) if timeout > 0 else 0.0
    return <int>(ms if ms < 2147483647.0 else 2147483647.0)


cdef class Latch:
    """A one-shot flag a thread waits on with the interpreter lock released.

    ``set()`` wakes every waiter; :func:`wait_readable` sets latches after releasing the
    interpreter lock. Safe from any thread.
    """
    cdef bmq_latch latch

    def __cinit__(self):
        cdef int rc = bmq_latch_init(&self.latch)
        if rc:
            raise OSError(rc, _os_strerror(rc))

    def __dealloc__(self):
        bmq_latch_destroy(&self.latch)

    def set(self):
        """Set the latch and wake its waiters."""
        bmq_latch_set(&self.latch)

    def kick_to(self, int kick_fd):
        """From now on setting the latch also writes eventfd ``kick_fd`` (-1: stop), waking a
        thread that waits for the socket instead (see Transport.wait_for); True if the latch
        is set already."""
        return bool(bmq_latch_kick_to(&self.latch, kick_fd))

    def is_set(self):
        """Whether the latch is set."""
        return bool(bmq_latch_wait(&self.latch, 0.0))

    def wait(self, double timeout):
        """Wait up to ``timeout`` seconds for the latch; True once it is set.

        Signal handlers run while waiting (a KeyboardInterrupt in the main thread ends the wait).
        """
        cdef double deadline, remaining
        cdef int done
        if bmq_latch_wait(&self.latch, 0.0):
            return True
        deadline = monotonic_ns() * 1e-9 + timeout
        while True:
            remaining = deadline - monotonic_ns() * 1e-9
            if remaining <= 0:
                return False
            with nogil:
                done = bmq_latch_wait(&self.latch, remaining if remaining < SIGNAL_CHECK else SIGNAL_CHECK)
            if done:
                return True
            PyErr_CheckSignals()


cdef class Lead:
    """A lock with one more way to wait: :meth:`wait_free` returns once nobody holds it, without
    taking it. The transport's reader thread waits so for a poster reading in its place (see
    Transport.wait_for): with a plain lock it would take the lock as the poster let go, and
    hold it until it got the interpreter lock back, while the poster, posting again, found
    it taken and had to be woken by the reader instead of reading its own answer. Safe from
    any thread; held by one at most, and released by any.
    """
    cdef bmq_latch lead
    # The reader thread is waiting in its epoll set: a poster taking the lead kicks it out.
    cdef int reader_waits

    def __cinit__(self):
        cdef int rc = bmq_latch_init(&self.lead)
        if rc:
            raise OSError(rc, _os_strerror(rc))

    def __dealloc__(self):
        bmq_latch_destroy(&self.lead)

    def acquire(self, double timeout=0.0):
        """Take the lead, waiting up to ``timeout`` seconds for it (0: not at all); True if taken."""
        cdef int taken
        if timeout <= 0:
            # Keeps the interpreter lock: a poster letting go of it here would have to wait
            # for it again behind the reader thread (woken by the lead's last release).
            return bool(bmq_lead_acquire(&self.lead, 0.0))
        with nogil:
            taken = bmq_lead_acquire(&self.lead, timeout)
        return bool(taken)

    def release(self):
        """Give the lead back (whoever holds it) and wake the threads waiting for it."""
        bmq_lead_release(&self.lead)

    def locked(self):
        """Whether a thread holds the lead."""
        return not bmq_lead_wait_free(&self.lead, 0.0)

    def wait_free(self, double timeout):
        """Wait up to ``timeout`` seconds until nobody holds the lead; True if nobody does."""
        cdef int free
        with nogil:
            free = bmq_lead_wait_free(&self.lead, timeout)
        return bool(free)

    def set_reader_waiting(self, bint waiting):
        """The reader thread is (or no longer is) waiting in its epoll set (see
        :func:`wait_lead_then_ready`)."""
        bmq_flag_store(&self.reader_waits, waiting)

    def reader_waiting(self):
        """Whether the reader thread is waiting in its epoll set: a poster that took the lead
        then kicks it out, or it would wake for the poster's answer too."""
        return bool(bmq_flag_load(&self.reader_waits))



def set_latches(list woken):
    """Set and remove every latch of ``woken`` (with the interpreter lock held: see
    :func:`wait_ready` for setting them once it is released)."""
    cdef Latch latch
    while woken:
        latch = <Latch?>woken.pop()
        bmq_latch_set(&latch.latch)


cdef bmq_latch **latch_array(tuple held) except? NULL:
    """The latches of ``held`` as a PyMem array, to be set without the interpreter lock (NULL
    when there are none); ``held`` keeps them alive meanwhile: the list they came from may be
    used by another thread once the lock is released."""
    cdef Py_ssize_t i, n = len(held)
    cdef bmq_latch **latches
    if n == 0:
        return NULL
    for item in held:  # checked first: nothing to free on a TypeError
        if not isinstance(item, Latch):
            raise TypeError(f"expected a Latch, got {type(item).__name__}")
    latches = <bmq_latch **>PyMem_Malloc(n * sizeof(bmq_latch *))
    if latches == NULL:
        raise MemoryError()
    for i in range(n):
        latches[i] = &(<Latch>held[i]).latch
    return latches


cdef int set_array(bmq_latch **latches, Py_ssize_t n) noexcept nogil:
    """Set every latch; 1 if one wrote its kick descriptor."""
    cdef Py_ssize_t i
    cdef int kicked = 0
    for i in range(n):
        kicked |= bmq_latch_set(latches[i])
    return kicked


def wait_readable(int fd, double timeout, list woken):
    """Release the interpreter lock, set the :class:`Latch` objects in ``woken``, and wait up
    to ``timeout`` seconds for socket ``fd`` to be readable (or closed, or failed); ``woken`` is
    emptied. True when there is something to read.
    """
    cdef tuple held = tuple(woken)
    cdef bmq_latch **latches = latch_array(held)
    cdef Py_ssize_t n = len(held)
    cdef pollfd watched
    cdef int rc
    del woken[:]
    watched.fd = fd
    watched.events = POLLIN
    watched.revents = 0
    try:
        with nogil:
            set_array(latches, n)
            rc = c_poll(&watched, 1, wait_ms(timeout))
    finally:
        PyMem_Free(latches)
    if rc < 0:
        if errno == EINTR:
            return False
        raise OSError(errno, _os_strerror(errno))
    return rc > 0


# What wait_ready found: the socket has something, the kick descriptor was written.
cdef enum:
    _READY_SOCKET = 1
    _READY_KICKED = 2
    _READY_HANDED = 4
    _READY_SPUN = 8
    _READY_LEFT = 16
READY_SOCKET = _READY_SOCKET
READY_KICKED = _READY_KICKED
READY_HANDED = _READY_HANDED
READY_SPUN = _READY_SPUN
READY_LEFT = _READY_LEFT


def wait_ready(int epfd, int sock_fd, double timeout, list woken, double spin=0.0, Lead lead=None):
    """Release the interpreter lock, set the latches of ``woken`` (emptied), then wait up to
    ``timeout`` seconds on the edge-triggered epoll set ``epfd``: socket ``sock_fd`` and a kick
    eventfd. Returns READY_SOCKET | READY_KICKED bits (a kick is drained).

    For the first ``spin`` seconds of the wait the set is polled without sleeping (READY_SPUN:
    something came meanwhile). A broker that answers within tens of microseconds then finds
    this thread running: waking a sleeping thread costs about as much again
    (docs/performance-notes.md).

    If setting a latch wrote its kick descriptor, returns READY_HANDED at once without waiting:
    the thread the kick is for reads in the caller's place (see Transport.wait_for), and the
    caller leaves it the socket rather than wait for it too.

    Given the ``lead`` the caller holds (a thread reading in the reader's place), a wait that
    ends with nothing (its time is up, or a signal interrupted it) releases it before returning
    (READY_LEFT): Python code runs next, a signal handler maybe, and one that calls
    ``Session.stop()`` needs the reader thread to read the broker's answer, which it does only
    once the lead is free."""
    cdef tuple held = tuple(woken)
    cdef bmq_latch **latches = latch_array(held)
    cdef Py_ssize_t n = len(held), i
    cdef int fds[2]
    cdef int got = 0, ready = 0, err = 0
    cdef int64_t spin_until
    cdef bmq_latch *leading = &lead.lead if lead is not None else NULL
    del woken[:]
    try:
        with nogil:
            if set_array(latches, n):
                ready = _READY_HANDED
            else:
                if spin > 0:
                    if spin > timeout:
                        spin = timeout
                    spin_until = monotonic_ns() + <int64_t>(spin * 1e9)
                    while True:
                        got = bmq_epoll_wait(epfd, 0, fds, 2)
                        if got:
                            ready = _READY_SPUN
                            break
                        if monotonic_ns() >= spin_until:
                            break
                        # A thread waiting for this core (the broker's, on a busy host) runs
                        # meanwhile: polling must not delay the answer it waits for.
                        sched_yield()
                    timeout -= spin
                if not got:
                    got = bmq_epoll_wait(epfd, wait_ms(timeout), fds, 2)
            err = errno
            for i in range(got if got > 0 else 0):
                if fds[i] == sock_fd:
                    ready |= _READY_SOCKET
                else:
                    bmq_drain(fds[i])
                    ready |= _READY_KICKED
            if leading != NULL and ready == 0 and (got >= 0 or err == EINTR):
                bmq_lead_release(leading)
                ready = _READY_LEFT
    finally:
        PyMem_Free(latches)
    if got < 0:
        if err == EINTR:
            return ready
        raise OSError(err, _os_strerror(err))
    return ready


def wait_lead_then_ready(Lead lead, int epfd, int sock_fd, double timeout):
    """The reader thread's wait while a poster holds ``lead`` (reading in its place: see
    Transport.wait_for), without the interpreter lock: until the lead is free and socket
    ``sock_fd`` has data, then READY_SOCKET; 0 after ``timeout`` seconds.

    Once the lead is free the socket is looked at (a poster may have left data; data found
    after a poster took the lead again is its answer, left to it), and then waited for in the
    reader's edge-triggered epoll set ``epfd``, announced with the lead's
    reader-waiting flag: a poster taking the lead meanwhile kicks the set, and the wait goes
    back to the lead. The reader thread so takes the interpreter lock again only for data:
    waking for each release of the lead, it took it while the next post let go of it (the ssl
    module lets go of it in every call, so that cost most with TLS).

    Raises:
        OSError: the epoll wait failed.
    """
    cdef int64_t deadline = monotonic_ns() + <int64_t>(timeout * 1e9)
    cdef int64_t left
    cdef int fds[2]
    cdef int got = 0, i, ready = 0
    cdef pollfd look
    with nogil:
        while True:
            left = deadline - monotonic_ns()
            if left <= 0 or not bmq_lead_wait_free(&lead.lead, left * 1e-9):
                break
            look.fd = sock_fd
            look.events = POLLIN
            look.revents = 0
            if c_poll(&look, 1, 0) > 0:  # level-triggered: what is there now, not stale edges
                if not bmq_lead_wait_free(&lead.lead, 0.0):
                    # A poster took the lead since: the data is its answer. Back to waiting
                    # here, not in Python: there this thread would want the interpreter lock
                    # while the poster lets go of it in the ssl module's calls (see below).
                    continue
                ready = _READY_SOCKET
                break
            bmq_flag_store(&lead.reader_waits, 1)
            got = 0
            if bmq_lead_wait_free(&lead.lead, 0.0):  # still free, so a taker will see the flag
                left = deadline - monotonic_ns()
                got = bmq_epoll_wait(epfd, wait_ms(left * 1e-9) if left > 0 else 0, fds, 2)
            bmq_flag_store(&lead.reader_waits, 0)
            for i in range(got if got > 0 else 0):
                if fds[i] != sock_fd:
                    bmq_drain(fds[i])  # a kick: a poster took the lead (or left data)
            if got < 0 and errno != EINTR:
                ready = -1
                break
    if ready < 0:
        raise OSError(errno, _os_strerror(errno))
    return ready
