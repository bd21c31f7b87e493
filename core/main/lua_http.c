/*
 * main/lua_http.c: the Lua module `eventstore.http`, the binary's way to
 * the HTTP server (http.h); core/main/main.c registers it in package.preload,
 * so only the binary has it (the Lua module core.so never links
 * libmicrohttpd). lua/eventstore/cli.lua's `serve` and `token` use it.
 *
 *   http.start{store = Store, engine = Engine|nil, listen = "HOST:PORT",
 *              tokens = PATH, static = DIR|nil, max_body = N, max_batch = N,
 *              max_connections = N, request_timeout = S, header_timeout_ms = MS,
 *              max_per_client = N, max_streams = N,
 *              stream_buffer = N, max_limit = N, max_response_bytes = N,
 *              tls_cert = PATH, tls_key = PATH (both or neither: HTTPS)} -> server
 *   server:port() -> the TCP port;  server:tls() -> whether it serves HTTPS
 *   server:stop() (also __close, __gc)
 *   http.hash_token(token) -> "sha256:<hex>"
 *   http.new_token() -> 64 hex digits from libsodium's randombytes_buf
 *   http.default_static() -> the inspector's directory next to the binary, or nil
 *
 * The server handle is shaped like the other handles (liolib): created
 * closed before the server starts, one close function behind stop(),
 * __close and __gc, stopping twice is harmless. It keeps the store and
 * engine handles it was given in its user values, so they cannot be
 * collected while it serves (closing them explicitly first is the
 * caller's mistake: the server's calls then fail with CLOSED).
 */
#include <lauxlib.h>
#include <lua.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"
#include "main/lua_http.h"
#include "http/tokens.h"
#include "bridge/common.h"
#include "module/engine_handle.h"
#include "bridge/events.h"
#include "module/store_handle.h"

#define SERVER_MT "eventstore.HttpServer"

typedef struct lserver {
  es_http *h; /* NULL: stopped */
} lserver;

/* A string field without NUL bytes, or NULL when absent. Left on the
 * stack (its anchor). */
static const char *opt_text(lua_State *L, int arg, const char *field) {
  lua_getfield(L, arg, field);
  if (lua_isnil(L, -1)) return NULL;
  size_t n;
  const char *s = lua_tolstring(L, -1, &n);
  if (lua_type(L, -1) != LUA_TSTRING || strlen(s) != n)
    luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be a string without NUL bytes", field));
  return s;
}

static int64_t opt_limit(lua_State *L, int arg, const char *field, int64_t max) {
  int64_t v = es_lua_opt_int_field(L, arg, field, 0);
  if (v < 0 || v > max)
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s must be from 1 to %lld", field, (long long)max);
  return v;
}

static int l_start(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "store"); /* 2 */
  es_store *store = es_lua_check_store(L, 2, NULL);
  lua_getfield(L, 1, "engine"); /* 3: the engine.lua table or its handle */
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "_handle");
    lua_replace(L, 3);
  }
  es_engine *engine = lua_isnil(L, 3) ? NULL : es_lua_check_engine(L, 3);
  es_http_opts o;
  es_http_opts_init(&o);
  o.listen = opt_text(L, 1, "listen");
  if (!o.listen) o.listen = "127.0.0.1:8080";
  o.tokens_path = opt_text(L, 1, "tokens");
  if (!o.tokens_path) es_lua_raisef(L, ES_INVALID_ARGUMENT, "start needs tokens = PATH (a tokens file)");
  o.static_dir = opt_text(L, 1, "static");
  o.tls_cert_path = opt_text(L, 1, "tls_cert");
  o.tls_key_path = opt_text(L, 1, "tls_key");
  o.limits.max_body = (size_t)opt_limit(L, 1, "max_body", (int64_t)1 << 40);
  o.limits.max_batch = (size_t)opt_limit(L, 1, "max_batch", 1000000);
  o.limits.max_connections = (unsigned)opt_limit(L, 1, "max_connections", 100000);
  o.limits.request_timeout_s = (unsigned)opt_limit(L, 1, "request_timeout", 86400);
  o.limits.header_timeout_ms = (unsigned)opt_limit(L, 1, "header_timeout_ms", 86400000);
  o.limits.max_per_client = (unsigned)opt_limit(L, 1, "max_per_client", 100000);
  o.limits.max_streams = (unsigned)opt_limit(L, 1, "max_streams", 100000);
  o.limits.stream_buffer = (size_t)opt_limit(L, 1, "stream_buffer", (int64_t)1 << 34);
  o.limits.max_limit = opt_limit(L, 1, "max_limit", 1000000);
  o.limits.max_response_bytes = (size_t)opt_limit(L, 1, "max_response_bytes", (int64_t)1 << 40);

  lserver *s = lua_newuserdatauv(L, sizeof *s, 2);
  s->h = NULL;
  luaL_setmetatable(L, SERVER_MT);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, -2, 2);
  es_err err = {0};
  if (es_http_start(store, engine, &o, &s->h, &err) != ES_OK) return es_lua_raise(L, &err);
  return 1;
}

static int l_port(lua_State *L) {
  lserver *s = luaL_checkudata(L, 1, SERVER_MT);
  if (!s->h) return es_lua_raisef(L, ES_CLOSED, "the server is stopped");
  lua_pushinteger(L, es_http_port(s->h));
  return 1;
}

static int l_tls(lua_State *L) {
  lserver *s = luaL_checkudata(L, 1, SERVER_MT);
  if (!s->h) return es_lua_raisef(L, ES_CLOSED, "the server is stopped");
  lua_pushboolean(L, es_http_tls(s->h));
  return 1;
}

static int l_stop(lua_State *L) {
  lserver *s = luaL_checkudata(L, 1, SERVER_MT);
  if (s->h) {
    es_http_stop(s->h);
    s->h = NULL;
  }
  return 0;
}

static int l_hash_token(lua_State *L) {
  size_t n;
  const char *tok = luaL_checklstring(L, 1, &n);
  if (n == 0) return es_lua_raisef(L, ES_INVALID_ARGUMENT, "the token is empty");
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)tok[i] < 0x21 || (unsigned char)tok[i] > 0x7e)
      return es_lua_raisef(L, ES_INVALID_ARGUMENT,
                           "a token is printable ASCII without spaces (byte %zu is 0x%02X)", i + 1,
                           (unsigned char)tok[i]);
  char out[ES_TOKEN_HASH_CHARS];
  es_err err = {0};
  if (es_token_hash(tok, n, out, &err) != ES_OK) return es_lua_raise(L, &err);
  lua_pushstring(L, out);
  return 1;
}

static int l_new_token(lua_State *L) {
  char out[ES_TOKEN_NEW_CHARS];
  es_err err = {0};
  if (es_token_new(out, &err) != ES_OK) return es_lua_raise(L, &err);
  lua_pushstring(L, out);
  return 1;
}

/* Where the inspector's files are, found like core/main/main.c finds the Lua
 * files: next to the binary, installed (PREFIX/bin ->
 * PREFIX/share/lua/5.4/eventstore/inspector, beside the Lua files: where
 * both make install and luarocks put them, luarocks deploying a rock's Lua
 * directory but no other share/ directory; see the Makefile's install) or
 * in the build tree (build/bin -> web/inspector). */
static int l_default_static(lua_State *L) {
  static const char *const rel[] = {"/../share/lua/5.4/eventstore/inspector", "/../../web/inspector"};
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
      snprintf(probe, sizeof probe, "%s%s", exe, rel[i]);
      if (access(probe, R_OK | X_OK) == 0) {
        char real[PATH_MAX];
        lua_pushstring(L, realpath(probe, real) ? real : probe);
        return 1;
      }
    }
  }
  lua_pushnil(L);
  return 1;
}

static const luaL_Reg server_methods[] = {
    {"port", l_port},
    {"tls", l_tls},
    {"stop", l_stop},
    {NULL, NULL},
};

static const luaL_Reg module_fns[] = {
    {"start", l_start},
    {"hash_token", l_hash_token},
    {"new_token", l_new_token},
    {"default_static", l_default_static},
    {NULL, NULL},
};

int luaopen_eventstore_http(lua_State *L) {
  if (luaL_newmetatable(L, SERVER_MT)) {
    lua_pushcfunction(L, l_stop);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_stop);
    lua_setfield(L, -2, "__close");
    luaL_newlib(L, server_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  luaL_newlib(L, module_fns);
  return 1;
}
