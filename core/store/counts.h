/*
 * counts.h: the §3.12 counts rule, stated once.
 *
 * The store keeps, for the whole store and for each tenant scope (§3.11),
 * the sums over the counted session rows: how many, and their events,
 * pending and dead (es_counts). Which rows count and what a name's scope is
 * are the core's rule (here); a backend stores the sums and moves them in
 * the same transaction as the session row (backend.h `counts`):
 * - the memory and SQLite backends call es_counts_move where a session row
 *   changes (SQLite from the row its file holds: docs/sqlite.md "The
 *   counts");
 * - PostgreSQL does it in the database (a trigger), and the SQLite
 *   migration that first fills the sums is SQL too, so that SQL is built
 *   from the ES_SQL_* fragments below instead of restating the rule.
 */
#ifndef ES_COUNTS_H
#define ES_COUNTS_H

#include <stddef.h>

#include "store/store.h"

/* A name's scope is its start through its first ES_TENANT_SEP when that is
 * a tenant's prefix: a tenant of 1..ES_MAX_TENANT_BYTES bytes and the
 * separator, so ES_SCOPE_MIN_BYTES..ES_SCOPE_MAX_BYTES bytes. Literals so
 * that SQL can spell them (ES_STR); counts.c asserts they agree with
 * store.h. */
#define ES_SCOPE_MIN_BYTES 2
#define ES_SCOPE_MAX_BYTES 65

/* The length of name's scope (the prefix a scoped counts row is keyed by),
 * 0 when it has none. */
size_t es_scope_len(const char *name);

/* Whether a session row counts: a row of a real session, not the row named
 * "" (a shard's plan record) nor one with a negative fence (a shard-move
 * marker, shards.c). row NULL (no row): 0. */
int es_counted(const char *name, const es_session_info *row);

/* Moves c by the change of the session row `name` from `from` to `to`
 * (either NULL: no row before / after), counting only counted rows. The
 * caller applies it to the store's sums and, when es_scope_len(name) > 0,
 * to that scope's. */
void es_counts_move(es_counts *c, const char *name, const es_session_info *from,
                    const es_session_info *to);

/* ---- the same rule as SQL (sqlite.c, postgres.c triggers) ------------- */

#define ES_STR_(x) #x
#define ES_STR(x) ES_STR_(x)

/* Session row r (NEW, OLD, a table) is not a shard-move marker. */
#define ES_SQL_LIVE(r) "(" r ".fence >= 0)"
/* Session row r counts: es_counted. */
#define ES_SQL_COUNTED(r) "(" ES_SQL_LIVE(r) " AND " r ".session <> '')"
/* The separator as an SQL string literal: position functions
 * (instr/strpos) look for it; its byte is ES_TENANT_SEP's own. */
#define ES_SQL_SEP "'" ES_TENANT_SEP "'"
/* `k ES_SQL_SCOPE_BOUNDS`: the separator's 1-based position k makes a
 * scope (es_scope_len: the scope is the name's first k bytes). */
#define ES_SQL_SCOPE_BOUNDS \
  " BETWEEN " ES_STR(ES_SCOPE_MIN_BYTES) " AND " ES_STR(ES_SCOPE_MAX_BYTES)

#endif
