/*
 * shards.c: sharded stores (docs/contract.md §5, docs/sharding.md).
 *
 * A sharded handle is the router, one of the three implementations of
 * the store interface (store_impl.h: its table is shards_ops): every
 * es_store_* call on it lands here and
 *   - a call about one session goes to the shard that owns the session
 *     (rendezvous hashing of its name over the plan's shard names), and is
 *     retried on another shard when that shard answers ES_MOVED;
 *   - a call that spans sessions asks every shard and merges the answers.
 *
 * Plan changes move sessions online. The markers a move leaves live in the
 * shards themselves (session rows no user can write: a negative fence, and
 * a row named "", a name es_check_name refuses), and every store checks
 * them in its backend lookups (es_shards_wrap_ops: the marker-checking
 * backend every store's own backend is wrapped in): a session moved away,
 * being moved in, or that a shard's plan record says belongs elsewhere
 * answers ES_MOVED inside the very transaction of the call, so a handle
 * holding an old plan can never write to a session's old home.
 *
 * A move of session X from shard A to shard B (move_one):
 *   (a) on B: an "incoming" row for X (fence -2): calls on B answer
 *       ES_MOVED with no target (wait and retry);
 *   (b) on A, one write: X's row is frozen (fence -1000 - fence) and each
 *       of its unprocessed events is taken out of the dispatch queue with
 *       its queue state kept in `returned` (encode_frozen), so A answers
 *       ES_MOVED for X and claim_next on A no longer returns its events;
 *   (c) read every row of X from A; on B, in one write that first checks
 *       the row is still incoming, insert them (same ids and dispatch
 *       records, new positions; sealed payloads sealed again under B's
 *       data key, segment files copied into B's directory before) and X's
 *       row;
 *   (d) on A, drop X's rows and keep a tombstone row (fence -1).
 * Each step checks the state it expects, so a move interrupted anywhere is
 * finished by running it again (and two movers at once do it once).
 *
 * Where the parts live: shard_plan.c (hashing, plans, the catalog),
 * shard_marks.c (the markers and the marker-checking backend), this file
 * (the handle, routing, the calls about one session, the table),
 * shard_lists.c (the calls that span sessions, read_all cursors),
 * shard_moves.c (plan changes, fork); shards_internal.h is what they
 * share (the router's ops defined outside this file are es_sh_*).
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "codec/json.h"
#include "store/internal.h"
#include "store/listing.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store.h"
#include "util/buf.h"

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* ---- the handle --------------------------------------------------------- */

/* ---- §8 projections: all in the catalog store -----------------------------
 * A projection folds every shard's events into one read model: its
 * record and states live in the catalog, so a batch commits in one
 * transaction there whatever shards its events came from; the checkpoint
 * is a read_all cursor. */

#define CAT(s) (SH(s)->catalog)

static int shards_projection_read(es_store *s, const char *scope, const char *name,
                                  const char *key, int64_t gen, char **value, size_t *len, es_projection *info,
                                  es_err *err) {
  return CAT(s)->impl->projection_read(CAT(s), scope, name, key, gen, value, len, info, err);
}

static int shards_projection_keys(es_store *s, const char *scope, const char *name,
                                  const char *prefix, const char *after, int64_t limit,
                                  es_proj_keys *out, es_err *err) {
  return CAT(s)->impl->projection_keys(CAT(s), scope, name, prefix, after, limit, out, err);
}

static int shards_projections(es_store *s, const char *name, es_projections *out, es_err *err) {
  return CAT(s)->impl->projections(CAT(s), name, out, err);
}

static int shards_projection_commit(es_store *s, const char *scope, const es_projection *next,
                                    int64_t expect_seq, int64_t ttl_ms, int64_t gen,
                                    const es_proj_state *states, size_t n, es_projection *out,
                                    es_err *err) {
  return CAT(s)->impl->projection_commit(CAT(s), scope, next, expect_seq, ttl_ms, gen, states, n,
                                         out, err);
}

static int shards_projection_control(es_store *s, const char *scope, const char *name,
                                     const char *action, es_projection *out, es_err *err) {
  return CAT(s)->impl->projection_control(CAT(s), scope, name, action, out, err);
}

static const es_store_ops shards_ops;



int es_store_is_sharded(const es_store *s) { return s && s->impl == &shards_ops; }

void es_shards_set_crash_after(es_store *s, int64_t steps) {
  if (es_store_is_sharded(s)) atomic_store(&SH(s)->crash_after, steps);
}

void es_shards_set_pause_after(es_store *s, int64_t steps, const char *gate) {
  if (!es_store_is_sharded(s)) return;
  pthread_mutex_lock(&SH(s)->mu);
  free(SH(s)->pause_path);
  SH(s)->pause_path = gate ? strdup(gate) : NULL;
  atomic_store(&SH(s)->pause_after, SH(s)->pause_path ? steps : 0);
  pthread_mutex_unlock(&SH(s)->mu);
}

static int file_exists(const char *path) {
  FILE *f = fopen(path, "r");
  if (f) fclose(f);
  return f != NULL;
}

/* The pause hook: before its nth step the mover creates GATE.paused and
 * waits (at most 120 s) until GATE exists, as a slow process would. */
static void maybe_pause(es_store *s) {
  struct es_shards *sh = SH(s);
  long long left = atomic_load(&sh->pause_after);
  if (left <= 0) return;
  atomic_store(&sh->pause_after, left - 1);
  if (left != 1) return;
  pthread_mutex_lock(&sh->mu);
  char *gate = sh->pause_path ? strdup(sh->pause_path) : NULL;
  pthread_mutex_unlock(&sh->mu);
  if (!gate) return;
  es_buf b;
  es_buf_init(&b);
  if (es_buf_addf(&b, "%s.paused", gate) == ES_OK && es_buf_addc(&b, '\0') == ES_OK) {
    FILE *f = fopen(b.data, "w");
    if (f) fclose(f);
  }
  es_buf_destroy(&b);
  for (int i = 0; i < 12000 && !file_exists(gate); i++) sleep_ms(10);
  free(gate);
}

/* The test hooks: count a step of a plan change. */
int es_sh_step(es_store *s, es_err *err) {
  maybe_pause(s);
  long long left = atomic_load(&SH(s)->crash_after);
  if (left <= 0) return ES_OK;
  if (left == 1) {
    atomic_store(&SH(s)->crash_after, -1); /* stays "crashed" until reset */
    return es_fail(err, ES_STORAGE, "simulated crash in the middle of a shard move");
  }
  atomic_store(&SH(s)->crash_after, left - 1);
  return ES_OK;
}

int es_sh_crashed(es_store *s, es_err *err) {
  if (atomic_load(&SH(s)->crash_after) < 0)
    return es_fail(err, ES_STORAGE, "simulated crash in the middle of a shard move");
  return ES_OK;
}

/* The store of shard `name` at `url`, opened at first use. */
int es_sh_shard_store(es_store *s, const char *name, const char *url, es_store **out,
                      es_err *err) {
  struct es_shards *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  /* close() closes the stores it finds under mu: a store opened after
   * that would never be closed */
  if (atomic_load(&sh->closed)) {
    pthread_mutex_unlock(&sh->mu);
    return es_fail(err, ES_CLOSED, "the store is closed");
  }
  for (conn *c = sh->conns; c; c = c->next)
    if (strcmp(c->name, name) == 0 && strcmp(c->url, url) == 0) {
      *out = c->st;
      pthread_mutex_unlock(&sh->mu);
      return ES_OK;
    }
  conn *c = calloc(1, sizeof *c);
  int rc = c ? ES_OK : nomem(err);
  if (rc == ES_OK) {
    c->name = strdup(name);
    c->url = strdup(url);
    if (!c->name || !c->url) rc = nomem(err);
  }
  char *archive = NULL;
  if (rc == ES_OK && sh->archive_root && !(archive = es_sh_archive_dir(sh->archive_root, name)))
    rc = nomem(err);
  if (rc == ES_OK) {
    /* each shard is a full store: the catalog's options, and the keys
     * and an archive directory of its own (docs/sharding.md "Keys and
     * archive") */
    es_open_opts o = sh->opts;
    o.keys_path = sh->keys_path;
    o.archive_dir = archive;
    rc = es_store_open(url, &o, &c->st, err);
    if (rc && err) {
      char why[ES_ERRMSG_MAX];
      memcpy(why, err->msg, sizeof why);
      es_fail(err, rc, "shard '%s': %s", name, why);
    }
  }
  free(archive);
  if (rc == ES_OK) {
    c->next = sh->conns;
    sh->conns = c;
    *out = c->st;
  } else if (c) {
    free(c->name);
    free(c->url);
    free(c);
  }
  pthread_mutex_unlock(&sh->mu);
  return rc;
}

/* Shard `name`'s directory below the archive directory: the name's bytes
 * kept when they are letters, digits, '-', '_' or a '.' that is not the
 * first, each other byte written %XX (a name may hold '/', or be "..").
 * The name and not the url: a shard moved to another url (same name,
 * docs/sharding.md) keeps its segments. */
static int add_shard_dir(es_buf *b, const char *name) {
  int bad = 0;
  for (const unsigned char *p = (const unsigned char *)name; !bad && *p; p++) {
    int keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               *p == '-' || *p == '_' || (*p == '.' && p != (const unsigned char *)name);
    bad = keep ? es_buf_addc(b, (char)*p) : es_buf_addf(b, "%%%02X", *p);
  }
  return bad;
}

/* Where shard `name` keeps its segment files: root/DIR (add_shard_dir).
 * NULL: out of memory. */
char *es_sh_archive_dir(const char *root, const char *name) {
  es_buf b;
  es_buf_init(&b);
  if (es_buf_adds(&b, root) || es_buf_addc(&b, '/') || add_shard_dir(&b, name) ||
      es_buf_addc(&b, '\0')) {
    es_buf_destroy(&b);
    return NULL;
  }
  return b.data;
}

/* A segment file's path as the shard store st gives it (relative to its
 * own archive directory) made relative to the router's archive directory:
 * DIR/ in front, so a caller joins it to the directory it opened the
 * store with, as on one store. Unchanged when the router has no archive
 * directory (each sqlite: shard keeps its default, PATH.archive). */
int es_sh_segment_path(es_store *s, es_store *st, char **file, es_err *err) {
  struct es_shards *sh = SH(s);
  if (!sh->archive_root || !*file) return ES_OK;
  const char *name = NULL;
  pthread_mutex_lock(&sh->mu);
  for (conn *c = sh->conns; c && !name; c = c->next)
    if (c->st == st) name = c->name; /* conns and their names stay until the handle goes */
  pthread_mutex_unlock(&sh->mu);
  if (!name) return ES_OK;
  es_buf b;
  es_buf_init(&b);
  if (add_shard_dir(&b, name) || es_buf_addc(&b, '/') || es_buf_adds(&b, *file) ||
      es_buf_addc(&b, '\0')) {
    es_buf_destroy(&b);
    return nomem(err);
  }
  free(*file);
  *file = b.data;
  return ES_OK;
}

/* Adopts the catalog's plans (a copy kept until the handle goes). */
int es_sh_adopt(es_store *s, catalog_view *v, es_err *err) {
  struct es_shards *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  int rc = ES_OK;
  es_shard_plan *src[2] = {&v->cur, &v->pend};
  const es_shard_plan **dst[2] = {&sh->cur, &sh->pend};
  for (int i = 0; i < 2; i++) {
    const es_shard_plan *have = *dst[i];
    if (src[i]->version == 0) {
      if (i == 1) sh->pend = NULL;
      continue;
    }
    if (have && have->version == src[i]->version) continue;
    if (i == 0 && have && have->version > src[i]->version) continue; /* never go back */
    plan_node *n = calloc(1, sizeof *n);
    if (!n) {
      rc = nomem(err);
      break;
    }
    n->p = *src[i];
    memset(src[i], 0, sizeof *src[i]);
    n->next = sh->plans;
    sh->plans = n;
    *dst[i] = &n->p;
  }
  if (sh->pend && sh->cur && sh->pend->version <= sh->cur->version) sh->pend = NULL;
  sh->refreshed_ms = mono_ms();
  pthread_mutex_unlock(&sh->mu);
  return rc;
}

/* Reads the catalog and adopts what it says. */
int es_sh_reload(es_store *s, es_err *err) {
  catalog_view v;
  int rc = es_sh_catalog_load(SH(s)->catalog, &v, err);
  if (rc == ES_OK && v.cur.version == 0)
    rc = es_fail(err, ES_NOT_FOUND, "the shard catalog holds no plan");
  if (rc == ES_OK) rc = es_sh_adopt(s, &v, err);
  es_sh_view_destroy(&v);
  return rc;
}

/* For calls that span sessions: the catalog is read again when it was
 * not for a while (another process may have changed the plan). */
static int refresh(es_store *s, es_err *err) {
  struct es_shards *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  int stale = mono_ms() - sh->refreshed_ms >= PLAN_REFRESH_MS;
  pthread_mutex_unlock(&sh->mu);
  return stale ? es_sh_reload(s, err) : ES_OK;
}

static void plans_now(es_store *s, const es_shard_plan **cur, const es_shard_plan **pend) {
  pthread_mutex_lock(&SH(s)->mu);
  *cur = SH(s)->cur;
  if (pend) *pend = SH(s)->pend;
  pthread_mutex_unlock(&SH(s)->mu);
}


int es_sh_all_shards(es_store *s, shard_set *set, es_err *err) {
  int rc = refresh(s, err);
  if (rc) return rc;
  const es_shard_plan *cur, *pend;
  plans_now(s, &cur, &pend);
  set->n = 0;
  const es_shard_plan *ps[2] = {cur, pend};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; ps[k] && i < ps[k]->n; i++) {
      const es_shard_def *d = &ps[k]->v[i];
      int dup = 0;
      for (size_t j = 0; j < set->n; j++) dup |= strcmp(set->name[j], d->name) == 0;
      if (dup) continue;
      if ((rc = es_sh_shard_store(s, d->name, d->url, &set->st[set->n], err))) return rc;
      set->name[set->n++] = d->name;
    }
  }
  return ES_OK;
}

/* ---- routing -------------------------------------------------------------- */


/* The store for a call about `key` (a session, or a presence namespace). */
int es_sh_route_store(es_store *s, const char *what, const char *key, route *r, es_store **st,
                      es_err *err) {
  int rc = sh_enter(s, err);
  if (rc) return rc;
  if (!key) return es_fail(err, ES_INVALID_ARGUMENT, "%s is required", what);
  if ((rc = es_check_name(what, key, err))) return rc;
  if (strcmp(what, "namespace") != 0 && strcmp(key, CATALOG_SESSION) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "%s name '%s' is reserved on a sharded store (the catalog's plans)", what, key);
  const es_shard_plan *cur, *pend;
  plans_now(s, &cur, &pend);
  const es_shard_def *d = NULL;
  if (r->has_target) {
    d = es_sh_plan_find(pend, r->target);
    if (!d) d = es_sh_plan_find(cur, r->target);
    if (!d && (rc = es_sh_reload(s, err)) == ES_OK) {
      plans_now(s, &cur, &pend);
      d = es_sh_plan_find(pend, r->target);
      if (!d) d = es_sh_plan_find(cur, r->target);
    }
    if (rc) return rc;
    if (!d)
      return es_fail(err, ES_STORAGE, "%s '%s' moved to shard '%s', which no plan names", what, key,
                     r->target);
  } else {
    d = &cur->v[es_shard_owner(cur, key)];
  }
  return es_sh_shard_store(s, d->name, d->url, st, err);
}

/* After a routed call: 1 to run it again elsewhere (ES_MOVED), else 0
 * with *rc final (ES_MOVED never leaves a sharded handle). */
int es_sh_route_again(es_store *s, route *r, int *rc, es_err *err) {
  if (*rc != ES_MOVED) return 0;
  const char *target = es_shards_moved_target(err);
  const es_shard_plan *pc;
  plans_now(s, &pc, NULL);
  int64_t before = pc ? pc->version : 0;
  es_err rerr = {0};
  int r2 = es_sh_reload(s, &rerr);
  if (r2) {
    if (err) *err = rerr;
    *rc = r2;
    return 0;
  }
  plans_now(s, &pc, NULL);
  int64_t after = pc->version;
  if (++r->redirects > MAX_REDIRECTS && target) {
    *rc = es_fail(err, ES_STORAGE, "a session kept moving between shards: try again");
    return 0;
  }
  if (after > before) {
    r->has_target = 0; /* the new plan knows where it lives */
  } else if (target) {
    snprintf(r->target, sizeof r->target, "%s", target);
    r->has_target = 1;
  } else {
    /* being moved in: wait for the copy to finish */
    int64_t now = mono_ms();
    if (!r->started) r->started = now;
    if (now - r->started > MOVE_WAIT_MS) {
      *rc = es_fail(err, ES_STORAGE, "a session was still being moved between shards after %d ms",
                    MOVE_WAIT_MS);
      return 0;
    }
    sleep_ms(now - r->started < 100 ? 2 : 20);
  }
  return 1;
}


/* A cross-session call hit a session in the middle of a move (its rows
 * are on two shards for a moment): wait a little and run it again. */
int es_sh_merged_again(int64_t *started, int *rc, es_err *err) {
  if (*rc != ES_MOVED) return 0;
  int64_t now = mono_ms();
  if (!*started) *started = now;
  if (now - *started > MOVE_WAIT_MS) {
    *rc = es_fail(err, ES_STORAGE, "sessions were still being moved between shards after %d ms",
                  MOVE_WAIT_MS);
    return 0;
  }
  sleep_ms(5);
  return 1;
}

/* ---- lifecycle ------------------------------------------------------------ */


int es_shards_open(const char *catalog, const es_shard_plan *plan, const es_open_opts *opts,
                   es_store **out, es_err *err) {
  static const es_open_opts defaults = {0};
  *out = NULL;
  if (!opts) opts = &defaults;
  if (!catalog || !*catalog)
    return es_fail(err, ES_INVALID_ARGUMENT, "shards: needs a catalog url");
  if (strncmp(catalog, "shards:", 7) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "the shard catalog cannot itself be shards:");
  if (opts->archive_dir && !*opts->archive_dir)
    return es_fail(err, ES_INVALID_ARGUMENT, "archive must be a directory path, not empty");
  /* §3.9: a file: URL's path is the root of every shard's directory */
  char *root = NULL;
  if (opts->archive_dir && es_archive_location(opts->archive_dir, &root, err) != ES_OK) return err->code;
  es_shard_plan want = {0};
  int rc = ES_OK;
  if (plan) {
    if (es_sh_plan_copy(&want, plan)) {
      free(root);
      return nomem(err);
    }
    if ((rc = es_shard_plan_check(&want, err))) {
      free(root);
      es_shard_plan_destroy(&want);
      return rc;
    }
  }
  struct es_shards *sh = calloc(1, sizeof *sh);
  if (!sh) {
    free(root);
    es_shard_plan_destroy(&want);
    return nomem(err);
  }
  es_store *s = &sh->h;
  s->impl = &shards_ops;
  es_core_handle_init(s, opts);
  pthread_mutex_init(&sh->mu, NULL);
  sh->opts.clock = opts->clock;
  sh->opts.clock_ctx = opts->clock_ctx;
  sh->opts.ids = opts->ids;
  sh->opts.ids_ctx = opts->ids_ctx;
  sh->opts.max_payload_bytes = opts->max_payload_bytes;
  sh->opts.max_batch_events = opts->max_batch_events;
  sh->opts.durability = opts->durability;
  sh->next_token = 1;
  if ((opts->keys_path && !(sh->keys_path = strdup(opts->keys_path))) ||
      (opts->archive_dir && !(sh->archive_root = root ? root : strdup(opts->archive_dir))))
    rc = nomem(err);
  if (root && sh->archive_root != root) free(root); /* the keys' copy failed first */
  /* the catalog holds plans, refs and shredded key names, never a
   * payload or a segment: it is opened without keys and archive */
  if (rc == ES_OK) rc = es_store_open(catalog, &sh->opts, &sh->catalog, err);
  int needs_move = 0;
  for (int tries = 0; rc == ES_OK; tries++) {
    catalog_view v;
    if ((rc = es_sh_catalog_load(sh->catalog, &v, err))) break;
    if (plan && v.cur.version == 0) {
      rc = es_sh_check_identities(s, &want, err);
      if (rc == ES_OK) rc = es_sh_catalog_put(sh->catalog, &want, "current", v.head, err);
      es_sh_view_destroy(&v);
      if (rc == ES_WRONG_EXPECTED_HEAD && tries < 100) rc = ES_OK; /* another opener won: look again */
      else if (rc == ES_OK) continue;
      if (rc) break;
      continue;
    }
    if (v.cur.version == 0) {
      rc = es_fail(err, ES_NOT_FOUND,
                   "the shard catalog '%s' holds no plan: open it once with a plan", catalog);
    } else if (plan && want.version == v.cur.version && !es_sh_plan_same_shards(&want, &v.cur)) {
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "plan version %lld is in the catalog with other shards: a changed plan needs "
                   "a new version",
                   (long long)want.version);
    } else {
      needs_move = plan && (want.version > v.cur.version ||
                            (v.pend.version && want.version >= v.pend.version));
      rc = es_sh_adopt(s, &v, err);
    }
    es_sh_view_destroy(&v);
    break;
  }
  if (rc == ES_OK && needs_move) {
    int64_t n = 0;
    rc = es_sh_set_plan_locked(s, &want, &n, err);
  }
  /* a key file another store was sealed with, or an archive directory
   * that cannot be made, is refused by the open, not by the first call
   * that reaches the shard */
  shard_set set;
  if (rc == ES_OK && (sh->keys_path || sh->archive_root)) rc = es_sh_all_shards(s, &set, err);
  es_shard_plan_destroy(&want);
  if (rc) {
    es_store_release(s);
    return rc;
  }
  *out = s;
  return ES_OK;
}

int es_shards_open_url(const char *url_rest, const es_open_opts *opts, es_store **out,
                       es_err *err) {
  return es_shards_open(url_rest, NULL, opts, out, err);
}

static void shards_close(es_store *s) {
  struct es_shards *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  if (atomic_exchange(&sh->closed, 1)) {
    pthread_mutex_unlock(&sh->mu);
    return;
  }
  for (conn *c = sh->conns; c; c = c->next) es_store_close(c->st);
  pthread_mutex_unlock(&sh->mu);
  if (sh->catalog) es_store_close(sh->catalog);
}

static void shards_free(es_store *s) {
  struct es_shards *sh = SH(s);
  for (swatch *w = sh->watches, *next; w; w = next) {
    next = w->next;
    es_store_presence_unwatch(w->st, w->inner);
    free(w);
  }
  for (conn *c = sh->conns, *next; c; c = next) {
    next = c->next;
    es_store_release(c->st);
    free(c->name);
    free(c->url);
    free(c);
  }
  for (plan_node *p = sh->plans, *next; p; p = next) {
    next = p->next;
    es_shard_plan_destroy(&p->p);
    free(p);
  }
  if (sh->catalog) es_store_release(sh->catalog);
  free(sh->pause_path);
  free(sh->keys_path);
  free(sh->archive_root);
  pthread_mutex_destroy(&sh->mu);
  es_core_handle_destroy(s);
  es_stats_destroy(&s->stats); /* §3.12 */
  free(sh);
}

static uint64_t shards_version(es_store *s) {
  uint64_t v = 0;
  pthread_mutex_lock(&SH(s)->mu);
  for (conn *c = SH(s)->conns; c; c = c->next) v += es_store_version(c->st);
  pthread_mutex_unlock(&SH(s)->mu);
  return v;
}

static int shards_data_version(es_store *s, uint64_t *version, es_err *err) {
  *version = 0;
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    uint64_t v = 0;
    rc = es_store_data_version(set.st[i], &v, err);
    *version += v * (i + 1); /* a change in any shard changes the sum */
  }
  return rc;
}


int es_shards_plan(es_store *s, es_shard_plan *out, es_err *err) {
  memset(out, 0, sizeof *out);
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_reload(s, err);
  if (rc) return rc;
  const es_shard_plan *cur;
  plans_now(s, &cur, NULL);
  return es_sh_plan_copy(out, cur) ? nomem(err) : ES_OK;
}

/* ---- calls about one session ------------------------------------------------ */

static int shards_append(es_store *s, const char *scope, const char *session, const es_new_event *evs, size_t n,
                     int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err) {
  if (out) memset(out, 0, sizeof *out);
  *pending = 0;
  ROUTED("session", session,
         st->impl->append(st, scope, session, evs, n, expected, fence, out, pending, err));
}

/* §3.1 append_many: one shard's transaction, so every session must live
 * on one shard (no distributed transaction); else INVALID_ARGUMENT naming
 * two sessions on different shards. A session moved meanwhile sends the
 * call round again, every session routed anew (by then a move still under
 * way ends in STORAGE "try again", as for any call, never half-written). */
static int shards_append_many(es_store *s, const char *scope, es_append_batch *v, size_t n,
                              es_err *err) {
  route r;
  memset(&r, 0, sizeof r);
  int rc;
  if (n == 0) return sh_enter(s, err);
  for (;;) {
    es_store *st = NULL;
    rc = es_sh_route_store(s, "batches[1].session", v[0].session, &r, &st, err);
    for (size_t i = 1; rc == ES_OK && i < n; i++) {
      route ri;
      memset(&ri, 0, sizeof ri);
      es_store *other = NULL;
      char label[48];
      snprintf(label, sizeof label, "batches[%zu].session", i + 1);
      rc = es_sh_route_store(s, label, v[i].session, &ri, &other, err);
      if (rc == ES_OK && other != st)
        rc = es_fail(err, ES_INVALID_ARGUMENT,
                     "append_many: sessions '%s' and '%s' live on different shards, and one call "
                     "commits on one shard only (append them separately)",
                     v[0].session, v[i].session);
    }
    if (rc) return rc;
    rc = st->impl->append_many(st, scope, v, n, err);
    if (!es_sh_route_again(s, &r, &rc, err)) break;
    /* the moved session may be any of them: the shard it names is no
     * route for the first one, so route by the reloaded plan only */
    r.has_target = 0;
  }
  return rc;
}

static int shards_read(es_store *s, const char *session, int64_t after, int64_t through,
                   int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_read(st, session, after, through, limit, out, err));
}

static int shards_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, int64_t *through_out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session,
         es_store_events_page(st, session, after, through, limit, out, through_out, err));
}

int es_sh_head(es_store *s, const char *session, int64_t *head, es_err *err) {
  *head = 0;
  ROUTED("session", session, es_store_head(st, session, head, err));
}

static int shards_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err) {
  es_event_init(out);
  ROUTED("session", session, es_store_get(st, session, index, out, err));
}

static int shards_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                    es_events *out, int64_t *retry_at, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_claim(st, session, o, outcome, out, retry_at, err));
}

static int shards_renew(es_store *s, const char *session, const char *holder,
                    const es_claim_ref *claims, size_t n, int64_t ttl_ms, int64_t expires_at,
                    es_renew_result *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session,
         es_store_renew(st, session, holder, claims, n, ttl_ms, expires_at, out, err));
}

static int shards_release_claims(es_store *s, const char *session, const char *holder,
                             const es_claim_ref *claims, size_t n, es_renew_result *out,
                             es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_release_claims(st, session, holder, claims, n, out, err));
}

static int shards_complete(es_store *s, const char *scope, const char *session, int64_t index, int64_t attempt,
                       const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                       es_events *out, es_err *err) {
  if (out) memset(out, 0, sizeof *out);
  ROUTED("session", session,
         st->impl->complete(st, scope, session, index, attempt, evs, n, fence, outcome, out, err));
}

static int shards_complete_cancel(es_store *s, const char *scope, es_completion *c,
                                  es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", c->session, st->impl->complete_cancel(st, scope, c, out, err));
}

static int shards_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                   const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                   int64_t *failures, es_err *err) {
  ROUTED("session", session,
         es_store_fail(st, session, index, attempt, error, max_failures, retry_after_ms, outcome,
                       failures, err));
}

static int shards_revive(es_store *s, const char *session, int64_t index, es_err *err) {
  ROUTED("session", session, es_store_revive(st, session, index, err));
}

static int shards_settle(es_store *s, const char *session, int64_t index, const char *reason,
                     es_err *err) {
  ROUTED("session", session, es_store_settle(st, session, index, reason, err));
}

static int shards_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                         es_event *out, es_err *err) {
  ROUTED("session", session, es_store_cancel(st, session, index, reason, out, err));
}

int es_sh_read_state(es_store *s, const char *session, const char *reducer, int *found,
                     es_snapshot *snap, es_events *events, es_err *err) {
  memset(events, 0, sizeof *events);
  ROUTED("session", session,
         es_store_read_state(st, session, reducer, found, snap, events, err));
}

static int shards_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                           const char *state, size_t state_len, const char *version, int *stored,
                           es_err *err) {
  ROUTED("session", session,
         es_store_put_snapshot(st, session, reducer, index, state, state_len, version, stored,
                               err));
}

static int shards_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_snapshots(st, session, out, err));
}

int es_sh_lineage(es_store *s, const char *session, int *found, es_lineage *out,
                  es_err *err) {
  *found = 0;
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_lineage(st, session, found, out, err));
}

static int shards_fence(es_store *s, const char *session, int64_t if_token, int64_t *token,
                    es_err *err) {
  ROUTED("session", session, es_store_fence(st, session, if_token, token, err));
}

static int shards_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                    es_lease *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_lease(st, session, holder, ttl_ms, out, err));
}

static int shards_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                            int *released, es_err *err) {
  *released = 0;
  ROUTED("session", session, es_store_lease_release(st, session, holder, token, released, err));
}

static int shards_seal(es_store *s, const char *session, const char *reason, es_err *err) {
  ROUTED("session", session, es_store_seal(st, session, reason, err));
}

static int shards_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                       es_err *err) {
  ROUTED("session", session, es_store_truncate(st, session, through, first_index, err));
}

typedef struct {
  const char *session;
  int *deleted;
} delete_args;

static int delete_routed(es_store *st, void *arg, es_err *err) {
  delete_args *a = arg;
  return es_store_delete(st, a->session, a->deleted, err);
}

static int shards_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  *deleted = 0;
  delete_args a = {session, deleted};
  int rc = es_sh_routed(s, "session", session, delete_routed, &a, err);
  /* the refs naming it are in the catalog: they go too (a put_ref racing
   * the delete can leave one naming a session with no events: head 0).
   * Also when nothing was deleted: the shard's delete and this write are
   * two stores' transactions, so a call whose catalog write failed left
   * its refs behind, and its retry (deleted 0) is what removes them. */
  if (rc == ES_OK) rc = es_sh_delete_refs_of(s, session, err);
  return rc;
}

static int shards_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                           int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session,
         es_store_read_at_rest(st, session, after, through, limit, out, err));
}

/* archive and segments on the shard st, segment paths made the router's
 * (es_sh_segment_path) */
static int archive_on(es_store *s, es_store *st, const char *session, int64_t through,
                      int *written, es_segment *out, es_err *err) {
  int rc = es_store_archive(st, session, through, written, out, err);
  return rc ? rc : es_sh_segment_path(s, st, &out->file, err);
}

static int segments_on(es_store *s, es_store *st, const char *session, es_segments *out,
                       es_err *err) {
  int rc = es_store_segments(st, session, out, err);
  for (size_t i = 0; rc == ES_OK && i < out->n; i++)
    rc = es_sh_segment_path(s, st, &out->v[i].file, err);
  return rc;
}

static int shards_archive(es_store *s, const char *session, int64_t through, int *written,
                      es_segment *out, es_err *err) {
  *written = 0;
  ROUTED("session", session, archive_on(s, st, session, through, written, out, err));
}

static int shards_segments(es_store *s, const char *session, es_segments *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, segments_on(s, st, session, out, err));
}

static void archived_row_free(void *e) { free(((es_archived_row *)e)->session); }
static const es_list_kind archived_kind = {sizeof(es_archived_row),
                                           offsetof(es_archived_row, session), archived_row_free};

/* §3.9 archived: every shard's page merged by name (a session in the
 * middle of a move listed once), then cut to limit; more follow when a
 * shard had more or the merge dropped some. */
static int shards_archived(es_store *s, const char *prefix, const char *after, int64_t limit,
                           es_archived *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int more = 0;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_archived part;
    rc = set.st[i]->impl->archived(set.st[i], prefix, after, limit, &part, err);
    if (rc) break;
    more |= part.cursor != NULL;
    free(part.cursor);
    part.cursor = NULL;
    rc = es_list_take(&archived_kind, (es_list *)out, (es_list *)&part, err);
  }
  if (rc == ES_OK) more |= es_list_sort_unique(&archived_kind, (es_list *)out, limit);
  if (rc == ES_OK && more && out->n && !(out->cursor = strdup(out->v[out->n - 1].session)))
    rc = es_fail(err, ES_STORAGE, "out of memory");
  if (rc) es_archived_destroy(out);
  return rc;
}

static int shards_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                              es_err *err) {
  ROUTED("session", session, es_store_compact_archive(st, session, before, after, err));
}

static int shards_wait(es_store *s, const char *scope, const char *session, int64_t after, int64_t timeout_ms,
                   int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (!session)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "wait across sessions on a sharded store: use read_all cursors "
                   "(positions are per shard)");
  ROUTED("session", session, st->impl->wait(st, scope, session, after, timeout_ms, limit, out, err));
}

/* Presence lives on the shard its namespace hashes to (not moved by a
 * plan change: it is ephemeral, docs/sharding.md). */
static int shards_presence_set(es_store *s, const char *ns, const char *participant,
                           const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                           int64_t seen, es_presence_rows *applied, es_err *err) {
  memset(applied, 0, sizeof *applied);
  ROUTED("namespace", ns,
         es_store_presence_set(st, ns, participant, fields, n, ttl_ms, at, seen, applied, err));
}

static int shards_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("namespace", ns, es_store_presence_read(st, ns, out, err));
}

static uint64_t shards_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx) {
  route r = {0};
  es_store *st;
  es_err err = {0};
  if (es_sh_route_store(s, "namespace", ns, &r, &st, &err)) return 0;
  swatch *w = calloc(1, sizeof *w);
  if (!w) return 0;
  w->st = st;
  w->inner = es_store_presence_watch(st, ns, cb, ctx);
  if (!w->inner) {
    free(w);
    return 0;
  }
  pthread_mutex_lock(&SH(s)->mu);
  w->token = SH(s)->next_token++;
  w->next = SH(s)->watches;
  SH(s)->watches = w;
  pthread_mutex_unlock(&SH(s)->mu);
  return w->token;
}

static void shards_presence_unwatch(es_store *s, uint64_t token) {
  swatch *found = NULL;
  pthread_mutex_lock(&SH(s)->mu);
  for (swatch **p = &SH(s)->watches; *p; p = &(*p)->next)
    if ((*p)->token == token) {
      found = *p;
      *p = found->next;
      break;
    }
  pthread_mutex_unlock(&SH(s)->mu);
  if (!found) return;
  es_store_presence_unwatch(found->st, found->inner);
  free(found);
}

/* ---- the table (store_impl.h) --------------------------------------------- */

static int shards_check_open(es_store *s, es_err *err) { return sh_enter(s, err); }

/* §3.1: "shards", durable and shared by processes only if the catalog
 * and every shard are, keys and archive only if every shard has them
 * (each shard is a full store opened with the router's options). */
static int shards_capabilities(es_store *s, es_capabilities *out, es_err *err) {
  shard_set set;
  es_capabilities c;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_capabilities(SH(s)->catalog, &c, err);
  if (rc) return rc;
  *out = c;
  out->backend = "shards";
  out->sharded = 1;
  rc = es_sh_all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    if ((rc = es_store_capabilities(set.st[i], &c, err))) break;
    out->durable &= c.durable;
    out->processes &= c.processes;
    out->keys = (i == 0 ? c.keys : out->keys & c.keys);
    out->archive = (i == 0 ? c.archive : out->archive & c.archive);
  }
  return rc;
}

static const es_store_ops shards_ops = {
    .close = shards_close,
    .free = shards_free,
    .check_open = shards_check_open,
    .version = shards_version,
    .data_version = shards_data_version,
    .new_id = es_core_new_id,
    .tenant = es_tenant_open,
    .tenant_name = NULL,
    .append = shards_append,
    .append_many = shards_append_many,
    .read = shards_read,
    .events_page = shards_events_page,
    .head = es_sh_head,
    .read_all = es_sh_read_all,
    .read_all_cursor = es_sh_read_all_cursor,
    .last_position = es_sh_last_position,
    .get = shards_get,
    .claim = shards_claim,
    .claim_next = es_sh_claim_next,
    .renew = shards_renew,
    .release_claims = shards_release_claims,
    .complete = shards_complete,
    .complete_many = es_complete_many_each,
    .complete_cancel = shards_complete_cancel,
    .fail = shards_fail,
    .revive = shards_revive,
    .settle = shards_settle,
    .cancel = shards_cancel,
    .dead_letters = es_sh_dead_letters,
    .read_state = es_sh_read_state,
    .read_states = es_sh_read_states,
    .put_snapshot = shards_put_snapshot,
    .snapshots = shards_snapshots,
    .sessions = es_sh_sessions,
    .pending_types = es_sh_pending_types,
    .wait = shards_wait,
    .presence_set = shards_presence_set,
    .presence_read = shards_presence_read,
    .presence_watch = shards_presence_watch,
    .presence_unwatch = shards_presence_unwatch,
    .fork = es_sh_fork,
    .lineage = es_sh_lineage,
    .children = es_sh_children,
    .put_ref = es_sh_put_ref,
    .get_ref = es_sh_get_ref,
    .list_refs = es_sh_list_refs,
    .delete_ref = es_sh_delete_ref,
    .promote = es_sh_promote,
    .fence = shards_fence,
    .lease = shards_lease,
    .lease_release = shards_lease_release,
    .seal = shards_seal,
    .truncate = shards_truncate,
    .delete = shards_delete,
    .archive = shards_archive,
    .segments = shards_segments,
    .archived = shards_archived,
    .compact_archive = shards_compact_archive,
    .verify_archive = es_sh_verify_archive,
    .shred = es_sh_shred,
    .read_at_rest = shards_read_at_rest,
    .counts = es_sh_counts,
    .capabilities = shards_capabilities,
    .projection_read = shards_projection_read,
    .projection_keys = shards_projection_keys,
    .projections = shards_projections,
    .projection_commit = shards_projection_commit,
    .projection_control = shards_projection_control,
};
