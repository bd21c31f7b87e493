/*
 * routes.c: every path the server answers (docs/http.md has the same
 * table for users). server.c matches the method and the segments in
 * order; "*" matches one segment. A path that matches a pattern with
 * another method is 405 with Allow; no pattern at all is 404.
 *
 * core/http/openapi.json describes every route of this table, and nothing
 * else: spec/c/http_openapi_test.c holds the two to each other, so a route
 * added here fails that test until its path is written there too.
 */
#include "http/internal.h"

const es_http_route es_http_routes[] = {
    {"POST", "v1/sessions/*/events", ES_RIGHT_APPEND, es_api_append},
    {"GET", "v1/sessions/*/events", ES_RIGHT_READ, es_api_read},
    {"GET", "v1/sessions/*/head", ES_RIGHT_READ, es_api_head},
    {"GET", "v1/sessions/*/state/*", ES_RIGHT_READ, es_api_state},
    {"GET", "v1/sessions/*/stream", ES_RIGHT_READ, es_sse_session},
    {"GET", "v1/sessions/*/lineage", ES_RIGHT_READ, es_api_lineage},
    {"GET", "v1/sessions/*/children", ES_RIGHT_READ, es_api_children},
    {"GET", "v1/sessions/*/snapshots", ES_RIGHT_READ, es_api_snapshots},
    {"GET", "v1/sessions/*/segments", ES_RIGHT_READ, es_api_segments},
    {"POST", "v1/sessions/*/fork", ES_RIGHT_ADMIN, es_api_fork},
    {"POST", "v1/sessions/*/fence", ES_RIGHT_ADMIN, es_api_fence},
    {"POST", "v1/sessions/*/lease", ES_RIGHT_WORK, es_api_lease},
    {"POST", "v1/sessions/*/release", ES_RIGHT_WORK, es_api_release},
    {"POST", "v1/sessions/*/seal", ES_RIGHT_ADMIN, es_api_seal},
    {"POST", "v1/sessions/*/truncate", ES_RIGHT_ADMIN, es_api_truncate},
    {"POST", "v1/sessions/*/archive", ES_RIGHT_ADMIN, es_api_archive},
    {"DELETE", "v1/sessions/*", ES_RIGHT_ADMIN, es_api_delete_session},
    {"POST", "v1/sessions/*/events/*/revive", ES_RIGHT_ADMIN, es_api_revive},
    {"POST", "v1/sessions/*/events/*/settle", ES_RIGHT_ADMIN, es_api_settle},
    {"POST", "v1/sessions/*/events/*/complete", ES_RIGHT_WORK, es_api_complete},
    {"POST", "v1/sessions/*/events/*/fail", ES_RIGHT_WORK, es_api_fail},
    {"POST", "v1/sessions/*/events/*/renew", ES_RIGHT_WORK, es_api_renew},
    {"POST", "v1/sessions/*/events/*/cancel", ES_RIGHT_WORK, es_api_cancel},
    {"GET", "v1/sessions", ES_RIGHT_READ, es_api_sessions},
    {"GET", "v1/events", ES_RIGHT_READ, es_api_read_all},
    {"POST", "v1/events", ES_RIGHT_APPEND, es_api_append_many},
    {"GET", "v1/stream", ES_RIGHT_READ, es_sse_all},
    {"GET", "v1/dead-letters", ES_RIGHT_READ, es_api_dead_letters},
    {"GET", "v1/archived", ES_RIGHT_READ, es_api_archived},
    {"POST", "v1/claims", ES_RIGHT_WORK, es_api_claims},
    {"GET", "v1/refs", ES_RIGHT_READ, es_api_list_refs},
    {"GET", "v1/refs/*", ES_RIGHT_READ, es_api_get_ref},
    {"PUT", "v1/refs/*", ES_RIGHT_ADMIN, es_api_put_ref},
    {"DELETE", "v1/refs/*", ES_RIGHT_ADMIN, es_api_delete_ref},
    {"POST", "v1/refs/*/promote", ES_RIGHT_ADMIN, es_api_promote},
    {"GET", "v1/presence/*", ES_RIGHT_READ, es_api_presence_read},
    {"GET", "v1/presence/*/stream", ES_RIGHT_READ, es_sse_presence},
    {"PUT", "v1/presence/*/*", ES_RIGHT_APPEND, es_api_presence_set},
    {"GET", "v1/stats", ES_RIGHT_READ, es_api_stats},
    {"POST", "v1/keys/*/shred", ES_RIGHT_ADMIN, es_api_shred},
    {"GET", "v1/openapi.json", ES_RIGHT_NONE, es_openapi},
    {"GET", "v1/projections", ES_RIGHT_READ, es_api_projections},
    {"GET", "v1/projections/*/keys", ES_RIGHT_READ, es_api_projection_keys},
    {"GET", "v1/projections/*/state/*", ES_RIGHT_READ, es_api_projection_state},
    {"GET", "v1/projections/*/state", ES_RIGHT_READ, es_api_projection_state},
    {"POST", "v1/projections/*/rebuild", ES_RIGHT_ADMIN, es_api_projection_control},
    {"POST", "v1/projections/*/retry", ES_RIGHT_ADMIN, es_api_projection_control},
    {"POST", "v1/projections/*/skip", ES_RIGHT_ADMIN, es_api_projection_control},
    {"GET", "metrics", ES_RIGHT_READ, es_metrics},
    {"GET", "healthz", ES_RIGHT_NONE, es_healthz},
    {NULL, NULL, 0, NULL},
};
