/*
 * backends/sqlite.c: the SQLite backend (`sqlite:PATH[?options]`), the durable
 * embedded default. It stores and finds rows (backend.h); every rule lives in
 * the core store (core/store/). docs/sqlite.md describes the schema, the durability modes and what
 * each can lose, multi-process use, versioning and the error mapping, files
 * that are not ours, read-only media and full disks.
 *
 * One file, though long: every op shares this file's connection pools,
 * prepared-statement cache and row codec, all static; its sections follow
 * backend.h's order, so an op is found where the interface declares it.
 *
 * Open never writes a file before judging it an eventstore database
 * (sq_check_header, sq_prejudge, sq_schema_read): another application's
 * file is refused and left exactly as it was. mode=ro falls back to
 * SQLite's immutable=1 where no -shm can be created (sq_open,
 * sq_immutable_changed). After a full disk each write first tries to give
 * the WAL's space back (sq_reclaim_wal).
 *
 * Connections (all on one file, WAL mode):
 *   - one write connection: write transactions (BEGIN IMMEDIATE, so several
 *     processes on one file serialise on the write lock instead of failing),
 *     savepoints, and the schema check / migration at open;
 *   - a pool of read connections (grown on demand up to `readers`): each read
 *     transaction is a deferred BEGIN ... COMMIT on one of them, so reads see
 *     only committed data and run while a write transaction is open;
 *   - one "watch" connection answering data_version (PRAGMA data_version
 *     changes when any other connection, in any process, commits);
 *   - read-write handles: one checkpointer connection, used only by the
 *     handle's checkpointer thread (sq_ckpt_main), which copies the WAL
 *     into the main file off the commit path (see "Checkpoints" below).
 * Every statement is prepared once per connection (SQLITE_PREPARE_PERSISTENT)
 * and reused; a statement needed again while it is still being stepped (a
 * callback calling back into the backend) gets a temporary one instead.
 *
 * Positions: assigned by this file from a counter loaded when a write
 * transaction begins (max of the stored high-water mark and max(position)+1)
 * and saved with the commit of a transaction that removed rows, so a
 * position is never handed out twice even if the newest rows are deleted
 * one day (retention); rows of a rolled-back
 * savepoint give their positions back (they were never visible). SQLite
 * serialises writers (one write lock per file), so positions grow in commit
 * order across threads and processes.
 *
 * Space (retention, §3.9): files created since schema version 5 are in
 * auto_vacuum=INCREMENTAL mode (set before the WAL switch writes the first
 * page: sq_open). After a write transaction that removed rows commits, one
 * bounded pass of incremental vacuum gives freed pages back to the file
 * system (sq_vacuum_pass); older files keep their mode and reuse freed pages.
 *
 * Checkpoints (docs/sqlite.md "Checkpoints"): SQLite's automatic checkpoint
 * would run in the commit of the group leader, with the core's write lock
 * held. The write connection has it off (wal_autocheckpoint = 0); its WAL
 * hook (sq_wal_hook) wakes a thread of the handle (sq_ckpt_main) that runs
 * PASSIVE checkpoints on its own connection, never waiting for the writer
 * or readers. A WAL the thread cannot get to restart (a constant writer
 * keeps appending while it copies) is restarted by the write path itself
 * once it is SQ_CKPT_LIMIT times the threshold (sq_reclaim_wal).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "sqlite_vfs.h"
#include "store/backend.h"
#include "store/backend_sql.h"
#include "store/counts.h"
#include "util/dirsync.h"
#include "util/hmap.h"
#include "util/parse.h"

/* ---- settings --------------------------------------------------------- */

#define SQ_SCHEMA_VERSION 14           /* PRAGMA user_version of the current schema */
/* A stored name's tenant scope (counts.h: its start through its first
 * separator when that makes a tenant's prefix) as SQL over column c, and
 * the condition that it has one: the key and the WHERE of events_scope,
 * spelled once so that the statements that use the index match it
 * exactly (SQLite uses an index on an expression only for that same
 * expression). */
#define SQ_SCOPE_OF(c) "substr(" c ", 1, instr(" c ", " ES_SQL_SEP "))"
#define SQ_SCOPED(c) "instr(" c ", " ES_SQL_SEP ")" ES_SQL_SCOPE_BOUNDS
#define SQ_APPLICATION_ID 0x45535442   /* PRAGMA application_id: "ESTB" */
#define SQ_DEFAULT_BUSY_MS 10000       /* how long to wait for another writer */
#define SQ_DEFAULT_READERS 8           /* read connections at most */
#define SQ_MAX_READERS 64
#define SQ_MAX_SAVEPOINTS 64           /* nesting depth whose positions are given back on rollback */
#define SQ_LOW_SPACE_BYTES (64 << 20)  /* less free space than this: keep the WAL small (sq_reclaim_wal) */
#define SQ_SPACE_CHECK_EVERY 256       /* writes between two looks at the free space */
/* WAL pages (frames) at which the checkpointer is woken: SQLite's own
 * default, and short of space the small WAL of sq_reclaim_wal. */
#define SQ_CKPT_PAGES 1000
#define SQ_CKPT_PAGES_LOW 64
/* Times SQ_CKPT_PAGES the WAL may hold before the write path restarts it
 * itself (sq_wal_hook, sq_reclaim_wal): 16 MiB of WAL with 4 KiB pages. */
#define SQ_CKPT_LIMIT 4
/* Pages the WAL grows by between two wakes of the checkpointer. A pass
 * copies each page changed since the last one (appends change the same
 * few pages again and again) and syncs the main file, so a pass per
 * commit would multiply both; a pass per 1000 pages copies what SQLite's
 * own checkpoint did (measured: 250 cost more CPU per event than 1000).
 * What the last pass left is copied by the next one, by the write path's
 * restart, or at close. */
#define SQ_CKPT_STEP SQ_CKPT_PAGES
/* Pages (4 KiB) one incremental-vacuum pass gives back at most: bounds what
 * a commit after a removal pays on top of the removal (sq_vacuum_pass).
 * Short of space the passes are smaller, since each one first writes the
 * pages it moves to the WAL. */
#define SQ_VACUUM_PAGES 1024
#define SQ_VACUUM_PAGES_LOW 64
#define SQ_STR_(x) #x
#define SQ_STR(x) SQ_STR_(x)

enum { SQ_SYNC_NORMAL = 1, SQ_SYNC_FULL = 2 };
enum { SQ_MODE_RWC = 0, SQ_MODE_RW, SQ_MODE_RO };

/* ---- statements ------------------------------------------------------- */

/* Column order of every event SELECT; bind_event() binds the same order as
 * ?1..?29, so INSERT and UPDATE share one binder (the insert binds the
 * immutable `key`, `revision` and `meta`, ?30..?32, itself: §3.10, §3.1). The columns of version 4
 * come last; the immutable origin before the dispatch fields, so that the
 * UPDATE's highest parameter is the last one bound (binding a number above
 * a statement's highest parameter is an error, one below it that the
 * statement does not use is not). */
#define EV_COLS ES_SQL_EV_COLS
/* An event's due time. A claim (and a renewal) keeps the due time it sets
 * (the claim's end) in claim_due and leaves due_at as it was, so that it
 * moves the row only in the two indexes ordered by due time across
 * sessions (events_queued, events_type_pending, keyed on this expression),
 * never in the per-session ones (schema version 11, sq_event_update). Any
 * other write of the dispatch record sets due_at and clears claim_due.
 * Hence due_at <= SQ_DUE on every row, which the per-session reads by
 * due_at rely on. */
#define SQ_DUE "coalesce(claim_due, due_at)"
/* An event's payload and meta (schema version 13, docs/sqlite.md "Long
 * payloads apart"): one longer than SQ_PAYLOAD_INLINE bytes is kept in
 * `payloads` under the event's position and the row's own column is NULL,
 * so that the claims and completions that rewrite the row do not rewrite
 * it too. COALESCE stops at the row's own value: only a NULL one (a long
 * value, or none at all) looks further. */
#define SQ_PAYLOAD_INLINE 512
#define SQ_APART(col) \
  "coalesce(" col ", (SELECT p." col " FROM payloads p WHERE p.position = events.position))"
#define SQ_PAYLOAD SQ_APART("payload")
#define SQ_META SQ_APART("meta")
/* EV_COLS as every event SELECT reads it: payload, due_at and meta through
 * SQ_PAYLOAD, SQ_DUE and SQ_META. */
#define EV_SEL                                                                        \
  ES_SQL_EV_COLS_ID SQ_PAYLOAD ES_SQL_EV_COLS_MID SQ_DUE ES_SQL_EV_COLS_AFTER_DUE SQ_META
/* Column order of every session SELECT; sq_session_put binds it as ?1..?20. */
#define SESS_COLS                                                                         \
  "session, head, events, pending, dead, attempts, failures, first_at, updated_at, fence, " \
  "sealed_at, seal_reason, lease_holder, lease_token, lease_expires_at, parent, fork_at, "  \
  "forked_at, first_index, archived_through"
#define REF_COLS "name, session, created_at, updated_at"

enum {
  ST_BEGIN_WRITE, ST_BEGIN_READ, ST_COMMIT, ST_ROLLBACK, ST_SAVEPOINT, ST_RELEASE, ST_ROLLBACK_TO,
  ST_MAX_POSITION, ST_META_GET, ST_META_PUT,
  ST_SESSION_GET, ST_SESSION_PUT,
  ST_SESSION_LIST_GE, ST_SESSION_LIST_GE_LT, ST_SESSION_LIST_GT, ST_SESSION_LIST_GT_LT,
  ST_SESSION_CHILDREN, ST_SESSION_CHILDREN_GT,
  ST_EVENT_GET, ST_EVENT_GET_BY_ID, ST_EVENT_INSERT, ST_EVENT_UPDATE, ST_EVENT_CLAIM, ST_EVENT_COMPLETE,
  ST_EVENT_RANGE, ST_EVENT_ALL,
  ST_EVENT_COPY,
  ST_LANE_NEXT, ST_QUEUED_DUE_ALL, ST_QUEUED_DUE_SESSION, ST_QUEUED_DUE_SESSION_BY_DUE,
  ST_QUEUED_WINDOW_COUNT, ST_QUEUED_NEXT_ALL,
  ST_QUEUED_NEXT_SESSION, ST_QUEUED_NEXT_SESSION_CLAIMED, ST_QUEUED_DUE_TYPE, ST_QUEUED_NEXT_TYPE,
  ST_PENDING_TYPES,
  ST_DEAD_ALL, ST_DEAD_SESSION,
  ST_SNAPSHOT_GET, ST_SNAPSHOT_PUT, ST_SNAPSHOT_LIST,
  ST_REF_GET, ST_REF_PUT, ST_REF_DELETE, ST_REF_LIST, ST_REF_LIST_GT,
  ST_PRESENCE_GET, ST_PRESENCE_PUT, ST_PRESENCE_EXPIRE, ST_PRESENCE_LIST,
  ST_EVENT_DELETE_RANGE, ST_PAYLOAD_DELETE_RANGE, ST_PAYLOAD_PUT,
  ST_SESSION_DELETE, ST_SNAPSHOT_DELETE_ALL, ST_REF_DELETE_SESSION,
  ST_KEY_GET, ST_KEY_PUT, ST_KEY_USE_PUT, ST_KEY_USE_LIST, ST_KEY_USE_DELETE_SESSION,
  ST_SNAPSHOT_DELETE_FROM,
  ST_FLOOR_GET, ST_FLOOR_PUT, /* §3.8 */
  ST_FREELIST_COUNT, ST_INCREMENTAL_VACUUM, ST_INCREMENTAL_VACUUM_LOW,
  ST_DATA_VERSION,
  ST_SEGMENT_LIST, ST_SEGMENT_PUT, ST_SEGMENT_DELETE, ST_SEGMENT_SESSIONS,
  /* §3.11 scoped listings (a tenant's): ?scope <= session < ?scope_end */
  ST_EVENT_ALL_SCOPED, ST_QUEUED_DUE_ALL_SCOPED, ST_QUEUED_NEXT_ALL_SCOPED,
  ST_QUEUED_DUE_TYPE_SCOPED, ST_QUEUED_NEXT_TYPE_SCOPED, ST_PENDING_TYPES_SCOPED,
  ST_DEAD_ALL_SCOPED,
  ST_COUNTS, ST_COUNTS_MOVE, ST_COUNTS_ADD, /* §3.12 */
  /* several rows per INSERT (sq_event_insert_many) */
  ST_EVENT_INSERT_4, ST_EVENT_INSERT_16, ST_EVENT_INSERT_64,
  ST_PROJ_GET, ST_PROJ_PUT, ST_PROJ_DELETE, ST_PROJ_LIST, ST_PROJ_DROP, /* §8 */
  ST_COUNT
};

/* One row of an INSERT's VALUES in EV_COLS order (anonymous parameters:
 * row r's column c is parameter 32 * r + c + 1), and 4, 16 and 64 of them. */
#define EV_ROW "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
#define EV_ROWS4 EV_ROW "," EV_ROW "," EV_ROW "," EV_ROW
#define EV_ROWS16 EV_ROWS4 "," EV_ROWS4 "," EV_ROWS4 "," EV_ROWS4
#define EV_ROWS64 EV_ROWS16 "," EV_ROWS16 "," EV_ROWS16 "," EV_ROWS16
#define EV_NCOLS 32

/* The WHERE terms `queued = 1`, `status = 2`, `status <> 1` and
 * `lane IS NOT NULL` repeat the partial indexes' terms literally: that is
 * what lets SQLite use a partial index. INDEXED BY pins the plan: without
 * statistics the planner may otherwise prefer UNIQUE(session, idx) and
 * walk every event of a session (INDEXED BY fails loudly at prepare, that
 * is at open, if an index ever stops being usable). */
static const char *const sq_sql[ST_COUNT] = {
    [ST_COUNTS] = "SELECT sessions, events, pending, dead FROM counts WHERE scope = ?1",
    /* sq_counts_add: a scope's sums moved by a flush's session rows; the
     * plain UPDATE first (the row is there but for a scope's first row),
     * which costs half the upsert */
    [ST_COUNTS_MOVE] = "UPDATE counts SET sessions = sessions + ?2, events = events + ?3,"
                       " pending = pending + ?4, dead = dead + ?5 WHERE scope = ?1",
    [ST_COUNTS_ADD] = "INSERT INTO counts(scope, sessions, events, pending, dead)"
                      " VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(scope) DO UPDATE SET"
                      " sessions = sessions + excluded.sessions, events = events + excluded.events,"
                      " pending = pending + excluded.pending, dead = dead + excluded.dead",
    /* §8: a range of the primary key (ns, key); ?3 is a zero-length blob
     * when there is no upper bound (every text sorts before a blob). */
    [ST_PROJ_GET] = "SELECT value FROM projections WHERE ns = ?1 AND key = ?2",
    [ST_PROJ_PUT] = "INSERT OR REPLACE INTO projections(ns, key, value) VALUES (?1, ?2, ?3)",
    [ST_PROJ_DELETE] = "DELETE FROM projections WHERE ns = ?1 AND key = ?2",
    [ST_PROJ_LIST] = "SELECT key, value FROM projections WHERE ns = ?1 AND key >= ?2 AND key < ?3"
                     " ORDER BY key LIMIT ?4",
    [ST_PROJ_DROP] = "DELETE FROM projections WHERE ns = ?1",
    [ST_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [ST_BEGIN_READ] = "BEGIN",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_SAVEPOINT] = "SAVEPOINT es_sp",
    [ST_RELEASE] = "RELEASE es_sp",
    [ST_ROLLBACK_TO] = "ROLLBACK TO es_sp",
    [ST_MAX_POSITION] = "SELECT max(position) FROM events",
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    [ST_META_PUT] = "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
    [ST_SESSION_GET] = "SELECT " SESS_COLS " FROM sessions WHERE session = ?1",
    /* An upsert, not INSERT OR REPLACE: a replace deletes the old row and
     * inserts a new one, moving its index entries, where the upsert
     * rewrites it in place. (The counts move from the row the file held:
     * sq_counts_row.) */
    [ST_SESSION_PUT] = "INSERT INTO sessions(" SESS_COLS
                       ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
                       " ?15, ?16, ?17, ?18, ?19, ?20) ON CONFLICT(session) DO UPDATE SET"
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
                           " FROM sessions WHERE session >= ?1 ORDER BY session LIMIT ?3",
    [ST_SESSION_LIST_GE_LT] = "SELECT " SESS_COLS
                              " FROM sessions WHERE session >= ?1 AND session < ?2"
                              " ORDER BY session LIMIT ?3",
    [ST_SESSION_LIST_GT] = "SELECT " SESS_COLS
                           " FROM sessions WHERE session > ?1 ORDER BY session LIMIT ?3",
    [ST_SESSION_LIST_GT_LT] = "SELECT " SESS_COLS
                              " FROM sessions WHERE session > ?1 AND session < ?2"
                              " ORDER BY session LIMIT ?3",
    /* One range of sessions_parent, already in session order (no sort);
     * `parent IS NOT NULL` repeats the partial index's term. */
    [ST_SESSION_CHILDREN] = "SELECT " SESS_COLS " FROM sessions INDEXED BY sessions_parent"
                            " WHERE parent IS NOT NULL AND parent = ?1"
                            " ORDER BY session LIMIT ?3",
    [ST_SESSION_CHILDREN_GT] = "SELECT " SESS_COLS " FROM sessions INDEXED BY sessions_parent"
                               " WHERE parent IS NOT NULL AND parent = ?1 AND session > ?2"
                               " ORDER BY session LIMIT ?3",
    [ST_EVENT_GET] = "SELECT " EV_SEL " FROM events WHERE session = ?1 AND idx = ?2",
    [ST_EVENT_GET_BY_ID] = "SELECT " EV_SEL " FROM events WHERE id = ?1",
    [ST_EVENT_INSERT] = "INSERT INTO events(" EV_COLS
                        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
                        " ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28,"
                        " ?29, ?30, ?31, ?32)",
    /* The mutable dispatch record only: the origin (?24, ?25) is bound but
     * not used, a fork's copy keeps it. The row is found by its position
     * when ?1 gives it (the rowid: one search fewer than through
     * UNIQUE(session, idx)), else by (session, idx). */
    [ST_EVENT_UPDATE] = "UPDATE events SET status = ?12, attempts = ?13, failures = ?14,"
                        " last_error = ?15, processed_at = ?16, claim_holder = ?17,"
                        " claim_expires_at = ?18, retry_at = ?19, queued = ?20, due_at = ?21,"
                        " last_failed_attempt = ?22, returned = ?23, first_claimed_at = ?26,"
                        " last_claimed_at = ?27, failed_at = ?28, processed_by_attempt = ?29,"
                        " claim_due = NULL WHERE position = coalesce(?1, (SELECT position FROM events"
                        " WHERE session = ?2 AND idx = ?3)) AND session = ?2 AND idx = ?3",
    /* A claim or a renewal of a queued pending row (sq_event_update): the
     * dispatch record without status, queued and due_at, whose indexes it
     * then leaves alone; the due time goes to claim_due. Only on a row
     * whose due_at is at most the new due time (SQ_DUE's invariant); on
     * any other row it changes nothing and ST_EVENT_UPDATE runs instead.
     * The row is found by its position (the rowid: one search fewer than
     * through UNIQUE(session, idx)), checked against (session, idx).
     * ?12 and ?20 are bound, not used. */
    [ST_EVENT_CLAIM] = "UPDATE events SET attempts = ?13, failures = ?14, last_error = ?15,"
                       " processed_at = ?16, claim_holder = ?17, claim_expires_at = ?18,"
                       " retry_at = ?19, claim_due = ?21, last_failed_attempt = ?22, returned = ?23,"
                       " first_claimed_at = ?26, last_claimed_at = ?27, failed_at = ?28,"
                       " processed_by_attempt = ?29 WHERE position = ?1 AND session = ?2 AND idx = ?3"
                       " AND queued = 1"
                       " AND status = " ES_SQL_PENDING " AND due_at <= ?21",
    /* A completion by the attempt that owns the row (sq_event_complete;
     * ?5: how many events it returned): es_event_complete_record's fields and
     * es_rule_owns's checks, spelled once in backend_sql.h. */
    [ST_EVENT_COMPLETE] = "UPDATE events SET " ES_SQL_COMPLETED("?4", "?3", "?5") ", claim_due = NULL"
                          " WHERE session = ?1 AND idx = ?2 AND " ES_SQL_OWNED("?3")
                          " AND returned > -2 AND lane IS NULL",
    [ST_EVENT_RANGE] = "SELECT " EV_SEL
                       " FROM events WHERE session = ?1 AND idx > ?2 AND idx <= ?3"
                       " ORDER BY idx LIMIT ?4",
    [ST_EVENT_ALL] = "SELECT " EV_SEL " FROM events WHERE position > ?1 ORDER BY position LIMIT ?2",
    /* fork: one statement copies the prefix inside SQLite (no row goes
     * through C); es_copy_id() is the core's id generator (sq_fn_copy_id).
     * The columns follow EV_COLS; the dispatch record is the core's
     * (backend_sql.h). Positions ?1 + idx - 1: increasing in
     * index order without a window function (a quarter of the time),
     * leaving a gap if the source lacks an index (allowed: positions need
     * only increase; the core refuses such a copy anyway). */
    [ST_EVENT_COPY] = "INSERT INTO events(" EV_COLS ")"
                      " SELECT ?1 + idx - 1, ?2, idx, es_copy_id(), type, " SQ_PAYLOAD ","
                      " lane, created_at, cause_index, cause_attempt, not_before, "
                      ES_SQL_COPY_DISPATCH("?3") ", ?4, idx, " ES_SQL_COPY_CLAIMS ","
                      " key, revision, " SQ_META " FROM events WHERE session = ?4 AND idx <= ?5 ORDER BY idx",
    [ST_LANE_NEXT] = "SELECT idx FROM events INDEXED BY events_lane"
                     " WHERE session = ?1 AND lane = ?2 AND idx > ?3"
                     " AND lane IS NOT NULL AND status <> " ES_SQL_PROCESSED
                     " ORDER BY idx LIMIT 1",
    [ST_QUEUED_DUE_ALL] = "SELECT " EV_SEL
                          " FROM events INDEXED BY events_queued WHERE queued = 1 AND " SQ_DUE " <= ?1"
                          " ORDER BY " SQ_DUE ", position LIMIT ?2",
    /* The ready rows among the first ?4 queued rows of the session (by
     * index): what a claim wants when ready rows come first. */
    [ST_QUEUED_DUE_SESSION] = "SELECT " EV_SEL " FROM events"
                              " WHERE queued = 1 AND session = ?1 AND " SQ_DUE " <= ?2 AND idx IN"
                              " (SELECT idx FROM events INDEXED BY events_session_queued"
                              "  WHERE queued = 1 AND session = ?1 ORDER BY idx LIMIT ?4)"
                              " ORDER BY idx LIMIT ?3",
    /* Only the ready rows, found by due time, then put in index order: when
     * many rows that are not due (claims, timers) come first. due_at <= ?2
     * holds for every row with SQ_DUE <= ?2; the rows it adds are live
     * claims, dropped by the second term. */
    [ST_QUEUED_DUE_SESSION_BY_DUE] = "SELECT " EV_SEL
                                     " FROM events INDEXED BY events_session_due"
                                     " WHERE queued = 1 AND session = ?1 AND due_at <= ?2"
                                     " AND " SQ_DUE " <= ?2 ORDER BY idx LIMIT ?3",
    [ST_QUEUED_WINDOW_COUNT] = "SELECT count(*) FROM (SELECT 1 FROM events INDEXED BY events_session_queued"
                               " WHERE queued = 1 AND session = ?1 LIMIT ?2)",
    [ST_QUEUED_NEXT_ALL] = "SELECT min(" SQ_DUE ") FROM events INDEXED BY events_queued"
                           " WHERE queued = 1 AND " SQ_DUE " > ?1",
    /* sq_queued_next_due: the session's rows from due_at > ?2 on, by due_at
     * (a row's SQ_DUE is at least its due_at, so the walk stops at the
     * first due_at past the least SQ_DUE seen), and the claims' due times
     * among the rows with due_at <= ?2. */
    [ST_QUEUED_NEXT_SESSION] = "SELECT due_at, claim_due FROM events INDEXED BY events_session_due"
                               " WHERE queued = 1 AND session = ?1 AND due_at > ?2 ORDER BY due_at",
    [ST_QUEUED_NEXT_SESSION_CLAIMED] = "SELECT min(claim_due) FROM events INDEXED BY events_session_due"
                                       " WHERE queued = 1 AND session = ?1 AND due_at <= ?2"
                                       " AND claim_due > ?2",
    /* `status = 0` selects the partial index events_type_pending; queued
     * rows are all pending, so it filters nothing else. */
    [ST_QUEUED_DUE_TYPE] = "SELECT " EV_SEL
                           " FROM events INDEXED BY events_type_pending"
                           " WHERE status = " ES_SQL_PENDING
                           " AND type = ?1 AND queued = 1 AND " SQ_DUE " <= ?2"
                           " ORDER BY " SQ_DUE ", position LIMIT ?3",
    [ST_QUEUED_NEXT_TYPE] = "SELECT min(" SQ_DUE ") FROM events INDEXED BY events_type_pending"
                            " WHERE status = " ES_SQL_PENDING
                            " AND type = ?1 AND queued = 1 AND " SQ_DUE " > ?2",
    [ST_PENDING_TYPES] = "SELECT type, count(*) FROM events INDEXED BY events_type_pending"
                         " WHERE status = " ES_SQL_PENDING " GROUP BY type ORDER BY type",
    [ST_DEAD_ALL] = "SELECT " EV_SEL
                    " FROM events INDEXED BY events_dead"
                    " WHERE status = " ES_SQL_DEAD " AND position > ?1 ORDER BY position LIMIT ?2",
    [ST_DEAD_SESSION] = "SELECT " EV_SEL
                        " FROM events INDEXED BY events_session_dead"
                        " WHERE status = " ES_SQL_DEAD " AND session = ?1 AND position > ?2"
                        " ORDER BY position LIMIT ?3",
    [ST_SNAPSHOT_GET] = "SELECT reducer, idx, state, version, updated_at FROM snapshots"
                        " WHERE session = ?1 AND reducer = ?2",
    [ST_SNAPSHOT_PUT] = "INSERT OR REPLACE INTO snapshots(session, reducer, idx, state, version,"
                        " updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [ST_SNAPSHOT_LIST] = "SELECT reducer, idx, NULL, version, updated_at FROM snapshots"
                         " WHERE session = ?1 ORDER BY reducer",
    [ST_REF_GET] = "SELECT " REF_COLS " FROM refs WHERE name = ?1",
    [ST_REF_PUT] = "INSERT OR REPLACE INTO refs(" REF_COLS ") VALUES (?1, ?2, ?3, ?4)",
    [ST_REF_DELETE] = "DELETE FROM refs WHERE name = ?1",
    [ST_REF_LIST] = "SELECT " REF_COLS " FROM refs ORDER BY name LIMIT ?2",
    [ST_REF_LIST_GT] = "SELECT " REF_COLS " FROM refs WHERE name > ?1 ORDER BY name LIMIT ?2",
    [ST_PRESENCE_GET] = "SELECT participant, field, value, seen, at, expires_at FROM presence"
                        " WHERE ns = ?1 AND participant = ?2 AND field = ?3",
    [ST_PRESENCE_PUT] = "INSERT OR REPLACE INTO presence(ns, participant, field, value, seen, at,"
                        " expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [ST_PRESENCE_EXPIRE] = "DELETE FROM presence WHERE ns = ?1 AND expires_at <= ?2",
    [ST_PRESENCE_LIST] = "SELECT participant, field, value, seen, at, expires_at FROM presence"
                         " WHERE ns = ?1 AND expires_at > ?2 ORDER BY participant, field",
    /* Retention (§3.9). UNIQUE(session, idx) is the only index that starts
     * with session and has no WHERE of its own, so the rows to remove are
     * one range of it: O(log n + removed), each removed row also leaving
     * the partial indexes it is in (queues, types, lanes, dead). */
    [ST_EVENT_DELETE_RANGE] = "DELETE FROM events WHERE session = ?1 AND idx <= ?2",
    /* the long payloads of the same rows, removed first (by the range above) */
    [ST_PAYLOAD_DELETE_RANGE] = "DELETE FROM payloads WHERE position IN"
                                " (SELECT position FROM events WHERE session = ?1 AND idx <= ?2)",
    [ST_PAYLOAD_PUT] = "INSERT INTO payloads(position, payload, meta) VALUES (?1, ?2, ?3)",
    [ST_SESSION_DELETE] = "DELETE FROM sessions WHERE session = ?1",
    /* a prefix range of the primary key (session, reducer) */
    [ST_SNAPSHOT_DELETE_ALL] = "DELETE FROM snapshots WHERE session = ?1",
    /* the primary key is the name: without refs_session this would scan */
    [ST_REF_DELETE_SESSION] = "DELETE FROM refs INDEXED BY refs_session WHERE session = ?1",
    /* Crypto-shredding (§3.10). A shred replaces a key's row (INSERT OR
     * REPLACE deletes the old cell, which secure_delete zeroes). */
    [ST_KEY_GET] = "SELECT name, wrapped, created_at, shredded_at FROM keys WHERE name = ?1",
    [ST_KEY_PUT] = "INSERT OR REPLACE INTO keys(name, wrapped, created_at, shredded_at)"
                   " VALUES (?1, ?2, ?3, ?4)",
    [ST_KEY_USE_PUT] = "INSERT INTO key_uses(key, session, first_index) VALUES (?1, ?2, ?3)"
                       " ON CONFLICT(key, session) DO UPDATE SET"
                       " first_index = min(first_index, excluded.first_index)",
    [ST_KEY_USE_LIST] = "SELECT session, first_index FROM key_uses WHERE key = ?1 ORDER BY session",
    [ST_KEY_USE_DELETE_SESSION] = "DELETE FROM key_uses INDEXED BY key_uses_session"
                                  " WHERE session = ?1",
    /* a range of the primary key prefix (session), filtered by idx */
    [ST_SNAPSHOT_DELETE_FROM] = "DELETE FROM snapshots WHERE session = ?1 AND idx >= ?2",
    [ST_FLOOR_GET] = "SELECT token FROM fence_floors WHERE session = ?1",
    [ST_FLOOR_PUT] = "INSERT INTO fence_floors(session, token) VALUES (?1, ?2)"
                     " ON CONFLICT(session) DO UPDATE SET token = max(token, excluded.token)",
    [ST_FREELIST_COUNT] = "PRAGMA freelist_count",
    /* one row per page given back; a pragma takes no bound parameter */
    [ST_INCREMENTAL_VACUUM] = "PRAGMA incremental_vacuum(" SQ_STR(SQ_VACUUM_PAGES) ")",
    [ST_INCREMENTAL_VACUUM_LOW] = "PRAGMA incremental_vacuum(" SQ_STR(SQ_VACUUM_PAGES_LOW) ")",
    [ST_DATA_VERSION] = "PRAGMA data_version",
    /* Archive (§3.9): a prefix range of the primary key (session, first). */
    [ST_SEGMENT_LIST] = "SELECT first, through, count, bytes, checksum, file, created_at"
                        " FROM segments WHERE session = ?1 ORDER BY first",
    [ST_SEGMENT_PUT] = "INSERT OR REPLACE INTO segments(session, first, through, count, bytes,"
                       " checksum, file, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [ST_SEGMENT_DELETE] = "DELETE FROM segments WHERE session = ?1 AND first = ?2",
    /* ?2 (after) "" when unbounded: every session name is non-empty;
     * substr and length count characters on both sides alike */
    [ST_SEGMENT_SESSIONS] = "SELECT session, MAX(through) FROM segments WHERE session > ?2"
                            " AND substr(session, 1, length(?1)) = ?1"
                            " GROUP BY session ORDER BY session LIMIT ?3",
    /* §3.11: a tenant's rows are one range of session names, but the
     * listings below are in position or due order across sessions. A
     * tenant's events by position are one range of events_scope (schema
     * version 9): "after P for tenant T" is an index seek, so a tenant's
     * read_all (and every wait or tail on it) costs its own rows, never
     * the store's. The queued listings below walk the same index as their unscoped
     * statement and pass over other tenants' rows (one row lookup each).
     * The unscoped statements are unchanged: users without tenants pay
     * nothing. */
    [ST_EVENT_ALL_SCOPED] = "SELECT " EV_SEL " FROM events INDEXED BY events_scope"
                            " WHERE " SQ_SCOPE_OF("session") " = ?3 AND " SQ_SCOPED("session")
                            " AND position > ?1 ORDER BY position LIMIT ?2",
    [ST_QUEUED_DUE_ALL_SCOPED] = "SELECT " EV_SEL
                                 " FROM events INDEXED BY events_queued WHERE queued = 1"
                                 " AND " SQ_DUE " <= ?1 AND session >= ?3 AND session < ?4"
                                 " ORDER BY " SQ_DUE ", position LIMIT ?2",
    [ST_QUEUED_NEXT_ALL_SCOPED] = "SELECT " SQ_DUE " FROM events INDEXED BY events_queued"
                                  " WHERE queued = 1 AND " SQ_DUE " > ?1 AND session >= ?2"
                                  " AND session < ?3 ORDER BY " SQ_DUE " LIMIT 1",
    [ST_QUEUED_DUE_TYPE_SCOPED] = "SELECT " EV_SEL
                                  " FROM events INDEXED BY events_type_pending"
                                  " WHERE status = " ES_SQL_PENDING
                                  " AND type = ?1 AND queued = 1 AND " SQ_DUE " <= ?2"
                                  " AND session >= ?4 AND session < ?5"
                                  " ORDER BY " SQ_DUE ", position LIMIT ?3",
    [ST_QUEUED_NEXT_TYPE_SCOPED] = "SELECT " SQ_DUE " FROM events INDEXED BY events_type_pending"
                                   " WHERE status = " ES_SQL_PENDING
                                   " AND type = ?1 AND queued = 1 AND " SQ_DUE " > ?2"
                                   " AND session >= ?3 AND session < ?4 ORDER BY " SQ_DUE " LIMIT 1",
    [ST_PENDING_TYPES_SCOPED] = "SELECT type, count(*) FROM events INDEXED BY events_type_pending"
                                " WHERE status = " ES_SQL_PENDING
                                " AND session >= ?1 AND session < ?2"
                                " GROUP BY type ORDER BY type",
    [ST_DEAD_ALL_SCOPED] = "SELECT " EV_SEL
                           " FROM events INDEXED BY events_dead"
                           " WHERE status = " ES_SQL_DEAD
                           " AND position > ?1 AND session >= ?3 AND session < ?4"
                           " ORDER BY position LIMIT ?2",
    /* An INSERT's fixed cost (opening a cursor on the table and each of
     * its nine indexes, closing them, the statement's journal) is larger
     * than a row's: several rows per statement make a batch's insert
     * about twice as fast (sq_event_insert_many). */
    [ST_EVENT_INSERT_4] = "INSERT INTO events(" EV_COLS ") VALUES " EV_ROWS4,
    [ST_EVENT_INSERT_16] = "INSERT INTO events(" EV_COLS ") VALUES " EV_ROWS16,
    [ST_EVENT_INSERT_64] = "INSERT INTO events(" EV_COLS ") VALUES " EV_ROWS64,
};

/* Binds a scope (§3.11) as the range [scope, end) at parameters i and
 * i + 1: end is scope with its last byte + 1 (a tenant prefix ends in
 * ES_TENANT_SEP, so end ends in a space). end must hold strlen(scope) + 1
 * bytes and outlive the statement's run. */
static int sq_bind_scope(sqlite3_stmt *st, int i, const char *scope, char *end) {
  size_t n = strlen(scope);
  memcpy(end, scope, n);
  if (n) end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
  end[n] = '\0';
  int rc = sqlite3_bind_text(st, i, scope, (int)n, SQLITE_STATIC);
  return rc != SQLITE_OK ? rc : sqlite3_bind_text(st, i + 1, end, (int)n, SQLITE_STATIC);
}

/* The end of a scope range: a tenant prefix is at most this long. */
typedef struct {
  char v[ES_MAX_TENANT_BYTES + 2];
} sq_scope_end;

static int sq_scope_ok(const char *scope, es_err *err) {
  if (scope && (!*scope || strlen(scope) > ES_MAX_TENANT_BYTES + 1))
    return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: a scope is 1 to %d bytes",
                   ES_MAX_TENANT_BYTES + 1);
  return ES_OK;
}

/* The schema, version 1. Byte order everywhere: every text column uses the
 * default BINARY collation (memcmp). */
static const char sq_schema_v1[] =
    "CREATE TABLE IF NOT EXISTS meta("
    "  key TEXT PRIMARY KEY,"
    "  value) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS events("
    "  position INTEGER PRIMARY KEY,"  /* rowid; assigned by this file, see the header */
    "  session TEXT NOT NULL,"
    "  idx INTEGER NOT NULL,"
    "  id TEXT NOT NULL UNIQUE,"
    "  type TEXT,"
    "  payload TEXT,"                  /* canonical JSON, every byte kept (bound with its length) */
    "  lane TEXT,"
    "  created_at INTEGER,"
    "  cause_index INTEGER,"
    "  cause_attempt INTEGER,"
    "  not_before INTEGER,"
    "  status INTEGER NOT NULL,"       /* 0 pending, 1 processed, 2 dead */
    "  attempts INTEGER,"
    "  failures INTEGER,"
    "  last_error TEXT,"
    "  processed_at INTEGER,"
    "  claim_holder TEXT,"
    "  claim_expires_at INTEGER,"
    "  retry_at INTEGER,"
    "  queued INTEGER NOT NULL,"
    "  due_at INTEGER,"
    "  last_failed_attempt INTEGER,"
    "  returned INTEGER,"
    "  UNIQUE(session, idx));"
    "CREATE INDEX IF NOT EXISTS events_queued ON events(due_at, position) WHERE queued = 1;"
    /* by index (claim order); due_at in the key filters without a row lookup */
    "CREATE INDEX IF NOT EXISTS events_session_queued ON events(session, idx, due_at) WHERE queued = 1;"
    "CREATE INDEX IF NOT EXISTS events_lane ON events(session, lane, idx)"
    "  WHERE lane IS NOT NULL AND status <> " ES_SQL_PROCESSED ";"
    "CREATE INDEX IF NOT EXISTS events_dead ON events(position) WHERE status = " ES_SQL_DEAD ";"
    "CREATE INDEX IF NOT EXISTS events_session_dead ON events(session, position) WHERE status = " ES_SQL_DEAD ";"
    "CREATE TABLE IF NOT EXISTS sessions("
    "  session TEXT PRIMARY KEY,"
    "  head INTEGER NOT NULL,"
    "  events INTEGER NOT NULL,"
    "  pending INTEGER NOT NULL,"
    "  dead INTEGER NOT NULL,"
    "  attempts INTEGER NOT NULL,"
    "  failures INTEGER NOT NULL,"
    "  first_at INTEGER,"
    "  updated_at INTEGER) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS snapshots("
    "  session TEXT NOT NULL,"
    "  reducer TEXT NOT NULL,"
    "  idx INTEGER NOT NULL,"
    "  state BLOB,"
    "  version TEXT,"
    "  updated_at INTEGER,"
    "  PRIMARY KEY(session, reducer));"
    "CREATE TABLE IF NOT EXISTS presence("
    "  ns TEXT NOT NULL,"
    "  participant TEXT NOT NULL,"
    "  field TEXT NOT NULL,"
    "  value TEXT,"                    /* NULL: a tombstone */
    "  seen INTEGER,"
    "  at INTEGER,"
    "  expires_at INTEGER,"
    "  PRIMARY KEY(ns, participant, field)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS presence_expiry ON presence(ns, expires_at);";

/* migrations[v] takes a file from schema version v to v + 1, inside the
 * open's write transaction. Version 0 is a file without our schema (new, or
 * an empty SQLite file). */
/* Version 2: by due time within a session (the ready rows alone, and the
 * next due time, in O(log n) however many rows wait). */
static const char sq_schema_v2[] =
    "CREATE INDEX IF NOT EXISTS events_session_due ON events(session, due_at) WHERE queued = 1;";

/* Version 3: the pending rows by type (claim_next{types}: each listed
 * type's ready rows in due order without touching other types' rows;
 * pending_types: counts from this index alone). queued sits before due_at
 * so the ready rows of a type are one range of it. */
static const char sq_schema_v3[] =
    "CREATE INDEX IF NOT EXISTS events_type_pending ON events(type, queued, due_at, position)"
    "  WHERE status = " ES_SQL_PENDING ";";

/* Version 4 (docs/contract.md §3.7, §3.8): the full dispatch record and a fork
 * copy's origin on events; fences, leases, seals and lineage on sessions
 * (kept on the session row so every write reads them with the row it
 * reads anyway); children by parent; refs. ADD COLUMN only rewrites the
 * schema text, not the rows (old rows read the defaults: NULL, i.e.
 * ES_NONE, and fence 0, i.e. never fenced), so the migration takes the
 * same time on any file. The new values are not made up for old rows
 * (processed_by_attempt and the claim and failure times stay unknown):
 * the backend stores rows, it does not reconstruct history. */
static const char sq_schema_v4[] =
    "ALTER TABLE events ADD COLUMN origin_session TEXT;"   /* immutable, written by insert */
    "ALTER TABLE events ADD COLUMN origin_index INTEGER;"
    "ALTER TABLE events ADD COLUMN first_claimed_at INTEGER;"
    "ALTER TABLE events ADD COLUMN last_claimed_at INTEGER;"
    "ALTER TABLE events ADD COLUMN failed_at INTEGER;"
    "ALTER TABLE events ADD COLUMN processed_by_attempt INTEGER;"
    "ALTER TABLE sessions ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE sessions ADD COLUMN sealed_at INTEGER;"
    "ALTER TABLE sessions ADD COLUMN seal_reason TEXT;"
    "ALTER TABLE sessions ADD COLUMN lease_holder TEXT;"
    "ALTER TABLE sessions ADD COLUMN lease_token INTEGER;"
    "ALTER TABLE sessions ADD COLUMN lease_expires_at INTEGER;"
    "ALTER TABLE sessions ADD COLUMN parent TEXT;"
    "ALTER TABLE sessions ADD COLUMN fork_at INTEGER;"
    "ALTER TABLE sessions ADD COLUMN forked_at INTEGER;"
    /* only forked sessions have a parent: the others cost no index entry */
    "CREATE INDEX IF NOT EXISTS sessions_parent ON sessions(parent, session) WHERE parent IS NOT NULL;"
    "CREATE TABLE IF NOT EXISTS refs("
    "  name TEXT PRIMARY KEY,"
    "  session TEXT NOT NULL,"
    "  created_at INTEGER,"
    "  updated_at INTEGER) WITHOUT ROWID;";

/* Version 5 (docs/contract.md §3.9): the session's first live index (a truncate
 * drops events below it; rows written before read 1: nothing was dropped
 * from them), and refs by the session they name, so deleting a session
 * removes its refs in O(log n + removed) instead of scanning every ref.
 * auto_vacuum is not part of a migration: switching an existing file needs
 * a full VACUUM, so a file keeps the mode it was created with (sq_open sets
 * it for new files). */
static const char sq_schema_v5[] =
    "ALTER TABLE sessions ADD COLUMN first_index INTEGER NOT NULL DEFAULT 1;"
    "CREATE INDEX IF NOT EXISTS refs_session ON refs(session, name);";

/* Version 6 (docs/contract.md §3.9 archive, §3.10 crypto-shredding):
 *   sessions.archived_through  events first_index..archived_through live in
 *                              segment files (archive.c), not rows;
 *   segments                   one row per segment file of a session, keyed
 *                              by its first index (the segment list that
 *                              compact_archive compares and sets);
 *   events.key                 the data key a sealed payload is under;
 *   keys                       data keys wrapped by the master key; a
 *                              shredded key keeps its row with wrapped NULL
 *                              (the name stays burned: no new data under it);
 *                              the row named '' is the master key's check;
 *   key_uses                   which sessions hold events under a key, from
 *                              which index (shred drops the snapshots that
 *                              folded them, archived events included). */
static const char sq_schema_v6[] =
    "ALTER TABLE sessions ADD COLUMN archived_through INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE IF NOT EXISTS segments("
    "  session TEXT NOT NULL,"
    "  first INTEGER NOT NULL,"
    "  through INTEGER NOT NULL,"
    "  count INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  checksum TEXT NOT NULL,"
    "  file TEXT NOT NULL,"
    "  created_at INTEGER,"
    "  PRIMARY KEY(session, first)) WITHOUT ROWID;"
    "ALTER TABLE events ADD COLUMN key TEXT;"
    "CREATE TABLE IF NOT EXISTS keys("
    "  name TEXT PRIMARY KEY,"
    "  wrapped BLOB,"
    "  created_at INTEGER,"
    "  shredded_at INTEGER) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS key_uses("
    "  key TEXT NOT NULL,"
    "  session TEXT NOT NULL,"
    "  first_index INTEGER NOT NULL,"
    "  PRIMARY KEY(key, session)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS key_uses_session ON key_uses(session);";

/* Version 7 (§3.12 stats): `counts` holds the sums over the counted
 * session rows (how many, and their events, pending and dead), of the
 * store (scope '') and of each tenant scope, kept by triggers on
 * `sessions` in the writing transaction itself, so store:stats() reads one
 * row instead of walking the sessions, whoever wrote (every process runs
 * the same triggers). Which rows count and what a scope is are the core's
 * rule (store/counts.h), spelled here with its ES_SQL_* fragments. Each trigger moves the
 * store's row by the difference and upserts the scope's; the update
 * trigger fires only when a counted value changes (a claim, which changes
 * attempts, costs nothing more). The migration computes the rows once
 * from the sessions as they are. */
#define SQ_COUNTED(r) ES_SQL_COUNTED(r)
#define SQ_SCOPE(r) SQ_SCOPE_OF(r ".session")
#define SQ_HAS_SCOPE(r) SQ_SCOPED(r ".session")
/* The statements of a trigger body moving the counts by (ds, de, dp, dd)
 * for the session row r. */
#define SQ_COUNTS_MOVE(r, ds, de, dp, dd)                                                        \
  "UPDATE counts SET sessions = sessions + " ds ", events = events + " de                       \
  ", pending = pending + " dp ", dead = dead + " dd " WHERE scope = '';"                          \
  "INSERT INTO counts(scope, sessions, events, pending, dead) SELECT " SQ_SCOPE(r) ", " ds ", " de \
  ", " dp ", " dd " WHERE " SQ_HAS_SCOPE(r) " ON CONFLICT(scope) DO UPDATE SET"                    \
  " sessions = sessions + excluded.sessions, events = events + excluded.events,"                \
  " pending = pending + excluded.pending, dead = dead + excluded.dead;"
static const char sq_schema_v7[] =
    "CREATE TABLE IF NOT EXISTS counts("
    "  scope TEXT PRIMARY KEY,"
    "  sessions INTEGER NOT NULL,"
    "  events INTEGER NOT NULL,"
    "  pending INTEGER NOT NULL,"
    "  dead INTEGER NOT NULL) WITHOUT ROWID;"
    "DELETE FROM counts;"
    "INSERT INTO counts SELECT '', count(*), coalesce(sum(events), 0), coalesce(sum(pending), 0),"
    "  coalesce(sum(dead), 0) FROM sessions WHERE " SQ_COUNTED("sessions") ";"
    "INSERT INTO counts SELECT " SQ_SCOPE("sessions") ", count(*), sum(events),"
    "  sum(pending), sum(dead) FROM sessions WHERE fence >= 0 AND " SQ_HAS_SCOPE("sessions")
    " GROUP BY 1;"
    "CREATE TRIGGER IF NOT EXISTS counts_insert AFTER INSERT ON sessions WHEN " SQ_COUNTED("NEW")
    " BEGIN " SQ_COUNTS_MOVE("NEW", "1", "NEW.events", "NEW.pending", "NEW.dead") " END;"
    "CREATE TRIGGER IF NOT EXISTS counts_delete AFTER DELETE ON sessions WHEN " SQ_COUNTED("OLD")
    " BEGIN " SQ_COUNTS_MOVE("OLD", "-1", "-OLD.events", "-OLD.pending", "-OLD.dead") " END;"
    "CREATE TRIGGER IF NOT EXISTS counts_update AFTER UPDATE OF events, pending, dead, fence"
    " ON sessions WHEN NEW.session <> '' AND (OLD.events <> NEW.events OR OLD.pending <> NEW.pending"
    " OR OLD.dead <> NEW.dead OR " ES_SQL_LIVE("OLD") " <> " ES_SQL_LIVE("NEW") ") BEGIN "
    SQ_COUNTS_MOVE("NEW", "(" ES_SQL_LIVE("NEW") " - " ES_SQL_LIVE("OLD") ")",
                   "(" ES_SQL_LIVE("NEW") " * NEW.events - " ES_SQL_LIVE("OLD") " * OLD.events)",
                   "(" ES_SQL_LIVE("NEW") " * NEW.pending - " ES_SQL_LIVE("OLD") " * OLD.pending)",
                   "(" ES_SQL_LIVE("NEW") " * NEW.dead - " ES_SQL_LIVE("OLD")
                   " * OLD.dead)") " END;";

/* Version 8 (§3.1): an event's revision and meta. Rows written before
 * read revision 1 (the default every event had) and meta NULL (none);
 * ADD COLUMN with a constant default rewrites only the schema text. */
static const char sq_schema_v8[] =
    "ALTER TABLE events ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;"
    "ALTER TABLE events ADD COLUMN meta TEXT;";

/* Version 9 (issue: idle tails of an empty tenant rescanned the store):
 * each tenant's events by position, so that a tenant's read_all, and the
 * waits and live tails built on it, seek to "after P" within the tenant
 * instead of walking every later event of the store. Partial: events of
 * sessions without a tenant have no entry, so a store without tenants
 * pays nothing for it. Built from the rows as they are. */
static const char sq_schema_v9[] =
    "CREATE INDEX IF NOT EXISTS events_scope ON events(" SQ_SCOPE_OF("session") ", position)"
    "  WHERE " SQ_SCOPED("session") ";";

/* Version 10 (§8): projections' records and keyed states, one table of
 * (ns, key) -> bytes (store/projections.c says what each row is). */
static const char sq_schema_v10[] =
    "CREATE TABLE IF NOT EXISTS projections("
    "  ns TEXT NOT NULL,"
    "  key TEXT NOT NULL,"
    "  value BLOB NOT NULL,"
    "  PRIMARY KEY(ns, key)) WITHOUT ROWID;";

/* Version 11 (issue 26, docs/sqlite.md "Claims in place"): a claim keeps
 * its due time in claim_due (SQ_DUE), so the two indexes ordered by due
 * time across sessions are rebuilt on SQ_DUE; the per-session ones keep
 * due_at. Rows written before keep their meaning: a live claim's due_at is
 * its end, which is also its SQ_DUE (claim_due NULL). Rebuilding the two
 * indexes reads the queued and pending rows once. */
static const char sq_schema_v11[] =
    "ALTER TABLE events ADD COLUMN claim_due INTEGER;"
    "DROP INDEX IF EXISTS events_queued;"
    "CREATE INDEX events_queued ON events(" SQ_DUE ", position) WHERE queued = 1;"
    "DROP INDEX IF EXISTS events_type_pending;"
    "CREATE INDEX events_type_pending ON events(type, queued, " SQ_DUE ", position)"
    "  WHERE status = " ES_SQL_PENDING ";";

/* Version 12 (issue 26, docs/stats.md): the counts are moved in C where
 * a session row is written or deleted (sq_counts_row), no longer by
 * triggers; the sums the triggers kept are the ones to move from. */
static const char sq_schema_v12[] =
    "DROP TRIGGER IF EXISTS counts_insert;"
    "DROP TRIGGER IF EXISTS counts_delete;"
    "DROP TRIGGER IF EXISTS counts_update;";

/* Version 13 (issue 26, docs/sqlite.md "Long payloads apart"): payloads
 * and metas longer than SQ_PAYLOAD_INLINE, kept apart from their rows (a
 * row of `payloads` holds the event's long ones, NULL for a short one).
 * Rows written before keep theirs in the row, which every read looks at
 * first (SQ_APART), so nothing is moved: the migration takes the same time
 * on any file. No IF NOT EXISTS: a `payloads` table that a user added to a
 * version 12 file is not ours, and taking it would leave a file that says
 * 13 and cannot be read; the migration fails instead (the whole of it is
 * rolled back, the file stays at 12) and the error names the table. */
static const char sq_schema_v13[] =
    "CREATE TABLE payloads("
    "  position INTEGER PRIMARY KEY,"  /* the event's */
    "  payload TEXT,"
    "  meta TEXT);";

/* Version 14 (§3.8, backend.h fence_floor_get): the fence tokens of
 * deleted sessions, by name, so that a session made again under a name
 * fences past every token the deleted one gave. No IF NOT EXISTS, as in
 * version 13: a table of that name a user added is not ours. */
static const char sq_schema_v14[] =
    "CREATE TABLE fence_floors("
    "  session TEXT PRIMARY KEY,"
    "  token INTEGER NOT NULL) WITHOUT ROWID;";

static const char *const sq_migrations[SQ_SCHEMA_VERSION] = {
    sq_schema_v1,
    sq_schema_v2,
    sq_schema_v3,
    sq_schema_v4,
    sq_schema_v5,
    sq_schema_v6,
    sq_schema_v7,
    sq_schema_v8,
    sq_schema_v9,
    sq_schema_v10,
    sq_schema_v11,
    sq_schema_v12,
    sq_schema_v13,
    sq_schema_v14,
};

/* ---- types ------------------------------------------------------------ */

typedef struct sq_conn {
  sqlite3 *db;
  es_backend *b;                   /* borrowed: the owner */
  sqlite3_stmt *st[ST_COUNT];      /* prepared on first use, finalized at close */
  unsigned char active[ST_COUNT];  /* 1 while st[i] is being stepped */
  int64_t busy_since;              /* monotonic ms of the first busy retry */
  int no_wait;                     /* 1: the busy handler gives up at once (opportunistic checkpoints) */
  es_id_fn copy_id;                /* es_copy_id()'s generator while ST_EVENT_COPY runs, else NULL */
  void *copy_id_ctx;
  es_err copy_err;                 /* why the generator failed */
  int copy_rc;
} sq_conn;

/* A session row's counted values as the file holds them: the counts move
 * by the difference when a row is written (sq_behind_flush). */
typedef struct sq_counted {
  int exists; /* 0: the file has no row */
  int64_t events, pending, dead, fence;
} sq_counted;

/* The row the last session_get of a write transaction read from the file
 * (valid until a session row is written or a rollback: sq_base_take). */
typedef struct sq_base {
  int valid;
  char name[ES_MAX_NAME_BYTES + 1];
  sq_counted v;
} sq_base;

struct es_txn {
  es_backend *b;
  sq_conn *c;
  int write;                       /* 1: the write transaction */
  int broken;                      /* SQLite ended the transaction behind our back */
  char broken_msg[ES_ERRMSG_MAX];  /* why, for every later call */
  int depth;                       /* open savepoints */
  int64_t next_position;           /* write: the position the next insert gets */
  int64_t saved_next;              /* write: next_position as stored when the txn began */
  int64_t sp_next[SQ_MAX_SAVEPOINTS]; /* next_position when each savepoint began */
  int removed;                     /* write: a removal op deleted rows (sq_vacuum_pass after
                                      commit; a savepoint rolling them back leaves it set,
                                      which costs one look at the free-page count) */
  struct sq_reader *reader;        /* read: the pool entry */
  es_hmap behind;                  /* write: session rows put, not yet written (sq_behind_*) */
  sq_base last;                    /* write: the session row the last session_get read from the
                                      file, as it is there (sq_base_*) */
  es_counts all_wait;              /* write: the store's sums moved, not yet written (sq_counts_*) */
  es_counts sp_all[SQ_MAX_SAVEPOINTS]; /* all_wait when each savepoint began */
};

typedef struct sq_reader {
  sq_conn c;
  es_txn t;
  struct sq_reader *next_free;
  struct sq_reader *next_all;
} sq_reader;

struct es_backend {
  char *path;                      /* owned: as given, for messages */
  char *full_path;                 /* owned: absolute, for every connection after the first
                                      (the process may change directory meanwhile) */
  int mode;                        /* SQ_MODE_* */
  int sync;                        /* SQ_SYNC_* */
  int lazy;                        /* 1: a claim's transaction, committed without fsync (sq_lazy_begin) */
  int gathered;                    /* 1: the write connection's WAL writes are gathered (sqlite_vfs.h) */
  int busy_ms;
  int max_readers;
  int64_t max_pages;               /* 0: no cap */
  char *wal_path;                  /* owned: PATH-wal, for the checks that look at it */
  int immutable;                   /* 1: mode=ro on a location where SQLite cannot create the
                                      -shm (read-only media): opened with immutable=1 */
  struct stat imm_st;              /* immutable: the main file as it was at open */
  int imm_changed;                 /* immutable: the file changed since (sticky; under pool_mu) */
  int ckpt_due;                    /* write path only: try a WAL checkpoint (TRUNCATE) before the
                                      next write, to give back the WAL's disk space */
  int restart_due;                 /* write path only: the WAL reached its limit (sq_wal_hook):
                                      try a RESTART checkpoint before the next write */
  int ck_woken_at;                 /* write path only: the WAL's pages when the checkpointer
                                      was last woken (0: since the WAL started again) */
  int low_space;                   /* write path only: 0 normal; 1 short of space (a write met a
                                      full disk, or little space is free); 2 the small-WAL
                                      settings of sq_reclaim_wal are applied */
  unsigned space_checks;           /* write path only: counts writes between free-space checks */
  int incremental;                 /* the file is in auto_vacuum=INCREMENTAL mode (read at open) */
  int secure_delete;               /* §3.10: the write connection zeroes what it deletes */
  int vacuum_due;                  /* write path only: free pages are left to give back (a pass
                                      could not run, or there were more than one pass takes) */
  sq_conn w;                       /* the write connection */
  es_txn wt;                       /* the write transaction (one at a time: the core serialises) */
  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;
  sq_reader *free_readers;
  sq_reader *all_readers;
  int n_readers;                   /* opened or being opened */
  pthread_mutex_t watch_mu;
  sq_conn watch;                   /* data_version */
  /* ext_version (under watch_mu): commits of other connections seen, the
   * watch connection's data_version that is accounted for, and the write
   * connection's after its last commit (it moves only when another
   * connection commits) */
  uint64_t foreign;
  int64_t watch_dv, w_dv;
  /* The checkpointer (sq_ckpt_main; read-write handles). ck_started is
   * set at open before the WAL hook is installed; ck is used by the
   * thread alone between its start and its join. */
  int ck_started;
  pthread_t ck_thread;
  sq_conn ck;
  pthread_mutex_t ck_mu;
  pthread_cond_t ck_cv;            /* the thread sleeps on it */
  pthread_cond_t ck_idle_cv;       /* sq_ckpt_pause waits on it for a pass to end */
  int ck_wake;                     /* under ck_mu: a commit asked for a pass */
  int ck_stop;                     /* under ck_mu: close: end the thread */
  int ck_paused;                   /* under ck_mu: no pass may start (sq_ckpt_pause) */
  int ck_in_pass;                  /* under ck_mu: a checkpoint is running */
};

/* ---- small helpers ---------------------------------------------------- */

static int64_t sq_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sq_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* What an SQLite result code means for the user, named plainly. */
static const char *sq_cause(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL: return "disk full";
    case SQLITE_CORRUPT: return "database corrupt";
    case SQLITE_NOTADB: return "not a database: corrupt, or not an SQLite file";
    case SQLITE_READONLY: return "read-only";
    case SQLITE_BUSY: return "locked by another writer";
    case SQLITE_LOCKED: return "locked";
    case SQLITE_IOERR: return "I/O error";
    case SQLITE_CANTOPEN: return "cannot open the file";
    case SQLITE_NOMEM: return "out of memory";
    case SQLITE_PERM: return "permission denied";
    case SQLITE_CONSTRAINT: return "constraint violated";
    case SQLITE_TOOBIG: return "value too large";
    default: return "error";
  }
}

/* Whether a failure means the disk (or max_pages, or a quota) is full. SQLite
 * reports most of these as SQLITE_FULL, but a -shm that cannot grow comes
 * back as an I/O error whose errno says so (only then is errno looked at:
 * it may be left over from an earlier failure). */
static int sq_is_full(int rc, int sys) {
  return (rc & 0xff) == SQLITE_FULL || ((rc & 0xff) == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT));
}

/* Fills err with ES_STORAGE: "sqlite PATH: WHAT: CAUSE (sqlite message[, errno text])".
 * A full disk met by the write connection also arms the recovery that
 * sq_write_begin runs (see sq_reclaim_wal). */
static int sq_fail(es_err *err, sq_conn *c, int rc, const char *what) {
  const char *msg = c && c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc);
  int sys = c && c->db ? sqlite3_system_errno(c->db) : 0;
  const char *path = c && c->b ? c->b->path : "";
  int prim = rc & 0xff;
  if (sq_is_full(rc, sys)) {
    if (c && c->b && c == &c->b->w) {
      c->b->ckpt_due = 1;
      if (!c->b->low_space) c->b->low_space = 1;
    }
    if (prim != SQLITE_FULL)
      return es_fail(err, ES_STORAGE, "sqlite %s: %s: disk full (%s; %s)", path, what, msg,
                     strerror(sys));
  }
  if (prim == SQLITE_BUSY) {
    return es_fail(err, ES_STORAGE, "sqlite %s: %s: %s for %d ms (%s)", path, what, sq_cause(rc),
                   c && c->b ? c->b->busy_ms : 0, msg);
  }
  if (sys && (prim == SQLITE_IOERR || prim == SQLITE_CANTOPEN || prim == SQLITE_FULL ||
              prim == SQLITE_READONLY || prim == SQLITE_PERM)) {
    return es_fail(err, ES_STORAGE, "sqlite %s: %s: %s (%s; %s)", path, what, sq_cause(rc), msg,
                   strerror(sys));
  }
  return es_fail(err, ES_STORAGE, "sqlite %s: %s: %s (%s)", path, what, sq_cause(rc), msg);
}

/* path followed by suffix, e.g. "x.db-wal". Caller frees; NULL when out of memory. */
static char *sq_path_with(const char *path, const char *suffix) {
  size_t n = strlen(path), m = strlen(suffix);
  char *s = malloc(n + m + 1);
  if (!s) return NULL;
  memcpy(s, path, n);
  memcpy(s + n, suffix, m + 1);
  return s;
}

static int sq_oom(es_err *err) {
  return es_fail(err, ES_STORAGE, "sqlite: out of memory");
}

static char *sq_dup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  if (n) memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* Our busy handler: short sleeps (1-5 ms) so waiting writers of several
 * processes get in soon after a commit, up to busy_ms in all. */
static int sq_busy_handler(void *ctx, int count) {
  sq_conn *c = ctx;
  int64_t now = sq_mono_ms();
  if (count == 0) c->busy_since = now;
  if (c->no_wait || now - c->busy_since >= c->b->busy_ms) return 0;
  sq_sleep_ms(count < 10 ? 1 : count < 50 ? 2 : 5);
  return 1;
}

/* ---- statements ------------------------------------------------------- */

/* Borrows the statement `id` of c, reset and ready to bind. When it is
 * already being stepped (re-entry from a callback) a temporary statement is
 * prepared; *temp tells sq_stmt_done to finalize it. */
static int sq_stmt(sq_conn *c, int id, sqlite3_stmt **out, int *temp, es_err *err) {
  int rc;
  *temp = 0;
  if (c->st[id] && !c->active[id]) {
    c->active[id] = 1;
    *out = c->st[id];
    return ES_OK;
  }
  if (!c->st[id]) {
    rc = sqlite3_prepare_v3(c->db, sq_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &c->st[id], NULL);
    if (rc != SQLITE_OK) {
      c->st[id] = NULL;
      return sq_fail(err, c, rc, "prepare");
    }
    c->active[id] = 1;
    *out = c->st[id];
    return ES_OK;
  }
  rc = sqlite3_prepare_v3(c->db, sq_sql[id], -1, 0, out, NULL);
  if (rc != SQLITE_OK) return sq_fail(err, c, rc, "prepare");
  *temp = 1;
  return ES_OK;
}

static void sq_stmt_done(sq_conn *c, int id, sqlite3_stmt *st, int temp) {
  if (temp) {
    sqlite3_finalize(st);
    return;
  }
  sqlite3_reset(st);
  c->active[id] = 0;
}

static void sq_conn_finalize(sq_conn *c) {
  for (int i = 0; i < ST_COUNT; i++) {
    if (c->st[i]) sqlite3_finalize(c->st[i]);
    c->st[i] = NULL;
    c->active[i] = 0;
  }
}

/* A transaction may be used after SQLite rolled it back on its own (some
 * I/O, full-disk and out-of-memory errors do that): every later call fails,
 * so a group commit never commits the rest of the batch as if nothing
 * happened. */
static void sq_txn_break(es_txn *t, const char *msg);

static int sq_txn_check(es_txn *t, es_err *err) {
  /* belt and braces: a write transaction that is no longer open on its
   * connection must not go on (a SAVEPOINT would silently start a new one) */
  if (t->write && !t->broken && sqlite3_get_autocommit(t->c->db))
    sq_txn_break(t, "SQLite ended the transaction");
  if (t->broken)
    return es_fail(err, ES_STORAGE, "sqlite %s: the transaction was rolled back by an earlier error: %s",
                   t->b->path, t->broken_msg);
  return ES_OK;
}

/* Marks t broken with msg as the cause (without our "sqlite PATH: " prefix). */
static void sq_txn_break(es_txn *t, const char *msg) {
  size_t n = strlen(t->b->path);
  if (strncmp(msg, "sqlite ", 7) == 0 && strncmp(msg + 7, t->b->path, n) == 0 && msg[7 + n] == ':')
    msg += 7 + n + 1 + (msg[8 + n] == ' ');
  t->broken = 1;
  snprintf(t->broken_msg, sizeof t->broken_msg, "%s", msg);
}

/* After a failed step: records err, and marks t broken when SQLite left the
 * transaction. */
static int sq_txn_fail(es_txn *t, int rc, const char *what, es_err *err) {
  int code = sq_fail(err, t->c, rc, what);
  if (sqlite3_get_autocommit(t->c->db) && !t->broken) sq_txn_break(t, err ? err->msg : sq_cause(rc));
  return code;
}

/* Runs a statement without results (BEGIN, SAVEPOINT, ...) on c. */
static int sq_exec_id(sq_conn *c, int id, es_err *err) {
  sqlite3_stmt *st;
  int temp, rc, code;
  if ((code = sq_stmt(c, id, &st, &temp, err)) != ES_OK) return code;
  rc = sqlite3_step(st);
  sq_stmt_done(c, id, st, temp);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW)
    return sq_fail(err, c, rc,
                   id == ST_BEGIN_WRITE ? "cannot begin a write transaction"
                   : id == ST_BEGIN_READ ? "cannot begin a read transaction"
                   : id == ST_COMMIT ? "commit" : "savepoint");
  return ES_OK;
}

/* ---- binding and decoding ----------------------------------------------- */

static int sq_bind_opt(sqlite3_stmt *st, int i, int64_t v) {
  return v == ES_NONE ? sqlite3_bind_null(st, i) : sqlite3_bind_int64(st, i, v);
}

static int sq_bind_str(sqlite3_stmt *st, int i, const char *s) {
  return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

static int sq_bind_bytes_text(sqlite3_stmt *st, int i, const char *s, size_t n) {
  return s ? sqlite3_bind_text64(st, i, s, n, SQLITE_STATIC, SQLITE_UTF8) : sqlite3_bind_null(st, i);
}

static int64_t sq_col_opt(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? ES_NONE : sqlite3_column_int64(st, i);
}

/* A text column: borrowed (copy 0, valid until the next step) or copied. */
static int sq_col_str(sqlite3_stmt *st, int i, int copy, char **dst, size_t *len) {
  const unsigned char *p;
  size_t n;
  if (sqlite3_column_type(st, i) == SQLITE_NULL) {
    *dst = NULL;
    if (len) *len = 0;
    return ES_OK;
  }
  p = sqlite3_column_text(st, i);
  n = (size_t)sqlite3_column_bytes(st, i);
  if (!p) return ES_STORAGE;
  if (len) *len = n;
  if (!copy) {
    *dst = (char *)p;
    return ES_OK;
  }
  *dst = sq_dup((const char *)p, n);
  return *dst ? ES_OK : ES_STORAGE;
}

static int sq_bind_event_at(sqlite3_stmt *st, int o, const es_event *e, int64_t position);

static int sq_bind_event(sqlite3_stmt *st, const es_event *e, int64_t position) {
  return sq_bind_event_at(st, 0, e, position);
}

/* Binds e at parameters o + 1 .. o + 29 (o: 0, or a later row's offset in
 * a several-row INSERT). */
static int sq_bind_event_at(sqlite3_stmt *st, int o, const es_event *e, int64_t position) {
  int rc = SQLITE_OK;
  rc |= sq_bind_opt(st, o + 1, position);
  rc |= sq_bind_str(st, o + 2, e->session);
  rc |= sqlite3_bind_int64(st, o + 3, e->index);
  rc |= sq_bind_str(st, o + 4, e->id);
  rc |= sq_bind_str(st, o + 5, e->type);
  /* a long payload goes to `payloads` (sq_payloads_put): NULL here */
  rc |= e->payload_len > SQ_PAYLOAD_INLINE ? sqlite3_bind_null(st, o + 6)
                                           : sq_bind_bytes_text(st, o + 6, e->payload, e->payload_len);
  rc |= sq_bind_str(st, o + 7, e->lane);
  rc |= sq_bind_opt(st, o + 8, e->created_at);
  rc |= sq_bind_opt(st, o + 9, e->cause_index);
  rc |= sq_bind_opt(st, o + 10, e->cause_attempt);
  rc |= sq_bind_opt(st, o + 11, e->not_before);
  rc |= sqlite3_bind_int(st, o + 12, e->status);
  rc |= sq_bind_opt(st, o + 13, e->attempts);
  rc |= sq_bind_opt(st, o + 14, e->failures);
  rc |= sq_bind_str(st, o + 15, e->last_error);
  rc |= sq_bind_opt(st, o + 16, e->processed_at);
  rc |= sq_bind_str(st, o + 17, e->claim_holder);
  rc |= sq_bind_opt(st, o + 18, e->claim_expires_at);
  rc |= sq_bind_opt(st, o + 19, e->retry_at);
  rc |= sqlite3_bind_int(st, o + 20, e->queued);
  rc |= sq_bind_opt(st, o + 21, e->due_at);
  rc |= sq_bind_opt(st, o + 22, e->last_failed_attempt);
  rc |= sq_bind_opt(st, o + 23, e->returned);
  rc |= sq_bind_str(st, o + 24, e->origin_session);
  rc |= sq_bind_opt(st, o + 25, e->origin_index);
  rc |= sq_bind_opt(st, o + 26, e->first_claimed_at);
  rc |= sq_bind_opt(st, o + 27, e->last_claimed_at);
  rc |= sq_bind_opt(st, o + 28, e->failed_at);
  rc |= sq_bind_opt(st, o + 29, e->processed_by_attempt);
  return rc;
}

/* Whether e's meta is kept apart (SQ_META). */
static int sq_meta_apart(const es_event *e) { return e->meta && strlen(e->meta) > SQ_PAYLOAD_INLINE; }

/* Binds the columns only an insert writes (o as sq_bind_event_at): key,
 * revision, meta (?30..?32; a long meta goes to `payloads`: NULL here). */
static int sq_bind_immutable(sqlite3_stmt *st, int o, const es_event *e) {
  return sq_bind_str(st, o + 30, e->key) | sqlite3_bind_int64(st, o + 31, e->revision) |
         (sq_meta_apart(e) ? sqlite3_bind_null(st, o + 32) : sq_bind_str(st, o + 32, e->meta));
}

/* Decodes the current row (EV_COLS) into e: strings borrowed from the
 * statement (copy 0) or owned (copy 1; on failure e is left empty). */
static int sq_decode_event(sqlite3_stmt *st, int copy, es_event *e) {
  es_event_init(e);
  e->position = sqlite3_column_int64(st, 0);
  e->index = sqlite3_column_int64(st, 2);
  e->created_at = sq_col_opt(st, 7);
  e->cause_index = sq_col_opt(st, 8);
  e->cause_attempt = sq_col_opt(st, 9);
  e->not_before = sq_col_opt(st, 10);
  e->status = sqlite3_column_int(st, 11);
  e->attempts = sq_col_opt(st, 12);
  e->failures = sq_col_opt(st, 13);
  e->processed_at = sq_col_opt(st, 15);
  e->claim_expires_at = sq_col_opt(st, 17);
  e->retry_at = sq_col_opt(st, 18);
  e->queued = sqlite3_column_int(st, 19);
  e->due_at = sq_col_opt(st, 20);
  e->last_failed_attempt = sq_col_opt(st, 21);
  e->returned = sq_col_opt(st, 22);
  e->origin_index = sq_col_opt(st, 24);
  e->first_claimed_at = sq_col_opt(st, 25);
  e->last_claimed_at = sq_col_opt(st, 26);
  e->failed_at = sq_col_opt(st, 27);
  e->processed_by_attempt = sq_col_opt(st, 28);
  e->revision = sqlite3_column_int64(st, 30); /* NOT NULL DEFAULT 1 */
  if (sq_col_str(st, 29, copy, &e->key, NULL) || sq_col_str(st, 31, copy, &e->meta, NULL) ||
      sq_col_str(st, 1, copy, &e->session, NULL) || sq_col_str(st, 3, copy, &e->id, NULL) ||
      sq_col_str(st, 4, copy, &e->type, NULL) ||
      sq_col_str(st, 5, copy, &e->payload, &e->payload_len) ||
      sq_col_str(st, 6, copy, &e->lane, NULL) || sq_col_str(st, 14, copy, &e->last_error, NULL) ||
      sq_col_str(st, 16, copy, &e->claim_holder, NULL) ||
      sq_col_str(st, 23, copy, &e->origin_session, NULL)) {
    if (copy) es_event_destroy(e);
    return ES_STORAGE;
  }
  return ES_OK;
}

static int sq_decode_session(sqlite3_stmt *st, int copy, es_session_info *si) {
  es_session_info_init(si);
  si->head = sqlite3_column_int64(st, 1);
  si->events = sqlite3_column_int64(st, 2);
  si->pending = sqlite3_column_int64(st, 3);
  si->dead = sqlite3_column_int64(st, 4);
  si->attempts = sqlite3_column_int64(st, 5);
  si->failures = sqlite3_column_int64(st, 6);
  si->first_at = sq_col_opt(st, 7);
  si->updated_at = sq_col_opt(st, 8);
  si->fence = sqlite3_column_int64(st, 9);
  si->sealed_at = sq_col_opt(st, 10);
  si->lease_token = sq_col_opt(st, 13);
  si->lease_expires_at = sq_col_opt(st, 14);
  si->fork_at = sq_col_opt(st, 16);
  si->forked_at = sq_col_opt(st, 17);
  si->first_index = sqlite3_column_int64(st, 18); /* NOT NULL DEFAULT 1: older rows read 1 */
  si->archived_through = sqlite3_column_int64(st, 19); /* NOT NULL DEFAULT 0 */
  if (sq_col_str(st, 0, copy, &si->session, NULL) || sq_col_str(st, 11, copy, &si->seal_reason, NULL) ||
      sq_col_str(st, 12, copy, &si->lease_holder, NULL) || sq_col_str(st, 15, copy, &si->parent, NULL)) {
    if (copy) es_session_info_destroy(si);
    return ES_STORAGE;
  }
  return ES_OK;
}

/* reducer, idx, state (blob), version, updated_at */
static int sq_decode_snapshot(sqlite3_stmt *st, int copy, es_snapshot *sn) {
  es_snapshot_init(sn);
  sn->index = sqlite3_column_int64(st, 1);
  sn->updated_at = sq_col_opt(st, 4);
  if (sq_col_str(st, 0, copy, &sn->reducer, NULL) || sq_col_str(st, 3, copy, &sn->version, NULL))
    goto oom;
  if (sqlite3_column_type(st, 2) != SQLITE_NULL) {
    const void *p = sqlite3_column_blob(st, 2);
    size_t n = (size_t)sqlite3_column_bytes(st, 2);
    sn->state_len = n;
    if (!p) p = ""; /* an empty blob reads back as NULL from SQLite: keep it "" */
    if (copy) {
      sn->state = sq_dup(p, n);
      if (!sn->state) goto oom;
    } else {
      sn->state = (char *)p; /* borrowed, never written through */
    }
  }
  return ES_OK;
oom:
  if (copy) es_snapshot_destroy(sn);
  return ES_STORAGE;
}

/* REF_COLS; head is not stored (the core fills it): ES_NONE. */
static int sq_decode_ref(sqlite3_stmt *st, int copy, es_ref *r) {
  es_ref_init(r);
  r->created_at = sq_col_opt(st, 2);
  r->updated_at = sq_col_opt(st, 3);
  if (sq_col_str(st, 0, copy, &r->name, NULL) || sq_col_str(st, 1, copy, &r->session, NULL)) {
    if (copy) es_ref_destroy(r);
    return ES_STORAGE;
  }
  return ES_OK;
}

/* participant, field, value, seen, at, expires_at */
static int sq_decode_presence(sqlite3_stmt *st, int copy, es_presence_row *r) {
  es_presence_row_init(r);
  r->seen = sq_col_opt(st, 3);
  r->at = sq_col_opt(st, 4);
  r->expires_at = sq_col_opt(st, 5);
  if (sq_col_str(st, 0, copy, &r->participant, NULL) || sq_col_str(st, 1, copy, &r->field, NULL) ||
      sq_col_str(st, 2, copy, &r->value, &r->value_len)) {
    if (copy) es_presence_row_destroy(r);
    return ES_STORAGE;
  }
  return ES_OK;
}

/* ---- iteration ---------------------------------------------------------- */

/* The row kinds that are iterated with callbacks. */
enum { ROW_EVENT, ROW_SESSION, ROW_SNAPSHOT, ROW_PRESENCE, ROW_REF };

typedef union sq_row {
  es_event ev;
  es_session_info se;
  es_snapshot sn;
  es_presence_row pr;
  es_ref rf;
} sq_row;

/* Decodes the current row of a statement of row kind `kind` into out (an
 * es_event, es_session_info, es_snapshot, es_presence_row or es_ref). */
static int sq_decode(int kind, sqlite3_stmt *st, int copy, void *out) {
  switch (kind) {
    case ROW_EVENT: return sq_decode_event(st, copy, out);
    case ROW_SESSION: return sq_decode_session(st, copy, out);
    case ROW_SNAPSHOT: return sq_decode_snapshot(st, copy, out);
    case ROW_REF: return sq_decode_ref(st, copy, out);
    default: return sq_decode_presence(st, copy, out);
  }
}

static void sq_row_destroy(int kind, sq_row *r) {
  switch (kind) {
    case ROW_EVENT: es_event_destroy(&r->ev); break;
    case ROW_SESSION: es_session_info_destroy(&r->se); break;
    case ROW_SNAPSHOT: es_snapshot_destroy(&r->sn); break;
    case ROW_REF: es_ref_destroy(&r->rf); break;
    default: es_presence_row_destroy(&r->pr); break;
  }
}

/* Any callback type, for passing through sq_iterate (converted back by kind). */
typedef void (*sq_fn)(void);

static int sq_call(int kind, sq_fn cb, void *ctx, const sq_row *r) {
  switch (kind) {
    case ROW_EVENT: return ((es_event_cb)cb)(ctx, &r->ev);
    case ROW_SESSION: return ((es_session_cb)cb)(ctx, &r->se);
    case ROW_SNAPSHOT: return ((es_snapshot_cb)cb)(ctx, &r->sn);
    case ROW_REF: return ((es_ref_cb)cb)(ctx, &r->rf);
    default: return ((es_presence_cb_row)cb)(ctx, &r->pr);
  }
}

/* Steps a bound statement and hands each row to cb.
 * In a read transaction rows stream straight from SQLite (borrowed
 * strings). In the write transaction the rows are copied out and the
 * statement reset before the first callback: a callback may then write
 * (e.g. update the rows it is given) without the scan seeing its own changes
 * (SQLite leaves that undefined) and without holding a statement open. */
static int sq_iterate(es_txn *t, int id, sqlite3_stmt *st, int temp, int kind, sq_fn cb, void *ctx,
                      es_err *err) {
  sq_row r;
  int rc, code = ES_OK;
  if (!t->write) {
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (sq_decode(kind, st, 0, &r) != ES_OK) {
        code = sq_oom(err);
        break;
      }
      if (sq_call(kind, cb, ctx, &r)) break;
    }
    if (code == ES_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
    sq_stmt_done(t->c, id, st, temp);
    return code;
  }
  sq_row *rows = NULL;
  size_t n = 0, cap = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      sq_row *nr = realloc(rows, ncap * sizeof *nr);
      if (!nr) {
        code = sq_oom(err);
        break;
      }
      rows = nr;
      cap = ncap;
    }
    if (sq_decode(kind, st, 1, &rows[n]) != ES_OK) {
      code = sq_oom(err);
      break;
    }
    n++;
  }
  if (code == ES_OK && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, id, st, temp);
  size_t i = 0;
  if (code == ES_OK)
    for (; i < n; i++)
      if (sq_call(kind, cb, ctx, &rows[i])) break;
  for (i = 0; i < n; i++) sq_row_destroy(kind, &rows[i]);
  free(rows);
  return code;
}

static int sq_behind_flush(es_txn *t, es_err *err);
static int sq_counts_write(es_txn *t, es_err *err);

/* Statements that neither read nor write the sessions table (nor the
 * counts moved with it): session rows written behind may wait past
 * them (sq_behind_flush). */
static int sq_behind_may_wait(int id) {
  switch (id) {
    case ST_EVENT_GET: case ST_EVENT_GET_BY_ID: case ST_EVENT_UPDATE: case ST_EVENT_CLAIM:
    case ST_EVENT_COMPLETE:
    case ST_EVENT_INSERT:
    case ST_EVENT_INSERT_4: case ST_EVENT_INSERT_16: case ST_EVENT_INSERT_64: case ST_PAYLOAD_PUT:
    case ST_LANE_NEXT:
    case ST_QUEUED_DUE_ALL: case ST_QUEUED_DUE_SESSION: case ST_QUEUED_DUE_SESSION_BY_DUE:
    case ST_QUEUED_WINDOW_COUNT: case ST_QUEUED_NEXT_ALL: case ST_QUEUED_NEXT_SESSION:
    case ST_QUEUED_NEXT_SESSION_CLAIMED:
    case ST_QUEUED_DUE_TYPE: case ST_QUEUED_NEXT_TYPE: case ST_QUEUED_DUE_ALL_SCOPED:
    case ST_QUEUED_NEXT_ALL_SCOPED: case ST_QUEUED_DUE_TYPE_SCOPED: case ST_QUEUED_NEXT_TYPE_SCOPED:
    case ST_SESSION_GET: case ST_SESSION_PUT:
      return 1;
    default:
      return 0;
  }
}

static const char *sq_behind_key(const void *item);
static void sq_behind_forget(es_txn *t);

/* Begins a row operation on t: checks the transaction, writes the session
 * rows waiting unless the statement may pass them, borrows statement id. */
static int sq_op(es_txn *t, int id, sqlite3_stmt **st, int *temp, es_err *err) {
  int code = sq_txn_check(t, err);
  if (code != ES_OK) return code;
  if (t->behind.count && !sq_behind_may_wait(id) && (code = sq_behind_flush(t, err)) != ES_OK)
    return code;
  return sq_stmt(t->c, id, st, temp, err);
}

static int sq_read_only_txn(es_err *err) {
  return es_fail(err, ES_STORAGE, "sqlite: a write inside a read transaction");
}

static int64_t sq_limit(int64_t limit) {
  return (limit == ES_NONE || limit < 0) ? -1 : limit;
}

/* Steps a statement expected to give at most one row into out (kind);
 * ES_NOT_FOUND when none. */
static int sq_get_one(es_txn *t, int id, sqlite3_stmt *st, int temp, int kind, void *out,
                      es_err *err) {
  int rc = sqlite3_step(st), code = ES_OK;
  if (rc == SQLITE_ROW) {
    if (sq_decode(kind, st, 1, out) != ES_OK) code = sq_oom(err);
  } else if (rc == SQLITE_DONE) {
    code = ES_NOT_FOUND;
  } else {
    code = sq_txn_fail(t, rc, "read", err);
  }
  sq_stmt_done(t->c, id, st, temp);
  return code;
}

/* Steps a write statement to completion. */
static int sq_run(es_txn *t, int id, sqlite3_stmt *st, int temp, const char *what, es_err *err) {
  int rc = sqlite3_step(st), code = ES_OK;
  if (rc != SQLITE_DONE) code = sq_txn_fail(t, rc, what, err);
  sq_stmt_done(t->c, id, st, temp);
  return code;
}

static int sq_bind_fail(es_txn *t, int id, sqlite3_stmt *st, int temp, es_err *err) {
  int code = sq_fail(err, t->c, sqlite3_errcode(t->c->db), "bind");
  sq_stmt_done(t->c, id, st, temp);
  return code;
}

/* ---- connections -------------------------------------------------------- */

/* Runs sql on c; on failure err says `what` failed. */
static int sq_conn_exec(sq_conn *c, const char *sql, const char *what, es_err *err) {
  int rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? ES_OK : sq_fail(err, c, rc, what ? what : sql);
}

/* "file:PATH?immutable=1" with PATH's '%', '?' and '#' escaped (the only
 * bytes SQLite's URI parser would not take literally in a path); an
 * absolute PATH gets an empty authority ("file://" PATH), so "//x" stays a
 * path. Caller frees; NULL when out of memory. */
static char *sq_immutable_uri(const char *path) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(path);
  char *u = malloc(7 + 3 * n + sizeof "?immutable=1");
  char *o = u;
  if (!u) return NULL;
  memcpy(o, "file://", 7);
  o += path[0] == '/' ? 7 : 5;
  for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
    if (*p == '%' || *p == '?' || *p == '#') {
      *o++ = '%';
      *o++ = hex[*p >> 4];
      *o++ = hex[*p & 15];
    } else {
      *o++ = (char)*p;
    }
  }
  memcpy(o, "?immutable=1", sizeof "?immutable=1");
  return u;
}

/* es_copy_id(): the next id from the generator event_copy set on the
 * connection (NOT deterministic, so SQLite calls it once per row). */
static void sq_fn_copy_id(sqlite3_context *cx, int argc, sqlite3_value **argv) {
  (void)argc;
  (void)argv;
  sq_conn *c = sqlite3_user_data(cx);
  char id[ES_MAX_NAME_BYTES + 1]; /* a tenant's fork: prefixed ids (§3.11) */
  if (!c->copy_id) {
    sqlite3_result_error(cx, "es_copy_id() runs only inside event_copy", -1);
    return;
  }
  int rc = c->copy_id(c->copy_id_ctx, id, sizeof id, &c->copy_err);
  if (rc != ES_OK) {
    c->copy_rc = rc;
    sqlite3_result_error(cx, c->copy_err.msg, -1);
    return;
  }
  sqlite3_result_text(cx, id, -1, SQLITE_TRANSIENT);
}

/* Opens c on the backend's file with its mode and settings. primary: the
 * write connection (may create the file; the others are query_only). */
static int sq_conn_open(es_backend *b, sq_conn *c, int primary, es_err *err) {
  int create = primary && b->mode == SQ_MODE_RWC;
  int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_PRIVATECACHE;
  int rc, code;
  char sql[96], *uri = NULL;
  const char *name = b->full_path ? b->full_path : b->path;
  memset(c, 0, sizeof *c);
  c->b = b;
  if (b->mode == SQ_MODE_RO)
    flags |= SQLITE_OPEN_READONLY;
  else
    flags |= SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  if (b->immutable) {
    if (!(uri = sq_immutable_uri(name))) return sq_oom(err);
    name = uri;
    flags |= SQLITE_OPEN_URI;
  }
  /* sqlite_vfs.c: the default VFS, with WAL writes gathered where a
   * connection turns that on; the default itself if it cannot be had */
  rc = sqlite3_open_v2(name, &c->db, flags, sq_vfs_register() == SQLITE_OK ? SQ_VFS_NAME : NULL);
  free(uri);
  if (rc != SQLITE_OK) {
    int sys = c->db ? sqlite3_system_errno(c->db) : 0;
    if (!c->db) return sq_oom(err);
    if ((rc & 0xff) == SQLITE_CANTOPEN && sys == ENOENT && !create)
      code = es_fail(err, ES_STORAGE, "sqlite %s: cannot open: the file does not exist", b->path);
    else
      code = sq_fail(err, c, rc, "cannot open");
    sqlite3_close_v2(c->db);
    c->db = NULL;
    return code;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_handler(c->db, sq_busy_handler, c);
  if (primary && sqlite3_create_function(c->db, "es_copy_id", 0, SQLITE_UTF8, c, sq_fn_copy_id,
                                         NULL, NULL) != SQLITE_OK) {
    code = sq_fail(err, c, sqlite3_errcode(c->db), "cannot open");
    sqlite3_close_v2(c->db);
    c->db = NULL;
    return code;
  }
  if (b->mode != SQ_MODE_RO && sqlite3_db_readonly(c->db, "main") == 1) {
    struct statvfs vfs;
    int ro_fs = statvfs(b->full_path ? b->full_path : b->path, &vfs) == 0 &&
                (vfs.f_flag & ST_RDONLY);
    code = es_fail(err, ES_STORAGE,
                   "sqlite %s: the file is read-only%s (open it with \"sqlite:%s?mode=ro\" to read it)",
                   b->path, ro_fs ? " (on a read-only file system)" : "", b->path);
    sqlite3_close_v2(c->db);
    c->db = NULL;
    return code;
  }
  if (b->max_pages > 0) {
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld", (long long)b->max_pages);
    if ((code = sq_conn_exec(c, sql, "cannot read the file", err)) != ES_OK) goto fail;
  }
  if (b->mode != SQ_MODE_RO) {
    snprintf(sql, sizeof sql, "PRAGMA synchronous = %s",
             b->sync == SQ_SYNC_FULL ? "FULL" : "NORMAL");
    if ((code = sq_conn_exec(c, sql, "cannot read the file", err)) != ES_OK) goto fail;
    /* docs/sqlite.md "WAL writes gathered": only where every commit syncs */
    if (primary && b->sync == SQ_SYNC_FULL) b->gathered = sq_vfs_gather(c->db, 1) == SQLITE_OK;
  }
  /* §3.10: deleted rows and freed pages are overwritten with zeros, so a
   * shredded key or a dropped snapshot is not left in the file's free
   * space (the WAL's old frames are cleared by sq_scrub). Only the write
   * connection deletes. */
  if (primary && b->secure_delete &&
      (code = sq_conn_exec(c, "PRAGMA secure_delete = ON", "cannot set up the file", err)) != ES_OK)
    goto fail;
  /* The write connection's statement and savepoint journals (the undo
   * of one caller's work inside a group commit, or of a statement that
   * fails halfway) stay in memory: past 64 KiB SQLite would otherwise
   * create, write and delete a temporary file for them in every write
   * transaction (an open, an unlink and dozens of writes per commit of a
   * batch of 100 events). They hold the pages one caller's call changed,
   * and are dropped when its savepoint is released. */
  if (primary && b->mode != SQ_MODE_RO &&
      (code = sq_conn_exec(c, "PRAGMA temp_store = MEMORY", "cannot set up the file", err)) != ES_OK)
    goto fail;
  /* Readers and the watch connection never write: let SQLite enforce it. */
  if (!primary && (code = sq_conn_exec(c, "PRAGMA query_only = 1", "cannot read the file", err)) != ES_OK)
    goto fail;
  return ES_OK;
fail:
  sqlite3_close_v2(c->db);
  c->db = NULL;
  return code;
}

static void sq_conn_close(sq_conn *c) {
  if (!c->db) return;
  sq_conn_finalize(c);
  sqlite3_close_v2(c->db);
  c->db = NULL;
}

/* Reads one integer pragma on c. */
static int sq_pragma_int(sq_conn *c, const char *sql, int64_t *out, es_err *err) {
  sqlite3_stmt *st;
  int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) return sq_fail(err, c, rc, sql);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(st, 0);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    *out = 0;
    rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  return rc == SQLITE_OK ? ES_OK : sq_fail(err, c, rc, sql);
}

/* WAL mode (persistent in the file; set once, by whoever opens it first). */
static int sq_setup_wal(es_backend *b, es_err *err) {
  sqlite3_stmt *st;
  sq_conn *c = &b->w;
  int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
  if (rc != SQLITE_OK) return sq_fail(err, c, rc, "cannot read the file");
  rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    sqlite3_finalize(st);
    return sq_fail(err, c, rc, "cannot read the file");
  }
  const char *mode = (const char *)sqlite3_column_text(st, 0);
  int ok = mode && strcmp(mode, "wal") == 0;
  char got[32];
  snprintf(got, sizeof got, "%s", mode ? mode : "?");
  sqlite3_finalize(st);
  if (!ok)
    return es_fail(err, ES_STORAGE, "sqlite %s: cannot switch the file to WAL mode (it is in %s mode)",
                   b->path, got);
  return ES_OK;
}

/* Formats an application id for messages: 0x47504B47 ("GPKG"), the quoted
 * part only when all four bytes are printable ASCII. */
static void sq_app_text(int64_t app, char *buf, size_t size) {
  uint32_t u = (uint32_t)app;
  char tag[5];
  int printable = 1;
  for (int i = 0; i < 4; i++) {
    tag[i] = (char)(u >> (24 - 8 * i));
    if (tag[i] < 0x20 || tag[i] > 0x7e) printable = 0;
  }
  tag[4] = '\0';
  if (printable)
    snprintf(buf, size, "0x%08" PRIX32 " (\"%s\")", u, tag);
  else
    snprintf(buf, size, "0x%08" PRIX32, u);
}

static int sq_foreign_app(es_backend *b, int64_t app, es_err *err) {
  char text[32];
  sq_app_text(app, text, sizeof text);
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "sqlite %s: not an eventstore database: application_id %s, not 0x%08X (\"ESTB\"); "
                 "it belongs to another application and is left untouched",
                 b->path, text, SQ_APPLICATION_ID);
}

/* Judges an existing, non-empty file from its first 100 bytes, read with
 * plain read(2) before SQLite opens it: a file that is not SQLite at all, or
 * another application's SQLite file (a foreign application_id), is refused
 * without SQLite ever touching it (no -wal, no -shm, no hot-journal
 * rollback). What the header cannot settle (application_id 0: new, empty or
 * foreign) sq_schema_read settles through SQLite, still without writing.
 * A file this process cannot read is left to SQLite, which names the cause. */
static int sq_check_header(es_backend *b, es_err *err) {
  static const char magic[16] = "SQLite format 3";   /* with its NUL: 16 bytes */
  unsigned char h[100];
  /* Read through SQLite's own file layer, never with open()/close(): the
   * file may already be open in this process (a second handle on it, a
   * shard opened directly), and closing any descriptor of a file drops
   * every POSIX lock this process holds on it. Another process could then
   * think itself the file's last user and delete the -wal and -shm under
   * the open handle (reads fail with "disk I/O error", commits can be
   * lost). SQLite's unix layer keeps such a descriptor open until the
   * process's last connection to the file closes. */
  sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
  sqlite3_file *f = vfs ? calloc(1, (size_t)vfs->szOsFile) : NULL;
  if (!f) return es_fail(err, ES_STORAGE, "sqlite %s: out of memory", b->path);
  int out_flags = 0;
  if (vfs->xOpen(vfs, b->path, f, SQLITE_OPEN_READONLY | SQLITE_OPEN_MAIN_DB, &out_flags) !=
      SQLITE_OK) {
    if (f->pMethods) f->pMethods->xClose(f);
    free(f);
    return ES_OK; /* left to SQLite, which names the cause */
  }
  /* a file shorter than the header reads as SQLITE_IOERR_SHORT_READ */
  int read_rc = f->pMethods->xRead(f, h, (int)sizeof h, 0);
  f->pMethods->xClose(f);
  free(f);
  if (read_rc != SQLITE_OK || memcmp(h, magic, sizeof magic) != 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "sqlite %s: not an eventstore database: not an SQLite file (it does not start "
                   "with the SQLite header); it is left untouched",
                   b->path);
  int64_t app = (int64_t)((uint32_t)h[68] << 24 | (uint32_t)h[69] << 16 | (uint32_t)h[70] << 8 | h[71]);
  if (app != 0 && app != SQ_APPLICATION_ID) return sq_foreign_app(b, app, err);
  return ES_OK;
}

/* Reads the file's schema version and application id and judges them,
 * without writing: ES_OK with *migrate 0 (current), ES_OK with *migrate 1
 * (older, or a new or empty file: create / migrate), ES_INVALID_ARGUMENT
 * (not an eventstore database) or ES_STORAGE (newer, damaged, unreadable).
 *
 * Ours are files with our application_id, and files with none (0) only while
 * they are empty: user_version 0 and no table, index, view or trigger. Every
 * schema this code ever wrote set application_id in the same transaction as
 * the tables, so an application_id of 0 next to any schema object is another
 * application's file (e.g. one with a `users` table) and is refused, never
 * stamped. */
static int sq_schema_read(es_backend *b, sq_conn *c, int64_t *version, int *migrate, es_err *err) {
  int64_t app = 0, objects = 0;
  int code;
  *migrate = 0;
  if ((code = sq_pragma_int(c, "PRAGMA user_version", version, err)) != ES_OK) return code;
  if ((code = sq_pragma_int(c, "PRAGMA application_id", &app, err)) != ES_OK) return code;
  if (app != 0 && app != SQ_APPLICATION_ID) return sq_foreign_app(b, app, err);
  if (app == 0) {
    if (*version != 0)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "sqlite %s: not an eventstore database: application_id 0 (not 0x%08X \"ESTB\") "
                     "and user_version %lld; it belongs to another application and is left untouched",
                     b->path, SQ_APPLICATION_ID, (long long)*version);
    if ((code = sq_pragma_int(c, "SELECT count(*) FROM sqlite_master", &objects, err)) != ES_OK)
      return code;
    if (objects > 0) {
      sqlite3_stmt *st;
      char first[64] = "?";
      if (sqlite3_prepare_v2(c->db, "SELECT type, name FROM sqlite_master ORDER BY rowid LIMIT 1", -1,
                             &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
          snprintf(first, sizeof first, "%s %s", (const char *)sqlite3_column_text(st, 0),
                   (const char *)sqlite3_column_text(st, 1));
        sqlite3_finalize(st);
      }
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "sqlite %s: not an eventstore database: application_id 0 (not 0x%08X \"ESTB\") "
                     "and it already holds %lld schema object%s (the first: %s); eventstore only "
                     "initialises a new or empty file, this one is left untouched",
                     b->path, SQ_APPLICATION_ID, (long long)objects, objects == 1 ? "" : "s", first);
    }
  }
  if (*version > SQ_SCHEMA_VERSION)
    return es_fail(err, ES_STORAGE,
                   "sqlite %s: schema version %lld is newer than this eventstore supports (%d); "
                   "upgrade eventstore to open it",
                   b->path, (long long)*version, SQ_SCHEMA_VERSION);
  if (*version < 0)
    return es_fail(err, ES_STORAGE, "sqlite %s: bad schema version %lld", b->path,
                   (long long)*version);
  *migrate = *version < SQ_SCHEMA_VERSION;
  return ES_OK;
}

/* Creates / migrates an older schema (as judged by sq_schema_read) in one
 * write transaction, judging the file again under the lock; refuses to in a
 * read-only open. */
static int sq_setup_schema(es_backend *b, int64_t version, int migrate, es_err *err) {
  sq_conn *c = &b->w;
  int code;
  /* the common case, a current file, takes no write lock */
  if (!migrate) return ES_OK;
  if (b->mode == SQ_MODE_RO)
    return es_fail(err, ES_STORAGE,
                   "sqlite %s: schema version %lld needs migrating to %d, which a read-only "
                   "open cannot do (open it read-write once)",
                   b->path, (long long)version, SQ_SCHEMA_VERSION);
  if ((code = sq_conn_exec(c, "BEGIN IMMEDIATE", "cannot lock the file to set up its schema", err)) != ES_OK)
    return code;
  /* again under the lock: another process may have migrated meanwhile */
  if ((code = sq_schema_read(b, &b->w, &version, &migrate, err)) != ES_OK) goto rollback;
  for (int64_t v = version; migrate && v < SQ_SCHEMA_VERSION; v++) {
    int rc = sqlite3_exec(c->db, sq_migrations[v], NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      char what[96];
      snprintf(what, sizeof what, "migrating schema %lld to %lld failed", (long long)v,
               (long long)v + 1);
      code = sq_fail(err, c, rc, what);
      goto rollback;
    }
  }
  if (migrate) {
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d",
             SQ_SCHEMA_VERSION, SQ_APPLICATION_ID);
    if ((code = sq_conn_exec(c, sql, "recording the schema version", err)) != ES_OK) goto rollback;
  }
  if ((code = sq_conn_exec(c, "COMMIT", "commit", err)) != ES_OK) goto rollback;
  return ES_OK;
rollback:
  if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
  return code;
}

/* ---- URL ---------------------------------------------------------------- */

/* "PATH[?key=value&...]": sync=full|normal, mode=rwc|rw|ro,
 * busy_timeout=ms, readers=n, max_pages=n. */
static int sq_parse_url(es_backend *b, const char *rest, const es_open_opts *opts, es_err *err) {
  const char *q = strchr(rest, '?');
  size_t plen = q ? (size_t)(q - rest) : strlen(rest);
  b->mode = SQ_MODE_RWC;
  b->sync = (opts && opts->durability == 1) ? SQ_SYNC_NORMAL : SQ_SYNC_FULL;
  if (opts && (opts->durability < 0 || opts->durability > 1))
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "sqlite: durability %d unknown (0 full, 1 normal)", opts->durability);
  b->busy_ms = SQ_DEFAULT_BUSY_MS;
  b->max_readers = SQ_DEFAULT_READERS;
  if (plen == 0) return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: the URL names no file (sqlite:PATH)");
  b->path = sq_dup(rest, plen);
  if (!b->path) return sq_oom(err);
  if (strcmp(b->path, ":memory:") == 0 || strncmp(b->path, "file:", 5) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "sqlite: \"%s\" is not supported: give a file path (use memory: for a store in memory)",
                   b->path);
  while (q && *q) {
    const char *k = q + 1, *amp = strchr(k, '&');
    size_t n = amp ? (size_t)(amp - k) : strlen(k);
    char kv[128], *eq, *v;
    int64_t x;
    q = amp;
    if (n == 0) continue;
    if (n >= sizeof kv) return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: URL option too long");
    memcpy(kv, k, n);
    kv[n] = '\0';
    eq = strchr(kv, '=');
    if (!eq) return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: URL option \"%s\" has no value", kv);
    *eq = '\0';
    v = eq + 1;
    if (strcmp(kv, "sync") == 0) {
      if (strcmp(v, "full") == 0) b->sync = SQ_SYNC_FULL;
      else if (strcmp(v, "normal") == 0) b->sync = SQ_SYNC_NORMAL;
      else return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: sync=%s unknown (full or normal)", v);
    } else if (strcmp(kv, "mode") == 0) {
      if (strcmp(v, "rwc") == 0) b->mode = SQ_MODE_RWC;
      else if (strcmp(v, "rw") == 0) b->mode = SQ_MODE_RW;
      else if (strcmp(v, "ro") == 0) b->mode = SQ_MODE_RO;
      else return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: mode=%s unknown (rwc, rw or ro)", v);
    } else if (strcmp(kv, "busy_timeout") == 0) {
      if (es_parse_int(v, 0, INT_MAX, &x))
        return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: busy_timeout=%s is not a number of ms", v);
      b->busy_ms = (int)x;
    } else if (strcmp(kv, "readers") == 0) {
      if (es_parse_int(v, 1, SQ_MAX_READERS, &x))
        return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: readers=%s not in 1..%d", v, SQ_MAX_READERS);
      b->max_readers = (int)x;
    } else if (strcmp(kv, "max_pages") == 0) {
      if (es_parse_int(v, 1, INT64_MAX, &x))
        return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: max_pages=%s is not a positive number", v);
      b->max_pages = x;
    } else {
      return es_fail(err, ES_INVALID_ARGUMENT, "sqlite: unknown URL option \"%s\"", kv);
    }
  }
  return ES_OK;
}

/* The directory part of path must exist: say so plainly when it does not. */
static int sq_check_dir(es_backend *b, es_err *err) {
  const char *slash = strrchr(b->path, '/');
  struct stat stb;
  char *dir;
  if (!slash) return ES_OK;
  dir = sq_dup(b->path, slash == b->path ? 1 : (size_t)(slash - b->path));
  if (!dir) return sq_oom(err);
  int code = ES_OK;
  if (stat(dir, &stb) != 0)
    code = es_fail(err, ES_STORAGE, "sqlite %s: the directory %s %s", b->path, dir,
                   errno == ENOENT ? "does not exist" : strerror(errno));
  else if (!S_ISDIR(stb.st_mode))
    code = es_fail(err, ES_STORAGE, "sqlite %s: %s is not a directory", b->path, dir);
  free(dir);
  return code;
}

/* Judges an existing file that has neither a -wal nor a -journal next to it
 * (sq_schema_read) through a temporary immutable, read-only connection: with
 * no -wal the main file holds every commit, and an immutable connection
 * reads it exactly while creating nothing. An ordinary connection would
 * create a -wal and a -shm for a WAL-mode file, and a read-only one would
 * leave them behind, next to another application's file. */
static int sq_prejudge(es_backend *b, es_err *err) {
  sq_conn j;
  int64_t version;
  int migrate, code;
  char *uri = sq_immutable_uri(b->path);
  if (!uri) return sq_oom(err);
  memset(&j, 0, sizeof j);
  j.b = b;
  int rc = sqlite3_open_v2(uri, &j.db,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX |
                               SQLITE_OPEN_PRIVATECACHE,
                           NULL);
  free(uri);
  if (rc != SQLITE_OK) {
    code = j.db ? sq_fail(err, &j, rc, "cannot open") : sq_oom(err);
  } else {
    sqlite3_extended_result_codes(j.db, 1);
    code = sq_schema_read(b, &j, &version, &migrate, err);
  }
  sqlite3_close_v2(j.db);
  return code;
}

/* Whether the write connection's failure means SQLite could not set up the
 * WAL's shared memory (-shm) for reading: it cannot create it on read-only
 * media, nor in a directory this process may not write. */
static int sq_cannot_init_wal(es_backend *b) {
  int rc = sqlite3_extended_errcode(b->w.db);
  return (rc & 0xff) == SQLITE_CANTOPEN || rc == SQLITE_READONLY_CANTINIT ||
         rc == SQLITE_READONLY_DIRECTORY;
}

/* Whether the file system holding the store has less than
 * SQ_LOW_SPACE_BYTES free (for unprivileged users: root may use a little
 * more, which only makes this err on the careful side). */
static int sq_space_short(es_backend *b) {
  struct statvfs vfs;
  if (statvfs(b->full_path ? b->full_path : b->path, &vfs) != 0) return 0;
  return (uint64_t)vfs.f_bavail * vfs.f_frsize < (uint64_t)SQ_LOW_SPACE_BYTES;
}

/* ---- checkpoints --------------------------------------------------------- */

/* The checkpointer thread of a read-write handle: each time a commit asks
 * (sq_wal_hook) it copies the WAL into the main file with a PASSIVE
 * checkpoint on its own connection. PASSIVE takes no lock the writer or
 * the readers need and never waits for one: it copies the frames no
 * reader still needs, then syncs the main file (the connection has the
 * handle's synchronous setting, so the copy is durable before any writer
 * may overwrite the WAL). When it has copied every frame and no commit
 * came meanwhile, the next write transaction starts the WAL again from
 * its beginning. Its result is not looked at: a checkpoint that fails
 * (a full disk, an I/O error) or stops short changes nothing, the WAL
 * stays authoritative and the next pass, or the write path's own
 * checkpoint (sq_reclaim_wal), or the last connection's close, tries
 * again. A write's own errors are the write connection's, never this
 * connection's. */
static void *sq_ckpt_main(void *arg) {
  es_backend *b = arg;
  pthread_mutex_lock(&b->ck_mu);
  for (;;) {
    while (!b->ck_stop && (!b->ck_wake || b->ck_paused)) pthread_cond_wait(&b->ck_cv, &b->ck_mu);
    if (b->ck_stop) break;
    b->ck_wake = 0;
    b->ck_in_pass = 1;
    pthread_mutex_unlock(&b->ck_mu);
    (void)sqlite3_wal_checkpoint_v2(b->ck.db, "main", SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    pthread_mutex_lock(&b->ck_mu);
    b->ck_in_pass = 0;
    pthread_cond_broadcast(&b->ck_idle_cv);
  }
  pthread_mutex_unlock(&b->ck_mu);
  return NULL;
}

/* The write connection's WAL hook: SQLite calls it after each commit of
 * that connection (on the writing thread, so the write path's fields are
 * its own), with the frames the WAL now holds. At the threshold it wakes
 * the checkpointer, and again each SQ_CKPT_STEP pages the WAL grows by
 * after. The checkpointer copies while the writer appends, so
 * under a constant writer its passes may never end with every frame
 * copied and the WAL would grow without bound; at SQ_CKPT_LIMIT times the
 * threshold the next write restarts it itself (sq_reclaim_wal), and the
 * checkpointer is left asleep meanwhile so that the two do not take each
 * other's checkpoint lock (the same while a TRUNCATE after a full disk is
 * due). Short of space, or without a checkpointer, the limit is the
 * threshold: the write path checkpoints every 64 (or 1000) pages itself,
 * before its next write, as SQLite's automatic checkpoint did after the
 * commit. Always SQLITE_OK: an error here would fail a commit that has
 * happened. */
static int sq_wal_hook(void *arg, sqlite3 *db, const char *name, int pages) {
  es_backend *b = arg;
  (void)db;
  (void)name;
  int threshold = b->low_space ? SQ_CKPT_PAGES_LOW : SQ_CKPT_PAGES;
  int limit = b->ck_started && !b->low_space ? SQ_CKPT_LIMIT * threshold : threshold;
  b->restart_due = pages >= limit;
  if (pages < b->ck_woken_at) b->ck_woken_at = 0; /* the WAL started again */
  if (b->ck_started && pages >= threshold && pages - b->ck_woken_at >= SQ_CKPT_STEP &&
      !b->restart_due && !b->ckpt_due) {
    b->ck_woken_at = pages;
    pthread_mutex_lock(&b->ck_mu);
    b->ck_wake = 1;
    pthread_cond_signal(&b->ck_cv);
    pthread_mutex_unlock(&b->ck_mu);
  }
  return SQLITE_OK;
}

/* A checkpoint that must not meet the checkpointer's (sq_scrub's: it
 * fails at once when another connection holds the checkpoint lock) runs
 * between these two: the pass in progress ends first, none starts until
 * sq_ckpt_resume. */
static void sq_ckpt_pause(es_backend *b) {
  if (!b->ck_started) return;
  pthread_mutex_lock(&b->ck_mu);
  b->ck_paused++;
  while (b->ck_in_pass) pthread_cond_wait(&b->ck_idle_cv, &b->ck_mu);
  pthread_mutex_unlock(&b->ck_mu);
}

static void sq_ckpt_resume(es_backend *b) {
  if (!b->ck_started) return;
  pthread_mutex_lock(&b->ck_mu);
  b->ck_paused--;
  pthread_cond_signal(&b->ck_cv);
  pthread_mutex_unlock(&b->ck_mu);
}

/* Sets up the checkpoints of a read-write handle at the end of open: the
 * checkpointer's connection and thread, then the write connection's hook.
 * Without a checkpointer (its connection or thread cannot be had) the
 * handle still works: the write path checkpoints itself (sq_wal_hook). */
static int sq_ckpt_start(es_backend *b, es_err *err) {
  es_err ignored = {0};
  int64_t v = 0;
  int code;
  /* the connection reads once now, so it has the WAL open before its
   * first checkpoint */
  if (sq_conn_open(b, &b->ck, 0, &ignored) == ES_OK &&
      sq_pragma_int(&b->ck, "PRAGMA user_version", &v, &ignored) == ES_OK &&
      pthread_create(&b->ck_thread, NULL, sq_ckpt_main, b) == 0)
    b->ck_started = 1;
  else
    sq_conn_close(&b->ck);
  if ((code = sq_conn_exec(&b->w, "PRAGMA wal_autocheckpoint = 0", "cannot set up the file", err)) !=
      ES_OK)
    return code;
  sqlite3_wal_hook(b->w.db, sq_wal_hook, b);
  return ES_OK;
}

/* Ends the checkpointer (close): the pass in progress ends first. */
static void sq_ckpt_stop(es_backend *b) {
  if (b->ck_started) {
    pthread_mutex_lock(&b->ck_mu);
    b->ck_stop = 1;
    pthread_cond_signal(&b->ck_cv);
    pthread_mutex_unlock(&b->ck_mu);
    pthread_join(b->ck_thread, NULL);
    b->ck_started = 0;
  }
  sq_conn_close(&b->ck);
}

/* ---- open / close ------------------------------------------------------- */

static void sq_close(es_backend *b) {
  if (!b) return;
  /* first: the thread uses its connection until it is joined, and the
   * write connection must stay the last one closed */
  sq_ckpt_stop(b);
  sq_reader *r = b->all_readers;
  while (r) {
    sq_reader *next = r->next_all;
    sq_conn_close(&r->c);
    free(r);
    r = next;
  }
  sq_conn_close(&b->watch);
  sq_conn_close(&b->w); /* the last connection: checkpoints and removes the WAL */
  sq_behind_forget(&b->wt); /* empty unless a write transaction was left open */
  pthread_mutex_destroy(&b->pool_mu);
  pthread_cond_destroy(&b->pool_cv);
  pthread_mutex_destroy(&b->watch_mu);
  pthread_mutex_destroy(&b->ck_mu);
  pthread_cond_destroy(&b->ck_cv);
  pthread_cond_destroy(&b->ck_idle_cv);
  free(b->path);
  free(b->full_path);
  free(b->wal_path);
  free(b);
}

static int sq_open(const char *url_rest, const es_open_opts *opts, es_backend **out, es_err *err) {
  es_backend *b;
  struct stat stb, wst;
  int code, existed, had_wal, wal_frames, migrate = 0;
  int64_t version = 0;
  *out = NULL;
  if (!url_rest) url_rest = "";
  if (!sqlite3_threadsafe())
    return es_fail(err, ES_STORAGE, "sqlite: the SQLite library was built without thread support");
  b = calloc(1, sizeof *b);
  if (!b) return sq_oom(err);
  pthread_mutex_init(&b->pool_mu, NULL);
  pthread_cond_init(&b->pool_cv, NULL);
  pthread_mutex_init(&b->watch_mu, NULL);
  pthread_mutex_init(&b->ck_mu, NULL);
  pthread_cond_init(&b->ck_cv, NULL);
  pthread_cond_init(&b->ck_idle_cv, NULL);
  b->wt.b = b;
  b->wt.c = &b->w;
  b->wt.write = 1;
  es_hmap_init(&b->wt.behind, sq_behind_key);
  b->secure_delete = opts && opts->secure_delete;
  if ((code = sq_parse_url(b, url_rest, opts, err)) != ES_OK) goto fail;
  if ((code = sq_check_dir(b, err)) != ES_OK) goto fail;
  existed = stat(b->path, &stb) == 0;
  if (existed && S_ISDIR(stb.st_mode)) {
    code = es_fail(err, ES_STORAGE, "sqlite %s: is a directory, not a database file", b->path);
    goto fail;
  }
  if (!existed && b->mode != SQ_MODE_RWC) {
    code = es_fail(err, ES_STORAGE, "sqlite %s: the file does not exist (mode=%s does not create it)",
                   b->path, b->mode == SQ_MODE_RO ? "ro" : "rw");
    goto fail;
  }
  /* Nothing below may write before the file is judged ours (sq_check_header,
   * sq_schema_read): the WAL switch and the migration come after. */
  if (existed && S_ISREG(stb.st_mode) && stb.st_size > 0 && (code = sq_check_header(b, err)) != ES_OK)
    goto fail;
  if (!(b->wal_path = sq_path_with(b->path, "-wal"))) {
    code = sq_oom(err);
    goto fail;
  }
  had_wal = stat(b->wal_path, &wst) == 0;
  wal_frames = had_wal && wst.st_size > 0;
  if (existed && S_ISREG(stb.st_mode) && stb.st_size > 0 && !had_wal) {
    char *journal = sq_path_with(b->path, "-journal");
    if (!journal) {
      code = sq_oom(err);
      goto fail;
    }
    int had_journal = access(journal, F_OK) == 0;
    free(journal);
    code = sq_prejudge(b, err);
    /* With a -journal (another application's transaction cut short: ours
     * never use one) the main file may be half written: only a clear
     * verdict counts, anything else is left to the ordinary connection. */
    if (code != ES_OK && !(had_journal && code == ES_STORAGE)) goto fail;
  }
  if ((code = sq_conn_open(b, &b->w, 1, err)) != ES_OK) goto fail;
  {
    const char *full = sqlite3_db_filename(b->w.db, "main");
    if (full && *full) {
      /* every later look at the files by name must not depend on the
       * current directory (the process may change it) */
      char *wal = sq_path_with(full, "-wal");
      if (!wal || !(b->full_path = sq_dup(full, strlen(full)))) {
        free(wal);
        code = sq_oom(err);
        goto fail;
      }
      free(b->wal_path);
      b->wal_path = wal;
    }
  }
  /* Until the file is judged ours, closing must not checkpoint a WAL that
   * was already there (it may be another application's): that would write
   * its main file. (A WAL this open created is empty, and SQLite removes it
   * with its -shm at close, writing nothing.) */
  if (had_wal) sqlite3_db_config(b->w.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)NULL);
  code = sq_schema_read(b, &b->w, &version, &migrate, err);
  if (code == ES_STORAGE && b->mode == SQ_MODE_RO && !wal_frames && sq_cannot_init_wal(b)) {
    /* Read-only media (or a directory this process may not write): SQLite
     * cannot create the -shm a WAL database needs even to be read. The -wal
     * is absent or empty, so the main file holds every commit: read it as
     * immutable. */
    sq_conn_close(&b->w);
    b->immutable = 1;
    if (stat(b->full_path ? b->full_path : b->path, &b->imm_st) != 0) {
      code = es_fail(err, ES_STORAGE, "sqlite %s: cannot open: %s", b->path, strerror(errno));
      goto fail;
    }
    if ((code = sq_conn_open(b, &b->w, 1, err)) != ES_OK) goto fail;
    code = sq_schema_read(b, &b->w, &version, &migrate, err);
  }
  if (code == ES_STORAGE && b->mode == SQ_MODE_RO && wal_frames && sq_cannot_init_wal(b))
    /* The -wal holds commits the main file lacks: immutable would not see
     * them, and SQLite needs a -shm it can create to read them. */
    code = es_fail(err, ES_STORAGE,
                   "sqlite %s: cannot open read-only: %s holds commits not yet copied into the main "
                   "file, and reading them needs a %s-shm that cannot be created here (read-only "
                   "media?); copy the files to writable storage, or open it read-write once where "
                   "it can be written",
                   b->path, b->wal_path, b->path);
  if (code != ES_OK) goto fail;
  if (had_wal) sqlite3_db_config(b->w.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, (int *)NULL);
  /* A new file (version 0: judged ours and empty) is made in
   * auto_vacuum=INCREMENTAL mode, so that what retention removes can be
   * given back (sq_vacuum_pass). The mode is fixed once the file's first
   * page exists, and the WAL switch below writes that page, so this comes
   * first. On an empty SQLite file made elsewhere (it already has a page)
   * it changes nothing, and an existing file keeps its mode: switching
   * needs a full VACUUM, far too slow for an open. */
  if (b->mode != SQ_MODE_RO && version == 0 && migrate &&
      (code = sq_conn_exec(&b->w, "PRAGMA auto_vacuum = INCREMENTAL", "cannot set up the file", err)) !=
          ES_OK)
    goto fail;
  if (b->mode != SQ_MODE_RO && (code = sq_setup_wal(b, err)) != ES_OK) goto fail;
  if ((code = sq_setup_schema(b, version, migrate, err)) != ES_OK) goto fail;
  if (b->mode != SQ_MODE_RO) {
    int64_t av = 0;
    if ((code = sq_pragma_int(&b->w, "PRAGMA auto_vacuum", &av, err)) != ES_OK) goto fail;
    b->incremental = av == 2;
    /* free pages a previous process left (its last pass could not run):
     * the first commit looks at the free-page count and gives them back */
    b->vacuum_due = b->incremental;
  }
  /* A WAL left with commits in it (a previous process could not checkpoint
   * it, e.g. on a full disk, or another process is using the file): the
   * first write checkpoints it first, so its space is given back. */
  if (b->mode != SQ_MODE_RO && wal_frames) b->ckpt_due = 1;
  if (b->mode != SQ_MODE_RO && sq_space_short(b)) b->low_space = 1;
  /* Statements that read the schema fail on a damaged file: prepare them
   * now, so such a file is refused at open rather than at first use. */
  for (int i = ST_MAX_POSITION; i < ST_COUNT; i++) {
    if (i == ST_DATA_VERSION) continue; /* asked on the watch connection only */
    int rc = sqlite3_prepare_v3(b->w.db, sq_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &b->w.st[i], NULL);
    if (rc != SQLITE_OK) {
      code = sq_fail(err, &b->w, rc, "the schema does not match");
      goto fail;
    }
  }
  if (b->mode != SQ_MODE_RO) {
    if ((code = sq_conn_exec(&b->w, "PRAGMA journal_size_limit = 67108864", NULL, err)) != ES_OK) goto fail;
  }
  if ((code = sq_conn_open(b, &b->watch, 0, err)) != ES_OK) goto fail;
  /* A new file's directory entry must be durable (SQLite syncs the
   * directory for its WAL, not for the main file it creates): the commits
   * to come would otherwise be lost with the file's name. */
  if (!existed && es_sync_parent_dir(b->full_path ? b->full_path : b->path) != 0) {
    code = es_fail(err, ES_STORAGE, "sqlite %s: cannot sync its directory: %s", b->path, strerror(errno));
    goto fail;
  }
  if (b->mode != SQ_MODE_RO && (code = sq_ckpt_start(b, err)) != ES_OK) goto fail;
  *out = b;
  return ES_OK;
fail:
  sq_close(b);
  return code;
}

/* ---- transactions ------------------------------------------------------- */

/* Loads the next position inside a fresh write transaction. */
static int sq_load_next_position(es_txn *t, es_err *err) {
  sqlite3_stmt *st;
  int temp, rc, code;
  int64_t max = 0, saved = 0;
  if ((code = sq_stmt(t->c, ST_MAX_POSITION, &st, &temp, err)) != ES_OK) return code;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) max = sqlite3_column_int64(st, 0);
  sq_stmt_done(t->c, ST_MAX_POSITION, st, temp);
  if (rc != SQLITE_ROW) return sq_txn_fail(t, rc, "read", err);
  if ((code = sq_stmt(t->c, ST_META_GET, &st, &temp, err)) != ES_OK) return code;
  sqlite3_bind_text(st, 1, "next_position", -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) saved = sqlite3_column_int64(st, 0);
  sq_stmt_done(t->c, ST_META_GET, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  t->saved_next = saved;
  t->next_position = max + 1 > saved ? max + 1 : saved;
  return ES_OK;
}

/* WAL frames are whole pages, so on a small disk the WAL, not the data, is
 * what fills it (each commit adds the ~10 pages it touched, for a few
 * hundred bytes of events), and it is checkpointed only every 1000 pages.
 * Once the disk is full the WAL cannot be checkpointed (that needs the main
 * file to grow) and, without a checkpoint, never restarts from its
 * beginning: every later write appends to it and fails, even after space is
 * freed, even after reopening. So after a write met a full disk (sq_fail arms
 * this), and after opening a file whose WAL still holds commits, each write
 * first tries a TRUNCATE checkpoint: it copies the WAL into the main file
 * and truncates the WAL to zero bytes, giving its space back, as soon as the
 * main file can grow by the (few) pages the WAL holds. It never waits: when
 * readers or another process's writer are in the way it is retried at the
 * next write. A failed checkpoint changes nothing (the WAL stays
 * authoritative), so acknowledged data is never at risk.
 * Short of space (a write met a full disk, or less than SQ_LOW_SPACE_BYTES
 * are free: looked at when the store opens and every SQ_SPACE_CHECK_EVERY
 * writes) the handle keeps its WAL small from then on (a checkpoint every 64
 * pages instead of 1000, made by the write path itself before its next
 * write, sq_wal_hook; the file cut back to 256 KiB when it restarts), so
 * the log does not grow into the space the data needs, and a checkpoint
 * after a full disk needs little room. */
static void sq_reclaim_wal(es_backend *b) {
  /* (the checkpoints every 64 pages: sq_wal_hook reads low_space) */
  if (b->low_space == 1 &&
      sqlite3_exec(b->w.db, "PRAGMA journal_size_limit = 262144", NULL, NULL, NULL) == SQLITE_OK)
    b->low_space = 2;
  if (b->ckpt_due || b->restart_due) {
    /* The WAL at its limit (sq_wal_hook): a RESTART checkpoint copies
     * what the checkpointer has not and, when no reader is on old frames,
     * leaves the WAL for this write to start again from its beginning
     * (the file keeps its size, up to journal_size_limit, to be written
     * over again). As the TRUNCATE it
     * never waits: with a reader on old frames, another process's writer,
     * or another checkpoint in the way, it is tried again at the next
     * write, and the WAL grows by that write meanwhile. */
    b->w.no_wait = 1;
    int rc = sqlite3_wal_checkpoint_v2(b->w.db, "main",
                                       b->ckpt_due ? SQLITE_CHECKPOINT_TRUNCATE
                                                   : SQLITE_CHECKPOINT_RESTART,
                                       NULL, NULL);
    b->w.no_wait = 0;
    if (rc == SQLITE_OK) b->ckpt_due = b->restart_due = 0;
  }
}

/* Claims and power loss (docs/sqlite.md): with sync=full, a claim_next
 * alone in its transaction commits as synchronous=NORMAL does: in WAL
 * mode the commit is in the WAL (safe from a process crash) without an
 * fsync, and the next FULL commit's fsync of the WAL makes it durable
 * with everything before it. The VFS does it (sqlite_vfs.h sq_vfs_lazy):
 * the connection stays FULL, the claim's frames are gathered like any
 * commit's, and the commit's sync writes them out without the fsync, so
 * a write error is still the commit's. Without the VFS (SQLite could not
 * register it) a claim cannot go lazy and commits synced: slower, never
 * less safe. */
static int sq_lazy_begin(es_backend *b) {
  if (b->sync != SQ_SYNC_FULL || b->mode == SQ_MODE_RO || b->lazy || !b->gathered ||
      sq_vfs_lazy(b->w.db, 1) != SQLITE_OK)
    return ES_STORAGE;
  b->lazy = 1;
  return ES_OK;
}

static void sq_lazy_end(es_backend *b) {
  if (!b->lazy) return;
  sq_vfs_lazy(b->w.db, 0);
  b->lazy = 0;
}

static int sq_write_begin(es_backend *b, es_txn **out, es_err *err) {
  es_txn *t = &b->wt;
  int code;
  *out = NULL;
  if (b->mode == SQ_MODE_RO)
    return es_fail(err, ES_STORAGE, "sqlite %s: opened read-only (mode=ro): cannot write", b->path);
  t->broken = 0;
  t->depth = 0;
  t->removed = 0;
  t->last.valid = 0;
  memset(&t->all_wait, 0, sizeof t->all_wait);
  /* never build on a transaction a failed rollback left behind */
  if (!sqlite3_get_autocommit(b->w.db)) sqlite3_exec(b->w.db, "ROLLBACK", NULL, NULL, NULL);
  if (!b->low_space && ++b->space_checks % SQ_SPACE_CHECK_EVERY == 0 && sq_space_short(b))
    b->low_space = 1;
  if (b->ckpt_due || b->restart_due || b->low_space == 1) sq_reclaim_wal(b);
  if ((code = sq_exec_id(&b->w, ST_BEGIN_WRITE, err)) != ES_OK) return code;
  if ((code = sq_load_next_position(t, err)) != ES_OK) {
    sqlite3_exec(b->w.db, "ROLLBACK", NULL, NULL, NULL);
    return code;
  }
  *out = t;
  return ES_OK;
}

static void sq_write_rollback(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  sq_behind_forget(t);
  memset(&t->all_wait, 0, sizeof t->all_wait);
  if (!sqlite3_get_autocommit(t->c->db)) {
    if (sq_exec_id(t->c, ST_ROLLBACK, NULL) != ES_OK)
      sqlite3_exec(t->c->db, "ROLLBACK", NULL, NULL, NULL);
  }
  t->depth = 0;
  t->broken = 0;
  t->removed = 0;
}

/* Gives space back after a commit, a little at a time: one pass of
 * `PRAGMA incremental_vacuum(SQ_VACUUM_PAGES)` moves at most that many
 * pages from the end of the file into free slots and shortens the file
 * (in WAL mode the main file shrinks when the WAL is next checkpointed).
 * It runs in its own short transaction right after the commit, not inside
 * it: a pass that fails (the disk is full, another process holds the write
 * lock: it never waits) leaves acknowledged work alone and is simply tried
 * again after the next commit. When more pages are free than one pass
 * takes, the next commits each take another pass until none is left, so
 * no commit pays more than SQ_VACUUM_PAGES page moves; meanwhile inserts
 * reuse free pages anyway. Short of space (sq_reclaim_wal) a pass moves
 * SQ_VACUUM_PAGES_LOW pages, so that the WAL it writes stays small. Files
 * not in incremental mode (created before schema version 5) never get
 * here: they reuse freed pages and keep their size (VACUUM shrinks them,
 * see docs/sqlite.md). */
static void sq_vacuum_pass(es_backend *b) {
  sq_conn *c = &b->w;
  sqlite3_stmt *st;
  int temp, rc;
  int64_t free_pages = 0;
  int id = b->low_space ? ST_INCREMENTAL_VACUUM_LOW : ST_INCREMENTAL_VACUUM;
  int64_t pass = b->low_space ? SQ_VACUUM_PAGES_LOW : SQ_VACUUM_PAGES;
  b->vacuum_due = 1;
  if (sq_stmt(c, ST_FREELIST_COUNT, &st, &temp, NULL) != ES_OK) return;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) free_pages = sqlite3_column_int64(st, 0);
  sq_stmt_done(c, ST_FREELIST_COUNT, st, temp);
  if (rc != SQLITE_ROW) return;
  if (free_pages == 0) {
    b->vacuum_due = 0;
    return;
  }
  if (sq_stmt(c, id, &st, &temp, NULL) != ES_OK) return;
  c->no_wait = 1;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
  }
  c->no_wait = 0;
  if (rc != SQLITE_DONE) {
    /* no message for anyone, but a full disk arms the WAL recovery */
    sq_fail(NULL, c, sqlite3_extended_errcode(c->db), "incremental vacuum");
    sq_stmt_done(c, id, st, temp);
    if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return;
  }
  sq_stmt_done(c, id, st, temp);
  b->vacuum_due = free_pages > pass;
}

static void sq_own_commit(es_backend *b);

static int sq_write_commit(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = sq_txn_check(t, err);
  if (code == ES_OK) code = sq_behind_flush(t, err);
  if (code == ES_OK) code = sq_counts_write(t, err);
  if (code != ES_OK) {
    sq_write_rollback(t->b, t);
    return code;
  }
  /* The high-water mark matters only once the newest rows are gone: a
   * transaction that inserted and removed nothing leaves max(position) + 1
   * at its own next_position, which the next one loads anyway; one that
   * removed rows (possibly the newest) stores it. So an append's commit
   * does not rewrite the meta page (a WAL frame per commit). */
  if (t->removed && t->next_position > t->saved_next) {
    sqlite3_stmt *st;
    int temp;
    if ((code = sq_stmt(t->c, ST_META_PUT, &st, &temp, err)) != ES_OK) goto fail;
    sqlite3_bind_text(st, 1, "next_position", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, t->next_position);
    if ((code = sq_run(t, ST_META_PUT, st, temp, "write", err)) != ES_OK) goto fail;
  }
  {
    sqlite3_stmt *st;
    int temp, rc;
    if ((code = sq_stmt(t->c, ST_COMMIT, &st, &temp, err)) != ES_OK) goto fail;
    rc = sqlite3_step(st);
    sq_stmt_done(t->c, ST_COMMIT, st, temp);
    if (rc != SQLITE_DONE) {
      code = sq_fail(err, t->c, rc, "commit");
      goto fail;
    }
  }
  sq_own_commit(t->b);
  t->depth = 0;
  if (t->b->incremental && (t->removed || t->b->vacuum_due)) sq_vacuum_pass(t->b);
  t->removed = 0;
  return ES_OK;
fail:
  sq_write_rollback(t->b, t);
  return code;
}

static int sq_savepoint(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = sq_txn_check(t, err);
  if (code == ES_OK) code = sq_behind_flush(t, err);
  /* deeper than sp_all remembers: the store's sums moved so far are
   * written before it, so that its rollback cannot take them back */
  if (code == ES_OK && t->depth >= SQ_MAX_SAVEPOINTS) code = sq_counts_write(t, err);
  if (code != ES_OK) return code;
  if ((code = sq_exec_id(t->c, ST_SAVEPOINT, err)) != ES_OK) return code;
  if (t->depth < SQ_MAX_SAVEPOINTS) {
    t->sp_next[t->depth] = t->next_position;
    t->sp_all[t->depth] = t->all_wait;
  }
  t->depth++;
  return ES_OK;
}

static int sq_savepoint_release(es_backend *b, es_txn *t, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int code = sq_txn_check(t, err);
  if (code != ES_OK) return code;
  if (t->depth <= 0) return es_fail(err, ES_STORAGE, "sqlite: release without a savepoint");
  if ((code = sq_behind_flush(t, err)) != ES_OK) return code;
  if ((code = sq_exec_id(t->c, ST_RELEASE, err)) != ES_OK) {
    if (sqlite3_get_autocommit(t->c->db)) sq_txn_break(t, err ? err->msg : "release failed");
    return code;
  }
  t->depth--;
  return ES_OK;
}

static void sq_savepoint_rollback(es_backend *b, es_txn *t) {
  (void)b; /* t carries it (t->b) */
  /* every row waiting was put since the savepoint began (it was flushed then) */
  sq_behind_forget(t);
  if (t->broken || t->depth <= 0) return;
  if (sq_exec_id(t->c, ST_ROLLBACK_TO, NULL) != ES_OK || sq_exec_id(t->c, ST_RELEASE, NULL) != ES_OK) {
    /* cannot undo only this caller's work: fail the whole transaction */
    char msg[300];
    snprintf(msg, sizeof msg, "rolling back a savepoint failed: %s", sqlite3_errmsg(t->c->db));
    sq_txn_break(t, msg);
    return;
  }
  t->depth--;
  if (t->depth < SQ_MAX_SAVEPOINTS) {
    t->next_position = t->sp_next[t->depth];
    t->all_wait = t->sp_all[t->depth];
  }
}

/* An immutable open reads the main file without locks and keeps pages in
 * its cache, which is right only while nobody writes the file (read-only
 * media; but a read-only bind mount, say, may be written through another
 * path). Every commit to a WAL database goes to the -wal first, and a
 * checkpoint changes the main file's mtime: once either is seen, stop
 * reading for good, since the cache may now mix old and new pages. */
static int sq_immutable_changed(es_backend *b) {
  struct stat now;
  int changed;
  pthread_mutex_lock(&b->pool_mu);
  if (!b->imm_changed &&
      ((stat(b->wal_path, &now) == 0 && now.st_size > 0) ||
       stat(b->full_path ? b->full_path : b->path, &now) != 0 ||
       now.st_ino != b->imm_st.st_ino ||
       now.st_size != b->imm_st.st_size || now.st_mtim.tv_sec != b->imm_st.st_mtim.tv_sec ||
       now.st_mtim.tv_nsec != b->imm_st.st_mtim.tv_nsec))
    b->imm_changed = 1;
  changed = b->imm_changed;
  pthread_mutex_unlock(&b->pool_mu);
  return changed;
}

static int sq_read_begin(es_backend *b, es_txn **out, es_err *err) {
  sq_reader *r = NULL;
  int code;
  *out = NULL;
  if (b->immutable && sq_immutable_changed(b))
    return es_fail(err, ES_STORAGE,
                   "sqlite %s: the file changed since this read-only handle opened it as immutable "
                   "(SQLite could not create %s-shm, so it reads without locks and cannot follow "
                   "writes); reopen the store",
                   b->path, b->path);
  pthread_mutex_lock(&b->pool_mu);
  while (!b->free_readers && b->n_readers >= b->max_readers) pthread_cond_wait(&b->pool_cv, &b->pool_mu);
  if (b->free_readers) {
    r = b->free_readers;
    b->free_readers = r->next_free;
    pthread_mutex_unlock(&b->pool_mu);
  } else {
    b->n_readers++;
    pthread_mutex_unlock(&b->pool_mu);
    r = calloc(1, sizeof *r);
    code = r ? sq_conn_open(b, &r->c, 0, err) : sq_oom(err);
    pthread_mutex_lock(&b->pool_mu);
    if (code != ES_OK) {
      b->n_readers--;
      pthread_cond_signal(&b->pool_cv);
      pthread_mutex_unlock(&b->pool_mu);
      free(r);
      return code;
    }
    r->t.b = b;
    r->t.c = &r->c;
    r->t.reader = r;
    r->next_all = b->all_readers;
    b->all_readers = r;
    pthread_mutex_unlock(&b->pool_mu);
  }
  r->t.broken = 0;
  if ((code = sq_exec_id(&r->c, ST_BEGIN_READ, err)) != ES_OK) {
    pthread_mutex_lock(&b->pool_mu);
    r->next_free = b->free_readers;
    b->free_readers = r;
    pthread_cond_signal(&b->pool_cv);
    pthread_mutex_unlock(&b->pool_mu);
    return code;
  }
  *out = &r->t;
  return ES_OK;
}

static void sq_read_end(es_backend *b, es_txn *t) {
  sq_reader *r = t->reader;
  if (!sqlite3_get_autocommit(r->c.db) && sq_exec_id(&r->c, ST_COMMIT, NULL) != ES_OK)
    sqlite3_exec(r->c.db, "ROLLBACK", NULL, NULL, NULL);
  pthread_mutex_lock(&b->pool_mu);
  r->next_free = b->free_readers;
  b->free_readers = r;
  pthread_cond_signal(&b->pool_cv);
  pthread_mutex_unlock(&b->pool_mu);
}

/* ---- sessions ------------------------------------------------------------ */

/* Session rows written behind. A write transaction's session_put only
 * keeps a copy of the row here, and session_get answers from it; the rows
 * are written (the upsert, and the counts it moves) before any
 * statement that could see the sessions table or the counts
 * (sq_behind_may_wait: every statement but the event rows' reads and
 * writes and the queue's reads), before a savepoint begins or is
 * released, and before the commit. A batch of completions (the engine's,
 * up to 512 in one transaction) often completes several events of one
 * session: its row is then written once per batch instead of once per
 * completion. A savepoint's rollback forgets the rows waiting (all put
 * since it began), as does the transaction's. A write that fails at a
 * flush fails the call that caused it, with STORAGE, as the put would
 * have; the core then rolls back. At most SQ_BEHIND_MAX rows wait, so a
 * transaction putting many sessions (an import) holds no more. */
#define SQ_BEHIND_MAX 1024

typedef struct sq_behind_row {
  es_session_info row; /* owned copy; row.session is the key */
  sq_counted base;     /* the row as the file holds it (the counts move from it) */
} sq_behind_row;

static const char *sq_behind_key(const void *item) {
  return ((const sq_behind_row *)item)->row.session;
}

static void sq_behind_forget(es_txn *t) {
  size_t pos = 0;
  sq_behind_row *r;
  t->last.valid = 0; /* a flush wrote session rows, or a rollback undid some */
  while ((r = es_hmap_next(&t->behind, &pos))) {
    es_session_info_destroy(&r->row);
    free(r);
  }
  es_hmap_destroy(&t->behind);
  es_hmap_init(&t->behind, sq_behind_key);
}

static int sq_session_write(es_txn *t, const es_session_info *row, es_err *err);

/* ---- counts (§3.12; docs/stats.md) ----
 *
 * The sums of the counted session rows, of the store (scope '') and of
 * each tenant scope, are moved in C where a session row is written or
 * deleted, by the difference between the row as the file held it and the
 * row written (es_counts_move: the core's rule), in the same transaction
 * and savepoint as the row. Up to schema version 11 triggers on
 * `sessions` did it; a trigger cost ~29,000 instructions per session row
 * written (a single append's whole write is ~280,000), and the flush of
 * many rows now moves the store's sums with one statement. Every process
 * that writes a file of this version runs this code (an older build
 * refuses the newer schema). */

static void sq_counted_of(sq_counted *c, const es_session_info *row) {
  c->exists = row != NULL;
  c->events = row ? row->events : 0;
  c->pending = row ? row->pending : 0;
  c->dead = row ? row->dead : 0;
  c->fence = row ? row->fence : 0;
}

/* d moved by session `name` going from `from` (as the file held it) to
 * `to` (NULL: deleted). */
static void sq_counts_moved(es_counts *d, const char *name, const sq_counted *from,
                            const es_session_info *to) {
  es_session_info f;
  memset(&f, 0, sizeof f);
  f.events = from->events;
  f.pending = from->pending;
  f.dead = from->dead;
  f.fence = from->fence;
  es_counts_move(d, name, from->exists ? &f : NULL, to);
}

/* Adds d to the sums of scope[0..len) ('' when len is 0). Not through
 * sq_op: it runs inside sq_behind_flush. */
static int sq_counts_add(es_txn *t, const char *scope, size_t len, const es_counts *d, es_err *err) {
  if (!d->sessions && !d->events && !d->pending && !d->dead) return ES_OK;
  int code = sq_txn_check(t, err);
  for (int id = ST_COUNTS_MOVE; code == ES_OK; id = ST_COUNTS_ADD) {
    sqlite3_stmt *st;
    int temp;
    if ((code = sq_stmt(t->c, id, &st, &temp, err)) != ES_OK) return code;
    if ((sqlite3_bind_text(st, 1, scope, (int)len, SQLITE_STATIC) |
         sqlite3_bind_int64(st, 2, d->sessions) | sqlite3_bind_int64(st, 3, d->events) |
         sqlite3_bind_int64(st, 4, d->pending) | sqlite3_bind_int64(st, 5, d->dead)) != SQLITE_OK)
      return sq_bind_fail(t, id, st, temp, err);
    if ((code = sq_run(t, id, st, temp, "write", err)) != ES_OK) return code;
    if (id == ST_COUNTS_ADD || sqlite3_changes(t->c->db) > 0) break;
  }
  return code;
}

/* Moves the sums for session `name` going from `from` to `to`: a scope's
 * at once (a tenant's rows are fewer), the store's in t->all_wait, written
 * once per transaction (sq_counts_write) unless savepoints nest deeper
 * than t->sp_all remembers (then at once too). */
static int sq_counts_row(es_txn *t, const char *name, const sq_counted *from,
                         const es_session_info *to, es_err *err) {
  es_counts d = {0};
  sq_counts_moved(&d, name, from, to);
  t->all_wait.sessions += d.sessions;
  t->all_wait.events += d.events;
  t->all_wait.pending += d.pending;
  t->all_wait.dead += d.dead;
  size_t k = es_scope_len(name);
  int code = k > 0 ? sq_counts_add(t, name, k, &d, err) : ES_OK;
  return code == ES_OK && t->depth >= SQ_MAX_SAVEPOINTS ? sq_counts_write(t, err) : code;
}

/* Writes the store's sums moved in this transaction: before the commit,
 * and before anything reads them (sq_counts). */
static int sq_counts_write(es_txn *t, es_err *err) {
  int code = sq_counts_add(t, "", 0, &t->all_wait, err);
  if (code == ES_OK) memset(&t->all_wait, 0, sizeof t->all_wait);
  return code;
}

/* The row of `session` as the file holds it: the last session_get's when
 * it read that one (the common case: a call reads its session row, then
 * puts it), else read now. */
static int sq_base_take(es_txn *t, const char *session, sq_counted *out, es_err *err) {
  if (t->last.valid && strcmp(t->last.name, session) == 0) {
    *out = t->last.v;
    t->last.valid = 0;
    return ES_OK;
  }
  sqlite3_stmt *st;
  int temp, code;
  es_session_info row;
  if ((code = sq_op(t, ST_SESSION_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  code = sq_get_one(t, ST_SESSION_GET, st, temp, ROW_SESSION, &row, err);
  if (code != ES_OK && code != ES_NOT_FOUND) return code;
  sq_counted_of(out, code == ES_OK ? &row : NULL);
  if (code == ES_OK) es_session_info_destroy(&row);
  return ES_OK;
}

static int sq_behind_flush(es_txn *t, es_err *err) {
  int code = ES_OK;
  size_t pos = 0;
  sq_behind_row *r;
  /* sq_session_write's statement may wait (sq_behind_may_wait): no re-entry */
  while (code == ES_OK && t->behind.count && (r = es_hmap_next(&t->behind, &pos))) {
    code = sq_session_write(t, &r->row, err);
    if (code == ES_OK) code = sq_counts_row(t, r->row.session, &r->base, &r->row, err);
  }
  sq_behind_forget(t);
  return code;
}

static int sq_session_get(es_backend *b, es_txn *t, const char *session, es_session_info *out,
                          es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  sq_behind_row *r = t->behind.count ? es_hmap_get(&t->behind, session) : NULL;
  if (r) return es_session_info_copy(out, &r->row) == 0 ? ES_OK : sq_oom(err);
  if ((code = sq_op(t, ST_SESSION_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  code = sq_get_one(t, ST_SESSION_GET, st, temp, ROW_SESSION, out, err);
  /* the row as the file holds it: what a put of it moves the counts from */
  if (t->write && (code == ES_OK || code == ES_NOT_FOUND) && strlen(session) < sizeof t->last.name) {
    strcpy(t->last.name, session);
    sq_counted_of(&t->last.v, code == ES_OK ? out : NULL);
    t->last.valid = 1;
  }
  return code;
}

static int sq_session_put(es_backend *b, es_txn *t, const es_session_info *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  if (!t->write) return sq_read_only_txn(err);
  int code = sq_txn_check(t, err);
  if (code != ES_OK) return code;
  sq_behind_row *r = es_hmap_get(&t->behind, row->session);
  es_session_info copy;
  if (es_session_info_copy(&copy, row) != 0) return sq_oom(err);
  if (r) { /* the newer row replaces the one waiting (its base stays) */
    es_session_info_destroy(&r->row);
    r->row = copy;
    return ES_OK;
  }
  /* the base first: a flush below writes other sessions, not this one */
  sq_counted base;
  if ((code = sq_base_take(t, row->session, &base, err)) != ES_OK ||
      (t->behind.count >= SQ_BEHIND_MAX && (code = sq_behind_flush(t, err)) != ES_OK)) {
    es_session_info_destroy(&copy);
    return code;
  }
  if (!(r = malloc(sizeof *r)) || (r->row = copy, r->base = base, es_hmap_put(&t->behind, r) != 0)) {
    free(r);
    es_session_info_destroy(&copy);
    /* not kept: written now, as without the write-behind */
    if ((code = sq_session_write(t, row, err)) == ES_OK)
      code = sq_counts_row(t, row->session, &base, row, err);
    t->last.valid = 0;
    return code;
  }
  return ES_OK;
}

/* The upsert of one session row. */
static int sq_session_write(es_txn *t, const es_session_info *row, es_err *err) {
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if ((code = sq_op(t, ST_SESSION_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, row->session);
  rc |= sqlite3_bind_int64(st, 2, row->head);
  rc |= sqlite3_bind_int64(st, 3, row->events);
  rc |= sqlite3_bind_int64(st, 4, row->pending);
  rc |= sqlite3_bind_int64(st, 5, row->dead);
  rc |= sqlite3_bind_int64(st, 6, row->attempts);
  rc |= sqlite3_bind_int64(st, 7, row->failures);
  rc |= sq_bind_opt(st, 8, row->first_at);
  rc |= sq_bind_opt(st, 9, row->updated_at);
  rc |= sqlite3_bind_int64(st, 10, row->fence);
  rc |= sq_bind_opt(st, 11, row->sealed_at);
  rc |= sq_bind_str(st, 12, row->seal_reason);
  rc |= sq_bind_str(st, 13, row->lease_holder);
  rc |= sq_bind_opt(st, 14, row->lease_token);
  rc |= sq_bind_opt(st, 15, row->lease_expires_at);
  rc |= sq_bind_str(st, 16, row->parent);
  rc |= sq_bind_opt(st, 17, row->fork_at);
  rc |= sq_bind_opt(st, 18, row->forked_at);
  rc |= sqlite3_bind_int64(st, 19, row->first_index);
  rc |= sqlite3_bind_int64(st, 20, row->archived_through);
  if (rc) return sq_bind_fail(t, ST_SESSION_PUT, st, temp, err);
  return sq_run(t, ST_SESSION_PUT, st, temp, "write", err);
}

/* The smallest string greater than every string starting with prefix:
 * prefix without its trailing 0xFF bytes, last byte + 1. NULL (no upper
 * bound) when prefix is empty or all 0xFF. *oom on allocation failure. */
static char *sq_prefix_successor(const char *prefix, int *oom) {
  size_t n = strlen(prefix);
  *oom = 0;
  while (n > 0 && (unsigned char)prefix[n - 1] == 0xFF) n--;
  if (n == 0) return NULL;
  char *s = sq_dup(prefix, n);
  if (!s) {
    *oom = 1;
    return NULL;
  }
  s[n - 1] = (char)((unsigned char)s[n - 1] + 1);
  return s;
}

static int sq_session_list(es_backend *b, es_txn *t, const char *prefix, const char *after,
                           int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, oom, id;
  const char *lower;
  int exclusive;
  char *upper;
  if (!prefix) prefix = "";
  /* One lower bound (the larger of prefix and after) and one upper bound
   * keep this a range scan of the primary key: O(log n + limit). */
  if (after && strcmp(after, prefix) >= 0) {
    lower = after;
    exclusive = 1;
  } else {
    lower = prefix;
    exclusive = 0;
  }
  upper = sq_prefix_successor(prefix, &oom);
  if (oom) return sq_oom(err);
  id = exclusive ? (upper ? ST_SESSION_LIST_GT_LT : ST_SESSION_LIST_GT)
                 : (upper ? ST_SESSION_LIST_GE_LT : ST_SESSION_LIST_GE);
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) {
    free(upper);
    return code;
  }
  sq_bind_str(st, 1, lower);
  if (upper) sq_bind_str(st, 2, upper);
  sqlite3_bind_int64(st, 3, sq_limit(limit));
  code = sq_iterate(t, id, st, temp, ROW_SESSION, (sq_fn)cb, ctx, err);
  free(upper);
  return code;
}

static int sq_session_children(es_backend *b, es_txn *t, const char *parent, const char *after,
                               int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, id = after ? ST_SESSION_CHILDREN_GT : ST_SESSION_CHILDREN;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, parent);
  if (after) sq_bind_str(st, 2, after);
  sqlite3_bind_int64(st, 3, sq_limit(limit));
  return sq_iterate(t, id, st, temp, ROW_SESSION, (sq_fn)cb, ctx, err);
}

/* ---- events -------------------------------------------------------------- */

static int sq_event_get(es_backend *b, es_txn *t, const char *session, int64_t index, es_event *out,
                        es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_EVENT_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, index);
  return sq_get_one(t, ST_EVENT_GET, st, temp, ROW_EVENT, out, err);
}

static int sq_event_get_by_id(es_backend *b, es_txn *t, const char *id, es_event *out,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_EVENT_GET_BY_ID, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, id);
  return sq_get_one(t, ST_EVENT_GET_BY_ID, st, temp, ROW_EVENT, out, err);
}

/* The long payloads and metas of rows[0..n), inserted at positions
 * first.. (their rows hold NULL: sq_bind_event_at, sq_bind_immutable). */
static int sq_payloads_put(es_txn *t, const es_event *rows, size_t n, int64_t first, es_err *err) {
  for (size_t i = 0; i < n; i++) {
    int payload = rows[i].payload_len > SQ_PAYLOAD_INLINE, meta = sq_meta_apart(&rows[i]);
    if (!payload && !meta) continue;
    sqlite3_stmt *st;
    int temp, code;
    if ((code = sq_op(t, ST_PAYLOAD_PUT, &st, &temp, err)) != ES_OK) return code;
    if (sqlite3_bind_int64(st, 1, first + (int64_t)i) != SQLITE_OK ||
        (payload ? sq_bind_bytes_text(st, 2, rows[i].payload, rows[i].payload_len)
                 : sqlite3_bind_null(st, 2)) != SQLITE_OK ||
        sq_bind_str(st, 3, meta ? rows[i].meta : NULL) != SQLITE_OK)
      return sq_bind_fail(t, ST_PAYLOAD_PUT, st, temp, err);
    if ((code = sq_run(t, ST_PAYLOAD_PUT, st, temp, "insert", err)) != ES_OK) return code;
  }
  return ES_OK;
}

static int sq_event_insert(es_backend *b, es_txn *t, es_event *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_EVENT_INSERT, &st, &temp, err)) != ES_OK) return code;
  if (sq_bind_event(st, row, t->next_position) != SQLITE_OK || sq_bind_immutable(st, 0, row) != SQLITE_OK)
    return sq_bind_fail(t, ST_EVENT_INSERT, st, temp, err);
  if ((code = sq_run(t, ST_EVENT_INSERT, st, temp, "insert", err)) != ES_OK) return code;
  if ((code = sq_payloads_put(t, row, 1, t->next_position, err)) != ES_OK) return code;
  row->position = t->next_position++;
  return ES_OK;
}

/* rows[0..n) in order, as n sq_event_insert calls would, in statements of
 * 64, 16, 4 and 1 rows. On failure some rows may be in: the core's
 * savepoint rollback takes them (and their positions) back. */
static int sq_event_insert_many(es_backend *b, es_txn *t, es_event *rows, size_t n, es_err *err) {
  (void)b; /* t carries it (t->b) */
  if (!t->write) return sq_read_only_txn(err);
  size_t i = 0;
  while (i < n) {
    size_t left = n - i, k;
    int id;
    if (left >= 64) k = 64, id = ST_EVENT_INSERT_64;
    else if (left >= 16) k = 16, id = ST_EVENT_INSERT_16;
    else if (left >= 4) k = 4, id = ST_EVENT_INSERT_4;
    else k = 1, id = ST_EVENT_INSERT;
    if (k == 1) {
      int code = sq_event_insert(t->b, t, &rows[i], err);
      if (code != ES_OK) return code;
      i++;
      continue;
    }
    sqlite3_stmt *st;
    int temp, code, bad = 0;
    if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
    for (size_t r = 0; r < k; r++) {
      int o = (int)r * EV_NCOLS;
      bad |= sq_bind_event_at(st, o, &rows[i + r], t->next_position + (int64_t)r) != SQLITE_OK ||
             sq_bind_immutable(st, o, &rows[i + r]) != SQLITE_OK;
    }
    if (bad) return sq_bind_fail(t, id, st, temp, err);
    if ((code = sq_run(t, id, st, temp, "insert", err)) != ES_OK) return code;
    if ((code = sq_payloads_put(t, &rows[i], k, t->next_position, err)) != ES_OK) return code;
    for (size_t r = 0; r < k; r++) rows[i + r].position = t->next_position++;
    i += k;
  }
  return ES_OK;
}

static int sq_event_copy(es_backend *b, es_txn *t, const char *from, int64_t through,
                         const char *to, int64_t processed_at, es_id_fn new_id, void *id_ctx,
                         int64_t *copied, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  *copied = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_EVENT_COPY, &st, &temp, err)) != ES_OK) return code;
  sqlite3_bind_int64(st, 1, t->next_position);
  sq_bind_str(st, 2, to);
  sqlite3_bind_int64(st, 3, processed_at);
  sq_bind_str(st, 4, from);
  sqlite3_bind_int64(st, 5, through);
  t->c->copy_id = new_id;
  t->c->copy_id_ctx = id_ctx;
  t->c->copy_rc = ES_OK;
  int rc = sqlite3_step(st);
  t->c->copy_id = NULL;
  if (rc != SQLITE_DONE && t->c->copy_rc != ES_OK) {
    /* The generator's own error, not SQLite's wrapping of it. */
    sq_stmt_done(t->c, ST_EVENT_COPY, st, temp);
    if (err) *err = t->c->copy_err;
    return t->c->copy_rc;
  }
  code = rc == SQLITE_DONE ? ES_OK : sq_txn_fail(t, rc, "copy", err);
  sq_stmt_done(t->c, ST_EVENT_COPY, st, temp);
  if (code != ES_OK) return code;
  *copied = sqlite3_changes64(t->c->db);
  t->next_position += through;
  return ES_OK;
}

/* 1: row is a claim's (or a renewal's) write: pending, queued, held, due
 * when the claim ends (store/dispatch.c claim_row). */
static int sq_claim_shaped(const es_event *row) {
  return row->status == ES_STATUS_PENDING && row->queued && row->claim_holder &&
         row->due_at != ES_NONE && row->due_at == row->claim_expires_at;
}

static int sq_event_update(es_backend *b, es_txn *t, const es_event *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return sq_read_only_txn(err);
  if (sq_claim_shaped(row)) {
    /* In place: ST_EVENT_CLAIM, unless the row is not one it may write. */
    if ((code = sq_op(t, ST_EVENT_CLAIM, &st, &temp, err)) != ES_OK) return code;
    if (sq_bind_event(st, row, row->position) != SQLITE_OK)
      return sq_bind_fail(t, ST_EVENT_CLAIM, st, temp, err);
    if ((code = sq_run(t, ST_EVENT_CLAIM, st, temp, "update", err)) != ES_OK) return code;
    if (sqlite3_changes(t->c->db) > 0) return ES_OK;
  }
  if ((code = sq_op(t, ST_EVENT_UPDATE, &st, &temp, err)) != ES_OK) return code;
  int64_t at = row->position > 0 ? row->position : ES_NONE;
  if (sq_bind_event(st, row, at) != SQLITE_OK) return sq_bind_fail(t, ST_EVENT_UPDATE, st, temp, err);
  if ((code = sq_run(t, ST_EVENT_UPDATE, st, temp, "update", err)) != ES_OK) return code;
  if (sqlite3_changes(t->c->db) > 0) return ES_OK;
  if (at == ES_NONE) return ES_NOT_FOUND;
  /* A row whose position is not the stored one's: by (session, idx). */
  if ((code = sq_op(t, ST_EVENT_UPDATE, &st, &temp, err)) != ES_OK) return code;
  if (sq_bind_event(st, row, ES_NONE) != SQLITE_OK)
    return sq_bind_fail(t, ST_EVENT_UPDATE, st, temp, err);
  if ((code = sq_run(t, ST_EVENT_UPDATE, st, temp, "update", err)) != ES_OK) return code;
  return sqlite3_changes(t->c->db) > 0 ? ES_OK : ES_NOT_FOUND;
}

/* A completion's write in one statement (backend.h event_complete; the
 * core inserts the events it returned): the core's read of the row
 * before its update was about a third of a completion (bench/README.md
 * "A completion in one statement"). Not `RETURNING lane`, which doubled the statement's cost
 * (SQLite runs it through a temporary trigger and table): a laned row is
 * left to the core's general path, which advances its lane. */
static int sq_event_complete(es_backend *b, es_txn *t, const char *session, int64_t index,
                             int64_t attempt, int64_t returned, int64_t now, int *done, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  *done = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_EVENT_COMPLETE, &st, &temp, err)) != ES_OK) return code;
  if ((sq_bind_str(st, 1, session) | sqlite3_bind_int64(st, 2, index) |
       sqlite3_bind_int64(st, 3, attempt) | sqlite3_bind_int64(st, 4, now) |
       sqlite3_bind_int64(st, 5, returned)) != SQLITE_OK)
    return sq_bind_fail(t, ST_EVENT_COMPLETE, st, temp, err);
  if ((code = sq_run(t, ST_EVENT_COMPLETE, st, temp, "update", err)) != ES_OK) return code;
  *done = sqlite3_changes(t->c->db) > 0;
  return ES_OK;
}

/* SQLite refuses a row over SQLITE_LIMIT_LENGTH (SQLITE_TOOBIG) as a
 * whole: the payload gets what the row's other columns leave, with room
 * to spare (names of at most 320 bytes, a meta of 8 KiB, a last_error of
 * 64 KiB). */
#define SQ_ROW_ROOM (1 << 20)

static size_t sq_max_payload(es_backend *b) {
  int limit = b->w.db ? sqlite3_limit(b->w.db, SQLITE_LIMIT_LENGTH, -1) : 1000000000;
  return limit > SQ_ROW_ROOM ? (size_t)(limit - SQ_ROW_ROOM) : 0;
}

static int sq_event_range(es_backend *b, es_txn *t, const char *session, int64_t after,
                          int64_t through, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_EVENT_RANGE, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, after == ES_NONE ? 0 : after);
  sqlite3_bind_int64(st, 3, through == ES_NONE ? INT64_MAX : through);
  sqlite3_bind_int64(st, 4, sq_limit(limit));
  return sq_iterate(t, ST_EVENT_RANGE, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
}

static int sq_event_all(es_backend *b, es_txn *t, const char *scope, int64_t after, int64_t limit,
                        es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, id = scope ? ST_EVENT_ALL_SCOPED : ST_EVENT_ALL;
  if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sqlite3_bind_int64(st, 1, after == ES_NONE ? 0 : after);
  sqlite3_bind_int64(st, 2, sq_limit(limit));
  if (scope) sq_bind_str(st, 3, scope); /* the scope itself: events_scope's key */
  return sq_iterate(t, id, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
}

/* §3.12: one row of `counts` (schema version 7); no row: all zero. */
static int sq_counts(es_backend *b, es_txn *t, const char *scope, es_counts *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  memset(out, 0, sizeof *out);
  /* a write transaction's own moves first: the rows waiting, the sums */
  if (t->write && ((code = sq_txn_check(t, err)) != ES_OK || (code = sq_behind_flush(t, err)) != ES_OK ||
                   (code = sq_counts_write(t, err)) != ES_OK))
    return code;
  if ((code = sq_op(t, ST_COUNTS, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, scope ? scope : "");
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    out->sessions = sqlite3_column_int64(st, 0);
    out->events = sqlite3_column_int64(st, 1);
    out->pending = sqlite3_column_int64(st, 2);
    out->dead = sqlite3_column_int64(st, 3);
  }
  sq_stmt_done(t->c, ST_COUNTS, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  return ES_OK;
}

static int sq_last_position(es_backend *b, es_txn *t, int64_t *position, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  *position = 0;
  if ((code = sq_op(t, ST_MAX_POSITION, &st, &temp, err)) != ES_OK) return code;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *position = sqlite3_column_int64(st, 0); /* NULL (empty) reads as 0 */
  sq_stmt_done(t->c, ST_MAX_POSITION, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  return ES_OK;
}

static int sq_lane_next(es_backend *b, es_txn *t, const char *session, const char *lane,
                        int64_t after, int64_t *index, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  *index = 0;
  if ((code = sq_op(t, ST_LANE_NEXT, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sq_bind_str(st, 2, lane);
  sqlite3_bind_int64(st, 3, after == ES_NONE ? 0 : after);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *index = sqlite3_column_int64(st, 0);
  sq_stmt_done(t->c, ST_LANE_NEXT, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  return ES_OK;
}

/* Counts rows on their way to the caller's callback, skipping the first
 * `skip` (already delivered by the window query). */
typedef struct {
  es_event_cb cb;
  void *ctx;
  int64_t seen, skip, delivered;
} sq_counting;

static int sq_count_event(void *ctx, const es_event *row) {
  sq_counting *c = ctx;
  if (c->seen++ < c->skip) return 0;
  c->delivered++;
  return c->cb(c->ctx, row);
}

#define SQ_CLAIM_WINDOW 64 /* queued rows a claim looks at past its limit before asking by due time */

static int sq_queued_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                         int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!session && scope) {
    sq_scope_end end;
    if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
    if ((code = sq_op(t, ST_QUEUED_DUE_ALL_SCOPED, &st, &temp, err)) != ES_OK) return code;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, sq_limit(limit));
    sq_bind_scope(st, 3, scope, end.v);
    return sq_iterate(t, ST_QUEUED_DUE_ALL_SCOPED, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
  }
  if (!session) {
    if ((code = sq_op(t, ST_QUEUED_DUE_ALL, &st, &temp, err)) != ES_OK) return code;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, sq_limit(limit));
    return sq_iterate(t, ST_QUEUED_DUE_ALL, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
  }
  sq_counting c = {cb, ctx, 0, 0, 0};
  int64_t window = limit == ES_NONE ? 0 : limit + SQ_CLAIM_WINDOW;
  if (window > 0) {
    /* Usually the ready rows are the first queued ones: O(log n + window). */
    if ((code = sq_op(t, ST_QUEUED_DUE_SESSION, &st, &temp, err)) != ES_OK) return code;
    sq_bind_str(st, 1, session);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, limit);
    sqlite3_bind_int64(st, 4, window);
    code = sq_iterate(t, ST_QUEUED_DUE_SESSION, st, temp, ROW_EVENT, (sq_fn)sq_count_event, &c, err);
    if (code != ES_OK || c.delivered >= limit) return code;
    /* Fewer than asked: done, unless the window was full of rows that are
     * not due, with ready rows possibly beyond it. */
    if ((code = sq_op(t, ST_QUEUED_WINDOW_COUNT, &st, &temp, err)) != ES_OK) return code;
    sq_bind_str(st, 1, session);
    sqlite3_bind_int64(st, 2, window);
    int rc = sqlite3_step(st);
    int64_t queued = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sq_stmt_done(t->c, ST_QUEUED_WINDOW_COUNT, st, temp);
    if (rc != SQLITE_ROW) return sq_txn_fail(t, rc, "read", err);
    if (queued < window) return ES_OK;
  }
  /* Only the ready rows (found by due time), in index order; the ones the
   * window delivered come first (they have the lowest indexes): skip them. */
  if ((code = sq_op(t, ST_QUEUED_DUE_SESSION_BY_DUE, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, now);
  sqlite3_bind_int64(st, 3, sq_limit(limit));
  c.skip = c.delivered;
  c.seen = 0;
  return sq_iterate(t, ST_QUEUED_DUE_SESSION_BY_DUE, st, temp, ROW_EVENT, (sq_fn)sq_count_event, &c,
                    err);
}

/* A session's least due time > now (ST_QUEUED_NEXT_SESSION's two parts):
 * O(log n + rows of the session with due_at <= now + rows walked past the
 * answer). The core asks when nothing of the session was claimable, so the
 * rows with due_at <= now are mostly its live claims. */
static int sq_queued_next_due_session(es_txn *t, const char *session, int64_t now, int64_t *due,
                                      es_err *err) {
  sqlite3_stmt *st;
  int temp, code, rc;
  int64_t least = ES_NONE;
  if ((code = sq_op(t, ST_QUEUED_NEXT_SESSION_CLAIMED, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, now);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) least = sq_col_opt(st, 0);
  sq_stmt_done(t->c, ST_QUEUED_NEXT_SESSION_CLAIMED, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  if ((code = sq_op(t, ST_QUEUED_NEXT_SESSION, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, now);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int64_t at = sqlite3_column_int64(st, 0), d = sq_col_opt(st, 1);
    if (least != ES_NONE && at >= least) break; /* every later row is due at >= at */
    if (d == ES_NONE) d = at;
    if (least == ES_NONE || d < least) least = d;
  }
  sq_stmt_done(t->c, ST_QUEUED_NEXT_SESSION, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  *due = least;
  return ES_OK;
}

static int sq_queued_next_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                              int64_t now, int64_t *due, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  int id = scope ? ST_QUEUED_NEXT_ALL_SCOPED : ST_QUEUED_NEXT_ALL;
  sq_scope_end end;
  *due = ES_NONE;
  if (session) return sq_queued_next_due_session(t, session, now, due, err);
  if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sqlite3_bind_int64(st, 1, now);
  if (scope) sq_bind_scope(st, 2, scope, end.v);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *due = sq_col_opt(st, 0);
  sq_stmt_done(t->c, id, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  return ES_OK;
}

static int sq_queued_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                              int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, id = scope ? ST_QUEUED_DUE_TYPE_SCOPED : ST_QUEUED_DUE_TYPE;
  sq_scope_end end;
  if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, type);
  sqlite3_bind_int64(st, 2, now);
  sqlite3_bind_int64(st, 3, sq_limit(limit));
  if (scope) sq_bind_scope(st, 4, scope, end.v);
  return sq_iterate(t, id, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
}

static int sq_queued_next_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                                   int64_t now, int64_t *due, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc, id = scope ? ST_QUEUED_NEXT_TYPE_SCOPED : ST_QUEUED_NEXT_TYPE;
  sq_scope_end end;
  *due = ES_NONE;
  if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, type);
  sqlite3_bind_int64(st, 2, now);
  if (scope) sq_bind_scope(st, 3, scope, end.v);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *due = sq_col_opt(st, 0);
  sq_stmt_done(t->c, id, st, temp);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_txn_fail(t, rc, "read", err);
  return ES_OK;
}

/* A walk of events_type_pending (covering: no table row is read), so
 * O(pending rows), not O(events). Rows are copied out before the first
 * callback, as sq_iterate does in a write transaction. */
static int sq_pending_types(es_backend *b, es_txn *t, const char *scope, es_type_count_cb cb,
                            void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc, id = scope ? ST_PENDING_TYPES_SCOPED : ST_PENDING_TYPES;
  sq_scope_end end;
  if ((code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  if (scope) sq_bind_scope(st, 1, scope, end.v);
  es_type_counts got = {NULL, 0};
  size_t cap = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const unsigned char *type = sqlite3_column_text(st, 0);
    char *copy = type ? strdup((const char *)type) : NULL;
    if (!copy || es_grow((void **)&got.v, &cap, got.n + 1, sizeof *got.v) != ES_OK) {
      free(copy);
      code = sq_oom(err);
      break;
    }
    got.v[got.n].type = copy;
    got.v[got.n++].pending = sqlite3_column_int64(st, 1);
  }
  if (code == ES_OK && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, id, st, temp);
  for (size_t i = 0; code == ES_OK && i < got.n; i++)
    if (cb(ctx, got.v[i].type, got.v[i].pending)) break;
  es_type_counts_destroy(&got);
  return code;
}

static int sq_dead_list(es_backend *b, es_txn *t, const char *session, const char *scope,
                        int64_t after, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, id = session ? ST_DEAD_SESSION : scope ? ST_DEAD_ALL_SCOPED : ST_DEAD_ALL;
  sq_scope_end end;
  if (!session && (code = sq_scope_ok(scope, err)) != ES_OK) return code;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  if (session) {
    sq_bind_str(st, 1, session);
    sqlite3_bind_int64(st, 2, after == ES_NONE ? 0 : after);
    sqlite3_bind_int64(st, 3, sq_limit(limit));
  } else {
    sqlite3_bind_int64(st, 1, after == ES_NONE ? 0 : after);
    sqlite3_bind_int64(st, 2, sq_limit(limit));
    if (scope) sq_bind_scope(st, 3, scope, end.v);
  }
  return sq_iterate(t, id, st, temp, ROW_EVENT, (sq_fn)cb, ctx, err);
}

/* ---- snapshots ------------------------------------------------------------ */

static int sq_snapshot_get(es_backend *b, es_txn *t, const char *session, const char *reducer,
                           es_snapshot *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_SNAPSHOT_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sq_bind_str(st, 2, reducer);
  return sq_get_one(t, ST_SNAPSHOT_GET, st, temp, ROW_SNAPSHOT, out, err);
}

static int sq_snapshot_put(es_backend *b, es_txn *t, const char *session, const es_snapshot *row,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_SNAPSHOT_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, session);
  rc |= sq_bind_str(st, 2, row->reducer);
  rc |= sqlite3_bind_int64(st, 3, row->index);
  rc |= row->state ? sqlite3_bind_blob64(st, 4, row->state, row->state_len, SQLITE_STATIC)
                   : sqlite3_bind_null(st, 4);
  rc |= sq_bind_str(st, 5, row->version);
  rc |= sq_bind_opt(st, 6, row->updated_at);
  if (rc) return sq_bind_fail(t, ST_SNAPSHOT_PUT, st, temp, err);
  return sq_run(t, ST_SNAPSHOT_PUT, st, temp, "write", err);
}

static int sq_snapshot_list(es_backend *b, es_txn *t, const char *session, es_snapshot_cb cb,
                            void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_SNAPSHOT_LIST, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  return sq_iterate(t, ST_SNAPSHOT_LIST, st, temp, ROW_SNAPSHOT, (sq_fn)cb, ctx, err);
}

/* ---- projections (§8) ------------------------------------------------------ */

static int sq_remove(es_txn *t, int id, const char *session, int64_t through, int64_t *removed,
                     es_err *err);

static int sq_proj_get(es_backend *b, es_txn *t, const char *ns, const char *key, char **value,
                       size_t *len, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  *value = NULL;
  *len = 0;
  if ((code = sq_op(t, ST_PROJ_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, ns);
  sq_bind_str(st, 2, key);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    size_t n = (size_t)sqlite3_column_bytes(st, 0);
    const void *p = sqlite3_column_blob(st, 0);
    char *v = malloc(n + 1);
    if (!v) {
      code = sq_oom(err);
    } else {
      if (n) memcpy(v, p, n);
      v[n] = 0;
      *value = v;
      *len = n;
    }
  } else if (rc == SQLITE_DONE) {
    code = ES_NOT_FOUND;
  } else {
    code = sq_txn_fail(t, rc, "read", err);
  }
  sq_stmt_done(t->c, ST_PROJ_GET, st, temp);
  return code;
}

static int sq_proj_put(es_backend *b, es_txn *t, const char *ns, const char *key, const char *value,
                       size_t len, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0, id = value ? ST_PROJ_PUT : ST_PROJ_DELETE;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, ns);
  rc |= sq_bind_str(st, 2, key);
  if (value) rc |= sqlite3_bind_blob64(st, 3, len ? value : "", len, SQLITE_STATIC);
  if (rc) return sq_bind_fail(t, id, st, temp, err);
  return sq_run(t, id, st, temp, "write", err);
}

static int sq_proj_list(es_backend *b, es_txn *t, const char *ns, const char *prefix,
                        const char *after, int64_t limit, es_proj_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  char *lower, *upper;
  size_t llen, ulen;
  if (es_proj_range(prefix, after, &lower, &llen, &upper, &ulen) != ES_OK) return sq_oom(err);
  if ((code = sq_op(t, ST_PROJ_LIST, &st, &temp, err)) != ES_OK) goto done;
  rc |= sq_bind_str(st, 1, ns);
  rc |= sqlite3_bind_text64(st, 2, lower, llen, SQLITE_STATIC, SQLITE_UTF8);
  rc |= ulen ? sqlite3_bind_text64(st, 3, upper, ulen, SQLITE_STATIC, SQLITE_UTF8)
             : sqlite3_bind_zeroblob(st, 3, 0);
  rc |= sqlite3_bind_int64(st, 4, sq_limit(limit));
  if (rc) {
    code = sq_bind_fail(t, ST_PROJ_LIST, st, temp, err);
    goto done;
  }
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *k = (const char *)sqlite3_column_text(st, 0);
    const char *v = sqlite3_column_blob(st, 1);
    size_t n = (size_t)sqlite3_column_bytes(st, 1);
    if (!k) {
      code = sq_oom(err);
      break;
    }
    if (cb(ctx, k, v ? v : "", n)) break;
  }
  if (code == ES_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, ST_PROJ_LIST, st, temp);
done:
  free(lower);
  free(upper);
  return code;
}

static int sq_proj_drop(es_backend *b, es_txn *t, const char *ns, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return sq_remove(t, ST_PROJ_DROP, ns, 0, &removed, err);
}

/* ---- refs ------------------------------------------------------------------ */

static int sq_ref_get(es_backend *b, es_txn *t, const char *name, es_ref *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_REF_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, name);
  return sq_get_one(t, ST_REF_GET, st, temp, ROW_REF, out, err);
}

static int sq_ref_put(es_backend *b, es_txn *t, const es_ref *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_REF_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, row->name);
  rc |= sq_bind_str(st, 2, row->session);
  rc |= sq_bind_opt(st, 3, row->created_at);
  rc |= sq_bind_opt(st, 4, row->updated_at);
  if (rc) return sq_bind_fail(t, ST_REF_PUT, st, temp, err);
  return sq_run(t, ST_REF_PUT, st, temp, "write", err);
}

static int sq_ref_delete(es_backend *b, es_txn *t, const char *name, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_REF_DELETE, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, name);
  if ((code = sq_run(t, ST_REF_DELETE, st, temp, "write", err)) != ES_OK) return code;
  return sqlite3_changes(t->c->db) > 0 ? ES_OK : ES_NOT_FOUND;
}

static int sq_ref_list(es_backend *b, es_txn *t, const char *after, int64_t limit, es_ref_cb cb,
                       void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, id = after ? ST_REF_LIST_GT : ST_REF_LIST;
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  if (after) sq_bind_str(st, 1, after);
  sqlite3_bind_int64(st, 2, sq_limit(limit));
  return sq_iterate(t, id, st, temp, ROW_REF, (sq_fn)cb, ctx, err);
}

/* ---- presence ------------------------------------------------------------- */

static int sq_presence_get(es_backend *b, es_txn *t, const char *ns, const char *participant,
                           const char *field, es_presence_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_PRESENCE_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, ns);
  sq_bind_str(st, 2, participant);
  sq_bind_str(st, 3, field);
  return sq_get_one(t, ST_PRESENCE_GET, st, temp, ROW_PRESENCE, out, err);
}

static int sq_presence_put(es_backend *b, es_txn *t, const char *ns, const es_presence_row *row,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_PRESENCE_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, ns);
  rc |= sq_bind_str(st, 2, row->participant);
  rc |= sq_bind_str(st, 3, row->field);
  rc |= sq_bind_bytes_text(st, 4, row->value, row->value_len);
  rc |= sq_bind_opt(st, 5, row->seen);
  rc |= sq_bind_opt(st, 6, row->at);
  rc |= sq_bind_opt(st, 7, row->expires_at);
  if (rc) return sq_bind_fail(t, ST_PRESENCE_PUT, st, temp, err);
  return sq_run(t, ST_PRESENCE_PUT, st, temp, "write", err);
}

static int sq_presence_expire(es_backend *b, es_txn *t, const char *ns, int64_t now, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return ES_OK; /* allowed no-op: a read transaction never writes */
  if ((code = sq_op(t, ST_PRESENCE_EXPIRE, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, ns);
  sqlite3_bind_int64(st, 2, now);
  return sq_run(t, ST_PRESENCE_EXPIRE, st, temp, "write", err);
}

static int sq_presence_list(es_backend *b, es_txn *t, const char *ns, int64_t now,
                            es_presence_cb_row cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if ((code = sq_op(t, ST_PRESENCE_LIST, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, ns);
  sqlite3_bind_int64(st, 2, now);
  return sq_iterate(t, ST_PRESENCE_LIST, st, temp, ROW_PRESENCE, (sq_fn)cb, ctx, err);
}

/* ---- retention (§3.9) -------------------------------------------------------- */

/* Runs one of the DELETE statements with session bound as ?1 (and through
 * as ?2 for event_delete_range); *removed: the rows deleted. Marks the
 * transaction so that the commit gives the freed space back. */
static int sq_remove(es_txn *t, int id, const char *session, int64_t through, int64_t *removed,
                     es_err *err) {
  sqlite3_stmt *st;
  int temp, code;
  *removed = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, id, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  if (id == ST_EVENT_DELETE_RANGE || id == ST_PAYLOAD_DELETE_RANGE) sqlite3_bind_int64(st, 2, through);
  if ((code = sq_run(t, id, st, temp, "delete", err)) != ES_OK) return code;
  *removed = sqlite3_changes64(t->c->db);
  if (*removed > 0) t->removed = 1;
  return ES_OK;
}

/* Positions are not touched: next_position was loaded when the
 * transaction began (above every row, the removed ones included) and the
 * commit stores it when it is above the stored high-water mark, so removing
 * the newest rows never lets a later insert reuse their positions, in this
 * process or after a reopen. A through below 1 (ES_NONE included) removes
 * nothing: never everything by mistake. */
static int sq_event_delete_range(es_backend *b, es_txn *t, const char *session, int64_t through,
                                 es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  int code = sq_remove(t, ST_PAYLOAD_DELETE_RANGE, session, through, &removed, err);
  return code == ES_OK ? sq_remove(t, ST_EVENT_DELETE_RANGE, session, through, &removed, err) : code;
}

static int sq_session_delete(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed = 0;
  sq_counted base;
  if (!t->write) return sq_read_only_txn(err);
  /* the rows waiting first (this one may be among them), then the row as
   * the file holds it, whose counts leave the sums */
  int code = sq_behind_flush(t, err);
  if (code == ES_OK) code = sq_base_take(t, session, &base, err);
  if (code == ES_OK) code = sq_remove(t, ST_SESSION_DELETE, session, 0, &removed, err);
  if (code == ES_OK && removed > 0) code = sq_counts_row(t, session, &base, NULL, err);
  if (code != ES_OK) return code;
  return removed > 0 ? ES_OK : ES_NOT_FOUND;
}

static int sq_fence_floor_get(es_backend *b, es_txn *t, const char *session, int64_t *token,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  *token = 0;
  if ((code = sq_op(t, ST_FLOOR_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *token = sqlite3_column_int64(st, 0);
  else if (rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, ST_FLOOR_GET, st, temp);
  return code;
}

static int sq_fence_floor_put(es_backend *b, es_txn *t, const char *session, int64_t token,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_FLOOR_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, session);
  rc |= sqlite3_bind_int64(st, 2, token);
  if (rc) return sq_bind_fail(t, ST_FLOOR_PUT, st, temp, err);
  return sq_run(t, ST_FLOOR_PUT, st, temp, "write", err);
}

static int sq_snapshot_delete_all(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return sq_remove(t, ST_SNAPSHOT_DELETE_ALL, session, 0, &removed, err);
}

static int sq_ref_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return sq_remove(t, ST_REF_DELETE_SESSION, session, 0, &removed, err);
}

/* ---- archive (§3.9) -------------------------------------------------------- */

/* The rows are copied out and the statement finished before the first
 * callback (the list is a handful of rows), so a callback may write. */
static int sq_segment_sessions(es_backend *b, es_txn *t, const char *prefix, const char *after,
                               int64_t limit,
                               int (*cb)(void *ctx, const char *session, int64_t through),
                               void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  if ((code = sq_op(t, ST_SEGMENT_SESSIONS, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, prefix ? prefix : "");
  sq_bind_str(st, 2, after ? after : "");
  sqlite3_bind_int64(st, 3, limit == ES_NONE ? -1 : limit);
  /* copied out before the callbacks, as segment_list does */
  es_archived rows = {0};
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (es_grow((void **)&rows.v, &rows.cap, rows.n + 1, sizeof *rows.v) != ES_OK ||
        sq_col_str(st, 0, 1, &rows.v[rows.n].session, NULL) != ES_OK) {
      code = sq_oom(err);
      break;
    }
    rows.v[rows.n++].archived_through = sqlite3_column_int64(st, 1);
  }
  if (code == ES_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, ST_SEGMENT_SESSIONS, st, temp);
  for (size_t i = 0; code == ES_OK && i < rows.n; i++)
    if (cb(ctx, rows.v[i].session, rows.v[i].archived_through)) break;
  es_archived_destroy(&rows);
  return code;
}

static int sq_segment_list(es_backend *b, es_txn *t, const char *session, es_segment_cb cb,
                           void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  if ((code = sq_op(t, ST_SEGMENT_LIST, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  es_segments rows = {0};
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (es_grow((void **)&rows.v, &rows.cap, rows.n + 1, sizeof *rows.v) != ES_OK) {
      code = sq_oom(err);
      break;
    }
    es_segment *g = &rows.v[rows.n];
    es_segment_init(g);
    g->from = sqlite3_column_int64(st, 0);
    g->through = sqlite3_column_int64(st, 1);
    g->count = sqlite3_column_int64(st, 2);
    g->bytes = sqlite3_column_int64(st, 3);
    const unsigned char *sum = sqlite3_column_text(st, 4);
    snprintf(g->checksum, sizeof g->checksum, "%s", sum ? (const char *)sum : "");
    g->created_at = sq_col_opt(st, 6);
    if (sq_col_str(st, 5, 1, &g->file, NULL) != ES_OK) {
      code = sq_oom(err);
      break;
    }
    rows.n++;
  }
  if (code == ES_OK && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, ST_SEGMENT_LIST, st, temp);
  for (size_t i = 0; code == ES_OK && i < rows.n; i++)
    if (cb(ctx, &rows.v[i])) break;
  es_segments_destroy(&rows);
  return code;
}

static int sq_segment_put(es_backend *b, es_txn *t, const char *session, const es_segment *row,
                          es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_SEGMENT_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, session);
  rc |= sqlite3_bind_int64(st, 2, row->from);
  rc |= sqlite3_bind_int64(st, 3, row->through);
  rc |= sqlite3_bind_int64(st, 4, row->count);
  rc |= sqlite3_bind_int64(st, 5, row->bytes);
  rc |= sq_bind_str(st, 6, row->checksum);
  rc |= sq_bind_str(st, 7, row->file);
  rc |= sq_bind_opt(st, 8, row->created_at);
  if (rc) return sq_bind_fail(t, ST_SEGMENT_PUT, st, temp, err);
  return sq_run(t, ST_SEGMENT_PUT, st, temp, "write", err);
}

static int sq_segment_delete(es_backend *b, es_txn *t, const char *session, int64_t from,
                             es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_SEGMENT_DELETE, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, from);
  if ((code = sq_run(t, ST_SEGMENT_DELETE, st, temp, "delete", err)) != ES_OK) return code;
  return sqlite3_changes(t->c->db) > 0 ? ES_OK : ES_NOT_FOUND;
}

/* ---- crypto-shredding (§3.10) ------------------------------------------- */

static int sq_key_get(es_backend *b, es_txn *t, const char *name, es_key_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  memset(out, 0, sizeof *out);
  if ((code = sq_op(t, ST_KEY_GET, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, name);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const void *w = sqlite3_column_blob(st, 1);
    size_t wn = (size_t)sqlite3_column_bytes(st, 1);
    out->created_at = sq_col_opt(st, 2);
    out->shredded_at = sq_col_opt(st, 3);
    out->name = strdup(name);
    if (sqlite3_column_type(st, 1) != SQLITE_NULL) {
      out->wrapped = malloc(wn ? wn : 1);
      if (out->wrapped && wn) memcpy(out->wrapped, w, wn);
      out->wrapped_len = wn;
    }
    code = !out->name || (sqlite3_column_type(st, 1) != SQLITE_NULL && !out->wrapped) ? sq_oom(err) : ES_OK;
    if (code) es_key_row_destroy(out);
  } else if (rc == SQLITE_DONE) {
    code = ES_NOT_FOUND;
  } else {
    code = sq_txn_fail(t, rc, "read", err);
  }
  sq_stmt_done(t->c, ST_KEY_GET, st, temp);
  return code;
}

static int sq_key_put(es_backend *b, es_txn *t, const es_key_row *row, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  /* A shred through a store opened without keys: what it deletes must be
   * zeroed all the same (the pragma is a flag of the connection, allowed
   * inside a transaction; it stays on for the connection's life). */
  if (!row->wrapped && !t->b->secure_delete) {
    if ((code = sq_conn_exec(t->c, "PRAGMA secure_delete = ON", "write", err)) != ES_OK) return code;
    t->b->secure_delete = 1;
  }
  if ((code = sq_op(t, ST_KEY_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, row->name);
  rc |= row->wrapped ? sqlite3_bind_blob64(st, 2, row->wrapped, row->wrapped_len, SQLITE_STATIC)
                     : sqlite3_bind_null(st, 2);
  rc |= sq_bind_opt(st, 3, row->created_at);
  rc |= sq_bind_opt(st, 4, row->shredded_at);
  if (rc) return sq_bind_fail(t, ST_KEY_PUT, st, temp, err);
  if ((code = sq_run(t, ST_KEY_PUT, st, temp, "write", err)) != ES_OK) return code;
  if (!row->wrapped) t->removed = 1; /* a shred frees space: the commit gives it back */
  return ES_OK;
}

static int sq_key_use_put(es_backend *b, es_txn *t, const char *key, const char *session,
                          int64_t first_index, es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc = 0;
  if (!t->write) return sq_read_only_txn(err);
  if ((code = sq_op(t, ST_KEY_USE_PUT, &st, &temp, err)) != ES_OK) return code;
  rc |= sq_bind_str(st, 1, key);
  rc |= sq_bind_str(st, 2, session);
  rc |= sqlite3_bind_int64(st, 3, first_index);
  if (rc) return sq_bind_fail(t, ST_KEY_USE_PUT, st, temp, err);
  return sq_run(t, ST_KEY_USE_PUT, st, temp, "write", err);
}

/* The rows are copied out and the statement reset before the first
 * callback (as sq_iterate does in the write transaction): shred deletes
 * snapshots for each of them. */
static int sq_key_use_list(es_backend *b, es_txn *t, const char *key, es_key_use_cb cb, void *ctx,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code, rc;
  char **names = NULL;
  int64_t *firsts = NULL;
  size_t n = 0, cap = 0;
  if ((code = sq_op(t, ST_KEY_USE_LIST, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, key);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      char **nn = realloc(names, ncap * sizeof *nn);
      if (nn) names = nn;
      int64_t *nf = nn ? realloc(firsts, ncap * sizeof *nf) : NULL;
      if (nf) firsts = nf;
      if (!nn || !nf) {
        code = sq_oom(err);
        break;
      }
      cap = ncap;
    }
    char *v = NULL;
    if (sq_col_str(st, 0, 1, &v, NULL) != ES_OK || !v) {
      code = sq_oom(err);
      break;
    }
    names[n] = v;
    firsts[n++] = sqlite3_column_int64(st, 1);
  }
  if (code == ES_OK && rc != SQLITE_DONE) code = sq_txn_fail(t, rc, "read", err);
  sq_stmt_done(t->c, ST_KEY_USE_LIST, st, temp);
  for (size_t i = 0; code == ES_OK && i < n; i++)
    if (cb(ctx, names[i], firsts[i])) break;
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  free(firsts);
  return code;
}

static int sq_key_use_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  (void)b; /* t carries it (t->b) */
  int64_t removed;
  return sq_remove(t, ST_KEY_USE_DELETE_SESSION, session, 0, &removed, err);
}

static int sq_snapshot_delete_from(es_backend *b, es_txn *t, const char *session, int64_t index,
                                   es_err *err) {
  (void)b; /* t carries it (t->b) */
  sqlite3_stmt *st;
  int temp, code;
  if (!t->write) return sq_read_only_txn(err);
  /* §3.10: only shred drops snapshots this way; what it drops held
   * plaintext, so it is zeroed even on a connection opened without keys */
  if (!t->b->secure_delete) {
    if ((code = sq_conn_exec(t->c, "PRAGMA secure_delete = ON", "write", err)) != ES_OK) return code;
    t->b->secure_delete = 1;
  }
  if ((code = sq_op(t, ST_SNAPSHOT_DELETE_FROM, &st, &temp, err)) != ES_OK) return code;
  sq_bind_str(st, 1, session);
  sqlite3_bind_int64(st, 2, index);
  if ((code = sq_run(t, ST_SNAPSHOT_DELETE_FROM, st, temp, "delete", err)) != ES_OK) return code;
  if (sqlite3_changes64(t->c->db) > 0) t->removed = 1;
  return ES_OK;
}

/* After a shred committed (outside any transaction): the deleted cells and
 * freed pages were zeroed in the pages the commit wrote to the WAL, but
 * older frames of the WAL still hold those pages as they were. A TRUNCATE
 * checkpoint copies the WAL into the main file (overwriting the old pages
 * there) and truncates the WAL to zero bytes. It waits for readers (up to
 * the busy timeout); when it cannot finish, the caller reports it and a
 * later shred finishes it. */
/* §10 eventstore backup (backend.h): the online backup API, from a read
 * connection of its own (one read transaction over the whole copy, so it
 * is consistent while the write connection, the engine's or another
 * process's, goes on), into a new file; then the copy's integrity check. */
static int sq_backup(es_backend *b, const char *to, es_err *err) {
  sqlite3 *src = NULL, *dst = NULL;
  struct stat st;
  if (stat(to, &st) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "backup: %s already exists (a backup makes a new file)", to);
  int rc = sqlite3_open_v2(b->full_path, &src, SQLITE_OPEN_READONLY, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_open_v2(to, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  int code = ES_STORAGE;
  const char *what = "open";
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(src, b->busy_ms);
    sqlite3_backup *bk = sqlite3_backup_init(dst, "main", src, "main");
    what = "copy";
    if (!bk) {
      rc = sqlite3_errcode(dst);
    } else {
      do {
        rc = sqlite3_backup_step(bk, -1);
      } while (rc == SQLITE_BUSY || rc == SQLITE_LOCKED);
      int fin = sqlite3_backup_finish(bk);
      rc = rc == SQLITE_DONE ? fin : rc;
    }
  }
  if (rc == SQLITE_OK) {
    sqlite3_stmt *q = NULL;
    what = "integrity check";
    rc = sqlite3_prepare_v2(dst, "PRAGMA integrity_check", -1, &q, NULL);
    if (rc == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
      const char *r = (const char *)sqlite3_column_text(q, 0);
      if (!r || strcmp(r, "ok") != 0) {
        es_fail(err, ES_STORAGE, "backup: the copy %s fails its integrity check: %s", to,
                r ? r : "(no answer)");
        rc = SQLITE_CORRUPT;
        code = ES_OK; /* err is filled */
      }
    } else if (rc == SQLITE_OK) {
      rc = sqlite3_errcode(dst);
    }
    sqlite3_finalize(q);
  }
  if (rc != SQLITE_OK && code != ES_OK)
    es_fail(err, code, "backup of %s to %s: %s failed: %s", b->path, to, what,
            dst ? sqlite3_errmsg(dst) : src ? sqlite3_errmsg(src) : sqlite3_errstr(rc));
  sqlite3_close(src);
  sqlite3_close(dst);
  if (rc != SQLITE_OK) {
    remove(to);
    return ES_STORAGE;
  }
  return ES_OK;
}

static int sq_scrub(es_backend *b, es_err *err) {
  int log = -1, done = -1;
  if (b->mode == SQ_MODE_RO) return ES_OK;
  /* not beside a pass of the checkpointer: its checkpoint lock would
   * fail this one at once */
  sq_ckpt_pause(b);
  int rc = sqlite3_wal_checkpoint_v2(b->w.db, "main", SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
  sq_ckpt_resume(b);
  if (rc != SQLITE_OK) return sq_fail(err, &b->w, rc, "checkpoint after shred");
  b->ckpt_due = b->restart_due = 0;
  return ES_OK;
}

/* ---- data version --------------------------------------------------------- */

/* PRAGMA data_version on connection c (watch_mu held for the watch
 * connection; the write connection only on the writing thread). */
static int sq_dv(sq_conn *c, int64_t *v, es_err *err) {
  sqlite3_stmt *st;
  int temp, code, rc;
  if ((code = sq_stmt(c, ST_DATA_VERSION, &st, &temp, err)) != ES_OK) return code;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *v = sqlite3_column_int64(st, 0);
  sq_stmt_done(c, ST_DATA_VERSION, st, temp);
  return rc == SQLITE_ROW ? ES_OK : sq_fail(err, c, rc, "data_version");
}

static int sq_data_version(es_backend *b, uint64_t *version, es_err *err) {
  int64_t v = 0;
  pthread_mutex_lock(&b->watch_mu);
  int code = sq_dv(&b->watch, &v, err);
  if (code == ES_OK) *version = (uint64_t)v;
  pthread_mutex_unlock(&b->watch_mu);
  return code;
}

/* ext_version: the watch connection's data_version moves with every
 * commit of another connection, this handle's write connection included;
 * sq_own_commit accounts for those, so what is left moved for another
 * process (or handle). O(1): no read of events. */
static int sq_ext_version(es_backend *b, uint64_t *version, es_err *err) {
  int64_t v = 0;
  pthread_mutex_lock(&b->watch_mu);
  int code = sq_dv(&b->watch, &v, err);
  if (code == ES_OK && v != b->watch_dv) {
    b->foreign++;
    b->watch_dv = v;
  }
  *version = b->foreign;
  pthread_mutex_unlock(&b->watch_mu);
  return code;
}

/* After a commit of the write connection (on the writing thread): the
 * watch connection's data_version read now includes this commit, so
 * ext_version does not count it; a commit of another connection that
 * came in between is caught by the write connection's own data_version,
 * which moves only for other connections' commits and is read after it.
 * A look that fails counts as another's commit (a spurious wake, never a
 * missed one). */
static void sq_own_commit(es_backend *b) {
  int64_t w = 0, d = 0;
  es_err ignored = {0};
  pthread_mutex_lock(&b->watch_mu);
  int ok = sq_dv(&b->watch, &w, &ignored) == ES_OK && sq_dv(&b->w, &d, &ignored) == ES_OK;
  if (!ok || d != b->w_dv) b->foreign++;
  b->watch_dv = w;
  b->w_dv = d;
  pthread_mutex_unlock(&b->watch_mu);
}

/* ---- the ops table ---------------------------------------------------------- */

const es_backend_ops es_backend_sqlite = {
    .scheme = "sqlite",
    .group_commit = 1,
    .open = sq_open,
    .close = sq_close,
    .write_begin = sq_write_begin,
    .write_commit = sq_write_commit,
    .write_rollback = sq_write_rollback,
    .savepoint = sq_savepoint,
    .savepoint_release = sq_savepoint_release,
    .savepoint_rollback = sq_savepoint_rollback,
    .read_begin = sq_read_begin,
    .read_end = sq_read_end,
    .session_get = sq_session_get,
    .session_put = sq_session_put,
    .session_list = sq_session_list,
    .session_children = sq_session_children,
    .event_get = sq_event_get,
    .event_get_by_id = sq_event_get_by_id,
    .event_insert = sq_event_insert,
    .event_insert_many = sq_event_insert_many,
    .event_copy = sq_event_copy,
    .event_update = sq_event_update,
    .event_complete = sq_event_complete,
    .event_range = sq_event_range,
    .event_all = sq_event_all,
    .last_position = sq_last_position,
    .lane_next = sq_lane_next,
    .queued_due = sq_queued_due,
    .queued_next_due = sq_queued_next_due,
    .queued_due_type = sq_queued_due_type,
    .queued_next_due_type = sq_queued_next_due_type,
    .pending_types = sq_pending_types,
    .dead_list = sq_dead_list,
    .snapshot_get = sq_snapshot_get,
    .snapshot_put = sq_snapshot_put,
    .snapshot_list = sq_snapshot_list,
    .ref_get = sq_ref_get,
    .ref_put = sq_ref_put,
    .ref_delete = sq_ref_delete,
    .ref_list = sq_ref_list,
    .presence_get = sq_presence_get,
    .presence_put = sq_presence_put,
    .presence_expire = sq_presence_expire,
    .presence_list = sq_presence_list,
    .event_delete_range = sq_event_delete_range,
    .session_delete = sq_session_delete,
    .fence_floor_get = sq_fence_floor_get,
    .fence_floor_put = sq_fence_floor_put,
    .snapshot_delete_all = sq_snapshot_delete_all,
    .ref_delete_session = sq_ref_delete_session,
    .key_get = sq_key_get,
    .key_put = sq_key_put,
    .key_use_put = sq_key_use_put,
    .key_use_list = sq_key_use_list,
    .key_use_delete_session = sq_key_use_delete_session,
    .snapshot_delete_from = sq_snapshot_delete_from,
    .proj_get = sq_proj_get,
    .proj_put = sq_proj_put,
    .proj_list = sq_proj_list,
    .proj_drop = sq_proj_drop,
    .scrub = sq_scrub,
    .data_version = sq_data_version,
    .ext_version = sq_ext_version,
    .lazy_begin = sq_lazy_begin,
    .lazy_end = sq_lazy_end,
    .backup = sq_backup,
    .segment_list = sq_segment_list,
    .segment_sessions = sq_segment_sessions,
    .segment_put = sq_segment_put,
    .segment_delete = sq_segment_delete,
    .counts = sq_counts,
    .max_payload = sq_max_payload,
};
