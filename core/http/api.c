/*
 * api.c: the JSON endpoints (docs/http-api.md). Each handler reads the
 * whole request (path segments, query, body) before its one store call, so
 * a bad request is answered 4xx having changed nothing, and answers with
 * the Lua face's names and shapes (module/store_handle.c), as JSON.
 *
 * Bodies are read by codec/json_doc.c: strict JSON (es_json_validate's
 * acceptance), every value with its raw text, so a payload reaches the
 * store as es_json_canonicalize(raw): integers exact over all of int64,
 * floats never through a double and back. Unknown fields are refused by
 * name, so a typo ("expeted") is a 400, never a silently ignored option.
 *
 * Names arrive as JSON strings with their length: a NUL byte inside one is
 * refused here (the store's C API takes NUL-terminated strings and would
 * silently cut "a\u0000b" to "a"); the store applies every other name rule.
 *
 * Tenancy is the token's handle (r->store). The one exception is state:
 * the engine folds on the root store, so a tenant's session is named there
 * as stored, tenant + ES_TENANT_SEP + session, and the prefix is taken out
 * of the engine's messages again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_doc.h"
#include "engine/type_stats.h"
#include "http/internal.h"

#define DEFAULT_LIMIT 100
#define DEFAULT_MAX_BATCH 1000
#define DEFAULT_MAX_LIMIT 1000
/* fail's max_failures when the body leaves it out: the engine's default
 * (docs/engine.md, es_engine_opts_init), so a remote worker and a local
 * handler dead-letter after the same number of failures. */
#define DEFAULT_MAX_FAILURES 5

/* ------------------------------------------------------------------------ */
/* limits, answers */

static size_t max_batch(const es_http_req *r) {
  size_t m = r->ctx && r->ctx->limits ? r->ctx->limits->max_batch : 0;
  return m ? m : DEFAULT_MAX_BATCH;
}

static int64_t max_limit(const es_http_req *r) {
  int64_t m = r->ctx && r->ctx->limits ? r->ctx->limits->max_limit : 0;
  return m > 0 ? m : DEFAULT_MAX_LIMIT;
}

/* Ends a successful answer: 200, or 503 when writing it ran out of memory
 * (the call itself succeeded; the client must read again to see it). */
static int answer(es_http_resp *out) {
  if (out->body.oom) {
    es_buf_destroy(&out->body);
    return es_http_fail(out, 503, "STORAGE", "out of memory while writing the answer");
  }
  out->status = 200;
  out->content_type = NULL;
  return 0;
}

static void put_bool(es_buf *b, int v) { es_buf_adds(b, v ? "true" : "false"); }

/* A latency in microseconds, with the nanoseconds as a fraction (as
 * store:stats() gives it). */
static void put_us(es_buf *b, uint64_t ns) {
  es_err err = {0};
  if (es_json_format_double((double)ns / 1000.0, b, &err) != ES_OK) es_buf_adds(b, "null");
}

/* ,"p50_us":..,"p99_us":..,"max_us":.. (store:stats()'s names). */
static void put_percentiles(es_buf *b, uint64_t p50_ns, uint64_t p99_ns, uint64_t max_ns) {
  es_buf_adds(b, ",\"p50_us\":");
  put_us(b, p50_ns);
  es_buf_adds(b, ",\"p99_us\":");
  put_us(b, p99_ns);
  es_buf_adds(b, ",\"max_us\":");
  put_us(b, max_ns);
}

/* ------------------------------------------------------------------------ */
/* Pages: a listing ends early at max_response_bytes */

#define DEFAULT_MAX_RESPONSE ((size_t)8 << 20)

static size_t max_response(const es_http_req *r) {
  size_t m = r->ctx && r->ctx->limits ? r->ctx->limits->max_response_bytes : 0;
  return m ? m : DEFAULT_MAX_RESPONSE;
}

/* A listing of unbounded rows (events with their payloads, session rows
 * with their seal reasons), written as it is read so that the answer, which
 * libmicrohttpd holds until a slow client has read it, stays near
 * max_response_bytes (docs/limits.md "Answers"). The store is asked for
 * chunks of items after the last one written, each sized by the room left
 * at item_max bytes an item (READ_AHEAD), so what is read is bounded too;
 * each item is written, and the page ends at `limit`, when
 * the store has no more, or before the item that would take the answer
 * past the cap: that item is left out and the route's cursor goes on
 * from the one before it (capped = 1). The first item is always written,
 * however large, so a client paging on never stalls on one large item. */
typedef struct page page;
struct page {
  const es_http_req *r;
  es_buf *b;
  int64_t limit, n;   /* at most, and written */
  size_t item_max;    /* the most bytes one item can take (ES_WIRE_*) */
  int keep_all;       /* every item read is written (claims: a claimed event must reach its
                       * worker), so no chunk is read without room for all of it */
  int capped;         /* the page ended at the cap */
  /* the route's: reads up to k items after the last one taken; *got: how many */
  int (*read)(page *p, int64_t k, size_t *got, es_err *err);
  void (*put)(page *p, size_t i);  /* writes item i of the last read */
  void (*take)(page *p, size_t i); /* item i is in the page: the next read goes on after it */
  void (*drop)(page *p);           /* frees the last read */
};

/* A listing that drops what does not fit reads up to this many times the
 * room left at the items' largest size per store call: fewer calls where
 * items are small (a page of 100 small events in 5 calls, not 20, at the
 * defaults), a few dropped where they are large. */
#define READ_AHEAD 4

static int page_fill(page *p, es_err *err) {
  size_t cap = max_response(p->r);
  int more = 1;
  while (more && p->n < p->limit) {
    size_t room = cap > p->b->len ? cap - p->b->len : 0;
    /* a listing that drops what does not fit may read ahead of the room */
    int64_t k = (int64_t)(room / p->item_max * (p->keep_all ? 1 : READ_AHEAD));
    if (k < 1) {
      if (p->keep_all && p->n > 0) {
        p->capped = 1;
        break;
      }
      k = 1; /* one more may fit: written and measured */
    }
    if (k > p->limit - p->n) k = p->limit - p->n;
    size_t got = 0;
    int rc = p->read(p, k, &got, err);
    if (rc) {
      p->drop(p);
      if (!p->keep_all || p->n == 0) return rc;
      p->capped = 1; /* what was claimed is answered; the next claim meets the error */
      break;
    }
    more = (int64_t)got == k; /* fewer than asked: the store has no more */
    for (size_t i = 0; i < got; i++) {
      size_t before = p->b->len;
      if (p->n) es_buf_addc(p->b, ',');
      p->put(p, i);
      if (!p->keep_all && p->n > 0 && p->b->len > cap) {
        p->b->len = before;
        p->capped = 1;
        more = 0;
        break;
      }
      p->take(p, i);
      p->n++;
    }
    p->drop(p);
  }
  return ES_OK;
}

/* ,"capped":true when the page ended at the cap (nothing otherwise: an
 * answer within the cap is written as before the cap existed). */
static void put_capped(es_buf *b, const page *p) {
  if (p->capped) es_buf_adds(b, ",\"capped\":true");
}

/* A page of events (read, read_all, dead letters, claims). */
typedef struct event_page {
  page p;
  es_events list;
  int claimed;         /* write each event's attempt */
  int by_index;        /* the route goes on after an index (else a position) */
  int64_t after;       /* the last event written's index or position */
  /* the route's arguments */
  const char *session;
  int64_t through;
  const char *holder;
  int64_t ttl;
  const char **types;
  size_t n_types;
  int64_t retry_at;
} event_page;

static void event_put(page *p, size_t i) {
  event_page *e = (event_page *)p;
  es_wire_event(p->b, &e->list.v[i], e->claimed);
}

static void event_take(page *p, size_t i) {
  event_page *e = (event_page *)p;
  e->after = e->by_index ? e->list.v[i].index : e->list.v[i].position;
}

static void event_drop(page *p) { es_events_destroy(&((event_page *)p)->list); }

/* Starts an event page of r, written into out's body. */
static void event_page_init(event_page *e, const es_http_req *r, es_http_resp *out,
                            int64_t limit, int64_t after,
                            int (*read)(page *, int64_t, size_t *, es_err *)) {
  memset(e, 0, sizeof *e);
  e->p.r = r;
  e->p.b = &out->body;
  e->p.limit = limit;
  size_t max_payload = es_store_max_payload(r->store); /* a router's may be SIZE_MAX: saturate */
  e->p.item_max = max_payload > SIZE_MAX - ES_WIRE_EVENT_MAX(0) ? SIZE_MAX : ES_WIRE_EVENT_MAX(max_payload);
  e->p.read = read;
  e->p.put = event_put;
  e->p.take = event_take;
  e->p.drop = event_drop;
  e->after = after;
}

/* ------------------------------------------------------------------------ */
/* path and query */

/* Path segment i as an event index: decimal digits only, 1..INT64_MAX. */
static int seg_index(const es_http_req *r, size_t i, int64_t *v, es_http_resp *out) {
  const char *s = i < r->nseg ? r->seg[i] : NULL;
  int64_t x = 0;
  int ok = s && *s;
  for (const char *p = s; ok && *p; p++) {
    if (*p < '0' || *p > '9' || x > (INT64_MAX - (*p - '0')) / 10) ok = 0;
    else x = x * 10 + (*p - '0');
  }
  if (!ok || x < 1) {
    es_http_fail(out, 400, "INVALID_ARGUMENT",
                 "the event index in the path must be a whole number from 1 to %lld, got '%.40s'",
                 (long long)INT64_MAX, s ? s : "");
    return -1;
  }
  *v = x;
  return 0;
}

/* A string query parameter; empty counts as absent. */
static const char *query_str(const es_http_req *r, const char *name) {
  const char *v = es_http_query(r, name);
  return v && *v ? v : NULL;
}

static int query_limit(const es_http_req *r, int64_t dflt, int64_t *v, es_http_resp *out) {
  int64_t hi = max_limit(r);
  return es_http_query_int(r, "limit", 1, hi, dflt < hi ? dflt : hi, v, out);
}

/* ------------------------------------------------------------------------ */
/* bodies */

typedef struct body {
  es_json_doc *doc;    /* NULL when there was no body */
  const es_jval *root; /* an object, or NULL (no body: every field absent) */
} body;

static void body_free(body *b) {
  es_json_doc_free(b->doc);
  b->doc = NULL;
  b->root = NULL;
}

/* Reads the request body as a JSON object. required: an absent or empty
 * body is 400 (else it reads as {}). -1 with out made on failure. */
static int read_body(const es_http_req *r, es_http_resp *out, int required, body *b) {
  b->doc = NULL;
  b->root = NULL;
  if (!r->body || r->body_len == 0) {
    if (!required) return 0;
    es_http_fail(out, 400, "INVALID_ARGUMENT", "this request needs a JSON object as its body");
    return -1;
  }
  es_err err = {0};
  if (es_json_doc_parse(r->body, r->body_len, &b->doc, &err) != ES_OK) {
    es_http_fail_err(out, &err);
    return -1;
  }
  const es_jval *root = es_json_doc_root(b->doc);
  if (root->type != ES_JOBJECT) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "the body must be a JSON object, got %s",
                 es_jtype_name(root->type));
    body_free(b);
    return -1;
  }
  b->root = root;
  return 0;
}

/* Refuses a member of obj not in `allowed` (NULL-terminated). ctx prefixes
 * the message ("events[2]: "). */
static int check_fields(es_http_resp *out, const es_jval *obj, const char *ctx,
                        const char *const *allowed) {
  if (!obj) return 0;
  for (size_t k = 0; k < obj->n; k++) {
    int known = 0;
    for (const char *const *a = allowed; *a && !known; a++)
      known = obj->key_lens[k] == strlen(*a) && memcmp(obj->keys[k], *a, obj->key_lens[k]) == 0;
    if (!known) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "%sunknown field '%.64s'", ctx, obj->keys[k]);
      return -1;
    }
  }
  return 0;
}

/* The member name of obj, NULL when absent or null. */
static const es_jval *member(const es_jval *obj, const char *name) {
  const es_jval *v = obj ? es_jval_get(obj, name) : NULL;
  return v && v->type != ES_JNULL ? v : NULL;
}

/* An integer member (ctx: the message's prefix for the field, "" or
 * "events[2]."). Absent or null: *v = dflt (and *has = 0), or 400 when
 * required. A float, a string, an integer beyond int64 or INT64_MIN (the
 * C API's "absent") is 400 naming the field. */
static int get_int(es_http_resp *out, const es_jval *obj, const char *ctx, const char *name,
                   int required, int64_t dflt, int64_t *v, int *has) {
  const es_jval *x = member(obj, name);
  if (has) *has = x != NULL;
  if (!x) {
    if (required) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' is required", ctx, name);
      return -1;
    }
    *v = dflt;
    return 0;
  }
  if (x->type != ES_JINT) {
    es_http_fail(out, 400, "INVALID_ARGUMENT",
                 "field '%s%s' must be a whole number (a JSON integer within int64), got %s", ctx,
                 name, es_jtype_name(x->type));
    return -1;
  }
  if (x->i == ES_NONE) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' is out of range (%lld)", ctx, name,
                 (long long)x->i);
    return -1;
  }
  *v = x->i;
  return 0;
}

/* A name member: a string without NUL bytes (arena text, NUL-terminated).
 * Absent or null: *v = NULL, or 400 when required. */
static int get_name(es_http_resp *out, const es_jval *obj, const char *ctx, const char *name,
                    int required, const char **v) {
  const es_jval *x = member(obj, name);
  *v = NULL;
  if (!x) {
    if (!required) return 0;
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' is required", ctx, name);
    return -1;
  }
  if (x->type != ES_JSTRING) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' must be a string, got %s", ctx, name,
                 es_jtype_name(x->type));
    return -1;
  }
  if (memchr(x->str, '\0', x->len)) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' must not contain a NUL byte", ctx, name);
    return -1;
  }
  *v = x->str;
  return 0;
}

/* Free text (fail's error, settle's reason): any string, kept as the store
 * keeps free text (es_text_clean: NUL and bad bytes become U+FFFD, cut at
 * ES_MAX_TEXT_BYTES). *text is malloc'd (NULL when absent). */
static int get_text(es_http_resp *out, const es_jval *obj, const char *name, int required,
                    char **text) {
  const es_jval *x = member(obj, name);
  *text = NULL;
  if (!x) {
    if (!required) return 0;
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s' is required", name);
    return -1;
  }
  if (x->type != ES_JSTRING) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s' must be a string, got %s", name,
                 es_jtype_name(x->type));
    return -1;
  }
  if (es_text_clean(x->str, x->len, ES_MAX_TEXT_BYTES, text, NULL) != ES_OK) {
    es_http_fail(out, 503, "STORAGE", "out of memory");
    return -1;
  }
  return 0;
}

static int get_bool(es_http_resp *out, const es_jval *obj, const char *ctx, const char *name,
                    int *v) {
  const es_jval *x = member(obj, name);
  *v = 0;
  if (!x) return 0;
  if (x->type != ES_JBOOL) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s%s' must be true or false, got %s", ctx,
                 name, es_jtype_name(x->type));
    return -1;
  }
  *v = x->boolean;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* events in a body (append, complete): the Lua event table's shape */

static const char *const event_fields[] = {"type",       "payload", "id",       "lane",
                                           "key",        "settled", "not_before", "at",
                                           "delay_ms",   "cause",   "revision", "meta", NULL};
static const char *const cause_fields[] = {"index", "attempt", NULL};

typedef struct batch {
  es_new_event *v;   /* owned array of n; strings borrowed from the document */
  size_t n;
  es_buf payloads;   /* every payload's canonical text, NUL after each */
} batch;

static void batch_free(batch *b) {
  free(b->v);
  es_buf_destroy(&b->payloads);
  memset(b, 0, sizeof *b);
}

int es_http_traceparent_ok(const char *v) {
  size_t n = strlen(v);
  if (n < 55 || n > ES_HTTP_TRACEPARENT_MAX || (n > 55 && v[55] != '-')) return 0;
  if (!strncmp(v, "00", 2) && n != 55) return 0;
  if (!strncmp(v, "ff", 2) || v[2] != '-' || v[35] != '-' || v[52] != '-') return 0;
  int zero_trace = 1, zero_parent = 1;
  for (size_t i = 0; i < 55; i++) {
    if (i == 2 || i == 35 || i == 52) continue;
    if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f'))) return 0;
    if (i > 2 && i < 35 && v[i] != '0') zero_trace = 0;
    if (i > 35 && i < 52 && v[i] != '0') zero_parent = 0;
  }
  for (size_t i = 55; i < n; i++)
    if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e) return 0;
  return !zero_trace && !zero_parent;
}

/* An event's `meta` (absent or null: none; else an object) as canonical
 * text into buf at *at (SIZE_MAX: none), its length in *len; §6: the
 * request's traceparent added as meta.traceparent where the event has
 * none. -1 with out made on failure. */
static int read_meta(const es_http_req *r, es_http_resp *out, const es_jval *ev, const char *ctx,
                     es_buf *buf, size_t *at, size_t *len) {
  const es_jval *meta = es_jval_get(ev, "meta");
  if (meta && meta->type == ES_JNULL) meta = NULL;
  if (meta && meta->type != ES_JOBJECT) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%smeta' must be an object, got %s", ctx,
                 es_jtype_name(meta->type));
    return -1;
  }
  if (!meta && !r->traceparent) return 0;
  es_buf canon;
  es_buf_init(&canon);
  es_err err = {0};
  const char *key = "traceparent";
  int rc = meta ? es_json_canonicalize(meta->raw, meta->raw_len, &canon, &err) : ES_OK;
  *at = buf->len;
  if (rc == ES_OK)
    rc = es_json_object_defaults(meta ? canon.data : NULL, canon.len, &key, &r->traceparent,
                                 r->traceparent ? 1 : 0, buf, &err);
  es_buf_destroy(&canon);
  if (rc == ES_OK && es_buf_addc(buf, '\0') != ES_OK) rc = es_fail(&err, ES_STORAGE, "out of memory");
  if (rc != ES_OK) {
    es_http_fail_err(out, &err);
    return -1;
  }
  *len = buf->len - *at - 1;
  return 0;
}

/* Reads the member `field` of obj (an array of events; absent or null: an
 * empty batch unless required) into b. -1 with out made on failure. */
static int read_events(const es_http_req *r, es_http_resp *out, const es_jval *obj,
                       const char *field, int required, batch *b) {
  memset(b, 0, sizeof *b);
  es_buf_init(&b->payloads);
  const es_jval *arr = member(obj, field);
  if (!arr) {
    if (!required) return 0;
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s' is required (an array of events)", field);
    return -1;
  }
  if (arr->type != ES_JARRAY) {
    /* One event without its list must not read as an empty batch. */
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field '%s' must be an array of events, got %s%s",
                 field, es_jtype_name(arr->type),
                 arr->type == ES_JOBJECT ? " (wrap one event in a list: [event])" : "");
    return -1;
  }
  if (arr->n > max_batch(r)) {
    es_http_fail(out, 413, "TOO_LARGE", "%zu events in '%s', over the limit of %zu", arr->n, field,
                 max_batch(r));
    return -1;
  }
  size_t n = arr->n;
  b->v = calloc(n ? n : 1, sizeof *b->v + 2 * sizeof(size_t));
  if (!b->v) {
    es_http_fail(out, 503, "STORAGE", "out of memory");
    return -1;
  }
  /* where each payload starts in b->payloads (SIZE_MAX: none); pointers
   * are set once the buffer stops growing */
  size_t *at = (size_t *)(void *)(b->v + (n ? n : 1));
  size_t *meta_at = at + (n ? n : 1); /* the same for each meta */
  int64_t now = ES_NONE;
  for (size_t i = 0; i < n; i++) {
    const es_jval *ev = &arr->items[i];
    es_new_event *e = &b->v[i];
    char ctx[64], cctx[80];
    es_new_event_init(e);
    at[i] = meta_at[i] = SIZE_MAX;
    snprintf(ctx, sizeof ctx, "%s[%zu].", field, i + 1);
    if (ev->type != ES_JOBJECT) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "%s[%zu] must be an object (an event), got %s",
                   field, i + 1, es_jtype_name(ev->type));
      goto fail;
    }
    char uctx[64];
    snprintf(uctx, sizeof uctx, "%s[%zu]: ", field, i + 1);
    if (check_fields(out, ev, uctx, event_fields)) goto fail;
    if (get_name(out, ev, ctx, "type", 1, &e->type) || get_name(out, ev, ctx, "id", 0, &e->id) ||
        get_name(out, ev, ctx, "lane", 0, &e->lane) || get_name(out, ev, ctx, "key", 0, &e->key) ||
        get_bool(out, ev, ctx, "settled", &e->settled) ||
        get_int(out, ev, ctx, "not_before", 0, ES_NONE, &e->not_before, NULL))
      goto fail;
    int has_at, has_delay;
    int64_t t_at, delay;
    if (get_int(out, ev, ctx, "at", 0, ES_NONE, &t_at, &has_at) ||
        get_int(out, ev, ctx, "delay_ms", 0, ES_NONE, &delay, &has_delay))
      goto fail;
    if (has_at || has_delay) {
      es_err err = {0};
      if (e->not_before != ES_NONE) {
        es_http_fail(out, 400, "INVALID_ARGUMENT", "%s[%zu] has both not_before and %s", field,
                     i + 1, has_at ? "at" : "delay_ms");
        goto fail;
      }
      if (has_delay && now == ES_NONE && es_store_now(r->store, &now, &err) != ES_OK) {
        es_http_fail_err(out, &err);
        goto fail;
      }
      char what[48];
      snprintf(what, sizeof what, "%s[%zu]", field, i + 1);
      if (es_timer_not_before(what, now == ES_NONE ? 0 : now, has_delay, delay, has_at, t_at,
                              &e->not_before, &err) != ES_OK) {
        es_http_fail_err(out, &err);
        goto fail;
      }
    }
    const es_jval *cause = member(ev, "cause");
    if (cause) {
      snprintf(cctx, sizeof cctx, "%scause.", ctx);
      if (cause->type != ES_JOBJECT) {
        es_http_fail(out, 400, "INVALID_ARGUMENT",
                     "field '%scause' must be an object {index, attempt}, got %s", ctx,
                     es_jtype_name(cause->type));
        goto fail;
      }
      char cu[96];
      snprintf(cu, sizeof cu, "%s[%zu].cause: ", field, i + 1);
      if (check_fields(out, cause, cu, cause_fields) ||
          get_int(out, cause, cctx, "index", 1, ES_NONE, &e->cause_index, NULL) ||
          get_int(out, cause, cctx, "attempt", 1, ES_NONE, &e->cause_attempt, NULL))
        goto fail;
    }
    if (get_int(out, ev, ctx, "revision", 0, ES_NONE, &e->revision, NULL) ||
        read_meta(r, out, ev, ctx, &b->payloads, &meta_at[i], &e->meta_len))
      goto fail;
    const es_jval *payload = es_jval_get(ev, "payload");
    if (payload) {
      es_err err = {0};
      at[i] = b->payloads.len;
      if (es_json_canonicalize(payload->raw, payload->raw_len, &b->payloads, &err) != ES_OK) {
        es_http_fail_err(out, &err);
        goto fail;
      }
      e->payload_len = b->payloads.len - at[i];
      if (es_buf_addc(&b->payloads, '\0') != ES_OK) {
        es_http_fail(out, 503, "STORAGE", "out of memory");
        goto fail;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (at[i] != SIZE_MAX) b->v[i].payload = b->payloads.data + at[i];
    if (meta_at[i] != SIZE_MAX) b->v[i].meta = b->payloads.data + meta_at[i];
  }
  b->n = n;
  return 0;
fail:
  batch_free(b);
  return -1;
}

/* ------------------------------------------------------------------------ */
/* append and read */

static const char *const append_fields[] = {"events", "expected", "fence", "answer", NULL};

/* The body's optional `answer` (§3.1 opts.answer): *ids = 1 for "ids", 0
 * for "events" or none; another value is 400 naming the field. */
static int get_answer(es_http_resp *out, const es_jval *root, int *ids) {
  const char *a;
  *ids = 0;
  if (get_name(out, root, "", "answer", 0, &a)) return -1;
  if (!a || strcmp(a, "events") == 0) return 0;
  if (strcmp(a, "ids") == 0) return *ids = 1, 0;
  es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'answer' must be \"events\" or \"ids\"");
  return -1;
}

/* `"events":[...]` or, under answer = "ids", `"ids":[...]`: an append's
 * stored events (the list is left to the caller). */
static void put_stored(es_buf *b, const es_events *stored, int ids) {
  if (!ids) {
    es_buf_adds(b, "\"events\":");
    es_wire_events_array(b, stored, 0);
    return;
  }
  es_buf_adds(b, "\"ids\":[");
  for (size_t i = 0; i < stored->n; i++) {
    if (i) es_buf_addc(b, ',');
    es_wire_cstr(b, stored->v[i].id);
  }
  es_buf_addc(b, ']');
}

int es_api_append(const es_http_req *r, es_http_resp *out) {
  const char *session = r->seg[2];
  body bd;
  batch b;
  int64_t expected, fence;
  int ids;
  if (read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", append_fields) || get_answer(out, bd.root, &ids) ||
      get_int(out, bd.root, "", "expected", 0, ES_NONE, &expected, NULL) ||
      get_int(out, bd.root, "", "fence", 0, ES_NONE, &fence, NULL) ||
      read_events(r, out, bd.root, "events", 1, &b)) {
    body_free(&bd);
    return 0;
  }
  es_events stored = {0};
  int pending = 0;
  es_err err = {0};
  int rc = es_store_append(r->store, session, b.v, b.n, expected, fence, &stored, &pending, &err);
  batch_free(&b);
  body_free(&bd);
  if (rc != ES_OK) return es_http_fail_err(out, &err);
  es_buf_addc(&out->body, '{');
  put_stored(&out->body, &stored, ids);
  es_buf_adds(&out->body, ",\"pending\":");
  put_bool(&out->body, pending);
  es_buf_addc(&out->body, '}');
  es_events_destroy(&stored);
  return answer(out);
}

static int read_page(page *p, int64_t k, size_t *got, es_err *err) {
  event_page *e = (event_page *)p;
  int64_t through = ES_NONE;
  int rc = es_store_events_page(p->r->store, e->session, e->after, e->through, k, &e->list,
                                &through, err);
  /* the first chunk pins the head (through left out); every later one reads below it */
  if (rc == ES_OK && e->through == ES_NONE) e->through = through;
  *got = e->list.n;
  return rc;
}

static const char *const append_many_fields[] = {"batches", "answer", NULL};
static const char *const batch_fields[] = {"session", "events", "expected", "fence", NULL};

/* POST /v1/events {batches: [{session, events, expected?, fence?}],
 * answer?} -> {batches: [{events | ids, pending}]}: §3.1 append_many,
 * every batch or none. */
int es_api_append_many(const es_http_req *r, es_http_resp *out) {
  body bd;
  int ids;
  if (read_body(r, out, 1, &bd)) return 0;
  const es_jval *arr = member(bd.root, "batches");
  if (check_fields(out, bd.root, "", append_many_fields) || get_answer(out, bd.root, &ids)) goto done;
  if (!arr || arr->type != ES_JARRAY) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'batches' must be an array of {session, events}, got %s",
                 arr ? es_jtype_name(arr->type) : "nothing");
    goto done;
  }
  if (arr->n > max_batch(r)) {
    es_http_fail(out, 413, "TOO_LARGE", "%zu batches, over the limit of %zu", arr->n, max_batch(r));
    goto done;
  }
  size_t n = arr->n;
  es_append_batch *v = calloc(n ? n : 1, sizeof *v);
  batch *bs = calloc(n ? n : 1, sizeof *bs);
  size_t read = 0, total = 0;
  int bad = !v || !bs;
  if (bad) es_http_fail(out, 503, "STORAGE", "out of memory");
  for (size_t i = 0; !bad && i < n; i++) {
    const es_jval *b = &arr->items[i];
    char ctx[48];
    snprintf(ctx, sizeof ctx, "batches[%zu].", i + 1);
    if (b->type != ES_JOBJECT) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "batches[%zu] must be an object {session, events}, got %s",
                   i + 1, es_jtype_name(b->type));
      bad = 1;
      break;
    }
    char uctx[48];
    snprintf(uctx, sizeof uctx, "batches[%zu]: ", i + 1);
    bad = check_fields(out, b, uctx, batch_fields) ||
          get_name(out, b, ctx, "session", 1, &v[i].session) ||
          get_int(out, b, ctx, "expected", 0, ES_NONE, &v[i].expected, NULL) ||
          get_int(out, b, ctx, "fence", 0, ES_NONE, &v[i].fence, NULL) ||
          read_events(r, out, b, "events", 1, &bs[i]);
    read = i + 1;
    v[i].evs = bs[i].v;
    v[i].n = bs[i].n;
    total += bs[i].n;
    if (!bad && total > max_batch(r)) {
      /* the limit is on the call: one transaction holds them all */
      es_http_fail(out, 413, "TOO_LARGE", "%zu events in all batches so far, over the limit of %zu",
                   total, max_batch(r));
      bad = 1;
    }
  }
  if (!bad) {
    es_err err = {0};
    if (es_store_append_many(r->store, v, n, &err)) {
      es_http_fail_err(out, &err);
    } else {
      es_buf_adds(&out->body, "{\"batches\":[");
      for (size_t i = 0; i < n; i++) {
        es_buf_adds(&out->body, i ? ",{" : "{");
        put_stored(&out->body, &v[i].out, ids);
        es_buf_adds(&out->body, ",\"pending\":");
        put_bool(&out->body, v[i].pending);
        es_buf_addc(&out->body, '}');
        es_events_destroy(&v[i].out);
      }
      es_buf_adds(&out->body, "]}");
      answer(out);
    }
  }
  for (size_t i = 0; i < read; i++) batch_free(&bs[i]);
  free(bs);
  free(v);
done:
  body_free(&bd);
  return 0;
}

/* GET /v1/archived?after&limit -> {sessions: [{session, archived_through}],
 * cursor} (§3.9 store:archived). */
int es_api_archived(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (query_limit(r, DEFAULT_LIMIT, &limit, out)) return 0;
  es_archived list = {0};
  es_err err = {0};
  if (es_store_archived(r->store, query_str(r, "after"), limit, &list, &err))
    return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"sessions\":[");
  for (size_t i = 0; i < list.n; i++) {
    es_buf_adds(&out->body, i ? ",{\"session\":" : "{\"session\":");
    es_wire_cstr(&out->body, list.v[i].session);
    es_wire_int_field(&out->body, "archived_through", list.v[i].archived_through);
    es_buf_addc(&out->body, '}');
  }
  es_buf_addc(&out->body, ']');
  es_wire_str_field(&out->body, "cursor", list.cursor);
  es_buf_addc(&out->body, '}');
  es_archived_destroy(&list);
  return answer(out);
}

int es_api_read(const es_http_req *r, es_http_resp *out) {
  int64_t after, through, limit;
  if (es_http_query_int(r, "after", 0, INT64_MAX, 0, &after, out) ||
      es_http_query_int(r, "through", 0, INT64_MAX, ES_NONE, &through, out) ||
      query_limit(r, DEFAULT_LIMIT, &limit, out))
    return 0;
  event_page e;
  event_page_init(&e, r, out, limit, after, read_page);
  e.by_index = 1;
  e.session = r->seg[2];
  e.through = through;
  es_err err = {0};
  es_buf_adds(&out->body, "{\"events\":[");
  if (page_fill(&e.p, &err)) return es_http_fail_err(out, &err);
  es_buf_addc(&out->body, ']');
  es_wire_int_field(&out->body, "through", e.through == ES_NONE ? 0 : e.through);
  put_capped(&out->body, &e.p);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

/* GET /v1/events reads with cursors (§5, store.h es_store_read_all_cursor):
 * a sharded store's events carry theirs ("cursor", the next `after`);
 * any other store's cursor is the position, and its answer is as before. */
typedef struct cursor_page {
  event_page e;
  char **cursors;      /* of the last read, one per event */
  size_t n_cursors;
  char *after;         /* owned: the cursor after the last event written; NULL: the start */
  int oom;
} cursor_page;

static int cursor_read(page *p, int64_t k, size_t *got, es_err *err) {
  cursor_page *c = (cursor_page *)p;
  int rc = es_store_read_all_cursor(p->r->store, c->after, k, &c->e.list, &c->cursors, err);
  c->n_cursors = rc ? 0 : c->e.list.n;
  *got = c->e.list.n;
  return rc;
}

static void cursor_put(page *p, size_t i) {
  cursor_page *c = (cursor_page *)p;
  es_wire_event(p->b, &c->e.list.v[i], 0);
  es_wire_cursor(p->b, &c->e.list.v[i], c->cursors[i]);
}

static void cursor_take(page *p, size_t i) {
  cursor_page *c = (cursor_page *)p;
  free(c->after);
  if (!(c->after = strdup(c->cursors[i]))) c->oom = 1;
}

static void cursor_drop(page *p) {
  cursor_page *c = (cursor_page *)p;
  es_store_cursors_free(c->cursors, c->n_cursors);
  c->cursors = NULL;
  c->n_cursors = 0;
  es_events_destroy(&c->e.list);
}

/* Ends an event page's answer: `]` (,"capped":true) `}`. */
static int end_events(es_http_resp *out, const event_page *e) {
  es_buf_addc(&out->body, ']');
  put_capped(&out->body, &e->p);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

/* `after`: a position, or a sharded store's cursor (0 or none: the start). */
int es_api_read_all(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (query_limit(r, DEFAULT_LIMIT, &limit, out)) return 0;
  const char *after = query_str(r, "after");
  cursor_page c = {0};
  event_page_init(&c.e, r, out, limit, 0, cursor_read);
  c.e.p.put = cursor_put;
  c.e.p.take = cursor_take;
  c.e.p.drop = cursor_drop;
  if (after && strcmp(after, "0") != 0 && !(c.after = strdup(after)))
    return es_http_fail(out, 503, "STORAGE", "out of memory");
  es_err err = {0};
  es_buf_adds(&out->body, "{\"events\":[");
  int rc = page_fill(&c.e.p, &err);
  free(c.after);
  if (rc) return es_http_fail_err(out, &err);
  if (c.oom) return es_http_fail(out, 503, "STORAGE", "out of memory");
  return end_events(out, &c.e);
}

int es_api_head(const es_http_req *r, es_http_resp *out) {
  int64_t head = 0;
  es_err err = {0};
  if (es_store_head(r->store, r->seg[2], &head, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"head\":");
  es_wire_int(&out->body, head);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

/* Replaces every occurrence of dir (the server's scripts directory, which
 * the engine's messages name: "no reducer 'x' in DIR/reducers", a
 * reducer's traceback) with "scripts": a remote client learns nothing of
 * the server's file system. */
static void hide_dir(char *msg, const char *dir) {
  size_t dn = dir ? strlen(dir) : 0;
  if (dn == 0 || !strstr(msg, dir)) return;
  char tmp[ES_ERRMSG_MAX];
  size_t n = 0;
  for (const char *p = msg; *p && n + 1 < sizeof tmp;) {
    if (strncmp(p, dir, dn) == 0) {
      size_t k = 7 < sizeof tmp - 1 - n ? 7 : sizeof tmp - 1 - n;
      memcpy(tmp + n, "scripts", k);
      n += k;
      p += dn;
    } else {
      tmp[n++] = *p++;
    }
  }
  tmp[n] = '\0';
  memcpy(msg, tmp, n + 1);
}

/* Removes every "tenant" + ES_TENANT_SEP from msg (the engine names the
 * session as stored on the root; the tenant knows it without the prefix). */
static void unprefix(char *msg, const char *tenant) {
  char pre[ES_MAX_TENANT_BYTES + 2];
  int pn = snprintf(pre, sizeof pre, "%s%s", tenant, ES_TENANT_SEP);
  if (pn <= 0 || (size_t)pn >= sizeof pre) return;
  char *p;
  while ((p = strstr(msg, pre))) memmove(p, p + pn, strlen(p + pn) + 1);
}

/* The engine works on the root store: a tenant's session by its stored
 * name, tenant + ES_TENANT_SEP + session (docs/tenants.md). *session is
 * pointed at stored (ES_MAX_NAME_BYTES + 1 bytes) for a tenant token.
 * -1 with out made when the name is too long. */
static int engine_session(const es_http_req *r, const char **session, char *stored,
                          es_http_resp *out) {
  if (!r->tenant) return 0;
  int n = snprintf(stored, ES_MAX_NAME_BYTES + 1, "%s%s%s", r->tenant, ES_TENANT_SEP, *session);
  if (n < 0 || n > ES_MAX_NAME_BYTES) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "session name too long");
    return -1;
  }
  *session = stored;
  return 0;
}

/* An engine error as a tenant and a remote client may see it: without
 * the tenant prefix and the server's scripts directory. */
static void engine_err_clean(const es_http_req *r, es_engine *engine, es_err *err) {
  if (r->tenant) unprefix(err->msg, r->tenant);
  hide_dir(err->msg, es_engine_scripts(engine));
}

int es_api_state(const es_http_req *r, es_http_resp *out) {
  const char *session = r->seg[2], *reducer = r->seg[4];
  es_engine *engine = r->ctx ? r->ctx->engine : NULL;
  int64_t at;
  if (es_http_query_int(r, "at", 0, INT64_MAX, ES_NONE, &at, out)) return 0;
  if (!engine)
    return es_http_fail(out, 404, "NOT_FOUND",
                        "no reducers: the server runs without an engine (no scripts directory)");
  es_err err = {0};
  if (es_check_name("session", session, &err) || es_check_name("reducer", reducer, &err))
    return es_http_fail_err(out, &err);
  char stored[ES_MAX_NAME_BYTES + 1];
  if (engine_session(r, &session, stored, out)) return 0;
  es_buf state;
  es_buf_init(&state);
  int64_t index = 0;
  int not_json = 0;
  int rc = es_engine_state_json(engine, session, reducer, at, &state, &index, &not_json, &err);
  if (rc != ES_OK) {
    es_buf_destroy(&state);
    engine_err_clean(r, engine, &err);
    /* The reducer ran; only its JSON view fails: 422, not the 400 of a
     * reducer that raised. */
    if (not_json) return es_http_fail(out, 422, es_strerror(err.code), "%s", err.msg);
    return es_http_fail_err(out, &err);
  }
  es_buf_adds(&out->body, "{\"state\":");
  es_buf_add(&out->body, state.data ? state.data : "null", state.data ? state.len : 4);
  es_wire_int_field(&out->body, "index", index);
  es_buf_addc(&out->body, '}');
  es_buf_destroy(&state);
  return answer(out);
}

/* ------------------------------------------------------------------------ */
/* inspection */

static void put_session_row(es_buf *b, const es_session_info *si) {
  es_buf_adds(b, "{\"session\":");
  es_wire_cstr(b, si->session);
  es_wire_int_field(b, "events", si->events);
  es_wire_int_field(b, "pending", si->pending);
  es_wire_int_field(b, "dead", si->dead);
  es_wire_int_field(b, "attempts", si->attempts);
  es_wire_int_field(b, "failures", si->failures);
  es_wire_int_field(b, "first_at", si->first_at);
  es_wire_int_field(b, "updated_at", si->updated_at);
  /* §3.7/§3.8 controls, as push_session_controls: sealed always, the
   * rest when set */
  es_wire_key(b, "sealed", 0);
  put_bool(b, si->sealed_at != ES_NONE);
  if (si->sealed_at != ES_NONE) {
    es_wire_int_field(b, "sealed_at", si->sealed_at);
  }
  if (si->seal_reason) {
    es_wire_str_field(b, "seal_reason", si->seal_reason);
  }
  if (si->fence > 0) {
    es_wire_int_field(b, "fence", si->fence);
  }
  if (si->lease_holder) {
    es_wire_key(b, "lease", 0);
    es_buf_adds(b, "{\"holder\":");
    es_wire_cstr(b, si->lease_holder);
    es_wire_int_field(b, "token", si->lease_token);
    es_wire_int_field(b, "expires_at", si->lease_expires_at);
    es_buf_addc(b, '}');
  }
  if (si->parent) {
    es_wire_str_field(b, "parent", si->parent);
  }
  es_wire_int_field(b, "first_index", si->first_index > 1 ? si->first_index : 1);
  es_buf_addc(b, '}');
}

/* A page of named rows (sessions, children, refs): goes on after the last
 * name written, and its cursor is that name when the page was cut. */
typedef struct row_page {
  page p;
  char last[ES_MAX_ID_BYTES + 1]; /* the last name written ("" before the first) */
  char *cursor;                   /* sessions: the store's cursor of the last chunk (owned) */
  const char *prefix;
  es_sessions sessions;
  es_lineages children;
  es_refs refs;
} row_page;

static void row_take_name(row_page *w, const char *name) {
  snprintf(w->last, sizeof w->last, "%s", name);
}

static const char *row_after(const row_page *w, const char *after) {
  return w->p.n > 0 ? w->last : after;
}

/* Starts a row page of r, written into out's body; item_max: one row's most bytes. */
static void row_page_init(row_page *w, const es_http_req *r, es_http_resp *out, int64_t limit,
                          size_t item_max, int (*read)(page *, int64_t, size_t *, es_err *),
                          void (*put)(page *, size_t), void (*take)(page *, size_t),
                          void (*drop)(page *)) {
  memset(w, 0, sizeof *w);
  w->p.r = r;
  w->p.b = &out->body;
  w->p.limit = limit;
  w->p.item_max = item_max;
  w->p.read = read;
  w->p.put = put;
  w->p.take = take;
  w->p.drop = drop;
}

/* Ends a row page's answer: `],"cursor":...` (,"capped":true) `}`. A
 * page cut at the cap goes on after its last row; otherwise the cursor is
 * the route's own (uncut). */
static int end_rows(es_http_resp *out, row_page *w, const char *uncut) {
  es_buf_adds(&out->body, "],\"cursor\":");
  es_wire_cstr(&out->body, w->p.capped ? w->last : uncut);
  put_capped(&out->body, &w->p);
  es_buf_addc(&out->body, '}');
  free(w->cursor);
  return answer(out);
}

static int sessions_read(page *p, int64_t k, size_t *got, es_err *err) {
  row_page *w = (row_page *)p;
  int rc = es_store_sessions(p->r->store, w->prefix, row_after(w, query_str(p->r, "after")), k,
                             &w->sessions, err);
  free(w->cursor);
  w->cursor = NULL;
  if (rc == ES_OK && w->sessions.cursor && !(w->cursor = strdup(w->sessions.cursor)))
    rc = es_fail(err, ES_STORAGE, "out of memory");
  *got = w->sessions.n;
  return rc;
}

static void sessions_put(page *p, size_t i) {
  put_session_row(p->b, &((row_page *)p)->sessions.v[i]);
}

static void sessions_take(page *p, size_t i) {
  row_page *w = (row_page *)p;
  row_take_name(w, w->sessions.v[i].session);
}

static void sessions_drop(page *p) { es_sessions_destroy(&((row_page *)p)->sessions); }

/* A session row: 3 names (session, lease holder, parent), a seal reason. */
#define SESSION_ROW_MAX (3 * ES_WIRE_NAME_MAX + ES_WIRE_TEXT_MAX + ES_WIRE_FIELDS_MAX)

int es_api_sessions(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (query_limit(r, DEFAULT_LIMIT, &limit, out)) return 0;
  row_page w;
  row_page_init(&w, r, out, limit, SESSION_ROW_MAX, sessions_read, sessions_put, sessions_take,
                sessions_drop);
  w.prefix = query_str(r, "prefix");
  es_err err = {0};
  es_buf_adds(&out->body, "{\"sessions\":[");
  if (page_fill(&w.p, &err)) {
    free(w.cursor);
    return es_http_fail_err(out, &err);
  }
  return end_rows(out, &w, w.cursor);
}

static void put_lineage(es_buf *b, const es_lineage *l) {
  es_buf_adds(b, "{\"session\":");
  es_wire_cstr(b, l->session);
  es_wire_str_field(b, "parent", l->parent);
  es_wire_int_field(b, "at", l->at);
  es_wire_int_field(b, "created_at", l->created_at);
  es_buf_addc(b, '}');
}

int es_api_lineage(const es_http_req *r, es_http_resp *out) {
  es_lineage l;
  memset(&l, 0, sizeof l);
  int found = 0;
  es_err err = {0};
  if (es_store_lineage(r->store, r->seg[2], &found, &l, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"lineage\":");
  if (found) put_lineage(&out->body, &l);
  else es_buf_adds(&out->body, "null");
  es_buf_addc(&out->body, '}');
  if (found) es_lineage_destroy(&l);
  return answer(out);
}

static int children_read(page *p, int64_t k, size_t *got, es_err *err) {
  row_page *w = (row_page *)p;
  int rc = es_store_children(p->r->store, p->r->seg[2], row_after(w, query_str(p->r, "after")), k,
                             &w->children, err);
  *got = w->children.n;
  return rc;
}

static void children_put(page *p, size_t i) { put_lineage(p->b, &((row_page *)p)->children.v[i]); }

static void children_take(page *p, size_t i) {
  row_page *w = (row_page *)p;
  row_take_name(w, w->children.v[i].session);
}

static void children_drop(page *p) { es_lineages_destroy(&((row_page *)p)->children); }

/* The cursor of a listing that has none from the store: a full page may
 * have more after it: its last name is the next page's `after` (that page
 * may be empty); a shorter page has none (null). */
static const char *full_page_cursor(const row_page *w) {
  return w->p.n > 0 && w->p.n == w->p.limit ? w->last : NULL;
}

int es_api_children(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (query_limit(r, DEFAULT_LIMIT, &limit, out)) return 0;
  row_page w;
  /* a lineage row: 2 names */
  row_page_init(&w, r, out, limit, 2 * ES_WIRE_NAME_MAX + ES_WIRE_FIELDS_MAX, children_read,
                children_put, children_take, children_drop);
  es_err err = {0};
  es_buf_adds(&out->body, "{\"children\":[");
  if (page_fill(&w.p, &err)) return es_http_fail_err(out, &err);
  return end_rows(out, &w, full_page_cursor(&w));
}

static int dead_page(page *p, int64_t k, size_t *got, es_err *err) {
  event_page *e = (event_page *)p;
  int rc = es_store_dead_letters(p->r->store, e->session, e->after, k, &e->list, err);
  *got = e->list.n;
  return rc;
}

int es_api_dead_letters(const es_http_req *r, es_http_resp *out) {
  int64_t after, limit;
  if (es_http_query_int(r, "after", 0, INT64_MAX, 0, &after, out) ||
      query_limit(r, DEFAULT_LIMIT, &limit, out))
    return 0;
  event_page e;
  event_page_init(&e, r, out, limit, after, dead_page);
  e.session = query_str(r, "session");
  es_err err = {0};
  es_buf_adds(&out->body, "{\"events\":[");
  if (page_fill(&e.p, &err)) return es_http_fail_err(out, &err);
  return end_events(out, &e);
}

/* ------------------------------------------------------------------------ */
/* dead letters: revive, settle */

/* {"event": the event after the change} */
static int answer_event(const es_http_req *r, es_http_resp *out, const char *session, int64_t index) {
  es_event e;
  es_event_init(&e);
  es_err err = {0};
  if (es_store_get(r->store, session, index, &e, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"event\":");
  es_wire_event(&out->body, &e, 0);
  es_buf_addc(&out->body, '}');
  es_event_destroy(&e);
  return answer(out);
}

static const char *const no_fields[] = {NULL};
static const char *const settle_fields[] = {"reason", NULL};

int es_api_revive(const es_http_req *r, es_http_resp *out) {
  int64_t index;
  body bd;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 0, &bd)) return 0;
  int bad = check_fields(out, bd.root, "", no_fields);
  body_free(&bd);
  if (bad) return 0;
  es_err err = {0};
  if (es_store_revive(r->store, r->seg[2], index, &err)) return es_http_fail_err(out, &err);
  return answer_event(r, out, r->seg[2], index);
}

int es_api_settle(const es_http_req *r, es_http_resp *out) {
  int64_t index;
  body bd;
  char *reason = NULL;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 0, &bd)) return 0;
  int bad = check_fields(out, bd.root, "", settle_fields) || get_text(out, bd.root, "reason", 0, &reason);
  body_free(&bd);
  if (bad) return 0;
  es_err err = {0};
  int rc = es_store_settle(r->store, r->seg[2], index, reason, &err);
  free(reason);
  if (rc) return es_http_fail_err(out, &err);
  return answer_event(r, out, r->seg[2], index);
}

/* POST .../events/{i}/cancel {reason?} -> {event} (§3.2 cancel; right work) */
int es_api_cancel(const es_http_req *r, es_http_resp *out) {
  int64_t index;
  body bd;
  char *reason = NULL;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 0, &bd)) return 0;
  int bad = check_fields(out, bd.root, "", settle_fields) || get_text(out, bd.root, "reason", 0, &reason);
  body_free(&bd);
  if (bad) return 0;
  es_event e;
  es_err err = {0};
  int rc = es_store_cancel(r->store, r->seg[2], index, reason, &e, &err);
  free(reason);
  if (rc) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"event\":");
  es_wire_event(&out->body, &e, 0);
  es_buf_addc(&out->body, '}');
  es_event_destroy(&e);
  return answer(out);
}

/* ------------------------------------------------------------------------ */
/* remote workers: claims, complete, fail, renew */

static const char *const claim_fields[] = {"holder", "ttl_ms", "limit", "types", NULL};

/* Claims in chunks (page_fill with keep_all): a chunk claims no more than
 * fits, and once the room left cannot hold one more event at its largest,
 * the answer ends (capped) and the rest stays ready for the next claim. */
static int claim_page(page *p, int64_t k, size_t *got, es_err *err) {
  event_page *e = (event_page *)p;
  int rc = es_store_claim_next(p->r->store, e->holder, e->ttl, k, e->types, e->n_types, NULL, 0,
                               &e->list, &e->retry_at, err);
  *got = e->list.n;
  return rc;
}

int es_api_claims(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *holder;
  int64_t ttl, limit;
  const char **types = NULL;
  size_t n_types = 0;
  if (read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", claim_fields) || get_name(out, bd.root, "", "holder", 1, &holder) ||
      get_int(out, bd.root, "", "ttl_ms", 1, ES_NONE, &ttl, NULL) ||
      get_int(out, bd.root, "", "limit", 0, 1, &limit, NULL))
    goto done;
  if (limit < 1 || limit > max_limit(r)) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'limit' must be from 1 to %lld",
                 (long long)max_limit(r));
    goto done;
  }
  const es_jval *tv = member(bd.root, "types");
  if (tv) {
    if (tv->type != ES_JARRAY) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'types' must be an array of type names, got %s",
                   es_jtype_name(tv->type));
      goto done;
    }
    if (tv->n > ES_MAX_CLAIM_TYPES) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'types' holds %zu names, over the limit of %d",
                   tv->n, ES_MAX_CLAIM_TYPES);
      goto done;
    }
    types = calloc(tv->n ? tv->n : 1, sizeof *types);
    if (!types) {
      es_http_fail(out, 503, "STORAGE", "out of memory");
      goto done;
    }
    for (size_t i = 0; i < tv->n; i++) {
      const es_jval *t = &tv->items[i];
      if (t->type != ES_JSTRING || memchr(t->str, '\0', t->len)) {
        es_http_fail(out, 400, "INVALID_ARGUMENT", "types[%zu] must be a type name (%s)", i + 1,
                     t->type != ES_JSTRING ? "a string" : "no NUL byte");
        goto done;
      }
      types[i] = t->str;
    }
    n_types = tv->n;
  }
  event_page e;
  event_page_init(&e, r, out, limit, 0, claim_page);
  e.claimed = 1;
  e.p.keep_all = 1;
  e.holder = holder;
  e.ttl = ttl;
  e.types = types;
  e.n_types = n_types;
  e.retry_at = ES_NONE;
  es_err err = {0};
  es_buf_adds(&out->body, "{\"events\":[");
  if (page_fill(&e.p, &err)) {
    es_http_fail_err(out, &err);
    goto done;
  }
  es_buf_addc(&out->body, ']');
  es_wire_int_field(&out->body, "retry_at", e.retry_at);
  put_capped(&out->body, &e.p);
  es_buf_addc(&out->body, '}');
  answer(out);
done:
  free(types);
  body_free(&bd);
  return 0;
}

static const char *const complete_fields[] = {"attempt", "events", "fence", "cancel", NULL};
static const char *const cancel_item_fields[] = {"index", "reason", NULL};

/* complete's "cancel" (§3.2): an array of indexes or {index, reason}; *v
 * NULL when absent (malloc'd otherwise, reasons borrowed from the body).
 * -1 with out made when it is not that. */
static int read_cancels(es_http_resp *out, const es_jval *root, size_t limit, es_cancel **v,
                        size_t *n) {
  *v = NULL;
  *n = 0;
  const es_jval *arr = member(root, "cancel");
  if (!arr) return 0;
  if (arr->type != ES_JARRAY) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'cancel' must be an array of event indexes");
    return -1;
  }
  if (arr->n > limit) {
    es_http_fail(out, 413, "TOO_LARGE", "%zu events to cancel, over the limit of %zu", arr->n, limit);
    return -1;
  }
  es_cancel *c = calloc(arr->n ? arr->n : 1, sizeof *c);
  if (!c) return es_http_fail(out, 503, "STORAGE", "out of memory"), -1;
  for (size_t i = 0; i < arr->n; i++) {
    const es_jval *it = &arr->items[i];
    const es_jval *ix = it;
    char ctx[48];
    snprintf(ctx, sizeof ctx, "cancel[%zu]: ", i + 1);
    if (it->type == ES_JOBJECT) {
      const char *reason = NULL;
      snprintf(ctx, sizeof ctx, "cancel[%zu].", i + 1);
      if (check_fields(out, it, ctx, cancel_item_fields) ||
          get_name(out, it, ctx, "reason", 0, &reason)) {
        free(c);
        return -1;
      }
      c[i].reason = reason;
      ix = member(it, "index");
    }
    if (!ix || ix->type != ES_JINT || ix->i < 1) {
      es_http_fail(out, 400, "INVALID_ARGUMENT",
                   "cancel[%zu] must be an event index (an integer >= 1) or {index, reason}", i + 1);
      free(c);
      return -1;
    }
    c[i].index = ix->i;
  }
  *v = c;
  *n = arr->n;
  return 0;
}

int es_api_complete(const es_http_req *r, es_http_resp *out) {
  int64_t index, attempt, fence;
  body bd;
  batch b;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", complete_fields) ||
      get_int(out, bd.root, "", "attempt", 1, ES_NONE, &attempt, NULL) ||
      get_int(out, bd.root, "", "fence", 0, ES_NONE, &fence, NULL) ||
      read_events(r, out, bd.root, "events", 0, &b)) {
    body_free(&bd);
    return 0;
  }
  es_cancel *cancel;
  size_t n_cancel;
  if (read_cancels(out, bd.root, max_batch(r), &cancel, &n_cancel)) {
    batch_free(&b);
    body_free(&bd);
    return 0;
  }
  es_events list = {0};
  int outcome = 0;
  es_err err = {0};
  int rc;
  if (cancel) {
    es_completion c = {.session = r->seg[2], .index = index, .attempt = attempt, .evs = b.v,
                       .n = b.n, .fence = fence, .cancel = cancel, .n_cancel = n_cancel};
    rc = es_store_complete_cancel(r->store, &c, &list, &err);
    outcome = c.outcome;
  } else {
    rc = es_store_complete(r->store, r->seg[2], index, attempt, b.v, b.n, fence, &outcome, &list,
                           &err);
  }
  batch_free(&b);
  if (rc) {
    free(cancel);
    body_free(&bd);
    return es_http_fail_err(out, &err);
  }
  es_buf_adds(&out->body, "{\"outcome\":");
  es_buf_adds(&out->body, outcome == ES_COMPLETED ? "\"completed\"" : "\"superseded\"");
  es_buf_adds(&out->body, ",\"events\":");
  es_wire_events_array(&out->body, &list, 0);
  if (cancel && outcome == ES_COMPLETED) { /* §3.2: the indexes no longer cancellable */
    es_buf_adds(&out->body, ",\"not_cancelled\":[");
    int first = 1;
    for (size_t i = 0; i < n_cancel; i++) {
      if (cancel[i].cancelled) continue;
      if (!first) es_buf_addc(&out->body, ',');
      es_json_write_int(&out->body, cancel[i].index);
      first = 0;
    }
    es_buf_addc(&out->body, ']');
  }
  es_buf_addc(&out->body, '}');
  es_events_destroy(&list);
  free(cancel);
  body_free(&bd);
  return answer(out);
}

static const char *const fail_fields[] = {"attempt", "error", "max_failures", "retry_after_ms", NULL};

int es_api_fail(const es_http_req *r, es_http_resp *out) {
  int64_t index, attempt, max_failures, retry_after;
  body bd;
  char *error = NULL;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 1, &bd)) return 0;
  int bad = check_fields(out, bd.root, "", fail_fields) ||
            get_int(out, bd.root, "", "attempt", 1, ES_NONE, &attempt, NULL) ||
            get_int(out, bd.root, "", "max_failures", 0, DEFAULT_MAX_FAILURES, &max_failures, NULL) ||
            get_int(out, bd.root, "", "retry_after_ms", 0, 0, &retry_after, NULL) ||
            get_text(out, bd.root, "error", 1, &error);
  body_free(&bd);
  if (bad) {
    free(error);
    return 0;
  }
  int outcome = 0;
  int64_t failures = 0;
  es_err err = {0};
  int rc = es_store_fail(r->store, r->seg[2], index, attempt, error, max_failures, retry_after,
                         &outcome, &failures, &err);
  free(error);
  if (rc) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"outcome\":");
  es_buf_adds(&out->body, outcome == ES_FAILED          ? "\"failed\""
                          : outcome == ES_DEAD_LETTERED ? "\"dead_lettered\""
                                                        : "\"superseded\"");
  es_wire_int_field(&out->body, "failures", failures);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

static void put_int_array(es_buf *b, const int64_t *v, size_t n) {
  es_buf_addc(b, '[');
  for (size_t i = 0; i < n; i++) {
    if (i) es_buf_addc(b, ',');
    es_wire_int(b, v[i]);
  }
  es_buf_addc(b, ']');
}

static const char *const renew_fields[] = {"holder", "attempt", "ttl_ms", NULL};

int es_api_renew(const es_http_req *r, es_http_resp *out) {
  int64_t index, ttl;
  es_claim_ref claim;
  const char *holder;
  body bd;
  if (seg_index(r, 4, &index, out) || read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", renew_fields) || get_name(out, bd.root, "", "holder", 1, &holder) ||
      get_int(out, bd.root, "", "attempt", 1, ES_NONE, &claim.attempt, NULL) ||
      get_int(out, bd.root, "", "ttl_ms", 1, ES_NONE, &ttl, NULL)) {
    body_free(&bd);
    return 0;
  }
  claim.index = index;
  es_renew_result res;
  memset(&res, 0, sizeof res);
  es_err err = {0};
  int rc = es_store_renew(r->store, r->seg[2], holder, &claim, 1, ttl, ES_NONE, &res, &err);
  body_free(&bd); /* holder lives in the document */
  if (rc) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"renewed\":");
  put_int_array(&out->body, res.renewed, res.n_renewed);
  es_buf_adds(&out->body, ",\"superseded\":");
  put_int_array(&out->body, res.superseded, res.n_superseded);
  es_buf_addc(&out->body, '}');
  es_renew_result_destroy(&res);
  return answer(out);
}

/* ------------------------------------------------------------------------ */
/* refs */

static void put_ref(es_buf *b, const es_ref *ref) {
  es_buf_adds(b, "{\"name\":");
  es_wire_cstr(b, ref->name);
  es_wire_str_field(b, "session", ref->session);
  es_wire_int_field(b, "head", ref->head);
  /* §3.7 the named session's lineage; null when it was not forked */
  es_wire_str_field(b, "parent", ref->parent);
  es_wire_int_field(b, "at", ref->parent ? ref->at : ES_NONE);
  es_wire_int_field(b, "created_at", ref->created_at);
  es_wire_int_field(b, "updated_at", ref->updated_at);
  es_buf_addc(b, '}');
}

static int answer_ref(es_http_resp *out, es_ref *ref) {
  put_ref(&out->body, ref);
  es_ref_destroy(ref);
  return answer(out);
}

static int refs_read(page *p, int64_t k, size_t *got, es_err *err) {
  row_page *w = (row_page *)p;
  int rc = es_store_list_refs(p->r->store, row_after(w, query_str(p->r, "after")), k, &w->refs, err);
  *got = w->refs.n;
  return rc;
}

static void refs_put(page *p, size_t i) { put_ref(p->b, &((row_page *)p)->refs.v[i]); }

static void refs_take(page *p, size_t i) {
  row_page *w = (row_page *)p;
  row_take_name(w, w->refs.v[i].name);
}

static void refs_drop(page *p) { es_refs_destroy(&((row_page *)p)->refs); }

int es_api_list_refs(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (query_limit(r, DEFAULT_LIMIT, &limit, out)) return 0;
  row_page w;
  /* a ref row: 2 names */
  row_page_init(&w, r, out, limit, 2 * ES_WIRE_NAME_MAX + ES_WIRE_FIELDS_MAX, refs_read, refs_put,
                refs_take, refs_drop);
  es_err err = {0};
  es_buf_adds(&out->body, "{\"refs\":[");
  if (page_fill(&w.p, &err)) return es_http_fail_err(out, &err);
  return end_rows(out, &w, full_page_cursor(&w));
}

int es_api_get_ref(const es_http_req *r, es_http_resp *out) {
  es_ref ref;
  es_ref_init(&ref);
  int found = 0;
  es_err err = {0};
  if (es_store_get_ref(r->store, r->seg[2], &found, &ref, &err)) return es_http_fail_err(out, &err);
  if (!found) return es_http_fail(out, 404, "NOT_FOUND", "no ref '%s'", r->seg[2]);
  return answer_ref(out, &ref);
}

static const char *const put_ref_fields[] = {"session", NULL};

int es_api_put_ref(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *session;
  if (read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", put_ref_fields) ||
      get_name(out, bd.root, "", "session", 1, &session)) {
    body_free(&bd);
    return 0;
  }
  es_ref ref;
  es_ref_init(&ref);
  es_err err = {0};
  int rc = es_store_put_ref(r->store, r->seg[2], session, &ref, &err);
  body_free(&bd);
  if (rc) return es_http_fail_err(out, &err);
  return answer_ref(out, &ref);
}

int es_api_delete_ref(const es_http_req *r, es_http_resp *out) {
  int deleted = 0;
  es_err err = {0};
  if (es_store_delete_ref(r->store, r->seg[2], &deleted, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"deleted\":");
  put_bool(&out->body, deleted);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

static const char *const promote_fields[] = {"from", "expect", NULL};

int es_api_promote(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *from, *expect = NULL;
  int has_expect = 0;
  if (read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", promote_fields) || get_name(out, bd.root, "", "from", 1, &from))
    goto bad;
  const es_jval *ev = es_jval_get(bd.root, "expect");
  if (ev) {
    /* false: the ref must not exist. null is refused: a client that
     * writes an unset option as null would otherwise ask for "must not
     * exist" when it meant "no compare-and-set", or the reverse. */
    if (ev->type == ES_JBOOL && !ev->boolean) {
      has_expect = 1;
    } else if (ev->type == ES_JSTRING) {
      if (get_name(out, bd.root, "", "expect", 1, &expect)) goto bad;
      has_expect = 1;
    } else {
      es_http_fail(out, 400, "INVALID_ARGUMENT",
                   "field 'expect' must be a session name or false (leave it out for last writer "
                   "wins), got %s",
                   es_jtype_name(ev->type));
      goto bad;
    }
  }
  es_ref ref;
  es_ref_init(&ref);
  char *actual = NULL;
  es_err err = {0};
  int rc = es_store_promote(r->store, from, r->seg[2], has_expect, expect, &ref, &actual, &err);
  if (rc == ES_REF_CONFLICT) {
    /* As the Lua face's error: what the caller expected and what it found
     * (false: no ref), so a loser can retry against `actual`. */
    es_http_fail_err(out, &err);
    if (!out->body.oom && out->body.len > 0) {
      out->body.len--; /* the closing brace */
      es_buf_adds(&out->body, ",\"expected\":");
      if (expect) es_wire_cstr(&out->body, expect);
      else es_buf_adds(&out->body, "false");
      es_buf_adds(&out->body, ",\"actual\":");
      if (actual) es_wire_cstr(&out->body, actual);
      else es_buf_adds(&out->body, "false");
      es_buf_addc(&out->body, '}');
    }
    free(actual);
    body_free(&bd);
    return 0;
  }
  free(actual);
  body_free(&bd);
  if (rc) return es_http_fail_err(out, &err);
  return answer_ref(out, &ref);
bad:
  body_free(&bd);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* §3.7-§3.10 over HTTP: fork, fences, leases, seals, snapshots, truncate,
 * delete, archive, segments, shred. Each reads its whole body first, then
 * makes its one store call, and answers what the Lua face returns as JSON
 * (a bare value wrapped in an object named after it). */

/* Reads the body (required or not) and refuses fields not in `allowed`:
 * -1 with out made. */
static int read_fields(const es_http_req *r, es_http_resp *out, int required,
                       const char *const *allowed, body *bd) {
  if (read_body(r, out, required, bd)) return -1;
  if (check_fields(out, bd->root, "", allowed)) {
    body_free(bd);
    return -1;
  }
  return 0;
}

/* {"name": true|false} */
static int answer_bool(es_http_resp *out, const char *name, int v) {
  es_buf_addc(&out->body, '{');
  es_wire_key(&out->body, name, 1);
  put_bool(&out->body, v);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

static const char *const fork_fields[] = {"at", "to", NULL};

/* POST /v1/sessions/{s}/fork {at, to} -> the lineage record of `to`. */
int es_api_fork(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *to;
  int64_t at;
  if (read_fields(r, out, 1, fork_fields, &bd)) return 0;
  if (get_int(out, bd.root, "", "at", 1, 0, &at, NULL) || get_name(out, bd.root, "", "to", 1, &to)) {
    body_free(&bd);
    return 0;
  }
  es_lineage l;
  memset(&l, 0, sizeof l);
  es_err err = {0};
  int rc = es_store_fork(r->store, r->seg[2], at, to, &l, &err);
  body_free(&bd);
  if (rc) return es_http_fail_err(out, &err);
  put_lineage(&out->body, &l);
  es_lineage_destroy(&l);
  return answer(out);
}

static const char *const fence_fields[] = {"if_token", NULL};

/* POST /v1/sessions/{s}/fence {if_token?} -> {token} (STALE_FENCE: 409). */
int es_api_fence(const es_http_req *r, es_http_resp *out) {
  body bd;
  int64_t if_token, token = 0;
  if (read_fields(r, out, 0, fence_fields, &bd)) return 0;
  int bad = get_int(out, bd.root, "", "if_token", 0, ES_NONE, &if_token, NULL);
  body_free(&bd);
  if (bad) return 0;
  es_err err = {0};
  if (es_store_fence(r->store, r->seg[2], if_token, &token, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"token\":");
  es_wire_int(&out->body, token);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

static const char *const lease_fields[] = {"holder", "ttl_ms", NULL};

/* POST /v1/sessions/{s}/lease {holder, ttl_ms} -> {outcome: "acquired",
 * holder, token, expires_at} or {outcome: "held", holder, expires_at}. */
int es_api_lease(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *holder;
  int64_t ttl;
  if (read_fields(r, out, 1, lease_fields, &bd)) return 0;
  if (get_name(out, bd.root, "", "holder", 1, &holder) ||
      get_int(out, bd.root, "", "ttl_ms", 1, 0, &ttl, NULL)) {
    body_free(&bd);
    return 0;
  }
  es_lease l;
  memset(&l, 0, sizeof l);
  es_err err = {0};
  int rc = es_store_lease(r->store, r->seg[2], holder, ttl, &l, &err);
  body_free(&bd);
  if (rc) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"outcome\":");
  es_wire_cstr(&out->body, l.acquired ? "acquired" : "held");
  es_wire_str_field(&out->body, "holder", l.holder ? l.holder : "");
  if (l.acquired) es_wire_int_field(&out->body, "token", l.token);
  es_wire_int_field(&out->body, "expires_at", l.expires_at);
  es_buf_addc(&out->body, '}');
  es_lease_destroy(&l);
  return answer(out);
}

static const char *const release_fields[] = {"holder", "token", NULL};

/* POST /v1/sessions/{s}/release {holder, token} -> {released}. */
int es_api_release(const es_http_req *r, es_http_resp *out) {
  body bd;
  const char *holder;
  int64_t token;
  int released = 0;
  if (read_fields(r, out, 1, release_fields, &bd)) return 0;
  if (get_name(out, bd.root, "", "holder", 1, &holder) ||
      get_int(out, bd.root, "", "token", 1, 0, &token, NULL)) {
    body_free(&bd);
    return 0;
  }
  es_err err = {0};
  int rc = es_store_lease_release(r->store, r->seg[2], holder, token, &released, &err);
  body_free(&bd);
  if (rc) return es_http_fail_err(out, &err);
  return answer_bool(out, "released", released);
}

static const char *const seal_fields[] = {"reason", NULL};

/* POST /v1/sessions/{s}/seal {reason?} -> {sealed: true} (again: a no-op
 * with the same answer; the first reason stays). */
int es_api_seal(const es_http_req *r, es_http_resp *out) {
  body bd;
  char *reason = NULL;
  if (read_fields(r, out, 0, seal_fields, &bd)) return 0;
  int bad = get_text(out, bd.root, "reason", 0, &reason);
  body_free(&bd);
  if (bad) return 0;
  es_err err = {0};
  int rc = es_store_seal(r->store, r->seg[2], reason, &err);
  free(reason);
  if (rc) return es_http_fail_err(out, &err);
  return answer_bool(out, "sealed", 1);
}

/* GET /v1/sessions/{s}/snapshots -> {snapshots: [{reducer, index, version,
 * updated_at}]} by reducer name (one row per reducer: not paged). */
int es_api_snapshots(const es_http_req *r, es_http_resp *out) {
  es_snapshots list = {0};
  es_err err = {0};
  if (es_store_snapshots(r->store, r->seg[2], &list, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"snapshots\":[");
  for (size_t i = 0; i < list.n; i++) {
    es_buf_adds(&out->body, i ? ",{\"reducer\":" : "{\"reducer\":");
    es_wire_cstr(&out->body, list.v[i].reducer);
    es_wire_int_field(&out->body, "index", list.v[i].index);
    es_wire_str_field(&out->body, "version", list.v[i].version);
    es_wire_int_field(&out->body, "updated_at", list.v[i].updated_at);
    es_buf_addc(&out->body, '}');
  }
  es_buf_adds(&out->body, "]}");
  es_snapshots_destroy(&list);
  return answer(out);
}

static const char *const through_fields[] = {"through", NULL};

/* POST /v1/sessions/{s}/truncate {through} -> {first_index}. With an
 * engine, as engine:truncate: every reducer is snapshotted at `through`
 * first, so GET .../state keeps answering (§3.9); without one, the store's
 * truncate. */
int es_api_truncate(const es_http_req *r, es_http_resp *out) {
  body bd;
  int64_t through, first = 0;
  if (read_fields(r, out, 1, through_fields, &bd)) return 0;
  int bad = get_int(out, bd.root, "", "through", 1, 0, &through, NULL);
  body_free(&bd);
  if (bad) return 0;
  es_engine *engine = r->ctx ? r->ctx->engine : NULL;
  es_err err = {0};
  int rc;
  if (engine) {
    const char *session = r->seg[2];
    char stored[ES_MAX_NAME_BYTES + 1];
    if (es_check_name("session", session, &err)) return es_http_fail_err(out, &err);
    if (engine_session(r, &session, stored, out)) return 0;
    rc = es_engine_truncate(engine, session, through, &first, &err);
    if (rc) engine_err_clean(r, engine, &err);
  } else {
    rc = es_store_truncate(r->store, r->seg[2], through, &first, &err);
  }
  if (rc) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"first_index\":");
  es_wire_int(&out->body, first);
  es_buf_addc(&out->body, '}');
  return answer(out);
}

/* DELETE /v1/sessions/{s} -> {deleted}: whether it existed. */
int es_api_delete_session(const es_http_req *r, es_http_resp *out) {
  int deleted = 0;
  es_err err = {0};
  if (es_store_delete(r->store, r->seg[2], &deleted, &err)) return es_http_fail_err(out, &err);
  return answer_bool(out, "deleted", deleted);
}

/* A segment as store:segments gives it; `file` is relative to the
 * archive directory, so it names nothing of the server's file system. */
static void put_segment(es_buf *b, const es_segment *g) {
  es_buf_adds(b, "{\"from\":");
  es_wire_int(b, g->from);
  es_wire_int_field(b, "through", g->through);
  es_wire_int_field(b, "count", g->count);
  es_wire_int_field(b, "bytes", g->bytes);
  es_wire_str_field(b, "checksum", g->checksum);
  es_wire_str_field(b, "file", g->file);
  es_wire_int_field(b, "created_at", g->created_at);
  es_buf_addc(b, '}');
}

/* POST /v1/sessions/{s}/archive {through} -> {segment}: the new segment,
 * or null when everything through there was archived already. */
int es_api_archive(const es_http_req *r, es_http_resp *out) {
  body bd;
  int64_t through;
  if (read_fields(r, out, 1, through_fields, &bd)) return 0;
  int bad = get_int(out, bd.root, "", "through", 1, 0, &through, NULL);
  body_free(&bd);
  if (bad) return 0;
  es_segment g;
  es_segment_init(&g);
  int written = 0;
  es_err err = {0};
  if (es_store_archive(r->store, r->seg[2], through, &written, &g, &err)) {
    es_segment_destroy(&g);
    return es_http_fail_err(out, &err);
  }
  es_buf_adds(&out->body, "{\"segment\":");
  if (written) put_segment(&out->body, &g);
  else es_buf_adds(&out->body, "null");
  es_buf_addc(&out->body, '}');
  es_segment_destroy(&g);
  return answer(out);
}

/* GET /v1/sessions/{s}/segments -> {segments: [...]}, ascending `from`
 * (small rows: not paged). */
int es_api_segments(const es_http_req *r, es_http_resp *out) {
  es_segments list = {0};
  es_err err = {0};
  if (es_store_segments(r->store, r->seg[2], &list, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"segments\":[");
  for (size_t i = 0; i < list.n; i++) {
    if (i) es_buf_addc(&out->body, ',');
    put_segment(&out->body, &list.v[i]);
  }
  es_buf_adds(&out->body, "]}");
  es_segments_destroy(&list);
  return answer(out);
}

/* POST /v1/keys/{name}/shred -> {shredded}: true when a live key was
 * destroyed now, false when it was gone already (idempotent). A tenant
 * token shreds its own tenant's key of that name only (§3.11). */
int es_api_shred(const es_http_req *r, es_http_resp *out) {
  body bd;
  if (read_fields(r, out, 0, no_fields, &bd)) return 0;
  body_free(&bd);
  int was_live = 0;
  es_err err = {0};
  if (es_store_shred(r->store, r->seg[2], &was_live, &err)) return es_http_fail_err(out, &err);
  return answer_bool(out, "shredded", was_live);
}

/* ------------------------------------------------------------------------ */
/* presence */

int es_api_presence_read(const es_http_req *r, es_http_resp *out) {
  es_presence_rows rows = {0};
  es_err err = {0};
  if (es_store_presence_read(r->store, r->seg[2], &rows, &err)) return es_http_fail_err(out, &err);
  es_wire_presence_rows(&out->body, &rows);
  es_presence_rows_destroy(&rows);
  return answer(out);
}

static const char *const presence_fields[] = {"values", "ttl_ms", "at", "seen", NULL};

/* qsort over presence fields by name bytes: the write is the same
 * whatever order the client's JSON object had. */
static int field_cmp(const void *a, const void *b) {
  return strcmp(((const es_presence_field *)a)->field, ((const es_presence_field *)b)->field);
}

int es_api_presence_set(const es_http_req *r, es_http_resp *out) {
  body bd;
  int64_t ttl, at, seen;
  es_presence_field *fields = NULL;
  es_buf vals;
  es_buf_init(&vals);
  if (read_body(r, out, 1, &bd)) return 0;
  if (check_fields(out, bd.root, "", presence_fields) ||
      get_int(out, bd.root, "", "ttl_ms", 1, ES_NONE, &ttl, NULL) ||
      get_int(out, bd.root, "", "at", 0, ES_NONE, &at, NULL) ||
      get_int(out, bd.root, "", "seen", 0, 0, &seen, NULL))
    goto done;
  const es_jval *values = member(bd.root, "values");
  if (!values) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'values' is required (an object {field: value})");
    goto done;
  }
  if (values->type != ES_JOBJECT) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "field 'values' must be an object {field: value}, got %s",
                 es_jtype_name(values->type));
    goto done;
  }
  size_t n = values->n;
  fields = calloc(n ? n : 1, sizeof *fields + sizeof(size_t));
  if (!fields) {
    es_http_fail(out, 503, "STORAGE", "out of memory");
    goto done;
  }
  size_t *off = (size_t *)(void *)(fields + (n ? n : 1));
  for (size_t i = 0; i < n; i++) {
    const char *name = values->keys[i];
    if (memchr(name, '\0', values->key_lens[i])) {
      es_http_fail(out, 400, "INVALID_ARGUMENT", "values: a field name must not contain a NUL byte");
      goto done;
    }
    es_err err = {0};
    if (es_check_name("presence field", name, &err)) {
      es_http_fail_err(out, &err);
      goto done;
    }
    fields[i].field = name;
    off[i] = SIZE_MAX;
    const es_jval *v = &values->items[i];
    if (v->type == ES_JNULL) continue; /* deletes the field */
    off[i] = vals.len;
    if (es_json_canonicalize(v->raw, v->raw_len, &vals, &err) != ES_OK) {
      es_http_fail_err(out, &err);
      goto done;
    }
    fields[i].value_len = vals.len - off[i];
    if (es_buf_addc(&vals, '\0') != ES_OK) {
      es_http_fail(out, 503, "STORAGE", "out of memory");
      goto done;
    }
  }
  for (size_t i = 0; i < n; i++) fields[i].value = off[i] == SIZE_MAX ? NULL : vals.data + off[i];
  qsort(fields, n, sizeof *fields, field_cmp);
  es_presence_rows applied = {0};
  es_err err = {0};
  if (es_store_presence_set(r->store, r->seg[2], r->seg[3], fields, n, ttl, at, seen, &applied,
                            &err)) {
    es_http_fail_err(out, &err);
    goto done;
  }
  es_buf_adds(&out->body, "{\"applied\":{");
  for (size_t i = 0; i < applied.n; i++) {
    const es_presence_row *row = &applied.v[i];
    if (i) es_buf_addc(&out->body, ',');
    es_wire_cstr(&out->body, row->field);
    es_buf_addc(&out->body, ':');
    if (row->value) es_buf_add(&out->body, row->value, row->value_len);
    else es_buf_adds(&out->body, "null");
  }
  es_buf_adds(&out->body, "}}");
  es_presence_rows_destroy(&applied);
  answer(out);
done:
  free(fields);
  es_buf_destroy(&vals);
  body_free(&bd);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* stats */

typedef struct type_sums {
  es_buf *b;
  size_t n;
  int64_t handled, failed, dead;
} type_sums;

static void put_type_stat(void *ctx, const es_type_stat *st) {
  type_sums *t = ctx;
  es_stats_summary sum;
  es_stats_hist_read((es_stats_hist *)&st->runs, &sum);
  int64_t handled = (int64_t)atomic_load(&st->handled), failed = (int64_t)atomic_load(&st->failed),
          dead = (int64_t)atomic_load(&st->dead);
  t->handled += handled;
  t->failed += failed;
  t->dead += dead;
  if (t->n++) es_buf_addc(t->b, ',');
  es_wire_cstr(t->b, st->type);
  es_buf_adds(t->b, ":{\"handled\":");
  es_wire_int(t->b, handled);
  es_wire_int_field(t->b, "failed", failed);
  es_wire_int_field(t->b, "dead", dead);
  es_wire_int_field(t->b, "runs", (int64_t)sum.count);
  put_percentiles(t->b, sum.p50_ns, sum.p99_ns, sum.max_ns);
  es_buf_addc(t->b, '}');
}

int es_api_stats(const es_http_req *r, es_http_resp *out) {
  es_call_stats calls[ES_STATS_MAX_OPS];
  size_t n = 0;
  es_counts c;
  es_err err = {0};
  /* the calls before the counts: this request is in neither (as stats()) */
  es_store_call_stats(r->store, calls, ES_STATS_MAX_OPS, &n);
  if (es_store_counts(r->store, &c, &err)) return es_http_fail_err(out, &err);
  es_buf *b = &out->body;
  es_buf_adds(b, "{\"calls\":{");
  for (size_t i = 0; i < n; i++) {
    if (i) es_buf_addc(b, ',');
    es_wire_cstr(b, calls[i].op);
    es_buf_adds(b, ":{\"count\":");
    es_wire_int(b, (int64_t)calls[i].count);
    es_wire_int_field(b, "errors", (int64_t)calls[i].errors);
    put_percentiles(b, calls[i].p50_ns, calls[i].p99_ns, calls[i].max_ns);
    es_buf_addc(b, '}');
  }
  es_buf_adds(b, "},\"sessions\":");
  es_wire_int(b, c.sessions);
  es_wire_int_field(b, "events", c.events);
  es_wire_int_field(b, "pending", c.pending);
  es_wire_int_field(b, "dead", c.dead);
  /* The engine's figures are every tenant's: only for a '*' token. */
  es_engine *engine = r->ctx ? r->ctx->engine : NULL;
  if (engine && !r->tenant) {
    type_sums t = {b, 0, 0, 0, 0};
    es_buf_adds(b, ",\"engine\":{\"types\":{");
    es_type_stats_each(es_engine_type_stats(engine), put_type_stat, &t);
    es_buf_adds(b, "},\"handled\":");
    es_wire_int(b, t.handled);
    es_wire_int_field(b, "failed", t.failed);
    es_wire_int_field(b, "dead", t.dead);
    es_buf_addc(b, '}');
  }
  es_buf_addc(b, '}');
  return answer(out);
}
