/*
 * api.c: PLACEHOLDER until its helper lands: every handler answers 501.
 */
#include "http/internal.h"

int es_api_append(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_append: not built yet");
}

int es_api_read(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_read: not built yet");
}

int es_api_read_all(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_read_all: not built yet");
}

int es_api_head(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_head: not built yet");
}

int es_api_state(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_state: not built yet");
}

int es_api_sessions(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_sessions: not built yet");
}

int es_api_lineage(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_lineage: not built yet");
}

int es_api_children(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_children: not built yet");
}

int es_api_dead_letters(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_dead_letters: not built yet");
}

int es_api_revive(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_revive: not built yet");
}

int es_api_settle(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_settle: not built yet");
}

int es_api_claims(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_claims: not built yet");
}

int es_api_complete(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_complete: not built yet");
}

int es_api_fail(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_fail: not built yet");
}

int es_api_renew(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_renew: not built yet");
}

int es_api_list_refs(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_list_refs: not built yet");
}

int es_api_get_ref(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_get_ref: not built yet");
}

int es_api_put_ref(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_put_ref: not built yet");
}

int es_api_delete_ref(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_delete_ref: not built yet");
}

int es_api_promote(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_promote: not built yet");
}

int es_api_presence_read(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_presence_read: not built yet");
}

int es_api_presence_set(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_presence_set: not built yet");
}

int es_api_stats(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_api_stats: not built yet");
}
