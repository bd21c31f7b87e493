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
 * Every commit still bumps the handle's version (es_store_version's
 * subscribers poll it). Keys are few (one per tenant
 * or session with a wait), so a commit compares each touched name with
 * each key.
 *
 * Other processes' commits: a backend that tells them from its own
 * (ext_version: postgres by the NOTIFY's sender, sqlite by the write
 * connection's data_version) gets one thread per handle (ext_watch),
 * while it has waits, that wakes every wait when one comes: it blocks in
 * wait_change (postgres: LISTEN/NOTIFY; kicked when the last wait ends)
 * or looks every WAIT_POLL_MS (sqlite). The waits themselves never block
 * in the backend nor poll it, so this handle's own commits wake only the
 * waits they concern, and an idle wait costs nothing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/internal.h"
#include "store/rules.h"

#define TOUCH_MAX 16 /* distinct sessions a transaction names before it wakes every wait */

static void ext_idle(es_store *s);

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

/* Wakes key k (vmu held). */
static void wake(wait_key *k) {
  k->seq++;
  pthread_cond_broadcast(&k->cond);
}

/* touched: 1 when the write transaction that committed recorded what it
 * touched (wmu is still held, so no other transaction adds to it); 0 for
 * a commit that added or dropped no event (claims: none is woken) and -1
 * for one that wakes every wait (close). */
void es_core_notify_commit(es_store *s, int touched) {
  pthread_mutex_lock(&s->vmu);
  atomic_fetch_add(&s->version, 1);
  for (wait_key *k = s->wkeys; k && touched; k = k->next)
    if (touched < 0 || wakes(s, k)) wake(k);
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
  int last = 0;
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
    last = s->wkeys == NULL;
  }
  pthread_mutex_unlock(&s->vmu);
  if (last) ext_idle(s);
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

/* Another process committed (or the backend failed: the waits read again
 * and meet the failure themselves): every wait looks again. */
static void wake_all(es_store *s) {
  pthread_mutex_lock(&s->vmu);
  for (wait_key *k = s->wkeys; k; k = k->next) wake(k);
  pthread_mutex_unlock(&s->vmu);
}

/* The thread of es_core_ext_start: while waits exist and the handle is
 * open, blocks in wait_change (close's wake() and the last wait's kick()
 * end it at once) or sleeps WAIT_POLL_MS, and wakes every wait when
 * ext_version moved. */
static void *ext_watch(void *arg) {
  es_store *s = arg;
  uint64_t since = s->ext_since;
  /* Named for top -H and /proc/PID/task/TID/comm: its cost is the other
   * commits' (one look per commit on PostgreSQL), not its waiters'. */
  pthread_setname_np(pthread_self(), "es-watch");
  for (;;) {
    /* no wait left: end (emu held across the look and the state, so a
     * wait that comes meanwhile sees the thread ended and starts one) */
    pthread_mutex_lock(&s->emu);
    pthread_mutex_lock(&s->vmu);
    int idle = s->wkeys == NULL;
    pthread_mutex_unlock(&s->vmu);
    if (idle) s->ext_state = EXT_ENDED;
    pthread_mutex_unlock(&s->emu);
    if (idle) break;
    es_err err = {0};
    if (es_core_enter(s, &err) != ES_OK) break; /* closed: close joins */
    uint64_t v = since;
    int rc = s->ops->wait_change ? s->ops->wait_change(s->bk, since, 1000, &err) : ES_OK;
    if (rc == ES_OK) rc = s->ops->ext_version(s->bk, &v, &err);
    es_core_leave(s);
    if (rc == ES_OK && v != since) {
      since = v;
      wake_all(s);
      es_presence_ext_change(s); /* presence_ext.c: their presence writes */
    } else if (rc != ES_OK || !s->ops->wait_change) {
      if (rc != ES_OK) wake_all(s);
      /* the next look (polled), or not a busy loop while it fails */
      struct timespec pause = {0, WAIT_POLL_MS * 1000000L};
      nanosleep(&pause, NULL);
    }
  }
  return NULL;
}

int es_core_ext_start(es_store *s, es_err *err) {
  /* entered: close waits for this call before it joins the thread */
  int rc = es_core_enter(s, err);
  if (rc) return rc;
  pthread_mutex_lock(&s->emu);
  if (s->ext_state == EXT_ENDED) {
    pthread_join(s->ext_thread, NULL);
    s->ext_state = EXT_NONE;
  }
  if (s->ext_state == EXT_NONE) {
    /* the version is taken before the wait's first read: a commit after
     * it wakes that wait */
    rc = s->ops->ext_version(s->bk, &s->ext_since, err);
    if (rc == ES_OK && pthread_create(&s->ext_thread, NULL, ext_watch, s) != 0)
      rc = es_fail(err, ES_STORAGE, "cannot start the thread that watches other processes' commits");
    if (rc == ES_OK) s->ext_state = EXT_RUNNING;
  }
  pthread_mutex_unlock(&s->emu);
  es_core_leave(s);
  return rc;
}

void es_core_ext_stop(es_store *s) {
  pthread_mutex_lock(&s->emu);
  int state = s->ext_state;
  s->ext_state = EXT_NONE;
  pthread_mutex_unlock(&s->emu);
  /* not under emu: the thread takes it before it ends */
  if (state != EXT_NONE) pthread_join(s->ext_thread, NULL);
}

/* The last wait gave its key back: the thread blocked in wait_change for
 * it returns now and ends. */
static void ext_idle(es_store *s) {
  es_err err = {0};
  if (!s->ops->kick || es_core_enter(s, &err) != ES_OK) return;
  s->ops->kick(s->bk);
  es_core_leave(s);
}
