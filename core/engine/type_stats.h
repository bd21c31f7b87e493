/*
 * type_stats.h: the engine's per-event-type counts and handler latencies
 * (docs/contract.md §3.12 engine:stats(), docs/stats.md).
 *
 * Workers note each handler run and each outcome; nothing on that path
 * takes a lock: the table of types is an array replaced whole (copy on
 * write, compare-and-swap) when a type is first seen, and each type's
 * figures are relaxed atomics and a striped histogram (store/stats.h).
 * Zeroed memory is an empty table (it lives inside struct es_engine).
 */
#ifndef ES_ENGINE_TYPE_STATS_H
#define ES_ENGINE_TYPE_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "store/stats.h"

typedef struct es_type_stat {
  es_stats_hist runs;            /* handler runs: count, errors (the run failed), latency */
  _Atomic uint64_t handled;      /* attempts completed with the handler's result */
  _Atomic uint64_t failed;       /* attempts failed and to be retried */
  _Atomic uint64_t dead;         /* attempts failed and dead-lettered */
  char type[];
} es_type_stat;

typedef struct es_type_arr es_type_arr;

typedef struct es_type_stats {
  _Atomic(es_type_arr *) cur;    /* sorted by type; NULL: no type yet */
  _Atomic(es_type_arr *) retired; /* arrays replaced, kept for readers until destroy */
  atomic_int off;                 /* bench only (es_type_stats_enable): 1 counts nothing */
} es_type_stats;

enum { ES_TYPE_HANDLED, ES_TYPE_FAILED, ES_TYPE_DEAD };

/* Counts one outcome (ES_TYPE_*) of an attempt of an event of `type`. */
void es_type_stats_count(es_type_stats *t, const char *type, int kind);
/* Counts one handler run of `ns` nanoseconds (failed: it raised, returned
 * something that is not a list of events, or its completion failed). */
void es_type_stats_run(es_type_stats *t, const char *type, uint64_t ns, int failed);

/* Around a handler run: begin's time (now_ns, monotonic; 0 when counting
 * is off) goes to end, whose nanoseconds go to es_type_stats_run. The
 * caller reads the clock (it has the times anyway). */
uint64_t es_type_stats_begin(es_type_stats *t, uint64_t now_ns);
uint64_t es_type_stats_end(es_type_stats *t, uint64_t t0, uint64_t now_ns);
/* Bench only (bench/README.md "Stats cost"). */
void es_type_stats_enable(es_type_stats *t, int on);

/* Calls fn for each type seen, in byte order (views valid during the call). */
void es_type_stats_each(es_type_stats *t, void (*fn)(void *ctx, const es_type_stat *st),
                        void *ctx);
void es_type_stats_destroy(es_type_stats *t);

#endif
