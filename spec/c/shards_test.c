/*
 * shards_test.c: the shard hash is pinned (docs/sharding.md): a change to
 * es_shard_score or es_shard_owner would move sessions between shards
 * without a plan change, so these values may never change. Prints
 * TAP-style "ok N - name" / "not ok N - name" lines and exits non-zero on
 * any failure.
 */
#include <stdio.h>
#include <string.h>

#include "store/shards.h"

static int test_no = 0, failures = 0;

static void check(int ok, const char *name) {
  test_no++;
  if (!ok) failures++;
  printf("%sok %d - %s\n", ok ? "" : "not ok ", test_no, name);
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
  return failures ? 1 : 0;
}
