/*
 * http_api_test.c: the JSON API's handlers (core/http/api.c,
 * docs/http-api.md) called directly with hand-built requests on memory:
 * stores, no socket; and the request-body reader (codec/json_doc.c).
 * Success, bad input (bad JSON, wrong types, unknown fields, NUL in
 * names, bad numbers, oversized batches), the status codes, tenant scoping
 * and exact int64/float payloads. The state endpoint runs a real engine on
 * a scripts directory made here (needs lua/eventstore/loader.lua on
 * LUA_PATH, as engine_test). TAP-style output; non-zero exit on failure.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec/json.h"
#include "codec/json_doc.h"
#include "http/internal.h"
#include "module/module.h" /* open_core: the engine's states preload this library's module */

#include "tap.h"

/* ------------------------------------------------------------------------ */
/* a request, its answer and the answer read back as JSON */

static es_http_limits limits;
static atomic_int stopping, streams;
static es_http_counters counters;
static es_http_ctx ctx;

typedef struct call {
  es_http_req req;
  es_http_resp resp;
  char path[2048];
  char query[2048];
  es_json_doc *doc;
  const es_jval *json; /* the answer's body; NULL when it is not JSON */
} call;

static void call_done(call *c) {
  es_buf_destroy(&c->resp.body);
  es_json_doc_free(c->doc);
  memset(c, 0, sizeof *c);
}

/* Runs handler fn on `method path?query` with body (NULL: none) as the
 * token of `tenant` (NULL: '*') whose store is s. Segments and query are
 * split in place; no percent-decoding (the tests use plain names). */
static void run(call *c, es_http_handler fn, es_store *s, const char *tenant, const char *method,
                const char *target, const char *body) {
  memset(c, 0, sizeof *c);
  snprintf(c->path, sizeof c->path, "%s", target);
  char *q = strchr(c->path, '?');
  if (q) {
    *q++ = '\0';
    snprintf(c->query, sizeof c->query, "%s", q);
  }
  c->req.method = method;
  c->req.path = target;
  for (char *p = c->path, *tok; (tok = strsep(&p, "/")) && c->req.nseg < ES_HTTP_MAX_SEGS;)
    if (*tok) c->req.seg[c->req.nseg++] = tok;
  for (char *p = c->query, *tok; q && (tok = strsep(&p, "&")) && c->req.nq < ES_HTTP_MAX_QUERY;) {
    char *eq = strchr(tok, '=');
    if (eq) *eq++ = '\0';
    c->req.qk[c->req.nq] = tok;
    c->req.qv[c->req.nq++] = eq ? eq : "";
  }
  c->req.body = body;
  c->req.body_len = body ? strlen(body) : 0;
  c->req.store = s;
  c->req.tenant = tenant;
  c->req.rights = ES_RIGHT_ADMIN;
  c->req.ctx = &ctx;
  c->resp.status = 200;
  es_buf_init(&c->resp.body);
  fn(&c->req, &c->resp);
  es_err err = {0};
  if (c->resp.body.len &&
      es_json_doc_parse(c->resp.body.data, c->resp.body.len, &c->doc, &err) == ES_OK)
    c->json = es_json_doc_root(c->doc);
  if (getenv("HTTP_API_TEST_VERBOSE"))
    printf("# %s %s -> %d %.*s\n", method, target, c->resp.status, (int)c->resp.body.len,
           c->resp.body.data ? c->resp.body.data : "");
}

/* The value at a dotted path ("events.0.payload"); NULL when absent. */
static const es_jval *at(const es_jval *v, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf, *tok; v && (tok = strsep(&p, "."));) {
    if (v->type == ES_JARRAY) v = es_jval_at(v, (size_t)strtoul(tok, NULL, 10));
    else v = es_jval_get(v, tok);
  }
  return v;
}

/* Whether the value at path has exactly this JSON text. */
static int raw_is(const call *c, const char *path, const char *text) {
  const es_jval *v = c->json ? at(c->json, path) : NULL;
  return v && v->raw_len == strlen(text) && memcmp(v->raw, text, v->raw_len) == 0;
}

static int64_t int_at(const call *c, const char *path) {
  const es_jval *v = c->json ? at(c->json, path) : NULL;
  return v && v->type == ES_JINT ? v->i : ES_NONE;
}

static size_t len_at(const call *c, const char *path) {
  const es_jval *v = c->json ? at(c->json, path) : NULL;
  return v && (v->type == ES_JARRAY || v->type == ES_JOBJECT) ? v->n : (size_t)-1;
}

/* An error answer: this status, this code, and a message holding `needle`. */
static int is_error(const call *c, int status, const char *code, const char *needle) {
  const es_jval *m = c->json ? es_jval_get(c->json, "message") : NULL;
  const es_jval *k = c->json ? es_jval_get(c->json, "code") : NULL;
  return c->resp.status == status && k && k->type == ES_JSTRING && strcmp(k->str, code) == 0 && m &&
         m->type == ES_JSTRING && (!needle || strstr(m->str, needle));
}

/* One request whose answer is only looked at for status/code/message. */
static void expect_error(es_http_handler fn, es_store *s, const char *method, const char *target,
                         const char *body, int status, const char *code, const char *needle,
                         const char *name) {
  call c;
  run(&c, fn, s, NULL, method, target, body);
  ok(is_error(&c, status, code, needle), name);
  if (!is_error(&c, status, code, needle))
    printf("#   got %d %.*s\n", c.resp.status, (int)c.resp.body.len, c.resp.body.data ? c.resp.body.data : "");
  call_done(&c);
}

static int64_t head_of(es_store *s, const char *session) {
  int64_t h = -1;
  es_err err = {0};
  es_store_head(s, session, &h, &err);
  return h;
}

/* ------------------------------------------------------------------------ */

static int64_t clock_now = 1000000;
static int fixed_clock(void *c, int64_t *now, es_err *err) {
  (void)c;
  (void)err;
  *now = clock_now;
  return ES_OK;
}

static void test_json_doc(void) {
  es_json_doc *d = NULL;
  es_err err = {0};
  const char *text = " {\"a\": [1, -9223372036854775808, 9223372036854775808, 0.1, 1e300],"
                     " \"s\": \"x\\u0000y\", \"t\": true, \"n\": null, \"o\": {\"k\": \"\\u00e9\"}} ";
  int rc = es_json_doc_parse(text, strlen(text), &d, &err);
  ok(rc == ES_OK, "json_doc: a document parses");
  if (rc != ES_OK) return;
  const es_jval *root = es_json_doc_root(d);
  const es_jval *a = es_jval_get(root, "a");
  ok(root->type == ES_JOBJECT && root->n == 5 && a && a->type == ES_JARRAY && a->n == 5,
     "json_doc: objects and arrays with their counts");
  ok(a->items[0].type == ES_JINT && a->items[0].i == 1 && a->items[1].type == ES_JINT &&
         a->items[1].i == INT64_MIN,
     "json_doc: integers within int64 are integers, INT64_MIN included");
  ok(a->items[2].type == ES_JFLOAT && a->items[3].type == ES_JFLOAT && a->items[4].type == ES_JFLOAT,
     "json_doc: 2^63, 0.1 and 1e300 are floats");
  ok(a->items[2].raw_len == 19 && memcmp(a->items[2].raw, "9223372036854775808", 19) == 0 &&
         a->items[4].raw_len == 5 && memcmp(a->items[4].raw, "1e300", 5) == 0,
     "json_doc: every value keeps its raw text");
  const es_jval *s = es_jval_get(root, "s");
  ok(s && s->type == ES_JSTRING && s->len == 3 && memcmp(s->str, "x\0y", 3) == 0,
     "json_doc: a string keeps a NUL byte with its length");
  const es_jval *o = es_jval_get(root, "o");
  ok(o && o->raw_len == 15 && es_jval_get(o, "k") && strcmp(es_jval_get(o, "k")->str, "\xc3\xa9") == 0,
     "json_doc: nested objects, escapes decoded, raw span of a container");
  ok(es_jval_get(root, "t")->boolean == 1 && es_jval_get(root, "n")->type == ES_JNULL &&
         !es_jval_get(root, "missing") && !es_jval_at(a, 5),
     "json_doc: booleans, null, lookups of what is not there");
  es_json_doc_free(d);

  const char *bad[] = {"{\"a\":1,\"a\":2}", "[1] x", "\"\xff\"", "{\"a\":}", "", "\"\\ud800\""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    es_err e1 = {0}, e2 = {0};
    d = (es_json_doc *)1;
    int r1 = es_json_doc_parse(bad[i], strlen(bad[i]), &d, &e1);
    int r2 = es_json_validate(bad[i], strlen(bad[i]), &e2);
    char name[96];
    snprintf(name, sizeof name, "json_doc: bad JSON #%zu refused as es_json_validate refuses it", i + 1);
    ok(r1 == ES_INVALID_ARGUMENT && r2 == r1 && d == NULL && strcmp(e1.msg, e2.msg) == 0 &&
           strstr(e1.msg, "invalid JSON at byte"),
       name);
  }
  /* the depth limit: 512 levels read, 513 refused */
  char deep[1100];
  for (int depth = 512; depth <= 513; depth++) {
    memset(deep, '[', (size_t)depth);
    memset(deep + depth, ']', (size_t)depth);
    rc = es_json_doc_parse(deep, (size_t)depth * 2, &d, &err);
    ok(depth == 512 ? rc == ES_OK : rc == ES_INVALID_ARGUMENT && strstr(err.msg, "nesting"),
       depth == 512 ? "json_doc: 512 levels of nesting read" : "json_doc: 513 levels refused");
    es_json_doc_free(d);
  }
}

static void test_append_read(es_store *s) {
  call c;
  /* exact payloads */
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/num/events",
      "{\"events\":[{\"type\":\"n\",\"id\":\"n-1\",\"payload\":{\"z\":1e300,\"big\":9007199254740993,"
      "\"min\":-9223372036854775808,\"f\":0.1,\"s\":\"\\u00e9\"}}],\"expected\":0}");
  ok(c.resp.status == 200 && int_at(&c, "events.0.index") == 1 && raw_is(&c, "pending", "true"),
     "append: 200 with the stored events and pending");
  ok(raw_is(&c, "events.0.payload",
            "{\"big\":9007199254740993,\"f\":0.1,\"min\":-9223372036854775808,\"s\":\"\xc3\xa9\",\"z\":1e+300}"),
     "append: the payload is stored canonically and exactly (int64, 0.1, 1e300)");
  ok(raw_is(&c, "events.0.id", "\"n-1\"") && raw_is(&c, "events.0.status", "\"pending\""),
     "append: the stored event has the Lua face's fields");
  call_done(&c);
  run(&c, es_api_read, s, NULL, "GET", "/v1/sessions/num/events", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 1 && int_at(&c, "through") == 1 &&
         raw_is(&c, "events.0.payload.big", "9007199254740993") &&
         raw_is(&c, "events.0.payload.min", "-9223372036854775808") &&
         raw_is(&c, "events.0.payload.f", "0.1") && raw_is(&c, "events.0.payload.z", "1e+300"),
     "read: the payload comes back byte for byte");
  call_done(&c);

  /* replay and expected */
  const char *two = "{\"events\":[{\"type\":\"a\",\"id\":\"r-1\"},{\"type\":\"b\",\"id\":\"r-2\",\"payload\":[1,2]}]}";
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/rep/events", two);
  ok(c.resp.status == 200 && len_at(&c, "events") == 2, "append: two events");
  call_done(&c);
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/rep/events", two);
  ok(c.resp.status == 200 && len_at(&c, "events") == 2 && int_at(&c, "events.1.index") == 2 &&
         head_of(s, "rep") == 2,
     "append: an idempotent replay answers 200 with the stored originals, writing nothing");
  call_done(&c);
  expect_error(es_api_append, s, "POST", "/v1/sessions/rep/events",
               "{\"events\":[{\"type\":\"b\",\"id\":\"r-2\",\"payload\":[1,2]},{\"type\":\"a\",\"id\":\"r-3\"}]}", 409,
               "PARTIAL_DUPLICATE_BATCH", NULL, "append: a partial replay is 409 PARTIAL_DUPLICATE_BATCH");
  expect_error(es_api_append, s, "POST", "/v1/sessions/rep/events",
               "{\"events\":[{\"type\":\"a\"}],\"expected\":1}", 409, "WRONG_EXPECTED_HEAD", NULL,
               "append: a wrong expected head is 409 WRONG_EXPECTED_HEAD");
  ok(head_of(s, "rep") == 2, "append: a refused append changed nothing");
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/rep/events", "{\"events\":[]}");
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "append: an empty list is an empty append");
  call_done(&c);

  /* every field of an event */
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/full/events", "{\"events\":[{\"type\":\"first\"}]}");
  call_done(&c);
  expect_error(es_api_append, s, "POST", "/v1/sessions/full/events",
               "{\"events\":[{\"type\":\"t\",\"cause\":{\"index\":1,\"attempt\":2}}]}", 409,
               "SUPERSEDED_ATTEMPT", NULL, "append: a cause reaches the store (its attempt must own the event)");
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/full/events",
      "{\"events\":[{\"type\":\"t\",\"lane\":\"l\",\"settled\":true},"
      "{\"type\":\"t\",\"delay_ms\":500},{\"type\":\"t\",\"at\":77},{\"type\":\"t\",\"not_before\":88},"
      "{\"type\":\"t\",\"payload\":null}]}");
  ok(c.resp.status == 200 && raw_is(&c, "events.0.lane", "\"l\"") &&
         raw_is(&c, "events.0.status", "\"processed\""),
     "append: lane and settled are taken");
  ok(int_at(&c, "events.1.not_before") == clock_now + 500 && int_at(&c, "events.2.not_before") == 77 &&
         int_at(&c, "events.3.not_before") == 88 && raw_is(&c, "events.4.payload", "null"),
     "append: delay_ms counts from the store's clock, at and not_before are absolute");
  call_done(&c);

  /* bad input: nothing written */
  struct {
    const char *body;
    int status;
    const char *code, *needle, *name;
  } bad[] = {
      {"{\"events\":[{\"type\":\"a\"}]", 400, "INVALID_ARGUMENT", "invalid JSON at byte",
       "append: bad JSON is 400 naming the byte"},
      {"{\"events\":[],\"events\":[]}", 400, "INVALID_ARGUMENT", "duplicate object key",
       "append: a duplicate key is 400"},
      {"{\"events\":[]} x", 400, "INVALID_ARGUMENT", "trailing", "append: trailing garbage is 400"},
      {"{\"events\":[{\"type\":\"\xff\"}]}", 400, "INVALID_ARGUMENT", "UTF-8", "append: bad UTF-8 is 400"},
      {NULL, 400, "INVALID_ARGUMENT", "body", "append: no body is 400"},
      {"[]", 400, "INVALID_ARGUMENT", "must be a JSON object", "append: a body that is not an object is 400"},
      {"{\"events\":{\"type\":\"a\"}}", 400, "INVALID_ARGUMENT", "must be an array",
       "append: events as an object (one event) is 400, never an empty batch"},
      {"{}", 400, "INVALID_ARGUMENT", "'events' is required", "append: events is required"},
      {"{\"events\":[],\"expeted\":0}", 400, "INVALID_ARGUMENT", "unknown field 'expeted'",
       "append: an unknown top-level field is 400 naming it"},
      {"{\"events\":[{\"type\":\"a\",\"paylod\":1}]}", 400, "INVALID_ARGUMENT", "events[1]: unknown field 'paylod'",
       "append: an unknown event field is 400 naming it"},
      {"{\"events\":[{\"type\":\"a\",\"cause\":{\"index\":1,\"attempt\":1,\"x\":1}}]}", 400,
       "INVALID_ARGUMENT", "unknown field 'x'", "append: an unknown cause field is 400"},
      {"{\"events\":[{\"type\":\"a\",\"cause\":{\"index\":1}}]}", 400, "INVALID_ARGUMENT",
       "events[1].cause.attempt", "append: a cause without attempt is 400"},
      {"{\"events\":[{\"type\":\"a\\u0000b\"}]}", 400, "INVALID_ARGUMENT", "NUL",
       "append: a NUL in a type is 400"},
      {"{\"events\":[{\"type\":\"a\",\"id\":\"x\\u0000y\"}]}", 400, "INVALID_ARGUMENT", "events[1].id",
       "append: a NUL in an id is 400 naming it"},
      {"{\"events\":[{\"payload\":1}]}", 400, "INVALID_ARGUMENT", "events[1].type' is required",
       "append: an event without type is 400"},
      {"{\"events\":[{\"type\":5}]}", 400, "INVALID_ARGUMENT", "must be a string", "append: a type that is not a string is 400"},
      {"{\"events\":[7]}", 400, "INVALID_ARGUMENT", "events[1] must be an object", "append: an event that is not an object is 400"},
      {"{\"events\":[],\"expected\":1.0}", 400, "INVALID_ARGUMENT", "'expected' must be a whole number",
       "append: a float expected is 400"},
      {"{\"events\":[],\"expected\":\"0\"}", 400, "INVALID_ARGUMENT", "'expected' must be a whole number",
       "append: a string expected is 400"},
      {"{\"events\":[],\"expected\":9223372036854775808}", 400, "INVALID_ARGUMENT", "'expected'",
       "append: an expected beyond int64 is 400"},
      {"{\"events\":[],\"expected\":-9223372036854775808}", 400, "INVALID_ARGUMENT", "out of range",
       "append: INT64_MIN (the C API's absent) is 400"},
      {"{\"events\":[{\"type\":\"a\",\"settled\":1}]}", 400, "INVALID_ARGUMENT", "true or false",
       "append: settled that is not a boolean is 400"},
      {"{\"events\":[{\"type\":\"a\",\"at\":1,\"not_before\":2}]}", 400, "INVALID_ARGUMENT", "both",
       "append: at with not_before is 400"},
      {"{\"events\":[{\"type\":\"a\",\"at\":1,\"delay_ms\":2}]}", 400, "INVALID_ARGUMENT", "both",
       "append: at with delay_ms is 400"},
      {"{\"events\":[{\"type\":\"a\",\"delay_ms\":-1}]}", 400, "INVALID_ARGUMENT", "delay_ms",
       "append: a negative delay_ms is 400"},
      {"{\"events\":[{\"type\":\"a\",\"delay_ms\":9223372036854775807}]}", 400, "INVALID_ARGUMENT",
       "too large", "append: a delay past the largest time is 400"},
      {"{\"events\":[{\"type\":\"\"}]}", 400, "INVALID_ARGUMENT", NULL, "append: an empty type is the store's 400"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    expect_error(es_api_append, s, "POST", "/v1/sessions/bad/events", bad[i].body, bad[i].status,
                 bad[i].code, bad[i].needle, bad[i].name);
  ok(head_of(s, "bad") == 0, "append: no bad request wrote anything");

  limits.max_batch = 3;
  expect_error(es_api_append, s, "POST", "/v1/sessions/bad/events",
               "{\"events\":[{\"type\":\"a\"},{\"type\":\"a\"},{\"type\":\"a\"},{\"type\":\"a\"}]}", 413,
               "TOO_LARGE", "over the limit of 3", "append: more events than max_batch is 413 TOO_LARGE");
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/bad/events",
      "{\"events\":[{\"type\":\"a\"},{\"type\":\"a\"},{\"type\":\"a\"}]}");
  ok(c.resp.status == 200 && head_of(s, "bad") == 3, "append: max_batch events are taken");
  call_done(&c);
  limits.max_batch = 1000;

  /* reads */
  run(&c, es_api_read, s, NULL, "GET", "/v1/sessions/bad/events?after=1&limit=1", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 1 && int_at(&c, "events.0.index") == 2 &&
         int_at(&c, "through") == 3,
     "read: after and limit page; through pins the head");
  call_done(&c);
  run(&c, es_api_read, s, NULL, "GET", "/v1/sessions/bad/events?through=2", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 2 && int_at(&c, "through") == 2,
     "read: through bounds the page");
  call_done(&c);
  run(&c, es_api_read, s, NULL, "GET", "/v1/sessions/bad/events?after=&limit=&through=", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 3, "read: empty query parameters count as absent");
  call_done(&c);
  run(&c, es_api_read, s, NULL, "GET", "/v1/sessions/nobody/events", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 0 && int_at(&c, "through") == 0,
     "read: a session that does not exist has no events");
  call_done(&c);
  expect_error(es_api_read, s, "GET", "/v1/sessions/bad/events?limit=0", NULL, 400, "INVALID_ARGUMENT",
               "'limit'", "read: limit 0 is 400");
  expect_error(es_api_read, s, "GET", "/v1/sessions/bad/events?limit=1001", NULL, 400,
               "INVALID_ARGUMENT", "1 to 1000", "read: limit over max_limit is 400");
  expect_error(es_api_read, s, "GET", "/v1/sessions/bad/events?after=x", NULL, 400, "INVALID_ARGUMENT",
               "'after'", "read: a non-number after is 400");
  expect_error(es_api_read, s, "GET", "/v1/sessions/bad/events?after=-1", NULL, 400,
               "INVALID_ARGUMENT", "'after'", "read: a negative after is 400");
  expect_error(es_api_read, s, "GET", "/v1/sessions/bad/events?after=99999999999999999999", NULL, 400,
               "INVALID_ARGUMENT", "'after'", "read: an after beyond int64 is 400");

  run(&c, es_api_read_all, s, NULL, "GET", "/v1/events?after=1&limit=2", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 2 && int_at(&c, "events.0.position") == 2,
     "read_all: events by position after `after`");
  call_done(&c);
  expect_error(es_api_read_all, s, "GET", "/v1/events?limit=abc", NULL, 400, "INVALID_ARGUMENT",
               "'limit'", "read_all: a bad limit is 400");
  run(&c, es_api_head, s, NULL, "GET", "/v1/sessions/bad/head", NULL);
  ok(c.resp.status == 200 && int_at(&c, "head") == 3, "head: {head}");
  call_done(&c);
}

static void test_sessions(es_store *s) {
  call c;
  run(&c, es_api_sessions, s, NULL, "GET", "/v1/sessions?prefix=re&limit=10", NULL);
  ok(c.resp.status == 200 && len_at(&c, "sessions") == 1 && raw_is(&c, "sessions.0.session", "\"rep\"") &&
         int_at(&c, "sessions.0.events") == 2 && int_at(&c, "sessions.0.pending") == 2 &&
         int_at(&c, "sessions.0.dead") == 0 && raw_is(&c, "sessions.0.sealed", "false") &&
         int_at(&c, "sessions.0.first_at") == clock_now && raw_is(&c, "cursor", "null"),
     "sessions: a prefix, the Lua face's row fields, no cursor at the end");
  call_done(&c);
  run(&c, es_api_sessions, s, NULL, "GET", "/v1/sessions?limit=1", NULL);
  ok(c.resp.status == 200 && len_at(&c, "sessions") == 1 && raw_is(&c, "cursor", "\"bad\""),
     "sessions: a full page has a cursor");
  call_done(&c);
  run(&c, es_api_sessions, s, NULL, "GET", "/v1/sessions?limit=1&after=bad", NULL);
  ok(c.resp.status == 200 && raw_is(&c, "sessions.0.session", "\"full\""), "sessions: after pages on");
  call_done(&c);
  expect_error(es_api_sessions, s, "GET", "/v1/sessions?limit=-5", NULL, 400, "INVALID_ARGUMENT",
               "'limit'", "sessions: a negative limit is 400");
}

static void test_work(es_store *s) {
  call c;
  run(&c, es_api_append, s, NULL, "POST", "/v1/sessions/jobs/events",
      "{\"events\":[{\"type\":\"job\"},{\"type\":\"job\"},{\"type\":\"job\"},{\"type\":\"other\"}]}");
  call_done(&c);
  run(&c, es_api_claims, s, NULL, "POST", "/v1/claims",
      "{\"holder\":\"w1\",\"ttl_ms\":60000,\"limit\":2,\"types\":[\"job\"]}");
  ok(c.resp.status == 200 && len_at(&c, "events") == 2 && int_at(&c, "events.0.attempt") == 1 &&
         raw_is(&c, "events.0.claim_holder", "\"w1\"") &&
         int_at(&c, "events.0.claim_expires_at") == clock_now + 60000 && at(c.json, "retry_at"),
     "claims: events with attempt, claim_holder and claim_expires_at");
  ok(raw_is(&c, "events.0.session", "\"jobs\"") && int_at(&c, "events.0.index") == 1 &&
         int_at(&c, "events.1.index") == 2,
     "claims: the earliest ready events first");
  call_done(&c);
  run(&c, es_api_claims, s, NULL, "POST", "/v1/claims", "{\"holder\":\"w1\",\"ttl_ms\":1000,\"types\":[]}");
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "claims: types [] claims nothing");
  call_done(&c);

  run(&c, es_api_renew, s, NULL, "POST", "/v1/sessions/jobs/events/1/renew",
      "{\"holder\":\"w1\",\"attempt\":1,\"ttl_ms\":90000}");
  ok(c.resp.status == 200 && raw_is(&c, "renewed", "[1]") && raw_is(&c, "superseded", "[]"),
     "renew: {renewed, superseded}");
  call_done(&c);
  run(&c, es_api_renew, s, NULL, "POST", "/v1/sessions/jobs/events/1/renew",
      "{\"holder\":\"w1\",\"attempt\":7,\"ttl_ms\":90000}");
  ok(c.resp.status == 200 && raw_is(&c, "renewed", "[]") && raw_is(&c, "superseded", "[1]"),
     "renew: a wrong attempt is superseded");
  call_done(&c);

  const char *done = "{\"attempt\":1,\"events\":[{\"type\":\"done\",\"id\":\"d-1\",\"payload\":{\"n\":-9223372036854775807}}]}";
  run(&c, es_api_complete, s, NULL, "POST", "/v1/sessions/jobs/events/1/complete", done);
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"completed\"") && len_at(&c, "events") == 1 &&
         int_at(&c, "events.0.cause.index") == 1 && int_at(&c, "events.0.cause.attempt") == 1 &&
         raw_is(&c, "events.0.payload.n", "-9223372036854775807"),
     "complete: completed, the returned events appended with their cause");
  call_done(&c);
  int64_t h = head_of(s, "jobs");
  run(&c, es_api_complete, s, NULL, "POST", "/v1/sessions/jobs/events/1/complete", done);
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"completed\"") && head_of(s, "jobs") == h,
     "complete: a retried completion (ids given) writes nothing again");
  call_done(&c);
  run(&c, es_api_complete, s, NULL, "POST", "/v1/sessions/jobs/events/2/complete", "{\"attempt\":9}");
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"superseded\"") && raw_is(&c, "events", "[]"),
     "complete: a wrong attempt is superseded");
  call_done(&c);

  run(&c, es_api_fail, s, NULL, "POST", "/v1/sessions/jobs/events/2/fail",
      "{\"attempt\":1,\"error\":\"boom\\u0000here\",\"retry_after_ms\":0}");
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"failed\"") && int_at(&c, "failures") == 1,
     "fail: failed, with the failure count (max_failures defaults to 5)");
  call_done(&c);
  es_event e;
  es_event_init(&e);
  es_err err = {0};
  es_store_get(s, "jobs", 2, &e, &err);
  ok(e.last_error && strstr(e.last_error, "boom\xef\xbf\xbdhere"), "fail: a NUL in the error text becomes U+FFFD");
  es_event_destroy(&e);
  run(&c, es_api_claims, s, NULL, "POST", "/v1/claims", "{\"holder\":\"w2\",\"ttl_ms\":1000,\"types\":[\"job\"]}");
  int64_t idx = int_at(&c, "events.0.index"), att = int_at(&c, "events.0.attempt");
  call_done(&c);
  char path[128], body[128];
  snprintf(path, sizeof path, "/v1/sessions/jobs/events/%lld/fail", (long long)idx);
  snprintf(body, sizeof body, "{\"attempt\":%lld,\"error\":\"x\",\"max_failures\":1}", (long long)att);
  run(&c, es_api_fail, s, NULL, "POST", path, body);
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"dead_lettered\""), "fail: max_failures 1 dead-letters");
  call_done(&c);

  run(&c, es_api_dead_letters, s, NULL, "GET", "/v1/dead-letters?session=jobs", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 1 && raw_is(&c, "events.0.status", "\"dead\"") &&
         int_at(&c, "events.0.index") == idx,
     "dead-letters: the dead letter of the session");
  call_done(&c);
  run(&c, es_api_dead_letters, s, NULL, "GET", "/v1/dead-letters?session=nobody", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "dead-letters: none in another session");
  call_done(&c);
  snprintf(path, sizeof path, "/v1/sessions/jobs/events/%lld/settle", (long long)idx);
  run(&c, es_api_settle, s, NULL, "POST", path, "{\"reason\":\"by hand\"}");
  ok(c.resp.status == 200 && raw_is(&c, "event.status", "\"processed\"") && int_at(&c, "event.index") == idx,
     "settle: {event} after the change");
  call_done(&c);
  expect_error(es_api_settle, s, "POST", path, NULL, 400, "INVALID_ARGUMENT", NULL,
               "settle: an event that is not dead is 400");
  expect_error(es_api_revive, s, "POST", "/v1/sessions/jobs/events/999/revive", NULL, 404,
               "NO_SUCH_EVENT", NULL, "revive: a missing index is 404 NO_SUCH_EVENT");

  /* a dead letter to revive */
  run(&c, es_api_claims, s, NULL, "POST", "/v1/claims", "{\"holder\":\"w3\",\"ttl_ms\":1000,\"types\":[\"other\"]}");
  idx = int_at(&c, "events.0.index");
  att = int_at(&c, "events.0.attempt");
  call_done(&c);
  snprintf(path, sizeof path, "/v1/sessions/jobs/events/%lld/fail", (long long)idx);
  snprintf(body, sizeof body, "{\"attempt\":%lld,\"error\":\"x\",\"max_failures\":1}", (long long)att);
  run(&c, es_api_fail, s, NULL, "POST", path, body);
  call_done(&c);
  snprintf(path, sizeof path, "/v1/sessions/jobs/events/%lld/revive", (long long)idx);
  expect_error(es_api_revive, s, "POST", path, "{\"x\":1}", 400, "INVALID_ARGUMENT", "unknown field 'x'",
               "revive: an unknown field is 400");
  run(&c, es_api_revive, s, NULL, "POST", path, "{}");
  ok(c.resp.status == 200 && raw_is(&c, "event.status", "\"pending\"") && int_at(&c, "event.failures") == 0,
     "revive: the dead letter is pending again, failures reset");
  call_done(&c);

  /* bad input */
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"ttl_ms\":1000}", 400, "INVALID_ARGUMENT",
               "'holder' is required", "claims: holder is required");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":1000.5}", 400,
               "INVALID_ARGUMENT", "'ttl_ms' must be a whole number", "claims: a float ttl_ms is 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":1000,\"limit\":0}", 400,
               "INVALID_ARGUMENT", "'limit'", "claims: limit 0 is 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":1000,\"types\":\"job\"}",
               400, "INVALID_ARGUMENT", "'types' must be an array", "claims: types that is not an array is 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":1000,\"types\":[\"a\\u0000\"]}",
               400, "INVALID_ARGUMENT", "types[1]", "claims: a NUL in a type is 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\\u0000x\",\"ttl_ms\":1000}", 400,
               "INVALID_ARGUMENT", "NUL", "claims: a NUL in the holder is 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":0}", 400,
               "INVALID_ARGUMENT", NULL, "claims: ttl_ms 0 is the store's 400");
  expect_error(es_api_claims, s, "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl\":1000}", 400,
               "INVALID_ARGUMENT", "unknown field 'ttl'", "claims: an unknown field is 400");
  const char *bad_index[] = {"0", "-1", "1.5", "x", "+1", "99999999999999999999", "1e3"};
  for (size_t i = 0; i < sizeof bad_index / sizeof *bad_index; i++) {
    char name[96];
    snprintf(path, sizeof path, "/v1/sessions/jobs/events/%s/complete", bad_index[i]);
    snprintf(name, sizeof name, "complete: path index '%s' is 400", bad_index[i]);
    expect_error(es_api_complete, s, "POST", path, "{\"attempt\":1}", 400, "INVALID_ARGUMENT",
                 "event index", name);
  }
  expect_error(es_api_complete, s, "POST", "/v1/sessions/jobs/events/3/complete", "{}", 400,
               "INVALID_ARGUMENT", "'attempt' is required", "complete: attempt is required");
  expect_error(es_api_complete, s, "POST", "/v1/sessions/jobs/events/3/complete",
               "{\"attempt\":1,\"events\":{\"type\":\"x\"}}", 400, "INVALID_ARGUMENT", "must be an array",
               "complete: events as an object is 400");
  limits.max_batch = 1;
  expect_error(es_api_complete, s, "POST", "/v1/sessions/jobs/events/3/complete",
               "{\"attempt\":1,\"events\":[{\"type\":\"x\"},{\"type\":\"x\"}]}", 413, "TOO_LARGE", NULL,
               "complete: more events than max_batch is 413");
  limits.max_batch = 1000;
  expect_error(es_api_fail, s, "POST", "/v1/sessions/jobs/events/3/fail", "{\"attempt\":1}", 400,
               "INVALID_ARGUMENT", "'error' is required", "fail: error is required");
  expect_error(es_api_fail, s, "POST", "/v1/sessions/jobs/events/3/fail", "{\"attempt\":1,\"error\":5}", 400,
               "INVALID_ARGUMENT", "'error' must be a string", "fail: an error that is not text is 400");
  expect_error(es_api_fail, s, "POST", "/v1/sessions/jobs/events/3/fail",
               "{\"attempt\":1,\"error\":\"x\",\"max_failures\":\"5\"}", 400, "INVALID_ARGUMENT",
               "'max_failures'", "fail: a string max_failures is 400");
  expect_error(es_api_renew, s, "POST", "/v1/sessions/jobs/events/3/renew", "{\"holder\":\"w\",\"attempt\":1}",
               400, "INVALID_ARGUMENT", "'ttl_ms' is required", "renew: ttl_ms is required");
  expect_error(es_api_settle, s, "POST", "/v1/sessions/jobs/events/3/settle", "{\"reason\":1}", 400,
               "INVALID_ARGUMENT", "'reason' must be a string", "settle: a reason that is not text is 400");
}

static void test_refs(es_store *s) {
  call c;
  run(&c, es_api_put_ref, s, NULL, "PUT", "/v1/refs/main", "{\"session\":\"rep\"}");
  ok(c.resp.status == 200 && raw_is(&c, "name", "\"main\"") && raw_is(&c, "session", "\"rep\"") &&
         int_at(&c, "head") == 2 && int_at(&c, "created_at") == clock_now,
     "put_ref: the ref {name, session, head, created_at, updated_at}");
  call_done(&c);
  run(&c, es_api_put_ref, s, NULL, "PUT", "/v1/refs/try", "{\"session\":\"bad\"}");
  call_done(&c);
  run(&c, es_api_get_ref, s, NULL, "GET", "/v1/refs/main", NULL);
  ok(c.resp.status == 200 && raw_is(&c, "session", "\"rep\""), "get_ref: the ref");
  call_done(&c);
  expect_error(es_api_get_ref, s, "GET", "/v1/refs/nope", NULL, 404, "NOT_FOUND", "nope",
               "get_ref: a missing ref is 404 NOT_FOUND");
  run(&c, es_api_list_refs, s, NULL, "GET", "/v1/refs?limit=1", NULL);
  ok(c.resp.status == 200 && len_at(&c, "refs") == 1 && raw_is(&c, "refs.0.name", "\"main\"") &&
         raw_is(&c, "cursor", "\"main\""),
     "list_refs: a full page and its cursor");
  call_done(&c);
  run(&c, es_api_list_refs, s, NULL, "GET", "/v1/refs?after=main", NULL);
  ok(c.resp.status == 200 && len_at(&c, "refs") == 1 && raw_is(&c, "refs.0.name", "\"try\"") &&
         raw_is(&c, "cursor", "null"),
     "list_refs: after pages on");
  call_done(&c);

  expect_error(es_api_promote, s, "POST", "/v1/refs/main/promote", "{\"from\":\"try\",\"expect\":\"full\"}",
               409, "REF_CONFLICT", NULL, "promote: a failed compare-and-set is 409 REF_CONFLICT");
  run(&c, es_api_promote, s, NULL, "POST", "/v1/refs/main/promote", "{\"from\":\"try\",\"expect\":\"full\"}");
  ok(raw_is(&c, "expected", "\"full\"") && raw_is(&c, "actual", "\"rep\""),
     "promote: the conflict carries expected and actual");
  call_done(&c);
  run(&c, es_api_get_ref, s, NULL, "GET", "/v1/refs/main", NULL);
  ok(raw_is(&c, "session", "\"rep\""), "promote: a conflict moved nothing");
  call_done(&c);
  run(&c, es_api_promote, s, NULL, "POST", "/v1/refs/main/promote", "{\"from\":\"try\",\"expect\":\"rep\"}");
  ok(c.resp.status == 200 && raw_is(&c, "name", "\"main\"") && raw_is(&c, "session", "\"bad\""),
     "promote: with the right expect the ref moves");
  call_done(&c);
  run(&c, es_api_promote, s, NULL, "POST", "/v1/refs/fresh/promote", "{\"from\":\"try\",\"expect\":false}");
  ok(c.resp.status == 200 && raw_is(&c, "session", "\"bad\""), "promote: expect false onto a new ref");
  call_done(&c);
  run(&c, es_api_promote, s, NULL, "POST", "/v1/refs/fresh/promote", "{\"from\":\"try\",\"expect\":false}");
  ok(is_error(&c, 409, "REF_CONFLICT", NULL) && raw_is(&c, "expected", "false") && raw_is(&c, "actual", "\"bad\""),
     "promote: expect false onto an existing ref is 409 with actual");
  call_done(&c);
  expect_error(es_api_promote, s, "POST", "/v1/refs/fresh/promote", "{\"from\":\"try\",\"expect\":null}", 400,
               "INVALID_ARGUMENT", "'expect'", "promote: expect null is 400 (ambiguous)");
  expect_error(es_api_promote, s, "POST", "/v1/refs/fresh/promote", "{\"from\":\"missing\"}", 404,
               "NOT_FOUND", NULL, "promote: a missing from ref is 404");
  expect_error(es_api_promote, s, "POST", "/v1/refs/fresh/promote", "{}", 400, "INVALID_ARGUMENT",
               "'from' is required", "promote: from is required");
  expect_error(es_api_put_ref, s, "PUT", "/v1/refs/x", "{\"session\":\"a\\u0000b\"}", 400, "INVALID_ARGUMENT",
               "NUL", "put_ref: a NUL in the session is 400");
  expect_error(es_api_put_ref, s, "PUT", "/v1/refs/x", "{\"session\":\"a\",\"expect\":\"b\"}", 400,
               "INVALID_ARGUMENT", "unknown field 'expect'", "put_ref: expect is not taken (promote is the CAS)");
  expect_error(es_api_put_ref, s, "PUT", "/v1/refs/x", "{\"session\":[]}", 400, "INVALID_ARGUMENT",
               "must be a string", "put_ref: a session that is not a string is 400");
  run(&c, es_api_delete_ref, s, NULL, "DELETE", "/v1/refs/fresh", NULL);
  ok(c.resp.status == 200 && raw_is(&c, "deleted", "true"), "delete_ref: {deleted: true}");
  call_done(&c);
  run(&c, es_api_delete_ref, s, NULL, "DELETE", "/v1/refs/fresh", NULL);
  ok(c.resp.status == 200 && raw_is(&c, "deleted", "false"), "delete_ref: a missing ref is {deleted: false}");
  call_done(&c);

  /* lineage */
  es_lineage l;
  es_err err = {0};
  if (es_store_fork(s, "rep", 1, "rep/fork", &l, &err) == ES_OK) es_lineage_destroy(&l);
  /* a name with a '/' (a percent-decoded segment): built by hand, as run()
   * splits on '/' */
  es_http_req r;
  es_http_resp out;
  memset(&r, 0, sizeof r);
  memset(&out, 0, sizeof out);
  const char *segs[] = {"v1", "sessions", "rep/fork", "lineage"};
  memcpy(r.seg, segs, sizeof segs);
  r.nseg = 4;
  r.store = s;
  r.ctx = &ctx;
  es_api_lineage(&r, &out);
  es_buf_cstr(&out.body);
  ok(out.status == 200 && out.body.data &&
         strstr(out.body.data, "{\"lineage\":{\"session\":\"rep/fork\",\"parent\":\"rep\",\"at\":1,"),
     "lineage: the fork's record");
  es_buf_destroy(&out.body);
  run(&c, es_api_lineage, s, NULL, "GET", "/v1/sessions/rep/lineage", NULL);
  ok(c.resp.status == 200 && raw_is(&c, "lineage", "null"), "lineage: null for a session not made by fork");
  call_done(&c);
  run(&c, es_api_children, s, NULL, "GET", "/v1/sessions/rep/children", NULL);
  ok(c.resp.status == 200 && len_at(&c, "children") == 1 && raw_is(&c, "children.0.session", "\"rep/fork\"") &&
         raw_is(&c, "cursor", "null"),
     "children: the forks of a session");
  call_done(&c);
}

static void test_presence(es_store *s) {
  call c;
  run(&c, es_api_presence_set, s, NULL, "PUT", "/v1/presence/room/alice",
      "{\"values\":{\"cursor\":{\"x\":9007199254740993},\"name\":\"A\"},\"ttl_ms\":60000,\"seen\":3}");
  ok(c.resp.status == 200 && raw_is(&c, "applied.cursor", "{\"x\":9007199254740993}") &&
         raw_is(&c, "applied.name", "\"A\""),
     "presence_set: {applied} with the values exact");
  call_done(&c);
  run(&c, es_api_presence_read, s, NULL, "GET", "/v1/presence/room", NULL);
  ok(c.resp.status == 200 && len_at(&c, "rows") == 2 && raw_is(&c, "rows.0.participant", "\"alice\"") &&
         raw_is(&c, "rows.0.field", "\"cursor\"") && raw_is(&c, "rows.0.value", "{\"x\":9007199254740993}") &&
         int_at(&c, "rows.0.seen") == 3 && int_at(&c, "rows.0.at") == clock_now &&
         int_at(&c, "rows.0.expires_at") == clock_now + 60000,
     "presence_read: {rows} with participant, field, value, seen, at, expires_at");
  call_done(&c);
  clock_now += 1;
  run(&c, es_api_presence_set, s, NULL, "PUT", "/v1/presence/room/alice", "{\"values\":{\"name\":null},\"ttl_ms\":60000}");
  ok(c.resp.status == 200 && raw_is(&c, "applied.name", "null"), "presence_set: null deletes a field");
  call_done(&c);
  run(&c, es_api_presence_read, s, NULL, "GET", "/v1/presence/room", NULL);
  ok(c.resp.status == 200 && len_at(&c, "rows") == 1, "presence_read: the deleted field is gone");
  call_done(&c);
  expect_error(es_api_presence_set, s, "PUT", "/v1/presence/room/alice", "{\"ttl_ms\":1000}", 400,
               "INVALID_ARGUMENT", "'values' is required", "presence_set: values is required");
  expect_error(es_api_presence_set, s, "PUT", "/v1/presence/room/alice", "{\"values\":{}}", 400,
               "INVALID_ARGUMENT", "'ttl_ms' is required", "presence_set: ttl_ms is required");
  expect_error(es_api_presence_set, s, "PUT", "/v1/presence/room/alice", "{\"values\":[1],\"ttl_ms\":1}", 400,
               "INVALID_ARGUMENT", "must be an object", "presence_set: values that is not an object is 400");
  expect_error(es_api_presence_set, s, "PUT", "/v1/presence/room/alice",
               "{\"values\":{\"a\\u0000b\":1},\"ttl_ms\":1000}", 400, "INVALID_ARGUMENT", "NUL",
               "presence_set: a NUL in a field name is 400");
  expect_error(es_api_presence_set, s, "PUT", "/v1/presence/room/alice",
               "{\"values\":{\"a\":1},\"ttl_ms\":1000,\"ttl\":5}", 400, "INVALID_ARGUMENT", "unknown field 'ttl'",
               "presence_set: an unknown field is 400");
}

static void test_stats(es_store *s) {
  call c;
  run(&c, es_api_stats, s, NULL, "GET", "/v1/stats", NULL);
  const es_jval *p50 = c.json ? at(c.json, "calls.append.p50_us") : NULL;
  ok(c.resp.status == 200 && int_at(&c, "calls.append.count") > 0 && int_at(&c, "calls.append.errors") > 0 &&
         p50 && (p50->type == ES_JFLOAT) && int_at(&c, "sessions") > 0 && int_at(&c, "events") > 0 &&
         int_at(&c, "pending") >= 0 && int_at(&c, "dead") >= 0 && !at(c.json, "engine"),
     "stats: calls{op:{count,errors,p50_us,...}}, sessions, events, pending, dead; no engine here");
  call_done(&c);
}

/* Tenant A's handle never sees tenant B's data, whatever the endpoint. */
static void test_tenants(es_store *root) {
  es_store *a = NULL, *b = NULL;
  es_err err = {0};
  es_store_tenant(root, "acme", &a, &err);
  es_store_tenant(root, "globex", &b, &err);
  call c;
  run(&c, es_api_append, a, "acme", "POST", "/v1/sessions/orders/events",
      "{\"events\":[{\"type\":\"placed\",\"id\":\"o-1\"},{\"type\":\"dead\",\"id\":\"o-2\"}]}");
  ok(c.resp.status == 200 && raw_is(&c, "events.0.session", "\"orders\"") && raw_is(&c, "events.0.id", "\"o-1\""),
     "tenant: names come back without the prefix");
  call_done(&c);
  ok(head_of(root, "acme\x1f" "orders") == 2, "tenant: the root store holds them under the prefix");
  run(&c, es_api_put_ref, a, "acme", "PUT", "/v1/refs/main", "{\"session\":\"orders\"}");
  call_done(&c);
  run(&c, es_api_presence_set, a, "acme", "PUT", "/v1/presence/room/x", "{\"values\":{\"v\":1},\"ttl_ms\":60000}");
  call_done(&c);
  run(&c, es_api_claims, a, "acme", "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":60000,\"types\":[\"dead\"]}");
  int64_t att = int_at(&c, "events.0.attempt");
  call_done(&c);
  char body[96];
  snprintf(body, sizeof body, "{\"attempt\":%lld,\"error\":\"x\",\"max_failures\":1}", (long long)att);
  run(&c, es_api_fail, a, "acme", "POST", "/v1/sessions/orders/events/2/fail", body);
  ok(c.resp.status == 200 && raw_is(&c, "outcome", "\"dead_lettered\""), "tenant: a dead letter in acme");
  call_done(&c);

  run(&c, es_api_read, b, "globex", "GET", "/v1/sessions/orders/events", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "tenant: globex reads no acme events");
  call_done(&c);
  run(&c, es_api_head, b, "globex", "GET", "/v1/sessions/orders/head", NULL);
  ok(int_at(&c, "head") == 0, "tenant: globex sees head 0");
  call_done(&c);
  run(&c, es_api_read_all, b, "globex", "GET", "/v1/events", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "tenant: globex read_all is empty");
  call_done(&c);
  run(&c, es_api_sessions, b, "globex", "GET", "/v1/sessions", NULL);
  ok(c.resp.status == 200 && len_at(&c, "sessions") == 0, "tenant: globex lists no sessions");
  call_done(&c);
  run(&c, es_api_dead_letters, b, "globex", "GET", "/v1/dead-letters", NULL);
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "tenant: globex has no dead letters");
  call_done(&c);
  run(&c, es_api_list_refs, b, "globex", "GET", "/v1/refs", NULL);
  ok(c.resp.status == 200 && len_at(&c, "refs") == 0, "tenant: globex lists no refs");
  call_done(&c);
  expect_error(es_api_get_ref, b, "GET", "/v1/refs/main", NULL, 404, "NOT_FOUND", NULL,
               "tenant: globex cannot read acme's ref");
  run(&c, es_api_presence_read, b, "globex", "GET", "/v1/presence/room", NULL);
  ok(c.resp.status == 200 && len_at(&c, "rows") == 0, "tenant: globex sees no acme presence");
  call_done(&c);
  run(&c, es_api_claims, b, "globex", "POST", "/v1/claims", "{\"holder\":\"w\",\"ttl_ms\":60000,\"limit\":10}");
  ok(c.resp.status == 200 && len_at(&c, "events") == 0, "tenant: globex claims none of acme's events");
  call_done(&c);
  expect_error(es_api_revive, b, "POST", "/v1/sessions/orders/events/2/revive", NULL, 404, "NO_SUCH_EVENT",
               NULL, "tenant: globex cannot revive acme's dead letter");
  run(&c, es_api_append, b, "globex", "POST", "/v1/sessions/orders/events", "{\"events\":[{\"type\":\"x\",\"id\":\"o-1\"}]}");
  ok(c.resp.status == 200 && int_at(&c, "events.0.index") == 1 && head_of(a, "orders") == 2,
     "tenant: globex's same names are its own data");
  call_done(&c);
  run(&c, es_api_stats, b, "globex", "GET", "/v1/stats", NULL);
  ok(c.resp.status == 200 && int_at(&c, "sessions") == 1 && int_at(&c, "events") == 1 && int_at(&c, "dead") == 0,
     "tenant: stats count the tenant's data only");
  call_done(&c);
  es_store_release(a);
  es_store_release(b);
}

static char dir[64];

static void write_file(const char *rel, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(2);
  }
  fputs(text, f);
  fclose(f);
}

static void test_state(es_store *root) {
  call c;
  ctx.engine = NULL;
  expect_error(es_api_state, root, "GET", "/v1/sessions/x/state/count", NULL, 404, "NOT_FOUND",
               "no reducers", "state: no engine is 404 NOT_FOUND");

  snprintf(dir, sizeof dir, "/tmp/es-http-api-test-XXXXXX");
  if (!mkdtemp(dir)) {
    ok(0, "state: a scripts directory");
    return;
  }
  char sub[128];
  snprintf(sub, sizeof sub, "%s/reducers", dir);
  mkdir(sub, 0700);
  snprintf(sub, sizeof sub, "%s/handlers", dir);
  mkdir(sub, 0700);
  write_file("reducers/count.lua",
             "return {init = function() return {n = 0, big = 9007199254740993, f = 0.1, items = {}} end,\n"
             "  placed = function(s, e) s.n = s.n + 1; s.items[#s.items + 1] = e.payload end}\n");
  write_file("reducers/floaty.lua", "return {placed = function(s) s[1.5] = true end}\n");
  write_file("reducers/broken.lua", "return {placed = function() error('kaput') end}\n");
  es_engine_opts o;
  es_engine *e = NULL;
  es_err err = {0};
  es_engine_opts_init(&o);
  o.scripts = dir;
  o.open_core = luaopen_eventstore_core;
  o.workers = 1;
  if (es_engine_open(root, &o, &e, &err) != ES_OK) {
    printf("# %s\n", err.msg);
    ok(0, "state: es_engine_open");
    return;
  }
  ctx.engine = e;
  run(&c, es_api_append, root, NULL, "POST", "/v1/sessions/cart/events",
      "{\"events\":[{\"type\":\"placed\",\"payload\":{\"sku\":\"A\",\"q\":-9223372036854775808}},"
      "{\"type\":\"placed\",\"payload\":1e300}]}");
  call_done(&c);
  run(&c, es_api_state, root, NULL, "GET", "/v1/sessions/cart/state/count", NULL);
  ok(c.resp.status == 200 && int_at(&c, "index") == 2 && int_at(&c, "state.n") == 2 &&
         raw_is(&c, "state.big", "9007199254740993") && raw_is(&c, "state.f", "0.1") &&
         raw_is(&c, "state.items.0", "{\"q\":-9223372036854775808,\"sku\":\"A\"}") &&
         raw_is(&c, "state.items.1", "1e+300"),
     "state: {state, index}, the state as exact JSON");
  call_done(&c);
  run(&c, es_api_state, root, NULL, "GET", "/v1/sessions/cart/state/count?at=1", NULL);
  ok(c.resp.status == 200 && int_at(&c, "index") == 1 && int_at(&c, "state.n") == 1,
     "state: ?at folds through an earlier index");
  call_done(&c);
  run(&c, es_api_state, root, NULL, "GET", "/v1/sessions/empty/state/count", NULL);
  ok(c.resp.status == 200 && int_at(&c, "index") == 0 && int_at(&c, "state.n") == 0 &&
         raw_is(&c, "state.items", "{}"),
     "state: a session with no events gets init's state (an empty table is {})");
  call_done(&c);
  expect_error(es_api_state, root, "GET", "/v1/sessions/cart/state/count?at=9", NULL, 404, "NO_SUCH_EVENT",
               NULL, "state: at beyond the head is 404 NO_SUCH_EVENT");
  expect_error(es_api_state, root, "GET", "/v1/sessions/cart/state/count?at=x", NULL, 400,
               "INVALID_ARGUMENT", "'at'", "state: a bad at is 400");
  expect_error(es_api_state, root, "GET", "/v1/sessions/cart/state/nope", NULL, 404, "NOT_FOUND", "nope",
               "state: an unknown reducer is 404 NOT_FOUND");
  {
    /* the server's file system stays its own: the engine's message names
     * the scripts directory, the answer says "scripts" */
    call c2;
    run(&c2, es_api_state, root, NULL, "GET", "/v1/sessions/cart/state/nope", NULL);
    const char *text = es_buf_cstr(&c2.resp.body); /* a buffer is not NUL-terminated until asked */
    ok(c2.resp.status == 404 && text && !strstr(text, dir) && strstr(text, "scripts/reducers"),
       "state: an unknown reducer's message does not show the server's scripts path");
    call_done(&c2);
  }
  {
    /* a decoded segment may hold '/': no path out of scripts/reducers */
    es_http_req r;
    es_http_resp out;
    memset(&r, 0, sizeof r);
    memset(&out, 0, sizeof out);
    const char *segs[] = {"v1", "sessions", "cart", "state", "../reducers/count"};
    memcpy(r.seg, segs, sizeof segs);
    r.nseg = 5;
    r.store = root;
    r.ctx = &ctx;
    es_api_state(&r, &out);
    const char *text = es_buf_cstr(&out.body);
    ok(out.status == 404 && text && strstr(text, "NOT_FOUND"),
       "state: a reducer name with '..' finds no file outside reducers/");
    es_buf_destroy(&out.body);
  }
  expect_error(es_api_state, root, "GET", "/v1/sessions/cart/state/floaty", NULL, 422, "INVALID_ARGUMENT",
               "cannot be written as JSON", "state: a state JSON cannot carry is 422");
  expect_error(es_api_state, root, "GET", "/v1/sessions/cart/state/broken", NULL, 400, "INVALID_ARGUMENT",
               "kaput", "state: a reducer that raises is 400 naming its error");

  /* a tenant folds its own session on the root */
  es_store *a = NULL;
  es_store_tenant(root, "acme", &a, &err);
  run(&c, es_api_append, a, "acme", "POST", "/v1/sessions/cart/events", "{\"events\":[{\"type\":\"placed\",\"payload\":7}]}");
  call_done(&c);
  run(&c, es_api_state, a, "acme", "GET", "/v1/sessions/cart/state/count", NULL);
  ok(c.resp.status == 200 && int_at(&c, "state.n") == 1 && raw_is(&c, "state.items", "[7]"),
     "state: a tenant token folds the tenant's session, not the root's of the same name");
  call_done(&c);
  run(&c, es_api_state, a, "acme", "GET", "/v1/sessions/cart/state/count?at=5", NULL);
  const es_jval *m = c.json ? es_jval_get(c.json, "message") : NULL;
  ok(c.resp.status == 404 && m && m->type == ES_JSTRING && strstr(m->str, "'cart'") && !strstr(m->str, "acme"),
     "state: the engine's message names the tenant's session without the prefix");
  call_done(&c);
  es_store_release(a);

  run(&c, es_api_stats, root, NULL, "GET", "/v1/stats", NULL);
  ok(c.resp.status == 200 && c.json && at(c.json, "engine.types") && int_at(&c, "engine.handled") == 0,
     "stats: a '*' token with an engine sees the engine's figures");
  call_done(&c);
  run(&c, es_api_stats, root, "acme", "GET", "/v1/stats", NULL);
  ok(c.resp.status == 200 && c.json && !at(c.json, "engine"), "stats: a tenant token does not");
  call_done(&c);

  ctx.engine = NULL;
  es_engine_close(e);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
  limits.max_body = 16 << 20;
  limits.max_batch = 1000;
  limits.max_limit = 1000;
  ctx.limits = &limits;
  ctx.stopping = &stopping;
  ctx.streams = &streams;
  ctx.counters = &counters;
  ctx.tenant_sep = ES_TENANT_SEP;

  test_json_doc();

  es_open_opts oo = {0};
  oo.clock = fixed_clock;
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open("memory:", &oo, &s, &err)) {
    printf("# %s\n", err.msg);
    return 2;
  }
  ctx.root = s;
  test_append_read(s);
  test_sessions(s);
  test_work(s);
  test_refs(s);
  test_presence(s);
  test_stats(s);
  es_store_release(s);

  s = NULL;
  if (es_store_open("memory:", &oo, &s, &err)) return 2;
  ctx.root = s;
  test_tenants(s);
  es_store_release(s);

  s = NULL;
  if (es_store_open("memory:", NULL, &s, &err)) return 2;
  ctx.root = s;
  test_state(s);
  es_store_release(s);

  return tap_done();
}
