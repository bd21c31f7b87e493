/*
 * store.c: the store's front door and every rule of CONTRACT.md §3, written
 * once for all backends.
 *
 * A call validates its arguments, reads the clock once, and runs its work
 * as one function inside a backend transaction (run_write / run_read).
 * Backends only store and find rows (backend.h); this file decides every
 * value they store, including the dispatch bookkeeping:
 *
 *   queued  the event is a dispatch candidate: pending, not dead, and (if
 *           laned) the oldest unprocessed event of its lane.
 *   due_at  for a queued event, the time it is (or becomes) ready: the end
 *           of its live claim, its not_before, or its backoff end. An event
 *           is ready exactly when queued and due_at <= now, so "claim" and
 *           "claim_next" are index lookups, never scans.
 *
 * Group commit (backends with group_commit = 1; run_write_group): writers
 * queue their work, and one of them, the leader, runs every queued
 * caller's work in one transaction, each in its own savepoint, and commits
 * once (one sync) for all, who return only after that commit; a failed
 * commit fails them all.
 */
#include "store/store.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "store/backend.h"
#include "store/internal.h"
#include "store/crypto.h"
#include "codec/json.h"

#define GROUP_MAX 1024        /* callers per group commit at most */
#define WAIT_POLL_MS 50       /* how often es_store_wait looks for other processes' commits */

/* ---------------------------------------------------------------------- */
/* small helpers */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The length (1-4) of the valid UTF-8 sequence at s (n bytes left), or 0
 * when s does not start one (a stray continuation byte, an overlong form,
 * a surrogate, a code point above U+10FFFF, a sequence cut short). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (len > n) return 0;
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[k] & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

static int utf8_valid(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t len = utf8_seq(s + i, n - i);
    if (len == 0) return 0;
    i += len;
  }
  return 1;
}

/* §3.11: the length of the tenant prefix a stored name starts with (the
 * bytes up to and including an ES_TENANT_SEP among its first
 * ES_MAX_TENANT_BYTES + 1 bytes), 0 when it has none. */
static size_t tenant_prefix_len(const char *v, size_t n) {
  const char *sep = memchr(v, ES_TENANT_SEP[0], n < ES_MAX_TENANT_BYTES + 1 ? n : ES_MAX_TENANT_BYTES + 1);
  return sep ? (size_t)(sep - v) + 1 : 0;
}

/* Names (sessions, ids, types, lanes, holders, reducers, namespaces): a
 * non-empty UTF-8 string of at most 255 bytes, not counting a tenant
 * prefix (§3.11: a tenant's names reach the core as tenant + SEP + name,
 * and the root handle names them so). */
int es_check_name(const char *what, const char *v, es_err *err) {
  if (!v) return es_fail(err, ES_INVALID_ARGUMENT, "%s is required", what);
  size_t n = strlen(v);
  if (n == 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s must not be empty", what);
  if (n - tenant_prefix_len(v, n) > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is %zu bytes, at most %d allowed", what,
                   n - tenant_prefix_len(v, n), ES_MAX_ID_BYTES);
  if (!utf8_valid((const unsigned char *)v, n))
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is not valid UTF-8", what);
  return ES_OK;
}

/* U+FFFD REPLACEMENT CHARACTER and U+2026 HORIZONTAL ELLIPSIS in UTF-8. */
#define REPLACEMENT "\xEF\xBF\xBD"
#define ELLIPSIS "\xE2\x80\xA6"

int es_text_clean(const char *s, size_t n, size_t max, char **out, size_t *out_len) {
  const unsigned char *p = (const unsigned char *)s;
  /* Each input byte gives at most 3 output bytes (one U+FFFD). */
  size_t cap = n > max / 3 ? max : n * 3;
  char *o = malloc(cap + 1);
  *out = NULL;
  if (out_len) *out_len = 0;
  if (!o) return ES_STORAGE;
  size_t k = 0, i = 0;
  int cut = 0;
  while (i < n) {
    size_t len = p[i] == 0 ? 0 : utf8_seq(p + i, n - i);
    const char *piece = len ? s + i : REPLACEMENT;
    size_t plen = len ? len : 3;
    if (k + plen > max) {
      cut = 1;
      break;
    }
    memcpy(o + k, piece, plen);
    k += plen;
    i += len ? len : 1;
  }
  if (cut) {
    /* Make room for the ellipsis, backing off whole characters only. */
    while (k > 0 && k + 3 > max) {
      do k--;
      while (k > 0 && ((unsigned char)o[k] & 0xC0) == 0x80);
    }
    if (k + 3 <= max) {
      memcpy(o + k, ELLIPSIS, 3);
      k += 3;
    }
  }
  o[k] = '\0';
  *out = o;
  if (out_len) *out_len = k;
  return ES_OK;
}

/* now + d for a duration d >= 0; 1 when the sum would pass INT64_MAX (the
 * largest time there is: refused, never wrapped to a time in the past). */
static int add_time(int64_t now, int64_t d, int64_t *sum) {
  if (now > 0 && d > INT64_MAX - now) return 1;
  *sum = now + d;
  return 0;
}

static int too_late(es_err *err, const char *what) {
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "%s is too large: now + %s is beyond the largest time (%lld)", what, what,
                 (long long)INT64_MAX);
}

int es_timer_not_before(const char *what, int64_t now, int has_delay, int64_t delay_ms,
                        int has_at, int64_t at, int64_t *not_before, es_err *err) {
  if (!what) what = "event";
  *not_before = ES_NONE;
  if (has_delay && has_at)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s has both delay_ms and at (give one)", what);
  if (has_at) {
    if (at < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s.at must be >= 0", what);
    *not_before = at;
  }
  if (has_delay) {
    if (delay_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s.delay_ms must be >= 0", what);
    if (add_time(now, delay_ms, not_before)) {
      *not_before = ES_NONE;
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "%s.delay_ms is too large: now + delay_ms is beyond the largest time (%lld)",
                     what, (long long)INT64_MAX);
    }
  }
  return ES_OK;
}

/* Count limits: ES_NONE (none) stays; a negative one is refused by the
 * caller; anything above ES_MAX_LIMIT saturates (it could never be reached,
 * and backends add small windows to limits). */
static int64_t cap_limit(int64_t limit) {
  return limit != ES_NONE && limit > ES_MAX_LIMIT ? ES_MAX_LIMIT : limit;
}

/* Optional non-negative integers (positions, indexes, times): ES_NONE or
 * >= 0. */
static int check_nonneg(const char *what, int64_t v, es_err *err) {
  if (v != ES_NONE && v < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s must be >= 0", what);
  return ES_OK;
}

static int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

static void notify_commit(es_store *s) {
  pthread_mutex_lock(&s->vmu);
  atomic_fetch_add(&s->version, 1);
  pthread_cond_broadcast(&s->vcond);
  pthread_mutex_unlock(&s->vmu);
}

static void group_init(es_store *s);

/* ---------------------------------------------------------------------- */
/* lifecycle */

static const es_backend_ops *const backends[] = {&es_backend_memory, &es_backend_sqlite,
                                                 &es_backend_postgres, &es_backend_postgresql};

/* The fields and locks every handle has (a store, a sharded store),
 * from the open options; es_core_handle_destroy undoes the locks. */
void es_core_handle_init(es_store *s, const es_open_opts *opts) {
  s->clock = opts->clock ? opts->clock : es_clock_system;
  s->clock_ctx = opts->clock_ctx;
  s->ids = opts->ids;
  s->ids_ctx = opts->ids_ctx;
  s->max_payload = opts->max_payload_bytes ? opts->max_payload_bytes : ES_DEFAULT_MAX_PAYLOAD;
  s->max_batch = opts->max_batch_events ? opts->max_batch_events : ES_DEFAULT_MAX_BATCH;
  pthread_mutex_init(&s->lmu, NULL);
  pthread_cond_init(&s->lcond, NULL);
  pthread_mutex_init(&s->wmu, NULL);
  pthread_mutex_init(&s->dmu, NULL);
  group_init(s);
  pthread_mutex_init(&s->vmu, NULL);
  pthread_cond_init(&s->vcond, NULL);
  pthread_mutex_init(&s->umu, NULL);
  pthread_mutex_init(&s->pmu, NULL);
  atomic_init(&s->refs, 1);
  atomic_init(&s->version, 0);
  s->next_token = 1;
  s->rand_used = sizeof s->rand_pool;
}

void es_core_handle_destroy(es_store *s) {
  pthread_mutex_destroy(&s->lmu);
  pthread_cond_destroy(&s->lcond);
  pthread_mutex_destroy(&s->wmu);
  pthread_mutex_destroy(&s->dmu);
  pthread_mutex_destroy(&s->qmu);
  pthread_cond_destroy(&s->qcond);
  pthread_mutex_destroy(&s->vmu);
  pthread_cond_destroy(&s->vcond);
  pthread_mutex_destroy(&s->umu);
  pthread_mutex_destroy(&s->pmu);
}

int es_store_open(const char *url, const es_open_opts *opts, es_store **out, es_err *err) {
  static const es_open_opts defaults = {0};
  const es_backend_ops *ops = NULL;
  const char *rest = "";
  *out = NULL;
  if (!opts) opts = &defaults;
  if (!url) url = "memory:";
  const char *colon = strchr(url, ':');
  if (colon) {
    size_t n = (size_t)(colon - url);
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++) {
      if (strlen(backends[i]->scheme) == n && memcmp(backends[i]->scheme, url, n) == 0) {
        ops = backends[i];
        rest = colon + 1;
      }
    }
  }
  /* "shards:CATALOG_URL": the sharded store whose plan that catalog holds
   * (shards.c; with a plan to install: es_shards_open). */
  if (!ops && strncmp(url, "shards:", 7) == 0) return es_shards_open_url(url + 7, opts, out, err);
  if (!ops)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "unknown store url '%s' (expected memory:, sqlite:PATH, postgres://..., "
                   "shards:CATALOG_URL)", url);
  es_store *s = calloc(1, sizeof *s);
  if (!s) return nomem(err);
  s->ops = ops;
  es_shards_wrap_ops(s); /* the shard-move markers (shards.c) */
  es_core_handle_init(s, opts);
  /* §3.10: a store with keys has the backend overwrite what it deletes, so
   * a shredded key or a dropped snapshot does not linger in free space. */
  es_open_opts bo = *opts;
  if (opts->keys_path) bo.secure_delete = 1;
  int rc = ops->open(rest, &bo, &s->bk, err);
  if (rc == ES_OK) rc = es_archive_setup(s, ops->scheme, rest, opts, err); /* §3.9 */
  if (rc == ES_OK && opts->keys_path) rc = es_crypto_open(s, opts->keys_path, err);
  if (rc != ES_OK) {
    if (s->bk) {
      s->ops->close(s->bk);
      s->bk = NULL;
    }
    s->closed = 1;
    es_store_release(s);
    return rc;
  }
  *out = s;
  return ES_OK;
}

void es_store_close(es_store *s) {
  if (s->shards) {
    es_shards_close(s);
    return;
  }
  if (s->base) {
    es_tenant_close(s);
    return;
  }
  pthread_mutex_lock(&s->lmu);
  if (s->closed) {
    pthread_mutex_unlock(&s->lmu);
    return;
  }
  s->closed = 1;
  if (s->ops->wake) s->ops->wake(s->bk); /* a wait blocked in the backend returns now */
  while (s->inflight > 0) pthread_cond_wait(&s->lcond, &s->lmu);
  pthread_mutex_unlock(&s->lmu);
  /* No call is in flight, so no group transaction is open. */
  s->ops->close(s->bk);
  s->bk = NULL;
  notify_commit(s); /* wake waiters so they see CLOSED */
}

void es_store_retain(es_store *s) { atomic_fetch_add(&s->refs, 1); }

void es_store_release(es_store *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  if (s->shards) {
    es_shards_free(s);
    return;
  }
  if (s->base) {
    es_tenant_free(s);
    return;
  }
  es_store_close(s);
  presence_watch *w = s->watches;
  while (w) {
    presence_watch *next = w->next;
    free(w->ns);
    free(w);
    w = next;
  }
  es_core_handle_destroy(s);
  es_stats_destroy(&s->stats); /* §3.12 */
  es_archive_teardown(s); /* §3.9 */
  es_crypto_free(s->crypto);
  free(s);
}

/* Every call is bracketed by enter/leave so close() can wait for it. */
int es_core_enter(es_store *s, es_err *err) {
  pthread_mutex_lock(&s->lmu);
  if (s->closed) {
    pthread_mutex_unlock(&s->lmu);
    return es_fail(err, ES_CLOSED, "the store is closed");
  }
  s->inflight++;
  pthread_mutex_unlock(&s->lmu);
  return ES_OK;
}

void es_core_leave(es_store *s) {
  pthread_mutex_lock(&s->lmu);
  if (--s->inflight == 0) pthread_cond_broadcast(&s->lcond);
  pthread_mutex_unlock(&s->lmu);
}

size_t es_store_max_payload(const es_store *s) { return s->max_payload; }

/* Every reading of a store's clock passes here, so the clock's range
 * (docs/limits.md "The clock") is one check: a time before the epoch is
 * refused, and with it math.mininteger, which is ES_NONE ("absent") to
 * the rest of the API (an event stamped with it would read back without
 * created_at). */
int es_store_now(es_store *s, int64_t *now, es_err *err) {
  if (s->base) s = s->base; /* a tenant shares its store's clock */
  int rc = s->clock(s->clock_ctx, now, err);
  if (rc == ES_OK && *now < 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the store's clock read %lld, outside its range 0..math.maxinteger (ms since the epoch)",
                   (long long)*now);
  return rc;
}

uint64_t es_store_version(es_store *s) {
  if (s->shards) return es_shards_version(s);
  if (s->base) s = s->base; /* commits happen in the store a tenant handle is made from */
  return atomic_load(&s->version);
}

int es_store_data_version(es_store *s, uint64_t *version, es_err *err) {
  if (s->shards) return es_shards_data_version(s, version, err);
  if (s->base) return es_tenant_data_version(s, version, err);
  *version = 0;
  if (!s->ops->data_version) return ES_OK;
  int rc = es_core_enter(s, err);
  if (rc) return rc;
  rc = s->ops->data_version(s->bk, version, err);
  es_core_leave(s);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* transactions */

/* Group commit (backends with group_commit = 1; docs/store.md
 * "Transactions, threads and group commit").
 *
 * A writer queues its work (fn, arg) and sleeps on its own semaphore. The
 * first writer to find nobody leading becomes the group's leader: it takes
 * wmu, begins the transaction and runs every queued caller's fn, each in
 * its own savepoint, in one pass on its own thread; then it takes the
 * callers who queued meanwhile, and so on until nobody is left; then it
 * commits once (one sync), hands the lead to the first caller queued
 * during the commit, and wakes each member with its own result.
 *
 * Why the leader runs the others' work: a group used to hand wmu from
 * caller to caller (a context switch per member to get the lock, another
 * to go back to sleep, and a broadcast that woke every member to fight for
 * wmu again); on a two-core machine those switches cost more than the
 * rows. Now a member sleeps once and is woken once, by the leader, after
 * the sync of the commit that holds its rows.
 *
 * Why the leader may wait: right after a commit the last group's members
 * are only waking up. The first to come back would lead a group of one
 * and commit it alone while the others queue behind it (groups of 1, 15,
 * 1, 15... with 16 writers: half the commits wasted). So when the queue
 * is empty before the group is as large as the last one, the leader waits
 * for the missing callers, at most one commit's time (what committing
 * without them would cost them anyway), and learns the new size from the
 * group it commits: writers that stopped writing cost one such wait.
 *
 * A store with an id source (es_open_opts.ids) promises to call it on the
 * calling thread (store.h), and the source is called inside fn: there the
 * leader hands the transaction to each member's thread in turn (the
 * member runs its fn and posts the leader back), which costs the context
 * switches again, for stores whose ids are made by the application.
 *
 * A member whose fn fails has its savepoint rolled back and gets its own
 * error; the others are not touched. A failed begin fails the callers
 * taken for that transaction (they ran nothing); a failed commit fails
 * every member whose fn succeeded. */
/* A member's turn to run its own fn (a store with an id source). */
typedef struct group_turn {
  int alone;        /* group_run's argument */
  int *committed;
  sem_t back;       /* posted by the member when its fn ran */
} group_turn;

struct group_waiter {
  txn_fn fn;        /* the caller's work, run by the leader */
  void *arg;
  int rc;           /* set by the leader before it posts wake */
  es_err err;
  int lead;         /* woken to lead the next group, not done */
  group_turn *turn; /* woken to run fn on its own thread, not done */
  sem_t wake;
  struct group_waiter *next;
};

#define GROUP_WAIT_MAX_NS 10000000 /* a leader waits at most 10 ms for late members */

static void group_init(es_store *s) {
  pthread_condattr_t ca;
  pthread_mutex_init(&s->qmu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->qcond, &ca);
  pthread_condattr_destroy(&ca);
  s->queue = NULL;
  s->queue_tail = &s->queue;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Takes up to max callers off the queue (qmu held); returns them linked. */
static group_waiter *group_take(es_store *s, int max) {
  group_waiter *first = s->queue, *last = NULL;
  int n = 0;
  for (group_waiter *w = first; w && n < max; w = w->next) {
    last = w;
    n++;
  }
  if (!last) return NULL;
  s->queue = last->next;
  if (!s->queue) s->queue_tail = &s->queue;
  s->queued -= n;
  s->taken += n;
  last->next = NULL;
  return first;
}

/* With the queue empty and the group smaller than the last one: waits
 * (qmu held) until enough callers queued or *deadline (set at the first
 * wait of the group) passed. */
static void group_wait_late(es_store *s, int n, int64_t *deadline) {
  if (*deadline == 0) {
    int64_t budget = s->commit_ns < GROUP_WAIT_MAX_NS ? s->commit_ns : GROUP_WAIT_MAX_NS;
    *deadline = mono_ns() + budget;
  }
  struct timespec ts = {(time_t)(*deadline / 1000000000), (long)(*deadline % 1000000000)};
  s->want = s->last_group - n;
  while (s->queued < s->want) {
    if (pthread_cond_timedwait(&s->qcond, &s->qmu, &ts) != 0 && mono_ns() >= *deadline) break;
  }
  s->want = 0;
}

/* Runs one member's work in its own savepoint of the group transaction.
 * *committed is set when the member was alone and took the backend's
 * release_commit (release and commit in one step): the transaction is
 * then over. */
static int group_run(es_store *s, group_waiter *m, int alone, int *committed) {
  es_txn *t = s->wtxn;
  int rc = s->ops->savepoint(t, &m->err);
  if (rc != ES_OK) return rc;
  rc = m->fn(s, t, m->arg, &m->err);
  if (rc == ES_OK && alone && s->ops->release_commit) {
    pthread_mutex_lock(&s->qmu);
    alone = s->queued == 0;
    pthread_mutex_unlock(&s->qmu);
    if (alone) {
      /* Alone in the transaction, nobody queued to join: release and
       * commit in one step (one round trip on PostgreSQL). The
       * transaction holds this caller's work only, so a failure is this
       * caller's alone, as a failed release would be. */
      *committed = 1;
      s->wtxn = NULL;
      return s->ops->release_commit(t, &m->err);
    }
  }
  if (rc == ES_OK) rc = s->ops->savepoint_release(t, &m->err);
  if (rc != ES_OK) s->ops->savepoint_rollback(t);
  return rc;
}

/* The leader's part: runs and commits one group, then passes the lead on
 * and wakes the members (me, the leader's own entry, is not posted). */
static void group_lead(es_store *s, group_waiter *me) {
  group_waiter *group = NULL, **tail = &group;
  int n = 0, n_ok = 0, committed = 0;
  int64_t deadline = 0;
  es_err berr = {0};
  pthread_mutex_lock(&s->wmu);
  int brc = s->ops->write_begin(s->bk, &s->wtxn, &berr);
  for (;;) {
    pthread_mutex_lock(&s->qmu);
    if (!s->queue && brc == ES_OK && !committed && n_ok > 0 && n < s->last_group)
      group_wait_late(s, n, &deadline);
    group_waiter *batch = group_take(s, GROUP_MAX - n);
    pthread_mutex_unlock(&s->qmu);
    if (!batch) break;
    for (group_waiter *m = batch; m; m = m->next) {
      n++;
      if (brc != ES_OK) {
        m->rc = brc;
        m->err = berr;
      } else if (committed) {
        /* cannot happen: release_commit is taken with nobody queued, and
         * only this leader takes callers off the queue */
        m->rc = es_fail(&m->err, ES_STORAGE, "group commit: transaction already committed");
      } else {
        int alone = n == 1 && !m->next && s->last_group <= 1;
        if (m == me || !s->ids) {
          m->rc = group_run(s, m, alone, &committed);
        } else {
          group_turn turn = {alone, &committed, {{0}}};
          sem_init(&turn.back, 0, 0);
          m->turn = &turn;
          sem_post(&m->wake);
          while (sem_wait(&turn.back) != 0) {
          }
          sem_destroy(&turn.back);
        }
        if (m->rc == ES_OK) n_ok++;
      }
    }
    *tail = batch;
    while (*tail) tail = &(*tail)->next;
    if (brc != ES_OK || committed || n >= GROUP_MAX) break;
  }
  int64_t commit_ns = 0;
  if (brc == ES_OK && !committed) {
    es_err cerr = {0};
    int crc = ES_OK;
    if (n_ok > 0) {
      int64_t t0 = mono_ns();
      crc = s->ops->write_commit(s->wtxn, &cerr);
      commit_ns = mono_ns() - t0;
    } else {
      s->ops->write_rollback(s->wtxn);
    }
    s->wtxn = NULL;
    for (group_waiter *m = group; m; m = m->next) {
      if (m->rc == ES_OK && crc != ES_OK) {
        m->rc = crc;
        m->err = cerr;
      }
    }
    committed = n_ok > 0 && crc == ES_OK;
  } else if (committed) {
    committed = group->rc == ES_OK;
  }
  pthread_mutex_unlock(&s->wmu);
  if (committed) notify_commit(s);
  pthread_mutex_lock(&s->qmu);
  s->taken = 0;
  if (brc == ES_OK) {
    s->last_group = n;
    if (commit_ns > 0) s->commit_ns = commit_ns;
  }
  if (s->queue) {
    s->queue->lead = 1;
    sem_post(&s->queue->wake);
  } else {
    s->leading = 0;
  }
  pthread_mutex_unlock(&s->qmu);
  /* A member returns as soon as it is posted (its entry is on its stack):
   * read next first, touch nothing after. */
  for (group_waiter *m = group, *next; m; m = next) {
    next = m->next;
    if (m != me) sem_post(&m->wake);
  }
}

static int run_write_group(es_store *s, txn_fn fn, void *arg, es_err *err) {
  group_waiter me;
  memset(&me, 0, sizeof me);
  me.fn = fn;
  me.arg = arg;
  sem_init(&me.wake, 0, 0);
  pthread_mutex_lock(&s->qmu);
  *s->queue_tail = &me;
  s->queue_tail = &me.next;
  s->queued++;
  int lead = !s->leading;
  if (lead) s->leading = 1;
  if (s->want > 0 && s->queued >= s->want) pthread_cond_signal(&s->qcond);
  pthread_mutex_unlock(&s->qmu);
  for (;;) {
    if (lead) {
      /* me is run by this group (it is queued, and nobody else takes
       * callers off the queue while this thread leads) */
      group_lead(s, &me);
      break;
    }
    while (sem_wait(&me.wake) != 0) {
    }
    if (me.turn) {
      group_turn *turn = me.turn;
      me.turn = NULL;
      me.rc = group_run(s, &me, turn->alone, turn->committed);
      sem_post(&turn->back); /* the leader reads me.rc; turn is on its stack */
      continue;
    }
    if (!me.lead) break;
    me.lead = 0;
    lead = 1;
  }
  sem_destroy(&me.wake);
  if (me.rc != ES_OK && err) *err = me.err;
  return me.rc;
}

int es_core_write(es_store *s, txn_fn fn, void *arg, es_err *err) {
  if (s->ops->group_commit) return run_write_group(s, fn, arg, err);
  es_txn *t = NULL;
  pthread_mutex_lock(&s->wmu);
  int rc = s->ops->write_begin(s->bk, &t, err);
  if (rc == ES_OK) {
    rc = fn(s, t, arg, err);
    if (rc == ES_OK) {
      rc = s->ops->write_commit(t, err);
    } else {
      s->ops->write_rollback(t);
    }
  }
  pthread_mutex_unlock(&s->wmu);
  if (rc == ES_OK) notify_commit(s);
  return rc;
}

int es_core_read(es_store *s, txn_fn fn, void *arg, es_err *err) {
  es_txn *t = NULL;
  int rc = s->ops->read_begin(s->bk, &t, err);
  if (rc != ES_OK) return rc;
  rc = fn(s, t, arg, err);
  s->ops->read_end(t);
  return rc;
}

int es_core_outside_txn(es_store *s, int (*fn)(es_store *s, void *arg, es_err *err), void *arg,
                        es_err *err) {
  /* A group transaction is open only while its leader holds wmu. */
  pthread_mutex_lock(&s->wmu);
  int rc = fn(s, arg, err);
  pthread_mutex_unlock(&s->wmu);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* event ids: UUIDv7 (RFC 9562), strictly increasing per handle */

static int uuid7(es_store *s, int64_t now, char out[37], es_err *err) {
  unsigned char r[10];
  pthread_mutex_lock(&s->umu);
  /* One getrandom() per few hundred ids: a syscall per id cost more than
   * the rest of an append. */
  if (s->rand_used + sizeof r > sizeof s->rand_pool) {
    if (getrandom(s->rand_pool, sizeof s->rand_pool, 0) != (ssize_t)sizeof s->rand_pool) {
      pthread_mutex_unlock(&s->umu);
      return es_fail(err, ES_STORAGE, "no randomness for an event id");
    }
    s->rand_used = 0;
  }
  memcpy(r, s->rand_pool + s->rand_used, sizeof r);
  s->rand_used += sizeof r;
  if (now > s->uuid_ms) {
    s->uuid_ms = now;
    s->uuid_seq = ((uint32_t)r[8] << 8 | r[9]) & 0x3FF; /* random start, room to count */
  } else if (++s->uuid_seq > 0xFFF) {
    /* Borrow the next millisecond rather than repeat (a clock stuck at the
     * largest time keeps it; the 62 random bits still tell ids apart). */
    if (s->uuid_ms < INT64_MAX) s->uuid_ms++;
    s->uuid_seq = 0;
  }
  uint64_t ms = (uint64_t)s->uuid_ms;
  uint32_t seq = s->uuid_seq;
  pthread_mutex_unlock(&s->umu);
  unsigned char b[16];
  for (int i = 0; i < 6; i++) b[i] = (unsigned char)(ms >> (40 - 8 * i));
  b[6] = (unsigned char)(0x70 | (seq >> 8));
  b[7] = (unsigned char)(seq & 0xFF);
  b[8] = (unsigned char)(0x80 | (r[0] & 0x3F));
  memcpy(b + 9, r + 1, 7);
  static const char hex[] = "0123456789abcdef";
  int o = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
    out[o++] = hex[b[i] >> 4];
    out[o++] = hex[b[i] & 15];
  }
  out[o] = '\0';
  return ES_OK;
}

/* An id from the injected source, checked to be a name. */
static int source_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  out[0] = '\0';
  int rc = s->ids(s->ids_ctx, out, ES_MAX_ID_BYTES + 1, err);
  if (rc) return rc;
  out[ES_MAX_ID_BYTES] = '\0';
  return es_check_name("the id source's id", out, err);
}

int es_store_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  /* A tenant's ids are the store's, prefixed when stored (es_tenant_append
   * maps a given id in): the caller sees the unprefixed id. */
  if (s->base) s = s->base;
  if (s->ids) return source_id(s, out, err);
  int64_t now;
  int rc = es_store_now(s, &now, err);
  return rc ? rc : uuid7(s, now, out, err);
}

/* A generated event id, from the store's id source when it has one. An
 * injected source is trusted with nothing: its id must be a name and new,
 * or the call fails before writing a row with it. */
static int new_event_id(es_store *s, es_txn *t, int64_t now, const char *scope,
                        char out[ES_MAX_NAME_BYTES + 1], es_err *err) {
  /* §3.11: a tenant's generated id is the generated id behind its prefix,
   * so every id in a tenant's sessions is the tenant's own. */
  size_t p = scope ? strlen(scope) : 0;
  memcpy(out, scope ? scope : "", p);
  if (!s->ids) return uuid7(s, now, out + p, err);
  int rc = source_id(s, out + p, err);
  if (rc) return rc;
  es_event row;
  rc = s->ops->event_get_by_id(t, out, &row, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc == ES_OK) {
    es_event_destroy(&row);
    rc = es_fail(err, ES_INVALID_ARGUMENT, "the id source returned '%s', an id already stored", out);
  }
  return rc;
}

/* ---------------------------------------------------------------------- */
/* the rules */

/* Attempt `attempt` owns the event from the claim that started it until it
 * completes or fails, or a later claim starts attempt + 1 (CONTRACT §3.1). */
static int owns(const es_event *row, int64_t attempt) {
  return row->status == ES_STATUS_PENDING && row->attempts == attempt && row->claim_holder != NULL;
}

/* The time a queued, unclaimed event becomes ready. */
static int64_t due_of(const es_event *row, int64_t now) {
  int64_t due = now;
  if (row->not_before != ES_NONE) due = max64(due, row->not_before);
  if (row->retry_at != ES_NONE) due = max64(due, row->retry_at);
  return due;
}

static int load_session(es_store *s, es_txn *t, const char *session, es_session_info *si,
                        es_err *err) {
  int rc = s->ops->session_get(t, session, si, err);
  if (rc == ES_NOT_FOUND) {
    es_session_info_init(si);
    si->session = strdup(session);
    return si->session ? ES_OK : nomem(err);
  }
  return rc;
}

static int get_event(es_store *s, es_txn *t, const char *session, int64_t index, es_event *row,
                     es_err *err) {
  int rc = s->ops->event_get(t, session, index, row, err);
  if (rc == ES_NOT_FOUND)
    return es_fail(err, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s'", (long long)index,
                   session);
  return rc;
}

/* Checks one event to append (everything that needs no transaction). */
static int check_new_event(es_store *s, const es_new_event *e, size_t i, es_err *err) {
  char what[64];
  int rc;
  if (!e->type) return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].type is required", i + 1);
  snprintf(what, sizeof what, "events[%zu].type", i + 1);
  if ((rc = es_check_name(what, e->type, err))) return rc;
  if (e->id) {
    snprintf(what, sizeof what, "events[%zu].id", i + 1);
    if ((rc = es_check_name(what, e->id, err))) return rc;
  }
  if (e->lane) {
    snprintf(what, sizeof what, "events[%zu].lane", i + 1);
    if ((rc = es_check_name(what, e->lane, err))) return rc;
  }
  if (e->key) {
    snprintf(what, sizeof what, "events[%zu].key", i + 1);
    if ((rc = es_check_name(what, e->key, err))) return rc;
    /* §3.10: never store in plaintext what the caller asked to seal */
    if (!s->crypto)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "events[%zu].key: the store was opened without keys, so it cannot seal the "
                     "payload (open it with {keys = PATH})",
                     i + 1);
  }
  if (e->payload) {
    if (e->payload_len > s->max_payload)
      return es_fail(err, ES_TOO_LARGE, "events[%zu].payload is %zu bytes, over the limit of %zu",
                     i + 1, e->payload_len, s->max_payload);
    es_err jerr = {0};
    if (es_json_validate(e->payload, e->payload_len, &jerr) != ES_OK)
      return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].payload: %s", i + 1, jerr.msg);
  }
  if ((e->cause_index == ES_NONE) != (e->cause_attempt == ES_NONE))
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].cause needs both index and attempt", i + 1);
  if (e->cause_index != ES_NONE && (e->cause_index < 1 || e->cause_attempt < 1))
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].cause index and attempt must be >= 1",
                   i + 1);
  if (e->not_before != ES_NONE && e->not_before < 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "events[%zu].not_before must be >= 0", i + 1);
  return ES_OK;
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_batch(es_store *s, const es_new_event *evs, size_t n, es_err *err) {
  if (n > s->max_batch)
    return es_fail(err, ES_TOO_LARGE, "batch of %zu events, over the limit of %zu", n, s->max_batch);
  size_t n_ids = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = check_new_event(s, &evs[i], i, err);
    if (rc) return rc;
    if (evs[i].id) n_ids++;
  }
  if (n_ids < 2) return ES_OK;
  /* Distinct ids: sort pointers rather than compare all pairs. */
  const char **ids = malloc(n_ids * sizeof *ids);
  if (!ids) return nomem(err);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (evs[i].id) ids[k++] = evs[i].id;
  qsort(ids, k, sizeof *ids, cmp_str_ptr);
  int rc = ES_OK;
  for (size_t i = 1; i < k; i++) {
    if (strcmp(ids[i - 1], ids[i]) == 0) {
      rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH, "the batch repeats event id '%s'", ids[i]);
      break;
    }
  }
  free(ids);
  return rc;
}

static int payload_equal(const es_new_event *e, const es_event *row) {
  const char *p = e->payload ? e->payload : "null";
  size_t n = e->payload ? e->payload_len : 4;
  return n == row->payload_len && memcmp(p, row->payload, n) == 0;
}

/* §3.10: a replay must name the same key as the stored event, and its
 * payload is compared with the stored one opened (row's payload is
 * replaced by the plaintext, which the replay then returns). A shredded
 * original cannot be compared: refused like any new data under that key. */
static int replay_key_check(es_store *s, es_txn *t, const es_new_event *e, es_event *row,
                            es_err *err) {
  if (!e->key && !row->key) return ES_OK;
  if (!e->key || !row->key || strcmp(e->key, row->key) != 0)
    return es_fail(err, ES_ID_CONFLICT, "event id '%s' is already stored with a different key",
                   row->id);
  int rc = es_crypto_reveal(s, t, NULL, row, 1, err);
  if (rc == ES_OK && row->shredded)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "key '%s' was shredded: nothing can be sealed under that name again", e->key);
  return rc;
}

/* Batch idempotency (CONTRACT §3.1). Returns ES_OK with *replayed = 1 and
 * the originals in out when every id is already stored in this session;
 * *replayed = 0 when none is; an error otherwise. `cause` (complete()) also
 * requires the stored events to carry that cause. */
static int check_replay(es_store *s, es_txn *t, const char *session, const es_new_event *evs,
                        size_t n, int *replayed, es_events *out, es_err *err) {
  size_t found = 0;
  int rc = ES_OK;
  *replayed = 0;
  if (n == 0) return ES_OK;
  es_event row;
  es_event_init(&row);
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    if (!evs[i].id) continue;
    rc = s->ops->event_get_by_id(t, evs[i].id, &row, err);
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      continue;
    }
    if (rc != ES_OK) break;
    if (strcmp(row.session, session) != 0) {
      rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                   "event id '%s' already exists in another session", evs[i].id);
    } else if ((rc = replay_key_check(s, t, &evs[i], &row, err)) != ES_OK) {
      /* a different key, or the stored payload cannot be compared */
    } else if (strcmp(row.type, evs[i].type) != 0 || !payload_equal(&evs[i], &row)) {
      rc = es_fail(err, ES_ID_CONFLICT,
                   "event id '%s' is already stored with a different %s", evs[i].id,
                   strcmp(row.type, evs[i].type) != 0 ? "type" : "payload");
    } else {
      found++;
      rc = es_events_push_copy(out, &row);
      if (rc) nomem(err);
    }
    es_event_destroy(&row);
  }
  if (rc == ES_OK && found > 0 && found < n)
    rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                 "the batch mixes %zu already-stored and %zu new events", found, n - found);
  if (rc != ES_OK || found < n) {
    es_events_destroy(out);
    return rc;
  }
  *replayed = 1;
  return ES_OK;
}

/* Rows built by insert_rows and not yet inserted: inserted together
 * (event_insert_many), since on SQLite a statement's fixed cost is larger
 * than a row's. */
#define INSERT_CHUNK 64

typedef struct {
  es_event *rows;    /* [cap] */
  char **sealed;     /* [cap] §3.10: the stored text of a keyed row, else NULL */
  const char **plain; /* [cap] the payload the caller gets back */
  size_t *plain_len;
  char *gen;         /* [cap][ES_MAX_NAME_BYTES + 1] ids generated in the transaction */
  size_t n, cap;
} insert_chunk;

static void chunk_clear(insert_chunk *c) {
  for (size_t k = 0; k < c->n; k++) {
    free(c->sealed[k]);
    c->sealed[k] = NULL;
  }
  c->n = 0;
}

/* Inserts the built rows; on success counts them into si and copies them
 * (with the plaintext payload) to out. */
static int chunk_flush(es_store *s, es_txn *t, insert_chunk *c, es_session_info *si, int64_t now,
                       es_events *out, es_err *err) {
  int rc = ES_OK;
  if (c->n == 0) return ES_OK;
  if (s->ops->event_insert_many) {
    rc = s->ops->event_insert_many(t, c->rows, c->n, err);
  } else {
    for (size_t k = 0; k < c->n && rc == ES_OK; k++) rc = s->ops->event_insert(t, &c->rows[k], err);
  }
  for (size_t k = 0; k < c->n && rc == ES_OK; k++) {
    es_event *row = &c->rows[k];
    row->payload = (char *)c->plain[k];
    row->payload_len = c->plain_len[k];
    si->head++;
    si->events++;
    if (si->first_at == ES_NONE) si->first_at = now;
    if (out && es_events_push_copy(out, row)) rc = nomem(err);
  }
  chunk_clear(c);
  return rc;
}

/* Inserts events after the session's head; cause_* (complete) overrides each
 * event's own cause. Updates si's counters; appends copies to out. ids:
 * NULL, or the ids of the events without one, generated before the
 * transaction (es_core_append): event i's at ids + i * ids_stride. */
static int insert_rows(es_store *s, es_txn *t, es_session_info *si, const es_new_event *evs,
                       size_t n, int64_t cause_index, int64_t cause_attempt, int64_t now,
                       const char *scope, const char *ids, size_t ids_stride, es_events *out,
                       es_err *err) {
  int rc = ES_OK;
  insert_chunk c = {0};
  c.cap = n < INSERT_CHUNK ? n : INSERT_CHUNK;
  if (c.cap == 0) c.cap = 1;
  size_t gen_size = ids ? 0 : c.cap * (ES_MAX_NAME_BYTES + 1);
  /* one allocation for the chunk's arrays */
  size_t size = c.cap * (sizeof *c.rows + sizeof *c.sealed + sizeof *c.plain + sizeof *c.plain_len) + gen_size;
  char *mem = calloc(1, size);
  if (!mem) return nomem(err);
  c.rows = (es_event *)mem;
  c.sealed = (char **)(c.rows + c.cap);
  c.plain = (const char **)(c.sealed + c.cap);
  c.plain_len = (size_t *)(c.plain + c.cap);
  c.gen = gen_size ? (char *)(c.plain_len + c.cap) : NULL;
  es_keyring ring; /* §3.10: data keys of this batch */
  es_keyring_init(&ring);
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    const es_new_event *e = &evs[i];
    /* What looks at the rows already built must find them inserted: a
     * lane's earlier event (lane_next), an id source's repeated id
     * (new_event_id's lookup). */
    if ((e->lane && !e->settled) || (!e->id && !ids && s->ids))
      if ((rc = chunk_flush(s, t, &c, si, now, out, err))) break;
    es_event *row = &c.rows[c.n];
    char *gen = c.gen ? c.gen + c.n * (ES_MAX_NAME_BYTES + 1) : NULL;
    es_event_init(row);
    if (!e->id && !ids && (rc = new_event_id(s, t, now, scope, gen, err))) break;
    row->id = (char *)(e->id ? e->id : ids ? ids + i * ids_stride : gen);
    row->type = (char *)e->type;
    row->payload = (char *)(e->payload ? e->payload : "null");
    row->payload_len = e->payload ? e->payload_len : 4;
    row->session = si->session;
    row->lane = (char *)e->lane;
    row->index = si->head + 1 + (int64_t)c.n;
    row->created_at = now;
    row->cause_index = cause_index != ES_NONE ? cause_index : e->cause_index;
    row->cause_attempt = cause_index != ES_NONE ? cause_attempt : e->cause_attempt;
    row->not_before = e->not_before;
    row->returned = 0;
    if (e->settled) {
      row->status = ES_STATUS_PROCESSED;
      row->processed_at = now;
      row->returned = -1;
    } else {
      row->status = ES_STATUS_PENDING;
      int64_t blocker = 0;
      if (e->lane) rc = s->ops->lane_next(t, si->session, e->lane, 0, &blocker, err);
      if (rc) break;
      row->queued = blocker == 0;
      if (row->queued) row->due_at = due_of(row, now);
      si->pending++;
    }
    /* §3.10: the row stores the sealed text; the caller gets the plaintext */
    c.plain[c.n] = row->payload;
    c.plain_len[c.n] = row->payload_len;
    c.sealed[c.n] = NULL;
    if (e->key) {
      row->key = (char *)e->key;
      rc = es_crypto_seal(s, t, &ring, row, c.plain[c.n], c.plain_len[c.n], &c.sealed[c.n],
                          &row->payload_len, err);
      row->payload = c.sealed[c.n];
    }
    c.n++;
    if (rc == ES_OK && c.n == c.cap) rc = chunk_flush(s, t, &c, si, now, out, err);
  }
  if (rc == ES_OK) rc = chunk_flush(s, t, &c, si, now, out, err);
  chunk_clear(&c);
  free(mem);
  es_keyring_destroy(&ring);
  si->updated_at = now;
  return rc;
}

static int insert_events(es_store *s, es_txn *t, es_session_info *si, const es_new_event *evs,
                         size_t n, int64_t cause_index, int64_t cause_attempt, int64_t now,
                         const char *scope, es_events *out, es_err *err) {
  return insert_rows(s, t, si, evs, n, cause_index, cause_attempt, now, scope, NULL, 0, out, err);
}

/* After the head of a lane was processed: the next unprocessed event of
 * the lane becomes a dispatch candidate. */
static int advance_lane(es_store *s, es_txn *t, const es_event *done, int64_t now, es_err *err) {
  if (!done->lane) return ES_OK;
  int64_t next = 0;
  int rc = s->ops->lane_next(t, done->session, done->lane, done->index, &next, err);
  if (rc || next == 0) return rc;
  es_event row;
  if ((rc = get_event(s, t, done->session, next, &row, err))) return rc;
  if (row.status == ES_STATUS_PENDING && !row.queued) {
    row.queued = 1;
    row.due_at = due_of(&row, now);
    rc = s->ops->event_update(t, &row, err);
  }
  es_event_destroy(&row);
  return rc;
}

/* §3.8: a write that carries a fence token must carry the session's current
 * one (a token never issued is as stale as an old one: either way another
 * writer owns the session or the writer is confused); a sealed session takes
 * no more events. Checked after the replay check, so a lost-acknowledgement
 * retry, which writes nothing, still gets its answer. */
static int check_writable(const es_session_info *si, int64_t fence, size_t n, es_err *err) {
  if (fence != ES_NONE && fence != si->fence) {
    if (fence < si->fence)
      return es_fail(err, ES_STALE_FENCE, "fence token %lld of session '%s' is stale (current: %lld)",
                     (long long)fence, si->session, (long long)si->fence);
    return es_fail(err, ES_STALE_FENCE, "fence token %lld was never issued for session '%s' (current: %lld)",
                   (long long)fence, si->session, (long long)si->fence);
  }
  if (n > 0 && si->sealed_at != ES_NONE)
    return es_fail(err, ES_SEALED, "session '%s' is sealed%s%s", si->session,
                   si->seal_reason ? ": " : "", si->seal_reason ? si->seal_reason : "");
  return ES_OK;
}

/* --- append --- */

typedef struct {
  const char *session;
  const es_new_event *evs;
  size_t n;
  int64_t expected;
  int64_t fence;
  int64_t now;
  es_events *out;
  int pending;
  int want_out;   /* 0: the caller passed no out list; do not copy rows */
  const char *scope; /* §3.11: the tenant prefix of generated ids, or NULL */
  const char *ids;   /* NULL, or ids generated before the write (insert_rows) */
  size_t ids_stride;
} append_args;

static int check_causes(es_store *s, es_txn *t, const char *session, const es_new_event *evs,
                        size_t n, es_err *err) {
  for (size_t i = 0; i < n; i++) {
    if (evs[i].cause_index == ES_NONE) continue;
    es_event parent;
    int rc = get_event(s, t, session, evs[i].cause_index, &parent, err);
    if (rc) return rc;
    int ok = owns(&parent, evs[i].cause_attempt);
    es_event_destroy(&parent);
    if (!ok)
      return es_fail(err, ES_SUPERSEDED_ATTEMPT,
                     "attempt %lld no longer owns event %lld in session '%s'",
                     (long long)evs[i].cause_attempt, (long long)evs[i].cause_index, session);
  }
  return ES_OK;
}

static int do_append(es_store *s, es_txn *t, void *arg, es_err *err) {
  append_args *a = arg;
  int replayed = 0;
  es_session_info si;
  int rc = check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  if (rc) return rc;
  if ((rc = load_session(s, t, a->session, &si, err))) return rc;
  if (replayed) {
    a->pending = si.pending > 0;
    es_session_info_destroy(&si);
    return ES_OK;
  }
  rc = check_writable(&si, a->fence, a->n, err);
  if (rc == ES_OK && a->expected != ES_NONE && si.head != a->expected) {
    rc = es_fail(err, ES_WRONG_EXPECTED_HEAD, "session '%s' is at %lld, expected %lld", a->session,
                 (long long)si.head, (long long)a->expected);
  }
  if (rc == ES_OK) rc = check_causes(s, t, a->session, a->evs, a->n, err);
  if (rc == ES_OK)
    rc = insert_rows(s, t, &si, a->evs, a->n, ES_NONE, ES_NONE, a->now, a->scope, a->ids,
                     a->ids_stride, a->want_out ? a->out : NULL, err);
  if (rc == ES_OK) rc = s->ops->session_put(t, &si, err);
  a->pending = si.pending > 0;
  es_session_info_destroy(&si);
  return rc;
}

/* The UUIDv7 ids of the events without one, made before the write so
 * that the group's serial part does not make them (a store with an id
 * source calls it inside the transaction, as before: its ids are used
 * only by a call that gets as far as inserting). *ids: NULL when no event
 * needs one, else owned by the caller. */
static int pregenerate_ids(es_store *s, append_args *a, char **ids, es_err *err) {
  *ids = NULL;
  if (s->ids) return ES_OK;
  size_t missing = 0;
  for (size_t i = 0; i < a->n; i++) missing += !a->evs[i].id;
  if (missing == 0) return ES_OK;
  size_t p = a->scope ? strlen(a->scope) : 0;
  size_t stride = p + 37;
  char *v = malloc(a->n * stride);
  if (!v) return nomem(err);
  for (size_t i = 0; i < a->n; i++) {
    if (a->evs[i].id) continue;
    memcpy(v + i * stride, a->scope ? a->scope : "", p);
    int rc = uuid7(s, a->now, v + i * stride + p, err);
    if (rc) {
      free(v);
      return rc;
    }
  }
  *ids = v;
  a->ids = v;
  a->ids_stride = stride;
  return ES_OK;
}

int es_store_append(es_store *s, const char *session, const es_new_event *evs, size_t n,
                    int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err) {
  ES_STATS_CALL(s, ES_OP_APPEND,
                es_store_append(s, session, evs, n, expected, fence, out, pending, err));
  if (s->shards) return es_shards_append(s, session, evs, n, expected, fence, out, pending, err);
  if (s->base) return es_tenant_append(s, session, evs, n, expected, fence, out, pending, err);
  return es_core_append(s, NULL, session, evs, n, expected, fence, out, pending, err);
}

int es_core_append(es_store *s, const char *scope, const char *session, const es_new_event *evs,
                   size_t n, int64_t expected, int64_t fence, es_events *out, int *pending,
                   es_err *err) {
  int rc;
  es_events unused = {0};
  if (!out) out = &unused; /* the caller does not want the stored events back */
  memset(out, 0, sizeof *out);
  *pending = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = check_nonneg("expected", expected, err))) return rc;
  if ((rc = check_batch(s, evs, n, err))) return rc;
  if (fence != ES_NONE && fence < 1) return es_fail(err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  if ((rc = es_core_enter(s, err))) return rc;
  append_args a = {session, evs, n, expected, fence, 0, out, 0, 1, scope, NULL, 0};
  if (n == 0) {
    /* Writes nothing; still answers whether the session has pending work. */
    es_session_info si;
    es_txn *t = NULL;
    rc = s->ops->read_begin(s->bk, &t, err);
    if (rc == ES_OK) {
      rc = s->ops->session_get(t, session, &si, err);
      if (rc == ES_OK) {
        *pending = si.pending > 0;
        es_session_info_destroy(&si);
      } else if (rc == ES_NOT_FOUND) {
        rc = ES_OK;
      }
      s->ops->read_end(t);
    }
    es_core_leave(s);
    return rc;
  }
  a.want_out = out != &unused;
  rc = es_store_now(s, &a.now, err);
  char *ids = NULL;
  if (rc == ES_OK) rc = pregenerate_ids(s, &a, &ids, err);
  if (rc == ES_OK) rc = es_core_write(s, do_append, &a, err);
  free(ids);
  es_core_leave(s);
  es_events_destroy(&unused);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *pending = a.pending;
  return ES_OK;
}

/* --- reads --- */

/* §3.9: a read of (after, through] needs no event below the session's
 * first_index (the truncated prefix), else TRUNCATED. */
static int check_live(const es_session_info *si, int64_t after, int64_t through, es_err *err) {
  int64_t first = si->first_index > 1 ? si->first_index : 1;
  if (through > after && after + 1 < first)
    return es_fail(err, ES_TRUNCATED,
                   "events 1..%lld of session '%s' were truncated: read from after = %lld on",
                   (long long)(first - 1), si->session, (long long)(first - 1));
  return ES_OK;
}

typedef struct {
  const char *session;
  int64_t after, through, limit;
  es_events *out;
  int64_t head;
  int at_rest;   /* §3.10 read_at_rest: payloads as stored */
} range_args;

/* Backend iterations copy rows into a list through a collector. A
 * callback's nonzero return only stops an iteration, so running out of
 * memory is remembered here and turned into an error by collected(). */
typedef struct {
  void *list;
  int oom;
} collector;

static int collected(int rc, const collector *c, es_err *err) {
  return rc == ES_OK && c->oom ? nomem(err) : rc;
}

static int collect_event(void *ctx, const es_event *row) {
  collector *c = ctx;
  if (es_events_push_copy(c->list, row) == ES_OK) return 0;
  c->oom = 1;
  return 1;
}

/* §3.10: every path that returns events opens sealed payloads (or marks
 * them shredded) inside its transaction, after collecting them. */
static int revealed(es_store *s, es_txn *t, int rc, es_events *list, es_err *err) {
  return rc == ES_OK ? es_crypto_reveal(s, t, NULL, list->v, list->n, err) : rc;
}

static int do_range(es_store *s, es_txn *t, void *arg, es_err *err) {
  range_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) {
    a->head = 0;
    return ES_OK;
  }
  if (rc) return rc;
  a->head = si.head;
  int64_t through = a->through == ES_NONE ? a->head : a->through;
  if (through > a->head) through = a->head;
  rc = check_live(&si, a->after, through, err);
  /* §3.9: the archived part first (from segment files), then live rows */
  int64_t after = a->after, limit = a->limit;
  if (rc == ES_OK && through > after)
    rc = es_archive_read_part(s, t, &si, &after, through, &limit, a->out, err);
  es_session_info_destroy(&si);
  if (rc) return rc;
  collector c = {a->out, 0};
  int rc2 = ES_OK;
  if (through > after && limit != 0)
    rc2 = collected(s->ops->event_range(t, a->session, after, through, limit, collect_event, &c, err),
                    &c, err);
  /* §3.10: archived and live rows alike (segments keep payloads as stored) */
  if (a->at_rest) return rc2 == ES_OK ? es_crypto_mark_at_rest(s, t, a->out->v, a->out->n, err) : rc2;
  return revealed(s, t, rc2, a->out, err);
}

static int read_range(es_store *s, range_args *a, es_err *err) {
  int rc;
  memset(a->out, 0, sizeof *a->out);
  if ((rc = es_check_name("session", a->session, err)) ||
      (rc = check_nonneg("after", a->after, err)) ||
      (rc = check_nonneg("through", a->through, err)) || (rc = check_nonneg("limit", a->limit, err)))
    return rc;
  if (a->limit == 0) return ES_OK;
  a->limit = cap_limit(a->limit);
  if ((rc = es_core_enter(s, err))) return rc;
  rc = es_core_read(s, do_range, a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_events_destroy(a->out);
    rc = es_core_read(s, do_range, a, err);
  }
  es_core_leave(s);
  if (rc) es_events_destroy(a->out);
  return rc;
}

int es_store_read(es_store *s, const char *session, int64_t after, int64_t through, int64_t limit,
                  es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ, es_store_read(s, session, after, through, limit, out, err));
  if (s->shards) return es_shards_read(s, session, after, through, limit, out, err);
  if (s->base) return es_tenant_read(s, session, after, through, limit, out, err);
  range_args a = {session, after, through, limit, out, 0, 0};
  return read_range(s, &a, err);
}

int es_store_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                         int64_t limit, es_events *out, int64_t *through_out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_EVENTS_PAGE,
                es_store_events_page(s, session, after, through, limit, out, through_out, err));
  if (s->shards) return es_shards_events_page(s, session, after, through, limit, out, through_out, err);
  if (s->base) return es_tenant_events_page(s, session, after, through, limit, out, through_out, err);
  range_args a = {session, after, through, limit, out, 0, 0};
  int rc = read_range(s, &a, err);
  if (rc == ES_OK) *through_out = through == ES_NONE ? a.head : (through < a.head ? through : a.head);
  return rc;
}

typedef struct {
  const char *session;
  int64_t *head;
} head_args;

static int do_head(es_store *s, es_txn *t, void *arg, es_err *err) {
  head_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  *a->head = 0;
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  *a->head = si.head;
  es_session_info_destroy(&si);
  return ES_OK;
}

int es_store_head(es_store *s, const char *session, int64_t *head, es_err *err) {
  ES_STATS_CALL(s, ES_OP_HEAD, es_store_head(s, session, head, err));
  if (s->shards) return es_shards_head(s, session, head, err);
  if (s->base) return es_tenant_head(s, session, head, err);
  int rc;
  *head = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  head_args a = {session, head};
  rc = es_core_read(s, do_head, &a, err);
  es_core_leave(s);
  return rc;
}

typedef struct {
  int64_t after, limit;
  const char *session; /* dead_letters filter */
  es_events *out;
  const char *scope;   /* §3.11: a tenant's prefix, or NULL */
} all_args;

static int do_read_all(es_store *s, es_txn *t, void *arg, es_err *err) {
  all_args *a = arg;
  collector c = {a->out, 0};
  int rc = collected(s->ops->event_all(t, a->scope, a->after, a->limit, collect_event, &c, err), &c,
                     err);
  return revealed(s, t, rc, a->out, err);
}

int es_store_read_all(es_store *s, int64_t after, int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_ALL, es_store_read_all(s, after, limit, out, err));
  if (s->shards) return es_shards_read_all(s, after, limit, out, err);
  if (s->base) return es_tenant_read_all(s, after, limit, out, err);
  return es_core_read_all(s, NULL, after, limit, out, err);
}

int es_core_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out,
                     es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = check_nonneg("after", after, err)) || (rc = check_nonneg("limit", limit, err))) return rc;
  if (limit == 0) return ES_OK;
  if ((rc = es_core_enter(s, err))) return rc;
  all_args a = {after == ES_NONE ? 0 : after, cap_limit(limit), NULL, out, scope};
  rc = es_core_read(s, do_read_all, &a, err);
  es_core_leave(s);
  if (rc) es_events_destroy(out);
  return rc;
}

static int do_last_position(es_store *s, es_txn *t, void *arg, es_err *err) {
  return s->ops->last_position(t, arg, err);
}

int es_store_last_position(es_store *s, int64_t *position, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LAST_POSITION, es_store_last_position(s, position, err));
  if (s->shards) return es_shards_last_position(s, position, err);
  if (s->base) return es_tenant_last_position(s, position, err);
  int rc;
  *position = 0;
  if ((rc = es_core_enter(s, err))) return rc;
  rc = es_core_read(s, do_last_position, position, err);
  es_core_leave(s);
  return rc;
}

typedef struct {
  const char *session;
  int64_t index;
  es_event *out;
} get_args;

static int do_get(es_store *s, es_txn *t, void *arg, es_err *err) {
  get_args *a = arg;
  int rc = get_event(s, t, a->session, a->index, a->out, err);
  if (rc == ES_OK) rc = es_crypto_reveal(s, t, NULL, a->out, 1, err);
  if (rc != ES_NO_SUCH_EVENT) return rc;
  es_session_info si;
  if (s->ops->session_get(t, a->session, &si, err) != ES_OK) return rc;
  if (a->index >= 1 && a->index <= si.head) rc = check_live(&si, a->index - 1, a->index, err);
  if (rc == ES_NO_SUCH_EVENT && a->index >= 1 && a->index <= si.archived_through) {
    /* §3.9: an archived event */
    es_events one = {0};
    int64_t after = a->index - 1, limit = 1;
    rc = es_archive_read_part(s, t, &si, &after, a->index, &limit, &one, err);
    if (rc == ES_OK && one.n == 1) {
      *a->out = one.v[0];  /* moves the event out of the list */
      one.n = 0;
      rc = es_crypto_reveal(s, t, NULL, a->out, 1, err); /* §3.10: segments keep it sealed */
    } else if (rc == ES_OK) {
      rc = es_fail(err, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s'",
                   (long long)a->index, a->session);
    }
    es_events_destroy(&one);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_GET, es_store_get(s, session, index, out, err));
  if (s->shards) return es_shards_get(s, session, index, out, err);
  if (s->base) return es_tenant_get(s, session, index, out, err);
  int rc;
  es_event_init(out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  get_args a = {session, index, out};
  rc = es_core_read(s, do_get, &a, err);
  if (es_archive_retryable(rc, err)) rc = es_core_read(s, do_get, &a, err);
  es_core_leave(s);
  return rc;
}

/* --- claims --- */

/* Claims a ready row: a new attempt, owned by holder until expires. */
static int claim_row(es_store *s, es_txn *t, es_event *row, const char *holder, int64_t now,
                     int64_t expires, es_err *err) {
  char *h = strdup(holder);
  if (!h) return nomem(err);
  free(row->claim_holder);
  row->claim_holder = h;
  row->attempts++;
  if (row->first_claimed_at == ES_NONE) row->first_claimed_at = now;
  row->last_claimed_at = now;
  row->claim_expires_at = expires;
  row->retry_at = ES_NONE;
  row->due_at = expires; /* a live claim is ready again only when it expires */
  return s->ops->event_update(t, row, err);
}

/* retry_at for claim / claim_next. A due time of INT64_MAX (a not_before or
 * claim end of math.maxinteger) is "never" and reported as none, the same
 * on every backend (the memory backend's search cannot report it). */
static int next_due(es_store *s, es_txn *t, const char *session, const char *scope, int64_t now,
                    int64_t *due, es_err *err) {
  int rc = s->ops->queued_next_due(t, session, scope, now, due, err);
  if (rc == ES_OK && *due == INT64_MAX) *due = ES_NONE;
  return rc;
}

static int cmp_event_index(const void *a, const void *b) {
  const es_event *x = a, *y = b;
  return (x->index > y->index) - (x->index < y->index);
}

typedef struct {
  const char *session;
  const es_claim_opts *o;
  int64_t now;
  int64_t expires;  /* the claim's end: expires_at, or now + ttl_ms */
  int64_t limit;    /* o->limit, capped (cap_limit) */
  int outcome;
  es_events *out;
  int64_t retry_at;
} claim_args;

static int excluded(const es_claim_opts *o, int64_t index) {
  for (size_t i = 0; i < o->n_exclude; i++)
    if (o->exclude[i] == index) return 1;
  return 0;
}

static int do_claim(es_store *s, es_txn *t, void *arg, es_err *err) {
  claim_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  a->retry_at = ES_NONE;
  if (rc == ES_NOT_FOUND) {
    a->outcome = ES_SETTLED;
    return ES_OK;
  }
  if (rc) return rc;
  /* Excluded rows come back too and are dropped here, so ask for that many
   * more than the limit. */
  int64_t want = a->limit == ES_NONE ? ES_NONE : cap_limit(a->limit + (int64_t)a->o->n_exclude);
  collector c = {a->out, 0};
  rc = collected(s->ops->queued_due(t, a->session, NULL, a->now, want, collect_event, &c, err), &c,
                 err);
  if (rc == ES_OK) {
    /* Drop exclusions, then index order (backends already give it), then the limit. */
    size_t k = 0;
    for (size_t i = 0; i < a->out->n; i++) {
      if (excluded(a->o, a->out->v[i].index)) {
        es_event_destroy(&a->out->v[i]);
      } else {
        a->out->v[k++] = a->out->v[i];
      }
    }
    a->out->n = k;
    if (k > 1) qsort(a->out->v, k, sizeof *a->out->v, cmp_event_index);
    if (a->limit != ES_NONE && (int64_t)k > a->limit) {
      for (size_t i = (size_t)a->limit; i < k; i++) es_event_destroy(&a->out->v[i]);
      a->out->n = (size_t)a->limit;
    }
  }
  for (size_t i = 0; rc == ES_OK && i < a->out->n; i++)
    rc = claim_row(s, t, &a->out->v[i], a->o->holder, a->now, a->expires, err);
  rc = revealed(s, t, rc, a->out, err);
  if (rc == ES_OK && a->out->n > 0) {
    a->outcome = ES_CLAIMED;
    si.attempts += (int64_t)a->out->n;
    si.updated_at = a->now;
    rc = s->ops->session_put(t, &si, err);
  } else if (rc == ES_OK) {
    a->outcome = si.pending > 0 ? ES_BUSY : ES_SETTLED;
    if (si.pending > 0) rc = next_due(s, t, a->session, NULL, a->now, &a->retry_at, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

static int check_claim_opts(const es_claim_opts *o, es_err *err) {
  int rc = es_check_name("holder", o->holder, err);
  if (rc) return rc;
  if (o->expires_at == ES_NONE && o->ttl_ms <= 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0 (or give expires_at)");
  if ((rc = check_nonneg("expires_at", o->expires_at, err))) return rc;
  if (o->limit != ES_NONE && o->limit < 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "limit must be >= 1 (omit it for no limit)");
  return ES_OK;
}

int es_store_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                   es_events *out, int64_t *retry_at, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CLAIM, es_store_claim(s, session, o, outcome, out, retry_at, err));
  if (s->shards) return es_shards_claim(s, session, o, outcome, out, retry_at, err);
  if (s->base) return es_tenant_claim(s, session, o, outcome, out, retry_at, err);
  int rc;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  if ((rc = es_check_name("session", session, err)) || (rc = check_claim_opts(o, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  claim_args a = {session, o, 0, o->expires_at, cap_limit(o->limit), 0, out, ES_NONE};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && o->expires_at == ES_NONE && add_time(a.now, o->ttl_ms, &a.expires))
    rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_claim, &a, err);
  es_core_leave(s);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *outcome = a.outcome;
  *retry_at = a.retry_at;
  return ES_OK;
}

typedef struct {
  const char *holder;
  int64_t expires, limit, now;
  const char **types;  /* NULL: every type; else n_types distinct names */
  size_t n_types;
  const char *const *skip; /* sessions not to claim from (borrowed) */
  size_t n_skip;
  es_events *out;
  int64_t retry_at;
  const char *scope;  /* §3.11: a tenant's prefix, or NULL */
  int claim_txn;      /* running in a claim transaction (ops->claim_begin) */
  int64_t ttl_ms;     /* a retried claim transaction takes now and expires again */
} claim_next_args;

/* With sessions to skip, ready rows are read without a backend limit and
 * collected until `want` rows of other sessions are in: the backends'
 * iterations are lazy, so the cost is the skipped rows plus the limit. */
typedef struct {
  collector c;
  const claim_next_args *a;
  int64_t want, got;
} skip_collector;

static int collect_unskipped(void *ctx, const es_event *row) {
  skip_collector *k = ctx;
  for (size_t i = 0; i < k->a->n_skip; i++)
    if (strcmp(k->a->skip[i], row->session) == 0) return 0;
  if (collect_event(&k->c, row)) return 1;
  return ++k->got >= k->want;
}

/* Ready rows (of one type, or of every type when type is NULL), earliest
 * first, at most a->limit of sessions not skipped, appended to a->out. In
 * a claim transaction (a->claim_txn) the backend passes over the skipped
 * sessions itself and locks the rows it returns: asking without a limit
 * would lock every ready row. */
static int ready_rows(es_store *s, es_txn *t, claim_next_args *a, const char *type, es_err *err) {
  skip_collector k = {{a->out, 0}, a, a->limit, 0};
  int filter = a->n_skip && !a->claim_txn;
  int64_t limit = filter ? ES_NONE : a->limit;
  es_event_cb cb = filter ? collect_unskipped : collect_event;
  void *ctx = filter ? (void *)&k : (void *)&k.c;
  int rc = type ? s->ops->queued_due_type(t, a->scope, type, a->now, limit, cb, ctx, err)
                : s->ops->queued_due(t, NULL, a->scope, a->now, limit, cb, ctx, err);
  return collected(rc, &k.c, err);
}

/* The contract's claim order: the time it became ready, then position. */
static int cmp_event_ready(const void *x, const void *y) {
  const es_event *a = x, *b = y;
  if (a->due_at != b->due_at) return a->due_at < b->due_at ? -1 : 1;
  return (a->position > b->position) - (a->position < b->position);
}

/* The ready rows of the listed types, earliest first, at most a->limit:
 * each type's index gives its own earliest ones, the merge keeps the
 * earliest overall. Rows of types not listed are never looked at. */
static int ready_of_types(es_store *s, es_txn *t, claim_next_args *a, es_err *err) {
  int rc = ES_OK;
  for (size_t i = 0; rc == ES_OK && i < a->n_types; i++) rc = ready_rows(s, t, a, a->types[i], err);
  if (rc) return rc;
  if (a->out->n > 1) qsort(a->out->v, a->out->n, sizeof *a->out->v, cmp_event_ready);
  if (a->limit != ES_NONE && (int64_t)a->out->n > a->limit) {
    for (size_t i = (size_t)a->limit; i < a->out->n; i++) es_event_destroy(&a->out->v[i]);
    a->out->n = (size_t)a->limit;
  }
  return ES_OK;
}

/* retry_at limited to the listed types: the least of each type's next due
 * time. */
static int next_due_of_types(es_store *s, es_txn *t, const claim_next_args *a, int64_t *due,
                             es_err *err) {
  *due = ES_NONE;
  for (size_t i = 0; i < a->n_types; i++) {
    int64_t d;
    int rc = s->ops->queued_next_due_type(t, a->scope, a->types[i], a->now, &d, err);
    if (rc) return rc;
    if (d != ES_NONE && (*due == ES_NONE || d < *due)) *due = d;
  }
  if (*due == INT64_MAX) *due = ES_NONE;  /* "never", as next_due says */
  return ES_OK;
}

static int cmp_event_ptr_session(const void *x, const void *y) {
  const es_event *const *a = x, *const *b = y;
  return strcmp((*a)->session, (*b)->session);
}

/* do_claim_next in a claim transaction (ops->claim_begin): the ready rows
 * come locked; their sessions are locked in byte order of the names, the
 * same order in every claim transaction, so two of them never wait for
 * each other in a cycle (docs/postgres.md "Concurrency"). Each session row
 * is read (locked) before its rows are claimed and written once. The rows
 * are handed out in claim order, as do_claim_next's. */
/* The ready rows and retry_at with ops->claim_ready: each type's rows and
 * next due time in one step. retry_at is then asked before the rows are
 * claimed, so the claims' end (the due time claim_row gives them) is
 * added to it here: the same answer as asking afterwards. */
static int claim_ready_rows(es_store *s, es_txn *t, claim_next_args *a, int64_t *next,
                            es_err *err) {
  int rc = ES_OK;
  *next = ES_NONE;
  for (size_t i = 0; rc == ES_OK && i < (a->types ? a->n_types : 1); i++) {
    collector c = {a->out, 0};
    int64_t d = ES_NONE;
    rc = collected(s->ops->claim_ready(t, a->scope, a->types ? a->types[i] : NULL, a->now,
                                       a->limit, collect_event, &c, &d, err),
                   &c, err);
    if (rc == ES_OK && d != ES_NONE && (*next == ES_NONE || d < *next)) *next = d;
  }
  if (rc) return rc;
  if (a->types && a->out->n > 1) qsort(a->out->v, a->out->n, sizeof *a->out->v, cmp_event_ready);
  if (a->limit != ES_NONE && (int64_t)a->out->n > a->limit) {
    for (size_t i = (size_t)a->limit; i < a->out->n; i++) es_event_destroy(&a->out->v[i]);
    a->out->n = (size_t)a->limit;
  }
  if (a->out->n > 0 && (*next == ES_NONE || a->expires < *next)) *next = a->expires;
  if (*next == INT64_MAX) *next = ES_NONE;  /* "never", as next_due says */
  return ES_OK;
}

static int do_claim_next_locked(es_store *s, es_txn *t, claim_next_args *a, es_err *err) {
  int64_t early_next = ES_NONE;
  int early = s->ops->claim_ready != NULL;
  int rc = early     ? claim_ready_rows(s, t, a, &early_next, err)
           : a->types ? ready_of_types(s, t, a, err)
                      : ready_rows(s, t, a, NULL, err);
  size_t n = rc == ES_OK ? a->out->n : 0;
  es_event **by = n ? malloc(n * sizeof *by) : NULL; /* the rows of out, by session */
  if (n && !by) rc = nomem(err);
  if (rc == ES_OK && n) {
    for (size_t i = 0; i < n; i++) by[i] = &a->out->v[i];
    qsort(by, n, sizeof *by, cmp_event_ptr_session);
  }
  for (size_t i = 0; rc == ES_OK && i < n;) {
    size_t j = i;
    while (j < n && strcmp(by[j]->session, by[i]->session) == 0) j++;
    if (s->ops->session_claimed) {
      rc = s->ops->session_claimed(t, by[i]->session, (int64_t)(j - i), a->now, err);
      for (size_t k = i; rc == ES_OK && k < j; k++)
        rc = claim_row(s, t, by[k], a->holder, a->now, a->expires, err);
      i = j;
      continue;
    }
    es_session_info si;
    rc = s->ops->session_get(t, by[i]->session, &si, err);
    if (rc == ES_NOT_FOUND)
      rc = es_fail(err, ES_STORAGE, "claim_next: session '%s' has ready events but no row",
                   by[i]->session);
    if (rc) break;
    for (size_t k = i; rc == ES_OK && k < j; k++)
      rc = claim_row(s, t, by[k], a->holder, a->now, a->expires, err);
    if (rc == ES_OK) {
      si.attempts += (int64_t)(j - i);
      si.updated_at = a->now;
      rc = s->ops->session_put(t, &si, err);
    }
    es_session_info_destroy(&si);
    i = j;
  }
  free(by);
  rc = revealed(s, t, rc, a->out, err);
  if (rc == ES_OK && early) a->retry_at = early_next;
  else if (rc == ES_OK)
    rc = a->types ? next_due_of_types(s, t, a, &a->retry_at, err)
                  : next_due(s, t, NULL, a->scope, a->now, &a->retry_at, err);
  return rc;
}

/* claim_next in the write transaction: do_claim_next_locked serves both
 * kinds (without a claim transaction its ready rows come from
 * ready_rows's filtering path), so a batch of claims reads and writes each
 * session row once, not once per claimed event. */
static int do_claim_next(es_store *s, es_txn *t, void *arg, es_err *err) {
  return do_claim_next_locked(s, t, arg, err);
}

/* claim_next on a backend that can commit lazily (ops->lazy_begin: SQLite;
 * docs/sqlite.md "Claims and power loss"): a claim that finds no group
 * transaction open runs in one of its own whose commit is not synced, and
 * nobody joins it (the write lock is held throughout), so no other
 * caller's work is ever committed unsynced. The next synced commit (a
 * completion, a failure, any write) makes it durable with everything
 * before it. When a group is open the claim joins it as every write does:
 * that commit is synced anyway. */
static int claim_write(es_store *s, claim_next_args *a, es_err *err) {
  if (!s->ops->lazy_begin) return es_core_write(s, do_claim_next, a, err);
  pthread_mutex_lock(&s->wmu);
  if (s->wtxn) {
    pthread_mutex_unlock(&s->wmu);
    return es_core_write(s, do_claim_next, a, err);
  }
  /* A backend that cannot go lazy now commits durably, which is safe. */
  int lazy = s->ops->lazy_begin(s->bk) == ES_OK;
  es_txn *t = NULL;
  int rc = s->ops->write_begin(s->bk, &t, err);
  if (rc == ES_OK) {
    rc = do_claim_next(s, t, a, err);
    if (rc == ES_OK) rc = s->ops->write_commit(t, err);
    else s->ops->write_rollback(t);
  }
  if (lazy) s->ops->lazy_end(s->bk);
  pthread_mutex_unlock(&s->wmu);
  if (rc == ES_OK) notify_commit(s);
  return rc;
}

#define CLAIM_TRIES 20 /* claim transactions run before giving up on lock contention */

/* claim_next on a backend with claim transactions: one of its own,
 * committed before the call returns, outside the group commit. A claim
 * that lost on lock contention did nothing: it runs again after a short,
 * growing, jittered pause, up to CLAIM_TRIES times. */
static int claim_next_own_txn(es_store *s, claim_next_args *a, es_err *err) {
  int rc = ES_OK;
  a->claim_txn = 1;
  for (int attempt = 1; attempt <= CLAIM_TRIES; attempt++) {
    es_txn *t = NULL;
    if ((rc = s->ops->claim_begin(s->bk, a->skip, a->n_skip, &t, err))) return rc;
    rc = do_claim_next_locked(s, t, a, err);
    int again = 0;
    if (rc == ES_OK && !s->ops->claim_commit) return s->ops->write_commit(t, err);
    if (rc == ES_OK) {
      /* the commit may be where a lost lock wait is learnt of */
      if ((rc = s->ops->claim_commit(t, &again, err)) == ES_OK) return ES_OK;
    } else {
      again = s->ops->claim_retry && s->ops->claim_retry(t);
      s->ops->write_rollback(t);
    }
    es_events_destroy(a->out);
    memset(a->out, 0, sizeof *a->out);
    a->retry_at = ES_NONE;
    if (!again) return rc;
    /* 1..2^attempt ms (at most 128 ms), so the claims that collided do
     * not collide again in step */
    unsigned r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (unsigned)attempt;
    int64_t ms = 1 + (int64_t)(r % (1u << (attempt < 7 ? attempt : 7)));
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    /* The claims of the next try start now: after many tries, the time of
     * the first would hand out claims already near their end. */
    if ((rc = es_store_now(s, &a->now, err))) return rc;
    if (add_time(a->now, a->ttl_ms, &a->expires)) return too_late(err, "ttl_ms");
  }
  char last[ES_ERRMSG_MAX];
  snprintf(last, sizeof last, "%s", err ? err->msg : "");
  return es_fail(err, ES_STORAGE, "claim_next: gave up after %d tries on lock contention: %s",
                 CLAIM_TRIES, last);
}

/* Checks claim_next's types and returns them sorted without duplicates in
 * *out (malloc'd, the strings borrowed; NULL when n is 0), so each type's
 * index is asked once. */
static int claim_types(const char *const *types, size_t n, const char ***out, size_t *n_out,
                       es_err *err) {
  *out = NULL;
  *n_out = 0;
  if (n > ES_MAX_CLAIM_TYPES)
    return es_fail(err, ES_INVALID_ARGUMENT, "types: %zu names, more than the %d allowed", n,
                   ES_MAX_CLAIM_TYPES);
  for (size_t i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "types[%zu]", i + 1);
    int rc = es_check_name(what, types[i], err);
    if (rc) return rc;
  }
  if (n == 0) return ES_OK;
  const char **v = malloc(n * sizeof *v);
  if (!v) return nomem(err);
  memcpy(v, types, n * sizeof *v);
  qsort(v, n, sizeof *v, cmp_str_ptr);
  size_t k = 1;
  for (size_t i = 1; i < n; i++)
    if (strcmp(v[i], v[k - 1]) != 0) v[k++] = v[i];
  *out = v;
  *n_out = k;
  return ES_OK;
}

int es_store_claim_next(es_store *s, const char *holder, int64_t ttl_ms, int64_t limit,
                        const char *const *types, size_t n_types, const char *const *skip,
                        size_t n_skip, es_events *out, int64_t *retry_at, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CLAIM_NEXT,
                es_store_claim_next(s, holder, ttl_ms, limit, types, n_types, skip, n_skip, out, retry_at, err));
  if (s->shards)
    return es_shards_claim_next(s, holder, ttl_ms, limit, types, n_types, skip, n_skip, out,
                                retry_at, err);
  if (s->base)
    return es_tenant_claim_next(s, holder, ttl_ms, limit, types, n_types, skip, n_skip, out,
                                retry_at, err);
  return es_core_claim_next(s, NULL, holder, ttl_ms, limit, types, n_types, skip, n_skip, out,
                            retry_at, err);
}

int es_core_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms,
                       int64_t limit, const char *const *types, size_t n_types,
                       const char *const *skip, size_t n_skip, es_events *out, int64_t *retry_at,
                       es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  es_claim_opts o = {.holder = holder, .ttl_ms = ttl_ms, .expires_at = ES_NONE, .limit = limit};
  if ((rc = check_claim_opts(&o, err))) return rc;
  const char **tv = NULL;
  size_t tn = 0;
  if (types && (rc = claim_types(types, n_types, &tv, &tn, err))) return rc;
  if (limit == ES_NONE) limit = 1;
  if ((rc = es_core_enter(s, err))) {
    free(tv);
    return rc;
  }
  claim_next_args a = {holder, 0, cap_limit(limit), 0, tv, tn, skip, skip ? n_skip : 0, out,
                       ES_NONE, scope, 0, ttl_ms};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, ttl_ms, &a.expires)) rc = too_late(err, "ttl_ms");
  /* An empty list of types (an engine without handlers) claims nothing and
   * waits for nothing. */
  if (rc == ES_OK && !(types && tn == 0))
    rc = s->ops->claim_begin ? claim_next_own_txn(s, &a, err) : claim_write(s, &a, err);
  es_core_leave(s);
  free(tv);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *retry_at = a.retry_at;
  return ES_OK;
}

/* renew and release (claims taken and never started) share one walk over
 * the caller's claims: a claim the holder no longer owns is reported
 * superseded, one of another holder is left alone, and each of the
 * holder's own is renewed (release 0) or undone (release 1). */
typedef struct {
  const char *session, *holder;
  const es_claim_ref *claims;
  size_t n;
  int64_t expires, now;
  int release;
  es_renew_result *out;
} claims_args;

/* As if the claim had never been made: the attempt number goes back (the
 * next claim takes it again: the attempts of an event stay the ones that
 * ran or may have run), so it counts neither as a failure nor as an
 * attempt that never finished. */
static int release_row(es_store *s, es_txn *t, claims_args *a, es_event *row, es_err *err) {
  es_session_info si;
  int rc = load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  free(row->claim_holder);
  row->claim_holder = NULL;
  row->claim_expires_at = ES_NONE;
  row->attempts--;
  if (row->attempts == 0) row->first_claimed_at = ES_NONE;
  row->due_at = due_of(row, a->now);
  rc = s->ops->event_update(t, row, err);
  if (rc == ES_OK) {
    si.attempts--;
    si.updated_at = a->now;
    rc = s->ops->session_put(t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

static int do_claims(es_store *s, es_txn *t, void *arg, es_err *err) {
  claims_args *a = arg;
  int rc = ES_OK;
  a->out->n_renewed = a->out->n_superseded = 0;
  for (size_t i = 0; i < a->n && rc == ES_OK; i++) {
    es_event row;
    rc = s->ops->event_get(t, a->session, a->claims[i].index, &row, err);
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      continue;
    }
    if (rc) break;
    if (!owns(&row, a->claims[i].attempt)) {
      a->out->superseded[a->out->n_superseded++] = row.index;
    } else if (strcmp(row.claim_holder, a->holder) == 0) {
      if (a->release) {
        rc = release_row(s, t, a, &row, err);
      } else {
        row.claim_expires_at = row.due_at = a->expires;
        rc = s->ops->event_update(t, &row, err);
      }
      if (rc == ES_OK) a->out->renewed[a->out->n_renewed++] = row.index;
    }
    es_event_destroy(&row);
  }
  return rc;
}

/* The checks and the transaction of renew and release_claims (a->out set,
 * the rest of a filled in by the caller except now and, for renew with
 * expires_at ES_NONE, expires). */
static int claims_call(es_store *s, claims_args *a, int64_t ttl_ms, es_err *err) {
  int rc;
  memset(a->out, 0, sizeof *a->out);
  if ((rc = es_check_name("session", a->session, err)) ||
      (rc = es_check_name("holder", a->holder, err)))
    return rc;
  if (!a->release) {
    if (a->expires == ES_NONE && ttl_ms <= 0)
      return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0 (or give expires_at)");
    if ((rc = check_nonneg("expires_at", a->expires, err))) return rc;
  }
  size_t room = a->n ? a->n : 1;
  a->out->renewed = malloc(room * sizeof *a->out->renewed);
  a->out->superseded = malloc(room * sizeof *a->out->superseded);
  if (!a->out->renewed || !a->out->superseded) {
    es_renew_result_destroy(a->out);
    return nomem(err);
  }
  if ((rc = es_core_enter(s, err))) {
    es_renew_result_destroy(a->out);
    return rc;
  }
  rc = es_store_now(s, &a->now, err);
  if (rc == ES_OK && !a->release && a->expires == ES_NONE && add_time(a->now, ttl_ms, &a->expires))
    rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_claims, a, err);
  es_core_leave(s);
  if (rc) es_renew_result_destroy(a->out);
  return rc;
}

int es_store_renew(es_store *s, const char *session, const char *holder, const es_claim_ref *claims,
                   size_t n, int64_t ttl_ms, int64_t expires_at, es_renew_result *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_RENEW,
                es_store_renew(s, session, holder, claims, n, ttl_ms, expires_at, out, err));
  if (s->shards) return es_shards_renew(s, session, holder, claims, n, ttl_ms, expires_at, out, err);
  if (s->base) return es_tenant_renew(s, session, holder, claims, n, ttl_ms, expires_at, out, err);
  claims_args a = {session, holder, claims, n, expires_at, 0, 0, out};
  return claims_call(s, &a, ttl_ms, err);
}

int es_store_release_claims(es_store *s, const char *session, const char *holder,
                            const es_claim_ref *claims, size_t n, es_renew_result *out,
                            es_err *err) {
  ES_STATS_CALL(s, ES_OP_RELEASE_CLAIMS,
                es_store_release_claims(s, session, holder, claims, n, out, err));
  if (s->shards) return es_shards_release_claims(s, session, holder, claims, n, out, err);
  if (s->base) return es_tenant_release_claims(s, session, holder, claims, n, out, err);
  claims_args a = {session, holder, claims, n, ES_NONE, 0, 1, out};
  return claims_call(s, &a, 0, err);
}

/* --- complete --- */

typedef struct {
  const char *session;
  int64_t index, attempt;
  const es_new_event *evs;
  size_t n;
  int64_t fence;
  int64_t now;
  int outcome;
  es_events *out;
  const char *scope;  /* §3.11: the tenant prefix of generated ids, or NULL */
} complete_args;

/* A repeated complete() of the attempt that completed the event: the same
 * ids return the same events; anything else is PARTIAL_DUPLICATE_BATCH. */
static int complete_replay(es_store *s, es_txn *t, complete_args *a, const es_event *parent,
                           es_err *err) {
  int replayed = 0;
  int rc = ES_OK;
  if ((int64_t)a->n == parent->returned) {
    if (a->n == 0) replayed = 1;
    else rc = check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  }
  for (size_t i = 0; rc == ES_OK && replayed && i < a->out->n; i++) {
    if (a->out->v[i].cause_index != a->index || a->out->v[i].cause_attempt != a->attempt)
      replayed = 0;
  }
  if (rc == ES_ID_CONFLICT || rc == ES_STORAGE) return rc;
  if (rc != ES_OK || !replayed) {
    es_events_destroy(a->out);
    return es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                   "attempt %lld already completed event %lld with a different batch",
                   (long long)a->attempt, (long long)a->index);
  }
  a->outcome = ES_COMPLETED;
  return ES_OK;
}

static int do_complete(es_store *s, es_txn *t, void *arg, es_err *err) {
  complete_args *a = arg;
  es_event parent;
  int rc = get_event(s, t, a->session, a->index, &parent, err);
  if (rc) return rc;
  if (parent.status == ES_STATUS_PROCESSED && parent.returned >= 0 &&
      parent.attempts == a->attempt) {
    rc = complete_replay(s, t, a, &parent, err);
    es_event_destroy(&parent);
    return rc;
  }
  es_session_info si;
  if ((rc = load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&parent);
    return rc;
  }
  /* A fenced-out writer learns it even when its attempt was also
   * superseded: STALE_FENCE says stop, SUPERSEDED only "not this one". */
  if (a->fence != ES_NONE) rc = check_writable(&si, a->fence, 0, err);
  if (rc == ES_OK && !owns(&parent, a->attempt)) {
    a->outcome = ES_SUPERSEDED;
    es_session_info_destroy(&si);
    es_event_destroy(&parent);
    return ES_OK;
  }
  if (rc == ES_OK) rc = check_writable(&si, ES_NONE, a->n, err);
  int replayed = 0;
  if (rc == ES_OK) rc = check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  if (rc == ES_OK && replayed) {
    es_events_destroy(a->out);
    rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH, "the returned events' ids are already stored");
  }
  if (rc == ES_OK)
    rc = insert_events(s, t, &si, a->evs, a->n, a->index, a->attempt, a->now, a->scope, a->out,
                       err);
  if (rc == ES_OK) {
    free(parent.claim_holder);
    parent.claim_holder = NULL;
    parent.status = ES_STATUS_PROCESSED;
    parent.processed_at = a->now;
    parent.claim_expires_at = ES_NONE;
    parent.retry_at = ES_NONE;
    parent.queued = 0;
    parent.due_at = ES_NONE;
    parent.returned = (int64_t)a->n;
    parent.processed_by_attempt = a->attempt;
    rc = s->ops->event_update(t, &parent, err);
  }
  if (rc == ES_OK) rc = advance_lane(s, t, &parent, a->now, err);
  if (rc == ES_OK) {
    si.pending--;
    si.updated_at = a->now;
    rc = s->ops->session_put(t, &si, err);
  }
  if (rc == ES_OK) a->outcome = ES_COMPLETED;
  es_session_info_destroy(&si);
  es_event_destroy(&parent);
  return rc;
}

int es_store_complete(es_store *s, const char *session, int64_t index, int64_t attempt,
                      const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                      es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPLETE,
                es_store_complete(s, session, index, attempt, evs, n, fence, outcome, out, err));
  if (s->shards) return es_shards_complete(s, session, index, attempt, evs, n, fence, outcome, out, err);
  if (s->base) return es_tenant_complete(s, session, index, attempt, evs, n, fence, outcome, out, err);
  return es_core_complete(s, NULL, session, index, attempt, evs, n, fence, outcome, out, err);
}

int es_core_complete(es_store *s, const char *scope, const char *session, int64_t index,
                     int64_t attempt, const es_new_event *evs, size_t n, int64_t fence,
                     int *outcome, es_events *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err)) || (rc = check_batch(s, evs, n, err))) return rc;
  if (fence != ES_NONE && fence < 1) return es_fail(err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  if ((rc = es_core_enter(s, err))) return rc;
  complete_args a = {session, index, attempt, evs, n, fence, 0, 0, out, scope};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_complete, &a, err);
  es_core_leave(s);
  if (rc || a.outcome != ES_COMPLETED) es_events_destroy(out);
  if (rc) return rc;
  *outcome = a.outcome;
  return ES_OK;
}

/* --- complete_many: several completions, one transaction --- */

typedef struct {
  es_completion *v;
  size_t n;
  int64_t now;
} complete_many_args;

/* Does completion c need a savepoint of its own in complete_many? Every
 * error do_complete can meet before its first write is an answer, and
 * after it only STORAGE, which fails the whole call (the transaction is
 * rolled back: every item is then STORAGE, to be tried again), as long as
 * its events are inserted without a step that can refuse one of them
 * halfway: an event with a key is sealed (the key may be refused), one
 * without an id may be given one by the store's id source (which may
 * fail). Only such items need a savepoint, so that one failing halfway
 * leaves nothing. */
static int completion_needs_savepoint(const es_completion *c) {
  for (size_t i = 0; i < c->n; i++)
    if (!c->evs[i].id || c->evs[i].key) return 1;
  return 0;
}

/* The most completions whose reads go ahead together (read_ahead). */
#define READ_AHEAD_MAX 64

/* Tells the backend what completions v[0..n) will read (read_ahead). */
static int complete_read_ahead(es_store *s, es_txn *t, const es_completion *v, size_t n,
                               es_err *err) {
  const char *sessions[READ_AHEAD_MAX];
  int64_t indexes[READ_AHEAD_MAX];
  size_t n_ids = 0;
  for (size_t i = 0; i < n; i++) {
    sessions[i] = v[i].session;
    indexes[i] = v[i].index;
    n_ids += v[i].n;
  }
  const char **ids = n_ids ? malloc(n_ids * sizeof *ids) : NULL;
  if (n_ids && !ids) return nomem(err);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < v[i].n; j++)
      if (v[i].evs[j].id) ids[k++] = v[i].evs[j].id;
  int rc = s->ops->read_ahead(t, sessions, indexes, n, ids, k, err);
  free(ids);
  return rc;
}

/* Each completion as do_complete; an item's own error (NO_SUCH_EVENT,
 * STALE_FENCE, SEALED, PARTIAL_DUPLICATE_BATCH, ...) is its answer alone.
 * The reads of up to READ_AHEAD_MAX items go ahead together. */
static int do_complete_many(es_store *s, es_txn *t, void *arg, es_err *err) {
  complete_many_args *m = arg;
  for (size_t i = 0; i < m->n; i++) {
    es_completion *c = &m->v[i];
    if (s->ops->read_ahead && i % READ_AHEAD_MAX == 0) {
      size_t n = m->n - i < READ_AHEAD_MAX ? m->n - i : READ_AHEAD_MAX;
      int rc = complete_read_ahead(s, t, c, n, err);
      if (rc) {
        for (size_t j = i; j < m->n; j++) m->v[j].rc = rc, m->v[j].err = *err;
        return rc;
      }
    }
    es_events out;
    memset(&out, 0, sizeof out);
    complete_args a = {c->session, c->index, c->attempt, c->evs, c->n, c->fence, m->now, 0, &out,
                       NULL};
    memset(&c->err, 0, sizeof c->err);
    int own_sp = completion_needs_savepoint(c);
    int rc = own_sp ? s->ops->savepoint(t, &c->err) : ES_OK;
    if (rc == ES_OK) {
      rc = do_complete(s, t, &a, &c->err);
      if (own_sp) {
        if (rc == ES_OK) rc = s->ops->savepoint_release(t, &c->err);
        if (rc != ES_OK) s->ops->savepoint_rollback(t);
      }
    }
    es_events_destroy(&out);
    c->rc = rc;
    c->outcome = rc == ES_OK ? a.outcome : 0;
    if (rc == ES_STORAGE) {
      *err = c->err;
      return rc;
    }
  }
  return ES_OK;
}

int es_store_complete_many(es_store *s, es_completion *v, size_t n, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPLETE_MANY, es_store_complete_many(s, v, n, err));
  for (size_t i = 0; i < n; i++) {
    v[i].rc = ES_OK;
    v[i].outcome = 0;
    memset(&v[i].err, 0, sizeof v[i].err);
  }
  if (s->shards || s->base) {
    /* a tenant's or a shard's completions go one by one through its own rules */
    for (size_t i = 0; i < n; i++) {
      es_events out;
      v[i].rc = es_store_complete(s, v[i].session, v[i].index, v[i].attempt, v[i].evs, v[i].n,
                                  v[i].fence, &v[i].outcome, &out, &v[i].err);
      if (v[i].rc == ES_OK) es_events_destroy(&out);
      if (v[i].rc == ES_CLOSED) return es_fail(err, ES_CLOSED, "%s", v[i].err.msg);
    }
    return ES_OK;
  }
  int rc;
  for (size_t i = 0; i < n; i++) {
    es_completion *c = &v[i];
    if ((c->rc = es_check_name("session", c->session, &c->err)) ||
        (c->rc = check_batch(s, c->evs, c->n, &c->err)))
      continue;
    if (c->fence != ES_NONE && c->fence < 1)
      c->rc = es_fail(&c->err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  }
  /* the items that passed the checks, in order */
  es_completion *ok = n ? malloc(n * sizeof *ok) : NULL;
  size_t k = 0;
  if (n && !ok) return nomem(err);
  for (size_t i = 0; i < n; i++)
    if (v[i].rc == ES_OK) ok[k++] = v[i];
  if ((rc = es_core_enter(s, err))) {
    free(ok);
    return rc;
  }
  complete_many_args m = {ok, k, 0};
  rc = k ? es_store_now(s, &m.now, err) : ES_OK;
  if (rc == ES_OK && k) rc = es_core_write(s, do_complete_many, &m, err);
  es_core_leave(s);
  for (size_t i = 0, j = 0; i < n && j < k; i++) {
    if (v[i].rc != ES_OK) continue;
    v[i].rc = rc ? rc : ok[j].rc;
    v[i].outcome = rc ? 0 : ok[j].outcome;
    v[i].err = rc ? *err : ok[j].err;
    j++;
  }
  free(ok);
  return rc;
}

/* --- fail, revive, settle --- */

typedef struct {
  const char *session;
  int64_t index, attempt;
  const char *error;
  int64_t max_failures, retry_after_ms, now;
  int outcome;
  int64_t failures;
  int64_t retry_at;  /* now + retry_after_ms */
} fail_args;

static int do_fail(es_store *s, es_txn *t, void *arg, es_err *err) {
  fail_args *a = arg;
  es_event row;
  int rc = get_event(s, t, a->session, a->index, &row, err);
  if (rc) return rc;
  a->failures = row.failures;
  if (row.status != ES_STATUS_PROCESSED && row.attempts == a->attempt &&
      row.last_failed_attempt == a->attempt && !row.claim_holder) {
    /* The same fail again: same outcome, counted once. */
    a->outcome = row.status == ES_STATUS_DEAD ? ES_DEAD_LETTERED : ES_FAILED;
    es_event_destroy(&row);
    return ES_OK;
  }
  if (!owns(&row, a->attempt)) {
    a->outcome = ES_SUPERSEDED;
    es_event_destroy(&row);
    return ES_OK;
  }
  es_session_info si;
  if ((rc = load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&row);
    return rc;
  }
  /* Stored text is always valid UTF-8 and bounded (es_text_clean), so every
   * reader (Lua, JSON output, the CLI) can show it. */
  char *msg = NULL;
  if (es_text_clean(a->error, strlen(a->error), ES_MAX_TEXT_BYTES, &msg, NULL)) rc = nomem(err);
  if (rc == ES_OK) {
    free(row.last_error);
    row.last_error = msg;
    free(row.claim_holder);
    row.claim_holder = NULL;
    row.claim_expires_at = ES_NONE;
    row.failures++;
    row.last_failed_attempt = a->attempt;
    row.failed_at = a->now;
    si.failures++;
    if (row.failures >= a->max_failures) {
      row.status = ES_STATUS_DEAD;
      row.queued = 0;
      row.due_at = ES_NONE;
      row.retry_at = ES_NONE;
      si.pending--;
      si.dead++;
      a->outcome = ES_DEAD_LETTERED;
    } else {
      row.retry_at = a->retry_after_ms > 0 ? a->retry_at : ES_NONE;
      row.due_at = due_of(&row, a->now);
      a->outcome = ES_FAILED;
    }
    a->failures = row.failures;
    si.updated_at = a->now;
    rc = s->ops->event_update(t, &row, err);
  }
  if (rc == ES_OK) rc = s->ops->session_put(t, &si, err);
  es_session_info_destroy(&si);
  es_event_destroy(&row);
  return rc;
}

int es_store_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                  const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                  int64_t *failures, es_err *err) {
  ES_STATS_CALL(s, ES_OP_FAIL,
                es_store_fail(s, session, index, attempt, error, max_failures, retry_after_ms, outcome, failures, err));
  if (s->shards)
    return es_shards_fail(s, session, index, attempt, error, max_failures, retry_after_ms, outcome, failures, err);
  if (s->base)
    return es_tenant_fail(s, session, index, attempt, error, max_failures, retry_after_ms, outcome, failures, err);
  int rc;
  if ((rc = es_check_name("session", session, err))) return rc;
  if (!error) return es_fail(err, ES_INVALID_ARGUMENT, "error is required");
  if (max_failures < 1) return es_fail(err, ES_INVALID_ARGUMENT, "max_failures must be >= 1");
  if (retry_after_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "retry_after_ms must be >= 0");
  if ((rc = es_core_enter(s, err))) return rc;
  fail_args a = {session, index, attempt, error, max_failures, retry_after_ms, 0, 0, 0, ES_NONE};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, retry_after_ms, &a.retry_at))
    rc = too_late(err, "retry_after_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_fail, &a, err);
  es_core_leave(s);
  if (rc) return rc;
  *outcome = a.outcome;
  *failures = a.failures;
  return ES_OK;
}

typedef struct {
  const char *session;
  int64_t index;
  const char *reason; /* settle */
  int revive;
  int64_t now;
} dead_args;

/* A settled dead letter's last_error: its last error (cleaned too: a file
 * written by an older version may hold any bytes), a newline, "settled: "
 * and the reason; within ES_MAX_TEXT_BYTES, the reason keeping at least
 * half of it so a long error cannot push the reason out. NULL: out of memory. */
static char *settle_text(const char *last_error, const char *reason) {
  static const char sep[] = "settled: ";
  char *why = NULL, *old = NULL, *msg = NULL;
  size_t nwhy = 0, nold = 0;
  if (es_text_clean(reason, strlen(reason), ES_MAX_TEXT_BYTES / 2, &why, &nwhy)) return NULL;
  size_t room = ES_MAX_TEXT_BYTES - nwhy - (sizeof sep - 1) - 1; /* - 1: the newline */
  if (last_error && es_text_clean(last_error, strlen(last_error), room, &old, &nold)) {
    free(why);
    return NULL;
  }
  size_t n = nold + (old ? 1 : 0) + (sizeof sep - 1) + nwhy + 1;
  msg = malloc(n);
  if (msg) snprintf(msg, n, "%s%s%s%s", old ? old : "", old ? "\n" : "", sep, why);
  free(why);
  free(old);
  return msg;
}

static int do_dead_change(es_store *s, es_txn *t, void *arg, es_err *err) {
  dead_args *a = arg;
  es_event row;
  int rc = get_event(s, t, a->session, a->index, &row, err);
  if (rc) return rc;
  if (row.status != ES_STATUS_DEAD) {
    es_event_destroy(&row);
    return es_fail(err, ES_INVALID_ARGUMENT, "event %lld in session '%s' is not a dead letter",
                   (long long)a->index, a->session);
  }
  es_session_info si;
  if ((rc = load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&row);
    return rc;
  }
  si.dead--;
  si.updated_at = a->now;
  if (a->revive) {
    row.status = ES_STATUS_PENDING;
    row.failures = 0;
    /* Attempts up to now ended (the last one dead-lettered it): an engine
     * counting attempts that never ended (docs/engine.md) starts afresh. */
    row.last_failed_attempt = row.attempts;
    row.retry_at = ES_NONE;
    row.queued = 1; /* a dead letter was the head of its lane */
    row.due_at = due_of(&row, a->now);
    si.pending++;
  } else {
    row.status = ES_STATUS_PROCESSED;
    row.processed_at = a->now;
    row.returned = -1;
    if (a->reason && *a->reason) {
      char *msg = settle_text(row.last_error, a->reason);
      if (!msg) rc = nomem(err);
      else {
        free(row.last_error);
        row.last_error = msg;
      }
    }
  }
  if (rc == ES_OK) rc = s->ops->event_update(t, &row, err);
  if (rc == ES_OK && !a->revive) rc = advance_lane(s, t, &row, a->now, err);
  if (rc == ES_OK) rc = s->ops->session_put(t, &si, err);
  es_session_info_destroy(&si);
  es_event_destroy(&row);
  return rc;
}

static int dead_change(es_store *s, dead_args *a, es_err *err) {
  int rc;
  if ((rc = es_check_name("session", a->session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  rc = es_store_now(s, &a->now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_dead_change, a, err);
  es_core_leave(s);
  return rc;
}

int es_store_revive(es_store *s, const char *session, int64_t index, es_err *err) {
  ES_STATS_CALL(s, ES_OP_REVIVE, es_store_revive(s, session, index, err));
  if (s->shards) return es_shards_revive(s, session, index, err);
  if (s->base) return es_tenant_revive(s, session, index, err);
  dead_args a = {session, index, NULL, 1, 0};
  return dead_change(s, &a, err);
}

int es_store_settle(es_store *s, const char *session, int64_t index, const char *reason,
                    es_err *err) {
  ES_STATS_CALL(s, ES_OP_SETTLE, es_store_settle(s, session, index, reason, err));
  if (s->shards) return es_shards_settle(s, session, index, reason, err);
  if (s->base) return es_tenant_settle(s, session, index, reason, err);
  dead_args a = {session, index, reason, 0, 0};
  return dead_change(s, &a, err);
}

static int do_dead_list(es_store *s, es_txn *t, void *arg, es_err *err) {
  all_args *a = arg;
  collector c = {a->out, 0};
  int rc = collected(
      s->ops->dead_list(t, a->session, a->scope, a->after, a->limit, collect_event, &c, err), &c,
      err);
  return revealed(s, t, rc, a->out, err);
}

int es_store_dead_letters(es_store *s, const char *session, int64_t after, int64_t limit,
                          es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DEAD_LETTERS, es_store_dead_letters(s, session, after, limit, out, err));
  if (s->shards) return es_shards_dead_letters(s, session, after, limit, out, err);
  if (s->base) return es_tenant_dead_letters(s, session, after, limit, out, err);
  return es_core_dead_letters(s, NULL, session, after, limit, out, err);
}

int es_core_dead_letters(es_store *s, const char *scope, const char *session, int64_t after,
                         int64_t limit, es_events *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if (session && (rc = es_check_name("session", session, err))) return rc;
  if ((rc = check_nonneg("after", after, err)) || (rc = check_nonneg("limit", limit, err))) return rc;
  if (limit == 0) return ES_OK;
  if ((rc = es_core_enter(s, err))) return rc;
  all_args a = {after == ES_NONE ? 0 : after, cap_limit(limit), session, out,
                session ? NULL : scope};
  rc = es_core_read(s, do_dead_list, &a, err);
  es_core_leave(s);
  if (rc) es_events_destroy(out);
  return rc;
}

/* --- snapshots --- */

typedef struct {
  const char *session, *reducer;
  int *found;
  es_snapshot *snap;
  es_events *events;
} state_args;

static int do_read_state(es_store *s, es_txn *t, void *arg, es_err *err) {
  state_args *a = arg;
  int rc = s->ops->snapshot_get(t, a->session, a->reducer, a->snap, err);
  *a->found = rc == ES_OK;
  if (rc == ES_NOT_FOUND) rc = ES_OK;
  if (rc) return rc;
  int64_t after = *a->found ? a->snap->index : 0;
  es_session_info si;
  rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_OK) {
    rc = check_live(&si, after, si.head, err); /* the fold from this snapshot needs them */
    int64_t limit = ES_NONE; /* §3.9: archived events after the snapshot come first */
    if (rc == ES_OK) rc = es_archive_read_part(s, t, &si, &after, si.head, &limit, a->events, err);
    es_session_info_destroy(&si);
  } else if (rc == ES_NOT_FOUND) {
    rc = ES_OK;
  }
  if (rc) {
    es_snapshot_destroy(a->snap);
    *a->found = 0;
    return rc;
  }
  collector c = {a->events, 0};
  rc = collected(
      s->ops->event_range(t, a->session, after, INT64_MAX, ES_NONE, collect_event, &c, err), &c, err);
  return revealed(s, t, rc, a->events, err);
}

int es_store_read_state(es_store *s, const char *session, const char *reducer, int *found,
                        es_snapshot *snap, es_events *events, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_STATE,
                es_store_read_state(s, session, reducer, found, snap, events, err));
  if (s->shards) return es_shards_read_state(s, session, reducer, found, snap, events, err);
  if (s->base) return es_tenant_read_state(s, session, reducer, found, snap, events, err);
  int rc;
  memset(events, 0, sizeof *events);
  es_snapshot_init(snap);
  *found = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("reducer", reducer, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  state_args a = {session, reducer, found, snap, events};
  rc = es_core_read(s, do_read_state, &a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_events_destroy(events);
    es_snapshot_destroy(snap);
    rc = es_core_read(s, do_read_state, &a, err);
  }
  es_core_leave(s);
  if (rc) {
    es_events_destroy(events);
    es_snapshot_destroy(snap);
    *found = 0;
  }
  return rc;
}

/* read_states: every session's answer inside one read transaction. */
typedef struct {
  const char *const *sessions;
  size_t n;
  const char *reducer;
  es_state_read *out;
} states_args;

static int do_read_states(es_store *s, es_txn *t, void *arg, es_err *err) {
  states_args *a = arg;
  for (size_t i = 0; i < a->n; i++) {
    state_args one = {a->sessions[i], a->reducer, &a->out[i].found, &a->out[i].snap,
                      &a->out[i].events};
    int rc = do_read_state(s, t, &one, err);
    if (rc) return rc;
  }
  return ES_OK;
}

void es_state_reads_destroy(es_state_read *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    es_snapshot_destroy(&v[i].snap);
    es_events_destroy(&v[i].events);
    v[i].found = 0;
  }
}

int es_store_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                         es_state_read *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_STATES, es_store_read_states(s, sessions, n, reducer, out, err));
  if (s->shards) return es_shards_read_states(s, sessions, n, reducer, out, err);
  if (s->base) return es_tenant_read_states(s, sessions, n, reducer, out, err);
  int rc;
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    es_snapshot_init(&out[i].snap);
  }
  if ((rc = es_check_name("reducer", reducer, err))) return rc;
  if (n > ES_DEFAULT_MAX_BATCH)
    return es_fail(err, ES_TOO_LARGE, "%zu sessions, over the limit of %d", n, ES_DEFAULT_MAX_BATCH);
  for (size_t i = 0; i < n; i++) {
    char what[40];
    snprintf(what, sizeof what, "sessions[%zu]", i + 1);
    if ((rc = es_check_name(what, sessions[i], err))) return rc;
  }
  if ((rc = es_core_enter(s, err))) return rc;
  states_args a = {sessions, n, reducer, out};
  rc = es_core_read(s, do_read_states, &a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_state_reads_destroy(out, n);
    rc = es_core_read(s, do_read_states, &a, err);
  }
  es_core_leave(s);
  if (rc) es_state_reads_destroy(out, n);
  return rc;
}

typedef struct {
  const char *session;
  es_snapshot row;
  int stored;
} put_snap_args;

static int do_put_snapshot(es_store *s, es_txn *t, void *arg, es_err *err) {
  put_snap_args *a = arg;
  es_session_info si;
  int64_t head = 0;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_OK) {
    head = si.head;
    es_session_info_destroy(&si);
  } else if (rc != ES_NOT_FOUND) {
    return rc;
  }
  if (a->row.index > head)
    return es_fail(err, ES_NO_SUCH_EVENT, "snapshot index %lld is beyond the head %lld of '%s'",
                   (long long)a->row.index, (long long)head, a->session);
  es_snapshot old;
  rc = s->ops->snapshot_get(t, a->session, a->row.reducer, &old, err);
  if (rc == ES_OK) {
    int newer = old.index > a->row.index;
    es_snapshot_destroy(&old);
    /* Never replace a further-along snapshot: a slow writer must not
     * clobber a fast one. Equal index replaces (a new reducer version). */
    if (newer) return ES_OK;
  } else if (rc != ES_NOT_FOUND) {
    return rc;
  }
  rc = s->ops->snapshot_put(t, a->session, &a->row, err);
  if (rc == ES_OK) a->stored = 1;
  return rc;
}

int es_store_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                          const char *state, size_t state_len, const char *version, int *stored,
                          es_err *err) {
  ES_STATS_CALL(s, ES_OP_PUT_SNAPSHOT,
                es_store_put_snapshot(s, session, reducer, index, state, state_len, version, stored, err));
  if (s->shards)
    return es_shards_put_snapshot(s, session, reducer, index, state, state_len, version, stored, err);
  if (s->base)
    return es_tenant_put_snapshot(s, session, reducer, index, state, state_len, version, stored, err);
  int rc;
  *stored = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("reducer", reducer, err)))
    return rc;
  if (index < 0) return es_fail(err, ES_INVALID_ARGUMENT, "snapshot index must be >= 0");
  if (!state) return es_fail(err, ES_INVALID_ARGUMENT, "snapshot state is required");
  if (!version) version = "";
  if ((rc = es_core_enter(s, err))) return rc;
  put_snap_args a = {session, {0}, 0};
  a.row.reducer = (char *)reducer;
  a.row.index = index;
  a.row.state = (char *)state;
  a.row.state_len = state_len;
  a.row.version = (char *)version;
  rc = es_store_now(s, &a.row.updated_at, err);
  if (rc == ES_OK) rc = es_core_write(s, do_put_snapshot, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *stored = a.stored;
  return rc;
}

static int collect_snapshot(void *ctx, const es_snapshot *row) {
  collector *c = ctx;
  es_snapshots *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_snapshot_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *session;
  es_snapshots *out;
} snaps_args;

static int do_snapshots(es_store *s, es_txn *t, void *arg, es_err *err) {
  snaps_args *a = arg;
  collector c = {a->out, 0};
  return collected(s->ops->snapshot_list(t, a->session, collect_snapshot, &c, err), &c, err);
}

int es_store_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SNAPSHOTS, es_store_snapshots(s, session, out, err));
  if (s->shards) return es_shards_snapshots(s, session, out, err);
  if (s->base) return es_tenant_snapshots(s, session, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  snaps_args a = {session, out};
  rc = es_core_read(s, do_snapshots, &a, err);
  es_core_leave(s);
  if (rc) es_snapshots_destroy(out);
  return rc;
}

/* --- inspection --- */

static int collect_session(void *ctx, const es_session_info *row) {
  collector *c = ctx;
  es_sessions *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_session_info_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *prefix, *after;
  int64_t limit;
  es_sessions *out;
} sessions_args;

static int do_sessions(es_store *s, es_txn *t, void *arg, es_err *err) {
  sessions_args *a = arg;
  /* One more than asked tells whether another page follows. */
  collector c = {a->out, 0};
  int rc = collected(
      s->ops->session_list(t, a->prefix, a->after, a->limit + 1, collect_session, &c, err), &c, err);
  if (rc) return rc;
  if ((int64_t)a->out->n > a->limit) {
    es_session_info_destroy(&a->out->v[--a->out->n]);
    a->out->cursor = strdup(a->out->v[a->out->n - 1].session);
    if (!a->out->cursor) return nomem(err);
  }
  return ES_OK;
}

int es_store_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                      es_sessions *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SESSIONS, es_store_sessions(s, prefix, after, limit, out, err));
  if (s->shards) return es_shards_sessions(s, prefix, after, limit, out, err);
  if (s->base) return es_tenant_sessions(s, prefix, after, limit, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if (limit <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be > 0");
  if ((rc = es_core_enter(s, err))) return rc;
  sessions_args a = {prefix ? prefix : "", after, cap_limit(limit), out};
  rc = es_core_read(s, do_sessions, &a, err);
  es_core_leave(s);
  if (rc) es_sessions_destroy(out);
  return rc;
}

/* --- pending events by type --- */

typedef struct {
  es_type_counts *out;
  size_t cap;
  int oom;
  const char *scope;  /* §3.11: a tenant's prefix, or NULL */
} type_counts_args;

static int collect_type_count(void *ctx, const char *type, int64_t pending) {
  type_counts_args *a = ctx;
  char *copy = strdup(type);
  if (!copy || es_grow((void **)&a->out->v, &a->cap, a->out->n + 1, sizeof *a->out->v) != ES_OK) {
    free(copy);
    a->oom = 1;
    return 1;
  }
  a->out->v[a->out->n].type = copy;
  a->out->v[a->out->n++].pending = pending;
  return 0;
}

static int do_pending_types(es_store *s, es_txn *t, void *arg, es_err *err) {
  type_counts_args *a = arg;
  int rc = s->ops->pending_types(t, a->scope, collect_type_count, a, err);
  return rc == ES_OK && a->oom ? nomem(err) : rc;
}

void es_type_counts_destroy(es_type_counts *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) free(list->v[i].type);
  free(list->v);
  list->v = NULL;
  list->n = 0;
}

int es_store_pending_types(es_store *s, es_type_counts *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PENDING_TYPES, es_store_pending_types(s, out, err));
  if (s->shards) return es_shards_pending_types(s, out, err);
  if (s->base) return es_tenant_pending_types(s, out, err);
  return es_core_pending_types(s, NULL, out, err);
}

int es_core_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_core_enter(s, err))) return rc;
  type_counts_args a = {out, 0, 0, scope};
  rc = es_core_read(s, do_pending_types, &a, err);
  es_core_leave(s);
  if (rc) es_type_counts_destroy(out);
  return rc;
}

/* --- waiting --- */

int es_store_wait(es_store *s, const char *session, int64_t after, int64_t timeout_ms,
                  int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_WAIT, es_store_wait(s, session, after, timeout_ms, limit, out, err));
  if (s->shards) return es_shards_wait(s, session, after, timeout_ms, limit, out, err);
  if (s->base) return es_tenant_wait(s, session, after, timeout_ms, limit, out, err);
  return es_core_wait(s, NULL, session, after, timeout_ms, limit, out, err);
}

/* es_core_wait on a backend that can block until data_version moves
 * (ops->wait_change, postgres: woken by LISTEN/NOTIFY): no polling loop.
 * The version is taken before each read, so a commit that the read missed
 * has moved it and the wait returns at once. Every commit of this process
 * moves it too (postgres NOTIFYs on each), and close() wakes the wait
 * (ops->wake), after which the next read says CLOSED. */
static int wait_notified(es_store *s, const char *scope, const char *session, int64_t after,
                         const struct timespec *deadline, int64_t limit, es_events *out,
                         es_err *err) {
  for (;;) {
    uint64_t v = 0;
    int rc = es_store_data_version(s, &v, err);
    if (rc == ES_OK)
      rc = session ? es_store_read(s, session, after, ES_NONE, limit, out, err)
                   : es_core_read_all(s, scope, after, limit, out, err);
    if (rc || out->n > 0) return rc;
    es_events_destroy(out);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 +
                   (deadline->tv_nsec - now.tv_nsec) / 1000000;
    if (left <= 0) {
      /* less than a millisecond left counts as none */
      return ES_OK;
    }
    /* inside enter/leave: close() waits for this call, after waking it */
    if ((rc = es_core_enter(s, err))) return rc;
    rc = s->ops->wait_change(s->bk, v, left, err);
    es_core_leave(s);
    if (rc) return rc;
  }
}

int es_core_wait(es_store *s, const char *scope, const char *session, int64_t after,
                 int64_t timeout_ms, int64_t limit, es_events *out, es_err *err) {
  struct timespec deadline;
  memset(out, 0, sizeof *out);
  if (timeout_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "timeout_ms must be >= 0");
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (timeout_ms % 1000) * 1000000;
  if (deadline.tv_nsec >= 1000000000) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000;
  }
  if (s->ops->wait_change) return wait_notified(s, scope, session, after, &deadline, limit, out, err);
  uint64_t ext = 0;
  int have_ext = 0;
  for (;;) {
    uint64_t seen = es_store_version(s);
    int rc = session ? es_store_read(s, session, after, ES_NONE, limit, out, err)
                     : es_core_read_all(s, scope, after, limit, out, err);
    if (rc || out->n > 0) return rc;
    es_events_destroy(out);
    if (s->ops->data_version) {
      uint64_t v = 0;
      if ((rc = es_store_data_version(s, &v, err))) return rc;
      if (have_ext && v != ext) {
        ext = v;
        continue; /* another process committed: read again */
      }
      ext = v;
      have_ext = 1;
    }
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > deadline.tv_sec ||
        (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec))
      return ES_OK;
    /* Sleep until a commit here, the deadline, or the next external poll. */
    until = now;
    until.tv_nsec += WAIT_POLL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    if (until.tv_sec > deadline.tv_sec ||
        (until.tv_sec == deadline.tv_sec && until.tv_nsec > deadline.tv_nsec))
      until = deadline;
    pthread_mutex_lock(&s->vmu);
    while (es_store_version(s) == seen) {
      if (pthread_cond_clockwait(&s->vcond, &s->vmu, CLOCK_MONOTONIC, &until) != 0) break;
    }
    pthread_mutex_unlock(&s->vmu);
  }
}

/* --- presence --- */

typedef struct {
  const char *ns, *participant;
  const es_presence_field *fields;
  size_t n;
  int64_t ttl_ms, at, seen, now;
  int64_t expires;  /* now + ttl_ms */
  es_presence_rows *applied;
} presence_args;

static int push_presence(es_presence_rows *rows, const es_presence_row *row) {
  if (es_grow((void **)&rows->v, &rows->cap, rows->n + 1, sizeof *rows->v) ||
      es_presence_row_copy(&rows->v[rows->n], row))
    return ES_STORAGE;
  rows->n++;
  return ES_OK;
}

static int do_presence_set(es_store *s, es_txn *t, void *arg, es_err *err) {
  presence_args *a = arg;
  int rc = s->ops->presence_expire(t, a->ns, a->now, err);
  for (size_t i = 0; rc == ES_OK && i < a->n; i++) {
    es_presence_row old;
    rc = s->ops->presence_get(t, a->ns, a->participant, a->fields[i].field, &old, err);
    if (rc == ES_OK) {
      /* Last writer wins by `at`; a tie goes to the incoming write. An
       * expired row (or tombstone) no longer guards its field. */
      int newer = old.expires_at > a->now && old.at > a->at;
      es_presence_row_destroy(&old);
      if (newer) continue;
    } else if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
    } else {
      break;
    }
    es_presence_row row = {
        .participant = (char *)a->participant,
        .field = (char *)a->fields[i].field,
        .value = (char *)a->fields[i].value,
        .value_len = a->fields[i].value_len,
        .seen = a->seen,
        .at = a->at,
        .expires_at = a->expires,
    };
    rc = s->ops->presence_put(t, a->ns, &row, err);
    if (rc == ES_OK && push_presence(a->applied, &row)) rc = nomem(err);
  }
  return rc;
}

int es_store_presence_set(es_store *s, const char *ns, const char *participant,
                          const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                          int64_t seen, es_presence_rows *applied, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PRESENCE_SET,
                es_store_presence_set(s, ns, participant, fields, n, ttl_ms, at, seen, applied, err));
  if (s->shards)
    return es_shards_presence_set(s, ns, participant, fields, n, ttl_ms, at, seen, applied, err);
  if (s->base)
    return es_tenant_presence_set(s, ns, participant, fields, n, ttl_ms, at, seen, applied, err);
  int rc;
  memset(applied, 0, sizeof *applied);
  if ((rc = es_check_name("namespace", ns, err)) || (rc = es_check_name("participant", participant, err)))
    return rc;
  if (ttl_ms <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0");
  if ((rc = check_nonneg("at", at, err))) return rc;
  if (seen < 0) return es_fail(err, ES_INVALID_ARGUMENT, "seen must be >= 0");
  for (size_t i = 0; i < n; i++) {
    if ((rc = es_check_name("presence field", fields[i].field, err))) return rc;
    if (fields[i].value) {
      if (fields[i].value_len > s->max_payload)
        return es_fail(err, ES_TOO_LARGE, "presence value '%s' is %zu bytes, over the limit of %zu",
                       fields[i].field, fields[i].value_len, s->max_payload);
      es_err jerr = {0};
      if (es_json_validate(fields[i].value, fields[i].value_len, &jerr))
        return es_fail(err, ES_INVALID_ARGUMENT, "presence value '%s': %s", fields[i].field,
                       jerr.msg);
    }
  }
  if ((rc = es_core_enter(s, err))) return rc;
  presence_args a = {ns, participant, fields, n, ttl_ms, at, seen, 0, 0, applied};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, ttl_ms, &a.expires)) rc = too_late(err, "ttl_ms");
  if (a.at == ES_NONE) a.at = a.now;
  if (rc == ES_OK && n > 0) rc = es_core_write(s, do_presence_set, &a, err);
  es_core_leave(s);
  if (rc) {
    es_presence_rows_destroy(applied);
    return rc;
  }
  if (applied->n == 0) return ES_OK;
  /* Tell in-process watchers, after commit, on this thread. */
  pthread_mutex_lock(&s->pmu);
  for (presence_watch *w = s->watches; w; w = w->next)
    if (strcmp(w->ns, ns) == 0) w->cb(w->ctx, ns, applied);
  pthread_mutex_unlock(&s->pmu);
  return ES_OK;
}

typedef struct {
  const char *ns;
  int64_t now;
  es_presence_rows *out;
} presence_read_args;

static int collect_presence(void *ctx, const es_presence_row *row) {
  collector *c = ctx;
  if (!row->value) return 0; /* tombstones only guard against older writes */
  if (push_presence(c->list, row) == ES_OK) return 0;
  c->oom = 1;
  return 1;
}

static int do_presence_read(es_store *s, es_txn *t, void *arg, es_err *err) {
  presence_read_args *a = arg;
  collector c = {a->out, 0};
  return collected(s->ops->presence_list(t, a->ns, a->now, collect_presence, &c, err), &c, err);
}

int es_store_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PRESENCE_READ, es_store_presence_read(s, ns, out, err));
  if (s->shards) return es_shards_presence_read(s, ns, out, err);
  if (s->base) return es_tenant_presence_read(s, ns, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("namespace", ns, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  presence_read_args a = {ns, 0, out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_read(s, do_presence_read, &a, err);
  es_core_leave(s);
  if (rc) es_presence_rows_destroy(out);
  return rc;
}

uint64_t es_store_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx) {
  if (s->shards) return es_shards_presence_watch(s, ns, cb, ctx);
  if (s->base) return es_tenant_presence_watch(s, ns, cb, ctx);
  presence_watch *w = calloc(1, sizeof *w);
  if (!w) return 0;
  w->ns = strdup(ns);
  if (!w->ns) {
    free(w);
    return 0;
  }
  w->cb = cb;
  w->ctx = ctx;
  pthread_mutex_lock(&s->pmu);
  w->token = s->next_token++;
  w->next = s->watches;
  s->watches = w;
  pthread_mutex_unlock(&s->pmu);
  return w->token;
}

void es_store_presence_unwatch(es_store *s, uint64_t token) {
  if (s->shards) {
    es_shards_presence_unwatch(s, token);
    return;
  }
  if (s->base) {
    es_tenant_presence_unwatch(s, token);
    return;
  }
  pthread_mutex_lock(&s->pmu);
  for (presence_watch **p = &s->watches; *p; p = &(*p)->next) {
    if ((*p)->token == token) {
      presence_watch *w = *p;
      *p = w->next;
      free(w->ns);
      free(w);
      break;
    }
  }
  pthread_mutex_unlock(&s->pmu);
}

/* ---------------------------------------------------------------------- */
/* 3.7 branches: fork, lineage, refs, promote */

#define FORK_CHUNK 1024  /* rows read from the source per step of a fork */

static int no_session(es_err *err, const char *session) {
  return es_fail(err, ES_NOT_FOUND, "no session '%s'", session);
}

static int check_limit(int64_t limit, es_err *err) {
  if (limit < 1) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be a positive integer");
  return ES_OK;
}

/* `after` bounds of listings may be any string (they need not name a
 * session or ref that exists); only their length is bounded. */
static int check_after(const char *after, es_err *err) {
  if (after && strlen(after) - tenant_prefix_len(after, strlen(after)) > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "after is longer than %d bytes", ES_MAX_ID_BYTES);
  return ES_OK;
}

static int lineage_of(const es_session_info *si, es_lineage *out) {
  memset(out, 0, sizeof *out);
  out->session = strdup(si->session);
  out->parent = strdup(si->parent);
  out->at = si->fork_at;
  out->created_at = si->forked_at;
  if (out->session && out->parent) return ES_OK;
  es_lineage_destroy(out);
  return ES_STORAGE;
}

typedef struct {
  const char *from, *to;
  int64_t at, now;
  es_lineage *out;
  const char *scope;  /* §3.11: the tenant prefix of the copies' ids, or NULL */
  es_keyring *ring;   /* §3.10: data keys of the copies sealed again (row by row) */
} fork_args;

typedef struct {
  es_store *s;
  int64_t now;
  const char *scope;
} fork_id_ctx;

/* The ids of a backend's bulk copy: UUIDv7 (behind a tenant's prefix),
 * unique by construction. */
static int fork_id(void *ctx, char *out, size_t cap, es_err *err) {
  fork_id_ctx *f = ctx;
  size_t p = f->scope ? strlen(f->scope) : 0;
  if (cap < p + 37) return es_fail(err, ES_STORAGE, "no room for an event id");
  memcpy(out, f->scope ? f->scope : "", p);
  return uuid7(f->s, f->now, out + p, err);
}

/* The backend copies the rows itself (event_copy): no row passes through
 * the core. Only with generated UUIDv7 ids: an injected id source's ids
 * are checked one by one (new_event_id), which the row-by-row copy does. */
static int fork_events_bulk(es_store *s, es_txn *t, fork_args *a, es_session_info *dst,
                            es_err *err) {
  es_events first = {0};
  collector c = {&first, 0};
  int rc = collected(s->ops->event_range(t, a->from, 0, a->at, 1, collect_event, &c, err), &c, err);
  if (rc == ES_OK && first.n) dst->first_at = first.v[0].created_at;
  es_events_destroy(&first);
  if (rc) return rc;
  fork_id_ctx ids = {s, a->now, a->scope};
  int64_t copied = 0;
  rc = s->ops->event_copy(t, a->from, a->at, dst->session, a->now, fork_id, &ids, &copied, err);
  if (rc == ES_OK && copied != a->at)
    rc = es_fail(err, ES_STORAGE, "session '%s' has %lld events through %lld, not %lld", a->from,
                 (long long)copied, (long long)a->at, (long long)a->at);
  if (rc == ES_OK) dst->head = dst->events = a->at;
  return rc;
}

/* Inserts the copy of one source event as a processed row of `to`. */
static int fork_copy_row(es_store *s, es_txn *t, fork_args *a, es_session_info *dst,
                         const es_event *src, es_err *err) {
  char id[ES_MAX_NAME_BYTES + 1];
  int rc;
  if ((rc = new_event_id(s, t, a->now, a->scope, id, err))) return rc;
  es_event row;
  es_event_init(&row);
  row.id = id;
  row.type = src->type;
  row.payload = src->payload;
  row.payload_len = src->payload_len;
  row.session = dst->session;
  row.lane = src->lane;
  row.index = src->index;
  row.created_at = src->created_at;
  row.cause_index = src->cause_index;
  row.cause_attempt = src->cause_attempt;
  row.not_before = src->not_before;
  row.status = ES_STATUS_PROCESSED;
  row.processed_at = a->now;
  row.returned = -1;
  row.origin_session = (char *)a->from;
  row.origin_index = src->index;
  row.key = src->key;
  char *sealed = NULL;
  if (src->key)
    rc = es_crypto_fork_payload(s, t, a->ring, src, &row, &sealed, &row.payload_len, err);
  if (sealed) row.payload = sealed;
  else row.payload_len = src->payload_len; /* no key, or shredded: copied as stored */
  if (rc == ES_OK) rc = s->ops->event_insert(t, &row, err);
  free(sealed);
  if (rc) return rc;
  if (dst->first_at == ES_NONE) dst->first_at = src->created_at;
  dst->head = dst->events = src->index;
  return ES_OK;
}

/* §3.9: archived events of the source are copied from its segments. */
typedef struct {
  es_store *s;
  es_txn *t;
  fork_args *a;
  es_session_info *dst;
  es_err *err;
  int rc;
} fork_archived_ctx;

static int fork_archived_row(void *ctx, const es_event *src) {
  fork_archived_ctx *c = ctx;
  c->rc = fork_copy_row(c->s, c->t, c->a, c->dst, src, c->err);
  return c->rc != ES_OK;
}

/* The source's archived events 1..at (first_index..archived_through of
 * it), copied row by row; *after: the last index copied. */
static int fork_archived(es_store *s, es_txn *t, fork_args *a, es_session_info *dst, int64_t *after,
                         es_err *err) {
  es_session_info src;
  int rc = s->ops->session_get(t, a->from, &src, err);
  if (rc) return rc;
  if (src.archived_through > 0 && a->at > 0) {
    fork_archived_ctx c = {s, t, a, dst, err, ES_OK};
    rc = es_archive_each(s, t, &src, 0, a->at, fork_archived_row, &c, err);
    if (rc == ES_OK) rc = c.rc;
    if (rc == ES_OK) *after = src.archived_through < a->at ? src.archived_through : a->at;
  }
  es_session_info_destroy(&src);
  return rc;
}

/* Copies the source's events 1..at in chunks (a backend iteration must not
 * run while rows are inserted) as processed rows of `to`. */
static int fork_events(es_store *s, es_txn *t, fork_args *a, es_session_info *dst, es_err *err) {
  /* §3.10: sealed payloads are bound to their event's id, so a store that
   * has ever sealed one copies row by row (each copy sealed again). */
  int keyed = 0;
  int rc = es_crypto_in_use(s, t, &keyed, err);
  if (rc) return rc;
  int64_t after = 0;
  if (!keyed && s->ops->event_copy && !s->ids && a->at > 0) {
    /* the bulk copy serves a source without archived events */
    es_session_info src;
    if ((rc = s->ops->session_get(t, a->from, &src, err))) return rc;
    int archived = src.archived_through > 0;
    es_session_info_destroy(&src);
    if (!archived) return fork_events_bulk(s, t, a, dst, err);
  }
  es_keyring ring;
  es_keyring_init(&ring);
  a->ring = &ring;
  rc = fork_archived(s, t, a, dst, &after, err);
  while (rc == ES_OK && after < a->at) {
    es_events chunk = {0};
    collector c = {&chunk, 0};
    rc = collected(s->ops->event_range(t, a->from, after, a->at, FORK_CHUNK, collect_event, &c, err),
                   &c, err);
    if (rc == ES_OK && chunk.n == 0)
      rc = es_fail(err, ES_STORAGE, "session '%s' has no event after %lld below its head", a->from,
                   (long long)after);
    for (size_t i = 0; rc == ES_OK && i < chunk.n; i++)
      rc = fork_copy_row(s, t, a, dst, &chunk.v[i], err);
    if (chunk.n) after = chunk.v[chunk.n - 1].index;
    es_events_destroy(&chunk);
  }
  es_keyring_destroy(&ring);
  return rc;
}

/* Carries over the source's snapshots at or below the fork point: the
 * fork's state is then as cheap to read as the source's was. */
static int fork_snapshots(es_store *s, es_txn *t, fork_args *a, es_err *err) {
  es_snapshots list = {0};
  collector c = {&list, 0};
  int rc = collected(s->ops->snapshot_list(t, a->from, collect_snapshot, &c, err), &c, err);
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    if (list.v[i].index > a->at) continue;
    es_snapshot snap;
    es_snapshot_init(&snap);
    rc = s->ops->snapshot_get(t, a->from, list.v[i].reducer, &snap, err);
    if (rc == ES_OK) rc = s->ops->snapshot_put(t, a->to, &snap, err);
    es_snapshot_destroy(&snap);
  }
  es_snapshots_destroy(&list);
  return rc;
}

/* `to` may be a session without events that already has forks of its own
 * (made at 0): forking one of its descendants into it would make the
 * lineage a loop. Walks from's ancestors (a chain of forks, each step one
 * row lookup). */
static int check_not_ancestor(es_store *s, es_txn *t, const char *from, const char *to,
                              es_err *err) {
  char *cur = strdup(from);
  int rc = cur ? ES_OK : nomem(err);
  while (rc == ES_OK && cur) {
    es_session_info si;
    rc = s->ops->session_get(t, cur, &si, err);
    free(cur);
    cur = NULL;
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      break;
    }
    if (rc) break;
    if (si.parent && strcmp(si.parent, to) == 0)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot fork '%s' into '%s': '%s' is its ancestor (lineage must not loop)", from,
                   to, to);
    cur = si.parent; /* moves to the next step */
    si.parent = NULL;
    es_session_info_destroy(&si);
  }
  free(cur);
  return rc;
}

static int do_fork(es_store *s, es_txn *t, void *arg, es_err *err) {
  fork_args *a = arg;
  es_session_info src, dst;
  int rc = s->ops->session_get(t, a->from, &src, err);
  if (rc == ES_NOT_FOUND) return no_session(err, a->from);
  if (rc) return rc;
  int64_t head = src.head;
  rc = a->at <= head ? check_live(&src, 0, a->at, err) : ES_OK; /* the copy needs 1..at */
  es_session_info_destroy(&src);
  if (rc) return rc;
  if (a->at > head)
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot fork session '%s' at %lld: its head is %lld",
                   a->from, (long long)a->at, (long long)head);
  if ((rc = load_session(s, t, a->to, &dst, err))) return rc;
  if (dst.head > 0) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "cannot fork into session '%s': it already has events",
                 a->to);
  } else if (dst.parent) {
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot fork into session '%s': it is already a fork of '%s'", a->to, dst.parent);
  } else if ((rc = check_not_ancestor(s, t, a->from, a->to, err)) != ES_OK) {
    /* refused: lineage must stay a tree */
  } else {
    rc = check_writable(&dst, ES_NONE, (size_t)a->at, err);
  }
  if (rc == ES_OK) rc = fork_events(s, t, a, &dst, err);
  if (rc == ES_OK) rc = fork_snapshots(s, t, a, err);
  if (rc == ES_OK) {
    dst.parent = strdup(a->from);
    dst.fork_at = a->at;
    dst.forked_at = dst.updated_at = a->now;
    rc = dst.parent ? s->ops->session_put(t, &dst, err) : nomem(err);
  }
  if (rc == ES_OK && lineage_of(&dst, a->out)) rc = nomem(err);
  es_session_info_destroy(&dst);
  return rc;
}

int es_store_fork(es_store *s, const char *from, int64_t at, const char *to, es_lineage *out,
                  es_err *err) {
  ES_STATS_CALL(s, ES_OP_FORK, es_store_fork(s, from, at, to, out, err));
  if (s->shards) return es_shards_fork(s, from, at, to, out, err);
  if (s->base) return es_tenant_fork(s, from, at, to, out, err);
  return es_core_fork(s, NULL, from, at, to, out, err);
}

int es_core_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to,
                 es_lineage *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("from", from, err)) || (rc = es_check_name("to", to, err))) return rc;
  if (at < 0) return es_fail(err, ES_INVALID_ARGUMENT, "at must be >= 0");
  if (strcmp(from, to) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "cannot fork session '%s' into itself", from);
  if ((rc = es_core_enter(s, err))) return rc;
  fork_args a = {from, to, at, 0, out, scope, NULL};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_fork, &a, err);
  es_core_leave(s);
  if (rc) es_lineage_destroy(out);
  return rc;
}

typedef struct {
  const char *session;
  int *found;
  es_lineage *out;
} lineage_args;

static int do_lineage(es_store *s, es_txn *t, void *arg, es_err *err) {
  lineage_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  if (si.parent) {
    if (lineage_of(&si, a->out)) rc = nomem(err);
    else *a->found = 1;
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LINEAGE, es_store_lineage(s, session, found, out, err));
  if (s->shards) return es_shards_lineage(s, session, found, out, err);
  if (s->base) return es_tenant_lineage(s, session, found, out, err);
  int rc;
  *found = 0;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  lineage_args a = {session, found, out};
  rc = es_core_read(s, do_lineage, &a, err);
  es_core_leave(s);
  return rc;
}

static int collect_child(void *ctx, const es_session_info *row) {
  collector *c = ctx;
  es_lineages *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      lineage_of(row, &out->v[out->n])) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *session, *after;
  int64_t limit;
  es_lineages *out;
} children_args;

static int do_children(es_store *s, es_txn *t, void *arg, es_err *err) {
  children_args *a = arg;
  collector c = {a->out, 0};
  return collected(
      s->ops->session_children(t, a->session, a->after, a->limit, collect_child, &c, err), &c, err);
}

int es_store_children(es_store *s, const char *session, const char *after, int64_t limit,
                      es_lineages *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CHILDREN, es_store_children(s, session, after, limit, out, err));
  if (s->shards) return es_shards_children(s, session, after, limit, out, err);
  if (s->base) return es_tenant_children(s, session, after, limit, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err)) || (rc = check_after(after, err)) ||
      (rc = check_limit(limit, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  children_args a = {session, after, cap_limit(limit), out};
  rc = es_core_read(s, do_children, &a, err);
  es_core_leave(s);
  if (rc) es_lineages_destroy(out);
  return rc;
}

/* A ref as shown: with the head its session has now. */
static int ref_with_head(es_store *s, es_txn *t, es_ref *ref, es_err *err) {
  es_session_info si;
  int rc = s->ops->session_get(t, ref->session, &si, err);
  ref->head = 0;
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  ref->head = si.head;
  es_session_info_destroy(&si);
  return ES_OK;
}

/* Points `name` at `session` (keeping created_at of an existing ref). */
static int ref_point(es_store *s, es_txn *t, const char *name, const char *session, int64_t now,
                     es_ref *out, es_err *err) {
  es_ref old;
  es_ref_init(&old);
  int rc = s->ops->ref_get(t, name, &old, err);
  if (rc != ES_OK && rc != ES_NOT_FOUND) return rc;
  es_ref row = {(char *)name, (char *)session, ES_NONE, rc == ES_OK ? old.created_at : now, now};
  es_ref_destroy(&old);
  if ((rc = s->ops->ref_put(t, &row, err))) return rc;
  if (es_ref_copy(out, &row)) return nomem(err);
  return ref_with_head(s, t, out, err);
}

typedef struct {
  const char *name, *session, *expect;
  int has_expect;
  int64_t now;
  es_ref *out;
  char *actual;  /* promote's REF_CONFLICT: what to_ref names (owned) */
  int found;
} ref_args;

static int do_put_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  return ref_point(s, t, a->name, a->session, a->now, a->out, err);
}

int es_store_put_ref(es_store *s, const char *name, const char *session, es_ref *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PUT_REF, es_store_put_ref(s, name, session, out, err));
  if (s->shards) return es_shards_put_ref(s, name, session, out, err);
  if (s->base) return es_tenant_put_ref(s, name, session, out, err);
  int rc;
  es_ref_init(out);
  if ((rc = es_check_name("name", name, err)) || (rc = es_check_name("session", session, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name, .session = session, .out = out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_put_ref, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  return rc;
}

static int do_get_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  int rc = s->ops->ref_get(t, a->name, a->out, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc == ES_OK) {
    a->found = 1;
    rc = ref_with_head(s, t, a->out, err);
  }
  return rc;
}

int es_store_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_GET_REF, es_store_get_ref(s, name, found, out, err));
  if (s->shards) return es_shards_get_ref(s, name, found, out, err);
  if (s->base) return es_tenant_get_ref(s, name, found, out, err);
  int rc;
  *found = 0;
  es_ref_init(out);
  if ((rc = es_check_name("name", name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name, .out = out};
  rc = es_core_read(s, do_get_ref, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  else *found = a.found;
  return rc;
}

static int collect_ref(void *ctx, const es_ref *row) {
  collector *c = ctx;
  es_refs *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_ref_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *after;
  int64_t limit;
  es_refs *out;
} list_refs_args;

static int do_list_refs(es_store *s, es_txn *t, void *arg, es_err *err) {
  list_refs_args *a = arg;
  collector c = {a->out, 0};
  int rc = collected(s->ops->ref_list(t, a->after, a->limit, collect_ref, &c, err), &c, err);
  for (size_t i = 0; rc == ES_OK && i < a->out->n; i++) rc = ref_with_head(s, t, &a->out->v[i], err);
  return rc;
}

int es_store_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LIST_REFS, es_store_list_refs(s, after, limit, out, err));
  if (s->shards) return es_shards_list_refs(s, after, limit, out, err);
  if (s->base) return es_tenant_list_refs(s, after, limit, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = check_after(after, err)) || (rc = check_limit(limit, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  list_refs_args a = {after, cap_limit(limit), out};
  rc = es_core_read(s, do_list_refs, &a, err);
  es_core_leave(s);
  if (rc) es_refs_destroy(out);
  return rc;
}

static int do_delete_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  int rc = s->ops->ref_delete(t, a->name, err);
  a->found = rc == ES_OK;
  return rc == ES_NOT_FOUND ? ES_OK : rc;
}

int es_store_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DELETE_REF, es_store_delete_ref(s, name, deleted, err));
  if (s->shards) return es_shards_delete_ref(s, name, deleted, err);
  if (s->base) return es_tenant_delete_ref(s, name, deleted, err);
  int rc;
  *deleted = 0;
  if ((rc = es_check_name("name", name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name};
  rc = es_core_write(s, do_delete_ref, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *deleted = a.found;
  return rc;
}

/* The compare-and-set runs inside the write transaction, which is
 * serialised within this process (wmu) and across processes by the
 * backend's write lock, so of two promotes with the same `expect` exactly
 * one sees it hold. */
static int do_promote(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg; /* name: from_ref, session: to_ref */
  es_ref from, to;
  es_ref_init(&from);
  es_ref_init(&to);
  int rc = s->ops->ref_get(t, a->name, &from, err);
  if (rc == ES_NOT_FOUND) return es_fail(err, ES_NOT_FOUND, "no ref '%s'", a->name);
  if (rc) return rc;
  rc = s->ops->ref_get(t, a->session, &to, err);
  int exists = rc == ES_OK;
  if (rc == ES_NOT_FOUND) rc = ES_OK;
  if (rc == ES_OK && a->has_expect &&
      (a->expect ? !exists || strcmp(to.session, a->expect) != 0 : exists)) {
    if (exists && !(a->actual = strdup(to.session))) {
      rc = nomem(err);
    } else {
      rc = es_fail(err, ES_REF_CONFLICT, "promote onto ref '%s' refused: expected %s%s%s, found %s%s%s",
                   a->session, a->expect ? "'" : "", a->expect ? a->expect : "no ref",
                   a->expect ? "'" : "", exists ? "'" : "", exists ? to.session : "no ref",
                   exists ? "'" : "");
    }
  }
  if (rc == ES_OK) rc = ref_point(s, t, a->session, from.session, a->now, a->out, err);
  es_ref_destroy(&from);
  es_ref_destroy(&to);
  return rc;
}

int es_store_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                     const char *expect, es_ref *out, char **actual, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PROMOTE,
                es_store_promote(s, from_ref, to_ref, has_expect, expect, out, actual, err));
  if (s->shards) return es_shards_promote(s, from_ref, to_ref, has_expect, expect, out, actual, err);
  if (s->base) return es_tenant_promote(s, from_ref, to_ref, has_expect, expect, out, actual, err);
  int rc;
  es_ref_init(out);
  *actual = NULL;
  if ((rc = es_check_name("from_ref", from_ref, err)) || (rc = es_check_name("to_ref", to_ref, err)))
    return rc;
  if (has_expect && expect && (rc = es_check_name("expect", expect, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {from_ref, to_ref, has_expect ? expect : NULL, has_expect, 0, out, NULL, 0};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_promote, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  if (rc == ES_REF_CONFLICT) *actual = a.actual;
  else free(a.actual);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* 3.8 fences, leases, seals: fields of the session row, so every write,
 * which reads that row anyway, checks them for free. */

typedef struct {
  const char *session, *holder, *reason;
  int64_t token;    /* fence: if_token in, the new token out; release: the token */
  int64_t ttl_ms, now;
  es_lease *lease;
  int done;         /* release: released */
} ctl_args;

static int do_fence(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  if (a->token != ES_NONE && a->token != si.fence) {
    rc = es_fail(err, ES_STALE_FENCE, "session '%s' is at fence token %lld, not %lld", a->session,
                 (long long)si.fence, (long long)a->token);
  } else if (si.fence == INT64_MAX) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "session '%s' has used up its fence tokens", a->session);
  } else {
    a->token = ++si.fence;
    rc = s->ops->session_put(t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_fence(es_store *s, const char *session, int64_t if_token, int64_t *token, es_err *err) {
  ES_STATS_CALL(s, ES_OP_FENCE, es_store_fence(s, session, if_token, token, err));
  if (s->shards) return es_shards_fence(s, session, if_token, token, err);
  if (s->base) return es_tenant_fence(s, session, if_token, token, err);
  int rc;
  *token = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = check_nonneg("if_token", if_token, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .token = if_token};
  rc = es_core_write(s, do_fence, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *token = a.token;
  return rc;
}

static int do_lease(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  int live = si.lease_holder && a->now < si.lease_expires_at;
  es_lease *out = a->lease;
  if (live && strcmp(si.lease_holder, a->holder) != 0) {
    out->acquired = 0;
    out->expires_at = si.lease_expires_at;
    out->holder = strdup(si.lease_holder);
    es_session_info_destroy(&si);
    return out->holder ? ES_OK : nomem(err);
  }
  /* A renewal keeps its token while it is still the current one; a new
   * holder (or the same one after expiry, perhaps a restarted process)
   * takes a new token, which fences out the previous holder's writes. */
  if (!live || si.lease_token != si.fence) {
    if (si.fence == INT64_MAX) {
      es_session_info_destroy(&si);
      return es_fail(err, ES_INVALID_ARGUMENT, "session '%s' has used up its fence tokens",
                     a->session);
    }
    si.lease_token = ++si.fence;
  }
  if (!live) {
    free(si.lease_holder);
    if (!(si.lease_holder = strdup(a->holder))) rc = nomem(err);
  }
  if (rc == ES_OK && add_time(a->now, a->ttl_ms, &si.lease_expires_at)) rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = s->ops->session_put(t, &si, err);
  if (rc == ES_OK) {
    out->acquired = 1;
    out->token = si.lease_token;
    out->expires_at = si.lease_expires_at;
    if (!(out->holder = strdup(a->holder))) rc = nomem(err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                   es_lease *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LEASE, es_store_lease(s, session, holder, ttl_ms, out, err));
  if (s->shards) return es_shards_lease(s, session, holder, ttl_ms, out, err);
  if (s->base) return es_tenant_lease(s, session, holder, ttl_ms, out, err);
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("holder", holder, err)))
    return rc;
  if (ttl_ms <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0");
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .holder = holder, .ttl_ms = ttl_ms, .lease = out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_lease, &a, err);
  es_core_leave(s);
  if (rc) es_lease_destroy(out);
  return rc;
}

static int do_lease_release(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  if (si.lease_holder && strcmp(si.lease_holder, a->holder) == 0 && si.lease_token == a->token) {
    free(si.lease_holder);
    si.lease_holder = NULL;
    si.lease_token = si.lease_expires_at = ES_NONE;
    rc = s->ops->session_put(t, &si, err);
    a->done = rc == ES_OK;
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                           int *released, es_err *err) {
  ES_STATS_CALL(s, ES_OP_RELEASE, es_store_lease_release(s, session, holder, token, released, err));
  if (s->shards) return es_shards_lease_release(s, session, holder, token, released, err);
  if (s->base) return es_tenant_lease_release(s, session, holder, token, released, err);
  int rc;
  *released = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("holder", holder, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .holder = holder, .token = token};
  rc = es_core_write(s, do_lease_release, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *released = a.done;
  return rc;
}

static int do_seal(es_store *s, es_txn *t, void *arg, es_err *err) {
  ctl_args *a = arg;
  es_session_info si;
  int rc = load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  if (si.sealed_at == ES_NONE) {
    si.sealed_at = si.updated_at = a->now;
    if (a->reason && es_text_clean(a->reason, strlen(a->reason), ES_MAX_TEXT_BYTES, &si.seal_reason,
                                   NULL))
      rc = nomem(err);
    if (rc == ES_OK) rc = s->ops->session_put(t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_seal(es_store *s, const char *session, const char *reason, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SEAL, es_store_seal(s, session, reason, err));
  if (s->shards) return es_shards_seal(s, session, reason, err);
  if (s->base) return es_tenant_seal(s, session, reason, err);
  int rc;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ctl_args a = {.session = session, .reason = reason};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_seal, &a, err);
  es_core_leave(s);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* 3.9 retention: truncate and delete */

typedef struct {
  const char *session;
  int64_t through, now;
  int64_t first_index;   /* truncate: after */
  int done;              /* delete: it existed */
  /* the scan of the range to drop */
  int64_t rows, bad_index;
  int bad_status;
  es_archive_files drop; /* §3.9: segment files to remove once committed */
} retention_args;

/* Counts the rows to drop and stops at the first one that is not
 * processed: only settled history may go. */
static int scan_droppable(void *ctx, const es_event *row) {
  retention_args *a = ctx;
  if (row->status != ES_STATUS_PROCESSED) {
    a->bad_index = row->index;
    a->bad_status = row->status;
    return 1;
  }
  a->rows++;
  return 0;
}

static int do_truncate(es_store *s, es_txn *t, void *arg, es_err *err) {
  retention_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) {
    a->first_index = 1;
    if (a->through == 0) return ES_OK;
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot truncate session '%s' through %lld: it has no events",
                   a->session, (long long)a->through);
  }
  if (rc) return rc;
  int64_t first = si.first_index > 1 ? si.first_index : 1;
  a->first_index = first;
  if (a->through > si.head) {
    rc = es_fail(err, ES_NO_SUCH_EVENT, "cannot truncate session '%s' through %lld: its head is %lld",
                 a->session, (long long)a->through, (long long)si.head);
  } else if (a->through >= first) {
    a->bad_index = 0;
    rc = s->ops->event_range(t, a->session, first - 1, a->through, ES_NONE, scan_droppable, a, err);
    if (rc == ES_OK && a->bad_index)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot truncate session '%s' through %lld: event %lld is %s (only processed events "
                   "can be dropped: let it complete, or settle it)",
                   a->session, (long long)a->through, (long long)a->bad_index,
                   a->bad_status == ES_STATUS_DEAD ? "a dead letter" : "pending");
    if (rc == ES_OK) rc = s->ops->event_delete_range(t, a->session, a->through, err);
    /* §3.9: archived events in the range go too (they count in `events`),
     * and the segments that end at or before through */
    if (rc == ES_OK && si.archived_through >= first) {
      int64_t upto = a->through < si.archived_through ? a->through : si.archived_through;
      si.events -= upto - first + 1;
      rc = es_archive_drop(s, t, a->session, a->through, &a->drop, err);
    }
    if (rc == ES_OK) {
      si.events -= a->rows;
      si.first_index = a->first_index = a->through + 1;
      rc = s->ops->session_put(t, &si, err);
    }
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_store_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                      es_err *err) {
  ES_STATS_CALL(s, ES_OP_TRUNCATE, es_store_truncate(s, session, through, first_index, err));
  if (s->shards) return es_shards_truncate(s, session, through, first_index, err);
  if (s->base) return es_tenant_truncate(s, session, through, first_index, err);
  int rc;
  *first_index = 1;
  if ((rc = es_check_name("session", session, err))) return rc;
  if (through < 0) return es_fail(err, ES_INVALID_ARGUMENT, "through must be >= 0");
  if ((rc = es_core_enter(s, err))) return rc;
  retention_args a = {.session = session, .through = through};
  rc = es_core_write(s, do_truncate, &a, err);
  es_archive_files_finish(s, &a.drop, rc == ES_OK);
  es_core_leave(s);
  if (rc == ES_OK) *first_index = a.first_index;
  return rc;
}

static int do_delete(es_store *s, es_txn *t, void *arg, es_err *err) {
  retention_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  es_session_info_destroy(&si);
  if ((rc = s->ops->event_delete_range(t, a->session, INT64_MAX, err)) ||
      (rc = es_archive_drop(s, t, a->session, INT64_MAX, &a->drop, err)) || /* §3.9 */
      (rc = s->ops->snapshot_delete_all(t, a->session, err)) ||
      (rc = s->ops->ref_delete_session(t, a->session, err)) ||
      (rc = s->ops->key_use_delete_session(t, a->session, err)))
    return rc;
  rc = s->ops->session_delete(t, a->session, err);
  a->done = rc == ES_OK;
  return rc;
}

int es_store_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DELETE, es_store_delete(s, session, deleted, err));
  if (s->shards) return es_shards_delete(s, session, deleted, err);
  if (s->base) return es_tenant_delete(s, session, deleted, err);
  int rc;
  *deleted = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  retention_args a = {.session = session};
  rc = es_core_write(s, do_delete, &a, err);
  es_archive_files_finish(s, &a.drop, rc == ES_OK);
  es_core_leave(s);
  if (rc == ES_OK) *deleted = a.done;
  return rc;
}

/* ---------------------------------------------------------------------- */
/* 3.10 crypto-shredding: reads as stored (the rest is in crypto.c) */

int es_store_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_AT_REST,
                es_store_read_at_rest(s, session, after, through, limit, out, err));
  if (s->shards) return es_shards_read_at_rest(s, session, after, through, limit, out, err);
  if (s->base) return es_tenant_read_at_rest(s, session, after, through, limit, out, err);
  range_args a = {session, after, through, limit, out, 0, 1};
  return read_range(s, &a, err);
}
