/*
 * http_live_test.c: the live tails' and metrics' handlers (http/sse.c,
 * http/metrics.c) called directly, without a socket, the way server.c
 * calls them: a request in, a response out, the stream callback pulled
 * like the server pulls it. The HTTP specs (spec/83-85) test the same
 * through the server; this pins the handler contract: resume points, bad
 * ids, the stream slot limit, tenant scope, stop, the presence snapshot
 * and patches, and the exposition format. TAP-style output.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/internal.h"

#include "tap.h"

static es_http_limits limits;
static atomic_int stopping_flag, streams_open;
static es_http_counters counters;
static es_http_ctx ctx;

static void req_init(es_http_req *r, es_store *store, const char *tenant) {
  memset(r, 0, sizeof *r);
  r->method = "GET";
  r->store = store;
  r->tenant = tenant;
  r->rights = ES_RIGHT_READ;
  r->ctx = &ctx;
}

static void resp_init(es_http_resp *o) {
  memset(o, 0, sizeof *o);
  es_buf_init(&o->body);
}

static void resp_done(es_http_resp *o) {
  if (o->stream_free) o->stream_free(o->stream_state);
  es_buf_destroy(&o->body);
  memset(o, 0, sizeof *o);
}

/* Pulls the stream until `want` appears in what it sent (or n calls). */
static int pull_until(es_http_resp *o, es_buf *got, const char *want, int calls) {
  static char buf[16 * 1024]; /* what the server asks for at once */
  for (int i = 0; i < calls; i++) {
    es_buf_cstr(got);
    if (got->data && strstr(got->data, want)) return 1;
    ssize_t n = o->stream(o->stream_state, buf, sizeof buf);
    if (n < 0) return 0;
    es_buf_add(got, buf, (size_t)n);
  }
  es_buf_cstr(got);
  return got->data && strstr(got->data, want) != NULL;
}

static void append1(es_store *s, const char *session, const char *type, const char *payload) {
  es_new_event e;
  es_new_event_init(&e);
  e.type = type;
  e.payload = payload;
  e.payload_len = payload ? strlen(payload) : 0;
  e.settled = 1;
  es_err err;
  int pending;
  if (es_store_append(s, session, &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err)) {
    fprintf(stderr, "append: %s\n", err.msg);
    exit(2);
  }
}

typedef struct {
  es_store *s;
  const char *session;
} later_args;

static void *append_later(void *p) {
  later_args *a = p;
  usleep(200 * 1000);
  append1(a->s, a->session, "late", "{\"n\":4}");
  return NULL;
}

static void test_session_stream(es_store *root) {
  append1(root, "s1", "a", "{\"n\":1}");
  append1(root, "s1", "b", "{\"n\":2}");
  append1(root, "s1", "c", "{\"n\":3}");
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[0] = "v1", r.seg[1] = "sessions", r.seg[2] = "s1", r.nseg = 4;
  r.last_event_id = "1";
  resp_init(&o);
  es_sse_session(&r, &o);
  ok(o.status == 200 && o.stream && strcmp(o.content_type, "text/event-stream") == 0,
     "session stream: 200 text/event-stream with a callback");
  ok(atomic_load(&streams_open) == 1, "session stream: holds a slot");
  es_buf got;
  es_buf_init(&got);
  ok(pull_until(&o, &got, "id: 3\n", 20), "session stream: history after Last-Event-ID");
  ok(strncmp(got.data, ": keep-alive\n\n", 14) == 0, "session stream: opens with a comment");
  ok(!strstr(got.data, "id: 1\n") && strstr(got.data, "id: 2\nevent: event\ndata: {") != NULL,
     "session stream: starts after the resume point, id/event/data lines");
  char *p2 = strstr(got.data, "id: 2\n"), *p3 = strstr(got.data, "id: 3\n");
  ok(p2 && p3 && p2 < p3 && strstr(got.data, "\"payload\":{\"n\":2}"),
     "session stream: index order, the event's JSON with its payload");
  pthread_t th;
  later_args la = {root, "s1"};
  pthread_create(&th, NULL, append_later, &la);
  ok(pull_until(&o, &got, "id: 4\n", 20), "session stream: a live append arrives");
  pthread_join(th, NULL);
  atomic_store(&stopping_flag, 1);
  char buf[64];
  ok(o.stream(o.stream_state, buf, sizeof buf) == -1, "session stream: ends once stopping");
  atomic_store(&stopping_flag, 0);
  uint64_t dropped = atomic_load(&counters.streams_dropped);
  resp_done(&o);
  ok(atomic_load(&streams_open) == 0, "session stream: its slot is freed");
  ok(atomic_load(&counters.streams_dropped) == dropped, "a stream ended by a stop is not a drop");
  es_buf_destroy(&got);

  /* ?after, and a client that goes away (freed without an end) counts as dropped */
  req_init(&r, root, NULL);
  r.seg[0] = "v1", r.seg[1] = "sessions", r.seg[2] = "s1", r.nseg = 4;
  r.qk[0] = "after", r.qv[0] = "3", r.nq = 1;
  r.last_event_id = ""; /* empty: none (an EventSource without an id) */
  resp_init(&o);
  es_sse_session(&r, &o);
  es_buf_init(&got);
  ok(o.status == 200 && pull_until(&o, &got, "id: 4\n", 20) && !strstr(got.data, "id: 3\n"),
     "session stream: ?after=3 (an empty Last-Event-ID ignored) starts at 4");
  es_buf_destroy(&got);
  resp_done(&o);
  ok(atomic_load(&counters.streams_dropped) == dropped + 1, "a client gone counts as dropped");
}

static void test_bad_ids(es_store *root) {
  const char *bad[] = {"-1", "abc", "1.5", " 1", "+3", "99999999999999999999", "1\n"};
  const char *shown[] = {"-1", "abc", "1.5", " 1", "+3", "99999999999999999999", "1\\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    es_http_req r;
    es_http_resp o;
    req_init(&r, root, NULL);
    r.seg[2] = "s1";
    r.last_event_id = bad[i];
    resp_init(&o);
    es_sse_session(&r, &o);
    char name[96];
    snprintf(name, sizeof name, "Last-Event-ID '%.30s' is 400 INVALID_ARGUMENT", shown[i]);
    es_buf_cstr(&o.body);
    ok(o.status == 400 && !o.stream && strstr(o.body.data, "INVALID_ARGUMENT"), name);
    resp_done(&o);
    req_init(&r, root, NULL);
    r.qk[0] = "after", r.qv[0] = bad[i], r.nq = 1;
    resp_init(&o);
    es_sse_all(&r, &o);
    snprintf(name, sizeof name, "?after='%.30s' is 400", shown[i]);
    ok(o.status == 400 && !o.stream, name);
    resp_done(&o);
  }
  ok(atomic_load(&streams_open) == 0, "refused streams hold no slot");
  /* a bad session name is refused before any stream */
  es_http_req r;
  es_http_resp o;
  char long_name[300];
  memset(long_name, 'x', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  req_init(&r, root, NULL);
  r.seg[2] = long_name;
  resp_init(&o);
  es_sse_session(&r, &o);
  ok(o.status == 400 && !o.stream && atomic_load(&streams_open) == 0,
     "a session name over 255 bytes is 400, no slot kept");
  resp_done(&o);
}

static void test_max_streams(es_store *root) {
  unsigned old = limits.max_streams;
  limits.max_streams = 2;
  es_http_req r;
  es_http_resp o[3];
  for (int i = 0; i < 3; i++) {
    req_init(&r, root, NULL);
    resp_init(&o[i]);
    es_sse_all(&r, &o[i]);
  }
  es_buf_cstr(&o[2].body);
  ok(o[0].status == 200 && o[1].status == 200 && o[2].status == 503 &&
         strstr(o[2].body.data, "UNAVAILABLE"),
     "max_streams: the third stream is 503 UNAVAILABLE");
  resp_done(&o[2]);
  resp_done(&o[0]);
  req_init(&r, root, NULL);
  resp_init(&o[2]);
  es_sse_all(&r, &o[2]);
  ok(o[2].status == 200, "max_streams: a freed slot admits again");
  resp_done(&o[1]);
  resp_done(&o[2]);
  limits.max_streams = old;
}

static void test_tenant_all(es_store *root) {
  es_err err;
  es_store *acme = NULL, *globex = NULL;
  if (es_store_tenant(root, "acme", &acme, &err) || es_store_tenant(root, "globex", &globex, &err)) {
    fprintf(stderr, "tenant: %s\n", err.msg);
    exit(2);
  }
  append1(globex, "g1", "secret", "{\"g\":1}");
  append1(acme, "a1", "mine", "{\"a\":1}");
  append1(globex, "g1", "secret", "{\"g\":2}");
  append1(acme, "a2", "mine", "{\"a\":2}");
  int64_t last = 0;
  es_store_last_position(root, &last, &err);
  es_http_req r;
  es_http_resp o;
  req_init(&r, acme, "acme");
  resp_init(&o);
  es_sse_all(&r, &o);
  es_buf got;
  es_buf_init(&got);
  char want[64];
  snprintf(want, sizeof want, "id: %lld\n", (long long)last);
  ok(o.status == 200 && pull_until(&o, &got, want, 20), "all stream (tenant): up to the last position");
  ok(!strstr(got.data, "secret") && !strstr(got.data, "globex") && strstr(got.data, "\"a2\""),
     "all stream (tenant): only the tenant's events, names unprefixed");
  snprintf(want, sizeof want, "id: %lld\n", (long long)(last - 1));
  ok(!strstr(got.data, want), "all stream (tenant): ids are positions (another tenant's are skipped)");
  es_buf_destroy(&got);
  resp_done(&o);

  /* the metrics a tenant sees: its counts and calls, not the server's */
  req_init(&r, acme, "acme");
  resp_init(&o);
  es_metrics(&r, &o);
  es_buf_cstr(&o.body);
  ok(o.status == 200 && strstr(o.body.data, "eventstore_sessions 2\n") &&
         strstr(o.body.data, "eventstore_events 2\n"),
     "metrics (tenant): the tenant's counts");
  ok(strstr(o.body.data, "eventstore_calls_total{op=\"append\"} 2\n") != NULL,
     "metrics (tenant): its handle's calls");
  ok(!strstr(o.body.data, "eventstore_http_") && !strstr(o.body.data, "eventstore_handler_"),
     "metrics (tenant): no server-wide figures");
  resp_done(&o);
  es_store_release(acme);
  es_store_release(globex);
}

/* The format's rules, checked line by line (the spec 84 parser does the
 * same over HTTP). */
static int check_exposition(const char *text, char *why, size_t cap) {
  char typed[64][96];
  int ntyped = 0;
  const char *p = text;
  int line_no = 0;
  while (*p) {
    const char *nl = strchr(p, '\n');
    if (!nl) return snprintf(why, cap, "no final newline"), 0;
    line_no++;
    size_t n = (size_t)(nl - p);
    char line[1024];
    if (n >= sizeof line) return snprintf(why, cap, "line %d too long", line_no), 0;
    memcpy(line, p, n);
    line[n] = 0;
    p = nl + 1;
    if (strncmp(line, "# TYPE ", 7) == 0) {
      char name[96], type[32];
      if (sscanf(line + 7, "%95s %31s", name, type) != 2) return snprintf(why, cap, "bad TYPE %d", line_no), 0;
      if (ntyped < 64) strcpy(typed[ntyped++], name);
      continue;
    }
    if (line[0] == '#') continue;
    char name[96];
    size_t k = 0;
    while (line[k] && line[k] != '{' && line[k] != ' ' && k < sizeof name - 1) name[k] = line[k], k++;
    name[k] = 0;
    int found = 0;
    for (int i = 0; i < ntyped; i++) {
      size_t tl = strlen(typed[i]);
      if (strncmp(name, typed[i], tl) == 0 &&
          (name[tl] == 0 || strcmp(name + tl, "_bucket") == 0 || strcmp(name + tl, "_count") == 0))
        found = 1;
    }
    if (!found) return snprintf(why, cap, "sample before its TYPE: %.100s", line), 0;
    const char *sp = strrchr(line, ' ');
    char *end;
    if (!sp) return snprintf(why, cap, "no value: %.100s", line), 0;
    strtod(sp + 1, &end);
    if (*end) return snprintf(why, cap, "bad value: %.100s", line), 0;
  }
  return 1;
}

static void test_metrics(es_store *root) {
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  resp_init(&o);
  es_metrics(&r, &o);
  es_buf_cstr(&o.body);
  ok(o.status == 200 && strstr(o.content_type, "version=0.0.4"), "metrics: 200 text 0.0.4");
  char why[256] = "";
  ok(check_exposition(o.body.data, why, sizeof why), "metrics: every line well formed");
  if (why[0]) printf("# %s\n", why);
  ok(strstr(o.body.data, "# TYPE eventstore_call_duration_seconds histogram\n") &&
         strstr(o.body.data, "eventstore_call_duration_seconds_bucket{op=\"append\",le=\"+Inf\"}"),
     "metrics: call latency is a histogram with +Inf");
  ok(strstr(o.body.data, "eventstore_http_streams_open 0\n") &&
         strstr(o.body.data, "eventstore_http_responses_total{class=\"2xx\"}"),
     "metrics (*): the server's figures");
  /* cumulative buckets, +Inf = _count */
  const char *pre = "eventstore_call_duration_seconds_bucket{op=\"append\",";
  const char *b = strstr(o.body.data, pre);
  unsigned long long prev = 0, v = 0;
  int mono = 1, lines = 0;
  while (b && strncmp(b, pre, strlen(pre)) == 0) {
    lines++;
    const char *nl = strchr(b, '\n');
    const char *sp = nl;
    while (sp > b && sp[-1] != ' ') sp--;
    v = strtoull(sp, NULL, 10);
    if (v < prev) mono = 0;
    prev = v;
    b = nl + 1;
  }
  unsigned long long count = 0;
  const char *c = strstr(o.body.data, "eventstore_call_duration_seconds_count{op=\"append\"} ");
  if (c) count = strtoull(strchr(c, '}') + 2, NULL, 10);
  ok(mono && lines == 28 && count > 0 && v == count, "metrics: buckets cumulative, the last (+Inf) equals _count");
  resp_done(&o);

  req_init(&r, root, NULL);
  resp_init(&o);
  es_healthz(&r, &o);
  es_buf_cstr(&o.body);
  ok(o.status == 200 && strcmp(o.body.data, "{\"ok\":true}") == 0, "healthz: 200 {\"ok\":true}");
  resp_done(&o);
}

static void test_presence(es_store *root) {
  es_err err;
  es_presence_field f = {"cursor", "5", 1};
  es_presence_rows applied;
  es_store_presence_set(root, "room", "ann", &f, 1, 60000, ES_NONE, 0, &applied, &err);
  es_presence_rows_destroy(&applied);
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[2] = "room";
  r.last_event_id = "not a number"; /* ignored: presence has no resume point */
  resp_init(&o);
  es_sse_presence(&r, &o);
  es_buf got;
  es_buf_init(&got);
  ok(o.status == 200 && pull_until(&o, &got, "event: snapshot\n", 5) &&
         strstr(got.data, "\"participant\":\"ann\",\"field\":\"cursor\",\"value\":5"),
     "presence stream: the snapshot first (Last-Event-ID ignored)");
  es_presence_field g[2] = {{"cursor", "7", 1}, {"typing", NULL, 0}};
  es_store_presence_set(root, "room", "bob", g, 2, 60000, ES_NONE, 3, &applied, &err);
  es_presence_rows_destroy(&applied);
  ok(pull_until(&o, &got, "event: presence\n", 5) &&
         strstr(got.data, "{\"participant\":\"bob\",\"values\":{\"cursor\":7,\"typing\":null},\"seen\":3"),
     "presence stream: a patch {participant, values (deletion null), seen, at}");
  es_buf_destroy(&got);
  resp_done(&o);
  /* after the stream is freed, writes do not touch it */
  es_store_presence_set(root, "room", "cy", &f, 1, 60000, ES_NONE, 0, &applied, &err);
  es_presence_rows_destroy(&applied);
  ok(atomic_load(&streams_open) == 0, "presence stream: unwatched and freed");
}

static void test_keepalive(es_store *root) {
  unsigned old = limits.request_timeout_s;
  limits.request_timeout_s = 2; /* keep-alive every second */
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[2] = "quiet";
  resp_init(&o);
  es_sse_session(&r, &o);
  char buf[256];
  ssize_t n1 = o.stream(o.stream_state, buf, sizeof buf); /* the opening comment */
  ssize_t n2 = o.stream(o.stream_state, buf, sizeof buf);
  ok(n1 == 14 && n2 == 14 && memcmp(buf, ": keep-alive\n\n", 14) == 0,
     "an idle stream sends a keep-alive comment");
  resp_done(&o);
  limits.request_timeout_s = old;
}

static void test_truncated(es_store *root) {
  for (int i = 0; i < 3; i++) append1(root, "t1", "x", NULL);
  es_err err;
  int64_t first;
  if (es_store_truncate(root, "t1", 2, &first, &err)) {
    printf("# truncate: %s\n", err.msg);
    return;
  }
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[2] = "t1";
  resp_init(&o);
  es_sse_session(&r, &o);
  es_buf_cstr(&o.body);
  ok(o.status == 410 && !o.stream && strstr(o.body.data, "TRUNCATED"),
     "a stream from before a truncation is 410 TRUNCATED");
  resp_done(&o);
  req_init(&r, root, NULL);
  r.seg[2] = "t1";
  r.last_event_id = "2";
  resp_init(&o);
  es_sse_session(&r, &o);
  es_buf got;
  es_buf_init(&got);
  ok(o.status == 200 && pull_until(&o, &got, "id: 3\n", 5), "resuming at the truncation point works");
  es_buf_destroy(&got);
  resp_done(&o);
}


/* Presence patches pile up for a client that does not read: past
 * stream_buffer bytes the stream ends with an error event (a fresh
 * snapshot on reconnecting is the only way not to miss any). */
static void test_presence_overflow(es_store *root) {
  size_t old = limits.stream_buffer;
  limits.stream_buffer = 300;
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[2] = "busy";
  resp_init(&o);
  es_sse_presence(&r, &o);
  es_buf got;
  es_buf_init(&got);
  ok(o.status == 200 && pull_until(&o, &got, "event: snapshot\n", 5), "overflow: the snapshot");
  for (int i = 0; i < 10; i++) {
    char v[16];
    snprintf(v, sizeof v, "%d", i);
    es_presence_field f = {"n", v, strlen(v)};
    es_presence_rows applied;
    es_err err;
    es_store_presence_set(root, "busy", "p", &f, 1, 60000, ES_NONE, 0, &applied, &err);
    es_presence_rows_destroy(&applied);
  }
  ok(pull_until(&o, &got, "event: error\n", 5) && strstr(got.data, "UNAVAILABLE"),
     "overflow: an error event once patches pass stream_buffer");
  char buf[64];
  ok(o.stream(o.stream_state, buf, sizeof buf) == -1, "overflow: then the stream ends");
  uint64_t dropped = atomic_load(&counters.streams_dropped);
  resp_done(&o);
  ok(atomic_load(&counters.streams_dropped) == dropped, "overflow: an end of its own is not a drop");
  es_buf_destroy(&got);
  limits.stream_buffer = old;
}

/* The store fails under an open stream: an error event, then the end. */
static void test_store_error(void) {
  es_store *s = NULL;
  es_err err;
  if (es_store_open("memory:", NULL, &s, &err)) exit(2);
  append1(s, "x", "a", NULL);
  es_http_req r;
  es_http_resp o;
  req_init(&r, s, NULL);
  r.seg[2] = "x";
  resp_init(&o);
  es_sse_session(&r, &o);
  es_buf got;
  es_buf_init(&got);
  ok(o.status == 200 && pull_until(&o, &got, "id: 1\n", 5), "store error: the stream runs");
  es_store_close(s);
  ok(pull_until(&o, &got, "event: error\ndata: {\"code\":\"CLOSED\"", 5),
     "store error: an error event with the code");
  char buf[64];
  ok(o.stream(o.stream_state, buf, sizeof buf) == -1, "store error: then the stream ends");
  es_buf_destroy(&got);
  resp_done(&o);
  es_store_release(s);
}

/* Events bigger than the read size: pages shrink to the buffer, every
 * event still arrives whole and in order. */
static void test_big_events(es_store *root) {
  size_t big = 300 * 1024;
  char *payload = malloc(big + 3);
  payload[0] = '"';
  memset(payload + 1, 'y', big);
  payload[big + 1] = '"';
  payload[big + 2] = 0;
  for (int i = 0; i < 6; i++) append1(root, "big", "b", payload);
  free(payload);
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  r.seg[2] = "big";
  resp_init(&o);
  es_sse_session(&r, &o);
  es_buf got;
  es_buf_init(&got);
  int whole = o.status == 200 && pull_until(&o, &got, "\"index\":6,", 1000);
  /* then until id 6's event is complete (its blank line) */
  while (whole && !strstr(strstr(got.data, "\"index\":6,"), "\n\n")) {
    static char buf[16 * 1024];
    ssize_t n = o.stream(o.stream_state, buf, sizeof buf);
    if (n < 0) whole = 0;
    else es_buf_add(&got, buf, (size_t)n), es_buf_cstr(&got);
  }
  size_t n_events = 0;
  for (const char *p = got.data; (p = strstr(p, "\nevent: event\n")); p++) n_events++;
  ok(whole && n_events == 6 && got.len > 6 * big, "big events: all six, whole");
  es_buf_destroy(&got);
  resp_done(&o);
}

int main(void) {
  /* http.h's defaults (es_http_opts_init is server.c's) */
  limits.max_streams = 128;
  limits.stream_buffer = 1 << 20;
  limits.request_timeout_s = 30;
  ctx.limits = &limits;
  ctx.stopping = &stopping_flag;
  ctx.streams = &streams_open;
  ctx.counters = &counters;
  ctx.tenant_sep = "\x1f";
  es_store *root = NULL;
  es_err err;
  if (es_store_open("memory:", NULL, &root, &err)) {
    fprintf(stderr, "open: %s\n", err.msg);
    return 2;
  }
  ctx.root = root;
  test_session_stream(root);
  test_bad_ids(root);
  test_max_streams(root);
  test_tenant_all(root);
  test_metrics(root);
  test_presence(root);
  test_keepalive(root);
  test_truncated(root);
  test_presence_overflow(root);
  test_store_error();
  test_big_events(root);

  /* healthz once the store is gone */
  es_store_close(root);
  es_http_req r;
  es_http_resp o;
  req_init(&r, root, NULL);
  resp_init(&o);
  es_healthz(&r, &o);
  es_buf_cstr(&o.body);
  ok(o.status == 503 && strstr(o.body.data, "CLOSED"), "healthz: 503 with the error when the store fails");
  resp_done(&o);
  es_store_release(root);
  printf("1..%d\n", test_no);
  return failures ? 1 : 0;
}
