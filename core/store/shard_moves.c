/*
 * shard_moves.c: the router's plan changes (shards.c top comment: how a
 * move runs, steps (a)-(d)) and fork between any two shards. Moved out of
 * shards.c as they were.
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
#include "store/crypto.h"
#include "store/internal.h"
#include "store/listing.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store.h"
#include "util/buf.h"

/* ---- moving sessions -------------------------------------------------------- */

static const es_backend_ops *real(es_store *st) { return st->real_ops ? st->real_ops : st->ops; }
static es_backend *real_bk(es_store *st) { return st->real_ops ? st->real_bk : st->bk; }

/* ---- sealed payloads between shards (§3.10) ---------------------------------- */

/* Each shard has a data key of its own for a key name (docs/sharding.md
 * "Keys"), so a keyed row copied to another shard (a move, a fork) cannot
 * keep its sealed text: it is opened where it comes from and sealed again
 * under the target's key (a move keeps the id, which is associated data;
 * a fork seals for the copy's id). A row whose key was shredded where it
 * comes from keeps its sealed text: nothing can open it, and the target
 * burns the name first (burn_shredded), so it reads as shredded there. */

/* Inserts row on st through ops: row as stored, plain the same event as a
 * read shows it (payload opened, or shredded). */
static int insert_resealed(es_store *st, const es_backend_ops *ops, es_backend *bk, es_txn *t,
                           es_keyring *ring, es_event *row, const es_event *plain,
                           es_err *err) {
  if (!row->key || !plain || plain->shredded) return ops->event_insert(bk, t, row, err);
  es_event copy = *row;
  char *sealed = NULL;
  int rc = es_crypto_seal(st, t, ring, &copy, plain->payload, plain->payload_len, &sealed,
                          &copy.payload_len, err);
  copy.payload = sealed;
  if (rc == ES_OK) rc = ops->event_insert(bk, t, &copy, err);
  free(sealed);
  return rc;
}

/* Before rows of v (as a read shows them) are copied to st: every key name
 * shredded among them is burnt on st too (idempotent; once per name in a
 * row of names). */
static int burn_shredded(es_store *st, const es_events *v, es_err *err) {
  const char *last = NULL;
  for (size_t i = 0; i < v->n; i++) {
    const es_event *e = &v->v[i];
    if (!e->key || !e->shredded || (last && strcmp(last, e->key) == 0)) continue;
    int was_live = 0;
    int rc = es_store_shred(st, e->key, &was_live, err);
    if (rc) return rc;
    last = e->key;
  }
  return ES_OK;
}

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
int es_sh_check_identities(es_store *s, const es_shard_plan *p, es_err *err) {
  char *cat = NULL, *ids[ES_MAX_SHARDS] = {0};
  int rc = store_identity(SH(s)->catalog, &cat, err);
  size_t n = 0;
  for (; rc == ES_OK && n < p->n; n++) {
    es_store *st;
    rc = es_sh_shard_store(s, p->v[n].name, p->v[n].url, &st, err);
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
  int rc = es_sh_step(s, err);
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
  int target_archive;  /* freeze: the target shard has an archive directory */
  const es_segments *segs; /* drop: the session's segment rows (read when frozen) */
  es_archive_files *drop;  /* drop: their files, to remove once the drop committed */
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

/* An archived event sealed under a key, if any (archived_movable). */
typedef struct {
  int64_t index;
  char key[ES_MAX_NAME_BYTES + 1];
} keyed_seen;

static int find_keyed(void *ctx, const es_event *row) {
  keyed_seen *k = ctx;
  if (!row->key) return 0;
  k->index = row->index;
  snprintf(k->key, sizeof k->key, "%s", row->key);
  return 1;
}

/* A session with segments moves when the target has an archive directory
 * and none of its archived events is sealed: the segment files are copied
 * as they are (es_archive_copy_files), and a sealed payload inside one
 * would have to be sealed again under the target's key
 * (docs/sharding.md "Keys and archive"). */
static int archived_movable(es_store *st, es_txn *t, const session_step *a,
                            const es_session_info *si, es_err *err) {
  if (!a->target_archive)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot move session '%s' to another shard: it has archived segments and "
                   "the sharded store was opened without an archive directory for the target "
                   "(docs/sharding.md)",
                   a->session);
  keyed_seen k = {0};
  int rc = es_archive_each(st, t, si, 0, si->archived_through, find_keyed, &k, err);
  if (rc == ES_OK && k.index)
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot move session '%s' to another shard: its archived event %lld is sealed "
                 "under key '%s' (docs/sharding.md)",
                 a->session, (long long)k.index, k.key);
  return rc;
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
  if (si.archived_through > 0) rc = archived_movable(st, t, a, &si, err);
  if (rc == ES_OK)
    rc = ops->event_range(real_bk(st), t, a->session, 0, INT64_MAX, ES_NONE, collect_row, &rows, err);
  for (size_t i = 0; rc == ES_OK && i < rows.n; i++) {
    es_event *e = &rows.v[i];
    if (e->key && !st->crypto) {
      /* refused before the freeze: the copy must open it (insert_resealed) */
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot move session '%s' to another shard: event %lld is encrypted under "
                   "key '%s' and the sharded store was opened without keys",
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
  es_events plain;    /* events as a read shows them (n 0: none is keyed) */
  es_segments segs;   /* its segment rows (the files: es_archive_copy_files) */
  es_snapshots snaps; /* with state */
  es_refs refs;       /* naming the session */
  size_t refs_cap;
  int oom;
} session_copy;

static void copy_destroy(session_copy *c) {
  if (c->have_si) es_session_info_destroy(&c->si);
  es_events_destroy(&c->events);
  es_events_destroy(&c->plain);
  es_segments_destroy(&c->segs);
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

static int collect_seg(void *ctx, const es_segment *row) {
  session_copy *c = ctx;
  es_segments *l = &c->segs;
  if (es_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) ||
      es_segment_copy(&l->v[l->n], row)) {
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
  int keyed = 0;
  for (size_t i = 0; rc == ES_OK && i < c->events.n; i++) keyed |= c->events.v[i].key != NULL;
  for (size_t i = 0; rc == ES_OK && keyed && i < c->events.n; i++)
    if (es_events_push_copy(&c->plain, &c->events.v[i])) rc = nomem(err);
  if (rc == ES_OK && keyed) rc = es_crypto_reveal(st, t, NULL, c->plain.v, c->plain.n, err);
  if (rc == ES_OK) rc = ops->snapshot_list(real_bk(st), t, c->session, collect_snap_name, c, err);
  if (rc == ES_OK && c->si.archived_through > 0)
    rc = ops->segment_list(real_bk(st), t, c->session, collect_seg, c, err);
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
  es_keyring ring;
  es_keyring_init(&ring);
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
    es_core_touch(st, NULL); /* a move: every wait on this shard looks again */
    rc = insert_resealed(st, ops, real_bk(st), t, &ring, e, c->plain.n ? &c->plain.v[i] : NULL,
                         err);
  }
  es_keyring_destroy(&ring);
  for (size_t i = 0; rc == ES_OK && i < c->snaps.n; i++)
    rc = ops->snapshot_put(real_bk(st), t, c->session, &c->snaps.v[i], err);
  for (size_t i = 0; rc == ES_OK && i < c->segs.n; i++) /* their files are in by now */
    rc = ops->segment_put(real_bk(st), t, c->session, &c->segs.v[i], err);
  if (rc == ES_OK) {
    es_session_info si = c->si;
    si.fence = FENCE_FROZEN_BASE - c->si.fence;
    rc = ops->session_put(real_bk(st), t, &si, err);
  }
  if (rc == ES_OK) a->copied = a->present = 1;
  return rc;
}

/* Lists dir/file in drop (removed by es_archive_files_finish once the
 * transaction committed). */
static int drop_later(es_archive_files *drop, const char *dir, const char *file, es_err *err) {
  es_buf b;
  es_buf_init(&b);
  if (es_grow((void **)&drop->v, &drop->cap, drop->n + 1, sizeof *drop->v) || es_buf_adds(&b, dir) ||
      es_buf_addc(&b, '/') || es_buf_adds(&b, file) || es_buf_addc(&b, '\0')) {
    es_buf_destroy(&b);
    return nomem(err);
  }
  drop->v[drop->n++] = b.data;
  return ES_OK;
}

/* (d) on the source: the rows go, a tombstone stays. */
static int do_drop(es_store *st, es_txn *t, void *arg, es_err *err) {
  session_step *a = arg;
  const es_backend_ops *ops = real(st);
  int rc = plan_guard(st, t, a->version, err);
  if (rc == ES_OK) rc = do_state(st, t, arg, err);
  if (rc || a->state != ST_FROZEN) return rc;
  es_core_touch(st, a->session);
  rc = ops->event_delete_range(real_bk(st), t, a->session, INT64_MAX, err);
  /* the segment rows through the real backend (the marker-checking one
   * answers "moved" for a frozen session) */
  for (size_t i = 0; rc == ES_OK && a->segs && i < a->segs->n; i++) {
    rc = ops->segment_delete(real_bk(st), t, a->session, a->segs->v[i].from, err);
    if (rc == ES_NOT_FOUND) rc = ES_OK; /* a retried transaction */
    if (rc == ES_OK && st->archive_dir) rc = drop_later(a->drop, st->archive_dir, a->segs->v[i].file, err);
  }
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
  session_step sa = {session, from, 0, version, 0, NULL, NULL},
               sb = {session, from, 0, version, 0, NULL, NULL};
  sa.target_archive = b->archive_dir != NULL;
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
      if (rc != ES_STORAGE || !es_sh_crashed(s, &ignored)) {
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
  if ((rc = es_sh_crashed(s, err)) == ES_OK) rc = shard_read(a, do_read_frozen, &c, err);
  if (rc == ES_NOT_FOUND) rc = ES_OK; /* moved meanwhile by another mover */
  copy_in_args ca = {&c, to, from, version, 0, 0};
  if (rc == ES_OK && c.have_si && c.si.fence <= FENCE_FROZEN_BASE) {
    rc = burn_shredded(b, &c.plain, err);
    /* segment files first: the rows copied in name them (only while the
     * target still waits: once the session is in, it may have compacted
     * them, and copies would be orphans) */
    session_step wait_b = {session, NULL, 0, 0, 0, NULL, NULL};
    if (rc == ES_OK && c.segs.n) rc = shard_read(b, do_state, &wait_b, err);
    if (rc == ES_OK && wait_b.state == ST_INCOMING)
      rc = es_archive_copy_files(a, b, session, &c.segs, err);
    if (rc == ES_OK) rc = shard_write(s, b, do_copy_in, &ca, err);
    /* the source's rows go only once the target holds the session; its
     * segment files once that commit is in */
    if (rc == ES_OK && ca.present) {
      es_archive_files drop = {0};
      sa.segs = &c.segs;
      sa.drop = &drop;
      rc = shard_write(s, a, do_drop, &sa, err);
      es_archive_files_finish(a, &drop, rc == ES_OK);
      sa.segs = NULL;
      sa.drop = NULL;
    } else if (rc == ES_OK)
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
  session_step probe = {a->session, NULL, 0, 0, 0, NULL, NULL};
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

/* A key name shredded through the router, burnt on shard st too. */
static int burn_key(void *st, const char *name, es_err *err) {
  int was_live = 0;
  return es_store_shred(st, name, &was_live, err);
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
      rc = es_sh_shard_store(s, ps[k]->v[i].name, ps[k]->v[i].url, &all[n].st, err);
      if (rc == ES_OK) n++;
    }
  /* 0. a shard new to the fleet burns every key name shredded before it
   *    joined (es_sh_shred), before any session can land on it */
  for (size_t i = 0; rc == ES_OK && i < to->n; i++) {
    const es_shard_def *old = es_sh_plan_find(from, to->v[i].name);
    if (old && strcmp(old->url, to->v[i].url) == 0) continue;
    rc = es_sh_catalog_shredded_each(SH(s)->catalog, burn_key, store_named(all, n, to->v[i].name),
                                     err);
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
          session_step st = {x->name, NULL, 0, 0, 0, NULL, NULL};
          if (src && src != all[i].st) rc = shard_read(src, do_state, &st, err);
          if (rc == ES_OK && st.state == ST_FROZEN)
            rc = move_one(s, to->version, x->name, x->source, src, all[i].name, all[i].st,
                          &copied, err);
          if (rc == ES_OK) {
            session_step sb = {x->name, NULL, 0, to->version, 0, NULL, NULL};
            rc = shard_write(s, all[i].st, do_unincoming, &sb, err); /* nothing came */
          }
          /* and if it landed off its owner under this plan, on it goes */
          session_step here = {x->name, NULL, 0, 0, 0, NULL, NULL};
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
    rc = es_sh_adopt(s, &v, err); /* the handle follows redirects to the new shards */
    if (rc == ES_OK) rc = run_moves(s, &from, &to, moved_n, err);
    if (rc && rc != ES_CLOSED) {
      /* another mover may have finished this plan (and installed a newer
       * one, whose records stop this mover's steps): then it is done */
      catalog_view w;
      es_err ignored = {0};
      if (!es_sh_crashed(s, &ignored) && es_sh_catalog_load(SH(s)->catalog, &w, &ignored) == ES_OK) {
        if (w.cur.version >= to.version) rc = ES_OK;
        es_sh_view_destroy(&w);
      }
    }
    for (int tries = 0; rc == ES_OK; tries++) {
      catalog_view w;
      if ((rc = es_sh_catalog_load(SH(s)->catalog, &w, err))) break;
      if (w.cur.version < to.version) {
        rc = es_sh_step(s, err);
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
  if (rc == ES_OK) rc = es_sh_reload(s, err);
  return rc;
}

int es_sh_set_plan_locked(es_store *s, const es_shard_plan *plan, int64_t *moved_n, es_err *err) {
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
      if (same) return es_sh_reload(s, err);
      return es_fail(err, ES_INVALID_ARGUMENT,
                     plan->version == have
                         ? "plan version %lld is in the catalog with other shards: a changed "
                           "plan needs a new version"
                         : "plan version %lld is not newer than the catalog's",
                     (long long)plan->version);
    }
    rc = es_sh_check_identities(s, plan, err);
    if (rc == ES_OK) rc = es_sh_step(s, err);
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
  if (rc == ES_OK) rc = es_sh_set_plan_locked(s, &want, moved_n, err);
  es_shard_plan_destroy(&want);
  return rc;
}

/* ---- fork (any two shards) -------------------------------------------------- */

typedef struct {
  const char *from, *to;
  int64_t at, now;
  es_events src;       /* from's events 1..at, as a read shows them */
  es_events rest;      /* the same as stored (read_at_rest; n 0: none is keyed) */
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
  es_events_destroy(&f->rest);
  int keyed = 0;
  for (size_t i = 0; i < f->src.n; i++) keyed |= f->src.v[i].key != NULL;
  if (keyed && (rc = es_store_read_at_rest(st, f->from, 0, f->at, ES_NONE, &f->rest, err))) return rc;
  if (keyed && f->rest.n != f->src.n)
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
  es_keyring ring;
  es_keyring_init(&ring);
  for (size_t i = 0; rc == ES_OK && i < f->src.n; i++) {
    const es_event *e = &f->src.v[i];
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
    row.revision = e->revision;
    row.meta = e->meta;
    row.status = ES_STATUS_PROCESSED;
    row.processed_at = f->now;
    row.returned = -1;
    row.origin_session = (char *)f->from;
    row.origin_index = e->index;
    row.key = e->key;
    if (e->key && e->shredded) { /* as stored: it reads as shredded here too */
      row.payload = f->rest.v[i].payload;
      row.payload_len = f->rest.v[i].payload_len;
    }
    es_core_touch(st, NULL); /* a fork across shards: every wait on this shard looks again */
    rc = insert_resealed(st, ops, st->bk, t, &ring, &row, e->key ? e : NULL, err);
  }
  es_keyring_destroy(&ring);
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
  int rc = burn_shredded(st, &f->src, err);
  if (rc == ES_OK) rc = es_core_enter(st, err);
  if (rc) return rc;
  rc = es_core_write(st, do_fork_target, f, err);
  es_core_leave(st);
  return rc;
}

int es_sh_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to, es_lineage *out,
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
    rc = es_sh_lineage(s, cur, &found, &l, err);
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
  rc = es_sh_routed(s, "from", from, fork_source, &f, err);
  if (rc == ES_OK && f.src.n && !(f.ids = calloc(f.src.n, sizeof *f.ids))) rc = nomem(err);
  size_t sl = scope ? strlen(scope) : 0;
  if (sl > ES_MAX_TENANT_BYTES + 1) rc = es_fail(err, ES_INVALID_ARGUMENT, "scope is too long");
  for (size_t i = 0; rc == ES_OK && i < f.src.n; i++) {
    memcpy(f.ids[i], scope ? scope : "", sl);
    rc = es_store_new_id(s, f.ids[i] + sl, err);
  }
  if (rc == ES_OK) rc = es_store_now(s, &f.now, err);
  if (rc == ES_OK) rc = es_sh_routed(s, "to", to, fork_target, &f, err);
  es_events_destroy(&f.src);
  es_events_destroy(&f.rest);
  es_snapshots_destroy(&f.snaps);
  free(f.ids);
  if (rc) es_lineage_destroy(out);
  return rc;
}

int es_shards_read_all_cursor(es_store *s, const char *cursor, int64_t limit, es_events *out,
                              char ***cursors, es_err *err) {
  return es_sh_read_all_cursor(s, NULL, cursor, limit, out, cursors, err);
}
