/*
 * engine.c: the engine of engine.h: runners (a thread and a budgeted Lua
 * state each), dispatch, the keeper (claim renewal and watchdog), runs,
 * and the fold runner behind es_engine_state. The reducer fold itself is
 * fold.c; budgets are budget.c.
 *
 * Dispatch: a worker claims one event with claim_next, runs the job (load
 * the handler, call it, convert and encode what it returned) as one
 * budgeted call, fixes the ids of the returned events and completes (so a
 * retried completion is idempotent). A failure is retried with exponential
 * backoff and jitter; at max_failures the event is dead-lettered with its
 * traceback. Attempts that never ended (the process died in the handler,
 * a worker was abandoned) count toward max_failures: see lost_attempts.
 *
 * Abandoning: a runner whose call tripped (deadline, stop) and did not
 * unwind within GRACE_MS, or that burns CPU where no hook reaches, is
 * abandoned by the keeper: its attempt is failed for it, its slot gets a
 * fresh runner, and its thread, whenever it comes back, frees its own
 * state and drops its reference to the engine without touching the store.
 */
#include "engine/engine.h"

#include <dirent.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#include "engine/internal.h"
#include "codec/json.h"
#include "codec/state.h"
#include "lua/common.h"
#include "lua/events.h"
#include "lua/module.h"

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

static const char loader_key = 'l'; /* registry: the state's loader */

int64_t es_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int64_t cpu_ns(clockid_t c) {
  struct timespec ts;
  if (clock_gettime(c, &ts) != 0) return -1;
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void es_engine_log(es_engine *e, int id, const char *fmt, ...) {
  va_list ap;
  char line[1024];
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (id) fprintf(stderr, "eventstore[%s/%d]: %s\n", e->holder, id, line);
  else fprintf(stderr, "eventstore[%s]: %s\n", e->holder, line);
}

/* ---------------------------------------------------------------------- */
/* runner states */

/* stat(path) -> "mtime_ns:size:inode" or nil: a script file's signature. */
static int l_stat(lua_State *L) {
  struct stat st;
  if (stat(luaL_checkstring(L, 1), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  lua_pushfstring(L, "%I.%I:%I:%I", (lua_Integer)st.st_mtim.tv_sec,
                  (lua_Integer)st.st_mtim.tv_nsec, (lua_Integer)st.st_size,
                  (lua_Integer)st.st_ino);
  return 1;
}

/* hash(source) -> 16 hex digits (FNV-1a 64): a reducer's version. */
static int l_hash(lua_State *L) {
  size_t n;
  const unsigned char *p = (const unsigned char *)luaL_checklstring(L, 1, &n);
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  lua_pushstring(L, hex);
  return 1;
}

/* os.execute for engine scripts. The C library's system() ignores SIGINT
 * and SIGQUIT in the whole process while the command runs, so a Ctrl-C
 * to an engine whose handler sits in os.execute("sleep 20") was lost; this
 * one runs /bin/sh -c without touching any signal disposition, and
 * returns what os.execute returns. */
static int l_execute(lua_State *L) {
  const char *cmd = luaL_optstring(L, 1, NULL);
  if (!cmd) {
    lua_pushboolean(L, access("/bin/sh", X_OK) == 0);
    return 1;
  }
  char *argv[] = {"sh", "-c", (char *)cmd, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ);
  if (rc != 0) {
    errno = rc;
    return luaL_fileresult(L, 0, NULL);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return luaL_fileresult(L, 0, NULL);
  }
  return luaL_execresult(L, status);
}

/* Sets up a runner's state: package paths, eventstore preloaded (the
 * module is linked into this very library, so handlers' require needs no
 * .so search), and the loader (lua/eventstore/loader.lua). */
static int setup_state(lua_State *L) {
  es_engine *e = lua_touserdata(L, 1);
  lua_getglobal(L, "package");
  if (e->lua_path) {
    lua_pushstring(L, e->lua_path);
    lua_setfield(L, -2, "path");
  }
  if (e->lua_cpath) {
    lua_pushstring(L, e->lua_cpath);
    lua_setfield(L, -2, "cpath");
  }
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_eventstore_core);
  lua_setfield(L, -2, "eventstore.core");
  lua_pop(L, 2);
  lua_getglobal(L, "os");
  lua_pushcfunction(L, l_execute);
  lua_setfield(L, -2, "execute");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "eventstore.loader");
  lua_call(L, 1, 1);
  lua_pushstring(L, e->scripts);
  lua_pushcfunction(L, l_stat);
  lua_pushcfunction(L, l_hash);
  es_scripts_push_shared(L, e);
  lua_call(L, 4, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &loader_key);
  return 0;
}

/* Pushes loader[fn](name, now): value, err, extra. Raises. */
void es_loader_call(lua_State *L, const char *fn, const char *name) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &loader_key);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushstring(L, name);
  lua_pushinteger(L, es_mono_ms());
  lua_call(L, 2, 3);
}

static void runner_free_now(runner *r) {
  if (r->L) lua_close(r->L);
  es_buf_destroy(&r->fold_out);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

static runner *runner_new(es_engine *e, int id, es_err *err) {
  runner *r = calloc(1, sizeof *r);
  if (!r) {
    es_fail(err, ES_STORAGE, "out of memory");
    return NULL;
  }
  r->e = e;
  r->id = id;
  pthread_mutex_init(&r->mu, NULL);
  es_buf_init(&r->fold_out);
  char msg[512];
  r->L = es_budget_newstate(&r->b, (size_t)e->o.memory_budget, e->o.instruction_budget,
                            e->o.deadline_ms, msg, sizeof msg);
  if (!r->L) {
    es_fail(err, ES_INVALID_ARGUMENT, "cannot create an engine Lua state: %s", msg);
    runner_free_now(r);
    return NULL;
  }
  lua_pushcfunction(r->L, setup_state);
  lua_pushlightuserdata(r->L, e);
  if (lua_pcall(r->L, 1, 0, 0) != LUA_OK) {
    es_fail(err, ES_INVALID_ARGUMENT, "cannot set up an engine Lua state: %s",
            lua_tostring(r->L, -1));
    runner_free_now(r);
    return NULL;
  }
  return r;
}

static void *closer_main(void *arg) {
  runner_free_now(arg);
  return NULL;
}

/* Frees a runner whose thread (if any) has ended. Closing its state runs
 * the finalizers its scripts left, with hooks off (Lua's rule), so one
 * that never returns would hang the caller: the close gets CLOSE_WAIT_MS
 * on a thread of its own, and is left to it after that. */
static void runner_free(runner *r) {
  pthread_t t;
  if (pthread_create(&t, NULL, closer_main, r) != 0) {
    runner_free_now(r);
    return;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += CLOSE_WAIT_MS / 1000;
  if (pthread_timedjoin_np(t, NULL, &until) != 0) pthread_detach(t);
}

/* Marks the start of a watched call (under r->mu). */
static void watch_start(runner *r) {
  r->busy = 1;
  r->finishing = 0;
  r->started_ms = es_mono_ms();
  r->tripped_ms = 0;
  r->last_ticks = atomic_load(&r->b.ticks);
  r->last_cpu_ns = -1; /* the watchdog takes its baseline at its first look */
  atomic_store(&r->b.trip, ES_TRIP_NONE);
  if (r->id && atomic_load(&r->e->stopping)) { /* a worker; folds are not the run's */
    es_budget_trip(&r->b, ES_TRIP_STOP);
    r->tripped_ms = r->started_ms;
  }
}

/* The watchdog's look at one runner (under r->mu): trips a call past its
 * deadline; returns 1 (and a cause) when the runner must be abandoned. */
static int watch(es_engine *e, runner *r, int64_t now, char *cause, size_t len) {
  if (!r->busy || r->finishing || r->abandoned) return 0;
  if (!r->tripped_ms && now - r->started_ms > e->o.deadline_ms) {
    es_budget_trip(&r->b, ES_TRIP_DEADLINE);
    r->tripped_ms = now;
  }
  if (r->tripped_ms && now - r->tripped_ms > GRACE_MS) {
    char msg[128];
    int t = atomic_load(&r->b.trip);
    snprintf(cause, len, "%s; the call did not unwind within %d ms, its worker was abandoned",
             es_budget_message(&r->b, t ? t : ES_TRIP_DEADLINE, msg, sizeof msg), GRACE_MS);
    return 1;
  }
  unsigned ticks = atomic_load(&r->b.ticks);
  int64_t cpu = r->has_cpu ? cpu_ns(r->cpu) : -1;
  if (ticks != r->last_ticks || atomic_load(&r->b.trusted) > 0 || cpu < 0 || r->last_cpu_ns < 0) {
    r->last_ticks = ticks;
    r->last_cpu_ns = cpu;
    return 0;
  }
  if (cpu - r->last_cpu_ns > STALL_CPU_NS) {
    snprintf(cause, len,
             "stuck: %lld ms of CPU where no budget hook reaches (a C function such as a "
             "pathological string pattern, or a __gc finalizer); its worker was abandoned",
             (long long)((cpu - r->last_cpu_ns) / 1000000));
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Riding out a store outage
 *
 * A store call that fails with STORAGE (a PostgreSQL server restarting, a
 * lost connection, cannot connect; a full disk) is tried again, waiting
 * between half and all of a base that doubles up to STORE_WAIT_MAX_MS (the
 * jitter keeps workers and engines that failed together from retrying
 * together), until it succeeds or has failed for outage_ms. The engine
 * logs when the store begins failing and when it answers again, not every
 * try. Trying again is safe: a claim that failed claimed nothing, and a
 * completion or failure is repeated with the same attempt and the same
 * ids, so one whose commit went through but whose answer was lost comes
 * back as the result already stored (CONTRACT §3.2), never a second one. */

static void engine_sleep(es_engine *e, int64_t ms);

typedef struct store_retry {
  int64_t first_ms; /* when the call first failed (monotonic); 0: it has not */
  int64_t base_ms;  /* the next wait's base */
} store_retry;

/* Between half and all of base. */
static int64_t jittered(int64_t base) {
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)es_mono_ms();
  int64_t half = base / 2;
  return half + (int64_t)(r % (uint64_t)(base - half + 1));
}

/* A store call succeeded: an outage, if one was going on, is over. */
static void store_answered(es_engine *e, int id) {
  if (!atomic_load(&e->answered)) atomic_store(&e->answered, 1);
  if (!atomic_load(&e->outage_since)) return;
  int64_t since = atomic_exchange(&e->outage_since, 0);
  if (since)
    es_engine_log(e, id, "the store answers again (it failed for %lld ms)",
                  (long long)(es_mono_ms() - since));
}

/* A store call (what: "claiming", ...) failed with rc: starts the call's
 * clock, and the outage's (logged by whichever call saw it first). */
static void store_failed(es_engine *e, int id, store_retry *t, const char *what, int rc,
                         const es_err *err) {
  int64_t now = es_mono_ms();
  if (!t->first_ms) t->first_ms = now;
  long long zero = 0;
  if (!atomic_compare_exchange_strong(&e->outage_since, &zero, now)) return;
  /* One log line: libpq's messages run over several. */
  char msg[ES_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", err->msg);
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\t') *p = ' ';
  es_engine_log(e, id, "%s failed: %s: %s; retrying with backoff until the store answers", what,
                es_strerror(rc), msg);
}

/* Whether the failed call of t may be tried again, limit_ms (< 0: no
 * limit) after its first failure at most; waits first. A stop cuts the
 * wait short and gives the call up. */
static int store_retry_wait(es_engine *e, store_retry *t, int64_t limit_ms) {
  int64_t wait = jittered(t->base_ms);
  t->base_ms = t->base_ms * 2 > STORE_WAIT_MAX_MS ? STORE_WAIT_MAX_MS : t->base_ms * 2;
  if (limit_ms >= 0) {
    int64_t left = t->first_ms + limit_ms - es_mono_ms();
    if (left <= 0) return 0;
    if (wait > left) wait = left;
  }
  if (atomic_load(&e->stopping)) return 0;
  engine_sleep(e, wait);
  return !atomic_load(&e->stopping);
}

/* ---------------------------------------------------------------------- */
/* dispatch */

/* Attempts of ev that neither completed nor failed (the process died in
 * the handler, a worker was abandoned after it lost its claim) since the
 * last recorded failure or revive: they count toward max_failures, or a
 * handler that kills its process would be retried forever. */
static int64_t lost_attempts(const es_event *ev) {
  int64_t ended = ev->last_failed_attempt == ES_NONE ? 0 : ev->last_failed_attempt;
  int64_t lost = ev->attempts - 1 - ended;
  return lost > 0 ? lost : 0;
}

/* The n-th retry waits between half and all of min(backoff * 2^(n-1), cap). */
static int64_t backoff_for(const es_engine *e, int64_t n) {
  int64_t base = e->o.backoff_ms;
  for (int64_t i = 1; i < n && base < e->o.backoff_cap_ms; i++) base *= 2;
  if (base > e->o.backoff_cap_ms) base = e->o.backoff_cap_ms;
  if (base <= 0) return 0;
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)es_mono_ms();
  int64_t half = base / 2;
  return half + (int64_t)(r % (uint64_t)(base - half + 1));
}

/* Records a failed attempt (from the worker, or from the keeper for an
 * abandoned one). patient: ride out a store outage (a worker; the keeper,
 * the watchdog of every call, must not wait: its attempt's claim expires
 * and the attempt counts as lost). */
static void record_failure(es_engine *e, int id, const claim_info *c, const char *error,
                           int retry_now, int patient) {
  int outcome = 0;
  int64_t failures = 0;
  es_err err = {0};
  /* Lost attempts count: the store dead-letters at max, so lower it by
   * them (never below this failure, which always counts). */
  int64_t max = e->o.max_failures - c->lost;
  if (max < c->failures + 1) max = c->failures + 1;
  int64_t wait = retry_now ? 0 : backoff_for(e, c->failures + c->lost + 1);
  store_retry retry = {0, STORE_WAIT_FIRST_MS};
  int rc;
  /* The same fail again is idempotent (the same outcome, counted once). */
  while ((rc = es_store_fail(e->s, c->session, c->index, c->attempt, error, max, wait, &outcome,
                             &failures, &err)) == ES_STORAGE && patient) {
    store_failed(e, id, &retry, "recording a failure", rc, &err);
    if (!store_retry_wait(e, &retry, e->o.outage_ms)) break;
  }
  if (rc == ES_OK) store_answered(e, id);
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
static es_type_set *types_get(es_engine *e) {
  pthread_mutex_lock(&e->types_mu);
  es_type_set *t = e->types;
  if (t) atomic_fetch_add(&t->refs, 1);
  pthread_mutex_unlock(&e->types_mu);
  return t;
}

/* Rescans scripts/handlers (at a run's start, then every second by the
 * keeper), so a handler file added while the engine runs is picked up. */
static void types_refresh(es_engine *e) {
  es_err err = {0};
  es_type_set *fresh = es_type_set_scan(e->scripts, &err);
  if (!fresh) { /* keep the old set; say why once, not every second */
    if (!e->types_failing) es_engine_log(e, 0, "cannot rescan the handlers: %s", err.msg);
    e->types_failing = 1;
    return;
  }
  e->types_failing = 0;
  pthread_mutex_lock(&e->types_mu);
  es_type_set *old = e->types;
  e->types = fresh;
  e->types_at = es_mono_ms();
  pthread_mutex_unlock(&e->types_mu);
  es_type_set_release(old);
}

/* What handling one event came to. */
enum { RUN_HANDLED, RUN_FAILED, RUN_RELEASE };

typedef struct job {
  runner *r;
  const es_event *ev;
  int result;
  char *error;       /* malloc'd, for RUN_FAILED */
  es_new_event *evs; /* what the handler returned (anchored on the stack) */
  size_t n;
} job;

static void job_error(job *j, const char *msg) {
  free(j->error);
  j->error = strdup(msg ? msg : "unknown error");
  j->result = RUN_FAILED;
}

/* Everything of one event that runs Lua, as one budgeted call: finding
 * and loading the handler, calling it, and converting what it returned
 * (metamethods included) and encoding the payloads (within the size
 * limit). Leaves the converted events on the stack, with what they borrow. */
static int run_job(lua_State *L) {
  job *j = lua_touserdata(L, 1);
  const es_event *ev = j->ev;
  es_engine *e = j->r->e;
  es_loader_call(L, "handler", ev->type);
  if (!lua_isnil(L, -2)) { /* the load error */
    lua_pushvalue(L, -2);
    return lua_error(L);
  }
  if (lua_isnil(L, -3)) {
    /* Its handler file went away between the scan and the claim: never
     * settle work this engine cannot do; the claim expires and an engine
     * with the handler takes it. */
    j->result = RUN_RELEASE;
    return 0;
  }
  lua_pop(L, 2);
  es_lua_push_event(L, ev, 1);
  es_push_ctx(L, j->r, ev);
  lua_call(L, 2, 1);
  j->result = RUN_HANDLED;
  if (lua_isnil(L, -1)) return 0; /* nothing to append: no clock, no conversion */
  int64_t now;
  es_err err = {0};
  atomic_fetch_add(&j->r->b.trusted, 1);
  int rc = es_store_now(e->s, &now, &err);
  atomic_fetch_sub(&j->r->b.trusted, 1);
  if (rc) return es_lua_raise(L, &err);
  j->evs = es_lua_check_events(L, -1, 0, now, es_store_max_payload(e->s), &j->n);
  return 3; /* the returned table (it holds the events' strings), the events, their payloads */
}

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
 * falls that far behind. */

/* Completions per transaction at most: enough to share one sync among
 * many, few enough that one commit stays short beside a claim's TTL (on
 * a busy PostgreSQL a completion costs a millisecond or two). */
#define COMPLETE_MAX 64
#define COMPLETE_BACKLOG 1024 /* completions waiting before workers wait too */

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
                                  size_t n) {
  size_t room = sizeof(completion) + n * sizeof(es_new_event) + str_room(c->session) +
                str_room(c->type);
  for (size_t i = 0; i < n; i++)
    room += str_room(evs[i].id) + str_room(evs[i].type) + str_room(evs[i].lane) +
            str_room(evs[i].key) + (evs[i].payload ? evs[i].payload_len + 1 : 0);
  completion *p = malloc(room);
  if (!p) return NULL;
  memset(p, 0, sizeof *p);
  p->worker = worker;
  p->c = *c;
  p->n = n;
  p->evs = n ? (es_new_event *)(p + 1) : NULL;
  char *at = (char *)(p + 1) + n * sizeof(es_new_event);
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
  }
  return p;
}

/* Hands the completion of a handled job to the completer: types the
 * engine has no handler for are stored processed (CONTRACT §4: facts
 * nobody here handles must not sit pending; the set is at most a second
 * old, as the loader's view), ids are fixed, the events copied. A failure
 * here fails the job. */
static void hand_over(job *j, const claim_info *c) {
  es_engine *e = j->r->e;
  es_err err = {0};
  char (*ids)[ES_MAX_ID_BYTES + 1] = NULL;
  if (j->n) {
    if (!(ids = calloc(j->n, sizeof *ids))) {
      job_error(j, "out of memory");
      return;
    }
    es_type_set *ts = types_get(e);
    for (size_t i = 0; i < j->n; i++)
      if (!j->evs[i].settled && !es_type_set_has(ts, j->evs[i].type)) j->evs[i].settled = 1;
    es_type_set_release(ts);
    for (size_t i = 0; i < j->n; i++) {
      if (j->evs[i].id) continue;
      if (es_store_new_id(e->s, ids[i], &err)) {
        job_error(j, err.msg);
        free(ids);
        return;
      }
      j->evs[i].id = ids[i];
    }
  }
  completion *p = completion_new(j->r->id, c, j->evs, j->n);
  free(ids);
  if (!p) {
    job_error(j, "out of memory");
    return;
  }
  pthread_mutex_lock(&j->r->mu);
  p->renewed_ms = j->r->renewed_ms; /* the keeper renews it while it waits (renew_waiting) */
  pthread_mutex_unlock(&j->r->mu);
  p->handed_ms = es_mono_ms();
  pthread_mutex_lock(&e->c_mu);
  while (e->c_n >= COMPLETE_BACKLOG && !e->c_quit) pthread_cond_wait(&e->c_done, &e->c_mu);
  atomic_fetch_add(&e->unacked, 1);
  if (e->c_tail) e->c_tail->next = p;
  else e->c_head = p;
  e->c_tail = p;
  /* the completer waits only on an empty list */
  if (e->c_n++ == 0) pthread_cond_signal(&e->c_cond);
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
                           .evs = p->evs, .n = p->n};
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
      record_failure(e, p->worker, &p->c, msg, 0, 1);
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
        store_answered(e, p->worker);
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
        record_failure(e, p->worker, &p->c, msg, 0, 1);
      }
      free(p);
    }
    n = keep;
    if (n == 0 || !storage) continue;
    store_failed(e, items[0]->worker, &retry, "completing", ES_STORAGE, &storage_err);
    if (store_retry_wait(e, &retry, e->o.outage_ms)) continue;
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

/* How often a claim is renewed while its event is worked on (ttl/3). */
static int64_t renew_every(const es_engine *e) {
  return e->o.ttl_ms / 3 > 10 ? e->o.ttl_ms / 3 : 10;
}

/* The keeper renews the claims of completions still waiting in the list
 * that were not renewed for renew_every: a handled event's claim must
 * outlast the wait for its completion's turn (a busy store), or another
 * engine takes the event again and this result is dropped as superseded.
 * (A completion whose claim ran out still lands while nobody has taken
 * the event since, so the completer itself does not renew.) What to renew
 * is copied under c_mu (the completer frees items once answered); the
 * renewals are made after, one call per run of one session's items. */
static void renew_waiting(es_engine *e, int64_t now) {
  enum { MAX = 256 }; /* per keeper tick; the rest on the next one, 50 ms later */
  es_claim_ref refs[MAX];
  char *sessions[MAX];
  size_t n = 0;
  pthread_mutex_lock(&e->c_mu);
  for (completion *p = e->c_head; p && n < MAX; p = p->next) {
    if (now - p->renewed_ms < renew_every(e)) continue;
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

/* The completer: takes every completion waiting (up to COMPLETE_MAX) and
 * commits them together, until the run's end has drained the list. */
static void *completer_main(void *arg) {
  es_engine *e = arg;
  completion *items[COMPLETE_MAX];
  es_completion *v = malloc(COMPLETE_MAX * sizeof *v);
  pthread_mutex_lock(&e->c_mu);
  for (;;) {
    while (!e->c_head && !e->c_quit) pthread_cond_wait(&e->c_cond, &e->c_mu);
    if (!e->c_head) break;
    size_t n = 0;
    /* out of memory for v: one at a time through the stack */
    es_completion one;
    size_t max = v ? COMPLETE_MAX : 1;
    while (e->c_head && n < max) {
      items[n++] = e->c_head;
      e->c_head = e->c_head->next;
    }
    if (!e->c_head) e->c_tail = NULL;
    e->c_n -= n;
    pthread_cond_broadcast(&e->c_done); /* room for workers waiting to hand over */
    e->c_busy_since = items[0]->handed_ms;
    pthread_mutex_unlock(&e->c_mu);
    complete_batch(e, items, v ? v : &one, n);
    pthread_mutex_lock(&e->c_mu);
    e->c_busy_since = 0;
    atomic_fetch_sub(&e->unacked, (long long)n);
    pthread_cond_broadcast(&e->c_done);
  }
  pthread_mutex_unlock(&e->c_mu);
  free(v);
  return NULL;
}

/* Whether the completions are falling behind: the oldest one not yet
 * answered was handed over more than LAG_MS (or hold_ms / 2) ago. Workers
 * then run what they have queued but claim nothing more until the store
 * catches up: a handled event's claim must not run out while its
 * completion waits its turn, or another engine runs it again and this
 * result is dropped as superseded (a cascade once it starts: the re-run
 * adds to the very backlog that made the first one late). */
#define LAG_MS 250
static int64_t hold_ms(const es_engine *e);
static int completions_lag(es_engine *e) {
  int64_t limit = hold_ms(e) / 2 < LAG_MS ? hold_ms(e) / 2 : LAG_MS;
  pthread_mutex_lock(&e->c_mu);
  int64_t oldest = e->c_busy_since;
  if (e->c_head && (!oldest || e->c_head->handed_ms < oldest)) oldest = e->c_head->handed_ms;
  pthread_mutex_unlock(&e->c_mu);
  return oldest && es_mono_ms() - oldest > limit;
}

/* Waits until the completer answered something or ms passed. */
static void wait_acked(es_engine *e, int64_t ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += (long)(ms % 1000) * 1000000L;
  until.tv_sec += ms / 1000 + until.tv_nsec / 1000000000L;
  until.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&e->c_mu);
  if (atomic_load(&e->unacked) > 0 && !atomic_load(&e->stopping))
    pthread_cond_timedwait(&e->c_done, &e->c_mu, &until);
  pthread_mutex_unlock(&e->c_mu);
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
 * waited in the queue hold_ms (ttl_ms / 3, at most HOLD_MAX_MS), long
 * before its claim could expire, so another engine, or this one's next
 * free worker, takes it at once. A stop releases what is left. A released
 * attempt does not count as a failure nor as an attempt that never ended.
 *
 * A process that dies (kill -9, a handler crashing it) leaves its queued
 * events claimed until they expire, and each then counts as an attempt
 * that never finished (lost_attempts). So that a handler that kills its
 * process cannot drag the events it was claimed with to the dead-letter
 * queue, a claim that returns such an event keeps only the first of them
 * and releases the rest: an attempt after a lost one runs alone. */

#define BATCH_MAX 64           /* events per claim at most */
#define BATCH_WINDOW_US 20000  /* a claim takes what the handlers get through in this */
#define HOLD_MAX_MS 1000       /* queued longer than this (or ttl_ms / 3): released */
#define GC_EVERY 64            /* handled events between explicit collector steps */

static int64_t hold_ms(const es_engine *e) {
  int64_t h = e->o.ttl_ms / 3;
  if (h > HOLD_MAX_MS) h = HOLD_MAX_MS;
  return h > 0 ? h : 1;
}

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* How many events to claim at once: as many as the workers handle in
 * BATCH_WINDOW_US (a quarter of hold_ms when that is shorter), from the
 * running mean of a handler call; 1 while nothing is known. */
static int64_t claim_limit(es_engine *e) {
  int64_t us = atomic_load(&e->handler_us);
  if (us <= 0) return 1;
  int64_t window = hold_ms(e) * 1000 / 4;
  if (window > BATCH_WINDOW_US) window = BATCH_WINDOW_US;
  int64_t k = window * e->n / us;
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

/* Takes the oldest queued event into *out; 0 when the queue is empty. */
static int queue_pop(es_engine *e, queued_event *out) {
  pthread_mutex_lock(&e->q_mu);
  int got = e->q_n > 0;
  if (got) {
    *out = e->q[e->q_head];
    e->q_head = (e->q_head + 1) % e->q_cap;
    e->q_n--;
  }
  pthread_mutex_unlock(&e->q_mu);
  return got;
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

/* Takes out of the queue (under q_mu) and releases every event claimed
 * before cutoff (INT64_MAX: all of them). */
static void queue_release_before(es_engine *e, int64_t cutoff) {
  es_event *evs = NULL;
  size_t n = 0;
  pthread_mutex_lock(&e->q_mu);
  /* oldest first: the ones to release are at the head */
  while (n < e->q_n && e->q[(e->q_head + n) % e->q_cap].claimed_ms < cutoff) n++;
  if (n && (evs = malloc(n * sizeof *evs))) {
    for (size_t i = 0; i < n; i++) evs[i] = e->q[(e->q_head + i) % e->q_cap].ev;
    e->q_head = (e->q_head + n) % e->q_cap;
    e->q_n -= n;
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
}

/* Claims ready events into the queue. ES_OK with *claimed the number
 * claimed; *claimed = -1 when there was no need (the queue has events) or
 * another worker was claiming (then after it ended, or IDLE_POLL_MS):
 * the caller looks at the queue again. Otherwise the claim's error. */
static int claim_into_queue(es_engine *e, int64_t *claimed, es_err *err) {
  *claimed = -1;
  pthread_mutex_lock(&e->q_mu);
  if (e->q_n > 0) {
    pthread_mutex_unlock(&e->q_mu);
    return ES_OK;
  }
  if (e->claiming) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += IDLE_POLL_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (e->claiming && !atomic_load(&e->stopping) &&
           pthread_cond_timedwait(&e->q_cond, &e->q_mu, &until) == 0) {
    }
    pthread_mutex_unlock(&e->q_mu);
    return ES_OK;
  }
  e->claiming = 1;
  pthread_mutex_unlock(&e->q_mu);
  /* The queue was used up: claims may grow again (by a quarter). */
  int64_t cap = atomic_load(&e->claim_cap);
  if (cap >= 1 && cap < BATCH_MAX) atomic_store(&e->claim_cap, cap + cap / 4 + 1);

  es_events got;
  int64_t retry_at = ES_NONE;
  /* Only the types this engine has handlers for: others stay pending for
   * an engine that has theirs (CONTRACT §4). */
  static const char *const no_types[1] = {NULL}; /* types != NULL, n 0: claim nothing */
  es_type_set *ts = types_get(e);
  size_t n_skip;
  char **skip = es_engine_skip_list(e, &n_skip); /* sessions another holder owns */
  int rc = ts ? es_store_claim_next(e->s, e->holder, e->o.ttl_ms, claim_limit(e),
                                    ts->n ? (const char *const *)ts->v : no_types, ts->n,
                                    (const char *const *)skip, n_skip, &got, &retry_at, err)
              : es_fail(err, ES_STORAGE, "out of memory");
  es_engine_skip_free(skip, n_skip);
  es_type_set_release(ts);
  size_t keep = rc == ES_OK ? got.n : 0;
  if (keep > 1) {
    /* An attempt after a lost one runs alone (the section comment). */
    size_t first = got.n;
    for (size_t i = 0; i < got.n && first == got.n; i++)
      if (lost_attempts(&got.v[i]) > 0) first = i;
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
  pthread_cond_broadcast(&e->q_cond);
  pthread_mutex_unlock(&e->q_mu);
  /* What did not fit (out of memory) is released, not held. */
  for (size_t i = pushed; i < keep; i++) {
    es_event *ev = &got.v[i];
    release_events(e, &ev, 1);
    es_event_destroy(ev);
  }
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
static int handle(runner *r, const es_event *ev, int64_t claimed_ms) {
  es_engine *e = r->e;
  lua_State *L = r->L;
  job j = {r, ev, RUN_FAILED, NULL, NULL, 0};
  claim_info c = {ev->session, ev->type, ev->index, ev->attempts, ev->failures,
                  lost_attempts(ev)};
  if (c.failures + c.lost >= e->o.max_failures) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%lld earlier attempts never finished (the process running the handler died, was "
             "killed or called os.exit, or its worker was abandoned)",
             (long long)c.lost);
    record_failure(e, r->id, &c, msg, 1, 1); /* failures + lost >= max: dead-letters it */
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
  watch_start(r);
  pthread_mutex_unlock(&r->mu);

  int64_t t0 = mono_us();
  lua_settop(L, 0);
  lua_pushcfunction(L, run_job);
  lua_pushlightuserdata(L, &j);
  uint64_t run_t0 = es_type_stats_begin(&e->tstats); /* §3.12 */
  int rc = es_budget_pcall(L, 1, 3);
  uint64_t run_ns = es_type_stats_end(&e->tstats, run_t0);
  if (rc != LUA_OK) job_error(&j, lua_tostring(L, -1));
  /* A collector a handler stopped runs again; and every GC_EVERY events
   * a step collects garbage within a watched window (a finalizer may
   * run). A step after every call cost more than the trivial handler's
   * whole dispatch, and the collector steps with allocations anyway. */
  if (!lua_gc(L, LUA_GCISRUNNING)) lua_gc(L, LUA_GCRESTART);
  if (++r->gc_due >= GC_EVERY) {
    r->gc_due = 0;
    lua_gc(L, LUA_GCSTEP, 0);
  }
  note_handler_time(e, mono_us() - t0);

  pthread_mutex_lock(&r->mu);
  int abandoned = r->abandoned;
  if (!abandoned) r->finishing = 1;
  pthread_mutex_unlock(&r->mu);
  if (abandoned) {
    free(j.error);
    return 1;
  }
  if (j.result == RUN_RELEASE)
    es_engine_log(e, r->id, "%s #%lld %s: its handler file is gone; left for its claim to expire",
                  ev->session, (long long)ev->index, ev->type);
  else if (j.result == RUN_HANDLED) hand_over(&j, &c);
  if (j.result == RUN_FAILED) {
    int stop = j.error && strstr(j.error, "interrupted: the engine is stopping") != NULL;
    record_failure(e, r->id, &c, j.error ? j.error : "unknown error", stop, 1);
  }
  if (run_t0 && j.result != RUN_RELEASE)
    es_type_stats_run(&e->tstats, ev->type, run_ns, j.result == RUN_FAILED);
  free(j.error);
  lua_settop(L, 0);
  pthread_mutex_lock(&r->mu);
  r->busy = 0;
  r->finishing = 0;
  r->session = r->type = NULL;
  pthread_mutex_unlock(&r->mu);
  return 0;
}

static void engine_sleep(es_engine *e, int64_t ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&e->mu);
  if (!atomic_load(&e->stopping)) pthread_cond_clockwait(&e->cond, &e->mu, CLOCK_MONOTONIC, &until);
  pthread_mutex_unlock(&e->mu);
}

/* Ends the run: wakes idle workers and interrupts busy ones. */
static void begin_stop(es_engine *e) {
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
    atomic_fetch_sub(&r->e->running, 1);
    return;
  }
  es_engine *e = r->e;
  runner_free_now(r);
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

static void *worker_main(void *arg) {
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
    if (!active) {
      atomic_fetch_add(&e->busy, 1);
      active = 1;
    }
    queued_event q;
    if (queue_pop(e, &q)) {
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
        continue;
      }
      int gone = handle(r, &q.ev, q.claimed_ms);
      es_event_destroy(&q.ev);
      if (gone) {
        active = 0; /* abandon() took it out of e->busy: this run may be long over */
        break;
      }
      continue;
    }
    /* Read before the claim: completions answered after it may have made
     * events ready (the next of a lane) that the claim did not see. */
    int64_t unacked = atomic_load(&e->unacked);
    int64_t claimed;
    es_err err = {0};
    if (completions_lag(e)) {
      wait_acked(e, IDLE_POLL_MS);
      continue;
    }
    int rc = claim_into_queue(e, &claimed, &err);
    if (rc == ES_OK && claimed >= 0) {
      if (retry.first_ms) retry = (store_retry){0, IDLE_POLL_MS};
      store_answered(e, r->id);
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
        begin_stop(e);
        break;
      }
      if (rc == ES_STORAGE) note_orphaned_claim(e);
      store_failed(e, r->id, &retry, "claiming", rc, &err);
      if (!store_retry_wait(e, &retry, idle_run ? e->o.outage_ms : -1)) {
        if (!atomic_load(&e->stopping)) {
          snprintf(msg, sizeof msg, "claiming failed for %lld ms (outage_ms): %s",
                   (long long)(es_mono_ms() - retry.first_ms), err.msg);
          run_error(e, rc, msg);
          begin_stop(e);
        }
        break;
      }
      continue;
    }
    /* Nothing ready now. Completions still on their way to the store may
     * make events ready, and must be stored before an until_idle run
     * ends: wait for them (still busy). */
    if (unacked > 0) {
      wait_acked(e, IDLE_POLL_MS);
      continue;
    }
    /* With until_idle, the run is over once no other worker is busy either
     * (a busy one may still produce events), and no claim lost in an
     * outage is still to expire and be taken again. */
    active = 0;
    if (atomic_fetch_sub(&e->busy, 1) == 1 && atomic_load(&e->until_idle) &&
        es_mono_ms() >= atomic_load(&e->orphans_until)) {
      begin_stop(e);
      break;
    }
    atomic_fetch_add(&e->sleeping, 1);
    engine_sleep(e, IDLE_POLL_MS);
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
  /* It was busy (in a handler); its thread, whenever it comes back, must
   * not count itself out of a later run's e->busy. */
  atomic_fetch_sub(&e->busy, 1);
  pthread_detach(r->thread);
  es_engine_log(e, r->id, "%s #%lld %s: %s", c.session, (long long)c.index, c.type, cause);
  record_failure(e, r->id, &c, cause, atomic_load(&e->stopping), 0);

  runner *fresh = NULL;
  if (!atomic_load(&e->stopping)) {
    es_err err = {0};
    fresh = runner_new(e, r->id, &err);
    if (fresh && pthread_create(&fresh->thread, NULL, worker_main, fresh) != 0) {
      runner_free_now(fresh);
      fresh = NULL;
    }
    if (!fresh) es_engine_log(e, r->id, "cannot replace the abandoned worker: %s", err.msg);
  }
  pthread_mutex_lock(&e->mu);
  e->slots[slot] = fresh;
  if (!fresh) atomic_fetch_sub(&e->running, 1);
  pthread_mutex_unlock(&e->mu);
}

/* The keeper: renews the claims of handlers in flight every ttl/3, and
 * watches every call (watch()). Runs until the last worker has finished,
 * so handlers finishing during a stop keep their claims. */
static void *keeper_main(void *arg) {
  es_engine *e = arg;
  int64_t every = renew_every(e);
  while (!atomic_load(&e->keeper_quit)) {
    sleep_ms(WATCH_EVERY_MS < every ? WATCH_EVERY_MS : every);
    int64_t now = es_mono_ms();
    if (now - e->types_at >= 1000) types_refresh(e);
    es_engine_renew_leases(e, now);
    queue_release_before(e, now - hold_ms(e)); /* Prefetch: nothing waits behind slow handlers */
    renew_waiting(e, now);
    for (int i = 0; i < e->n; i++) {
      pthread_mutex_lock(&e->mu);
      runner *r = e->slots[i];
      pthread_mutex_unlock(&e->mu);
      if (!r) continue;
      char cause[512];
      pthread_mutex_lock(&r->mu);
      int gone = watch(e, r, now, cause, sizeof cause);
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

/* ---------------------------------------------------------------------- */
/* open, run, close */

void es_engine_opts_init(es_engine_opts *o) {
  memset(o, 0, sizeof *o);
  o->scripts = "scripts";
  o->workers = 1;
  o->ttl_ms = 30000;
  o->max_failures = 5;
  o->backoff_ms = 1000;
  o->backoff_cap_ms = 60000;
  o->instruction_budget = 100000000;
  o->memory_budget = 64 * 1024 * 1024;
  o->deadline_ms = 300000;
  o->snapshot_every = 100;
  o->outage_ms = 60000;
}

static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi, es_err *err) {
  if (v >= lo && v <= hi) return ES_OK;
  return es_fail(err, ES_INVALID_ARGUMENT, "%s must be an integer from %lld to %lld (got %lld)",
                 name, (long long)lo, (long long)hi, (long long)v);
}

static int check_opts(const es_engine_opts *o, es_err *err) {
  int rc;
  if ((rc = check_range("workers", o->workers, 1, ES_ENGINE_MAX_WORKERS, err)) ||
      (rc = check_range("ttl_ms", o->ttl_ms, 1, MAX_MS, err)) ||
      (rc = check_range("max_failures", o->max_failures, 1, 1000000000, err)) ||
      (rc = check_range("backoff_ms", o->backoff_ms, 0, MAX_MS, err)) ||
      (rc = check_range("backoff_cap_ms", o->backoff_cap_ms, 0, MAX_MS, err)) ||
      (rc = check_range("instruction_budget", o->instruction_budget, 0, INT64_MAX / 2, err)) ||
      (rc = check_range("memory_budget", o->memory_budget, 0, INT64_MAX / 2, err)) ||
      (rc = check_range("deadline_ms", o->deadline_ms, 1, MAX_MS, err)) ||
      (rc = check_range("snapshot_every", o->snapshot_every, 0, INT64_MAX / 2, err)) ||
      (rc = check_range("outage_ms", o->outage_ms, 0, MAX_MS, err)))
    return rc;
  if (!o->scripts || !*o->scripts) return es_fail(err, ES_INVALID_ARGUMENT, "scripts must name a directory");
  struct stat st;
  if (stat(o->scripts, &st) != 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "scripts directory '%s' does not exist (%s)",
                   o->scripts, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return es_fail(err, ES_INVALID_ARGUMENT, "scripts '%s' is not a directory", o->scripts);
  if (o->holder && (!*o->holder || strlen(o->holder) > ES_MAX_ID_BYTES))
    return es_fail(err, ES_INVALID_ARGUMENT, "holder must be 1 to %d bytes", ES_MAX_ID_BYTES);
  return ES_OK;
}

static void engine_free(es_engine *e) {
  for (int i = 0; i < e->n && e->slots; i++)
    if (e->slots[i]) runner_free(e->slots[i]);
  free(e->slots);
  if (e->folder) {
    runner *r = e->folder;
    pthread_mutex_lock(&e->fold_mu);
    r->quit = 1;
    pthread_cond_broadcast(&e->fold_cond);
    pthread_mutex_unlock(&e->fold_mu);
    pthread_join(r->thread, NULL);
    free(r->fold_session);
    free(r->fold_reducer);
    runner_free(r);
  }
  if (e->s) es_store_release(e->s);
  free(e->scripts);
  free(e->holder);
  free(e->lua_path);
  free(e->lua_cpath);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cond);
  pthread_mutex_destroy(&e->fold_mu);
  pthread_mutex_destroy(&e->state_mu);
  pthread_mutex_destroy(&e->types_mu);
  es_engine_leases_free(e);
  pthread_mutex_destroy(&e->lease_mu);
  /* a run releases its queue and drains its completions before it returns */
  for (size_t i = 0; i < e->q_n; i++) es_event_destroy(&e->q[(e->q_head + i) % e->q_cap].ev);
  free(e->q);
  while (e->c_head) {
    completion *p = e->c_head;
    e->c_head = p->next;
    free(p);
  }
  pthread_mutex_destroy(&e->q_mu);
  pthread_cond_destroy(&e->q_cond);
  pthread_mutex_destroy(&e->c_mu);
  pthread_cond_destroy(&e->c_cond);
  pthread_cond_destroy(&e->c_done);
  es_type_set_release(e->types);
  pthread_cond_destroy(&e->fold_cond);
  es_type_stats_destroy(&e->tstats); /* §3.12 */
  es_scripts_free(e);
  pthread_mutex_destroy(&e->good_mu);
  free(e);
}

void es_engine_unref(es_engine *e) {
  if (atomic_fetch_sub(&e->refs, 1) == 1) engine_free(e);
}

static char *dup_or_null(const char *s, int *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = 1;
  return d;
}

int es_engine_open(es_store *s, const es_engine_opts *o, es_engine **out, es_err *err) {
  *out = NULL;
  int rc = check_opts(o, err);
  if (rc) return rc;
  es_engine *e = calloc(1, sizeof *e);
  if (!e) return es_fail(err, ES_STORAGE, "out of memory");
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cond, NULL);
  pthread_mutex_init(&e->fold_mu, NULL);
  pthread_mutex_init(&e->state_mu, NULL);
  pthread_mutex_init(&e->types_mu, NULL);
  pthread_mutex_init(&e->good_mu, NULL);
  pthread_mutex_init(&e->lease_mu, NULL);
  pthread_mutex_init(&e->q_mu, NULL);
  pthread_cond_init(&e->q_cond, NULL);
  pthread_mutex_init(&e->c_mu, NULL);
  pthread_cond_init(&e->c_cond, NULL);
  pthread_cond_init(&e->c_done, NULL);
  atomic_init(&e->any_fenced, 0);
  pthread_cond_init(&e->fold_cond, NULL);
  es_store_retain(s);
  e->s = s;
  e->o = *o;
  char holder[64];
  if (!o->holder) {
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)es_mono_ms();
    snprintf(holder, sizeof holder, "engine-%ld-%08x", (long)getpid(), r);
  }
  int oom = 0;
  e->scripts = dup_or_null(o->scripts, &oom);
  e->holder = dup_or_null(o->holder ? o->holder : holder, &oom);
  e->lua_path = dup_or_null(o->lua_path, &oom);
  e->lua_cpath = dup_or_null(o->lua_cpath, &oom);
  e->o.scripts = e->scripts;
  e->o.holder = e->holder;
  e->o.lua_path = e->lua_path;
  e->o.lua_cpath = e->lua_cpath;
  e->n = (int)o->workers;
  e->slots = calloc((size_t)e->n, sizeof *e->slots);
  if (oom || !e->slots) {
    es_engine_unref(e);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  for (int i = 0; i < e->n; i++) {
    e->slots[i] = runner_new(e, i + 1, err);
    if (!e->slots[i]) {
      es_engine_unref(e);
      return err->code;
    }
  }
  /* CONTRACT §4: every script loads now, or the engine is not made. */
  if ((rc = es_scripts_load_all(e->slots[0], err)) != ES_OK) {
    es_engine_unref(e);
    return rc;
  }
  *out = e;
  return ES_OK;
}

void es_engine_stop(es_engine *e) { atomic_store(&e->stop_req, 1); }

es_store *es_engine_store(es_engine *e) { return e->s; }

const char *es_engine_scripts(es_engine *e) { return e->scripts; }

int64_t es_engine_reload_failures(es_engine *e) { return atomic_load(&e->reload_failures); }

static void fill_stats(es_engine *e, es_engine_stats *st) {
  st->handled = atomic_load(&e->handled);
  st->failed = atomic_load(&e->failed);
  st->dead = atomic_load(&e->dead);
  st->abandoned = atomic_load(&e->abandoned);
  /* handlers running: e->busy also counts workers that are only claiming,
   * which a "stopping: interrupting N running handlers" must not count */
  int64_t running = 0;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < e->n; i++) {
    runner *r = e->slots[i];
    if (!r) continue;
    pthread_mutex_lock(&r->mu);
    running += r->busy && !r->finishing;
    pthread_mutex_unlock(&r->mu);
  }
  pthread_mutex_unlock(&e->mu);
  st->busy = running;
}

/* Counts the pending events this engine has no handler for, and says so
 * once per run: a wrong scripts directory shows up as work left pending,
 * never as work silently done (CONTRACT §4). */
static void report_unhandled(es_engine *e, es_engine_stats *st) {
  es_type_counts tc;
  es_err err = {0};
  if (es_store_pending_types(e->s, &tc, &err) != ES_OK) return;
  es_type_set *ts = types_get(e);
  size_t used = 0;
  for (size_t i = 0; i < tc.n; i++) {
    if (tc.v[i].pending <= 0 || es_type_set_has(ts, tc.v[i].type)) continue;
    st->unhandled += tc.v[i].pending;
    size_t room = sizeof st->unhandled_types - used;
    int n = snprintf(st->unhandled_types + used, room, "%s%s", used ? ", " : "", tc.v[i].type);
    if (n < 0 || (size_t)n >= room) { /* cut, marked */
      strcpy(st->unhandled_types + sizeof st->unhandled_types - 4, "...");
      used = sizeof st->unhandled_types - 1;
    } else {
      used += (size_t)n;
    }
  }
  es_type_set_release(ts);
  es_type_counts_destroy(&tc);
  if (st->unhandled)
    es_engine_log(e, 0, "%lld pending event%s of type%s %s %s no handler here (scripts: %s)",
                  (long long)st->unhandled, st->unhandled == 1 ? "" : "s",
                  strchr(st->unhandled_types, ',') ? "s" : "", st->unhandled_types,
                  st->unhandled == 1 ? "has" : "have", e->scripts);
}

/* Lets the completer drain the list, and joins it. */
static void end_completer(es_engine *e, pthread_t completer) {
  pthread_mutex_lock(&e->c_mu);
  e->c_quit = 1;
  pthread_cond_broadcast(&e->c_cond);
  pthread_cond_broadcast(&e->c_done);
  pthread_mutex_unlock(&e->c_mu);
  pthread_join(completer, NULL);
}

int es_engine_run(es_engine *e, const es_run_opts *ro, es_engine_stats *stats, es_err *err) {
  memset(stats, 0, sizeof *stats);
  if (e->in_run) return es_fail(err, ES_INVALID_ARGUMENT, "the engine is already running");
  static const es_run_opts none = {0};
  if (!ro) ro = &none;
  int64_t every = ro->progress_ms > 0 ? ro->progress_ms : 500;
  e->in_run = 1;
  memset(&e->run_err, 0, sizeof e->run_err);
  atomic_store(&e->stop_req, 0);
  atomic_store(&e->stopping, 0);
  atomic_store(&e->keeper_quit, 0);
  atomic_store(&e->until_idle, ro->until_idle);
  atomic_store(&e->orphans_until, 0); /* a new run waits only for the claims it lost itself */
  atomic_store(&e->busy, 0);
  atomic_store(&e->handled, 0);
  atomic_store(&e->failed, 0);
  atomic_store(&e->dead, 0);
  atomic_store(&e->abandoned, 0);
  types_refresh(e);
  e->c_quit = 0;
  pthread_t completer;
  if (pthread_create(&completer, NULL, completer_main, e) != 0) {
    e->in_run = 0;
    return es_fail(err, ES_STORAGE, "cannot start the completer thread");
  }
  int started = 0;
  for (int i = 0; i < e->n; i++) {
    runner *r = e->slots[i];
    if (!r) {
      es_err ignored = {0};
      r = e->slots[i] = runner_new(e, i + 1, &ignored);
      if (!r) continue;
    }
    /* A new run looks at every script file again. */
    lua_State *L = r->L;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &loader_key);
    lua_getfield(L, -1, "new_run");
    lua_pcall(L, 0, 0, 0);
    lua_settop(L, 0);
    atomic_fetch_add(&e->running, 1);
    if (pthread_create(&r->thread, NULL, worker_main, r) != 0) {
      atomic_fetch_sub(&e->running, 1);
      runner_free(r);
      e->slots[i] = NULL;
      continue;
    }
    started++;
  }
  if (started == 0) {
    end_completer(e, completer);
    e->in_run = 0;
    return es_fail(err, ES_STORAGE, "cannot start worker threads");
  }
  pthread_t keeper;
  int keeper_started = pthread_create(&keeper, NULL, keeper_main, e) == 0;
  int64_t next = es_mono_ms() + every;
  while (atomic_load(&e->running) > 0) {
    sleep_ms(20);
    if (atomic_load(&e->stop_req)) begin_stop(e);
    if (ro->progress && es_mono_ms() >= next) {
      next = es_mono_ms() + every;
      es_engine_stats now;
      fill_stats(e, &now);
      if (ro->progress(ro->progress_ctx, &now)) begin_stop(e);
    }
  }
  begin_stop(e);
  atomic_store(&e->keeper_quit, 1);
  if (keeper_started) pthread_join(keeper, NULL);
  /* Every worker still in a slot has finished (running is 0); the
   * abandoned ones were detached and left their slots. */
  for (int i = 0; i < e->n; i++)
    if (e->slots[i]) pthread_join(e->slots[i]->thread, NULL);
  /* Every handed-over completion is stored (or given up) before the run
   * returns; prefetched events nobody started are given back. */
  end_completer(e, completer);
  queue_release_before(e, INT64_MAX);
  fill_stats(e, stats);
  stats->busy = 0;
  report_unhandled(e, stats);
  e->in_run = 0;
  if (e->run_err.code) {
    *err = e->run_err;
    return err->code;
  }
  return ES_OK;
}

/* ---------------------------------------------------------------------- */
/* es_engine_state: folds on the fold runner, watched by the caller */

static int engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                        int force, int json, int *not_json, es_buf *out, int64_t *index,
                        es_err *err);

/* The error at idx as an es_err: an eventstore error object keeps its
 * code; anything else (a reducer's own error) is INVALID_ARGUMENT. */
static void to_err(lua_State *L, int idx, es_err *err) {
  int code = ES_INVALID_ARGUMENT;
  const char *msg = NULL;
  if (lua_type(L, idx) == LUA_TTABLE && luaL_getmetafield(L, idx, "__name") != LUA_TNIL) {
    int ours = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), ES_LUA_ERROR_MT) == 0;
    lua_pop(L, 1);
    if (ours) {
      lua_getfield(L, idx, "code");
      const char *name = lua_tostring(L, -1);
      for (int c = 1; name && c < ES_NCODES; c++)
        if (strcmp(es_strerror(c), name) == 0) code = c;
      lua_pop(L, 1);
      lua_getfield(L, idx, "message");
      msg = lua_tostring(L, -1);
      lua_pop(L, 1); /* still referenced by the error object */
    }
  }
  if (!msg) msg = lua_isstring(L, idx) ? lua_tostring(L, idx) : "error object is not a string";
  es_fail(err, code, "%s", msg);
}

static int fold_job_inner(lua_State *L) {
  runner *r = lua_touserdata(L, 1);
  lua_settop(L, 0);
  /* engine:state never acts on a stale view of the scripts: a reducer
   * edited a moment ago is used now (a stat per call is cheap). */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &loader_key);
  lua_getfield(L, -1, "new_run");
  lua_call(L, 0, 0);
  lua_settop(L, 0);
  es_fold(L, r, r->fold_session, r->fold_reducer, r->fold_at, &r->fold_out, &r->fold_index,
          r->fold_force);
  if (r->fold_json) {
    /* The fold may have left the state codec's bytes (for its snapshot):
     * the caller wants the JSON view instead. */
    es_err err = {0};
    r->fold_out.len = 0;
    int rc = es_json_encode_lua(L, -1, "state", &r->fold_out, &err);
    if (rc == ES_INVALID_ARGUMENT) {
      r->fold_not_json = 1;
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "the state of reducer '%s' cannot be written as JSON: %s",
                    r->fold_reducer, err.msg);
    }
    if (rc != ES_OK) es_lua_raise(L, &err);
  } else if (r->e->o.snapshot_every == 0 && !r->fold_force) { /* fold did not encode it */
    es_err err = {0};
    char what[300];
    snprintf(what, sizeof what, "state of reducer '%s'", r->fold_reducer);
    if (es_state_encode(L, -1, what, &r->fold_out, &err) != ES_OK) es_lua_raise(L, &err);
  }
  return 0;
}

/* The fold job, in the fold runner's state, as one budgeted call: the
 * fold and the encoding of its result. An error object is caught inside
 * to keep its code (the budgeted call reports strings). */
static int fold_job(lua_State *L) {
  runner *r = lua_touserdata(L, 1);
  lua_pushcfunction(L, fold_job_inner);
  lua_pushlightuserdata(L, r);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    to_err(L, -1, &r->fold_err);
    r->fold_rc = r->fold_err.code;
  }
  return 0;
}

/* Polls flag for up to FOLD_SPIN_US: handing a fold to the fold thread
 * and back costs two thread wake-ups when either side blocks (tens of
 * microseconds each on a VM, ten times a small fold); a short poll finds a
 * quick fold's answer, or back-to-back calls' next job, without them. */
static int spin_until(atomic_int *flag) {
  int64_t until = 0;
  for (int i = 0;; i++) {
    if (atomic_load(flag)) return 1;
    if ((i & 63) == 63) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      int64_t now = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
      if (!until) until = now + FOLD_SPIN_US;
      else if (now >= until) return 0;
      sched_yield();
    }
  }
}

static void *fold_main(void *arg) {
  runner *r = arg;
  es_engine *e = r->e;
  pthread_mutex_lock(&r->mu);
  r->has_cpu = pthread_getcpuclockid(pthread_self(), &r->cpu) == 0;
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_lock(&e->fold_mu);
  for (;;) {
    if (!r->fold_pending && !r->quit) {
      pthread_mutex_unlock(&e->fold_mu);
      spin_until(&r->fold_pending);
      pthread_mutex_lock(&e->fold_mu);
    }
    while (!r->fold_pending && !r->quit) pthread_cond_wait(&e->fold_cond, &e->fold_mu);
    if (r->quit) break;
    r->fold_pending = 0;
    pthread_mutex_unlock(&e->fold_mu);

    pthread_mutex_lock(&r->mu);
    watch_start(r);
    pthread_mutex_unlock(&r->mu);
    lua_State *L = r->L;
    lua_settop(L, 0);
    lua_pushcfunction(L, fold_job);
    lua_pushlightuserdata(L, r);
    if (es_budget_pcall(L, 1, 0) != LUA_OK) {
      es_fail(&r->fold_err, ES_INVALID_ARGUMENT, "reducer '%s': %s", r->fold_reducer,
              lua_tostring(L, -1));
      r->fold_rc = ES_INVALID_ARGUMENT;
    }
    lua_settop(L, 0);
    lua_gc(L, LUA_GCRESTART);
    lua_gc(L, LUA_GCSTEP, 0);

    pthread_mutex_lock(&e->fold_mu);
    pthread_mutex_lock(&r->mu);
    int gone = r->abandoned;
    r->busy = 0;
    pthread_mutex_unlock(&r->mu);
    if (gone) break;
    r->fold_done = 1;
    pthread_cond_broadcast(&e->fold_cond);
  }
  int gone = r->abandoned;
  pthread_mutex_unlock(&e->fold_mu);
  if (gone) {
    free(r->fold_session);
    free(r->fold_reducer);
    runner_free_now(r);
    es_engine_unref(e);
  }
  return NULL;
}

int es_engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                    es_buf *out, int64_t *index, es_err *err) {
  pthread_mutex_lock(&e->state_mu);
  int rc = engine_state(e, session, reducer, at, 0, 0, NULL, out, index, err);
  pthread_mutex_unlock(&e->state_mu);
  return rc;
}

int es_engine_state_json(es_engine *e, const char *session, const char *reducer, int64_t at,
                         es_buf *out, int64_t *index, int *not_json, es_err *err) {
  pthread_mutex_lock(&e->state_mu);
  int rc = engine_state(e, session, reducer, at, 0, 1, not_json, out, index, err);
  pthread_mutex_unlock(&e->state_mu);
  return rc;
}

static int engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                        int force, int json, int *not_json, es_buf *out, int64_t *index,
                        es_err *err) {
  if (not_json) *not_json = 0;
  pthread_mutex_lock(&e->fold_mu);
  runner *r = e->folder;
  if (!r) {
    r = runner_new(e, 0, err);
    if (r && pthread_create(&r->thread, NULL, fold_main, r) != 0) {
      runner_free_now(r);
      r = NULL;
      es_fail(err, ES_STORAGE, "cannot start the fold thread");
    }
    if (!r) {
      pthread_mutex_unlock(&e->fold_mu);
      return err->code;
    }
    e->folder = r;
  }
  free(r->fold_session);
  free(r->fold_reducer);
  r->fold_session = strdup(session);
  r->fold_reducer = strdup(reducer);
  if (!r->fold_session || !r->fold_reducer) {
    pthread_mutex_unlock(&e->fold_mu);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  r->fold_at = at;
  r->fold_force = force;
  r->fold_json = json;
  r->fold_not_json = 0;
  r->fold_rc = ES_OK;
  memset(&r->fold_err, 0, sizeof r->fold_err);
  r->fold_out.len = 0;
  r->fold_done = 0;
  r->fold_pending = 1;
  pthread_cond_broadcast(&e->fold_cond);
  pthread_mutex_unlock(&e->fold_mu);
  spin_until(&r->fold_done);
  pthread_mutex_lock(&e->fold_mu);
  /* The caller is this call's watchdog. */
  while (!r->fold_done) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += WATCH_EVERY_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&e->fold_cond, &e->fold_mu, &until);
    if (r->fold_done) break;
    char cause[512];
    pthread_mutex_lock(&r->mu);
    int gone = watch(e, r, es_mono_ms(), cause, sizeof cause);
    if (gone) r->abandoned = 1;
    pthread_mutex_unlock(&r->mu);
    if (gone) {
      atomic_fetch_add(&e->refs, 1); /* the thread's, until it comes back */
      pthread_detach(r->thread);
      e->folder = NULL;
      pthread_mutex_unlock(&e->fold_mu);
      return es_fail(err, ES_INVALID_ARGUMENT, "reducer '%s': %s", reducer, cause);
    }
  }
  int rc = r->fold_rc;
  if (rc && not_json) *not_json = r->fold_not_json;
  if (rc) *err = r->fold_err;
  else if (es_buf_add(out, r->fold_out.data ? r->fold_out.data : "", r->fold_out.len) != ES_OK)
    rc = es_fail(err, ES_STORAGE, "out of memory");
  if (index) *index = r->fold_index;
  pthread_mutex_unlock(&e->fold_mu);
  return rc;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The reducer names of scripts/reducers (the files *.lua), sorted. */
static int reducer_names(es_engine *e, char ***out, size_t *n, es_err *err) {
  char path[4096];
  *out = NULL;
  *n = 0;
  int plen = snprintf(path, sizeof path, "%s/reducers", e->scripts);
  if (plen < 0 || (size_t)plen >= sizeof path) /* never cut short: another directory */
    return es_fail(err, ES_INVALID_ARGUMENT, "scripts directory path too long (over %zu bytes)",
                   sizeof path - 1);
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? ES_OK : es_fail(err, ES_STORAGE, "cannot read %s: %s", path, strerror(errno));
  size_t cap = 0;
  int rc = ES_OK;
  struct dirent *de;
  while (rc == ES_OK && (de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len <= 4 || de->d_name[0] == '.' || strcmp(de->d_name + len - 4, ".lua") != 0) continue;
    char *name = strndup(de->d_name, len - 4);
    if (!name || es_grow((void **)out, &cap, *n + 1, sizeof **out)) {
      free(name);
      rc = es_fail(err, ES_STORAGE, "out of memory");
    } else {
      (*out)[(*n)++] = name;
    }
  }
  closedir(d);
  if (rc == ES_OK && *n > 1) qsort(*out, *n, sizeof **out, cmp_names);
  return rc;
}

/* Whether the store would drop 1..through: every live event in the range
 * processed, through within the head. (An answer of 0 is checked again by
 * the store itself, which then says why.) */
static int truncate_allowed(es_engine *e, const char *session, int64_t through) {
  es_sessions rows;
  es_err err = {0};
  if (es_store_sessions(e->s, session, NULL, 1, &rows, &err) != ES_OK) return 0;
  int known = rows.n == 1 && strcmp(rows.v[0].session, session) == 0;
  int64_t first = known && rows.v[0].first_index > 1 ? rows.v[0].first_index : 1;
  int64_t head = known ? rows.v[0].head : 0;
  es_sessions_destroy(&rows);
  if (through > head) return 0;
  if (through < first) return 1;
  es_events range;
  if (es_store_read(e->s, session, first - 1, through, ES_NONE, &range, &err) != ES_OK) return 0;
  int ok = 1;
  for (size_t i = 0; ok && i < range.n; i++) ok = range.v[i].status == ES_STATUS_PROCESSED;
  es_events_destroy(&range);
  return ok;
}

int es_engine_truncate(es_engine *e, const char *session, int64_t through, int64_t *first_index,
                       es_err *err) {
  char **names;
  size_t n;
  *first_index = 1;
  int rc = es_check_name("session", session, err);
  if (rc == ES_OK && through < 0) rc = es_fail(err, ES_INVALID_ARGUMENT, "through must be >= 0");
  if (rc) return rc;
  /* A truncate the store would refuse (a pending or dead event in the
   * range, through past the head) must not leave snapshots behind: let the
   * store refuse it before anything is folded. */
  if (!truncate_allowed(e, session, through)) return es_store_truncate(e->s, session, through, first_index, err);
  if ((rc = reducer_names(e, &names, &n, err))) return rc;
  /* Every reducer's state at `through` is snapshotted first: once the
   * events are gone, that snapshot is where every later fold starts. */
  es_buf state;
  es_buf_init(&state);
  pthread_mutex_lock(&e->state_mu);
  for (size_t i = 0; rc == ES_OK && through > 0 && i < n; i++) {
    state.len = 0;
    rc = engine_state(e, session, names[i], through, 1, 0, NULL, &state, NULL, err);
  }
  pthread_mutex_unlock(&e->state_mu);
  es_buf_destroy(&state);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc) return rc;
  return es_store_truncate(e->s, session, through, first_index, err);
}

int es_engine_has_handler(es_engine *e, const char *type) {
  char path[4096];
  struct stat st;
  if (strchr(type, '/') && (strstr(type, "..") || type[0] == '/')) return 0;
  int n = snprintf(path, sizeof path, "%s/handlers/%s.lua", e->scripts, type);
  return n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int es_engine_append(es_engine *e, const char *session, es_new_event *evs, size_t n,
                     int64_t expected, es_events *out, int *pending, es_err *err) {
  /* One look at the scripts directory per type and call: has[i] is the
   * answer for evs[i]'s type, copied from an earlier event of that type. */
  signed char *has = n ? malloc(n) : NULL;
  if (n && !has) return es_fail(err, ES_STORAGE, "out of memory");
  for (size_t i = 0; i < n; i++) {
    has[i] = -1;
    if (!evs[i].type) continue;
    for (size_t k = 0; k < i && has[i] < 0; k++)
      if (has[k] >= 0 && strcmp(evs[k].type, evs[i].type) == 0) has[i] = has[k];
    if (has[i] < 0) has[i] = (signed char)es_engine_has_handler(e, evs[i].type);
    if (!has[i]) evs[i].settled = 1;
  }
  free(has);
  int64_t fence = es_engine_fence_of(e, session);
  /* Fenced out, the engine holds no token any more: an unfenced write now
   * would land in a session another holder owns. */
  if (fence == ES_NONE && es_engine_is_fenced(e, session))
    return es_fail(err, ES_STALE_FENCE,
                   "this engine was fenced out of session '%s' (another holder took its lease); "
                   "lease it again to write there", session);
  int rc = es_store_append(e->s, session, evs, n, expected, fence, out, pending, err);
  if (rc == ES_STALE_FENCE) es_engine_fenced_out(e, session);
  return rc;
}

struct es_type_stats *es_engine_type_stats(es_engine *e) { return &e->tstats; }

void es_engine_close(es_engine *e) {
  if (!e) return;
  es_engine_unref(e);
}
