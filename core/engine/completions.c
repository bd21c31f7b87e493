/*
 * engine/completions.c: handing completions over from the workers to the
 * completer thread, which writes them in batches (complete_many) and
 * renews the claims of those still waiting. See engine.c's top comment
 * for the engine as a whole.
 */
#include "engine/engine.h"

#include <lua.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"
#include "util/clock.h"

/* ---------------------------------------------------------------------- */
/* Completions
 *
 * A worker does not wait for its completion's commit before it runs the
 * next handler: it fixes the ids of the returned events (so a completion
 * tried again is idempotent), copies them, and hands the completion to the
 * completer thread, which commits every completion waiting at that moment
 * in one transaction (es_store_complete_many; on SQLite one sync for all
 * of them, from every worker). An event counts as handled only once its
 * completion is answered. A completion that fails is handled as a worker
 * handled it before: STORAGE is tried again with the same attempt and ids
 * (outage_ms), a lease re-taken meanwhile is tried with its new token,
 * STALE_FENCE fences the session out, any other error fails the attempt.
 * The list is bounded (COMPLETE_BACKLOG): workers wait when the store
 * falls that far behind.
 *
 * Naps. A completer that finds the list empty after a cheap batch waits
 * NAP_US before it sleeps, and a worker handing over meanwhile does not
 * wake it: what is handed over during the nap is taken when it ends. On
 * memory: a completion costs less than a handler call, so the completer
 * used to empty the list after one or two completions and sleep, and
 * every other hand-over woke it: a futex call and a context switch per
 * event or two, with one worker a third of the dispatch rate
 * (bench/README.md "Completions in naps"). What stays prompt: a nap ends
 * at once when NAP_FULL completions wait, when a worker hands over the
 * last event it had queued with no claim under way (awaited: what it
 * claims next may wait on it, the next of a lane, an until_idle run's
 * end), or when a worker
 * finds its queue empty (es_completer_kick); after a nap that found
 * nothing the completer sleeps until the next hand-over wakes it. No nap
 * after a batch that took NAP_US / 2 or more (a sync, a round trip:
 * hand-overs gather meanwhile), nor after a lone awaited completion (one
 * lane run in turn: a nap would only add a timer per event). So a
 * completion waits at most NAP_US longer than before, and only while its
 * worker still has events to run.
 *
 * Awaited completions. Where a completion is cheap (the completer's last
 * batch took under NAP_US / 2: memory:), an awaited one (its worker has
 * nothing queued and no claim is under way, so what it claims next may
 * depend on it) is written by the worker itself, through the same
 * complete_batch: handing it over would cost two wake-ups (the
 * completer's, then the worker's on c_done) for a write of a few
 * microseconds. One lane run in turn went from ~36,000 to ~116,000
 * events a second on memory: (bench/README.md "Awaited completions").
 * Where batches take longer (a sync; a round trip, unless the server is
 * fast and near), the hand-over stays: the completer shares one commit
 * among workers. The rule is the measured time, not the backend. */
#define NAP_US 500
#define NAP_FULL COMPLETE_MIN

/* Completions per transaction: enough to share one sync (and the pages a
 * commit writes) among many, few enough that one commit stays short
 * beside a claim's TTL. What a completion costs differs by two orders of
 * magnitude between backends (tens of microseconds on SQLite, a
 * millisecond or two on a busy PostgreSQL), so the completer sizes its
 * batches from the time its commits took: as many completions as fit in
 * COMPLETE_COMMIT_US at the running mean cost of one, never fewer than
 * COMPLETE_MIN (what every backend took before) nor more than
 * COMPLETE_MAX. */
#define COMPLETE_MIN 64
#define COMPLETE_MAX 2048
#define COMPLETE_COMMIT_US 25000
#define COMPLETE_BACKLOG 4096 /* completions waiting before workers wait too: two claims' worth */

static size_t str_room(const char *s) { return s ? strlen(s) + 1 : 0; }

static const char *str_put(char **at, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  memcpy(*at, s, n);
  const char *out = *at;
  *at += n;
  return out;
}

/* A completion owning copies of the claim's names and of the n returned
 * events (NULL: out of memory). */
static completion *completion_new(int worker, const claim_info *c, const es_new_event *evs,
                                  size_t n, const es_cancel *cancel, size_t n_cancel) {
  size_t room = sizeof(completion) + n * sizeof(es_new_event) + n_cancel * sizeof(es_cancel) +
                str_room(c->session) + str_room(c->type);
  for (size_t i = 0; i < n_cancel; i++) room += str_room(cancel[i].reason);
  for (size_t i = 0; i < n; i++)
    room += str_room(evs[i].id) + str_room(evs[i].type) + str_room(evs[i].lane) +
            str_room(evs[i].key) + (evs[i].payload ? evs[i].payload_len + 1 : 0) +
            (evs[i].meta ? evs[i].meta_len + 1 : 0);
  completion *p = malloc(room);
  if (!p) return NULL;
  memset(p, 0, sizeof *p);
  p->worker = worker;
  p->c = *c;
  p->n = n;
  p->evs = n ? (es_new_event *)(p + 1) : NULL;
  p->n_cancel = n_cancel;
  p->cancel = n_cancel ? (es_cancel *)((char *)(p + 1) + n * sizeof(es_new_event)) : NULL;
  char *at = (char *)(p + 1) + n * sizeof(es_new_event) + n_cancel * sizeof(es_cancel);
  for (size_t i = 0; i < n_cancel; i++) {
    p->cancel[i] = cancel[i];
    p->cancel[i].reason = str_put(&at, cancel[i].reason);
  }
  p->c.session = str_put(&at, c->session);
  p->c.type = str_put(&at, c->type);
  for (size_t i = 0; i < n; i++) {
    es_new_event *d = &p->evs[i];
    *d = evs[i];
    d->id = str_put(&at, evs[i].id);
    d->type = str_put(&at, evs[i].type);
    d->lane = str_put(&at, evs[i].lane);
    d->key = str_put(&at, evs[i].key);
    if (evs[i].payload) {
      memcpy(at, evs[i].payload, evs[i].payload_len);
      at[evs[i].payload_len] = '\0';
      d->payload = at;
      at += evs[i].payload_len + 1;
    }
    if (evs[i].meta) { /* §3.1, §4: the correlation the worker added */
      memcpy(at, evs[i].meta, evs[i].meta_len);
      at[evs[i].meta_len] = '\0';
      d->meta = at;
      at += evs[i].meta_len + 1;
    }
  }
  return p;
}

static void complete_batch(es_engine *e, completion **items, es_completion *v, size_t n);
static void acked(es_engine *e, size_t n);

/* Hands the completion of a handled job to the completer (or writes it
 * now: "Awaited completions"): types the engine has no handler for are
 * stored processed (docs/contract.md §4: facts nobody here handles must
 * not sit pending; the set is at most a second old, as the loader's
 * view), ids are fixed, the events copied. A failure here fails the job. */
void es_hand_over(job *j, const claim_info *c) {
  es_engine *e = j->r->e;
  es_err err = {0};
  char (*ids)[ES_MAX_ID_BYTES + 1] = NULL;
  if (j->n) {
    if (!(ids = calloc(j->n, sizeof *ids))) {
      es_job_error(j, "out of memory");
      return;
    }
    es_type_set *ts = es_handlers_get(e); /* not the claimed types (§7: those add upcasters') */
    for (size_t i = 0; i < j->n; i++)
      if (!j->evs[i].settled && !es_type_set_has(ts, j->evs[i].type)) j->evs[i].settled = 1;
    es_type_set_release(ts);
    for (size_t i = 0; i < j->n; i++) {
      if (j->evs[i].id) continue;
      if (es_store_new_id(e->s, ids[i], &err)) {
        es_job_error(j, err.msg);
        free(ids);
        return;
      }
      j->evs[i].id = ids[i];
    }
  }
  completion *p = completion_new(j->r->id, c, j->evs, j->n, j->cancel, j->n_cancel);
  free(ids);
  if (!p) {
    es_job_error(j, "out of memory");
    return;
  }
  pthread_mutex_lock(&j->r->mu);
  p->renewed_ms = j->r->renewed_ms; /* the keeper renews it while it waits (es_renew_waiting) */
  pthread_mutex_unlock(&j->r->mu);
  p->handed_ms = j->done_ms;
  p->awaited = j->last;
  if (p->awaited && atomic_load(&e->c_cheap) && !e->inline_now) {
    /* Awaited, and a completion is cheap here (memory:): written now, on
     * this thread, rather than handed over to a completer that must be
     * woken to write it and then wake this worker ("Awaited
     * completions"). */
    atomic_fetch_add(&e->unacked, 1);
    es_completion v;
    complete_batch(e, &p, &v, 1);
    acked(e, 1);
    return;
  }
  pthread_mutex_lock(&e->c_mu);
  while (e->c_n >= COMPLETE_BACKLOG && !e->c_quit) pthread_cond_wait(&e->c_done, &e->c_mu);
  atomic_fetch_add(&e->unacked, 1);
  if (e->c_tail) e->c_tail->next = p;
  else e->c_head = p;
  e->c_tail = p;
  /* the completer waits only on an empty list; a nap ends by itself
   * ("Naps"), or here once NAP_FULL wait or this completion is awaited
   * (what the worker claims next may wait on it) */
  size_t was = e->c_n++;
  if (e->c_napping ? e->c_n >= NAP_FULL || p->awaited : was == 0) {
    e->c_napping = 0;
    pthread_cond_signal(&e->c_cond);
  }
  pthread_mutex_unlock(&e->c_mu);
}

/* A worker out of queued events: a napping completer takes what waits
 * now ("Naps"), since what the worker claims next may wait on it. */
void es_completer_kick(es_engine *e) {
  pthread_mutex_lock(&e->c_mu);
  if (e->c_napping && e->c_head) {
    e->c_napping = 0;
    pthread_cond_signal(&e->c_cond);
  }
  pthread_mutex_unlock(&e->c_mu);
}

/* Completes items[0..n) (their ids fixed), trying again as the section
 * comment says; frees each item once it is answered or given up. */
static void complete_batch(es_engine *e, completion **items, es_completion *v, size_t n) {
  store_retry retry = {0, STORE_WAIT_FIRST_MS};
  int fence_tries[COMPLETE_MAX] = {0};
  for (size_t i = 0; i < n; i++) {
    completion *p = items[i];
    v[i] = (es_completion){.session = p->c.session, .index = p->c.index, .attempt = p->c.attempt,
                           .evs = p->evs, .n = p->n, .cancel = p->cancel, .n_cancel = p->n_cancel};
  }
  while (n > 0) {
    /* Fenced out (the keeper found another holder, or another completion
     * was refused), the engine holds no token any more: an unfenced
     * completion now would land in a session another holder owns. */
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
      completion *p = items[i];
      v[i].fence = es_engine_fence_of(e, v[i].session);
      if (v[i].fence != ES_NONE || !es_engine_is_fenced(e, v[i].session)) {
        items[live] = p;
        v[live] = v[i];
        fence_tries[live] = fence_tries[i];
        live++;
        continue;
      }
      char msg[ES_ERRMSG_MAX + 64];
      snprintf(msg, sizeof msg,
               "completing failed: STALE_FENCE: this engine was fenced out of session '%s' "
               "(another holder took its lease)", p->c.session);
      es_record_failure(e, p->worker, &p->c, msg, 0, 1);
      free(p);
    }
    n = live;
    if (n == 0) break;
    es_err err = {0};
    es_store_complete_many(e->s, v, n, &err);
    size_t keep = 0;
    int storage = 0;
    es_err storage_err = {0};
    for (size_t i = 0; i < n; i++) {
      completion *p = items[i];
      int rc = v[i].rc;
      int again = 0;
      if (rc == ES_STALE_FENCE && v[i].fence != ES_NONE) {
        int64_t now_fence = es_engine_fence_of(e, p->c.session);
        /* the keeper re-took a lapsed lease meanwhile: a new token, still ours */
        again = now_fence != v[i].fence && now_fence != ES_NONE && ++fence_tries[i] < FENCE_TRIES;
      }
      if (!again && rc == ES_STALE_FENCE) es_engine_fenced_out(e, p->c.session);
      if (rc == ES_STORAGE) {
        /* again with the same ids: harmless if the failed try committed */
        again = 1;
        storage = 1;
        storage_err = v[i].err;
      }
      if (again) {
        items[keep] = p;
        v[keep] = v[i];
        fence_tries[keep] = fence_tries[i];
        keep++;
        continue;
      }
      if (rc == ES_OK) {
        es_store_answered(e, p->worker);
        if (v[i].outcome == ES_SUPERSEDED)
          es_engine_log(e, p->worker, "%s #%lld: attempt %lld was superseded; its result is dropped",
                        p->c.session, (long long)p->c.index, (long long)p->c.attempt);
        else {
          atomic_fetch_add(&e->handled, 1);
          es_type_stats_count(&e->tstats, p->c.type, ES_TYPE_HANDLED); /* §3.12 */
        }
      } else {
        char msg[ES_ERRMSG_MAX + 64];
        snprintf(msg, sizeof msg, "completing failed: %s: %s", es_strerror(rc), v[i].err.msg);
        es_record_failure(e, p->worker, &p->c, msg, 0, 1);
      }
      free(p);
    }
    n = keep;
    if (n == 0 || !storage) continue;
    es_store_failed(e, items[0]->worker, &retry, "completing", ES_STORAGE, &storage_err);
    if (es_store_retry_wait(e, &retry, e->o.outage_ms)) continue;
    /* Given up: the claims expire and the events are retried, nothing lost. */
    for (size_t i = 0; i < n; i++) {
      completion *p = items[i];
      es_engine_log(e, p->worker,
                    "%s #%lld: completing failed: %s: %s (tried for %lld ms); left for its claim "
                    "to expire",
                    p->c.session, (long long)p->c.index, es_strerror(v[i].rc), v[i].err.msg,
                    (long long)(es_mono_ms() - retry.first_ms));
      free(p);
    }
    n = 0;
  }
}

/* n completions are answered: what waits for that (es_wait_acked) looks
 * again. */
static void acked(es_engine *e, size_t n) {
  pthread_mutex_lock(&e->c_mu);
  atomic_fetch_sub(&e->unacked, (long long)n);
  pthread_cond_broadcast(&e->c_done);
  pthread_mutex_unlock(&e->c_mu);
}

/* How often a claim is renewed while its event is worked on (ttl/3). */
int64_t es_renew_every(const es_engine *e) {
  return e->o.ttl_ms / 3 > 10 ? e->o.ttl_ms / 3 : 10;
}

/* The keeper renews the claims of completions still waiting in the list
 * that were not renewed for es_renew_every: a handled event's claim must
 * outlast the wait for its completion's turn (a busy store), or another
 * engine takes the event again and this result is dropped as superseded.
 * (A completion whose claim ran out still lands while nobody has taken
 * the event since, so the completer itself does not renew.) What to renew
 * is copied under c_mu (the completer frees items once answered); the
 * renewals are made after, one call per run of one session's items. */
void es_renew_waiting(es_engine *e, int64_t now) {
  enum { MAX = 256 }; /* per keeper tick; the rest on the next one, 50 ms later */
  es_claim_ref refs[MAX];
  char *sessions[MAX];
  size_t n = 0;
  pthread_mutex_lock(&e->c_mu);
  for (completion *p = e->c_head; p && n < MAX; p = p->next) {
    if (now - p->renewed_ms < es_renew_every(e)) continue;
    if (!(sessions[n] = strdup(p->c.session))) break;
    refs[n++] = (es_claim_ref){p->c.index, p->c.attempt};
    p->renewed_ms = now;
  }
  pthread_mutex_unlock(&e->c_mu);
  for (size_t i = 0; i < n;) {
    size_t k = 1;
    while (i + k < n && strcmp(sessions[i + k], sessions[i]) == 0) k++;
    es_renew_result rr;
    es_err err = {0};
    if (es_store_renew(e->s, sessions[i], e->holder, refs + i, k, e->o.ttl_ms, ES_NONE, &rr,
                       &err) == ES_OK)
      es_renew_result_destroy(&rr);
    i += k;
  }
  for (size_t i = 0; i < n; i++) free(sessions[i]);
}

/* How many completions the next batch may hold, from the running mean
 * cost of one (us_each, microseconds; 0 while nothing is known). */
static size_t batch_limit(int64_t us_each) {
  if (us_each <= 0) return COMPLETE_MIN;
  int64_t k = COMPLETE_COMMIT_US / us_each;
  return k < COMPLETE_MIN ? COMPLETE_MIN : k > COMPLETE_MAX ? COMPLETE_MAX : (size_t)k;
}

/* The completer: takes every completion waiting (up to batch_limit) and
 * commits them together, until the run's end has drained the list. */
void *es_completer_main(void *arg) {
  es_engine *e = arg;
  completion *items[COMPLETE_MAX];
  es_completion *v = malloc(COMPLETE_MAX * sizeof *v);
  int64_t us_each = 0; /* running mean of a completion's share of its batch's time */
  int nap = 0; /* after this batch: nap before sleeping ("Naps") */
  pthread_mutex_lock(&e->c_mu);
  for (;;) {
    if (nap && !e->c_head && !e->c_quit) {
      struct timespec until = es_timespec_in_us(CLOCK_MONOTONIC, NAP_US);
      e->c_napping = 1;
      while (e->c_napping && !e->c_quit && pthread_cond_timedwait(&e->c_cond, &e->c_mu, &until) == 0) {
      }
      e->c_napping = 0;
    }
    while (!e->c_head && !e->c_quit) pthread_cond_wait(&e->c_cond, &e->c_mu);
    if (!e->c_head) break;
    size_t n = 0;
    /* out of memory for v: one at a time through the stack */
    es_completion one;
    size_t max = v ? batch_limit(us_each) : 1;
    while (e->c_head && n < max) {
      items[n++] = e->c_head;
      e->c_head = e->c_head->next;
    }
    if (!e->c_head) e->c_tail = NULL;
    e->c_n -= n;
    pthread_cond_broadcast(&e->c_done); /* room for workers waiting to hand over */
    e->c_busy_since = items[0]->handed_ms;
    /* After a lone completion its worker was waiting for, no nap: the
     * next will be awaited too (one lane, run in turn), and a nap would
     * only add a timer to each. (Read here: complete_batch frees items.) */
    nap = n > 1 || !items[0]->awaited;
    pthread_mutex_unlock(&e->c_mu);
    int64_t t0 = es_mono_us();
    complete_batch(e, items, v ? v : &one, n);
    int64_t took = es_mono_us() - t0;
    /* Nor after a batch that took half a nap or more (a sync, a round
     * trip): hand-overs gather while it runs, and a nap would only delay
     * the next. */
    if (took >= NAP_US / 2) nap = 0;
    atomic_store(&e->c_cheap, took < NAP_US / 2);
    int64_t each = took / (int64_t)n;
    if (each < 1) each = 1;
    us_each = us_each ? us_each + (each - us_each) / 4 : each;
    pthread_mutex_lock(&e->c_mu);
    e->c_busy_since = 0;
    atomic_fetch_sub(&e->unacked, (long long)n);
    pthread_cond_broadcast(&e->c_done);
  }
  pthread_mutex_unlock(&e->c_mu);
  free(v);
  return NULL;
}

void es_complete_waiting(es_engine *e) {
  /* An inline run hands over one completion at a time: a few slots on the
   * stack are plenty (an es_completion carries an error message). */
  enum { AT_ONCE = 8 };
  completion *items[AT_ONCE];
  es_completion v[AT_ONCE];
  for (;;) {
    pthread_mutex_lock(&e->c_mu);
    size_t n = 0;
    while (e->c_head && n < AT_ONCE) {
      items[n++] = e->c_head;
      e->c_head = e->c_head->next;
    }
    if (!e->c_head) e->c_tail = NULL;
    e->c_n -= n;
    pthread_mutex_unlock(&e->c_mu);
    if (n == 0) return;
    complete_batch(e, items, v, n);
    atomic_fetch_sub(&e->unacked, (long long)n);
  }
}

/* Whether the completions are falling behind: the oldest one not yet
 * answered was handed over more than LAG_MS (or es_hold_ms / 2) ago. Workers
 * then run what they have queued but claim nothing more until the store
 * catches up: a handled event's claim must not run out while its
 * completion waits its turn, or another engine runs it again and this
 * result is dropped as superseded (a cascade once it starts: the re-run
 * adds to the very backlog that made the first one late). */
#define LAG_MS 250
int es_completions_lag(es_engine *e) {
  int64_t limit = es_hold_ms(e) / 2 < LAG_MS ? es_hold_ms(e) / 2 : LAG_MS;
  pthread_mutex_lock(&e->c_mu);
  int64_t oldest = e->c_busy_since;
  if (e->c_head && (!oldest || e->c_head->handed_ms < oldest)) oldest = e->c_head->handed_ms;
  pthread_mutex_unlock(&e->c_mu);
  return oldest && es_mono_ms() - oldest > limit;
}

/* Waits until the completer answered something or ms passed. */
void es_wait_acked(es_engine *e, int64_t ms) {
  struct timespec until = es_timespec_in(CLOCK_REALTIME, ms);
  pthread_mutex_lock(&e->c_mu);
  if (atomic_load(&e->unacked) > 0 && !atomic_load(&e->stopping))
    pthread_cond_timedwait(&e->c_done, &e->c_mu, &until);
  pthread_mutex_unlock(&e->c_mu);
}

