# A ring of the latest samples of a measurement (a queue's post->ACK latencies: bmq._stats),
# as C doubles: a deque of Python floats took 32 bytes per sample (133 KB per queue at 4,096).


cdef class SampleRing:
    """The latest ``size`` samples appended (floats), 8 bytes each, allocated at the first
    append (a queue that never posts keeps none). Appending is as cheap as ``deque.append``.

    Thread-safety: safe from any thread: appending and reading take the ring's own mutex
    (a free-threaded build has no interpreter lock to keep two appends from both moving
    ``next`` past the end); uncontended, it costs one atomic instruction each way.
    """
    cdef double *samples
    cdef Py_ssize_t size, count, next
    cdef cython.pymutex lock

    def __cinit__(self, Py_ssize_t size):
        if size <= 0:
            raise ValueError(f"size must be positive, not {size}")
        self.size = size

    def __dealloc__(self):
        PyMem_Free(self.samples)

    def append(self, double sample):
        """Add ``sample``, dropping the oldest once ``size`` are kept."""
        with self.lock:
            if self.samples == NULL:
                self.samples = <double *>PyMem_Malloc(self.size * sizeof(double))
                if self.samples == NULL:
                    raise MemoryError()
            self.samples[self.next] = sample
            self.next += 1
            if self.next == self.size:
                self.next = 0
            if self.count < self.size:
                self.count += 1

    def __len__(self):
        with self.lock:
            return self.count

    def values(self):
        """The samples kept, oldest first, as a list."""
        cdef Py_ssize_t i, start
        with self.lock:
            start = self.next if self.count == self.size else 0
            return [self.samples[(start + i) % self.size] for i in range(self.count)]
