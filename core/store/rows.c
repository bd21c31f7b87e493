/*
 * rows.c: init / copy / destroy for the row structs of store.h and
 * backend.h, shared by the core and every backend.
 */
#include <stdlib.h>
#include <string.h>

#include "store/backend.h"
#include "store/backend_sql.h"

static int dup_str(char **dst, const char *src) {
  if (!src) {
    *dst = NULL;
    return ES_OK;
  }
  *dst = strdup(src);
  return *dst ? ES_OK : ES_STORAGE;
}

static int dup_bytes(char **dst, const char *src, size_t len) {
  if (!src) {
    *dst = NULL;
    return ES_OK;
  }
  *dst = malloc(len + 1);
  if (!*dst) return ES_STORAGE;
  memcpy(*dst, src, len);
  (*dst)[len] = '\0';
  return ES_OK;
}

void es_event_init(es_event *e) {
  memset(e, 0, sizeof *e);
  e->cause_index = e->cause_attempt = ES_NONE;
  e->not_before = ES_NONE;
  e->processed_at = ES_NONE;
  e->claim_expires_at = ES_NONE;
  e->retry_at = ES_NONE;
  e->due_at = ES_NONE;
  e->last_failed_attempt = ES_NONE;
  e->first_claimed_at = e->last_claimed_at = e->failed_at = ES_NONE;
  e->processed_by_attempt = ES_NONE;
  e->origin_index = ES_NONE;
  e->revision = 1;
}

void es_event_settle_copy(es_event *e, int64_t processed_at) {
  e->status = ES_STATUS_PROCESSED;
  e->attempts = e->failures = 0;
  e->last_error = e->claim_holder = NULL;
  e->processed_at = processed_at;
  e->claim_expires_at = e->retry_at = e->due_at = e->last_failed_attempt = ES_NONE;
  e->queued = 0;
  e->returned = ES_COPY_RETURNED;
  e->first_claimed_at = e->last_claimed_at = e->failed_at = ES_NONE;
  e->processed_by_attempt = ES_NONE;
}

void es_event_complete_record(es_event *e, int64_t now, int64_t attempt, int64_t returned) {
  e->status = ES_STATUS_PROCESSED;
  e->processed_at = now;
  e->processed_by_attempt = attempt;
  e->returned = returned;
  e->claim_holder = NULL;
  e->claim_expires_at = e->retry_at = e->due_at = ES_NONE;
  e->queued = 0;
}

void es_event_destroy(es_event *e) {
  if (!e) return;
  if (!e->packed) {
    free(e->type);
    free(e->payload);
    free(e->session);
    free(e->lane);
    free(e->origin_session);
    free(e->key);
    free(e->meta);
  } else if (e->payload_own) {
    free(e->payload);
  }
  free(e->id);
  free(e->last_error);
  free(e->claim_holder);
  es_event_init(e);
}

/* A stored event's id, type, session, lane, origin, key, meta and payload
 * never change, so a copy puts them in one allocation anchored at id: one
 * malloc, not eight. (Rows without an id, which no store returns, are copied
 * field by field.) */
int es_event_copy(es_event *dst, const es_event *src) {
  *dst = *src;
  dst->id = dst->type = dst->payload = dst->session = dst->lane = dst->origin_session = NULL;
  dst->key = dst->last_error = dst->claim_holder = dst->meta = NULL;
  dst->packed = dst->payload_own = 0;
  if (src->id) {
    const char *strs[7] = {src->id,  src->type, src->session, src->lane, src->origin_session,
                           src->key, src->meta};
    char **outs[7] = {&dst->id,  &dst->type, &dst->session, &dst->lane, &dst->origin_session,
                      &dst->key, &dst->meta};
    size_t lens[7], total = src->payload ? src->payload_len + 1 : 0;
    for (int i = 0; i < 7; i++) total += lens[i] = strs[i] ? strlen(strs[i]) + 1 : 0;
    char *p = malloc(total);
    if (!p) return ES_STORAGE;
    for (int i = 0; i < 7; i++) {
      if (!strs[i]) continue;
      *outs[i] = memcpy(p, strs[i], lens[i]);
      p += lens[i];
    }
    if (src->payload) {
      memcpy(p, src->payload, src->payload_len);
      p[src->payload_len] = '\0';
      dst->payload = p;
    }
    dst->packed = 1;
  } else if (dup_str(&dst->type, src->type) ||
             dup_bytes(&dst->payload, src->payload, src->payload_len) ||
             dup_str(&dst->session, src->session) || dup_str(&dst->lane, src->lane) ||
             dup_str(&dst->origin_session, src->origin_session) || dup_str(&dst->key, src->key) ||
             dup_str(&dst->meta, src->meta)) {
    es_event_destroy(dst);
    return ES_STORAGE;
  }
  if (dup_str(&dst->last_error, src->last_error) || dup_str(&dst->claim_holder, src->claim_holder)) {
    es_event_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_events_destroy(es_events *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_event_destroy(&list->v[i]);
  free(list->v);
  list->v = NULL;
  list->n = list->cap = 0;
}

int es_grow(void **v, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return ES_OK;
  size_t n = *cap ? *cap : 8;
  while (n < need) n *= 2;
  void *p = realloc(*v, n * elem);
  if (!p) return ES_STORAGE;
  *v = p;
  *cap = n;
  return ES_OK;
}

int es_events_push_copy(es_events *list, const es_event *e) {
  if (es_grow((void **)&list->v, &list->cap, list->n + 1, sizeof *list->v) ||
      es_event_copy(&list->v[list->n], e) != ES_OK)
    return ES_STORAGE;
  list->n++;
  return ES_OK;
}

void es_new_event_init(es_new_event *e) {
  memset(e, 0, sizeof *e);
  e->cause_index = e->cause_attempt = ES_NONE;
  e->not_before = ES_NONE;
  e->revision = ES_NONE;
}

void es_renew_result_destroy(es_renew_result *r) {
  if (!r) return;
  free(r->renewed);
  free(r->superseded);
  memset(r, 0, sizeof *r);
}

void es_session_info_init(es_session_info *si) {
  memset(si, 0, sizeof *si);
  si->first_at = si->updated_at = ES_NONE;
  si->sealed_at = ES_NONE;
  si->lease_token = si->lease_expires_at = ES_NONE;
  si->fork_at = si->forked_at = ES_NONE;
  si->first_index = 1;
}

void es_session_info_destroy(es_session_info *si) {
  if (!si) return;
  free(si->session);
  free(si->seal_reason);
  free(si->lease_holder);
  free(si->parent);
  es_session_info_init(si);
}

int es_session_info_copy(es_session_info *dst, const es_session_info *src) {
  *dst = *src;
  dst->session = dst->seal_reason = dst->lease_holder = dst->parent = NULL;
  if (dup_str(&dst->session, src->session) || dup_str(&dst->seal_reason, src->seal_reason) ||
      dup_str(&dst->lease_holder, src->lease_holder) || dup_str(&dst->parent, src->parent)) {
    es_session_info_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_sessions_destroy(es_sessions *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_session_info_destroy(&list->v[i]);
  free(list->v);
  free(list->cursor);
  memset(list, 0, sizeof *list);
}

void es_snapshot_init(es_snapshot *sn) {
  memset(sn, 0, sizeof *sn);
  sn->updated_at = ES_NONE;
}

void es_snapshot_destroy(es_snapshot *sn) {
  if (!sn) return;
  free(sn->reducer);
  free(sn->state);
  free(sn->version);
  es_snapshot_init(sn);
}

int es_snapshot_copy(es_snapshot *dst, const es_snapshot *src) {
  *dst = *src;
  dst->reducer = dst->state = dst->version = NULL;
  if (dup_str(&dst->reducer, src->reducer) || dup_bytes(&dst->state, src->state, src->state_len) ||
      dup_str(&dst->version, src->version)) {
    es_snapshot_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_snapshots_destroy(es_snapshots *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_snapshot_destroy(&list->v[i]);
  free(list->v);
  memset(list, 0, sizeof *list);
}

void es_presence_row_init(es_presence_row *r) {
  memset(r, 0, sizeof *r);
}

void es_presence_row_destroy(es_presence_row *r) {
  if (!r) return;
  free(r->participant);
  free(r->field);
  free(r->value);
  es_presence_row_init(r);
}

int es_presence_row_copy(es_presence_row *dst, const es_presence_row *src) {
  *dst = *src;
  dst->participant = dst->field = dst->value = NULL;
  if (dup_str(&dst->participant, src->participant) || dup_str(&dst->field, src->field) ||
      dup_bytes(&dst->value, src->value, src->value_len)) {
    es_presence_row_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_presence_rows_destroy(es_presence_rows *rows) {
  if (!rows) return;
  for (size_t i = 0; i < rows->n; i++) es_presence_row_destroy(&rows->v[i]);
  free(rows->v);
  memset(rows, 0, sizeof *rows);
}

void es_lineage_destroy(es_lineage *l) {
  if (!l) return;
  free(l->session);
  free(l->parent);
  memset(l, 0, sizeof *l);
}

void es_lineages_destroy(es_lineages *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_lineage_destroy(&list->v[i]);
  free(list->v);
  memset(list, 0, sizeof *list);
}

const char *es_event_cancelled(const es_event *e) {
  if (e->status != ES_STATUS_PROCESSED || e->processed_by_attempt != 0) return NULL;
  return e->last_error ? e->last_error : "";
}

void es_ref_init(es_ref *r) {
  memset(r, 0, sizeof *r);
  r->head = r->created_at = r->updated_at = r->at = ES_NONE;
}

void es_ref_destroy(es_ref *r) {
  if (!r) return;
  free(r->name);
  free(r->session);
  free(r->parent);
  es_ref_init(r);
}

void es_refs_destroy(es_refs *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_ref_destroy(&list->v[i]);
  free(list->v);
  memset(list, 0, sizeof *list);
}

int es_ref_copy(es_ref *dst, const es_ref *src) {
  *dst = *src;
  dst->name = dst->session = dst->parent = NULL;
  if (dup_str(&dst->name, src->name) || dup_str(&dst->session, src->session) ||
      dup_str(&dst->parent, src->parent)) {
    es_ref_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_lease_destroy(es_lease *l) {
  if (!l) return;
  free(l->holder);
  memset(l, 0, sizeof *l);
}
