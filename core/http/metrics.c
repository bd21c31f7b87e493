/*
 * metrics.c: GET /metrics in the Prometheus text format 0.0.4, and GET
 * /healthz (docs/http-live.md).
 *
 * Everything comes from figures the store, the engine and the server keep
 * anyway (store/stats.h, engine/type_stats.h, es_http_counters): a scrape
 * costs one counts read and a walk of a few fixed arrays, never a scan of
 * events.
 *
 * Scope: a tenant token sees its tenant's counts and its tenant handle's
 * calls; the engine's figures and the server's own (responses, streams,
 * refused connections) are the whole server's, so only `*` tokens see
 * them (a tenant must not learn how busy the others are).
 *
 * Latency histograms: the store's buckets are log-linear in nanoseconds
 * (8 per power of two); every power of two is a bucket bound, so the
 * exported buckets (le = 2^10 .. 2^36 ns, in seconds) are exact sums of
 * stored buckets. No sum of latencies is kept on the hot path (stats.h:
 * one atomic add per call), so the histograms have `_bucket` and
 * `_count` but no `_sum`; `_max_seconds` gauges give the exact largest.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/type_stats.h"
#include "http/internal.h"
#include "store/projections.h"
#include "store/stats.h"

#define LE_FIRST 10 /* 2^10 ns: about 1 us */
#define LE_LAST 36  /* 2^36 ns: about 69 s */

/* ---- writing the format -------------------------------------------------- */

/* A label value: backslash, double quote and line feed escaped (the
 * format's three escapes); anything else as is. */
static void label_value(es_buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') es_buf_adds(b, "\\\\");
    else if (*s == '"') es_buf_adds(b, "\\\"");
    else if (*s == '\n') es_buf_adds(b, "\\n");
    else es_buf_addc(b, *s);
  }
}

static void family(es_buf *b, const char *name, const char *type, const char *help) {
  es_buf_addf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{key="value"} (no labels when key is NULL) and a space. */
static void sample_start(es_buf *b, const char *name, const char *key, const char *value) {
  es_buf_adds(b, name);
  if (key) {
    es_buf_addc(b, '{');
    es_buf_adds(b, key);
    es_buf_adds(b, "=\"");
    label_value(b, value);
    es_buf_adds(b, "\"}");
  }
  es_buf_addc(b, ' ');
}

static void sample_u(es_buf *b, const char *name, const char *key, const char *value, uint64_t v) {
  sample_start(b, name, key, value);
  es_buf_addf(b, "%" PRIu64 "\n", v);
}

static void sample_i(es_buf *b, const char *name, const char *key, const char *value, int64_t v) {
  sample_start(b, name, key, value);
  es_buf_addf(b, "%" PRId64 "\n", v);
}

/* Nanoseconds as seconds, exactly (ns / 10^9 is a finite decimal). */
static void seconds(es_buf *b, uint64_t ns) {
  es_buf_addf(b, "%" PRIu64 ".%09" PRIu64, ns / 1000000000u, ns % 1000000000u);
}

static void sample_secs(es_buf *b, const char *name, const char *key, const char *value,
                        uint64_t ns) {
  sample_start(b, name, key, value);
  seconds(b, ns);
  es_buf_addc(b, '\n');
}

/* One histogram's samples: cumulative buckets at every power of two from
 * 2^LE_FIRST ns, then +Inf (= _count), then _count. A stored bucket's
 * upper bound is exclusive, so a bucket counts toward `le` when its upper
 * bound is <= le: those samples were all < le. */
static void histogram(es_buf *b, const char *name, const char *key, const char *value,
                      const uint64_t *buckets, uint64_t count) {
  uint64_t cum = 0;
  int k = 0;
  for (int e = LE_FIRST; e <= LE_LAST; e++) {
    uint64_t le = (uint64_t)1 << e;
    while (k < ES_STATS_BUCKETS - 1 && es_stats_bucket_upper(k) <= le) cum += buckets[k++];
    es_buf_addf(b, "%s_bucket{%s=\"", name, key);
    label_value(b, value);
    es_buf_adds(b, "\",le=\"");
    seconds(b, le);
    es_buf_addf(b, "\"} %" PRIu64 "\n", cum);
  }
  es_buf_addf(b, "%s_bucket{%s=\"", name, key);
  label_value(b, value);
  es_buf_addf(b, "\",le=\"+Inf\"} %" PRIu64 "\n", count);
  es_buf_addf(b, "%s_count{%s=\"", name, key);
  label_value(b, value);
  es_buf_addf(b, "\"} %" PRIu64 "\n", count);
}

/* ---- the store's figures ----------------------------------------------------- */

typedef struct {
  uint64_t b[ES_STATS_BUCKETS];
  es_stats_summary sum;
} op_hist;

static void store_calls(es_buf *b, es_store *s) {
  /* Read every op once, so the families agree with each other (on the
   * heap: ES_OP_COUNT histograms are ~120 KB). */
  op_hist *v = calloc(ES_OP_COUNT, sizeof *v);
  if (!v) {
    b->oom = 1;
    return;
  }
  for (int op = 0; op < ES_OP_COUNT; op++) es_store_call_hist(s, op, v[op].b, &v[op].sum);
  family(b, "eventstore_calls_total", "counter", "Store calls made through this handle, by call.");
  for (int op = 0; op < ES_OP_COUNT; op++)
    if (v[op].sum.count) sample_u(b, "eventstore_calls_total", "op", es_stats_op_name(op), v[op].sum.count);
  family(b, "eventstore_call_errors_total", "counter",
         "Store calls that returned an error (any code), by call.");
  for (int op = 0; op < ES_OP_COUNT; op++)
    if (v[op].sum.count)
      sample_u(b, "eventstore_call_errors_total", "op", es_stats_op_name(op), v[op].sum.errors);
  family(b, "eventstore_call_duration_seconds", "histogram",
         "Time store calls took, blocking included (no _sum: not kept).");
  for (int op = 0; op < ES_OP_COUNT; op++)
    if (v[op].sum.count)
      histogram(b, "eventstore_call_duration_seconds", "op", es_stats_op_name(op), v[op].b,
                v[op].sum.count);
  family(b, "eventstore_call_duration_max_seconds", "gauge",
         "The longest store call so far, by call (exact).");
  for (int op = 0; op < ES_OP_COUNT; op++)
    if (v[op].sum.count)
      sample_secs(b, "eventstore_call_duration_max_seconds", "op", es_stats_op_name(op),
                  v[op].sum.max_ns);
  free(v);
}

static int store_counts(es_buf *b, es_store *s, es_err *err) {
  es_counts c;
  if (es_store_counts(s, &c, err)) return -1;
  family(b, "eventstore_sessions", "gauge", "Sessions (with a session row).");
  sample_i(b, "eventstore_sessions", NULL, NULL, c.sessions);
  family(b, "eventstore_events", "gauge", "Readable events (live and archived).");
  sample_i(b, "eventstore_events", NULL, NULL, c.events);
  family(b, "eventstore_pending", "gauge", "Events neither processed nor dead.");
  sample_i(b, "eventstore_pending", NULL, NULL, c.pending);
  family(b, "eventstore_dead", "gauge", "Dead letters.");
  sample_i(b, "eventstore_dead", NULL, NULL, c.dead);
  return 0;
}

/* ---- the engine's figures -------------------------------------------------------- */

/* es_type_stats_each's views are valid only during the call: the walk
 * writes each family in its own pass. */
typedef struct {
  es_buf *b;
  int what;
} type_walk;

enum { T_RUNS, T_RUN_ERRORS, T_HANDLED, T_FAILED, T_DEAD, T_HIST, T_MAX };

static void type_one(void *ctx, const es_type_stat *st) {
  type_walk *w = ctx;
  es_buf *b = w->b;
  uint64_t buckets[ES_STATS_BUCKETS];
  es_stats_summary sum;
  switch (w->what) {
  case T_HANDLED:
    sample_u(b, "eventstore_handler_handled_total", "type", st->type,
             atomic_load_explicit(&st->handled, memory_order_relaxed));
    return;
  case T_FAILED:
    sample_u(b, "eventstore_handler_failed_total", "type", st->type,
             atomic_load_explicit(&st->failed, memory_order_relaxed));
    return;
  case T_DEAD:
    sample_u(b, "eventstore_handler_dead_total", "type", st->type,
             atomic_load_explicit(&st->dead, memory_order_relaxed));
    return;
  default:
    break;
  }
  es_stats_hist_buckets((es_stats_hist *)&st->runs, buckets, &sum);
  if (w->what == T_RUNS) sample_u(b, "eventstore_handler_runs_total", "type", st->type, sum.count);
  else if (w->what == T_RUN_ERRORS)
    sample_u(b, "eventstore_handler_run_errors_total", "type", st->type, sum.errors);
  else if (w->what == T_HIST)
    histogram(b, "eventstore_handler_duration_seconds", "type", st->type, buckets, sum.count);
  else sample_secs(b, "eventstore_handler_duration_max_seconds", "type", st->type, sum.max_ns);
}

static void engine_figures(es_buf *b, es_engine *e) {
  static const struct {
    int what;
    const char *name, *type, *help;
  } fams[] = {
      {T_RUNS, "eventstore_handler_runs_total", "counter", "Handler runs, by event type."},
      {T_RUN_ERRORS, "eventstore_handler_run_errors_total", "counter",
       "Handler runs that failed (raised, bad result, completion failed), by event type."},
      {T_HANDLED, "eventstore_handler_handled_total", "counter",
       "Attempts completed with the handler's result, by event type."},
      {T_FAILED, "eventstore_handler_failed_total", "counter",
       "Attempts failed and to be retried, by event type."},
      {T_DEAD, "eventstore_handler_dead_total", "counter",
       "Attempts failed and dead-lettered, by event type."},
      {T_HIST, "eventstore_handler_duration_seconds", "histogram",
       "Time handler runs took, by event type (no _sum: not kept)."},
      {T_MAX, "eventstore_handler_duration_max_seconds", "gauge",
       "The longest handler run so far, by event type (exact)."},
  };
  struct es_type_stats *ts = es_engine_type_stats(e);
  for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
    family(b, fams[i].name, fams[i].type, fams[i].help);
    type_walk w = {b, fams[i].what};
    es_type_stats_each(ts, type_one, &w);
  }
  /* §3.9 retention policies (lua/eventstore/retention.lua) */
  family(b, "eventstore_retention_actions_total", "counter",
         "Retention policy actions applied (failed: tried and refused), by action.");
  for (int k = ES_RETAIN_TRUNCATE; k <= ES_RETAIN_FAILED; k++)
    sample_i(b, "eventstore_retention_actions_total", "action", es_retain_kind_name(k),
             es_engine_retain_counted(e, k));
  family(b, "eventstore_retention_sweeps_total", "counter",
         "Times this engine applied the retention rules.");
  sample_i(b, "eventstore_retention_sweeps_total", NULL, NULL,
           es_engine_retain_counted(e, ES_RETAIN_SWEEPS));
}

/* ---- the server's figures ------------------------------------------------------------ */

static uint64_t ld(atomic_uint_fast64_t *v) {
  return (uint64_t)atomic_load_explicit(v, memory_order_relaxed);
}

static void server_figures(es_buf *b, const es_http_ctx *ctx) {
  es_http_counters *c = ctx->counters;
  family(b, "eventstore_http_responses_total", "counter", "HTTP answers, by status class.");
  static const char *const classes[] = {"", "1xx", "2xx", "3xx", "4xx", "5xx"};
  for (int i = 1; i < 6; i++)
    sample_u(b, "eventstore_http_responses_total", "class", classes[i], ld(&c->by_class[i]));
  family(b, "eventstore_http_route_responses_total", "counter",
         "HTTP answers, by route (method and path pattern).");
  char route[160];
  for (int i = 0; i < 64 && es_http_routes[i].method; i++) {
    snprintf(route, sizeof route, "%s /%s", es_http_routes[i].method, es_http_routes[i].pattern);
    sample_u(b, "eventstore_http_route_responses_total", "route", route, ld(&c->by_route[i]));
  }
  family(b, "eventstore_http_streams_open", "gauge", "SSE streams open now.");
  sample_i(b, "eventstore_http_streams_open", NULL, NULL, atomic_load(ctx->streams));
  family(b, "eventstore_http_streams_opened_total", "counter", "SSE streams started.");
  sample_u(b, "eventstore_http_streams_opened_total", NULL, NULL, ld(&c->streams_opened));
  family(b, "eventstore_http_streams_dropped_total", "counter",
           "SSE streams that ended on the client's side: gone, or too slow until the connection "
           "timed out.");
  sample_u(b, "eventstore_http_streams_dropped_total", NULL, NULL, ld(&c->streams_dropped));
  family(b, "eventstore_http_connections_refused_total", "counter",
         "Connections refused over the connection limit.");
  sample_u(b, "eventstore_http_connections_refused_total", NULL, NULL, ld(&c->refused));
  family(b, "eventstore_http_header_timeouts_total", "counter",
         "Connections closed because their request headers did not all come in time.");
  sample_u(b, "eventstore_http_header_timeouts_total", NULL, NULL, ld(&c->header_timeouts));
}

/* ---- the handlers ------------------------------------------------------------------------- */

/* §8: each projection's lag (positions and seconds behind the head) and
 * whether it stopped at an event; one last position and one event read
 * per projection (es_store_projection_lag), never a scan. A tenant's
 * token sees the lag over its tenant's events. */
static int projection_figures(es_buf *b, es_store *s, es_err *err) {
  es_projections list = {0};
  int rc = es_store_projections(s, NULL, &list, err);
  int64_t *lag = calloc(list.n ? list.n : 1, 2 * sizeof *lag);
  if (rc == ES_OK && !lag) rc = es_fail(err, ES_STORAGE, "out of memory");
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    int64_t head;
    rc = es_store_projection_lag(s, &list.v[i], &head, &lag[2 * i], &lag[2 * i + 1], err);
  }
  if (rc == ES_OK && list.n) {
    family(b, "eventstore_projection_lag_events", "gauge",
           "Positions after the projection's checkpoint (the generation being folded).");
    for (size_t i = 0; i < list.n; i++)
      sample_i(b, "eventstore_projection_lag_events", "projection", list.v[i].name, lag[2 * i]);
    family(b, "eventstore_projection_lag_seconds", "gauge",
           "How long ago the oldest event the projection has not folded was written.");
    for (size_t i = 0; i < list.n; i++)
      sample_secs(b, "eventstore_projection_lag_seconds", "projection", list.v[i].name,
                  (uint64_t)lag[2 * i + 1] * 1000000u);
    family(b, "eventstore_projection_failed", "gauge",
           "1 while the projection is stopped at an event that raised (retry or skip it).");
    for (size_t i = 0; i < list.n; i++)
      sample_i(b, "eventstore_projection_failed", "projection", list.v[i].name, list.v[i].failed);
  }
  free(lag);
  es_projections_destroy(&list);
  return rc;
}

int es_metrics(const es_http_req *r, es_http_resp *out) {
  es_buf *b = &out->body;
  es_err err = {0};
  if (store_counts(b, r->store, &err)) {
    es_buf_destroy(b);
    return es_http_fail_err(out, &err);
  }
  store_calls(b, r->store);
  if (projection_figures(b, r->store, &err)) {
    es_buf_destroy(b);
    return es_http_fail_err(out, &err);
  }
  if (!r->tenant) {
    if (r->ctx->engine) engine_figures(b, r->ctx->engine);
    server_figures(b, r->ctx);
  }
  if (b->oom) {
    es_buf_destroy(b);
    return es_http_fail(out, 503, "STORAGE", "out of memory");
  }
  out->status = 200;
  out->content_type = "text/plain; version=0.0.4; charset=utf-8";
  return 0;
}

int es_healthz(const es_http_req *r, es_http_resp *out) {
  es_err err = {0};
  int64_t pos;
  /* A cheap call that needs the backend (PostgreSQL answering, the file
   * readable): the root's, whatever token (none needed). */
  if (es_store_last_position(r->ctx->root, &pos, &err))
    return es_http_fail(out, 503, es_strerror(err.code), "%s", err.msg);
  out->status = 200;
  es_buf_adds(&out->body, "{\"ok\":true}");
  if (out->body.oom) return es_http_fail(out, 503, "STORAGE", "out of memory");
  return 0;
}
