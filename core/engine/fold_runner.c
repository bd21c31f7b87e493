/*
 * engine/fold_runner.c: es_engine_state, folds run on the engine's fold
 * runners (each its own budgeted Lua state and thread) and watched by the
 * caller; the fold itself is fold.c. Also which reducers exist and
 * whether a truncate would cut under a snapshot.
 *
 * Several runners (es_engine_opts.fold_runners) let state calls from
 * several threads (the HTTP server's connections) fold at once, so one
 * long fold does not hold up a short one. Nothing a fold relies on lives
 * in one runner: snapshots are the store's, read by every runner, and each
 * call asks its runner's loader to look at the script files again
 * (new_run), so an edited reducer reaches every runner at its next call.
 */
#include "engine/engine.h"

#include <dirent.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/internal.h"
#include "bridge/json_lua.h"
#include "bridge/state.h"
#include "bridge/common.h"

/* ---------------------------------------------------------------------- */
/* es_engine_state: folds on a fold runner, watched by the caller */

static int engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                        int force, int json, int *not_json, es_buf *out, int64_t *index,
                        es_err *err);
static int engine_job(es_engine *e, const char *session, const char *reducer, int64_t at,
                      int force, int json, int *not_json, const es_buf *upcast, es_buf *out,
                      int64_t *index, es_err *err);

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
   * edited a moment ago is used now (a stat per call is cheap). An inline
   * engine (a replay's, called for every session) looks at most once a
   * second, as its runs do (engine.c "Inline runs"). */
  int64_t now = es_mono_ms();
  if (!r->e->o.inline_runs || now - r->looked_ms >= 1000) {
    r->looked_ms = now;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &es_loader_key);
    lua_getfield(L, -1, "new_run");
    lua_call(L, 0, 0);
    lua_settop(L, 0);
    es_upcast_refresh(r->e, 0); /* an upcaster file added a moment ago counts too */
  }
  es_upcast_begin(r);
  if (r->fold_upcast) { /* es_engine_upcast: a list of event tables in, upcast, out */
    es_err err = {0};
    if (es_state_decode(L, r->fold_in.data ? r->fold_in.data : "", r->fold_in.len, &err) != ES_OK)
      es_lua_raise(L, &err);
    lua_Integer n = lua_istable(L, 1) ? (lua_Integer)lua_rawlen(L, 1) : 0;
    for (lua_Integer i = 1; i <= n; i++) {
      if (lua_rawgeti(L, 1, i) == LUA_TTABLE) es_upcast_event(L, r, -1);
      lua_pop(L, 1);
    }
    r->fold_out.len = 0;
    if (es_state_encode(L, 1, "events", &r->fold_out, &err) != ES_OK) es_lua_raise(L, &err);
    return 0;
  }
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

/* Polls flag for up to FOLD_SPIN_US: handing a fold to a fold runner
 * and back costs two thread wake-ups when either side blocks (tens of
 * microseconds each on a VM, ten times a small fold); a short poll finds a
 * quick fold's answer, or back-to-back calls' next job, without them. */
static int spin_until(atomic_int *flag) {
  int64_t until = 0;
  for (int i = 0;; i++) {
    if (atomic_load(flag)) return 1;
    if ((i & 63) == 63) {
      int64_t now = es_mono_us();
      if (!until) until = now + FOLD_SPIN_US;
      else if (now >= until) return 0;
      sched_yield();
    }
  }
}

/* Runs r's job (set up by engine_job) in its state, as one watched,
 * budgeted call; its outcome in r->fold_rc, fold_err, fold_out. */
static void run_job(runner *r) {
  pthread_mutex_lock(&r->mu);
  es_watch_start(r, es_mono_ms());
  /* an inline engine's fold runs on the caller, whom nobody watches: the
   * budget hook trips it at its deadline (engine.c "Inline runs") */
  if (r->e->o.inline_runs) r->b.deadline_at = r->started_ms + r->e->o.deadline_ms;
  pthread_mutex_unlock(&r->mu);
  lua_State *L = r->L;
  lua_settop(L, 0);
  lua_pushcfunction(L, fold_job);
  lua_pushlightuserdata(L, r);
  if (es_budget_pcall(L, 1, 0) != LUA_OK) {
    if (r->fold_upcast) es_fail(&r->fold_err, ES_INVALID_ARGUMENT, "upcasting: %s", lua_tostring(L, -1));
    else es_fail(&r->fold_err, ES_INVALID_ARGUMENT, "reducer '%s': %s", r->fold_reducer,
                 lua_tostring(L, -1));
    r->fold_rc = ES_INVALID_ARGUMENT;
  }
  r->b.deadline_at = 0;
  lua_settop(L, 0);
  lua_gc(L, LUA_GCRESTART);
  lua_gc(L, LUA_GCSTEP, 0);
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

    run_job(r);
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
    es_runner_free_now(r);
    es_engine_unref(e);
  }
  return NULL;
}

int es_engine_upcast(es_engine *e, const char *events, size_t len, es_buf *out, es_err *err) {
  es_buf in = {0};
  in.data = (char *)events;
  in.len = in.cap = len;
  return engine_job(e, "", "(upcasting)", ES_NONE, 0, 0, NULL, &in, out, NULL, err);
}

int es_engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                    es_buf *out, int64_t *index, es_err *err) {
  return engine_state(e, session, reducer, at, 0, 0, NULL, out, index, err);
}

int es_engine_state_json(es_engine *e, const char *session, const char *reducer, int64_t at,
                         es_buf *out, int64_t *index, int *not_json, es_err *err) {
  return engine_state(e, session, reducer, at, 0, 1, not_json, out, index, err);
}

/* Stands in a slot while its runner is being made, outside fold_mu (a
 * new Lua state takes a while, and the runners' handoffs need the lock):
 * neither empty nor idle to other callers. */
static runner starting;

/* Takes a fold runner for one call (under e->fold_mu, which it may let go
 * of meanwhile): an idle one, else a new one in an empty slot, else waits
 * for one to be given back. Idle runners are reused before a slot is
 * filled, so a quiet engine keeps one warm Lua state, and only calls at
 * once start more. *slot: its slot. NULL with *err when none exists and
 * none can start. */
static runner *take_folder(es_engine *e, int *slot, es_err *err) {
  for (;;) {
    int empty = -1, any = 0;
    for (int i = 0; i < e->n_folders; i++) {
      runner *r = e->folders[i];
      if (!r) {
        if (empty < 0) empty = i;
        continue;
      }
      any = 1;
      if (r != &starting && !r->fold_taken) {
        *slot = i;
        return r;
      }
    }
    if (empty >= 0) {
      e->folders[empty] = &starting;
      pthread_mutex_unlock(&e->fold_mu);
      es_err why = {0};
      runner *r = es_runner_new(e, 0, &why);
      if (r && pthread_create(&r->thread, NULL, fold_main, r) != 0) {
        es_runner_free_now(r);
        r = NULL;
        es_fail(&why, ES_STORAGE, "cannot start a fold thread");
      }
      pthread_mutex_lock(&e->fold_mu);
      e->folders[empty] = r;
      if (r) {
        *slot = empty;
        return r;
      }
      pthread_cond_broadcast(&e->fold_free); /* the slot is empty again */
      /* With other runners, wait for one rather than fail this call. */
      if (!any) {
        *err = why;
        return NULL;
      }
      continue; /* one may have come back meanwhile */
    }
    pthread_cond_wait(&e->fold_free, &e->fold_mu);
  }
}

static int engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                        int force, int json, int *not_json, es_buf *out, int64_t *index,
                        es_err *err) {
  return engine_job(e, session, reducer, at, force, json, not_json, NULL, out, index, err);
}

/* What a finished job gives its caller (under fold_mu). */
static int job_result(runner *r, int *not_json, es_buf *out, int64_t *index, es_err *err) {
  int rc = r->fold_rc;
  if (rc && not_json) *not_json = r->fold_not_json;
  if (rc) *err = r->fold_err;
  else if (es_buf_add(out, r->fold_out.data ? r->fold_out.data : "", r->fold_out.len) != ES_OK)
    rc = es_fail(err, ES_STORAGE, "out of memory");
  if (index) *index = r->fold_index;
  return rc;
}

/* A job on a fold runner: a fold, or (upcast not NULL) es_engine_upcast's. */
static int engine_job(es_engine *e, const char *session, const char *reducer, int64_t at,
                      int force, int json, int *not_json, const es_buf *upcast, es_buf *out,
                      int64_t *index, es_err *err) {
  if (not_json) *not_json = 0;
  pthread_mutex_lock(&e->fold_mu);
  int slot = 0;
  runner *r;
  if (e->o.inline_runs) {
    /* An inline engine folds on the calling thread, in one runner with no
     * thread of its own, one call at a time (fold_mu held throughout):
     * handing a replay's small upcasts to a thread and back cost more
     * than the upcasting (engine.c "Inline runs"). */
    if (!e->inline_folder && !(e->inline_folder = es_runner_new(e, 0, err))) {
      pthread_mutex_unlock(&e->fold_mu);
      return err->code;
    }
    r = e->inline_folder;
  } else if (!(r = take_folder(e, &slot, err))) {
    pthread_mutex_unlock(&e->fold_mu);
    return err->code;
  }
  r->fold_taken = 1;
  free(r->fold_session);
  free(r->fold_reducer);
  r->fold_session = strdup(session);
  r->fold_reducer = strdup(reducer);
  if (!r->fold_session || !r->fold_reducer) {
    r->fold_taken = 0;
    pthread_cond_signal(&e->fold_free);
    pthread_mutex_unlock(&e->fold_mu);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  r->fold_upcast = upcast != NULL;
  r->fold_in.len = 0; /* copied: an abandoned runner may read it after the caller left */
  if (upcast && es_buf_add(&r->fold_in, upcast->data, upcast->len) != ES_OK) {
    r->fold_taken = 0;
    pthread_cond_signal(&e->fold_free);
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
  if (r == e->inline_folder) {
    run_job(r);
    int rc = job_result(r, not_json, out, index, err);
    r->fold_taken = 0;
    pthread_mutex_unlock(&e->fold_mu);
    return rc;
  }
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
    int gone = es_watch(e, r, es_mono_ms(), cause, sizeof cause);
    if (gone) r->abandoned = 1;
    pthread_mutex_unlock(&r->mu);
    if (gone) {
      atomic_fetch_add(&e->refs, 1); /* the thread's, until it comes back */
      pthread_detach(r->thread);
      e->folders[slot] = NULL; /* a fresh runner takes the slot when a call needs it */
      pthread_cond_signal(&e->fold_free);
      pthread_mutex_unlock(&e->fold_mu);
      return es_fail(err, ES_INVALID_ARGUMENT, "%s%s%s: %s", upcast ? "" : "reducer '", reducer,
                     upcast ? "" : "'", cause);
    }
  }
  int rc = job_result(r, not_json, out, index, err);
  r->fold_taken = 0;
  pthread_cond_signal(&e->fold_free);
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

/* Whether the store would drop 1..through and something is left to drop:
 * every live event in the range processed, through within the head, and
 * not all of 1..through gone already. An answer of 0 leaves the call to
 * the store itself, which then says why it refuses, or (through below
 * first_index) answers the idempotent no-op that store:truncate answers:
 * folding at such a `through` would need the events that are gone. */
static int truncate_allowed(es_engine *e, const char *session, int64_t through) {
  es_sessions rows;
  es_err err = {0};
  if (es_store_sessions(e->s, session, NULL, 1, &rows, &err) != ES_OK) return 0;
  int known = rows.n == 1 && strcmp(rows.v[0].session, session) == 0;
  int64_t first = known && rows.v[0].first_index > 1 ? rows.v[0].first_index : 1;
  int64_t head = known ? rows.v[0].head : 0;
  es_sessions_destroy(&rows);
  if (through > head || through < first) return 0;
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
  for (size_t i = 0; rc == ES_OK && through > 0 && i < n; i++) {
    state.len = 0;
    rc = engine_state(e, session, names[i], through, 1, 0, NULL, &state, NULL, err);
  }
  es_buf_destroy(&state);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc) return rc;
  return es_store_truncate(e->s, session, through, first_index, err);
}

