/*
 * shards.c: sharded stores (CONTRACT §5, docs/sharding.md).
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
 *       records, new positions) and X's row;
 *   (d) on A, drop X's rows and keep a tombstone row (fence -1).
 * Each step checks the state it expects, so a move interrupted anywhere is
 * finished by running it again (and two movers at once do it once).
 *
 * Where the parts live: shard_plan.c (hashing, plans, the catalog),
 * shard_marks.c (the markers and the marker-checking backend), this file
 * (the handle, routing, the calls, moves); shards_internal.h is what they
 * share.
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

/* One opened shard store, by name and url (kept until the handle goes:
 * calls in flight may hold it). */
typedef struct conn {
  char *name, *url;
  es_store *st;
  struct conn *next;
} conn;

/* Plans the handle routed by: kept until it goes (calls in flight read
 * them without a lock). */
typedef struct plan_node {
  es_shard_plan p;
  struct plan_node *next;
} plan_node;

/* A presence watch: the sharded token and the shard's. */
typedef struct swatch {
  uint64_t token, inner;
  es_store *st;
  struct swatch *next;
} swatch;

/* The router: an es_store (its impl is shards_ops) and its own state. Of
 * the es_store only impl, refs, the clock, the ids and their state, the
 * limits and the stats are used. */
struct es_shards {
  es_store h;                /* first: a router's es_store * is its struct es_shards * */
  pthread_mutex_t mu;        /* guards every field below but the atomics */
  es_store *catalog;         /* owned reference */
  es_open_opts opts;         /* for the shards' opens (clock, limits, ids; borrowed ctxs) */
  const es_shard_plan *cur;  /* the plan calls route by (a node of plans) */
  const es_shard_plan *pend; /* a pending plan (moves under way), or NULL */
  plan_node *plans;
  int64_t refreshed_ms;      /* when the catalog was last read */
  conn *conns;
  swatch *watches;
  uint64_t next_token;
  atomic_uint rr;            /* claim_next's first shard, rotating */
  atomic_int closed;
  atomic_llong crash_after;  /* test hook: steps left before a simulated crash; 0: off */
  atomic_llong pause_after;  /* test hook: steps left before a pause; 0: off */
  char *pause_path;          /* owned; the pause hook's gate file */
};

static const es_store_ops shards_ops;

static struct es_shards *SH(const es_store *s) { return (struct es_shards *)s; }

static int sh_enter(es_store *s, es_err *err) {
  if (atomic_load(&SH(s)->closed)) return es_fail(err, ES_CLOSED, "the store is closed");
  return ES_OK;
}

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
static int step(es_store *s, es_err *err) {
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

static int crashed(es_store *s, es_err *err) {
  if (atomic_load(&SH(s)->crash_after) < 0)
    return es_fail(err, ES_STORAGE, "simulated crash in the middle of a shard move");
  return ES_OK;
}

/* The store of shard `name` at `url`, opened at first use. */
static int shard_store(es_store *s, const char *name, const char *url, es_store **out,
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
  if (rc == ES_OK) {
    rc = es_store_open(url, &sh->opts, &c->st, err);
    if (rc && err) {
      char why[ES_ERRMSG_MAX];
      memcpy(why, err->msg, sizeof why);
      es_fail(err, rc, "shard '%s': %s", name, why);
    }
  }
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

/* Adopts the catalog's plans (a copy kept until the handle goes). */
static int adopt(es_store *s, catalog_view *v, es_err *err) {
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
static int reload(es_store *s, es_err *err) {
  catalog_view v;
  int rc = es_sh_catalog_load(SH(s)->catalog, &v, err);
  if (rc == ES_OK && v.cur.version == 0)
    rc = es_fail(err, ES_NOT_FOUND, "the shard catalog holds no plan");
  if (rc == ES_OK) rc = adopt(s, &v, err);
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
  return stale ? reload(s, err) : ES_OK;
}

static void plans_now(es_store *s, const es_shard_plan **cur, const es_shard_plan **pend) {
  pthread_mutex_lock(&SH(s)->mu);
  *cur = SH(s)->cur;
  if (pend) *pend = SH(s)->pend;
  pthread_mutex_unlock(&SH(s)->mu);
}

/* Every shard a cross-session call must look at: the current plan's and
 * a pending plan's (sessions already moved to a new shard live there). */
typedef struct {
  es_store *st[2 * ES_MAX_SHARDS];
  const char *name[2 * ES_MAX_SHARDS];
  size_t n;
} shard_set;

static int all_shards(es_store *s, shard_set *set, es_err *err) {
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
      if ((rc = shard_store(s, d->name, d->url, &set->st[set->n], err))) return rc;
      set->name[set->n++] = d->name;
    }
  }
  return ES_OK;
}

/* ---- routing -------------------------------------------------------------- */

typedef struct {
  int redirects;
  int64_t started;  /* mono_ms of the first wait, 0: none yet */
  char target[ES_MAX_SHARD_NAME_BYTES + 1];
  int has_target;
} route;

/* The store for a call about `key` (a session, or a presence namespace). */
static int route_store(es_store *s, const char *what, const char *key, route *r, es_store **st,
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
    if (!d && (rc = reload(s, err)) == ES_OK) {
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
  return shard_store(s, d->name, d->url, st, err);
}

/* After a routed call: 1 to run it again elsewhere (ES_MOVED), else 0
 * with *rc final (ES_MOVED never leaves a sharded handle). */
static int route_again(es_store *s, route *r, int *rc, es_err *err) {
  if (*rc != ES_MOVED) return 0;
  const char *target = es_shards_moved_target(err);
  const es_shard_plan *pc;
  plans_now(s, &pc, NULL);
  int64_t before = pc ? pc->version : 0;
  es_err rerr = {0};
  int r2 = reload(s, &rerr);
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

/* A call about one session (or namespace): `call` uses st. */
#define ROUTED(what, key, call)                                    \
  do {                                                             \
    route r_;                                                      \
    memset(&r_, 0, sizeof r_);                                     \
    int rc_;                                                       \
    for (;;) {                                                     \
      es_store *st;                                                \
      if ((rc_ = route_store(s, what, key, &r_, &st, err))) break; \
      rc_ = (call);                                                \
      if (!route_again(s, &r_, &rc_, err)) break;                  \
    }                                                              \
    return rc_;                                                    \
  } while (0)

/* A cross-session call hit a session in the middle of a move (its rows
 * are on two shards for a moment): wait a little and run it again. */
static int merged_again(int64_t *started, int *rc, es_err *err) {
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

static int set_plan_locked(es_store *s, const es_shard_plan *plan, int64_t *moved_n, es_err *err);
static int check_identities(es_store *s, const es_shard_plan *p, es_err *err);

int es_shards_open(const char *catalog, const es_shard_plan *plan, const es_open_opts *opts,
                   es_store **out, es_err *err) {
  static const es_open_opts defaults = {0};
  *out = NULL;
  if (!opts) opts = &defaults;
  if (!catalog || !*catalog)
    return es_fail(err, ES_INVALID_ARGUMENT, "shards: needs a catalog url");
  if (strncmp(catalog, "shards:", 7) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "the shard catalog cannot itself be shards:");
  if (opts->archive_dir || opts->keys_path)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "a sharded store is opened without archive or keys (docs/sharding.md)");
  es_shard_plan want = {0};
  int rc = ES_OK;
  if (plan) {
    if (es_sh_plan_copy(&want, plan)) return nomem(err);
    if ((rc = es_shard_plan_check(&want, err))) {
      es_shard_plan_destroy(&want);
      return rc;
    }
  }
  struct es_shards *sh = calloc(1, sizeof *sh);
  if (!sh) {
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
  rc = es_store_open(catalog, &sh->opts, &sh->catalog, err);
  int needs_move = 0;
  for (int tries = 0; rc == ES_OK; tries++) {
    catalog_view v;
    if ((rc = es_sh_catalog_load(sh->catalog, &v, err))) break;
    if (plan && v.cur.version == 0) {
      rc = check_identities(s, &want, err);
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
      rc = adopt(s, &v, err);
    }
    es_sh_view_destroy(&v);
    break;
  }
  if (rc == ES_OK && needs_move) {
    int64_t n = 0;
    rc = set_plan_locked(s, &want, &n, err);
  }
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
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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
  if (rc == ES_OK) rc = reload(s, err);
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

static int shards_head(es_store *s, const char *session, int64_t *head, es_err *err) {
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

static int shards_read_state(es_store *s, const char *session, const char *reducer, int *found,
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

static int shards_lineage(es_store *s, const char *session, int *found, es_lineage *out,
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

typedef int (*routed_fn)(es_store *st, void *arg, es_err *err);
static int routed(es_store *s, const char *what, const char *key, routed_fn fn, void *arg,
                  es_err *err);
static int delete_refs_of(es_store *s, const char *session, es_err *err);

static int shards_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  *deleted = 0;
  delete_args a = {session, deleted};
  int rc = routed(s, "session", session, delete_routed, &a, err);
  /* the refs naming it are in the catalog: they go too (a put_ref racing
   * the delete can leave one naming a session with no events: head 0).
   * Also when nothing was deleted: the shard's delete and this write are
   * two stores' transactions, so a call whose catalog write failed left
   * its refs behind, and its retry (deleted 0) is what removes them. */
  if (rc == ES_OK) rc = delete_refs_of(s, session, err);
  return rc;
}

static int shards_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                           int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session,
         es_store_read_at_rest(st, session, after, through, limit, out, err));
}

static int shards_archive(es_store *s, const char *session, int64_t through, int *written,
                      es_segment *out, es_err *err) {
  *written = 0;
  ROUTED("session", session, es_store_archive(st, session, through, written, out, err));
}

static int shards_segments(es_store *s, const char *session, es_segments *out, es_err *err) {
  memset(out, 0, sizeof *out);
  ROUTED("session", session, es_store_segments(st, session, out, err));
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
  if (route_store(s, "namespace", ns, &r, &st, &err)) return 0;
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

/* ---- calls that span sessions ---------------------------------------------- */

typedef int (*routed_fn)(es_store *st, void *arg, es_err *err);

/* fn on the shard owning key, run again where ES_MOVED points. */
static int routed(es_store *s, const char *what, const char *key, routed_fn fn, void *arg,
                  es_err *err) {
  route r;
  memset(&r, 0, sizeof r);
  int rc;
  for (;;) {
    es_store *st;
    if ((rc = route_store(s, what, key, &r, &st, err))) break;
    rc = fn(st, arg, err);
    if (!route_again(s, &r, &rc, err)) break;
  }
  return rc;
}

static void session_free(void *e) { es_session_info_destroy(e); }
static const es_list_kind session_kind = {sizeof(es_session_info),
                                          offsetof(es_session_info, session), session_free};

static int shards_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                           es_sessions *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (limit <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be > 0");
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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

static int read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                           es_events *out, char ***cursors, es_err *err);

static int shards_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (after != 0 && after != ES_NONE)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "read_all on a sharded store resumes from a cursor (an event's `cursor`), "
                   "not a position");
  char **cursors = NULL;
  int rc = read_all_cursor(s, scope, NULL, limit, out, &cursors, err);
  if (rc == ES_OK) es_shards_cursors_free(cursors, out->n);
  return rc;
}

static int shards_last_position(es_store *s, const char *scope, int64_t *position, es_err *err) {
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

static int shards_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms, int64_t limit,
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
    if (rc == ES_OK) rc = all_shards(s, &set, err);
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
  } while (out->n == 0 && merged_again(&started, &rc, err));
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

static int shards_dead_letters(es_store *s, const char *scope, const char *session, int64_t after, int64_t limit,
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
    if (rc == ES_OK) rc = all_shards(s, &set, err);
    for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
      es_events part;
      rc = set.st[i]->impl->dead_letters(set.st[i], scope, NULL, after, limit, &part, err);
      if (rc == ES_OK) rc = move_events(out, &part, err);
    }
  } while (merged_again(&started, &rc, err));
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

static int shards_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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
static int shards_counts(es_store *s, const char *scope, es_counts *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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

static int shards_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
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
    rc = shards_read_state(s, sessions[i], reducer, &out[i].found, &out[i].snap,
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

static int shards_children(es_store *s, const char *session, const char *after, int64_t limit,
                           es_lineages *out, es_err *err) {
  memset(out, 0, sizeof *out);
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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
 * (CONTRACT §3.7: of two promotes with the same expect exactly one wins),
 * and a plan change never moves them. The catalog's own rows know no
 * session's head: it is read from the session's shard. */

/* ref->head from the shard of the session it names (0 when none). */
static int ref_head(es_store *s, es_ref *ref, es_err *err) {
  ref->head = 0;
  if (!ref->session || strcmp(ref->session, CATALOG_SESSION) == 0) return ES_OK;
  int rc = shards_head(s, ref->session, &ref->head, err);
  if (rc == ES_NOT_FOUND) {
    ref->head = 0;
    rc = ES_OK;
  }
  return rc;
}

static int shards_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
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

static int shards_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
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

static int shards_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out,
                        es_err *err) {
  memset(out, 0, sizeof *out);
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_list_refs(SH(s)->catalog, after, limit, out, err);
  /* one routed head per ref: a page of refs costs a read per ref */
  for (size_t i = 0; rc == ES_OK && i < out->n; i++) rc = ref_head(s, &out->v[i], err);
  if (rc) es_refs_destroy(out);
  return rc;
}

static int shards_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  *deleted = 0;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = es_store_delete_ref(SH(s)->catalog, name, deleted, err);
  return rc;
}

static int shards_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
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

static int delete_refs_of(es_store *s, const char *session, es_err *err) {
  es_store *cat = SH(s)->catalog;
  int rc = es_core_enter(cat, err);
  if (rc) return rc;
  refs_of_args a = {session};
  rc = es_core_write(cat, do_delete_refs_of, &a, err);
  es_core_leave(cat);
  return rc;
}

static int shards_shred(es_store *s, const char *name, int *was_live, es_err *err) {
  *was_live = 0;
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    int live = 0;
    rc = es_store_shred(set.st[i], name, &live, err);
    *was_live |= live;
  }
  return rc;
}

static int shards_verify_archive(es_store *s, const char *session, es_archive_report *out,
                             es_err *err) {
  memset(out, 0, sizeof *out);
  if (session) ROUTED("session", session, es_store_verify_archive(st, session, out, err));
  shard_set set;
  int rc = sh_enter(s, err);
  if (rc == ES_OK) rc = all_shards(s, &set, err);
  for (size_t i = 0; rc == ES_OK && i < set.n; i++) {
    es_archive_report part;
    rc = es_store_verify_archive(set.st[i], NULL, &part, err);
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
static int read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
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
  if (rc == ES_OK) rc = all_shards(s, &set, err);
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

/* ---- moving sessions -------------------------------------------------------- */

static const es_backend_ops *real(es_store *st) { return st->real_ops ? st->real_ops : st->ops; }
static es_backend *real_bk(es_store *st) { return st->real_ops ? st->real_bk : st->bk; }

typedef struct {
  int64_t version;
  const char *me;
  const es_shard_plan *plan;
} record_args;

static int do_record(es_store *st, es_txn *t, void *arg, es_err *err) {
  record_args *a = arg;
  es_session_info si;
  char *identity = NULL; /* kept across records (store_identity) */
  int rc = real(st)->session_get(real_bk(st), t, "", &si, err);
  if (rc == ES_OK) {
    int64_t have = si.fence;
    identity = si.lease_holder;
    si.lease_holder = NULL;
    es_session_info_destroy(&si);
    if (have >= a->version) {
      free(identity);
      return ES_OK;
    }
  } else if (rc != ES_NOT_FOUND) {
    return rc;
  }
  es_buf b;
  es_buf_init(&b);
  int oom = es_buf_adds(&b, a->me) != ES_OK;
  for (size_t i = 0; i < a->plan->n; i++)
    oom |= es_buf_addc(&b, '\n') != ES_OK || es_buf_adds(&b, a->plan->v[i].name) != ES_OK;
  oom |= es_buf_addc(&b, '\0') != ES_OK;
  if (oom) {
    es_buf_destroy(&b);
    free(identity);
    return nomem(err);
  }
  es_session_info_init(&si);
  si.session = "";
  si.fence = a->version;
  si.seal_reason = b.data;
  si.lease_holder = identity;
  rc = real(st)->session_put(real_bk(st), t, &si, err);
  es_buf_destroy(&b);
  free(identity);
  return rc;
}

/* A store's identity: an id kept in its "" row's lease_holder, written at
 * first asked. Two urls reaching one store (another spelling of a path,
 * another host name) give one identity, which is how a plan naming one
 * store twice, or the catalog as a shard, is caught. */
typedef struct {
  char fresh[ES_MAX_ID_BYTES + 1];
  char *out; /* owned */
} identity_args;

static int do_identity(es_store *st, es_txn *t, void *arg, es_err *err) {
  identity_args *a = arg;
  es_session_info si;
  int rc = real(st)->session_get(real_bk(st), t, "", &si, err);
  if (rc == ES_OK && si.lease_holder) {
    a->out = si.lease_holder;
    si.lease_holder = NULL;
    es_session_info_destroy(&si);
    return ES_OK;
  }
  if (rc == ES_NOT_FOUND) {
    es_session_info_init(&si);
    if (!(si.session = strdup(""))) return nomem(err);
    si.fence = 0; /* plan version 0: routes nothing (record_get) */
  } else if (rc) {
    return rc;
  }
  if (!(si.lease_holder = strdup(a->fresh)) || !(a->out = strdup(a->fresh))) {
    es_session_info_destroy(&si);
    return nomem(err);
  }
  rc = real(st)->session_put(real_bk(st), t, &si, err);
  es_session_info_destroy(&si);
  return rc;
}

/* A new identity: 128 bits from the kernel, as 32 hex digits. Never from
 * the handle's id source (`ids`): an injected source is often
 * deterministic (a counter restarting in each process), and two stores
 * given one identity would make a valid plan be refused as naming one
 * store twice. */
static int random_identity(char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  unsigned char r[16];
  size_t got = 0;
  while (got < sizeof r) {
    ssize_t n = getrandom(r + got, sizeof r - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return es_fail(err, ES_STORAGE, "no randomness for a store identity");
    got += (size_t)n;
  }
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof r; i++) {
    out[2 * i] = hex[r[i] >> 4];
    out[2 * i + 1] = hex[r[i] & 15];
  }
  out[2 * sizeof r] = '\0';
  return ES_OK;
}

static int store_identity(es_store *st, char **out, es_err *err) {
  identity_args a;
  memset(&a, 0, sizeof a);
  int rc = random_identity(a.fresh, err);
  if (rc == ES_OK) rc = es_core_enter(st, err);
  if (rc) return rc;
  rc = es_core_write(st, do_identity, &a, err);
  es_core_leave(st);
  if (rc) free(a.out);
  else *out = a.out;
  return rc;
}

/* Refuses a plan whose shards are not distinct stores, or one of which is
 * the catalog: INVALID_ARGUMENT naming them. Opens every shard. */
static int check_identities(es_store *s, const es_shard_plan *p, es_err *err) {
  char *cat = NULL, *ids[ES_MAX_SHARDS] = {0};
  int rc = store_identity(SH(s)->catalog, &cat, err);
  size_t n = 0;
  for (; rc == ES_OK && n < p->n; n++) {
    es_store *st;
    rc = shard_store(s, p->v[n].name, p->v[n].url, &st, err);
    if (rc == ES_OK) rc = store_identity(st, &ids[n], err);
    if (rc) break;
    if (strcmp(ids[n], cat) == 0) {
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "shard '%s' is the catalog's store: the catalog cannot be a shard",
                   p->v[n].name);
      n++;
      break;
    }
    for (size_t j = 0; j < n; j++)
      if (strcmp(ids[j], ids[n]) == 0) {
        rc = es_fail(err, ES_INVALID_ARGUMENT, "shards '%s' and '%s' are one store",
                     p->v[j].name, p->v[n].name);
        break;
      }
    if (rc) {
      n++;
      break;
    }
  }
  for (size_t i = 0; i < n && i < p->n; i++) free(ids[i]);
  free(cat);
  return rc;
}

/* Runs fn in a write transaction of shard store st (a plan-change step). */
static int shard_write(es_store *s, es_store *st, txn_fn fn, void *arg, es_err *err) {
  int rc = step(s, err);
  if (rc == ES_OK) rc = es_core_enter(st, err);
  if (rc) return rc;
  rc = es_core_write(st, fn, arg, err);
  es_core_leave(st);
  return rc;
}

static int shard_read(es_store *st, txn_fn fn, void *arg, es_err *err) {
  int rc = es_core_enter(st, err);
  if (rc) return rc;
  rc = es_core_read(st, fn, arg, err);
  es_core_leave(st);
  return rc;
}

/* A session's state on one shard. */
enum { ST_ABSENT, ST_LIVE, ST_FROZEN, ST_INCOMING, ST_TOMBSTONE };

static int state_of(int rc, const es_session_info *si) {
  if (rc == ES_NOT_FOUND) return ST_ABSENT;
  if (si->fence <= FENCE_FROZEN_BASE) return ST_FROZEN;
  if (si->fence == FENCE_INCOMING) return ST_INCOMING;
  if (si->fence < 0) return ST_TOMBSTONE;
  return ST_LIVE;
}

typedef struct {
  const char *session;
  const char *source;  /* incoming: the shard it comes from */
  int state;           /* out: the state found before the step */
  int64_t version;     /* the plan the move is for (0: no guard) */
} session_step;

/* Every move step checks, in its own transaction, that the shard does not
 * already follow a newer plan: a mover of an older plan (slow, paused)
 * must never move a session after a newer plan's mover ran, or sessions
 * would land on shards the newer plan does not route to. The newer plan's
 * record is written on every shard before its moves start, so from then
 * on an older mover's every step fails here. */
static int plan_guard(es_store *st, es_txn *t, int64_t version, es_err *err) {
  if (version <= 0) return ES_OK;
  es_session_info si;
  int rc = real(st)->session_get(real_bk(st), t, "", &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  int64_t have = si.fence;
  es_session_info_destroy(&si);
  if (have > version)
    return es_fail(err, ES_STORAGE,
                   "a shard already follows shard plan %lld: the move for plan %lld stops",
                   (long long)have, (long long)version);
  return ES_OK;
}

static int do_state(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  es_session_info si;
  int rc = real(st)->session_get(real_bk(st), t, a->session, &si, err);
  if (rc && rc != ES_NOT_FOUND) return rc;
  a->state = state_of(rc, &si);
  if (rc == ES_OK) es_session_info_destroy(&si);
  return ES_OK;
}

/* (a) on the target: the incoming row. */
static int do_incoming(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  int rc = plan_guard(st, t, a->version, err);
  if (rc == ES_OK) rc = do_state(st, t, arg, err);
  if (rc || (a->state != ST_ABSENT && a->state != ST_TOMBSTONE)) return rc;
  es_session_info si;
  es_session_info_init(&si);
  si.session = (char *)a->session;
  si.fence = FENCE_INCOMING;
  si.seal_reason = (char *)a->source;
  return real(st)->session_put(real_bk(st), t, &si, err);
}

/* Undoes (a) when (b) refused. */
static int do_unincoming(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  int rc = plan_guard(st, t, a->version, err);
  if (rc == ES_OK) rc = do_state(st, t, arg, err);
  if (rc || a->state != ST_INCOMING) return rc;
  return real(st)->session_delete(real_bk(st), t, a->session, err);
}

static int collect_row(void *ctx, const es_event *row) {
  es_events *l = ctx;
  return es_events_push_copy(l, row) != ES_OK;
}

/* (b) on the source: freeze. */
static int do_freeze(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  const es_backend_ops *ops = real(st);
  es_session_info si;
  int rc = plan_guard(st, t, a->version, err);
  if (rc) return rc;
  rc = ops->session_get(real_bk(st), t, a->session, &si, err);
  if (rc && rc != ES_NOT_FOUND) return rc;
  a->state = state_of(rc, &si);
  if (a->state != ST_LIVE) {
    if (rc == ES_OK) es_session_info_destroy(&si);
    return ES_OK;
  }
  es_events rows = {0};
  if (si.archived_through > 0)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot move session '%s' to another shard: it has archived segments "
                 "(docs/sharding.md)",
                 a->session);
  if (rc == ES_OK)
    rc = ops->event_range(real_bk(st), t, a->session, 0, INT64_MAX, ES_NONE, collect_row, &rows, err);
  for (size_t i = 0; rc == ES_OK && i < rows.n; i++) {
    es_event *e = &rows.v[i];
    if (e->key) {
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot move session '%s' to another shard: event %lld is encrypted under "
                   "key '%s' (docs/sharding.md)",
                   a->session, (long long)e->index, e->key);
      break;
    }
    if (e->status == ES_STATUS_PROCESSED) continue;
    e->returned = es_sh_encode_frozen(e);
    e->queued = 0;
    rc = ops->event_update(real_bk(st), t, e, err);
  }
  es_events_destroy(&rows);
  if (rc == ES_OK) {
    si.fence = FENCE_FROZEN_BASE - si.fence;
    rc = ops->session_put(real_bk(st), t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

/* Every row of a frozen session, read from its source. */
typedef struct {
  const char *session;
  es_session_info si;
  int have_si;
  es_events events;
  es_snapshots snaps; /* with state */
  es_refs refs;       /* naming the session */
  size_t refs_cap;
  int oom;
} session_copy;

static void copy_destroy(session_copy *c) {
  if (c->have_si) es_session_info_destroy(&c->si);
  es_events_destroy(&c->events);
  es_snapshots_destroy(&c->snaps);
  es_refs_destroy(&c->refs);
}

static int collect_snap_name(void *ctx, const es_snapshot *row) {
  session_copy *c = ctx;
  es_snapshots *l = &c->snaps;
  if (es_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) ||
      es_snapshot_copy(&l->v[l->n], row)) {
    c->oom = 1;
    return 1;
  }
  l->n++;
  return 0;
}

static int do_read_frozen(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_copy *c = arg;
  const es_backend_ops *ops = real(st);
  int rc = ops->session_get(real_bk(st), t, c->session, &c->si, err);
  if (rc) return rc;
  c->have_si = 1;
  if (c->si.fence > FENCE_FROZEN_BASE) return ES_OK; /* not frozen: nothing to copy */
  rc = ops->event_range(real_bk(st), t, c->session, 0, INT64_MAX, ES_NONE, collect_row, &c->events, err);
  if (rc == ES_OK) rc = ops->snapshot_list(real_bk(st), t, c->session, collect_snap_name, c, err);
  for (size_t i = 0; rc == ES_OK && !c->oom && i < c->snaps.n; i++) {
    es_snapshot full;
    es_snapshot_init(&full);
    rc = ops->snapshot_get(real_bk(st), t, c->session, c->snaps.v[i].reducer, &full, err);
    if (rc == ES_OK) {
      es_snapshot_destroy(&c->snaps.v[i]);
      c->snaps.v[i] = full;
    }
  }
  /* refs live in the catalog (docs/sharding.md): none to copy */
  if (rc == ES_OK && c->oom) rc = nomem(err);
  return rc;
}

typedef struct {
  session_copy *c;
  const char *shard;
  const char *source; /* the shard the rows come from */
  int64_t version;
  int copied;  /* out: 1 when this step inserted the rows */
  int present; /* out: 1 when the session is live here (copied by now) */
} copy_in_args;

/* (c) on the target: the rows, in one write, if still incoming. */
static int do_copy_in(es_store *st, es_txn *t, void *arg, es_err *err) {
  copy_in_args *a = arg;
  session_copy *c = a->c;
  const es_backend_ops *ops = real(st);
  int rc = plan_guard(st, t, a->version, err);
  if (rc) return rc;
  es_session_info in;
  rc = ops->session_get(real_bk(st), t, c->session, &in, err);
  if (rc && rc != ES_NOT_FOUND) return rc;
  int state = state_of(rc, &in);
  /* only the move the incoming row was made for copies in: its source */
  int ours = state == ST_INCOMING && in.seal_reason && strcmp(in.seal_reason, a->source) == 0;
  if (rc == ES_OK) es_session_info_destroy(&in);
  a->present = state == ST_LIVE;
  if (!ours) return ES_OK;
  rc = ES_OK;
  for (size_t i = 0; rc == ES_OK && i < c->events.n; i++) {
    es_event *e = &c->events.v[i];
    es_event other;
    es_event_init(&other);
    int r2 = ops->event_get_by_id(real_bk(st), t, e->id, &other, err);
    if (r2 == ES_OK) {
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot move session '%s' to shard '%s': event id '%s' is already used there "
                   "by session '%s'",
                   c->session, a->shard, e->id, other.session);
      es_event_destroy(&other);
      break;
    }
    if (r2 != ES_NOT_FOUND) {
      rc = r2;
      break;
    }
    es_sh_decode_frozen(e);
    rc = ops->event_insert(real_bk(st), t, e, err);
  }
  for (size_t i = 0; rc == ES_OK && i < c->snaps.n; i++)
    rc = ops->snapshot_put(real_bk(st), t, c->session, &c->snaps.v[i], err);
  if (rc == ES_OK) {
    es_session_info si = c->si;
    si.fence = FENCE_FROZEN_BASE - c->si.fence;
    rc = ops->session_put(real_bk(st), t, &si, err);
  }
  if (rc == ES_OK) a->copied = a->present = 1;
  return rc;
}

/* (d) on the source: the rows go, a tombstone stays. */
static int do_drop(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  const es_backend_ops *ops = real(st);
  int rc = plan_guard(st, t, a->version, err);
  if (rc == ES_OK) rc = do_state(st, t, arg, err);
  if (rc || a->state != ST_FROZEN) return rc;
  rc = ops->event_delete_range(real_bk(st), t, a->session, INT64_MAX, err);
  if (rc == ES_OK) rc = ops->snapshot_delete_all(real_bk(st), t, a->session, err);
  if (rc == ES_OK) rc = ops->key_use_delete_session(real_bk(st), t, a->session, err);
  if (rc == ES_OK) {
    es_session_info si;
    es_session_info_init(&si);
    si.session = (char *)a->session;
    si.fence = FENCE_TOMBSTONE;
    rc = ops->session_put(real_bk(st), t, &si, err);
  }
  return rc;
}

/* Moves one session from shard `from` (store a) to shard `to` (store b)
 * for plan `version`, from whatever step an earlier, interrupted move of
 * that plan reached. *copied: 1 when this call put the rows on the
 * target. */
static int move_one(es_store *s, int64_t version, const char *session, const char *from,
                    es_store *a, const char *to, es_store *b, int *copied, es_err *err) {
  *copied = 0;
  session_step sa = {session, from, 0, version}, sb = {session, from, 0, version};
  int rc = shard_read(a, do_state, &sa, err);
  if (rc == ES_OK) rc = shard_read(b, do_state, &sb, err);
  if (rc) return rc;
  if (sa.state == ST_LIVE) {
    if (sb.state == ST_LIVE || sb.state == ST_FROZEN)
      return es_fail(err, ES_STORAGE, "session '%s' is on both shard '%s' and shard '%s'", session,
                     from, to);
    if ((rc = shard_write(s, b, do_incoming, &sb, err))) return rc;
    int wrote_incoming = sb.state == ST_ABSENT || sb.state == ST_TOMBSTONE;
    rc = shard_write(s, a, do_freeze, &sa, err);
    if (rc) {
      es_err ignored = {0};
      if (rc != ES_STORAGE || !crashed(s, &ignored)) {
        /* refused: the session stays where it is, usable */
        shard_write(s, b, do_unincoming, &sb, &ignored);
      }
      return rc;
    }
    if (sa.state != ST_LIVE && sa.state != ST_FROZEN) {
      /* another mover took it between our read and the freeze: the
       * incoming row this call made waits for nothing */
      if (wrote_incoming) rc = shard_write(s, b, do_unincoming, &sb, err);
      return rc;
    }
  } else if (sa.state != ST_FROZEN) {
    return ES_OK; /* already moved (or gone) */
  }
  session_copy c;
  memset(&c, 0, sizeof c);
  c.session = session;
  if ((rc = crashed(s, err)) == ES_OK) rc = shard_read(a, do_read_frozen, &c, err);
  if (rc == ES_NOT_FOUND) rc = ES_OK; /* moved meanwhile by another mover */
  copy_in_args ca = {&c, to, from, version, 0, 0};
  if (rc == ES_OK && c.have_si && c.si.fence <= FENCE_FROZEN_BASE) {
    rc = shard_write(s, b, do_copy_in, &ca, err);
    /* the source's rows go only once the target holds the session */
    if (rc == ES_OK && ca.present) rc = shard_write(s, a, do_drop, &sa, err);
    else if (rc == ES_OK)
      rc = es_fail(err, ES_STORAGE,
                   "session '%s' is frozen on shard '%s' but shard '%s' does not wait for it",
                   session, from, to);
  }
  copy_destroy(&c);
  *copied = ca.copied;
  return rc;
}

/* A session row as listed by the mover. */
typedef struct {
  char *name;
  int64_t fence;
  char *source; /* incoming rows: the shard it comes from */
} listed;

typedef struct {
  listed *v;
  size_t n, cap;
  int oom;
} listing;

static void listing_destroy(listing *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    free(l->v[i].source);
  }
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int collect_listed(void *ctx, const es_session_info *row) {
  listing *l = ctx;
  if (es_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) {
    l->oom = 1;
    return 1;
  }
  listed *x = &l->v[l->n];
  x->name = strdup(row->session);
  x->fence = row->fence;
  x->source = row->seal_reason && row->fence == FENCE_INCOMING ? strdup(row->seal_reason) : NULL;
  if (!x->name) {
    free(x->source);
    l->oom = 1;
    return 1;
  }
  l->n++;
  return 0;
}

typedef struct {
  const char *after;
  listing *out;
} list_args;

#define MOVE_PAGE 256

static int do_list_all(es_store *st, es_txn *t, void *arg, es_err *err) {
  list_args *a = arg;
  int rc = real(st)->session_list(real_bk(st), t, "", a->after, MOVE_PAGE, collect_listed, a->out, err);
  if (rc == ES_OK && a->out->oom) rc = nomem(err);
  return rc;
}

typedef struct {
  const char *name;
  es_store *st;
} named_store;

static es_store *store_named(const named_store *v, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0) return v[i].st;
  return NULL;
}

typedef struct {
  int64_t version;
  const char *session;
} tomb_args;

static int do_clear_tomb(es_store *st, es_txn *t, void *arg, es_err *err) {
  tomb_args *a = arg;
  int rc = plan_guard(st, t, a->version, err);
  session_step probe = {a->session, NULL, 0, 0};
  if (rc == ES_OK) rc = do_state(st, t, &probe, err);
  if (rc || probe.state != ST_TOMBSTONE) return rc;
  return real(st)->session_delete(real_bk(st), t, a->session, err);
}

/* Drops the tombstones on shard `me` of sessions `to` gives to `me`. */
static int clear_tombstones(es_store *s, const es_shard_plan *to, const char *me, es_store *st,
                            es_err *err) {
  char *after = NULL;
  int rc = ES_OK;
  for (;;) {
    listing l = {0};
    list_args la = {after, &l};
    rc = shard_read(st, do_list_all, &la, err);
    for (size_t j = 0; rc == ES_OK && j < l.n; j++) {
      if (l.v[j].fence != FENCE_TOMBSTONE || !l.v[j].name[0]) continue;
      if (strcmp(to->v[es_shard_owner(to, l.v[j].name)].name, me) != 0) continue;
      tomb_args ta = {to->version, l.v[j].name};
      rc = shard_write(s, st, do_clear_tomb, &ta, err);
    }
    free(after);
    after = NULL;
    if (rc == ES_OK && l.n == MOVE_PAGE && !(after = strdup(l.v[l.n - 1].name))) rc = nomem(err);
    listing_destroy(&l);
    if (rc || !after) break;
  }
  free(after);
  return rc;
}

/* Moves every session whose owner under `to` is not where it is. */
static int run_moves(es_store *s, const es_shard_plan *from, const es_shard_plan *to,
                     int64_t *moved_n, es_err *err) {
  named_store all[2 * ES_MAX_SHARDS];
  size_t n = 0;
  int rc = ES_OK;
  const es_shard_plan *ps[2] = {from, to};
  for (int k = 0; k < 2 && rc == ES_OK; k++)
    for (size_t i = 0; rc == ES_OK && i < ps[k]->n; i++) {
      if (store_named(all, n, ps[k]->v[i].name)) continue;
      all[n].name = ps[k]->v[i].name;
      rc = shard_store(s, ps[k]->v[i].name, ps[k]->v[i].url, &all[n].st, err);
      if (rc == ES_OK) n++;
    }
  /* 1. every shard learns the new plan: from now on it refuses to create
   *    a session it does not own under it */
  for (size_t i = 0; rc == ES_OK && i < n; i++) {
    record_args ra = {to->version, all[i].name, to};
    rc = shard_write(s, all[i].st, do_record, &ra, err);
  }
  /* 2. every session not on its owner moves there */
  for (size_t i = 0; rc == ES_OK && i < n; i++) {
    char *after = NULL;
    for (;;) {
      listing l = {0};
      list_args la = {after, &l};
      rc = shard_read(all[i].st, do_list_all, &la, err);
      for (size_t j = 0; rc == ES_OK && j < l.n; j++) {
        listed *x = &l.v[j];
        if (!x->name[0] || x->fence == FENCE_TOMBSTONE) continue;
        if (strcmp(x->name, CATALOG_SESSION) == 0) continue; /* never a user's (route_store) */
        const char *owner = to->v[es_shard_owner(to, x->name)].name;
        int copied = 0;
        if (x->fence == FENCE_INCOMING) {
          /* a move into this shard that stopped half-way: finished when
           * its source froze the session, else the incoming row goes */
          es_store *src = x->source ? store_named(all, n, x->source) : NULL;
          session_step st = {x->name, NULL, 0, 0};
          if (src && src != all[i].st) rc = shard_read(src, do_state, &st, err);
          if (rc == ES_OK && st.state == ST_FROZEN)
            rc = move_one(s, to->version, x->name, x->source, src, all[i].name, all[i].st,
                          &copied, err);
          if (rc == ES_OK) {
            session_step sb = {x->name, NULL, 0, to->version};
            rc = shard_write(s, all[i].st, do_unincoming, &sb, err); /* nothing came */
          }
          /* and if it landed off its owner under this plan, on it goes */
          session_step here = {x->name, NULL, 0, 0};
          if (rc == ES_OK && strcmp(owner, all[i].name) != 0)
            rc = shard_read(all[i].st, do_state, &here, err);
          if (rc == ES_OK && here.state == ST_LIVE) {
            int again = 0;
            rc = move_one(s, to->version, x->name, all[i].name, all[i].st, owner,
                          store_named(all, n, owner), &again, err);
            copied |= again;
          }
        } else if (strcmp(owner, all[i].name) != 0) {
          rc = move_one(s, to->version, x->name, all[i].name, all[i].st, owner,
                        store_named(all, n, owner), &copied, err);
        }
        *moved_n += copied;
      }
      free(after);
      after = NULL;
      if (rc == ES_OK && l.n == MOVE_PAGE && !(after = strdup(l.v[l.n - 1].name))) rc = nomem(err);
      listing_destroy(&l);
      if (rc || !after) break;
    }
    free(after);
  }
  /* 3. every session is home: a tombstone on the shard that owns its
   *    session under this plan no longer stands for anything to wait for */
  for (size_t i = 0; rc == ES_OK && i < to->n; i++)
    rc = clear_tombstones(s, to, to->v[i].name, store_named(all, n, to->v[i].name), err);
  return rc;
}

/* Finishes the catalog's pending plan: moves, then marks it current. */
static int finish_pending(es_store *s, int64_t *moved_n, es_err *err) {
  catalog_view v;
  int rc = es_sh_catalog_load(SH(s)->catalog, &v, err);
  if (rc == ES_OK && v.pend.version) {
    es_shard_plan to, from;
    if (es_sh_plan_copy(&to, &v.pend) || es_sh_plan_copy(&from, &v.cur)) {
      es_sh_view_destroy(&v);
      return nomem(err);
    }
    rc = adopt(s, &v, err); /* the handle follows redirects to the new shards */
    if (rc == ES_OK) rc = run_moves(s, &from, &to, moved_n, err);
    if (rc && rc != ES_CLOSED) {
      /* another mover may have finished this plan (and installed a newer
       * one, whose records stop this mover's steps): then it is done */
      catalog_view w;
      es_err ignored = {0};
      if (!crashed(s, &ignored) && es_sh_catalog_load(SH(s)->catalog, &w, &ignored) == ES_OK) {
        if (w.cur.version >= to.version) rc = ES_OK;
        es_sh_view_destroy(&w);
      }
    }
    for (int tries = 0; rc == ES_OK; tries++) {
      catalog_view w;
      if ((rc = es_sh_catalog_load(SH(s)->catalog, &w, err))) break;
      if (w.cur.version < to.version) {
        rc = step(s, err);
        if (rc == ES_OK) rc = es_sh_catalog_put(SH(s)->catalog, &to, "current", w.head, err);
        if (rc == ES_WRONG_EXPECTED_HEAD && tries < 100) rc = ES_OK;
        else if (rc == ES_OK) {
          es_sh_view_destroy(&w);
          continue;
        }
      }
      es_sh_view_destroy(&w);
      break;
    }
    es_shard_plan_destroy(&to);
    es_shard_plan_destroy(&from);
  }
  es_sh_view_destroy(&v);
  if (rc == ES_OK) rc = reload(s, err);
  return rc;
}

static int set_plan_locked(es_store *s, const es_shard_plan *plan, int64_t *moved_n, es_err *err) {
  for (int tries = 0;; tries++) {
    if (tries > 100) return es_fail(err, ES_STORAGE, "the shard catalog kept changing");
    catalog_view v;
    int rc = es_sh_catalog_load(SH(s)->catalog, &v, err);
    if (rc) return rc;
    if (v.pend.version) {
      int same = v.pend.version == plan->version;
      if (same && !es_sh_plan_same_shards(&v.pend, plan)) {
        es_sh_view_destroy(&v);
        return es_fail(err, ES_INVALID_ARGUMENT,
                       "plan version %lld is in the catalog with other shards: a changed plan "
                       "needs a new version",
                       (long long)plan->version);
      }
      es_sh_view_destroy(&v);
      /* an interrupted change is finished first (this one, or an older one) */
      if ((rc = finish_pending(s, moved_n, err)) || same) return rc;
      continue;
    }
    if (plan->version <= v.cur.version) {
      int same = plan->version == v.cur.version && es_sh_plan_same_shards(plan, &v.cur);
      int64_t have = v.cur.version;
      es_sh_view_destroy(&v);
      if (same) return reload(s, err);
      return es_fail(err, ES_INVALID_ARGUMENT,
                     plan->version == have
                         ? "plan version %lld is in the catalog with other shards: a changed "
                           "plan needs a new version"
                         : "plan version %lld is not newer than the catalog's",
                     (long long)plan->version);
    }
    rc = check_identities(s, plan, err);
    if (rc == ES_OK) rc = step(s, err);
    if (rc == ES_OK) rc = es_sh_catalog_put(SH(s)->catalog, plan, "pending", v.head, err);
    es_sh_view_destroy(&v);
    if (rc && rc != ES_WRONG_EXPECTED_HEAD) return rc;
  }
}

int es_shards_set_plan(es_store *s, const es_shard_plan *plan, int64_t *moved_n, es_err *err) {
  *moved_n = 0;
  int rc = sh_enter(s, err);
  if (rc) return rc;
  es_shard_plan want;
  if (es_sh_plan_copy(&want, plan)) return nomem(err);
  rc = es_shard_plan_check(&want, err);
  if (rc == ES_OK) rc = set_plan_locked(s, &want, moved_n, err);
  es_shard_plan_destroy(&want);
  return rc;
}

/* ---- fork (any two shards) -------------------------------------------------- */

typedef struct {
  const char *from, *to;
  int64_t at, now;
  es_events src;       /* from's events 1..at */
  es_snapshots snaps;  /* from's snapshots at or below at, with state */
  char (*ids)[ES_MAX_NAME_BYTES + 1]; /* generated ids, behind the scope */
  es_lineage *out;
  int64_t head;
} xfork;

static int do_fork_source(es_store *st, es_txn *t, void *arg, es_err *err) {
  xfork *f = arg;
  session_copy c;
  memset(&c, 0, sizeof c);
  int rc = st->ops->snapshot_list(st->bk, t, f->from, collect_snap_name, &c, err);
  if (rc == ES_OK && c.oom) rc = nomem(err);
  for (size_t i = 0; rc == ES_OK && i < c.snaps.n; i++) {
    if (c.snaps.v[i].index > f->at) continue;
    es_snapshot full;
    es_snapshot_init(&full);
    rc = st->ops->snapshot_get(st->bk, t, f->from, c.snaps.v[i].reducer, &full, err);
    if (rc == ES_OK &&
        (es_grow((void **)&f->snaps.v, &f->snaps.cap, f->snaps.n + 1, sizeof *f->snaps.v))) {
      es_snapshot_destroy(&full);
      rc = nomem(err);
    }
    if (rc == ES_OK) f->snaps.v[f->snaps.n++] = full;
  }
  es_snapshots_destroy(&c.snaps);
  return rc;
}

static int fork_source(es_store *st, void *arg, es_err *err) {
  xfork *f = arg;
  es_events_destroy(&f->src);
  es_snapshots_destroy(&f->snaps);
  es_sessions probe;
  int rc = es_store_sessions(st, f->from, NULL, 1, &probe, err);
  if (rc) return rc;
  int exists = probe.n && strcmp(probe.v[0].session, f->from) == 0;
  f->head = exists ? probe.v[0].head : 0;
  es_sessions_destroy(&probe);
  if (!exists) return es_fail(err, ES_NOT_FOUND, "no session '%s'", f->from);
  if (f->at > f->head)
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot fork session '%s' at %lld: its head is %lld",
                   f->from, (long long)f->at, (long long)f->head);
  if (f->at > 0 && (rc = es_store_read(st, f->from, 0, f->at, ES_NONE, &f->src, err))) return rc;
  if ((int64_t)f->src.n != f->at)
    return es_fail(err, ES_STORAGE, "session '%s' changed while it was forked", f->from);
  if ((rc = es_core_enter(st, err))) return rc;
  rc = es_core_read(st, do_fork_source, f, err);
  es_core_leave(st);
  return rc;
}

static int do_fork_target(es_store *st, es_txn *t, void *arg, es_err *err) {
  xfork *f = arg;
  const es_backend_ops *ops = st->ops; /* the marker-checking table: `to` may have moved */
  es_session_info dst;
  int rc = ops->session_get(st->bk, t, f->to, &dst, err);
  if (rc == ES_NOT_FOUND) {
    rc = ES_OK;
    es_session_info_init(&dst);
    if (!(dst.session = strdup(f->to))) return nomem(err);
  } else if (rc) {
    return rc;
  }
  if (dst.head > 0)
    rc = es_fail(err, ES_INVALID_ARGUMENT, "cannot fork into session '%s': it already has events",
                 f->to);
  else if (dst.parent)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot fork into session '%s': it is already a fork of '%s'", f->to, dst.parent);
  else if (f->at > 0 && dst.sealed_at != ES_NONE)
    rc = es_fail(err, ES_SEALED, "session '%s' is sealed%s%s", f->to, dst.seal_reason ? ": " : "",
                 dst.seal_reason ? dst.seal_reason : "");
  for (size_t i = 0; rc == ES_OK && i < f->src.n; i++) {
    const es_event *e = &f->src.v[i];
    if (e->key) {
      rc = es_fail(err, ES_INVALID_ARGUMENT, "cannot fork encrypted events on a sharded store");
      break;
    }
    es_event other;
    es_event_init(&other);
    if (ops->event_get_by_id(st->bk, t, f->ids[i], &other, err) == ES_OK) {
      es_event_destroy(&other);
      rc = es_fail(err, ES_INVALID_ARGUMENT, "the id source returned '%s', an id already stored",
                   f->ids[i]);
      break;
    }
    es_event row;
    es_event_init(&row);
    row.id = f->ids[i];
    row.type = e->type;
    row.payload = e->payload;
    row.payload_len = e->payload_len;
    row.session = dst.session;
    row.lane = e->lane;
    row.index = e->index;
    row.created_at = e->created_at;
    row.cause_index = e->cause_index;
    row.cause_attempt = e->cause_attempt;
    row.not_before = e->not_before;
    row.status = ES_STATUS_PROCESSED;
    row.processed_at = f->now;
    row.returned = -1;
    row.origin_session = (char *)f->from;
    row.origin_index = e->index;
    rc = ops->event_insert(st->bk, t, &row, err);
  }
  for (size_t i = 0; rc == ES_OK && i < f->snaps.n; i++)
    rc = ops->snapshot_put(st->bk, t, f->to, &f->snaps.v[i], err);
  if (rc == ES_OK) {
    dst.head = dst.events = f->at;
    if (f->src.n) dst.first_at = f->src.v[0].created_at;
    dst.parent = strdup(f->from);
    dst.fork_at = f->at;
    dst.forked_at = dst.updated_at = f->now;
    rc = dst.parent ? ops->session_put(st->bk, t, &dst, err) : nomem(err);
  }
  if (rc == ES_OK) {
    f->out->session = strdup(f->to);
    f->out->parent = strdup(f->from);
    f->out->at = f->at;
    f->out->created_at = f->now;
    if (!f->out->session || !f->out->parent) rc = nomem(err);
  }
  es_session_info_destroy(&dst);
  return rc;
}

static int fork_target(es_store *st, void *arg, es_err *err) {
  xfork *f = arg;
  es_lineage_destroy(f->out);
  memset(f->out, 0, sizeof *f->out);
  int rc = es_core_enter(st, err);
  if (rc) return rc;
  rc = es_core_write(st, do_fork_target, f, err);
  es_core_leave(st);
  return rc;
}

static int shards_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to, es_lineage *out,
                   es_err *err) {
  memset(out, 0, sizeof *out);
  int rc;
  if ((rc = es_check_name("from", from, err)) || (rc = es_check_name("to", to, err))) return rc;
  if (at < 0) return es_fail(err, ES_INVALID_ARGUMENT, "at must be >= 0");
  if (strcmp(from, to) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "cannot fork session '%s' into itself", from);
  /* lineage must stay a tree: `to` may not be an ancestor of `from` */
  char *cur = strdup(from);
  for (int depth = 0; cur && rc == ES_OK && depth < 100000; depth++) {
    int found = 0;
    es_lineage l;
    rc = shards_lineage(s, cur, &found, &l, err);
    free(cur);
    cur = NULL;
    if (rc || !found) break;
    if (strcmp(l.parent, to) == 0)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot fork '%s' into '%s': '%s' is its ancestor (lineage must not loop)", from,
                   to, to);
    cur = l.parent;
    l.parent = NULL;
    es_lineage_destroy(&l);
  }
  free(cur);
  if (rc) return rc;
  xfork f;
  memset(&f, 0, sizeof f);
  f.from = from;
  f.to = to;
  f.at = at;
  f.out = out;
  rc = routed(s, "from", from, fork_source, &f, err);
  if (rc == ES_OK && f.src.n && !(f.ids = calloc(f.src.n, sizeof *f.ids))) rc = nomem(err);
  size_t sl = scope ? strlen(scope) : 0;
  if (sl > ES_MAX_TENANT_BYTES + 1) rc = es_fail(err, ES_INVALID_ARGUMENT, "scope is too long");
  for (size_t i = 0; rc == ES_OK && i < f.src.n; i++) {
    memcpy(f.ids[i], scope ? scope : "", sl);
    rc = es_store_new_id(s, f.ids[i] + sl, err);
  }
  if (rc == ES_OK) rc = es_store_now(s, &f.now, err);
  if (rc == ES_OK) rc = routed(s, "to", to, fork_target, &f, err);
  es_events_destroy(&f.src);
  es_snapshots_destroy(&f.snaps);
  free(f.ids);
  if (rc) es_lineage_destroy(out);
  return rc;
}

int es_shards_read_all_cursor(es_store *s, const char *cursor, int64_t limit, es_events *out,
                              char ***cursors, es_err *err) {
  return read_all_cursor(s, NULL, cursor, limit, out, cursors, err);
}

/* ---- the table (store_impl.h) --------------------------------------------- */

static int shards_check_open(es_store *s, es_err *err) { return sh_enter(s, err); }

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
    .read = shards_read,
    .events_page = shards_events_page,
    .head = shards_head,
    .read_all = shards_read_all,
    .last_position = shards_last_position,
    .get = shards_get,
    .claim = shards_claim,
    .claim_next = shards_claim_next,
    .renew = shards_renew,
    .release_claims = shards_release_claims,
    .complete = shards_complete,
    .complete_many = es_complete_many_each,
    .fail = shards_fail,
    .revive = shards_revive,
    .settle = shards_settle,
    .dead_letters = shards_dead_letters,
    .read_state = shards_read_state,
    .read_states = shards_read_states,
    .put_snapshot = shards_put_snapshot,
    .snapshots = shards_snapshots,
    .sessions = shards_sessions,
    .pending_types = shards_pending_types,
    .wait = shards_wait,
    .presence_set = shards_presence_set,
    .presence_read = shards_presence_read,
    .presence_watch = shards_presence_watch,
    .presence_unwatch = shards_presence_unwatch,
    .fork = shards_fork,
    .lineage = shards_lineage,
    .children = shards_children,
    .put_ref = shards_put_ref,
    .get_ref = shards_get_ref,
    .list_refs = shards_list_refs,
    .delete_ref = shards_delete_ref,
    .promote = shards_promote,
    .fence = shards_fence,
    .lease = shards_lease,
    .lease_release = shards_lease_release,
    .seal = shards_seal,
    .truncate = shards_truncate,
    .delete = shards_delete,
    .archive = shards_archive,
    .segments = shards_segments,
    .compact_archive = shards_compact_archive,
    .verify_archive = shards_verify_archive,
    .shred = shards_shred,
    .read_at_rest = shards_read_at_rest,
    .counts = shards_counts,
};
