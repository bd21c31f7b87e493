/*
 * wakes.c: who a commit wakes (internal.h es_core_touch, es_core_wait_key_*,
 * es_core_notify_commit).
 *
 * A wait (es_store_wait, the live tails of `eventstore serve`) sleeps
 * until something it could read was committed. It used to sleep on one
 * condition of the handle that every commit broadcast, and read again
 * after each: a tail of a tenant with no events woke for every other
 * tenant's commit and read again (issue 24: 20 idle tails of an empty
 * tenant took 1.5 cores while another tenant wrote). Now:
 *   - a write transaction records the sessions whose events it adds or
 *     drops (es_core_touch; up to TOUCH_MAX of them, more, or a write that
 *     cannot say which, wakes every wait);
 *   - a wait sleeps on a key (its session, its scope, or "" for every
 *     session), one condition per distinct key with a count of waits on it;
 *   - a commit wakes the keys that are a prefix of a session it touched
 *     ("" is a prefix of every name, a tenant's scope of each of its
 *     sessions), and only those: a tenant's tail sleeps through another
 *     tenant's commits.
 * Every commit still bumps the handle's version and broadcasts vcond
 * (es_store_version's subscribers poll it). Keys are few (one per tenant
 * or session with a wait), so a commit compares each touched name with
 * each key.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/internal.h"

#define TOUCH_MAX 16 /* distinct sessions a transaction names before it wakes every wait */

struct wait_key {
  char *key; /* owned */
  size_t len;
  int refs;      /* waits sleeping on it (under vmu) */
  uint64_t seq;  /* bumped by each commit that wakes it (under vmu) */
  pthread_cond_t cond;
  wait_key *next;
};

void es_core_touch(es_store *s, const char *session) {
  if (s->touched_all) return;
  if (!session) {
    s->touched_all = 1;
    return;
  }
  for (size_t i = 0; i < s->ntouched; i++)
    if (strcmp(s->touched[i], session) == 0) return;
  if (!s->touched && !(s->touched = malloc(TOUCH_MAX * sizeof *s->touched))) {
    s->touched_all = 1; /* out of memory: wake everyone rather than miss one */
    return;
  }
  size_t n = strlen(session);
  if (s->ntouched == TOUCH_MAX || n > ES_MAX_NAME_BYTES) {
    s->touched_all = 1;
    return;
  }
  memcpy(s->touched[s->ntouched++], session, n + 1);
}

/* Whether the touched sessions wake key k (vmu held). */
static int wakes(const es_store *s, const wait_key *k) {
  if (s->touched_all) return 1;
  for (size_t i = 0; i < s->ntouched; i++)
    if (strncmp(s->touched[i], k->key, k->len) == 0) return 1;
  return 0;
}

/* touched: 1 when the write transaction that committed recorded what it
 * touched (wmu is still held, so no other transaction adds to it); 0 for
 * a commit that added or dropped no event (claims: none is woken) and -1
 * for one that wakes every wait (close). */
void es_core_notify_commit(es_store *s, int touched) {
  pthread_mutex_lock(&s->vmu);
  atomic_fetch_add(&s->version, 1);
  pthread_cond_broadcast(&s->vcond);
  for (wait_key *k = s->wkeys; k && touched; k = k->next) {
    if (touched < 0 || wakes(s, k)) {
      k->seq++;
      pthread_cond_broadcast(&k->cond);
    }
  }
  pthread_mutex_unlock(&s->vmu);
  if (touched > 0) es_core_touch_clear(s);
}

void es_core_touch_clear(es_store *s) {
  s->ntouched = 0;
  s->touched_all = 0;
}

wait_key *es_core_wait_key_get(es_store *s, const char *key) {
  pthread_mutex_lock(&s->vmu);
  wait_key *k = s->wkeys;
  while (k && strcmp(k->key, key) != 0) k = k->next;
  if (!k && (k = calloc(1, sizeof *k)) != NULL) {
    if (!(k->key = strdup(key))) {
      free(k);
      k = NULL;
    } else {
      pthread_condattr_t ca;
      pthread_condattr_init(&ca);
      pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
      pthread_cond_init(&k->cond, &ca);
      pthread_condattr_destroy(&ca);
      k->len = strlen(key);
      k->next = s->wkeys;
      s->wkeys = k;
    }
  }
  if (k) k->refs++;
  pthread_mutex_unlock(&s->vmu);
  return k;
}

void es_core_wait_key_put(es_store *s, wait_key *k) {
  pthread_mutex_lock(&s->vmu);
  if (--k->refs == 0) {
    for (wait_key **p = &s->wkeys; *p; p = &(*p)->next) {
      if (*p == k) {
        *p = k->next;
        break;
      }
    }
    pthread_cond_destroy(&k->cond);
    free(k->key);
    free(k);
  }
  pthread_mutex_unlock(&s->vmu);
}

uint64_t es_core_wait_key_seq(es_store *s, wait_key *k) {
  pthread_mutex_lock(&s->vmu);
  uint64_t v = k->seq;
  pthread_mutex_unlock(&s->vmu);
  return v;
}

int es_core_wait_key_sleep(es_store *s, wait_key *k, uint64_t seen,
                           const struct timespec *until) {
  pthread_mutex_lock(&s->vmu);
  while (k->seq == seen) {
    if (pthread_cond_clockwait(&k->cond, &s->vmu, CLOCK_MONOTONIC, until) != 0) break;
  }
  int woken = k->seq != seen;
  pthread_mutex_unlock(&s->vmu);
  return woken;
}
