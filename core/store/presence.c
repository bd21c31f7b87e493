/*
 * presence.c: the rules of §3.6 presence: set, read, watch.
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

/* --- presence --- */

typedef struct {
  const char *ns, *participant;
  const es_presence_field *fields;
  size_t n;
  int64_t ttl_ms, at, seen, now;
  int64_t expires;  /* now + ttl_ms */
  es_presence_rows *applied;
} presence_args;

int es_presence_push(es_presence_rows *rows, const es_presence_row *row) {
  if (es_grow((void **)&rows->v, &rows->cap, rows->n + 1, sizeof *rows->v) ||
      es_presence_row_copy(&rows->v[rows->n], row))
    return ES_STORAGE;
  rows->n++;
  return ES_OK;
}

static int do_presence_set(es_store *s, es_txn *t, void *arg, es_err *err) {
  presence_args *a = arg;
  int rc = s->ops->presence_expire(s->bk, t, a->ns, a->now, err);
  for (size_t i = 0; rc == ES_OK && i < a->n; i++) {
    es_presence_row old;
    rc = s->ops->presence_get(s->bk, t, a->ns, a->participant, a->fields[i].field, &old, err);
    if (rc == ES_OK) {
      /* Last writer wins by `at`; a tie goes to the incoming write. An
       * expired row (or tombstone) no longer guards its field. */
      int newer = old.expires_at > a->now && old.at > a->at;
      es_presence_row_destroy(&old);
      if (newer) continue;
    } else if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
    } else {
      break;
    }
    es_presence_row row = {
        .participant = (char *)a->participant,
        .field = (char *)a->fields[i].field,
        .value = (char *)a->fields[i].value,
        .value_len = a->fields[i].value_len,
        .seen = a->seen,
        .at = a->at,
        .expires_at = a->expires,
    };
    rc = s->ops->presence_put(s->bk, t, a->ns, &row, err);
    if (rc == ES_OK && es_presence_push(a->applied, &row)) rc = nomem(err);
  }
  return rc;
}

int es_core_presence_set(es_store *s, const char *ns, const char *participant,
                         const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                         int64_t seen, es_presence_rows *applied, es_err *err) {
  int rc;
  memset(applied, 0, sizeof *applied);
  if ((rc = es_check_name("namespace", ns, err)) || (rc = es_check_name("participant", participant, err)))
    return rc;
  if (ttl_ms <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0");
  if ((rc = check_nonneg("at", at, err))) return rc;
  if (seen < 0) return es_fail(err, ES_INVALID_ARGUMENT, "seen must be >= 0");
  for (size_t i = 0; i < n; i++) {
    if ((rc = es_check_name("presence field", fields[i].field, err))) return rc;
    if (fields[i].value) {
      if (fields[i].value_len > s->max_payload)
        return es_fail(err, ES_TOO_LARGE, "presence value '%s' is %zu bytes, over the limit of %zu",
                       fields[i].field, fields[i].value_len, s->max_payload);
      es_err jerr = {0};
      if (es_json_validate(fields[i].value, fields[i].value_len, &jerr))
        return es_fail(err, ES_INVALID_ARGUMENT, "presence value '%s': %s", fields[i].field,
                       jerr.msg);
    }
  }
  if ((rc = es_core_enter(s, err))) return rc;
  presence_args a = {ns, participant, fields, n, ttl_ms, at, seen, 0, 0, applied};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, ttl_ms, &a.expires)) rc = too_late(err, "ttl_ms");
  if (a.at == ES_NONE) a.at = a.now;
  if (rc == ES_OK && n > 0) rc = es_core_write(s, do_presence_set, &a, err);
  es_core_leave(s);
  if (rc) {
    es_presence_rows_destroy(applied);
    return rc;
  }
  if (applied->n == 0) return ES_OK;
  /* Tell in-process watchers, after commit, on this thread: what the
   * ext_watch thread did not already (presence_ext.c) */
  pthread_mutex_lock(&s->pmu);
  es_presence_rows fresh = {0};
  const es_presence_rows *give;
  es_presence_ext_own(s, ns, applied, &fresh, &give);
  for (presence_watch *w = s->watches; w && give->n; w = w->next)
    if (strcmp(w->ns, ns) == 0) w->cb(w->ctx, ns, give);
  pthread_mutex_unlock(&s->pmu);
  free(fresh.v);
  return ES_OK;
}

typedef struct {
  const char *ns;
  int64_t now;
  es_presence_rows *out;
} presence_read_args;

static int collect_presence(void *ctx, const es_presence_row *row) {
  collector *c = ctx;
  if (!row->value) return 0; /* tombstones only guard against older writes */
  if (es_presence_push(c->list, row) == ES_OK) return 0;
  c->oom = 1;
  return 1;
}

static int do_presence_read(es_store *s, es_txn *t, void *arg, es_err *err) {
  presence_read_args *a = arg;
  collector c = {a->out, 0};
  return es_rule_collected(s->ops->presence_list(s->bk, t, a->ns, a->now, collect_presence, &c, err), &c,
                   err);
}

int es_core_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("namespace", ns, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  presence_read_args a = {ns, 0, out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_read(s, do_presence_read, &a, err);
  es_core_leave(s);
  if (rc) es_presence_rows_destroy(out);
  return rc;
}

uint64_t es_core_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx) {
  presence_watch *w = calloc(1, sizeof *w);
  if (!w) return 0;
  w->ns = strdup(ns);
  if (!w->ns) {
    free(w);
    return 0;
  }
  w->cb = cb;
  w->ctx = ctx;
  pthread_mutex_lock(&s->pmu);
  uint64_t token = w->token = s->next_token++;
  w->next = s->watches;
  s->watches = w;
  pthread_mutex_unlock(&s->pmu);
  es_presence_ext_watched(s, ns); /* writes of other processes too */
  return token;
}

void es_core_presence_unwatch(es_store *s, uint64_t token) {
  char *ns = NULL;
  pthread_mutex_lock(&s->pmu);
  for (presence_watch **p = &s->watches; *p; p = &(*p)->next) {
    if ((*p)->token == token) {
      presence_watch *w = *p;
      *p = w->next;
      ns = w->ns;
      free(w);
      break;
    }
  }
  pthread_mutex_unlock(&s->pmu);
  if (ns) es_presence_ext_unwatched(s, ns);
  free(ns);
}
