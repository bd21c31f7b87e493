/*
 * internal.h: what the engine's files share (engine.c, dispatch.c,
 * completions.c, fold_runner.c, fold.c, ...): the engine's struct, the
 * runner (a thread with a budgeted Lua state), the fold, and the
 * functions one file calls in another. Not part of the engine's API
 * (engine.h).
 */
#ifndef ES_ENGINE_INTERNAL_H
#define ES_ENGINE_INTERNAL_H

#include <lua.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "engine/budget.h"
#include "engine/engine.h"
#include "engine/type_stats.h"
#include "engine/upcast.h"

/* A sorted set of script names (handlers.c): the event types with a
 * handler file, with an upcaster file, or the types an engine claims;
 * shared and replaced whole, so refcounted. */
typedef struct es_type_set {
  atomic_int refs;
  char **v;
  size_t n;
} es_type_set;

/* Scans scripts/handlers; one reference. NULL with *err when out of
 * memory or a path is too long. */
es_type_set *es_type_set_scan(const char *scripts, es_err *err);
/* The same for scripts/<kind> ("handlers", "reducers"): the script names. */
es_type_set *es_script_scan(const char *scripts, const char *kind, es_err *err);
int es_type_set_has(const es_type_set *t, const char *type);
/* a ∪ b (either may be NULL) less the names minus[0..n_minus): a new set
 * with one reference, NULL when out of memory (handlers.c). */
es_type_set *es_type_set_union(const es_type_set *a, const es_type_set *b, char *const *minus,
                               size_t n_minus);
void es_type_set_release(es_type_set *t);
/* The set in *slot (guarded by mu) with a reference for the caller; NULL:
 * none yet. */
es_type_set *es_type_set_get(pthread_mutex_t *mu, es_type_set *const *slot);

/* The claim a worker is handling. Strings borrowed from the runner. */
typedef struct claim_info {
  const char *session;
  const char *type;
  int64_t index, attempt;
  int64_t failures;   /* recorded failures when claimed */
  int64_t lost;       /* earlier attempts that never ended (count as failures) */
} claim_info;

/* A handler a worker found through its loader (runner.hcache). */
typedef struct handler_slot {
  unsigned gen;  /* the runner's loader_gen when filled; 0: empty */
  int64_t until; /* monotonic ms */
  size_t len;
  char type[64]; /* longer types are not kept */
} handler_slot;

typedef struct runner {
  es_engine *e;
  int id;                  /* 1..workers; 0: a fold runner */
  lua_State *L;            /* its own state, budgeted by b */
  es_budget b;
  es_type_set *up;         /* the upcaster types of its job (upcast.c; a reference) */
  unsigned up_gen, up_cache_gen; /* its job, and the job its upcaster cache is of (upcast.c) */
  pthread_t thread;
  clockid_t cpu;           /* the thread's CPU clock, for the watchdog */
  int has_cpu;

  pthread_mutex_t mu;      /* guards what the keeper reads below */
  int busy;                /* in a watched call */
  int finishing;           /* writing its outcome: no longer to be abandoned */
  int abandoned;           /* given up on: its thread frees it when it returns */
  int64_t started_ms;      /* monotonic start of the call */
  int64_t tripped_ms;      /* when a deadline or stop tripped it; 0: not */
  int64_t renewed_ms;      /* last claim renewal */
  unsigned last_ticks;     /* hook ticks at the last look ... */
  int64_t last_cpu_ns;     /* ... and the thread's CPU time then */
  unsigned gc_due;         /* handled events since the last explicit collector step */
  /* The generator's seed for the call in flight, applied at its first
   * draw (determinism.c): set by es_determinism_seed. */
  int seed_due;
  lua_Integer seed_hash, seed_attempt;
  int64_t looked_ms;       /* an inline engine's fold runner: when its job last had the
                            * script files looked at again (fold_runner.c) */
  const char *session, *type; /* of the claim in flight: borrowed from its event */
  claim_info claim;
  /* Handlers found through the loader lately (es_loader_handler): the
   * function is in a registry table at the slot's index + 1. A slot
   * serves until the time the loader answered with (its own cache's), or
   * the next es_loader_new_run (loader_gen). */
  unsigned loader_gen;      /* from 1 */
  handler_slot hcache[8];

  /* A fold runner's job (under e->fold_mu; the flags are also polled
   * without it for a moment before blocking, see spin_until). */
  int fold_taken;          /* a caller of es_engine_state holds it */
  atomic_int fold_pending, fold_done, quit;
  char *fold_session, *fold_reducer;
  int64_t fold_at, fold_index;
  int fold_force;          /* snapshot at fold_at whatever snapshot_every says (truncate) */
  int fold_upcast;         /* the job is es_engine_upcast's: fold_in upcast into fold_out */
  es_buf fold_in;          /* its events (state codec), copied */
  int fold_json;           /* fold_out gets the state as JSON (es_engine_state_json) */
  int fold_not_json;       /* set by the job: the state folded, but JSON cannot carry it */
  int fold_rc;
  es_err fold_err;
  es_buf fold_out;
} runner;

/* A claimed event waiting in the engine's queue for a worker (dispatch.c
 * "Prefetch"): owned. */
typedef struct queued_event {
  es_event ev;
  int64_t claimed_ms;  /* monotonic: when it was claimed */
} queued_event;

/* A handled event's completion, waiting for the completer (completions.c
 * "Completions"): one allocation with the strings and returned events. */
typedef struct completion {
  struct completion *next;
  int worker;               /* the runner's id, for its log lines */
  claim_info c;             /* session and type point into this allocation */
  es_new_event *evs;        /* what the handler returned, ids fixed; in this allocation */
  size_t n;
  es_cancel *cancel;        /* its ctx.cancel calls (§3.2); in this allocation */
  size_t n_cancel;
  int64_t renewed_ms;       /* monotonic: when its claim was made or last renewed */
  int64_t handed_ms;        /* monotonic: when the worker handed it over */
  int awaited;              /* its worker had nothing queued: wanted at once (completions.c "Naps") */
} completion;

/* A session lease this engine holds (engine:lease): its writes to the
 * session carry the token; the keeper renews it every ttl_ms/3. */
typedef struct engine_lease {
  char *session;
  int64_t token, ttl_ms;
  int64_t renewed_ms;         /* monotonic */
} engine_lease;

struct es_engine {
  atomic_int refs;            /* the owner's, and one per abandoned runner */
  es_store *s;                /* retained */
  es_engine_opts o;           /* strings point at the copies below */
  char *scripts, *holder, *lua_path, *lua_cpath;
  int n;                      /* worker slots */
  runner **slots;             /* NULL where a worker could not be replaced */
  pthread_mutex_t mu;         /* slots; with cond, idle workers sleep and stop wakes them */
  pthread_cond_t cond;
  pthread_cond_t run_cond;    /* with mu: a worker left the run (the run's thread waits for
                               * the last), or keeper_quit was set (the keeper sleeps on it),
                               * so a run ends when its work does, not a poll period later */

  es_type_set *types;         /* what workers claim (under types_mu); the keeper rescans it */
  es_type_set *handlers;      /* the types with a handler file (under types_mu, rescanned with it) */
  pthread_mutex_t types_mu;
  int64_t types_at;           /* when it was scanned (monotonic ms) */
  int types_failing;          /* the last rescan failed (logged once); the keeper's */

  /* upcast.c (§7): the types with an upcaster file (refcounted like
   * types; the mtime of scripts/upcasters when scanned) and the `current`
   * of each as the states last loaded it; and (dispatch.c) the stored
   * types whose chains were found to end at a type with no handler here,
   * left out of this run's claims. All under up_mu. */
  pthread_mutex_t up_mu;
  es_type_set *upcasters;
  int64_t up_mtime;
  struct es_upcast_current *currents;
  size_t n_currents, cap_currents;
  char **elsewhere;
  size_t n_elsewhere;

  /* scripts.c: the last source of each script that loaded, and failed reloads */
  pthread_mutex_t good_mu;
  struct es_good_script *good;
  size_t n_good, cap_good;
  atomic_llong reload_failures; /* reloads that failed (the last good version ran on) */
  atomic_llong retained[ES_RETAIN_KINDS]; /* retention_counts.c */

  pthread_mutex_t lease_mu;   /* the two lists below */
  engine_lease *leases;       /* held leases */
  size_t n_leases, cap_leases;
  char **fenced;              /* sessions this engine was fenced out of: its claims skip them */
  size_t n_fenced, cap_fenced;
  atomic_int any_fenced;      /* n_fenced > 0, read without the lock on the claim path */

  /* Fold runners (fold_runner.c): es_engine_state takes an idle one (or
   * starts one in an empty slot) and gives it back; under fold_mu. */
  runner **folders;           /* n_folders slots; NULL until needed or after an abandon */
  int n_folders;
  pthread_mutex_t fold_mu;    /* the slots, the runners' fold_taken and their job handoff */
  pthread_cond_t fold_cond;   /* a job for a runner, or a job done */
  pthread_cond_t fold_free;   /* a runner given back or a slot emptied */
  runner *inline_folder;      /* inline_runs: the one fold runner, with no thread (under
                               * fold_mu for a whole call; fold_runner.c engine_job) */

  /* one run */
  int in_run;
  /* An inline run (engine.h inline_runs, engine.c "Inline runs"): set for
   * the run's length by es_engine_run before any thread it starts. */
  int inline_now;
  _Atomic(runner *) inline_runner; /* its runner, for es_engine_stop to interrupt */
  const es_run_opts *run_opts;     /* its progress callback ... */
  int64_t progress_next, progress_every; /* ... and when it is called next (monotonic ms) */
  atomic_int stop_req;        /* es_engine_stop (signal-safe) */
  atomic_int stopping;        /* the run is ending: claim no more */
  atomic_int keeper_quit;
  atomic_int until_idle;
  atomic_int busy;            /* workers claiming or handling */
  atomic_int running;         /* worker threads not finished nor abandoned */
  atomic_llong handled, failed, dead, abandoned;
  es_type_stats tstats;       /* §3.12 per event type, since the engine opened (type_stats.h) */
  es_err run_err;             /* the first error that ended the run */

  /* Prefetch (dispatch.c): claimed events not started yet, shared by the
   * workers, oldest first (a ring: q[(q_head + i) % q_cap]). */
  pthread_mutex_t q_mu;
  pthread_cond_t q_cond;      /* a claim for the queue ended */
  queued_event *q;
  size_t q_head, q_n, q_cap;
  int claiming;               /* a worker or the prefetcher is claiming for the queue (under q_mu) */
  int releasing;              /* events off the queue whose release is not done (under q_mu):
                               * still claimed by this engine, so a claim that finds nothing
                               * then does not mean idle */
  /* Claims ahead (dispatch.c "Claims ahead"), all under q_mu: the
   * prefetcher thread of a threaded run claims the next batch while the
   * workers still have events queued. */
  pthread_cond_t pf_cond;     /* the prefetcher is wanted, or is to quit */
  int pf_run;                 /* this run has a prefetcher thread */
  int pf_on;                  /* ... not held back (a claim ahead found nothing or failed) */
  int pf_want;                /* a worker took the queue down to pf_low: claim ahead */
  int pf_quit;
  size_t pf_low;              /* the queue's low-water mark: half the last claim */
  long long pf_mark;          /* settled_count (dispatch.c) before the last claim, when it got
                               * less than it asked for (everything ready then); -1 when it got
                               * all, or failed */
  int lone_out;               /* attempts after a lost one taken off the queue, not yet done */
  atomic_llong handler_us;    /* running mean of a handler call's wall time (0: none yet) */
  atomic_llong claim_cap;     /* events per claim at most now: halved when queued events had
                               * to be released, grown back while claims are used up */
  atomic_int sleeping;        /* workers in the idle wait (woken when the queue fills) */

  /* Completions (completions.c): handed over by the workers, committed by the
   * completer thread, many per transaction. */
  pthread_mutex_t c_mu;
  pthread_cond_t c_cond;      /* work for the completer, or quit */
  pthread_cond_t c_done;      /* the completer finished some */
  completion *c_head, *c_tail;
  size_t c_n;                 /* waiting in the list */
  int64_t c_busy_since;       /* handed_ms of the oldest completion being committed (0: none) */
  int c_quit;
  int c_napping;              /* the completer's short wait after a batch (completions.c) */
  atomic_int c_cheap;         /* the completer's last batch took under NAP_US / 2 (completions.c) */
  atomic_llong unacked;       /* handed over and not yet answered by the store */

  /* Store outages (engine.c "Riding out a store outage"): */
  atomic_llong outage_since;  /* monotonic ms the store began failing; 0: it answers */
  atomic_int answered;        /* a claim of this engine ever succeeded */
  /* A claim that failed with STORAGE may have committed all the same (its
   * answer lost with the connection): the event is then claimed by this
   * holder with no worker on it, and ready again when the claim expires.
   * An until-idle run does not end before then (monotonic ms; 0: none). */
  _Atomic int64_t orphans_until;

  /* Projections (projections.c, §8): their runner's state, made at the
   * first pass that has a projection, used by one pass at a time. */
  pthread_mutex_t proj_mu;
  runner *proj_runner;
};

/* scripts.c: pushes the table the loader shares with the other states
 * ({get, put, failed}, see loader.lua); loads every script in r's state
 * (INVALID_ARGUMENT naming the first that does not load); frees the
 * sources kept. */
void es_scripts_push_shared(lua_State *L, es_engine *e);
int es_scripts_load_all(runner *r, es_err *err);
void es_scripts_free(es_engine *e);

int64_t es_mono_ms(void);
int64_t es_mono_us(void);
int64_t es_mono_ns(void);
void es_engine_log(es_engine *e, int id, const char *fmt, ...)
                   #if defined(__GNUC__)
                   __attribute__((format(printf, 3, 4)))
                   #endif
                   ;
void es_engine_unref(es_engine *e);

/* Pushes loader[fn](name, now) of L's loader: value, err, extra. Raises. */
void es_loader_call(lua_State *L, const char *fn, const char *name);

/* es_loader_call(r->L, "handler", type) through r's cache of handlers
 * (runner.hcache): the same three values. Raises. */
void es_loader_handler(runner *r, const char *type, size_t len, int64_t now);

/* Folds reducer over session through at (ES_NONE: the head) in r's state
 * and pushes the state (fold.c). With snapshots on, encoded (if not NULL)
 * receives the state's encoding; *through (if not NULL) the index folded
 * through. force: encode and snapshot at `at` (> 0) whatever snapshot_every
 * says (engine:truncate keeps every state readable that way). Raises error
 * objects. */
void es_fold(lua_State *L, runner *r, const char *session, const char *reducer, int64_t at,
             es_buf *encoded, int64_t *through, int force);

/* Leases (leases.c). The token this engine's writes to session carry
 * (ES_NONE: it holds no lease there). */
int64_t es_engine_fence_of(es_engine *e, const char *session);
/* A write carrying the session's token was refused (STALE_FENCE) or a
 * renewal found another holder: the lease is gone, and the engine's claims
 * skip the session until engine:lease takes it again. */
void es_engine_fenced_out(es_engine *e, const char *session);
/* Whether the engine was fenced out of session (and has not leased it again). */
int es_engine_is_fenced(es_engine *e, const char *session);
/* A copy of the sessions to skip (NULL, *n = 0 when none); free it with
 * es_engine_skip_free. */
char **es_engine_skip_list(es_engine *e, size_t *n);
void es_engine_skip_free(char **v, size_t n);
/* The keeper's turn: renews leases due (every ttl_ms/3). */
void es_engine_renew_leases(es_engine *e, int64_t now_ms);
void es_engine_leases_free(es_engine *e);

/* Waits on run_cond (with mu) for at most ms while *v != until (dispatch.c). */
void es_run_wait(es_engine *e, int64_t ms, atomic_int *v, int until);

/* Pushes the ctx table for a handler of ev (fold.c). */
void es_push_ctx(lua_State *L, runner *r, const es_event *ev);
/* ctx.meta = the value on top of the stack (popped), for the ctx at idx
 * (es_push_ctx's, which has room for it). */
void es_ctx_set_meta(lua_State *L, int idx);

/* Deterministic scripts (determinism.c, docs/contract.md §4): setup at a
 * state's making, the generator seeded from ev for its handler (at the
 * first draw), and the state's own math.random pushed (for ctx.random). */
void es_determinism_setup(lua_State *L, runner *r);
void es_determinism_seed(runner *r, const es_event *ev);
void es_determinism_push_random(lua_State *L);
/* FNV-1a 64 of n bytes, continuing from h (ES_FNV_BASIS to start). */
#define ES_FNV_BASIS 14695981039346656037ULL
uint64_t es_fnv1a(uint64_t h, const void *data, size_t n);

/* The engine's timings (engine.c, dispatch.c, completions.c, fold_runner.c). */
#define IDLE_POLL_MS 50      /* how often an idle worker looks for ready events */
#define WATCH_EVERY_MS 50    /* the keeper's period */
#define GRACE_MS 1000        /* a tripped call must unwind within this */
#define STALL_CPU_NS 1000000000LL /* CPU burnt with no hook: stuck where no hook reaches */
#define CLOSE_WAIT_MS 1000   /* closing a Lua state (its finalizers) */
#define FENCE_TRIES 3        /* a completion refused for a lease the keeper re-took meanwhile */
#define STORE_WAIT_FIRST_MS 10 /* the first wait before retrying a failed write (then doubling) */
#define STORE_WAIT_MAX_MS 2000 /* the longest wait between two tries of a failing store */
#define MAX_MS (100LL * 365 * 24 * 3600 * 1000) /* the largest time option: 100 years */
#define FOLD_SPIN_US 50      /* how long the fold handoff polls before blocking */

/* Registry key of a runner state's loader (lua/eventstore/loader.lua). */
extern const char es_loader_key;

typedef struct store_retry {
  int64_t first_ms; /* when the call first failed (monotonic); 0: it has not */
  int64_t base_ms;  /* the next wait's base */
} store_retry;

/* What handling one event came to. */
enum {
  RUN_HANDLED, RUN_FAILED, RUN_RELEASE,
  RUN_ELSEWHERE /* §7: its upcast type has no handler here: give the claim back */
};

typedef struct job {
  runner *r;
  const es_event *ev;
  int result;
  char *error;       /* malloc'd, for RUN_FAILED */
  es_new_event *evs; /* what the handler returned (anchored on the stack) */
  size_t n;
  es_cancel *cancel; /* malloc'd: the handler's ctx.cancel calls (§3.2), with their reasons */
  size_t n_cancel;
  int last;          /* nothing was queued or being claimed once this event was taken: its
                      * completion is awaited (completions.c "Naps") */
  int64_t start_ms;  /* es_mono_ms when the call began */
  int64_t done_ms;   /* ... and when it returned (the hand-over's time) */
} job;

/* The ctx.cancel calls of the ctx at idx (pushed by es_push_ctx), copied
 * into j (malloc'd with their reasons; the caller frees j->cancel).
 * fold.c. */
void es_ctx_cancels(lua_State *L, int idx, job *j);

/* engine.c (each commented where it is defined) */
void es_sleep_ms(int64_t ms);
void es_runner_free_now(runner *r);
runner *es_runner_new(es_engine *e, int id, es_err *err);
void es_watch_start(runner *r, int64_t now_ms);
int es_watch(es_engine *e, runner *r, int64_t now, char *cause, size_t len);
void es_store_answered(es_engine *e, int id);
void es_store_failed(es_engine *e, int id, store_retry *t, const char *what, int rc,
                     const es_err *err);
int es_store_retry_wait(es_engine *e, store_retry *t, int64_t limit_ms);

/* dispatch.c (each commented where it is defined) */
void es_engine_sleep(es_engine *e, int64_t ms);
int64_t es_lost_attempts(const es_event *ev);
void es_record_failure(es_engine *e, int id, const claim_info *c, const char *error,
                       int retry_now, int patient);
es_type_set *es_types_get(es_engine *e);
es_type_set *es_handlers_get(es_engine *e);
void es_types_refresh(es_engine *e);
void es_types_exclude(es_engine *e, const char *type);
void es_job_error(job *j, const char *msg);
int64_t es_hold_ms(const es_engine *e);
void es_queue_release_before(es_engine *e, int64_t cutoff);
void es_begin_stop(es_engine *e);
void *es_worker_main(void *arg);
void *es_keeper_main(void *arg);
/* The prefetcher thread of a threaded run (dispatch.c "Claims ahead"). */
void *es_prefetcher_main(void *arg);
/* engine.c: what an inline run's worker loop does between two events in
 * place of the run's thread and the keeper (a stop asked for, the progress
 * callback, the scripts looked at again once a second). */
void es_inline_tick(es_engine *e);
/* engine.c: tells r's script loader a new run began, so that it looks at
 * every script file again (errors there are the next load's to report). */
void es_loader_new_run(runner *r);

/* projections.c (§8): passes until every projection is caught up (an
 * until-idle run's end); the thread that keeps them caught up while a run
 * goes on; what es_engine_close frees. */
int es_projections_catch_up(es_engine *e, es_err *err);
void *es_projections_main(void *arg);
void es_projections_free(es_engine *e);
/* At a run's end: gives back the leases of the projections this engine
 * runs, so that the next run (of this engine or another, e.g. the next
 * `eventstore run --until-idle`) takes them at once instead of after the
 * TTL. */
void es_projections_release(es_engine *e);

/* completions.c (each commented where it is defined) */
void es_hand_over(job *j, const claim_info *c);
int64_t es_renew_every(const es_engine *e);
void es_renew_waiting(es_engine *e, int64_t now);
void *es_completer_main(void *arg);
int es_completions_lag(es_engine *e);
/* An inline run's completer: writes every completion waiting, on the
 * calling thread, before it returns. */
void es_complete_waiting(es_engine *e);
void es_wait_acked(es_engine *e, int64_t ms);
void es_completer_kick(es_engine *e);

#endif
