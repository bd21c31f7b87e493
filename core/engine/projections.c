/*
 * projections.c: the engine's projection runner (docs/contract.md §8,
 * docs/projections.md). Each scripts/projections/<name>.lua is folded
 * over the store's events in position order, a batch of events at a time, in
 * a Lua state of its own (a runner, budgeted like the workers'). A batch
 * is read, folded into the states it touches (read from the generation
 * being folded, or made by init), and committed with the checkpoint in
 * one store transaction (es_store_projection_commit), which also holds
 * the runner's lease and checks that nobody else moved the record since
 * it was read: a batch is either all in or not at all, and never twice.
 *
 * Generations (blue/green): a projection whose version (a hash of its
 * source) differs from the stored one, or that `rebuild` asked for, is
 * built as a new generation from the first position while reads answer
 * from the live one; the commit of the batch that reaches the head swaps
 * it in and drops the old one.
 *
 * Upcasting (§7): push_step_event hands every event to key() and the
 * steps upcast; a projection's version covers the upcaster files (the
 * loader's source hash and es_upcast_push_version, in pass_main).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/common.h"
#include "bridge/events.h"
#include "bridge/json_lua.h"
#include "bridge/state.h"
#include "engine/internal.h"
#include "store/projections.h"
#include "store/shards.h"

/* Events per commit at most (docs/projections.md "Batches"): BATCH, and
 * CATCH_UP_BATCH after a pass that left events to fold (a catch-up:
 * fewer commits, and fewer of each pass's fixed costs, per event). */
#define BATCH 500
#define CATCH_UP_BATCH 2000

/* What one pass over one projection came to. */
enum { P_CAUGHT_UP, P_MORE, P_IDLE /* failed, or another engine runs it */ };

typedef struct pass {
  runner *r;
  const char *name;
  int outcome;
  es_err err;          /* a store error that ended the pass */
} pass;

static int store_fail(lua_State *L, const es_err *err) { return es_lua_raise(L, err); }

/* The tenant prefix of a stored session name (through its first
 * separator), or 0 when it has none: the keys of its events are that
 * tenant's (§8 "Tenants"). */
static size_t tenant_len(const char *session) {
  const char *sep = strchr(session, ES_TENANT_SEP[0]); /* one byte: strchr, not strstr */
  return sep ? (size_t)(sep - session) + 1 : 0;
}

static int upcast_protected(lua_State *L) {
  es_upcast_event(L, lua_touserdata(L, 2), 1);
  lua_settop(L, 1);
  return 1;
}

/* Pushes the event key() and the step see: as store:read returns it, its
 * session as its tenant names it, upcast (§7) by r's upcasters. NULL, or
 * the upcaster's error (the message is then what was pushed): it stops
 * the projection at this event like a raising step. */
static const char *push_step_event(lua_State *L, runner *r, es_lua_pusher *b, const es_event *ev,
                                   size_t tl) {
  es_event shown = *ev; /* borrowed fields */
  shown.session = ev->session + tl;
  es_lua_pusher_push(b, &shown);
  if (!es_upcast_has(r, ev->type)) return NULL;
  lua_pushcfunction(L, upcast_protected);
  lua_insert(L, -2);
  lua_pushlightuserdata(L, r);
  if (lua_pcall(L, 2, 1, 0) == LUA_OK) return NULL;
  return luaL_tolstring(L, -1, NULL);
}

typedef struct fold_box {
  es_events events;
  char **cursors;        /* shards: each event's cursor */
  es_projection p, next;
  es_proj_state *states;
  es_buf *bufs;
  size_t n_states;
} fold_box;

static void fold_box_release(void *v) {
  fold_box *x = v;
  es_store_cursors_free(x->cursors, x->events.n);
  x->cursors = NULL;
  es_events_destroy(&x->events);
  es_projection_destroy(&x->p);
  es_projection_destroy(&x->next);
  for (size_t i = 0; i < x->n_states; i++) es_buf_destroy(&x->bufs[i]);
  free(x->bufs);
  free(x->states);
  x->bufs = NULL;
  x->states = NULL;
  x->n_states = 0;
}

static void set_str(char **dst, const char *src) {
  free(*dst);
  *dst = src ? strdup(src) : NULL;
}

/* The runner's pace per projection, kept in its state's registry as
 * name -> monotonic ms before which an idle pass commits nothing: a
 * holder with nothing new renews its lease every ttl/3 (not every pass),
 * and an engine standing by tries to take over as often, so neither
 * writes to the store at the idle loop's pace. */
static const char pace_key = 0;

static int64_t pace_get(lua_State *L, const char *name) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &pace_key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &pace_key);
  }
  lua_getfield(L, -1, name);
  int64_t v = lua_isinteger(L, -1) ? (int64_t)lua_tointeger(L, -1) : 0;
  lua_pop(L, 2);
  return v;
}

static void pace_set(lua_State *L, const char *name, int64_t until) {
  (void)pace_get(L, name); /* makes the table */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &pace_key);
  lua_pushinteger(L, (lua_Integer)until);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* Whether the last pass over a projection left events to fold (its read
 * was full): the next reads CATCH_UP_BATCH. Kept in the runner state's
 * registry as name -> true. */
static const char behind_key = 'b'; /* its own address: not merged with pace_key */

static int behind_get(lua_State *L, const char *name) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &behind_key) != LUA_TTABLE) {
    lua_pop(L, 1);
    return 0;
  }
  lua_getfield(L, -1, name);
  int v = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return v;
}

static void behind_set(lua_State *L, const char *name, int behind) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &behind_key) != LUA_TTABLE) {
    lua_pop(L, 1);
    if (!behind) return;
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &behind_key);
  }
  if (behind) lua_pushboolean(L, 1);
  else lua_pushnil(L);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* Commits next (and the states) over the record p was; STALE_FENCE means
 * someone else holds or moved it: this engine stands by. */
static int commit(lua_State *L, pass *ps, fold_box *x, int64_t gen) {
  es_engine *e = ps->r->e;
  es_err err = {0};
  set_str(&x->next.holder, e->holder);
  es_projection out;
  int rc = es_store_projection_commit(e->s, &x->next, x->p.seq, e->o.ttl_ms, gen, x->states,
                                      x->n_states, &out, &err);
  if (rc == ES_STALE_FENCE) {
    pace_set(L, ps->name, es_mono_ms() + e->o.ttl_ms / 3);
    return 0;
  }
  if (rc) store_fail(L, &err);
  pace_set(L, ps->name, es_mono_ms() + e->o.ttl_ms / 3);
  es_projection_destroy(&x->p);
  x->p = out;
  return 1;
}

/* One event's fold, key() and the step, in one budgeted call where it can
 * be (fold_event): the runner's budgeted call per event costs what the
 * reducer fold's one call per event does, and everything the engine does
 * for a key the batch has not met yet (reading its state, init, its ctx)
 * stays outside the budget, in fold_first. */
enum { PH_KEY, PH_INIT, PH_STEP };   /* which user code ran last: names a failure */
enum { FE_DONE, FE_BAD_KEY, FE_NUL_KEY, FE_MISS }; /* what fold_event came to */

typedef struct fold_call {
  runner *r;
  int has_keyfn;
  int phase;
  int outcome;
} fold_call;

/* Upvalues: key() (or "", the one key of a projection without one), the
 * batch's states by stored key, their ctxs, the fold_call. Arguments: the
 * step, the event, its tenant's prefix (nil: none). key() then, if the
 * batch holds that key's state, the step with the budget of a call of its
 * own. Returns nothing, or (FE_MISS: the key's state or ctx is not in the
 * batch yet) the step, the event, the key and the key as stored. A nil
 * key skips the event (FE_DONE). */
static int fold_event(lua_State *L) {
  fold_call *c = lua_touserdata(L, lua_upvalueindex(4));
  lua_pushvalue(L, lua_upvalueindex(1));
  if (c->has_keyfn) {
    lua_pushvalue(L, 2);
    lua_call(L, 1, 1);
    int t = lua_type(L, -1);
    if (t == LUA_TNIL) return 0;
    if (t == LUA_TNUMBER) {
      lua_tostring(L, -1); /* its decimal text, in place */
    } else if (t != LUA_TSTRING) {
      c->outcome = FE_BAD_KEY;
      return 0;
    }
    /* A key is a name: stored as a C string, "a\0b" would be "a", and
     * the states of "a\0b" and "a" would overwrite each other. */
    size_t len;
    const char *key = lua_tolstring(L, -1, &len);
    if (memchr(key, '\0', len)) {
      c->outcome = FE_NUL_KEY;
      return 0;
    }
  }
  int k = lua_gettop(L);
  /* the key as stored: behind its tenant's prefix. A short string the
   * batch met before is found, not made. */
  if (!lua_isnil(L, 3)) {
    lua_pushvalue(L, 3);
    lua_pushvalue(L, k);
    lua_concat(L, 2);
  } else {
    lua_pushvalue(L, k);
  }
  int sk = k + 1;
  lua_pushvalue(L, sk); /* where a new state goes */
  lua_pushvalue(L, 1);
  lua_pushvalue(L, sk);
  if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) {
    lua_pushvalue(L, 2);
    lua_pushvalue(L, sk);
    if (lua_rawget(L, lua_upvalueindex(3)) != LUA_TNIL) {
      c->phase = PH_STEP;
      es_budget_recount(&c->r->b);
      lua_call(L, 3, 1);
      if (lua_isnil(L, -1)) return 0; /* changed in place */
      lua_rawset(L, lua_upvalueindex(2)); /* sk is in the table already: nothing to allocate */
      return 0;
    }
  }
  c->outcome = FE_MISS;
  lua_settop(L, sk);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_rotate(L, k, 2);
  return 4;
}

/* The error fold_event (or an init or a step below) left at the top, led
 * by the user code that raised it. */
static const char *failure(lua_State *L, int phase) {
  return lua_pushfstring(L, "%s: %s",
                         phase == PH_KEY ? "key()" : phase == PH_INIT ? "init()" : "the step",
                         lua_tostring(L, -1));
}

/* The fold of an event whose key the batch has not met (FE_MISS): step,
 * event, key and stored key at top + 1..4. Reads the key's state from the
 * generation being folded, or makes it with init, makes the key's ctx,
 * and runs the step as a budgeted call of its own. NULL, or why the
 * projection stops at this event (a string on the stack or in err). */
static const char *fold_first(lua_State *L, pass *ps, int top, int mod, int cache, int ctxs,
                              int64_t gen, const es_event *ev, size_t tl, es_err *err) {
  es_engine *e = ps->r->e;
  int step = top + 1, evt = top + 2, k = top + 3, sk = top + 4;
  const char *key = lua_tostring(L, k);
  lua_pushvalue(L, sk);
  if (lua_rawget(L, cache) == LUA_TNIL) {
    lua_pop(L, 1);
    char *v = NULL;
    size_t len = 0;
    char scope[ES_MAX_TENANT_BYTES + 2];
    memcpy(scope, ev->session, tl);
    scope[tl] = 0;
    if (es_store_projection_read_gen(e->s, tl ? scope : NULL, ps->name, key, gen, &v, &len, err))
      return err->msg;
    if (v) {
      int rc = es_state_decode(L, v, len, err);
      free(v);
      if (rc) return err->msg;
    } else {
      lua_getfield(L, mod, "init");
      if (lua_isfunction(L, -1)) {
        lua_pushvalue(L, k);
        if (es_budget_pcall(L, 1, 1) != LUA_OK) return failure(L, PH_INIT);
      } else {
        lua_pop(L, 1);
        lua_newtable(L);
      }
    }
  }
  int st = lua_gettop(L);
  lua_pushvalue(L, step);
  lua_pushvalue(L, st);
  lua_pushvalue(L, evt);
  lua_pushvalue(L, sk);
  if (lua_rawget(L, ctxs) == LUA_TNIL) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 1); /* ctx */
    lua_pushvalue(L, k);
    lua_setfield(L, -2, "key");
    lua_pushvalue(L, sk);
    lua_pushvalue(L, -2);
    lua_rawset(L, ctxs);
  }
  if (es_budget_pcall(L, 3, 1) != LUA_OK) return failure(L, PH_STEP);
  if (lua_isnil(L, -1)) { /* changed in place */
    lua_pop(L, 1);
    lua_pushvalue(L, st);
  }
  lua_pushvalue(L, sk);
  lua_insert(L, -2);
  lua_rawset(L, cache);
  return NULL;
}

/* One pass: takes (or renews) the lease, starts a generation when the
 * version changed, folds one batch and commits it. Runs under lua_pcall
 * (store errors raise). */
static int pass_main(lua_State *L) {
  pass *ps = lua_touserdata(L, 1);
  es_engine *e = ps->r->e;
  es_err err = {0};
  int rc;
  ps->outcome = P_IDLE;
  es_upcast_refresh(e, 0); /* an upcaster file added a moment ago counts too */
  es_upcast_begin(ps->r);
  es_loader_call(L, "projection", ps->name);
  if (lua_isnil(L, -3))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s", lua_isnil(L, -2) ? "no projection" : lua_tostring(L, -2));
  /* §8: the version covers the upcasters too (as a reducer's does,
   * fold.c); without upcaster files it is the source's hash alone. */
  es_upcast_push_version(L, ps->r);
  if (lua_rawlen(L, -1) > 0) lua_pushfstring(L, "%s+%s", lua_tostring(L, -2), lua_tostring(L, -1));
  else lua_pushvalue(L, -2);
  lua_replace(L, -3); /* mod, err, version */
  lua_pop(L, 1);
  const char *version = lua_tostring(L, -1);
  int mod = lua_gettop(L) - 2;
  fold_box *x = es_lua_push_box(L, sizeof *x, 0, fold_box_release);
  memset(x, 0, sizeof *x);
  es_projections list = {0};
  rc = es_store_projections(e->s, ps->name, &list, &err);
  if (rc) store_fail(L, &err);
  if (list.n) {
    x->p = list.v[0];
    memset(&list.v[0], 0, sizeof list.v[0]);
  } else {
    x->p.name = strdup(ps->name);
  }
  es_projections_destroy(&list);
  if (es_projection_copy(&x->next, &x->p)) es_lua_raisef(L, ES_STORAGE, "out of memory");

  /* A new generation: first run, a changed source, or a rebuild asked for. */
  const char *built = x->p.building ? x->p.building_version : x->p.version;
  if (x->p.seq == 0 || x->p.rebuild || !built || strcmp(built, version) != 0) {
    int64_t g = (x->p.generation > x->p.building ? x->p.generation : x->p.building) + 1;
    x->next.building = g;
    set_str(&x->next.building_version, version);
    x->next.building_position = 0;
    set_str(&x->next.building_cursor, NULL);
    x->next.rebuild = 0;
    x->next.failed = 0;
    set_str(&x->next.error, NULL);
    set_str(&x->next.error_id, NULL);
    set_str(&x->next.error_cursor, NULL);
    if (!commit(L, ps, x, 0)) return 0;
    es_projection_destroy(&x->next);
    if (es_projection_copy(&x->next, &x->p)) es_lua_raisef(L, ES_STORAGE, "out of memory");
  }
  if (x->p.failed) return 0; /* stopped at an event until retry or skip */
  int mine = x->p.holder && strcmp(x->p.holder, e->holder) == 0;
  if (!mine && x->p.holder && es_mono_ms() < pace_get(L, ps->name)) return 0; /* standing by */

  int building = x->p.building > 0;
  int64_t gen = building ? x->p.building : x->p.generation;
  int64_t pos = building ? x->p.building_position : x->p.position;
  const char *cursor = building ? x->p.building_cursor : x->p.cursor;
  es_capabilities caps;
  rc = es_store_capabilities(e->s, &caps, &err);
  if (rc) store_fail(L, &err);
  int64_t limit = behind_get(L, ps->name) ? CATCH_UP_BATCH : BATCH;
  if (caps.sharded)
    rc = es_store_read_all_cursor(e->s, cursor, limit, &x->events, &x->cursors, &err);
  else
    rc = es_store_read_all(e->s, pos, limit, &x->events, &err);
  if (rc) store_fail(L, &err);

  lua_getfield(L, mod, "sessions");
  const char *prefix = lua_isstring(L, -1) ? lua_tostring(L, -1) : NULL; /* kept alive by the stack */
  size_t prefix_len = prefix ? strlen(prefix) : 0;
  lua_getfield(L, mod, "key");
  int keyfn = lua_gettop(L);
  int has_keyfn = lua_isfunction(L, keyfn);
  lua_newtable(L); /* stored key -> state, the states this batch touched */
  int cache = lua_gettop(L);
  lua_newtable(L); /* stored key -> the steps' ctx for that key, made once per batch */
  int ctxs = lua_gettop(L);
  fold_call fc = {ps->r, has_keyfn, PH_KEY, FE_DONE};
  if (has_keyfn) lua_pushvalue(L, keyfn);
  else lua_pushliteral(L, ""); /* one state, key "" */
  lua_pushvalue(L, cache);
  lua_pushvalue(L, ctxs);
  lua_pushlightuserdata(L, &fc);
  lua_pushcclosure(L, fold_event, 4);
  int fold_fn = lua_gettop(L);
  es_lua_pusher b;
  es_lua_pusher_begin(L, &b);
  int64_t last = pos, failed_at = 0;
  const char *last_cursor = cursor;
  size_t n_events = x->events.n;
  for (size_t i = 0; i < n_events; i++) {
    const es_event *ev = &x->events.v[i];
    size_t tl = tenant_len(ev->session);
    int top = lua_gettop(L);
    const char *why = NULL;
    lua_pushvalue(L, fold_fn);
    /* The step for the event's type (after upcasting) at top + 2, the
     * event as the steps see it at top + 3; events of no step's type, or
     * of sessions the projection does not want, are passed over. */
    int wanted = !prefix || strncmp(ev->session + tl, prefix, prefix_len) == 0;
    if (wanted && es_upcast_has(ps->r, ev->type)) {
      why = push_step_event(L, ps->r, &b, ev, tl);
      if (!why) {
        lua_getfield(L, -1, "type");
        lua_gettable(L, mod);
        lua_insert(L, -2);
      }
    } else if (wanted) {
      es_lua_pusher_push_text(&b, ev->type, ES_PUSHER_TYPE);
      lua_gettable(L, mod);
      if (lua_isfunction(L, -1)) why = push_step_event(L, ps->r, &b, ev, tl);
    }
    if (wanted && !why) wanted = lua_isfunction(L, top + 2);
    if (wanted && !why) {
      /* key(event), and the step when this batch holds its key's state:
       * one budgeted call (fold_event) */
      if (tl) lua_pushlstring(L, ev->session, tl);
      else lua_pushnil(L);
      fc.phase = PH_KEY;
      fc.outcome = FE_DONE;
      if (es_budget_pcall(L, 3, 4) != LUA_OK) why = failure(L, fc.phase);
      else if (fc.outcome == FE_BAD_KEY) why = "key() must return a string, a number or nil";
      else if (fc.outcome == FE_NUL_KEY) why = "key() returned a key with a NUL byte (keys are names)";
      else if (fc.outcome == FE_MISS) why = fold_first(L, ps, top, mod, cache, ctxs, gen, ev, tl, &err);
    }
    if (why) {
      /* §8: the projection stops at this event; what came before it commits. */
      char msg[4 * ES_ERRMSG_MAX];
      snprintf(msg, sizeof msg, "projection '%s' failed at position %lld (event %s, type %s): %.1000s",
               ps->name, (long long)ev->position, ev->id ? ev->id : "?", ev->type, why);
      x->next.failed = 1;
      set_str(&x->next.error, msg);
      x->next.error_position = ev->position;
      set_str(&x->next.error_id, ev->id);
      set_str(&x->next.error_cursor, x->cursors ? x->cursors[i] : NULL);
      failed_at = ev->position;
      es_engine_log(e, 0, "%s", msg);
      /* The step may have changed its state in place before it raised,
       * and that state may hold this batch's earlier events: fold the
       * events before this one again from the stored states, so that
       * nothing of the failed step is committed. */
      lua_settop(L, top);
      lua_newtable(L);
      lua_pushvalue(L, -1);
      lua_setupvalue(L, fold_fn, 2);
      lua_replace(L, cache);
      n_events = i;
      last = pos;
      last_cursor = cursor;
      i = (size_t)-1; /* the loop's i++ starts again at 0 */
      continue;
    }
    lua_settop(L, top);
    last = ev->position;
    last_cursor = x->cursors ? x->cursors[i] : NULL;
  }
  es_lua_pusher_end(&b);

  /* The touched states, encoded (the stack keeps the table alive). */
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, cache)) {
    n++;
    lua_pop(L, 1);
  }
  x->states = calloc(n ? n : 1, sizeof *x->states);
  x->bufs = calloc(n ? n : 1, sizeof *x->bufs);
  if (!x->states || !x->bufs) es_lua_raisef(L, ES_STORAGE, "out of memory");
  lua_pushnil(L);
  while (lua_next(L, cache)) {
    es_buf_init(&x->bufs[x->n_states]);
    size_t i = x->n_states++;
    char what[64];
    snprintf(what, sizeof what, "projection '%.40s'", ps->name);
    if (es_state_encode(L, -1, what, &x->bufs[i], &err) != ES_OK) store_fail(L, &err);
    x->states[i].key = lua_tostring(L, -2);
    x->states[i].value = x->bufs[i].data ? x->bufs[i].data : "";
    x->states[i].len = x->bufs[i].len;
    lua_pop(L, 1);
  }
  if (building) {
    x->next.building_position = last;
    set_str(&x->next.building_cursor, last_cursor);
  } else {
    x->next.position = last;
    set_str(&x->next.cursor, last_cursor);
  }
  /* The batch's events are folded: freed now, as the reducer fold frees
   * its own, rather than whenever the collector gets to the box (a
   * catch-up would otherwise hold several batches at once). */
  size_t n_read = x->events.n;
  es_store_cursors_free(x->cursors, n_read);
  x->cursors = NULL;
  es_events_destroy(&x->events);
  int caught_up = !failed_at && n_read < (size_t)limit;
  if (building && caught_up) { /* blue/green: the new generation answers from this commit on */
    x->next.generation = x->next.building;
    set_str(&x->next.version, x->next.building_version);
    x->next.position = x->next.building_position;
    set_str(&x->next.cursor, x->next.building_cursor);
    x->next.building = 0;
    x->next.building_position = 0;
    set_str(&x->next.building_version, NULL);
    set_str(&x->next.building_cursor, NULL);
  }
  if (n_read == 0 && !building && mine && es_mono_ms() < pace_get(L, ps->name)) {
    ps->outcome = P_CAUGHT_UP; /* nothing new, and the lease is young */
    return 0;
  }
  if (!commit(L, ps, x, gen)) return 0;
  ps->outcome = failed_at ? P_IDLE : caught_up ? P_CAUGHT_UP : P_MORE;
  behind_set(L, ps->name, ps->outcome == P_MORE);
  return 0;
}

/* Runs one pass of every projection; *more: one has events left. fresh:
 * a run starts, so every script file is looked at again (§4), as the
 * workers' are. */
static int run_passes(es_engine *e, int fresh, int *more, es_err *err) {
  *more = 0;
  /* A projection folds every tenant's events and keeps each tenant's
   * keys apart (§8): it is run by an engine on the root handle; one given
   * a tenant handle leaves them to it (docs/projections.md "Tenants"). */
  es_capabilities caps;
  if (es_store_capabilities(e->s, &caps, err)) return err->code;
  if (caps.tenant) return ES_OK;
  es_type_set *names = es_script_scan(e->scripts, "projections", err);
  if (!names) return err->code;
  int rc = ES_OK;
  pthread_mutex_lock(&e->proj_mu);
  if (names->n && !e->proj_runner) e->proj_runner = es_runner_new(e, 0, err);
  runner *r = e->proj_runner;
  if (names->n && !r) rc = err->code;
  if (r && fresh) es_loader_new_run(r);
  for (size_t i = 0; rc == ES_OK && i < names->n; i++) {
    lua_State *L = r->L;
    pass ps = {r, names->v[i], P_IDLE, {0}};
    lua_settop(L, 0);
    lua_pushcfunction(L, pass_main);
    lua_pushlightuserdata(L, &ps);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
      /* a store outage or a projection that does not load: logged, and
       * the next pass tries again */
      es_engine_log(e, 0, "projection '%s': %s", names->v[i],
                    lua_isstring(L, -1) ? lua_tostring(L, -1) : "error");
    }
    lua_settop(L, 0);
    if (ps.outcome == P_MORE) *more = 1;
  }
  pthread_mutex_unlock(&e->proj_mu);
  es_type_set_release(names);
  return rc;
}

typedef struct catch_up {
  es_engine *e;
  es_err *err;
  int rc;
} catch_up;

static void *catch_up_main(void *arg) {
  catch_up *c = arg;
  int more = 1, fresh = 1;
  c->rc = ES_OK;
  while (c->rc == ES_OK && more && !atomic_load(&c->e->stop_req)) {
    c->rc = run_passes(c->e, fresh, &more, c->err);
    fresh = 0;
  }
  return NULL;
}

/* The catch-up of an until-idle run, on a thread of its own as in a run
 * that goes on (es_projections_main) and as the reducer folds it is
 * measured against (fold runners): the runner's allocations then come
 * from that thread's malloc arena rather than the caller's, which may be
 * crowded by everything the caller holds (a memory: store's events, for
 * one; bench/README.md "Projections"). The caller waits for it; without
 * a thread it runs here. */
int es_projections_catch_up(es_engine *e, es_err *err) {
  /* No projection, nothing to catch up, and no thread started: a replay
   * runs its scratch engine to idle once per input (docs/replay.md). */
  es_type_set *names = es_script_scan(e->scripts, "projections", err);
  if (!names) return err->code;
  size_t n = names->n;
  es_type_set_release(names);
  if (!n) return ES_OK;
  catch_up c = {e, err, ES_OK};
  pthread_t t;
  if (pthread_create(&t, NULL, catch_up_main, &c) == 0) pthread_join(t, NULL);
  else catch_up_main(&c);
  return c.rc;
}

void *es_projections_main(void *arg) {
  es_engine *e = arg;
  int fresh = 1;
  while (!atomic_load(&e->keeper_quit)) {
    es_err err = {0};
    int more = 0;
    if (run_passes(e, fresh, &more, &err) != ES_OK) es_engine_log(e, 0, "projections: %s", err.msg);
    fresh = 0;
    if (!more) es_run_wait(e, IDLE_POLL_MS, &e->keeper_quit, 1);
  }
  return NULL;
}

void es_projections_free(es_engine *e) {
  if (e->proj_runner) es_runner_free_now(e->proj_runner);
  e->proj_runner = NULL;
  pthread_mutex_destroy(&e->proj_mu);
}

/* The conversion of es_engine_projection_json, in the runner's state. */
typedef struct to_json {
  const char *data;
  size_t len;
  es_buf *out;
  int not_json;
  es_err err;
} to_json;

static int to_json_main(lua_State *L) {
  to_json *j = lua_touserdata(L, 1);
  if (es_state_decode(L, j->data, j->len, &j->err) != ES_OK) return 0;
  if (es_json_encode_lua(L, -1, "state", j->out, &j->err) != ES_OK) j->not_json = 1;
  return 0;
}

int es_engine_projection_json(es_engine *e, const char *data, size_t len, es_buf *out,
                              int *not_json, es_err *err) {
  to_json j = {data, len, out, 0, {0}};
  int rc = ES_OK;
  *not_json = 0;
  pthread_mutex_lock(&e->proj_mu);
  if (!e->proj_runner) e->proj_runner = es_runner_new(e, 0, err);
  if (!e->proj_runner) {
    rc = err->code;
  } else {
    lua_State *L = e->proj_runner->L;
    lua_settop(L, 0);
    lua_pushcfunction(L, to_json_main);
    lua_pushlightuserdata(L, &j);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
      rc = es_fail(err, ES_STORAGE, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "error");
    } else if (j.err.code) {
      *err = j.err;
      rc = j.err.code;
      *not_json = j.not_json;
    }
    lua_settop(L, 0);
  }
  pthread_mutex_unlock(&e->proj_mu);
  return rc;
}

void es_projections_release(es_engine *e) {
  es_projections list = {0};
  es_err err = {0};
  if (es_store_projections(e->s, NULL, &list, &err) != ES_OK) return;
  for (size_t i = 0; i < list.n; i++) {
    es_projection *p = &list.v[i];
    if (!p->holder || strcmp(p->holder, e->holder) != 0) continue;
    es_projection next;
    if (es_projection_copy(&next, p) != ES_OK) break;
    free(next.holder);
    next.holder = NULL;
    next.lease_expires_at = 0;
    /* a record moved on meanwhile (a control command) keeps its lease to
     * run out: nothing is lost, another engine waits the TTL */
    (void)es_store_projection_commit(e->s, &next, p->seq, 0, 0, NULL, 0, NULL, &err);
    es_projection_destroy(&next);
  }
  es_projections_destroy(&list);
}
