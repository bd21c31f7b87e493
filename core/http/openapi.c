/*
 * openapi.c: GET /v1/openapi.json (§6), the OpenAPI 3.1 document of every
 * route (docs/http-api.md "OpenAPI"). Its source is core/http/openapi.json,
 * kept as JSON so that it is read and edited as what it is; the Makefile
 * embeds it into the binary as es_openapi_json (tools/embed.lua), so the
 * server needs no file at run time and cannot serve a copy that differs
 * from the one it was built with. No token: a client generator must be
 * able to read it before it has one.
 */
#include <string.h>

#include "http/internal.h"

int es_openapi(const es_http_req *r, es_http_resp *out) {
  (void)r;
  es_buf_add(&out->body, es_openapi_json, strlen(es_openapi_json));
  if (out->body.oom) {
    es_buf_destroy(&out->body);
    return es_http_fail(out, 503, "STORAGE", "out of memory while writing the answer");
  }
  out->status = 200;
  out->content_type = NULL; /* application/json */
  return 0;
}
