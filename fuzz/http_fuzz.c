/*
 * http_fuzz.c: libFuzzer target over the HTTP API's handlers (core/http/
 * api.c and the body reader codec/json_doc.c): what a remote client
 * controls, the body, the query and the path's names, straight into the
 * handler, as server.c hands them over after percent-decoding.
 * Built with -DES_FUZZ_STANDALONE it is also a plain program that feeds
 * itself mutations of valid requests from a fixed seed; `make test` runs
 * it (build/ctest/http_fuzz_run; fuzz/README.md).
 *
 * An input is: one byte choosing the route, one the token (root or a
 * tenant), one the event index in the path, then the rest: for routes
 * with a body, the body; for the others, a query string ("k=v&k=v").
 * Names in the path come from a small set that includes a NUL-free
 * session with '/', a tenant-separator byte and invalid UTF-8.
 *
 * What must hold, whatever the bytes:
 *   - the answer's status is one the API documents (200, 400, 404, 409,
 *     410, 413, 422) — never 5xx on a healthy memory: store;
 *   - the answer is one valid JSON value; an error is {"code", "message"};
 *   - a refused request changed nothing (the store's last position and
 *     the tenant's session count are as before);
 *   - and, from the sanitizers: no memory error, no undefined behaviour,
 *     no leak.
 * A broken invariant aborts, which libFuzzer reports with the input.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "http/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      fprintf(stderr, "http_fuzz: %s failed: ", #cond); \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, "\n");                             \
      abort();                                           \
    }                                                    \
  } while (0)

typedef struct route {
  const char *method;
  es_http_handler fn;
  int body;          /* 1: the input's rest is the body; 0: the query */
  const char *segs;  /* the path, "S" for the session, "I" for the index */
} route;

static const route ROUTES[] = {
    {"POST", es_api_append, 1, "v1/sessions/S/events"},
    {"GET", es_api_read, 0, "v1/sessions/S/events"},
    {"GET", es_api_read_all, 0, "v1/events"},
    {"GET", es_api_head, 0, "v1/sessions/S/head"},
    {"GET", es_api_sessions, 0, "v1/sessions"},
    {"GET", es_api_lineage, 0, "v1/sessions/S/lineage"},
    {"GET", es_api_children, 0, "v1/sessions/S/children"},
    {"GET", es_api_dead_letters, 0, "v1/dead-letters"},
    {"POST", es_api_revive, 1, "v1/sessions/S/events/I/revive"},
    {"POST", es_api_settle, 1, "v1/sessions/S/events/I/settle"},
    {"POST", es_api_claims, 1, "v1/claims"},
    {"POST", es_api_complete, 1, "v1/sessions/S/events/I/complete"},
    {"POST", es_api_fail, 1, "v1/sessions/S/events/I/fail"},
    {"POST", es_api_renew, 1, "v1/sessions/S/events/I/renew"},
    {"GET", es_api_list_refs, 0, "v1/refs"},
    {"GET", es_api_get_ref, 0, "v1/refs/S"},
    {"PUT", es_api_put_ref, 1, "v1/refs/S"},
    {"DELETE", es_api_delete_ref, 0, "v1/refs/S"},
    {"POST", es_api_promote, 1, "v1/refs/S/promote"},
    {"GET", es_api_presence_read, 0, "v1/presence/S"},
    {"PUT", es_api_presence_set, 1, "v1/presence/S/S"},
    {"GET", es_api_stats, 0, "v1/stats"},
    {"POST", es_api_append_many, 1, "v1/events"},
};
#define NROUTES (sizeof ROUTES / sizeof ROUTES[0])

/* Names a path may carry after percent-decoding (server.c refuses NUL and
 * invalid UTF-8 before any handler; the handlers must still hold if one
 * slipped through, so one invalid name is here too). */
static const char *const NAMES[] = {"s", "orders/1", "a b", "acme\x1fs", "\xff\xfe", "main", "ns",
                                    "x"};
static const char *const INDEXES[] = {"1", "2", "0", "9223372036854775807", "-1", "x", "1e3",
                                      "99999999999999999999"};

typedef struct world {
  es_store *root;
  es_store *tenant;
  es_http_limits limits;
  atomic_int stopping, streams;
  es_http_counters counters;
  es_http_ctx ctx;
  long answered; /* 200 answers (the standalone run reports them) */
  long refused;  /* 4xx answers */
} world;

static world W;

static void seed_store(void) {
  es_err err = {0};
  CHECK(es_store_open("memory:", NULL, &W.root, &err) == ES_OK, "%s", err.msg);
  CHECK(es_store_tenant(W.root, "acme", &W.tenant, &err) == ES_OK, "%s", err.msg);
  for (int t = 0; t < 2; t++) {
    es_store *s = t ? W.tenant : W.root;
    es_new_event ev[3];
    for (int i = 0; i < 3; i++) {
      es_new_event_init(&ev[i]);
      ev[i].type = "placed";
      ev[i].payload = "{\"n\":1}";
      ev[i].payload_len = 7;
    }
    es_events out = {0};
    int pending = 0;
    CHECK(es_store_append(s, "s", ev, 3, ES_NONE, ES_NONE, &out, &pending, &err) == ES_OK, "%s", err.msg);
    es_events_destroy(&out);
    es_events claimed = {0};
    int64_t retry_at;
    CHECK(es_store_claim_next(s, "w", 60000, 1, NULL, 0, NULL, 0, &claimed, &retry_at, &err) == ES_OK,
          "%s", err.msg);
    es_events_destroy(&claimed);
  }
  W.ctx.root = W.root;
}

/* Each input gets a fresh seeded store (libFuzzer counts what outlives an
 * input as a leak; a memory: store costs microseconds). */
static void world_init(void) {
  es_http_opts o;
  es_http_opts_init(&o);
  W.limits = o.limits;
  W.limits.max_batch = 16;
  W.ctx.root = NULL;
  W.ctx.limits = &W.limits;
  W.ctx.stopping = &W.stopping;
  W.ctx.streams = &W.streams;
  W.ctx.counters = &W.counters;
  seed_store();
}

/* A fingerprint of what a refused request must leave alone. */
static void fingerprint(es_store *s, int64_t *pos, int64_t *sessions) {
  es_err err = {0};
  *pos = -1;
  es_store_last_position(s, pos, &err);
  es_sessions list = {0};
  *sessions = -1;
  if (es_store_sessions(s, "", NULL, 1000, &list, &err) == ES_OK) *sessions = (int64_t)list.n;
  es_sessions_destroy(&list);
}

static int status_ok(int st) {
  return st == 200 || st == 400 || st == 404 || st == 409 || st == 410 || st == 413 || st == 422;
}

static void run_input(const uint8_t *data, size_t size) {
  if (size < 3) return;
  world_init();
  const route *rt = &ROUTES[data[0] % NROUTES];
  es_store *s = (data[1] & 1) ? W.tenant : W.root;
  const char *tenant = (data[1] & 1) ? "acme" : NULL;
  const char *index = INDEXES[(data[2] >> 3) % 8];
  const char *name = NAMES[data[2] % 8];
  const char *rest = (const char *)data + 3;
  size_t rest_n = size - 3;

  es_http_req r;
  memset(&r, 0, sizeof r);
  char segbuf[256];
  snprintf(segbuf, sizeof segbuf, "%s", rt->segs);
  for (char *p = segbuf, *tok; (tok = strsep(&p, "/")) && r.nseg < ES_HTTP_MAX_SEGS;)
    r.seg[r.nseg++] = strcmp(tok, "S") == 0 ? name : strcmp(tok, "I") == 0 ? index : tok;
  /* the query or the body: copies, NUL-terminated, as server.c gives them */
  char *copy = malloc(rest_n + 1);
  CHECK(copy != NULL, "out of memory");
  memcpy(copy, rest, rest_n);
  copy[rest_n] = '\0';
  if (rt->body) {
    r.body = copy;
    r.body_len = rest_n;
  } else {
    for (char *p = copy, *tok; (tok = strsep(&p, "&")) && r.nq < ES_HTTP_MAX_QUERY;) {
      char *eq = strchr(tok, '=');
      if (eq) *eq++ = '\0';
      r.qk[r.nq] = tok;
      r.qv[r.nq++] = eq ? eq : "";
    }
  }
  r.method = rt->method;
  r.path = rt->segs;
  r.store = s;
  r.tenant = tenant;
  r.rights = ES_RIGHT_ADMIN;
  r.ctx = &W.ctx;

  int64_t pos0, n0, pos1, n1;
  fingerprint(s, &pos0, &n0);
  es_http_resp out;
  memset(&out, 0, sizeof out);
  out.status = 200;
  es_buf_init(&out.body);
  rt->fn(&r, &out);
  CHECK(status_ok(out.status), "%s %s answered %d: %.*s", rt->method, rt->segs, out.status,
        (int)out.body.len, out.body.data ? out.body.data : "");
  es_err err = {0};
  CHECK(out.body.len > 0 && es_json_validate(out.body.data, out.body.len, &err) == ES_OK,
        "%s %s: the answer is not JSON (%s): %.*s", rt->method, rt->segs, err.msg, (int)out.body.len,
        out.body.data ? out.body.data : "");
  if (out.status == 200) W.answered++;
  else W.refused++;
  if (out.status != 200) {
    CHECK(out.body.len > 9 && memcmp(out.body.data, "{\"code\":", 8) == 0, "%s %s: error without code",
          rt->method, rt->segs);
    fingerprint(s, &pos1, &n1);
    CHECK(pos0 == pos1 && n0 == n1, "%s %s answered %d but changed the store (position %lld -> %lld)",
          rt->method, rt->segs, out.status, (long long)pos0, (long long)pos1);
  }
  CHECK(out.stream == NULL, "a JSON route answered with a stream");
  es_buf_destroy(&out.body);
  free(copy);
  es_store_close(W.tenant);
  es_store_release(W.tenant);
  es_store_close(W.root);
  es_store_release(W.root);
  W.tenant = W.root = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_input(data, size);
  return 0;
}

#ifdef ES_FUZZ_STANDALONE
/* Valid requests to mutate: route byte, token byte, names byte, then the
 * body or query. */
static const char *const SEEDS[] = {
    "\x00\x00\x00{\"events\":[{\"type\":\"placed\",\"payload\":{\"n\":9007199254740993}}]}",
    "\x00\x01\x00{\"events\":[{\"id\":\"e1\",\"type\":\"t\",\"lane\":\"l\",\"delay_ms\":5}],\"expected\":3}",
    "\x00\x00\x00{\"events\":[{\"type\":\"t\",\"cause\":{\"index\":1,\"attempt\":1}}]}",
    "\x01\x00\x00after=1&limit=2&through=3",
    "\x02\x01\x00after=0&limit=5",
    "\x04\x00\x00prefix=s&after=a&limit=3",
    "\x07\x00\x00session=s&after=0&limit=10",
    "\x0a\x00\x00{\"holder\":\"w2\",\"ttl_ms\":1000,\"limit\":3,\"types\":[\"placed\"]}",
    "\x0b\x00\x00{\"attempt\":1,\"events\":[{\"type\":\"done\",\"payload\":[1,2.5,null]}]}",
    "\x0c\x01\x00{\"attempt\":1,\"error\":\"boom\",\"max_failures\":1,\"retry_after_ms\":0}",
    "\x0d\x00\x00{\"holder\":\"w\",\"attempt\":1,\"ttl_ms\":500}",
    "\x10\x00\x05{\"session\":\"s\"}",
    "\x12\x00\x05{\"from\":\"main\",\"expect\":\"s\"}",
    "\x14\x00\x06{\"values\":{\"typing\":true,\"gone\":null},\"ttl_ms\":1000,\"at\":5,\"seen\":1}",
    "\x09\x00\x00{\"reason\":\"by hand\"}",
    "\x00\x00\x00{\"events\":[{\"type\":\"t\",\"id\":\"i1\"}],\"answer\":\"ids\"}",
    "\x16\x00\x00{\"batches\":[{\"session\":\"s\",\"events\":[{\"type\":\"t\"}]},"
    "{\"session\":\"u\",\"events\":[],\"expected\":0}],\"answer\":\"ids\"}",
};
#define NSEEDS (sizeof SEEDS / sizeof SEEDS[0])
static const char *const TOKENS[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "1e309",
                                     "-0", "9223372036854775808", "\\u0000", "\"events\"",
                                     "\"type\"", "\"ttl_ms\"", "\"answer\"", "\"ids\"",
                                     "{\"a\":1,\"a\":2}", "0.1", "\xc3"};
#define NTOKENS (sizeof TOKENS / sizeof TOKENS[0])

static uint64_t rnd(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 2685821657736338717ULL;
}

/* The deterministic run `make test` does: HTTP_FUZZ_ITERS inputs (default
 * 4000), each a seed with 0..6 mutations (a byte changed, inserted or
 * removed, a JSON token spliced in, the head bytes changed). */
int main(void) {
  const char *it = getenv("HTTP_FUZZ_ITERS");
  long iters = it ? atol(it) : 4000;
  uint64_t x = 0x4e77f0225eedULL;
  uint8_t buf[1024];
  for (long i = 0; i < iters; i++) {
    const char *seed = SEEDS[rnd(&x) % NSEEDS];
    size_t n = 3 + strlen(seed + 3);
    memcpy(buf, seed, n);
    int muts = (int)(rnd(&x) % 7);
    for (int m = 0; m < muts && n > 3; m++) {
      size_t at = 3 + rnd(&x) % (n - 2);
      if (at > n) at = n;
      switch (rnd(&x) % 5) {
      case 0: if (at < n) buf[at] = (uint8_t)rnd(&x); break;
      case 1:
        if (n < sizeof buf) {
          memmove(buf + at + 1, buf + at, n - at);
          buf[at] = (uint8_t)rnd(&x);
          n++;
        }
        break;
      case 2:
        if (at < n) {
          memmove(buf + at, buf + at + 1, n - at - 1);
          n--;
        }
        break;
      case 3: {
        const char *t = TOKENS[rnd(&x) % NTOKENS];
        size_t tl = strlen(t);
        if (n + tl < sizeof buf) {
          memmove(buf + at + tl, buf + at, n - at);
          memcpy(buf + at, t, tl);
          n += tl;
        }
        break;
      }
      default: buf[rnd(&x) % 3] = (uint8_t)rnd(&x); break;
      }
    }
    run_input(buf, n);
  }
  printf("ok 1 - http fuzz: %ld mutated requests through the API handlers (%ld answered 200, %ld "
         "refused), every answer documented and valid JSON, no refused request changed the store\n",
         iters, W.answered, W.refused);
  return 0;
}
#endif
