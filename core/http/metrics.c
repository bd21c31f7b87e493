/*
 * metrics.c: PLACEHOLDER until its helper lands.
 */
#include "http/internal.h"

int es_metrics(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "metrics: not built yet");
}

int es_healthz(const es_http_req *r, es_http_resp *out) {
  (void)r;
  return es_http_fail(out, 501, "NOT_IMPLEMENTED", "healthz: not built yet");
}
