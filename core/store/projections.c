/*
 * projections.c: §8 in the store: the front door's projection calls, the
 * core store's rules over the backend's projection rows (backend.h
 * proj_*), and the record's encoding. projections.h says what each call
 * means; docs/projections.md why it is shaped so.
 *
 * Rows. A projection's record is the row (ns "", key = its name); the
 * states of its generation g are the rows of ns "<name>@<g>" (keys as
 * stored: a tenant's keys behind its prefix). A record is a short text of
 * tagged fields (enc_*), read back field by field in the same order.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/backend.h"
#include "store/internal.h"
#include "store/projections.h"
#include "store/shards.h"
#include "store/store_impl.h"
#include "util/buf.h"

#define KEYS_MAX 1000 /* a page of projection_keys at most */

void es_projection_init(es_projection *p) { memset(p, 0, sizeof *p); }

void es_projection_destroy(es_projection *p) {
  if (!p) return;
  free(p->name);
  free(p->version);
  free(p->cursor);
  free(p->building_version);
  free(p->building_cursor);
  free(p->error);
  free(p->error_id);
  free(p->error_cursor);
  free(p->holder);
  es_projection_init(p);
}

static int dup_opt(char **dst, const char *src) {
  *dst = NULL;
  return src && !(*dst = strdup(src)) ? ES_STORAGE : ES_OK;
}

int es_projection_copy(es_projection *dst, const es_projection *src) {
  *dst = *src;
  if (dup_opt(&dst->name, src->name) | dup_opt(&dst->version, src->version) |
      dup_opt(&dst->cursor, src->cursor) | dup_opt(&dst->building_version, src->building_version) |
      dup_opt(&dst->building_cursor, src->building_cursor) | dup_opt(&dst->error, src->error) |
      dup_opt(&dst->error_id, src->error_id) | dup_opt(&dst->error_cursor, src->error_cursor) |
      dup_opt(&dst->holder, src->holder)) {
    es_projection_destroy(dst);
    return ES_STORAGE;
  }
  return ES_OK;
}

void es_projections_destroy(es_projections *l) {
  for (size_t i = 0; l && i < l->n; i++) es_projection_destroy(&l->v[i]);
  if (l) {
    free(l->v);
    memset(l, 0, sizeof *l);
  }
}

void es_proj_keys_destroy(es_proj_keys *k) {
  for (size_t i = 0; k && i < k->n; i++) free(k->keys[i]);
  if (k) {
    free(k->keys);
    free(k->cursor);
    memset(k, 0, sizeof *k);
  }
}

/* ---- the record's encoding ----------------------------------------------
 * "p1" then, in es_projection's order, each integer as "i<decimal>;" and
 * each string as "s<length>:<bytes>" or "n" (NULL). */

static int enc_int(es_buf *b, int64_t v) {
  char t[32];
  int n = snprintf(t, sizeof t, "i%" PRId64 ";", v);
  return es_buf_add(b, t, (size_t)n);
}

static int enc_str(es_buf *b, const char *s) {
  if (!s) return es_buf_add(b, "n", 1);
  char t[32];
  size_t len = strlen(s);
  int n = snprintf(t, sizeof t, "s%zu:", len);
  return es_buf_add(b, t, (size_t)n) || es_buf_add(b, s, len);
}

static int encode(const es_projection *p, es_buf *b) {
  return es_buf_add(b, "p1", 2) || enc_int(b, p->seq) || enc_int(b, p->generation) ||
         enc_str(b, p->version) || enc_int(b, p->position) || enc_str(b, p->cursor) ||
         enc_int(b, p->building) || enc_str(b, p->building_version) ||
         enc_int(b, p->building_position) || enc_str(b, p->building_cursor) ||
         enc_int(b, p->failed) || enc_str(b, p->error) || enc_int(b, p->error_position) ||
         enc_str(b, p->error_id) || enc_str(b, p->error_cursor) || enc_int(b, p->skipped) ||
         enc_int(b, p->rebuild) || enc_str(b, p->holder) || enc_int(b, p->lease_expires_at) ||
         enc_int(b, p->updated_at);
}

typedef struct dec {
  const char *p, *end;
  int bad;
} dec;

static int64_t dec_int(dec *d) {
  if (d->bad || d->p >= d->end || *d->p != 'i') return d->bad = 1, 0;
  char *e;
  long long v = strtoll(d->p + 1, &e, 10);
  if (e >= d->end || *e != ';') return d->bad = 1, 0;
  d->p = e + 1;
  return v;
}

static char *dec_str(dec *d) {
  if (d->bad || d->p >= d->end) return d->bad = 1, NULL;
  if (*d->p == 'n') return d->p++, NULL;
  if (*d->p != 's') return d->bad = 1, NULL;
  char *e;
  unsigned long long n = strtoull(d->p + 1, &e, 10);
  if (e >= d->end || *e != ':' || n > (unsigned long long)(d->end - e - 1)) return d->bad = 1, NULL;
  char *s = malloc(n + 1);
  if (!s) return d->bad = 1, NULL;
  memcpy(s, e + 1, n);
  s[n] = 0;
  d->p = e + 1 + n;
  return s;
}

static int decode(const char *name, const char *v, size_t len, es_projection *p, es_err *err) {
  es_projection_init(p);
  dec d = {v + 2, v + len, len < 2 || memcmp(v, "p1", 2) != 0};
  p->seq = dec_int(&d);
  p->generation = dec_int(&d);
  p->version = dec_str(&d);
  p->position = dec_int(&d);
  p->cursor = dec_str(&d);
  p->building = dec_int(&d);
  p->building_version = dec_str(&d);
  p->building_position = dec_int(&d);
  p->building_cursor = dec_str(&d);
  p->failed = (int)dec_int(&d);
  p->error = dec_str(&d);
  p->error_position = dec_int(&d);
  p->error_id = dec_str(&d);
  p->error_cursor = dec_str(&d);
  p->skipped = dec_int(&d);
  p->rebuild = (int)dec_int(&d);
  p->holder = dec_str(&d);
  p->lease_expires_at = dec_int(&d);
  p->updated_at = dec_int(&d);
  p->name = strdup(name);
  if (d.bad || !p->name) {
    es_projection_destroy(p);
    return es_fail(err, ES_STORAGE, "projection '%s': its stored record does not read", name);
  }
  return ES_OK;
}

/* ---- rows ---------------------------------------------------------------- */

/* "<name>@<generation>": the ns of a generation's states. */
static void gen_ns(char *out, size_t cap, const char *name, int64_t gen) {
  snprintf(out, cap, "%s@%" PRId64, name, gen);
}
#define NS_CAP (ES_MAX_NAME_BYTES + 32)

static int get_record(es_store *s, es_txn *t, const char *name, es_projection *p, int *found,
                      es_err *err) {
  char *v = NULL;
  size_t len = 0;
  *found = 0;
  es_projection_init(p);
  int rc = s->ops->proj_get(s->bk, t, "", name, &v, &len, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  rc = decode(name, v, len, p, err);
  free(v);
  *found = rc == ES_OK;
  return rc;
}

static int put_record(es_store *s, es_txn *t, const es_projection *p, es_err *err) {
  es_buf b;
  es_buf_init(&b);
  int rc = encode(p, &b) ? es_fail(err, ES_STORAGE, "out of memory")
                         : s->ops->proj_put(s->bk, t, "", p->name, b.data, b.len, err);
  es_buf_destroy(&b);
  return rc;
}

/* A key as stored: scope (a tenant's prefix, or NULL) and the key. The
 * root handle's keys are outside every tenant: a key that looks like a
 * tenant's is not one of them. */
static int stored_key(const char *scope, const char *key, char *out, es_err *err) {
  if (!key) return es_fail(err, ES_INVALID_ARGUMENT, "key is required");
  if (*key) {
    int rc = es_check_name("key", key, err);
    if (rc) return rc;
    if (es_name_prefix_len(key, strlen(key)))
      return es_fail(err, ES_INVALID_ARGUMENT, "key '%s' starts like a tenant's name", key);
  }
  snprintf(out, ES_MAX_NAME_BYTES + 1, "%s%s", scope ? scope : "", key);
  return ES_OK;
}

static int check_proj_name(const char *name, es_err *err) {
  int rc = es_check_name("projection", name, err);
  if (!rc && (strchr(name, '@') || es_name_prefix_len(name, strlen(name))))
    rc = es_fail(err, ES_INVALID_ARGUMENT, "projection name '%s' may not hold '@' or a tenant's prefix",
                 name);
  return rc;
}

/* ---- the core store's ops -------------------------------------------------- */

typedef struct read_args {
  const char *name, *key;
  int64_t gen;
  char **value;
  size_t *len;
  es_projection *info;
} read_args;

static int do_read(es_store *s, es_txn *t, void *arg, es_err *err) {
  read_args *a = arg;
  es_projection p;
  int found, rc = get_record(s, t, a->name, &p, &found, err);
  if (rc || !found) return rc;
  int64_t g = a->gen > 0 ? a->gen : p.generation;
  if (g > 0) {
    char ns[NS_CAP];
    gen_ns(ns, sizeof ns, a->name, g);
    rc = s->ops->proj_get(s->bk, t, ns, a->key, a->value, a->len, err);
    if (rc == ES_NOT_FOUND) rc = ES_OK;
  }
  if (rc == ES_OK && a->info) {
    es_projection_destroy(a->info);
    *a->info = p;
  } else {
    es_projection_destroy(&p);
  }
  return rc;
}

int es_core_projection_read(es_store *s, const char *scope, const char *name, const char *key,
                            int64_t gen, char **value, size_t *len, es_projection *info, es_err *err) {
  char k[ES_MAX_NAME_BYTES + 1];
  int rc;
  *value = NULL;
  *len = 0;
  if ((rc = check_proj_name(name, err)) || (rc = stored_key(scope, key, k, err))) return rc;
  if (info && !(info->name = strdup(name))) return es_fail(err, ES_STORAGE, "out of memory");
  if ((rc = es_core_enter(s, err))) return rc;
  read_args a = {name, k, gen, value, len, info};
  rc = es_core_read(s, do_read, &a, err);
  es_core_leave(s);
  if (rc) {
    free(*value);
    *value = NULL;
  }
  return rc;
}

typedef struct keys_args {
  const char *name, *scope, *prefix, *after;
  int64_t limit;
  es_proj_keys *out;
  size_t cap;
  int oom;
} keys_args;

static int collect_key(void *ctx, const char *key, const char *value, size_t len) {
  (void)value;
  (void)len;
  keys_args *a = ctx;
  size_t sl = a->scope ? strlen(a->scope) : 0;
  if (!a->scope && es_name_prefix_len(key, strlen(key))) return 0; /* a tenant's */
  if ((int64_t)a->out->n > a->limit) return 1;
  char *k = strdup(key + sl);
  if (!k || es_grow((void **)&a->out->keys, &a->cap, a->out->n + 1, sizeof *a->out->keys)) {
    free(k);
    a->oom = 1;
    return 1;
  }
  a->out->keys[a->out->n++] = k;
  return (int64_t)a->out->n > a->limit; /* one more than asked: another page follows */
}

static int do_keys(es_store *s, es_txn *t, void *arg, es_err *err) {
  keys_args *a = arg;
  es_projection p;
  int found, rc = get_record(s, t, a->name, &p, &found, err);
  if (rc || !found || p.generation == 0) {
    es_projection_destroy(&p);
    return rc;
  }
  char ns[NS_CAP], pre[ES_MAX_NAME_BYTES + 1], aft[ES_MAX_NAME_BYTES + 1];
  gen_ns(ns, sizeof ns, a->name, p.generation);
  es_projection_destroy(&p);
  snprintf(pre, sizeof pre, "%s%s", a->scope ? a->scope : "", a->prefix ? a->prefix : "");
  if (a->after) snprintf(aft, sizeof aft, "%s%s", a->scope ? a->scope : "", a->after);
  /* The root's walk passes over tenants' keys: no limit on the backend's
   * side then, the callback stops it. */
  rc = s->ops->proj_list(s->bk, t, ns, pre, a->after ? aft : NULL, a->scope ? a->limit + 1 : ES_NONE,
                         collect_key, a, err);
  if (rc == ES_OK && a->oom) rc = es_fail(err, ES_STORAGE, "out of memory");
  if (rc == ES_OK && (int64_t)a->out->n > a->limit) {
    free(a->out->keys[--a->out->n]);
    if (!(a->out->cursor = strdup(a->out->keys[a->out->n - 1])))
      rc = es_fail(err, ES_STORAGE, "out of memory");
  }
  return rc;
}

int es_core_projection_keys(es_store *s, const char *scope, const char *name, const char *prefix,
                            const char *after, int64_t limit, es_proj_keys *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = check_proj_name(name, err))) return rc;
  if (limit == ES_NONE) limit = 100;
  if (limit <= 0 || limit > KEYS_MAX)
    return es_fail(err, ES_INVALID_ARGUMENT, "limit must be 1..%d", KEYS_MAX);
  if ((prefix && strlen(prefix) > ES_MAX_ID_BYTES) || (after && strlen(after) > ES_MAX_ID_BYTES))
    return es_fail(err, ES_INVALID_ARGUMENT, "prefix and after are at most %d bytes", ES_MAX_ID_BYTES);
  if ((rc = es_check_utf8("prefix", prefix, err)) || (rc = es_check_utf8("after", after, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  keys_args a = {name, scope, prefix, after, limit, out, 0, 0};
  rc = es_core_read(s, do_keys, &a, err);
  es_core_leave(s);
  if (rc) es_proj_keys_destroy(out);
  return rc;
}

typedef struct list_args {
  es_store *s;
  es_projections *out;
  es_err *err;
  int rc;
} list_args;

static int collect_record(void *ctx, const char *key, const char *value, size_t len) {
  list_args *a = ctx;
  if (es_grow((void **)&a->out->v, &a->out->cap, a->out->n + 1, sizeof *a->out->v)) {
    a->rc = es_fail(a->err, ES_STORAGE, "out of memory");
    return 1;
  }
  if ((a->rc = decode(key, value, len, &a->out->v[a->out->n], a->err))) return 1;
  a->out->n++;
  return 0;
}

typedef struct infos_args {
  const char *name;
  es_projections *out;
} infos_args;

static int do_infos(es_store *s, es_txn *t, void *arg, es_err *err) {
  infos_args *a = arg;
  if (a->name) {
    es_projection p;
    int found, rc = get_record(s, t, a->name, &p, &found, err);
    if (rc || !found) return rc;
    if (es_grow((void **)&a->out->v, &a->out->cap, 1, sizeof *a->out->v)) {
      es_projection_destroy(&p);
      return es_fail(err, ES_STORAGE, "out of memory");
    }
    a->out->v[a->out->n++] = p;
    return ES_OK;
  }
  list_args l = {s, a->out, err, ES_OK};
  int rc = s->ops->proj_list(s->bk, t, "", NULL, NULL, ES_NONE, collect_record, &l, err);
  return rc ? rc : l.rc;
}

int es_core_projections(es_store *s, const char *name, es_projections *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if (name && (rc = check_proj_name(name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  infos_args a = {name, out};
  rc = es_core_read(s, do_infos, &a, err);
  es_core_leave(s);
  if (rc) es_projections_destroy(out);
  return rc;
}

typedef struct commit_args {
  const es_projection *next;
  int64_t expect_seq, ttl_ms, gen, now;
  const es_proj_state *states;
  size_t n;
  es_projection *out;
} commit_args;

static int in_next(const es_projection *n, int64_t g) {
  return g == n->generation || g == n->building;
}

static int do_commit(es_store *s, es_txn *t, void *arg, es_err *err) {
  commit_args *a = arg;
  const char *name = a->next->name;
  es_projection cur;
  int found, rc = get_record(s, t, name, &cur, &found, err);
  if (rc) return rc;
  int64_t seq = found ? cur.seq : 0;
  if (seq != a->expect_seq)
    rc = es_fail(err, ES_STALE_FENCE,
                 "projection '%s' changed since it was read (another runner or a control command)",
                 name);
  else if (found && cur.holder && a->next->holder && strcmp(cur.holder, a->next->holder) != 0 &&
           cur.lease_expires_at > a->now)
    rc = es_fail(err, ES_STALE_FENCE, "projection '%s' is run by '%s' until %" PRId64, name,
                 cur.holder, cur.lease_expires_at);
  char ns[NS_CAP];
  if (rc == ES_OK && a->n) {
    if (a->gen <= 0 || !in_next(a->next, a->gen))
      rc = es_fail(err, ES_INVALID_ARGUMENT, "states go to a generation the record names");
    gen_ns(ns, sizeof ns, name, a->gen);
  }
  for (size_t i = 0; rc == ES_OK && i < a->n; i++)
    rc = s->ops->proj_put(s->bk, t, ns, a->states[i].key, a->states[i].value, a->states[i].len, err);
  /* A generation the record leaves (swapped out, or a build abandoned)
   * goes with this commit: nothing reads it any more. */
  int64_t old[2] = {found ? cur.generation : 0, found ? cur.building : 0};
  for (int i = 0; rc == ES_OK && i < 2; i++) {
    if (old[i] <= 0 || in_next(a->next, old[i])) continue;
    gen_ns(ns, sizeof ns, name, old[i]);
    rc = s->ops->proj_drop(s->bk, t, ns, err);
  }
  es_projection_destroy(&cur);
  if (rc) return rc;
  es_projection w = *a->next;
  w.seq = seq + 1;
  w.updated_at = a->now;
  if (w.holder) w.lease_expires_at = a->now + a->ttl_ms;
  rc = put_record(s, t, &w, err);
  if (rc == ES_OK && a->out) {
    es_projection_destroy(a->out);
    if (es_projection_copy(a->out, &w)) rc = es_fail(err, ES_STORAGE, "out of memory");
  }
  return rc;
}

static int check_state_key(const es_proj_state *st, es_err *err) {
  if (!st->key) return es_fail(err, ES_INVALID_ARGUMENT, "a state needs a key");
  if (!*st->key) return ES_OK;
  return es_check_name("key", st->key, err);
}

int es_core_projection_commit(es_store *s, const char *scope, const es_projection *next,
                              int64_t expect_seq, int64_t ttl_ms, int64_t gen,
                              const es_proj_state *states, size_t n, es_projection *out,
                              es_err *err) {
  int rc;
  if (scope)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "projections are run and controlled through the root handle, not a tenant's");
  if ((rc = check_proj_name(next->name, err))) return rc;
  if (ttl_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be >= 0");
  for (size_t i = 0; i < n; i++)
    if ((rc = check_state_key(&states[i], err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  commit_args a = {next, expect_seq, ttl_ms, gen, 0, states, n, out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_commit, &a, err);
  es_core_leave(s);
  return rc;
}

typedef struct control_args {
  const char *name, *action;
  int64_t now;
  es_projection *out;
} control_args;

static int do_control(es_store *s, es_txn *t, void *arg, es_err *err) {
  control_args *a = arg;
  es_projection p;
  int found, rc = get_record(s, t, a->name, &p, &found, err);
  if (rc) return rc;
  if (!found) return es_fail(err, ES_NOT_FOUND, "no projection '%s'", a->name);
  if (strcmp(a->action, "rebuild") == 0) {
    p.rebuild = 1;
  } else if (!p.failed) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "projection '%s' has not failed: nothing to %s", a->name,
                 a->action);
  } else if (strcmp(a->action, "skip") == 0) {
    /* The failed event counts as folded: the checkpoint moves onto it. */
    int64_t *pos = p.building ? &p.building_position : &p.position;
    char **cur = p.building ? &p.building_cursor : &p.cursor;
    *pos = p.error_position;
    free(*cur);
    *cur = p.error_cursor;
    p.error_cursor = NULL;
    p.skipped++;
  }
  if (rc == ES_OK && strcmp(a->action, "rebuild") != 0) {
    p.failed = 0;
    free(p.error);
    free(p.error_id);
    free(p.error_cursor);
    p.error = p.error_id = p.error_cursor = NULL;
    p.error_position = 0;
  }
  if (rc == ES_OK) {
    p.seq++;
    p.updated_at = a->now;
    rc = put_record(s, t, &p, err);
  }
  if (rc == ES_OK && a->out) {
    es_projection_destroy(a->out);
    *a->out = p;
  } else {
    es_projection_destroy(&p);
  }
  return rc;
}

int es_core_projection_control(es_store *s, const char *scope, const char *name, const char *action,
                               es_projection *out, es_err *err) {
  int rc;
  if (scope)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "projections are run and controlled through the root handle, not a tenant's");
  if ((rc = check_proj_name(name, err))) return rc;
  if (!action || (strcmp(action, "rebuild") && strcmp(action, "retry") && strcmp(action, "skip")))
    return es_fail(err, ES_INVALID_ARGUMENT, "action must be rebuild, retry or skip");
  if ((rc = es_core_enter(s, err))) return rc;
  control_args a = {name, action, 0, out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_control, &a, err);
  es_core_leave(s);
  return rc;
}

/* ---- the front door --------------------------------------------------------- */

int es_store_projection_read(es_store *s, const char *name, const char *key, char **value,
                             size_t *len, es_projection *info, es_err *err) {
  if (info) es_projection_init(info);
  return s->impl->projection_read(s, NULL, name, key, 0, value, len, info, err);
}

int es_store_projection_read_gen(es_store *s, const char *scope, const char *name, const char *key,
                                 int64_t gen, char **value, size_t *len, es_err *err) {
  return s->impl->projection_read(s, scope, name, key, gen, value, len, NULL, err);
}

int es_store_projection_keys(es_store *s, const char *name, const char *prefix, const char *after,
                             int64_t limit, es_proj_keys *out, es_err *err) {
  return s->impl->projection_keys(s, NULL, name, prefix, after, limit, out, err);
}

int es_store_projections(es_store *s, const char *name, es_projections *out, es_err *err) {
  return s->impl->projections(s, name, out, err);
}

int es_store_projection_commit(es_store *s, const es_projection *next, int64_t expect_seq,
                               int64_t ttl_ms, int64_t gen, const es_proj_state *states, size_t n,
                               es_projection *out, es_err *err) {
  if (out) es_projection_init(out);
  return s->impl->projection_commit(s, NULL, next, expect_seq, ttl_ms, gen, states, n, out, err);
}

int es_store_projection_control(es_store *s, const char *name, const char *action,
                                es_projection *out, es_err *err) {
  if (out) es_projection_init(out);
  return s->impl->projection_control(s, NULL, name, action, out, err);
}

#define SHARD_LAG_CAP 1000 /* events after a shards: cursor counted at most */

int es_store_projection_lag(es_store *s, const es_projection *p, int64_t *head, int64_t *lag,
                            int64_t *lag_ms, es_err *err) {
  int building = p->building > 0;
  int64_t pos = building ? p->building_position : p->position;
  const char *cursor = building ? p->building_cursor : p->cursor;
  es_capabilities caps;
  es_events next = {0};
  char **cursors = NULL;
  int64_t now = 0;
  *head = ES_NONE;
  *lag = *lag_ms = 0;
  int rc = es_store_capabilities(s, &caps, err);
  if (rc == ES_OK && caps.sharded) {
    rc = es_store_read_all_cursor(s, cursor, SHARD_LAG_CAP, &next, &cursors, err);
    if (rc == ES_OK) *lag = (int64_t)next.n;
  } else if (rc == ES_OK) {
    rc = es_store_last_position(s, head, err);
    if (rc == ES_OK) *lag = *head > pos ? *head - pos : 0;
    if (rc == ES_OK && *lag) rc = es_store_read_all(s, pos, 1, &next, err);
  }
  if (rc == ES_OK && next.n) rc = es_store_now(s, &now, err);
  if (rc == ES_OK && next.n && now > next.v[0].created_at) *lag_ms = now - next.v[0].created_at;
  es_store_cursors_free(cursors, next.n);
  es_events_destroy(&next);
  return rc;
}
