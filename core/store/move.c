/*
 * move.c: export and import (§10, move.h, docs/moving.md).
 *
 * Both sides work on "parts": the core stores that hold a store's rows. A
 * core store is one part holding everything; a sharded store is its
 * shards (sessions, events, snapshots, keys) and its catalog (refs). An
 * export reads each part in one read transaction (the cut is per part:
 * on shards, per shard) and sorts the lines of all parts into one order;
 * an import routes each record to the part that owns it and writes each
 * part in one write transaction. Records are written and read through
 * the same tables of fields, so what an export says is what an import
 * stores.
 *
 * The raw write path is the backend's own row ops: every value of an
 * event row (dispatch record, queued/due_at bookkeeping, origin, key) is
 * stored verbatim by event_insert, which hands out the next position.
 * Positions are kept by inserting the events in position order and
 * filling each gap (positions of deleted, truncated or archived events)
 * with a filler row that is dropped again before the commit: a filler of
 * the session whose dropped prefix it stands for (the backends keep a
 * session's indexes dense from 1, as truncate leaves them), chosen
 * earliest-deadline-first (the session whose first stored row comes
 * soonest), or one of a scratch session no caller can name. Cost: one
 * insert and one delete per gap position.
 */
#include "store/move.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "codec/json_doc.h"
#include "store/backend.h"
#include "store/crypto.h"
#include "store/internal.h"
#include "store/segment.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store_impl.h"
#include "util/buf.h"

/* The tag of gap fillers: their scratch session's name and their ids'
 * prefix, with "~" added until no session and no event id of the stream
 * uses it (names may hold any UTF-8, control bytes included), so a filler
 * never meets a row it would clash with. */
#define FILLER_TAG "\x01" "import-filler"
#define FILLER_TAG_MAX 64
#define FILLER_TYPE "\x01"


/* ---- the fields of each record ------------------------------------------ */

enum { F_I64, F_INT, F_STR, F_JSON, F_PAYLOAD, F_HEX };

typedef struct field {
  const char *name;
  unsigned char kind;
  size_t off;
} field;

#define I64(T, m) {#m, F_I64, offsetof(T, m)}
#define INT(T, m) {#m, F_INT, offsetof(T, m)}
#define STR(T, m) {#m, F_STR, offsetof(T, m)}
/* a member of the row inside a record, named as the row names it */
#define SI(K, m) {#m, F_##K, offsetof(session_rec, si.m)}
#define SN(K, m) {#m, F_##K, offsetof(snapshot_rec, sn.m)}

/* Every field of an event row (backend.h: what event_insert stores),
 * shredded excepted (the core's reading, not a stored value). */
static const field event_fields[] = {
    I64(es_event, position), STR(es_event, session), I64(es_event, index), STR(es_event, id),
    STR(es_event, type), STR(es_event, key), /* before payload: it says how payload reads */
    {"payload", F_PAYLOAD, offsetof(es_event, payload)}, I64(es_event, revision), {"meta", F_JSON, offsetof(es_event, meta)},
    STR(es_event, lane), I64(es_event, created_at), I64(es_event, cause_index),
    I64(es_event, cause_attempt), I64(es_event, not_before), INT(es_event, status),
    I64(es_event, attempts), I64(es_event, failures), STR(es_event, last_error),
    I64(es_event, processed_at), STR(es_event, claim_holder), I64(es_event, claim_expires_at),
    I64(es_event, retry_at), I64(es_event, first_claimed_at), I64(es_event, last_claimed_at),
    I64(es_event, failed_at), I64(es_event, processed_by_attempt),
    STR(es_event, origin_session), I64(es_event, origin_index), INT(es_event, queued),
    I64(es_event, due_at), I64(es_event, last_failed_attempt), I64(es_event, returned),
};

/* A session row as stored, plus two values the import needs before the
 * session's events arrive (where its first stored row is: rows below it
 * were dropped and their positions are gaps). */
typedef struct session_rec {
  es_session_info si;
  int64_t first_row;      /* the index of its first stored row; head + 1 when none */
  int64_t first_position; /* that row's position; 0 when none */
} session_rec;

static const field session_fields[] = {
    SI(STR, session), SI(I64, head), SI(I64, events),
    SI(I64, pending), SI(I64, dead), SI(I64, attempts),
    SI(I64, failures), SI(I64, first_at), SI(I64, updated_at),
    SI(I64, fence), SI(I64, sealed_at), SI(STR, seal_reason),
    SI(STR, lease_holder), SI(I64, lease_token),
    SI(I64, lease_expires_at), SI(STR, parent),
    SI(I64, fork_at), SI(I64, forked_at),
    SI(I64, first_index), SI(I64, archived_through),
    I64(session_rec, first_row), I64(session_rec, first_position),
};

typedef struct snapshot_rec {
  const char *session;
  es_snapshot sn;
} snapshot_rec;

static const field snapshot_fields[] = {
    STR(snapshot_rec, session), SN(STR, reducer), SN(I64, index),
    SN(STR, version), SN(I64, updated_at),
    {"state", F_HEX, offsetof(snapshot_rec, sn.state)},
};

static const field ref_fields[] = {
    STR(es_ref, name), STR(es_ref, session), I64(es_ref, created_at), I64(es_ref, updated_at),
};

/* The wrapped key bytes are written as hex, like a snapshot's state. */
static const field key_fields[] = {
    STR(es_key_row, name), {"wrapped", F_HEX, offsetof(es_key_row, wrapped)},
    I64(es_key_row, created_at), I64(es_key_row, shredded_at),
};

/* The segment an archived event is in (§3.9): its row's range and time,
 * written with each of its events so an import rebuilds the same
 * segments. */
static const field segment_fields[] = {
    I64(es_segment, from), I64(es_segment, through), I64(es_segment, created_at),
};

typedef struct key_use_rec {
  const char *key, *session;
  int64_t first_index;
} key_use_rec;

static const field key_use_fields[] = {
    STR(key_use_rec, key), STR(key_use_rec, session), I64(key_use_rec, first_index),
};

/* The length member that goes with a pointer field (payload, state,
 * wrapped): the size_t right after it in each struct. */
static size_t *len_of(void *row, const field *f) {
  return (size_t *)((char *)row + f->off + sizeof(char *));
}
_Static_assert(offsetof(es_event, payload_len) == offsetof(es_event, payload) + sizeof(char *),
               "payload_len follows payload");
_Static_assert(offsetof(es_snapshot, state_len) == offsetof(es_snapshot, state) + sizeof(char *),
               "state_len follows state");
_Static_assert(offsetof(es_key_row, wrapped_len) ==
                   offsetof(es_key_row, wrapped) + sizeof(unsigned char *),
               "wrapped_len follows wrapped");

static void put_fields(es_buf *b, const field *f, size_t n, const void *row_) {
  void *row = (void *)row_;
  es_buf_addc(b, '{');
  for (size_t i = 0; i < n; i++) {
    if (i) es_buf_addc(b, ',');
    es_json_write_text(b, f[i].name, strlen(f[i].name));
    es_buf_addc(b, ':');
    void *at = (char *)row + f[i].off;
    switch (f[i].kind) {
      case F_I64: {
        int64_t v = *(int64_t *)at;
        if (v == ES_NONE) es_buf_adds(b, "null");
        else es_json_write_int(b, v);
        break;
      }
      case F_INT: es_json_write_int(b, *(int *)at); break;
      case F_STR:
      case F_JSON: {
        const char *s = *(char **)at;
        if (!s) es_buf_adds(b, "null");
        else if (f[i].kind == F_STR) es_json_write_text(b, s, strlen(s));
        else es_buf_adds(b, s);
        break;
      }
      case F_PAYLOAD: {
        const es_event *e = row;
        /* a sealed payload (§3.10) is text, not JSON: carried as a string */
        if (!e->payload) es_buf_adds(b, "null");
        else if (e->key) es_json_write_text(b, e->payload, e->payload_len);
        else es_buf_add(b, e->payload, e->payload_len);
        break;
      }
      case F_HEX: {
        const unsigned char *p = *(unsigned char **)at;
        size_t len = *len_of(row, &f[i]);
        if (!p) {
          es_buf_adds(b, "null");
          break;
        }
        es_buf_addc(b, '"');
        for (size_t k = 0; k < len; k++) es_buf_addf(b, "%02x", p[k]);
        es_buf_addc(b, '"');
        break;
      }
    }
  }
  es_buf_addc(b, '}');
}

/* Strings a record read borrows from its document or owns here. */
typedef struct owned_strs {
  char **v;
  size_t n, cap;
} owned_strs;

static char *keep(owned_strs *o, char *p) {
  if (!p || es_grow((void **)&o->v, &o->cap, o->n + 1, sizeof *o->v)) {
    free(p);
    return NULL;
  }
  return o->v[o->n++] = p;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The canonical text of a JSON value read (a payload, a meta), kept in o. */
static int canonical(const es_jval *v, owned_strs *o, char **out, size_t *len, es_err *err) {
  es_buf b;
  es_buf_init(&b);
  int rc = es_json_canonicalize(v->raw, v->raw_len, &b, err);
  if (rc) {
    es_buf_destroy(&b);
    return rc;
  }
  *len = 0;
  *out = keep(o, es_buf_take(&b, len));
  return *out ? ES_OK : nomem(err);
}

/* Fills row from obj by the table; strings borrowed from the document
 * (decoded, NUL-terminated) or kept in o. */
static int get_fields(const es_jval *obj, const char *what, const field *f, size_t n, void *row,
                      owned_strs *o, es_err *err) {
  if (!obj || obj->type != ES_JOBJECT) return es_fail(err, ES_INVALID_ARGUMENT, "%s: not an object", what);
  for (size_t i = 0; i < n; i++) {
    const es_jval *v = es_jval_get(obj, f[i].name);
    void *at = (char *)row + f[i].off;
    if (!v) return es_fail(err, ES_INVALID_ARGUMENT, "%s: no field \"%s\"", what, f[i].name);
    int null = v->type == ES_JNULL;
    switch (f[i].kind) {
      case F_I64:
        if (!null && v->type != ES_JINT) goto bad;
        *(int64_t *)at = null ? ES_NONE : v->i;
        break;
      case F_INT:
        if (v->type != ES_JINT || v->i < 0 || v->i > 1000) goto bad;
        *(int *)at = (int)v->i;
        break;
      case F_STR:
        if (!null && (v->type != ES_JSTRING || strlen(v->str) != v->len)) goto bad;
        *(const char **)at = null ? NULL : v->str;
        break;
      case F_JSON:
        if (null) {
          *(char **)at = NULL;
        } else {
          size_t len;
          int rc = canonical(v, o, (char **)at, &len, err);
          if (rc) return rc;
        }
        break;
      case F_PAYLOAD: {
        es_event *e = row;
        e->payload = NULL;
        e->payload_len = 0;
        /* key is read before payload (the table's order) */
        if (null) break;
        if (e->key) {
          if (v->type != ES_JSTRING) goto bad;
          e->payload = (char *)v->str;
          e->payload_len = v->len;
        } else {
          int rc = canonical(v, o, &e->payload, &e->payload_len, err);
          if (rc) return rc;
        }
        break;
      }
      case F_HEX: {
        if (null) {
          *(char **)at = NULL;
          *len_of(row, &f[i]) = 0;
          break;
        }
        if (v->type != ES_JSTRING || v->len % 2) goto bad;
        char *p = keep(o, malloc(v->len / 2 + 1));
        if (!p) return nomem(err);
        for (size_t k = 0; k < v->len / 2; k++) {
          int hi = hexval(v->str[2 * k]), lo = hexval(v->str[2 * k + 1]);
          if (hi < 0 || lo < 0) goto bad;
          p[k] = (char)(hi << 4 | lo);
        }
        p[v->len / 2] = '\0';
        *(char **)at = p;
        *len_of(row, &f[i]) = v->len / 2;
        break;
      }
    }
    continue;
  bad:
    return es_fail(err, ES_INVALID_ARGUMENT, "%s: field \"%s\" has a bad value", what, f[i].name);
  }
  return ES_OK;
}

/* ---- lines -------------------------------------------------------------- */

/* The sections of a stream, in their order. */
enum { SEC_KEY, SEC_KEY_USE, SEC_SESSION, SEC_EVENT, SEC_ARCHIVED, SEC_SNAPSHOT, SEC_REF, SEC_N };
static const char *const sec_names[SEC_N] = {"key",      "key_use",        "session", "event",
                                             "archived_event", "snapshot", "ref"};

typedef struct line {
  int sec;
  char *text; /* owned, no newline */
  size_t len;
  char *k1, *k3; /* owned sort keys: a name; a second name (NULL: none) */
  int64_t k2;    /* events: the position (their first key); archived events: the index */
} line;

typedef struct lines {
  line *v;
  size_t n, cap;
  int oom;
} lines;

static void lines_destroy(lines *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].text);
    free(l->v[i].k1);
    free(l->v[i].k3);
  }
  free(l->v);
  memset(l, 0, sizeof *l);
}

/* Keeps the line built in b (taken from it) with its sort keys. */
static void push_line(lines *l, int sec, es_buf *b, const char *k1, int64_t k2, const char *k3) {
  es_buf_addc(b, '}');
  line ln = {sec, NULL, 0, k1 ? strdup(k1) : NULL, k3 ? strdup(k3) : NULL, k2};
  if (b->oom || (k1 && !ln.k1) || (k3 && !ln.k3) ||
      es_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) {
    es_buf_destroy(b);
    free(ln.k1);
    free(ln.k3);
    l->oom = 1;
    return;
  }
  ln.text = es_buf_take(b, &ln.len);
  if (!ln.text) {
    free(ln.k1);
    free(ln.k3);
    l->oom = 1;
    return;
  }
  l->v[l->n++] = ln;
}

static void add_line(lines *l, int sec, const field *f, size_t nf, const void *row, const char *k1,
                     int64_t k2, const char *k3) {
  if (l->oom) return;
  es_buf b;
  es_buf_init(&b);
  es_buf_addf(&b, "{\"%s\":", sec_names[sec]);
  put_fields(&b, f, nf, row);
  push_line(l, sec, &b, k1, k2, k3);
}

/* {"archived_event":{"segment":{from,through,created_at},"event":{...}}}:
 * the event whole, as an event line has it, with the segment it is in. */
static void add_archived_line(lines *l, const es_segment *g, const es_event *e) {
  if (l->oom) return;
  es_buf b;
  es_buf_init(&b);
  es_buf_addf(&b, "{\"%s\":{\"segment\":", sec_names[SEC_ARCHIVED]);
  put_fields(&b, segment_fields, sizeof segment_fields / sizeof *segment_fields, g);
  es_buf_adds(&b, ",\"event\":");
  put_fields(&b, event_fields, sizeof event_fields / sizeof *event_fields, e);
  es_buf_addc(&b, '}');
  push_line(l, SEC_ARCHIVED, &b, e->session, e->index, NULL);
}

static int cmp_str(const char *a, const char *b) {
  if (!a || !b) return (a != NULL) - (b != NULL);
  return strcmp(a, b);
}

static int cmp_line(const void *pa, const void *pb) {
  const line *a = pa, *b = pb;
  if (a->sec != b->sec) return a->sec < b->sec ? -1 : 1;
  if (a->sec == SEC_EVENT && a->k2 != b->k2) return a->k2 < b->k2 ? -1 : 1;
  int c = cmp_str(a->k1, b->k1);
  if (c) return c;
  if (a->sec == SEC_ARCHIVED && a->k2 != b->k2) return a->k2 < b->k2 ? -1 : 1;
  return cmp_str(a->k3, b->k3);
}

/* ---- parts -------------------------------------------------------------- */

typedef struct part {
  es_store *st;
  int sessions;      /* holds sessions, events, snapshots, keys */
  int refs;          /* holds refs */
  const char *shard; /* its shard's name; NULL for a core store */
} part;

typedef struct parts {
  part v[ES_MAX_SHARDS * 2 + 1];
  size_t n;
  es_shard_plan plan; /* shards: the plan sessions are routed by */
  int sharded;
} parts;

static int get_parts(es_store *s, parts *p, es_err *err) {
  memset(p, 0, sizeof *p);
  if (s->impl == &es_core_ops) {
    p->v[p->n++] = (part){s, 1, 1, NULL};
    return ES_OK;
  }
  if (!es_store_is_sharded(s))
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "export and import work on a whole store, not a tenant handle (§3.11): "
                   "open the store itself");
  shard_set *set = malloc(sizeof *set);
  if (!set) return nomem(err);
  int rc = es_sh_all_shards(s, set, err);
  if (rc == ES_OK) rc = es_shards_plan(s, &p->plan, err);
  for (size_t i = 0; rc == ES_OK && i < set->n; i++)
    p->v[p->n++] = (part){set->st[i], 1, 0, set->name[i]};
  if (rc == ES_OK) p->v[p->n++] = (part){SH(s)->catalog, 0, 1, NULL};
  p->sharded = 1;
  free(set);
  return rc;
}

static void parts_destroy(parts *p) {
  if (p->sharded) es_shard_plan_destroy(&p->plan);
}

/* The part that holds a session's rows. */
static const part *owner_of(const parts *p, const char *session) {
  if (!p->sharded) return &p->v[0];
  const char *name = p->plan.v[es_shard_owner(&p->plan, session)].name;
  for (size_t i = 0; i < p->n; i++)
    if (p->v[i].sessions && strcmp(p->v[i].shard, name) == 0) return &p->v[i];
  return NULL;
}

/* ---- export ------------------------------------------------------------- */

typedef struct names {
  char **v;
  size_t n, cap;
  unsigned char *touched; /* after-mode: the session has an event past `after` */
  int oom;
} names;

static void names_destroy(names *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  free(l->touched);
  memset(l, 0, sizeof *l);
}

static int names_add(names *l, const char *s) {
  char *c = strdup(s);
  if (!c || es_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) {
    free(c);
    return l->oom = 1;
  }
  l->v[l->n++] = c;
  return 0;
}

static int cmp_pstr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static ptrdiff_t names_find(const names *l, const char *s) {
  char *const *hit = l->n ? bsearch(&s, l->v, l->n, sizeof *l->v, cmp_pstr) : NULL;
  return hit ? hit - l->v : -1;
}

/* A shard's own rows (its plan record "", no name a caller can give, and
 * the catalog's plan session, refused by the router) are never exported. */
static int internal_name(const part *pt, const char *s) {
  return !*s || (pt->shard && strcmp(s, CATALOG_SESSION) == 0);
}

typedef struct export_args {
  const part *pt;
  const char *prefix;
  int64_t after;
  int rows_only;
  names only; /* sorted; used when has_only */
  int has_only;
  lines *out;
  int64_t last_position;
  names sess, keys;
  int64_t first_row, first_position; /* scratch for first_cb */
} export_args;

static int list_cb(void *ctx, const es_session_info *row) {
  export_args *a = ctx;
  if (a->has_only && names_find(&a->only, row->session) < 0) return 0;
  if (!internal_name(a->pt, row->session)) names_add(&a->sess, row->session);
  return a->sess.oom;
}

/* The data key a sealed event is under is exported with it. */
static int note_key(export_args *a, const es_event *row) {
  if (!row->key || names_find(&a->keys, row->key) >= 0) return 0;
  if (names_add(&a->keys, row->key)) return 1;
  qsort(a->keys.v, a->keys.n, sizeof *a->keys.v, cmp_pstr);
  return 0;
}

static int archived_cb(void *ctx, const es_segment *g, const es_event *row) {
  export_args *a = ctx;
  if (note_key(a, row)) return 1;
  add_archived_line(a->out, g, row);
  return a->out->oom;
}

static int event_cb(void *ctx, const es_event *row) {
  export_args *a = ctx;
  ptrdiff_t i = names_find(&a->sess, row->session);
  if (i < 0) return 0;
  a->sess.touched[i] = 1;
  /* an increment's first pass only finds the sessions with new events */
  if (a->after > 0 && !a->has_only) return 0;
  if (note_key(a, row)) return 1;
  add_line(a->out, SEC_EVENT, event_fields, sizeof event_fields / sizeof *event_fields, row,
           row->session, row->position, NULL);
  return a->out->oom;
}

static int first_cb(void *ctx, const es_event *row) {
  export_args *a = ctx;
  a->first_row = row->index;
  a->first_position = row->position;
  return 1;
}

static int snap_name_cb(void *ctx, const es_snapshot *row) {
  return names_add(ctx, row->reducer);
}

static int ref_cb(void *ctx, const es_ref *row) {
  export_args *a = ctx;
  if (a->prefix && strncmp(row->session, a->prefix, strlen(a->prefix)) != 0) return 0;
  add_line(a->out, SEC_REF, ref_fields, sizeof ref_fields / sizeof *ref_fields, row, row->name, 0,
           NULL);
  return a->out->oom;
}

typedef struct key_use_args {
  export_args *a;
  const char *key;
} key_use_args;

static int key_use_cb(void *ctx, const char *session, int64_t first_index) {
  key_use_args *k = ctx;
  if (names_find(&k->a->sess, session) < 0) return 0;
  key_use_rec r = {k->key, session, first_index};
  add_line(k->a->out, SEC_KEY_USE, key_use_fields, sizeof key_use_fields / sizeof *key_use_fields,
           &r, k->key, 0, session);
  return k->a->out->oom;
}

static int export_session(es_store *st, es_txn *t, export_args *a, const char *name, es_err *err) {
  const es_backend_ops *ops = st->ops;
  session_rec r;
  int rc = ops->session_get(st->bk, t, name, &r.si, err);
  if (rc == ES_NOT_FOUND) return ES_OK; /* listed but gone: a shard mid-move */
  if (rc) return rc;
  /* §10: archived events inline, each with its segment (an increment's
   * too: the follower adds the segments archived meanwhile) */
  if (r.si.archived_through > 0 && !a->rows_only)
    rc = es_archive_each_segment(st, t, name, archived_cb, a, err);
  if (rc) {
    es_session_info_destroy(&r.si);
    return rc;
  }
  a->first_row = r.si.head + 1;
  a->first_position = 0;
  rc = ops->event_range(st->bk, t, name, 0, INT64_MAX, 1, first_cb, a, err);
  r.first_row = a->first_row;
  r.first_position = a->first_position;
  if (rc == ES_OK)
    add_line(a->out, SEC_SESSION, session_fields, sizeof session_fields / sizeof *session_fields,
             &r, name, 0, NULL);
  es_session_info_destroy(&r.si);
  if (rc || a->after > 0 || a->rows_only) return rc;
  names reducers = {0};
  rc = ops->snapshot_list(st->bk, t, name, snap_name_cb, &reducers, err);
  if (rc == ES_OK && reducers.oom) rc = nomem(err);
  for (size_t i = 0; rc == ES_OK && i < reducers.n; i++) {
    snapshot_rec sr = {name, {0}};
    es_snapshot_init(&sr.sn);
    rc = ops->snapshot_get(st->bk, t, name, reducers.v[i], &sr.sn, err);
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      continue;
    }
    if (rc == ES_OK)
      add_line(a->out, SEC_SNAPSHOT, snapshot_fields,
               sizeof snapshot_fields / sizeof *snapshot_fields, &sr, name, 0, sr.sn.reducer);
    es_snapshot_destroy(&sr.sn);
  }
  names_destroy(&reducers);
  return rc;
}

static int export_key(es_store *st, es_txn *t, export_args *a, const char *name, es_err *err) {
  es_key_row k;
  memset(&k, 0, sizeof k);
  int rc = st->ops->key_get(st->bk, t, name, &k, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  add_line(a->out, SEC_KEY, key_fields, sizeof key_fields / sizeof *key_fields, &k, name, 0, NULL);
  es_key_row_destroy(&k);
  if (!*name) return ES_OK; /* the master key's check row: used by no session */
  key_use_args ku = {a, name};
  return st->ops->key_use_list(st->bk, t, name, key_use_cb, &ku, err);
}

static int do_export(es_store *st, es_txn *t, void *arg, es_err *err) {
  export_args *a = arg;
  const es_backend_ops *ops = st->ops;
  /* a catalog's own events (its plans) are not the store's: only the
   * parts holding sessions say where the store is */
  int rc = a->pt->sessions ? ops->last_position(st->bk, t, &a->last_position, err) : ES_OK;
  if (rc == ES_OK && a->pt->sessions) {
    rc = ops->session_list(st->bk, t, a->prefix ? a->prefix : "", NULL, ES_NONE, list_cb, a, err);
    if (rc == ES_OK && !a->sess.oom && a->sess.n &&
        !(a->sess.touched = calloc(a->sess.n, 1)))
      a->sess.oom = 1;
    if (rc == ES_OK && a->sess.oom) rc = nomem(err);
    if (rc == ES_OK && !a->rows_only && !a->has_only)
      rc = ops->event_all(st->bk, t, NULL, a->after, ES_NONE, event_cb, a, err);
    /* a few named sessions, or an increment's sessions with new events
     * (whole: the dispatch records of their older events moved too, and
     * their rows, replaced on the target, count them): their own rows, not
     * a walk of the store's */
    if (rc == ES_OK && a->after > 0) a->has_only = 1;
    for (size_t i = 0; rc == ES_OK && a->has_only && i < a->sess.n; i++)
      if (a->after <= 0 || a->sess.touched[i])
        rc = ops->event_range(st->bk, t, a->sess.v[i], 0, INT64_MAX, ES_NONE, event_cb, a, err);
    for (size_t i = 0; rc == ES_OK && i < a->sess.n; i++)
      if (a->after <= 0 || a->sess.touched[i]) rc = export_session(st, t, a, a->sess.v[i], err);
    if (rc == ES_OK) rc = export_key(st, t, a, "", err);
    for (size_t i = 0; rc == ES_OK && i < a->keys.n; i++) rc = export_key(st, t, a, a->keys.v[i], err);
  }
  if (rc == ES_OK && a->pt->refs && a->after <= 0 && !a->has_only)
    rc = ops->ref_list(st->bk, t, NULL, ES_NONE, ref_cb, a, err);
  if (rc == ES_OK && (a->out->oom || a->keys.oom)) rc = nomem(err);
  return rc;
}

/* The lines of one part (unsorted), and its last position. */
static int export_part(const part *pt, const es_export_opts *o, lines *out, int64_t *last_position,
                       es_err *err) {
  export_args a;
  memset(&a, 0, sizeof a);
  a.pt = pt;
  a.prefix = o->prefix && *o->prefix ? o->prefix : NULL;
  a.after = o->after;
  a.rows_only = o->rows_only;
  a.out = out;
  a.has_only = o->names != NULL;
  for (size_t i = 0; i < o->n_names; i++) names_add(&a.only, o->names[i]);
  if (a.only.n) qsort(a.only.v, a.only.n, sizeof *a.only.v, cmp_pstr);
  int rc = a.only.oom ? nomem(err) : es_core_enter(pt->st, err);
  if (rc == ES_OK) {
    rc = es_core_read(pt->st, do_export, &a, err);
    es_core_leave(pt->st);
  }
  names_destroy(&a.sess);
  names_destroy(&a.keys);
  names_destroy(&a.only);
  if (rc == ES_OK && a.last_position > *last_position) *last_position = a.last_position;
  return rc;
}

/* Every shard of a keyed shards: store holds key rows of its own: the
 * master key's check row (any one of them checks the same master key)
 * and, for a store that was imported into shards:, copies of the same
 * data keys; those are exported once. A name whose data key differs
 * between shards (each sealed under it on its own) has no single row a
 * store could import: refused, naming it (docs/moving.md). Lines are
 * sorted: a name's rows are next to each other. */
static int shared_key_line(const lines *l, size_t i, es_err *err) {
  const line *a = i ? &l->v[i - 1] : NULL, *b = &l->v[i];
  if (!a || b->sec != SEC_KEY || a->sec != SEC_KEY || cmp_line(a, b) != 0) return ES_OK;
  if (!*b->k1 || (a->len == b->len && memcmp(a->text, b->text, a->len) == 0)) return ES_OK;
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "export: the shards hold different data keys named '%s' (each sealed under "
                 "that name on its own); such a store cannot be exported yet (docs/moving.md)",
                 b->k1);
}

static int emit(es_line_fn fn, void *ctx, es_buf *b, es_err *err) {
  if (b->oom) return nomem(err);
  int stop = fn(ctx, b->data, b->len);
  b->len = 0;
  return stop ? es_fail(err, ES_INVALID_ARGUMENT, "export stopped by its caller") : ES_OK;
}

int es_store_export(es_store *s, const es_export_opts *o, es_line_fn fn, void *ctx, es_err *err) {
  static const es_export_opts all;
  if (!o) o = &all;
  es_capabilities caps;
  parts p;
  int rc = es_store_capabilities(s, &caps, err);
  if (rc == ES_OK) rc = get_parts(s, &p, err);
  if (rc) return rc;
  lines l = {0};
  int64_t position = 0;
  for (size_t i = 0; rc == ES_OK && i < p.n; i++)
    rc = export_part(&p.v[i], o, &l, &position, err);
  parts_destroy(&p);
  if (rc) {
    lines_destroy(&l);
    return rc;
  }
  if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_line); /* qsort(NULL, 0): undefined */
  int64_t count[SEC_N] = {0};
  es_buf b;
  es_buf_init(&b);
  es_buf_addf(&b, "{\"eventstore_export\":%d,\"backend\":", ES_EXPORT_VERSION);
  es_json_write_text(&b, caps.backend, strlen(caps.backend));
  es_buf_adds(&b, ",\"position\":");
  es_json_write_int(&b, position);
  es_buf_addc(&b, '}');
  rc = emit(fn, ctx, &b, err);
  for (size_t i = 0; rc == ES_OK && i < l.n; i++) {
    if ((rc = shared_key_line(&l, i, err))) break;
    if (i > 0 && l.v[i].sec == SEC_KEY && cmp_line(&l.v[i - 1], &l.v[i]) == 0) continue;
    count[l.v[i].sec]++;
    int stop = fn(ctx, l.v[i].text, l.v[i].len);
    if (stop) rc = es_fail(err, ES_INVALID_ARGUMENT, "export stopped by its caller");
  }
  if (rc == ES_OK) {
    es_buf_adds(&b, "{\"end\":{");
    for (int k = 0; k < SEC_N; k++) es_buf_addf(&b, "%s\"%ss\":%lld", k ? "," : "", sec_names[k], (long long)count[k]);
    es_buf_adds(&b, "}}");
    rc = emit(fn, ctx, &b, err);
  }
  es_buf_destroy(&b);
  lines_destroy(&l);
  return rc;
}

/* ---- import ------------------------------------------------------------- */

typedef struct rec {
  int sec;
  char *text; /* owned (the document borrows it) */
  size_t len;
  es_json_doc *doc;
  const es_jval *body;
  const char *session; /* the session it belongs to (NULL: keys, refs) */
} rec;

struct es_import {
  rec *v;
  size_t n, cap;
  int64_t version, position;
  int have_header, have_end;
  int64_t count[SEC_N];
  int64_t lineno;
};

int es_import_new(es_import **out, es_err *err) {
  *out = calloc(1, sizeof **out);
  return *out ? ES_OK : nomem(err);
}

void es_import_free(es_import *im) {
  if (!im) return;
  for (size_t i = 0; i < im->n; i++) {
    es_json_doc_free(im->v[i].doc);
    free(im->v[i].text);
  }
  free(im->v);
  free(im);
}

static int bad_line(es_import *im, es_err *err, const char *why) {
  return es_fail(err, ES_INVALID_ARGUMENT, "import: line %lld: %s", (long long)im->lineno, why);
}

static int read_header(es_import *im, const es_jval *root, es_err *err) {
  const es_jval *v = es_jval_get(root, "eventstore_export");
  const es_jval *pos = es_jval_get(root, "position");
  if (!v || v->type != ES_JINT || !pos || pos->type != ES_JINT || !es_jval_get(root, "backend"))
    return bad_line(im, err, "not an eventstore export (the first line is its header)");
  if (v->i > ES_EXPORT_VERSION)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "import: the export is format version %lld, newer than this eventstore reads "
                   "(%d): import it with a newer eventstore",
                   (long long)v->i, ES_EXPORT_VERSION);
  im->version = v->i;
  im->position = pos->i;
  im->have_header = 1;
  return ES_OK;
}

static int read_end(es_import *im, const es_jval *body, es_err *err) {
  for (int k = 0; k < SEC_N; k++) {
    char key[32];
    snprintf(key, sizeof key, "%ss", sec_names[k]);
    const es_jval *c = es_jval_get(body, key);
    /* version 1 had no archived events (export refused them) */
    if (!c && k == SEC_ARCHIVED && im->version < 2 && !im->count[k]) continue;
    if (!c || c->type != ES_JINT || c->i != im->count[k])
      return bad_line(im, err, "the end record's counts do not match the lines before it");
  }
  im->have_end = 1;
  return ES_OK;
}

int es_import_line(es_import *im, const char *text, size_t len, es_err *err) {
  im->lineno++;
  if (im->have_end) return bad_line(im, err, "a line after the end record");
  es_json_doc *doc = NULL;
  char *copy = malloc(len + 1);
  if (!copy) return nomem(err);
  memcpy(copy, text, len);
  copy[len] = '\0';
  int rc = es_json_doc_parse(copy, len, &doc, err);
  if (rc) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg); /* es_fail writes over err->msg */
    free(copy);
    return bad_line(im, err, why);
  }
  const es_jval *root = es_json_doc_root(doc);
  if (!im->have_header) {
    rc = root->type == ES_JOBJECT ? read_header(im, root, err)
                                  : bad_line(im, err, "not an eventstore export");
    es_json_doc_free(doc);
    free(copy);
    return rc;
  }
  if (root->type != ES_JOBJECT || root->n != 1) {
    rc = bad_line(im, err, "not a record (an object with one member)");
  } else if (strcmp(root->keys[0], "end") == 0) {
    rc = read_end(im, &root->items[0], err);
  } else {
    int sec = -1;
    for (int k = 0; k < SEC_N; k++)
      if (strcmp(root->keys[0], sec_names[k]) == 0) sec = k;
    const es_jval *body = &root->items[0];
    if (sec < 0) {
      rc = bad_line(im, err, "an unknown record");
    } else if (body->type != ES_JOBJECT) {
      rc = bad_line(im, err, "a record's value is not an object");
    } else if (es_grow((void **)&im->v, &im->cap, im->n + 1, sizeof *im->v)) {
      rc = nomem(err);
    } else {
      /* an archived event's session is its event's */
      const es_jval *sv = es_jval_get(sec == SEC_ARCHIVED ? es_jval_get(body, "event") : body,
                                      "session");
      im->count[sec]++;
      im->v[im->n++] = (rec){sec, copy, len, doc, body,
                             sec != SEC_REF && sv && sv->type == ES_JSTRING ? sv->str : NULL};
      return ES_OK;
    }
  }
  es_json_doc_free(doc);
  free(copy);
  return rc;
}

/* One filler stands for a dropped prefix of a session (or, session NULL,
 * for a gap nobody's prefix fills). */
typedef struct need {
  const char *session;
  int64_t count, done;
  int64_t deadline; /* the position of its first stored row; INT64_MAX: none */
} need;

static int cmp_need(const void *pa, const void *pb) {
  const need *a = pa, *b = pb;
  return a->deadline < b->deadline ? -1 : a->deadline > b->deadline;
}

typedef struct import_args {
  es_import *im;
  const parts *p;
  const part *pt;
  int mode;
  es_import_result *res;
  owned_strs strs;
  need *needs;
  size_t n_needs, needs_cap, next_need;
  int64_t next_pos, fillers;
  const char *tag; /* FILLER_TAG made unique (es_import_run) */
  const char *gate; /* test hook (ES_TEST_IMPORT_GATE): pause before the commit */
} import_args;

static int mine(const import_args *a, const rec *r) {
  if (r->sec == SEC_REF) return a->pt->refs;
  if (!a->pt->sessions) return 0;
  if (r->sec == SEC_KEY) return 1;
  return r->session && owner_of(a->p, r->session) == a->pt;
}

/* Inserts one filler row at a->next_pos: of the session whose prefix is
 * due first, else of the scratch session. */
static int put_filler(es_store *st, es_txn *t, import_args *a, need *n, es_err *err) {
  char id[FILLER_TAG_MAX + 24];
  snprintf(id, sizeof id, "%s:%lld", a->tag, (long long)a->next_pos);
  es_event e;
  es_event_init(&e);
  e.id = id;
  e.type = FILLER_TYPE;
  e.payload = "null";
  e.payload_len = 4;
  e.session = n ? (char *)n->session : (char *)a->tag;
  e.index = n ? ++n->done : ++a->fillers;
  e.created_at = 0;
  e.revision = 1;
  es_event_settle_copy(&e, 0);
  int rc = st->ops->event_insert(st->bk, t, &e, err);
  if (rc == ES_OK && e.position != a->next_pos)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "import: the target hands out position %lld where the export needs %lld "
                 "(it held events before: import into a store that never had any)",
                 (long long)e.position, (long long)a->next_pos);
  a->next_pos++;
  return rc;
}

static need *next_due(import_args *a) {
  while (a->next_need < a->n_needs && a->needs[a->next_need].done == a->needs[a->next_need].count)
    a->next_need++;
  return a->next_need < a->n_needs ? &a->needs[a->next_need] : NULL;
}

static need *need_of(import_args *a, const char *session) {
  for (size_t i = 0; i < a->n_needs; i++)
    if (strcmp(a->needs[i].session, session) == 0) return &a->needs[i];
  return NULL;
}

static int import_event(es_store *st, es_txn *t, import_args *a, const rec *r, es_err *err) {
  const es_backend_ops *ops = st->ops;
  es_event e;
  es_event_init(&e);
  int rc = get_fields(r->body, "event", event_fields, sizeof event_fields / sizeof *event_fields,
                      &e, &a->strs, err);
  if (rc) return rc;
  if (!e.session || !e.id || !e.type || e.index < 1 || e.position < 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "import: an event without session, id, type, index or position");
  if (a->mode == ES_IMPORT_UPSERT) {
    es_event have;
    es_event_init(&have);
    rc = ops->event_get(st->bk, t, e.session, e.index, &have, err);
    if (rc == ES_OK) {
      int same = strcmp(have.id, e.id) == 0;
      es_event_destroy(&have);
      if (!same)
        return es_fail(err, ES_INVALID_ARGUMENT,
                       "import: event %lld of '%s' has another id on the target", (long long)e.index,
                       e.session);
      return ops->event_update(st->bk, t, &e, err);
    }
    if (rc != ES_NOT_FOUND) return rc;
    rc = ES_OK;
  }
  if (e.position < a->next_pos)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "import: event %lld of '%s' has position %lld, not past the target's %lld "
                   "(positions must grow through the stream)",
                   (long long)e.index, e.session, (long long)e.position, (long long)a->next_pos - 1);
  while (rc == ES_OK && a->next_pos < e.position) {
    need *n = next_due(a);
    if (n && n->deadline <= a->next_pos)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "import: session '%s' has fewer free positions below its first event "
                     "than dropped events",
                     n->session);
    rc = put_filler(st, t, a, n, err);
  }
  need *mine_n = need_of(a, e.session);
  if (rc == ES_OK && mine_n && mine_n->done < mine_n->count)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "import: session '%s' has fewer free positions below its first event than "
                   "dropped events",
                   e.session);
  if (rc) return rc;
  int64_t want = e.position;
  rc = ops->event_insert(st->bk, t, &e, err);
  if (rc == ES_OK && e.position != want)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "import: the target hands out position %lld where the export needs %lld "
                 "(it held events before: import into a store that never had any)",
                 (long long)e.position, (long long)want);
  a->next_pos = want + 1;
  a->res->events++;
  return rc;
}

/* What the target holds of one session's segments (an increment). */
typedef struct seg_seen {
  const es_segment *want;
  int same;        /* a row with want's range */
  int64_t through; /* the highest through of its rows */
} seg_seen;

static int count_row(void *ctx, const es_event *row) {
  (void)row;
  ++*(int64_t *)ctx;
  return 0;
}

static int seg_seen_cb(void *ctx, const es_segment *row) {
  seg_seen *c = ctx;
  if (row->from == c->want->from && row->through == c->want->through) c->same = 1;
  if (row->through > c->through) c->through = row->through;
  return 0;
}

/* Writes one segment rebuilt from its events (raw). Into an empty store
 * it is new. In an increment (UPSERT) a segment the target has already is
 * left as it is; one past the target's archive is written and the rows it
 * covers dropped (archived on the source since the last pass); any other
 * (the source compacted or truncated its archive meanwhile) is refused,
 * as the target's segments could not be made the source's. */
static int put_archived(es_store *st, es_txn *t, import_args *a, const char *session,
                        const es_segment *g, const es_buf *raw, es_err *err) {
  if (a->mode == ES_IMPORT_UPSERT) {
    seg_seen c = {g, 0, 0};
    int rc = st->ops->segment_list(st->bk, t, session, seg_seen_cb, &c, err);
    if (rc || c.same) return rc;
    if (g->from <= c.through)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "import: the archive of session '%s' changed on the source (segment "
                     "%lld..%lld overlaps the target's, archived through %lld): a follower "
                     "carries new segments only; export and import the store again",
                     session, (long long)g->from, (long long)g->through, (long long)c.through);
  }
  /* the result counts the events the target did not hold: in an
   * increment, those a segment brings that were not rows there yet */
  int64_t held = 0;
  int rc = a->mode == ES_IMPORT_UPSERT ? st->ops->event_range(st->bk, t, session, g->from - 1,
                                                              g->through, ES_NONE, count_row,
                                                              &held, err)
                                       : ES_OK;
  if (rc == ES_OK)
    rc = es_archive_import_segment(st, t, session, g->from, g->through,
                                   (const unsigned char *)raw->data, raw->len, g->created_at, err);
  if (rc == ES_OK && a->mode == ES_IMPORT_UPSERT)
    rc = st->ops->event_delete_range(st->bk, t, session, g->through, err);
  if (rc == ES_OK) a->res->events += g->through - g->from + 1 - held;
  return rc;
}

static int bad_archived(es_err *err, const char *session, const es_segment *g, const char *why) {
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "import: the archived events of segment %lld..%lld of session '%s' %s",
                 (long long)g->from, (long long)g->through, session, why);
}

/* §10: the archived events of this part, rebuilt into their segments. An
 * export writes each segment's events together, whole and in index order
 * (sorted by session, then index), each with its segment's range and
 * time: the same events encoded the same way make the same segment
 * (segment.h), so from, through, count, bytes and checksum come out as on
 * the source (docs/moving.md says when bytes and checksum cannot). */
static int import_archived(es_store *st, es_txn *t, import_args *a, es_err *err) {
  es_buf raw;
  es_buf_init(&raw);
  es_segment cur;
  es_segment_init(&cur);
  const char *session = NULL; /* the open segment's; NULL: none open */
  int64_t next = 0;           /* the index its next event must have */
  int rc = ES_OK;
  for (size_t i = 0; rc == ES_OK && i <= a->im->n; i++) {
    const rec *r = i < a->im->n ? &a->im->v[i] : NULL;
    if (r && (r->sec != SEC_ARCHIVED || !mine(a, r))) continue;
    es_segment g;
    es_segment_init(&g);
    es_event e;
    es_event_init(&e);
    if (r) {
      rc = get_fields(es_jval_get(r->body, "segment"), "archived_event segment", segment_fields,
                      sizeof segment_fields / sizeof *segment_fields, &g, &a->strs, err);
      if (rc == ES_OK)
        rc = get_fields(es_jval_get(r->body, "event"), "archived_event", event_fields,
                        sizeof event_fields / sizeof *event_fields, &e, &a->strs, err);
      if (rc) break;
      if (!e.session || !e.id || !e.type || e.position < 1 || g.from < 1 || g.through < g.from)
        rc = es_fail(err, ES_INVALID_ARGUMENT,
                     "import: an archived event without session, id, type or position, or with "
                     "a bad segment range");
      else if (e.status != ES_STATUS_PROCESSED)
        rc = bad_archived(err, e.session, &g, "hold an event not processed");
      if (rc) break;
    }
    /* a new segment starts (or the stream ends): the open one is whole */
    if (session && (!r || strcmp(e.session, session) != 0 || g.from != cur.from)) {
      rc = next == cur.through + 1 ? put_archived(st, t, a, session, &cur, &raw, err)
                                   : bad_archived(err, session, &cur, "are not all in the stream");
      raw.len = 0;
      session = NULL;
    }
    if (!r || rc) break;
    if (!session) {
      cur = g;
      session = e.session;
      next = g.from;
    } else if (g.through != cur.through || g.created_at != cur.created_at) {
      rc = bad_archived(err, session, &cur, "disagree about their segment");
      break;
    }
    if (e.index != next) {
      rc = bad_archived(err, session, &cur, "are not whole and in index order");
      break;
    }
    next++;
    if (es_seg_raw_add(&raw, &e) != ES_OK) rc = nomem(err);
  }
  es_buf_destroy(&raw);
  return rc;
}

/* Test hook (spec/75): with ES_TEST_IMPORT_GATE=PATH in the environment,
 * the import of the last part, its rows written but not committed (earlier
 * parts of a sharded store committed), creates PATH.paused and waits until
 * PATH exists: a process to kill -9 halfway, found by a file, not a time. */
static void pause_at(const char *gate) {
  char paused[4096];
  snprintf(paused, sizeof paused, "%s.paused", gate);
  FILE *f = fopen(paused, "w");
  if (f) fclose(f);
  for (;;) {
    FILE *g = fopen(gate, "r");
    if (g) {
      fclose(g);
      return;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int do_import(es_store *st, es_txn *t, void *arg, es_err *err) {
  import_args *a = arg;
  es_import *im = a->im;
  const es_backend_ops *ops = st->ops;
  int64_t last = 0;
  int rc = ops->last_position(st->bk, t, &last, err);
  a->next_pos = last + 1;
  /* the fillers each session's dropped prefix needs, earliest first */
  for (size_t i = 0; rc == ES_OK && i < im->n; i++) {
    const rec *r = &im->v[i];
    if (r->sec != SEC_SESSION || !mine(a, r)) continue;
    session_rec sr;
    memset(&sr, 0, sizeof sr);
    rc = get_fields(r->body, "session", session_fields,
                    sizeof session_fields / sizeof *session_fields, &sr, &a->strs, err);
    if (rc) break;
    if (a->mode == ES_IMPORT_UPSERT) {
      es_session_info have;
      int g = ops->session_get(st->bk, t, sr.si.session, &have, err);
      if (g == ES_OK) {
        es_session_info_destroy(&have);
        continue; /* its rows are there already */
      }
      if (g != ES_NOT_FOUND) {
        rc = g;
        break;
      }
    }
    if (sr.first_row <= 1) continue;
    if (es_grow((void **)&a->needs, &a->needs_cap, a->n_needs + 1, sizeof *a->needs)) {
      rc = nomem(err);
      break;
    }
    a->needs[a->n_needs++] = (need){sr.si.session, sr.first_row - 1, 0,
                                    sr.first_position > 0 ? sr.first_position : INT64_MAX};
  }
  if (rc == ES_OK && a->n_needs) qsort(a->needs, a->n_needs, sizeof *a->needs, cmp_need);
  for (size_t i = 0; rc == ES_OK && i < im->n; i++) {
    const rec *r = &im->v[i];
    if (!mine(a, r)) continue;
    switch (r->sec) {
      case SEC_KEY: {
        es_key_row k;
        memset(&k, 0, sizeof k);
        rc = get_fields(r->body, "key", key_fields, sizeof key_fields / sizeof *key_fields, &k,
                        &a->strs, err);
        if (rc == ES_OK) rc = ops->key_put(st->bk, t, &k, err);
        break;
      }
      case SEC_KEY_USE: {
        key_use_rec k;
        rc = get_fields(r->body, "key_use", key_use_fields,
                        sizeof key_use_fields / sizeof *key_use_fields, &k, &a->strs, err);
        if (rc == ES_OK) rc = ops->key_use_put(st->bk, t, k.key, k.session, k.first_index, err);
        break;
      }
      case SEC_EVENT: rc = import_event(st, t, a, r, err); break;
      default: break;
    }
  }
  if (rc == ES_OK && st->crypto) rc = es_crypto_check(st, t, err);
  /* sessions none of whose rows is stored: their prefixes go last */
  for (need *n; rc == ES_OK && (n = next_due(a));) rc = put_filler(st, t, a, n, err);
  for (size_t i = 0; rc == ES_OK && i < a->n_needs; i++)
    rc = ops->event_delete_range(st->bk, t, a->needs[i].session, a->needs[i].count, err);
  if (rc == ES_OK && a->fillers) {
    rc = ops->event_delete_range(st->bk, t, a->tag, INT64_MAX, err);
    if (rc == ES_OK) rc = ops->session_delete(st->bk, t, a->tag, err);
    if (rc == ES_NOT_FOUND) rc = ES_OK;
  }
  /* the archived events' positions were gaps like those of truncated ones
   * (their rows are fillers, gone again): they go into segments */
  if (rc == ES_OK) rc = import_archived(st, t, a, err);
  /* the rows that count and route: after the events they describe */
  for (size_t i = 0; rc == ES_OK && i < im->n; i++) {
    const rec *r = &im->v[i];
    if (!mine(a, r)) continue;
    if (r->sec == SEC_SESSION) {
      session_rec sr;
      memset(&sr, 0, sizeof sr);
      rc = get_fields(r->body, "session", session_fields,
                      sizeof session_fields / sizeof *session_fields, &sr, &a->strs, err);
      if (rc == ES_OK) rc = ops->session_put(st->bk, t, &sr.si, err);
      a->res->sessions++;
    } else if (r->sec == SEC_SNAPSHOT) {
      snapshot_rec sr;
      memset(&sr, 0, sizeof sr);
      rc = get_fields(r->body, "snapshot", snapshot_fields,
                      sizeof snapshot_fields / sizeof *snapshot_fields, &sr, &a->strs, err);
      if (rc == ES_OK) rc = ops->snapshot_put(st->bk, t, sr.session, &sr.sn, err);
    } else if (r->sec == SEC_REF) {
      es_ref ref;
      es_ref_init(&ref);
      rc = get_fields(r->body, "ref", ref_fields, sizeof ref_fields / sizeof *ref_fields, &ref,
                      &a->strs, err);
      if (rc == ES_OK) rc = ops->ref_put(st->bk, t, &ref, err);
    }
  }
  if (rc == ES_OK) es_core_touch(st, NULL); /* every wait on the store looks again */
  if (rc == ES_OK && a->gate) pause_at(a->gate);
  return rc;
}

/* Whether part pt of the target is empty, holds exactly this stream's
 * share already (a rerun), or holds something else (refused). */
enum { PART_EMPTY, PART_SAME, PART_OTHER };

static int part_state(import_args *a, int *state, char *what, size_t what_len, es_err *err) {
  lines l = {0};
  int64_t last = 0;
  static const es_export_opts all;
  int rc = export_part(a->pt, &all, &l, &last, err);
  if (rc) return rc;
  if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_line); /* qsort(NULL, 0): undefined */
  size_t data = 0;
  const char *master = NULL;
  for (size_t i = 0; i < l.n; i++) {
    if (l.v[i].sec == SEC_KEY && l.v[i].k1 && !*l.v[i].k1) master = l.v[i].text;
    else data++;
  }
  if (!data && last == 0) {
    *state = PART_EMPTY;
    /* a store opened with keys has its master key's check row: it must be
     * the source's, or nothing imported could be opened */
    for (size_t i = 0; master && i < a->im->n; i++) {
      const rec *r = &a->im->v[i];
      const es_jval *name = r->sec == SEC_KEY ? es_jval_get(r->body, "name") : NULL;
      if (name && name->type == ES_JSTRING && name->len == 0 &&
          (strlen(master) != r->len || memcmp(master, r->text, r->len) != 0))
        rc = es_fail(err, ES_INVALID_ARGUMENT,
                     "import: the target store's master key is not the source's: open it with "
                     "the source's key file");
    }
    lines_destroy(&l);
    return rc;
  }
  size_t j = 0, i = 0;
  int same = 1;
  for (; same && i < a->im->n; i++) {
    const rec *r = &a->im->v[i];
    if (!mine(a, r)) continue;
    same = j < l.n && l.v[j].len == r->len && memcmp(l.v[j].text, r->text, r->len) == 0;
    j++;
  }
  same = same && j == l.n;
  *state = same ? PART_SAME : PART_OTHER;
  if (!same) snprintf(what, what_len, "%s", l.n ? l.v[0].text : "events");
  lines_destroy(&l);
  return ES_OK;
}

int es_import_run(es_store *s, es_import *im, int mode, es_import_result *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (!im->have_header) return es_fail(err, ES_INVALID_ARGUMENT, "import: the stream is empty");
  if (!im->have_end)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "import: the stream ends before its end record (cut short): nothing written");
  out->position = im->position;
  parts p;
  int rc = get_parts(s, &p, err);
  if (rc) return rc;
  char tag[FILLER_TAG_MAX] = FILLER_TAG;
  for (int clash = 1; clash && strlen(tag) + 1 < sizeof tag;) {
    clash = 0;
    for (size_t i = 0; !clash && i < im->n; i++) {
      const es_jval *id = im->v[i].sec == SEC_EVENT ? es_jval_get(im->v[i].body, "id") : NULL;
      clash = (im->v[i].session && strcmp(im->v[i].session, tag) == 0) ||
              (id && id->type == ES_JSTRING && strncmp(id->str, tag, strlen(tag)) == 0);
    }
    if (clash) strcat(tag, "~");
  }
  int state[ES_MAX_SHARDS * 2 + 1];
  size_t same = 0;
  for (size_t i = 0; rc == ES_OK && i < im->n; i++)
    if (im->v[i].sec != SEC_REF && im->v[i].sec != SEC_KEY && im->v[i].session &&
        !owner_of(&p, im->v[i].session))
      rc = es_fail(err, ES_STORAGE, "import: no shard owns session '%s'", im->v[i].session);
  /* archived events need the archive directory of the part that will hold
   * them: refused before anything is written, naming the option */
  for (size_t i = 0; rc == ES_OK && i < im->n; i++) {
    const part *pt = im->v[i].sec == SEC_ARCHIVED && im->v[i].session
                         ? owner_of(&p, im->v[i].session)
                         : NULL;
    if (pt && !pt->st->archive_dir)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "import: the export holds archived events (session '%s') and the target "
                   "store has no archive directory: open it with {archive = DIR} (--archive "
                   "DIR); nothing written",
                   im->v[i].session);
  }
  /* every part is checked before any is written: a refused import writes nothing */
  for (size_t i = 0; rc == ES_OK && i < p.n; i++) {
    import_args a = {.im = im, .p = &p, .pt = &p.v[i], .mode = mode, .res = out};
    char what[200];
    state[i] = PART_EMPTY;
    if (mode == ES_IMPORT_EMPTY) rc = part_state(&a, &state[i], what, sizeof what, err);
    if (rc == ES_OK && state[i] == PART_OTHER)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "import: the target store is not empty (it holds %.120s...): import writes "
                   "only into an empty store; nothing written",
                   what);
    if (state[i] == PART_SAME) same++;
  }
  for (size_t i = 0; rc == ES_OK && i < p.n; i++) {
    if (state[i] != PART_EMPTY) continue;
    import_args a = {.im = im, .p = &p, .pt = &p.v[i], .mode = mode, .res = out, .tag = tag};
    if (i + 1 == p.n) a.gate = getenv("ES_TEST_IMPORT_GATE");
    rc = es_core_enter(a.pt->st, err);
    if (rc == ES_OK) {
      rc = es_core_write(a.pt->st, do_import, &a, err);
      es_core_leave(a.pt->st);
    }
    for (size_t k = 0; k < a.strs.n; k++) free(a.strs.v[k]);
    free(a.strs.v);
    free(a.needs);
  }
  out->already = rc == ES_OK && same == p.n;
  parts_destroy(&p);
  return rc;
}

/* ---- backup ------------------------------------------------------------- */

int es_store_backup(es_store *s, const char *to, es_err *err) {
  if (s->impl != &es_core_ops)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "backup copies one sqlite: store: back up each shard's store (or export the "
                   "sharded store), and a tenant's store rather than its handle");
  const es_backend_ops *ops = s->real_ops ? s->real_ops : s->ops;
  es_backend *bk = s->real_ops ? s->real_bk : s->bk;
  if (!ops->backup)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "backup copies a sqlite: store's file; a %s: store has none (docs/moving.md: "
                   "export, or pg_basebackup / pg_dump for postgres)",
                   ops->scheme);
  int rc = es_core_enter(s, err);
  if (rc) return rc;
  rc = ops->backup(bk, to, err);
  es_core_leave(s);
  return rc;
}
