/*
 * stats.h: per-call counters and latency histograms of a store handle
 * (docs/contract.md §3.12, docs/stats.md), and the histogram the engine reuses for
 * its handler runs.
 *
 * Always on, so they must cost next to nothing on the hot path:
 *   - one clock_gettime(CLOCK_MONOTONIC) pair per call (the vDSO, no
 *     system call), relaxed atomic adds, no lock;
 *   - the counters are split in ES_STATS_STRIPES stripes, each thread
 *     writing to the stripe its thread-local slot picks, so threads calling
 *     the same op do not fight over one cache line; a reader sums them;
 *   - a stripe of an op is allocated on its first use (most handles use a
 *     few ops), and never freed before the handle.
 * Latencies go into fixed log-linear buckets (8 per power of two, in
 * nanoseconds, up to 2^43 ns, about 2.4 hours): a percentile is the upper
 * bound of the bucket holding it (at most 12.5% above the true value, and
 * never above the largest latency seen), computed when read.
 *
 * Counting once: a store call made while another is running on the same
 * thread (a tenant handle calling its store, a sharded handle calling a
 * shard, es_store_wait reading) is part of the outer call and not counted
 * again; ES_STATS_CALL does this with a thread-local depth.
 */
#ifndef ES_STATS_H
#define ES_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "es.h"

/* The ops counted, by the name store:stats() reports (the Lua method's
 * name): X(enum suffix, "name"). */
#define ES_STATS_OPS(X)                                                                        \
  X(APPEND, "append") X(READ, "read") X(EVENTS_PAGE, "events_page") X(HEAD, "head")            \
  X(READ_ALL, "read_all") X(LAST_POSITION, "last_position") X(GET, "get") X(CLAIM, "claim")    \
  X(CLAIM_NEXT, "claim_next") X(RENEW, "renew") X(COMPLETE, "complete") X(FAIL, "fail")        \
  X(REVIVE, "revive") X(SETTLE, "settle") X(DEAD_LETTERS, "dead_letters")                      \
  X(READ_STATE, "read_state") X(READ_STATES, "read_states") X(PUT_SNAPSHOT, "put_snapshot")    \
  X(SNAPSHOTS, "snapshots") X(SESSIONS, "sessions") X(PENDING_TYPES, "pending_types")          \
  X(WAIT, "wait") X(PRESENCE_SET, "presence_set") X(PRESENCE_READ, "presence_read")            \
  X(FORK, "fork") X(LINEAGE, "lineage") X(CHILDREN, "children") X(PUT_REF, "put_ref")          \
  X(GET_REF, "get_ref") X(LIST_REFS, "list_refs") X(DELETE_REF, "delete_ref")                  \
  X(PROMOTE, "promote") X(FENCE, "fence") X(LEASE, "lease") X(RELEASE, "release")              \
  X(SEAL, "seal") X(TRUNCATE, "truncate") X(DELETE, "delete") X(ARCHIVE, "archive")            \
  X(SEGMENTS, "segments") X(COMPACT_ARCHIVE, "compact_archive")                                \
  X(VERIFY_ARCHIVE, "verify_archive") X(SHRED, "shred") X(READ_AT_REST, "read_at_rest")        \
  X(COUNTS, "stats") X(COMPLETE_MANY, "complete_many") X(RELEASE_CLAIMS, "release_claims")    \
  X(APPEND_MANY, "append_many") X(CANCEL, "cancel") X(ARCHIVED, "archived")

#define ES_STATS_ENUM_(e, name) ES_OP_##e,
enum { ES_STATS_OPS(ES_STATS_ENUM_) ES_OP_COUNT };
#undef ES_STATS_ENUM_

#define ES_STATS_STRIPES 4
/* Buckets: [0, 64 ns) in 8 buckets of 8 ns, then 8 per power of two up to
 * 2^43 ns; longer calls land in the last bucket (max_ns keeps the truth). */
#define ES_STATS_SUB 8
#define ES_STATS_MAX_EXP 43
#define ES_STATS_BUCKETS (ES_STATS_SUB + (ES_STATS_MAX_EXP - 6) * ES_STATS_SUB)

/* One thread stripe of one histogram: written with relaxed atomic adds. */
typedef struct es_stats_stripe {
  _Atomic uint64_t errors;    /* the count is the buckets' sum */
  _Atomic uint64_t max_ns;
  _Atomic uint64_t b[ES_STATS_BUCKETS];
} es_stats_stripe;

/* A histogram: count, errors, latencies. Zero-initialised memory is an
 * empty histogram (no init call); es_stats_hist_destroy frees its stripes. */
typedef struct es_stats_hist {
  _Atomic(es_stats_stripe *) stripe[ES_STATS_STRIPES];
} es_stats_hist;

/* A store handle's stats (a field of struct es_store). Zeroed memory is
 * valid and empty. */
typedef struct es_stats {
  es_stats_hist op[ES_OP_COUNT];
  atomic_int off;  /* bench only (es_stats_set_enabled): 1 skips counting */
} es_stats;

/* What a histogram reads as: latencies in nanoseconds. */
typedef struct es_stats_summary {
  uint64_t count, errors;
  uint64_t p50_ns, p99_ns, max_ns;  /* 0 when count is 0 */
} es_stats_summary;

/* The bucket of a latency, and a bucket's upper bound (exclusive), in ns. */
int es_stats_bucket(uint64_t ns);
uint64_t es_stats_bucket_upper(int bucket);

/* Adds one sample (failed: counts an error too). Out of memory for a new
 * stripe: the sample is dropped (counting never fails a call). */
void es_stats_hist_add(es_stats_hist *h, uint64_t ns, int failed);
/* Sums the stripes and computes the percentiles. */
void es_stats_hist_read(es_stats_hist *h, es_stats_summary *out);
/* The same, and the summed count of each bucket into b (not cumulative),
 * for exporters that show the whole distribution (/metrics, http/metrics.c). */
void es_stats_hist_buckets(es_stats_hist *h, uint64_t b[ES_STATS_BUCKETS], es_stats_summary *out);
/* The buckets and summary of op (ES_OP_*) on store handle s (store.h's
 * es_store_call_stats gives only the percentiles). Never fails, no lock. */
struct es_store;
void es_store_call_hist(struct es_store *s, int op, uint64_t b[ES_STATS_BUCKETS],
                        es_stats_summary *out);
void es_stats_hist_destroy(es_stats_hist *h);

void es_stats_destroy(es_stats *st);
/* The name store:stats() reports for op (ES_OP_*). Static. */
const char *es_stats_op_name(int op);
/* Bench only (bench/README.md "Stats cost"): 0 stops counting on this
 * handle, 1 starts again; not part of the API (stats are always on). */
void es_stats_set_enabled(es_stats *st, int on);

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t es_stats_now_ns(void);

/* ES_STATS_CALL's state between begin and end. */
typedef struct es_stats_span {
  es_stats *own, *also;  /* where the call counts: its handle, and (a tenant handle) its store */
  int op;
  uint64_t t0;
} es_stats_span;

/* 1: this is an outer call on a handle that counts: the caller must make
 * the call and then es_stats_span_end. 0: count nothing (nested call, or
 * counting off). */
int es_stats_span_begin(es_stats_span *sp, es_stats *own, es_stats *also, int op);
void es_stats_span_end(es_stats_span *sp, int rc);

/* The one line at the top of each counted es_store_* function (store.c):
 * the outer call runs the function again (the thread-local depth makes
 * that inner run skip this line), times it and counts its result; nested
 * calls fall through to the body. `call` is the function's own call with
 * its parameters. A tenant handle's calls also count in its store's
 * stats (docs/stats.md). */
#define ES_STATS_CALL(s, op, call)                                                         \
  do {                                                                                     \
    es_stats_span es_sp_;                                                                  \
    if (es_stats_span_begin(&es_sp_, &(s)->stats, (s)->stats_also, op)) { \
      int es_rc_ = (call);                                                                 \
      es_stats_span_end(&es_sp_, es_rc_);                                                  \
      return es_rc_;                                                                       \
    }                                                                                      \
  } while (0)

#endif
