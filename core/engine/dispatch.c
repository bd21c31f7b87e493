/*
 * engine/dispatch.c: handling one event (the job: load the handler, call
 * it, convert what it returned, record a failure) and the loops around
 * it: the prefetch queue that claim_next fills, the workers that take
 * from it, and the keeper (claim renewal and the watchdog). What the
 * engine as a whole is, and how abandoning works: engine.c's top comment.
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
#include "bridge/common.h"
#include "bridge/events.h"
#include "codec/json_doc.h"

/* ---------------------------------------------------------------------- */
/* dispatch */

/* Attempts of ev that neither completed nor failed (the process died in
 * the handler, a worker was abandoned after it lost its claim) since the
 * last recorded failure or revive: they count toward max_failures, or a
 * handler that kills its process would be retried forever. */
int64_t es_lost_attempts(const es_event *ev) {
  int64_t ended = ev->last_failed_attempt == ES_NONE ? 0 : ev->last_failed_attempt;
  int64_t lost = ev->attempts - 1 - ended;
  return lost > 0 ? lost : 0;
}

/* The n-th retry waits between half and all of min(backoff * 2^(n-1), cap).
 * The point in that range comes from the event and its attempt, not from
 * the machine (docs/contract.md §4 "Deterministic scripts"): events that
 * failed together still spread their retries, and a replay (§9) sees each
 * retry at the virtual time it had live. */
static int64_t backoff_for(const es_engine *e, const claim_info *c, int64_t n) {
  int64_t base = e->o.backoff_ms;
  for (int64_t i = 1; i < n && base < e->o.backoff_cap_ms; i++) base *= 2;
  if (base > e->o.backoff_cap_ms) base = e->o.backoff_cap_ms;
  if (base <= 0) return 0;
  int64_t nums[2] = {c->index, c->attempt};
  uint64_t h = es_fnv1a(es_fnv1a(ES_FNV_BASIS, c->session, strlen(c->session)), nums, sizeof nums);
  int64_t half = base / 2;
  return half + (int64_t)((h >> 16) % (uint64_t)(base - half + 1));
}

/* Records a failed attempt (from the worker, or from the keeper for an
 * abandoned one). patient: ride out a store outage (a worker; the keeper,
 * the watchdog of every call, must not wait: its attempt's claim expires
 * and the attempt counts as lost). */
void es_record_failure(es_engine *e, int id, const claim_info *c, const char *error,
                       int retry_now, int patient) {
  int outcome = 0;
  int64_t failures = 0;
  es_err err = {0};
  /* Lost attempts count: the store dead-letters at max, so lower it by
   * them (never below this failure, which always counts). */
  int64_t max = e->o.max_failures - c->lost;
  if (max < c->failures + 1) max = c->failures + 1;
  int64_t wait = retry_now ? 0 : backoff_for(e, c, c->failures + c->lost + 1);
  store_retry retry = {0, STORE_WAIT_FIRST_MS};
  int rc;
  /* The same fail again is idempotent (the same outcome, counted once). */
  while ((rc = es_store_fail(e->s, c->session, c->index, c->attempt, error, max, wait, &outcome,
                             &failures, &err)) == ES_STORAGE && patient) {
    es_store_failed(e, id, &retry, "recording a failure", rc, &err);
    if (!es_store_retry_wait(e, &retry, e->o.outage_ms)) break;
  }
  if (rc == ES_OK) es_store_answered(e, id);
  const char *nl = strchr(error, '\n');
  int first = (int)(nl ? nl - error : (ptrdiff_t)strlen(error));
  if (rc) {
    es_engine_log(e, id, "%s #%lld: recording the failure failed: %s: %s", c->session,
                  (long long)c->index, es_strerror(rc), err.msg);
  } else if (outcome == ES_DEAD_LETTERED) {
    atomic_fetch_add(&e->dead, 1);
    es_type_stats_count(&e->tstats, c->type, ES_TYPE_DEAD); /* §3.12 */
    es_engine_log(e, id, "%s #%lld %s dead-lettered after %lld failures: %.*s", c->session,
                  (long long)c->index, c->type, (long long)(failures + c->lost), first, error);
  } else if (outcome == ES_FAILED) {
    atomic_fetch_add(&e->failed, 1);
    es_type_stats_count(&e->tstats, c->type, ES_TYPE_FAILED); /* §3.12 */
    /* One line per failed attempt (the traceback stays in last_error). */
    es_engine_log(e, id, "%s #%lld %s attempt %lld failed, retry in %lld ms: %.*s", c->session,
                  (long long)c->index, c->type, (long long)c->attempt, (long long)wait, first,
                  error);
  }
}

/* The current type set, with a reference for the caller (NULL: none). */
es_type_set *es_types_get(es_engine *e) { return es_type_set_get(&e->types_mu, &e->types); }

/* Replaces the claimed types with fresh, and the handler types with
 * handlers unless NULL (taking their references). */
static void types_set(es_engine *e, es_type_set *fresh, es_type_set *handlers) {
  pthread_mutex_lock(&e->types_mu);
  es_type_set *old = e->types, *old_handlers = handlers ? e->handlers : NULL;
  e->types = fresh;
  if (handlers) e->handlers = handlers;
  e->types_at = es_mono_ms();
  pthread_mutex_unlock(&e->types_mu);
  es_type_set_release(old);
  es_type_set_release(old_handlers);
}

es_type_set *es_handlers_get(es_engine *e) { return es_type_set_get(&e->types_mu, &e->handlers); }

/* Rescans scripts/handlers and scripts/upcasters (at a run's start, then
 * every second by the keeper), so a file added while the engine runs is
 * picked up. The engine claims the types it has a handler for and (§7)
 * the types with an upcaster file, whose chains may end at one, less
 * those found to end elsewhere this run (es_types_exclude). */
void es_types_refresh(es_engine *e) {
  es_err err = {0};
  es_type_set *handlers = es_type_set_scan(e->scripts, &err);
  if (!handlers) { /* keep the old set; say why once, not every second */
    if (!e->types_failing) es_engine_log(e, 0, "cannot rescan the handlers: %s", err.msg);
    e->types_failing = 1;
    return;
  }
  e->types_failing = 0;
  es_upcast_refresh(e, 1);
  pthread_mutex_lock(&e->up_mu);
  es_type_set *fresh = es_type_set_union(handlers, e->upcasters, e->elsewhere, e->n_elsewhere);
  pthread_mutex_unlock(&e->up_mu);
  if (fresh) types_set(e, fresh, handlers);
  else es_type_set_release(handlers);
}

/* §7: events of the stored type `type` were found to upcast to a type
 * with no handler here: this engine stops claiming the type for the rest
 * of the run (a chain ends where its steps say, which only running them
 * tells), leaving the events to an engine that has the handler. */
void es_types_exclude(es_engine *e, const char *type) {
  pthread_mutex_lock(&e->up_mu);
  int known = 0;
  for (size_t i = 0; i < e->n_elsewhere && !known; i++) known = strcmp(e->elsewhere[i], type) == 0;
  char *copy = known ? NULL : strdup(type);
  char **v = copy ? realloc(e->elsewhere, (e->n_elsewhere + 1) * sizeof *v) : NULL;
  if (v) {
    e->elsewhere = v;
    e->elsewhere[e->n_elsewhere++] = copy;
  } else {
    free(copy);
  }
  pthread_mutex_unlock(&e->up_mu);
  if (known) return;
  es_engine_log(e, 0, "events of type %s upcast to a type with no handler here: left to an engine "
                "that has one (scripts: %s)", type, e->scripts);
  es_type_set *cur = es_types_get(e);
  char *minus[1] = {(char *)type};
  es_type_set *fresh = es_type_set_union(cur, NULL, minus, 1);
  es_type_set_release(cur);
  if (fresh) types_set(e, fresh, NULL);
}

void es_job_error(job *j, const char *msg) {
  free(j->error);
  j->error = strdup(msg ? msg : "unknown error");
  j->result = RUN_FAILED;
}

/* §4: the correlation a handler's results carry: the handled event's
 * meta.correlation when it is a string (copied into buf, cap bytes), else
 * the event's own id (the first of a chain correlates as itself). */
static const char *correlation_of(const es_event *ev, char *buf, size_t cap) {
  const char *c = ev->id;
  es_json_doc *doc = NULL;
  es_err err = {0};
  if (ev->meta && es_json_doc_parse(ev->meta, strlen(ev->meta), &doc, &err) == ES_OK) {
    const es_jval *v = es_jval_get(es_json_doc_root(doc), "correlation");
    if (v && v->type == ES_JSTRING && v->len < cap && !memchr(v->str, '\0', v->len)) {
      memcpy(buf, v->str, v->len + 1);
      c = buf;
    }
  }
  es_json_doc_free(doc);
  return c;
}

/* Everything of one event that runs Lua, as one budgeted call: finding
 * and loading the handler, calling it, and converting what it returned
 * (metamethods included) and encoding the payloads (within the size
 * limit). Leaves the converted events on the stack, with what they borrow. */
static int run_job(lua_State *L) {
  job *j = lua_touserdata(L, 1);
  const es_event *ev = j->ev;
  es_engine *e = j->r->e;
  es_determinism_seed(j->r, ev);
  /* §7: the handler sees the event upcast, and is its upcast type's */
  es_upcast_begin(j->r);
  es_lua_push_event(L, ev, 1);
  es_upcast_event(L, j->r, -1);
  lua_getfield(L, -1, "type");
  size_t type_len;
  const char *type = lua_tolstring(L, -1, &type_len);
  es_loader_handler(j->r, type, type_len, j->start_ms);
  if (!lua_isnil(L, -2)) { /* the load error */
    lua_pushvalue(L, -2);
    return lua_error(L);
  }
  if (lua_isnil(L, -3)) {
    /* Its handler file went away between the scan and the claim, or (§7)
     * the chain ends at a type with no handler here: never settle work
     * this engine cannot do. */
    j->result = es_upcast_has(j->r, ev->type) ? RUN_ELSEWHERE : RUN_RELEASE;
    return 0;
  }
  lua_pop(L, 2);
  lua_remove(L, -2);  /* the type */
  lua_insert(L, -2);  /* the handler below the event */
  es_push_ctx(L, j->r, ev);
  lua_getfield(L, -2, "meta"); /* ctx.meta: the handled event's (§4), the same table */
  es_ctx_set_meta(L, -2);
  lua_pushvalue(L, -1);
  lua_insert(L, -4); /* a copy of ctx below the call: its cancels are read after */
  lua_call(L, 2, 1);
  es_ctx_cancels(L, -2, j);
  j->result = RUN_HANDLED;
  if (lua_isnil(L, -1)) return 0; /* nothing to append: no clock, no conversion */
  int64_t now;
  es_err err = {0};
  atomic_fetch_add(&j->r->b.trusted, 1);
  int rc = es_store_now(e->s, &now, &err);
  atomic_fetch_sub(&j->r->b.trusted, 1);
  if (rc) return es_lua_raise(L, &err);
  /* §4: each result's meta gets the chain's correlation and this event as
   * its causation, where the handler did not set them itself */
  char corr[ES_MAX_META_BYTES + 1];
  es_meta_defaults caused = {{"correlation", "causation"}, {correlation_of(ev, corr, sizeof corr), ev->id}, 2};
  j->evs = es_lua_check_events_meta(L, -1, 0, now, es_store_max_payload(e->s), &caused, &j->n);
  /* §7: what the engine writes without a revision is its type's current */
  for (size_t i = 0; i < j->n; i++)
    if (j->evs[i].revision == ES_NONE && es_upcast_has(j->r, j->evs[i].type))
      j->evs[i].revision = es_upcast_current_L(L, j->r, j->evs[i].type);
  return 3; /* the returned table (it holds the events' strings), the events, their payloads */
}

/* ---------------------------------------------------------------------- */
/* Prefetch
 *
 * One claim_next takes several ready events (up to claim_limit) into the
 * engine's queue, which every worker takes from, oldest first: a round
 * trip and a transaction for several events, and no worker hoards events
 * another one could run. Laned events stay in order without anything
 * here: only the oldest unprocessed event of a lane is ever ready, so two
 * of one lane are never claimed together; the next becomes ready when the
 * completion of the one before it is committed.
 *
 * No event waits long behind slow handlers: claim_limit sizes the batch
 * to what the workers get through in a small window (from the measured
 * handler time), and the keeper releases (es_store_release_claims) what
 * waited in the queue es_hold_ms (ttl_ms / 3, at most HOLD_MAX_MS), long
 * before its claim could expire, so another engine, or this one's next
 * free worker, takes it at once. A stop releases what is left. A released
 * attempt does not count as a failure nor as an attempt that never ended.
 *
 * A process that dies (kill -9, a handler crashing it) leaves its queued
 * events claimed until they expire, and each then counts as an attempt
 * that never finished (es_lost_attempts). So that a handler that kills its
 * process cannot drag the events it was claimed with to the dead-letter
 * queue, a claim that returns such an event keeps only the first of them
 * and releases the rest: an attempt after a lost one runs alone.
 *
 * Claims ahead. A worker that finds the queue empty claims for it, and
 * runs no handler meanwhile; with one worker, the claims were a sixth of
 * its time on memory: (bench/README.md "Claims ahead"). So a threaded run
 * has a prefetcher thread: the pop that takes the queue down to half the
 * last claim (pf_low) wakes it, and it claims the next batch on another
 * core while the workers run the rest. It claims only what a worker would
 * (the same types, skip list and size), never while completions lag nor
 * once the run is stopping, and what it claimed is released like any
 * prefetched event. Nor while a handler call takes a batch window or more
 * on average: behind such handlers a claim's own time hardly counts, and
 * an event claimed ahead would wait for a free worker while another
 * engine could have run it at once. A claim ahead that finds nothing or
 * fails holds the prefetcher until a worker's own claim finds work again
 * (errors are a worker's claim's to report and ride out). An attempt
 * after a lost one still runs alone: a claim ahead that returns one keeps
 * only it, as a worker's claim does, queued after the events claimed
 * before it (with one worker they end before it starts; with more, other
 * workers' events ran beside it before as well), and no claim ahead is
 * made while it is queued or running (lone_out). */

/* Events per claim at most. Each claim and each batch of completions is a
 * commit whose cost on SQLite is mostly the pages it touches (the rows,
 * the queue indexes, the session rows), which a bigger batch shares among
 * more events: with 8 workers and a trivial handler on sqlite:, 256
 * dispatched ~1.4x what 64 did (bench/README.md "Larger batches"), and
 * 1024 (with completions of up to 2048, completions.c) ~1.15x what 256
 * did; 2048 was slower again ("Batches of 1024"). What the handlers get
 * through in BATCH_WINDOW_US and claim_cap (halved by each release) keep
 * slow handlers' claims small. */
#define BATCH_MAX 1024
#define BATCH_WINDOW_US 20000  /* a claim takes what the handlers get through in this */
#define HOLD_MAX_MS 1000       /* queued longer than this (or ttl_ms / 3): released */
#define GC_EVERY 64            /* handled events between explicit collector steps */

int64_t es_hold_ms(const es_engine *e) {
  int64_t h = e->o.ttl_ms / 3;
  if (h > HOLD_MAX_MS) h = HOLD_MAX_MS;
  return h > 0 ? h : 1;
}

/* The time one claim's events are meant to keep the workers busy:
 * BATCH_WINDOW_US, or a quarter of es_hold_ms when that is shorter. */
static int64_t batch_window_us(const es_engine *e) {
  int64_t window = es_hold_ms(e) * 1000 / 4;
  return window > BATCH_WINDOW_US ? BATCH_WINDOW_US : window;
}

/* How many events to claim at once: as many as the workers handle in the
 * batch window, from the running mean of a handler call; 1 while nothing
 * is known. */
static int64_t claim_limit(es_engine *e) {
  int64_t us = atomic_load(&e->handler_us);
  if (us <= 0) return 1;
  int64_t k = batch_window_us(e) * e->n / us;
  /* what the handlers alone would allow; the store's pace sets the cap */
  int64_t cap = atomic_load(&e->claim_cap);
  if (cap < 1 || cap > BATCH_MAX) cap = BATCH_MAX;
  if (k > cap) k = cap;
  return k < 1 ? 1 : k;
}

static void note_handler_time(es_engine *e, int64_t us) {
  if (us < 1) us = 1;
  int64_t old = atomic_load(&e->handler_us);
  atomic_store(&e->handler_us, old <= 0 ? us : old + (us - old) / 8);
}

/* Releases the claims of evs[0..n) (not patient: a release that fails
 * leaves the claims to expire, as a crash would). */
static void release_events(es_engine *e, es_event **evs, size_t n) {
  es_claim_ref *refs = n ? malloc(n * sizeof *refs) : NULL;
  if (!refs) return;
  for (size_t i = 0; i < n; i++) {
    if (!evs[i]) continue;
    const char *session = evs[i]->session;
    size_t k = 0;
    for (size_t j = i; j < n; j++) {
      if (!evs[j] || strcmp(evs[j]->session, session) != 0) continue;
      refs[k++] = (es_claim_ref){evs[j]->index, evs[j]->attempts};
      if (j > i) evs[j] = NULL; /* done with it */
    }
    es_renew_result rr;
    es_err err = {0};
    if (es_store_release_claims(e->s, session, e->holder, refs, k, &rr, &err) == ES_OK)
      es_renew_result_destroy(&rr);
    else
      es_engine_log(e, 0, "releasing %zu prefetched event%s of %s failed: %s (left for their "
                    "claims to expire)", k, k == 1 ? "" : "s", session, err.msg);
  }
  free(refs);
}

/* Attempts that ended in the store since the run began: completed,
 * failed, dead-lettered. What a claim could not see ready may be ready once
 * this moves (the next event of a lane, a retry); pf_mark compares it. */
static long long settled_count(es_engine *e) {
  return atomic_load(&e->handled) + atomic_load(&e->failed) + atomic_load(&e->dead);
}

/* Whether a claim ahead would find nothing worth its write (under q_mu):
 * after a claim that took everything ready (pf_mark), until attempts have
 * ended since (what they made ready, the next events of lanes, is what it
 * would find), and once the queue is empty (nothing is left to overlap
 * with but the running handlers). With one lane run in turn a claim ahead
 * found nothing for every event, and while it ran the worker's completion
 * could not be awaited ("Awaited completions" in completions.c): 2-7x
 * slower (bench/README.md "No futile claims ahead"). */
static int ahead_futile(es_engine *e) {
  return e->pf_mark >= 0 && (e->q_n == 0 || settled_count(e) == e->pf_mark);
}

/* Takes the oldest queued event into *out; 0 when the queue is empty.
 * *last: it was the last one queued, and no claim is under way. Taking
 * the queue down to its
 * low-water mark wakes the prefetcher ("Claims ahead"), unless the event
 * taken is an attempt after a lost one, which runs alone. */
static int queue_pop(es_engine *e, queued_event *out, int *lone, int *last) {
  pthread_mutex_lock(&e->q_mu);
  int got = e->q_n > 0;
  *lone = 0;
  *last = 0;
  if (got) {
    *out = e->q[e->q_head];
    e->q_head = (e->q_head + 1) % e->q_cap;
    e->q_n--;
    *lone = es_lost_attempts(&out->ev) > 0;
    if (*lone)
      e->lone_out++; /* no claim ahead until it ends (lone_done) */
    else if (e->pf_on && !e->pf_want && !e->claiming && e->q_n <= e->pf_low && !ahead_futile(e)) {
      e->pf_want = 1;
      pthread_cond_signal(&e->pf_cond);
    }
    /* nothing more queued nor being claimed: what this worker runs next
     * may wait on this event's completion */
    *last = e->q_n == 0 && !e->claiming;
  }
  pthread_mutex_unlock(&e->q_mu);
  return got;
}

/* The worker is done with an event queue_pop took (lone: its *lone). */
static void lone_done(es_engine *e, int lone) {
  if (!lone) return;
  pthread_mutex_lock(&e->q_mu);
  e->lone_out--;
  pthread_mutex_unlock(&e->q_mu);
}

/* Whether an attempt after a lost one is queued or running (under q_mu):
 * no claim ahead may then put events beside it. The queue holds a claim
 * and a half at most, and the scan runs once per claim ahead. */
static int lone_attempt_out(es_engine *e) {
  if (e->lone_out > 0) return 1;
  for (size_t i = 0; i < e->q_n; i++)
    if (es_lost_attempts(&e->q[(e->q_head + i) % e->q_cap].ev) > 0) return 1;
  return 0;
}

/* Appends ev (moved in) to the queue, under q_mu. ES_STORAGE when out of memory. */
static int queue_push_locked(es_engine *e, es_event *ev, int64_t now) {
  if (e->q_n == e->q_cap) {
    size_t cap = e->q_cap ? e->q_cap * 2 : BATCH_MAX;
    queued_event *q = malloc(cap * sizeof *q);
    if (!q) return ES_STORAGE;
    for (size_t i = 0; i < e->q_n; i++) q[i] = e->q[(e->q_head + i) % e->q_cap];
    free(e->q);
    e->q = q;
    e->q_cap = cap;
    e->q_head = 0;
  }
  queued_event *slot = &e->q[(e->q_head + e->q_n) % e->q_cap];
  slot->ev = *ev;
  slot->claimed_ms = now;
  e->q_n++;
  return ES_OK;
}

/* A release of events taken off the queue (e->releasing) is done: a
 * worker's claim waiting for it looks at the store again. */
static void released_done(es_engine *e) {
  pthread_mutex_lock(&e->q_mu);
  e->releasing--;
  pthread_cond_broadcast(&e->q_cond);
  pthread_mutex_unlock(&e->q_mu);
}

/* Takes out of the queue (under q_mu) and releases every event claimed
 * before cutoff (INT64_MAX: all of them). */
void es_queue_release_before(es_engine *e, int64_t cutoff) {
  es_event *evs = NULL;
  size_t n = 0;
  pthread_mutex_lock(&e->q_mu);
  /* oldest first: the ones to release are at the head */
  while (n < e->q_n && e->q[(e->q_head + n) % e->q_cap].claimed_ms < cutoff) n++;
  if (n && (evs = malloc(n * sizeof *evs))) {
    for (size_t i = 0; i < n; i++) evs[i] = e->q[(e->q_head + i) % e->q_cap].ev;
    e->q_head = (e->q_head + n) % e->q_cap;
    e->q_n -= n;
    e->releasing++; /* until the store has them back (released_done) */
  } else {
    n = 0;
  }
  pthread_mutex_unlock(&e->q_mu);
  if (!n) return;
  /* Claimed more than got run in time (the handlers or the completions
   * are slower than the claim size assumed): claim less. Each release is
   * a write, and a churn of claims and releases is all cost. */
  int64_t cap = atomic_load(&e->claim_cap);
  if (cap < 1 || cap > BATCH_MAX) cap = BATCH_MAX; /* 0: never set */
  atomic_store(&e->claim_cap, cap > 1 ? cap / 2 : 1);
  es_event **ptrs = malloc(n * sizeof *ptrs);
  for (size_t i = 0; ptrs && i < n; i++) ptrs[i] = &evs[i];
  if (ptrs) release_events(e, ptrs, n);
  free(ptrs);
  for (size_t i = 0; i < n; i++) es_event_destroy(&evs[i]);
  free(evs);
  released_done(e);
}

/* Claims ready events into the queue: a worker's claim (ahead 0) when the
 * queue is empty, the prefetcher's (ahead 1) when it is down to pf_low.
 * ES_OK with *claimed the number claimed; *claimed = -1 when there was no
 * need (the queue has events) or another claim was under way (a worker's
 * then returns after it ended, or IDLE_POLL_MS; the prefetcher's at once):
 * the caller looks at the queue again. Otherwise the claim's error. */
static int claim_into_queue(es_engine *e, int ahead, int64_t *claimed, es_err *err) {
  *claimed = -1;
  pthread_mutex_lock(&e->q_mu);
  if (ahead ? !e->pf_on || e->claiming || e->releasing || e->q_n > e->pf_low || lone_attempt_out(e) ||
                  atomic_load(&e->handler_us) >= batch_window_us(e) || ahead_futile(e)
            : e->q_n > 0) {
    pthread_mutex_unlock(&e->q_mu);
    return ES_OK;
  }
  /* Another claim under way, or events on their way back to the store
   * (es_queue_release_before): a claim now could find nothing while they
   * are still ours, and an until_idle run would end with them pending.
   * Wait for either, then look at the queue again. */
  if (e->claiming || e->releasing) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += IDLE_POLL_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while ((e->claiming || e->releasing) && !atomic_load(&e->stopping) &&
           pthread_cond_timedwait(&e->q_cond, &e->q_mu, &until) == 0) {
    }
    pthread_mutex_unlock(&e->q_mu);
    return ES_OK;
  }
  e->claiming = 1;
  pthread_mutex_unlock(&e->q_mu);
  /* The queue ran low (empty, or down to pf_low for a claim ahead): claims
   * may grow again (by a quarter). */
  int64_t cap = atomic_load(&e->claim_cap);
  if (cap >= 1 && cap < BATCH_MAX) atomic_store(&e->claim_cap, cap + cap / 4 + 1);

  es_events got;
  int64_t retry_at = ES_NONE;
  /* Only the types this engine has handlers for: others stay pending for
   * an engine that has theirs (docs/contract.md §4). */
  static const char *const no_types[1] = {NULL}; /* types != NULL, n 0: claim nothing */
  es_type_set *ts = es_types_get(e);
  size_t n_skip;
  char **skip = es_engine_skip_list(e, &n_skip); /* sessions another holder owns */
  long long settled = settled_count(e);
  int64_t want = claim_limit(e);
  int rc = ts ? es_store_claim_next(e->s, e->holder, e->o.ttl_ms, want,
                                    ts->n ? (const char *const *)ts->v : no_types, ts->n,
                                    (const char *const *)skip, n_skip, &got, &retry_at, err)
              : es_fail(err, ES_STORAGE, "out of memory");
  es_engine_skip_free(skip, n_skip);
  es_type_set_release(ts);
  size_t keep = rc == ES_OK ? got.n : 0;
  if (keep > 1) {
    /* An attempt after a lost one runs alone (the section comment): from
     * a claim ahead, after the events still queued, and nothing is claimed
     * ahead behind it (lone_attempt_out). */
    size_t first = got.n;
    for (size_t i = 0; i < got.n && first == got.n; i++)
      if (es_lost_attempts(&got.v[i]) > 0) first = i;
    es_event **others = first < got.n ? malloc(got.n * sizeof *others) : NULL;
    if (others) {
      size_t k = 0;
      for (size_t i = 0; i < got.n; i++)
        if (i != first) others[k++] = &got.v[i];
      release_events(e, others, k);
      free(others);
      for (size_t i = 0; i < got.n; i++)
        if (i != first) es_event_destroy(&got.v[i]);
      got.v[0] = got.v[first];
      keep = 1;
    }
  }
  pthread_mutex_lock(&e->q_mu);
  int64_t now = es_mono_ms();
  size_t pushed = 0;
  for (; pushed < keep; pushed++)
    if (queue_push_locked(e, &got.v[pushed], now) != ES_OK) break;
  e->claiming = 0;
  e->pf_mark = rc == ES_OK && (int64_t)got.n < want ? settled : -1;
  /* A claim that found work sets the next low-water mark; a worker's
   * turns claims ahead on again. One ahead that found nothing or failed
   * holds them until a worker's claim finds work: each pop would
   * otherwise pay a claim that finds nothing. */
  if (pushed > 0) {
    e->pf_low = pushed / 2;
    if (!ahead) e->pf_on = e->pf_run;
  } else if (ahead) {
    e->pf_on = 0;
  }
  if (pushed < keep) e->releasing++;
  pthread_cond_broadcast(&e->q_cond);
  pthread_mutex_unlock(&e->q_mu);
  /* What did not fit (out of memory) is released, not held. */
  for (size_t i = pushed; i < keep; i++) {
    es_event *ev = &got.v[i];
    release_events(e, &ev, 1);
    es_event_destroy(ev);
  }
  if (pushed < keep) released_done(e);
  if (rc == ES_OK) free(got.v); /* the events themselves moved into the queue */
  if (rc == ES_OK && pushed > 1 && atomic_load(&e->sleeping) > 0) {
    pthread_mutex_lock(&e->mu); /* idle workers: work is here */
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->mu);
  }
  if (rc == ES_OK) *claimed = (int64_t)pushed;
  return rc;
}

/* Handles one claimed event. Returns 0, or 1 when the runner was
 * abandoned meanwhile (its thread must then only clean up). */
static int handle(runner *r, const es_event *ev, int64_t claimed_ms, int last) {
  es_engine *e = r->e;
  lua_State *L = r->L;
  job j = {.r = r, .ev = ev, .result = RUN_FAILED, .last = last};
  claim_info c = {ev->session, ev->type, ev->index, ev->attempts, ev->failures,
                  es_lost_attempts(ev)};
  if (c.failures + c.lost >= e->o.max_failures) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%lld earlier attempts never finished (the process running the handler died, was "
             "killed or called os.exit, or its worker was abandoned)",
             (long long)c.lost);
    es_record_failure(e, r->id, &c, msg, 1, 1); /* failures + lost >= max: dead-letters it */
    return 0;
  }
  pthread_mutex_lock(&r->mu);
  /* Borrowed from ev, which outlives the call: the keeper copies what it
   * keeps, under r->mu. */
  r->session = ev->session;
  r->type = ev->type;
  r->claim = c;
  /* The claim's age counts from when it was made, not from when this
   * worker took it off the queue: it may have waited there. */
  r->renewed_ms = claimed_ms;
  /* Two clock reads per event serve every time below (each read costs
   * about a percent of a trivial handler's dispatch). */
  int64_t t0 = es_mono_ns();
  j.start_ms = t0 / 1000000;
  es_watch_start(r, j.start_ms);
  pthread_mutex_unlock(&r->mu);

  lua_settop(L, 0);
  lua_pushcfunction(L, run_job);
  lua_pushlightuserdata(L, &j);
  uint64_t run_t0 = es_type_stats_begin(&e->tstats, (uint64_t)t0); /* §3.12 */
  int rc = es_budget_pcall(L, 1, 3);
  int64_t t1 = es_mono_ns();
  j.done_ms = t1 / 1000000;
  uint64_t run_ns = es_type_stats_end(&e->tstats, run_t0, (uint64_t)t1);
  if (rc != LUA_OK) es_job_error(&j, lua_tostring(L, -1));
  /* A collector a handler stopped runs again; and every GC_EVERY events
   * a step collects garbage within a watched window (a finalizer may
   * run). A step after every call cost more than the trivial handler's
   * whole dispatch, and the collector steps with allocations anyway. */
  if (!lua_gc(L, LUA_GCISRUNNING)) lua_gc(L, LUA_GCRESTART);
  if (++r->gc_due >= GC_EVERY) {
    r->gc_due = 0;
    lua_gc(L, LUA_GCSTEP, 0);
  }
  note_handler_time(e, (t1 - t0) / 1000);

  pthread_mutex_lock(&r->mu);
  int abandoned = r->abandoned;
  if (!abandoned) r->finishing = 1;
  pthread_mutex_unlock(&r->mu);
  if (abandoned) {
    free(j.error);
    free(j.cancel);
    return 1;
  }
  if (j.result == RUN_RELEASE)
    es_engine_log(e, r->id, "%s #%lld %s: its handler file is gone; left for its claim to expire",
                  ev->session, (long long)ev->index, ev->type);
  if (j.result == RUN_ELSEWHERE) { /* unrun: the release charges no attempt */
    es_event *mine = (es_event *)ev;
    release_events(e, &mine, 1);
    es_types_exclude(e, ev->type);
  }
  else if (j.result == RUN_HANDLED) es_hand_over(&j, &c);
  if (j.result == RUN_FAILED) {
    int stop = j.error && strstr(j.error, "interrupted: the engine is stopping") != NULL;
    es_record_failure(e, r->id, &c, j.error ? j.error : "unknown error", stop, 1);
  }
  if (run_t0 && j.result != RUN_RELEASE && j.result != RUN_ELSEWHERE)
    es_type_stats_run(&e->tstats, ev->type, run_ns, j.result == RUN_FAILED);
  free(j.error);
  free(j.cancel);
  lua_settop(L, 0);
  r->b.deadline_at = 0; /* an inline run's deadline was this call's */
  pthread_mutex_lock(&r->mu);
  r->busy = 0;
  r->finishing = 0;
  r->session = r->type = NULL;
  pthread_mutex_unlock(&r->mu);
  return 0;
}

/* CLOCK_MONOTONIC now + ms, for pthread_cond_clockwait. */
static struct timespec mono_in(int64_t ms) { return es_timespec_in(CLOCK_MONOTONIC, ms); }

void es_engine_sleep(es_engine *e, int64_t ms) {
  struct timespec until = mono_in(ms);
  pthread_mutex_lock(&e->mu);
  if (!atomic_load(&e->stopping)) pthread_cond_clockwait(&e->cond, &e->mu, CLOCK_MONOTONIC, &until);
  pthread_mutex_unlock(&e->mu);
}

/* Waits on run_cond for at most ms while *v is not `until`: the run's
 * thread for its last worker (running 0), the keeper for its quit. */
void es_run_wait(es_engine *e, int64_t ms, atomic_int *v, int until) {
  struct timespec t = mono_in(ms);
  pthread_mutex_lock(&e->mu);
  if (atomic_load(v) != until) pthread_cond_clockwait(&e->run_cond, &e->mu, CLOCK_MONOTONIC, &t);
  pthread_mutex_unlock(&e->mu);
}

/* One worker fewer in the run: its thread waits for the last one. */
static void run_left(es_engine *e) {
  pthread_mutex_lock(&e->mu);
  atomic_fetch_sub(&e->running, 1);
  pthread_cond_broadcast(&e->run_cond);
  pthread_mutex_unlock(&e->mu);
}

/* Ends the run: wakes idle workers and interrupts busy ones. */
void es_begin_stop(es_engine *e) {
  pthread_mutex_lock(&e->mu);
  int was = atomic_exchange(&e->stopping, 1);
  pthread_cond_broadcast(&e->cond);
  if (!was) {
    int64_t now = es_mono_ms();
    for (int i = 0; i < e->n; i++) {
      runner *r = e->slots[i];
      if (!r) continue;
      pthread_mutex_lock(&r->mu);
      if (r->busy && !r->finishing) {
        es_budget_trip(&r->b, ES_TRIP_STOP);
        if (!r->tripped_ms) r->tripped_ms = now;
      }
      pthread_mutex_unlock(&r->mu);
    }
  }
  pthread_mutex_unlock(&e->mu);
}

/* Keeps the first error that ends a run. */
static void run_error(es_engine *e, int code, const char *msg) {
  pthread_mutex_lock(&e->mu);
  if (!e->run_err.code) es_fail(&e->run_err, code, "%s", msg);
  pthread_mutex_unlock(&e->mu);
}

static void worker_exit(runner *r) {
  if (!r->abandoned) {
    run_left(r->e);
    return;
  }
  es_engine *e = r->e;
  es_runner_free_now(r);
  es_engine_unref(e);
}

/* internal.h orphans_until: a claim that failed with STORAGE may have been
 * committed; its claim ends within ttl_ms from now (the claim's own start
 * was earlier), and an expired claim is ready again. */
static void note_orphaned_claim(es_engine *e) {
  int64_t until = es_mono_ms() + e->o.ttl_ms + IDLE_POLL_MS;
  int64_t was = atomic_load(&e->orphans_until);
  while (was < until && !atomic_compare_exchange_weak(&e->orphans_until, &was, until)) {
  }
}

void *es_prefetcher_main(void *arg) {
  es_engine *e = arg;
  pthread_mutex_lock(&e->q_mu);
  while (!e->pf_quit) {
    if (!e->pf_want) {
      pthread_cond_wait(&e->pf_cond, &e->q_mu);
      continue;
    }
    e->pf_want = 0;
    pthread_mutex_unlock(&e->q_mu);
    if (!atomic_load(&e->stopping) && !es_completions_lag(e)) {
      int64_t claimed;
      es_err err = {0};
      /* a failed claim holds the prefetcher (claim_into_queue); one that
       * failed with STORAGE may have been committed all the same */
      if (claim_into_queue(e, 1, &claimed, &err) == ES_STORAGE) note_orphaned_claim(e);
    }
    pthread_mutex_lock(&e->q_mu);
  }
  pthread_mutex_unlock(&e->q_mu);
  return NULL;
}

void *es_worker_main(void *arg) {
  runner *r = arg;
  es_engine *e = r->e;
  pthread_mutex_lock(&r->mu); /* the keeper reads it under r->mu */
  r->has_cpu = pthread_getcpuclockid(pthread_self(), &r->cpu) == 0;
  pthread_mutex_unlock(&r->mu);
  store_retry retry = {0, IDLE_POLL_MS};
  /* Counted in e->busy from the moment it looks for work until it finds
   * none: between two events of a streak it is never seen idle. */
  int active = 0;
  while (!atomic_load(&e->stopping)) {
    if (e->inline_now) {
      es_inline_tick(e);
      if (atomic_load(&e->stopping)) break;
    }
    if (!active) {
      atomic_fetch_add(&e->busy, 1);
      active = 1;
    }
    queued_event q;
    int lone, last;
    if (queue_pop(e, &q, &lone, &last)) {
      /* Fenced out of its session since the claim: give the event back to
       * the lease's holder, unrun (the release undoes the attempt). This is
       * also what closes the race with a claim in flight: the completer
       * records the fence before the failure that makes the event ready
       * again, but a claim_next that took its skip list before the fence
       * can still claim it after that failure; such a claim ends after the
       * fence was recorded, so the event is caught here. */
      if (es_engine_is_fenced(e, q.ev.session)) {
        es_event *ev = &q.ev;
        release_events(e, &ev, 1);
        es_event_destroy(&q.ev);
        lone_done(e, lone);
        continue;
      }
      int gone = handle(r, &q.ev, q.claimed_ms, last);
      es_event_destroy(&q.ev);
      if (!gone) lone_done(e, lone); /* abandon() ended an abandoned one */
      /* Inline: the completion is written before the next claim, which may
       * then see what it made ready (the next of a lane, its results). */
      if (e->inline_now) es_complete_waiting(e);
      if (gone) {
        active = 0; /* abandon() took it out of e->busy: this run may be long over */
        break;
      }
      continue;
    }
    /* Read before the claim: completions answered after it may have made
     * events ready (the next of a lane) that the claim did not see. */
    int64_t unacked = atomic_load(&e->unacked);
    if (unacked > 0) es_completer_kick(e); /* they are to be written now, not after a nap */
    int64_t claimed;
    es_err err = {0};
    if (es_completions_lag(e)) {
      es_wait_acked(e, IDLE_POLL_MS);
      continue;
    }
    int rc = claim_into_queue(e, 0, &claimed, &err);
    if (rc == ES_OK && claimed >= 0) {
      if (retry.first_ms) retry = (store_retry){0, IDLE_POLL_MS};
      es_store_answered(e, r->id);
    }
    if (rc == ES_OK && claimed != 0) continue; /* events queued, or another worker claimed */
    if (rc != ES_OK) {
      active = 0;
      atomic_fetch_sub(&e->busy, 1);
      char msg[ES_ERRMSG_MAX + 64];
      snprintf(msg, sizeof msg, "claiming failed: %s", err.msg);
      /* A store that closed ends any run. A run that is to end when idle
       * cannot tell idle from broken, except in an outage: STORAGE from a
       * store that has answered this engine's claims before is ridden out
       * for outage_ms; any other error, or STORAGE from a store that never
       * answered (opened read-only, no right to write), ends it at once.
       * Other runs back off and go on, whatever the error. */
      int idle_run = atomic_load(&e->until_idle);
      if (rc == ES_CLOSED || (idle_run && (rc != ES_STORAGE || !atomic_load(&e->answered)))) {
        run_error(e, rc, msg);
        es_begin_stop(e);
        break;
      }
      if (rc == ES_STORAGE) note_orphaned_claim(e);
      es_store_failed(e, r->id, &retry, "claiming", rc, &err);
      if (!es_store_retry_wait(e, &retry, idle_run ? e->o.outage_ms : -1)) {
        if (!atomic_load(&e->stopping)) {
          snprintf(msg, sizeof msg, "claiming failed for %lld ms (outage_ms): %s",
                   (long long)(es_mono_ms() - retry.first_ms), err.msg);
          run_error(e, rc, msg);
          es_begin_stop(e);
        }
        break;
      }
      continue;
    }
    /* Nothing ready now. Completions still on their way to the store may
     * make events ready, and must be stored before an until_idle run
     * ends: wait for them (still busy). */
    if (unacked > 0) {
      es_wait_acked(e, IDLE_POLL_MS);
      continue;
    }
    /* With until_idle, the run is over once no other worker is busy either
     * (a busy one may still produce events), and no claim lost in an
     * outage is still to expire and be taken again. */
    active = 0;
    if (atomic_fetch_sub(&e->busy, 1) == 1 && atomic_load(&e->until_idle) &&
        es_mono_ms() >= atomic_load(&e->orphans_until)) {
      es_begin_stop(e);
      break;
    }
    atomic_fetch_add(&e->sleeping, 1);
    es_engine_sleep(e, IDLE_POLL_MS);
    atomic_fetch_sub(&e->sleeping, 1);
  }
  if (active) atomic_fetch_sub(&e->busy, 1);
  worker_exit(r);
  return NULL;
}

/* Takes r (busy, not finishing) out of its slot: fails its attempt, lets
 * its thread go, and (unless the run is stopping) starts a replacement. */
static void abandon(es_engine *e, int slot, runner *r, const char *cause) {
  /* r's strings are borrowed from its event, which its thread frees
   * whenever it comes back: copied here, into buffers that cannot fail to
   * be had (a failed strdup would lose the attempt's failure). */
  char session[ES_MAX_NAME_BYTES + 1], type[ES_MAX_NAME_BYTES + 1];
  pthread_mutex_lock(&r->mu);
  int ok = r->busy && !r->finishing && !r->abandoned;
  claim_info c = r->claim;
  if (ok) {
    r->abandoned = 1;
    snprintf(session, sizeof session, "%s", r->claim.session ? r->claim.session : "?");
    snprintf(type, sizeof type, "%s", r->claim.type ? r->claim.type : "?");
    c.session = session;
    c.type = type;
  }
  pthread_mutex_unlock(&r->mu);
  if (!ok) return;
  atomic_fetch_add(&e->refs, 1); /* the thread's, until it comes back */
  atomic_fetch_add(&e->abandoned, 1);
  /* Its attempt ends here (failed below): an attempt after a lost one no
   * longer holds claims ahead off, though its thread may never come back. */
  lone_done(e, c.lost > 0);
  /* It was busy (in a handler); its thread, whenever it comes back, must
   * not count itself out of a later run's e->busy. */
  atomic_fetch_sub(&e->busy, 1);
  pthread_detach(r->thread);
  es_engine_log(e, r->id, "%s #%lld %s: %s", c.session, (long long)c.index, c.type, cause);
  es_record_failure(e, r->id, &c, cause, atomic_load(&e->stopping), 0);

  runner *fresh = NULL;
  if (!atomic_load(&e->stopping)) {
    es_err err = {0};
    fresh = es_runner_new(e, r->id, &err);
    if (fresh && pthread_create(&fresh->thread, NULL, es_worker_main, fresh) != 0) {
      es_runner_free_now(fresh);
      fresh = NULL;
    }
    if (!fresh) es_engine_log(e, r->id, "cannot replace the abandoned worker: %s", err.msg);
  }
  pthread_mutex_lock(&e->mu);
  e->slots[slot] = fresh;
  if (!fresh) {
    atomic_fetch_sub(&e->running, 1);
    pthread_cond_broadcast(&e->run_cond);
  }
  pthread_mutex_unlock(&e->mu);
}

/* The keeper: renews the claims of handlers in flight every ttl/3, and
 * watches every call (es_watch()). Runs until the last worker has finished,
 * so handlers finishing during a stop keep their claims. */
void *es_keeper_main(void *arg) {
  es_engine *e = arg;
  int64_t every = es_renew_every(e);
  while (!atomic_load(&e->keeper_quit)) {
    es_run_wait(e, WATCH_EVERY_MS < every ? WATCH_EVERY_MS : every, &e->keeper_quit, 1);
    if (atomic_load(&e->keeper_quit)) break;
    int64_t now = es_mono_ms();
    if (now - e->types_at >= 1000) es_types_refresh(e);
    es_engine_renew_leases(e, now);
    es_queue_release_before(e, now - es_hold_ms(e)); /* Prefetch: nothing waits behind slow handlers */
    es_renew_waiting(e, now);
    for (int i = 0; i < e->n; i++) {
      pthread_mutex_lock(&e->mu);
      runner *r = e->slots[i];
      pthread_mutex_unlock(&e->mu);
      if (!r) continue;
      char cause[512];
      pthread_mutex_lock(&r->mu);
      int gone = es_watch(e, r, now, cause, sizeof cause);
      int renew = !gone && r->busy && !r->abandoned && r->session && now - r->renewed_ms >= every;
      claim_info c = r->claim;
      char *session = renew ? strdup(r->session) : NULL;
      if (renew) r->renewed_ms = now;
      pthread_mutex_unlock(&r->mu);
      if (gone) abandon(e, i, r, cause);
      if (session) {
        es_claim_ref ref = {c.index, c.attempt};
        es_renew_result rr;
        es_err err = {0};
        if (es_store_renew(e->s, session, e->holder, &ref, 1, e->o.ttl_ms, ES_NONE, &rr, &err) == ES_OK)
          es_renew_result_destroy(&rr);
        free(session);
      }
    }
  }
  return NULL;
}

