/*
 * http/internal.h: what the HTTP room's files share. server.c owns the
 * daemon (libmicrohttpd), authentication, limits and routing; each
 * endpoint is a handler that turns one es_http_req into one es_http_resp
 * and never sees libmicrohttpd, so handlers are testable without a socket
 * (spec/c/http_api_test.c). api.c: the JSON endpoints; sse.c: the live
 * tails; metrics.c: /metrics and /healthz; wire.c: the JSON the API
 * writes; routes.c: the route table.
 */
#ifndef ES_HTTP_INTERNAL_H
#define ES_HTTP_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "http/http.h"
#include "util/buf.h"

/* Rights a token carries (a bit set). `admin` implies every other. */
enum {
  ES_RIGHT_READ = 1,
  ES_RIGHT_APPEND = 2,
  ES_RIGHT_WORK = 4,
  ES_RIGHT_ADMIN = 8,
  ES_RIGHT_NONE = 0 /* a route anyone may call (healthz, the inspector's files) */
};

/* The server's own figures, for /metrics (relaxed atomics: counts only). */
typedef struct es_http_counters {
  atomic_uint_fast64_t by_class[6];    /* answers by status class: [2] 2xx ... [5] 5xx */
  atomic_uint_fast64_t by_route[64];   /* answers by es_http_routes index (first 64 routes) */
  atomic_uint_fast64_t streams_opened; /* SSE streams started */
  atomic_uint_fast64_t streams_dropped;/* SSE clients dropped as too slow or gone */
  atomic_uint_fast64_t refused;        /* connections refused over max_connections */
  atomic_uint_fast64_t header_timeouts; /* connections closed: headers late (header_timeout_ms) */
} es_http_counters;

/* What a handler needs of the server; owned by server.c. */
typedef struct es_http_ctx {
  es_store *root;              /* borrowed from the server */
  es_engine *engine;           /* NULL: no reducers */
  const es_http_limits *limits;
  atomic_int *stopping;        /* 1 once es_http_stop began: streams end */
  atomic_int *streams;         /* SSE streams open now (sse.c counts) */
  es_http_counters *counters;  /* server.c counts answers; sse.c counts streams */
  const char *tenant_sep;      /* "\x1f": how a tenant's names are stored on the root */
} es_http_ctx;

#define ES_HTTP_MAX_SEGS 8
#define ES_HTTP_MAX_QUERY 16

/* §6: a W3C Trace Context traceparent (version-traceid-parentid-flags,
 * lowercase hex; version 00 is exactly 55 characters, a later version may
 * append "-..."), at most ES_HTTP_TRACEPARENT_MAX bytes. An all-zero trace
 * or parent id, version ff, or anything else malformed is not one. */
#define ES_HTTP_TRACEPARENT_MAX 256
int es_http_traceparent_ok(const char *v);

/* One request, as a handler sees it. Every string is borrowed, valid for
 * the handler's call (and a stream's life: server.c keeps the request
 * until the stream ends). */
typedef struct es_http_req {
  const char *method;                 /* "GET", "POST", "PUT", "DELETE" (HEAD comes as "GET") */
  int head;                           /* a HEAD: answer as GET would, but a stream route opens
                                         no stream (headers only) */
  const char *path;                   /* the raw path, without the query */
  const char *seg[ES_HTTP_MAX_SEGS];  /* the path's segments, percent-decoded; a segment
                                         that decodes to a NUL byte or invalid UTF-8 is
                                         refused by server.c before any handler */
  size_t nseg;
  const char *qk[ES_HTTP_MAX_QUERY];  /* query parameters, decoded (first of a repeated name wins) */
  const char *qv[ES_HTTP_MAX_QUERY];
  size_t nq;
  const char *body;                   /* NULL when the request has none */
  size_t body_len;
  const char *last_event_id;          /* the Last-Event-ID header, or NULL */
  const char *traceparent;            /* §6: a valid W3C traceparent header, or NULL (an
                                         invalid one is ignored, as Trace Context says) */
  es_store *store;                    /* the token's store: a tenant handle, or the root for '*' */
  const char *tenant;                 /* the token's tenant; NULL for '*' */
  int rights;                         /* the token's ES_RIGHT_* bits */
  const es_http_ctx *ctx;
} es_http_req;

/* An SSE body: called whenever the client can take more. Writes at most
 * max bytes into buf and returns how many (> 0); may block, but must
 * return within about a second (sending ": keep-alive\n\n" when idle) and
 * return -1 (end) once *ctx->stopping is set; -1 also ends the stream at
 * its own choice, -2 on an error (the connection is closed). */
typedef ssize_t (*es_http_stream_fn)(void *state, char *buf, size_t max);

typedef struct es_http_resp {
  int status;                 /* 200 unless set */
  const char *content_type;   /* static; NULL: "application/json" */
  es_buf body;                /* owned; sent as is */
  const char *allow;          /* for 405: the methods the path takes (static) */
  es_http_stream_fn stream;   /* non-NULL: an SSE stream follows body */
  void *stream_state;         /* owned by the stream: freed by stream_free */
  void (*stream_free)(void *state);
} es_http_resp;

typedef int (*es_http_handler)(const es_http_req *r, es_http_resp *out);

/* A route: the method and the path's segments, "*" matching any one
 * segment (its decoded value is then in r->seg at that place). */
typedef struct es_http_route {
  const char *method;
  const char *pattern;   /* e.g. "v1/sessions/ * /events" without the spaces */
  int right;             /* ES_RIGHT_* needed; ES_RIGHT_NONE: no token needed */
  es_http_handler fn;
} es_http_route;

extern const es_http_route es_http_routes[]; /* routes.c; ends with a {NULL} entry */

/* Handlers (each returns 0; the status and body are in out). ------------- */
/* api.c */
int es_api_append(const es_http_req *r, es_http_resp *out);
int es_api_append_many(const es_http_req *r, es_http_resp *out);
int es_api_cancel(const es_http_req *r, es_http_resp *out);
int es_api_archived(const es_http_req *r, es_http_resp *out);
int es_api_read(const es_http_req *r, es_http_resp *out);
int es_api_read_all(const es_http_req *r, es_http_resp *out);
int es_api_head(const es_http_req *r, es_http_resp *out);
int es_api_state(const es_http_req *r, es_http_resp *out);
int es_api_sessions(const es_http_req *r, es_http_resp *out);
int es_api_lineage(const es_http_req *r, es_http_resp *out);
int es_api_children(const es_http_req *r, es_http_resp *out);
int es_api_dead_letters(const es_http_req *r, es_http_resp *out);
int es_api_revive(const es_http_req *r, es_http_resp *out);
int es_api_settle(const es_http_req *r, es_http_resp *out);
int es_api_claims(const es_http_req *r, es_http_resp *out);
int es_api_complete(const es_http_req *r, es_http_resp *out);
int es_api_fail(const es_http_req *r, es_http_resp *out);
int es_api_renew(const es_http_req *r, es_http_resp *out);
int es_api_list_refs(const es_http_req *r, es_http_resp *out);
int es_api_get_ref(const es_http_req *r, es_http_resp *out);
int es_api_put_ref(const es_http_req *r, es_http_resp *out);
int es_api_delete_ref(const es_http_req *r, es_http_resp *out);
int es_api_promote(const es_http_req *r, es_http_resp *out);
int es_api_presence_read(const es_http_req *r, es_http_resp *out);
int es_api_presence_set(const es_http_req *r, es_http_resp *out);
int es_api_stats(const es_http_req *r, es_http_resp *out);
/* api.c, §3.7-§3.10 */
int es_api_fork(const es_http_req *r, es_http_resp *out);
int es_api_fence(const es_http_req *r, es_http_resp *out);
int es_api_lease(const es_http_req *r, es_http_resp *out);
int es_api_release(const es_http_req *r, es_http_resp *out);
int es_api_seal(const es_http_req *r, es_http_resp *out);
int es_api_snapshots(const es_http_req *r, es_http_resp *out);
int es_api_truncate(const es_http_req *r, es_http_resp *out);
int es_api_delete_session(const es_http_req *r, es_http_resp *out);
int es_api_archive(const es_http_req *r, es_http_resp *out);
int es_api_segments(const es_http_req *r, es_http_resp *out);
int es_api_shred(const es_http_req *r, es_http_resp *out);
/* openapi.c: GET /v1/openapi.json, the document core/http/openapi.json
 * (embedded at build time as es_openapi_json, NUL-terminated) */
extern const char es_openapi_json[];
int es_openapi(const es_http_req *r, es_http_resp *out);
/* projections.c (§8) */
int es_api_projections(const es_http_req *r, es_http_resp *out);
int es_api_projection_keys(const es_http_req *r, es_http_resp *out);
int es_api_projection_state(const es_http_req *r, es_http_resp *out);
int es_api_projection_control(const es_http_req *r, es_http_resp *out);
/* sse.c */
int es_sse_session(const es_http_req *r, es_http_resp *out);
int es_sse_all(const es_http_req *r, es_http_resp *out);
int es_sse_presence(const es_http_req *r, es_http_resp *out);
/* metrics.c */
int es_metrics(const es_http_req *r, es_http_resp *out);
int es_healthz(const es_http_req *r, es_http_resp *out);

/* Shared helpers (wire.c). ------------------------------------------------ */

/* The HTTP status for a store error code: 400 INVALID_ARGUMENT, 404
 * NOT_FOUND and NO_SUCH_EVENT, 409 WRONG_EXPECTED_HEAD, REF_CONFLICT,
 * STALE_FENCE, SEALED, PARTIAL_DUPLICATE_BATCH, ID_CONFLICT and
 * SUPERSEDED_ATTEMPT, 410 TRUNCATED, 413 TOO_LARGE, 503 STORAGE and
 * CLOSED. */
int es_http_status_of(int code);

/* Makes out an error answer: status, body {"code":..,"message":..}
 * (message made printable: invalid UTF-8 bytes as \xHH). `code` is a
 * contract code name or one of the HTTP layer's own: "UNAUTHORIZED",
 * "FORBIDDEN", "NOT_FOUND", "METHOD_NOT_ALLOWED", "TOO_LARGE",
 * "UNAVAILABLE". Returns 0. */
int es_http_fail(es_http_resp *out, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The same for a failed store call: es_http_status_of(err->code). */
int es_http_fail_err(es_http_resp *out, const es_err *err);

/* The query parameter `name`, or NULL. */
const char *es_http_query(const es_http_req *r, const char *name);
/* An integer query parameter in [lo, hi]; absent or empty: *v = dflt. A bad value
 * makes out a 400 INVALID_ARGUMENT naming it and returns -1; else 0. */
int es_http_query_int(const es_http_req *r, const char *name, int64_t lo, int64_t hi,
                      int64_t dflt, int64_t *v, es_http_resp *out);

/* JSON writing: appends to b; out-of-memory shows as b->oom. */
void es_wire_cstr(es_buf *b, const char *s);           /* the same; NULL writes null */
void es_wire_int(es_buf *b, int64_t v);                /* ES_NONE writes null */
void es_wire_key(es_buf *b, const char *name, int first);  /* "name": after a ',' unless first */
void es_wire_int_field(es_buf *b, const char *name, int64_t v);     /* ,"name":v */
void es_wire_str_field(es_buf *b, const char *name, const char *s); /* ,"name":"s" (NULL: null) */
/* {"code":..,"message":..}: every error the API writes, answers and streams alike. */
void es_wire_error(es_buf *b, const char *code, const char *message);
/* {"rows":[{participant, field, value, seen, at, expires_at}]}: presence as
 * presence_read gives it (GET /v1/presence/{ns} and a presence stream's
 * snapshot). */
void es_wire_presence_rows(es_buf *b, const es_presence_rows *rows);
/* A stored event as the Lua face shows it (docs/contract.md §3.1): every field
 * that is set, "payload" always (null when absent or shredded), "cause"
 * and "origin" as objects, "status" as text; `claimed` adds "attempt". */
void es_wire_event(es_buf *b, const es_event *e, int claimed);
/* §5: after es_wire_event of an event read with a read_all cursor (store.h
 * es_store_read_all_cursor), adds "cursor" to it when the cursor is not
 * the event's position (a sharded store's): unsharded answers stay as
 * they were. */
void es_wire_cursor(es_buf *b, const es_event *e, const char *cursor);
/* [event, ...] */
void es_wire_events_array(es_buf *b, const es_events *list, int claimed);

/* The most bytes one item can take in an answer, for a page read in
 * chunks that cannot pass max_response_bytes (api.c "Pages"): JSON
 * writes a byte of a string as at most 6 ("\u001f"), a name is at most
 * ES_MAX_ID_BYTES and free text ES_MAX_TEXT_BYTES (plus its cut mark).
 * An event's payload is its stored canonical text, at most the store's
 * max_payload_bytes. */
#define ES_WIRE_NAME_MAX (ES_MAX_ID_BYTES * 6 + 2)
#define ES_WIRE_TEXT_MAX ((ES_MAX_TEXT_BYTES + 8) * 6 + 2)
#define ES_WIRE_FIELDS_MAX 1024 /* every key, integer and punctuation of one item */
/* es_wire_event: 7 names (id, type, key, session, lane, claim_holder,
 * origin's session), last_error and the meta (§3.1: its stored canonical
 * text, at most ES_MAX_META_BYTES). */
#define ES_WIRE_EVENT_MAX(max_payload)                                                  \
  ((max_payload) + 7 * ES_WIRE_NAME_MAX + ES_WIRE_TEXT_MAX + ES_MAX_META_BYTES + \
   ES_WIRE_FIELDS_MAX)

#endif
