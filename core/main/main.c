/*
 * main.c: the `eventstore` binary (build/bin/eventstore), shaped like Lua's
 * own lua.c: main() creates a Lua state and runs pmain() under lua_pcall;
 * pmain() opens the standard libraries, makes the statically linked core
 * and the Lua files findable, and calls require("eventstore.cli").main(argv)
 * through docall() (a traceback handler, as lua.c's docall). Every command
 * is Lua (lua/eventstore/cli.lua, docs/cli.md); this file only hosts it.
 *
 * Not part of the library or the module: the Makefile keeps it out of
 * CORE_SRC and links it with libeventstore.a and the Lua-face objects.
 *
 * Exit codes: what cli.main returns (0 ok, 1 runtime error, 2 usage error);
 * 1 when an error escapes it, reported on stderr as "eventstore: message".
 * Signals are the host's (the library installs none): tty.watch_signals()
 * installs SIGINT/SIGTERM handlers that count; `run` polls tty.signals()
 * and stops its engine, which interrupts running handlers and returns
 * within about a second. A second signal ends the process at once
 * (claims expire; nothing is lost).
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROGNAME "eventstore"

#include "module/module.h" /* the module, linked statically: registered in package.preload */
#include "main/lua_http.h" /* eventstore.http: `serve` and `token` (the binary only) */

/* Prints "eventstore: msg" on stderr (lua.c's l_message). */
static void l_message(const char *msg) {
  fprintf(stderr, "%s: %s\n", PROGNAME, msg);
  fflush(stderr);
}

/* Reports a non-ok status with the message on top of the stack. */
static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    l_message(msg ? msg : "(error with no message)");
    lua_pop(L, 1);
  }
  return status;
}

/*
 * Message handler for docall. An eventstore error object (a table whose
 * __tostring gives "CODE: message") or any value with __tostring is an
 * expected failure (unreachable database, bad input): the user gets that
 * one line, no traceback. A string error is a bug somewhere: it gets the
 * traceback, as lua.c does.
 */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Calls the function below narg arguments with msghandler (lua.c's docall). */
static int docall(lua_State *L, int narg, int nres) {
  int status;
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  status = lua_pcall(L, narg, nres, base);
  lua_remove(L, base);
  return status;
}

/* Whether path names an existing file. */
static int exists(const char *path) {
  return access(path, F_OK) == 0;
}

/*
 * Puts the Lua files next to the binary in front of package.path, so the
 * binary always runs the Lua face matching its C code:
 *   build tree:  <exe dir>/../../lua   (build/bin/eventstore -> lua/)
 *   installed:   <exe dir>/../share/lua/5.4   (PREFIX/bin -> PREFIX/share)
 * Each only when it holds eventstore/cli.lua, so an installed binary does
 * not search a stray /lua. The default path (LUA_PATH_5_4 / LUA_PATH or
 * Lua's built-in /usr/local/share/lua/5.4 ...) stays behind them. The
 * engine gives its worker states this state's package.path, so handlers'
 * require() sees the same files; the environment is left alone (a handler's
 * child lua5.4 is not pointed at this build tree).
 */
static void set_path(lua_State *L) {
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  static const char *const roots[] = {"/../../lua", "/../share/lua/5.4"};
  luaL_Buffer b;
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  size_t i;
  char *slash;

  luaL_buffinit(L, &b);
  if (n > 0) {
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (slash != NULL) *slash = '\0';
    for (i = 0; i < sizeof roots / sizeof roots[0]; i++) {
      snprintf(probe, sizeof probe, "%s%s/eventstore/cli.lua", exe, roots[i]);
      if (!exists(probe)) continue;
      lua_pushfstring(L, "%s%s/?.lua;%s%s/?/init.lua;", exe, roots[i], exe, roots[i]);
      luaL_addvalue(&b);
    }
  }
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_remove(L, -2);
  luaL_addvalue(&b);
  luaL_pushresult(&b);
  lua_getglobal(L, "package");
  lua_insert(L, -2);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

/* tty.isatty(fd): whether file descriptor fd (0, 1, 2) is a terminal. */
static int tty_isatty(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "not a file descriptor");
  lua_pushboolean(L, isatty((int)fd));
  return 1;
}

/* Signals seen since tty.watch_signals(): a process-wide flag is the one
 * thing a signal handler may touch, and this file is the host. */
static volatile sig_atomic_t signals_seen = 0;
static volatile int64_t first_signal_ms = 0;

static int64_t signal_now_ms(void) { /* clock_gettime is async-signal-safe */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_signal(int sig) {
  /* One keypress or kill can arrive twice (to the process and to its
   * group, as timeout(1) sends it): only a signal a moment after the first
   * is someone asking again. */
  if (signals_seen > 0 && signal_now_ms() - first_signal_ms < 250) return;
  if (signals_seen > 0) { /* the second one: quit now */
    static const char msg[] = "\neventstore: quitting at once; running attempts' claims will expire\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(128 + sig);
  }
  first_signal_ms = signal_now_ms();
  signals_seen = sig;
}

/* tty.watch_signals(): SIGINT and SIGTERM are counted from now on. */
static int tty_watch_signals(lua_State *L) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  (void)L;
  return 0;
}

/* tty.signals() -> the signal number seen (0: none yet). */
static int tty_signals(lua_State *L) {
  lua_pushinteger(L, signals_seen);
  return 1;
}

/* tty.now_ms(): a monotonic clock in milliseconds, to pace the progress
 * line (os.time has only seconds, os.clock is CPU time). */
static int tty_now_ms(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushinteger(L, (lua_Integer)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  return 1;
}

/* tty.sleep_ms(ms): sleeps up to ms milliseconds; a signal ends it early
 * (nanosleep returns EINTR whatever SA_RESTART says), so a loop polling
 * tty.signals() answers at once. */
static int tty_sleep_ms(lua_State *L) {
  lua_Integer ms = luaL_checkinteger(L, 1);
  if (ms < 0) ms = 0;
  if (ms > 60000) ms = 60000;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  return 0;
}

static const luaL_Reg tty_fns[] = {
    {"isatty", tty_isatty},
    {"sleep_ms", tty_sleep_ms},
    {"now_ms", tty_now_ms},
    {"watch_signals", tty_watch_signals},
    {"signals", tty_signals},
    {NULL, NULL},
};

/* require("eventstore.tty"): terminal helpers only the binary has (the CLI
 * falls back to "not a terminal" when run from a plain lua5.4). */
static int luaopen_eventstore_tty(lua_State *L) {
  luaL_newlib(L, tty_fns);
  return 1;
}

/* Registers the statically linked C modules in package.preload. */
static void preload(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_eventstore_core);
  lua_setfield(L, -2, "eventstore.core");
  lua_pushcfunction(L, luaopen_eventstore_tty);
  lua_setfield(L, -2, "eventstore.tty");
  lua_pushcfunction(L, luaopen_eventstore_http);
  lua_setfield(L, -2, "eventstore.http");
  lua_pop(L, 1);
}

/* Calls cli.main(argv) (argv[1..], the program name as argv[0]) with the
 * module table at index 3; leaves the exit code on the stack. */
static int l_runcli(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int i;
  lua_getfield(L, 3, "main");
  if (lua_type(L, -1) != LUA_TFUNCTION)
    return luaL_error(L, "module 'eventstore.cli' has no main function");
  lua_createtable(L, argc > 0 ? argc - 1 : 0, 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_call(L, 1, 1);
  return 1;
}

/* Everything that runs inside the protected call; returns the exit code. */
static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int status, code = EXIT_FAILURE;
  luaL_checkversion(L);
  luaL_openlibs(L);
  preload(L);
  set_path(L);
  /* Loading apart from running: a binary that cannot find its Lua files
   * says so, with where it looked, instead of a traceback. */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "eventstore.cli");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    lua_pushfstring(L, "cannot load its Lua files (see docs/cli.md, \"Where the binary finds its Lua "
                       "files\"): %s", lua_tostring(L, -1));
    report(L, LUA_ERRRUN);
    lua_pushinteger(L, EXIT_FAILURE);
    return 1;
  }
  lua_pushcfunction(L, l_runcli);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  lua_pushvalue(L, -4);
  status = docall(L, 3, 1);
  if (report(L, status) == LUA_OK) {
    if (lua_isnil(L, -1)) {
      code = EXIT_SUCCESS;
    } else if (lua_isinteger(L, -1)) {
      lua_Integer c = lua_tointeger(L, -1);
      code = (c >= 0 && c <= 125) ? (int)c : EXIT_FAILURE;
    } else {
      l_message("eventstore.cli main returned a non-integer exit code");
    }
  }
  lua_pushinteger(L, code);
  return 1;
}

int main(int argc, char **argv) {
  int status, code;
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    l_message("cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  code = status == LUA_OK ? (int)lua_tointeger(L, -1) : EXIT_FAILURE;
  report(L, status);
  /* Closing runs __gc/__close: stores flush and close before exit. */
  lua_close(L);
  return code;
}
