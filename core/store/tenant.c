/*
 * tenant.c: tenant handles (docs/contract.md §3.11).
 *
 * A tenant is a name prefix: tenant T's session, event id, ref or presence
 * namespace N is stored as T + ES_TENANT_SEP + N ("\x1f", a byte no tenant
 * name may hold). A tenant handle is a view, one of the three
 * implementations of the store interface (store_impl.h: its table is
 * tenant_ops), over the store it was made from (`base`: a core store or a
 * sharded one; it uses only the base's ops). Every call on it
 *   1. checks the caller's names as the store would (every byte counts:
 *      the 255-byte limit is the tenant's, not the prefix's),
 *   2. puts every name it is given behind the prefix (name_in), so nothing
 *      it can name lies outside the tenant,
 *   3. calls the base (with the prefix as the op's scope where an answer
 *      spans sessions or the store makes names: read_all, last_position,
 *      claim_next, dead_letters, pending_types, wait, counts, and the
 *      generated ids of append, complete and fork),
 *   4. strips the prefix from every name on the way out (events, sessions,
 *      refs, lineage, cursors, error messages), in place: es_event strings
 *      are each NUL-terminated (packed or not, rows.c), so shrinking one
 *      with memmove keeps every pointer valid.
 * Listings whose order is by name and that the base cannot scope (refs,
 * children) are read from the base page by page from where the tenant's
 * names start, stopping at the first name past them (page_*).
 *
 * A new store call needs one op here: name_in its names, call the
 * base, strip_* its answer, t_done its error.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/internal.h"
#include "store/listing.h"
#include "store/store.h"

/* A tenant view: an es_store (its impl is tenant_ops) and the store it
 * wraps. Of the es_store only impl, refs, the limits, the clock, the stats
 * and the presence watch list (pmu, watches) are used. */
typedef struct tenant {
  es_store h;        /* first: a tenant's es_store * is its tenant * */
  es_store *base;    /* retained: the store the view was made from */
  char *prefix;      /* owned: tenant name + ES_TENANT_SEP, then NUL and the name */
  size_t len;        /* strlen(prefix) */
  atomic_int closed; /* the view's own close() */
} tenant;

static tenant *T(const es_store *s) { return (tenant *)s; }
static es_store *B(const es_store *s) { return T(s)->base; }

/* A stored (prefixed) name: the tenant's prefix and a name of at most
 * ES_MAX_ID_BYTES. */
typedef struct {
  char v[ES_MAX_NAME_BYTES + 1];
} tname;

static int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

static int t_enter(es_store *s, es_err *err) {
  if (atomic_load(&T(s)->closed)) return es_fail(err, ES_CLOSED, "the tenant handle is closed");
  return ES_OK;
}

static int has_prefix(const es_store *s, const char *v) {
  return v && strncmp(v, T(s)->prefix, T(s)->len) == 0;
}

/* Checks a name given to the tenant handle (`what` names it in an error)
 * and puts it behind the prefix. */
static int name_in(const es_store *s, const char *what, const char *name, tname *out, es_err *err) {
  int rc = es_check_name(what, name, err);
  if (rc) return rc;
  size_t n = strlen(name);
  /* es_check_name leaves out a prefix-like start: here every byte is the
   * tenant's own. */
  if (n > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is %zu bytes, at most %d allowed", what, n,
                   ES_MAX_ID_BYTES);
  memcpy(out->v, T(s)->prefix, T(s)->len);
  memcpy(out->v + T(s)->len, name, n + 1);
  return ES_OK;
}

/* A bound of a listing (`after`, `prefix`: any string of at most
 * ES_MAX_ID_BYTES), behind the prefix. */
static int bound_in(const es_store *s, const char *what, const char *after, tname *out,
                    es_err *err) {
  size_t n = strlen(after);
  if (n > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is longer than %d bytes", what, ES_MAX_ID_BYTES);
  memcpy(out->v, T(s)->prefix, T(s)->len);
  memcpy(out->v + T(s)->len, after, n + 1);
  return ES_OK;
}

/* The scope of a cross-session call on the base: the prefix, then the
 * scope the call was given within the tenant (NULL: all of the tenant). */
static int scope_in(const es_store *s, const char *scope, tname *out, es_err *err) {
  return bound_in(s, "scope", scope ? scope : "", out, err);
}

/* Several names (read_states' sessions, claim_next's skip) behind the
 * prefix: *out (malloc'd, the caller frees it) holds n pointers and then
 * the names. what is a printf format for one name's label ("sessions[%zu]"). */
static int names_in(const es_store *s, const char *what, const char *const *names, size_t n,
                    char ***out, es_err *err) {
  *out = NULL;
  size_t bytes = n * sizeof(char *);
  for (size_t i = 0; i < n; i++) {
    char label[48];
    snprintf(label, sizeof label, what, i + 1);
    tname probe;
    int rc = name_in(s, label, names[i], &probe, err);
    if (rc) return rc;
    bytes += T(s)->len + strlen(names[i]) + 1;
  }
  char **v = malloc(bytes ? bytes : 1);
  if (!v) return nomem(err);
  char *p = (char *)(v + n);
  for (size_t i = 0; i < n; i++) {
    size_t k = strlen(names[i]);
    v[i] = p;
    memcpy(p, T(s)->prefix, T(s)->len);
    memcpy(p + T(s)->len, names[i], k + 1);
    p += T(s)->len + k + 1;
  }
  *out = v;
  return ES_OK;
}

/* A batch to append (or complete with) whose given ids are put behind the
 * prefix; ids left out are generated by the base behind it (the op's
 * scope). *out is one block (the caller frees it) holding the copies
 * and then the ids. */
static int batch_in(const es_store *s, const es_new_event *evs, size_t n, es_new_event **out,
                    es_err *err) {
  *out = NULL;
  if (n > B(s)->max_batch)
    return es_fail(err, ES_TOO_LARGE, "batch of %zu events, over the limit of %zu", n,
                   B(s)->max_batch);
  /* the given ids and (§3.10) key names go behind the prefix: a tenant's
   * data keys are its own, shredding one never reaches another tenant */
  size_t bytes = n * sizeof **out;
  for (size_t i = 0; i < n; i++) {
    const char *names[2] = {evs[i].id, evs[i].key};
    for (int f = 0; f < 2; f++) {
      if (!names[f]) continue;
      char label[48];
      snprintf(label, sizeof label, "events[%zu].%s", i + 1, f ? "key" : "id");
      tname probe;
      int rc = name_in(s, label, names[f], &probe, err);
      if (rc) return rc;
      bytes += T(s)->len + strlen(names[f]) + 1;
    }
  }
  es_new_event *v = malloc(bytes ? bytes : 1);
  if (!v) return nomem(err);
  char *p = (char *)(v + n);
  for (size_t i = 0; i < n; i++) {
    v[i] = evs[i];
    const char **fields[2] = {&v[i].id, &v[i].key};
    for (int f = 0; f < 2; f++) {
      if (!*fields[f]) continue;
      size_t k = strlen(*fields[f]);
      memcpy(p, T(s)->prefix, T(s)->len);
      memcpy(p + T(s)->len, *fields[f], k + 1);
      *fields[f] = p;
      p += T(s)->len + k + 1;
    }
  }
  *out = v;
  return ES_OK;
}

/* ---- the way out ------------------------------------------------------ */

/* Drops the prefix from a name in place. A name without it (only the root
 * handle can make one: e.g. a ref of this tenant pointing at a session of
 * another) is left whole. */
static void strip(const es_store *s, char *v) {
  if (has_prefix(s, v)) memmove(v, v + T(s)->len, strlen(v + T(s)->len) + 1);
}

static void strip_event(const es_store *s, es_event *e) {
  strip(s, e->id);
  strip(s, e->session);
  strip(s, e->origin_session);
  strip(s, e->key);
}

static void strip_events(const es_store *s, es_events *l) {
  for (size_t i = 0; l && i < l->n; i++) strip_event(s, &l->v[i]);
}

static void strip_lineage(const es_store *s, es_lineage *l) {
  strip(s, l->session);
  strip(s, l->parent);
}

static void strip_ref(const es_store *s, es_ref *r) {
  strip(s, r->name);
  strip(s, r->session);
  strip(s, r->parent);
}

/* Drops every copy of the prefix from a text, in place. */
static void strip_all(const es_store *s, char *m) {
  for (char *hit; m && (hit = strstr(m, T(s)->prefix));) {
    memmove(hit, hit + T(s)->len, strlen(hit + T(s)->len) + 1);
    m = hit;
  }
}

/* Every copy of the prefix leaves the message: the base names sessions,
 * ids and refs as stored. */
static int t_done(const es_store *s, int rc, es_err *err) {
  if (rc == ES_OK || !err) return rc;
  strip_all(s, err->msg);
  return rc;
}

/* ---- lifecycle -------------------------------------------------------- */

static const es_store_ops tenant_ops;

int es_tenant_open(es_store *s, const char *name, es_store **out, es_err *err) {
  *out = NULL;
  if (!name) return es_fail(err, ES_INVALID_ARGUMENT, "tenant name is required");
  size_t n = strlen(name);
  if (n == 0 || n > ES_MAX_TENANT_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "tenant name is %zu bytes, must be 1 to %d", n,
                   ES_MAX_TENANT_BYTES);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "tenant name holds the control byte 0x%02x (at byte %zu)",
                     (unsigned)(unsigned char)name[i], i + 1);
  int rc = es_check_name("tenant name", name, err); /* valid UTF-8 */
  if (rc) return rc;
  if ((rc = s->impl->check_open(s, err))) return rc; /* a closed store makes no tenant handles */
  tenant *t = calloc(1, sizeof *t);
  /* One block: the prefix "name\x1f", its NUL, then the name (for
   * es_store_tenant_name). */
  char *p = malloc(2 * n + 3);
  if (!t || !p) {
    free(t);
    free(p);
    return nomem(err);
  }
  memcpy(p, name, n);
  p[n] = ES_TENANT_SEP[0];
  p[n + 1] = '\0';
  memcpy(p + n + 2, name, n + 1);
  t->prefix = p;
  t->len = n + 1;
  es_store *h = &t->h;
  h->impl = &tenant_ops;
  h->stats_also = &s->stats; /* a tenant's calls count in its store's stats too */
  h->max_payload = s->max_payload;
  h->max_stored = s->max_stored;
  h->max_batch = s->max_batch;
  h->clock = s->clock; /* es_store_now: the store's clock */
  h->clock_ctx = s->clock_ctx;
  atomic_init(&h->refs, 1);
  atomic_init(&t->closed, 0);
  pthread_mutex_init(&h->pmu, NULL);
  h->next_token = 1;
  es_store_retain(s);
  t->base = s;
  *out = h;
  return ES_OK;
}

/* Tenants do not nest: a view's names are already behind one prefix. */
static int tenant_tenant(es_store *s, const char *name, es_store **out, es_err *err) {
  (void)s;
  (void)name;
  *out = NULL;
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "tenant() of a tenant handle: tenants do not nest (make it from the store)");
}

static const char *tenant_tenant_name(const es_store *s) { return T(s)->prefix + T(s)->len + 1; }

static int tenant_check_open(es_store *s, es_err *err) {
  int rc = t_enter(s, err);
  return rc ? rc : B(s)->impl->check_open(B(s), err);
}

/* Closing a tenant handle closes the handle only: the store and other
 * tenant handles go on. Calls in flight finish (they hold the base). */
static void tenant_close(es_store *s) { atomic_store(&T(s)->closed, 1); }

static void tenant_free(es_store *s) {
  /* Watches still registered (a caller that never unwatched) leave the
   * base before their records go. */
  presence_watch *w = s->watches;
  while (w) {
    presence_watch *next = w->next;
    es_store_presence_unwatch(B(s), w->token);
    free(w->ns);
    free(w);
    w = next;
  }
  pthread_mutex_destroy(&s->pmu);
  es_store_release(B(s));
  free(T(s)->prefix);
  es_stats_destroy(&s->stats); /* §3.12 */
  free(T(s));
}

/* The tenant's commits are its store's. */
static uint64_t tenant_version(es_store *s) { return es_store_version(B(s)); }

/* A tenant's ids are the store's, prefixed when stored (tenant_append
 * maps a given id in): the caller sees the unprefixed id. */
static int tenant_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  return es_store_new_id(B(s), out, err);
}

static int tenant_data_version(es_store *s, uint64_t *version, es_err *err) {
  *version = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = es_store_data_version(B(s), version, err);
  return t_done(s, rc, err);
}

/* ---- 3.1 append and read ---------------------------------------------- */

static int tenant_append(es_store *s, const char *scope, const char *session, const es_new_event *evs, size_t n,
                     int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err) {
  tname sc;
  tname ss;
  es_new_event *mine = NULL;
  if (out) memset(out, 0, sizeof *out);
  *pending = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = batch_in(s, evs, n, &mine, err);
  if (!rc)
    rc = B(s)->impl->append(B(s), sc.v, ss.v, mine, n, expected, fence, out, pending,
                        err);
  free(mine);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* §3.1 append_many: every session and id behind the prefix, in one call
 * of the base (so the batches still commit together). */
static int tenant_append_many(es_store *s, const char *scope, es_append_batch *v, size_t n,
                              es_err *err) {
  tname sc;
  size_t m = n ? n : 1;
  es_append_batch *mine = calloc(m, sizeof *mine);
  tname *ss = calloc(m, sizeof *ss);
  es_new_event **evs = calloc(m, sizeof *evs);
  int rc = t_enter(s, err);
  if (!rc && (!mine || !ss || !evs)) rc = nomem(err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  for (size_t i = 0; !rc && i < n; i++) {
    char label[48];
    snprintf(label, sizeof label, "batches[%zu].session", i + 1);
    rc = name_in(s, label, v[i].session, &ss[i], err);
    if (!rc) rc = batch_in(s, v[i].evs, v[i].n, &evs[i], err);
    mine[i] = v[i];
    mine[i].session = ss[i].v;
    mine[i].evs = evs[i];
  }
  if (!rc) rc = B(s)->impl->append_many(B(s), sc.v, mine, n, err);
  for (size_t i = 0; i < n && evs; i++) {
    if (!rc) {
      v[i].out = mine[i].out;
      v[i].pending = mine[i].pending;
      strip_events(s, &v[i].out);
    }
    free(evs[i]);
  }
  free(mine);
  free(ss);
  free(evs);
  return t_done(s, rc, err);
}

static int tenant_read(es_store *s, const char *session, int64_t after, int64_t through,
                   int64_t limit, es_events *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_read(B(s), ss.v, after, through, limit, out, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

static int tenant_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, int64_t *through_out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_events_page(B(s), ss.v, after, through, limit, out, through_out, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

static int tenant_head(es_store *s, const char *session, int64_t *head, es_err *err) {
  tname ss;
  *head = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_head(B(s), ss.v, head, err);
  return t_done(s, rc, err);
}

static int tenant_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out, es_err *err) {
  tname sc;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = B(s)->impl->read_all(B(s), sc.v, after, limit, out, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

static int tenant_read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                                  es_events *out, char ***cursors, es_err *err) {
  tname sc;
  memset(out, 0, sizeof *out);
  *cursors = NULL;
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = B(s)->impl->read_all_cursor(B(s), sc.v, cursor, limit, out, cursors, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* last_position: the highest position among the tenant's own events (a
 * tenant does not see how far other tenants have written): the base's,
 * scoped to the prefix. */
static int tenant_last_position(es_store *s, const char *scope, int64_t *position, es_err *err) {
  tname sc;
  *position = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = B(s)->impl->last_position(B(s), sc.v, position, err);
  return t_done(s, rc, err);
}

static int tenant_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err) {
  tname ss;
  es_event_init(out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_get(B(s), ss.v, index, out, err);
  if (!rc) strip_event(s, out);
  return t_done(s, rc, err);
}

/* ---- 3.2 dispatch ----------------------------------------------------- */

static int tenant_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                    es_events *out, int64_t *retry_at, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_claim(B(s), ss.v, o, outcome, out, retry_at, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

static int tenant_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms, int64_t limit,
                         const char *const *types, size_t n_types, const char *const *skip,
                         size_t n_skip, es_events *out, int64_t *retry_at, es_err *err) {
  tname sc;
  char **sk = NULL;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc && skip) rc = names_in(s, "skip[%zu]", skip, n_skip, &sk, err);
  if (!rc)
    rc = B(s)->impl->claim_next(B(s), sc.v, holder, ttl_ms, limit, types, n_types,
                            (const char *const *)sk, skip ? n_skip : 0, out, retry_at, err);
  free(sk);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

static int tenant_renew(es_store *s, const char *session, const char *holder,
                    const es_claim_ref *claims, size_t n, int64_t ttl_ms, int64_t expires_at,
                    es_renew_result *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_renew(B(s), ss.v, holder, claims, n, ttl_ms, expires_at, out, err);
  return t_done(s, rc, err);
}

static int tenant_release_claims(es_store *s, const char *session, const char *holder,
                             const es_claim_ref *claims, size_t n, es_renew_result *out,
                             es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_release_claims(B(s), ss.v, holder, claims, n, out, err);
  return t_done(s, rc, err);
}

static int tenant_complete_cancel(es_store *s, const char *scope, es_completion *c,
                                  es_events *out, es_err *err) {
  tname sc;
  tname ss;
  es_new_event *mine = NULL;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = name_in(s, "session", c->session, &ss, err);
  if (!rc) rc = batch_in(s, c->evs, c->n, &mine, err);
  if (!rc) {
    es_completion in = *c;
    in.session = ss.v;
    in.evs = mine;
    rc = B(s)->impl->complete_cancel(B(s), sc.v, &in, out, err);
    c->outcome = in.outcome;
  }
  free(mine);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* complete is complete_cancel without cancels: one path behind the prefix */
static int tenant_complete(es_store *s, const char *scope, const char *session, int64_t index,
                           int64_t attempt, const es_new_event *evs, size_t n, int64_t fence,
                           int *outcome, es_events *out, es_err *err) {
  es_completion c = {.session = session, .index = index, .attempt = attempt, .evs = evs, .n = n,
                     .fence = fence};
  int rc = tenant_complete_cancel(s, scope, &c, out, err);
  *outcome = c.outcome;
  return rc;
}

static int tenant_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                   const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                   int64_t *failures, es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc)
    rc = es_store_fail(B(s), ss.v, index, attempt, error, max_failures, retry_after_ms, outcome,
                       failures, err);
  return t_done(s, rc, err);
}

static int tenant_revive(es_store *s, const char *session, int64_t index, es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_revive(B(s), ss.v, index, err);
  return t_done(s, rc, err);
}

static int tenant_settle(es_store *s, const char *session, int64_t index, const char *reason,
                     es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_settle(B(s), ss.v, index, reason, err);
  return t_done(s, rc, err);
}

static int tenant_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                         es_event *out, es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_cancel(B(s), ss.v, index, reason, out, err);
  if (!rc && out) strip_event(s, out);
  return t_done(s, rc, err);
}

static int tenant_dead_letters(es_store *s, const char *scope, const char *session, int64_t after, int64_t limit,
                           es_events *out, es_err *err) {
  tname sc;
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc && session) rc = name_in(s, "session", session, &ss, err);
  if (!rc)
    rc = B(s)->impl->dead_letters(B(s), sc.v, session ? ss.v : NULL, after, limit, out,
                              err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* ---- 3.3 snapshots ---------------------------------------------------- */

static int tenant_read_state(es_store *s, const char *session, const char *reducer, int *found,
                         es_snapshot *snap, es_events *events, es_err *err) {
  tname ss;
  *found = 0;
  es_snapshot_init(snap);
  memset(events, 0, sizeof *events);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_read_state(B(s), ss.v, reducer, found, snap, events, err);
  if (!rc) strip_events(s, events);
  return t_done(s, rc, err);
}

static int tenant_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                          es_state_read *out, es_err *err) {
  char **mine = NULL;
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    es_snapshot_init(&out[i].snap);
  }
  int rc = t_enter(s, err);
  if (!rc) rc = es_check_name("reducer", reducer, err);
  /* The base's limit, said before a block for that many names is made. */
  if (!rc && n > ES_DEFAULT_MAX_BATCH)
    rc = es_fail(err, ES_TOO_LARGE, "%zu sessions, over the limit of %d", n, ES_DEFAULT_MAX_BATCH);
  if (!rc) rc = names_in(s, "sessions[%zu]", sessions, n, &mine, err);
  if (!rc) rc = es_store_read_states(B(s), (const char *const *)mine, n, reducer, out, err);
  free(mine);
  for (size_t i = 0; !rc && i < n; i++) strip_events(s, &out[i].events);
  return t_done(s, rc, err);
}

static int tenant_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                           const char *state, size_t state_len, const char *version, int *stored,
                           es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc)
    rc = es_store_put_snapshot(B(s), ss.v, reducer, index, state, state_len, version, stored,
                               err);
  return t_done(s, rc, err);
}

static int tenant_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_snapshots(B(s), ss.v, out, err);
  return t_done(s, rc, err);
}

/* ---- 3.4 inspection --------------------------------------------------- */

static int tenant_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                       es_sessions *out, es_err *err) {
  tname pre, aft;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = bound_in(s, "prefix", prefix ? prefix : "", &pre, err);
  if (!rc && after) rc = bound_in(s, "after", after, &aft, err);
  if (!rc) rc = es_store_sessions(B(s), pre.v, after ? aft.v : NULL, limit, out, err);
  for (size_t i = 0; !rc && i < out->n; i++) {
    strip(s, out->v[i].session);
    strip(s, out->v[i].parent);
  }
  if (!rc) strip(s, out->cursor);
  return t_done(s, rc, err);
}

/* §3.9 archived: the base's listing under this tenant's prefix, names
 * unprefixed (the cursor too). */
static int tenant_archived(es_store *s, const char *prefix, const char *after, int64_t limit,
                           es_archived *out, es_err *err) {
  tname pre, aft;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = bound_in(s, "prefix", prefix ? prefix : "", &pre, err);
  if (!rc && after) rc = bound_in(s, "after", after, &aft, err);
  if (!rc) rc = B(s)->impl->archived(B(s), pre.v, after ? aft.v : NULL, limit, out, err);
  for (size_t i = 0; !rc && i < out->n; i++) strip(s, out->v[i].session);
  if (!rc) strip(s, out->cursor);
  return t_done(s, rc, err);
}

static int tenant_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err) {
  tname sc;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = B(s)->impl->pending_types(B(s), sc.v, out, err);
  return t_done(s, rc, err);
}

/* §3.12: the tenant's counts, kept by the backend per scope (O(1)). */
static int tenant_counts(es_store *s, const char *scope, es_counts *out, es_err *err) {
  tname sc;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = B(s)->impl->counts(B(s), sc.v, out, err);
  return t_done(s, rc, err);
}

/* ---- 3.5 waiting ------------------------------------------------------ */

static int tenant_wait(es_store *s, const char *scope, const char *session, int64_t after, int64_t timeout_ms,
                   int64_t limit, es_events *out, es_err *err) {
  tname sc;
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc && session) rc = name_in(s, "session", session, &ss, err);
  if (!rc)
    rc = B(s)->impl->wait(B(s), sc.v, session ? ss.v : NULL, after, timeout_ms, limit,
                      out, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* ---- 3.6 presence ----------------------------------------------------- */

static int tenant_presence_set(es_store *s, const char *ns, const char *participant,
                           const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                           int64_t seen, es_presence_rows *applied, es_err *err) {
  tname nn;
  memset(applied, 0, sizeof *applied);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "namespace", ns, &nn, err);
  if (!rc)
    rc = es_store_presence_set(B(s), nn.v, participant, fields, n, ttl_ms, at, seen, applied,
                               err);
  return t_done(s, rc, err);
}

static int tenant_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err) {
  tname nn;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "namespace", ns, &nn, err);
  if (!rc) rc = es_store_presence_read(B(s), nn.v, out, err);
  return t_done(s, rc, err);
}

/* The base calls this (under its watch lock) with the stored namespace;
 * the tenant's watcher gets its own name. w lives until the base's watch
 * is gone (tenant_presence_unwatch removes that first). */
static void on_tenant_presence(void *ctx, const char *ns, const es_presence_rows *applied) {
  presence_watch *w = ctx;
  (void)ns;
  w->cb(w->ctx, w->ns, applied);
}

static uint64_t tenant_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx) {
  tname nn;
  if (atomic_load(&T(s)->closed) || name_in(s, "namespace", ns, &nn, NULL)) return 0;
  presence_watch *w = calloc(1, sizeof *w);
  if (!w || !(w->ns = strdup(ns))) {
    free(w);
    return 0;
  }
  w->cb = cb;
  w->ctx = ctx;
  /* The base's token names the watch here too: tokens are unique per
   * base, and only the ones in this handle's list can be removed through
   * it. */
  pthread_mutex_lock(&s->pmu);
  w->token = es_store_presence_watch(B(s), nn.v, on_tenant_presence, w);
  if (w->token) {
    w->next = s->watches;
    s->watches = w;
  }
  pthread_mutex_unlock(&s->pmu);
  uint64_t token = w->token;
  if (!token) {
    free(w->ns);
    free(w);
  }
  return token;
}

static void tenant_presence_unwatch(es_store *s, uint64_t token) {
  presence_watch *w = NULL;
  pthread_mutex_lock(&s->pmu);
  for (presence_watch **p = &s->watches; *p; p = &(*p)->next) {
    if ((*p)->token == token) {
      w = *p;
      *p = w->next;
      break;
    }
  }
  pthread_mutex_unlock(&s->pmu);
  if (!w) return; /* not this handle's watch: another tenant's token does nothing */
  es_store_presence_unwatch(B(s), token); /* no callback with w runs after it */
  free(w->ns);
  free(w);
}

/* ---- 3.7 branches ----------------------------------------------------- */

static int tenant_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to, es_lineage *out,
                   es_err *err) {
  tname sc;
  tname f, t;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = scope_in(s, scope, &sc, err);
  if (!rc) rc = name_in(s, "from", from, &f, err);
  if (!rc) rc = name_in(s, "to", to, &t, err);
  if (!rc) rc = B(s)->impl->fork(B(s), sc.v, f.v, at, t.v, out, err);
  if (!rc) strip_lineage(s, out);
  return t_done(s, rc, err);
}

static int tenant_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err) {
  tname ss;
  *found = 0;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_lineage(B(s), ss.v, found, out, err);
  if (!rc && *found) strip_lineage(s, out);
  return t_done(s, rc, err);
}

/* Where a listing in name order starts for this tenant: after `after`
 * behind the prefix, or (no after) after the tenant's bare name, which
 * sorts before every name behind the prefix (and past only names the
 * root handle may have made, like "t\x01x", which page_keep skips). */
static int page_start(const es_store *s, const char *after, tname *out, es_err *err) {
  if (after) return bound_in(s, "after", after, out, err);
  memcpy(out->v, T(s)->prefix, T(s)->len - 1);
  out->v[T(s)->len - 1] = '\0';
  return ES_OK;
}

/* A name read from the base in byte order: 1 keep it (the tenant's), 0
 * skip it (before the tenant's names), -1 stop (past them). */
static int page_keep(const es_store *s, const char *name) {
  if (has_prefix(s, name)) return 1;
  return strcmp(name, T(s)->prefix) < 0 ? 0 : -1;
}

/* The listings the base cannot scope (children, refs) are read from the
 * base page by page from where the tenant's names start (or the caller's
 * `after`), keeping the tenant's names and stopping at the first name
 * past them (listing.h es_list_page_through). */
typedef struct {
  es_store *s;
  const char *key; /* children: the session */
} page_ctx;

static int keep_name(void *ctx, const char *name) { return page_keep(((page_ctx *)ctx)->s, name); }

static int page_through(es_store *s, const char *key, const char *after, int64_t limit,
                        const es_list_kind *kind, es_list_page_fn fetch, es_list *out,
                        es_err *err) {
  tname from;
  int rc = page_start(s, after, &from, err);
  if (!rc && limit < 1) rc = es_fail(err, ES_INVALID_ARGUMENT, "limit must be a positive integer");
  page_ctx c = {s, key};
  if (!rc) rc = es_list_page_through(kind, fetch, keep_name, &c, from.v, limit, out, err);
  return rc;
}

static void lineage_free(void *e) { es_lineage_destroy(e); }
static const es_list_kind lineage_kind = {sizeof(es_lineage), offsetof(es_lineage, session),
                                          lineage_free};

static int children_page(void *ctx, const char *after, int64_t limit, es_list *page,
                         es_err *err) {
  page_ctx *c = ctx;
  return es_store_children(B(c->s), c->key, after, limit, (es_lineages *)page, err);
}

static int tenant_children(es_store *s, const char *session, const char *after, int64_t limit,
                           es_lineages *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc)
    rc = page_through(s, ss.v, after, limit, &lineage_kind, children_page, (es_list *)out, err);
  for (size_t i = 0; !rc && i < out->n; i++) strip_lineage(s, &out->v[i]);
  return t_done(s, rc, err);
}

static int tenant_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
                      es_err *err) {
  tname nn, ss;
  es_ref_init(out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "name", name, &nn, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_put_ref(B(s), nn.v, ss.v, out, err);
  if (!rc) strip_ref(s, out);
  return t_done(s, rc, err);
}

static int tenant_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
  tname nn;
  *found = 0;
  es_ref_init(out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "name", name, &nn, err);
  if (!rc) rc = es_store_get_ref(B(s), nn.v, found, out, err);
  if (!rc && *found) strip_ref(s, out);
  return t_done(s, rc, err);
}

static void ref_free(void *e) { es_ref_destroy(e); }
static const es_list_kind ref_kind = {sizeof(es_ref), offsetof(es_ref, name), ref_free};

static int refs_page(void *ctx, const char *after, int64_t limit, es_list *page, es_err *err) {
  page_ctx *c = ctx;
  return es_store_list_refs(B(c->s), after, limit, (es_refs *)page, err);
}

static int tenant_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out,
                            es_err *err) {
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc)
    rc = page_through(s, NULL, after, limit, &ref_kind, refs_page, (es_list *)out, err);
  for (size_t i = 0; !rc && i < out->n; i++) strip_ref(s, &out->v[i]);
  return t_done(s, rc, err);
}

static int tenant_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  tname nn;
  *deleted = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "name", name, &nn, err);
  if (!rc) rc = es_store_delete_ref(B(s), nn.v, deleted, err);
  return t_done(s, rc, err);
}

static int tenant_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                      const char *expect, es_ref *out, char **actual, es_err *err) {
  tname f, t, e;
  es_ref_init(out);
  if (actual) *actual = NULL;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "from_ref", from_ref, &f, err);
  if (!rc) rc = name_in(s, "to_ref", to_ref, &t, err);
  if (!rc && has_expect && expect) rc = name_in(s, "expect", expect, &e, err);
  if (!rc)
    rc = es_store_promote(B(s), f.v, t.v, has_expect, has_expect && expect ? e.v : NULL, out,
                          actual, err);
  if (!rc) strip_ref(s, out);
  if (actual) strip(s, *actual); /* REF_CONFLICT's actual, also when rc says so */
  return t_done(s, rc, err);
}

/* ---- 3.8 fences, leases, seals; 3.9 retention ------------------------- */

static int tenant_fence(es_store *s, const char *session, int64_t if_token, int64_t *token,
                    es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_fence(B(s), ss.v, if_token, token, err);
  return t_done(s, rc, err);
}

static int tenant_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                    es_lease *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_lease(B(s), ss.v, holder, ttl_ms, out, err);
  return t_done(s, rc, err);
}

static int tenant_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                            int *released, es_err *err) {
  tname ss;
  *released = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_lease_release(B(s), ss.v, holder, token, released, err);
  return t_done(s, rc, err);
}

static int tenant_seal(es_store *s, const char *session, const char *reason, es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_seal(B(s), ss.v, reason, err);
  return t_done(s, rc, err);
}

static int tenant_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                       es_err *err) {
  tname ss;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_truncate(B(s), ss.v, through, first_index, err);
  return t_done(s, rc, err);
}

static int tenant_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  tname ss;
  *deleted = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_delete(B(s), ss.v, deleted, err);
  return t_done(s, rc, err);
}

/* ---- archive (§3.9) ----------------------------------------------------- */

/* Segment rows and files name no session (files are under a hash of the
 * stored name), so only the session goes in. */

static int tenant_archive(es_store *s, const char *session, int64_t through, int *written,
                      es_segment *out, es_err *err) {
  tname ss;
  *written = 0;
  es_segment_init(out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_archive(B(s), ss.v, through, written, out, err);
  return t_done(s, rc, err);
}

static int tenant_segments(es_store *s, const char *session, es_segments *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_segments(B(s), ss.v, out, err);
  return t_done(s, rc, err);
}

static int tenant_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                              es_err *err) {
  tname ss;
  *before = *after = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_compact_archive(B(s), ss.v, before, after, err);
  return t_done(s, rc, err);
}

static void strip_problems(const es_store *s, es_archive_problem *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    strip(s, v[i].session);
    strip_all(s, v[i].problem); /* "... (session 'T\x1fname', ...)" */
  }
}

/* Moves the entries of one session's report to the end of *dst. */
static int take_problems(es_archive_problem **dst, size_t *n, size_t *cap, es_archive_problem *src,
                         size_t k) {
  if (k == 0) return ES_OK;
  if (es_grow((void **)dst, cap, *n + k, sizeof **dst)) return ES_STORAGE;
  memcpy(*dst + *n, src, k * sizeof *src);
  *n += k;
  return ES_OK;
}

/* Without a session: every session of the tenant that has archived events,
 * one by one (the base's all-sessions form would look at other tenants'
 * files). Orphan directories that no session owns are the operator's to
 * see, from the root handle. */
static int tenant_verify_archive(es_store *s, const char *session, es_archive_report *out,
                             es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (rc) return rc;
  if (session) {
    if (!(rc = name_in(s, "session", session, &ss, err)))
      rc = es_store_verify_archive(B(s), ss.v, out, err);
  } else {
    char *after = NULL;
    do {
      es_sessions page;
      rc = es_store_sessions(B(s), T(s)->prefix, after, 100, &page, err);
      free(after);
      after = NULL;
      if (rc) break;
      for (size_t i = 0; rc == ES_OK && i < page.n; i++) {
        if (page.v[i].archived_through <= 0) continue;
        es_archive_report one;
        rc = es_store_verify_archive(B(s), page.v[i].session, &one, err);
        if (rc) break;
        out->checked += one.checked;
        /* each list moved over belongs to out from then on: one keeps only
         * what was not moved, so an out-of-memory frees nothing twice */
        if (take_problems(&out->problems, &out->n_problems, &out->cap_problems, one.problems,
                          one.n_problems) == ES_OK)
          one.n_problems = 0;
        if (take_problems(&out->orphans, &out->n_orphans, &out->cap_orphans, one.orphans,
                          one.n_orphans) == ES_OK)
          one.n_orphans = 0;
        int lost = one.n_problems || one.n_orphans;
        es_archive_report_destroy(&one);
        if (lost) {
          rc = nomem(err);
          break;
        }
      }
      if (rc == ES_OK && page.cursor && !(after = strdup(page.cursor))) rc = nomem(err);
      es_sessions_destroy(&page);
    } while (rc == ES_OK && after);
    free(after);
  }
  if (rc) es_archive_report_destroy(out);
  else {
    strip_problems(s, out->problems, out->n_problems);
    strip_problems(s, out->orphans, out->n_orphans);
  }
  return t_done(s, rc, err);
}

/* ---- crypto-shredding (§3.10) ------------------------------------------ */

/* A tenant's key names are stored behind its prefix (batch_in). */
static int tenant_shred(es_store *s, const char *name, int *was_live, es_err *err) {
  tname k;
  *was_live = 0;
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "key", name, &k, err);
  if (!rc) rc = es_store_shred(B(s), k.v, was_live, err);
  return t_done(s, rc, err);
}

static int tenant_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                           int64_t limit, es_events *out, es_err *err) {
  tname ss;
  memset(out, 0, sizeof *out);
  int rc = t_enter(s, err);
  if (!rc) rc = name_in(s, "session", session, &ss, err);
  if (!rc) rc = es_store_read_at_rest(B(s), ss.v, after, through, limit, out, err);
  if (!rc) strip_events(s, out);
  return t_done(s, rc, err);
}

/* §3.1: the store's capabilities, with this view's tenant. */
static int tenant_capabilities(es_store *s, es_capabilities *out, es_err *err) {
  int rc = t_enter(s, err);
  if (!rc) rc = es_store_capabilities(B(s), out, err);
  if (!rc) out->tenant = tenant_tenant_name(s);
  return t_done(s, rc, err);
}

/* ---- the table (store_impl.h) ----------------------------------------- */

/* ---- §8 projections: the tenant's keys, behind its prefix ---------------- */

static int tenant_projection_read(es_store *s, const char *scope, const char *name, const char *key,
                                  int64_t gen, char **value, size_t *len, es_projection *info, es_err *err) {
  (void)scope; /* a view's keys are its tenant's */
  int rc = t_enter(s, err);
  if (!rc) rc = B(s)->impl->projection_read(B(s), T(s)->prefix, name, key, gen, value, len, info, err);
  return t_done(s, rc, err);
}

static int tenant_projection_keys(es_store *s, const char *scope, const char *name,
                                  const char *prefix, const char *after, int64_t limit,
                                  es_proj_keys *out, es_err *err) {
  (void)scope;
  int rc = t_enter(s, err);
  if (!rc)
    rc = B(s)->impl->projection_keys(B(s), T(s)->prefix, name, prefix, after, limit, out, err);
  return t_done(s, rc, err);
}

static int tenant_projections(es_store *s, const char *name, es_projections *out, es_err *err) {
  int rc = t_enter(s, err);
  if (!rc) rc = B(s)->impl->projections(B(s), name, out, err);
  return t_done(s, rc, err);
}

static int tenant_projection_commit(es_store *s, const char *scope, const es_projection *next,
                                    int64_t expect_seq, int64_t ttl_ms, int64_t gen,
                                    const es_proj_state *states, size_t n, es_projection *out,
                                    es_err *err) {
  (void)scope;
  int rc = t_enter(s, err);
  /* the base refuses a scope: a tenant never writes another's keys */
  if (!rc)
    rc = B(s)->impl->projection_commit(B(s), T(s)->prefix, next, expect_seq, ttl_ms, gen, states,
                                       n, out, err);
  return t_done(s, rc, err);
}

static int tenant_projection_control(es_store *s, const char *scope, const char *name,
                                     const char *action, es_projection *out, es_err *err) {
  (void)scope;
  int rc = t_enter(s, err);
  if (!rc) rc = B(s)->impl->projection_control(B(s), T(s)->prefix, name, action, out, err);
  return t_done(s, rc, err);
}

static const es_store_ops tenant_ops = {
    .close = tenant_close,
    .free = tenant_free,
    .check_open = tenant_check_open,
    .version = tenant_version,
    .data_version = tenant_data_version,
    .new_id = tenant_new_id,
    .tenant = tenant_tenant,
    .tenant_name = tenant_tenant_name,
    .append = tenant_append,
    .append_many = tenant_append_many,
    .read = tenant_read,
    .events_page = tenant_events_page,
    .head = tenant_head,
    .read_all = tenant_read_all,
    .read_all_cursor = tenant_read_all_cursor,
    .last_position = tenant_last_position,
    .get = tenant_get,
    .claim = tenant_claim,
    .claim_next = tenant_claim_next,
    .renew = tenant_renew,
    .release_claims = tenant_release_claims,
    .complete = tenant_complete,
    .complete_many = es_complete_many_each,
    .complete_cancel = tenant_complete_cancel,
    .fail = tenant_fail,
    .revive = tenant_revive,
    .settle = tenant_settle,
    .cancel = tenant_cancel,
    .dead_letters = tenant_dead_letters,
    .read_state = tenant_read_state,
    .read_states = tenant_read_states,
    .put_snapshot = tenant_put_snapshot,
    .snapshots = tenant_snapshots,
    .sessions = tenant_sessions,
    .pending_types = tenant_pending_types,
    .wait = tenant_wait,
    .presence_set = tenant_presence_set,
    .presence_read = tenant_presence_read,
    .presence_watch = tenant_presence_watch,
    .presence_unwatch = tenant_presence_unwatch,
    .fork = tenant_fork,
    .lineage = tenant_lineage,
    .children = tenant_children,
    .put_ref = tenant_put_ref,
    .get_ref = tenant_get_ref,
    .list_refs = tenant_list_refs,
    .delete_ref = tenant_delete_ref,
    .promote = tenant_promote,
    .fence = tenant_fence,
    .lease = tenant_lease,
    .lease_release = tenant_lease_release,
    .seal = tenant_seal,
    .truncate = tenant_truncate,
    .delete = tenant_delete,
    .archive = tenant_archive,
    .segments = tenant_segments,
    .archived = tenant_archived,
    .compact_archive = tenant_compact_archive,
    .verify_archive = tenant_verify_archive,
    .shred = tenant_shred,
    .read_at_rest = tenant_read_at_rest,
    .counts = tenant_counts,
    .capabilities = tenant_capabilities,
    .projection_read = tenant_projection_read,
    .projection_keys = tenant_projection_keys,
    .projections = tenant_projections,
    .projection_commit = tenant_projection_commit,
    .projection_control = tenant_projection_control,
};
