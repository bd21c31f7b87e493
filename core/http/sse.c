/*
 * sse.c: PLACEHOLDER until its helper lands: every handler answers 501.
 */
#include "http/internal.h"

int es_sse_session(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_sse_session: not built yet");
}

int es_sse_all(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_sse_all: not built yet");
}

int es_sse_presence(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "es_sse_presence: not built yet");
}
