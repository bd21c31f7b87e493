/*
 * ids.c: the counter id source (ids.h).
 */
#include "util/ids.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IDS_MAX_PREFIX 200

struct es_counter_ids {
  atomic_int_least64_t next;
  atomic_int refs;
  char prefix[];
};

es_counter_ids *es_counter_ids_new(const char *prefix, int64_t start) {
  size_t n = strlen(prefix);
  if (n > IDS_MAX_PREFIX) return NULL;
  es_counter_ids *c = malloc(sizeof *c + n + 1);
  if (!c) return NULL;
  atomic_init(&c->next, start);
  atomic_init(&c->refs, 1);
  memcpy(c->prefix, prefix, n + 1);
  return c;
}

void es_counter_ids_retain(es_counter_ids *c) { atomic_fetch_add(&c->refs, 1); }

void es_counter_ids_release(es_counter_ids *c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

int es_counter_ids_next(void *ctx, char *out, size_t cap, es_err *err) {
  es_counter_ids *c = ctx;
  int64_t v = atomic_fetch_add(&c->next, 1);
  if (v == INT64_MAX) atomic_store(&c->next, INT64_MAX); /* never wraps to negative */
  int n = snprintf(out, cap, "%s%012" PRId64, c->prefix, v);
  if (n < 0 || (size_t)n >= cap) return es_fail(err, ES_INVALID_ARGUMENT, "the id counter ran out of room");
  return ES_OK;
}
