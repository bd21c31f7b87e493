/*
 * shards_test.c: the shard hash is pinned (docs/sharding.md): a change to
 * es_shard_score or es_shard_owner would move sessions between shards
 * without a plan change, so these values may never change. Prints
 * TAP-style "ok N - name" / "not ok N - name" lines and exits non-zero on
 * any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

#include "store/shards.h"

static int test_no = 0, failures = 0;

static void check(int ok, const char *name) {
  test_no++;
  if (!ok) failures++;
  printf("%sok %d - %s\n", ok ? "" : "not ok ", test_no, name);
}

/* A read_all cursor may name at most as many shards as the plans hold:
 * a crafted one naming 512 others must neither overrun the cursor's
 * arrays nor hide the shards it does not name (their events come from
 * the start), nor carry the unknown names forward. */
static void check_cursor_overflow(void) {
  es_err err = {0};
  es_shard_def d[1] = {{"a", "memory:"}};
  es_shard_plan p = {1, d, 1};
  es_store *s = NULL;
  int rc = es_shards_open("memory:", &p, NULL, &s, &err);
  check(rc == ES_OK, "open a sharded store on memory:");
  if (rc) return;
  es_new_event ev;
  es_new_event_init(&ev);
  ev.type = "t";
  ev.payload = "{}";
  ev.payload_len = 2;
  int pending = 0;
  for (int i = 0; i < 5 && rc == ES_OK; i++) {
    char name[16];
    snprintf(name, sizeof name, "s%d", i);
    rc = es_store_append(s, name, &ev, 1, ES_NONE, ES_NONE, NULL, &pending, &err);
  }
  check(rc == ES_OK, "append 5 events");
  for (int names = 511; names <= 512; names++) {
    es_buf b;
    es_buf_init(&b);
    es_buf_adds(&b, "c1");
    for (int i = 0; i < names; i++) es_buf_addf(&b, ".%02x%02x-1", 1 + i / 255, 1 + i % 255);
    es_buf_addc(&b, '\0');
    es_events out;
    char **cursors = NULL;
    rc = es_shards_read_all_cursor(s, b.data, ES_NONE, &out, &cursors, &err);
    char name[96];
    snprintf(name, sizeof name, "a cursor naming %d other shards reads shard a from the start", names);
    check(rc == ES_OK && out.n == 5, name);
    snprintf(name, sizeof name, "the next cursor (after %d foreign names) names shard a only", names);
    check(rc == ES_OK && out.n > 0 && strcmp(cursors[out.n - 1], "c1.61-5") == 0, name);
    if (rc == ES_OK) {
      es_shards_cursors_free(cursors, out.n);
      es_events_destroy(&out);
    }
    es_buf_destroy(&b);
  }
  es_store_release(s);
}

int main(void) {
  /* FNV-1a 64 over key, a 0 byte, shard name; then splitmix64's finaliser */
  check(es_shard_score("alpha", "a") == 0x78d099a7ca6edbd2ULL, "score(alpha, a)");
  check(es_shard_score("user-42", "a") == 0x28db3ba1a68fdc64ULL, "score(user-42, a)");
  check(es_shard_score("\xc3\xa9", "a") == 0xc5651d42b507f91bULL, "score(e-acute, a)");
  es_shard_def d[3] = {{"a", "memory:"}, {"b", "memory:"}, {"c", "memory:"}};
  es_shard_plan p = {1, d, 3};
  const char *keys[] = {"alpha", "beta", "gamma", "user-42", "order:1001"};
  const char *owners[] = {"a", "b", "c", "b", "b"};
  for (int i = 0; i < 5; i++) {
    char name[64];
    snprintf(name, sizeof name, "owner of %s is %s", keys[i], owners[i]);
    check(strcmp(d[es_shard_owner(&p, keys[i])].name, owners[i]) == 0, name);
  }
  /* adding a shard moves a session only to the new shard */
  es_shard_def d4[4] = {{"a", "memory:"}, {"b", "memory:"}, {"c", "memory:"}, {"d", "memory:"}};
  es_shard_plan p4 = {2, d4, 4};
  int moved = 0, wrong = 0;
  for (int i = 0; i < 10000; i++) {
    char key[32];
    snprintf(key, sizeof key, "session-%d", i);
    const char *before = d[es_shard_owner(&p, key)].name;
    const char *after = d4[es_shard_owner(&p4, key)].name;
    if (strcmp(before, after) != 0) {
      moved++;
      wrong += strcmp(after, "d") != 0;
    }
  }
  check(wrong == 0, "a session moves only to the added shard");
  check(moved > 2300 && moved < 2700, "adding a 4th shard moves about 1/4 of 10000 sessions");
  es_err err = {0};
  es_shard_def bad[2] = {{"a", "memory:"}, {"a", "memory:"}};
  es_shard_plan pb = {1, bad, 2};
  check(es_shard_plan_check(&pb, &err) == ES_INVALID_ARGUMENT, "a name twice is refused");
  es_shard_def dup[2] = {{"a", "sqlite:x.db"}, {"b", "sqlite:x.db"}};
  es_shard_plan pd = {1, dup, 2};
  check(es_shard_plan_check(&pd, &err) == ES_INVALID_ARGUMENT, "one url under two names is refused");
  check_cursor_overflow();
  return failures ? 1 : 0;
}
