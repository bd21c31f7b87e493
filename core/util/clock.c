/*
 * clock.c: the manual clock (clock.h). Atomics, so worker threads can read
 * it while a test moves it.
 */
#include "util/clock.h"

#include <stdatomic.h>
#include <stdlib.h>

struct es_manual_clock {
  atomic_int_least64_t ms;
  atomic_int refs;
};

es_manual_clock *es_manual_clock_new(int64_t ms) {
  es_manual_clock *c = malloc(sizeof *c);
  if (!c) return NULL;
  atomic_init(&c->ms, ms);
  atomic_init(&c->refs, 1);
  return c;
}

void es_manual_clock_retain(es_manual_clock *c) { atomic_fetch_add(&c->refs, 1); }

void es_manual_clock_release(es_manual_clock *c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

int64_t es_manual_clock_get(const es_manual_clock *c) {
  return atomic_load(&((es_manual_clock *)c)->ms);
}

void es_manual_clock_set(es_manual_clock *c, int64_t ms) { atomic_store(&c->ms, ms); }

int64_t es_manual_clock_advance(es_manual_clock *c, int64_t ms) {
  return atomic_fetch_add(&c->ms, ms) + ms;
}

int es_manual_clock_now(void *ctx, int64_t *now_ms, es_err *err) {
  (void)err;
  *now_ms = es_manual_clock_get(ctx);
  return ES_OK;
}

/* *from + sec seconds + ns (0 <= ns < 1e9) nanoseconds, normalised. The
 * parts, not one count of nanoseconds: a far deadline (a timeout of
 * math.maxinteger ms) must not overflow. */
static struct timespec add_parts(const struct timespec *from, int64_t sec, long ns) {
  struct timespec t = *from;
  t.tv_sec += (time_t)sec;
  t.tv_nsec += ns;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

struct timespec es_timespec_add(const struct timespec *from, int64_t ms) {
  return add_parts(from, ms / 1000, (long)(ms % 1000) * 1000000L);
}

struct timespec es_timespec_in(clockid_t clock, int64_t ms) {
  struct timespec now;
  clock_gettime(clock, &now);
  return es_timespec_add(&now, ms);
}

struct timespec es_timespec_in_us(clockid_t clock, int64_t us) {
  struct timespec now;
  clock_gettime(clock, &now);
  return add_parts(&now, us / 1000000, (long)(us % 1000000) * 1000L);
}
