/*
 * engine.c: the engine of engine.h: runners (a thread and a budgeted Lua
 * state each), riding out a store outage, opening, running and closing.
 * The rest is a file per concern, sharing engine/internal.h: dispatch.c
 * (handling an event, the prefetch queue and the prefetcher claiming
 * ahead, the workers and the keeper: claim renewal and watchdog),
 * completions.c (the completer thread),
 * fold_runner.c (es_engine_state on the fold runners), fold.c (the reducer
 * fold itself), budget.c, handlers.c, leases.c, type_stats.c.
 *
 * Dispatch: a worker claims one event with claim_next, runs the job (load
 * the handler, call it, convert and encode what it returned) as one
 * budgeted call, fixes the ids of the returned events and completes (so a
 * retried completion is idempotent). A failure is retried with exponential
 * backoff and jitter; at max_failures the event is dead-lettered with its
 * traceback. Attempts that never ended (the process died in the handler,
 * a worker was abandoned) count toward max_failures: see es_lost_attempts.
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
#include <pthread.h>
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

const char es_loader_key = 'l'; /* registry: the state's loader */


int64_t es_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t es_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t es_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void es_sleep_ms(int64_t ms) {
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
  if (e->o.quiet) return;
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
 * caller's open_core: the module is linked into this very library, so
 * handlers' require needs no .so search), and the loader
 * (lua/eventstore/loader.lua). */
static int setup_state(lua_State *L) {
  runner *r = lua_touserdata(L, 1);
  es_engine *e = r->e;
  lua_getglobal(L, "package");
  if (e->lua_path) {
    lua_pushstring(L, e->lua_path);
    lua_setfield(L, -2, "path");
  }
  if (e->lua_cpath) {
    lua_pushstring(L, e->lua_cpath);
    lua_setfield(L, -2, "cpath");
  }
  if (e->o.open_core) {
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, e->o.open_core);
    lua_setfield(L, -2, "eventstore.core");
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_getglobal(L, "os");
  lua_pushcfunction(L, l_execute);
  lua_setfield(L, -2, "execute");
  lua_pop(L, 1);
  es_determinism_setup(L, r);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "eventstore.loader");
  lua_call(L, 1, 1);
  lua_pushstring(L, e->scripts);
  lua_pushcfunction(L, l_stat);
  lua_pushcfunction(L, l_hash);
  es_scripts_push_shared(L, e);
  lua_call(L, 4, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &es_loader_key);
  return 0;
}

/* Pushes nres results of loader[fn](name[0..len), now) (name NULL: nil).
 * Raises. */
static void loader_call(lua_State *L, const char *fn, const char *name, size_t len, int64_t now,
                        int nres) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &es_loader_key);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  if (name) lua_pushlstring(L, name, len);
  else lua_pushnil(L);
  lua_pushinteger(L, now);
  lua_call(L, 2, nres);
}

/* Pushes loader[fn](name, now): value, err, extra. Raises. */
void es_loader_call(lua_State *L, const char *fn, const char *name) {
  loader_call(L, fn, name, name ? strlen(name) : 0, es_mono_ms(), 3);
}

void es_runner_free_now(runner *r) {
  es_budget_close(&r->b);
  es_upcast_end(r);
  es_buf_destroy(&r->fold_out);
  es_buf_destroy(&r->fold_in);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

runner *es_runner_new(es_engine *e, int id, es_err *err) {
  runner *r = calloc(1, sizeof *r);
  if (!r) {
    es_fail(err, ES_STORAGE, "out of memory");
    return NULL;
  }
  r->e = e;
  r->id = id;
  r->loader_gen = 1;
  pthread_mutex_init(&r->mu, NULL);
  es_buf_init(&r->fold_out);
  es_buf_init(&r->fold_in);
  char msg[512];
  r->L = es_budget_newstate(&r->b, (size_t)e->o.memory_budget, e->o.instruction_budget,
                            e->o.deadline_ms, msg, sizeof msg);
  if (!r->L) {
    es_fail(err, ES_INVALID_ARGUMENT, "cannot create an engine Lua state: %s", msg);
    es_runner_free_now(r);
    return NULL;
  }
  lua_pushcfunction(r->L, setup_state);
  lua_pushlightuserdata(r->L, r);
  if (lua_pcall(r->L, 1, 0, 0) != LUA_OK) {
    es_fail(err, ES_INVALID_ARGUMENT, "cannot set up an engine Lua state: %s",
            lua_tostring(r->L, -1));
    es_runner_free_now(r);
    return NULL;
  }
  return r;
}

static void *closer_main(void *arg) {
  es_runner_free_now(arg);
  return NULL;
}

/* Frees a runner whose thread (if any) has ended. Closing its state runs
 * the finalizers its scripts left, with hooks off (Lua's rule), so one
 * that never returns would hang the caller: the close gets CLOSE_WAIT_MS
 * on a thread of its own, and is left to it after that. */
static void runner_free(runner *r) {
  pthread_t t;
  if (pthread_create(&t, NULL, closer_main, r) != 0) {
    es_runner_free_now(r);
    return;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += CLOSE_WAIT_MS / 1000;
  if (pthread_timedjoin_np(t, NULL, &until) != 0) pthread_detach(t);
}

/* Marks the start of a watched call (under r->mu), now_ms its es_mono_ms. */
void es_watch_start(runner *r, int64_t now_ms) {
  r->busy = 1;
  r->finishing = 0;
  r->started_ms = now_ms;
  r->tripped_ms = 0;
  r->last_ticks = atomic_load(&r->b.ticks);
  r->last_cpu_ns = -1; /* the watchdog takes its baseline at its first look */
  atomic_store(&r->b.trip, ES_TRIP_NONE);
  es_engine *e = r->e;
  /* An inline run has no watchdog thread: the budget hook trips the call
   * at its deadline itself (a worker; folds are not the run's). */
  r->b.deadline_at = r->id && e->inline_now ? r->started_ms + e->o.deadline_ms : 0;
  /* a worker; folds are not the run's. Inline, a stop asked for since the
   * loop last looked is not seen by anyone else. */
  if (r->id && (atomic_load(&e->stopping) || (e->inline_now && atomic_load(&e->stop_req)))) {
    es_budget_trip(&r->b, ES_TRIP_STOP);
    r->tripped_ms = r->started_ms;
  }
}

/* The watchdog's look at one runner (under r->mu): trips a call past its
 * deadline; returns 1 (and a cause) when the runner must be abandoned. */
int es_watch(es_engine *e, runner *r, int64_t now, char *cause, size_t len) {
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
 * back as the result already stored (docs/contract.md §3.2), never a second one. */

/* Between half and all of base. */
static int64_t jittered(int64_t base) {
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)es_mono_ms();
  int64_t half = base / 2;
  return half + (int64_t)(r % (uint64_t)(base - half + 1));
}

/* A store call succeeded: an outage, if one was going on, is over. */
void es_store_answered(es_engine *e, int id) {
  if (!atomic_load(&e->answered)) atomic_store(&e->answered, 1);
  if (!atomic_load(&e->outage_since)) return;
  int64_t since = atomic_exchange(&e->outage_since, 0);
  if (since)
    es_engine_log(e, id, "the store answers again (it failed for %lld ms)",
                  (long long)(es_mono_ms() - since));
}

/* A store call (what: "claiming", ...) failed with rc: starts the call's
 * clock, and the outage's (logged by whichever call saw it first). */
void es_store_failed(es_engine *e, int id, store_retry *t, const char *what, int rc,
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
int es_store_retry_wait(es_engine *e, store_retry *t, int64_t limit_ms) {
  int64_t wait = jittered(t->base_ms);
  t->base_ms = t->base_ms * 2 > STORE_WAIT_MAX_MS ? STORE_WAIT_MAX_MS : t->base_ms * 2;
  if (limit_ms >= 0) {
    int64_t left = t->first_ms + limit_ms - es_mono_ms();
    if (left <= 0) return 0;
    if (wait > left) wait = left;
  }
  if (atomic_load(&e->stopping)) return 0;
  es_engine_sleep(e, wait);
  return !atomic_load(&e->stopping);
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
      (rc = check_range("fold_runners", o->fold_runners, 0, ES_ENGINE_MAX_WORKERS, err)) ||
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
  if (o->inline_runs && o->workers != 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "inline_runs needs workers = 1 (got %lld)",
                   (long long)o->workers);
  return ES_OK;
}

static void engine_free(es_engine *e) {
  for (int i = 0; i < e->n && e->slots; i++)
    if (e->slots[i]) runner_free(e->slots[i]);
  free(e->slots);
  for (int i = 0; i < e->n_folders && e->folders; i++) {
    runner *r = e->folders[i];
    if (!r) continue;
    pthread_mutex_lock(&e->fold_mu);
    r->quit = 1;
    pthread_cond_broadcast(&e->fold_cond);
    pthread_mutex_unlock(&e->fold_mu);
    pthread_join(r->thread, NULL);
    free(r->fold_session);
    free(r->fold_reducer);
    runner_free(r);
  }
  free(e->folders);
  if (e->inline_folder) {
    free(e->inline_folder->fold_session);
    free(e->inline_folder->fold_reducer);
    runner_free(e->inline_folder);
  }
  if (e->s) es_store_release(e->s);
  free(e->scripts);
  free(e->holder);
  free(e->lua_path);
  free(e->lua_cpath);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cond);
  pthread_cond_destroy(&e->run_cond);
  pthread_mutex_destroy(&e->fold_mu);
  es_projections_free(e);
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
  pthread_cond_destroy(&e->pf_cond);
  pthread_mutex_destroy(&e->c_mu);
  pthread_cond_destroy(&e->c_cond);
  pthread_cond_destroy(&e->c_done);
  es_type_set_release(e->types);
  es_type_set_release(e->handlers);
  pthread_cond_destroy(&e->fold_cond);
  pthread_cond_destroy(&e->fold_free);
  es_type_stats_destroy(&e->tstats); /* §3.12 */
  es_scripts_free(e);
  pthread_mutex_destroy(&e->good_mu);
  es_upcast_free(e);
  for (size_t i = 0; i < e->n_elsewhere; i++) free(e->elsewhere[i]);
  free(e->elsewhere);
  pthread_mutex_destroy(&e->up_mu);
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
  pthread_cond_init(&e->run_cond, NULL);
  pthread_mutex_init(&e->fold_mu, NULL);
  pthread_mutex_init(&e->proj_mu, NULL);
  pthread_mutex_init(&e->types_mu, NULL);
  pthread_mutex_init(&e->good_mu, NULL);
  pthread_mutex_init(&e->up_mu, NULL);
  pthread_mutex_init(&e->lease_mu, NULL);
  pthread_mutex_init(&e->q_mu, NULL);
  pthread_cond_init(&e->q_cond, NULL);
  pthread_cond_init(&e->pf_cond, NULL);
  pthread_mutex_init(&e->c_mu, NULL);
  {
    /* the completer's naps are timed on the monotonic clock: a step of
     * the wall clock must not stretch one (completions.c "Naps") */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->c_cond, &ca);
    pthread_condattr_destroy(&ca);
  }
  pthread_cond_init(&e->c_done, NULL);
  atomic_init(&e->any_fenced, 0);
  pthread_cond_init(&e->fold_cond, NULL);
  pthread_cond_init(&e->fold_free, NULL);
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
  e->n_folders = (int)o->fold_runners;
  if (e->n_folders == 0) { /* the cores, so that state requests fold in parallel */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    e->n_folders = cores < 2 ? 2 : cores > ES_ENGINE_MAX_WORKERS ? ES_ENGINE_MAX_WORKERS : (int)cores;
  }
  e->folders = calloc((size_t)e->n_folders, sizeof *e->folders);
  if (oom || !e->slots || !e->folders) {
    es_engine_unref(e);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  for (int i = 0; i < e->n; i++) {
    e->slots[i] = es_runner_new(e, i + 1, err);
    if (!e->slots[i]) {
      es_engine_unref(e);
      return err->code;
    }
  }
  /* docs/contract.md §4: every script loads now, or the engine is not made. */
  if ((rc = es_scripts_load_all(e->slots[0], err)) != ES_OK) {
    es_engine_unref(e);
    return rc;
  }
  *out = e;
  return ES_OK;
}

void es_engine_stop(es_engine *e) {
  atomic_store(&e->stop_req, 1);
  /* An inline run's handler is interrupted here: the thread that would
   * notice the stop is the one running it. (Lock-free atomics only: this
   * may run in a signal handler.) */
  runner *r = atomic_load(&e->inline_runner);
  if (r) es_budget_trip(&r->b, ES_TRIP_STOP);
}
                    
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
 * never as work silently done (docs/contract.md §4). */
static void report_unhandled(es_engine *e, es_engine_stats *st) {
  es_type_counts tc;
  es_err err = {0};
  if (es_store_pending_types(e->s, &tc, &err) != ES_OK) return;
  es_type_set *ts = es_types_get(e);
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

/* Stops the prefetcher (when the run has one) and joins it. */
static void end_prefetcher(es_engine *e, pthread_t prefetcher) {
  pthread_mutex_lock(&e->q_mu);
  int had = e->pf_run;
  e->pf_quit = 1;
  e->pf_run = e->pf_on = 0;
  pthread_cond_signal(&e->pf_cond);
  pthread_mutex_unlock(&e->q_mu);
  if (had) pthread_join(prefetcher, NULL);
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

static const char hcache_key = 'h'; /* registry: the functions of r->hcache */

/* A handler call found its function by calling the loader, a Lua call of
 * ~2,800 instructions for a table lookup (a sixth of a trivial handler's
 * dispatch on memory:); the runner now keeps what the loader answered for
 * as long as the loader itself would (until the time it answers with, or
 * the next new_run), and asks again after that. now: es_mono_ms (the
 * call's start: one clock read per event serves it all). */
void es_loader_handler(runner *r, const char *type, size_t len, int64_t now) {
  lua_State *L = r->L;
  unsigned h = (unsigned)len;
  for (size_t i = 0; i < len; i++) h = h * 31u + (unsigned char)type[i];
  size_t slot = h % (sizeof r->hcache / sizeof r->hcache[0]);
  handler_slot *c = &r->hcache[slot];
  if (c->gen == r->loader_gen && now < c->until && c->len == len && memcmp(c->type, type, len) == 0) {
    int top = lua_gettop(L);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &hcache_key) == LUA_TTABLE &&
        lua_rawgeti(L, -1, (lua_Integer)slot + 1) == LUA_TFUNCTION) {
      lua_remove(L, -2);
      lua_pushnil(L);
      lua_pushboolean(L, 1);
      return;
    }
    lua_settop(L, top); /* no longer there: asked for again */
  }
  c->gen = 0;
  loader_call(L, "handler", type, len, now, 4);
  int isnum;
  lua_Integer until = lua_tointegerx(L, -1, &isnum); /* the loader's: until when it stands */
  if (lua_type(L, -4) == LUA_TFUNCTION && lua_isnil(L, -3) && isnum && len < sizeof c->type) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &hcache_key) != LUA_TTABLE) {
      lua_pop(L, 1);
      lua_createtable(L, (int)(sizeof r->hcache / sizeof r->hcache[0]), 0);
      lua_pushvalue(L, -1);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &hcache_key);
    }
    lua_pushvalue(L, -5);
    lua_rawseti(L, -2, (lua_Integer)slot + 1);
    lua_pop(L, 1);
    memcpy(c->type, type, len);
    c->len = len;
    c->until = until;
    c->gen = r->loader_gen;
  }
  lua_pop(L, 1); /* until */
}

void es_loader_new_run(runner *r) {
  if (++r->loader_gen == 0) r->loader_gen = 1; /* 0 marks an empty slot */
  lua_State *L = r->L;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &es_loader_key);
  lua_getfield(L, -1, "new_run");
  lua_pcall(L, 0, 0, 0);
  lua_settop(L, 0);
}

/* ---------------------------------------------------------------------- */
/* Inline runs
 *
 * With inline_runs (engine.h), an until_idle run is the worker loop
 * (es_worker_main) called on the calling thread, with the run's thread,
 * the completer and the keeper folded into it: each completion is written
 * as soon as its handler returned (es_complete_waiting), and between two
 * events the loop looks at what those threads would (es_inline_tick). No
 * thread is started or joined, nothing is handed between threads: a run
 * costs its claims, handler calls and store writes. A replay runs its
 * scratch engine to idle once per input and once per timer or retry, most
 * of them with one or two events to handle, where starting and joining
 * three threads cost several times the handlers' work (bench/README.md,
 * "Replay").
 *
 * What the other threads did that an inline run does otherwise, or not:
 * - the deadline: the budget hook trips a call past it (budget.h
 *   deadline_at), where the keeper did; the message is the same;
 * - es_engine_stop trips the handler running, as the run's thread did;
 * - the scripts are scanned (and the loader told to look at its files)
 *   when the last scan is a second old, where the keeper rescanned every
 *   second and each run began with a scan: the scripts of a replay do not
 *   change under it, and a scan per run was a good part of its cost;
 * - not done: renewing claims while a handler runs, releasing prefetched
 *   events that waited, and abandoning a call stuck where no hook reaches
 *   (a C function that blocks): the loop waits for it. Hence an option for
 *   a store no other engine claims from, whose handlers are the engine's
 *   own business (the replay's scratch store on a manual clock). */

void es_inline_tick(es_engine *e) {
  if (atomic_load(&e->stop_req)) es_begin_stop(e);
  int64_t now = es_mono_ms();
  if (now - e->types_at >= 1000) {
    es_types_refresh(e);
    if (e->slots[0]) es_loader_new_run(e->slots[0]);
  }
  const es_run_opts *ro = e->run_opts;
  if (ro && ro->progress && now >= e->progress_next) {
    e->progress_next = now + e->progress_every;
    es_engine_stats st;
    fill_stats(e, &st);
    if (ro->progress(ro->progress_ctx, &st)) es_begin_stop(e);
  }
}

/* The threads of a run, until its work is done or it is stopped. */
static int run_threads(es_engine *e, const es_run_opts *ro, int64_t every, es_err *err) {
  es_types_refresh(e);
  e->c_quit = 0;
  pthread_t completer;
  if (pthread_create(&completer, NULL, es_completer_main, e) != 0)
    return es_fail(err, ES_STORAGE, "cannot start the completer thread");
  /* Claims ahead (dispatch.c): off until a worker's first claim finds work */
  pthread_mutex_lock(&e->q_mu);
  e->pf_on = e->pf_want = e->pf_quit = 0;
  e->pf_low = 0;
  e->pf_mark = -1;
  pthread_mutex_unlock(&e->q_mu);
  pthread_t prefetcher;
  int pf = pthread_create(&prefetcher, NULL, es_prefetcher_main, e) == 0;
  pthread_mutex_lock(&e->q_mu);
  e->pf_run = pf;
  pthread_mutex_unlock(&e->q_mu);
  int started = 0;
  for (int i = 0; i < e->n; i++) {
    runner *r = e->slots[i];
    if (!r) {
      es_err ignored = {0};
      r = e->slots[i] = es_runner_new(e, i + 1, &ignored);
      if (!r) continue;
    }
    es_loader_new_run(r);
    atomic_fetch_add(&e->running, 1);
    if (pthread_create(&r->thread, NULL, es_worker_main, r) != 0) {
      atomic_fetch_sub(&e->running, 1);
      runner_free(r);
      e->slots[i] = NULL;
      continue;
    }
    started++;
  }
  if (started == 0) {
    end_prefetcher(e, prefetcher);
    end_completer(e, completer);
    return es_fail(err, ES_STORAGE, "cannot start worker threads");
  }
  pthread_t keeper;
  int keeper_started = pthread_create(&keeper, NULL, es_keeper_main, e) == 0;
  /* §8: a run that goes on keeps the projections caught up beside it */
  pthread_t projector;
  int projector_started =
      !ro->until_idle && pthread_create(&projector, NULL, es_projections_main, e) == 0;
  int64_t next = es_mono_ms() + every;
  while (atomic_load(&e->running) > 0) {
    es_run_wait(e, 20, &e->running, 0);
    if (atomic_load(&e->stop_req)) es_begin_stop(e);
    if (ro->progress && es_mono_ms() >= next) {
      next = es_mono_ms() + every;
      es_engine_stats now;
      fill_stats(e, &now);
      if (ro->progress(ro->progress_ctx, &now)) es_begin_stop(e);
    }
  }
  es_begin_stop(e);
  pthread_mutex_lock(&e->mu);
  atomic_store(&e->keeper_quit, 1);
  pthread_cond_broadcast(&e->run_cond);
  pthread_mutex_unlock(&e->mu);
  if (keeper_started) pthread_join(keeper, NULL);
  if (projector_started) pthread_join(projector, NULL);
  /* Every worker still in a slot has finished (running is 0); the
   * abandoned ones were detached and left their slots. */
  for (int i = 0; i < e->n; i++)
    if (e->slots[i]) pthread_join(e->slots[i]->thread, NULL);
  /* What it claims after this point the run's end releases with the rest
   * of the queue. */
  end_prefetcher(e, prefetcher);
  /* Every handed-over completion is stored (or given up) before the run
   * returns. */
  end_completer(e, completer);
  return ES_OK;
}

/* An inline run ("Inline runs" above): the worker loop on this thread. */
static int run_inline(es_engine *e, const es_run_opts *ro, int64_t every, int relearn,
                      es_err *err) {
  runner *r = e->slots[0];
  if (!r && !(r = e->slots[0] = es_runner_new(e, 1, err))) return err->code;
  /* §7: the types the last run left out as ending elsewhere are claimed
   * again (es_engine_run forgot them), so the set is made anew now */
  if (relearn) es_types_refresh(e);
  e->run_opts = ro;
  e->progress_every = every;
  e->progress_next = es_mono_ms() + every;
  e->inline_now = 1;
  atomic_store(&e->inline_runner, r);
  atomic_store(&e->running, 1);
  es_worker_main(r); /* its end counts it out of running */
  atomic_store(&e->inline_runner, NULL);
  e->inline_now = 0;
  e->run_opts = NULL;
  es_begin_stop(e);
  es_complete_waiting(e); /* nothing is left: each was written after its handler */
  return ES_OK;
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
  /* §7: what a run learnt of chains that end elsewhere, the next one
   * learns again (the scripts may have changed in between) */
  pthread_mutex_lock(&e->up_mu);
  int relearn = e->n_elsewhere > 0;
  for (size_t i = 0; i < e->n_elsewhere; i++) free(e->elsewhere[i]);
  e->n_elsewhere = 0;
  pthread_mutex_unlock(&e->up_mu);
  int rc = e->o.inline_runs && ro->until_idle ? run_inline(e, ro, every, relearn, err)
                                              : run_threads(e, ro, every, err);
  if (rc != ES_OK) {
    e->in_run = 0;
    return rc;
  }
  /* Prefetched events nobody started are given back. */
  es_queue_release_before(e, INT64_MAX);
  /* §8: an until-idle run returns with every projection caught up */
  if (ro->until_idle && !e->run_err.code) {
    es_err perr = {0};
    if (es_projections_catch_up(e, &perr) != ES_OK) e->run_err = perr;
  }
  es_projections_release(e);
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

/* Whether a type can name a handler file as the scan of handlers/ finds
 * them (handlers.c): parts between '/' that are not empty and do not
 * start with '.' (".", "..", hidden files are never a type). Otherwise a
 * file the path happens to reach ("./t" is t.lua) would make engine:append
 * store an event pending that no run ever claims. */
static int script_type_name(const char *type) {
  for (const char *p = type;; p++) {
    if (*p == '\0' || *p == '/' || *p == '.') return 0; /* an empty part, or a dot first */
    p = strchr(p, '/');
    if (!p) return 1;
  }
}

int es_engine_has_handler(es_engine *e, const char *type) {
  char path[4096];
  struct stat st;
  if (!script_type_name(type)) return 0;
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
    /* §7: written by the engine without a revision: its type's current */
    if (evs[i].revision == ES_NONE) evs[i].revision = es_upcast_current(e, evs[i].type);
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
