/*
 * bridge/common.c: the eventstore error object shared by every Lua-facing C
 * file (bridge/common.h, docs/contract.md §2): a table {code = "CODE", message =
 * "..."} whose metatable, registered as "eventstore.Error", makes
 * tostring(e) read "CODE: message". And boxes (common.h).
 */
#include "bridge/common.h"

#include <lauxlib.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A box is this header, then the caller's bytes. Lua aligns a userdata
 * for its LUAI_MAXALIGN types only (not for max_align_t's long double), so
 * the header is padded for those: what a box holds needs no more. */
typedef union box_head {
  struct {
    es_box_release release; /* NULL once it ran */
    es_box_tracker *tracker; /* NULL: untracked */
    size_t slot;             /* its index in tracker->boxes */
  } h;
  void *align_p;
  double align_d;
  long long align_ll;
} box_head;

#define BOX_MT "eventstore.Box"

static const char tracker_key = 't'; /* registry: the state's es_box_tracker */

static box_head *head_of(void *box) { return (box_head *)box - 1; }

static void untrack(box_head *h) {
  es_box_tracker *t = h->h.tracker;
  if (!t) return;
  h->h.tracker = NULL;
  void *last = t->boxes[--t->n];
  if (h->h.slot < t->n) { /* the last one takes its slot */
    t->boxes[h->h.slot] = last;
    head_of(last)->h.slot = h->h.slot;
  }
}

void es_box_release_now(void *box) {
  box_head *h = head_of(box);
  es_box_release release = h->h.release;
  h->h.release = NULL;
  untrack(h);
  if (release) release(box);
}

static int box_gc(lua_State *L) {
  /* Checked: a script can reach this function (debug.getregistry) and
   * call it with any value; only a box has a release to run. */
  box_head *h = luaL_testudata(L, 1, BOX_MT);
  if (h) es_box_release_now(h + 1);
  return 0;
}

void *es_lua_push_box(lua_State *L, size_t size, int nuv, es_box_release release) {
  luaL_checkstack(L, 3, "box");
  box_head *h = lua_newuserdatauv(L, sizeof *h + size, nuv);
  memset(h, 0, sizeof *h + size);
  if (luaL_newmetatable(L, BOX_MT)) {
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tracker_key);
  es_box_tracker *t = lua_touserdata(L, -1);
  lua_pop(L, 1);
  /* Only now: nothing above can raise once the box holds something. */
  h->h.release = release;
  if (t && t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    void **v = realloc(t->boxes, cap * sizeof *v);
    if (v) {
      t->boxes = v;
      t->cap = cap;
    }
  }
  if (t && t->n < t->cap) { /* else untracked: its __gc alone releases it */
    h->h.tracker = t;
    h->h.slot = t->n;
    t->boxes[t->n++] = h + 1;
  }
  return h + 1;
}

void es_lua_set_box_tracker(lua_State *L, es_box_tracker *t) {
  lua_pushlightuserdata(L, t);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tracker_key);
}

void es_box_tracker_freeing(es_box_tracker *t, const void *block, size_t len) {
  const char *from = block;
  for (size_t i = 0; i < t->n;) {
    const char *box = t->boxes[i];
    if (box >= from && box < from + len) es_box_release_now(t->boxes[i]); /* i now holds another */
    else i++;
  }
}

void es_box_tracker_destroy(es_box_tracker *t) {
  free(t->boxes);
  memset(t, 0, sizeof *t);
}

static int error_tostring(lua_State *L) {
  /* Raw reads: the fields are ours, and a user-set __index on an error
   * table must not make tostring raise while reporting an error. */
  const char *code, *msg;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushliteral(L, "code");
  lua_rawget(L, 1);
  lua_pushliteral(L, "message");
  lua_rawget(L, 1);
  code = lua_tostring(L, 2);
  msg = lua_tostring(L, 3);
  if (!code) code = "ERROR";
  if (msg) lua_pushfstring(L, "%s: %s", code, msg);
  else lua_pushstring(L, code);
  return 1;
}

/* Pushes the metatable, creating it on first use in this lua_State. */
static void push_error_mt(lua_State *L) {
  if (luaL_newmetatable(L, ES_LUA_ERROR_MT)) {
    lua_pushcfunction(L, error_tostring);
    lua_setfield(L, -2, "__tostring");
  }
}

void es_lua_push_error(lua_State *L, int code, const char *message) {
  luaL_checkstack(L, 3, "error object");
  lua_createtable(L, 0, 2);
  lua_pushstring(L, es_strerror(code));
  lua_setfield(L, -2, "code");
  lua_pushstring(L, message ? message : "");
  lua_setfield(L, -2, "message");
  push_error_mt(L);
  lua_setmetatable(L, -2);
}

int es_lua_raise(lua_State *L, const es_err *err) {
  es_lua_push_error(L, err->code, err->msg);
  return lua_error(L);
}

int es_lua_encode_arg(lua_State *L, es_lua_encoder enc, const char *what) {
  es_buf b;
  es_err err;
  es_buf_init(&b);
  if (enc(L, 1, what, &b, &err) != ES_OK) {
    es_buf_destroy(&b);
    return es_lua_raise(L, &err);
  }
  es_lua_push_buf(L, &b);
  es_buf_destroy(&b);
  return 1;
}

int es_lua_decode_arg(lua_State *L, es_lua_decoder dec) {
  size_t len;
  const char *s;
  es_err err;
  luaL_checktype(L, 1, LUA_TSTRING);
  s = lua_tolstring(L, 1, &len);
  if (dec(L, s, len, &err) != ES_OK) return es_lua_raise(L, &err);
  return 1;
}

int es_lua_raisef(lua_State *L, int code, const char *fmt, ...) {
  char small[ES_ERRMSG_MAX];
  va_list ap, ap2;
  int n;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    va_end(ap2);
    es_lua_push_error(L, code, fmt);
    return lua_error(L);
  }
  if ((size_t)n < sizeof small) {
    va_end(ap2);
    es_lua_push_error(L, code, small);
  } else {
    /* Too long for the stack copy: format into a Lua buffer instead of
     * truncating (the message is what the user reads). */
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    luaL_pushresultsize(&b, (size_t)n);
    es_lua_push_error(L, code, lua_tostring(L, -1));
  }
  return lua_error(L);
}

static int push_buf_unprotected(lua_State *L) {
  es_buf *b = lua_touserdata(L, 1);
  lua_pushlstring(L, b->data ? b->data : "", b->len);
  return 1;
}

void es_lua_push_names(lua_State *L, const void *key, const char *const *names, int n) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_createtable(L, n - 1, 0);
  for (int i = 1; i < n; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i);
  }
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}

void es_lua_push_buf(lua_State *L, es_buf *b) {
  lua_pushcfunction(L, push_buf_unprotected);
  lua_pushlightuserdata(L, b);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    es_buf_destroy(b);
    lua_error(L);
  }
}
