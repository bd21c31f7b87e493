/*
 * row_eq.h: field-by-field equality of the rows the backend ops return,
 * shared by backend_test.c and sqlite_backend_test.c: strings (NULL equal
 * only to NULL), event rows and session rows, every field; and a
 * collector of session rows (deep copies) for listings.
 */
#ifndef ES_SPEC_ROW_EQ_H
#define ES_SPEC_ROW_EQ_H

#include <string.h>

#include "store/store.h"

static inline int str_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

static inline int ev_eq(const es_event *a, const es_event *b) {
  return str_eq(a->id, b->id) && str_eq(a->type, b->type) && str_eq(a->session, b->session) &&
         str_eq(a->lane, b->lane) && a->payload_len == b->payload_len &&
         (a->payload_len == 0 || memcmp(a->payload, b->payload, a->payload_len) == 0) &&
         (a->payload == NULL) == (b->payload == NULL) && a->index == b->index &&
         a->position == b->position && a->created_at == b->created_at &&
         a->cause_index == b->cause_index && a->cause_attempt == b->cause_attempt &&
         a->not_before == b->not_before && a->status == b->status && a->attempts == b->attempts &&
         a->failures == b->failures && str_eq(a->last_error, b->last_error) &&
         a->processed_at == b->processed_at && str_eq(a->claim_holder, b->claim_holder) &&
         a->claim_expires_at == b->claim_expires_at && a->retry_at == b->retry_at &&
         a->queued == b->queued && a->due_at == b->due_at &&
         a->last_failed_attempt == b->last_failed_attempt && a->returned == b->returned &&
         a->first_claimed_at == b->first_claimed_at && a->last_claimed_at == b->last_claimed_at &&
         a->failed_at == b->failed_at && a->processed_by_attempt == b->processed_by_attempt &&
         str_eq(a->origin_session, b->origin_session) && a->origin_index == b->origin_index;
}

/* Every field of two session rows. */
static inline int si_eq(const es_session_info *a, const es_session_info *b) {
  return str_eq(a->session, b->session) && a->head == b->head && a->events == b->events &&
         a->pending == b->pending && a->dead == b->dead && a->attempts == b->attempts &&
         a->failures == b->failures && a->first_at == b->first_at && a->updated_at == b->updated_at &&
         a->fence == b->fence && a->sealed_at == b->sealed_at &&
         str_eq(a->seal_reason, b->seal_reason) && str_eq(a->lease_holder, b->lease_holder) &&
         a->lease_token == b->lease_token && a->lease_expires_at == b->lease_expires_at &&
         str_eq(a->parent, b->parent) && a->fork_at == b->fork_at && a->forked_at == b->forked_at &&
         a->first_index == b->first_index;
}

/* Session rows, every field (deep copies). */
typedef struct {
  es_session_info v[32];
  int n;
} sess_rows;

static inline int collect_session_row(void *ctx, const es_session_info *row) {
  sess_rows *r = ctx;
  if (r->n < 32 && es_session_info_copy(&r->v[r->n], row) == ES_OK) r->n++;
  return 0;
}

static inline void sess_rows_reset(sess_rows *r) {
  for (int i = 0; i < r->n; i++) es_session_info_destroy(&r->v[i]);
  r->n = 0;
}

#endif
