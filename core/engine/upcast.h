/*
 * engine/upcast.h: upcasters (docs/contract.md §7, docs/upcasting.md): how
 * an engine reads an old revision of an event as the current one, in one of
 * its own Lua states, before any handler, reducer, projection or replay
 * sees it. Stored bytes never change: only the event table a script gets.
 *
 * The one entry point for "upcast an event in this engine state" is
 * es_upcast_event; anything that hands events to scripts (the handler job,
 * the reducer fold, engine:upcast, a projection runner) calls it on each
 * event table, inside the budgeted call that runs the script, after
 * es_upcast_begin for the job.
 */
#ifndef ES_ENGINE_UPCAST_H
#define ES_ENGINE_UPCAST_H

#include <lua.h>
#include <stdint.h>

struct runner;
struct es_engine;

/* The longest chain (steps over all the files a chain passes through). */
#define ES_UPCAST_MAX_STEPS 32

/* Rescans scripts/upcasters into the engine's set of types with an
 * upcaster file: always when force, else only when the folder's mtime
 * changed since the last scan (a stat). A failed scan keeps the old set. */
void es_upcast_refresh(struct es_engine *e, int force);

/* Starts a job on r: r uses the engine's current upcaster set (a
 * reference, held until the next begin or the runner's end). */
void es_upcast_begin(struct runner *r);
/* Drops r's reference (runner teardown). */
void es_upcast_end(struct runner *r);

/* Whether type has an upcaster file in r's set (no Lua, no I/O): the fast
 * path that keeps events of other types free of any upcasting cost. */
int es_upcast_has(const struct runner *r, const char *type);

/* Upcasts the event table at idx in place: from its `revision` (1 when
 * absent) it runs the steps of its type's file up to `current`; a step
 * that renames the type goes on with the new type's file, from the
 * revision the step returned third (1 when it returned none). Sets the
 * table's type, revision and payload. Each step is a budgeted call of its
 * own. Raises an error object (INVALID_ARGUMENT) naming the upcaster file,
 * the type, the revision and the event when a step raises, trips a budget
 * or returns a bad type, when the file does not load, when the event's
 * revision is newer than the file's `current`, when a needed step is
 * missing, and when the chain loops or runs past ES_UPCAST_MAX_STEPS
 * (naming the types). Must run inside a budgeted call of r's state. */
void es_upcast_event(lua_State *L, struct runner *r, int idx);

/* Pushes the version of r's upcaster files: a hash over each file's name
 * and source hash ("" when there are none, so reducers' versions do not
 * change in a scripts directory without upcasters). A file that does not
 * load counts by its error. */
void es_upcast_push_version(lua_State *L, struct runner *r);

/* type's `current` as r's state loads its file now (1 with no file). */
int64_t es_upcast_current_L(lua_State *L, struct runner *r, const char *type);
/* type's `current` as the engine's states last loaded it (no Lua: for
 * es_engine_append on the caller's thread); 1 with no file or while no
 * state has loaded it. */
int64_t es_upcast_current(struct es_engine *e, const char *type);

/* Frees the engine's upcaster set and cache. */
void es_upcast_free(struct es_engine *e);

#endif
