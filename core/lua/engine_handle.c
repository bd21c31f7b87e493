/*
 * lua/engine_handle.c: the engine (CONTRACT.md §4, docs/engine.md): worker
 * threads, each with its own lua_State, that claim ready events, run the
 * Lua handler for their type, and complete or fail them; and the reducer
 * fold with snapshots.
 *
 * Dispatch is C calling Lua: a worker claims with claim_next, runs the
 * handler under lua_pcall with a traceback and two budgets, fixes the ids
 * of the returned events, and completes (so a retried completion is
 * idempotent). A failure is retried with exponential backoff and jitter;
 * at max_failures the event is dead-lettered with its traceback. A keeper
 * thread renews the claims of handlers that run long.
 *
 * Budgets: an instruction count hook, and (in worker states) an allocator
 * that refuses to grow past memory_budget, so `while true do end` or a
 * 10 GB table fails one attempt and the engine goes on.
 *
 * Loading scripts is plain Lua (LOADER below), one copy per Lua state, so
 * caches need no locks.
 */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/buf.h"
#include "codec/json.h"
#include "lua/common.h"
#include "lua/engine_handle.h"
#include "lua/events.h"
#include "codec/state.h"
#include "lua/store_handle.h"
#include "store/store.h"

#define ENGINE_MT "eventstore.Engine"
#define HOOK_EVERY 1000     /* instructions between count-hook calls */
#define IDLE_POLL_MS 50     /* how often an idle worker looks for ready events */
#define COMPLETE_TRIES 3    /* a completion failing with STORAGE is retried (same ids) */

/* The budgets of one Lua state. Found through the registry (budget_key). */
typedef struct budget {
  size_t used;            /* bytes the state holds (worker states only) */
  size_t limit;           /* 0: no memory limit (a host's state) */
  int exceeded;           /* an allocation was refused since the last reset */
  int64_t instr;          /* instructions counted in the current call */
  int64_t instr_limit;    /* 0: none */
} budget;

static const char budget_key = 0;

typedef struct es_engine es_engine;

typedef struct worker {
  es_engine *e;
  int id;
  lua_State *L;
  budget b;
  pthread_t thread;
  int started;
  /* The claim in flight, for the keeper to renew. */
  pthread_mutex_t mu;
  int busy;
  char *session;
  int64_t index, attempt;
} worker;

struct es_engine {
  es_store *s;                /* retained */
  char *scripts;
  char *holder;
  char *lua_path, *lua_cpath; /* package paths given to worker states */
  int n_workers;
  int64_t ttl_ms, max_failures, backoff_ms, backoff_cap_ms, instruction_budget, snapshot_every;
  size_t memory_budget;
  worker *workers;

  /* one run */
  atomic_int stop;
  atomic_int until_idle;
  atomic_int busy;            /* workers claiming or handling */
  atomic_int running;         /* worker threads not yet finished */
  atomic_llong handled, failed, dead;
  pthread_mutex_t mu;         /* with cond: idle workers sleep, stop wakes them */
  pthread_cond_t cond;
  int keeper_started;
  pthread_t keeper;
  int in_run;
};

/* Signals reach only globals: SIGINT/SIGTERM during run() set this. */
static volatile sig_atomic_t signalled = 0;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---------------------------------------------------------------------- */
/* budgets */

static void *budget_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  budget *b = ud;
  size_t old = ptr ? osize : 0; /* with ptr NULL, osize is a type tag */
  if (nsize == 0) {
    free(ptr);
    b->used -= old;
    return NULL;
  }
  if (b->limit && nsize > old && b->used + (nsize - old) > b->limit) {
    b->exceeded = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (!p) return NULL;
  b->used = b->used - old + nsize;
  return p;
}

static budget *get_budget(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &budget_key);
  budget *b = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return b;
}

static void count_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  budget *b = get_budget(L);
  if (!b || !b->instr_limit) return;
  b->instr += HOOK_EVERY;
  if (b->instr > b->instr_limit)
    luaL_error(L, "instruction budget exceeded (%I instructions)", (lua_Integer)b->instr_limit);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Calls the function below nargs arguments with a fresh instruction
 * budget (restoring the caller's count after: a reducer step inside a
 * handler's ctx.state has its own budget). Like lua_pcall with a traceback
 * handler; a refused allocation is reported as the memory budget. On error
 * leaves the message (a string) on the stack. */
static int budget_pcall(lua_State *L, int nargs, int nresults) {
  budget *b = get_budget(L);
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int64_t saved = b ? b->instr : 0;
  lua_Hook old_hook = lua_gethook(L);
  int old_mask = lua_gethookmask(L), old_count = lua_gethookcount(L);
  if (b) {
    b->instr = 0;
    b->exceeded = 0;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
  }
  int rc = lua_pcall(L, nargs, nresults, base);
  if (b) {
    lua_sethook(L, old_hook, old_mask, old_count);
    b->instr = saved;
  }
  lua_remove(L, base);
  if (rc != LUA_OK) {
    if (b && b->exceeded) {
      lua_pop(L, 1);
      lua_pushfstring(L, "memory budget exceeded (%I bytes)", (lua_Integer)b->limit);
    } else if (!lua_isstring(L, -1)) {
      lua_pop(L, 1);
      lua_pushliteral(L, "error object is not a string");
    }
    if (b) b->exceeded = 0;
  }
  return rc;
}

/* ---------------------------------------------------------------------- */
/* loading scripts (one loader per Lua state) */

/* Loads handlers and reducers from the scripts directory, caching each by
 * its file's signature (mtime, size, inode) and looking again at most once
 * a second per state or when a new run starts. */
static const char LOADER[] =
    "local dir, stat, hash = ...\n"
    "local handlers, reducers, gen = {}, {}, 0\n"
    "local M = {}\n"
    "function M.new_run() gen = gen + 1 end\n"
    "local function valid(name)\n"
    "  if name == '' or name:find('\\0', 1, true) or name:sub(1, 1) == '/' then return false end\n"
    "  for part in (name .. '/'):gmatch('([^/]*)/') do\n"
    "    if part == '' or part == '.' or part == '..' then return false end\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local function lookup(cache, kind, name, now, want)\n"
    "  local c = cache[name]\n"
    "  if c and c.gen == gen and now - c.checked < 1000 then return c end\n"
    "  local path = dir .. '/' .. kind .. '/' .. name .. '.lua'\n"
    "  local sig = valid(name) and stat(path) or nil\n"
    "  if c and c.sig == sig then c.checked, c.gen = now, gen; return c end\n"
    "  c = {sig = sig, checked = now, gen = gen}\n"
    "  cache[name] = c\n"
    "  if not sig then return c end\n"
    "  local f, err = io.open(path, 'rb')\n"
    "  local src = f and f:read('a')\n"
    "  if f then f:close() end\n"
    "  local chunk = src and load(src, '@' .. path, 't')\n"
    "  if src and not chunk then chunk, err = load(src, '@' .. path, 't') end\n"
    "  if chunk then\n"
    "    local ok, res = pcall(chunk)\n"
    "    if not ok then err = tostring(res)\n"
    "    elseif type(res) ~= want then\n"
    "      err = path .. ' must return a ' .. want .. ', not ' .. type(res)\n"
    "    else c.value, c.version = res, hash(src) end\n"
    "  end\n"
    "  if err then c.err = 'cannot load ' .. path .. ': ' .. tostring(err) end\n"
    "  return c\n"
    "end\n"
    "function M.handler(name, now)\n"
    "  local c = lookup(handlers, 'handlers', name, now, 'function')\n"
    "  return c.value, c.err, c.sig ~= nil\n"
    "end\n"
    "function M.reducer(name, now)\n"
    "  local c = lookup(reducers, 'reducers', name, now, 'table')\n"
    "  return c.value, c.err, c.version\n"
    "end\n"
    "return M\n";

/* stat(path) -> "mtime_ns:size:inode" or nil */
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

/* Creates e's loader in L and keeps it in L's registry, keyed by e (a host
 * state may hold several engines). May raise. */
static void install_loader(lua_State *L, es_engine *e) {
  const char *dir = e->scripts;
  if (luaL_loadbufferx(L, LOADER, sizeof LOADER - 1, "=eventstore.loader", "t") != LUA_OK)
    lua_error(L);
  lua_pushstring(L, dir);
  lua_pushcfunction(L, l_stat);
  lua_pushcfunction(L, l_hash);
  lua_call(L, 3, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, e);
}

/* Makes sure the host state L has e's loader, and makes its next lookups
 * look at the files again: engine:state and engine:append must never act
 * on a stale view of the scripts (a stat per call is cheap). May raise. */
static void need_loader(lua_State *L, es_engine *e) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, e) == LUA_TNIL) {
    lua_pop(L, 1);
    install_loader(L, e);
    return;
  }
  lua_getfield(L, -1, "new_run");
  lua_call(L, 0, 0);
  lua_pop(L, 1);
}

/* Pushes loader[fn](name, now): value, err, extra. May raise. */
static void loader_call(lua_State *L, es_engine *e, const char *fn, const char *name) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, e);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_pushstring(L, name);
  lua_pushinteger(L, mono_ms());
  lua_call(L, 2, 3);
}

/* ---------------------------------------------------------------------- */
/* the fold */

/* C-owned event lists held by a userdata, so a Lua error in a reducer
 * step never leaks them. */
typedef struct box {
  es_events events;
  es_snapshot snap;
} box;

static int box_gc(lua_State *L) {
  box *x = lua_touserdata(L, 1);
  es_events_destroy(&x->events);
  es_snapshot_destroy(&x->snap);
  return 0;
}

static box *push_box(lua_State *L) {
  box *x = lua_newuserdatauv(L, sizeof *x, 0);
  memset(x, 0, sizeof *x);
  es_snapshot_init(&x->snap);
  lua_newtable(L);
  lua_pushcfunction(L, box_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  return x;
}

static int raise_code(lua_State *L, int code, const char *fmt, ...) {
  va_list ap;
  char msg[ES_ERRMSG_MAX];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  es_lua_push_error(L, code, msg);
  return lua_error(L);
}

/* Folds reducer over session through `at` (ES_NONE: the head) in L and
 * pushes the state. Starts from the newest snapshot of the same version
 * at or before `at`, snapshots every snapshot_every events folded, and
 * replaces a snapshot of another version. Raises error objects. */
static void fold(lua_State *L, es_engine *e, const char *session, const char *reducer,
                 int64_t at) {
  es_err err = {0};
  loader_call(L, e, "reducer", reducer);
  if (!lua_isnil(L, -2)) raise_code(L, ES_INVALID_ARGUMENT, "%s", lua_tostring(L, -2));
  if (lua_isnil(L, -3))
    raise_code(L, ES_NOT_FOUND, "no reducer '%s' in %s/reducers", reducer, e->scripts);
  const char *version = lua_tostring(L, -1);
  lua_pop(L, 2);
  int mod = lua_gettop(L);
  lua_pushstring(L, version);
  int ver = lua_gettop(L);

  int64_t head;
  if (es_store_head(e->s, session, &head, &err)) es_lua_raise(L, &err);
  if (at == ES_NONE) at = head;
  if (at < 0) raise_code(L, ES_INVALID_ARGUMENT, "at must be >= 0");
  if (at > head)
    raise_code(L, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s' (head %lld)",
               (long long)at, session, (long long)head);

  box *x = push_box(L);
  int found = 0;
  if (es_store_read_state(e->s, session, reducer, &found, &x->snap, &x->events, &err))
    es_lua_raise(L, &err);
  int stale = found && strcmp(x->snap.version ? x->snap.version : "", version) != 0;
  int64_t from = 0;
  int have_state = 0;
  if (found && !stale && x->snap.index <= at) {
    /* A snapshot that does not decode is a bad cache entry: refold. */
    if (es_state_decode(L, x->snap.state, x->snap.state_len, &err) == ES_OK) {
      from = x->snap.index;
      have_state = 1;
    }
  }
  if (!have_state) {
    if (found) {
      es_events_destroy(&x->events);
      if (es_store_read(e->s, session, 0, at, ES_NONE, &x->events, &err)) es_lua_raise(L, &err);
    }
    lua_getfield(L, mod, "init");
    if (lua_isfunction(L, -1)) {
      if (budget_pcall(L, 0, 1) != LUA_OK)
        raise_code(L, ES_INVALID_ARGUMENT, "reducer '%s' init: %s", reducer, lua_tostring(L, -1));
    } else {
      lua_pop(L, 1);
      lua_newtable(L);
    }
  }
  int st = lua_gettop(L);
  int64_t folded = 0;
  for (size_t i = 0; i < x->events.n; i++) {
    const es_event *ev = &x->events.v[i];
    if (ev->index <= from) continue;
    if (ev->index > at) break;
    folded++;
    lua_getfield(L, mod, ev->type);
    if (!lua_isfunction(L, -1)) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, st);
    es_lua_push_event(L, ev, 0);
    if (budget_pcall(L, 2, 1) != LUA_OK)
      raise_code(L, ES_INVALID_ARGUMENT, "reducer '%s' at %s #%lld (%s): %s", reducer, session,
                 (long long)ev->index, ev->type, lua_tostring(L, -1));
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1); /* changed in place */
    } else {
      lua_replace(L, st);
    }
  }
  if (e->snapshot_every > 0) {
    /* With snapshots on, an unserialisable state is an error even before
     * the first snapshot is due, so it shows up on the first fold. */
    es_buf buf;
    es_buf_init(&buf);
    char what[300];
    snprintf(what, sizeof what, "state of reducer '%s'", reducer);
    int rc = es_state_encode(L, st, what, &buf, &err);
    int stored = 0;
    if (rc == ES_OK && (folded >= e->snapshot_every || stale) && at > 0)
      rc = es_store_put_snapshot(e->s, session, reducer, at, buf.data ? buf.data : "", buf.len,
                                 lua_tostring(L, ver), &stored, &err);
    es_buf_destroy(&buf);
    if (rc) es_lua_raise(L, &err);
  }
  lua_replace(L, mod); /* the state where the module was */
  lua_settop(L, mod);
}

/* ---------------------------------------------------------------------- */
/* workers */

static void worker_log(worker *w, const char *fmt, ...) {
  va_list ap;
  char line[1024];
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "eventstore[%s/%d]: %s\n", w->e->holder, w->id, line);
}

/* ctx.now() */
static int ctx_now(lua_State *L) {
  worker *w = lua_touserdata(L, lua_upvalueindex(1));
  int64_t now;
  es_err err = {0};
  if (es_store_now(w->e->s, &now, &err)) es_lua_raise(L, &err);
  lua_pushinteger(L, now);
  return 1;
}

/* ctx.state(reducer): the session's state before the handled event. */
static int ctx_state(lua_State *L) {
  worker *w = lua_touserdata(L, lua_upvalueindex(1));
  const char *reducer = luaL_checkstring(L, 1);
  fold(L, w->e, lua_tostring(L, lua_upvalueindex(2)), reducer,
       lua_tointeger(L, lua_upvalueindex(3)) - 1);
  return 1;
}

/* ctx.log(...): one line on stderr naming the event. */
static int ctx_log(lua_State *L) {
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, lua_tostring(L, lua_upvalueindex(1)));
  for (int i = 1; i <= n; i++) {
    luaL_addchar(&b, i == 1 ? ' ' : '\t');
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  fprintf(stderr, "%s\n", lua_tostring(L, -1));
  return 0;
}

static void push_ctx(lua_State *L, worker *w, const es_event *ev) {
  lua_createtable(L, 0, 6);
  es_lua_set_str(L, "session", ev->session);
  es_lua_set_int(L, "attempt", ev->attempts);
  es_lua_set_int(L, "index", ev->index);
  lua_pushlightuserdata(L, w);
  lua_pushcclosure(L, ctx_now, 1);
  lua_setfield(L, -2, "now");
  lua_pushlightuserdata(L, w);
  lua_pushstring(L, ev->session);
  lua_pushinteger(L, ev->index);
  lua_pushcclosure(L, ctx_state, 3);
  lua_setfield(L, -2, "state");
  lua_pushfstring(L, "[%s #%I %s]", ev->session, (lua_Integer)ev->index, ev->type);
  lua_pushcclosure(L, ctx_log, 1);
  lua_setfield(L, -2, "log");
}

/* What handling one event came to. */
enum { RUN_HANDLED, RUN_SETTLE, RUN_FAILED };

typedef struct job {
  worker *w;
  const es_event *ev;
  int result;
  char *error;  /* malloc'd, for RUN_FAILED */
} job;

static void job_error(job *j, const char *msg) {
  free(j->error);
  j->error = strdup(msg ? msg : "unknown error");
  j->result = RUN_FAILED;
}

/* Parses what a handler returned (at index 1) into es_new_event structs;
 * run under lua_pcall so a malformed result fails the attempt. */
static int parse_returned(lua_State *L) {
  int64_t *now = lua_touserdata(L, 2);
  size_t *n = lua_touserdata(L, 3);
  if (lua_isnil(L, 1)) {
    lua_newtable(L);
    lua_replace(L, 1);
  }
  es_lua_check_events(L, 1, 0, *now, n);
  return 2;
}

static void complete_job(lua_State *L, job *j, es_new_event *evs, size_t n) {
  es_engine *e = j->w->e;
  const es_event *ev = j->ev;
  char (*ids)[37] = n ? lua_newuserdatauv(L, n * sizeof *ids, 0) : NULL;
  es_err err = {0};
  /* Ids fixed before the call: retrying the completion is idempotent. */
  for (size_t i = 0; i < n; i++) {
    if (evs[i].id) continue;
    if (es_store_new_id(e->s, ids[i], &err)) {
      job_error(j, err.msg);
      return;
    }
    evs[i].id = ids[i];
  }
  for (int tries = 0;; tries++) {
    int outcome = 0;
    es_events out;
    int rc = es_store_complete(e->s, ev->session, ev->index, ev->attempts, evs, n, &outcome, &out,
                               &err);
    es_events_destroy(&out);
    if (rc == ES_OK) {
      if (outcome == ES_SUPERSEDED)
        worker_log(j->w, "%s #%lld: attempt %lld was superseded; its result is dropped",
                   ev->session, (long long)ev->index, (long long)ev->attempts);
      else if (j->result == RUN_HANDLED)
        atomic_fetch_add(&e->handled, 1);
      return;
    }
    if (rc != ES_STORAGE || tries + 1 >= COMPLETE_TRIES) {
      char msg[ES_ERRMSG_MAX + 64];
      snprintf(msg, sizeof msg, "completing failed: %s: %s", es_strerror(rc), err.msg);
      if (rc == ES_STORAGE) {
        /* Leave the claim to expire: the event is retried, nothing lost. */
        worker_log(j->w, "%s #%lld: %s", ev->session, (long long)ev->index, msg);
        j->result = RUN_SETTLE;
        return;
      }
      job_error(j, msg);
      return;
    }
    sleep_ms(10 << tries);
  }
}

/* Everything for one event that touches the worker's Lua state, under one
 * lua_pcall (so running out of memory anywhere is an error, not a panic). */
static int run_job(lua_State *L) {
  job *j = lua_touserdata(L, 1);
  const es_event *ev = j->ev;
  loader_call(L, j->w->e, "handler", ev->type);
  if (!lua_isnil(L, -2)) {
    job_error(j, lua_tostring(L, -2));
    return 0;
  }
  if (lua_isnil(L, -3)) {
    j->result = RUN_SETTLE; /* no handler: settle it, never wait for one */
    complete_job(L, j, NULL, 0);
    return 0;
  }
  lua_pop(L, 2);
  es_lua_push_event(L, ev, 1);
  push_ctx(L, j->w, ev);
  if (budget_pcall(L, 2, 1) != LUA_OK) {
    job_error(j, lua_tostring(L, -1));
    return 0;
  }
  int64_t now;
  size_t n = 0;
  es_err err = {0};
  if (es_store_now(j->w->e->s, &now, &err)) {
    job_error(j, err.msg);
    return 0;
  }
  lua_pushcfunction(L, parse_returned);
  lua_insert(L, -2);
  lua_pushlightuserdata(L, &now);
  lua_pushlightuserdata(L, &n);
  if (lua_pcall(L, 3, 2, 0) != LUA_OK) {
    /* An error object (a payload JSON cannot carry) prints as CODE: message. */
    job_error(j, luaL_tolstring(L, -1, NULL));
    return 0;
  }
  j->result = RUN_HANDLED;
  complete_job(L, j, lua_touserdata(L, -2), n);
  return 0;
}

/* The n-th retry waits between half and all of min(backoff * 2^(n-1), cap). */
static int64_t backoff_for(const es_engine *e, int64_t n) {
  int64_t base = e->backoff_ms;
  for (int64_t i = 1; i < n && base < e->backoff_cap_ms; i++) base *= 2;
  if (base > e->backoff_cap_ms) base = e->backoff_cap_ms;
  if (base <= 0) return 0;
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)mono_ms();
  int64_t half = base / 2;
  return half + (int64_t)(r % (uint64_t)(base - half + 1));
}

static void handle(worker *w, const es_event *ev) {
  es_engine *e = w->e;
  lua_State *L = w->L;
  job j = {w, ev, RUN_FAILED, NULL};
  pthread_mutex_lock(&w->mu);
  w->busy = 1;
  w->session = strdup(ev->session);
  w->index = ev->index;
  w->attempt = ev->attempts;
  pthread_mutex_unlock(&w->mu);

  lua_pushcfunction(L, run_job);
  lua_pushlightuserdata(L, &j);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    job_error(&j, w->b.exceeded ? "memory budget exceeded" : lua_tostring(L, -1));
    w->b.exceeded = 0;
  }
  lua_settop(L, 0);

  if (j.result == RUN_FAILED) {
    int outcome = 0;
    int64_t failures = 0;
    es_err err = {0};
    int64_t wait = backoff_for(e, ev->failures + 1);
    int rc = es_store_fail(e->s, ev->session, ev->index, ev->attempts, j.error, e->max_failures,
                           wait, &outcome, &failures, &err);
    if (rc) {
      worker_log(w, "%s #%lld: recording the failure failed: %s: %s", ev->session,
                 (long long)ev->index, es_strerror(rc), err.msg);
    } else if (outcome == ES_DEAD_LETTERED) {
      atomic_fetch_add(&e->dead, 1);
      worker_log(w, "%s #%lld %s dead-lettered after %lld failures: %s", ev->session,
                 (long long)ev->index, ev->type, (long long)failures, j.error);
    } else if (outcome == ES_FAILED) {
      atomic_fetch_add(&e->failed, 1);
      /* One line per failed attempt (the traceback stays in last_error). */
      const char *nl = strchr(j.error, '\n');
      worker_log(w, "%s #%lld %s attempt %lld failed, retry in %lld ms: %.*s", ev->session,
                 (long long)ev->index, ev->type, (long long)ev->attempts, (long long)wait,
                 (int)(nl ? nl - j.error : (ptrdiff_t)strlen(j.error)), j.error);
    }
  }
  free(j.error);
  pthread_mutex_lock(&w->mu);
  w->busy = 0;
  free(w->session);
  w->session = NULL;
  pthread_mutex_unlock(&w->mu);
  /* What the handler left behind is garbage now; do not let it pile up
   * until the memory budget trips on the next event. */
  lua_gc(L, LUA_GCSTEP, 0);
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
  if (!atomic_load(&e->stop)) pthread_cond_clockwait(&e->cond, &e->mu, CLOCK_MONOTONIC, &until);
  pthread_mutex_unlock(&e->mu);
}

static void engine_stop(es_engine *e) {
  pthread_mutex_lock(&e->mu);
  atomic_store(&e->stop, 1);
  pthread_cond_broadcast(&e->cond);
  pthread_mutex_unlock(&e->mu);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  es_engine *e = w->e;
  while (!atomic_load(&e->stop)) {
    atomic_fetch_add(&e->busy, 1);
    es_events got;
    int64_t retry_at = ES_NONE;
    es_err err = {0};
    int rc = es_store_claim_next(e->s, e->holder, e->ttl_ms, 1, &got, &retry_at, &err);
    if (rc == ES_OK && got.n > 0) {
      handle(w, &got.v[0]);
      es_events_destroy(&got);
      atomic_fetch_sub(&e->busy, 1);
      continue;
    }
    if (rc != ES_OK) {
      worker_log(w, "claiming failed: %s: %s", es_strerror(rc), err.msg);
      if (rc == ES_CLOSED) {
        atomic_fetch_sub(&e->busy, 1);
        engine_stop(e);
        break;
      }
    }
    /* Nothing ready now. With until_idle, the run is over once no other
     * worker is busy either (a busy one may still produce events). */
    if (atomic_fetch_sub(&e->busy, 1) == 1 && atomic_load(&e->until_idle) && rc == ES_OK) {
      engine_stop(e);
      break;
    }
    engine_sleep(e, IDLE_POLL_MS);
  }
  atomic_fetch_sub(&e->running, 1);
  return NULL;
}

/* Renews the claims of handlers in flight every ttl/3, until the last
 * worker has finished (handlers in flight when a stop comes keep their
 * claims while they finish). */
static void *keeper_main(void *arg) {
  es_engine *e = arg;
  int64_t every = e->ttl_ms / 3 > 10 ? e->ttl_ms / 3 : 10;
  while (atomic_load(&e->running) > 0) {
    if (atomic_load(&e->stop)) sleep_ms(every < 20 ? every : 20);
    else engine_sleep(e, every);
    for (int i = 0; i < e->n_workers; i++) {
      worker *w = &e->workers[i];
      pthread_mutex_lock(&w->mu);
      if (w->busy && w->session) {
        es_claim_ref ref = {w->index, w->attempt};
        es_renew_result r;
        es_err err = {0};
        if (es_store_renew(e->s, w->session, e->holder, &ref, 1, e->ttl_ms, &r, &err) == ES_OK)
          es_renew_result_destroy(&r);
      }
      pthread_mutex_unlock(&w->mu);
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* worker states */

static int open_worker_state(lua_State *L) {
  es_engine *e = lua_touserdata(L, 1);
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_pushstring(L, e->lua_path);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, e->lua_cpath);
  lua_setfield(L, -2, "cpath");
  /* The module is linked into this very library: preload it, so handlers'
   * require("eventstore") needs no .so search. */
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_eventstore_core);
  lua_setfield(L, -2, "eventstore.core");
  lua_pop(L, 2);
  install_loader(L, e);
  return 0;
}

static void close_worker(worker *w) {
  if (w->L) lua_close(w->L);
  w->L = NULL;
  free(w->session);
  pthread_mutex_destroy(&w->mu);
}

static void engine_free(es_engine *e) {
  if (!e) return;
  for (int i = 0; i < e->n_workers && e->workers; i++) close_worker(&e->workers[i]);
  free(e->workers);
  if (e->s) es_store_release(e->s);
  free(e->scripts);
  free(e->holder);
  free(e->lua_path);
  free(e->lua_cpath);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cond);
  free(e);
}

static int create_workers(es_engine *e, es_err *err) {
  e->workers = calloc((size_t)e->n_workers, sizeof *e->workers);
  if (!e->workers) return es_fail(err, ES_STORAGE, "out of memory");
  for (int i = 0; i < e->n_workers; i++) {
    worker *w = &e->workers[i];
    w->e = e;
    w->id = i + 1;
    pthread_mutex_init(&w->mu, NULL);
    w->b.limit = e->memory_budget;
    w->b.instr_limit = e->instruction_budget;
    w->L = lua_newstate(budget_alloc, &w->b);
    if (!w->L) return es_fail(err, ES_STORAGE, "cannot create a worker Lua state");
    lua_pushlightuserdata(w->L, &w->b);
    lua_rawsetp(w->L, LUA_REGISTRYINDEX, &budget_key);
    lua_pushcfunction(w->L, open_worker_state);
    lua_pushlightuserdata(w->L, e);
    if (lua_pcall(w->L, 1, 0, 0) != LUA_OK)
      return es_fail(err, ES_INVALID_ARGUMENT, "cannot set up a worker Lua state (memory_budget %zu too small?): %s",
                     e->memory_budget, lua_tostring(w->L, -1));
  }
  return ES_OK;
}

/* ---------------------------------------------------------------------- */
/* run */

static void on_signal(int sig) {
  (void)sig;
  signalled = 1;
}

/* Runs the workers until stopped (or idle) on the calling thread's behalf;
 * calls progress (at stack index `progress`, 0: none) every progress_ms. */
static int engine_run(lua_State *L, es_engine *e, int until_idle, int progress, int64_t every) {
  struct sigaction sa, old_int, old_term;
  int signals = 1; /* SIGINT/SIGTERM end the run gracefully, idle or not */
  if (signals) {
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    signalled = 0;
  }
  atomic_store(&e->stop, 0);
  atomic_store(&e->until_idle, until_idle);
  atomic_store(&e->busy, 0);
  atomic_store(&e->handled, 0);
  atomic_store(&e->failed, 0);
  atomic_store(&e->dead, 0);
  atomic_store(&e->running, e->n_workers);
  e->in_run = 1;
  for (int i = 0; i < e->n_workers; i++) {
    /* A new run looks at every script file again. */
    lua_State *W = e->workers[i].L;
    lua_rawgetp(W, LUA_REGISTRYINDEX, e);
    lua_getfield(W, -1, "new_run");
    lua_pcall(W, 0, 0, 0);
    lua_settop(W, 0);
  }
  int started = 0;
  for (; started < e->n_workers; started++) {
    if (pthread_create(&e->workers[started].thread, NULL, worker_main, &e->workers[started]) != 0)
      break;
  }
  if (started < e->n_workers) atomic_fetch_sub(&e->running, e->n_workers - started);
  e->keeper_started = pthread_create(&e->keeper, NULL, keeper_main, e) == 0;
  int64_t next = mono_ms() + every;
  int cb_error = 0;
  while (atomic_load(&e->running) > 0) {
    sleep_ms(20);
    if (signalled) engine_stop(e);
    if (progress && mono_ms() >= next && !cb_error) {
      next = mono_ms() + every;
      lua_pushvalue(L, progress);
      lua_createtable(L, 0, 3);
      es_lua_set_int(L, "handled", atomic_load(&e->handled));
      es_lua_set_int(L, "failed", atomic_load(&e->failed));
      es_lua_set_int(L, "dead", atomic_load(&e->dead));
      if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        cb_error = lua_gettop(L); /* raised after the workers stop */
        engine_stop(e);
      }
    }
  }
  for (int i = 0; i < started; i++) pthread_join(e->workers[i].thread, NULL);
  engine_stop(e);
  if (e->keeper_started) pthread_join(e->keeper, NULL);
  e->keeper_started = 0;
  e->in_run = 0;
  if (signals) {
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
  }
  if (cb_error) {
    lua_pushvalue(L, cb_error);
    return lua_error(L);
  }
  if (started < e->n_workers && started == 0)
    return raise_code(L, ES_STORAGE, "cannot start worker threads");
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Lua face: eventstore.core.engine(store, opts) -> handle */

typedef struct lengine {
  es_engine *e;
} lengine;

static es_engine *check_engine(lua_State *L) {
  lengine *h = luaL_checkudata(L, 1, ENGINE_MT);
  if (!h->e) {
    es_err err = {ES_CLOSED, "the engine is closed"};
    es_lua_raise(L, &err);
  }
  return h->e;
}

static int opt_positive(lua_State *L, int arg, const char *field, int64_t def, int64_t min,
                        int64_t *out) {
  *out = es_lua_opt_int_field(L, arg, field, def);
  if (*out < min)
    return luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be >= %I", field, (lua_Integer)min));
  return 0;
}

static int l_engine_new(lua_State *L) {
  int lua_clock = 0;
  es_store *s = es_lua_check_store(L, 1, &lua_clock);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (lua_clock)
    luaL_argerror(L, 1, "the store's clock is a Lua function, which worker threads cannot call; "
                        "use eventstore.manual_clock");
  int64_t workers, ttl, maxf, backoff, cap, instr, mem, every;
  opt_positive(L, 2, "workers", 1, 1, &workers);
  opt_positive(L, 2, "ttl_ms", 30000, 1, &ttl);
  opt_positive(L, 2, "max_failures", 5, 1, &maxf);
  opt_positive(L, 2, "backoff_ms", 1000, 0, &backoff);
  opt_positive(L, 2, "backoff_cap_ms", 60000, 0, &cap);
  opt_positive(L, 2, "instruction_budget", 100000000, 0, &instr);
  opt_positive(L, 2, "memory_budget", 64 * 1024 * 1024, 0, &mem);
  opt_positive(L, 2, "snapshot_every", 100, 0, &every);
  if (workers > 256) luaL_argerror(L, 2, "field 'workers' must be at most 256");
  const char *scripts = es_lua_opt_str_field(L, 2, "scripts");
  const char *holder = es_lua_opt_str_field(L, 2, "holder");
  char holder_buf[64];
  if (!holder) {
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)mono_ms();
    snprintf(holder_buf, sizeof holder_buf, "engine-%ld-%08x", (long)getpid(), r);
    holder = holder_buf;
  }
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_getfield(L, -2, "cpath");
  const char *lpath = lua_tostring(L, -2), *cpath = lua_tostring(L, -1);

  lengine *h = lua_newuserdatauv(L, sizeof *h, 0);
  h->e = NULL;
  luaL_setmetatable(L, ENGINE_MT);
  es_engine *e = calloc(1, sizeof *e);
  if (!e) return luaL_error(L, "out of memory");
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cond, NULL);
  es_store_retain(s);
  e->s = s;
  e->scripts = strdup(scripts ? scripts : "scripts");
  e->holder = strdup(holder);
  e->lua_path = strdup(lpath ? lpath : "");
  e->lua_cpath = strdup(cpath ? cpath : "");
  e->n_workers = (int)workers;
  e->ttl_ms = ttl;
  e->max_failures = maxf;
  e->backoff_ms = backoff;
  e->backoff_cap_ms = cap;
  e->instruction_budget = instr;
  e->memory_budget = (size_t)mem;
  e->snapshot_every = every;
  es_err err = {0};
  if (!e->scripts || !e->holder || !e->lua_path || !e->lua_cpath) {
    engine_free(e);
    return luaL_error(L, "out of memory");
  }
  if (create_workers(e, &err) != ES_OK) {
    engine_free(e);
    return es_lua_raise(L, &err);
  }
  h->e = e;
  /* The caller's state folds too (engine:state): its own loader and an
   * instruction budget (its allocator is the host's, so no memory limit). */
  budget *hb = get_budget(L);
  if (!hb) {
    hb = lua_newuserdatauv(L, sizeof *hb, 0);
    memset(hb, 0, sizeof *hb);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &budget_key);
  }
  hb->instr_limit = instr;
  return 1;
}

static int l_engine_run(lua_State *L) {
  es_engine *e = check_engine(L);
  if (e->in_run) return luaL_error(L, "the engine is already running");
  int until_idle = 0, progress = 0;
  int64_t every = 500;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "until_idle");
    until_idle = lua_toboolean(L, -1);
    lua_pop(L, 1);
    every = es_lua_opt_int_field(L, 2, "progress_ms", 500);
    lua_getfield(L, 2, "progress");
    if (lua_isfunction(L, -1)) progress = lua_gettop(L);
    else lua_pop(L, 1);
  }
  engine_run(L, e, until_idle, progress, every);
  lua_createtable(L, 0, 3);
  es_lua_set_int(L, "handled", atomic_load(&e->handled));
  es_lua_set_int(L, "failed", atomic_load(&e->failed));
  es_lua_set_int(L, "dead", atomic_load(&e->dead));
  return 1;
}

static int l_engine_stop(lua_State *L) {
  engine_stop(check_engine(L));
  return 0;
}

/* engine:state(session, reducer, at) in the caller's state. */
static int l_engine_fold(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *session = luaL_checkstring(L, 2);
  const char *reducer = luaL_checkstring(L, 3);
  int64_t at = luaL_opt(L, luaL_checkinteger, 4, ES_NONE);
  lua_settop(L, 4);
  need_loader(L, e);
  fold(L, e, session, reducer, at);
  return 1;
}

/* engine:has_handler(type): whether scripts/handlers/<type>.lua exists. */
static int l_engine_has_handler(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *type = luaL_checkstring(L, 2);
  need_loader(L, e);
  loader_call(L, e, "handler", type);
  lua_pushboolean(L, lua_toboolean(L, -1)); /* the file exists (even if it does not load) */
  return 1;
}

static int l_engine_close(lua_State *L) {
  lengine *h = luaL_checkudata(L, 1, ENGINE_MT);
  if (h->e && !h->e->in_run) {
    /* The host state's loader is keyed by the engine's address, which a
     * later engine may reuse: drop it with the engine. */
    lua_pushnil(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, h->e);
    engine_free(h->e);
    h->e = NULL;
  }
  return 0;
}

static const luaL_Reg engine_methods[] = {
    {"run", l_engine_run},
    {"stop", l_engine_stop},
    {"fold", l_engine_fold},
    {"has_handler", l_engine_has_handler},
    {"close", l_engine_close},
    {NULL, NULL},
};

/* Pushes core.engine(store, opts), registering the handle's metatable. */
void es_engine_push_constructor(lua_State *L) {
  if (luaL_newmetatable(L, ENGINE_MT)) {
    lua_pushcfunction(L, l_engine_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_engine_close);
    lua_setfield(L, -2, "__close");
    luaL_newlib(L, engine_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_engine_new);
}
