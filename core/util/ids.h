/*
 * ids.h: a deterministic event-id source (es_open_opts.ids) for tests and
 * replays: prefix followed by a counter, zero-padded to 12 digits so the
 * ids sort in the order they were made (as UUIDv7 ids do). Atomic, so an
 * engine's worker threads can share it; reference counted like the manual
 * clock, so a store can keep it after the code that made it lets go.
 */
#ifndef ES_UTIL_IDS_H
#define ES_UTIL_IDS_H

#include "es.h"

typedef struct es_counter_ids es_counter_ids;

/* prefix: copied, at most 200 bytes (the ids must stay names); the first
 * id carries `start`. NULL when out of memory or the prefix is too long. */
es_counter_ids *es_counter_ids_new(const char *prefix, int64_t start);
void es_counter_ids_retain(es_counter_ids *c);
void es_counter_ids_release(es_counter_ids *c); /* frees at the last reference */
/* An es_id_fn over the es_counter_ids passed as ctx. */
int es_counter_ids_next(void *ctx, char *out, size_t cap, es_err *err);

#endif
