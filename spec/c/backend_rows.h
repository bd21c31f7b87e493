/*
 * backend_rows.h: rows and a populated store for the C tests of the
 * backend ops (backend_test.c, memory_backend_test.c): a row as the core
 * inserts it, updates of its dispatch state, listings collected as
 * integers (WANT compares them), session, ref and presence rows with every
 * field set, ref and child listings as text, rows with origins of every
 * kind (origin_rows), and populate(), a store whose every index has members. The
 * including file defines OPS and includes backend_check.h first. The
 * functions are static inline so that a test need not use every one.
 */
#ifndef ES_SPEC_BACKEND_ROWS_H
#define ES_SPEC_BACKEND_ROWS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_check.h"

/* A row as the core would insert it: pending and queued at created_at. */
static inline es_event mkrow(const char *session, int64_t index, const char *id, const char *lane) {
  es_event e;
  es_event_init(&e);
  e.session = (char *)session;
  e.index = index;
  e.id = (char *)id;
  e.type = "t";
  e.payload = "{}";
  e.payload_len = 2;
  e.lane = (char *)lane;
  e.created_at = 1000 + index;
  e.queued = 1;
  e.due_at = e.created_at;
  return e;
}

static inline int ins(es_txn *t, es_event e) {
  es_err err;
  return OPS->event_insert(BK(t), t, &e, &err);
}

/* Inserts and returns the position (0 on failure). */
static inline int64_t ins_pos(es_txn *t, es_event e) {
  es_err err;
  if (OPS->event_insert(BK(t), t, &e, &err) != ES_OK) return 0;
  return e.position;
}

static inline int upd(es_txn *t, const es_event *e) {
  es_err err;
  return OPS->event_update(BK(t), t, e, &err);
}

/* Reads a row back, changes it with fn's arguments and updates it. */
static inline int set_state(es_txn *t, const char *session, int64_t index, int status, int queued,
                     int64_t due_at) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, session, index, &e, &err);
  if (rc != ES_OK) return rc;
  e.status = status;
  e.queued = queued;
  e.due_at = due_at;
  rc = upd(t, &e);
  es_event_destroy(&e);
  return rc;
}

/* Collects the index (or position) of rows passed to a callback. */
typedef struct ints {
  int64_t v[4096];
  size_t n;
  int which;       /* 0 index, 1 position, 2 due_at */
  size_t stop_at;  /* nonzero: stop after that many */
} ints;

static inline int collect_int(void *ctx, const es_event *row) {
  ints *c = ctx;
  int64_t x = c->which == 0 ? row->index : c->which == 1 ? row->position : row->due_at;
  if (c->n < 4096) c->v[c->n++] = x;
  return c->stop_at && c->n >= c->stop_at;
}

static inline int same_ints(const ints *c, const int64_t *want, size_t n) {
  if (c->n != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (c->v[i] != want[i]) return 0;
  return 1;
}

#define WANT(c, ...)                                                          \
  do {                                                                        \
    const int64_t w_[] = {__VA_ARGS__};                                       \
    size_t nw_ = sizeof w_ / sizeof w_[0];                                    \
    if (!same_ints(&(c), w_, nw_)) {                                          \
      printf("#   %s:%d: got [", __FILE__, __LINE__);                         \
      for (size_t i_ = 0; i_ < (c).n; i_++) printf("%s%lld", i_ ? " " : "", (long long)(c).v[i_]); \
      printf("] wanted [%s]\n", #__VA_ARGS__);                                \
      cur_failed = 1;                                                         \
    }                                                                         \
  } while (0)
#define WANT_NONE(c) CHECK((c).n == 0)

static inline ints range(es_txn *t, const char *s, int64_t after, int64_t through, int64_t limit) {
  ints c = {.which = 0};
  es_err err;
  CHECK_RC(OPS->event_range(BK(t), t, s, after, through, limit, collect_int, &c, &err), ES_OK);
  return c;
}

static inline ints all_pos(es_txn *t, int64_t after, int64_t limit) {
  ints c = {.which = 1};
  es_err err;
  CHECK_RC(OPS->event_all(BK(t), t, NULL, after, limit, collect_int, &c, &err), ES_OK);
  return c;
}

static inline ints due_pos(es_txn *t, const char *s, int64_t now, int64_t limit) {
  ints c = {.which = 1};
  es_err err;
  CHECK_RC(OPS->queued_due(BK(t), t, s, NULL, now, limit, collect_int, &c, &err), ES_OK);
  return c;
}

static inline ints dead_pos(es_txn *t, const char *s, int64_t after, int64_t limit) {
  ints c = {.which = 1};
  es_err err;
  CHECK_RC(OPS->dead_list(BK(t), t, s, NULL, after, limit, collect_int, &c, &err), ES_OK);
  return c;
}

static inline int64_t next_due(es_txn *t, const char *s, int64_t now) {
  int64_t d = 0;
  es_err err;
  CHECK_RC(OPS->queued_next_due(BK(t), t, s, NULL, now, &d, &err), ES_OK);
  return d;
}

static inline ints due_type_pos(es_txn *t, const char *type, int64_t now, int64_t limit) {
  ints c = {.which = 1};
  es_err err;
  CHECK_RC(OPS->queued_due_type(BK(t), t, NULL, type, now, limit, collect_int, &c, &err), ES_OK);
  return c;
}

static inline int64_t next_due_type(es_txn *t, const char *type, int64_t now) {
  int64_t d = 0;
  es_err err;
  CHECK_RC(OPS->queued_next_due_type(BK(t), t, NULL, type, now, &d, &err), ES_OK);
  return d;
}

/* pending_types as text: "type=count " in the order given. */
typedef struct {
  char s[256];
  size_t n;
} type_text;

static inline int type_text_cb(void *ctx, const char *type, int64_t pending) {
  type_text *tt = ctx;
  int k = snprintf(tt->s + tt->n, sizeof tt->s - tt->n, "%s=%lld ", type, (long long)pending);
  if (k > 0 && (size_t)k < sizeof tt->s - tt->n) tt->n += (size_t)k;
  return 0;
}

static inline const char *pending_text(es_txn *t, type_text *tt) {
  es_err err;
  tt->n = 0;
  tt->s[0] = '\0';
  CHECK_RC(OPS->pending_types(BK(t), t, NULL, type_text_cb, tt, &err), ES_OK);
  return tt->s;
}

static inline int64_t lane_next(es_txn *t, const char *s, const char *lane, int64_t after) {
  int64_t i = -1;
  es_err err;
  CHECK_RC(OPS->lane_next(BK(t), t, s, lane, after, &i, &err), ES_OK);
  return i;
}

static inline int sess_put(es_txn *t, const char *name, int64_t head) {
  es_session_info si;
  es_err err;
  es_session_info_init(&si);
  si.session = (char *)name;
  si.head = si.events = head;
  si.pending = 1;
  si.dead = 2;
  si.attempts = 3;
  si.failures = 4;
  si.first_at = 5;
  si.updated_at = 6 + head;
  return OPS->session_put(BK(t), t, &si, &err);
}

/* A session row with every field set: lineage when parent is given, a
 * seal and a lease when reason / holder are. */
static inline int sess_put_full(es_txn *t, const char *name, int64_t head, const char *parent,
                         const char *reason, const char *holder) {
  es_session_info si;
  es_err err;
  es_session_info_init(&si);
  si.session = (char *)name;
  si.head = si.events = head;
  si.first_at = 5;
  si.updated_at = 6 + head;
  si.fence = head + 1;
  if (reason) {
    si.sealed_at = 900 + head;
    si.seal_reason = (char *)reason;
  }
  if (holder) {
    si.lease_holder = (char *)holder;
    si.lease_token = head + 1;
    si.lease_expires_at = 5000 + head;
  }
  if (parent) {
    si.parent = (char *)parent;
    si.fork_at = head;
    si.forked_at = 800 + head;
  }
  return OPS->session_put(BK(t), t, &si, &err);
}

static inline int ref_put(es_txn *t, const char *name, const char *session, int64_t created,
                   int64_t updated) {
  es_ref r;
  es_err err;
  es_ref_init(&r);
  r.name = (char *)name;
  r.session = (char *)session;
  r.head = 12345;  /* not stored */
  r.created_at = created;
  r.updated_at = updated;
  return OPS->ref_put(BK(t), t, &r, &err);
}

static inline int ref_del(es_txn *t, const char *name) {
  es_err err;
  return OPS->ref_delete(BK(t), t, name, &err);
}

static inline int del_range(es_txn *t, const char *session, int64_t through) {
  es_err err;
  return OPS->event_delete_range(BK(t), t, session, through, &err);
}

static inline int sess_del(es_txn *t, const char *session) {
  es_err err;
  return OPS->session_delete(BK(t), t, session, &err);
}

static inline int snaps_del(es_txn *t, const char *session) {
  es_err err;
  return OPS->snapshot_delete_all(BK(t), t, session, &err);
}

static inline int refs_del(es_txn *t, const char *session) {
  es_err err;
  return OPS->ref_delete_session(BK(t), t, session, &err);
}

static inline int pres_put(es_txn *t, const char *ns, const char *p, const char *f, const char *value,
                    int64_t at, int64_t expires_at) {
  es_presence_row r;
  es_err err;
  es_presence_row_init(&r);
  r.participant = (char *)p;
  r.field = (char *)f;
  r.value = (char *)value;
  r.value_len = value ? strlen(value) : 0;
  r.seen = at * 2;
  r.at = at;
  r.expires_at = expires_at;
  return OPS->presence_put(BK(t), t, ns, &r, &err);
}

/* Eight rows with origins of every kind (none, a fork's copy, the own
 * session, a name that is no session, half an origin, new sessions) and a
 * fresh row given every new dispatch field, for sessions o, f, g, h; their
 * positions are 1..8 in a fresh store. Returns 8. */
static inline int origin_rows(es_event rows[8]) {
  int n = 0;
  rows[n++] = mkrow("o", 1, "o1", NULL);  /* ordinary: no origin */
  es_event e = mkrow("f", 1, "f1", "l1");  /* a fork's copy, as fork writes them */
  e.origin_session = "o";
  e.origin_index = 1;
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = 7;
  e.returned = -1;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.cause_index = 3;
  e.cause_attempt = 2;
  e.not_before = 44;
  e.payload = NULL;
  e.payload_len = 0;
  rows[n++] = e;
  e = mkrow("f", 2, "f2", NULL);  /* origin: the row's own session */
  e.origin_session = "f";
  e.origin_index = 1;
  rows[n++] = e;
  e = mkrow("f", 3, "f3", "l1");  /* origin: a name that is no session here */
  e.origin_session = "ghost";
  e.origin_index = 9;
  rows[n++] = e;
  e = mkrow("f", 4, "f4", NULL);  /* stored verbatim, even half an origin */
  e.origin_index = 4;
  rows[n++] = e;
  e = mkrow("g", 1, "g1", NULL);  /* a new session copied from a new name */
  e.origin_session = "ghost2";
  e.origin_index = 1;
  rows[n++] = e;
  e = mkrow("h", 1, "h1", NULL);  /* a new session copied from itself */
  e.origin_session = "h";
  e.origin_index = 1;
  rows[n++] = e;
  e = mkrow("f", 5, "f5", NULL);  /* a fresh row given every new dispatch field */
  e.attempts = 2;
  e.first_claimed_at = 1;
  e.last_claimed_at = 2;
  e.failed_at = 3;
  e.processed_by_attempt = 4;
  rows[n++] = e;
  return n;
}

/* ref_list's rows as one string: "name=session "; head is never stored. */
typedef struct rtext {
  char s[4096];
  size_t n;
  int calls;
  size_t stop_at;
  es_txn *t;
  int mode;  /* 1: the first call replaces each odd ref r001..r099 and deletes r010,
                r020, ..., r090 */
} rtext;

static inline int rtext_cb(void *ctx, const es_ref *r) {
  rtext *c = ctx;
  c->calls++;
  CHECK(r->head == ES_NONE); /* never stored */
  int k = snprintf(c->s + c->n, sizeof c->s - c->n, "%s=%s ", r->name, r->session);
  if (k > 0 && (size_t)k < sizeof c->s - c->n) c->n += (size_t)k;
  if (c->mode == 1 && c->calls == 1) {
    for (int i = 1; i < 100; i++) {
      char name[16];
      snprintf(name, sizeof name, "r%03d", i);
      if (i % 10 == 0) CHECK_RC(ref_del(c->t, name), ES_OK);
      else if (i % 2) CHECK_RC(ref_put(c->t, name, "moved", 0, 1), ES_OK);
    }
  }
  return c->stop_at && (size_t)c->calls >= c->stop_at;
}

static inline const char *refs(es_txn *t, const char *after, int64_t limit, rtext *c) {
  es_err err;
  c->n = 0;
  c->s[0] = '\0';
  c->calls = 0;
  CHECK_RC(OPS->ref_list(BK(t), t, after, limit, rtext_cb, c, &err), ES_OK);
  return c->s;
}

/* session_children's names as one string: "a b c ". */
typedef struct ntext {
  char s[4096];
  size_t n;
  size_t stop_at;
  int calls;
  es_txn *t;
  int mode;  /* 1: each call moves its child to parent "elsewhere" and, the first 40,
                add a child "zz<k>" of "big"; the first also moves c001, c003, ...
                c099 away */
} ntext;

static inline int ntext_cb(void *ctx, const es_session_info *si) {
  ntext *c = ctx;
  c->calls++;
  int k = snprintf(c->s + c->n, sizeof c->s - c->n, "%s ", si->session);
  if (k > 0 && (size_t)k < sizeof c->s - c->n) c->n += (size_t)k;
  if (c->mode == 1) {
    char name[32];
    CHECK_RC(sess_put_full(c->t, si->session, 0, "elsewhere", NULL, NULL), ES_OK);
    snprintf(name, sizeof name, "zz%d", c->calls);
    if (c->calls <= 40) CHECK_RC(sess_put_full(c->t, name, 0, "big", NULL, NULL), ES_OK);
    for (int i = 1; c->calls == 1 && i < 100; i += 2) {
      snprintf(name, sizeof name, "c%03d", i);
      CHECK_RC(sess_put_full(c->t, name, 0, "elsewhere", NULL, NULL), ES_OK);
    }
  }
  return c->stop_at && (size_t)c->calls >= c->stop_at;
}

static inline const char *children(es_txn *t, const char *parent, const char *after, int64_t limit,
                            ntext *c) {
  es_err err;
  c->n = 0;
  c->s[0] = '\0';
  c->calls = 0;
  CHECK_RC(OPS->session_children(BK(t), t, parent, after, limit, ntext_cb, c, &err), ES_OK);
  return c->s;
}

/* presence rows of ns live at now, as "participant.field" keys */
typedef struct prows {
  char key[64][16];
  int tomb[64];
  size_t n;
} prows;

static inline int collect_pres(void *ctx, const es_presence_row *r) {
  prows *c = ctx;
  if (c->n < 64) {
    snprintf(c->key[c->n], 16, "%s.%s", r->participant, r->field);
    c->tomb[c->n++] = r->value == NULL;
  }
  return 0;
}

static inline prows list_pres(es_txn *t, const char *ns, int64_t now) {
  prows c = {.n = 0};
  es_err err;
  CHECK_RC(OPS->presence_list(BK(t), t, ns, now, collect_pres, &c, &err), ES_OK);
  return c;
}

/* Sessions a, b, c with laned, queued, processed, dead rows, session rows,
 * snapshots and presence: every index has members. */
static inline void populate(es_backend *b) {
  es_txn *t = NULL;
  es_err err;
  if (tx_write_begin(OPS, b, &t, &err) != ES_OK) {
    printf("# populate: write_begin failed: %s\n", err.msg);
    exit(2);
  }
  es_event e;
  e = mkrow("a", 1, "a1", "l1");
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("a", 2, "a2", "l1");
  e.queued = 0;  /* behind a1 in its lane */
  e.due_at = ES_NONE;
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("a", 3, "a3", NULL);
  e.status = ES_STATUS_PROCESSED;  /* settled, as the core writes it */
  e.processed_at = e.created_at;
  e.returned = -1;
  e.queued = 0;
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("a", 4, "a4", "l2");
  e.status = ES_STATUS_DEAD;
  e.queued = 0;
  e.failures = 3;
  e.attempts = 3;
  e.last_error = "boom";
  e.last_failed_attempt = 3;
  e.first_claimed_at = 1100;
  e.last_claimed_at = 1300;
  e.failed_at = 1310;
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("a", 5, "a5", "l2");
  e.queued = 0;
  e.type = "u";
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("a", 6, "a6", NULL);
  e.not_before = e.due_at = 1010;
  e.cause_index = 3;
  e.cause_attempt = 1;
  e.payload = "[1,\"\\u0000\"]";
  e.payload_len = strlen(e.payload);
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("b", 1, "b1", NULL);
  e.due_at = 1003;
  e.type = "u";
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("b", 2, "b2", NULL);
  e.due_at = 1001;  /* ties a1: position breaks it */
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("b", 3, "b3", "l1");
  e.due_at = 5000;
  e.type = "u";
  CHECK_RC(ins(t, e), ES_OK);
  e = mkrow("c", 1, "c1", NULL);
  e.status = ES_STATUS_PROCESSED;
  e.queued = 0;
  e.attempts = 1;
  e.processed_at = 1500;
  e.claim_holder = "w1";
  e.claim_expires_at = 1600;
  e.returned = 2;
  e.first_claimed_at = e.last_claimed_at = 1400;
  e.processed_by_attempt = 1;
  CHECK_RC(ins(t, e), ES_OK);
  CHECK_RC(sess_put(t, "a", 6), ES_OK);
  CHECK_RC(sess_put(t, "b", 3), ES_OK);
  CHECK_RC(sess_put_full(t, "fa", 0, "a", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "fb", 1, "a", "closed", "w9"), ES_OK);
  CHECK_RC(sess_put_full(t, "fc", 2, "b", NULL, "w8"), ES_OK);
  CHECK_RC(sess_put_full(t, "x/1", 3, "a", "", NULL), ES_OK);
  CHECK_RC(ref_put(t, "main", "a", 1, 2), ES_OK);
  CHECK_RC(ref_put(t, "dev", "fa", 3, 4), ES_OK);
  CHECK_RC(ref_put(t, "rel/1", "b", 5, 6), ES_OK);
  CHECK_RC(snap_put(t, "a", "r2", 4, "S2", "v1"), ES_OK);
  CHECK_RC(snap_put(t, "a", "r1", 2, "S1", NULL), ES_OK);
  CHECK_RC(snap_put(t, "snaponly", "r1", 0, NULL, "v"), ES_OK);
  CHECK_RC(pres_put(t, "ns1", "p1", "f1", "1", 10, 2000), ES_OK);
  CHECK_RC(pres_put(t, "ns1", "p1", "f2", NULL, 11, 2000), ES_OK);
  CHECK_RC(pres_put(t, "ns1", "p2", "f1", "\"x\"", 12, 900), ES_OK);
  CHECK_RC(pres_put(t, "ns2", "p3", "f1", "true", 13, 3000), ES_OK);
  CHECK_RC(OPS->write_commit(BK(t), t, &err), ES_OK);
}

#endif
