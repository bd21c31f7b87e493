/*
 * retention.c: the rules of §3.9 retention: truncate and delete (the
 * archive is archive.c).
 * Moved out of store.c as they were (store.c's top comment says how a
 * call runs).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "codec/json.h"
#include "store/backend.h"
#include "store/crypto.h"
#include "store/internal.h"
#include "store/rules.h"
#include "store/store.h"

/* ---------------------------------------------------------------------- */
/* 3.9 retention: truncate and delete */

typedef struct {
  const char *session;
  int64_t through, now;
  int64_t first_index;   /* truncate: after */
  int done;              /* delete: it existed */
  /* the scan of the range to drop */
  int64_t rows, bad_index;
  int bad_status;
  es_archive_files drop; /* §3.9: segment files to remove once committed */
} retention_args;

/* Counts the rows to drop and stops at the first one that is not
 * processed: only settled history may go. */
static int scan_droppable(void *ctx, const es_event *row) {
  retention_args *a = ctx;
  if (row->status != ES_STATUS_PROCESSED) {
    a->bad_index = row->index;
    a->bad_status = row->status;
    return 1;
  }
  a->rows++;
  return 0;
}

static int do_truncate(es_store *s, es_txn *t, void *arg, es_err *err) {
  retention_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) {
    a->first_index = 1;
    if (a->through == 0) return ES_OK;
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot truncate session '%s' through %lld: it has no events",
                   a->session, (long long)a->through);
  }
  if (rc) return rc;
  int64_t first = si.first_index > 1 ? si.first_index : 1;
  a->first_index = first;
  if (a->through > si.head) {
    rc = es_fail(err, ES_NO_SUCH_EVENT, "cannot truncate session '%s' through %lld: its head is %lld",
                 a->session, (long long)a->through, (long long)si.head);
  } else if (a->through >= first) {
    a->bad_index = 0;
    rc = s->ops->event_range(s->bk, t, a->session, first - 1, a->through, ES_NONE, scan_droppable,
                             a, err);
    if (rc == ES_OK && a->bad_index)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot truncate session '%s' through %lld: event %lld is %s (only processed events "
                   "can be dropped: let it complete, or settle it)",
                   a->session, (long long)a->through, (long long)a->bad_index,
                   a->bad_status == ES_STATUS_DEAD ? "a dead letter" : "pending");
    es_core_touch(s, a->session); /* a wait on it must see TRUNCATED */
    if (rc == ES_OK) rc = s->ops->event_delete_range(s->bk, t, a->session, a->through, err);
    /* §3.9: archived events in the range go too (they count in `events`),
     * and the segments that end at or before through */
    if (rc == ES_OK && si.archived_through >= first) {
      int64_t upto = a->through < si.archived_through ? a->through : si.archived_through;
      si.events -= upto - first + 1;
      rc = es_archive_drop(s, t, a->session, a->through, &a->drop, err);
    }
    if (rc == ES_OK) {
      si.events -= a->rows;
      si.first_index = a->first_index = a->through + 1;
      rc = s->ops->session_put(s->bk, t, &si, err);
    }
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                     es_err *err) {
  int rc;
  *first_index = 1;
  if ((rc = es_check_name("session", session, err))) return rc;
  if (through < 0) return es_fail(err, ES_INVALID_ARGUMENT, "through must be >= 0");
  if ((rc = es_core_enter(s, err))) return rc;
  retention_args a = {.session = session, .through = through};
  rc = es_core_write(s, do_truncate, &a, err);
  es_archive_files_finish(s, &a.drop, rc == ES_OK);
  es_core_leave(s);
  if (rc == ES_OK) *first_index = a.first_index;
  return rc;
}

static int do_delete(es_store *s, es_txn *t, void *arg, es_err *err) {
  retention_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  /* §3.8: the row goes, its fence token stays (backend.h fence_floor_put):
   * a session made again under this name fences past it */
  int64_t token = si.fence > si.lease_token ? si.fence : si.lease_token;
  es_session_info_destroy(&si);
  if (token > 0 && s->ops->fence_floor_put && (rc = s->ops->fence_floor_put(s->bk, t, a->session, token, err)))
    return rc;
  es_core_touch(s, a->session);
  if ((rc = s->ops->event_delete_range(s->bk, t, a->session, INT64_MAX, err)) ||
      (rc = es_archive_drop(s, t, a->session, INT64_MAX, &a->drop, err)) || /* §3.9 */
      (rc = s->ops->snapshot_delete_all(s->bk, t, a->session, err)) ||
      (rc = s->ops->ref_delete_session(s->bk, t, a->session, err)) ||
      (rc = s->ops->key_use_delete_session(s->bk, t, a->session, err)))
    return rc;
  rc = s->ops->session_delete(s->bk, t, a->session, err);
  a->done = rc == ES_OK;
  return rc;
}

int es_core_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  int rc;
  *deleted = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  retention_args a = {.session = session};
  rc = es_core_write(s, do_delete, &a, err);
  es_archive_files_finish(s, &a.drop, rc == ES_OK);
  es_core_leave(s);
  if (rc == ES_OK) *deleted = a.done;
  return rc;
}
