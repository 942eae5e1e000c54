/* Atomic helpers of the GUID generator (guid.pxi), for threads that post at once without an
   interpreter lock (free-threaded CPython) as well as with one. */
#ifndef BMQ_GUID_H
#define BMQ_GUID_H

#include <stdint.h>

/* Reserve `count` counter values: returns the value before them (the caller uses the next
   `count` ones, masked to 22 bits; 2**32 is a multiple of 2**22, so wrapping is seamless). */
static inline uint32_t bmq_counter_reserve(uint32_t *counter, uint32_t count)
{
    return __atomic_fetch_add(counter, count, __ATOMIC_RELAXED);
}

/* The generator's fork count: stored after the client id is derived (release), loaded before
   the id is read (acquire), so a thread that sees the new count sees the new id. */
static inline unsigned long bmq_forks_load(unsigned long *forks)
{
    return __atomic_load_n(forks, __ATOMIC_ACQUIRE);
}

static inline void bmq_forks_store(unsigned long *forks, unsigned long value)
{
    __atomic_store_n(forks, value, __ATOMIC_RELEASE);
}

#endif
