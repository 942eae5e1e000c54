# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, freethreading_compatible=True
"""The BlazingMQ binary wire format (see ``_codec.pyi`` for the documented API).

This module only gathers its parts: each file in ``bmq/_wire`` holds one area of the
protocol, all compiled into this single extension so they can share inline C helpers.
Section numbers (§) in these files refer to docs/protocol.md.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New
from cpython.long cimport PyLong_FromUnsignedLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport getpid

include "common.pxi"
include "crc.pxi"
include "header.pxi"
include "control.pxi"
include "properties.pxi"
include "guid.pxi"
include "compress.pxi"
include "bulk.pxi"
include "put.pxi"
include "push.pxi"
include "ackconfirm.pxi"
include "sockio.pxi"
include "latch.pxi"
include "ring.pxi"
