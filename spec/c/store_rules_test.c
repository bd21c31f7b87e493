/*
 * store_rules_test.c: the argument rules the store core exports to the
 * bindings (store.h), tested directly in C: the one timer rule
 * (es_timer_not_before), free text as stored (es_text_clean), names
 * (es_check_name), and the core refusing times that would overflow
 * (claim, renew, fail, presence) on a memory: store with a clock at the
 * edges of int64; claim_next skipping sessions (what a fenced-out engine
 * uses), on both backends; an append's checks of each event, which name
 * the event and field at fault and store nothing; max_payload_bytes capped
 * by what each backend stores (postgres too when ES_PG_URL is set). TAP-style output;
 * non-zero exit on failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/crypto.h" /* es_crypto_sealed_len */
#include "store/store.h"

#include "new_events.h"
#include "tap.h"

/* Whether err's message contains part. */
static int says(const es_err *err, const char *part) { return strstr(err->msg, part) != NULL; }

static void timer_rule(void) {
  int64_t nb = 0;
  es_err err = {0};
  ok(es_timer_not_before("events[1]", 1000, 0, 0, 0, 0, &nb, &err) == ES_OK && nb == ES_NONE,
     "timer: neither delay_ms nor at: no not_before");
  ok(es_timer_not_before("events[1]", 1000, 1, 500, 0, 0, &nb, &err) == ES_OK && nb == 1500,
     "timer: delay_ms counts from now");
  ok(es_timer_not_before("events[1]", 1000, 1, 0, 0, 0, &nb, &err) == ES_OK && nb == 1000,
     "timer: delay_ms = 0 is now");
  ok(es_timer_not_before("events[1]", 1000, 0, 0, 1, 42, &nb, &err) == ES_OK && nb == 42,
     "timer: at is absolute (even in the past)");
  ok(es_timer_not_before("events[1]", 1000, 0, 0, 1, INT64_MAX, &nb, &err) == ES_OK &&
         nb == INT64_MAX,
     "timer: at = INT64_MAX is accepted");
  ok(es_timer_not_before("events[1]", 1000, 1, INT64_MAX - 1000, 0, 0, &nb, &err) == ES_OK &&
         nb == INT64_MAX,
     "timer: the largest delay that fits reaches INT64_MAX exactly");
  ok(es_timer_not_before("events[1]", -5, 1, INT64_MAX, 0, 0, &nb, &err) == ES_OK &&
         nb == INT64_MAX - 5,
     "timer: a clock before the epoch takes any delay");

  struct {
    const char *name;
    int64_t now;
    int has_delay;
    int64_t delay;
    int has_at;
    int64_t at;
    const char *msg;
  } bad[] = {
      {"delay_ms past INT64_MAX", 1000, 1, INT64_MAX, 0, 0, "events[2].delay_ms is too large"},
      {"delay_ms one past the largest", 1000, 1, INT64_MAX - 999, 0, 0, "events[2].delay_ms is too large"},
      {"negative delay_ms", 1000, 1, -500, 0, 0, "events[2].delay_ms must be >= 0"},
      {"delay_ms = INT64_MIN", 1000, 1, INT64_MIN, 0, 0, "events[2].delay_ms must be >= 0"},
      {"negative at", 1000, 0, 0, 1, -1, "events[2].at must be >= 0"},
      {"at = INT64_MIN", 1000, 0, 0, 1, INT64_MIN, "events[2].at must be >= 0"},
      {"both delay_ms and at", 1000, 1, 5, 1, 5, "events[2] has both delay_ms and at"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char name[128];
    nb = 7;
    memset(&err, 0, sizeof err);
    int rc = es_timer_not_before("events[2]", bad[i].now, bad[i].has_delay, bad[i].delay,
                                 bad[i].has_at, bad[i].at, &nb, &err);
    snprintf(name, sizeof name, "timer: %s is INVALID_ARGUMENT naming it", bad[i].name);
    ok(rc == ES_INVALID_ARGUMENT && err.code == ES_INVALID_ARGUMENT && says(&err, bad[i].msg) &&
           nb == ES_NONE,
       name);
  }
}

static void text_clean(void) {
  char *out = NULL;
  size_t n = 0;
  ok(es_text_clean("plain ünïcødé", strlen("plain ünïcødé"), 100, &out, &n) == ES_OK &&
         strcmp(out, "plain ünïcødé") == 0 && n == strlen(out),
     "text: valid text is unchanged");
  free(out);
  ok(es_text_clean("a\0b", 3, 100, &out, &n) == ES_OK && strcmp(out, "a\xEF\xBF\xBD" "b") == 0,
     "text: a NUL becomes U+FFFD, the bytes after it are kept");
  free(out);
  ok(es_text_clean("\xC3(\xFF\xED\xA0\x80\xF0\x9F\x98", 9, 100, &out, &n) == ES_OK &&
         strcmp(out, "\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                     "\xEF\xBF\xBD\xEF\xBF\xBD") == 0,
     "text: each byte of an invalid sequence becomes U+FFFD (cut, stray, surrogate, short)");
  free(out);
  /* "x" then 2-byte characters, cut to 10 bytes: a byte count lands inside
   * a character; the result ends at a boundary with the ellipsis. */
  ok(es_text_clean("x\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 11, 10, &out, &n) == ES_OK &&
         strcmp(out, "x\xC3\xA9\xC3\xA9\xC3\xA9\xE2\x80\xA6") == 0 && n == 10,
     "text: a cut falls on a character boundary and ends with U+2026");
  free(out);
  ok(es_text_clean("0123456789", 10, 10, &out, &n) == ES_OK && strcmp(out, "0123456789") == 0,
     "text: exactly max bytes is not cut");
  free(out);
  ok(es_text_clean("", 0, 10, &out, &n) == ES_OK && out[0] == '\0' && n == 0, "text: empty");
  free(out);
}

static void names(void) {
  es_err err = {0};
  char long_name[300];
  memset(long_name, 's', 256);
  long_name[256] = '\0';
  ok(es_check_name("session", "ok", &err) == ES_OK, "name: a plain name");
  ok(es_check_name("session", "", &err) == ES_INVALID_ARGUMENT && says(&err, "session must not be empty"),
     "name: empty");
  ok(es_check_name("holder", long_name, &err) == ES_INVALID_ARGUMENT && says(&err, "holder is 256 bytes"),
     "name: 256 bytes");
  ok(es_check_name("lane", "bad\xff", &err) == ES_INVALID_ARGUMENT && says(&err, "lane is not valid UTF-8"),
     "name: invalid UTF-8");
  ok(es_check_name("namespace", NULL, &err) == ES_INVALID_ARGUMENT && says(&err, "namespace is required"),
     "name: missing");
}

/* A clock the test moves; ctx is an int64_t. */
static int test_clock(void *ctx, int64_t *now, es_err *err) {
  (void)err;
  *now = *(int64_t *)ctx;
  return ES_OK;
}

static void overflowing_times(void) {
  int64_t now = INT64_MAX - 10;
  es_open_opts o = {0};
  o.clock = test_clock;
  o.clock_ctx = &now;
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open("memory:", &o, &s, &err)) {
    ok(0, "open a memory store");
    return;
  }
  es_new_event e;
  es_new_event_init(&e);
  e.type = "t";
  int pending;
  ok(es_store_append(s, "s", &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err) == ES_OK, "edge clock: append");

  es_claim_opts co = {.holder = "w", .ttl_ms = 11, .expires_at = ES_NONE, .limit = ES_NONE};
  int outcome = 0;
  es_events got;
  int64_t retry;
  ok(es_store_claim(s, "s", &co, &outcome, &got, &retry, &err) == ES_INVALID_ARGUMENT &&
         says(&err, "ttl_ms is too large"),
     "edge clock: claim ttl_ms one past INT64_MAX is refused");
  co.ttl_ms = 10;
  ok(es_store_claim(s, "s", &co, &outcome, &got, &retry, &err) == ES_OK && outcome == ES_CLAIMED &&
         got.n == 1 && got.v[0].claim_expires_at == INT64_MAX,
     "edge clock: claim ttl_ms reaching INT64_MAX exactly");
  int64_t attempt = got.n ? got.v[0].attempts : 0;
  es_events_destroy(&got);

  es_claim_ref ref = {1, attempt};
  es_renew_result rr;
  ok(es_store_renew(s, "s", "w", &ref, 1, 11, ES_NONE, &rr, &err) == ES_INVALID_ARGUMENT &&
         says(&err, "ttl_ms is too large"),
     "edge clock: renew past INT64_MAX is refused");
  int64_t fails = 0;
  ok(es_store_fail(s, "s", 1, attempt, "e", 5, 11, &outcome, &fails, &err) ==
             ES_INVALID_ARGUMENT &&
         says(&err, "retry_after_ms is too large"),
     "edge clock: fail with retry_after_ms past INT64_MAX is refused");
  es_events all;
  ok(es_store_read(s, "s", 0, ES_NONE, ES_NONE, &all, &err) == ES_OK && all.n == 1 &&
         all.v[0].failures == 0 && all.v[0].claim_expires_at == INT64_MAX,
     "edge clock: the refused calls changed nothing");
  es_events_destroy(&all);

  es_presence_field f = {"typing", "true", 4};
  es_presence_rows applied;
  ok(es_store_presence_set(s, "room", "ann", &f, 1, 11, ES_NONE, 0, &applied, &err) ==
             ES_INVALID_ARGUMENT &&
         says(&err, "ttl_ms is too large"),
     "edge clock: presence ttl_ms past INT64_MAX is refused");
  es_store_release(s);
}

/* claim_next with sessions to skip: their ready events stay, the limit
 * counts only the others, and many skipped rows ahead do not hide them. */
static void claim_skip(const char *url) {
  es_store *s = NULL;
  es_err err = {0};
  char name[128];
  if (es_store_open(url, NULL, &s, &err)) {
    ok(0, "claim skip: open");
    return;
  }
  es_new_event e[50];
  for (int i = 0; i < 50; i++) {
    es_new_event_init(&e[i]);
    e[i].type = "t";
  }
  int pending;
  int rc = es_store_append(s, "owned", e, 50, ES_NONE, ES_NONE, NULL, &pending, &err);
  rc = rc ? rc : es_store_append(s, "mine", e, 3, ES_NONE, ES_NONE, NULL, &pending, &err);
  ok(rc == ES_OK, "claim skip: append");
  const char *skip[] = {"owned"};
  const char *types[] = {"t"};
  es_events got;
  int64_t retry;
  rc = es_store_claim_next(s, "w", 1000, 2, NULL, 0, skip, 1, &got, &retry, &err);
  int only_mine = rc == ES_OK && got.n == 2;
  for (size_t i = 0; only_mine && i < got.n; i++) only_mine = strcmp(got.v[i].session, "mine") == 0;
  snprintf(name, sizeof name, "claim skip (%s): the limit counts only sessions not skipped", url);
  ok(only_mine, name);
  es_events_destroy(&got);
  rc = es_store_claim_next(s, "w", 1000, 5, types, 1, skip, 1, &got, &retry, &err);
  snprintf(name, sizeof name, "claim skip (%s): with types too", url);
  ok(rc == ES_OK && got.n == 1 && strcmp(got.v[0].session, "mine") == 0, name);
  es_events_destroy(&got);
  rc = es_store_claim_next(s, "w", 1000, 100, NULL, 0, NULL, 0, &got, &retry, &err);
  snprintf(name, sizeof name, "claim skip (%s): the skipped session's events are still ready", url);
  ok(rc == ES_OK && got.n == 50 && strcmp(got.v[0].session, "owned") == 0, name);
  es_events_destroy(&got);
  es_store_release(s);
}

/* n events of type "t" with the payload {} */
static void plain_events(es_new_event *e, int n) { new_events(e, n, "t", "{}"); }

/* es_store_append's per-event checks: the error names events[i] and the
 * field (the label is only formatted for an error), the call stores
 * nothing, and a C caller's payload text is parsed (payload_encoded 0). */
static void append_checks(void) {
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open("memory:", NULL, &s, &err)) {
    ok(0, "append checks: open");
    return;
  }
  char long_id[300];
  memset(long_id, 'i', 256);
  long_id[256] = '\0';
  struct {
    const char *field, *value, *msg;
  } bad[] = {
      {"type", "", "events[2].type must not be empty"},
      {"type", "t\xff", "events[2].type is not valid UTF-8"},
      {"id", long_id, "events[2].id is 256 bytes"},
      {"lane", "", "events[2].lane must not be empty"},
      {"key", "k\xc3", "events[2].key is not valid UTF-8"},
      {"payload", "{\"a\":1,}", "events[2].payload: invalid JSON at byte"},
      {"payload", "{\"a\":1,\"a\":2}", "events[2].payload: invalid JSON at byte"},
      {"payload", "\"\xff\"", "events[2].payload: invalid JSON at byte"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    es_new_event e[3];
    plain_events(e, 3);
    if (strcmp(bad[i].field, "type") == 0) e[1].type = bad[i].value;
    else if (strcmp(bad[i].field, "id") == 0) e[1].id = bad[i].value;
    else if (strcmp(bad[i].field, "lane") == 0) e[1].lane = bad[i].value;
    else if (strcmp(bad[i].field, "key") == 0) e[1].key = bad[i].value;
    else e[1].payload = bad[i].value, e[1].payload_len = strlen(bad[i].value);
    int pending = 0;
    memset(&err, 0, sizeof err);
    int rc = es_store_append(s, "checks", e, 3, ES_NONE, ES_NONE, NULL, &pending, &err);
    es_events got;
    es_err rerr = {0};
    int read = es_store_read(s, "checks", 0, ES_NONE, ES_NONE, &got, &rerr) == ES_OK;
    int empty = read && got.n == 0;
    if (read) es_events_destroy(&got);
    okf(rc == ES_INVALID_ARGUMENT && says(&err, bad[i].msg) && empty,
        "append checks: %s -> \"%s\" (got \"%s\"), nothing stored", bad[i].field, bad[i].msg,
        err.msg);
  }
  es_store_release(s);
}

/* max_payload_bytes is capped by what the backend stores (backend.h
 * max_payload): a payload over it is TOO_LARGE from the append's checks,
 * before any byte of it is read or written (the lengths below are claimed
 * by payload_len over a 2-byte text: the check must not read it). */
static void backend_limit(const char *url, const char *tag, size_t backend_max, const char *keys_path) {
  es_open_opts o = {0};
  o.max_payload_bytes = SIZE_MAX;
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open(url, &o, &s, &err)) {
    okf(0, "backend limit (%s): open: %s", tag, err.msg);
    return;
  }
  okf(es_store_max_payload(s) == backend_max, "backend limit (%s): max_payload_bytes = SIZE_MAX is capped at %zu (got %zu)",
      tag, backend_max, es_store_max_payload(s));
  es_new_event e[2];
  plain_events(e, 2);
  e[1].payload_len = backend_max + 1;
  int pending = 0;
  int rc = es_store_append(s, "big", e, 2, ES_NONE, ES_NONE, NULL, &pending, &err);
  char want[96];
  snprintf(want, sizeof want, "events[2].payload is %zu bytes, over the limit of %zu", backend_max + 1, backend_max);
  int64_t head = -1;
  es_err herr = {0};
  int untouched = es_store_head(s, "big", &head, &herr) == ES_OK && head == 0;
  okf(rc == ES_TOO_LARGE && says(&err, want) && untouched,
      "backend limit (%s): one byte over is TOO_LARGE before any write (got %d \"%s\", head %lld)", tag, rc,
      err.msg, (long long)head);
  es_store_release(s);
  /* a sealed payload (§3.10) is stored ~4/3 as long: one under the limit
   * as given, sealed, is over what the backend stores */
  o.keys_path = keys_path;
  if (es_store_open(url, &o, &s, &err) == ES_OK) {
    plain_events(e, 2);
    e[1].key = "k";
    e[1].payload_len = backend_max;
    rc = es_store_append(s, "sealed", e, 2, ES_NONE, ES_NONE, NULL, &pending, &err);
    untouched = es_store_head(s, "sealed", &head, &herr) == ES_OK && head == 0;
    okf(rc == ES_TOO_LARGE && says(&err, "once sealed, over the") && untouched,
        "backend limit (%s): a payload within it but over it sealed is TOO_LARGE before any write (got %d \"%s\")",
        tag, rc, err.msg);
    /* and the length the check uses is what a sealed payload takes at rest */
    static const char small[] = "{\"note\":\"leave at the door\"}";
    plain_events(e, 1);
    e[0].key = "k";
    e[0].payload = small;
    e[0].payload_len = sizeof small - 1;
    es_events rest = {0};
    int read = es_store_append(s, "sealed", e, 1, ES_NONE, ES_NONE, NULL, &pending, &err) == ES_OK &&
               es_store_read_at_rest(s, "sealed", 0, ES_NONE, ES_NONE, &rest, &err) == ES_OK;
    int stored = read && rest.n == 1;
    size_t at_rest = stored ? rest.v[0].payload_len : 0;
    okf(stored && at_rest == es_crypto_sealed_len(sizeof small - 1) && strlen(rest.v[0].payload) == at_rest,
        "backend limit (%s): a %zu-byte payload takes %zu bytes sealed, as the check counts (got %zu: %s)", tag,
        sizeof small - 1, es_crypto_sealed_len(sizeof small - 1), at_rest, stored ? "" : err.msg);
    if (read) es_events_destroy(&rest);
    es_store_release(s);
  } else {
    okf(0, "backend limit (%s): open with keys: %s", tag, err.msg);
  }
  o.keys_path = NULL;
  o.max_payload_bytes = 0;
  if (es_store_open(url, &o, &s, &err) == ES_OK) {
    okf(es_store_max_payload(s) == ES_DEFAULT_MAX_PAYLOAD, "backend limit (%s): the default stays 1 MiB", tag);
    es_store_release(s);
  }
}

int main(void) {
  char path[] = "/tmp/es_rules_XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  char url[64];
  snprintf(url, sizeof url, "sqlite:%s", path);
  claim_skip("memory:");
  claim_skip(url);
  char kdir[] = "/tmp/es_rules_keys_XXXXXX", keys[64] = "";
  if (mkdtemp(kdir)) snprintf(keys, sizeof keys, "%s/master.key", kdir);
  backend_limit("memory:", "memory", UINT32_MAX, keys);
  sqlite3 *db = NULL; /* the library's row limit, as the backend reads it */
  int sq_limit = sqlite3_open(":memory:", &db) == SQLITE_OK ? sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1) : 0;
  sqlite3_close(db);
  backend_limit(url, "sqlite", (size_t)sq_limit - ((size_t)1 << 20), keys);
  const char *pg = getenv("ES_PG_URL");
  if (pg && *pg) {
    char pu[1024];
    pg_url(pg, "rules_limit", pu, sizeof pu);
    backend_limit(pu, "postgres", ((size_t)1 << 30) - ((size_t)9 << 20), keys);
  } else {
    skip("backend limit (postgres): ES_PG_URL is not set (make test sets it)");
  }
  unlink(path);
  for (const char *suffix = "-wal"; suffix; suffix = strcmp(suffix, "-wal") == 0 ? "-shm" : NULL) {
    char p2[96];
    snprintf(p2, sizeof p2, "%s%s", path, suffix);
    unlink(p2);
  }
  if (*keys) {
    unlink(keys);
    rmdir(kdir);
  }
  timer_rule();
  text_clean();
  names();
  append_checks();
  overflowing_times();
  return tap_done();
}
