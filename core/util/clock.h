/*
 * clock.h: a manual clock for tests: thread-safe, shared by reference
 * between a Lua handle, stores and (later) the engine's worker threads.
 */
#ifndef ES_CLOCK_H
#define ES_CLOCK_H

#include <time.h>

#include "es.h"

typedef struct es_manual_clock es_manual_clock;

/* A new clock at ms, with one reference; NULL when out of memory. */
es_manual_clock *es_manual_clock_new(int64_t ms);
void es_manual_clock_retain(es_manual_clock *c);
void es_manual_clock_release(es_manual_clock *c); /* frees at the last reference */
int64_t es_manual_clock_get(const es_manual_clock *c);
void es_manual_clock_set(es_manual_clock *c, int64_t ms);
/* Adds ms (may be negative) and returns the new time. */
int64_t es_manual_clock_advance(es_manual_clock *c, int64_t ms);
/* An es_clock_fn reading the es_manual_clock passed as ctx. */
int es_manual_clock_now(void *ctx, int64_t *now_ms, es_err *err);

/* The time `ms` (>= 0) milliseconds after *from, normalised. */
struct timespec es_timespec_add(const struct timespec *from, int64_t ms);
/* The time `ms` milliseconds from now on clock `clock` (a deadline for
 * pthread_cond_timedwait and the like). */
struct timespec es_timespec_in(clockid_t clock, int64_t ms);
/* The same, `us` (>= 0) microseconds from now. */
struct timespec es_timespec_in_us(clockid_t clock, int64_t us);

#endif
