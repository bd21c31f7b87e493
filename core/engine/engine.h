/*
 * engine.h: the engine (docs/contract.md §4, docs/engine.md) as a C subsystem.
 *
 * An engine dispatches a store's pending events to Lua handlers loaded
 * from a scripts directory: worker threads, each with its own Lua state,
 * claim ready events (claim_next), run the handler under budgets, and
 * complete (appending what it returned, exactly once) or fail them (retry
 * with exponential backoff, dead letter at max_failures). A keeper thread
 * renews the claims of long handlers and is the watchdog: it stops calls
 * past their deadline, and abandons (and replaces) a worker stuck where no
 * hook reaches. It also folds reducers, with snapshots, on fold runners
 * (es_engine_state): threads with a Lua state each, so no user code runs
 * in the caller's state, and calls from several threads fold in parallel.
 *
 * Threads: es_engine_stop may be called from any thread and from a signal
 * handler; es_engine_state and es_engine_state_json from any threads at
 * once; every other call from one thread at a time.
 *
 * The engine installs no signal handlers: a host that wants SIGINT or
 * SIGTERM to stop a run installs its own and calls es_engine_stop.
 */
#ifndef ES_ENGINE_H
#define ES_ENGINE_H

#include "store/store.h"
#include "util/buf.h"

typedef struct es_engine es_engine;
struct lua_State; /* lua.h's, not included: C callers of the engine need no Lua headers */

#define ES_ENGINE_MAX_WORKERS 256

/* Options; start from es_engine_opts_init (the documented defaults). */
typedef struct es_engine_opts {
  const char *scripts;        /* scripts directory; must exist (copied) */
  const char *holder;         /* claim holder name; NULL: "engine-<pid>-<random>" (copied) */
  int64_t workers;            /* worker threads, 1..ES_ENGINE_MAX_WORKERS */
  int64_t fold_runners;       /* threads that fold for es_engine_state, each with its own
                               * Lua state, started as calls need them; 0: the number of
                               * cores, at least 2 (ES_ENGINE_MAX_WORKERS at most) */
  int64_t ttl_ms;             /* claim TTL (renewed every ttl_ms/3 while a handler runs) */
  int64_t max_failures;       /* failures before an event is dead-lettered */
  int64_t backoff_ms;         /* the n-th retry waits between half and all of */
  int64_t backoff_cap_ms;     /*   min(backoff_ms * 2^(n-1), backoff_cap_ms) */
  int64_t instruction_budget; /* VM instructions per handler or reducer call; 0: none */
  int64_t memory_budget;      /* bytes one Lua state of the engine may hold; 0: none */
  int64_t deadline_ms;        /* wall-clock time per handler call or fold */
  int64_t snapshot_every;     /* events folded between snapshots; 0: no snapshots */
  int64_t outage_ms;          /* how long a store call failing with STORAGE (a lost
                               * connection, a server restarting) is retried, with
                               * backoff, before it is given up; 0: not retried */
  const char *lua_path;       /* package.path of the engine's states; NULL: Lua's default */
  const char *lua_cpath;      /* package.cpath; NULL: Lua's default */
  int (*open_core)(struct lua_State *L);
                              /* the eventstore.core module's luaopen
                               * (luaopen_eventstore_core, module/module.h),
                               * put in package.preload of the engine's
                               * states, so that a script's require finds the
                               * module linked into this very library rather
                               * than a second copy of it on lua_cpath. The
                               * module sits above the engine (docs/
                               * architecture.md), hence a hook set by the
                               * caller: the Lua handle sets it, and so must
                               * a C program that links libeventstore.a and
                               * whose scripts require "eventstore". NULL:
                               * nothing preloaded. */
  int quiet;                  /* 1: log nothing on stderr (a replay, docs/replay.md,
                               * reports the failures it meets itself) */
  int inline_runs;            /* 1: an until_idle run works on the calling thread
                               * (workers must be 1): no thread is started, each
                               * completion is written as soon as its handler
                               * returns, the deadline is checked by the budget
                               * hook, and the scripts are looked at again at most
                               * once a second. For a store no other engine works
                               * on (the replay's scratch store, docs/replay.md):
                               * no claim is renewed while a handler runs and a
                               * call stuck where no hook reaches is waited for,
                               * not abandoned (docs/engine.md "Inline runs"). */
} es_engine_opts;

void es_engine_opts_init(es_engine_opts *o);

/* Creates an engine on s (retained until the engine is gone). Checks the
 * options (INVALID_ARGUMENT naming the option), that the scripts
 * directory exists, creates the workers' Lua states (which need
 * lua/eventstore/loader.lua on lua_path) and loads every handler and
 * reducer once (docs/contract.md §4): one that does not load is INVALID_ARGUMENT
 * naming its file and line. *out: es_engine_close it. */
int es_engine_open(es_store *s, const es_engine_opts *o, es_engine **out, es_err *err);

/* The scripts directory as given (borrowed: valid while the engine is). */
const char *es_engine_scripts(es_engine *e);

/* Script reloads that failed since the engine opened (the last good
 * version ran on; docs/contract.md §4). */
int64_t es_engine_reload_failures(es_engine *e);

/* §3.9 retention policies: lua/eventstore/retention.lua applies them (over
 * the store's public calls, from the thread that drives the run); the
 * engine only keeps the counts, so that engine:stats() and /metrics show
 * them (docs/retention.md "Retention policies"). */
enum { ES_RETAIN_TRUNCATE, ES_RETAIN_ARCHIVE, ES_RETAIN_DELETE, ES_RETAIN_FAILED, ES_RETAIN_SWEEPS,
       ES_RETAIN_KINDS };
/* The names of the kinds above, as stats() and /metrics show them. Static. */
const char *es_retain_kind_name(int kind);
/* Counts one of kind; an unknown kind is ignored (-1 returned, else 0). */
int es_engine_retain_count(es_engine *e, int kind);
int64_t es_engine_retain_counted(es_engine *e, int kind);

/* The store the engine works on (borrowed: valid while the engine is). */
es_store *es_engine_store(es_engine *e);

/* Stops the run in progress (no effect when none is). Handlers in flight are
 * interrupted (their attempts fail as interrupted, to be retried) and a
 * worker that does not unwind within a second is abandoned, so the run
 * returns within about a second whatever the handlers do.
 * Async-signal-safe. */
void es_engine_stop(es_engine *e);

typedef struct es_engine_stats {
  int64_t handled;   /* events whose handler returned and whose completion was stored */
  int64_t failed;    /* failed attempts that will be retried */
  int64_t dead;      /* events dead-lettered */
  int64_t abandoned; /* workers abandoned (stuck past the deadline or a stop) */
  int64_t busy;      /* handlers running right now */
  int64_t unhandled; /* at the end of a run: pending events of types with no handler here */
  char unhandled_types[256]; /* their types, "a, b" (cut with "..." when long) */
} es_engine_stats;

/* Called on the running thread about every progress_ms; return non-zero
 * to stop the run. */
typedef int (*es_engine_progress_fn)(void *ctx, const es_engine_stats *now);

typedef struct es_run_opts {
  int until_idle;               /* return once no event is ready and no worker is busy */
  es_engine_progress_fn progress; /* NULL: none */
  void *progress_ctx;
  int64_t progress_ms;          /* 0: 500 */
} es_run_opts;

/* Runs the workers on the calling thread's behalf until es_engine_stop,
 * the progress callback, a closed store, or (until_idle) no ready event.
 * Store calls failing with STORAGE are retried with backoff (outage_ms);
 * an until_idle run ends with a claim's error when it is not STORAGE, when
 * no claim of this engine ever succeeded, or after outage_ms of STORAGE.
 * *stats: the run's counts. ES_INVALID_ARGUMENT when a run is already in
 * progress; ES_STORAGE when no worker thread could start. */
int es_engine_run(es_engine *e, const es_run_opts *ro, es_engine_stats *stats, es_err *err);

/* Folds reducer over session through at (ES_NONE: the head) from the
 * newest usable snapshot, snapshotting as configured, and writes the state
 * encoded by the reducer-state codec (bridge/state.h) into out (appended).
 * *index: the index folded through. Errors: NOT_FOUND (no such reducer),
 * NO_SUCH_EVENT (at beyond the head), INVALID_ARGUMENT (the reducer failed,
 * went over a budget or its state cannot be serialised: the message names
 * the reducer), store errors. */
int es_engine_state(es_engine *e, const char *session, const char *reducer, int64_t at,
                    es_buf *out, int64_t *index, es_err *err);

/* es_engine_state, but out gets the state as JSON text (the payload
 * codec's canonical text, es_json_encode_lua's rules), for callers that
 * hand it to programs in other languages (the HTTP API). A state that
 * JSON cannot carry (float or mixed keys, NaN, text that is not UTF-8, a
 * function...) is INVALID_ARGUMENT "the state of reducer 'r' cannot be
 * written as JSON: <path>: ..." with *not_json = 1 (0 for every other
 * error), so the caller can tell it from a reducer that failed. */
int es_engine_state_json(es_engine *e, const char *session, const char *reducer, int64_t at,
                         es_buf *out, int64_t *index, int *not_json, es_err *err);

/* §7: upcasts a list of event tables (encoded with the reducer-state
 * codec, bridge/state.h: events[0..len), borrowed) on a fold runner, as
 * handlers would see them, and appends the list's encoding to out.
 * Errors: INVALID_ARGUMENT (bytes that do not decode; an upcaster that
 * fails: the message names it and the event), STORAGE. */
int es_engine_upcast(es_engine *e, const char *events, size_t len, es_buf *out, es_err *err);

/* §3.9 with state kept readable: snapshots every reducer of
 * scripts/reducers at `through` (whatever snapshot_every says), then
 * es_store_truncate. A reducer that fails to fold (or needs events already
 * dropped: TRUNCATED) stops it before anything is dropped. */
int es_engine_truncate(es_engine *e, const char *session, int64_t through, int64_t *first_index,
                       es_err *err);

/* Whether scripts/handlers/<type>.lua exists (loadable or not). */
int es_engine_has_handler(es_engine *e, const char *type);

/* store append with the engine's rule for events it writes itself: an
 * event of a type with no handler is stored processed (settled), since
 * nothing here would ever handle it. evs[i].settled may be set. */
int es_engine_append(es_engine *e, const char *session, es_new_event *evs, size_t n,
                     int64_t expected, es_events *out, int *pending, es_err *err);

/* Takes (or renews) the session's lease (store.h es_store_lease) for this
 * engine's holder. While it holds it, the engine's writes to the session
 * (completions, es_engine_append) carry the lease's fence token and the
 * keeper renews it every ttl_ms/3. When a write is refused with
 * STALE_FENCE (another holder took the lease over) the attempt fails with
 * that error, the engine drops the lease and its claims skip the session
 * from then on, leaving its events to the new holder, and
 * es_engine_append there is STALE_FENCE, until es_engine_lease takes it
 * again. out as es_store_lease's. */
int es_engine_lease(es_engine *e, const char *session, int64_t ttl_ms, es_lease *out,
                    es_err *err);
/* Ends the engine's lease on session early (*released: whether the store
 * still had it as this engine's). */
int es_engine_release(es_engine *e, const char *session, int *released, es_err *err);

/* Frees the engine (must not be running). A Lua state that does not close
 * within a second (a finalizer that never returns) is left to its thread. */
/* §8: a projection state as stored (the reducer-state codec's bytes,
 * store/projections.h) as JSON text appended to out, converted in the
 * engine's projection state (HTTP needs no Lua of its own). A state JSON
 * cannot carry (a binary string, a float key): *not_json set and an
 * error. */
int es_engine_projection_json(es_engine *e, const char *data, size_t len, es_buf *out,
                              int *not_json, es_err *err);
void es_engine_close(es_engine *e);

/* §3.12: the engine's per-event-type figures since it opened
 * (engine/type_stats.h); borrowed, valid while the engine lives. */
struct es_type_stats *es_engine_type_stats(es_engine *e);

#endif
