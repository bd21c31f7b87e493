/*
 * fences.c: the rules of §3.8 fences, leases and seals.
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
/* 3.8 fences, leases, seals: fields of the session row, so every write,
 * which reads that row anyway, checks them for free. */

typedef struct {
  const char *session, *holder, *reason;
  int64_t token;    /* fence: if_token in, the new token out; release: the token */
  int64_t ttl_ms, now;
  es_lease *lease;
  int done;         /* release: released */
} ctl_args;

static int do_fence(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  if (a->token != ES_NONE && a->token != si.fence) {
    rc = es_fail(err, ES_STALE_FENCE, "session '%s' is at fence token %lld, not %lld", a->session,
                 (long long)si.fence, (long long)a->token);
  } else if (si.fence == INT64_MAX) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "session '%s' has used up its fence tokens", a->session);
  } else {
    a->token = ++si.fence;
    rc = s->ops->session_put(s->bk, t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_fence(es_store *s, const char *session, int64_t if_token, int64_t *token, es_err *err) {
  int rc;
  *token = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = check_nonneg("if_token", if_token, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .token = if_token};
  rc = es_core_write(s, do_fence, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *token = a.token;
  return rc;
}

static int do_lease(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  int live = si.lease_holder && a->now < si.lease_expires_at;
  es_lease *out = a->lease;
  if (live && strcmp(si.lease_holder, a->holder) != 0) {
    out->acquired = 0;
    out->expires_at = si.lease_expires_at;
    out->holder = strdup(si.lease_holder);
    es_session_info_destroy(&si);
    return out->holder ? ES_OK : nomem(err);
  }
  /* A renewal keeps its token while it is still the current one; a new
   * holder (or the same one after expiry, perhaps a restarted process)
   * takes a new token, which fences out the previous holder's writes. */
  if (!live || si.lease_token != si.fence) {
    if (si.fence == INT64_MAX) {
      es_session_info_destroy(&si);
      return es_fail(err, ES_INVALID_ARGUMENT, "session '%s' has used up its fence tokens",
                     a->session);
    }
    si.lease_token = ++si.fence;
  }
  if (!live) {
    free(si.lease_holder);
    if (!(si.lease_holder = strdup(a->holder))) rc = nomem(err);
  }
  if (rc == ES_OK && add_time(a->now, a->ttl_ms, &si.lease_expires_at)) rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = s->ops->session_put(s->bk, t, &si, err);
  if (rc == ES_OK) {
    out->acquired = 1;
    out->token = si.lease_token;
    out->expires_at = si.lease_expires_at;
    if (!(out->holder = strdup(a->holder))) rc = nomem(err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                  es_lease *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("holder", holder, err)))
    return rc;
  if (ttl_ms <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0");
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .holder = holder, .ttl_ms = ttl_ms, .lease = out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_lease, &a, err);
  es_core_leave(s);
  if (rc) es_lease_destroy(out);
  return rc;
}

static int do_lease_release(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  if (si.lease_holder && strcmp(si.lease_holder, a->holder) == 0 && si.lease_token == a->token) {
    free(si.lease_holder);
    si.lease_holder = NULL;
    si.lease_token = si.lease_expires_at = ES_NONE;
    rc = s->ops->session_put(s->bk, t, &si, err);
    a->done = rc == ES_OK;
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                          int *released, es_err *err) {
  int rc;
  *released = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("holder", holder, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .holder = holder, .token = token};
  rc = es_core_write(s, do_lease_release, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *released = a.done;
  return rc;
}

static int do_seal(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  if (si.sealed_at == ES_NONE) {
    si.sealed_at = si.updated_at = a->now;
    if (a->reason && es_text_clean(a->reason, strlen(a->reason), ES_MAX_TEXT_BYTES, &si.seal_reason,
                                   NULL))
      rc = nomem(err);
    if (rc == ES_OK) rc = s->ops->session_put(s->bk, t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_seal(es_store *s, const char *session, const char *reason, es_err *err) {
  int rc;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .reason = reason};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_seal, &a, err);
  es_core_leave(s);
  return rc;
}
