# eventstore: build, test, bench, install.
#
#   make            build the Lua module (build/lib/eventstore/core.so), libeventstore.a
#                   and the binary (build/bin/eventstore, docs/cli.md); no apt, no root
#   make deps       install the missing Debian packages (apt-get: root)
#   make test       make deps, build, run every test (spec/README.md)
#   make check-sanitize   the same suite under AddressSanitizer (leaks included) + UBSan
#   make fuzz-api   random calls through the Lua API under ASan (SEEDS=, CALLS=; fuzz/README.md)
#   make bench      print benchmark figures (see bench/README.md)
#   make bench-pg   only the PostgreSQL ones (a throwaway server, as make test)
#   make bench-http only the HTTP ones (eventstore serve under wrk, SSE clients)
#   make bench-redis  eventstore beside Redis Streams on this machine (issue 26;
#                   installs redis-server and libhiredis-dev: make deps-bench-redis)
#   make install    put the module where the system Lua 5.4 finds it, the binary,
#                   its man page and the inspector's files (make uninstall: remove them;
#                   eventstore-*.rockspec runs the same target for luarocks make)
#   make demo       the README's first command: a short run on SQLite

# ---- settings --------------------------------------------------------------
CC       ?= cc
LUA      ?= lua5.4
PREFIX   ?= /usr/local
BUILD    ?= build
OPT      ?= -O2 -g
LUA_INC  ?= /usr/include/lua5.4
PG_INC   ?= $(shell pg_config --includedir 2>/dev/null || echo /usr/include/postgresql)
WARN     := -Wall -Wextra -Wshadow -Wmissing-prototypes -Wstrict-prototypes -Wpointer-arith -Werror
# override: `make CFLAGS=...` adds to these flags instead of replacing them.
override CFLAGS += -std=c11 -D_GNU_SOURCE -fPIC $(OPT) $(WARN) -I$(LUA_INC) -I$(PG_INC) -Icore -MMD -MP $(SAN)
# libpq is not linked: backends/postgres.c loads it (dlopen) when a
# postgres:// store first opens (see there why); its headers are needed.
LDLIBS   += -lsqlite3 -lzstd -lsodium -ldl -lpthread -lm
LUA_LIB  ?= -llua5.4
LUA_CMOD_DIR ?= $(PREFIX)/lib/lua/5.4
LUA_LMOD_DIR ?= $(PREFIX)/share/lua/5.4

# Debian packages the build and the tests need (installed by `make deps`);
# lua-cjson only as the benches' reference decoder (bench/fold_bench.lua);
# libmicrohttpd for `eventstore serve` and GnuTLS, which serves its HTTPS
# and checks its certificate (core/http/tls.c); lua-socket as the HTTP
# specs' client; openssl and curl make and call the HTTPS spec's throwaway
# certificates; chromium and its driver for the inspector's browser spec;
# wrk for the HTTP bench and luarocks for the packaging spec.
DEB_PKGS := gcc make lua5.4 liblua5.4-dev lua-busted libsqlite3-dev sqlite3 libzstd-dev libsodium-dev pkg-config valgrind libpq-dev postgresql lua-cjson \
  libmicrohttpd-dev libgnutls28-dev lua-socket
DEB_PKGS += openssl curl
DEB_PKGS += chromium chromium-driver
DEB_PKGS += wrk luarocks
# python3-jsonschema: the OpenAPI spec (spec/94) validates the server's
# real answers against the document's schemas with it (JSON Schema 2020-12).
DEB_PKGS += python3-jsonschema

# ---- sources ---------------------------------------------------------------
# One folder per room, each using only the rooms below it
# (docs/architecture.md; `make check-layers` holds the includes to it):
# util/ (buffers, trees, clock), codec/ (payload JSON in plain C), store/
# (the front door and its rules), backends/ (memory, sqlite, postgres),
# bridge/ (Lua values <-> events, payloads, reducer state), engine/
# (dispatch, budgets, fold), module/ (the Lua handles). Two rooms are the
# binary's only: http/ (below) and main/ (the entry point and its
# eventstore.http module): in neither the library nor the module.
ROOMS    := util codec store backends bridge engine module
CORE_SRC := core/es.c $(foreach r,$(ROOMS),$(wildcard core/$(r)/*.c))
CORE_OBJ := $(CORE_SRC:core/%.c=$(BUILD)/obj/%.o)
MODULE   := $(BUILD)/lib/eventstore/core.so
LIB      := $(BUILD)/libeventstore.a
MAIN_OBJ := $(patsubst core/%.c,$(BUILD)/obj/%.o,$(wildcard core/main/*.c))
# The HTTP room (core/http/, docs/http.md) is linked into the binary and its
# C tests only: the Lua module and libeventstore.a never load libmicrohttpd
# (nor GnuTLS, which tls.c calls to check a certificate before serving it).
HTTP_SRC := $(wildcard core/http/*.c)
# The OpenAPI document (core/http/openapi.json) as a C string: generated
# into the build directory, linked with the HTTP room.
HTTP_GEN := $(BUILD)/gen/openapi_doc.c
HTTP_OBJ := $(HTTP_SRC:core/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/openapi_doc.o
HTTP_LIBS := -lmicrohttpd -lgnutls
BIN      := $(BUILD)/bin/eventstore
# redis_bench needs hiredis, which only make deps-bench-redis installs:
# built by make bench-redis alone, not with the others.
BENCH_SRC := $(filter-out bench/redis_bench.c,$(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
CTEST_SRC := $(wildcard spec/c/*.c)
CTEST_BIN := $(CTEST_SRC:spec/c/%.c=$(BUILD)/ctest/%)
# The store fuzz target built as a plain program that runs a fixed sequence
# of inputs: make test runs it with the C tests (fuzz/README.md).
FUZZ_RUN  := $(BUILD)/ctest/store_fuzz_run $(BUILD)/ctest/http_fuzz_run

LUA_ENV := LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='$(BUILD)/lib/?.so;;'

.PHONY: all deps test check check-sanitize check-valgrind bench bench-pg bench-http bench-redis deps-bench-redis install uninstall programs clean demo fuzz fuzz-api failover-demo soak

all: $(MODULE) $(LIB) $(BIN) $(CTEST_BIN) $(FUZZ_RUN)

# Installs what is missing; a no-op (no apt) when everything is there.
# Only the targets that run things call it (DEPS_FIRST): a plain `make` or
# `make install` builds with what is installed, without apt or root.
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The targets that call `make deps` first (the README's `make demo` and
# `make test` stay one command each). Every object waits for deps when one of
# them is asked for, so that -j never compiles beside a running apt-get.
DEPS_GOALS := test check check-sanitize check-valgrind fuzz-api bench bench-pg bench-http bench-redis demo failover-demo soak
DEPS_FIRST := $(if $(filter $(DEPS_GOALS),$(MAKECMDGOALS)),deps)
$(DEPS_GOALS): deps

$(BUILD)/obj/%.o: core/%.c | $(DEPS_FIRST)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(HTTP_GEN): core/http/openapi.json tools/embed.lua
	@mkdir -p $(dir $@)
	$(LUA) tools/embed.lua es_openapi_json core/http/openapi.json > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/gen/openapi_doc.o: $(HTTP_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(MODULE): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(SAN) -o $@ $^ $(LDLIBS)

# Made afresh: `ar r` keeps members whose source is gone (a file moved to
# another room or split), which would then clash with their new homes.
$(LIB): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	$(AR) rcs $@ $^

# The binary links the core statically (no core.so needed at run time); it
# finds the Lua files as docs/cli.md says.
$(BIN): $(MAIN_OBJ) $(HTTP_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $(MAIN_OBJ) $(HTTP_OBJ) $(LIB) $(LUA_LIB) $(LDLIBS) $(HTTP_LIBS)

$(BUILD)/bench/%: bench/%.c $(LIB) $(MODULE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LUA_LIB) $(LDLIBS)

# pg_bench links libpq itself for its raw reference (the core still loads
# it with dlopen). An explicit rule, not a target-specific LDLIBS, which
# make would pass on to the core.so and libeventstore.a it depends on.
# Benches are never built under ASan (check-sanitize builds `all` only).
$(BUILD)/bench/pg_bench: bench/pg_bench.c $(LIB) $(MODULE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LUA_LIB) $(LDLIBS) -lpq

$(BUILD)/ctest/%: spec/c/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LUA_LIB) $(LDLIBS)

# C tests of the HTTP room (spec/c/http_*_test.c) link it too.
$(BUILD)/ctest/http_%: spec/c/http_%.c $(HTTP_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(HTTP_OBJ) $(LIB) $(LUA_LIB) $(LDLIBS) $(HTTP_LIBS)

$(BUILD)/ctest/store_fuzz_run: fuzz/store_fuzz.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DES_FUZZ_STANDALONE $< -o $@ $(LIB) $(LUA_LIB) $(LDLIBS)

$(BUILD)/ctest/http_fuzz_run: fuzz/http_fuzz.c $(HTTP_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DES_FUZZ_STANDALONE $< -o $@ $(HTTP_OBJ) $(LIB) $(LUA_LIB) $(LDLIBS) $(HTTP_LIBS)

# The README's test command. Last line: "N passed, N failed, N skipped". The suite
# runs on memory:, sqlite: and postgres: (a throwaway PostgreSQL cluster
# that spec/support/pg_cluster.sh starts for the run and removes after it,
# whatever happens).
PG_RUN := sh spec/support/pg_cluster.sh run

test: all check-layers
	@$(LUA_ENV) BUILD=$(BUILD) $(PG_RUN) sh spec/run.sh

check: test

# Holds core/'s includes to the rooms and layers of docs/architecture.md,
# whose table it reads (tools/check_layers.lua; spec/72-layers_spec.lua).
.PHONY: check-layers san-build
check-layers:
	@$(LUA) tools/check_layers.lua core docs/architecture.md

# The same suite with the module built under ASan + UBSan, leaks included.
# The system lua5.4 is not instrumented, so the ASan runtime is preloaded,
# into lua5.4 only: spec/sanitize/lua5.4 comes first on PATH and preloads
# it with spec/sanitize/unpreload.so, which keeps the tools the specs spawn
# (sh, mktemp, make, ...) from inheriting it (LeakSanitizer would fail them
# on leaks of their own). The module is preloaded too, so that lua_close's
# dlclose does not unload it before LeakSanitizer symbolizes its stacks.
# spec/lsan.supp lists the leaks that are Lua's or busted's own, each with
# its reason; nothing of ours is suppressed.
SAN_OPTS := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  LSAN_OPTIONS=suppressions='$(CURDIR)/spec/lsan.supp':print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# The ASan + UBSan build (build-san/) and the preload helper, for
# check-sanitize and fuzz-api; SAN_ENV is the environment their lua5.4 runs in.
san-build:
	@$(MAKE) --no-print-directory BUILD=build-san OPT='-O1 -g -fno-omit-frame-pointer' \
	  SAN='-fsanitize=address,undefined -fno-sanitize-recover=all' all
	@mkdir -p build-san/sanitize
	@$(CC) -std=c11 -shared -fPIC -O2 $(WARN) -o build-san/sanitize/unpreload.so spec/sanitize/unpreload.c

SAN_ENV = lua=$$(command -v $(LUA)) && \
  PATH='$(CURDIR)/spec/sanitize':"$$PATH" ES_SAN_LUA="$$lua" \
  ES_SAN_PRELOAD="$$($(CC) -print-file-name=libasan.so):$(CURDIR)/build-san/lib/eventstore/core.so:$(CURDIR)/build-san/sanitize/unpreload.so" \
  $(SAN_OPTS) LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build-san/lib/?.so;;'

check-sanitize: san-build
	@$(SAN_ENV) BUILD=build-san $(PG_RUN) sh spec/run.sh

check-valgrind: all
	@$(LUA_ENV) $(PG_RUN) sh spec/valgrind.sh

bench: all $(BENCH_BIN)
	@$(LUA_ENV) BUILD=$(BUILD) sh bench/run.sh

# Only the PostgreSQL figures (bench/README.md, "PostgreSQL"), on a
# throwaway server started as for make test; PG_BENCH_SCALE=N scales them.
bench-pg: all $(BUILD)/bench/pg_bench
	@$(LUA_ENV) $(PG_RUN) $(BUILD)/bench/pg_bench

# The HTTP figures (bench/README.md, "HTTP (issue 13)"): eventstore serve
# under wrk on loopback beside the Lua API, and many SSE clients.
bench-http: programs $(BUILD)/bench/sse_fanout
	@$(LUA_ENV) BUILD=$(BUILD) sh bench/http_bench.sh

# eventstore beside Redis Streams (bench/README.md, "Redis Streams (issue
# 26)"): redis-server(s) of its own on loopback, in a temporary directory,
# stopped and removed at the end. REDIS_BENCH_ROUNDS, REDIS_BENCH_SCALE,
# REDIS_BENCH_COUNT and REDIS_BENCH_ONLY as bench/redis_bench.c says.
# Its Debian packages are not in DEB_PKGS (make deps, which CI runs): only
# this target needs them.
REDIS_DEB_PKGS := redis-server libhiredis-dev
deps-bench-redis: deps
	@missing=""; for p in $(REDIS_DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# links hiredis (waits for its headers when bench-redis installs them)
$(BUILD)/bench/redis_bench: bench/redis_bench.c $(LIB) $(MODULE) | $(if $(filter bench-redis,$(MAKECMDGOALS)),deps-bench-redis)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB) $(LUA_LIB) $(LDLIBS) -lhiredis

bench-redis: deps-bench-redis $(BUILD)/bench/redis_bench
	@$(LUA_ENV) BUILD=$(BUILD) sh bench/redis_bench.sh

demo: all
	@$(LUA_ENV) $(LUA) examples/demo.lua

# PostgreSQL failover under load, shown (docs/postgres.md "Failover"): a
# primary and a standby, engines, serve and clients, the primary killed
# with -9, the standby promoted. FAILOVER_RUNS=N repeats it; FAILOVER_MODE
# is sync, async or both (default).
failover-demo: all
	@$(LUA_ENV) BUILD=$(BUILD) $(LUA) spec/support/failover_demo.lua

# A long run under mixed load with engine kills, failing on an upward trend
# of serve's memory, descriptors, threads or latency (bench/soak.lua,
# bench/README.md "Soak"). SOAK_SECONDS sets its length (default 3600).
soak: all
	@$(LUA_ENV) BUILD=$(BUILD) SOAK_LATENCY=1 $(LUA) bench/soak.lua

# ---- install ---------------------------------------------------------------
# The one list of what is installed where (DESTDIR in front of each). The
# rockspec (eventstore-*.rockspec) runs `make programs` and `make install`
# with luarocks' directories in these variables, so `luarocks make` and
# `make install` cannot install different files. The inspector's files go
# beside the Lua files (not to PREFIX/share/eventstore): luarocks deploys a
# rock's Lua directory into its tree but leaves any other share/ inside the
# rock's own directory, where the binary could not find it; beside the Lua
# files the binary finds them as it finds cli.lua (core/main/lua_http.c,
# docs/http.md "--static").
BINDIR    ?= $(PREFIX)/bin
MANDIR    ?= $(PREFIX)/share/man
INSPECTOR_DIR = $(LUA_LMOD_DIR)/eventstore/inspector
LUA_FILES := $(sort $(wildcard lua/eventstore/*.lua))
INSPECTOR_FILES := $(shell find web/inspector -type f ! -name '.*' 2>/dev/null | LC_ALL=C sort)

# What install needs built (the rockspec's build step): not the tests.
programs: $(MODULE) $(BIN)

install: programs
	install -d $(DESTDIR)$(LUA_CMOD_DIR)/eventstore $(DESTDIR)$(LUA_LMOD_DIR)/eventstore
	install -m 755 $(MODULE) $(DESTDIR)$(LUA_CMOD_DIR)/eventstore/core.so
	install -m 644 $(LUA_FILES) $(DESTDIR)$(LUA_LMOD_DIR)/eventstore/
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1
	install -m 755 $(BIN) $(DESTDIR)$(BINDIR)/eventstore
	install -m 644 docs/eventstore.1 $(DESTDIR)$(MANDIR)/man1/eventstore.1
	@set -e; for f in $(INSPECTOR_FILES); do \
	  d='$(DESTDIR)$(INSPECTOR_DIR)'/$$(dirname "$${f#web/inspector/}"); \
	  echo "install -m 644 $$f $$d/"; install -d "$$d"; install -m 644 "$$f" "$$d/"; \
	done

# Removes exactly the files install puts there (as the current tree lists
# them), then the directories that are the package's own when empty; the
# shared ones (bin, man1, lib/lua/5.4, ...) stay.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/eventstore $(DESTDIR)$(MANDIR)/man1/eventstore.1 \
	  $(DESTDIR)$(LUA_CMOD_DIR)/eventstore/core.so \
	  $(addprefix $(DESTDIR)$(LUA_LMOD_DIR)/eventstore/,$(notdir $(LUA_FILES))) \
	  $(patsubst web/inspector/%,$(DESTDIR)$(INSPECTOR_DIR)/%,$(INSPECTOR_FILES))
	@for d in '$(DESTDIR)$(INSPECTOR_DIR)' '$(DESTDIR)$(LUA_LMOD_DIR)/eventstore' '$(DESTDIR)$(LUA_CMOD_DIR)/eventstore'; do \
	  [ ! -d "$$d" ] || find "$$d" -depth -type d -empty -delete; \
	done

# libFuzzer over the JSON codec (C face, and the Lua face against it), over
# the reducer-state codec (decode, and re-encode against the input) and over
# the store's Lua face (hostile Lua values through append, claim, presence);
# see fuzz/README.md. Bounded: FUZZ_TIME seconds per target (default 60).
fuzz: $(HTTP_GEN)
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/state_corpus $(BUILD)/fuzz/store_corpus $(BUILD)/fuzz/segment_corpus $(BUILD)/fuzz/http_corpus
	clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -I$(LUA_INC) -I$(PG_INC) -Icore \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/json_fuzz.c core/codec/json.c core/util/buf.c core/es.c core/bridge/json_lua.c core/bridge/common.c \
	  -o $(BUILD)/fuzz/json_fuzz -llua5.4 -lm
	clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -I$(LUA_INC) -I$(PG_INC) -Icore \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/state_fuzz.c core/bridge/state.c core/codec/json.c core/util/buf.c core/es.c core/bridge/json_lua.c core/bridge/common.c \
	  -o $(BUILD)/fuzz/state_fuzz -llua5.4 -lm
	clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -I$(LUA_INC) -I$(PG_INC) -Icore \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/store_fuzz.c $(CORE_SRC) -o $(BUILD)/fuzz/store_fuzz -llua5.4 $(LDLIBS)
	clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -I$(LUA_INC) -Icore \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/segment_fuzz.c core/store/segment.c core/store/rows.c core/util/buf.c core/es.c \
	  -o $(BUILD)/fuzz/segment_fuzz -lzstd -lsodium -lm
	clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -I$(LUA_INC) -I$(PG_INC) -Icore \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/http_fuzz.c $(CORE_SRC) $(HTTP_SRC) $(HTTP_GEN) -o $(BUILD)/fuzz/http_fuzz -llua5.4 $(LDLIBS) $(HTTP_LIBS)
	$(BUILD)/fuzz/json_fuzz -max_total_time=$${FUZZ_TIME:-60} -dict=fuzz/json.dict -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/corpus
	$(BUILD)/fuzz/state_fuzz -max_total_time=$${FUZZ_TIME:-60} -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/state- $(BUILD)/fuzz/state_corpus
	$(BUILD)/fuzz/store_fuzz -max_total_time=$${FUZZ_TIME:-60} -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/store- $(BUILD)/fuzz/store_corpus
	$(BUILD)/fuzz/segment_fuzz -max_total_time=$${FUZZ_TIME:-60} -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/segment- $(BUILD)/fuzz/segment_corpus
	$(BUILD)/fuzz/http_fuzz -max_total_time=$${FUZZ_TIME:-60} -dict=fuzz/json.dict -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/http- $(BUILD)/fuzz/http_corpus

# The random-call fuzzer of the Lua API and the engine handle
# (fuzz/api_fuzz.lua; make test runs one short fixed seed of it, spec/36):
# SEEDS seeds from FIRST_SEED, CALLS calls each, on memory:, sqlite: and
# postgres: (a throwaway cluster, as make test; ES_TEST_URLS=... picks
# others), under check-sanitize's ASan + UBSan build with leak detection.
# A failure prints its seed, URL and calls; FIRST_SEED=n SEEDS=1 replays it.
FIRST_SEED ?= 1
SEEDS ?= 20
CALLS ?= 2000
fuzz-api: san-build
	@$(SAN_ENV) $(PG_RUN) lua5.4 fuzz/api_fuzz.lua $(FIRST_SEED) $(SEEDS) $(CALLS)

clean:
	rm -rf build build-san

-include $(CORE_OBJ:.o=.d) $(MAIN_OBJ:.o=.d) $(HTTP_OBJ:.o=.d)
