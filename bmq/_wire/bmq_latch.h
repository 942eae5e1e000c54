/* A one-shot latch that can be set without the interpreter lock (latch.pxi). */
#ifndef BMQ_LATCH_H
#define BMQ_LATCH_H

#include <errno.h>
#include <pthread.h>
#include <time.h>

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int set;
    int kick_fd; /* >= 0: an eventfd written when the latch is set (see Latch.kick_to) */
} bmq_latch;

static int bmq_kick(int fd);

static int bmq_latch_init(bmq_latch *latch)
{
    pthread_condattr_t attr;
    int rc;
    latch->set = 0;
    latch->kick_fd = -1;
    if ((rc = pthread_mutex_init(&latch->mutex, NULL)) != 0)
        return rc;
    if ((rc = pthread_condattr_init(&attr)) != 0)
        goto fail_mutex;
#if !defined(__APPLE__)
    /* Timeouts count on the monotonic clock: a wall-clock step must not stretch a wait. */
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
    rc = pthread_cond_init(&latch->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (rc == 0)
        return 0;
fail_mutex:
    pthread_mutex_destroy(&latch->mutex);
    return rc;
}

static void bmq_latch_destroy(bmq_latch *latch)
{
    pthread_cond_destroy(&latch->cond);
    pthread_mutex_destroy(&latch->mutex);
}

/* Set the latch; 1 if that also wrote its kick descriptor. */
static int bmq_latch_set(bmq_latch *latch)
{
    int kick_fd;
    pthread_mutex_lock(&latch->mutex);
    latch->set = 1;
    kick_fd = latch->kick_fd;
    pthread_mutex_unlock(&latch->mutex);
    /* The setter holds a reference to the latch, so it outlives this call. */
    pthread_cond_broadcast(&latch->cond);
    if (kick_fd < 0)
        return 0;
    bmq_kick(kick_fd);
    return 1;
}

/* From now on a set writes kick_fd (-1: nothing); 1 if the latch is set already. */
static int bmq_latch_kick_to(bmq_latch *latch, int kick_fd)
{
    int set;
    pthread_mutex_lock(&latch->mutex);
    latch->kick_fd = kick_fd;
    set = latch->set;
    pthread_mutex_unlock(&latch->mutex);
    return set;
}

/* With latch->mutex held: wait on latch->cond up to `seconds` (> 0) while *flag == value. */
static void bmq_latch_wait_while(bmq_latch *latch, const int *flag, int value, double seconds)
{
    struct timespec until;
    int rc = 0;
#if defined(__APPLE__)
    until.tv_sec = (time_t)seconds;
    until.tv_nsec = (long)((seconds - (double)until.tv_sec) * 1e9);
    while (*flag == value && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait_relative_np(&latch->cond, &latch->mutex, &until);
#else
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)seconds;
    until.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    while (*flag == value && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&latch->cond, &latch->mutex, &until);
#endif
}

/* Wait up to `seconds` (>= 0) for the latch; 1 when it is set. */
static int bmq_latch_wait(bmq_latch *latch, double seconds)
{
    int set;
    pthread_mutex_lock(&latch->mutex);
    if (!latch->set && seconds > 0)
        bmq_latch_wait_while(latch, &latch->set, 0, seconds);
    set = latch->set;
    pthread_mutex_unlock(&latch->mutex);
    return set;
}

/* A lead (latch.pxi's Lead) is a latch whose flag means "held": it is taken and given back
   rather than set once, and a thread can wait for it to be free without taking it. */

/* Take the lead, waiting up to `seconds` (0: not at all); 1 when taken. */
static int bmq_lead_acquire(bmq_latch *lead, double seconds)
{
    int taken = 0;
    pthread_mutex_lock(&lead->mutex);
    if (lead->set && seconds > 0)
        bmq_latch_wait_while(lead, &lead->set, 1, seconds);
    if (!lead->set)
        taken = lead->set = 1;
    pthread_mutex_unlock(&lead->mutex);
    return taken;
}

static void bmq_lead_release(bmq_latch *lead)
{
    pthread_mutex_lock(&lead->mutex);
    lead->set = 0;
    pthread_mutex_unlock(&lead->mutex);
    pthread_cond_broadcast(&lead->cond);
}

/* Wait up to `seconds` for the lead to be free, without taking it; 1 when free. */
static int bmq_lead_wait_free(bmq_latch *lead, double seconds)
{
    int held;
    pthread_mutex_lock(&lead->mutex);
    if (lead->set && seconds > 0)
        bmq_latch_wait_while(lead, &lead->set, 1, seconds);
    held = lead->set;
    pthread_mutex_unlock(&lead->mutex);
    return !held;
}

/* A flag two threads hand over without a lock (Lead's reader-waiting flag): stored by one,
   read by the other, each followed or preceded by a full fence, so that of "flag up, then look
   at the lead" and "take the lead, then look at the flag" one always sees the other. */
static void bmq_flag_store(int *flag, int value)
{
    __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static int bmq_flag_load(int *flag)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
}

#include <unistd.h>
#include <stdint.h>
#if defined(__linux__)
#include <sys/epoll.h>
#endif

/* Wait on an epoll set; the descriptors that are ready go to fds (-1 and errno: failed). */
static int bmq_epoll_wait(int epfd, int timeout_ms, int *fds, int max_fds)
{
#if defined(__linux__)
    struct epoll_event events[4];
    int i, n;
    if (max_fds > 4)
        max_fds = 4;
    n = epoll_wait(epfd, events, max_fds, timeout_ms);
    for (i = 0; i < n; i++)
        fds[i] = events[i].data.fd;
    return n;
#else
    (void)epfd; (void)timeout_ms; (void)fds; (void)max_fds;
    errno = ENOSYS;
    return -1;
#endif
}

/* Add one to an eventfd: a thread waiting on it in an epoll set wakes. */
static int bmq_kick(int fd)
{
    uint64_t one = 1;
    return (int)write(fd, &one, sizeof one);
}

static void bmq_drain(int fd)
{
    uint64_t value;
    (void)!read(fd, &value, sizeof value);
}

#endif
