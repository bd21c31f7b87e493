/*
 * backends/postgres.c: the PostgreSQL backend (`postgres://...` or
 * `postgresql://...`, a libpq URI), how many engines on many machines share
 * one database. It stores and finds rows (backend.h); every rule lives in
 * the core store (core/store/). docs/postgres.md describes the URL, the schema, what a write
 * transaction locks, the connections and what a server restart does.
 *
 * One file, though long: every op shares this file's pipeline (statements
 * sent ahead, answered at the next sync), its read-ahead and write-behind
 * caches and the connection pools, all static; its sections follow
 * backend.h's order.
 *
 * A store lives in one schema of the database (`?schema=NAME`, default
 * `eventstore`), created on first open with its tables; the schema's `meta`
 * table holds the schema version (migrations as for SQLite; a newer version
 * is refused). Every text column is COLLATE "C": byte order.
 *
 * Concurrency: the core keeps one write transaction open for a group of
 * callers and does read-modify-write on session rows, lanes and head
 * indexes, assuming nobody else writes meanwhile. Every write transaction
 * therefore first takes a transaction-scoped advisory lock named after the
 * schema (pg_advisory_xact_lock), so writes to one store are serialised
 * across every process and machine, exactly as SQLite's BEGIN IMMEDIATE
 * serialises them on one file, and run in READ COMMITTED: each statement
 * sees everything committed before the lock was granted. Reads run in
 * REPEATABLE READ READ ONLY transactions on their own connections and never
 * wait for a writer. claim_next runs beside them in claim transactions of
 * its own, without the lock (FOR UPDATE SKIP LOCKED; see "claim
 * transactions" below), so the reads of a write transaction whose rows the
 * core rewrites take row locks (FOR UPDATE).
 *
 * Connections: one write connection (used by one thread at a time: the core
 * serialises writes per handle), a pool of read connections grown on demand
 * up to `readers` (one per concurrent read transaction), and one watch
 * connection that LISTENs on the store's channel: every write commit sends
 * a NOTIFY, and data_version counts the notifications received;
 * wait_change blocks in poll() on its socket until one comes. A
 * connection that the server dropped (restart, network) fails the call in
 * progress with STORAGE and is re-established by the next call on it.
 *
 * Positions: assigned by this file from a counter loaded when a write
 * transaction begins (under the lock: max of the stored high-water mark and
 * max(position)+1) and saved with the commit, as in sqlite.c; writes being
 * serialised, positions grow in commit order across processes.
 *
 * Statements are prepared once per connection (named "s<id>") and run with
 * text parameters (binary for payloads, states and keys, which carry their
 * own lengths) and binary results. In write and claim transactions the
 * statements whose answers nothing waits for are pipelined ("pipeline
 * mode" below) and inserts are buffered into one statement ("inserts,
 * buffered"): most calls are two round trips (docs/postgres.md "Round
 * trips").
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "store/backend.h"
#include "store/backend_sql.h"
#include "store/counts.h"
#include "util/parse.h"
#include "util/watchdog.h"

/* ---- libpq, loaded when the first postgres:// store opens --------------
 *
 * The module does not link libpq: it loads it (dlopen) the first time a
 * store on PostgreSQL is opened. Users of memory: and sqlite: then need no
 * libpq at all, and no process loads libpq's own dependencies (LDAP,
 * GnuTLS, p11-kit) unless it uses PostgreSQL: under AddressSanitizer,
 * p11-kit's constructor leaves glibc's locale lock in a state where the
 * next setlocale() (spec/01-json_spec.lua tests locales) and exit() hang.
 * The table below is the one piece of process-wide state in this file: it
 * is written once, under pthread_once, and only read afterwards, like the
 * dynamic linker's own tables. */
#define PG_LIBPQ "libpq.so.5"
#define PQ_FUNCS(X)                                                                         \
  X(PQclear) X(PQcmdStatus) X(PQcmdTuples) X(PQconnectdb) X(PQconninfoFree)                 \
  X(PQconninfoParse) X(PQconsumeInput) X(PQerrorMessage) X(PQexec) X(PQexecParams)          \
  X(PQexecPrepared) X(PQfinish) X(PQfreemem) X(PQgetisnull) X(PQgetlength) X(PQgetvalue)    \
  X(PQisthreadsafe) X(PQnotifies) X(PQntuples) X(PQparameterStatus) X(PQprepare) X(PQreset) \
  X(PQresultErrorMessage) X(PQresultStatus) X(PQsetNoticeProcessor) X(PQstatus)             \
  X(PQtransactionStatus) X(PQsocket) X(PQresultErrorField) X(PQenterPipelineMode)          \
  X(PQexitPipelineMode) X(PQpipelineSync) X(PQpipelineStatus) X(PQsendQueryPrepared)        \
  X(PQsendQueryParams) X(PQsendPrepare) X(PQgetResult) X(PQbackendPID)

#define PQ_FIELD(name) __typeof__(&name) name;
static struct {
  PQ_FUNCS(PQ_FIELD)
} pq;
static pthread_once_t pq_once = PTHREAD_ONCE_INIT;
static char pq_error[256]; /* why loading failed; "" when it worked */

static void pq_load(void) {
  void *h = dlopen(PG_LIBPQ, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(pq_error, sizeof pq_error, "%s", dlerror());
    return;
  }
#define PQ_LOAD(name)                                                                  \
  if (!(*(void **)&pq.name = dlsym(h, #name))) {                                       \
    snprintf(pq_error, sizeof pq_error, "%s has no %s", PG_LIBPQ, #name);              \
    return;                                                                            \
  }
  PQ_FUNCS(PQ_LOAD)
#undef PQ_LOAD
  /* h stays open for the life of the process: the table points into it */
}

static int pq_ready(es_err *err) {
  pthread_once(&pq_once, pq_load);
  if (pq_error[0])
    return es_fail(err, ES_STORAGE, "postgres: cannot load libpq (%s): %s; install it (Debian: libpq5)",
                   PG_LIBPQ, pq_error);
  return ES_OK;
}

/* From here on every PQxxx call goes through the table. */
#define PQclear (pq.PQclear)
#define PQcmdStatus (pq.PQcmdStatus)
#define PQcmdTuples (pq.PQcmdTuples)
#define PQconnectdb (pq.PQconnectdb)
#define PQconninfoFree (pq.PQconninfoFree)
#define PQconninfoParse (pq.PQconninfoParse)
#define PQconsumeInput (pq.PQconsumeInput)
#define PQerrorMessage (pq.PQerrorMessage)
#define PQexec (pq.PQexec)
#define PQexecParams (pq.PQexecParams)
#define PQexecPrepared (pq.PQexecPrepared)
#define PQfinish (pq.PQfinish)
#define PQfreemem (pq.PQfreemem)
#define PQgetisnull (pq.PQgetisnull)
#define PQgetlength (pq.PQgetlength)
#define PQgetvalue (pq.PQgetvalue)
#define PQisthreadsafe (pq.PQisthreadsafe)
#define PQnotifies (pq.PQnotifies)
#define PQbackendPID (pq.PQbackendPID)
#define PQntuples (pq.PQntuples)
#define PQparameterStatus (pq.PQparameterStatus)
#define PQprepare (pq.PQprepare)
#define PQreset (pq.PQreset)
#define PQresultErrorMessage (pq.PQresultErrorMessage)
#define PQresultStatus (pq.PQresultStatus)
#define PQsetNoticeProcessor (pq.PQsetNoticeProcessor)
#define PQstatus (pq.PQstatus)
#define PQtransactionStatus (pq.PQtransactionStatus)
#define PQsocket (pq.PQsocket)
#define PQresultErrorField (pq.PQresultErrorField)
#define PQenterPipelineMode (pq.PQenterPipelineMode)
#define PQexitPipelineMode (pq.PQexitPipelineMode)
#define PQpipelineSync (pq.PQpipelineSync)
#define PQpipelineStatus (pq.PQpipelineStatus)
#define PQsendQueryPrepared (pq.PQsendQueryPrepared)
#define PQsendQueryParams (pq.PQsendQueryParams)
#define PQsendPrepare (pq.PQsendPrepare)
#define PQgetResult (pq.PQgetResult)

/* ---- settings --------------------------------------------------------- */

#define PG_SCHEMA_VERSION 6          /* meta.schema_version of the current schema */
/* A stored name's tenant scope (counts.h: its start through its first
 * separator when that makes a tenant's prefix) as SQL over column c, and
 * the condition that it has one: the key and the WHERE of events_scope,
 * spelled once so that the statements using the index match it (the
 * planner uses an index on an expression for that same expression, and a
 * partial index for a WHERE that implies its own). */
#define PG_SCOPE_OF(c) "substr(" c ", 1, strpos(" c ", " ES_SQL_SEP "))"
#define PG_SCOPED(c) "strpos(" c ", " ES_SQL_SEP ")" ES_SQL_SCOPE_BOUNDS
#define PG_DEFAULT_SCHEMA "eventstore"
#define PG_DEFAULT_READERS 8         /* read connections at most */
#define PG_MAX_READERS 64
/* Every round trip gives up after this long without an answer (the
 * `timeout_ms` option; docs/postgres.md "Deadlines"): a server that went
 * silent without closing (a dropped network, a stalled proxy) must not
 * hold a call, nor the engine, for ever. Long enough for any statement
 * the store sends, a wait for the store's lock included. */
#define PG_DEFAULT_TIMEOUT_MS 60000
#define PG_MAX_TIMEOUT_MS 86400000
#define PG_MAX_SAVEPOINTS 64         /* nesting depth whose positions are given back on rollback */
#define PG_MAX_SCHEMA 63             /* NAMEDATALEN - 1 */
#define PG_MAX_PARAMS 32

/* ---- statements ------------------------------------------------------- */

/* Column order of every event SELECT, as in sqlite.c; pg_bind_event binds
 * the same order as $1..$29 (the insert binds `key`, `revision` and `meta`
 * as $30..$32). */
#define EV_COLS ES_SQL_EV_COLS
#define SESS_COLS                                                                         \
  "session, head, events, pending, dead, attempts, failures, first_at, updated_at, fence, " \
  "sealed_at, seal_reason, lease_holder, lease_token, lease_expires_at, parent, fork_at, "  \
  "forked_at, first_index, archived_through"
#define REF_COLS "name, session, created_at, updated_at"

enum {
  ST_MAX_POSITION,
  ST_SESSION_GET, ST_SESSION_PUT,
  ST_SESSION_LIST_GE, ST_SESSION_LIST_GE_LT, ST_SESSION_LIST_GT, ST_SESSION_LIST_GT_LT,
  ST_SESSION_CHILDREN, ST_SESSION_CHILDREN_GT,
  ST_EVENT_GET, ST_EVENT_GET_BY_ID, ST_EVENT_INSERT, ST_EVENT_UPDATE, ST_EVENT_RANGE, ST_EVENT_ALL,
  ST_LANE_NEXT, ST_QUEUED_DUE_ALL, ST_QUEUED_DUE_SESSION, ST_QUEUED_NEXT_ALL,
  ST_QUEUED_NEXT_SESSION, ST_QUEUED_DUE_TYPE, ST_QUEUED_NEXT_TYPE, ST_PENDING_TYPES,
  ST_DEAD_ALL, ST_DEAD_SESSION,
  ST_SNAPSHOT_GET, ST_SNAPSHOT_PUT, ST_SNAPSHOT_LIST,
  ST_REF_GET, ST_REF_PUT, ST_REF_DELETE, ST_REF_LIST, ST_REF_LIST_GT,
  ST_PRESENCE_GET, ST_PRESENCE_PUT, ST_PRESENCE_EXPIRE, ST_PRESENCE_LIST,
  ST_EVENT_DELETE_RANGE, ST_SESSION_DELETE, ST_SNAPSHOT_DELETE_ALL, ST_REF_DELETE_SESSION,
  ST_KEY_GET, ST_KEY_PUT, ST_KEY_USE_PUT, ST_KEY_USE_LIST, ST_KEY_USE_DELETE_SESSION,
  ST_SNAPSHOT_DELETE_FROM,
  ST_FLOOR_GET, ST_FLOOR_PUT, ST_AHEAD_FLOORS, /* §3.8 */
  ST_SEGMENT_LIST, ST_SEGMENT_PUT, ST_SEGMENT_DELETE, ST_SEGMENT_SESSIONS,
  ST_EVENT_COPY,
  ST_EVENT_ALL_SCOPED, ST_QUEUED_DUE_ALL_SCOPED, ST_QUEUED_NEXT_ALL_SCOPED,
  ST_QUEUED_DUE_TYPE_SCOPED, ST_QUEUED_NEXT_TYPE_SCOPED, ST_PENDING_TYPES_SCOPED,
  ST_DEAD_ALL_SCOPED,
  /* row locks (docs/postgres.md "Concurrency") */
  ST_SESSION_GET_LOCK, ST_EVENT_GET_LOCK, ST_QUEUED_DUE_SESSION_LOCK,
  ST_CLAIM_DUE_ALL, ST_CLAIM_DUE_ALL_SCOPED, ST_CLAIM_DUE_TYPE, ST_CLAIM_DUE_TYPE_SCOPED,
  /* transaction control, prepared like the rest (planned once per connection) */
  ST_BEGIN_LOCK, ST_BEGIN_POSITIONS, ST_META_NEXT, ST_CLAIM_SETUP,
  ST_SESSION_CLAIMED, ST_EVENT_INSERT_MANY,
  ST_COUNTS, /* §3.12 */
  ST_AHEAD_EVENTS, ST_AHEAD_SESSIONS, ST_AHEAD_IDS, /* pg_read_ahead */
  ST_PROJ_GET, ST_PROJ_PUT, ST_PROJ_DELETE, ST_PROJ_LIST, ST_PROJ_LIST_ALL, ST_PROJ_DROP, /* §8 */
  ST_COUNT
};

/* The WHERE terms `queued = 1`, `status = 2`, `status = 0`, `status <> 1`
 * and `parent IS NOT NULL` repeat the partial indexes' predicates
 * literally, so the planner can use those indexes with generic plans.
 * `LIMIT NULL` is no limit. */
static const char *const pg_sql[ST_COUNT] = {
    [ST_COUNTS] = "SELECT sessions, events, pending, dead FROM counts WHERE scope = $1",
    /* §8: keys are bytea, so that the range of a prefix (es_proj_range)
     * is a range of the primary key whatever its bytes. */
    [ST_PROJ_GET] = "SELECT value FROM projections WHERE ns = $1 AND key = $2",
    [ST_PROJ_PUT] = "INSERT INTO projections(ns, key, value) VALUES ($1, $2, $3)"
                    " ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
    [ST_PROJ_DELETE] = "DELETE FROM projections WHERE ns = $1 AND key = $2",
    [ST_PROJ_LIST] = "SELECT key, value FROM projections WHERE ns = $1 AND key >= $2 AND key < $3"
                     " ORDER BY key LIMIT $4",
    [ST_PROJ_LIST_ALL] = "SELECT key, value FROM projections WHERE ns = $1 AND key >= $2"
                         " ORDER BY key LIMIT $3",
    [ST_PROJ_DROP] = "DELETE FROM projections WHERE ns = $1",
    /* pg_read_ahead: what complete_many's completions will read, locked as
     * ST_EVENT_GET_LOCK and ST_SESSION_GET_LOCK lock it */
    [ST_AHEAD_EVENTS] = "SELECT " EV_COLS " FROM events"
                        " WHERE (session, idx) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))"
                        " FOR UPDATE",
    [ST_AHEAD_SESSIONS] = "SELECT " SESS_COLS " FROM sessions WHERE session = ANY($1::text[])"
                          " FOR UPDATE",
    [ST_AHEAD_IDS] = "SELECT id FROM events WHERE id = ANY($1::text[])",
    [ST_MAX_POSITION] = "SELECT coalesce(max(position), 0) FROM events",
    [ST_SESSION_GET] = "SELECT " SESS_COLS " FROM sessions WHERE session = $1",
    [ST_SESSION_PUT] = "INSERT INTO sessions(" SESS_COLS
                       ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,"
                       " $15, $16, $17, $18, $19, $20) ON CONFLICT (session) DO UPDATE SET"
                       " head = excluded.head, events = excluded.events,"
                       " pending = excluded.pending, dead = excluded.dead,"
                       " attempts = excluded.attempts, failures = excluded.failures,"
                       " first_at = excluded.first_at, updated_at = excluded.updated_at,"
                       " fence = excluded.fence, sealed_at = excluded.sealed_at,"
                       " seal_reason = excluded.seal_reason, lease_holder = excluded.lease_holder,"
                       " lease_token = excluded.lease_token,"
                       " lease_expires_at = excluded.lease_expires_at, parent = excluded.parent,"
                       " fork_at = excluded.fork_at, forked_at = excluded.forked_at,"
                       " first_index = excluded.first_index,"
                       " archived_through = excluded.archived_through",
    [ST_SESSION_LIST_GE] = "SELECT " SESS_COLS
                           " FROM sessions WHERE session >= $1 ORDER BY session LIMIT $2",
    [ST_SESSION_LIST_GE_LT] = "SELECT " SESS_COLS
                              " FROM sessions WHERE session >= $1 AND session < $2"
                              " ORDER BY session LIMIT $3",
    [ST_SESSION_LIST_GT] = "SELECT " SESS_COLS
                           " FROM sessions WHERE session > $1 ORDER BY session LIMIT $2",
    [ST_SESSION_LIST_GT_LT] = "SELECT " SESS_COLS
                              " FROM sessions WHERE session > $1 AND session < $2"
                              " ORDER BY session LIMIT $3",
    [ST_SESSION_CHILDREN] = "SELECT " SESS_COLS " FROM sessions"
                            " WHERE parent IS NOT NULL AND parent = $1"
                            " ORDER BY session LIMIT $2",
    [ST_SESSION_CHILDREN_GT] = "SELECT " SESS_COLS " FROM sessions"
                               " WHERE parent IS NOT NULL AND parent = $1 AND session > $2"
                               " ORDER BY session LIMIT $3",
    [ST_EVENT_GET] = "SELECT " EV_COLS " FROM events WHERE session = $1 AND idx = $2",
    [ST_EVENT_GET_BY_ID] = "SELECT " EV_COLS " FROM events WHERE id = $1",
    [ST_EVENT_INSERT] = "INSERT INTO events(" EV_COLS
                        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,"
                        " $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28,"
                        " $29, $30, $31, $32)",
    /* It must change its row, and is sent without waiting (pipelined):
     * when it changes none the server itself must fail (1/0, division
     * by zero: PEND_CHANGED), so that the statements queued after it
     * (RELEASE SAVEPOINT, COMMIT) do not run. An UPDATE 0 is no error to
     * the server. */
    [ST_EVENT_UPDATE] = "WITH u AS (UPDATE events SET status = $3, attempts = $4, failures = $5,"
                        " last_error = $6, processed_at = $7, claim_holder = $8,"
                        " claim_expires_at = $9, retry_at = $10, queued = $11, due_at = $12,"
                        " last_failed_attempt = $13, returned = $14, first_claimed_at = $15,"
                        " last_claimed_at = $16, failed_at = $17, processed_by_attempt = $18"
                        " WHERE session = $1 AND idx = $2 RETURNING 1) SELECT 1 / count(*) FROM u",
    [ST_EVENT_RANGE] = "SELECT " EV_COLS
                       " FROM events WHERE session = $1 AND idx > $2 AND idx <= $3"
                       " ORDER BY idx LIMIT $4",
    [ST_EVENT_ALL] = "SELECT " EV_COLS " FROM events WHERE position > $1 ORDER BY position LIMIT $2",
    [ST_LANE_NEXT] = "SELECT idx FROM events"
                     " WHERE session = $1 AND lane = $2 AND idx > $3"
                     " AND lane IS NOT NULL AND status <> " ES_SQL_PROCESSED
                     " ORDER BY idx LIMIT 1",
    [ST_QUEUED_DUE_ALL] = "SELECT " EV_COLS
                          " FROM events WHERE queued = 1 AND due_at <= $1"
                          " ORDER BY due_at, position LIMIT $2",
    /* events_session_queued is in index order with due_at in its key: the
     * rows that are not due are skipped inside the index. */
    [ST_QUEUED_DUE_SESSION] = "SELECT " EV_COLS " FROM events"
                              " WHERE queued = 1 AND session = $1 AND due_at <= $2"
                              " ORDER BY idx LIMIT $3",
    [ST_QUEUED_NEXT_ALL] = "SELECT min(due_at) FROM events WHERE queued = 1 AND due_at > $1",
    [ST_QUEUED_NEXT_SESSION] = "SELECT min(due_at) FROM events"
                               " WHERE queued = 1 AND session = $1 AND due_at > $2",
    [ST_QUEUED_DUE_TYPE] = "SELECT " EV_COLS
                           " FROM events WHERE status = " ES_SQL_PENDING
                           " AND type = $1 AND queued = 1"
                           " AND due_at <= $2 ORDER BY due_at, position LIMIT $3",
    [ST_QUEUED_NEXT_TYPE] = "SELECT min(due_at) FROM events"
                            " WHERE status = " ES_SQL_PENDING
                            " AND type = $1 AND queued = 1 AND due_at > $2",
    [ST_PENDING_TYPES] = "SELECT type, count(*) FROM events WHERE status = " ES_SQL_PENDING
                         " GROUP BY type ORDER BY type",
    [ST_DEAD_ALL] = "SELECT " EV_COLS " FROM events"
                    " WHERE status = " ES_SQL_DEAD " AND position > $1 ORDER BY position LIMIT $2",
    [ST_DEAD_SESSION] = "SELECT " EV_COLS " FROM events"
                        " WHERE status = " ES_SQL_DEAD " AND session = $1 AND position > $2"
                        " ORDER BY position LIMIT $3",
    [ST_SNAPSHOT_GET] = "SELECT reducer, idx, state, version, updated_at FROM snapshots"
                        " WHERE session = $1 AND reducer = $2",
    [ST_SNAPSHOT_PUT] = "INSERT INTO snapshots(session, reducer, idx, state, version, updated_at)"
                        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session, reducer) DO UPDATE"
                        " SET idx = excluded.idx, state = excluded.state,"
                        " version = excluded.version, updated_at = excluded.updated_at",
    [ST_SNAPSHOT_LIST] = "SELECT reducer, idx, NULL::bytea, version, updated_at FROM snapshots"
                         " WHERE session = $1 ORDER BY reducer",
    [ST_REF_GET] = "SELECT " REF_COLS " FROM refs WHERE name = $1",
    [ST_REF_PUT] = "INSERT INTO refs(" REF_COLS ") VALUES ($1, $2, $3, $4)"
                   " ON CONFLICT (name) DO UPDATE SET session = excluded.session,"
                   " created_at = excluded.created_at, updated_at = excluded.updated_at",
    [ST_REF_DELETE] = "DELETE FROM refs WHERE name = $1",
    [ST_REF_LIST] = "SELECT " REF_COLS " FROM refs ORDER BY name LIMIT $1",
    [ST_REF_LIST_GT] = "SELECT " REF_COLS " FROM refs WHERE name > $1 ORDER BY name LIMIT $2",
    [ST_PRESENCE_GET] = "SELECT participant, field, value, seen, at, expires_at FROM presence"
                        " WHERE ns = $1 AND participant = $2 AND field = $3",
    [ST_PRESENCE_PUT] = "INSERT INTO presence(ns, participant, field, value, seen, at, expires_at)"
                        " VALUES ($1, $2, $3, $4, $5, $6, $7)"
                        " ON CONFLICT (ns, participant, field) DO UPDATE SET"
                        " value = excluded.value, seen = excluded.seen, at = excluded.at,"
                        " expires_at = excluded.expires_at",
    [ST_PRESENCE_EXPIRE] = "DELETE FROM presence WHERE ns = $1 AND expires_at <= $2",
    [ST_PRESENCE_LIST] = "SELECT participant, field, value, seen, at, expires_at FROM presence"
                         " WHERE ns = $1 AND expires_at > $2 ORDER BY participant, field",
    [ST_EVENT_DELETE_RANGE] = "DELETE FROM events WHERE session = $1 AND idx <= $2",
    [ST_SESSION_DELETE] = "DELETE FROM sessions WHERE session = $1",
    [ST_FLOOR_GET] = "SELECT token FROM fence_floors WHERE session = $1",
    [ST_FLOOR_PUT] = "INSERT INTO fence_floors(session, token) VALUES ($1, $2)"
                     " ON CONFLICT (session) DO UPDATE SET"
                     " token = greatest(fence_floors.token, excluded.token)",
    [ST_AHEAD_FLOORS] = "SELECT session, token FROM fence_floors WHERE session = ANY($1::text[])",
    [ST_SNAPSHOT_DELETE_ALL] = "DELETE FROM snapshots WHERE session = $1",
    [ST_REF_DELETE_SESSION] = "DELETE FROM refs WHERE session = $1",
    [ST_KEY_GET] = "SELECT name, wrapped, created_at, shredded_at FROM keys WHERE name = $1",
    [ST_KEY_PUT] = "INSERT INTO keys(name, wrapped, created_at, shredded_at)"
                   " VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET"
                   " wrapped = excluded.wrapped, created_at = excluded.created_at,"
                   " shredded_at = excluded.shredded_at",
    [ST_KEY_USE_PUT] = "INSERT INTO key_uses(key, session, first_index) VALUES ($1, $2, $3)"
                       " ON CONFLICT (key, session) DO UPDATE SET"
                       " first_index = least(key_uses.first_index, excluded.first_index)",
    [ST_KEY_USE_LIST] = "SELECT session, first_index FROM key_uses WHERE key = $1 ORDER BY session",
    [ST_KEY_USE_DELETE_SESSION] = "DELETE FROM key_uses WHERE session = $1",
    [ST_SNAPSHOT_DELETE_FROM] = "DELETE FROM snapshots WHERE session = $1 AND idx >= $2",
    [ST_SEGMENT_LIST] = "SELECT first, through, count, bytes, checksum, file, created_at"
                        " FROM segments WHERE session = $1 ORDER BY first",
    [ST_SEGMENT_PUT] = "INSERT INTO segments(session, first, through, count, bytes, checksum,"
                       " file, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
                       " ON CONFLICT (session, first) DO UPDATE SET through = excluded.through,"
                       " count = excluded.count, bytes = excluded.bytes,"
                       " checksum = excluded.checksum, file = excluded.file,"
                       " created_at = excluded.created_at",
    [ST_SEGMENT_DELETE] = "DELETE FROM segments WHERE session = $1 AND first = $2",
    /* $2 (after) "" when unbounded: every session name is non-empty */
    [ST_SEGMENT_SESSIONS] = "SELECT session, MAX(through) FROM segments WHERE session > $2"
                            " AND starts_with(session, $1)"
                            " GROUP BY session ORDER BY session LIMIT $3",
    /* fork (pg_event_copy): one chunk of the source's indexes $5 ..
     * $5 + $7 - 1 copied inside the server, each row with the id of the
     * same rank in $6 (ids from the core's generator); positions $1 + idx
     * - 1, increasing in index order. The columns follow EV_COLS. */
    [ST_EVENT_COPY] = "INSERT INTO events(" EV_COLS ")"
                      " SELECT $1 + e.idx - 1, $2, e.idx, i.id, e.type, e.payload, e.lane,"
                      " e.created_at, e.cause_index, e.cause_attempt, e.not_before, "
                      ES_SQL_COPY_DISPATCH("$3") ", $4, e.idx, " ES_SQL_COPY_CLAIMS ","
                      " e.key, e.revision, e.meta FROM events e JOIN unnest($6::text[]) WITH ORDINALITY AS i(id, n)"
                      " ON e.idx = $5 + i.n - 1"
                      " WHERE e.session = $4 AND e.idx >= $5 AND e.idx < $5 + $7 ORDER BY e.idx",
    /* §3.11: a tenant's rows are one range of session names. A tenant's
     * events by position are one range of events_scope (schema version
     * 4): "after P for tenant T" is an index seek, so a tenant's read_all,
     * and every wait or tail on it, costs its own rows, never the store's.
     * The ORDER BY is the index's own order (the scope is fixed by the
     * WHERE, so it orders nothing), so that no plan, generic or custom,
     * finds walking the primary key and sorting cheaper. The queued
     * listings below walk the same order as their unscoped statements and
     * pass over other tenants' rows (docs/postgres.md). */
    [ST_EVENT_ALL_SCOPED] = "SELECT " EV_COLS " FROM events WHERE " PG_SCOPE_OF("session")
                            " = $3 AND " PG_SCOPED("session") " AND position > $1"
                            " ORDER BY " PG_SCOPE_OF("session") ", position LIMIT $2",
    [ST_QUEUED_DUE_ALL_SCOPED] = "SELECT " EV_COLS
                                 " FROM events WHERE queued = 1 AND due_at <= $1"
                                 " AND session >= $3 AND session < $4"
                                 " ORDER BY due_at, position LIMIT $2",
    [ST_QUEUED_NEXT_ALL_SCOPED] = "SELECT min(due_at) FROM events"
                                  " WHERE queued = 1 AND due_at > $1 AND session >= $2"
                                  " AND session < $3",
    [ST_QUEUED_DUE_TYPE_SCOPED] = "SELECT " EV_COLS
                                  " FROM events WHERE status = " ES_SQL_PENDING
                                  " AND type = $1 AND queued = 1"
                                  " AND due_at <= $2 AND session >= $4 AND session < $5"
                                  " ORDER BY due_at, position LIMIT $3",
    [ST_QUEUED_NEXT_TYPE_SCOPED] = "SELECT min(due_at) FROM events"
                                   " WHERE status = " ES_SQL_PENDING
                                   " AND type = $1 AND queued = 1 AND due_at > $2"
                                   " AND session >= $3 AND session < $4",
    [ST_PENDING_TYPES_SCOPED] = "SELECT type, count(*) FROM events"
                                " WHERE status = " ES_SQL_PENDING
                                " AND session >= $1 AND session < $2"
                                " GROUP BY type ORDER BY type",
    [ST_DEAD_ALL_SCOPED] = "SELECT " EV_COLS " FROM events"
                           " WHERE status = " ES_SQL_DEAD
                           " AND position > $1 AND session >= $3 AND session < $4"
                           " ORDER BY position LIMIT $2",
    /* Reads of a write transaction whose rows the core may rewrite lock
     * them (FOR UPDATE): a claim transaction runs outside the store's
     * lock, and the row a writer rewrites must be the latest committed
     * version, never a copy read before a claim committed. READ COMMITTED
     * re-reads the row (and re-checks the WHERE) after waiting for its
     * lock. */
    [ST_SESSION_GET_LOCK] = "SELECT " SESS_COLS " FROM sessions WHERE session = $1 FOR UPDATE",
    [ST_EVENT_GET_LOCK] = "SELECT " EV_COLS " FROM events WHERE session = $1 AND idx = $2"
                          " FOR UPDATE",
    [ST_QUEUED_DUE_SESSION_LOCK] = "SELECT " EV_COLS " FROM events"
                                   " WHERE queued = 1 AND session = $1 AND due_at <= $2"
                                   " ORDER BY idx LIMIT $3 FOR UPDATE",
    /* A claim transaction's scans (claim_next): the ready rows no other
     * transaction holds, locked; rows of the sessions in the text[] (the
     * caller's skip list) are passed over without being locked. The row
     * lock is taken below the LIMIT: a skipped row does not use up the
     * limit. */
    [ST_CLAIM_DUE_ALL] = "SELECT " EV_COLS
                         " FROM events WHERE queued = 1 AND due_at <= $1"
                         " AND session <> ALL($3::text[])"
                         " ORDER BY due_at, position LIMIT $2 FOR UPDATE SKIP LOCKED",
    [ST_CLAIM_DUE_ALL_SCOPED] = "SELECT " EV_COLS
                                " FROM events WHERE queued = 1 AND due_at <= $1"
                                " AND session >= $3 AND session < $4"
                                " AND session <> ALL($5::text[])"
                                " ORDER BY due_at, position LIMIT $2 FOR UPDATE SKIP LOCKED",
    [ST_CLAIM_DUE_TYPE] = "SELECT " EV_COLS
                          " FROM events WHERE status = " ES_SQL_PENDING
                          " AND type = $1 AND queued = 1"
                          " AND due_at <= $2 AND session <> ALL($4::text[])"
                          " ORDER BY due_at, position LIMIT $3 FOR UPDATE SKIP LOCKED",
    [ST_CLAIM_DUE_TYPE_SCOPED] = "SELECT " EV_COLS
                                 " FROM events WHERE status = " ES_SQL_PENDING
                                 " AND type = $1 AND queued = 1"
                                 " AND due_at <= $2 AND session >= $4 AND session < $5"
                                 " AND session <> ALL($6::text[])"
                                 " ORDER BY due_at, position LIMIT $3 FOR UPDATE SKIP LOCKED",
    /* A write transaction's begin (pg_write_begin): the store's lock, then
     * the position counter. Two statements: under READ COMMITTED a
     * statement's snapshot is taken when it starts, so the read must start
     * after the lock is granted to see the previous holder's commit. */
    [ST_BEGIN_LOCK] = "SELECT pg_advisory_xact_lock($1)",
    [ST_BEGIN_POSITIONS] = "SELECT (SELECT coalesce(max(position), 0) FROM events),"
                           " (SELECT coalesce(max(value), 0) FROM meta WHERE key = 'next_position')",
    [ST_META_NEXT] = "INSERT INTO meta(key, value) VALUES ('next_position', $1)"
                     " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    /* A claim transaction's begin (pg_claim_begin): its lock_timeout (SET
     * LOCAL), and the server's deadlock_timeout as it is now. */
    [ST_CLAIM_SETUP] = "SELECT current_setting('deadlock_timeout'),"
                       " set_config('lock_timeout', $1, true)",
    /* claim_next's count on a session row (pg_session_claimed); like
     * ST_EVENT_UPDATE, it fails on the server when it changes no row */
    [ST_SESSION_CLAIMED] = "WITH u AS (UPDATE sessions SET attempts = attempts + $2, updated_at = $3"
                           " WHERE session = $1 RETURNING 1) SELECT 1 / count(*) FROM u",
    /* The rows pg_event_insert buffered, one array per column (EV_COLS's
     * order), in one statement (pg_ins_flush). */
    [ST_EVENT_INSERT_MANY] = "INSERT INTO events(" EV_COLS ") SELECT * FROM unnest($1::bigint[],"
                             " $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],"
                             " $7::text[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[],"
                             " $12::bigint[], $13::bigint[], $14::bigint[], $15::text[],"
                             " $16::bigint[], $17::text[], $18::bigint[], $19::bigint[],"
                             " $20::bigint[], $21::bigint[], $22::bigint[], $23::bigint[],"
                             " $24::text[], $25::bigint[], $26::bigint[], $27::bigint[],"
                             " $28::bigint[], $29::bigint[], $30::text[], $31::bigint[],"
                             " $32::text[])",
};

/* The schema, version 1 (the tables of SQLite's version 6), created inside
 * the store's schema (search_path). Integers are BIGINT; payloads and
 * presence values are TEXT (canonical JSON: valid UTF-8 without NUL, JSON
 * escapes a NUL inside a string); snapshot states and wrapped keys are
 * bytes (BYTEA). */
#define C_TEXT "TEXT COLLATE \"C\""
static const char pg_schema_v1[] =
    "CREATE TABLE meta("
    "  key " C_TEXT " PRIMARY KEY,"
    "  value BIGINT);"
    "CREATE TABLE events("
    "  position BIGINT PRIMARY KEY,"
    "  session " C_TEXT " NOT NULL,"
    "  idx BIGINT NOT NULL,"
    "  id " C_TEXT " NOT NULL UNIQUE,"
    "  type " C_TEXT ","
    "  payload TEXT,"
    "  lane " C_TEXT ","
    "  created_at BIGINT,"
    "  cause_index BIGINT,"
    "  cause_attempt BIGINT,"
    "  not_before BIGINT,"
    "  status BIGINT NOT NULL,"
    "  attempts BIGINT,"
    "  failures BIGINT,"
    "  last_error TEXT,"
    "  processed_at BIGINT,"
    "  claim_holder " C_TEXT ","
    "  claim_expires_at BIGINT,"
    "  retry_at BIGINT,"
    "  queued BIGINT NOT NULL,"
    "  due_at BIGINT,"
    "  last_failed_attempt BIGINT,"
    "  returned BIGINT,"
    "  origin_session " C_TEXT ","
    "  origin_index BIGINT,"
    "  first_claimed_at BIGINT,"
    "  last_claimed_at BIGINT,"
    "  failed_at BIGINT,"
    "  processed_by_attempt BIGINT,"
    "  key " C_TEXT ","
    "  UNIQUE(session, idx));"
    "CREATE INDEX events_queued ON events(due_at, position) WHERE queued = 1;"
    "CREATE INDEX events_session_queued ON events(session, idx, due_at) WHERE queued = 1;"
    "CREATE INDEX events_session_due ON events(session, due_at) WHERE queued = 1;"
    "CREATE INDEX events_lane ON events(session, lane, idx) WHERE lane IS NOT NULL AND status <> " ES_SQL_PROCESSED ";"
    "CREATE INDEX events_dead ON events(position) WHERE status = " ES_SQL_DEAD ";"
    "CREATE INDEX events_session_dead ON events(session, position) WHERE status = " ES_SQL_DEAD ";"
    "CREATE INDEX events_type_pending ON events(type, queued, due_at, position) WHERE status = " ES_SQL_PENDING ";"
    "CREATE TABLE sessions("
    "  session " C_TEXT " PRIMARY KEY,"
    "  head BIGINT NOT NULL,"
    "  events BIGINT NOT NULL,"
    "  pending BIGINT NOT NULL,"
    "  dead BIGINT NOT NULL,"
    "  attempts BIGINT NOT NULL,"
    "  failures BIGINT NOT NULL,"
    "  first_at BIGINT,"
    "  updated_at BIGINT,"
    "  fence BIGINT NOT NULL DEFAULT 0,"
    "  sealed_at BIGINT,"
    "  seal_reason TEXT,"
    "  lease_holder " C_TEXT ","
    "  lease_token BIGINT,"
    "  lease_expires_at BIGINT,"
    "  parent " C_TEXT ","
    "  fork_at BIGINT,"
    "  forked_at BIGINT,"
    "  first_index BIGINT NOT NULL DEFAULT 1,"
    "  archived_through BIGINT NOT NULL DEFAULT 0);"
    "CREATE INDEX sessions_parent ON sessions(parent, session) WHERE parent IS NOT NULL;"
    "CREATE TABLE snapshots("
    "  session " C_TEXT " NOT NULL,"
    "  reducer " C_TEXT " NOT NULL,"
    "  idx BIGINT NOT NULL,"
    "  state BYTEA,"
    "  version " C_TEXT ","
    "  updated_at BIGINT,"
    "  PRIMARY KEY(session, reducer));"
    "CREATE TABLE presence("
    "  ns " C_TEXT " NOT NULL,"
    "  participant " C_TEXT " NOT NULL,"
    "  field " C_TEXT " NOT NULL,"
    "  value TEXT,"
    "  seen BIGINT,"
    "  at BIGINT,"
    "  expires_at BIGINT,"
    "  PRIMARY KEY(ns, participant, field));"
    "CREATE INDEX presence_expiry ON presence(ns, expires_at);"
    "CREATE TABLE refs("
    "  name " C_TEXT " PRIMARY KEY,"
    "  session " C_TEXT " NOT NULL,"
    "  created_at BIGINT,"
    "  updated_at BIGINT);"
    "CREATE INDEX refs_session ON refs(session, name);"
    "CREATE TABLE segments("
    "  session " C_TEXT " NOT NULL,"
    "  first BIGINT NOT NULL,"
    "  through BIGINT NOT NULL,"
    "  count BIGINT NOT NULL,"
    "  bytes BIGINT NOT NULL,"
    "  checksum " C_TEXT " NOT NULL,"
    "  file " C_TEXT " NOT NULL,"
    "  created_at BIGINT,"
    "  PRIMARY KEY(session, first));"
    "CREATE TABLE keys("
    "  name " C_TEXT " PRIMARY KEY,"
    "  wrapped BYTEA,"
    "  created_at BIGINT,"
    "  shredded_at BIGINT);"
    "CREATE TABLE key_uses("
    "  key " C_TEXT " NOT NULL,"
    "  session " C_TEXT " NOT NULL,"
    "  first_index BIGINT NOT NULL,"
    "  PRIMARY KEY(key, session));"
    "CREATE INDEX key_uses_session ON key_uses(session);";

/* Version 2 (§3.12 stats): SQLite's version 7. `counts` holds the sums
 * over the counted session rows (how many, their events, pending and dead)
 * of the store (scope '') and of each tenant scope, kept by a trigger on
 * `sessions` in the writing transaction, so stats read one row. Which rows
 * count and what a scope is are the core's rule (store/counts.h), spelled
 * here with its ES_SQL_* fragments. Contention: the
 * store's row is updated by every write that changes a count, and writes
 * already queue for the store's advisory lock, so it adds no wait; a
 * claim transaction (which runs beside them) changes only attempts and
 * updated_at, and the update trigger's WHEN skips those without running
 * the function, so claims never touch the row. The migration computes the
 * rows once from the sessions as they are. */
static const char pg_schema_v2[] =
    "CREATE TABLE counts("
    "  scope " C_TEXT " PRIMARY KEY,"
    "  sessions BIGINT NOT NULL,"
    "  events BIGINT NOT NULL,"
    "  pending BIGINT NOT NULL,"
    "  dead BIGINT NOT NULL);"
    "INSERT INTO counts SELECT '', count(*), coalesce(sum(events), 0), coalesce(sum(pending), 0),"
    "  coalesce(sum(dead), 0) FROM sessions WHERE " ES_SQL_COUNTED("sessions") ";"
    "INSERT INTO counts SELECT substr(session, 1, strpos(session, " ES_SQL_SEP ")), count(*),"
    "  sum(events), sum(pending), sum(dead) FROM sessions WHERE fence >= 0 AND"
    "  strpos(session, " ES_SQL_SEP ")" ES_SQL_SCOPE_BOUNDS " GROUP BY 1;"
    "CREATE FUNCTION counts_apply() RETURNS trigger LANGUAGE plpgsql AS $f$"
    " DECLARE ds bigint := 0; de bigint := 0; dp bigint := 0; dd bigint := 0;"
    "   name text; k int;"
    " BEGIN"
    "   IF TG_OP <> 'INSERT' AND " ES_SQL_COUNTED("OLD") " THEN"
    "     ds := -1; de := -OLD.events; dp := -OLD.pending; dd := -OLD.dead; name := OLD.session;"
    "   END IF;"
    "   IF TG_OP <> 'DELETE' AND " ES_SQL_COUNTED("NEW") " THEN"
    "     ds := ds + 1; de := de + NEW.events; dp := dp + NEW.pending; dd := dd + NEW.dead;"
    "     name := NEW.session;"
    "   END IF;"
    "   IF name IS NULL OR (ds = 0 AND de = 0 AND dp = 0 AND dd = 0) THEN RETURN NULL; END IF;"
    "   UPDATE counts SET sessions = sessions + ds, events = events + de,"
    "     pending = pending + dp, dead = dead + dd WHERE scope = '';"
    "   k := strpos(name, " ES_SQL_SEP ");"
    "   IF k" ES_SQL_SCOPE_BOUNDS " THEN"
    "     INSERT INTO counts VALUES (substr(name, 1, k), ds, de, dp, dd) ON CONFLICT (scope) DO"
    "     UPDATE SET sessions = counts.sessions + ds, events = counts.events + de,"
    "       pending = counts.pending + dp, dead = counts.dead + dd;"
    "   END IF;"
    "   RETURN NULL;"
    " END $f$;"
    "CREATE TRIGGER counts_insert_delete AFTER INSERT OR DELETE ON sessions"
    "  FOR EACH ROW EXECUTE FUNCTION counts_apply();"
    "CREATE TRIGGER counts_update AFTER UPDATE ON sessions FOR EACH ROW WHEN ("
    "  OLD.events IS DISTINCT FROM NEW.events OR OLD.pending IS DISTINCT FROM NEW.pending"
    "  OR OLD.dead IS DISTINCT FROM NEW.dead OR " ES_SQL_LIVE("OLD")
    " IS DISTINCT FROM " ES_SQL_LIVE("NEW") ")"
    "  EXECUTE FUNCTION counts_apply();";

/* Version 3 (§3.1): an event's revision and meta. Rows written before
 * read revision 1 (the default every event had) and meta NULL (none); a
 * constant default makes ADD COLUMN a catalog change, not a table rewrite. */
static const char pg_schema_v3[] =
    "ALTER TABLE events ADD COLUMN revision BIGINT NOT NULL DEFAULT 1;"
    "ALTER TABLE events ADD COLUMN meta TEXT;";

/* Version 4 (issue: idle tails of an empty tenant rescanned the store):
 * each tenant's events by position, so that a tenant's read_all, and the
 * waits and live tails built on it, seek to "after P" within the tenant
 * instead of walking every later event of the store. Partial: events of
 * sessions without a tenant have no entry, so a store without tenants
 * pays nothing for it. Built from the rows as they are. */
static const char pg_schema_v4[] =
    "CREATE INDEX IF NOT EXISTS events_scope ON events(" PG_SCOPE_OF("session") ", position)"
    "  WHERE " PG_SCOPED("session") ";";

/* Version 5 (§8): projections' records and keyed states, one table of
 * (ns, key) -> bytes (store/projections.c says what each row is). */
static const char pg_schema_v5[] =
    "CREATE TABLE IF NOT EXISTS projections("
    "  ns TEXT COLLATE \"C\" NOT NULL,"
    "  key BYTEA NOT NULL,"
    "  value BYTEA NOT NULL,"
    "  PRIMARY KEY(ns, key));";

/* Version 6 (§3.8, backend.h fence_floor_get): the fence tokens of
 * deleted sessions, by name. */
static const char pg_schema_v6[] =
    "CREATE TABLE IF NOT EXISTS fence_floors("
    "  session TEXT COLLATE \"C\" PRIMARY KEY,"
    "  token BIGINT NOT NULL);";

/* migrations[v] takes a schema from version v to v + 1 (0: a new schema). */
static const char *const pg_migrations[PG_SCHEMA_VERSION] = {
    pg_schema_v1, pg_schema_v2, pg_schema_v3, pg_schema_v4, pg_schema_v5, pg_schema_v6};

/* ---- types ------------------------------------------------------------ */

/* What a statement sent in pipeline mode answers, and what to do with it
 * when its result is read (pg_sync). */
enum {
  PEND_ANY,      /* a success of any kind; nothing to keep */
  PEND_PREPARE,  /* the statement `id` prepared */
  PEND_CHANGED,  /* an UPDATE that must have changed a row (event_update), and fails
                  * on the server when it did not (its SQL divides by its count) */
  PEND_BEGIN,    /* ST_BEGIN_POSITIONS: the position counter */
  PEND_CLAIM,    /* ST_CLAIM_SETUP: the server's deadlock_timeout */
  PEND_COMMIT,   /* COMMIT, which must answer "COMMIT" */
  PEND_WANT      /* the result the caller waits for (handed back by pg_sync) */
};

/* Statements in flight at most before pg_send syncs by itself: their
 * answers (a few dozen bytes each) must fit in the socket buffers, since
 * libpq sends in blocking mode while the server may block writing
 * answers nobody reads yet. */
#define PG_MAX_PEND 128

typedef struct pg_pend {
  short id;                        /* the statement (ST_*), or -1 */
  unsigned char kind;              /* PEND_* */
} pg_pend;

typedef struct pg_conn {
  PGconn *db;
  es_backend *b;                   /* borrowed: the owner */
  unsigned char prepared[ST_COUNT];
  int64_t deadlock_ms;             /* claim connections: deadlock_timeout as last read; 0: not yet */
  int n_pend;                      /* statements sent in pipeline mode whose answers are not read */
  es_wd_slot wd;                   /* the round trip in progress, under the watchdog */
  int timed_out;                   /* the last round trip passed timeout_ms: its socket was shut */
  pg_pend pend[PG_MAX_PEND];
} pg_conn;

struct es_txn {
  es_backend *b;
  pg_conn *c;
  int write;                       /* 1: the write transaction, or a claim transaction */
  int claim;                       /* 1: a claim transaction (claim_begin), on a pool connection */
  int retry;                       /* claim: it failed on lock contention only (claim_retry) */
  int64_t started_ms;              /* claim: when it began (monotonic) */
  int64_t lock_ms;                 /* claim: its lock_timeout */
  int64_t budget_ms;               /* claim: its waits must be over this long after it began */
  char *skip;                      /* claim: owned, the sessions to pass over as a text[] literal */
  int broken;                      /* the connection was lost or the transaction aborted */
  char broken_msg[ES_ERRMSG_MAX];
  int depth;                       /* open savepoints */
  int virtual_sp;                  /* write: the open savepoint (depth 1) is virtual (pg_savepoint) */
  int released;                    /* write: callers' work released into the transaction */
  int need_begin;                  /* write: no transaction open on the server (sent lazily) */
  int pos_known;                   /* write: the begin's positions were read (next_position) */
  int lock_fix;                    /* claim: lock_timeout must be set again before a wait */
  int ins_n;                       /* write: rows pg_event_insert buffered (pg_ins_flush) */
  size_t ins_bytes;                /* write: the bytes buffered */
  struct pg_buf *ins;              /* write: owned, PG_INS_COLS column arrays being built */
  es_event ins_first;              /* write: owned, the first row buffered (sent alone as such) */
  PGresult *pre_session;           /* write: the row of pre_name, read (locked) with an event */
  char *pre_name;                  /* write: owned, whose session row pre_session holds */
  struct pg_ahead *ahead;          /* write: owned, rows read ahead (pg_read_ahead), or NULL */
  int64_t next_position;           /* write: the position the next insert gets */
  int64_t saved_next;              /* write: the stored high-water mark when the txn began */
  int64_t sp_next[PG_MAX_SAVEPOINTS];
  struct pg_reader *reader;        /* read and claim: the pool entry */
};

typedef struct pg_reader {
  pg_conn c;
  es_txn t;
  struct pg_pool *pool;            /* borrowed: the pool it belongs to */
  struct pg_reader *next_free;
  struct pg_reader *next_all;
} pg_reader;

/* Connections opened on demand, one per transaction in progress, at most
 * max (the `readers` option). */
typedef struct pg_pool {
  pg_reader *free;
  pg_reader *all;
  int n;
  int claim;                       /* 1: claim connections, 0: read connections */
} pg_pool;

struct es_backend {
  char *conninfo;                  /* owned: the URI handed to libpq (without our options) */
  char *schema;                    /* owned: the schema name (validated: [A-Za-z0-9_]) */
  char *setup_sql;                 /* owned: run on every new connection */
  int64_t lock_key;                /* the store's advisory lock: a 64-bit hash of the schema */
  char *notify_sql;                /* owned: NOTIFY on the store's channel */
  char *listen_sql;                /* owned: LISTEN on it */
  int max_readers;
  int64_t timeout_ms;              /* a round trip's deadline; 0: none (the `timeout_ms` option) */
  es_watchdog *wd;                 /* owned: enforces it */
  int async_commit;                /* durability = 1: synchronous_commit off */
  pg_conn w;                       /* the write connection */
  es_txn wt;                       /* the write transaction (one at a time: the core serialises) */
  pthread_mutex_t pool_mu;         /* guards readers and claimers */
  pthread_cond_t pool_cv;
  pg_pool readers;                 /* read transactions */
  pg_pool claimers;                /* claim transactions (claim_begin) */
  pthread_mutex_t watch_mu;        /* guards watch, notes, polling, closing */
  pthread_cond_t watch_cv;         /* notes changed, or the thread polling stopped */
  pg_conn watch;                   /* LISTENs on the store's channel */
  uint64_t notes;                  /* notifications (and reconnects) seen by watch */
  uint64_t foreign;                /* those not sent by w (ext_version) */
  atomic_int own_pid;              /* w's server process: its NOTIFYs are our own commits */
  int polling;                     /* a wait_change thread is in poll() on watch's socket */
  int closing;                     /* wake() was called: every wait_change returns at once */
  uint64_t kicks;                  /* kick() calls: the wait_change calls then in progress return */
  int kick[2];                     /* a pipe: a byte written wakes the thread polling */
};

/* ---- small helpers ---------------------------------------------------- */

static int pg_oom(es_err *err) { return es_fail(err, ES_STORAGE, "postgres: out of memory"); }

static char *pg_dup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  if (n) memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* A libpq message without its trailing newline, for our messages. */
static void pg_trim(const char *msg, char *out, size_t cap) {
  snprintf(out, cap, "%s", msg && *msg ? msg : "unknown error");
  size_t n = strlen(out);
  while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = '\0';
}

/* Why c was lost, for a message: libpq's words, or the deadline when the
 * watchdog cut it (libpq then says only "server closed the connection"). */
static void pg_lost_msg(pg_conn *c, const char *msg, char *out, size_t cap) {
  if (c->timed_out || (c->b && es_watchdog_fired(c->b->wd, &c->wd)))
    snprintf(out, cap, "no answer within %lld ms (timeout_ms); the connection was dropped",
             (long long)c->b->timeout_ms);
  else
    pg_trim(msg, out, cap);
}

/* ES_STORAGE: "postgres SCHEMA: WHAT: server message". */
static int pg_fail_msg(es_err *err, es_backend *b, const char *what, const char *msg) {
  char m[ES_ERRMSG_MAX];
  pg_trim(msg, m, sizeof m);
  return es_fail(err, ES_STORAGE, "postgres %s: %s: %s", b && b->schema ? b->schema : "", what, m);
}

static int pg_fail_res(es_err *err, pg_conn *c, PGresult *res, const char *what) {
  const char *msg = res ? PQresultErrorMessage(res) : NULL;
  if (!msg || !*msg) msg = PQerrorMessage(c->db);
  if (PQstatus(c->db) == CONNECTION_BAD) {
    char m[ES_ERRMSG_MAX];
    pg_lost_msg(c, msg, m, sizeof m);
    return es_fail(err, ES_STORAGE, "postgres %s: %s: connection lost (%s)", c->b->schema, what, m);
  }
  return pg_fail_msg(err, c->b, what, msg);
}

/* 64-bit FNV-1a: the advisory lock key and the channel of a schema. */
static uint64_t pg_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 1099511628211ULL;
  }
  return h;
}

/* ---- parameters ------------------------------------------------------- */

/* Parameters of one statement: integers as text, strings as text (NUL
 * terminated), byte strings in binary format with their length. */
typedef struct pg_params {
  int n;
  const char *v[PG_MAX_PARAMS];
  int len[PG_MAX_PARAMS];
  int fmt[PG_MAX_PARAMS];
  char num[PG_MAX_PARAMS][24];
} pg_params;

static void pp_int(pg_params *p, int64_t v) {
  snprintf(p->num[p->n], sizeof p->num[p->n], "%" PRId64, v);
  p->v[p->n] = p->num[p->n];
  p->len[p->n] = 0;
  p->fmt[p->n++] = 0;
}

static void pp_null(pg_params *p) {
  p->v[p->n] = NULL;
  p->len[p->n] = 0;
  p->fmt[p->n++] = 0;
}

/* ES_NONE: NULL. */
static void pp_opt(pg_params *p, int64_t v) {
  if (v == ES_NONE) pp_null(p);
  else pp_int(p, v);
}

/* A limit: ES_NONE or negative: NULL (no limit). */
static void pp_limit(pg_params *p, int64_t v) {
  if (v == ES_NONE || v < 0) pp_null(p);
  else pp_int(p, v);
}

static void pp_str(pg_params *p, const char *s) {
  p->v[p->n] = s;
  p->len[p->n] = 0;
  p->fmt[p->n++] = 0;
}

/* Bytes with a length (binary format: no escaping, no NUL terminator
 * needed); NULL stays NULL. */
static int pp_bytes(pg_params *p, const void *s, size_t n) {
  if (n > INT_MAX) return -1;
  p->v[p->n] = s;
  p->len[p->n] = (int)n;
  p->fmt[p->n++] = s ? 1 : 0;
  return 0;
}

/* A scope (§3.11) as the range [scope, end): end is scope with its last
 * byte + 1. end must hold strlen(scope) + 1 bytes. */
static void pp_scope(pg_params *p, const char *scope, char *end) {
  size_t n = strlen(scope);
  memcpy(end, scope, n);
  if (n) end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
  end[n] = '\0';
  pp_str(p, scope);
  pp_str(p, end);
}

typedef struct {
  char v[ES_MAX_TENANT_BYTES + 2];
} pg_scope_end;

static int pg_scope_ok(const char *scope, es_err *err) {
  if (scope && (!*scope || strlen(scope) > ES_MAX_TENANT_BYTES + 1))
    return es_fail(err, ES_INVALID_ARGUMENT, "postgres: a scope is 1 to %d bytes",
                   ES_MAX_TENANT_BYTES + 1);
  return ES_OK;
}

/* ---- results (binary format) ------------------------------------------ */

static int64_t pg_int(const PGresult *r, int row, int col) {
  const char *v = PQgetvalue(r, row, col);
  int n = PQgetlength(r, row, col);
  if (n == 8) {
    uint64_t u;
    memcpy(&u, v, 8);
    return (int64_t)be64toh(u);
  }
  if (n == 4) {
    uint32_t u;
    memcpy(&u, v, 4);
    return (int32_t)ntohl(u);
  }
  if (n == 2) {
    uint16_t u;
    memcpy(&u, v, 2);
    return (int16_t)ntohs(u);
  }
  return 0;
}

static int64_t pg_opt(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? ES_NONE : pg_int(r, row, col);
}

/* A text column: borrowed from the result (copy 0; libpq ends every value
 * with a NUL) or copied. NULL stays NULL. */
static int pg_str(const PGresult *r, int row, int col, int copy, char **dst, size_t *len) {
  if (PQgetisnull(r, row, col)) {
    *dst = NULL;
    if (len) *len = 0;
    return ES_OK;
  }
  char *p = PQgetvalue(r, row, col);
  size_t n = (size_t)PQgetlength(r, row, col);
  if (len) *len = n;
  if (!copy) {
    *dst = p;
    return ES_OK;
  }
  *dst = pg_dup(p, n);
  return *dst ? ES_OK : ES_STORAGE;
}

static int pg_decode_event(const PGresult *r, int i, int copy, es_event *e) {
  es_event_init(e);
  e->position = pg_int(r, i, 0);
  e->index = pg_int(r, i, 2);
  e->created_at = pg_opt(r, i, 7);
  e->cause_index = pg_opt(r, i, 8);
  e->cause_attempt = pg_opt(r, i, 9);
  e->not_before = pg_opt(r, i, 10);
  e->status = (int)pg_int(r, i, 11);
  e->attempts = pg_opt(r, i, 12);
  e->failures = pg_opt(r, i, 13);
  e->processed_at = pg_opt(r, i, 15);
  e->claim_expires_at = pg_opt(r, i, 17);
  e->retry_at = pg_opt(r, i, 18);
  e->queued = (int)pg_int(r, i, 19);
  e->due_at = pg_opt(r, i, 20);
  e->last_failed_attempt = pg_opt(r, i, 21);
  e->returned = pg_opt(r, i, 22);
  e->origin_index = pg_opt(r, i, 24);
  e->first_claimed_at = pg_opt(r, i, 25);
  e->last_claimed_at = pg_opt(r, i, 26);
  e->failed_at = pg_opt(r, i, 27);
  e->processed_by_attempt = pg_opt(r, i, 28);
  e->revision = pg_int(r, i, 30); /* NOT NULL DEFAULT 1 */
  if (pg_str(r, i, 29, copy, &e->key, NULL) || pg_str(r, i, 31, copy, &e->meta, NULL) || pg_str(r, i, 1, copy, &e->session, NULL) ||
      pg_str(r, i, 3, copy, &e->id, NULL) || pg_str(r, i, 4, copy, &e->type, NULL) ||
      pg_str(r, i, 5, copy, &e->payload, &e->payload_len) ||
      pg_str(r, i, 6, copy, &e->lane, NULL) || pg_str(r, i, 14, copy, &e->last_error, NULL) ||
      pg_str(r, i, 16, copy, &e->claim_holder, NULL) ||
      pg_str(r, i, 23, copy, &e->origin_session, NULL)) {
    if (copy) es_event_destroy(e);
    return ES_STORAGE;
  }
  return ES_OK;
}

static int pg_decode_session(const PGresult *r, int i, int copy, es_session_info *si) {
  es_session_info_init(si);
  si->head = pg_int(r, i, 1);
  si->events = pg_int(r, i, 2);
  si->pending = pg_int(r, i, 3);
  si->dead = pg_int(r, i, 4);
  si->attempts = pg_int(r, i, 5);
  si->failures = pg_int(r, i, 6);
  si->first_at = pg_opt(r, i, 7);
  si->updated_at = pg_opt(r, i, 8);
  si->fence = pg_int(r, i, 9);
  si->sealed_at = pg_opt(r, i, 10);
  si->lease_token = pg_opt(r, i, 13);
  si->lease_expires_at = pg_opt(r, i, 14);
  si->fork_at = pg_opt(r, i, 16);
  si->forked_at = pg_opt(r, i, 17);
  si->first_index = pg_int(r, i, 18);
  si->archived_through = pg_int(r, i, 19);
  if (pg_str(r, i, 0, copy, &si->session, NULL) || pg_str(r, i, 11, copy, &si->seal_reason, NULL) ||
      pg_str(r, i, 12, copy, &si->lease_holder, NULL) || pg_str(r, i, 15, copy, &si->parent, NULL)) {
    if (copy) es_session_info_destroy(si);
    return ES_STORAGE;
  }
  return ES_OK;
}

/* reducer, idx, state (bytea), version, updated_at */
static int pg_decode_snapshot(const PGresult *r, int i, int copy, es_snapshot *sn) {
  es_snapshot_init(sn);
  sn->index = pg_int(r, i, 1);
  sn->updated_at = pg_opt(r, i, 4);
  if (pg_str(r, i, 0, copy, &sn->reducer, NULL) || pg_str(r, i, 3, copy, &sn->version, NULL) ||
      pg_str(r, i, 2, copy, &sn->state, &sn->state_len)) {
    if (copy) es_snapshot_destroy(sn);
    return ES_STORAGE;
  }
  return ES_OK;
}

static int pg_decode_ref(const PGresult *r, int i, int copy, es_ref *rf) {
  es_ref_init(rf);
  rf->created_at = pg_opt(r, i, 2);
  rf->updated_at = pg_opt(r, i, 3);
  if (pg_str(r, i, 0, copy, &rf->name, NULL) || pg_str(r, i, 1, copy, &rf->session, NULL)) {
    if (copy) es_ref_destroy(rf);
    return ES_STORAGE;
  }
  return ES_OK;
}

/* participant, field, value, seen, at, expires_at */
static int pg_decode_presence(const PGresult *r, int i, int copy, es_presence_row *p) {
  es_presence_row_init(p);
  p->seen = pg_opt(r, i, 3);
  p->at = pg_opt(r, i, 4);
  p->expires_at = pg_opt(r, i, 5);
  if (pg_str(r, i, 0, copy, &p->participant, NULL) || pg_str(r, i, 1, copy, &p->field, NULL) ||
      pg_str(r, i, 2, copy, &p->value, &p->value_len)) {
    if (copy) es_presence_row_destroy(p);
    return ES_STORAGE;
  }
  return ES_OK;
}

enum { ROW_EVENT, ROW_SESSION, ROW_SNAPSHOT, ROW_PRESENCE, ROW_REF };

typedef union pg_row {
  es_event ev;
  es_session_info se;
  es_snapshot sn;
  es_presence_row pr;
  es_ref rf;
} pg_row;

static int pg_decode(int kind, const PGresult *r, int i, int copy, void *out) {
  switch (kind) {
    case ROW_EVENT: return pg_decode_event(r, i, copy, out);
    case ROW_SESSION: return pg_decode_session(r, i, copy, out);
    case ROW_SNAPSHOT: return pg_decode_snapshot(r, i, copy, out);
    case ROW_REF: return pg_decode_ref(r, i, copy, out);
    default: return pg_decode_presence(r, i, copy, out);
  }
}

typedef void (*pg_fn)(void);

static int pg_call(int kind, pg_fn cb, void *ctx, const pg_row *r) {
  switch (kind) {
    case ROW_EVENT: return ((es_event_cb)cb)(ctx, &r->ev);
    case ROW_SESSION: return ((es_session_cb)cb)(ctx, &r->se);
    case ROW_SNAPSHOT: return ((es_snapshot_cb)cb)(ctx, &r->sn);
    case ROW_REF: return ((es_ref_cb)cb)(ctx, &r->rf);
    default: return ((es_presence_cb_row)cb)(ctx, &r->pr);
  }
}

/* ---- connections ------------------------------------------------------ */

/* A round trip on c begins: the watchdog shuts c's socket if no answer
 * came within timeout_ms, which ends libpq's wait (it polls with no limit
 * of its own) as a dropped connection would. Every blocking libpq call on
 * a connection sits between pg_arm and pg_disarm; wait_change's poll for
 * notifications does not (it has its own limit, and silence is normal). */
static void pg_arm(pg_conn *c) {
  c->timed_out = 0;
  if (c->db && c->b && c->b->timeout_ms > 0)
    (void)es_watchdog_arm(c->b->wd, &c->wd, PQsocket(c->db), c->b->timeout_ms);
}

static void pg_disarm(pg_conn *c) {
  if (c->b && es_watchdog_disarm(c->b->wd, &c->wd)) c->timed_out = 1;
}

static PGresult *pg_exec(pg_conn *c, const char *sql) {
  pg_arm(c);
  PGresult *res = PQexec(c->db, sql);
  pg_disarm(c);
  return res;
}

/* Server notices (e.g. "schema already exists, skipping") are not ours to
 * print. */
static void pg_quiet(void *arg, const char *message) {
  (void)arg;
  (void)message;
}

/* Runs sql (no parameters, possibly several statements) on c; ES_OK when
 * the last result is a success. */
static int pg_simple(pg_conn *c, const char *sql, const char *what, es_err *err) {
  PGresult *res = pg_exec(c, sql);
  ExecStatusType st = PQresultStatus(res);
  int code = ES_OK;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) code = pg_fail_res(err, c, res, what);
  PQclear(res);
  return code;
}

/* Connects c (or reconnects it after the server dropped it): the session
 * settings, and no statement prepared yet. */
static int pg_conn_connect(es_backend *b, pg_conn *c, es_err *err) {
  memset(c->prepared, 0, sizeof c->prepared);
  c->b = b;
  if (c->db) {
    PQreset(c->db);
  } else {
    c->db = PQconnectdb(b->conninfo);
    if (!c->db) return pg_oom(err);
    PQsetNoticeProcessor(c->db, pg_quiet, NULL);
  }
  if (PQstatus(c->db) != CONNECTION_OK) {
    char m[ES_ERRMSG_MAX];
    pg_trim(PQerrorMessage(c->db), m, sizeof m);
    return es_fail(err, ES_STORAGE, "postgres %s: cannot connect: %s", b->schema, m);
  }
  if (c == &b->w) atomic_store(&b->own_pid, PQbackendPID(c->db));
  const char *enc = PQparameterStatus(c->db, "server_encoding");
  if (enc && strcmp(enc, "UTF8") != 0 && strcmp(enc, "SQL_ASCII") != 0)
    return es_fail(err, ES_STORAGE,
                   "postgres %s: the database's encoding is %s; eventstore needs UTF8 (or "
                   "SQL_ASCII) to keep every byte of UTF-8 text",
                   b->schema, enc);
  return pg_simple(c, b->setup_sql, "cannot set up the connection", err);
}

/* Before a transaction on c: reconnects when the server dropped it. */
static int pg_conn_ready(es_backend *b, pg_conn *c, es_err *err) {
  if (c->db && PQstatus(c->db) == CONNECTION_OK) return ES_OK;
  return pg_conn_connect(b, c, err);
}

static void pg_conn_close(pg_conn *c) {
  if (c->db) PQfinish(c->db);
  c->db = NULL;
}

/* ---- statements ------------------------------------------------------- */

static int pg_txn_check(es_txn *t, es_err *err) {
  if (t->broken)
    return es_fail(err, ES_STORAGE, "postgres %s: the transaction was rolled back by an earlier error: %s",
                   t->b->schema, t->broken_msg);
  return ES_OK;
}

static void pg_txn_break(es_txn *t, const char *msg) {
  size_t n = strnlen(msg, sizeof t->broken_msg - 1);
  t->broken = 1;
  memcpy(t->broken_msg, msg, n);
  t->broken_msg[n] = '\0';
}

/* ---- inserts, buffered -------------------------------------------------
 *
 * pg_event_insert does not send a statement per row: it adds the row to one
 * text[] / bigint[] literal per column, and the rows are sent as one
 * INSERT ... SELECT FROM unnest(...) (pg_ins_flush) just before whatever
 * statement is sent next (pg_pipe) or before a sync, so the statements
 * still reach the server in the order the core made them. A batch of 100
 * events is one statement instead of 100. */

#define PG_INS_COLS 32
#define PG_INS_MAX_ROWS 1000             /* rows per INSERT at most */
#define PG_INS_MAX_BYTES (4u << 20)      /* bytes buffered before a flush */

typedef struct pg_buf {
  char *p;
  size_t len, cap;
} pg_buf;

static int pg_buf_put(pg_buf *b, const char *s, size_t n) {
  if (b->len + n + 2 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->len + n + 2 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  return 0;
}

/* One array element: NULL, or a number (quoted: false), or a string
 * (quoted, its '"' and '\' escaped). */
static int pg_buf_elem(pg_buf *b, const char *s, size_t n, int quoted) {
  if (pg_buf_put(b, b->len ? "," : "{", 1)) return -1;
  if (!s) return pg_buf_put(b, "NULL", 4);
  if (!quoted) return pg_buf_put(b, s, n);
  if (pg_buf_put(b, "\"", 1)) return -1;
  for (size_t i = 0, run = 0; i <= n; i++) {
    if (i < n && s[i] != '"' && s[i] != '\\') continue;
    if (pg_buf_put(b, s + run, i - run)) return -1;
    if (i < n && (pg_buf_put(b, "\\", 1) || pg_buf_put(b, s + i, 1))) return -1;
    run = i + 1;
  }
  return pg_buf_put(b, "\"", 1);
}

static int pg_buf_int(pg_buf *b, int64_t v) {
  char num[24];
  if (v == ES_NONE) return pg_buf_elem(b, NULL, 0, 0);
  int n = snprintf(num, sizeof num, "%" PRId64, v);
  return pg_buf_elem(b, num, (size_t)n, 0);
}

static int pg_buf_str(pg_buf *b, const char *s) { return pg_buf_elem(b, s, s ? strlen(s) : 0, 1); }

/* Ends the array literal ("{}" when it has no element) and terminates it
 * with a NUL (pg_buf_put always leaves room for one). */
static int pg_buf_end(pg_buf *b) {
  if ((!b->len && pg_buf_put(b, "{", 1)) || pg_buf_put(b, "}", 1)) return -1;
  b->p[b->len] = '\0';
  return 0;
}

/* Drops the rows buffered (their caller's work is being rolled back). */
static void pg_ins_discard(es_txn *t) {
  if (t->ins_n > 0) es_event_destroy(&t->ins_first);
  t->ins_n = 0;
  t->ins_bytes = 0;
  if (t->ins)
    for (int i = 0; i < PG_INS_COLS; i++) t->ins[i].len = 0;
}

static void pg_ins_free(es_txn *t) {
  pg_ins_discard(t);
  if (t->ins)
    for (int i = 0; i < PG_INS_COLS; i++) free(t->ins[i].p);
  free(t->ins);
  t->ins = NULL;
  t->ins_n = 0;
}

/* Forgets the session row read ahead by pg_event_get. */
static void pg_pre_drop(es_txn *t) {
  if (t->pre_session) PQclear(t->pre_session);
  free(t->pre_name);
  t->pre_session = NULL;
  t->pre_name = NULL;
}

/* ---- rows read ahead (pg_read_ahead) -----------------------------------
 *
 * complete_many hands the backend, before its completions run, the events
 * they complete and the ids of the events they return. They are read in
 * one round trip (locked, as event_get and session_get lock them in a
 * write transaction), so that a batch of completions holds the store's
 * lock for a few round trips instead of one or more per completion. What
 * was read stays right: an event row answers one event_get and is
 * forgotten once read or rewritten; a session row is rewritten with every
 * session_put of the transaction; an id is known absent until a row with
 * it is inserted. Anything else that writes rows (deletes, copies), a
 * savepoint's rollback and the end of the transaction forget it all.
 *
 * The session rows are also written behind: a put of a row read ahead
 * only changes the copy here, and the row is sent once (pg_ahead_flush)
 * before any statement other than an event row's insert or update, that
 * is before anything that could read it on the server, before a
 * savepoint, a release and the commit. Completions of one session's
 * events (a claim batch often holds many) then rewrite its row once per
 * batch instead of once each: every rewrite of one row in one
 * transaction leaves a version the next one steps over, and fires the
 * counts trigger. */

typedef struct pg_ahead {
  es_event *ev;                    /* [n_ev] events read, each answers one event_get */
  unsigned char *ev_live;          /* [n_ev] 1 until read or rewritten */
  size_t n_ev;
  es_session_info *si;             /* [n_si] their sessions' rows, as the transaction left them */
  unsigned char *si_dirty;         /* [n_si] 1: put since, not yet sent (pg_ahead_flush) */
  unsigned char *si_absent;        /* [n_si] 1: no such row (only .session is set) until put */
  size_t n_si, n_dirty;
  char **absent;                   /* [n_absent] ids not stored; NULL once inserted */
  size_t n_absent;
  /* read for a group's appends (no event asked): each session's rows go
   * in an INSERT of their own (pg_event_insert) */
  int per_session;
} pg_ahead;

static void pg_ahead_drop(es_txn *t) {
  pg_ahead *a = t->ahead;
  if (!a) return;
  for (size_t i = 0; i < a->n_ev; i++)
    if (a->ev_live[i]) es_event_destroy(&a->ev[i]);
  for (size_t i = 0; i < a->n_si; i++) es_session_info_destroy(&a->si[i]);
  for (size_t i = 0; i < a->n_absent; i++) free(a->absent[i]);
  free(a->ev);
  free(a->ev_live);
  free(a->si);
  free(a->si_dirty);
  free(a->si_absent);
  free(a->absent);
  free(a);
  t->ahead = NULL;
}

/* Forgets the rows read ahead for (session, index) (rewritten); with out,
 * the first of them moves there instead: 1 when one did. */
static int pg_ahead_event(es_txn *t, const char *session, int64_t index, es_event *out) {
  pg_ahead *a = t->ahead;
  int found = 0;
  for (size_t i = 0; a && i < a->n_ev; i++) {
    if (!a->ev_live[i] || a->ev[i].index != index || strcmp(a->ev[i].session, session) != 0)
      continue;
    a->ev_live[i] = 0;
    if (out && !found) *out = a->ev[i];
    else es_event_destroy(&a->ev[i]);
    found = 1;
  }
  return found;
}

static es_session_info *pg_ahead_session(es_txn *t, const char *session) {
  pg_ahead *a = t->ahead;
  for (size_t i = 0; a && i < a->n_si; i++)
    if (strcmp(a->si[i].session, session) == 0) return &a->si[i];
  return NULL;
}

/* The entry of id among the ids known absent, or NULL. */
static char **pg_ahead_absent(es_txn *t, const char *id) {
  pg_ahead *a = t->ahead;
  for (size_t i = 0; a && i < a->n_absent; i++)
    if (a->absent[i] && strcmp(a->absent[i], id) == 0) return &a->absent[i];
  return NULL;
}

static int pg_send(es_txn *t, int id, const struct pg_params *p, int kind, es_err *err);
static void pg_session_params(struct pg_params *p, const es_session_info *row);

/* Sends the session rows put since they were read ahead (without waiting
 * for the answers, as pg_session_put would have). */
static int pg_ahead_flush(es_txn *t, es_err *err) {
  pg_ahead *a = t->ahead;
  int code = ES_OK;
  for (size_t i = 0; a && a->n_dirty && i < a->n_si && code == ES_OK; i++) {
    if (!a->si_dirty[i]) continue;
    a->si_dirty[i] = 0; /* before sending: pg_send flushes first */
    a->n_dirty--;
    struct pg_params p;
    pg_session_params(&p, &a->si[i]);
    code = pg_send(t, ST_SESSION_PUT, &p, PEND_ANY, err);
  }
  return code;
}

/* The end of what was read ahead when the transaction goes on (or
 * commits): the rows written behind are sent, then it is forgotten. */
static int pg_ahead_end(es_txn *t, es_err *err) {
  int code = pg_ahead_flush(t, err);
  pg_ahead_drop(t);
  return code;
}

/* ---- pipeline mode ------------------------------------------------------
 *
 * A write or claim transaction does not wait for the answers of the
 * statements whose results the core does not look at (BEGIN and the
 * store's lock, SAVEPOINT, and the row writes: inserts, updates, upserts):
 * they are sent in libpq's pipeline mode (pg_send) and their answers are
 * read together with the next statement whose answer is needed (a read,
 * the release of a caller's savepoint, the commit: pg_sync), in one round
 * trip. An error in one of them aborts the transaction on the server as
 * it did before; the call that syncs reports it, and since every caller's
 * savepoint release syncs, in a group commit that is still the caller
 * whose statement failed (docs/postgres.md "Round trips"). */

static const char *pg_what(const es_txn *t) { return t->claim ? "claim" : t->write ? "write" : "read"; }

/* The server's deadlock_timeout as current_setting() shows it ("1s",
 * "200ms", "2min"), in milliseconds; 0 when it cannot be read. */
static int64_t pg_parse_ms(const char *v, size_t n) {
  char buf[32], *end;
  if (n == 0 || n >= sizeof buf) return 0;
  memcpy(buf, v, n);
  buf[n] = '\0';
  errno = 0;
  long long x = strtoll(buf, &end, 10);
  if (errno || end == buf || x < 0) return 0;
  static const struct { const char *unit; int64_t us; } units[] = {
      {"us", 1}, {"ms", 1000}, {"s", 1000000}, {"min", 60000000}, {"h", 3600000000LL},
      {"d", 86400000000LL}, {"", 1000}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].unit) == 0) {
      if (x > INT64_MAX / units[i].us) return INT64_MAX / 1000;
      return x * units[i].us / 1000;
    }
  return 0;
}

/* A claim transaction's lock_timeout and waiting budget from the server's
 * deadlock_timeout (see "claim transactions" below). */
static void pg_claim_limits(es_txn *t, int64_t deadlock_ms) {
  if (deadlock_ms < 4) deadlock_ms = 4;
  t->lock_ms = deadlock_ms / 4 < 200 ? deadlock_ms / 4 : 200;
  t->budget_ms = deadlock_ms * 3 / 4;
}

static int pg_sync(es_txn *t, PGresult **want, es_err *err);
static int pg_sync_n(es_txn *t, PGresult **want, int n_want, es_err *err);
static int pg_send_begin(es_txn *t, es_err *err);
static int pg_ins_flush(es_txn *t, es_err *err);

/* A send that failed: the connection is gone (libpq sends in blocking
 * mode). */
static int pg_send_fail(es_txn *t, const char *what, es_err *err) {
  int code = pg_fail_res(err, t->c, NULL, what);
  pg_txn_break(t, err ? err->msg : "connection lost");
  /* Closed: what reached the server is unknown, and the connection is
   * still in pipeline mode, where a rollback's PQexec is refused (the
   * server rolls the transaction back; the next call connects again). */
  pg_conn_close(t->c);
  t->c->n_pend = 0;
  return code;
}

/* Before sending on t's connection: pipeline mode on, the transaction
 * begun (a write transaction whose first caller was rolled back begins
 * again lazily), and room for the answers. */
static int pg_pipe_keep(es_txn *t, int keep_ins, es_err *err) {
  pg_conn *c = t->c;
  int code = pg_txn_check(t, err);
  if (code != ES_OK) return code;
  if (t->ins_n && !keep_ins && (code = pg_ins_flush(t, err)) != ES_OK) return code;
  if (!c->db || PQstatus(c->db) != CONNECTION_OK) return pg_send_fail(t, pg_what(t), err);
  if (c->n_pend >= PG_MAX_PEND - 4 && (code = pg_sync(t, NULL, err)) != ES_OK) return code;
  if (PQpipelineStatus(c->db) == PQ_PIPELINE_OFF && !PQenterPipelineMode(c->db))
    return pg_send_fail(t, "pipeline mode", err);
  if (t->need_begin) return pg_send_begin(t, err);
  return ES_OK;
}

static int pg_pipe(es_txn *t, es_err *err) { return pg_pipe_keep(t, 0, err); }

static int pg_send_keep(es_txn *t, int id, const pg_params *p, int kind, int keep_ins, es_err *err);

/* Sends statement id (preparing it on this connection first, in the same
 * pipeline) without waiting for its answer; kind says what its answer
 * must be (PEND_*). */
static int pg_send(es_txn *t, int id, const pg_params *p, int kind, es_err *err) {
  return pg_send_keep(t, id, p, kind, 0, err);
}

/* pg_send; keep_ins: the rows buffered for insertion may wait (the
 * statement does not touch them), so that a batch's inserts go in one
 * statement. */
static int pg_send_keep(es_txn *t, int id, const pg_params *p, int kind, int keep_ins, es_err *err) {
  int code;
  /* rows written behind go first, except past an event row's own write */
  if (t->ahead && t->ahead->n_dirty && id != ST_SESSION_PUT && id != ST_EVENT_UPDATE &&
      id != ST_EVENT_INSERT && id != ST_EVENT_INSERT_MANY && (code = pg_ahead_flush(t, err)) != ES_OK)
    return code;
  code = pg_pipe_keep(t, keep_ins, err);
  if (code != ES_OK) return code;
  pg_conn *c = t->c;
  char name[16];
  snprintf(name, sizeof name, "s%d", id);
  /* a send blocks when the socket's buffer is full (a large insert) */
  pg_arm(c);
  if (!c->prepared[id]) {
    if (!PQsendPrepare(c->db, name, pg_sql[id], 0, NULL)) {
      pg_disarm(c);
      return pg_send_fail(t, "prepare", err);
    }
    c->prepared[id] = 1;
    c->pend[c->n_pend].id = (short)id;
    c->pend[c->n_pend++].kind = PEND_PREPARE;
  }
  int sent = PQsendQueryPrepared(c->db, name, p ? p->n : 0, p ? p->v : NULL, p ? p->len : NULL,
                                 p ? p->fmt : NULL, 1);
  pg_disarm(c);
  if (!sent) return pg_send_fail(t, pg_what(t), err);
  c->pend[c->n_pend].id = (short)id;
  c->pend[c->n_pend++].kind = (unsigned char)kind;
  return ES_OK;
}

/* Sends a statement without parameters (BEGIN, SAVEPOINT, NOTIFY, COMMIT:
 * nothing to plan) without waiting for its answer. */
static int pg_send_sql(es_txn *t, const char *sql, int kind, es_err *err) {
  int code = t->ahead && t->ahead->n_dirty ? pg_ahead_flush(t, err) : ES_OK;
  if (code == ES_OK) code = pg_pipe(t, err);
  if (code != ES_OK) return code;
  pg_conn *c = t->c;
  pg_arm(c);
  int sent = PQsendQueryParams(c->db, sql, 0, NULL, NULL, NULL, NULL, 0);
  pg_disarm(c);
  if (!sent) return pg_send_fail(t, pg_what(t), err);
  c->pend[c->n_pend].id = -1;
  c->pend[c->n_pend++].kind = (unsigned char)kind;
  return ES_OK;
}

/* Sends the buffered rows as one INSERT (without waiting). */
static void pg_insert_params(pg_params *p, const es_event *row);

static int pg_ins_flush(es_txn *t, es_err *err) {
  pg_params p = {0};
  if (!t->ins_n) return ES_OK;
  if (t->ins_n == 1) {
    pg_insert_params(&p, &t->ins_first);
    t->ins_n = 0; /* before sending: pg_send flushes first */
    int code = pg_send(t, ST_EVENT_INSERT, &p, PEND_ANY, err);
    es_event_destroy(&t->ins_first);
    pg_ins_discard(t);
    return code;
  }
  for (int i = 0; i < PG_INS_COLS; i++) {
    if (pg_buf_end(&t->ins[i])) {
      pg_ins_discard(t);
      pg_txn_break(t, "out of memory");
      return pg_oom(err);
    }
    pp_str(&p, t->ins[i].p);
  }
  t->ins_n = 0; /* before sending: pg_send flushes first */
  int code = pg_send(t, ST_EVENT_INSERT_MANY, &p, PEND_ANY, err);
  es_event_destroy(&t->ins_first);
  pg_ins_discard(t);
  return code;
}

static int pg_gone(es_txn *t, const pg_pend *q, es_err *err) {
  return es_fail(err, ES_STORAGE, "postgres %s: %s: the %s row to update is gone", t->b->schema,
                 pg_what(t), q->id == ST_SESSION_CLAIMED ? "session" : "event");
}

/* The answer of one statement sent (pend q), read by pg_sync; code: the
 * sync's outcome so far (the first error wins). */
static int pg_answer(es_txn *t, const pg_pend *q, PGresult *res, PGresult **want, int code,
                     es_err *err) {
  pg_conn *c = t->c;
  ExecStatusType st = PQresultStatus(res);
  if (st == PGRES_PIPELINE_ABORTED || (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)) {
    /* skipped after an earlier error, or the error itself */
    if (q->kind == PEND_PREPARE) c->prepared[q->id] = 0;
    if (st == PGRES_PIPELINE_ABORTED || code != ES_OK) return code;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (q->kind == PEND_CHANGED && state && !strcmp(state, "22012"))
      return pg_gone(t, q, err); /* its own 1 / count(*) */
    code = pg_fail_res(err, c, res, pg_what(t));
    /* A claim transaction that lost on a lock (lock_timeout, a deadlock,
     * a serialization failure) did nothing yet that counts: it may run
     * again (claim_retry). */
    if (t->claim && state &&
        (!strcmp(state, "55P03") || !strcmp(state, "40P01") || !strcmp(state, "40001")))
      t->retry = 1;
    return code;
  }
  if (code != ES_OK) return code;
  switch (q->kind) {
    case PEND_CHANGED:
      /* the server failed already when it was 0 (above): a check only */
      if (strtoll(PQcmdTuples(res), NULL, 10) < 1) return pg_gone(t, q, err);
      break;
    case PEND_BEGIN:
      if (PQntuples(res) == 1) {
        int64_t max = pg_int(res, 0, 0), saved = pg_int(res, 0, 1);
        t->saved_next = saved;
        t->next_position = max + 1 > saved ? max + 1 : saved;
        t->pos_known = 1;
      }
      break;
    case PEND_CLAIM:
      if (PQntuples(res) == 1) {
        int64_t d = pg_parse_ms(PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
        if (d > 0) c->deadlock_ms = d;
        /* deadlock_timeout was lowered since the last claim on this
         * connection: the lock_timeout just set is too long, set it again
         * before any wait (pg_claim_may_wait) */
        int64_t lock = t->lock_ms, budget = t->budget_ms;
        pg_claim_limits(t, c->deadlock_ms);
        if (t->lock_ms < lock) t->lock_fix = 1;
        else t->lock_ms = lock;
        if (budget < t->budget_ms) t->budget_ms = budget;
      }
      break;
    case PEND_COMMIT:
      /* COMMIT of a transaction that failed answers "ROLLBACK", without
       * an error: only "COMMIT" means it is durable. */
      if (strcmp(PQcmdStatus(res), "COMMIT") != 0)
        return es_fail(err, ES_STORAGE, "postgres %s: commit: the transaction was rolled back",
                       t->b->schema);
      break;
    case PEND_WANT:
      if (want) *want = res;
      break;
  }
  return ES_OK;
}

/* Reads the answers of every statement sent since the last sync (one
 * round trip) and leaves pipeline mode; *want (want may be NULL): the
 * answer of the PEND_WANT statement when every statement succeeded
 * (PQclear it). A lost connection breaks the transaction and is closed
 * (the next call connects again). */
static int pg_sync_n(es_txn *t, PGresult **want, int n_want, es_err *err) {
  pg_conn *c = t->c;
  int code = ES_OK, lost = 0, k_want = 0;
  for (int i = 0; i < n_want; i++) want[i] = NULL;
  if (t->ins_n && (code = pg_ins_flush(t, err)) != ES_OK) return code;
  if (c->n_pend == 0) return pg_txn_check(t, err);
  pg_arm(c);
  if (!PQpipelineSync(c->db)) lost = 1;
  for (int i = 0; !lost && i < c->n_pend; i++) {
    PGresult *res = PQgetResult(c->db), *mine = NULL;
    if (!res) {
      lost = 1;
      break;
    }
    code = pg_answer(t, &c->pend[i], res, k_want < n_want ? &mine : NULL, code, err);
    if (mine) want[k_want++] = mine;
    else PQclear(res);
    /* each statement's answers end with a NULL */
    for (int k = 0; k < 8; k++) {
      PGresult *more = PQgetResult(c->db);
      if (!more) break;
      PQclear(more);
      if (PQstatus(c->db) == CONNECTION_BAD) break;
    }
    if (PQstatus(c->db) == CONNECTION_BAD) lost = 1;
  }
  if (!lost) {
    PGresult *res = PQgetResult(c->db);
    if (!res || PQresultStatus(res) != PGRES_PIPELINE_SYNC) lost = 1;
    PQclear(res);
  }
  c->n_pend = 0;
  if (!lost && !PQexitPipelineMode(c->db)) lost = 1;
  pg_disarm(c);
  if (code != ES_OK || lost || PQstatus(c->db) == CONNECTION_BAD)
    for (int i = 0; i < n_want; i++) {
      PQclear(want[i]);
      want[i] = NULL;
    }
  if (lost || PQstatus(c->db) == CONNECTION_BAD) {
    char m[ES_ERRMSG_MAX];
    pg_lost_msg(c, PQerrorMessage(c->db), m, sizeof m);
    if (code == ES_OK) code = es_fail(err, ES_STORAGE, "postgres %s: %s: connection lost (%s)",
                                      t->b->schema, pg_what(t), m);
    pg_txn_break(t, err ? err->msg : "connection lost");
    PQfinish(c->db);
    c->db = NULL;
  }
  return code;
}

static int pg_sync(es_txn *t, PGresult **want, es_err *err) {
  return pg_sync_n(t, want, want ? 1 : 0, err);
}

/* Reads and drops whatever answers are still due on c (a call that failed
 * before its sync), so that the connection can be used again. */
static void pg_drain(es_txn *t) {
  if (t->c->db && t->c->n_pend) {
    es_err e = {0};
    (void)pg_sync(t, NULL, &e);
  }
}

/* Runs statement id with p on t's connection (preparing it first on this
 * connection); *out: the result (PQclear it) when ES_OK. A lost connection
 * breaks the transaction. */
static int pg_run(es_txn *t, int id, const pg_params *p, PGresult **out, es_err *err) {
  pg_conn *c = t->c;
  PGresult *res;
  int code;
  *out = NULL;
  if ((code = pg_txn_check(t, err)) != ES_OK) return code;
  if (t->write) {
    /* with whatever was sent before it, in one round trip */
    if ((code = pg_send(t, id, p, PEND_WANT, err)) != ES_OK) return code;
    if ((code = pg_sync(t, out, err)) != ES_OK) return code;
    return *out ? ES_OK : es_fail(err, ES_STORAGE, "postgres %s: no answer", t->b->schema);
  }
  if (!c->prepared[id]) {
    char name[16];
    snprintf(name, sizeof name, "s%d", id);
    pg_arm(c);
    res = PQprepare(c->db, name, pg_sql[id], 0, NULL);
    pg_disarm(c);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      code = pg_fail_res(err, c, res, "prepare");
      PQclear(res);
      if (PQstatus(c->db) == CONNECTION_BAD) pg_txn_break(t, err ? err->msg : "connection lost");
      return code;
    }
    PQclear(res);
    c->prepared[id] = 1;
  }
  char name[16];
  snprintf(name, sizeof name, "s%d", id);
  pg_arm(c);
  res = PQexecPrepared(c->db, name, p ? p->n : 0, p ? p->v : NULL, p ? p->len : NULL,
                       p ? p->fmt : NULL, 1);
  pg_disarm(c);
  ExecStatusType st = PQresultStatus(res);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    code = pg_fail_res(err, c, res, t->claim ? "claim" : t->write ? "write" : "read");
    /* A claim transaction that lost on a lock (lock_timeout, a deadlock,
     * a serialization failure) did nothing yet that counts: it may run
     * again (claim_retry). */
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    if (t->claim && state &&
        (!strcmp(state, "55P03") || !strcmp(state, "40P01") || !strcmp(state, "40001")))
      t->retry = 1;
    PQclear(res);
    if (PQstatus(c->db) == CONNECTION_BAD) pg_txn_break(t, err ? err->msg : "connection lost");
    return code;
  }
  *out = res;
  return ES_OK;
}

/* Runs a statement and hands each row to cb (rows borrowed from the
 * result, which is complete before the first callback, so a callback may
 * call back into the backend, writes included). */
static int pg_iterate(es_txn *t, int id, const pg_params *p, int kind, pg_fn cb, void *ctx,
                      es_err *err) {
  PGresult *res;
  int code = pg_run(t, id, p, &res, err);
  if (code != ES_OK) return code;
  int n = PQntuples(res);
  for (int i = 0; i < n; i++) {
    pg_row r;
    if (pg_decode(kind, res, i, 0, &r) != ES_OK) {
      code = pg_oom(err);
      break;
    }
    if (pg_call(kind, cb, ctx, &r)) break;
  }
  PQclear(res);
  return code;
}

/* At most one row into out (owned); ES_NOT_FOUND when none. */
static int pg_get_one(es_txn *t, int id, const pg_params *p, int kind, void *out, es_err *err) {
  PGresult *res;
  int code = pg_run(t, id, p, &res, err);
  if (code != ES_OK) return code;
  if (PQntuples(res) == 0) code = ES_NOT_FOUND;
  else if (pg_decode(kind, res, 0, 1, out) != ES_OK) code = pg_oom(err);
  PQclear(res);
  return code;
}

/* A write statement; *changed: the rows it touched. Without changed
 * nobody waits for its answer: it is sent now and answered with the next
 * sync (pg_send). */
static int pg_write(es_txn *t, int id, const pg_params *p, int64_t *changed, es_err *err) {
  PGresult *res;
  if (!t->write) return es_fail(err, ES_STORAGE, "postgres: a write inside a read transaction");
  if (!changed) return pg_send(t, id, p, PEND_ANY, err);
  int code = pg_run(t, id, p, &res, err);
  if (code != ES_OK) return code;
  if (changed) *changed = strtoll(PQcmdTuples(res), NULL, 10);
  PQclear(res);
  return ES_OK;
}

/* One integer (NULL: ES_NONE; no row: ES_NONE). */
static int pg_one_int(es_txn *t, int id, const pg_params *p, int64_t *v, es_err *err) {
  PGresult *res;
  int code = pg_run(t, id, p, &res, err);
  *v = ES_NONE;
  if (code != ES_OK) return code;
  if (PQntuples(res) > 0) *v = pg_opt(res, 0, 0);
  PQclear(res);
  return ES_OK;
}

/* ---- URL ------------------------------------------------------------- */

/* libpq's TCP settings that bound a silent network, unless the URL sets
 * them (docs/postgres.md "Deadlines"): a connection attempt gives up
 * after connect_timeout (per host); the kernel probes an idle connection
 * after 10 s, every 5 s, 3 times (keepalives), and drops one whose sent
 * data stays unacknowledged for timeout_ms (tcp_user_timeout). A Unix
 * socket ignores all but connect_timeout. Appended to out (the URI so
 * far; first: it has no '?' yet), which has room for them. */
static void pg_tcp_defaults(const es_backend *b, char *out, int first) {
  char v[32];
  const char *set[][2] = {{"connect_timeout", v},
                          {"keepalives_idle", "10"},
                          {"keepalives_interval", "5"},
                          {"keepalives_count", "3"},
                          {"tcp_user_timeout", NULL}};
  char user_ms[32];
  /* libpq's connect_timeout is whole seconds, 2 at least */
  snprintf(v, sizeof v, "%lld", (long long)(b->timeout_ms > 0 ? (b->timeout_ms + 999) / 1000 : 0));
  if (b->timeout_ms > 0 && b->timeout_ms < 2000) snprintf(v, sizeof v, "2");
  snprintf(user_ms, sizeof user_ms, "%lld", (long long)b->timeout_ms);
  set[4][1] = user_ms;
  const char *q = strchr(out, '?');
  char *o = out + strlen(out);
  for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
    size_t kn = strlen(set[i][0]);
    int given = 0;
    for (const char *k = q; k && !given; k = strchr(k + 1, '&'))
      given = strncmp(k + 1, set[i][0], kn) == 0 && k[1 + kn] == '=';
    if (given) continue;
    o += sprintf(o, "%c%s=%s", first ? '?' : '&', set[i][0], set[i][1]);
    first = 0;
  }
}

/* rest: the URL after "postgres:" / "postgresql:" ("//..."). Takes our own
 * options out of the query (schema=NAME, readers=N, timeout_ms=N) and keeps
 * every other one for libpq, adding the TCP defaults the URL does not set. */
static int pg_parse_url(es_backend *b, const char *rest, const es_open_opts *opts, es_err *err) {
  const char *q = strchr(rest, '?');
  size_t base = q ? (size_t)(q - rest) : strlen(rest);
  /* room for the TCP defaults pg_tcp_defaults adds */
  size_t cap = strlen(rest) + sizeof "postgresql:" + 160;
  char *out = malloc(cap), *o = out;
  b->max_readers = PG_DEFAULT_READERS;
  b->timeout_ms = PG_DEFAULT_TIMEOUT_MS;
  if (!out) return pg_oom(err);
  if (strncmp(rest, "//", 2) != 0) {
    free(out);
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "postgres: the URL must be a libpq URI, postgres://[user@][host][:port]/[db][?...]");
  }
  if (opts && (opts->durability < 0 || opts->durability > 1)) {
    free(out);
    return es_fail(err, ES_INVALID_ARGUMENT, "postgres: durability %d unknown (0 full, 1 normal)",
                   opts->durability);
  }
  b->async_commit = opts && opts->durability == 1;
  o += sprintf(o, "postgresql:");
  memcpy(o, rest, base);
  o += base;
  int first = 1;
  while (q && *q) {
    const char *k = q + 1, *amp = strchr(k, '&');
    size_t n = amp ? (size_t)(amp - k) : strlen(k);
    q = amp;
    if (n == 0) continue;
    if (strncmp(k, "schema=", 7) == 0) {
      size_t vn = n - 7;
      if (vn == 0 || vn > PG_MAX_SCHEMA) {
        free(out);
        return es_fail(err, ES_INVALID_ARGUMENT, "postgres: schema must be 1 to %d bytes", PG_MAX_SCHEMA);
      }
      for (size_t i = 0; i < vn; i++) {
        unsigned char ch = (unsigned char)k[7 + i];
        if (!(isalnum(ch) || ch == '_') || (i == 0 && isdigit(ch))) {
          free(out);
          return es_fail(err, ES_INVALID_ARGUMENT,
                         "postgres: schema=%.*s: a schema name is letters, digits and '_' "
                         "(not starting with a digit)",
                         (int)vn, k + 7);
        }
      }
      if (vn >= 3 && strncasecmp(k + 7, "pg_", 3) == 0) {
        free(out);
        return es_fail(err, ES_INVALID_ARGUMENT, "postgres: schema names starting with pg_ are PostgreSQL's");
      }
      free(b->schema);
      if (!(b->schema = pg_dup(k + 7, vn))) {
        free(out);
        return pg_oom(err);
      }
      continue;
    }
    if (strncmp(k, "readers=", 8) == 0) {
      char v[32];
      int64_t x;
      if (n - 8 >= sizeof v || (memcpy(v, k + 8, n - 8), v[n - 8] = '\0', es_parse_int(v, 1, PG_MAX_READERS, &x))) {
        free(out);
        return es_fail(err, ES_INVALID_ARGUMENT, "postgres: readers must be 1..%d", PG_MAX_READERS);
      }
      b->max_readers = (int)x;
      continue;
    }
    if (strncmp(k, "timeout_ms=", 11) == 0) {
      char v[32];
      int64_t x;
      if (n - 11 >= sizeof v ||
          (memcpy(v, k + 11, n - 11), v[n - 11] = '\0', es_parse_int(v, 0, PG_MAX_TIMEOUT_MS, &x))) {
        free(out);
        return es_fail(err, ES_INVALID_ARGUMENT, "postgres: timeout_ms must be 0 (none) to %d",
                       PG_MAX_TIMEOUT_MS);
      }
      b->timeout_ms = x;
      continue;
    }
    *o++ = first ? '?' : '&';
    first = 0;
    memcpy(o, k, n);
    o += n;
  }
  *o = '\0';
  pg_tcp_defaults(b, out, first);
  b->conninfo = out;
  if (!b->schema && !(b->schema = pg_dup(PG_DEFAULT_SCHEMA, strlen(PG_DEFAULT_SCHEMA)))) return pg_oom(err);
  /* libpq's own judgement of the rest (unknown parameters, bad syntax):
   * a bad URL, not a storage failure. */
  char *perr = NULL;
  PQconninfoOption *info = PQconninfoParse(b->conninfo, &perr);
  if (!info) {
    char m[ES_ERRMSG_MAX];
    pg_trim(perr ? perr : "out of memory", m, sizeof m);
    if (perr) PQfreemem(perr);
    return es_fail(err, ES_INVALID_ARGUMENT, "postgres: bad URL: %s", m);
  }
  PQconninfoFree(info);
  return ES_OK;
}

/* The SQL strings that name the schema, its lock and its channel. */
static int pg_build_sql(es_backend *b, es_err *err) {
  uint64_t h = pg_hash(b->schema);
  int64_t key = (int64_t)h;
  char buf[512];
  snprintf(buf, sizeof buf,
           "SET client_encoding TO 'UTF8'; SET search_path TO \"%s\"; SET client_min_messages TO warning%s",
           b->schema, b->async_commit ? "; SET synchronous_commit TO off" : "");
  if (!(b->setup_sql = strdup(buf))) return pg_oom(err);
  b->lock_key = key;
  snprintf(buf, sizeof buf, "NOTIFY es_%016" PRIx64, h);
  if (!(b->notify_sql = strdup(buf))) return pg_oom(err);
  snprintf(buf, sizeof buf, "LISTEN es_%016" PRIx64, h);
  if (!(b->listen_sql = strdup(buf))) return pg_oom(err);
  return ES_OK;
}

/* ---- schema ------------------------------------------------------------ */

/* The schema's version: 0 when the schema or its meta table does not
 * exist; *foreign: the schema holds relations but no meta table. */
static int pg_schema_read(es_backend *b, pg_conn *c, int64_t *version, int *foreign, es_err *err) {
  const char *v[1] = {b->schema};
  *version = 0;
  *foreign = 0;
  pg_arm(c);
  PGresult *res = PQexecParams(c->db,
                               "SELECT to_regclass(quote_ident($1) || '.meta') IS NOT NULL,"
                               " (SELECT count(*) FROM pg_class k JOIN pg_namespace n"
                               "  ON n.oid = k.relnamespace WHERE n.nspname = $1)",
                               1, NULL, v, NULL, NULL, 0);
  pg_disarm(c);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    int code = pg_fail_res(err, c, res, "cannot read the schema");
    PQclear(res);
    return code;
  }
  int has_meta = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
  long long rels = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
  PQclear(res);
  if (!has_meta) {
    *foreign = rels > 0;
    return ES_OK;
  }
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT value FROM \"%s\".meta WHERE key = 'schema_version'", b->schema);
  res = pg_exec(c, sql);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    int code = pg_fail_res(err, c, res, "cannot read the schema version");
    PQclear(res);
    return code;
  }
  if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0)) *foreign = 1;
  else *version = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  return ES_OK;
}

static int pg_schema_judge(es_backend *b, int64_t version, int foreign, es_err *err) {
  if (foreign)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "postgres %s: not an eventstore schema: it holds tables but no eventstore "
                   "schema version; it is left untouched (choose another ?schema=)",
                   b->schema);
  if (version > PG_SCHEMA_VERSION)
    return es_fail(err, ES_STORAGE,
                   "postgres %s: schema version %lld is newer than this eventstore supports (%d); "
                   "upgrade eventstore to open it",
                   b->schema, (long long)version, PG_SCHEMA_VERSION);
  if (version < 0)
    return es_fail(err, ES_STORAGE, "postgres %s: bad schema version %lld", b->schema, (long long)version);
  return ES_OK;
}

/* Creates or migrates the schema under the store's write lock (another
 * process may be doing the same: the second one finds it done). The
 * common case, a current schema, takes no lock. */
static int pg_setup_schema(es_backend *b, es_err *err) {
  pg_conn *c = &b->w;
  int64_t version;
  int foreign, code;
  if ((code = pg_schema_read(b, c, &version, &foreign, err)) != ES_OK) return code;
  if ((code = pg_schema_judge(b, version, foreign, err)) != ES_OK) return code;
  if (version == PG_SCHEMA_VERSION) return ES_OK;
  char sql[256];
  snprintf(sql, sizeof sql,
           "BEGIN; SELECT pg_advisory_xact_lock(%" PRId64 "); CREATE SCHEMA IF NOT EXISTS \"%s\"",
           (int64_t)pg_hash(b->schema), b->schema);
  if ((code = pg_simple(c, sql, "cannot lock the schema to set it up", err)) != ES_OK) goto rollback;
  if ((code = pg_schema_read(b, c, &version, &foreign, err)) != ES_OK) goto rollback;
  if ((code = pg_schema_judge(b, version, foreign, err)) != ES_OK) goto rollback;
  for (int64_t v = version; v < PG_SCHEMA_VERSION; v++) {
    char what[96];
    snprintf(what, sizeof what, "migrating schema %lld to %lld failed", (long long)v, (long long)v + 1);
    if ((code = pg_simple(c, pg_migrations[v], what, err)) != ES_OK) goto rollback;
  }
  snprintf(sql, sizeof sql,
           "INSERT INTO meta(key, value) VALUES ('schema_version', %d) ON CONFLICT (key) DO UPDATE"
           " SET value = excluded.value; COMMIT",
           PG_SCHEMA_VERSION);
  if ((code = pg_simple(c, sql, "recording the schema version", err)) != ES_OK) goto rollback;
  return ES_OK;
rollback:
  if (PQstatus(c->db) == CONNECTION_OK && PQtransactionStatus(c->db) != PQTRANS_IDLE) {
    PGresult *res = pg_exec(c, "ROLLBACK");
    PQclear(res);
  }
  return code;
}

/* ---- open / close ------------------------------------------------------- */

static void pg_pool_close(pg_pool *pool) {
  pg_reader *r = pool->all;
  while (r) {
    pg_reader *next = r->next_all;
    pg_conn_close(&r->c);
    free(r->t.skip);
    free(r);
    r = next;
  }
}

static void pg_close(es_backend *b) {
  if (!b) return;
  pg_pre_drop(&b->wt);
  pg_ahead_drop(&b->wt);
  pg_ins_free(&b->wt);
  pg_pool_close(&b->readers);
  pg_pool_close(&b->claimers);
  pg_conn_close(&b->watch);
  pg_conn_close(&b->w);
  es_watchdog_free(b->wd);
  if (b->kick[0] >= 0) close(b->kick[0]);
  if (b->kick[1] >= 0) close(b->kick[1]);
  pthread_mutex_destroy(&b->pool_mu);
  pthread_cond_destroy(&b->pool_cv);
  pthread_mutex_destroy(&b->watch_mu);
  pthread_cond_destroy(&b->watch_cv);
  free(b->conninfo);
  free(b->schema);
  free(b->setup_sql);
  free(b->notify_sql);
  free(b->listen_sql);
  free(b);
}

static int pg_watch_connect(es_backend *b, es_err *err) {
  int code = pg_conn_connect(b, &b->watch, err);
  if (code == ES_OK) code = pg_simple(&b->watch, b->listen_sql, "cannot listen", err);
  return code;
}

static int pg_open(const char *url_rest, const es_open_opts *opts, es_backend **out, es_err *err) {
  es_backend *b;
  int code;
  *out = NULL;
  if ((code = pq_ready(err)) != ES_OK) return code;
  if (!PQisthreadsafe())
    return es_fail(err, ES_STORAGE, "postgres: the libpq library was built without thread support");
  b = calloc(1, sizeof *b);
  if (!b) return pg_oom(err);
  pthread_mutex_init(&b->pool_mu, NULL);
  pthread_cond_init(&b->pool_cv, NULL);
  pthread_mutex_init(&b->watch_mu, NULL);
  pthread_cond_init(&b->watch_cv, NULL);
  b->claimers.claim = 1;
  if (!(b->wd = es_watchdog_new())) {
    b->kick[0] = b->kick[1] = -1;
    code = pg_oom(err);
    goto fail;
  }
  /* wait_change polls this pipe beside the watch connection: wake() and
   * a notification another thread consumed write a byte to it */
  if (pipe2(b->kick, O_NONBLOCK | O_CLOEXEC) != 0) {
    b->kick[0] = b->kick[1] = -1;
    code = es_fail(err, ES_STORAGE, "postgres: cannot make a pipe: %s", strerror(errno));
    goto fail;
  }
  b->wt.b = b;
  b->wt.c = &b->w;
  b->wt.write = 1;
  if ((code = pg_parse_url(b, url_rest ? url_rest : "", opts, err)) != ES_OK) goto fail;
  if ((code = pg_build_sql(b, err)) != ES_OK) goto fail;
  /* The write connection's setup names the schema before it exists: the
   * search_path is only looked up by statements that use it. */
  if ((code = pg_conn_connect(b, &b->w, err)) != ES_OK) goto fail;
  if ((code = pg_setup_schema(b, err)) != ES_OK) goto fail;
  /* The watch connection is made by the first data_version, ext_version
   * or wait (pg_watch_consume): a connection costs ~15 ms on a small
   * machine, and most handles never wait. Whoever compares versions took
   * its first one from such a call, so the LISTEN was in place before it
   * read what the version guards. */
  *out = b;
  return ES_OK;
fail:
  pg_close(b);
  return code;
}

/* ---- transactions ------------------------------------------------------- */

/* Ends whatever a failed call left on t's connection: answers still due,
 * an open transaction. */
static void pg_rollback_txn(es_txn *t) {
  pg_conn *c = t->c;
  pg_pre_drop(t);
  pg_ahead_drop(t);
  pg_ins_discard(t);
  pg_drain(t);
  /* still in pipeline mode with nothing to read (a send that failed):
   * PQexec would be refused */
  if (c->db && PQpipelineStatus(c->db) != PQ_PIPELINE_OFF && !PQexitPipelineMode(c->db))
    pg_conn_close(c);
  if (c->db && PQstatus(c->db) == CONNECTION_OK && PQtransactionStatus(c->db) != PQTRANS_IDLE) {
    PGresult *res = pg_exec(c, "ROLLBACK");
    PQclear(res);
  }
}

/* A connection the server dropped while it was idle (a restart, an idle
 * timeout, pg_terminate_backend) has said so: its last words (a FATAL
 * message, the end of the stream) wait in the socket. An idle connection
 * has nothing else to say (the write and claim connections LISTEN to
 * nothing; a parameter the server reports after a configuration reload is
 * the rare exception, and reconnecting for it is harmless), so anything
 * readable means: connect again. Nothing of the call was sent yet, so it
 * is safe, and it costs no round trip. */
static int pg_conn_fresh(es_backend *b, pg_conn *c, es_err *err) {
  int code = pg_conn_ready(b, c, err);
  if (code != ES_OK) return code;
  struct pollfd f = {PQsocket(c->db), POLLIN, 0};
  if (poll(&f, 1, 0) != 0) return pg_conn_connect(b, c, err);
  return ES_OK;
}

/* BEGIN, the store's lock, the position counter: sent, not waited for
 * (the answers come with the transaction's first read or its first
 * release; pg_event_insert syncs first when it needs the counter). */
static int pg_send_begin(es_txn *t, es_err *err) {
  pg_params p = {0};
  int code;
  t->need_begin = 0;
  t->pos_known = 0;
  pp_int(&p, t->b->lock_key);
  /* READ COMMITTED: each statement sees what was committed before it, so
   * after the lock every earlier writer's commit is visible. */
  if ((code = pg_send_sql(t, "BEGIN ISOLATION LEVEL READ COMMITTED", PEND_ANY, err)) != ES_OK)
    return code;
  if ((code = pg_send(t, ST_BEGIN_LOCK, &p, PEND_ANY, err)) != ES_OK) return code;
  return pg_send(t, ST_BEGIN_POSITIONS, NULL, PEND_BEGIN, err);
}

static int pg_write_begin(es_backend *b, es_txn **out, es_err *err) {
  es_txn *t = &b->wt;
  int code;
  *out = NULL;
  /* never build on a transaction a failed call left behind */
  pg_rollback_txn(t);
  t->broken = 0;
  t->depth = 0;
  t->virtual_sp = 0;
  t->released = 0;
  t->need_begin = 0;
  t->pos_known = 0;
  if ((code = pg_conn_fresh(b, &b->w, err)) != ES_OK) return code;
  if ((code = pg_send_begin(t, err)) != ES_OK) {
    pg_rollback_txn(t);
    return code;
  }
  *out = t;
  return ES_OK;
}

/* Before the next insert: the position counter read by the begin. */
static int pg_positions(es_txn *t, es_err *err) {
  if (t->pos_known) return ES_OK;
  int code = ES_OK;
  /* a first caller rolled back (pg_savepoint_rollback) left nothing in
   * flight: the begin is sent now, with nothing else to answer */
  if (t->need_begin && (code = pg_pipe(t, err)) != ES_OK) return code;
  code = pg_sync(t, NULL, err);
  if (code == ES_OK && !t->pos_known)
    code = es_fail(err, ES_STORAGE, "postgres %s: the position counter was not read", t->b->schema);
  return code;
}

static void pg_claim_end(es_txn *t);

static void pg_write_rollback(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  pg_rollback_txn(t);
  t->depth = 0;
  t->virtual_sp = 0;
  t->broken = 0;
  if (t->claim) pg_claim_end(t);
}

/* The commit, with the statements still unanswered, in one round trip. A
 * claim transaction inserted nothing (no position to save) and sends no
 * NOTIFY: it adds no event, which is all waiters wait for, and a NOTIFY
 * would serialise its commit with every other notifying commit of the
 * database. */
static int pg_write_commit(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = pg_txn_check(t, err);
  pg_pre_drop(t);
  if (code == ES_OK) code = pg_ahead_end(t, err);
  pg_ahead_drop(t);
  if (code == ES_OK && !t->claim && t->pos_known && t->next_position > t->saved_next) {
    pg_params p = {0};
    pp_int(&p, t->next_position);
    code = pg_send(t, ST_META_NEXT, &p, PEND_ANY, err);
  }
  if (code == ES_OK && !t->claim) code = pg_send_sql(t, t->b->notify_sql, PEND_ANY, err);
  if (code == ES_OK) code = pg_send_sql(t, "COMMIT", PEND_COMMIT, err);
  if (code == ES_OK) code = pg_sync(t, NULL, err);
  if (code != ES_OK) {
    pg_write_rollback(t->b, t);
    return code;
  }
  t->depth = 0;
  if (t->claim) pg_claim_end(t);
  return ES_OK;
}

/* Savepoints. The first caller of a transaction gets a virtual one: the
 * transaction holds nobody else's work yet, so rolling back to its
 * savepoint is rolling the whole transaction back (and beginning again
 * lazily, pg_pipe, for the next caller of the group): no SAVEPOINT and no
 * RELEASE statement, which is every transaction of a handle used by one
 * thread. Later callers get a real SAVEPOINT, sent with their first
 * statement. A release syncs: the caller's statements are all answered
 * before the core counts it in the group, so a failure is this caller's,
 * rolled back to its savepoint only. */
static int pg_savepoint(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = pg_txn_check(t, err);
  pg_pre_drop(t);
  if (code != ES_OK) return code;
  if (t->depth == 0 && t->released == 0) {
    t->virtual_sp = 1;
    t->depth = 1;
    return ES_OK;
  }
  /* the counter is known: an earlier release synced */
  if ((code = pg_send_sql(t, "SAVEPOINT es_sp", PEND_ANY, err)) != ES_OK) return code;
  if (t->depth < PG_MAX_SAVEPOINTS) t->sp_next[t->depth] = t->next_position;
  t->depth++;
  return ES_OK;
}

static int pg_savepoint_release(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = pg_txn_check(t, err);
  pg_pre_drop(t);
  if (code != ES_OK) return code;
  if (t->depth <= 0) return es_fail(err, ES_STORAGE, "postgres: release without a savepoint");
  int is_virtual = t->virtual_sp && t->depth == 1;
  /* the caller's rows written behind are answered with its release too */
  if (is_virtual && (code = pg_ahead_flush(t, err)) != ES_OK) return code;
  if (!is_virtual && (code = pg_send_sql(t, "RELEASE SAVEPOINT es_sp", PEND_ANY, err)) != ES_OK)
    return code;
  if ((code = pg_sync(t, NULL, err)) != ES_OK) return code;
  t->depth--;
  if (is_virtual) t->virtual_sp = 0;
  if (t->depth == 0) t->released++;
  return ES_OK;
}

/* The only caller's release and the commit, in one round trip: a COMMIT
 * ends the savepoint with the transaction (virtual or not: it held this
 * caller's work only). */
static int pg_release_commit(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  t->depth = 0;
  t->virtual_sp = 0;
  return pg_write_commit(t->b, t, err);
}

static void pg_savepoint_rollback(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  pg_pre_drop(t);
  pg_ahead_drop(t);
  pg_ins_discard(t); /* this caller's rows */
  if (t->broken || t->depth <= 0) return;
  pg_drain(t);
  if (t->broken) return;
  if (t->virtual_sp && t->depth == 1) {
    /* the transaction held only this caller's work */
    pg_rollback_txn(t);
    t->depth = 0;
    t->virtual_sp = 0;
    t->need_begin = 1;
    t->pos_known = 0;
    return;
  }
  es_err e = {0};
  if (pg_simple(t->c, "ROLLBACK TO SAVEPOINT es_sp; RELEASE SAVEPOINT es_sp", "rollback", &e) != ES_OK) {
    char msg[ES_ERRMSG_MAX + 40];
    snprintf(msg, sizeof msg, "rolling back a savepoint failed: %s", e.msg);
    pg_txn_break(t, msg);
    return;
  }
  t->depth--;
  if (t->depth < PG_MAX_SAVEPOINTS) t->next_position = t->sp_next[t->depth];
}

static void pg_reader_put_back(es_backend *b, pg_reader *r) {
  pthread_mutex_lock(&b->pool_mu);
  r->next_free = r->pool->free;
  r->pool->free = r;
  /* broadcast: threads waiting for either pool share the condition */
  pthread_cond_broadcast(&b->pool_cv);
  pthread_mutex_unlock(&b->pool_mu);
}

/* A free connection of pool; else a free one of `other`, lent (it goes
 * back to its own pool: a connection costs ~15 ms to open, and a short
 * run, an `eventstore run --until-idle` whose last read follows its last
 * claim, need not open a third); else a new one while pool has fewer than
 * max_readers; else waits for one to be put back. The caller sets the
 * transaction's kind (write, claim) on what it gets. */
static int pg_pool_take(es_backend *b, pg_pool *pool, pg_pool *other, pg_reader **out, es_err *err) {
  pg_reader *r;
  *out = NULL;
  pthread_mutex_lock(&b->pool_mu);
  while (!pool->free && !other->free && pool->n >= b->max_readers)
    pthread_cond_wait(&b->pool_cv, &b->pool_mu);
  pg_pool *from = pool->free ? pool : other->free ? other : NULL;
  if (from) {
    r = from->free;
    from->free = r->next_free;
    pthread_mutex_unlock(&b->pool_mu);
    *out = r;
    return ES_OK;
  }
  pool->n++;
  pthread_mutex_unlock(&b->pool_mu);
  r = calloc(1, sizeof *r);
  if (!r) {
    pthread_mutex_lock(&b->pool_mu);
    pool->n--;
    pthread_cond_broadcast(&b->pool_cv);
    pthread_mutex_unlock(&b->pool_mu);
    return pg_oom(err);
  }
  r->t.b = b;
  r->t.c = &r->c;
  r->t.reader = r;
  r->t.write = pool->claim;
  r->t.claim = pool->claim;
  r->c.b = b;
  r->pool = pool;
  pthread_mutex_lock(&b->pool_mu);
  r->next_all = pool->all;
  pool->all = r;
  pthread_mutex_unlock(&b->pool_mu);
  *out = r;
  return ES_OK;
}

static int pg_read_begin(es_backend *b, es_txn **out, es_err *err) {
  pg_reader *r = NULL;
  int code;
  *out = NULL;
  if ((code = pg_pool_take(b, &b->readers, &b->claimers, &r, err)) != ES_OK) return code;
  /* a claim connection lent: left idle by its last claim (as a failed
   * one is rolled back), made sure of as claim_begin does */
  if (r->pool != &b->readers) pg_rollback_txn(&r->t);
  r->t.write = r->t.claim = 0;
  r->t.broken = 0;
  static const char begin[] = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
  code = pg_conn_ready(b, &r->c, err);
  if (code == ES_OK) code = pg_simple(&r->c, begin, "cannot begin a read transaction", err);
  /* dropped while idle: reconnect and begin again, once (as pg_write_begin) */
  if (code != ES_OK && r->c.db && PQstatus(r->c.db) == CONNECTION_BAD) {
    code = pg_conn_connect(b, &r->c, err);
    if (code == ES_OK) code = pg_simple(&r->c, begin, "cannot begin a read transaction", err);
  }
  if (code != ES_OK) {
    pg_reader_put_back(b, r);
    return code;
  }
  *out = &r->t;
  return ES_OK;
}

static void pg_read_end(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  pg_reader *r = t->reader;
  if (r->c.db && PQstatus(r->c.db) == CONNECTION_OK && PQtransactionStatus(r->c.db) != PQTRANS_IDLE) {
    PGresult *res = pg_exec(&r->c, "COMMIT");
    PQclear(res);
  }
  pg_reader_put_back(t->b, r);
}

/* ---- claim transactions (docs/postgres.md "Concurrency") -------------------
 *
 * claim_next runs in a transaction of its own on a pool connection, without
 * the store's advisory lock, so engines claim in parallel: its scans lock
 * the ready rows they return with FOR UPDATE SKIP LOCKED (never waiting for
 * a row another transaction holds), and it locks the session rows of those
 * rows (FOR UPDATE, in byte order of the names: the core asks in that
 * order) to add the attempts. Those session locks are its only waits, and
 * they can close a cycle with the writer (which holds the advisory lock and
 * may wait for one of the claim's event rows). PostgreSQL's deadlock
 * detector would then abort whichever transaction's deadlock_timeout ran
 * out first, possibly the writer's, and with it a whole group commit. So a
 * claim transaction (1) waits for a lock at most lock_timeout =
 * min(200 ms, deadlock_timeout / 4), and (2) never begins a wait that could
 * last beyond 3/4 of deadlock_timeout after the transaction began. A writer
 * waits only for locks a claim took after it began, so by the time the
 * writer's deadlock check runs (deadlock_timeout after its wait began) no
 * claim transaction it waits for is waiting any more: there is no cycle to
 * find, and the writer is never the one aborted. The claim transaction
 * that timed out is rolled back (nothing of it was done) and the core runs
 * it again (claim_retry). */

static int64_t pg_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Puts the claim transaction's connection back in its pool. */
static void pg_claim_end(es_txn *t) {
  free(t->skip);
  t->skip = NULL;
  pg_reader_put_back(t->b, t->reader);
}

/* Names as a text[] literal: {"a","b"}, each name
 * quoted with its '"' and '\' escaped (names hold no NUL). */
static char *pg_text_array(const char *const *v, size_t n) {
  pg_buf b = {0};
  int bad = 0;
  for (size_t i = 0; i < n && !bad; i++) bad = pg_buf_str(&b, v[i]);
  if (bad || pg_buf_end(&b)) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

/* A claim transaction begins with BEGIN and its lock_timeout (SET LOCAL),
 * sent without waiting, with its first statement. The lock_timeout comes
 * from deadlock_timeout as this connection last read it (read once when
 * it connects); the begin reads it again (current_setting: no catalog
 * scan), and should it have been lowered meanwhile, lock_timeout is set
 * again before the transaction's first wait (pg_claim_may_wait). */
static int pg_claim_begin(es_backend *b, const char *const *skip, size_t n_skip, es_txn **out,
                          es_err *err) {
  pg_reader *r = NULL;
  int code;
  *out = NULL;
  if ((code = pg_pool_take(b, &b->claimers, &b->readers, &r, err)) != ES_OK) return code;
  es_txn *t = &r->t;
  pg_rollback_txn(t);
  t->write = t->claim = 1; /* on a read connection lent, too */
  t->broken = 0;
  t->retry = 0;
  t->depth = 0;
  t->lock_fix = 0;
  t->next_position = t->saved_next = 0;
  free(t->skip);
  if (!(t->skip = pg_text_array(skip, skip ? n_skip : 0))) {
    pg_claim_end(t);
    return pg_oom(err);
  }
  code = pg_conn_fresh(b, &r->c, err);
  if (code == ES_OK && (r->c.deadlock_ms == 0 || !r->c.prepared[ST_CLAIM_SETUP])) {
    /* a new connection: deadlock_timeout as it is now, once */
    PGresult *res = pg_exec(&r->c, "SELECT current_setting('deadlock_timeout')");
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
      code = pg_fail_res(err, &r->c, res, "cannot begin a claim transaction");
    else
      r->c.deadlock_ms = pg_parse_ms(PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
    PQclear(res);
    if (code == ES_OK && r->c.deadlock_ms <= 0)
      code = es_fail(err, ES_STORAGE, "postgres %s: cannot read deadlock_timeout", b->schema);
  }
  if (code == ES_OK) {
    pg_params p = {0};
    char lock[32];
    pg_claim_limits(t, r->c.deadlock_ms);
    snprintf(lock, sizeof lock, "%" PRId64 "ms", t->lock_ms);
    pp_str(&p, lock);
    code = pg_send_sql(t, "BEGIN ISOLATION LEVEL READ COMMITTED", PEND_ANY, err);
    if (code == ES_OK) code = pg_send(t, ST_CLAIM_SETUP, &p, PEND_CLAIM, err);
  }
  if (code != ES_OK) {
    pg_rollback_txn(t);
    pg_claim_end(t);
    return code;
  }
  t->started_ms = pg_now_ms();
  *out = t;
  return ES_OK;
}

static int pg_claim_retry(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  return t->claim && t->retry;
}

/* The updates of a claim transaction are answered with its COMMIT: a
 * session row's lock wait that ran out (pg_session_claimed) is learnt of
 * here, and the claim may run again. */
static int pg_claim_commit(es_backend *b, es_txn *t, int *retry, es_err *err) {
  (void)b; /* t carries it (t->b) */
  *retry = 0;
  int code = pg_txn_check(t, err);
  if (code == ES_OK) code = pg_send_sql(t, "COMMIT", PEND_COMMIT, err);
  if (code == ES_OK) code = pg_sync(t, NULL, err);
  if (code != ES_OK) {
    *retry = t->retry;
    pg_write_rollback(t->b, t); /* ends t: read retry first */
    return code;
  }
  pg_claim_end(t);
  return ES_OK;
}

/* Statements sent on c and not answered yet that may wait for a lock
 * (pg_session_claimed's, sent without a sync). */
static int pg_pend_waits(const pg_conn *c) {
  int n = 0;
  for (int i = 0; i < c->n_pend; i++)
    if (c->pend[i].id == ST_SESSION_CLAIMED && c->pend[i].kind != PEND_PREPARE) n++;
  return n;
}

/* Before a statement of a claim transaction that may wait for a lock: the
 * begin's answers are in (the lock_timeout in force is known), and it may
 * not wait beyond the transaction's budget (see above). The statements
 * still unanswered may each wait lock_ms too, and time does not pass for
 * them while they are only sent: they count, and when they and this one
 * could end beyond the budget, they are answered first (a sync) and the
 * time is taken again. */
static int pg_claim_may_wait(es_txn *t, es_err *err) {
  if (!t->claim) return ES_OK;
  int code = ES_OK;
  for (int i = 0; i < t->c->n_pend; i++)
    if (t->c->pend[i].kind == PEND_CLAIM) {
      if ((code = pg_sync(t, NULL, err)) != ES_OK) return code;
      break;
    }
  if (t->lock_fix) {
    pg_params p = {0};
    char lock[32];
    snprintf(lock, sizeof lock, "%" PRId64 "ms", t->lock_ms);
    pp_str(&p, lock);
    if ((code = pg_send(t, ST_CLAIM_SETUP, &p, PEND_ANY, err)) != ES_OK) return code;
    t->lock_fix = 0;
  }
  int64_t waits = pg_pend_waits(t->c);
  if (waits > 0 && pg_now_ms() - t->started_ms + (waits + 1) * t->lock_ms > t->budget_ms) {
    if ((code = pg_sync(t, NULL, err)) != ES_OK) return code;
    waits = 0;
  }
  if (pg_now_ms() - t->started_ms + (waits + 1) * t->lock_ms <= t->budget_ms) return ES_OK;
  t->retry = 1;
  return es_fail(err, ES_STORAGE,
                 "postgres %s: claim: the transaction ran out of time to wait for locks",
                 t->b->schema);
}

/* ---- sessions ------------------------------------------------------------ */

/* In a write or claim transaction the row is locked (FOR UPDATE): the core
 * may rewrite it, and a claim transaction may change it meanwhile. */
static int pg_session_get(es_backend *b, es_txn *t, const char *session, es_session_info *out,
                          es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int code;
  if ((code = pg_claim_may_wait(t, err)) != ES_OK) return code;
  es_session_info *ahead = pg_ahead_session(t, session);
  if (ahead && t->ahead->si_absent[ahead - t->ahead->si]) return ES_NOT_FOUND;
  if (ahead) return es_session_info_copy(out, ahead) == ES_OK ? ES_OK : pg_oom(err);
  if (t->pre_name && strcmp(t->pre_name, session) == 0) {
    /* read (locked) with the event just before, unchanged since */
    if (PQntuples(t->pre_session) == 0) code = ES_NOT_FOUND;
    else if (pg_decode_session(t->pre_session, 0, 1, out) != ES_OK) code = pg_oom(err);
    pg_pre_drop(t);
    return code;
  }
  pp_str(&p, session);
  return pg_get_one(t, t->write ? ST_SESSION_GET_LOCK : ST_SESSION_GET, &p, ROW_SESSION, out, err);
}

/* ST_SESSION_PUT's parameters. */
static void pg_session_params(pg_params *p, const es_session_info *row) {
  memset(p, 0, sizeof *p);
  pp_str(p, row->session);
  pp_int(p, row->head);
  pp_int(p, row->events);
  pp_int(p, row->pending);
  pp_int(p, row->dead);
  pp_int(p, row->attempts);
  pp_int(p, row->failures);
  pp_opt(p, row->first_at);
  pp_opt(p, row->updated_at);
  pp_int(p, row->fence);
  pp_opt(p, row->sealed_at);
  pp_str(p, row->seal_reason);
  pp_str(p, row->lease_holder);
  pp_opt(p, row->lease_token);
  pp_opt(p, row->lease_expires_at);
  pp_str(p, row->parent);
  pp_opt(p, row->fork_at);
  pp_opt(p, row->forked_at);
  pp_int(p, row->first_index);
  pp_int(p, row->archived_through);
}

static int pg_session_put(es_backend *b, es_txn *t, const es_session_info *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p;
  pg_pre_drop(t);
  es_session_info *ahead = pg_ahead_session(t, row->session);
  if (ahead) { /* written behind (pg_ahead_flush) */
    es_session_info copy;
    if (es_session_info_copy(&copy, row) == ES_OK) {
      es_session_info_destroy(ahead);
      *ahead = copy;
      size_t i = (size_t)(ahead - t->ahead->si);
      if (!t->ahead->si_dirty[i]) t->ahead->n_dirty++;
      t->ahead->si_dirty[i] = 1;
      t->ahead->si_absent[i] = 0; /* a new row: the flush's upsert inserts it */
      return ES_OK;
    }
    int code = pg_ahead_end(t, err); /* the others go now; this one below */
    if (code != ES_OK) return code;
  }
  pg_session_params(&p, row);
  return pg_write(t, ST_SESSION_PUT, &p, NULL, err);
}

/* The smallest string greater than every string starting with prefix
 * (prefix without its trailing 0xFF bytes, last byte + 1); NULL when there
 * is none (no upper bound). *oom on allocation failure. */
static char *pg_prefix_successor(const char *prefix, int *oom) {
  size_t n = strlen(prefix);
  *oom = 0;
  while (n > 0 && (unsigned char)prefix[n - 1] == 0xFF) n--;
  if (n == 0) return NULL;
  char *s = pg_dup(prefix, n);
  if (!s) {
    *oom = 1;
    return NULL;
  }
  s[n - 1] = (char)((unsigned char)s[n - 1] + 1);
  return s;
}

typedef struct {
  es_session_cb cb;
  void *ctx;
  const char *prefix;
  size_t n;
} pg_prefix_stop;

static int pg_prefix_row(void *ctx, const es_session_info *row) {
  pg_prefix_stop *s = ctx;
  if (strncmp(row->session, s->prefix, s->n) != 0) return 1;
  return s->cb(s->ctx, row);
}

static int pg_session_list(es_backend *b, es_txn *t, const char *prefix, const char *after,
                           int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  const char *lower;
  int exclusive, oom, id;
  if (!prefix) prefix = "";
  if (after && strcmp(after, prefix) >= 0) {
    lower = after;
    exclusive = 1;
  } else {
    lower = prefix;
    exclusive = 0;
  }
  char *upper = pg_prefix_successor(prefix, &oom);
  if (oom) return pg_oom(err);
  /* The successor of a prefix ending in 0x7F or in the continuation byte
   * 0xBF ends in 0x80 or 0xC0: not UTF-8, which the server refuses as
   * text. Then the range has no upper bound and the rows stop at the first
   * one outside the prefix (they come in order, so the matching ones come
   * first and the limit still counts them). */
  pg_prefix_stop stop = {cb, ctx, prefix, strlen(prefix)};
  int unbounded = upper && (((unsigned char)upper[strlen(upper) - 1]) == 0x80 ||
                            ((unsigned char)upper[strlen(upper) - 1]) == 0xC0);
  if (unbounded) {
    free(upper);
    upper = NULL;
  }
  id = exclusive ? (upper ? ST_SESSION_LIST_GT_LT : ST_SESSION_LIST_GT)
                 : (upper ? ST_SESSION_LIST_GE_LT : ST_SESSION_LIST_GE);
  pp_str(&p, lower);
  if (upper) pp_str(&p, upper);
  pp_limit(&p, limit);
  int code = unbounded ? pg_iterate(t, id, &p, ROW_SESSION, (pg_fn)pg_prefix_row, &stop, err)
                       : pg_iterate(t, id, &p, ROW_SESSION, (pg_fn)cb, ctx, err);
  free(upper);
  return code;
}

static int pg_session_children(es_backend *b, es_txn *t, const char *parent, const char *after,
                               int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, parent);
  if (after) pp_str(&p, after);
  pp_limit(&p, limit);
  return pg_iterate(t, after ? ST_SESSION_CHILDREN_GT : ST_SESSION_CHILDREN, &p, ROW_SESSION,
                    (pg_fn)cb, ctx, err);
}

/* ---- events -------------------------------------------------------------- */

/* Locked in a write transaction, as pg_session_get. */
static int pg_event_get(es_backend *b, es_txn *t, const char *session, int64_t index, es_event *out,
                        es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int code;
  if ((code = pg_claim_may_wait(t, err)) != ES_OK) return code;
  if (t->write && !t->claim && pg_ahead_event(t, session, index, out)) return ES_OK;
  pp_str(&p, session);
  pp_int(&p, index);
  if (t->write && !t->claim) {
    /* The core reads (and locks) an event's session row right after the
     * event in complete, fail and renew: it is read ahead in the same
     * round trip (pg_session_get answers from it). Locking it a little
     * earlier changes nothing: the writer would lock it anyway, and only
     * claim transactions, which never wait long, contend for it. */
    PGresult *res[2];
    pg_params q = {0};
    pp_str(&q, session);
    pg_pre_drop(t);
    if ((code = pg_send(t, ST_EVENT_GET_LOCK, &p, PEND_WANT, err)) != ES_OK) return code;
    if ((code = pg_send(t, ST_SESSION_GET_LOCK, &q, PEND_WANT, err)) != ES_OK) return code;
    if ((code = pg_sync_n(t, res, 2, err)) != ES_OK) return code;
    if (!res[0] || !res[1] || !(t->pre_name = strdup(session))) {
      PQclear(res[0]);
      PQclear(res[1]);
      return res[0] && res[1] ? pg_oom(err) : es_fail(err, ES_STORAGE, "postgres %s: no answer", t->b->schema);
    }
    t->pre_session = res[1];
    if (PQntuples(res[0]) == 0) code = ES_NOT_FOUND;
    else if (pg_decode_event(res[0], 0, 1, out) != ES_OK) code = pg_oom(err);
    PQclear(res[0]);
    return code;
  }
  return pg_get_one(t, t->write ? ST_EVENT_GET_LOCK : ST_EVENT_GET, &p, ROW_EVENT, out, err);
}

static int pg_event_get_by_id(es_backend *b, es_txn *t, const char *id, es_event *out,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  if (pg_ahead_absent(t, id)) return ES_NOT_FOUND;
  pp_str(&p, id);
  return pg_get_one(t, ST_EVENT_GET_BY_ID, &p, ROW_EVENT, out, err);
}

/* The reads complete_many's completions, or the appends of a group
 * commit, will make, in one round trip (the rows read ahead, above): the
 * events at (sessions[i], indexes[i]) (index 0: none, the session's row
 * only), those sessions' rows, and which of ids are stored. A session
 * with no row is known absent until put. Only a hint: anything it cannot
 * do leaves the calls to read for themselves, except a failed statement,
 * which has aborted the transaction (STORAGE). */
static int pg_read_ahead(es_backend *b, es_txn *t, const char *const *sessions,
                         const int64_t *indexes, size_t n, const char *const *ids, size_t n_ids,
                         es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = pg_ahead_end(t, err);
  if (code != ES_OK || !t->write || t->claim || n == 0) return code;
  pg_pre_drop(t);
  int want_ev = 0;
  for (size_t i = 0; i < n; i++) want_ev |= indexes[i] > 0;
  char *s_arr = pg_text_array(sessions, n), *id_arr = n_ids ? pg_text_array(ids, n_ids) : NULL;
  pg_buf i_arr = {0};
  int bad = 0;
  for (size_t i = 0; i < n && want_ev && !bad; i++) bad = pg_buf_int(&i_arr, indexes[i]);
  pg_ahead *a = calloc(1, sizeof *a);
  if (!s_arr || bad || (want_ev && pg_buf_end(&i_arr)) || !a || (n_ids && !id_arr))
    code = pg_oom(err);
  else a->per_session = !want_ev;
  t->ahead = a;
  /* the answers: [0] events (want_ev), [1] sessions, [2] ids (n_ids), [3]
   * the fence floors of the sessions asked (§3.8: what a session without a
   * row starts from) */
  PGresult *res[4] = {NULL, NULL, NULL, NULL};
  int slot[4] = {-1, -1, -1, -1}, n_res = 0;
  if (code == ES_OK) {
    pg_params pe = {0}, ps = {0}, pi = {0};
    pp_str(&pe, s_arr);
    pp_str(&pe, i_arr.p);
    pp_str(&ps, s_arr);
    pp_str(&pi, id_arr);
    if (want_ev && (code = pg_send(t, ST_AHEAD_EVENTS, &pe, PEND_WANT, err)) == ES_OK) slot[0] = n_res++;
    if (code == ES_OK && (code = pg_send(t, ST_AHEAD_SESSIONS, &ps, PEND_WANT, err)) == ES_OK)
      slot[1] = n_res++;
    if (code == ES_OK && n_ids && (code = pg_send(t, ST_AHEAD_IDS, &pi, PEND_WANT, err)) == ES_OK)
      slot[2] = n_res++;
    if (code == ES_OK && (code = pg_send(t, ST_AHEAD_FLOORS, &ps, PEND_WANT, err)) == ES_OK)
      slot[3] = n_res++;
  }
  PGresult *got[4] = {NULL, NULL, NULL, NULL};
  if (code == ES_OK) code = pg_sync_n(t, got, n_res, err);
  for (int k = 0; k < 4; k++) res[k] = slot[k] >= 0 ? got[slot[k]] : NULL;
  if (code == ES_OK && ((want_ev && !res[0]) || !res[1] || (n_ids && !res[2]) || !res[3]))
    code = es_fail(err, ES_STORAGE, "postgres %s: no answer", t->b->schema);
  size_t ne = code == ES_OK && want_ev ? (size_t)PQntuples(res[0]) : 0;
  size_t ns = code == ES_OK ? (size_t)PQntuples(res[1]) : 0;
  /* room for every session asked: those without a row are listed absent */
  if (code == ES_OK && ((ne && (!(a->ev = calloc(ne, sizeof *a->ev)) ||
                                !(a->ev_live = calloc(ne, 1)))) ||
                        !(a->si = calloc(n > ns ? n : ns, sizeof *a->si)) ||
                        !(a->si_dirty = calloc(n > ns ? n : ns, 1)) ||
                        !(a->si_absent = calloc(n > ns ? n : ns, 1)) ||
                        (n_ids && !(a->absent = calloc(n_ids, sizeof *a->absent)))))
    code = pg_oom(err);
  for (size_t i = 0; code == ES_OK && i < ne; i++, a->n_ev++) {
    if (pg_decode_event(res[0], (int)i, 1, &a->ev[i]) != ES_OK) code = pg_oom(err);
    else a->ev_live[i] = 1;
  }
  for (size_t i = 0; code == ES_OK && i < ns; i++, a->n_si++)
    if (pg_decode_session(res[1], (int)i, 1, &a->si[i]) != ES_OK) code = pg_oom(err);
  for (size_t i = 0; code == ES_OK && i < n; i++) {
    if (pg_ahead_session(t, sessions[i])) continue; /* read, or listed absent already */
    es_session_info_init(&a->si[a->n_si]);
    if (!(a->si[a->n_si].session = strdup(sessions[i]))) code = pg_oom(err);
    else a->si_absent[a->n_si++] = 1;
  }
  /* an absent row's fence is its name's floor (pg_fence_floor_get) */
  for (int r = 0; code == ES_OK && r < PQntuples(res[3]); r++)
    for (size_t i = 0; i < a->n_si; i++)
      if (a->si_absent[i] && strcmp(a->si[i].session, PQgetvalue(res[3], r, 0)) == 0)
        a->si[i].fence = pg_int(res[3], r, 1);
  /* the ids no row has (a few: n_ids x the rows found) */
  for (size_t i = 0; code == ES_OK && i < n_ids; i++) {
    int stored = 0;
    for (int r = 0; !stored && r < PQntuples(res[2]); r++) stored = !strcmp(PQgetvalue(res[2], r, 0), ids[i]);
    /* once, however many completions name it: the insert forgets it */
    if (!stored && !pg_ahead_absent(t, ids[i]) && !(a->absent[a->n_absent++] = strdup(ids[i])))
      code = pg_oom(err);
  }
  for (int i = 0; i < 4; i++) PQclear(res[i]);
  free(s_arr);
  free(i_arr.p);
  free(id_arr);
  if (code != ES_OK) pg_ahead_drop(t);
  return code;
}

/* The single-row INSERT's parameters (EV_COLS's order, key, revision and
 * meta as $30..$32). */
static void pg_insert_params(pg_params *p, const es_event *row) {
  pp_int(p, row->position);
  pp_str(p, row->session);
  pp_int(p, row->index);
  pp_str(p, row->id);
  pp_str(p, row->type);
  pp_bytes(p, row->payload, row->payload_len); /* checked <= INT_MAX by pg_event_insert */
  pp_str(p, row->lane);
  pp_opt(p, row->created_at);
  pp_opt(p, row->cause_index);
  pp_opt(p, row->cause_attempt);
  pp_opt(p, row->not_before);
  pp_int(p, row->status);
  pp_opt(p, row->attempts);
  pp_opt(p, row->failures);
  pp_str(p, row->last_error);
  pp_opt(p, row->processed_at);
  pp_str(p, row->claim_holder);
  pp_opt(p, row->claim_expires_at);
  pp_opt(p, row->retry_at);
  pp_int(p, row->queued);
  pp_opt(p, row->due_at);
  pp_opt(p, row->last_failed_attempt);
  pp_opt(p, row->returned);
  pp_str(p, row->origin_session);
  pp_opt(p, row->origin_index);
  pp_opt(p, row->first_claimed_at);
  pp_opt(p, row->last_claimed_at);
  pp_opt(p, row->failed_at);
  pp_opt(p, row->processed_by_attempt);
  pp_str(p, row->key);
  pp_int(p, row->revision);
  pp_str(p, row->meta);
}

/* Adds a row (its position set) to the column arrays; -1: out of memory. */
static int pg_ins_add(es_txn *t, const es_event *row) {
  pg_buf *c = t->ins;
  return pg_buf_int(&c[0], row->position) || pg_buf_str(&c[1], row->session) ||
                 pg_buf_int(&c[2], row->index) || pg_buf_str(&c[3], row->id) ||
                 pg_buf_str(&c[4], row->type) ||
                 pg_buf_elem(&c[5], row->payload, row->payload_len, 1) ||
                 pg_buf_str(&c[6], row->lane) || pg_buf_int(&c[7], row->created_at) ||
                 pg_buf_int(&c[8], row->cause_index) || pg_buf_int(&c[9], row->cause_attempt) ||
                 pg_buf_int(&c[10], row->not_before) || pg_buf_int(&c[11], row->status) ||
                 pg_buf_int(&c[12], row->attempts) || pg_buf_int(&c[13], row->failures) ||
                 pg_buf_str(&c[14], row->last_error) || pg_buf_int(&c[15], row->processed_at) ||
                 pg_buf_str(&c[16], row->claim_holder) ||
                 pg_buf_int(&c[17], row->claim_expires_at) || pg_buf_int(&c[18], row->retry_at) ||
                 pg_buf_int(&c[19], row->queued) || pg_buf_int(&c[20], row->due_at) ||
                 pg_buf_int(&c[21], row->last_failed_attempt) ||
                 pg_buf_int(&c[22], row->returned) || pg_buf_str(&c[23], row->origin_session) ||
                 pg_buf_int(&c[24], row->origin_index) ||
                 pg_buf_int(&c[25], row->first_claimed_at) ||
                 pg_buf_int(&c[26], row->last_claimed_at) || pg_buf_int(&c[27], row->failed_at) ||
                 pg_buf_int(&c[28], row->processed_by_attempt) || pg_buf_str(&c[29], row->key) ||
                 pg_buf_int(&c[30], row->revision) || pg_buf_str(&c[31], row->meta)
             ? -1
             : 0;
}

/* PostgreSQL takes no protocol message and no field value of 1 GiB or
 * more (MaxAllocSize); a buffered INSERT sends up to PG_INS_MAX_BYTES of
 * other rows in the same message, and each row its other columns. */
static size_t pg_max_payload(es_backend *b) {
  (void)b;
  return ((size_t)1 << 30) - 2 * PG_INS_MAX_BYTES - ((size_t)1 << 20);
}

/* Buffers the row (pg_ins_flush sends it): the first row is kept as is
 * (sent alone, it is the single-row INSERT, cheaper for the server than
 * unnest of one element); from the second on, the rows go into the
 * column arrays. */
static int pg_event_insert(es_backend *b, es_txn *t, es_event *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code;
  if (!t->write) return es_fail(err, ES_STORAGE, "postgres: a write inside a read transaction");
  if (row->payload_len > INT_MAX) return es_fail(err, ES_TOO_LARGE, "postgres: payload too large");
  if ((code = pg_positions(t, err)) != ES_OK) return code;
  if (!t->ins && !(t->ins = calloc(PG_INS_COLS, sizeof *t->ins))) return pg_oom(err);
  /* Measured (bench/README.md "Appends of a group in one savepoint"): a
   * group's appends of one row each to different sessions ran at half the
   * rate as one unnest INSERT of their rows than as single-row INSERTs */
  if (t->ins_n && t->ahead && t->ahead->per_session && strcmp(t->ins_first.session, row->session) &&
      (code = pg_ins_flush(t, err)) != ES_OK)
    return code;
  int64_t position = row->position;
  row->position = t->next_position;
  int bad;
  if (t->ins_n == 0) bad = es_event_copy(&t->ins_first, row) != ES_OK;
  else bad = (t->ins_n == 1 && pg_ins_add(t, &t->ins_first)) || pg_ins_add(t, row);
  if (bad) {
    row->position = position;
    /* a row half in the arrays cannot be sent: the transaction is lost */
    pg_ins_discard(t);
    pg_txn_break(t, "out of memory");
    return pg_oom(err);
  }
  char **absent = row->id ? pg_ahead_absent(t, row->id) : NULL;
  if (absent) { /* stored now (listed once: pg_read_ahead) */
    free(*absent);
    *absent = NULL;
  }
  t->ins_n++;
  t->ins_bytes += row->payload_len + 64;
  t->next_position++;
  if (t->ins_n >= PG_INS_MAX_ROWS || t->ins_bytes >= PG_INS_MAX_BYTES) return pg_ins_flush(t, err);
  return ES_OK;
}

#define PG_COPY_CHUNK 4096 /* rows per INSERT ... SELECT of a fork */

/* fork's bulk copy: the rows never leave the server; the ids come from
 * new_id, sent as one text[] per chunk (bounded memory whatever `through`). */
static int pg_event_copy(es_backend *b, es_txn *t, const char *from, int64_t through,
                         const char *to, int64_t processed_at, es_id_fn new_id, void *id_ctx,
                         int64_t *copied, es_err *err) {
  (void)b; /* t carries it (t->b) */
  char id[ES_MAX_NAME_BYTES + 1];
  *copied = 0;
  if (!t->write) return es_fail(err, ES_STORAGE, "postgres: a write inside a read transaction");
  int code = pg_ahead_end(t, err); /* ids are stored without pg_event_insert */
  if (code == ES_OK) code = pg_positions(t, err);
  if (code != ES_OK) return code;
  int64_t base = t->next_position;
  char *arr = NULL;
  size_t cap = 0;
  for (int64_t lo = 1; code == ES_OK && lo <= through; lo += PG_COPY_CHUNK) {
    int64_t n = through - lo + 1 < PG_COPY_CHUNK ? through - lo + 1 : PG_COPY_CHUNK;
    size_t len = 0;
    /* {"id","id",...}: each id quoted, its '"' and '\' escaped */
    for (int64_t i = 0; i < n; i++) {
      if ((code = new_id(id_ctx, id, sizeof id, err)) != ES_OK) break;
      size_t need = len + 2 * strlen(id) + 4;
      if (need + 2 > cap) {
        size_t ncap = cap ? cap * 2 : 64 * 1024;
        while (ncap < need + 2) ncap *= 2;
        char *na = realloc(arr, ncap);
        if (!na) {
          code = pg_oom(err);
          break;
        }
        arr = na;
        cap = ncap;
      }
      arr[len++] = i == 0 ? '{' : ',';
      arr[len++] = '"';
      for (const char *c = id; *c; c++) {
        if (*c == '"' || *c == '\\') arr[len++] = '\\';
        arr[len++] = *c;
      }
      arr[len++] = '"';
    }
    if (code != ES_OK) break;
    arr[len++] = '}';
    arr[len] = '\0';
    pg_params p = {0};
    int64_t changed = 0;
    pp_int(&p, base);
    pp_str(&p, to);
    pp_int(&p, processed_at);
    pp_str(&p, from);
    pp_int(&p, lo);
    pp_str(&p, arr);
    pp_int(&p, n);
    code = pg_write(t, ST_EVENT_COPY, &p, &changed, err);
    *copied += changed;
  }
  free(arr);
  if (code != ES_OK) return code;
  t->next_position += through;
  return ES_OK;
}

static int pg_event_update(es_backend *b, es_txn *t, const es_event *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int64_t changed = 0;
  pg_ahead_event(t, row->session, row->index, NULL); /* read again from now on */
  pp_str(&p, row->session);
  pp_int(&p, row->index);
  pp_int(&p, row->status);
  pp_opt(&p, row->attempts);
  pp_opt(&p, row->failures);
  pp_str(&p, row->last_error);
  pp_opt(&p, row->processed_at);
  pp_str(&p, row->claim_holder);
  pp_opt(&p, row->claim_expires_at);
  pp_opt(&p, row->retry_at);
  pp_int(&p, row->queued);
  pp_opt(&p, row->due_at);
  pp_opt(&p, row->last_failed_attempt);
  pp_opt(&p, row->returned);
  pp_opt(&p, row->first_claimed_at);
  pp_opt(&p, row->last_claimed_at);
  pp_opt(&p, row->failed_at);
  pp_opt(&p, row->processed_by_attempt);
  /* In a write or claim transaction the core read the row locked just
   * before: the update is sent without waiting, and a row that is gone
   * anyway fails the sync (STORAGE). */
  if (t->write) {
    /* A row older than every row buffered for insertion (positions are
     * handed out in order) is not among them: its update need not wait
     * for them, and a batch of completions inserts its results at once. */
    int older = row->position > 0 && row->position < t->next_position - t->ins_n;
    return pg_send_keep(t, ST_EVENT_UPDATE, &p, PEND_CHANGED, t->ins_n && older, err);
  }
  int code = pg_write(t, ST_EVENT_UPDATE, &p, &changed, err);
  if (code != ES_OK) return code;
  return changed > 0 ? ES_OK : ES_NOT_FOUND;
}

static int pg_event_range(es_backend *b, es_txn *t, const char *session, int64_t after,
                          int64_t through, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  pp_int(&p, after == ES_NONE ? 0 : after);
  pp_int(&p, through == ES_NONE ? INT64_MAX : through);
  pp_limit(&p, limit);
  return pg_iterate(t, ST_EVENT_RANGE, &p, ROW_EVENT, (pg_fn)cb, ctx, err);
}

static int pg_event_all(es_backend *b, es_txn *t, const char *scope, int64_t after, int64_t limit,
                        es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int code;
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  pp_int(&p, after == ES_NONE ? 0 : after);
  pp_limit(&p, limit);
  if (scope) pp_str(&p, scope); /* the scope itself: events_scope's key */
  return pg_iterate(t, scope ? ST_EVENT_ALL_SCOPED : ST_EVENT_ALL, &p, ROW_EVENT, (pg_fn)cb, ctx,
                    err);
}

/* §3.12: one row of `counts` (schema version 2); no row: all zero. */
static int pg_counts(es_backend *b, es_txn *t, const char *scope, es_counts *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  memset(out, 0, sizeof *out);
  pp_str(&p, scope ? scope : "");
  int code = pg_run(t, ST_COUNTS, &p, &res, err);
  if (code != ES_OK) return code;
  if (PQntuples(res) > 0) {
    out->sessions = pg_int(res, 0, 0);
    out->events = pg_int(res, 0, 1);
    out->pending = pg_int(res, 0, 2);
    out->dead = pg_int(res, 0, 3);
  }
  PQclear(res);
  return ES_OK;
}

static int pg_last_position(es_backend *b, es_txn *t, int64_t *position, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t v;
  int code = pg_one_int(t, ST_MAX_POSITION, NULL, &v, err);
  *position = code == ES_OK && v != ES_NONE ? v : 0;
  return code;
}

static int pg_lane_next(es_backend *b, es_txn *t, const char *session, const char *lane,
                        int64_t after, int64_t *index, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int64_t v;
  pp_str(&p, session);
  pp_str(&p, lane);
  pp_int(&p, after == ES_NONE ? 0 : after);
  int code = pg_one_int(t, ST_LANE_NEXT, &p, &v, err);
  *index = code == ES_OK && v != ES_NONE ? v : 0;
  return code;
}

static int pg_queued_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                         int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int code;
  if (session) {
    /* claim() (one session) under the store's lock: FOR UPDATE waits for a
     * claim transaction holding one of these rows, then re-checks the
     * WHERE on the committed row, so it never hands out a row claim_next
     * just claimed. */
    if ((code = pg_claim_may_wait(t, err)) != ES_OK) return code;
    pp_str(&p, session);
    pp_int(&p, now);
    pp_limit(&p, limit);
    return pg_iterate(t, t->write ? ST_QUEUED_DUE_SESSION_LOCK : ST_QUEUED_DUE_SESSION, &p,
                      ROW_EVENT, (pg_fn)cb, ctx, err);
  }
  pg_scope_end end;
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  pp_int(&p, now);
  pp_limit(&p, limit);
  if (scope) pp_scope(&p, scope, end.v);
  if (t->claim) {
    pp_str(&p, t->skip);
    return pg_iterate(t, scope ? ST_CLAIM_DUE_ALL_SCOPED : ST_CLAIM_DUE_ALL, &p, ROW_EVENT,
                      (pg_fn)cb, ctx, err);
  }
  return pg_iterate(t, scope ? ST_QUEUED_DUE_ALL_SCOPED : ST_QUEUED_DUE_ALL, &p, ROW_EVENT,
                    (pg_fn)cb, ctx, err);
}

static int pg_queued_next_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                              int64_t now, int64_t *due, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pg_scope_end end;
  int code, id;
  *due = ES_NONE;
  if (session) {
    id = ST_QUEUED_NEXT_SESSION;
    pp_str(&p, session);
    pp_int(&p, now);
  } else {
    if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
    id = scope ? ST_QUEUED_NEXT_ALL_SCOPED : ST_QUEUED_NEXT_ALL;
    pp_int(&p, now);
    if (scope) pp_scope(&p, scope, end.v);
  }
  return pg_one_int(t, id, &p, due, err);
}

static int pg_queued_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                              int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pg_scope_end end;
  int code;
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  pp_str(&p, type);
  pp_int(&p, now);
  pp_limit(&p, limit);
  if (scope) pp_scope(&p, scope, end.v);
  if (t->claim) {
    pp_str(&p, t->skip);
    return pg_iterate(t, scope ? ST_CLAIM_DUE_TYPE_SCOPED : ST_CLAIM_DUE_TYPE, &p, ROW_EVENT,
                      (pg_fn)cb, ctx, err);
  }
  return pg_iterate(t, scope ? ST_QUEUED_DUE_TYPE_SCOPED : ST_QUEUED_DUE_TYPE, &p, ROW_EVENT,
                    (pg_fn)cb, ctx, err);
}

static int pg_queued_next_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                                   int64_t now, int64_t *due, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pg_scope_end end;
  int code;
  *due = ES_NONE;
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  pp_str(&p, type);
  pp_int(&p, now);
  if (scope) pp_scope(&p, scope, end.v);
  return pg_one_int(t, scope ? ST_QUEUED_NEXT_TYPE_SCOPED : ST_QUEUED_NEXT_TYPE, &p, due, err);
}

/* claim_next's scan and its next due time in one round trip (sent with
 * the claim transaction's begin): the same statements as queued_due /
 * queued_due_type and queued_next_due / queued_next_due_type in a claim
 * transaction. */
static int pg_claim_ready(es_backend *b, es_txn *t, const char *scope, const char *type,
                          int64_t now, int64_t limit, es_event_cb cb, void *ctx, int64_t *next_due,
                          es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0}, q = {0};
  pg_scope_end end, end2;
  PGresult *res[2];
  int code;
  *next_due = ES_NONE;
  if (!t->claim) return es_fail(err, ES_STORAGE, "postgres: claim_ready outside a claim transaction");
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  if (type) {
    pp_str(&p, type);
    pp_str(&q, type);
  }
  pp_int(&p, now);
  pp_limit(&p, limit);
  if (scope) pp_scope(&p, scope, end.v);
  pp_str(&p, t->skip);
  pp_int(&q, now);
  if (scope) pp_scope(&q, scope, end2.v);
  int scan = type ? (scope ? ST_CLAIM_DUE_TYPE_SCOPED : ST_CLAIM_DUE_TYPE)
                  : (scope ? ST_CLAIM_DUE_ALL_SCOPED : ST_CLAIM_DUE_ALL);
  int next = type ? (scope ? ST_QUEUED_NEXT_TYPE_SCOPED : ST_QUEUED_NEXT_TYPE)
                  : (scope ? ST_QUEUED_NEXT_ALL_SCOPED : ST_QUEUED_NEXT_ALL);
  if ((code = pg_send(t, scan, &p, PEND_WANT, err)) != ES_OK) return code;
  if ((code = pg_send(t, next, &q, PEND_WANT, err)) != ES_OK) return code;
  if ((code = pg_sync_n(t, res, 2, err)) != ES_OK) return code;
  if (!res[0] || !res[1]) {
    PQclear(res[0]);
    PQclear(res[1]);
    return es_fail(err, ES_STORAGE, "postgres %s: claim: no answer", t->b->schema);
  }
  if (PQntuples(res[1]) > 0) *next_due = pg_opt(res[1], 0, 0);
  PQclear(res[1]);
  int n = PQntuples(res[0]);
  for (int i = 0; i < n; i++) {
    pg_row r;
    if (pg_decode(ROW_EVENT, res[0], i, 0, &r) != ES_OK) {
      code = pg_oom(err);
      break;
    }
    if (pg_call(ROW_EVENT, (pg_fn)cb, ctx, &r)) break;
  }
  PQclear(res[0]);
  return code;
}

/* claim_next's count on a session row: one UPDATE, sent without waiting
 * (it locks the row, waiting at most lock_timeout: pg_claim_may_wait
 * first). */
static int pg_session_claimed(es_backend *b, es_txn *t, const char *session, int64_t n, int64_t now,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int code;
  if (!t->claim) return es_fail(err, ES_STORAGE, "postgres: session_claimed outside a claim transaction");
  if ((code = pg_claim_may_wait(t, err)) != ES_OK) return code;
  pp_str(&p, session);
  pp_int(&p, n);
  pp_int(&p, now);
  return pg_send(t, ST_SESSION_CLAIMED, &p, PEND_CHANGED, err);
}

static int pg_pending_types(es_backend *b, es_txn *t, const char *scope, es_type_count_cb cb,
                            void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pg_scope_end end;
  PGresult *res;
  int code;
  if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
  if (scope) pp_scope(&p, scope, end.v);
  if ((code = pg_run(t, scope ? ST_PENDING_TYPES_SCOPED : ST_PENDING_TYPES, &p, &res, err)) != ES_OK)
    return code;
  int n = PQntuples(res);
  for (int i = 0; i < n; i++)
    if (cb(ctx, PQgetvalue(res, i, 0), pg_int(res, i, 1))) break;
  PQclear(res);
  return ES_OK;
}

static int pg_dead_list(es_backend *b, es_txn *t, const char *session, const char *scope,
                        int64_t after, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pg_scope_end end;
  int code, id;
  if (session) {
    id = ST_DEAD_SESSION;
    pp_str(&p, session);
    pp_int(&p, after == ES_NONE ? 0 : after);
    pp_limit(&p, limit);
  } else {
    if ((code = pg_scope_ok(scope, err)) != ES_OK) return code;
    id = scope ? ST_DEAD_ALL_SCOPED : ST_DEAD_ALL;
    pp_int(&p, after == ES_NONE ? 0 : after);
    pp_limit(&p, limit);
    if (scope) pp_scope(&p, scope, end.v);
  }
  return pg_iterate(t, id, &p, ROW_EVENT, (pg_fn)cb, ctx, err);
}

/* ---- snapshots ------------------------------------------------------------ */

static int pg_snapshot_get(es_backend *b, es_txn *t, const char *session, const char *reducer,
                           es_snapshot *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  pp_str(&p, reducer);
  return pg_get_one(t, ST_SNAPSHOT_GET, &p, ROW_SNAPSHOT, out, err);
}

static int pg_snapshot_put(es_backend *b, es_txn *t, const char *session, const es_snapshot *row,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  pp_str(&p, row->reducer);
  pp_int(&p, row->index);
  if (pp_bytes(&p, row->state, row->state_len))
    return es_fail(err, ES_TOO_LARGE, "postgres: snapshot state too large");
  pp_str(&p, row->version);
  pp_opt(&p, row->updated_at);
  return pg_write(t, ST_SNAPSHOT_PUT, &p, NULL, err);
}

static int pg_snapshot_list(es_backend *b, es_txn *t, const char *session, es_snapshot_cb cb,
                            void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  return pg_iterate(t, ST_SNAPSHOT_LIST, &p, ROW_SNAPSHOT, (pg_fn)cb, ctx, err);
}

/* ---- projections (§8) ------------------------------------------------------ */

static int pg_proj_get(es_backend *b, es_txn *t, const char *ns, const char *key, char **value,
                       size_t *len, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  *value = NULL;
  *len = 0;
  pp_str(&p, ns);
  pp_bytes(&p, key, strlen(key));
  int code = pg_run(t, ST_PROJ_GET, &p, &res, err);
  if (code != ES_OK) return code;
  if (PQntuples(res) == 0) {
    code = ES_NOT_FOUND;
  } else {
    size_t n = (size_t)PQgetlength(res, 0, 0);
    char *v = malloc(n + 1);
    if (!v) {
      code = pg_oom(err);
    } else {
      memcpy(v, PQgetvalue(res, 0, 0), n);
      v[n] = 0;
      *value = v;
      *len = n;
    }
  }
  PQclear(res);
  return code;
}

static int pg_proj_put(es_backend *b, es_txn *t, const char *ns, const char *key, const char *value,
                       size_t len, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, ns);
  pp_bytes(&p, key, strlen(key));
  if (!value) return pg_write(t, ST_PROJ_DELETE, &p, NULL, err);
  if (pp_bytes(&p, len ? value : "", len))
    return es_fail(err, ES_TOO_LARGE, "postgres: projection state too large");
  return pg_write(t, ST_PROJ_PUT, &p, NULL, err);
}

static int pg_proj_list(es_backend *b, es_txn *t, const char *ns, const char *prefix,
                        const char *after, int64_t limit, es_proj_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  char *lower, *upper;
  size_t llen, ulen;
  if (es_proj_range(prefix, after, &lower, &llen, &upper, &ulen) != ES_OK) return pg_oom(err);
  pp_str(&p, ns);
  pp_bytes(&p, lower, llen);
  if (ulen) pp_bytes(&p, upper, ulen);
  pp_limit(&p, limit);
  int code = pg_run(t, ulen ? ST_PROJ_LIST : ST_PROJ_LIST_ALL, &p, &res, err);
  if (code == ES_OK) {
    int n = PQntuples(res);
    for (int i = 0; i < n && code == ES_OK; i++) {
      /* the key's bytes are not NUL-terminated in a binary result */
      size_t kl = (size_t)PQgetlength(res, i, 0);
      char *k = malloc(kl + 1);
      if (!k) {
        code = pg_oom(err);
        break;
      }
      memcpy(k, PQgetvalue(res, i, 0), kl);
      k[kl] = 0;
      int stop = cb(ctx, k, PQgetvalue(res, i, 1), (size_t)PQgetlength(res, i, 1));
      free(k);
      if (stop) break;
    }
    PQclear(res);
  }
  free(lower);
  free(upper);
  return code;
}

static int pg_proj_drop(es_backend *b, es_txn *t, const char *ns, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, ns);
  return pg_write(t, ST_PROJ_DROP, &p, NULL, err);
}

/* ---- refs ------------------------------------------------------------------ */

static int pg_ref_get(es_backend *b, es_txn *t, const char *name, es_ref *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, name);
  return pg_get_one(t, ST_REF_GET, &p, ROW_REF, out, err);
}

static int pg_ref_put(es_backend *b, es_txn *t, const es_ref *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, row->name);
  pp_str(&p, row->session);
  pp_opt(&p, row->created_at);
  pp_opt(&p, row->updated_at);
  return pg_write(t, ST_REF_PUT, &p, NULL, err);
}

static int pg_ref_delete(es_backend *b, es_txn *t, const char *name, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int64_t changed = 0;
  pp_str(&p, name);
  int code = pg_write(t, ST_REF_DELETE, &p, &changed, err);
  if (code != ES_OK) return code;
  return changed > 0 ? ES_OK : ES_NOT_FOUND;
}

static int pg_ref_list(es_backend *b, es_txn *t, const char *after, int64_t limit, es_ref_cb cb,
                       void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  if (after) pp_str(&p, after);
  pp_limit(&p, limit);
  return pg_iterate(t, after ? ST_REF_LIST_GT : ST_REF_LIST, &p, ROW_REF, (pg_fn)cb, ctx, err);
}

/* ---- presence ------------------------------------------------------------- */

static int pg_presence_get(es_backend *b, es_txn *t, const char *ns, const char *participant,
                           const char *field, es_presence_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, ns);
  pp_str(&p, participant);
  pp_str(&p, field);
  return pg_get_one(t, ST_PRESENCE_GET, &p, ROW_PRESENCE, out, err);
}

static int pg_presence_put(es_backend *b, es_txn *t, const char *ns, const es_presence_row *row,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, ns);
  pp_str(&p, row->participant);
  pp_str(&p, row->field);
  if (pp_bytes(&p, row->value, row->value_len))
    return es_fail(err, ES_TOO_LARGE, "postgres: presence value too large");
  pp_opt(&p, row->seen);
  pp_opt(&p, row->at);
  pp_opt(&p, row->expires_at);
  return pg_write(t, ST_PRESENCE_PUT, &p, NULL, err);
}

static int pg_presence_expire(es_backend *b, es_txn *t, const char *ns, int64_t now, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  if (!t->write) return ES_OK; /* allowed no-op: a read transaction never writes */
  pp_str(&p, ns);
  pp_int(&p, now);
  return pg_write(t, ST_PRESENCE_EXPIRE, &p, NULL, err);
}

static int pg_presence_list(es_backend *b, es_txn *t, const char *ns, int64_t now,
                            es_presence_cb_row cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, ns);
  pp_int(&p, now);
  return pg_iterate(t, ST_PRESENCE_LIST, &p, ROW_PRESENCE, (pg_fn)cb, ctx, err);
}

/* ---- retention (§3.9) -------------------------------------------------------- */

/* Runs a DELETE with session as $1 (and through as $2); *removed. */
static int pg_remove(es_txn *t, int id, const char *session, int64_t through, int64_t *removed,
                     es_err *err) {
  pg_params p = {0};
  int code = pg_ahead_end(t, err); /* rows go */
  if (code != ES_OK) return code;
  pp_str(&p, session);
  if (id == ST_EVENT_DELETE_RANGE || id == ST_SNAPSHOT_DELETE_FROM) pp_int(&p, through);
  *removed = 0;
  return pg_write(t, id, &p, removed, err);
}

/* Positions are not touched: next_position was loaded when the transaction
 * began, and the commit stores it as the high-water mark (see sqlite.c). */
static int pg_event_delete_range(es_backend *b, es_txn *t, const char *session, int64_t through,
                                 es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return pg_remove(t, ST_EVENT_DELETE_RANGE, session, through, &removed, err);
}

static int pg_session_delete(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  pg_pre_drop(t);
  int code = pg_remove(t, ST_SESSION_DELETE, session, 0, &removed, err);
  if (code != ES_OK) return code;
  return removed > 0 ? ES_OK : ES_NOT_FOUND;
}

/* §3.8: the floor of a session the transaction read ahead and found
 * absent was read with it (pg_read_ahead): no round trip in a group's
 * appends to new sessions. */
static int pg_fence_floor_get(es_backend *b, es_txn *t, const char *session, int64_t *token,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_ahead *a = t->ahead;
  for (size_t i = 0; a && i < a->n_si; i++)
    if (a->si_absent[i] && strcmp(a->si[i].session, session) == 0) {
      *token = a->si[i].fence;
      return ES_OK;
    }
  pg_params p = {0};
  PGresult *res;
  int code;
  *token = 0;
  pp_str(&p, session);
  if ((code = pg_run(t, ST_FLOOR_GET, &p, &res, err)) != ES_OK) return code;
  if (PQntuples(res) > 0) *token = pg_int(res, 0, 0);
  PQclear(res);
  return ES_OK;
}

static int pg_fence_floor_put(es_backend *b, es_txn *t, const char *session, int64_t token,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  pp_int(&p, token);
  return pg_write(t, ST_FLOOR_PUT, &p, NULL, err);
}

static int pg_snapshot_delete_all(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return pg_remove(t, ST_SNAPSHOT_DELETE_ALL, session, 0, &removed, err);
}

static int pg_ref_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return pg_remove(t, ST_REF_DELETE_SESSION, session, 0, &removed, err);
}

/* ---- archive (§3.9) -------------------------------------------------------- */

static int pg_segment_list(es_backend *b, es_txn *t, const char *session, es_segment_cb cb,
                           void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  int code;
  pp_str(&p, session);
  if ((code = pg_run(t, ST_SEGMENT_LIST, &p, &res, err)) != ES_OK) return code;
  int n = PQntuples(res);
  for (int i = 0; i < n; i++) {
    es_segment g;
    es_segment_init(&g);
    g.from = pg_int(res, i, 0);
    g.through = pg_int(res, i, 1);
    g.count = pg_int(res, i, 2);
    g.bytes = pg_int(res, i, 3);
    snprintf(g.checksum, sizeof g.checksum, "%s", PQgetvalue(res, i, 4));
    g.file = PQgetvalue(res, i, 5); /* borrowed for the callback */
    g.created_at = pg_opt(res, i, 6);
    if (cb(ctx, &g)) break;
  }
  PQclear(res);
  return ES_OK;
}

static int pg_segment_sessions(es_backend *b, es_txn *t, const char *prefix, const char *after,
                               int64_t limit,
                               int (*cb)(void *ctx, const char *session, int64_t through),
                               void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  int code;
  pp_str(&p, prefix ? prefix : "");
  pp_str(&p, after ? after : "");
  if (limit == ES_NONE) pp_null(&p);
  else pp_int(&p, limit);
  if ((code = pg_run(t, ST_SEGMENT_SESSIONS, &p, &res, err)) != ES_OK) return code;
  int n = PQntuples(res);
  for (int i = 0; i < n; i++)
    if (cb(ctx, PQgetvalue(res, i, 0), pg_int(res, i, 1))) break;
  PQclear(res);
  return ES_OK;
}

static int pg_segment_put(es_backend *b, es_txn *t, const char *session, const es_segment *row,
                          es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, session);
  pp_int(&p, row->from);
  pp_int(&p, row->through);
  pp_int(&p, row->count);
  pp_int(&p, row->bytes);
  pp_str(&p, row->checksum);
  pp_str(&p, row->file);
  pp_opt(&p, row->created_at);
  return pg_write(t, ST_SEGMENT_PUT, &p, NULL, err);
}

static int pg_segment_delete(es_backend *b, es_txn *t, const char *session, int64_t from,
                             es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  int64_t changed = 0;
  pp_str(&p, session);
  pp_int(&p, from);
  int code = pg_write(t, ST_SEGMENT_DELETE, &p, &changed, err);
  if (code != ES_OK) return code;
  return changed > 0 ? ES_OK : ES_NOT_FOUND;
}

/* ---- crypto-shredding (§3.10) ------------------------------------------- */

static int pg_key_get(es_backend *b, es_txn *t, const char *name, es_key_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  int code;
  memset(out, 0, sizeof *out);
  pp_str(&p, name);
  if ((code = pg_run(t, ST_KEY_GET, &p, &res, err)) != ES_OK) return code;
  if (PQntuples(res) == 0) {
    PQclear(res);
    return ES_NOT_FOUND;
  }
  out->created_at = pg_opt(res, 0, 2);
  out->shredded_at = pg_opt(res, 0, 3);
  out->name = strdup(name);
  int null = PQgetisnull(res, 0, 1);
  if (!null) {
    size_t wn = (size_t)PQgetlength(res, 0, 1);
    out->wrapped = malloc(wn ? wn : 1);
    if (out->wrapped && wn) memcpy(out->wrapped, PQgetvalue(res, 0, 1), wn);
    out->wrapped_len = wn;
  }
  PQclear(res);
  if (!out->name || (!null && !out->wrapped)) {
    es_key_row_destroy(out);
    return pg_oom(err);
  }
  return ES_OK;
}

/* A shred replaces the row: the old version is dead, and invisible to
 * every later transaction; pg_scrub vacuums it away (docs/postgres.md says
 * what that does and does not erase). */
static int pg_key_put(es_backend *b, es_txn *t, const es_key_row *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, row->name);
  if (pp_bytes(&p, row->wrapped, row->wrapped_len)) return es_fail(err, ES_TOO_LARGE, "postgres: key too large");
  pp_opt(&p, row->created_at);
  pp_opt(&p, row->shredded_at);
  return pg_write(t, ST_KEY_PUT, &p, NULL, err);
}

static int pg_key_use_put(es_backend *b, es_txn *t, const char *key, const char *session,
                          int64_t first_index, es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  pp_str(&p, key);
  pp_str(&p, session);
  pp_int(&p, first_index);
  return pg_write(t, ST_KEY_USE_PUT, &p, NULL, err);
}

static int pg_key_use_list(es_backend *b, es_txn *t, const char *key, es_key_use_cb cb, void *ctx,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  pg_params p = {0};
  PGresult *res;
  int code;
  pp_str(&p, key);
  if ((code = pg_run(t, ST_KEY_USE_LIST, &p, &res, err)) != ES_OK) return code;
  int n = PQntuples(res);
  for (int i = 0; i < n; i++)
    if (cb(ctx, PQgetvalue(res, i, 0), pg_int(res, i, 1))) break;
  PQclear(res);
  return ES_OK;
}

static int pg_key_use_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return pg_remove(t, ST_KEY_USE_DELETE_SESSION, session, 0, &removed, err);
}

static int pg_snapshot_delete_from(es_backend *b, es_txn *t, const char *session, int64_t index,
                                   es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return pg_remove(t, ST_SNAPSHOT_DELETE_FROM, session, index, &removed, err);
}

/* After a shred committed: VACUUM removes the dead versions of the keys
 * and snapshots rows the shred replaced or deleted (once no transaction
 * can still see them), so their bytes are no longer reachable through the
 * table. It cannot reach the server's write-ahead log or base backups
 * (docs/postgres.md). */
static int pg_scrub(es_backend *b, es_err *err) {
  int code = pg_conn_ready(b, &b->w, err);
  if (code != ES_OK) return code;
  return pg_simple(&b->w, "VACUUM keys, snapshots", "vacuum after shred", err);
}

/* ---- data version and waits ------------------------------------------------ */

/* Wakes the thread in poll() (if any) and the threads waiting for it. Called
 * with watch_mu held, after notes or closing changed. */
static void pg_watch_changed(es_backend *b) {
  pthread_cond_broadcast(&b->watch_cv);
  if (b->polling) {
    char one = 1;
    ssize_t w = write(b->kick[1], &one, 1); /* a full pipe is a pending wake already */
    (void)w;
  }
}

/* Counts the NOTIFYs every write commit sends on the store's channel (the
 * watch connection LISTENs on it); a reconnect counts as a change too, as
 * commits may have been missed meanwhile, and so does the first connect
 * (made here, not at open): a spurious wake, never a missed one. Never
 * blocks on anything but that connect. Called with watch_mu held. */
static int pg_watch_consume(es_backend *b, es_err *err) {
  int code = ES_OK;
  uint64_t before = b->notes;
  if (!b->watch.db || PQstatus(b->watch.db) != CONNECTION_OK) {
    code = pg_watch_connect(b, err);
    b->notes++;
    b->foreign++;
  }
  if (code == ES_OK) {
    if (!PQconsumeInput(b->watch.db)) {
      /* Notifications may have been lost with the connection: a change.
       * An idle watch connection the server dropped (a restart,
       * pg_terminate_backend) is found here, not by a call that failed:
       * reconnect now, as the other connections do before a call, rather
       * than fail a wait that has done nothing yet. */
      b->notes++;
      b->foreign++;
      code = PQstatus(b->watch.db) == CONNECTION_BAD
                 ? pg_watch_connect(b, err)
                 : pg_fail_msg(err, b, "data_version", PQerrorMessage(b->watch.db));
    } else {
      PGnotify *n;
      while ((n = PQnotifies(b->watch.db)) != NULL) {
        b->notes++;
        /* a NOTIFY of w (a commit of this handle) is not foreign; one of
         * w's earlier process (before a reconnect) counts, spuriously */
        if (n->be_pid != atomic_load(&b->own_pid)) b->foreign++;
        PQfreemem(n);
      }
    }
  }
  if (b->notes != before) pg_watch_changed(b);
  return code;
}

static int pg_data_version(es_backend *b, uint64_t *version, es_err *err) {
  pthread_mutex_lock(&b->watch_mu);
  int code = pg_watch_consume(b, err);
  *version = b->notes;
  pthread_mutex_unlock(&b->watch_mu);
  return code;
}

static int pg_ext_version(es_backend *b, uint64_t *version, es_err *err) {
  pthread_mutex_lock(&b->watch_mu);
  int code = pg_watch_consume(b, err);
  *version = b->foreign;
  pthread_mutex_unlock(&b->watch_mu);
  return code;
}

/* Blocks until ext_version differs from since, timeout_ms passed, or
 * wake() was called: one thread at a time poll()s the watch connection's
 * socket together with the kick pipe (no sleep loop: a NOTIFY wakes it as
 * it arrives); the others wait on watch_cv for what it finds. */
static int pg_wait_change(es_backend *b, uint64_t since, int64_t timeout_ms, es_err *err) {
  int64_t deadline = pg_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  int code = ES_OK;
  pthread_mutex_lock(&b->watch_mu);
  uint64_t kicks = b->kicks;
  for (;;) {
    if ((code = pg_watch_consume(b, err)) != ES_OK) break;
    if (b->foreign != since || b->closing || b->kicks != kicks) break;
    int64_t left = deadline - pg_now_ms();
    if (left <= 0) break;
    if (!b->polling) {
      struct pollfd fds[2] = {{PQsocket(b->watch.db), POLLIN, 0}, {b->kick[0], POLLIN, 0}};
      b->polling = 1;
      pthread_mutex_unlock(&b->watch_mu);
      int r = poll(fds, 2, left > INT_MAX ? INT_MAX : (int)left);
      /* kept before the drain below: its read ends with EAGAIN, which
       * would turn a signal's EINTR into a failed wait */
      int poll_errno = errno;
      char buf[64];
      while (read(b->kick[0], buf, sizeof buf) > 0) {
      }
      pthread_mutex_lock(&b->watch_mu);
      b->polling = 0;
      pthread_cond_broadcast(&b->watch_cv); /* someone else may poll now */
      if (r < 0 && poll_errno != EINTR) {
        code = es_fail(err, ES_STORAGE, "postgres %s: wait: poll: %s", b->schema, strerror(poll_errno));
        break;
      }
    } else {
      struct timespec until = es_timespec_in(CLOCK_MONOTONIC, left);
      pthread_cond_clockwait(&b->watch_cv, &b->watch_mu, CLOCK_MONOTONIC, &until);
    }
  }
  pthread_mutex_unlock(&b->watch_mu);
  return code;
}

/* The wait_change calls in progress return now. */
static void pg_kick(es_backend *b) {
  pthread_mutex_lock(&b->watch_mu);
  b->kicks++;
  pg_watch_changed(b);
  pthread_mutex_unlock(&b->watch_mu);
}

/* close() is coming: every wait_change returns now, and at once from now
 * on. */
static void pg_wake(es_backend *b) {
  pthread_mutex_lock(&b->watch_mu);
  b->closing = 1;
  pg_watch_changed(b);
  pthread_mutex_unlock(&b->watch_mu);
}

/* ---- the ops table ---------------------------------------------------------- */

#define PG_OPS(name, scheme_)                                   \
  const es_backend_ops name = {                                 \
      .scheme = scheme_,                                        \
      .group_commit = 1,                                        \
      .open = pg_open,                                          \
      .close = pg_close,                                        \
      .write_begin = pg_write_begin,                            \
      .write_commit = pg_write_commit,                          \
      .write_rollback = pg_write_rollback,                      \
      .savepoint = pg_savepoint,                                \
      .savepoint_release = pg_savepoint_release,                \
      .savepoint_rollback = pg_savepoint_rollback,              \
      .read_begin = pg_read_begin,                              \
      .read_end = pg_read_end,                                  \
      .session_get = pg_session_get,                            \
      .session_put = pg_session_put,                            \
      .session_list = pg_session_list,                          \
      .session_children = pg_session_children,                  \
      .event_get = pg_event_get,                                \
      .event_get_by_id = pg_event_get_by_id,                    \
      .event_insert = pg_event_insert,                          \
      .event_copy = pg_event_copy,                              \
      .event_update = pg_event_update,                          \
      .event_range = pg_event_range,                            \
      .event_all = pg_event_all,                                \
      .last_position = pg_last_position,                        \
      .lane_next = pg_lane_next,                                \
      .queued_due = pg_queued_due,                              \
      .queued_next_due = pg_queued_next_due,                    \
      .queued_due_type = pg_queued_due_type,                    \
      .queued_next_due_type = pg_queued_next_due_type,          \
      .pending_types = pg_pending_types,                        \
      .dead_list = pg_dead_list,                                \
      .snapshot_get = pg_snapshot_get,                          \
      .snapshot_put = pg_snapshot_put,                          \
      .snapshot_list = pg_snapshot_list,                        \
      .ref_get = pg_ref_get,                                    \
      .ref_put = pg_ref_put,                                    \
      .ref_delete = pg_ref_delete,                              \
      .ref_list = pg_ref_list,                                  \
      .presence_get = pg_presence_get,                          \
      .presence_put = pg_presence_put,                          \
      .presence_expire = pg_presence_expire,                    \
      .presence_list = pg_presence_list,                        \
      .event_delete_range = pg_event_delete_range,              \
      .session_delete = pg_session_delete,                      \
      .fence_floor_get = pg_fence_floor_get,                    \
      .fence_floor_put = pg_fence_floor_put,                    \
      .snapshot_delete_all = pg_snapshot_delete_all,            \
      .ref_delete_session = pg_ref_delete_session,              \
      .segment_list = pg_segment_list,                          \
      .segment_sessions = pg_segment_sessions,                  \
      .segment_put = pg_segment_put,                            \
      .segment_delete = pg_segment_delete,                      \
      .key_get = pg_key_get,                                    \
      .key_put = pg_key_put,                                    \
      .key_use_put = pg_key_use_put,                            \
      .key_use_list = pg_key_use_list,                          \
      .key_use_delete_session = pg_key_use_delete_session,      \
      .snapshot_delete_from = pg_snapshot_delete_from,          \
      .proj_get = pg_proj_get,                                  \
      .proj_put = pg_proj_put,                                  \
      .proj_list = pg_proj_list,                                \
      .proj_drop = pg_proj_drop,                                \
      .scrub = pg_scrub,                                        \
      .data_version = pg_data_version,                          \
      .claim_begin = pg_claim_begin,                            \
      .claim_retry = pg_claim_retry,                            \
      .wait_change = pg_wait_change,                            \
      .ext_version = pg_ext_version,                            \
      .kick = pg_kick,                                          \
      .wake = pg_wake,                                          \
      .release_commit = pg_release_commit,                      \
      .claim_ready = pg_claim_ready,                            \
      .session_claimed = pg_session_claimed,                    \
      .claim_commit = pg_claim_commit,                          \
      .read_ahead = pg_read_ahead,                              \
      .counts = pg_counts,                                      \
      .max_payload = pg_max_payload,                            \
  }

/* Both URI schemes libpq accepts. */
PG_OPS(es_backend_postgres, "postgres");
PG_OPS(es_backend_postgresql, "postgresql");
