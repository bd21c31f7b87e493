/*
 * http/projections.c: the routes of §8 (docs/http-api.md "Projections"):
 *   GET  /v1/projections                        read   {projections: [row]}
 *   GET  /v1/projections/{p}/keys               read   ?prefix&after&limit -> {keys, cursor}
 *   GET  /v1/projections/{p}/state/{key}        read   -> {state, position, version, generation}
 *   GET  /v1/projections/{p}/state              read   the same for the key "" (one state)
 *   POST /v1/projections/{p}/rebuild|retry|skip admin  -> {projection: row}
 * A tenant's token reads its tenant's keys (the request's store is its
 * tenant handle); rebuilding, retrying and skipping act on the whole
 * projection, so they need a '*' token. States are converted to JSON by
 * the engine (es_engine_projection_json): without one (serve
 * --no-engine) the state route is 404, as reducer states are.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "http/internal.h"
#include "store/projections.h"

static int done(es_http_resp *out) {
  if (out->body.oom) {
    es_buf_destroy(&out->body);
    return es_http_fail(out, 503, "STORAGE", "out of memory while writing the answer");
  }
  out->status = 200;
  return 0;
}

static void put_bool(es_buf *b, const char *name, int v) {
  es_buf_addf(b, ",\"%s\":%s", name, v ? "true" : "false");
}

/* One projection's row, as engine:projections() has it (§8). */
static int put_row(es_buf *b, es_store *s, const es_projection *p, es_err *err) {
  int64_t head, lag, lag_ms;
  int rc = es_store_projection_lag(s, p, &head, &lag, &lag_ms, err);
  if (rc) return rc;
  int building = p->building > 0;
  es_buf_adds(b, "{\"name\":");
  es_wire_cstr(b, p->name);
  es_wire_str_field(b, "version", building ? p->building_version : p->version);
  es_wire_int_field(b, "position", building ? p->building_position : p->position);
  es_wire_int_field(b, "head", head);
  es_wire_int_field(b, "lag", lag);
  es_wire_int_field(b, "lag_ms", lag_ms);
  es_wire_str_field(b, "status", p->failed ? "failed" : "running");
  es_wire_str_field(b, "error", p->failed ? p->error : NULL);
  es_wire_int_field(b, "error_position", p->failed ? p->error_position : ES_NONE);
  es_wire_str_field(b, "error_id", p->failed ? p->error_id : NULL);
  es_wire_int_field(b, "generation", p->generation);
  put_bool(b, "rebuilding", building || p->rebuild);
  es_wire_int_field(b, "skipped", p->skipped);
  es_buf_addc(b, '}');
  return ES_OK;
}

int es_api_projections(const es_http_req *r, es_http_resp *out) {
  es_projections list = {0};
  es_err err = {0};
  if (es_store_projections(r->store, NULL, &list, &err)) return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"projections\":[");
  int rc = ES_OK;
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    if (i) es_buf_addc(&out->body, ',');
    rc = put_row(&out->body, r->store, &list.v[i], &err);
  }
  es_projections_destroy(&list);
  if (rc) {
    es_buf_destroy(&out->body);
    return es_http_fail_err(out, &err);
  }
  es_buf_adds(&out->body, "]}");
  return done(out);
}

int es_api_projection_keys(const es_http_req *r, es_http_resp *out) {
  int64_t limit;
  if (es_http_query_int(r, "limit", 1, 1000, 100, &limit, out)) return 0;
  es_proj_keys k = {0};
  es_err err = {0};
  if (es_store_projection_keys(r->store, r->seg[2], es_http_query(r, "prefix"),
                               es_http_query(r, "after"), limit, &k, &err))
    return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"keys\":[");
  for (size_t i = 0; i < k.n; i++) {
    if (i) es_buf_addc(&out->body, ',');
    es_wire_cstr(&out->body, k.keys[i]);
  }
  es_buf_adds(&out->body, "]");
  es_wire_str_field(&out->body, "cursor", k.cursor);
  es_buf_addc(&out->body, '}');
  es_proj_keys_destroy(&k);
  return done(out);
}

int es_api_projection_state(const es_http_req *r, es_http_resp *out) {
  es_engine *engine = r->ctx ? r->ctx->engine : NULL;
  if (!engine)
    return es_http_fail(out, 404, "NOT_FOUND",
                        "no projection states: the server runs without an engine");
  char *value = NULL;
  size_t len = 0;
  es_projection info;
  es_err err = {0};
  /* .../state alone: the key "" of a projection without a key function
   * (a path cannot end in an empty segment) */
  const char *key = r->nseg > 4 ? r->seg[4] : "";
  if (es_store_projection_read(r->store, r->seg[2], key, &value, &len, &info, &err))
    return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"state\":");
  int rc = ES_OK, not_json = 0;
  if (value) rc = es_engine_projection_json(engine, value, len, &out->body, &not_json, &err);
  else es_buf_adds(&out->body, "null");
  free(value);
  if (rc == ES_OK) {
    es_wire_int_field(&out->body, "position", info.generation ? info.position : 0);
    es_wire_str_field(&out->body, "version", info.version);
    es_wire_int_field(&out->body, "generation", info.generation);
    es_buf_addc(&out->body, '}');
  }
  es_projection_destroy(&info);
  if (rc) {
    es_buf_destroy(&out->body);
    if (not_json) return es_http_fail(out, 422, es_strerror(err.code), "%s", err.msg);
    return es_http_fail_err(out, &err);
  }
  return done(out);
}

/* rebuild, retry, skip: the action is the path's last segment. */
int es_api_projection_control(const es_http_req *r, es_http_resp *out) {
  if (r->tenant)
    return es_http_fail(out, 403, "FORBIDDEN",
                        "projections are rebuilt, retried and skipped with a '*' token: they "
                        "fold every tenant's events");
  es_projection p;
  es_err err = {0};
  if (es_store_projection_control(r->store, r->seg[2], r->seg[3], &p, &err))
    return es_http_fail_err(out, &err);
  es_buf_adds(&out->body, "{\"projection\":");
  int rc = put_row(&out->body, r->store, &p, &err);
  es_projection_destroy(&p);
  if (rc) {
    es_buf_destroy(&out->body);
    return es_http_fail_err(out, &err);
  }
  es_buf_addc(&out->body, '}');
  return done(out);
}
