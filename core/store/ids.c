/*
 * ids.c: the core store's event ids: UUIDv7 per handle, or the handle's
 * injected id source, behind a scope when the call has one (§3.11).
 * Moved out of store.c as it was.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "store/backend.h"
#include "store/internal.h"
#include "store/store.h"

/* ---------------------------------------------------------------------- */
/* event ids: UUIDv7 (RFC 9562), strictly increasing per handle */

#define UUID_MS_MAX (((int64_t)1 << 48) - 1)

int es_core_uuid7(es_store *s, int64_t now, char out[37], es_err *err) {
  unsigned char r[10];
  pthread_mutex_lock(&s->umu);
  /* One getrandom() per few hundred ids: a syscall per id cost more than
   * the rest of an append. */
  if (s->rand_used + sizeof r > sizeof s->rand_pool) {
    if (getrandom(s->rand_pool, sizeof s->rand_pool, 0) != (ssize_t)sizeof s->rand_pool) {
      pthread_mutex_unlock(&s->umu);
      return es_fail(err, ES_STORAGE, "no randomness for an event id");
    }
    s->rand_used = 0;
  }
  memcpy(r, s->rand_pool + s->rand_used, sizeof r);
  s->rand_used += sizeof r;
  /* The id holds 48 bits of milliseconds (to the year 10889): a clock past
   * them (a test's manual clock) keeps the last one, so ids stay in time
   * order instead of wrapping to 0, counted on as a stuck clock is. */
  if (now > UUID_MS_MAX) now = UUID_MS_MAX;
  if (now > s->uuid_ms) {
    s->uuid_ms = now;
    s->uuid_seq = ((uint32_t)r[8] << 8 | r[9]) & 0x3FF; /* random start, room to count */
  } else if (++s->uuid_seq > 0xFFF) {
    /* Borrow the next millisecond rather than repeat (a clock stuck at the
     * largest time keeps it; the 62 random bits still tell ids apart). */
    if (s->uuid_ms < UUID_MS_MAX) s->uuid_ms++;
    s->uuid_seq = 0;
  }
  uint64_t ms = (uint64_t)s->uuid_ms;
  uint32_t seq = s->uuid_seq;
  pthread_mutex_unlock(&s->umu);
  unsigned char b[16];
  for (int i = 0; i < 6; i++) b[i] = (unsigned char)(ms >> (40 - 8 * i));
  b[6] = (unsigned char)(0x70 | (seq >> 8));
  b[7] = (unsigned char)(seq & 0xFF);
  b[8] = (unsigned char)(0x80 | (r[0] & 0x3F));
  memcpy(b + 9, r + 1, 7);
  static const char hex[] = "0123456789abcdef";
  int o = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
    out[o++] = hex[b[i] >> 4];
    out[o++] = hex[b[i] & 15];
  }
  out[o] = '\0';
  return ES_OK;
}

/* An id from the injected source, checked to be a name. */
static int source_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  out[0] = '\0';
  int rc = s->ids(s->ids_ctx, out, ES_MAX_ID_BYTES + 1, err);
  if (rc) return rc;
  out[ES_MAX_ID_BYTES] = '\0';
  return es_check_name("the id source's id", out, err);
}

/* A handle's own new id (the core store's, and the shard router's: it
 * has the same id state). */
int es_core_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  if (s->ids) return source_id(s, out, err);
  int64_t now;
  int rc = es_store_now(s, &now, err);
  return rc ? rc : es_core_uuid7(s, now, out, err);
}

/* A generated event id, from the store's id source when it has one. An
 * injected source is trusted with nothing: its id must be a name and new,
 * or the call fails before writing a row with it. */
int es_core_new_event_id(es_store *s, es_txn *t, int64_t now, const char *scope,
                         char out[ES_MAX_NAME_BYTES + 1], es_err *err) {
  /* §3.11: a tenant's generated id is the generated id behind its prefix,
   * so every id in a tenant's sessions is the tenant's own. */
  size_t p = scope ? strlen(scope) : 0;
  memcpy(out, scope ? scope : "", p);
  if (!s->ids) return es_core_uuid7(s, now, out + p, err);
  int rc = source_id(s, out + p, err);
  if (rc) return rc;
  es_event row;
  rc = s->ops->event_get_by_id(s->bk, t, out, &row, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc == ES_OK) {
    es_event_destroy(&row);
    rc = es_fail(err, ES_INVALID_ARGUMENT, "the id source returned '%s', an id already stored", out);
  }
  return rc;
}
