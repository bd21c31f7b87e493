/*
 * scripts.c: what the engine's Lua states share about the script files
 * (docs/contract.md §4, docs/engine.md "Scripts directory").
 *
 * - The last source of every script that loaded. Each state (worker, fold
 *   runner, a worker replacing an abandoned one) loads scripts on its own;
 *   when a reload fails, a state that never ran the file (a fresh worker)
 *   still has a last good version to run: this one.
 * - Failed reloads: logged once per change of the file (every state tries
 *   the same file, a line each would say the same thing) and counted.
 * - es_engine_load_all: every script loaded once when the engine opens,
 *   so a typo is an error at eventstore.engine naming the file and line,
 *   never work dead-lettered later.
 */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"
#include "util/clock.h"

typedef struct es_good_script {
  char *path;
  char *src;        /* the last source that loaded */
  size_t len;
  char *failed_sig; /* the signature of the file whose reload failed last (logged) */
} es_good_script;

static es_good_script *find(es_engine *e, const char *path) {
  for (size_t i = 0; i < e->n_good; i++)
    if (strcmp(e->good[i].path, path) == 0) return &e->good[i];
  return NULL;
}

/* Finds or adds path's entry (under good_mu); NULL when out of memory. */
static es_good_script *entry(es_engine *e, const char *path) {
  es_good_script *g = find(e, path);
  if (g) return g;
  if (es_grow((void **)&e->good, &e->cap_good, e->n_good + 1, sizeof *e->good)) return NULL;
  char *p = strdup(path);
  if (!p) return NULL;
  g = &e->good[e->n_good++];
  memset(g, 0, sizeof *g);
  g->path = p;
  return g;
}

/* good_get(path) -> the last source of path that loaded, or nil */
static int l_good_get(lua_State *L) {
  es_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  const char *path = luaL_checkstring(L, 1);
  pthread_mutex_lock(&e->good_mu);
  es_good_script *g = find(e, path);
  /* lua_pushlstring can raise (memory budget): copy out first */
  size_t len = g && g->src ? g->len : 0;
  char *copy = g && g->src ? malloc(len ? len : 1) : NULL;
  if (copy) memcpy(copy, g->src, len);
  pthread_mutex_unlock(&e->good_mu);
  if (!copy) return 0; /* none (or no memory for it: as if none) */
  lua_pushlstring(L, copy, len);
  free(copy);
  return 1;
}

/* good_put(path, src): src loaded; the file's next failure is news again. */
static int l_good_put(lua_State *L) {
  es_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  const char *path = luaL_checkstring(L, 1);
  size_t len;
  const char *src = luaL_checklstring(L, 2, &len);
  char *copy = malloc(len ? len : 1);
  if (!copy) return 0; /* a reload failing later then has no fallback in a fresh state */
  memcpy(copy, src, len);
  pthread_mutex_lock(&e->good_mu);
  es_good_script *g = entry(e, path);
  if (g) {
    free(g->src);
    g->src = copy;
    g->len = len;
    free(g->failed_sig);
    g->failed_sig = NULL;
    copy = NULL;
  }
  pthread_mutex_unlock(&e->good_mu);
  free(copy);
  return 0;
}

/* reload_failed(path, sig, why): a reload failed and the last good version
 * runs on. Logged and counted once per signature of the file. */
static int l_reload_failed(lua_State *L) {
  es_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  const char *path = luaL_checkstring(L, 1);
  const char *sig = luaL_checkstring(L, 2);
  const char *why = luaL_checkstring(L, 3);
  pthread_mutex_lock(&e->good_mu);
  es_good_script *g = entry(e, path);
  int news = !g || !g->failed_sig || strcmp(g->failed_sig, sig) != 0;
  if (g && news) {
    free(g->failed_sig);
    g->failed_sig = strdup(sig); /* NULL (no memory): logged again next time, no harm */
  }
  pthread_mutex_unlock(&e->good_mu);
  if (news) {
    atomic_fetch_add(&e->reload_failures, 1);
    es_engine_log(e, 0, "%s; still running its last good version", why);
  }
  return 0;
}

void es_scripts_push_shared(lua_State *L, es_engine *e) {
  static const luaL_Reg fns[] = {
      {"get", l_good_get}, {"put", l_good_put}, {"failed", l_reload_failed}, {NULL, NULL}};
  lua_createtable(L, 0, 3);
  lua_pushlightuserdata(L, e);
  luaL_setfuncs(L, fns, 1);
}

void es_scripts_free(es_engine *e) {
  for (size_t i = 0; i < e->n_good; i++) {
    free(e->good[i].path);
    free(e->good[i].src);
    free(e->good[i].failed_sig);
  }
  free(e->good);
  e->good = NULL;
  e->n_good = e->cap_good = 0;
}

/* load_one(fn, name, runner) -> why it does not load, or nil. An
 * upcaster's `current` is noted for es_engine_append (upcast.h). */
static int load_one(lua_State *L) {
  es_loader_call(L, lua_tostring(L, 1), lua_tostring(L, 2));
  if (lua_isnil(L, -2) && strcmp(lua_tostring(L, 1), "upcaster") == 0)
    es_upcast_current_L(L, lua_touserdata(L, 3), lua_tostring(L, 2));
  lua_pushvalue(L, -2);
  return 1;
}

/* The load's watchdog: no keeper runs yet, so a top level that loops with
 * no instruction budget (0: none) is stopped by deadline_ms here, as a
 * handler call would be, instead of hanging eventstore.engine. */
typedef struct load_watch {
  es_budget *b;
  int64_t ms;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  int done;
} load_watch;

static void *load_watch_main(void *arg) {
  load_watch *w = arg;
  struct timespec until = es_timespec_in(CLOCK_REALTIME, w->ms);
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cond, &w->mu, &until);
  if (!w->done) es_budget_trip(w->b, ES_TRIP_DEADLINE);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static int load_all(runner *r, es_err *err);

int es_scripts_load_all(runner *r, es_err *err) {
  load_watch w = {&r->b, r->e->o.deadline_ms, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  pthread_t t;
  int watched = pthread_create(&t, NULL, load_watch_main, &w) == 0;
  int rc = load_all(r, err);
  if (watched) {
    pthread_mutex_lock(&w.mu);
    w.done = 1;
    pthread_cond_signal(&w.cond);
    pthread_mutex_unlock(&w.mu);
    pthread_join(t, NULL);
  }
  /* a trip that came after the last script loaded is nobody's */
  atomic_store(&r->b.trip, ES_TRIP_NONE);
  return rc;
}

static int load_all(runner *r, es_err *err) {
  static const char *const kinds[] = {"handlers", "reducers", "upcasters", "projections"};
  static const char *const fns[] = {"handler", "reducer", "upcaster", "projection"};
  lua_State *L = r->L;
  size_t bad = 0;
  int late = 0; /* past the deadline: the watchdog is spent, load no more */
  es_upcast_refresh(r->e, 1);
  es_upcast_begin(r);
  for (int k = 0; k < (int)(sizeof kinds / sizeof *kinds) && !late; k++) {
    es_type_set *names = es_script_scan(r->e->scripts, kinds[k], err);
    if (!names) return err->code;
    for (size_t i = 0; i < names->n && !late; i++) {
      lua_settop(L, 0);
      lua_pushcfunction(L, load_one);
      lua_pushstring(L, fns[k]);
      lua_pushstring(L, names->v[i]);
      lua_pushlightuserdata(L, r);
      /* budgeted: a top level that loops or allocates without end fails */
      int st = es_budget_pcall(L, 3, 1);
      if (st == LUA_OK && lua_isnil(L, -1)) continue;
      const char *why = lua_tostring(L, -1);
      late = st != LUA_OK && why && strncmp(why, "deadline exceeded", 17) == 0;
      if (bad++) continue; /* the first names the file and line; the rest are counted */
      if (st == LUA_OK) {
        es_fail(err, ES_INVALID_ARGUMENT, "%s", why ? why : "?");
      } else { /* a budget's message, then a traceback: the first line */
        size_t len = why ? strcspn(why, "\n") : 0;
        es_fail(err, ES_INVALID_ARGUMENT, "cannot load %s/%s/%s.lua: %.*s", r->e->scripts,
                kinds[k], names->v[i], (int)len, why ? why : "");
      }
    }
    es_type_set_release(names);
  }
  lua_settop(L, 0);
  if (bad > 1) {
    size_t at = strlen(err->msg);
    snprintf(err->msg + at, sizeof err->msg - at, " (and %zu more script%s that do not load)",
             bad - 1, bad == 2 ? "" : "s");
  }
  return bad ? err->code : ES_OK;
}
