/*
 * http_openapi_test.c: GET /v1/openapi.json (core/http/openapi.json,
 * embedded as es_openapi_json) against the server's own route table
 * (es_http_routes, routes.c): every route of the table is an operation of
 * the document with the same right, and every operation of the document
 * is a route of the table, so neither can drift from the other. Also: the
 * handler serves the document as it was built, and it is valid JSON of
 * OpenAPI 3.1. spec/94-http_openapi_spec.lua checks the answers against
 * its schemas. TAP-style output; non-zero exit on failure.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "codec/json_doc.h"
#include "http/internal.h"

#include "tap.h"

/* "/v1/sessions/{s}/events" -> "v1/sessions/ * /events" (without the
 * spaces): the table's pattern for a document's path. 0 when it fits. */
static int pattern_of(const char *path, char *out, size_t cap) {
  size_t n = 0;
  if (*path == '/') path++;
  while (*path) {
    if (*path == '{') {
      const char *end = strchr(path, '}');
      if (!end || n + 1 >= cap) return -1;
      out[n++] = '*';
      path = end + 1;
    } else {
      if (n + 1 >= cap) return -1;
      out[n++] = *path++;
    }
  }
  out[n] = '\0';
  return 0;
}

static const char *right_name(int right) {
  switch (right) {
  case ES_RIGHT_READ: return "read";
  case ES_RIGHT_APPEND: return "append";
  case ES_RIGHT_WORK: return "work";
  case ES_RIGHT_ADMIN: return "admin";
  default: return "none";
  }
}

/* The table's route for method (lowercase, as the document writes it)
 * and pattern, or NULL. */
static const es_http_route *route_of(const char *method, const char *pattern) {
  for (const es_http_route *r = es_http_routes; r->method; r++)
    if (strcasecmp(r->method, method) == 0 && strcmp(r->pattern, pattern) == 0) return r;
  return NULL;
}

static const es_jval *operation_of(const es_jval *paths, const es_http_route *r) {
  char pattern[512], method[16];
  size_t m = 0;
  for (; r->method[m] && m + 1 < sizeof method; m++)
    method[m] = (char)(r->method[m] | 0x20); /* "GET" -> "get" */
  method[m] = '\0';
  for (size_t k = 0; k < paths->n; k++)
    if (pattern_of(paths->keys[k], pattern, sizeof pattern) == 0 && strcmp(pattern, r->pattern) == 0)
      return es_jval_get(&paths->items[k], method);
  return NULL;
}

static int str_is(const es_jval *v, const char *s) {
  return v && v->type == ES_JSTRING && strcmp(v->str, s) == 0;
}

int main(void) {
  es_json_doc *doc = NULL;
  es_err err = {0};
  int parsed = es_json_doc_parse(es_openapi_json, strlen(es_openapi_json), &doc, &err) == ES_OK;
  ok(parsed, "the embedded document is valid JSON");
  if (!parsed) {
    printf("# %s\n", err.msg);
    return tap_done();
  }
  const es_jval *root = es_json_doc_root(doc);
  ok(str_is(es_jval_get(root, "openapi"), "3.1.0"), "it is OpenAPI 3.1.0");
  const es_jval *paths = es_jval_get(root, "paths");
  ok(paths && paths->type == ES_JOBJECT && paths->n > 0, "it has paths");
  if (!paths || paths->type != ES_JOBJECT) return tap_done();

  /* table -> document, with the same right */
  size_t routes = 0;
  for (const es_http_route *r = es_http_routes; r->method; r++, routes++) {
    char name[256];
    const es_jval *o = operation_of(paths, r);
    snprintf(name, sizeof name, "route %s %s is in the document", r->method, r->pattern);
    ok(o != NULL, name);
    if (!o) continue;
    snprintf(name, sizeof name, "%s %s: x-right is '%s' as the table's", r->method, r->pattern,
             right_name(r->right));
    ok(str_is(es_jval_get(o, "x-right"), right_name(r->right)), name);
    const es_jval *sec = es_jval_get(o, "security");
    snprintf(name, sizeof name, "%s %s: security %s", r->method, r->pattern,
             r->right == ES_RIGHT_NONE ? "empty (no token)" : "names the bearer token");
    ok(sec && sec->type == ES_JARRAY && (r->right == ES_RIGHT_NONE ? sec->n == 0 : sec->n == 1), name);
  }

  /* document -> table */
  size_t ops = 0;
  for (size_t k = 0; k < paths->n; k++) {
    char pattern[512], name[600];
    const es_jval *item = &paths->items[k];
    int fits = pattern_of(paths->keys[k], pattern, sizeof pattern) == 0;
    for (size_t j = 0; item->type == ES_JOBJECT && j < item->n; j++) {
      ops++;
      snprintf(name, sizeof name, "operation %s %s is a route of the server's table",
               item->keys[j], paths->keys[k]);
      ok(fits && route_of(item->keys[j], pattern) != NULL, name);
    }
  }
  char name[128];
  snprintf(name, sizeof name, "as many operations (%zu) as routes (%zu)", ops, routes);
  ok(ops == routes, name);

  /* the handler serves exactly the embedded text, without a token */
  es_http_req req;
  memset(&req, 0, sizeof req);
  req.method = "GET";
  es_http_resp resp;
  memset(&resp, 0, sizeof resp);
  es_openapi(&req, &resp);
  ok(resp.status == 200 && resp.body.len == strlen(es_openapi_json) &&
         memcmp(resp.body.data, es_openapi_json, resp.body.len) == 0,
     "es_openapi answers 200 with the document");
  ok(resp.content_type == NULL, "as application/json");
  es_buf_destroy(&resp.body);
  const es_http_route *r = route_of("get", "v1/openapi.json");
  ok(r && r->right == ES_RIGHT_NONE && r->fn == es_openapi, "GET /v1/openapi.json needs no token");
  es_json_doc_free(doc);
  return tap_done();
}
