/*
 * sse.c: the live tails (docs/contract.md §6, docs/http-live.md): Server-Sent
 * Events for one session (`id:` is the index), for every session of the
 * token's store (`id:` is the position) and for a presence namespace.
 *
 * A handler checks the request, takes a stream slot (limits->max_streams),
 * reads what it must answer at once (the first page of history, the
 * presence snapshot: a bad name or a truncated start is a plain HTTP
 * error, not a stream that ends at once) and hands the server a stream
 * state and its callback. The server calls the callback whenever the
 * client's socket can take more: a client that does not read is simply
 * not called, so it is paused, and MHD's connection timeout drops it.
 *
 * What a stream holds is bounded: the callback fetches a page only once
 * everything formatted before it was handed out, and sizes the page so
 * that it is about limits->stream_buffer bytes (from the last page's
 * average event size). A slow client therefore costs one page, never a
 * backlog; appends never wait for any stream (history is read like any
 * reader reads it).
 *
 * Blocking: es_store_wait in slices of SLICE_MS, so a stream notices the
 * server stopping within about a second; with nothing new, the callback
 * keeps waiting (slice after slice) until the keep-alive comment is due
 * (every KEEPALIVE_S seconds, sooner when the request timeout is short),
 * so an idle stream sends a few bytes every few seconds, not every second.
 * The server runs each connection on its own thread, so a callback that
 * blocks holds only its own client.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/internal.h"
#include "store/stats.h"
#include "util/clock.h"

#define SLICE_MS 1000
#define KEEPALIVE_S 15
/* Formatted bytes handed out before more events are formatted from the
 * page (so one call never formats a whole 1 MiB page before sending). */
#define CHUNK (64 * 1024)
/* Page sizes: the first page (a resuming client may be far behind, but
 * the event size is not known yet), and the largest. */
#define FIRST_LIMIT 64
#define MAX_LIMIT 1000
/* Bytes an event costs on the wire beyond its payload and meta (the other
 * fields and the SSE framing), for sizing pages. */
#define EVENT_OVERHEAD 300

enum { SSE_SESSION, SSE_ALL, SSE_PRESENCE };

typedef struct sse {
  int kind;
  es_store *store;             /* retained: the token's store */
  const es_http_ctx *ctx;      /* the server's, outlives the stream */
  char *name;                  /* owned: the session or namespace; NULL for SSE_ALL */
  int64_t after;               /* the index (position) of the last event formatted */
  es_events page;              /* fetched, formatted from `next` on */
  size_t next;
  int64_t limit;               /* the next page's size */
  es_buf out;                  /* formatted, handed out from `off` */
  size_t off;
  uint64_t last_out_ns;        /* when bytes were last handed out */
  uint64_t keepalive_ns;
  int ending;                  /* an error event is queued: end once it is out */
  int ended;                   /* the stream ended itself (not dropped by the server) */
  /* SSE_PRESENCE: patches queued by the watch callback (other threads). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int sync_ok;                 /* mu and cv were initialised */
  es_buf queued;               /* under mu */
  int overflow;                /* under mu: more than stream_buffer bytes were queued */
  uint64_t watch;              /* the watch's token; 0: none */
  /* SSE_ALL on a store that cannot wait across sessions (shards:, §5):
   * followed by read_all cursors, which are the `id:`s. */
  int by_cursor;
  char *cursor;                /* owned: after the last event formatted; NULL: the start */
  char **cursors;              /* of `page`, one per event */
  size_t n_cursors;
  uint64_t seen_version;       /* the store's versions when it was last read */
} sse;

/* ---- the resume point ---------------------------------------------------- */

/* A whole number >= 0 written as decimal digits only (no sign, no space),
 * at most INT64_MAX. */
static int parse_whole(const char *s, int64_t *v) {
  if (!s || !*s) return -1;
  int64_t x = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    int d = *p - '0';
    if (x > (INT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  *v = x;
  return 0;
}

/* Where the stream starts: Last-Event-ID (what a reconnecting browser
 * sends), else ?after, else 0. A bad value is a 400 naming it. An empty
 * one is absent: an EventSource whose last event id is the empty string
 * has none, and the API reads `?after=` as no `after` (docs/http-api.md). */
static int resume_point(const es_http_req *r, int64_t *after, es_http_resp *out) {
  if (r->last_event_id && *r->last_event_id) {
    if (parse_whole(r->last_event_id, after)) {
      es_http_fail(out, 400, "INVALID_ARGUMENT",
                   "Last-Event-ID expects a whole number >= 0 (the id of the last event seen)");
      return -1;
    }
    return 0;
  }
  const char *q = es_http_query(r, "after");
  if (!q || !*q) {
    *after = 0;
    return 0;
  }
  if (parse_whole(q, after)) {
    es_http_fail(out, 400, "INVALID_ARGUMENT",
                 "query parameter 'after' expects a whole number from 0 to %lld",
                 (long long)INT64_MAX);
    return -1;
  }
  return 0;
}

/* ---- slots ----------------------------------------------------------------- */

/* Takes one of limits->max_streams slots; 503 UNAVAILABLE when none is
 * free. The slot is given back by stream_free (or by unadmit when the
 * handler fails after taking it). */
static int admit(const es_http_req *r, es_http_resp *out) {
  unsigned max = r->ctx->limits->max_streams;
  int n = atomic_fetch_add(r->ctx->streams, 1) + 1;
  if (n > (int)max) {
    atomic_fetch_sub(r->ctx->streams, 1);
    es_http_fail(out, 503, "UNAVAILABLE", "too many open streams (the limit is %u); try again later",
                 max);
    return -1;
  }
  return 0;
}

static void unadmit(const es_http_req *r) { atomic_fetch_sub(r->ctx->streams, 1); }

/* ---- the stream state -------------------------------------------------------- */

static uint64_t keepalive_ns(const es_http_ctx *ctx) {
  /* Some bytes must go out well within the connection timeout, or MHD
   * would take a quiet stream for a dead client. */
  unsigned s = KEEPALIVE_S, t = ctx->limits->request_timeout_s;
  if (t && s > t / 2) s = t / 2 ? t / 2 : 1;
  return (uint64_t)s * 1000000000u;
}

static sse *sse_new(const es_http_req *r, int kind, const char *name, int64_t after) {
  sse *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->kind = kind;
  st->ctx = r->ctx;
  st->after = after;
  st->limit = FIRST_LIMIT;
  es_buf_init(&st->out);
  es_buf_init(&st->queued);
  st->keepalive_ns = keepalive_ns(r->ctx);
  if (name && !(st->name = strdup(name))) {
    free(st);
    return NULL;
  }
  st->store = r->store;
  es_store_retain(st->store);
  return st;
}

static void sse_destroy(sse *st) {
  if (!st) return;
  /* Unwatch first: after it no callback can touch st (store.h). */
  if (st->watch) es_store_presence_unwatch(st->store, st->watch);
  if (st->sync_ok) {
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
  }
  es_events_destroy(&st->page);
  es_store_cursors_free(st->cursors, st->n_cursors);
  free(st->cursor);
  es_buf_destroy(&st->out);
  es_buf_destroy(&st->queued);
  free(st->name);
  es_store_release(st->store);
  free(st);
}

/* The server's stream_free: the stream is over (ended, dropped, or the
 * server stopping). A stream the server ended while not stopping and that
 * did not end itself was dropped: the client went away or stopped reading
 * until the connection timed out. */
static void stream_free(void *state) {
  sse *st = state;
  if (!st) return;
  if (!st->ended && !atomic_load(st->ctx->stopping))
    atomic_fetch_add_explicit(&st->ctx->counters->streams_dropped, 1, memory_order_relaxed);
  atomic_fetch_sub(st->ctx->streams, 1);
  sse_destroy(st);
}

/* ---- formatting ---------------------------------------------------------------- */

/* `data: ` lines for text: one line per line of the text (a JSON text
 * has no line break outside its strings, where they are escaped, but a
 * stored payload is not re-checked here, so a CR or LF must not end the
 * field early: SSE joins data lines with LF, the same JSON). */
static void put_data(es_buf *b, const char *s, size_t n) {
  es_buf_adds(b, "data: ");
  size_t start = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\n' || s[i] == '\r') {
      es_buf_add(b, s + start, i - start);
      es_buf_adds(b, "\ndata: ");
      if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') i++;
      start = i + 1;
    }
  }
  es_buf_add(b, s + start, n - start);
  es_buf_adds(b, "\n\n");
}

/* Event i of the page. */
static void put_event(sse *st, size_t i) {
  const es_event *e = &st->page.v[i];
  es_buf json;
  es_buf_init(&json);
  es_wire_event(&json, e, 0);
  if (st->by_cursor) {
    const char *cursor = st->cursors[i];
    es_wire_cursor(&json, e, cursor);
    es_buf_addf(&st->out, "id: %s\nevent: event\n", cursor);
    free(st->cursor);
    if (!(st->cursor = strdup(cursor))) st->out.oom = 1; /* closes the stream: no torn resume */
  } else {
    int64_t id = st->kind == SSE_ALL ? e->position : e->index;
    es_buf_addf(&st->out, "id: %lld\nevent: event\n", (long long)id);
    st->after = id;
  }
  if (json.oom) st->out.oom = 1;
  else put_data(&st->out, json.data, json.len);
  es_buf_destroy(&json);
}

/* The page (and its cursors) is done with. */
static void page_done(sse *st) {
  es_events_destroy(&st->page);
  es_store_cursors_free(st->cursors, st->n_cursors);
  st->cursors = NULL;
  st->n_cursors = 0;
  st->next = 0;
}

/* An error the stream cannot go on after (a store failure, a truncation
 * under the client's feet): told as `event: error` with the error object,
 * then the stream ends. The client may reconnect with Last-Event-ID. */
static void put_error(sse *st, const char *code, const char *msg) {
  es_buf json;
  es_buf_init(&json);
  es_wire_error(&json, code, msg);
  es_buf_adds(&st->out, "event: error\n");
  if (!json.oom) put_data(&st->out, json.data, json.len);
  es_buf_destroy(&json);
  st->ending = 1;
}

static void put_keepalive(sse *st) { es_buf_adds(&st->out, ": keep-alive\n\n"); }

/* The next page's size: about stream_buffer bytes at the last page's
 * average event size. */
static void size_next_page(sse *st) {
  if (!st->page.n) return;
  uint64_t bytes = 0;
  for (size_t i = 0; i < st->page.n; i++) {
    const es_event *e = &st->page.v[i];
    bytes += e->payload_len + (e->meta ? strlen(e->meta) : 0) + EVENT_OVERHEAD;
  }
  uint64_t avg = bytes / st->page.n;
  uint64_t lim = st->ctx->limits->stream_buffer / (avg ? avg : 1);
  st->limit = lim < 1 ? 1 : lim > MAX_LIMIT ? MAX_LIMIT : (int64_t)lim;
}

/* Formats events of the page until CHUNK bytes wait or the page is done. */
static void format_page(sse *st) {
  while (st->next < st->page.n && st->out.len - st->off < CHUNK && !st->out.oom)
    put_event(st, st->next++);
  if (st->next >= st->page.n) {
    size_next_page(st);
    page_done(st);
  }
}

/* Hands out what waits in st->out. */
static ssize_t hand_out(sse *st, char *buf, size_t max) {
  size_t n = st->out.len - st->off;
  if (n > max) n = max;
  memcpy(buf, st->out.data + st->off, n);
  st->off += n;
  if (st->off == st->out.len) {
    st->off = st->out.len = 0;
    /* One big event grew the buffer: give the memory back. */
    if (st->out.cap > 4 * CHUNK) es_buf_destroy(&st->out);
  }
  st->last_out_ns = es_stats_now_ns();
  return (ssize_t)n;
}

static int stopping(const sse *st) { return atomic_load(st->ctx->stopping) != 0; }

/* What both callbacks do first, in this order: end once the server stops;
 * close on out of memory rather than send a torn event; hand out what is
 * formatted; end after an error event went out. 1 with *ret when the
 * callback returns now, 0 when it should fetch or wait for more. */
static int answer_now(sse *st, char *buf, size_t max, ssize_t *ret) {
  if (stopping(st) || st->out.oom || (st->out.len <= st->off && st->ending)) {
    *ret = st->out.oom && !stopping(st) ? -2 : -1;
    st->ended = 1;
    return 1;
  }
  if (st->out.len > st->off) {
    *ret = hand_out(st, buf, max);
    return 1;
  }
  return 0;
}

/* Makes out the 200 answer that streams st through cb (st is then the
 * server's: freed by stream_free when the stream ends). */
static int open_stream(const es_http_req *r, es_http_resp *out, sse *st, es_http_stream_fn cb) {
  out->status = 200;
  out->content_type = "text/event-stream";
  if (r->head) {
    /* HEAD: the checks and the headers a GET gets, and no stream: a body
     * (even chunked framing) would corrupt the next answer on a
     * keep-alive connection. Not opened, so not counted as dropped. */
    st->ended = 1;
    stream_free(st);
    return 0;
  }
  atomic_fetch_add_explicit(&r->ctx->counters->streams_opened, 1, memory_order_relaxed);
  out->stream = cb;
  out->stream_state = st;
  out->stream_free = stream_free;
  return 0;
}

/* ---- the events' callback (session and all) --------------------------------------- */

/* A sum of the store's versions: moves with every commit it can see, this
 * process's or another's. */
static uint64_t versions(es_store *s) {
  uint64_t d = 0;
  es_err err = {0};
  es_store_data_version(s, &d, &err); /* failing: the next read meets the failure */
  return es_store_version(s) + d * 7919;
}

/* The next page of a stream followed by cursors: read after the cursor; when
 * nothing is new, look at the store's versions every CURSOR_POLL_MS until
 * one moves or SLICE_MS passed (a sharded store has no wait across
 * sessions: positions are per shard). */
#define CURSOR_POLL_MS 50
static int cursor_fetch(sse *st, es_err *err) {
  for (int waited = 0; waited < SLICE_MS; waited += CURSOR_POLL_MS) {
    uint64_t v = versions(st->store);
    if (waited == 0 || v != st->seen_version) {
      st->seen_version = v; /* taken before the read: a commit after it moves it */
      page_done(st);
      int rc = es_store_read_all_cursor(st->store, st->cursor, st->limit, &st->page, &st->cursors, err);
      st->n_cursors = rc ? 0 : st->page.n;
      if (rc || st->page.n) return rc;
    }
    if (stopping(st)) return ES_OK;
    struct timespec pause = {0, CURSOR_POLL_MS * 1000000L};
    nanosleep(&pause, NULL);
  }
  return ES_OK;
}

static ssize_t events_cb(void *state, char *buf, size_t max) {
  sse *st = state;
  for (;;) {
    ssize_t now;
    if (answer_now(st, buf, max, &now)) return now;
    if (st->next < st->page.n) {
      format_page(st);
      continue;
    }
    es_err err = {0};
    int rc = st->by_cursor ? cursor_fetch(st, &err)
                           : es_store_wait(st->store, st->kind == SSE_SESSION ? st->name : NULL,
                                           st->after, SLICE_MS, st->limit, &st->page, &err);
    if (rc) {
      put_error(st, es_strerror(err.code), err.msg);
      continue;
    }
    if (st->page.n) {
      st->next = 0;
      continue;
    }
    page_done(st);
    if (es_stats_now_ns() - st->last_out_ns >= st->keepalive_ns) put_keepalive(st);
  }
}

/* The common part of the two event streams: a state with the first page
 * read (so that a bad name, a truncated start or a store that is down is
 * an HTTP error). */
/* Whether the store waits across sessions (a sharded one does not: it is
 * followed by read_all cursors). Asked with a wait that reads nothing. */
static int waits_across(es_store *s) {
  es_events none;
  es_err err = {0};
  int rc = es_store_wait(s, NULL, INT64_MAX, 0, 1, &none, &err);
  if (rc == ES_OK) es_events_destroy(&none);
  return rc != ES_INVALID_ARGUMENT;
}

/* A cursor stream's resume point: Last-Event-ID (the `id:` of the last event
 * seen, a cursor), else ?after; "0" or none: the start. */
static const char *resume_cursor(const es_http_req *r) {
  const char *c = r->last_event_id && *r->last_event_id ? r->last_event_id : es_http_query(r, "after");
  return c && *c && strcmp(c, "0") != 0 ? c : NULL;
}

static int events_stream(const es_http_req *r, es_http_resp *out, int kind, const char *session) {
  int64_t after = 0;
  int by_cursor = kind == SSE_ALL && !waits_across(r->store);
  if (!by_cursor && resume_point(r, &after, out)) return 0;
  if (admit(r, out)) return 0;
  sse *st = sse_new(r, kind, session, after);
  const char *cursor = by_cursor ? resume_cursor(r) : NULL;
  if (st && cursor && !(st->cursor = strdup(cursor))) {
    sse_destroy(st);
    st = NULL;
  }
  if (!st) {
    unadmit(r);
    return es_http_fail(out, 503, "STORAGE", "out of memory");
  }
  st->by_cursor = by_cursor;
  es_err err = {0};
  int rc;
  if (by_cursor) {
    st->seen_version = versions(st->store);
    rc = es_store_read_all_cursor(st->store, st->cursor, st->limit, &st->page, &st->cursors, &err);
    st->n_cursors = rc ? 0 : st->page.n;
  } else {
    rc = kind == SSE_SESSION
             ? es_store_read(st->store, session, after, ES_NONE, st->limit, &st->page, &err)
             : es_store_read_all(st->store, after, st->limit, &st->page, &err);
  }
  if (rc) {
    sse_destroy(st);
    unadmit(r);
    return es_http_fail_err(out, &err);
  }
  /* A comment first, so the client sees at once that the stream is open
   * even when nothing happens for a while. */
  put_keepalive(st);
  return open_stream(r, out, st, events_cb);
}

int es_sse_session(const es_http_req *r, es_http_resp *out) {
  return events_stream(r, out, SSE_SESSION, r->seg[2]);
}

int es_sse_all(const es_http_req *r, es_http_resp *out) {
  return events_stream(r, out, SSE_ALL, NULL);
}

/* ---- presence --------------------------------------------------------------------- */

/* The JSON value of a presence row (its canonical text; null for a
 * deletion). */
static void put_value(es_buf *b, const es_presence_row *row) {
  if (row->value) es_buf_add(b, row->value, row->value_len);
  else es_buf_adds(b, "null");
}

/* One patch per participant of a write, as presence_subscribe gives it:
 * {participant, values, seen, at} with only the fields that won. */
static void put_patches(es_buf *b, const es_presence_rows *applied) {
  size_t i = 0;
  while (i < applied->n) {
    const es_presence_row *first = &applied->v[i];
    es_buf json;
    es_buf_init(&json);
    es_buf_adds(&json, "{\"participant\":");
    es_wire_cstr(&json, first->participant);
    es_buf_adds(&json, ",\"values\":{");
    size_t j = i;
    for (; j < applied->n && strcmp(applied->v[j].participant, first->participant) == 0; j++) {
      if (j > i) es_buf_addc(&json, ',');
      es_wire_cstr(&json, applied->v[j].field);
      es_buf_addc(&json, ':');
      put_value(&json, &applied->v[j]);
    }
    es_buf_adds(&json, "},\"seen\":");
    es_wire_int(&json, first->seen);
    es_buf_adds(&json, ",\"at\":");
    es_wire_int(&json, first->at);
    es_buf_addc(&json, '}');
    es_buf_adds(b, "event: presence\n");
    if (json.oom) b->oom = 1;
    else put_data(b, json.data, json.len);
    es_buf_destroy(&json);
    i = j;
  }
}

/* The store's watch callback: runs on the writing thread, under the
 * store's watch lock, so it only formats and queues (never blocks on the
 * client). Past stream_buffer queued bytes the stream is marked overflowed:
 * presence has no resume point, so dropping patches silently would leave
 * the client wrong; the stream ends with an error instead and the client
 * reconnects for a fresh snapshot. */
static void on_presence(void *ctx, const char *ns, const es_presence_rows *applied) {
  sse *st = ctx;
  (void)ns;
  pthread_mutex_lock(&st->mu);
  if (!st->overflow) {
    put_patches(&st->queued, applied);
    if (st->queued.oom || st->queued.len > st->ctx->limits->stream_buffer) {
      st->overflow = 1;
      es_buf_destroy(&st->queued);
    }
  }
  pthread_cond_signal(&st->cv);
  pthread_mutex_unlock(&st->mu);
}

static ssize_t presence_cb(void *state, char *buf, size_t max) {
  sse *st = state;
  for (;;) {
    ssize_t now;
    if (answer_now(st, buf, max, &now)) return now;
    struct timespec until = es_timespec_in(CLOCK_MONOTONIC, SLICE_MS);
    pthread_mutex_lock(&st->mu);
    while (!st->queued.len && !st->overflow && !stopping(st))
      if (pthread_cond_timedwait(&st->cv, &st->mu, &until) == ETIMEDOUT) break;
    int overflow = st->overflow;
    if (!overflow && st->queued.len) {
      /* take the queued bytes whole: st->out is empty here */
      es_buf t = st->out;
      st->out = st->queued;
      st->queued = t;
      st->off = 0;
    }
    pthread_mutex_unlock(&st->mu);
    if (overflow) {
      put_error(st, "UNAVAILABLE",
                "presence changes came faster than this client read them; reconnect for a new "
                "snapshot");
      continue;
    }
    if (st->out.len == 0 && es_stats_now_ns() - st->last_out_ns >= st->keepalive_ns)
      put_keepalive(st);
  }
}

/* The snapshot: every live row of the namespace, as presence_read gives
 * them ({participant, field, value, seen, at, expires_at}). */
static void put_snapshot(es_buf *b, const es_presence_rows *rows) {
  es_buf json;
  es_buf_init(&json);
  es_wire_presence_rows(&json, rows);
  es_buf_adds(b, "event: snapshot\n");
  if (json.oom) b->oom = 1;
  else put_data(b, json.data, json.len);
  es_buf_destroy(&json);
}

/* Presence has no resumable id (a change is not an event with a place in
 * a sequence): Last-Event-ID and ?after are ignored; every connection
 * starts with the snapshot. */
int es_sse_presence(const es_http_req *r, es_http_resp *out) {
  const char *ns = r->seg[2];
  es_err err = {0};
  if (es_check_name("namespace", ns, &err)) return es_http_fail_err(out, &err);
  if (admit(r, out)) return 0;
  sse *st = sse_new(r, SSE_PRESENCE, ns, 0);
  if (!st) {
    unadmit(r);
    return es_http_fail(out, 503, "STORAGE", "out of memory");
  }
  pthread_condattr_t ca;
  int ok = pthread_condattr_init(&ca) == 0;
  if (ok) {
    ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
         pthread_mutex_init(&st->mu, NULL) == 0;
    if (ok && pthread_cond_init(&st->cv, &ca) != 0) {
      pthread_mutex_destroy(&st->mu);
      ok = 0;
    }
    pthread_condattr_destroy(&ca);
  }
  if (!ok) {
    sse_destroy(st);
    unadmit(r);
    return es_http_fail(out, 503, "STORAGE", "cannot set up the stream");
  }
  st->sync_ok = 1;
  /* Watch before reading, so no change falls between the snapshot and the
   * first patch (a patch may repeat what the snapshot shows: applying it
   * again changes nothing). */
  st->watch = es_store_presence_watch(st->store, ns, on_presence, st);
  if (!st->watch) {
    sse_destroy(st);
    unadmit(r);
    return es_http_fail(out, 503, "STORAGE", "out of memory (or the store is closed)");
  }
  es_presence_rows rows;
  if (es_store_presence_read(st->store, ns, &rows, &err)) {
    sse_destroy(st);
    unadmit(r);
    return es_http_fail_err(out, &err);
  }
  put_keepalive(st);
  put_snapshot(&st->out, &rows);
  es_presence_rows_destroy(&rows);
  return open_stream(r, out, st, presence_cb);
}
