/*
 * backend_sql.h: what the SQL backends (sqlite.c, postgres.c) write in
 * their SQL that is the core's definition, spelled from it once: the
 * status numbers of store.h, the events table's column order and the
 * dispatch record of a copied event (backend.h event_copy). A change in
 * store.h that these no longer agree with stops the build (the static
 * asserts) instead of silently disagreeing with a backend's SQL.
 */
#ifndef ES_BACKEND_SQL_H
#define ES_BACKEND_SQL_H

#include "store/counts.h" /* ES_STR */
#include "store/store.h"

/* es_event.status as stored (store.h ES_STATUS_*). Literals so that SQL can
 * spell them; the partial indexes and the queries that must match their
 * predicates both use these, so the text stays identical. */
#define ES_SQL_STATUS_PENDING_N 0
#define ES_SQL_STATUS_PROCESSED_N 1
#define ES_SQL_STATUS_DEAD_N 2
_Static_assert(ES_SQL_STATUS_PENDING_N == ES_STATUS_PENDING, "store.h changed ES_STATUS_PENDING");
_Static_assert(ES_SQL_STATUS_PROCESSED_N == ES_STATUS_PROCESSED,
               "store.h changed ES_STATUS_PROCESSED");
_Static_assert(ES_SQL_STATUS_DEAD_N == ES_STATUS_DEAD, "store.h changed ES_STATUS_DEAD");
#define ES_SQL_PENDING ES_STR(ES_SQL_STATUS_PENDING_N)
#define ES_SQL_PROCESSED ES_STR(ES_SQL_STATUS_PROCESSED_N)
#define ES_SQL_DEAD ES_STR(ES_SQL_STATUS_DEAD_N)

/* The events table's columns in the order every event SELECT and INSERT
 * of both backends uses. The immutable columns added later (key, §3.10;
 * revision and meta, §3.1) come last. The columns around payload,
 * due_at and meta are apart so that a backend can read them through an
 * expression (sqlite: a long payload or meta is kept in a table of its
 * own, a claim's due time in a column of its own). */
#define ES_SQL_EV_COLS_ID "position, session, idx, id, type, "
#define ES_SQL_EV_COLS_MID                                                               \
  ", lane, created_at, cause_index, cause_attempt, not_before, status, attempts, "     \
  "failures, last_error, processed_at, claim_holder, claim_expires_at, retry_at, queued, "
#define ES_SQL_EV_COLS_HEAD ES_SQL_EV_COLS_ID "payload" ES_SQL_EV_COLS_MID
#define ES_SQL_EV_COLS_AFTER_DUE                                                         \
  ", last_failed_attempt, returned, origin_session, origin_index, first_claimed_at, " \
  "last_claimed_at, failed_at, processed_by_attempt, key, revision, "
#define ES_SQL_EV_COLS_TAIL ES_SQL_EV_COLS_AFTER_DUE "meta"
#define ES_SQL_EV_COLS ES_SQL_EV_COLS_HEAD "due_at" ES_SQL_EV_COLS_TAIL

/* The dispatch record of a copied event (es_event_settle_copy, rows.c), as
 * SQL values in ES_SQL_EV_COLS order: status .. returned, with
 * processed_at the SQL expression given, then first_claimed_at ..
 * processed_by_attempt. An empty field is NULL (ES_NONE, no text) or 0
 * (counters, queued); spec/c/backend_test.c compares what event_copy wrote
 * with es_event_settle_copy field by field. */
#define ES_COPY_RETURNED -1
#define ES_SQL_COPY_DISPATCH(processed_at)       \
  ES_SQL_PROCESSED ", 0, 0, NULL, " processed_at \
                   ", NULL, NULL, NULL, 0, NULL, NULL, " ES_STR(ES_COPY_RETURNED)
#define ES_SQL_COPY_CLAIMS "NULL, NULL, NULL, NULL"

/* es_rule_owns (rules.h) as an SQL condition on a row: attempt `attempt`
 * owns it (pending, claimed, its attempt count). */
#define ES_SQL_OWNED(attempt) \
  "status = " ES_SQL_PENDING " AND attempts = " attempt " AND claim_holder IS NOT NULL"

/* es_event_complete_record (backend.h) as an UPDATE's SET list (sqlite's
 * claim_due, its own column, cleared by the caller); spec/c/backend_test.c
 * compares event_complete's row with it field by field. */
#define ES_SQL_COMPLETED(now, attempt, returned)                                        \
  "status = " ES_SQL_PROCESSED ", processed_at = " now ", processed_by_attempt = " attempt \
  ", returned = " returned ", claim_holder = NULL, claim_expires_at = NULL,"             \
  " retry_at = NULL, due_at = NULL, queued = 0"

#endif
