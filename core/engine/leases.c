/*
 * leases.c: the leases an engine holds (engine.h es_engine_lease) and the
 * sessions it was fenced out of. Both lists are short (the sessions one
 * engine owns), so they are arrays searched linearly under lease_mu.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

static engine_lease *find_lease(es_engine *e, const char *session) {
  for (size_t i = 0; i < e->n_leases; i++)
    if (strcmp(e->leases[i].session, session) == 0) return &e->leases[i];
  return NULL;
}

static void drop_lease(es_engine *e, const char *session) {
  engine_lease *l = find_lease(e, session);
  if (!l) return;
  free(l->session);
  *l = e->leases[--e->n_leases];
}

static void unfence(es_engine *e, const char *session) {
  for (size_t i = 0; i < e->n_fenced; i++) {
    if (strcmp(e->fenced[i], session) != 0) continue;
    free(e->fenced[i]);
    e->fenced[i] = e->fenced[--e->n_fenced];
    break;
  }
  atomic_store(&e->any_fenced, e->n_fenced > 0);
}

int64_t es_engine_fence_of(es_engine *e, const char *session) {
  pthread_mutex_lock(&e->lease_mu);
  engine_lease *l = e->n_leases ? find_lease(e, session) : NULL;
  int64_t token = l ? l->token : ES_NONE;
  pthread_mutex_unlock(&e->lease_mu);
  return token;
}

void es_engine_fenced_out(es_engine *e, const char *session) {
  pthread_mutex_lock(&e->lease_mu);
  drop_lease(e, session);
  int known = 0;
  for (size_t i = 0; i < e->n_fenced && !known; i++) known = strcmp(e->fenced[i], session) == 0;
  char *copy = known ? NULL : strdup(session);
  /* Out of memory here only means the engine may claim the session's events
   * again; its writes there are unfenced then, as before it leased. */
  if (copy && es_grow((void **)&e->fenced, &e->cap_fenced, e->n_fenced + 1, sizeof *e->fenced) == ES_OK)
    e->fenced[e->n_fenced++] = copy;
  else
    free(copy);
  atomic_store(&e->any_fenced, e->n_fenced > 0);
  pthread_mutex_unlock(&e->lease_mu);
  es_engine_log(e, 0, "fenced out of session '%s': another holder owns it now; its events are left "
                      "to that holder", session);
}

int es_engine_is_fenced(es_engine *e, const char *session) {
  if (!atomic_load(&e->any_fenced)) return 0;
  pthread_mutex_lock(&e->lease_mu);
  int found = 0;
  for (size_t i = 0; i < e->n_fenced && !found; i++) found = strcmp(e->fenced[i], session) == 0;
  pthread_mutex_unlock(&e->lease_mu);
  return found;
}

char **es_engine_skip_list(es_engine *e, size_t *n) {
  *n = 0;
  if (!atomic_load(&e->any_fenced)) return NULL;
  pthread_mutex_lock(&e->lease_mu);
  char **v = e->n_fenced ? calloc(e->n_fenced, sizeof *v) : NULL;
  for (size_t i = 0; v && i < e->n_fenced; i++) {
    if (!(v[i] = strdup(e->fenced[i]))) {
      es_engine_skip_free(v, i);
      v = NULL;
    }
  }
  if (v) *n = e->n_fenced;
  pthread_mutex_unlock(&e->lease_mu);
  return v;
}

void es_engine_skip_free(char **v, size_t n) {
  for (size_t i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

/* Records an acquired lease (under lease_mu). */
static int keep_lease(es_engine *e, const char *session, const es_lease *got, int64_t ttl_ms) {
  engine_lease *l = find_lease(e, session);
  if (!l) {
    char *copy = strdup(session);
    if (!copy || es_grow((void **)&e->leases, &e->cap_leases, e->n_leases + 1, sizeof *e->leases)) {
      free(copy);
      return ES_STORAGE;
    }
    l = &e->leases[e->n_leases++];
    l->session = copy;
  }
  l->token = got->token;
  l->ttl_ms = ttl_ms;
  l->renewed_ms = es_mono_ms();
  unfence(e, session);
  return ES_OK;
}

int es_engine_lease(es_engine *e, const char *session, int64_t ttl_ms, es_lease *out,
                    es_err *err) {
  int rc = es_store_lease(e->s, session, e->holder, ttl_ms, out, err);
  if (rc || !out->acquired) return rc;
  pthread_mutex_lock(&e->lease_mu);
  rc = keep_lease(e, session, out, ttl_ms);
  pthread_mutex_unlock(&e->lease_mu);
  if (rc) es_lease_destroy(out);
  return rc ? es_fail(err, ES_STORAGE, "out of memory") : ES_OK;
}

int es_engine_release(es_engine *e, const char *session, int *released, es_err *err) {
  *released = 0;
  int64_t token = es_engine_fence_of(e, session);
  if (token == ES_NONE) return es_check_name("session", session, err);
  int rc = es_store_lease_release(e->s, session, e->holder, token, released, err);
  if (rc) return rc;
  pthread_mutex_lock(&e->lease_mu);
  drop_lease(e, session);
  pthread_mutex_unlock(&e->lease_mu);
  return ES_OK;
}

void es_engine_renew_leases(es_engine *e, int64_t now_ms) {
  for (;;) {
    /* One due lease at a time, renewed outside the lock (a store call). */
    pthread_mutex_lock(&e->lease_mu);
    engine_lease *due = NULL;
    for (size_t i = 0; i < e->n_leases && !due; i++) {
      int64_t every = e->leases[i].ttl_ms / 3 > 10 ? e->leases[i].ttl_ms / 3 : 10;
      if (now_ms - e->leases[i].renewed_ms >= every) due = &e->leases[i];
    }
    char *session = due ? strdup(due->session) : NULL;
    int64_t ttl = due ? due->ttl_ms : 0;
    if (due) due->renewed_ms = now_ms; /* a failed renewal is tried again a period later */
    pthread_mutex_unlock(&e->lease_mu);
    if (!session) return;
    es_lease got;
    es_err err = {0};
    int rc = es_store_lease(e->s, session, e->holder, ttl, &got, &err);
    if (rc == ES_OK && got.acquired) {
      pthread_mutex_lock(&e->lease_mu);
      engine_lease *l = find_lease(e, session);
      if (l) l->token = got.token; /* a new one if it lapsed and was free */
      pthread_mutex_unlock(&e->lease_mu);
      /* engine:release ran while this renewal was in the store: give back
       * what the renewal took, or others would see it held until it expires. */
      int released;
      es_err ignored = {0};
      if (!l) es_store_lease_release(e->s, session, e->holder, got.token, &released, &ignored);
    } else if (rc == ES_OK) {
      es_engine_fenced_out(e, session);
    } else {
      es_engine_log(e, 0, "renewing the lease of session '%s' failed: %s", session, err.msg);
    }
    if (rc == ES_OK) es_lease_destroy(&got);
    free(session);
  }
}

void es_engine_leases_free(es_engine *e) {
  for (size_t i = 0; i < e->n_leases; i++) free(e->leases[i].session);
  free(e->leases);
  es_engine_skip_free(e->fenced, e->n_fenced);
  e->leases = NULL;
  e->fenced = NULL;
  e->n_leases = e->n_fenced = 0;
}
