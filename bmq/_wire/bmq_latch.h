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
} bmq_latch;

static int bmq_latch_init(bmq_latch *latch)
{
    pthread_condattr_t attr;
    int rc;
    latch->set = 0;
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

static void bmq_latch_set(bmq_latch *latch)
{
    pthread_mutex_lock(&latch->mutex);
    latch->set = 1;
    pthread_mutex_unlock(&latch->mutex);
    /* The setter holds a reference to the latch, so it outlives this call. */
    pthread_cond_broadcast(&latch->cond);
}

/* Wait up to `seconds` (>= 0) for the latch; 1 when it is set. */
static int bmq_latch_wait(bmq_latch *latch, double seconds)
{
    struct timespec until;
    int rc = 0, set;
    pthread_mutex_lock(&latch->mutex);
    if (!latch->set && seconds > 0) {
#if defined(__APPLE__)
        until.tv_sec = (time_t)seconds;
        until.tv_nsec = (long)((seconds - (double)until.tv_sec) * 1e9);
        while (!latch->set && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait_relative_np(&latch->cond, &latch->mutex, &until);
#else
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)seconds;
        until.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000L;
        }
        while (!latch->set && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&latch->cond, &latch->mutex, &until);
#endif
    }
    set = latch->set;
    pthread_mutex_unlock(&latch->mutex);
    return set;
}

#endif
