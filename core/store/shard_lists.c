/*
 * shard_lists.c: the router's calls that span sessions (listings merged
 * over the shards, claim_next, dead letters, pending types, counts, refs
 * in the catalog) and read_all with cursors. Moved out of shards.c as
 * they were.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "store/internal.h"
#include "store/listing.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store.h"
#include "util/buf.h"

/* ---- calls that span sessions ---------------------------------------------- */

/* fn on the shard owning key, run again where ES_MOVED points. */
int es_sh_routed(es_store *s, const char *what, const char *key, routed_fn fn, void *arg,
                 es_err *err) {
  route r;
  memset(&r, 0, sizeof r);
  int rc;
  for (;;) {
    es_store *st;
    if ((rc = es_sh_route_store(s, what, key, &r, &st, err))) break;
    rc = fn(st, arg, err);
    if (!es_sh_route_again(s, &r, &rc, err)) break;
  }
  return rc;
}

static void session_free(void *e) { es_session_info_destroy(e); }
static const es_list_kind session_kind = {sizeof(es_session_info),
                                          offsetof(es_session_info, session), session_free};

int es_sh_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                   es_sessions *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (limit <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be > 0");
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  int more = 0;
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_sessions part;
    rc = es_store_sessions(set.st[i], prefix, after, limit, &part, err);
    if (rc) break;
    more |= part.cursor != NULL;
    free(part.cursor);
    rc = es_list_take(&session_kind, (es_list *)out, (es_list *)&part, err);
  }
  if (rc) {
    es_sessions_destroy(out);
    return rc;
  }
  /* a session in the middle of a move is listed by both shards: once */
  more |= es_list_sort_unique(&session_kind, (es_list *)out, limit);
  if (more && out->n) {
    out->cursor = strdup(out->v[out->n - 1].session);
    if (!out->cursor) {
      es_sessions_destroy(out);
      return nomem(err);
    }
  }
  return ES_OK;
}


int es_sh_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (after != 0 && after != ES_NONE)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "read_all on a sharded store resumes from a cursor (an event's `cursor`), "
                   "not a position");
  char **cursors = NULL;
  int rc = es_sh_read_all_cursor(s, scope, NULL, limit, out, &cursors, err);
  if (rc == ES_OK) es_shards_cursors_free(cursors, out->n);
  return rc;
}

int es_sh_last_position(es_store *s, const char *scope, int64_t *position, es_err *err) {
  (void)s;
  (void)scope;
  *position = 0;
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "a sharded store has no store-wide position: read_all returns cursors");
}

static int move_events(es_events *dst, es_events *src, es_err *err) {
  if (src->n && es_grow((void **)&dst->v, &dst->cap, dst->n + src->n, sizeof *dst->v)) {
    es_events_destroy(src);
    return nomem(err);
  }
  if (src->n) memcpy(dst->v + dst->n, src->v, src->n * sizeof *src->v);
  dst->n += src->n;
  free(src->v);
  memset(src, 0, sizeof *src);
  return ES_OK;
}

/* How soon claim_next asks a caller to come back when it skipped a
 * failing shard and claimed nothing (docs/sharding.md): short, since the
 * shard may hold ready work; not zero, so a shard that stays down is not
 * asked in a busy loop. */
#define SKIPPED_RETRY_MS 1000

int es_sh_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms, int64_t limit,
                     const char *const *types, size_t n_types, const char *const *skip,
                     size_t n_skip, es_events *out, int64_t *retry_at, es_err *err) {
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  int64_t want = limit == ES_NONE ? 1 : limit;
  shard_set set;
  int64_t started = 0;
  int rc;
  do {
    rc = sh_enter(s, err);
    if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
    if (rc) return rc;
    /* each call starts at the next shard, so none starves behind a busy one */
    size_t first = atomic_fetch_add(&SH(s)->rr, 1) % set.n;
    /* a shard that fails (down, or a session in a move) is skipped: the
     * others are still asked; its error is the answer only when no shard
     * answered */
    int answered = 0, failed = ES_OK;
    es_err first_err = {0};
    for (size_t k = 0; k < set.n && (int64_t)out->n < want; k++) {
      es_events part;
      int64_t ra = ES_NONE;
      es_err e = {0};
      es_store *st = set.st[(first + k) % set.n];
      int r = st->impl->claim_next(st, scope, holder, ttl_ms,
                                  limit == ES_NONE ? ES_NONE : want - (int64_t)out->n, types,
                                  n_types, skip, n_skip, &part, &ra, &e);
      if (r == ES_OK) r = move_events(out, &part, &e);
      if (r) {
        if (failed == ES_OK || (failed == ES_MOVED && r != ES_MOVED)) {
          failed = r;
          first_err = e;
        }
        continue;
      }
      answered = 1;
      if (ra != ES_NONE && (*retry_at == ES_NONE || ra < *retry_at)) *retry_at = ra;
    }
    rc = answered && failed != ES_MOVED ? ES_OK : failed;
    if (rc && err) *err = first_err;
    /* A skipped shard may hold ready work, or work ready sooner than the
     * others' retry_at: the answer says so by a retry_at SKIPPED_RETRY_MS
     * away (or sooner), so a caller sleeping until retry_at comes back to
     * ask it again. */
    if (rc == ES_OK && failed != ES_OK) {
      int64_t now;
      es_err e = {0};
      if (es_store_now(s, &now, &e) == ES_OK) {
        int64_t soon = now > INT64_MAX - SKIPPED_RETRY_MS ? INT64_MAX : now + SKIPPED_RETRY_MS;
        if (*retry_at == ES_NONE || soon < *retry_at) *retry_at = soon;
      }
    }
    /* what was claimed before a failure stays claimed (and expires) */
  } while (out->n == 0 && es_sh_merged_again(&started, &rc, err));
  if (rc && out->n == 0) es_events_destroy(out);
  return out->n ? ES_OK : rc;
}

static int cmp_event_time(const void *a, const void *b) {
  const es_event *x = a, *y = b;
  if (x->created_at != y->created_at) return x->created_at < y->created_at ? -1 : 1;
  int c = strcmp(x->session, y->session);
  if (c) return c < 0 ? -1 : 1;
  return x->position < y->position ? -1 : x->position > y->position;
}

int es_sh_dead_letters(es_store *s, const char *scope, const char *session, int64_t after, int64_t limit,
                       es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (session)
    ROUTED("session", session, st->impl->dead_letters(st, scope, session, after, limit, out, err));
  if (after != 0 && after != ES_NONE)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "dead_letters of every session on a sharded store takes no `after` "
                   "(positions are per shard): page by session");
  shard_set set;
  int64_t started = 0;
  int rc;
  do {
    es_events_destroy(out);
    rc = sh_enter(s, err);
    if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
    for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
      es_events part;
      rc = set.st[i]->impl->dead_letters(set.st[i], scope, NULL, after, limit, &part, err);
      if (rc == ES_OK) rc = move_events(out, &part, err);
    }
  } while (es_sh_merged_again(&started, &rc, err));
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  if (out->n > 1) qsort(out->v, out->n, sizeof *out->v, cmp_event_time);
  if (limit != ES_NONE && limit >= 0 && (int64_t)out->n > limit) {
    for (size_t i = (size_t)limit; i < out->n; i++) es_event_destroy(&out->v[i]);
    out->n = (size_t)limit;
  }
  return ES_OK;
}

static int cmp_type_count(const void *a, const void *b) {
  return strcmp(((const es_type_count *)a)->type, ((const es_type_count *)b)->type);
}

int es_sh_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  size_t cap = 0;
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_type_counts part;
    rc = set.st[i]->impl->pending_types(set.st[i], scope, &part, err);
    for (size_t j = 0; rc == ES_OK && j < part.n; j++) {
      size_t k = 0;
      while (k < out->n && strcmp(out->v[k].type, part.v[j].type)) k++;
      if (k < out->n) {
        out->v[k].pending += part.v[j].pending;
        continue;
      }
      if (es_grow((void **)&out->v, &cap, out->n + 1, sizeof *out->v)) {
        rc = nomem(err);
        break;
      }
      out->v[out->n].type = part.v[j].type;
      out->v[out->n++].pending = part.v[j].pending;
      part.v[j].type = NULL;
    }
    if (rc == ES_OK || part.v) es_type_counts_destroy(&part);
  }
  if (rc) {
    es_type_counts_destroy(out);
    return rc;
  }
  if (out->n > 1) qsort(out->v, out->n, sizeof *out->v, cmp_type_count);
  return ES_OK;
}

/* §3.12: each shard's counts, summed. Move markers are not counted by the
 * shards (backend.h counts), so a moved session counts once, where it
 * lives (between a move's freeze and its copy, for a moment, nowhere). */
int es_sh_counts(es_store *s, const char *scope, es_counts *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_counts part;
    rc = set.st[i]->impl->counts(set.st[i], scope, &part, err);
    out->sessions += part.sessions;
    out->events += part.events;
    out->pending += part.pending;
    out->dead += part.dead;
  }
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}

int es_sh_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                      es_state_read *out, es_err *err) {
  if (n > ES_DEFAULT_MAX_BATCH)
    return es_fail(err, ES_TOO_LARGE, "%zu sessions, at most %d in one read_states", n,
                   ES_DEFAULT_MAX_BATCH);
  memset(out, 0, n * sizeof *out);
  int rc = ES_OK;
  /* one shard call per session: consistent per session, not across
   * shards (docs/sharding.md) */
  for (size_t i = 0; rc == ES_OK && i < n; i++) {
    es_snapshot_init(&out[i].snap);
    rc = es_sh_read_state(s, sessions[i], reducer, &out[i].found, &out[i].snap,
                              &out[i].events, err);
    if (rc) {
      es_state_reads_destroy(out, i + 1);
      memset(out, 0, n * sizeof *out);
    }
  }
  return rc;
}

static void lineage_free(void *e) { es_lineage_destroy(e); }
static const es_list_kind lineage_kind = {sizeof(es_lineage), offsetof(es_lineage, session),
                                          lineage_free};

int es_sh_children(es_store *s, const char *session, const char *after, int64_t limit,
                   es_lineages *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_lineages part;
    rc = es_store_children(set.st[i], session, after, limit, &part, err);
    if (rc == ES_OK) rc = es_list_take(&lineage_kind, (es_list *)out, (es_list *)&part, err);
  }
  if (rc) {
    es_lineages_destroy(out);
    return rc;
  }
  es_list_sort_unique(&lineage_kind, (es_list *)out, limit);
  return ES_OK;
}

/* Refs live in the catalog (docs/sharding.md): one store, so put_ref,
 * delete_ref and promote keep their atomic compare-and-set there
 * (docs/contract.md §3.7: of two promotes with the same expect exactly one wins),
 * and a plan change never moves them. The catalog's own rows know no
 * session's head: it is read from the session's shard. */

/* ref->head and (§3.7) the lineage from the shard of the session it
 * names (0 and none when there is no such session). */
static int ref_head(es_store *s, es_ref *ref, es_err *err) {
  ref->head = 0;
  free(ref->parent);
  ref->parent = NULL;
  ref->at = ES_NONE;
  if (!ref->session || strcmp(ref->session, CATALOG_SESSION) == 0) return ES_OK;
  int rc = es_sh_head(s, ref->session, &ref->head, err);
  if (rc == ES_NOT_FOUND) {
    ref->head = 0;
    rc = ES_OK;
  }
  es_lineage l;
  int found = 0;
  if (rc == ES_OK) rc = es_sh_lineage(s, ref->session, &found, &l, err);
  if (rc == ES_OK && found) {
    ref->parent = l.parent; /* taken over from l */
    l.parent = NULL;
    ref->at = l.at;
    es_lineage_destroy(&l);
  }
  return rc;
}

int es_sh_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
  *found = 0;
  es_ref_init(out);
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_get_ref(SH(s)->catalog, name, found, out, err);
  if (rc == ES_OK && *found) rc = ref_head(s, out, err);
  if (rc) {
    *found = 0;
    es_ref_destroy(out);
  }
  return rc;
}

int es_sh_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
                  es_err *err) {
  es_ref_init(out);
  int rc = sh_enter(s, err);
  if (rc) return rc;
  if ((rc = es_check_name("name", name, err)) || (rc = es_check_name("session", session, err)))
    return rc;
  if (strcmp(session, CATALOG_SESSION) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "session name '%s' is reserved on a sharded store (the catalog's plans)",
                   session);
  rc = es_store_put_ref(SH(s)->catalog, name, session, out, err);
  if (rc == ES_OK) rc = ref_head(s, out, err);
  if (rc) es_ref_destroy(out);
  return rc;
}

int es_sh_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out,
                    es_err *err) {
  memset(out, 0, sizeof *out);
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_list_refs(SH(s)->catalog, after, limit, out, err);
  /* one routed head per ref: a page of refs costs a read per ref */
  for (size_t i = 0; rc == ES_OK && i < out->n; i++) rc = ref_head(s, &out->v[i], err);
  if (rc) es_refs_destroy(out);
  return rc;
}

int es_sh_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  *deleted = 0;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_delete_ref(SH(s)->catalog, name, deleted, err);
  return rc;
}

int es_sh_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                  const char *expect, es_ref *out, char **actual, es_err *err) {
  es_ref_init(out);
  if (actual) *actual = NULL;
  char *ignored = NULL;
  int rc = sh_enter(s, err);
  if (rc == ES_OK)
    rc = es_store_promote(SH(s)->catalog, from_ref, to_ref, has_expect, expect, out,
                          actual ? actual : &ignored, err);
  free(ignored);
  if (rc == ES_OK) rc = ref_head(s, out, err);
  if (rc) es_ref_destroy(out);
  return rc;
}

/* The refs naming a deleted session go with it (as on one store). */
typedef struct {
  const char *session;
} refs_of_args;

static int do_delete_refs_of(es_store *st, es_txn *t, void *arg, es_err *err) {
  refs_of_args *a = arg;
  return st->ops->ref_delete_session(st->bk, t, a->session, err);
}

int es_sh_delete_refs_of(es_store *s, const char *session, es_err *err) {
  es_store *cat = SH(s)->catalog;
  int rc = es_core_enter(cat, err);
  if (rc) return rc;
  refs_of_args a = {session};
  rc = es_core_write(cat, do_delete_refs_of, &a, err);
  es_core_leave(cat);
  return rc;
}

/* §3.10 shred on a sharded store: every shard that may hold a payload
 * under the name has a data key of its own for it, so the key is burnt on
 * every shard of the current and a pending plan. The name goes to the
 * catalog first, and the plans are read after that write: a plan change
 * running at the same time either sees the name when it gives the new
 * shards their tombstones (shard_moves.c run_moves), or was recorded
 * before it, and then this call reaches the new shards itself. */
int es_sh_shred(es_store *s, const char *name, int *was_live, es_err *err) {
  *was_live = 0;
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_check_name("key", name, err);
  if (rc == ES_OK) rc = es_sh_catalog_shredded_put(SH(s)->catalog, name, err);
  if (rc == ES_OK) rc = es_sh_reload(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    int live = 0;
    rc = es_store_shred(set.st[i], name, &live, err);
    *was_live |= live;
  }
  return rc;
}

/* verify_archive on the shard st, the files named relative to the
 * router's archive directory (es_sh_segment_path). */
static int verify_on(es_store *s, es_store *st, const char *session, es_archive_report *out,
                     es_err *err) {
  int rc = es_store_verify_archive(st, session, out, err);
  for (size_t i = 0; rc == ES_OK && i < out->n_problems; i++)
    rc = es_sh_segment_path(s, st, &out->problems[i].file, err);
  for (size_t i = 0; rc == ES_OK && i < out->n_orphans; i++)
    rc = es_sh_segment_path(s, st, &out->orphans[i].file, err);
  if (rc) es_archive_report_destroy(out);
  return rc;
}

int es_sh_verify_archive(es_store *s, const char *session, es_archive_report *out,
                         es_err *err) {
  memset(out, 0, sizeof *out);
  if (session) ROUTED("session", session, verify_on(s, st, session, out, err));
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_archive_report part;
    rc = verify_on(s, set.st[i], NULL, &part, err);
    if (rc) break;
    out->checked += part.checked;
    int oom = 0;
    if (part.n_problems)
      oom |= es_grow((void **)&out->problems, &out->cap_problems, out->n_problems + part.n_problems,
                     sizeof *out->problems) != ES_OK;
    if (part.n_orphans)
      oom |= es_grow((void **)&out->orphans, &out->cap_orphans, out->n_orphans + part.n_orphans,
                     sizeof *out->orphans) != ES_OK;
    if (oom) {
      es_archive_report_destroy(&part);
      rc = nomem(err);
      break;
    }
    if (part.n_problems)
      memcpy(out->problems + out->n_problems, part.problems, part.n_problems * sizeof *part.problems);
    out->n_problems += part.n_problems;
    if (part.n_orphans)
      memcpy(out->orphans + out->n_orphans, part.orphans, part.n_orphans * sizeof *part.orphans);
    out->n_orphans += part.n_orphans;
    free(part.problems);
    free(part.orphans);
  }
  if (rc) es_archive_report_destroy(out);
  return rc;
}

/* ---- read_all with cursors ---------------------------------------------- */

/* A cursor: "c1", then for each shard with a position, "." + the shard
 * name in hex + "-" + the position, in name order. */
typedef struct {
  char *name[2 * ES_MAX_SHARDS];
  int64_t pos[2 * ES_MAX_SHARDS];
  size_t n;
} cursor_map;

static void cursor_map_destroy(cursor_map *m) {
  for (size_t i = 0; i < m->n; i++) free(m->name[i]);
  m->n = 0;
}

static int bad_cursor(es_err *err) {
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "after is not a read_all cursor of a sharded store (nor 0)");
}

static int cursor_parse(const char *c, cursor_map *m, es_err *err) {
  m->n = 0;
  if (!c || !*c) return ES_OK;
  if (strncmp(c, "c1", 2) != 0) return bad_cursor(err);
  const char *p = c + 2;
  while (*p) {
    if (*p++ != '.' || m->n >= 2 * ES_MAX_SHARDS) break;
    const char *dash = strchr(p, '-');
    size_t hn = dash ? (size_t)(dash - p) : 0;
    if (!dash || hn == 0 || hn % 2 || hn > 2 * ES_MAX_SHARD_NAME_BYTES) break;
    char *name = malloc(hn / 2 + 1);
    if (!name) {
      cursor_map_destroy(m);
      return nomem(err);
    }
    int ok = 1;
    for (size_t i = 0; i < hn / 2; i++) {
      unsigned v;
      char two[5] = {'0', '0', p[2 * i], p[2 * i + 1], 0};
      ok &= es_sh_hex4(two, &v) && v != 0;
      name[i] = (char)v;
    }
    name[hn / 2] = '\0';
    p = dash + 1;
    char *end = NULL;
    errno = 0;
    long long pos = (*p >= '0' && *p <= '9') ? strtoll(p, &end, 10) : -1;
    if (!ok || pos < 1 || errno || !end || (*end && *end != '.') ||
        (m->n && strcmp(m->name[m->n - 1], name) >= 0)) {
      free(name);
      break;
    }
    m->name[m->n] = name;
    m->pos[m->n++] = pos;
    p = end;
    if (!*p) return ES_OK;
  }
  cursor_map_destroy(m);
  return bad_cursor(err);
}

static int64_t *cursor_slot(cursor_map *m, const char *name) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->name[i], name) == 0) return &m->pos[i];
  return NULL;
}

static int cmp_cursor_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *cursor_text(const cursor_map *m) {
  const char *order[2 * ES_MAX_SHARDS];
  size_t k = 0;
  for (size_t i = 0; i < m->n; i++)
    if (m->pos[i] > 0) order[k++] = m->name[i];
  if (k > 1) qsort(order, k, sizeof *order, cmp_cursor_name);
  es_buf b;
  es_buf_init(&b);
  int oom = es_buf_adds(&b, "c1") != ES_OK;
  for (size_t i = 0; i < k; i++) {
    oom |= es_buf_addc(&b, '.') != ES_OK;
    for (const unsigned char *p = (const unsigned char *)order[i]; *p; p++)
      oom |= es_buf_addf(&b, "%02x", *p) != ES_OK;
    int64_t pos = 0;
    for (size_t j = 0; j < m->n; j++)
      if (m->name[j] == order[i]) pos = m->pos[j];
    oom |= es_buf_addf(&b, "-%lld", (long long)pos) != ES_OK;
  }
  oom |= es_buf_addc(&b, '\0') != ES_OK;
  if (oom) {
    es_buf_destroy(&b);
    return NULL;
  }
  return es_buf_take(&b, NULL);
}

void es_shards_cursors_free(char **cursors, size_t n) {
  for (size_t i = 0; cursors && i < n; i++) free(cursors[i]);
  free(cursors);
}

/* read_all with a cursor over scope's sessions (NULL: all). */
int es_sh_read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                          es_events *out, char ***cursors, es_err *err) {
  memset(out, 0, sizeof *out);
  *cursors = NULL;
  if (limit != ES_NONE && limit < 0) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be >= 0");
  cursor_map m;
  int rc = cursor_parse(cursor, &m, err);
  if (rc) return rc;
  shard_set set;
  es_events lists[2 * ES_MAX_SHARDS];
  size_t head[2 * ES_MAX_SHARDS];
  int64_t *slot[2 * ES_MAX_SHARDS];
  size_t fetched = 0;
  rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  /* The cursor goes on with exactly the shards read now: a name no plan
   * holds any more (or a crafted one) is dropped, so the map never holds
   * more than set.n <= 2 * ES_MAX_SHARDS names. */
  cursor_map given = m;
  m.n = 0;
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    int64_t *had = cursor_slot(&given, set.name[i]);
    if (!(m.name[m.n] = strdup(set.name[i]))) {
      rc = nomem(err);
      break;
    }
    m.pos[m.n] = had ? *had : 0;
    slot[i] = &m.pos[m.n++];
  }
  cursor_map_destroy(&given);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    head[i] = 0;
    rc = set.st[i]->impl->read_all(set.st[i], scope, *slot[i], limit, &lists[i], err);
    if (rc == ES_OK) fetched++;
  }
  size_t cap = 0;
  while (rc == ES_OK && (limit == ES_NONE || (int64_t)out->n < limit)) {
    /* the earliest event (created_at, then shard name) among the shards'
     * next ones; a shard that returned a full page and has run dry stops
     * the merge, as its next page may hold earlier events */
    size_t best = SIZE_MAX;
    int stop = 0;
    for (size_t i = 0; i < set.n; i++) {
      if (head[i] >= lists[i].n) {
        stop |= limit != ES_NONE && (int64_t)lists[i].n >= limit && lists[i].n > 0;
        continue;
      }
      const es_event *e = &lists[i].v[head[i]];
      if (best == SIZE_MAX) {
        best = i;
        continue;
      }
      const es_event *b = &lists[best].v[head[best]];
      if (e->created_at < b->created_at ||
          (e->created_at == b->created_at && strcmp(set.name[i], set.name[best]) < 0))
        best = i;
    }
    if (best == SIZE_MAX || stop) break;
    es_event *e = &lists[best].v[head[best]++];
    *slot[best] = e->position;
    char *text = cursor_text(&m);
    if (!text || es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
        es_grow((void **)cursors, &cap, out->n + 1, sizeof **cursors)) {
      free(text);
      rc = nomem(err);
      break;
    }
    out->v[out->n] = *e;
    es_event_init(e); /* moved */
    (*cursors)[out->n++] = text;
  }
  for (size_t i = 0; i < fetched; i++) es_events_destroy(&lists[i]);
  cursor_map_destroy(&m);
  if (rc) {
    es_shards_cursors_free(*cursors, out->n);
    *cursors = NULL;
    es_events_destroy(out);
  }
  return rc;
}
