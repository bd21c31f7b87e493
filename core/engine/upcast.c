/*
 * engine/upcast.c: upcasters (upcast.h, docs/contract.md §7,
 * docs/upcasting.md). The files are loaded by each state's loader
 * (lua/eventstore/loader.lua, which checks their shape); the chain runs
 * here, in C, so that each step is a budgeted call of its own and a step
 * that trips a budget still fails with an error naming the upcaster and
 * the event (Lua code cannot run once a budget tripped).
 */
#include "engine/upcast.h"

#include <lauxlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bridge/common.h"
#include "engine/internal.h"

struct es_upcast_current {
  char *type;
  int64_t current;
};

static int64_t dir_mtime(const es_engine *e) {
  char path[4096];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/upcasters", e->scripts);
  if (n < 0 || (size_t)n >= sizeof path || stat(path, &st) != 0) return -1;
  return (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

void es_upcast_refresh(es_engine *e, int force) {
  int64_t m = dir_mtime(e);
  pthread_mutex_lock(&e->up_mu);
  int stale = force || !e->upcasters || m != e->up_mtime;
  pthread_mutex_unlock(&e->up_mu);
  if (!stale) return;
  es_err err = {0};
  es_type_set *fresh = es_script_scan(e->scripts, "upcasters", &err);
  if (!fresh) return; /* the old set stays; the handler rescan says why the folder fails */
  pthread_mutex_lock(&e->up_mu);
  es_type_set *old = e->upcasters;
  e->upcasters = fresh;
  e->up_mtime = m;
  pthread_mutex_unlock(&e->up_mu);
  es_type_set_release(old);
}

void es_upcast_begin(runner *r) {
  r->up_gen++; /* the job's module cache starts empty: files are looked at again */
  es_type_set *t = es_type_set_get(&r->e->up_mu, &r->e->upcasters);
  es_type_set_release(r->up);
  r->up = t;
}

void es_upcast_end(runner *r) {
  es_type_set_release(r->up);
  r->up = NULL;
}

int es_upcast_has(const runner *r, const char *type) {
  return r->up && r->up->n && type && es_type_set_has(r->up, type);
}

static void remember_current(es_engine *e, const char *type, int64_t current) {
  pthread_mutex_lock(&e->up_mu);
  size_t i = 0;
  while (i < e->n_currents && strcmp(e->currents[i].type, type) != 0) i++;
  if (i < e->n_currents) {
    e->currents[i].current = current;
  } else if (es_grow((void **)&e->currents, &e->cap_currents, i + 1, sizeof *e->currents) == ES_OK) {
    char *t = strdup(type);
    if (t) e->currents[e->n_currents++] = (struct es_upcast_current){t, current};
  } /* out of memory: es_upcast_current answers 1, which the chain upcasts */
  pthread_mutex_unlock(&e->up_mu);
}

int64_t es_upcast_current(es_engine *e, const char *type) {
  int64_t c = 1;
  pthread_mutex_lock(&e->up_mu);
  int has = e->upcasters && es_type_set_has(e->upcasters, type);
  for (size_t i = 0; has && i < e->n_currents; i++)
    if (strcmp(e->currents[i].type, type) == 0) c = e->currents[i].current;
  pthread_mutex_unlock(&e->up_mu);
  return c;
}

void es_upcast_free(es_engine *e) {
  es_type_set_release(e->upcasters);
  e->upcasters = NULL;
  for (size_t i = 0; i < e->n_currents; i++) free(e->currents[i].type);
  free(e->currents);
  e->currents = NULL;
  e->n_currents = e->cap_currents = 0;
}

/* Pushes type's upcaster table and returns 1, or pushes nothing and
 * returns 0 when the type has no file. A file that does not load (and has
 * no last good version) raises its load error. */
static int push_module(lua_State *L, runner *r, const char *type) {
  if (!es_upcast_has(r, type)) return 0;
  es_loader_call(L, "upcaster", type);
  if (!lua_isnil(L, -2)) es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s", lua_tostring(L, -2));
  if (lua_isnil(L, -3)) { /* the file went away since the scan */
    lua_pop(L, 3);
    return 0;
  }
  lua_pop(L, 2);
  return 1;
}

int64_t es_upcast_current_L(lua_State *L, runner *r, const char *type) {
  if (!push_module(L, r, type)) return 1;
  lua_getfield(L, -1, "current"); /* checked by the loader: an integer revision */
  int64_t c = lua_tointeger(L, -1);
  lua_pop(L, 2);
  remember_current(r->e, type, c);
  return c;
}

/* Raises the chain's error: the upcaster file, the type and revision the
 * step was at, and the event (session, index, id) of the table at ev. */
static int fail(lua_State *L, runner *r, int ev, const char *type, int64_t rev, const char *fmt,
                ...) {
  char why[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  lua_getfield(L, ev, "session");
  lua_getfield(L, ev, "index");
  lua_getfield(L, ev, "id");
  const char *session = lua_tostring(L, -3), *id = lua_tostring(L, -1);
  return es_lua_raisef(L, ES_INVALID_ARGUMENT,
                       "upcaster %s/upcasters/%s.lua (type '%s', revision %lld) on %s #%lld "
                       "(id %s): %s",
                       r->e->scripts, type, type, (long long)rev, session ? session : "?",
                       (long long)lua_tointeger(L, -2), id ? id : "?", why);
}

/* "a -> b -> c": the chain's types so far, then last. */
static void path_text(const char *const *types, int n, const char *last, char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i <= n && used < cap; i++) {
    const char *t = i < n ? types[i] : last;
    int k = snprintf(out + used, cap - used, "%s%s", i ? " -> " : "", t ? t : "?");
    if (k < 0) break;
    used += (size_t)k;
  }
}

static const char cache_key = 'u'; /* registry: {[type] = upcaster table} of r's current job */

/* Pushes type's upcaster table, as push_module, through the job's cache:
 * a fold of many events of one type asks the loader once, not per event
 * (the loader itself looks at the file at most once a second anyway). */
static int cached_module(lua_State *L, runner *r, const char *type, int type_idx) {
  if (r->up_cache_gen != r->up_gen) {
    lua_newtable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &cache_key);
    r->up_cache_gen = r->up_gen;
  }
  lua_rawgetp(L, LUA_REGISTRYINDEX, &cache_key);
  lua_pushvalue(L, type_idx);
  if (lua_rawget(L, -2) == LUA_TTABLE) {
    lua_remove(L, -2);
    return 1;
  }
  int none = lua_type(L, -1) == LUA_TBOOLEAN; /* false: no file */
  lua_pop(L, 1);
  if (none) {
    lua_pop(L, 1);
    return 0;
  }
  int has = push_module(L, r, type);
  lua_pushvalue(L, type_idx);
  if (has) lua_pushvalue(L, -2);
  else lua_pushboolean(L, 0);
  lua_rawset(L, -3 - has);
  if (has) lua_remove(L, -2);
  else lua_pop(L, 1);
  return has;
}

void es_upcast_event(lua_State *L, runner *r, int idx) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, idx, "type");
  if (!es_upcast_has(r, lua_tostring(L, -1))) { /* the common case: nothing to do */
    lua_pop(L, 1);
    return;
  }
  luaL_checkstack(L, ES_UPCAST_MAX_STEPS + 16, "upcast");
  int base = lua_gettop(L); /* the stored type; each renamed type is pushed above it */
  lua_getfield(L, idx, "revision");
  int64_t rev = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 1;
  lua_pop(L, 1);
  lua_getfield(L, idx, "payload");
  lua_insert(L, base); /* the payload below the types */
  int pay = base, type_slot = base + 1;
  /* The (type, revision) pairs the chain was at, for the loop check: the
   * type strings stay anchored on the stack while the chain runs. */
  const char *types[ES_UPCAST_MAX_STEPS + 1];
  int64_t revs[ES_UPCAST_MAX_STEPS + 1];
  int steps = 0;
  int have = 0; /* the module of types[..] at type_slot is on the stack */
  for (;;) {
    const char *type = lua_tostring(L, type_slot);
    if (!have && !cached_module(L, r, type, type_slot)) break;
    have = 1;
    int mod = lua_gettop(L);
    lua_getfield(L, mod, "current");
    int64_t cur = lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (rev == cur) break;
    if (rev > cur)
      fail(L, r, idx, type, rev, "the event's revision is newer than current (%lld): these "
           "scripts are older than the event", (long long)cur);
    for (int i = 0; i < steps; i++)
      if (revs[i] == rev && strcmp(types[i], type) == 0) {
        char p[512];
        path_text(types, steps, type, p, sizeof p);
        fail(L, r, idx, type, rev, "the upcasters loop: %s", p);
      }
    if (steps == ES_UPCAST_MAX_STEPS) {
      char p[512];
      path_text(types, steps, type, p, sizeof p);
      fail(L, r, idx, type, rev, "the chain is longer than %d steps: %s", ES_UPCAST_MAX_STEPS, p);
    }
    types[steps] = type;
    revs[steps] = rev;
    if (lua_rawgeti(L, mod, rev) != LUA_TFUNCTION)
      fail(L, r, idx, type, rev, "no step [%lld] (revision %lld -> %lld) in the file",
           (long long)rev, (long long)rev, (long long)rev + 1);
    lua_pushvalue(L, pay);
    lua_pushvalue(L, idx);
    if (es_budget_pcall(L, 2, 3) != LUA_OK) fail(L, r, idx, type, rev, "%s", lua_tostring(L, -1));
    steps++;
    int out = mod + 1; /* payload, type, revision */
    if (!lua_isnil(L, out)) { /* nil: the payload was changed in place */
      lua_pushvalue(L, out);
      lua_replace(L, pay);
    }
    int64_t next = rev + 1;
    int renamed = 0;
    if (!lua_isnil(L, out + 1)) {
      size_t len;
      const char *to = lua_type(L, out + 1) == LUA_TSTRING ? lua_tolstring(L, out + 1, &len) : NULL;
      es_err err = {0};
      if (!to || strlen(to) != len || es_check_name("the new type", to, &err) != ES_OK)
        fail(L, r, idx, type, rev, "step [%lld] must return a type name second (or nothing), not %s",
             (long long)rev, to ? "that string" : luaL_typename(L, out + 1));
      if (strcmp(to, type) != 0) {
        renamed = 1;
        next = 1;
        if (!lua_isnil(L, out + 2)) {
          if (!lua_isinteger(L, out + 2) || lua_tointeger(L, out + 2) < 1 ||
              lua_tointeger(L, out + 2) > ES_MAX_REVISION)
            fail(L, r, idx, type, rev, "step [%lld] renamed the type to '%s' but its third result "
                 "is not a revision (an integer 1..%d)", (long long)rev, to, ES_MAX_REVISION);
          next = lua_tointeger(L, out + 2);
        }
      }
    }
    rev = next;
    if (renamed) { /* the new type takes the module's slot and stays anchored there */
      lua_pushvalue(L, out + 1);
      lua_replace(L, mod);
      lua_settop(L, mod);
      type_slot = mod;
      have = 0;
    } else {
      lua_settop(L, mod);
    }
  }
  if (steps) {
    lua_pushvalue(L, type_slot);
    lua_setfield(L, idx, "type");
    lua_pushinteger(L, rev);
    lua_setfield(L, idx, "revision");
    lua_pushvalue(L, pay);
    lua_setfield(L, idx, "payload");
  }
  lua_settop(L, base - 1);
}

void es_upcast_push_version(lua_State *L, runner *r) {
  if (!r->up || !r->up->n) {
    lua_pushliteral(L, "");
    return;
  }
  uint64_t h = ES_FNV_BASIS;
  for (size_t i = 0; i < r->up->n; i++) {
    const char *name = r->up->v[i];
    es_loader_call(L, "upcaster", name); /* value, err, version */
    size_t len = 0;
    const char *v = lua_isstring(L, -1) ? lua_tolstring(L, -1, &len)
                    : lua_isstring(L, -2) ? lua_tolstring(L, -2, &len) : "";
    h = es_fnv1a(h, name, strlen(name) + 1);
    h = es_fnv1a(h, v, len + 1);
    lua_pop(L, 3);
  }
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  lua_pushstring(L, hex);
}
