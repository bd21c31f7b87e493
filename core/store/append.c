/*
 * append.c: the rules of §3.1 append and read: the checks and row
 * writes every write shares (batches, replays, lanes, inserts), append,
 * the reads, read_all, last_position, waiting, and §3.10 reads as stored.
 * Moved out of store.c as they were (store.c's top comment says how a
 * call runs).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "codec/json.h"
#include "store/backend.h"
#include "store/crypto.h"
#include "store/internal.h"
#include "store/rules.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/parse.h"

/* ---------------------------------------------------------------------- */
/* the rules */

/* Attempt `attempt` es_rule_owns the event from the claim that started it until it
 * completes or fails, or a later claim starts attempt + 1 (docs/contract.md §3.1). */
int es_rule_owns(const es_event *row, int64_t attempt) {
  return row->status == ES_STATUS_PENDING && row->attempts == attempt && row->claim_holder != NULL;
}

/* The time a queued, unclaimed event becomes ready. */
int64_t es_rule_due_of(const es_event *row, int64_t now) {
  int64_t due = now;
  if (row->not_before != ES_NONE) due = max64(due, row->not_before);
  if (row->retry_at != ES_NONE) due = max64(due, row->retry_at);
  return due;
}

int es_rule_load_session(es_store *s, es_txn *t, const char *session, es_session_info *si,
                         es_err *err) {
  int rc = s->ops->session_get(s->bk, t, session, si, err);
  if (rc == ES_NOT_FOUND) {
    es_session_info_init(si);
    si->session = strdup(session);
    if (!si->session) return nomem(err);
    /* §3.8: a name used before starts from its deleted session's token
     * (backend.h fence_floor_get), so no earlier token is ever current */
    if (s->ops->fence_floor_get && (rc = s->ops->fence_floor_get(s->bk, t, session, &si->fence, err))) {
      es_session_info_destroy(si);
      return rc;
    }
    return ES_OK;
  }
  return rc;
}

int es_rule_get_event(es_store *s, es_txn *t, const char *session, int64_t index, es_event *row,
                      es_err *err) {
  int rc = s->ops->event_get(s->bk, t, session, index, row, err);
  if (rc == ES_NOT_FOUND)
    return es_fail(err, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s'", (long long)index,
                   session);
  return rc;
}

int es_rule_check_meta(const char *meta, size_t len, size_t i, es_err *err) {
  if (len > ES_MAX_META_BYTES)
    return es_fail(err, ES_TOO_LARGE, "events[%zu].meta is %zu bytes, over the limit of %d", i + 1,
                   len, ES_MAX_META_BYTES);
  es_err jerr = {0};
  if (es_json_validate(meta, len, &jerr) != ES_OK)
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].meta: %s", i + 1, jerr.msg);
  /* canonical text has no leading space: an object starts with '{' */
  if (len == 0 || meta[0] != '{')
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].meta must be a JSON object", i + 1);
  return ES_OK;
}

/* es_check_name for events[i].FIELD; the label is formatted only for the
 * error (an snprintf per name was ~800 instructions of every event). */
static int check_event_name(size_t i, const char *field, const char *v, es_err *err) {
  if (es_check_name(field, v, NULL) == ES_OK) return ES_OK;
  char what[64];
  snprintf(what, sizeof what, "events[%zu].%s", i + 1, field);
  return es_check_name(what, v, err);
}

/* Checks one event to append (everything that needs no transaction). */
static int check_new_event(es_store *s, const es_new_event *e, size_t i, es_err *err) {
  int rc;
  if (!e->type) return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].type is required", i + 1);
  if ((rc = check_event_name(i, "type", e->type, err))) return rc;
  if (e->id && (rc = check_event_name(i, "id", e->id, err))) return rc;
  if (e->lane && (rc = check_event_name(i, "lane", e->lane, err))) return rc;
  if (e->key) {
    if ((rc = check_event_name(i, "key", e->key, err))) return rc;
    /* §3.10: never store in plaintext what the caller asked to seal */
    if (!s->crypto)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "events[%zu].key: the store was opened without keys, so it cannot seal the "
                     "payload (open it with {keys = PATH})",
                     i + 1);
  }
  if (e->payload) {
    if (e->payload_len > s->max_payload)
      return es_fail(err, ES_TOO_LARGE, "events[%zu].payload is %zu bytes, over the limit of %zu",
                     i + 1, e->payload_len, s->max_payload);
    /* sealed, it is stored ~4/3 as long: that too must fit the backend */
    if (e->key && es_crypto_sealed_len(e->payload_len) > s->max_stored)
      return es_fail(err, ES_TOO_LARGE,
                     "events[%zu].payload is %zu bytes, %zu once sealed, over the %zu the backend stores",
                     i + 1, e->payload_len, es_crypto_sealed_len(e->payload_len), s->max_stored);
    es_err jerr = {0};
    if (!e->payload_encoded && es_json_validate(e->payload, e->payload_len, &jerr) != ES_OK)
      return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].payload: %s", i + 1, jerr.msg);
  }
  if (e->revision != ES_NONE && (e->revision < 1 || e->revision > ES_MAX_REVISION))
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].revision must be an integer 1..%d", i + 1,
                   ES_MAX_REVISION);
  if (e->meta && (rc = es_rule_check_meta(e->meta, e->meta_len, i, err))) return rc;
  if ((e->cause_index == ES_NONE) != (e->cause_attempt == ES_NONE))
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].cause needs both index and attempt", i + 1);
  if (e->cause_index != ES_NONE && (e->cause_index < 1 || e->cause_attempt < 1))
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].cause index and attempt must be >= 1",
                   i + 1);
  if (e->not_before != ES_NONE && e->not_before < 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].not_before must be >= 0", i + 1);
  return ES_OK;
}

int es_rule_cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int es_rule_check_batch(es_store *s, const es_new_event *evs, size_t n, es_err *err) {
  if (n > s->max_batch)
    return es_fail(err, ES_TOO_LARGE, "batch of %zu events, over the limit of %zu", n, s->max_batch);
  size_t n_ids = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = check_new_event(s, &evs[i], i, err);
    if (rc) return rc;
    if (evs[i].id) n_ids++;
  }
  if (n_ids < 2) return ES_OK;
  /* Distinct ids: sort pointers rather than compare all pairs. */
  const char **ids = malloc(n_ids * sizeof *ids);
  if (!ids) return nomem(err);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (evs[i].id) ids[k++] = evs[i].id;
  qsort(ids, k, sizeof *ids, es_rule_cmp_str_ptr);
  int rc = ES_OK;
  for (size_t i = 1; i < k; i++) {
    if (strcmp(ids[i - 1], ids[i]) == 0) {
      rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH, "the batch repeats event id '%s'", ids[i]);
      break;
    }
  }
  free(ids);
  return rc;
}

static int payload_equal(const es_new_event *e, const es_event *row) {
  const char *p = e->payload ? e->payload : "null";
  size_t n = e->payload ? e->payload_len : 4;
  return n == row->payload_len && memcmp(p, row->payload, n) == 0;
}

/* §3.1: what of a replay differs from the stored event (NULL: nothing);
 * the payload is compared last, after the key check opened it. */
static const char *replay_differs(const es_new_event *e, const es_event *row) {
  if (strcmp(row->type, e->type) != 0) return "type";
  if ((e->revision == ES_NONE ? 1 : e->revision) != row->revision) return "revision";
  if (!e->meta != !row->meta ||
      (e->meta && (strlen(row->meta) != e->meta_len || memcmp(row->meta, e->meta, e->meta_len))))
    return "meta";
  return payload_equal(e, row) ? NULL : "payload";
}

/* §3.10: a replay must name the same key as the stored event, and its
 * payload is compared with the stored one opened (row's payload is
 * replaced by the plaintext, which the replay then returns). A shredded
 * original cannot be compared: refused like any new data under that key. */
static int replay_key_check(es_store *s, es_txn *t, const es_new_event *e, es_event *row,
                            es_err *err) {
  if (!e->key && !row->key) return ES_OK;
  if (!e->key || !row->key || strcmp(e->key, row->key) != 0)
    return es_fail(err, ES_ID_CONFLICT, "event id '%s' is already stored with a different key",
                   row->id);
  int rc = es_crypto_reveal(s, t, NULL, row, 1, err);
  if (rc == ES_OK && row->shredded)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "key '%s' was shredded: nothing can be sealed under that name again", e->key);
  return rc;
}

/* Batch idempotency (docs/contract.md §3.1). Returns ES_OK with *replayed = 1 and
 * the originals in out when every id is already stored in this session;
 * *replayed = 0 when none is; an error otherwise. `cause` (complete()) also
 * requires the stored events to carry that cause. What decides the error
 * is the batch as a whole, never the order of its events: an id stored in
 * another session, or a batch of stored and new ids, is
 * PARTIAL_DUPLICATE_BATCH even when one of its stored ids also differs;
 * ID_CONFLICT (or a key's error) only when every id is stored here. */
int es_rule_check_replay(es_store *s, es_txn *t, const char *session, const es_new_event *evs,
                         size_t n, int *replayed, es_events *out, es_err *err) {
  size_t found = 0, stored = 0; /* matching the stored event; stored here at all */
  int rc = ES_OK, conflict = ES_OK;
  es_err first = {0}; /* the first stored event that does not match */
  const char *differs;
  *replayed = 0;
  if (n == 0) return ES_OK;
  es_event row;
  es_event_init(&row);
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    if (!evs[i].id) continue;
    rc = s->ops->event_get_by_id(s->bk, t, evs[i].id, &row, err);
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      continue;
    }
    if (rc != ES_OK) break;
    int key_rc;
    es_err key_err = {0};
    if (strcmp(row.session, session) != 0) {
      rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                   "event id '%s' already exists in another session", evs[i].id);
    } else if ((key_rc = replay_key_check(s, t, &evs[i], &row, &key_err)) != ES_OK) {
      /* a different key, or the stored payload cannot be compared */
      if (key_rc == ES_STORAGE) {
        rc = es_fail(err, ES_STORAGE, "%s", key_err.msg);
      } else if (conflict == ES_OK) {
        conflict = key_rc;
        first = key_err;
      }
    } else if ((differs = replay_differs(&evs[i], &row)) != NULL) {
      if (conflict == ES_OK)
        conflict = es_fail(&first, ES_ID_CONFLICT, "event id '%s' is already stored with a different %s",
                           evs[i].id, differs);
    } else {
      found++;
      rc = es_events_push_copy(out, &row);
      if (rc) nomem(err);
    }
    if (rc == ES_OK) stored++;
    es_event_destroy(&row);
  }
  if (rc == ES_OK && stored > 0 && stored < n)
    rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                 "the batch mixes %zu already-stored and %zu new events", stored, n - stored);
  if (rc == ES_OK && conflict != ES_OK) rc = es_fail(err, conflict, "%s", first.msg);
  if (rc != ES_OK || found < n) {
    es_events_destroy(out);
    return rc;
  }
  *replayed = 1;
  return ES_OK;
}

/* Rows built by insert_rows and not yet inserted: inserted together
 * (event_insert_many), since on SQLite a statement's fixed cost is larger
 * than a row's. */
#define INSERT_CHUNK 64

typedef struct {
  es_event *rows;    /* [cap] */
  char **sealed;     /* [cap] §3.10: the stored text of a keyed row, else NULL */
  const char **plain; /* [cap] the payload the caller gets back */
  size_t *plain_len;
  char *gen;         /* [cap][ES_MAX_NAME_BYTES + 1] ids generated in the transaction */
  size_t n, cap;
} insert_chunk;

static void chunk_clear(insert_chunk *c) {
  for (size_t k = 0; k < c->n; k++) {
    free(c->sealed[k]);
    c->sealed[k] = NULL;
  }
  c->n = 0;
}

/* Inserts the built rows; on success counts them into si and copies them
 * (with the plaintext payload) to out. */
static int chunk_flush(es_store *s, es_txn *t, insert_chunk *c, es_session_info *si, int64_t now,
                       es_events *out, es_err *err) {
  int rc = ES_OK;
  if (c->n == 0) return ES_OK;
  es_core_touch(s, c->rows[0].session); /* a chunk holds one session's rows */
  if (s->ops->event_insert_many) {
    rc = s->ops->event_insert_many(s->bk, t, c->rows, c->n, err);
  } else {
    for (size_t k = 0; k < c->n && rc == ES_OK; k++)
      rc = s->ops->event_insert(s->bk, t, &c->rows[k], err);
  }
  for (size_t k = 0; k < c->n && rc == ES_OK; k++) {
    es_event *row = &c->rows[k];
    row->payload = (char *)c->plain[k];
    row->payload_len = c->plain_len[k];
    si->head++;
    si->events++;
    if (si->first_at == ES_NONE) si->first_at = now;
    if (out && es_events_push_copy(out, row)) rc = nomem(err);
  }
  chunk_clear(c);
  return rc;
}

/* Inserts events after the session's head; cause_* (complete) overrides each
 * event's own cause. Updates si's counters; appends copies to out. ids:
 * NULL, or the ids of the events without one, generated before the
 * transaction (es_core_append): event i's at ids + i * ids_stride. */
static int insert_rows(es_store *s, es_txn *t, es_session_info *si, const es_new_event *evs,
                       size_t n, int64_t cause_index, int64_t cause_attempt, int64_t now,
                       const char *scope, const char *ids, size_t ids_stride, es_events *out,
                       es_err *err) {
  int rc = ES_OK;
  /* The batch's room in out at once, not one reallocation per doubling. */
  if (out && es_grow((void **)&out->v, &out->cap, out->n + n, sizeof *out->v)) return nomem(err);
  insert_chunk c = {0};
  c.cap = n < INSERT_CHUNK ? n : INSERT_CHUNK;
  if (c.cap == 0) c.cap = 1;
  size_t gen_size = ids ? 0 : c.cap * (ES_MAX_NAME_BYTES + 1);
  /* one allocation for the chunk's arrays */
  size_t size = c.cap * (sizeof *c.rows + sizeof *c.sealed + sizeof *c.plain + sizeof *c.plain_len) + gen_size;
  char *mem = calloc(1, size);
  if (!mem) return nomem(err);
  c.rows = (es_event *)mem;
  c.sealed = (char **)(c.rows + c.cap);
  c.plain = (const char **)(c.sealed + c.cap);
  c.plain_len = (size_t *)(c.plain + c.cap);
  c.gen = gen_size ? (char *)(c.plain_len + c.cap) : NULL;
  es_keyring ring; /* §3.10: data keys of this batch */
  es_keyring_init(&ring);
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    const es_new_event *e = &evs[i];
    /* What looks at the rows already built must find them inserted: a
     * lane's earlier event (lane_next), an id source's repeated id
     * (es_core_new_event_id's lookup). */
    if ((e->lane && !e->settled) || (!e->id && !ids && s->ids))
      if ((rc = chunk_flush(s, t, &c, si, now, out, err))) break;
    es_event *row = &c.rows[c.n];
    char *gen = c.gen ? c.gen + c.n * (ES_MAX_NAME_BYTES + 1) : NULL;
    es_event_init(row);
    if (!e->id && !ids && (rc = es_core_new_event_id(s, t, now, scope, gen, err))) break;
    row->id = (char *)(e->id ? e->id : ids ? ids + i * ids_stride : gen);
    row->type = (char *)e->type;
    row->payload = (char *)(e->payload ? e->payload : "null");
    row->payload_len = e->payload ? e->payload_len : 4;
    row->session = si->session;
    row->lane = (char *)e->lane;
    row->index = si->head + 1 + (int64_t)c.n;
    row->created_at = now;
    row->cause_index = cause_index != ES_NONE ? cause_index : e->cause_index;
    row->cause_attempt = cause_index != ES_NONE ? cause_attempt : e->cause_attempt;
    row->not_before = e->not_before;
    row->revision = e->revision == ES_NONE ? 1 : e->revision;
    row->meta = (char *)e->meta; /* canonical text: no NUL inside, NUL-terminated by the caller */
    row->returned = 0;
    if (e->settled) {
      row->status = ES_STATUS_PROCESSED;
      row->processed_at = now;
      row->returned = -1;
    } else {
      row->status = ES_STATUS_PENDING;
      int64_t blocker = 0;
      if (e->lane) rc = s->ops->lane_next(s->bk, t, si->session, e->lane, 0, &blocker, err);
      if (rc) break;
      row->queued = blocker == 0;
      if (row->queued) row->due_at = es_rule_due_of(row, now);
      si->pending++;
    }
    /* §3.10: the row stores the sealed text; the caller gets the plaintext */
    c.plain[c.n] = row->payload;
    c.plain_len[c.n] = row->payload_len;
    c.sealed[c.n] = NULL;
    if (e->key) {
      row->key = (char *)e->key;
      rc = es_crypto_seal(s, t, &ring, row, c.plain[c.n], c.plain_len[c.n], &c.sealed[c.n],
                          &row->payload_len, err);
      row->payload = c.sealed[c.n];
    }
    c.n++;
    if (rc == ES_OK && c.n == c.cap) rc = chunk_flush(s, t, &c, si, now, out, err);
  }
  if (rc == ES_OK) rc = chunk_flush(s, t, &c, si, now, out, err);
  chunk_clear(&c);
  free(mem);
  es_keyring_destroy(&ring);
  si->updated_at = now;
  return rc;
}

int es_rule_insert_events(es_store *s, es_txn *t, es_session_info *si, const es_new_event *evs,
                          size_t n, int64_t cause_index, int64_t cause_attempt, int64_t now,
                          const char *scope, es_events *out, es_err *err) {
  return insert_rows(s, t, si, evs, n, cause_index, cause_attempt, now, scope, NULL, 0, out, err);
}

/* After the head of a lane was processed: the next unprocessed event of
 * the lane becomes a dispatch candidate. */
int es_rule_advance_lane(es_store *s, es_txn *t, const es_event *done, int64_t now, es_err *err) {
  if (!done->lane) return ES_OK;
  int64_t next = 0;
  int rc = s->ops->lane_next(s->bk, t, done->session, done->lane, done->index, &next, err);
  if (rc || next == 0) return rc;
  es_event row;
  if ((rc = es_rule_get_event(s, t, done->session, next, &row, err))) return rc;
  if (row.status == ES_STATUS_PENDING && !row.queued) {
    row.queued = 1;
    row.due_at = es_rule_due_of(&row, now);
    rc = s->ops->event_update(s->bk, t, &row, err);
  }
  es_event_destroy(&row);
  return rc;
}

/* §3.8: a write that carries a fence token must carry the session's current
 * one (a token never issued is as stale as an old one: either way another
 * writer es_rule_owns the session or the writer is confused); a sealed session takes
 * no more events. Checked after the replay check, so a lost-acknowledgement
 * retry, which writes nothing, still gets its answer. */
int es_rule_check_writable(const es_session_info *si, int64_t fence, size_t n, es_err *err) {
  if (fence != ES_NONE && fence != si->fence) {
    if (fence < si->fence)
      return es_fail(err, ES_STALE_FENCE, "fence token %lld of session '%s' is stale (current: %lld)",
                     (long long)fence, si->session, (long long)si->fence);
    return es_fail(err, ES_STALE_FENCE, "fence token %lld was never issued for session '%s' (current: %lld)",
                   (long long)fence, si->session, (long long)si->fence);
  }
  if (n > 0 && si->sealed_at != ES_NONE)
    return es_fail(err, ES_SEALED, "session '%s' is sealed%s%s", si->session,
                   si->seal_reason ? ": " : "", si->seal_reason ? si->seal_reason : "");
  return ES_OK;
}

/* --- append --- */

typedef struct {
  const char *session;
  const es_new_event *evs;
  size_t n;
  int64_t expected;
  int64_t fence;
  int64_t now;
  es_events *out;
  int pending;
  int want_out;   /* 0: the caller passed no out list; do not copy rows */
  const char *scope; /* §3.11: the tenant prefix of generated ids, or NULL */
  const char *ids;   /* NULL, or ids generated before the write (insert_rows) */
  size_t ids_stride;
} append_args;

static int check_causes(es_store *s, es_txn *t, const char *session, const es_new_event *evs,
                        size_t n, es_err *err) {
  for (size_t i = 0; i < n; i++) {
    if (evs[i].cause_index == ES_NONE) continue;
    es_event parent;
    int rc = es_rule_get_event(s, t, session, evs[i].cause_index, &parent, err);
    if (rc) return rc;
    int ok = es_rule_owns(&parent, evs[i].cause_attempt);
    es_event_destroy(&parent);
    if (!ok)
      return es_fail(err, ES_SUPERSEDED_ATTEMPT,
                     "attempt %lld no longer owns event %lld in session '%s'",
                     (long long)evs[i].cause_attempt, (long long)evs[i].cause_index, session);
  }
  return ES_OK;
}

static int do_append(es_store *s, es_txn *t, void *arg, es_err *err) {
  append_args *a = arg;
  int replayed = 0;
  es_session_info si;
  int rc = es_rule_check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  if (rc) return rc;
  if ((rc = es_rule_load_session(s, t, a->session, &si, err))) return rc;
  if (replayed) {
    a->pending = si.pending > 0;
    es_session_info_destroy(&si);
    return ES_OK;
  }
  rc = es_rule_check_writable(&si, a->fence, a->n, err);
  if (rc == ES_OK && a->expected != ES_NONE && si.head != a->expected) {
    rc = es_fail(err, ES_WRONG_EXPECTED_HEAD, "session '%s' is at %lld, expected %lld", a->session,
                 (long long)si.head, (long long)a->expected);
  }
  if (rc == ES_OK) rc = check_causes(s, t, a->session, a->evs, a->n, err);
  if (rc == ES_OK)
    rc = insert_rows(s, t, &si, a->evs, a->n, ES_NONE, ES_NONE, a->now, a->scope, a->ids,
                     a->ids_stride, a->want_out ? a->out : NULL, err);
  if (rc == ES_OK) rc = s->ops->session_put(s->bk, t, &si, err);
  a->pending = si.pending > 0;
  es_session_info_destroy(&si);
  return rc;
}

/* The UUIDv7 ids of the events without one, made before the write so
 * that the group's serial part does not make them (a store with an id
 * source calls it inside the transaction, as before: its ids are used
 * only by a call that gets as far as inserting). *ids: NULL when no event
 * needs one, else owned by the caller. */
static int pregenerate_ids(es_store *s, append_args *a, char **ids, es_err *err) {
  *ids = NULL;
  if (s->ids) return ES_OK;
  size_t missing = 0;
  for (size_t i = 0; i < a->n; i++) missing += !a->evs[i].id;
  if (missing == 0) return ES_OK;
  size_t p = a->scope ? strlen(a->scope) : 0;
  size_t stride = p + 37;
  char *v = malloc(a->n * stride);
  if (!v) return nomem(err);
  for (size_t i = 0; i < a->n; i++) {
    if (a->evs[i].id) continue;
    memcpy(v + i * stride, a->scope ? a->scope : "", p);
    int rc = es_core_uuid7(s, a->now, v + i * stride + p, err);
    if (rc) {
      free(v);
      return rc;
    }
  }
  *ids = v;
  a->ids = v;
  a->ids_stride = stride;
  return ES_OK;
}

int es_core_append(es_store *s, const char *scope, const char *session, const es_new_event *evs,
                   size_t n, int64_t expected, int64_t fence, es_events *out, int *pending,
                   es_err *err) {
  int rc;
  es_events unused = {0};
  if (!out) out = &unused; /* the caller does not want the stored events back */
  memset(out, 0, sizeof *out);
  *pending = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = check_nonneg("expected", expected, err))) return rc;
  if ((rc = es_rule_check_batch(s, evs, n, err))) return rc;
  if (fence != ES_NONE && fence < 1) return es_fail(err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  if ((rc = es_core_enter(s, err))) return rc;
  append_args a = {session, evs, n, expected, fence, 0, out, 0, 1, scope, NULL, 0};
  if (n == 0) {
    /* Writes nothing; still answers whether the session has pending work. */
    es_session_info si;
    es_txn *t = NULL;
    rc = s->ops->read_begin(s->bk, &t, err);
    if (rc == ES_OK) {
      rc = s->ops->session_get(s->bk, t, session, &si, err);
      if (rc == ES_OK) {
        *pending = si.pending > 0;
        es_session_info_destroy(&si);
      } else if (rc == ES_NOT_FOUND) {
        rc = ES_OK;
      }
      s->ops->read_end(s->bk, t);
    }
    es_core_leave(s);
    return rc;
  }
  a.want_out = out != &unused;
  rc = es_store_now(s, &a.now, err);
  char *ids = NULL;
  if (rc == ES_OK) rc = pregenerate_ids(s, &a, &ids, err);
  if (rc == ES_OK) {
    /* do_append reads the session row and looks the ids up before its
     * first write, and after it meets only STORAGE, unless an event is
     * sealed (a key may be refused halfway). A payload the backend could
     * not store was refused by the checks (max_payload is capped by the
     * backend's own limit at open). */
    es_write_hint hint = {session, evs, n, 1};
    for (size_t i = 0; i < n; i++)
      if (evs[i].key) hint.shared = 0;
    rc = es_core_write_hinted(s, do_append, &a, &hint, err);
  }
  free(ids);
  es_core_leave(s);
  es_events_destroy(&unused);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *pending = a.pending;
  return ES_OK;
}

/* --- append_many: several appends, one transaction --- */

typedef struct {
  append_args *a;  /* [n] one per batch */
  size_t n;
} append_many_args;

/* rc with err's message behind the batch it is about, so a caller of
 * many batches knows which one was refused. */
static int batch_failed(es_err *err, int rc, size_t i, const char *session) {
  if (!err) return rc;
  char msg[ES_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", err->msg);
  if (session && es_check_name("session", session, NULL) == ES_OK)
    return es_fail(err, rc, "batches[%zu] (session '%s'): %s", i + 1, session, msg);
  return es_fail(err, rc, "batches[%zu]: %s", i + 1, msg);
}

/* Each batch as append would run it; the first refused one fails the
 * whole work, whose savepoint then drops the batches written before it. */
static int do_append_many(es_store *s, es_txn *t, void *arg, es_err *err) {
  append_many_args *m = arg;
  for (size_t i = 0; i < m->n; i++) {
    append_args *a = &m->a[i];
    int rc;
    if (a->n == 0) {
      /* as append's empty batch: writes nothing (no session row either),
       * answers whether the session has pending work */
      es_session_info si;
      if ((rc = es_rule_load_session(s, t, a->session, &si, err)) == ES_OK) {
        a->pending = si.pending > 0;
        es_session_info_destroy(&si);
      }
    } else {
      rc = do_append(s, t, a, err);
    }
    if (rc) return batch_failed(err, rc, i, a->session);
  }
  return ES_OK;
}

/* What append checks before its transaction, for one batch. */
static int check_append_batch(es_store *s, const es_append_batch *b, es_err *err) {
  int rc;
  if ((rc = es_check_name("session", b->session, err)) ||
      (rc = check_nonneg("expected", b->expected, err)) ||
      (rc = es_rule_check_batch(s, b->evs, b->n, err)))
    return rc;
  if (b->fence != ES_NONE && b->fence < 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  return ES_OK;
}

int es_core_append_many(es_store *s, const char *scope, es_append_batch *v, size_t n,
                        es_err *err) {
  int rc;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if ((rc = check_append_batch(s, &v[i], err))) return batch_failed(err, rc, i, v[i].session);
    total += v[i].n;
  }
  if (n > s->max_batch || total > s->max_batch)
    return es_fail(err, ES_TOO_LARGE, "%zu batches of %zu events in all, over the limit of %zu",
                   n, total, s->max_batch);
  if (n == 0) return ES_OK;
  if ((rc = es_core_enter(s, err))) return rc;
  append_args *a = calloc(n, sizeof *a);
  char **ids = calloc(n, sizeof *ids);
  int64_t now = 0;
  rc = a && ids ? es_store_now(s, &now, err) : nomem(err);
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    append_args one = {v[i].session, v[i].evs, v[i].n, v[i].expected, v[i].fence, now,
                       &v[i].out, 0, 1, scope, NULL, 0};
    a[i] = one;
    rc = pregenerate_ids(s, &a[i], &ids[i], err);
  }
  append_many_args m = {a, n};
  if (rc == ES_OK) rc = es_core_write(s, do_append_many, &m, err);
  for (size_t i = 0; i < n; i++) {
    if (ids) free(ids[i]);
    if (rc) es_events_destroy(&v[i].out);
    else if (a) v[i].pending = a[i].pending;
  }
  free(ids);
  free(a);
  es_core_leave(s);
  return rc;
}

/* --- reads --- */

/* §3.9: a read of (after, through] needs no event below the session's
 * first_index (the truncated prefix), else TRUNCATED. */
int es_rule_check_live(const es_session_info *si, int64_t after, int64_t through, es_err *err) {
  int64_t first = si->first_index > 1 ? si->first_index : 1;
  if (through > after && after + 1 < first)
    return es_fail(err, ES_TRUNCATED,
                   "events 1..%lld of session '%s' were truncated: read from after = %lld on",
                   (long long)(first - 1), si->session, (long long)(first - 1));
  return ES_OK;
}

typedef struct {
  const char *session;
  int64_t after, through, limit;
  es_events *out;
  int64_t head;
  int at_rest;   /* §3.10 read_at_rest: payloads as stored */
} range_args;

int es_rule_collected(int rc, const collector *c, es_err *err) {
  return rc == ES_OK && c->oom ? nomem(err) : rc;
}

int es_rule_collect_event(void *ctx, const es_event *row) {
  collector *c = ctx;
  if (es_events_push_copy(c->list, row) == ES_OK) return 0;
  c->oom = 1;
  return 1;
}

/* §3.10: every path that returns events opens sealed payloads (or marks
 * them shredded) inside its transaction, after collecting them. */
int es_rule_revealed(es_store *s, es_txn *t, int rc, es_events *list, es_err *err) {
  return rc == ES_OK ? es_crypto_reveal(s, t, NULL, list->v, list->n, err) : rc;
}

static int do_range(es_store *s, es_txn *t, void *arg, es_err *err) {
  range_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) {
    a->head = 0;
    return ES_OK;
  }
  if (rc) return rc;
  a->head = si.head;
  int64_t through = a->through == ES_NONE ? a->head : a->through;
  if (through > a->head) through = a->head;
  rc = es_rule_check_live(&si, a->after, through, err);
  /* §3.9: the archived part first (from segment files), then live rows */
  int64_t after = a->after, limit = a->limit;
  if (rc == ES_OK && through > after)
    rc = es_archive_read_part(s, t, &si, &after, through, &limit, a->out, err);
  es_session_info_destroy(&si);
  if (rc) return rc;
  collector c = {a->out, 0};
  int rc2 = ES_OK;
  if (through > after && limit != 0)
    rc2 = es_rule_collected(
        s->ops->event_range(s->bk, t, a->session, after, through, limit, es_rule_collect_event, &c, err),
        &c, err);
  /* §3.10: archived and live rows alike (segments keep payloads as stored) */
  if (a->at_rest) return rc2 == ES_OK ? es_crypto_mark_at_rest(s, t, a->out->v, a->out->n, err) : rc2;
  return es_rule_revealed(s, t, rc2, a->out, err);
}

static int read_range(es_store *s, range_args *a, es_err *err) {
  int rc;
  memset(a->out, 0, sizeof *a->out);
  if ((rc = es_check_name("session", a->session, err)) ||
      (rc = check_nonneg("after", a->after, err)) ||
      (rc = check_nonneg("through", a->through, err)) || (rc = check_nonneg("limit", a->limit, err)))
    return rc;
  if (a->limit == 0) return ES_OK;
  a->limit = cap_limit(a->limit);
  if ((rc = es_core_enter(s, err))) return rc;
  rc = es_core_read(s, do_range, a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_events_destroy(a->out);
    rc = es_core_read(s, do_range, a, err);
  }
  es_core_leave(s);
  if (rc) es_events_destroy(a->out);
  return rc;
}

int es_core_read_events(es_store *s, const char *session, int64_t after, int64_t through, int64_t limit,
                        es_events *out, es_err *err) {
  range_args a = {session, after, through, limit, out, 0, 0};
  return read_range(s, &a, err);
}

int es_core_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                        int64_t limit, es_events *out, int64_t *through_out, es_err *err) {
  range_args a = {session, after, through, limit, out, 0, 0};
  int rc = read_range(s, &a, err);
  /* A page of no events still pins the head (§3.4): read_range read nothing */
  if (rc == ES_OK && limit == 0 && (rc = es_core_head(s, session, &a.head, err))) es_events_destroy(out);
  if (rc == ES_OK) *through_out = through == ES_NONE ? a.head : (through < a.head ? through : a.head);
  return rc;
}

typedef struct {
  const char *session;
  int64_t *head;
} head_args;

static int do_head(es_store *s, es_txn *t, void *arg, es_err *err) {
  head_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  *a->head = 0;
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  *a->head = si.head;
  es_session_info_destroy(&si);
  return ES_OK;
}

int es_core_head(es_store *s, const char *session, int64_t *head, es_err *err) {
  int rc;
  *head = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  head_args a = {session, head};
  rc = es_core_read(s, do_head, &a, err);
  es_core_leave(s);
  return rc;
}

static int do_read_all(es_store *s, es_txn *t, void *arg, es_err *err) {
  all_args *a = arg;
  collector c = {a->out, 0};
  int rc = es_rule_collected(
      s->ops->event_all(s->bk, t, a->scope, a->after, a->limit, es_rule_collect_event, &c, err), &c, err);
  return es_rule_revealed(s, t, rc, a->out, err);
}

int es_core_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out,
                     es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = check_nonneg("after", after, err)) || (rc = check_nonneg("limit", limit, err))) return rc;
  if (limit == 0) return ES_OK;
  if ((rc = es_core_enter(s, err))) return rc;
  all_args a = {after == ES_NONE ? 0 : after, cap_limit(limit), NULL, out, scope};
  rc = es_core_read(s, do_read_all, &a, err);
  es_core_leave(s);
  if (rc) es_events_destroy(out);
  return rc;
}

/* §5 read_all_cursor: a core store's cursor is the position, in decimal
 * (digits only: "+1" or " 1" is not one), so clients paging with cursors
 * work on sharded and unsharded stores alike. */
int es_core_read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                            es_events *out, char ***cursors, es_err *err) {
  *cursors = NULL;
  memset(out, 0, sizeof *out);
  int64_t after = 0;
  if (cursor && *cursor &&
      (cursor[0] < '0' || cursor[0] > '9' || es_parse_int(cursor, 0, INT64_MAX, &after)))
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "a read_all cursor of this store is a position (a whole number >= 0)");
  int rc = es_core_read_all(s, scope, after, limit, out, err);
  if (rc || out->n == 0) return rc;
  char **v = calloc(out->n, sizeof *v);
  for (size_t i = 0; v && i < out->n; i++) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)out->v[i].position);
    if (!(v[i] = strdup(buf))) {
      es_store_cursors_free(v, i);
      v = NULL;
    }
  }
  if (!v) {
    es_events_destroy(out);
    return nomem(err);
  }
  *cursors = v;
  return ES_OK;
}

/* last_position with a scope (a tenant's): the highest position among
 * the scope's own events (a tenant does not see how far other tenants
 * have written). Each session's newest event holds its highest position,
 * so it is the largest of those: O(the scope's sessions), one read
 * transaction. */
typedef struct {
  const char *scope;
  char **names;
  size_t n, cap;
  int oom;
  int64_t *position;
} last_args;

static int collect_name(void *ctx, const es_session_info *row) {
  last_args *a = ctx;
  if (row->events <= 0) return 0;
  char *copy = strdup(row->session);
  if (!copy || es_grow((void **)&a->names, &a->cap, a->n + 1, sizeof *a->names)) {
    free(copy);
    a->oom = 1;
    return 1;
  }
  a->names[a->n++] = copy;
  return 0;
}

static int do_last_position(es_store *s, es_txn *t, void *arg, es_err *err) {
  last_args *a = arg;
  if (!a->scope) return s->ops->last_position(s->bk, t, a->position, err);
  int rc = s->ops->session_list(s->bk, t, a->scope, NULL, ES_NONE, collect_name, a, err);
  if (rc == ES_OK && a->oom) rc = nomem(err);
  for (size_t i = 0; rc == ES_OK && i < a->n; i++) {
    es_session_info si;
    if ((rc = s->ops->session_get(s->bk, t, a->names[i], &si, err))) break;
    es_event e;
    rc = s->ops->event_get(s->bk, t, a->names[i], si.head, &e, err);
    es_session_info_destroy(&si);
    if (rc == ES_NOT_FOUND) { /* every event dropped (truncate through the head) */
      rc = ES_OK;
      continue;
    }
    if (rc) break;
    if (e.position > *a->position) *a->position = e.position;
    es_event_destroy(&e);
  }
  return rc;
}

int es_core_last_position(es_store *s, const char *scope, int64_t *position, es_err *err) {
  int rc;
  *position = 0;
  if ((rc = es_core_enter(s, err))) return rc;
  last_args a = {scope, NULL, 0, 0, 0, position};
  rc = es_core_read(s, do_last_position, &a, err);
  es_core_leave(s);
  for (size_t i = 0; i < a.n; i++) free(a.names[i]);
  free(a.names);
  if (rc) *position = 0;
  return rc;
}

typedef struct {
  const char *session;
  int64_t index;
  es_event *out;
} get_args;

static int do_get(es_store *s, es_txn *t, void *arg, es_err *err) {
  get_args *a = arg;
  int rc = es_rule_get_event(s, t, a->session, a->index, a->out, err);
  if (rc == ES_OK) rc = es_crypto_reveal(s, t, NULL, a->out, 1, err);
  if (rc != ES_NO_SUCH_EVENT) return rc;
  es_session_info si;
  if (s->ops->session_get(s->bk, t, a->session, &si, err) != ES_OK) return rc;
  if (a->index >= 1 && a->index <= si.head) rc = es_rule_check_live(&si, a->index - 1, a->index, err);
  if (rc == ES_NO_SUCH_EVENT && a->index >= 1 && a->index <= si.archived_through) {
    /* §3.9: an archived event */
    es_events one = {0};
    int64_t after = a->index - 1, limit = 1;
    rc = es_archive_read_part(s, t, &si, &after, a->index, &limit, &one, err);
    if (rc == ES_OK && one.n == 1) {
      *a->out = one.v[0];  /* moves the event out of the list */
      one.n = 0;
      rc = es_crypto_reveal(s, t, NULL, a->out, 1, err); /* §3.10: segments keep it sealed */
    } else if (rc == ES_OK) {
      rc = es_fail(err, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s'",
                   (long long)a->index, a->session);
    }
    es_events_destroy(&one);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err) {
  int rc;
  es_event_init(out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  get_args a = {session, index, out};
  rc = es_core_read(s, do_get, &a, err);
  if (es_archive_retryable(rc, err)) rc = es_core_read(s, do_get, &a, err);
  es_core_leave(s);
  return rc;
}

/* --- waiting --- */

static int before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* es_core_wait. A wait costs nothing while nothing it could read happens
 * (issue 24: idle tails of an empty tenant used to read again on every
 * commit of any tenant and every 50 ms poll): it sleeps on its key
 * (wakes.c: its session, its scope, or every session), which only this
 * handle's commits that add or drop events there wake, and the handle's
 * ext_watch thread on another process's commit; it reads again only
 * then. The read itself is an index seek within the scope (backend.h
 * event_all), so what a wake costs is what is new there. */
static int wait_keyed(es_store *s, const char *scope, const char *session, int64_t after,
                      const struct timespec *deadline, int64_t limit, es_events *out,
                      es_err *err) {
  wait_key *k = es_core_wait_key_get(s, session ? session : scope ? scope : "");
  if (!k) return nomem(err);
  int rc = ES_OK, read = 1;
  /* with the key held, so that the thread does not end under it */
  if (s->ops->ext_version) rc = es_core_ext_start(s, err);
  while (rc == ES_OK) {
    /* the sequence is taken before the read: a commit the read missed
     * has moved it, and the sleep below returns at once */
    uint64_t seen = es_core_wait_key_seq(s, k);
    if (read) {
      rc = session ? es_store_read(s, session, after, ES_NONE, limit, out, err)
                   : es_core_read_all(s, scope, after, limit, out, err);
      if (rc || out->n > 0) break;
      es_events_destroy(out);
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!before(&now, deadline)) break;
    read = es_core_wait_key_sleep(s, k, seen, deadline);
  }
  es_core_wait_key_put(s, k);
  return rc;
}

int es_core_wait(es_store *s, const char *scope, const char *session, int64_t after,
                 int64_t timeout_ms, int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (timeout_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "timeout_ms must be >= 0");
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  struct timespec deadline = es_timespec_add(&now, timeout_ms);
  return wait_keyed(s, scope, session, after, &deadline, limit, out, err);
}

/* ---------------------------------------------------------------------- */
/* 3.10 crypto-shredding: reads as stored (the rest is in crypto.c) */

int es_core_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                         int64_t limit, es_events *out, es_err *err) {
  range_args a = {session, after, through, limit, out, 0, 1};
  return read_range(s, &a, err);
}
