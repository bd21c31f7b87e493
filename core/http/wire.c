/*
 * wire.c: the JSON the HTTP API writes (docs/http.md "Wire format"), and
 * its error answers. An event is written with the Lua face's field names
 * and shapes (bridge/events.c push_one), so a remote client reads what
 * store:read returns in Lua: payloads are the stored canonical text,
 * copied, so int64 and floats stay exact.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "http/internal.h"

void es_wire_cstr(es_buf *b, const char *s) {
  if (s) es_json_write_text(b, s, strlen(s));
  else es_buf_adds(b, "null");
}

void es_wire_int(es_buf *b, int64_t v) {
  if (v == ES_NONE) es_buf_adds(b, "null");
  else es_json_write_int(b, v);
}

void es_wire_key(es_buf *b, const char *name, int first) {
  if (!first) es_buf_addc(b, ',');
  es_buf_addc(b, '"');
  es_buf_adds(b, name);
  es_buf_adds(b, "\":");
}

static void key(es_buf *b, const char *name) { es_wire_key(b, name, 0); }

void es_wire_int_field(es_buf *b, const char *name, int64_t v) {
  key(b, name);
  es_wire_int(b, v);
}

void es_wire_str_field(es_buf *b, const char *name, const char *s) {
  key(b, name);
  es_wire_cstr(b, s);
}

void es_wire_error(es_buf *b, const char *code, const char *message) {
  es_buf_adds(b, "{\"code\":");
  es_wire_cstr(b, code);
  es_wire_str_field(b, "message", message);
  es_buf_addc(b, '}');
}

void es_wire_presence_rows(es_buf *b, const es_presence_rows *rows) {
  es_buf_adds(b, "{\"rows\":[");
  for (size_t i = 0; i < rows->n; i++) {
    const es_presence_row *row = &rows->v[i];
    if (i) es_buf_addc(b, ',');
    es_buf_adds(b, "{\"participant\":");
    es_wire_cstr(b, row->participant);
    es_wire_str_field(b, "field", row->field);
    key(b, "value");
    if (row->value) es_buf_add(b, row->value, row->value_len);
    else es_buf_adds(b, "null");
    es_wire_int_field(b, "seen", row->seen);
    es_wire_int_field(b, "at", row->at);
    es_wire_int_field(b, "expires_at", row->expires_at);
    es_buf_addc(b, '}');
  }
  es_buf_adds(b, "]}");
}

static void opt_int(es_buf *b, const char *name, int64_t v) {
  if (v == ES_NONE) return;
  key(b, name);
  es_json_write_int(b, v);
}

static void opt_str(es_buf *b, const char *name, const char *s) {
  if (!s) return;
  key(b, name);
  es_wire_cstr(b, s);
}

void es_wire_event(es_buf *b, const es_event *e, int claimed) {
  es_buf_adds(b, "{\"id\":");
  es_wire_cstr(b, e->id);
  opt_str(b, "type", e->type);
  key(b, "payload");
  if (e->payload) es_buf_add(b, e->payload, e->payload_len);
  else es_buf_adds(b, "null");
  opt_int(b, "revision", e->revision);
  if (e->meta) { /* §3.1: the stored canonical text, as the payload */
    key(b, "meta");
    es_buf_adds(b, e->meta);
  }
  opt_str(b, "key", e->key);
  if (e->shredded) {
    key(b, "shredded");
    es_buf_adds(b, "true");
  }
  opt_int(b, "index", e->index);
  opt_str(b, "session", e->session);
  opt_int(b, "position", e->position);
  opt_int(b, "created_at", e->created_at);
  if (e->cause_index != ES_NONE) {
    key(b, "cause");
    es_buf_adds(b, "{\"attempt\":");
    es_json_write_int(b, e->cause_attempt);
    es_buf_adds(b, ",\"index\":");
    es_json_write_int(b, e->cause_index);
    es_buf_addc(b, '}');
  }
  opt_str(b, "lane", e->lane);
  opt_int(b, "not_before", e->not_before);
  key(b, "status");
  es_buf_adds(b, e->status == ES_STATUS_PROCESSED ? "\"processed\""
                 : e->status == ES_STATUS_DEAD    ? "\"dead\""
                                                  : "\"pending\"");
  opt_int(b, "attempts", e->attempts);
  opt_int(b, "failures", e->failures);
  /* §3.2: a cancelled event shows its reason (es_event_cancelled) */
  const char *cancelled = es_event_cancelled(e);
  opt_str(b, "last_error", cancelled ? NULL : e->last_error);
  opt_str(b, "cancelled", cancelled);
  opt_int(b, "processed_at", e->processed_at);
  opt_str(b, "claim_holder", e->claim_holder);
  opt_int(b, "claim_expires_at", e->claim_expires_at);
  opt_int(b, "retry_at", e->retry_at);
  opt_int(b, "first_claimed_at", e->first_claimed_at);
  opt_int(b, "last_claimed_at", e->last_claimed_at);
  opt_int(b, "failed_at", e->failed_at);
  opt_int(b, "processed_by_attempt", cancelled ? ES_NONE : e->processed_by_attempt);
  if (e->origin_session) {
    key(b, "origin");
    es_buf_adds(b, "{\"index\":");
    es_wire_int(b, e->origin_index);
    es_buf_adds(b, ",\"session\":");
    es_wire_cstr(b, e->origin_session);
    es_buf_addc(b, '}');
  }
  if (claimed) opt_int(b, "attempt", e->attempts);
  es_buf_addc(b, '}');
}

void es_wire_events_array(es_buf *b, const es_events *list, int claimed) {
  es_buf_addc(b, '[');
  for (size_t i = 0; i < list->n; i++) {
    if (i) es_buf_addc(b, ',');
    es_wire_event(b, &list->v[i], claimed);
  }
  es_buf_addc(b, ']');
}

int es_http_status_of(int code) {
  switch (code) {
  case ES_INVALID_ARGUMENT: return 400;
  case ES_NOT_FOUND:
  case ES_NO_SUCH_EVENT: return 404;
  case ES_WRONG_EXPECTED_HEAD:
  case ES_REF_CONFLICT:
  case ES_STALE_FENCE:
  case ES_SEALED:
  case ES_PARTIAL_DUPLICATE_BATCH:
  case ES_ID_CONFLICT:
  case ES_SUPERSEDED_ATTEMPT: return 409;
  case ES_TRUNCATED: return 410;
  case ES_TOO_LARGE: return 413;
  default: return 503; /* STORAGE, CLOSED */
  }
}

static int fail_v(es_http_resp *out, int status, const char *code, const char *fmt, va_list ap) {
  char msg[ES_ERRMSG_MAX + 64];
  vsnprintf(msg, sizeof msg, fmt, ap);
  out->status = status;
  out->content_type = NULL;
  out->body.len = 0;
  out->body.oom = 0;
  es_wire_error(&out->body, code, msg);
  return 0;
}

int es_http_fail(es_http_resp *out, int status, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_v(out, status, code, fmt, ap);
  va_end(ap);
  return 0;
}

int es_http_fail_err(es_http_resp *out, const es_err *err) {
  return es_http_fail(out, es_http_status_of(err->code), es_strerror(err->code), "%s", err->msg);
}

const char *es_http_query(const es_http_req *r, const char *name) {
  for (size_t i = 0; i < r->nq; i++)
    if (strcmp(r->qk[i], name) == 0) return r->qv[i];
  return NULL;
}

int es_http_query_int(const es_http_req *r, const char *name, int64_t lo, int64_t hi,
                      int64_t dflt, int64_t *v, es_http_resp *out) {
  const char *s = es_http_query(r, name);
  if (!s || !*s) { /* empty counts as absent, as a form's blank field */
    *v = dflt;
    return 0;
  }
  char *end = NULL;
  long long x = 0;
  int ok = (*s == '-' || (*s >= '0' && *s <= '9'));
  if (ok) {
    errno = 0;
    x = strtoll(s, &end, 10);
    ok = errno == 0 && end && *end == '\0' && x >= lo && x <= hi;
  }
  if (!ok) {
    es_http_fail(out, 400, "INVALID_ARGUMENT", "query parameter '%s' expects a whole number from %lld to %lld",
                 name, (long long)lo, (long long)hi);
    return -1;
  }
  *v = (int64_t)x;
  return 0;
}

void es_wire_cursor(es_buf *b, const es_event *e, const char *cursor) {
  char pos[24];
  snprintf(pos, sizeof pos, "%lld", (long long)e->position);
  if (!cursor || strcmp(cursor, pos) == 0 || b->len == 0 || b->data[b->len - 1] != '}') return;
  b->len--; /* the event's closing brace */
  es_buf_adds(b, ",\"cursor\":");
  es_wire_cstr(b, cursor);
  es_buf_addc(b, '}');
}
