-- `luarocks --lua-version 5.4 make` in a checkout builds and installs the
-- Lua module (eventstore.core and the Lua files), the `eventstore` binary,
-- its man page and the inspector's files. The Makefile does both steps:
-- `make programs` builds, `make install` installs with luarocks'
-- directories in its layout variables, so this rockspec and `make install`
-- install the same files (spec/71-packaging_spec.lua compares the trees).
-- The version follows the module's _VERSION (core/module/store_handle.c).
rockspec_format = "3.0"
package = "eventstore"
version = "0.1.0-1"

source = {
  -- Built from a checkout (luarocks make); no source archive is published.
  url = "git+file://.",
}

description = {
  summary = "A Lua-scriptable event store and engine in C (memory, SQLite, PostgreSQL)",
  detailed = [[
Sessions of events dispatched to Lua handlers and folded by Lua reducers,
stored in memory, SQLite or PostgreSQL; a command-line binary and an HTTP
server (eventstore serve) with a browser inspector.
]],
  license = "MIT",
}

dependencies = {
  "lua >= 5.4, < 5.5",
}

-- The C libraries the Makefile links (Debian: `make deps` installs them).
-- libpq is loaded at run time (dlopen); only its header is needed.
external_dependencies = {
  SQLITE3 = { header = "sqlite3.h" },
  ZSTD = { header = "zstd.h" },
  SODIUM = { header = "sodium.h" },
  MICROHTTPD = { header = "microhttpd.h" },
  GNUTLS = { header = "gnutls/gnutls.h" }, -- serve's TLS certificate checks (core/http/tls.c)
  LIBPQ = { header = "postgresql/libpq-fe.h" },
}

-- A rockspec runs without the standard library (no pairs): both tables
-- are written out.
build = {
  type = "make",
  build_target = "programs",
  build_variables = {
    LUA_INC = "$(LUA_INCDIR)",
    -- luarocks' CFLAGS as the Makefile's optimisation flags (its own
    -- CFLAGS carry the warnings and include paths, which CFLAGS= would
    -- replace).
    OPT = "$(CFLAGS)",
    -- No apt-get from inside luarocks: external_dependencies are checked
    -- instead.
    DEB_PKGS = "",
  },
  install_target = "install",
  install_variables = {
    LUA_INC = "$(LUA_INCDIR)",
    OPT = "$(CFLAGS)",
    DEB_PKGS = "",
    PREFIX = "$(PREFIX)",
    BINDIR = "$(BINDIR)",
    LUA_CMOD_DIR = "$(LIBDIR)",
    LUA_LMOD_DIR = "$(LUADIR)",
  },
  -- The docs stay in the source tree (the man page is installed).
  copy_directories = {},
}
