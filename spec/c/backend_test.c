/*
 * backend_test.c: the same cases against the row-level interface
 * (store/backend.h) of every backend: memory, sqlite (a temporary file) and
 * postgres (ES_PG_URL, each case in a fresh schema; make test runs under
 * spec/support/pg_cluster.sh, which sets it: without it every postgres case
 * prints a SKIP line, never ok). A case written once here covers the three
 * backends; memory_backend_test.c and sqlite_backend_test.c keep what is
 * particular to one backend (its indexes, files, faults, scale).
 *
 * Cases:
 * - snapshots: put, replace, get, list by reducer (moved from
 *   memory_backend_test.c), binary and empty states (moved from
 *   sqlite_backend_test.c), every assertion kept;
 * - sessions: get, put, replace, listing by prefix, after and limit
 *   (memory's), byte order, '%' and '_' literal in a prefix, every field of
 *   the row set and unset, children of a row (sqlite's); a 0xFF byte in
 *   names on memory and sqlite only (see HI);
 * - session_children: byte order, after, limits, a stopping callback,
 *   parents next to each other apart, moves between parents (memory's
 *   listing; its NULL parent, negative limit, whole-state undo and walks
 *   that write stay in memory_backend_test.c), whole rows with lineage,
 *   replaced rows, savepoint and write rollback (sqlite's); the rollback of
 *   a savepoint opened after writes is outside the interface on postgres
 *   (see case_children_savepoint);
 * - presence: put, get, list by (participant, field) at now, tombstones,
 *   replace, expire, namespaces apart, past one walk chunk (memory's, over
 *   populate()'s store; sqlite's fixture);
 * - lanes, queues, types, dead letters: lane_next, queued_due,
 *   queued_next_due, queued_due_type, queued_next_due_type, pending_types,
 *   dead_list over populate()'s store (memory's) and over a small fixture
 *   (sqlite's), every assertion kept but memory's NULL lane (refused by
 *   memory only; memory_backend_test.c keeps it);
 * - events: event_insert, event_get, event_get_by_id, event_range,
 *   event_all, event_update, last_position over populate()'s store: every
 *   field, owned rows, missing rows, bounds, limits, compact forms, the
 *   writer's own rows (memory's); every field as written with ES_NONE,
 *   origins set and unset, event_update's rules (sqlite's); a 0xFF origin
 *   and a NUL byte in a payload on memory and sqlite only (canonical JSON
 *   has none); origins and the new dispatch fields through inserts,
 *   updates and every read (memory's). Memory keeps its own refusals (read
 *   transaction, gaps, taken indexes and ids, bad status) and an undo
 *   compared over the whole state; sqlite an update of
 *   a missing row; every read of events (event_get, event_get_by_id,
 *   event_range, event_all, queued_due, queued_due_type, dead_list) returns
 *   the dispatch times and the origin, read and write transaction (sqlite's);
 * - refs: get, put, replace, delete, listing in byte order with after,
 *   limits and a stopping callback, nested savepoints undoing every kind of
 *   ref write, one walk chunk (memory's), reverse inserts, no prefix match,
 *   ES_NONE times kept, a released savepoint's delete committed (sqlite's);
 *   a 0xFF byte in names on memory and sqlite only. Memory keeps its
 *   read-transaction error, NULL names, negative limit, whole-state undo and
 *   walks that write; sqlite its read-transaction error, a reader beside
 *   the write and reopening;
 * - counts: the sums a backend keeps (backend.h counts) follow the core's
 *   rule (store/counts.h, es_counts_move) through puts, replacements,
 *   markers, deletes and a rolled-back savepoint; for the SQL backends this
 *   ties their triggers to the one definition;
 * - event_copy (sqlite, postgres): the copies carry exactly the dispatch
 *   record es_event_settle_copy defines (backend_sql.h spells it in SQL);
 * - event_complete (sqlite): only the row attempt `attempt` owns, without
 *   a lane and not frozen, is completed, exactly as
 *   es_event_complete_record says; every other row is left as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/backend.h"
#include "store/backend_sql.h"
#include "store/counts.h"
#include "row_eq.h"
#include "tap.h"

/* ---- the backends --------------------------------------------------------- */

typedef struct target {
  const char *name;           /* memory, sqlite, postgres */
  const es_backend_ops *ops;  /* NULL: not available in this run (skip) */
  const char *why;            /* why not */
} target;

static const es_backend_ops *OPS; /* the case's backend (helpers use it) */
#include "backend_check.h"
#include "backend_rows.h"
static char sqlite_path[256];
static int case_no;               /* a fresh store (file, schema) per case */

/* Opens a fresh store of target x; NULL (with a message) when it fails. */
static es_backend *open_fresh(const target *x, const char *what) {
  es_backend *b = NULL;
  es_err err = {0};
  int rc;
  case_no++;
  if (x->ops == &es_backend_memory) {
    rc = x->ops->open("", NULL, &b, &err);
  } else if (x->ops == &es_backend_sqlite) {
    snprintf(sqlite_path, sizeof sqlite_path, "/tmp/es_backend_test_%ld_%d.db", (long)getpid(),
             case_no);
    unlink_sqlite(sqlite_path);
    rc = x->ops->open(sqlite_path, NULL, &b, &err);
  } else {
    char url[1024], tag[64];
    snprintf(tag, sizeof tag, "bt_%s_%d", what, case_no);
    pg_url(getenv("ES_PG_URL"), tag, url, sizeof url);
    rc = x->ops->open(strchr(url, ':') + 1, NULL, &b, &err);
  }
  if (rc != ES_OK) {
    printf("# %s: open failed: %s %s\n", x->name, es_strerror(rc), err.msg);
    return NULL;
  }
  return b;
}

static void close_fresh(const target *x, es_backend *b) {
  if (b) x->ops->close(b);
  if (x->ops == &es_backend_sqlite) unlink_sqlite(sqlite_path);
}

static es_txn *wbegin(es_backend *b) {
  es_txn *t = NULL;
  es_err err;
  if (tx_write_begin(OPS, b, &t, &err) != ES_OK) {
    printf("# write_begin failed: %s\n", err.msg);
    exit(2);
  }
  return t;
}

static es_txn *rbegin(es_backend *b) {
  es_txn *t = NULL;
  es_err err;
  if (tx_read_begin(OPS, b, &t, &err) != ES_OK) {
    printf("# read_begin failed: %s\n", err.msg);
    exit(2);
  }
  return t;
}

static void commit(es_txn *t) {
  es_err err = {0};
  CHECK_RC(OPS->write_commit(BK(t), t, &err), ES_OK);
  if (err.msg[0]) printf("#   write_commit: %s\n", err.msg);
}

/* ---- projection rows (§8, backend.h proj_*) --------------------------------- */

typedef struct pkeys {
  int n;
  char key[16][16];
  size_t len[16];
} pkeys;

static int collect_pkey(void *ctx, const char *key, const char *value, size_t len) {
  pkeys *c = ctx;
  (void)value;
  if (c->n < 16) {
    snprintf(c->key[c->n], sizeof c->key[c->n], "%s", key);
    c->len[c->n] = len;
  }
  c->n++;
  return 0;
}

static pkeys plist(es_txn *t, const char *ns, const char *prefix, const char *after, int64_t limit) {
  pkeys c = {0};
  es_err err;
  CHECK_RC(OPS->proj_list(BK(t), t, ns, prefix, after, limit, collect_pkey, &c, &err), ES_OK);
  return c;
}

/* Put, replace, delete, get with binary values; listing by prefix (one
 * ending in a byte that carries), after and limit, namespaces apart; drop;
 * a rolled-back savepoint undoes puts, replaces and drops. */
static void case_projection_rows(es_backend *b) {
  es_err err;
  char *v;
  size_t len;
  es_txn *t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "b", "x\0y", 3, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "a", "A", 1, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "", "", 0, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "az", "AZ", 2, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "b", "B2", 2, &err), ES_OK); /* replaces */
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "c", "C", 1, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "c", NULL, 0, &err), ES_OK);  /* removes */
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "zz", NULL, 0, &err), ES_OK); /* absent: no-op */
  CHECK_RC(OPS->proj_put(BK(t), t, "p@2", "a", "other", 5, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "", "p", "record", 6, &err), ES_OK);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->proj_get(BK(t), t, "p@1", "b", &v, &len, &err), ES_OK);
  CHECK(len == 2 && memcmp(v, "B2", 3) == 0);
  free(v);
  CHECK_RC(OPS->proj_get(BK(t), t, "p@1", "", &v, &len, &err), ES_OK);
  CHECK(len == 0 && v && v[0] == 0);
  free(v);
  CHECK_RC(OPS->proj_get(BK(t), t, "p@1", "c", &v, &len, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->proj_get(BK(t), t, "p@3", "a", &v, &len, &err), ES_NOT_FOUND);
  pkeys c = plist(t, "p@1", NULL, NULL, ES_NONE);
  CHECK(c.n == 4 && strcmp(c.key[0], "") == 0 && strcmp(c.key[1], "a") == 0 &&
        strcmp(c.key[2], "az") == 0 && strcmp(c.key[3], "b") == 0 && c.len[3] == 2);
  c = plist(t, "p@1", "a", NULL, ES_NONE);
  CHECK(c.n == 2 && strcmp(c.key[1], "az") == 0);
  c = plist(t, "p@1", "a", "a", ES_NONE); /* strictly after */
  CHECK(c.n == 1 && strcmp(c.key[0], "az") == 0);
  c = plist(t, "p@1", NULL, "", 2);
  CHECK(c.n == 2 && strcmp(c.key[0], "a") == 0 && strcmp(c.key[1], "az") == 0);
  c = plist(t, "p@1", "b", "a", ES_NONE); /* after before the prefix: the prefix wins */
  CHECK(c.n == 1 && strcmp(c.key[0], "b") == 0);
  c = plist(t, "p@2", NULL, NULL, ES_NONE);
  CHECK(c.n == 1);
  c = plist(t, "", NULL, NULL, ES_NONE);
  CHECK(c.n == 1 && strcmp(c.key[0], "p") == 0);
  OPS->read_end(BK(t), t);

  /* a rolled-back savepoint undoes a put, a replace, a delete and a drop */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "x", "X", 1, &err), ES_OK);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "a", "changed", 7, &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "az", NULL, 0, &err), ES_OK);
  CHECK_RC(OPS->proj_drop(BK(t), t, "p@2", &err), ES_OK);
  CHECK_RC(OPS->proj_put(BK(t), t, "p@1", "new", "N", 1, &err), ES_OK);
  OPS->savepoint_rollback(BK(t), t);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->proj_get(BK(t), t, "p@1", "a", &v, &len, &err), ES_OK);
  CHECK(len == 1 && v[0] == 'A');
  free(v);
  c = plist(t, "p@1", NULL, NULL, ES_NONE);
  CHECK(c.n == 5 && strcmp(c.key[3], "b") == 0 && strcmp(c.key[4], "x") == 0);
  CHECK(plist(t, "p@2", NULL, NULL, ES_NONE).n == 1);
  OPS->read_end(BK(t), t);

  /* drop removes one namespace only */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->proj_drop(BK(t), t, "p@1", &err), ES_OK);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK(plist(t, "p@1", NULL, NULL, ES_NONE).n == 0);
  CHECK(plist(t, "p@2", NULL, NULL, ES_NONE).n == 1);
  CHECK(plist(t, "", NULL, NULL, ES_NONE).n == 1);
  OPS->read_end(BK(t), t);
}

/* ---- snapshots (moved from memory_backend_test.c) -------------------------- */

static void case_snapshots(es_backend *b) {
  es_txn *t = wbegin(b);
  es_err err;
  es_snapshot sn;
  es_snapshot_init(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "r", &sn, &err), ES_NOT_FOUND);
  CHECK_RC(snap_put(t, "s", "rb", 3, "B", "v1"), ES_OK);
  CHECK_RC(snap_put(t, "s", "ra", 5, "A", NULL), ES_OK);
  CHECK_RC(snap_put(t, "s", "rc", 1, NULL, "v3"), ES_OK);
  es_snapshot bin;
  es_snapshot_init(&bin);
  bin.reducer = "rd";
  bin.index = 9;
  bin.state = "x\0y";
  bin.state_len = 3;
  bin.version = "v";
  bin.updated_at = 42;
  CHECK_RC(OPS->snapshot_put(BK(t), t, "s", &bin, &err), ES_OK);
  CHECK_RC(snap_put(t, "s", "rb", 2, "B2", "v2"), ES_OK); /* the core guards; the backend replaces */
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "rb", &sn, &err), ES_OK);
  CHECK(sn.index == 2 && sn.state_len == 2 && memcmp(sn.state, "B2", 3) == 0);
  CHECK(strcmp(sn.version, "v2") == 0 && sn.updated_at == 72 && strcmp(sn.reducer, "rb") == 0);
  es_snapshot_destroy(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "rd", &sn, &err), ES_OK);
  CHECK(sn.state_len == 3 && memcmp(sn.state, "x\0y", 3) == 0 && sn.updated_at == 42);
  es_snapshot_destroy(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "ra", &sn, &err), ES_OK);
  CHECK(sn.version == NULL && sn.state_len == 1);
  es_snapshot_destroy(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "rc", &sn, &err), ES_OK);
  CHECK(sn.state == NULL && sn.state_len == 0);
  es_snapshot_destroy(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "other", "ra", &sn, &err), ES_NOT_FOUND);
  snaps c = {.n = 0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 4 && strcmp(c.reducer[0], "ra") == 0 && strcmp(c.reducer[1], "rb") == 0);
  CHECK(strcmp(c.reducer[2], "rc") == 0 && strcmp(c.reducer[3], "rd") == 0);
  CHECK(c.index[1] == 2 && c.state_null[0] && c.state_null[3]);
  c.n = 0;
  CHECK_RC(OPS->snapshot_list(BK(t), t, "none", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 0);
  /* A snapshot alone does not make a listed session. */
  names sl = list_sessions(t, "", NULL, ES_NONE);
  CHECK(sl.n == 0);
  OPS->read_end(BK(t), t);
}

/* Moved from sqlite_backend_test.c: binary and empty states, another
 * session's snapshots apart, listing without states, replacing. */
static void case_snapshots_binary(es_backend *b) {
  static const char state[] = "\x00\x01\xff state \x00";
  es_txn *t = wbegin(b);
  es_err err;
  es_snapshot sn;
  es_snapshot_init(&sn);
  sn.reducer = (char *)"zeta";
  sn.index = 3;
  sn.state = (char *)state;
  sn.state_len = sizeof state - 1;
  sn.version = (char *)"v1";
  sn.updated_at = 77;
  int ok = OPS->snapshot_put(BK(t), t, "s", &sn, &err) == ES_OK;
  sn.reducer = (char *)"alpha";
  sn.state = (char *)"";
  sn.state_len = 0;
  ok &= OPS->snapshot_put(BK(t), t, "s", &sn, &err) == ES_OK;
  sn.reducer = (char *)"other-session";
  ok &= OPS->snapshot_put(BK(t), t, "s2", &sn, &err) == ES_OK;
  CHECK(ok); /* snapshot_put */
  commit(t);
  t = rbegin(b);
  es_snapshot got;
  /* binary state round-trips */
  CHECK(OPS->snapshot_get(BK(t), t, "s", "zeta", &got, &err) == ES_OK && got.index == 3 &&
        got.state_len == sizeof state - 1 && memcmp(got.state, state, got.state_len) == 0 &&
        got.version && strcmp(got.version, "v1") == 0 && got.updated_at == 77 &&
        strcmp(got.reducer, "zeta") == 0);
  es_snapshot_destroy(&got);
  /* an empty state stays empty (not NULL) */
  CHECK(OPS->snapshot_get(BK(t), t, "s", "alpha", &got, &err) == ES_OK && got.state != NULL &&
        got.state_len == 0);
  es_snapshot_destroy(&got);
  CHECK(OPS->snapshot_get(BK(t), t, "s", "nope", &got, &err) == ES_NOT_FOUND);
  /* listed by reducer, without state, the other session's apart */
  snaps c = {.n = 0};
  CHECK(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err) == ES_OK && c.n == 2 &&
        strcmp(c.reducer[0], "alpha") == 0 && strcmp(c.reducer[1], "zeta") == 0 &&
        c.index[0] == 3 && c.index[1] == 3 && c.state_null[0] && c.state_null[1]);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  sn.reducer = (char *)"zeta";
  sn.index = 9;
  sn.state = (char *)"new";
  sn.state_len = 3;
  sn.version = (char *)"v2";
  /* snapshot_put replaces */
  CHECK(OPS->snapshot_put(BK(t), t, "s", &sn, &err) == ES_OK &&
        OPS->snapshot_get(BK(t), t, "s", "zeta", &got, &err) == ES_OK && got.index == 9 &&
        got.state_len == 3 && got.version && strcmp(got.version, "v2") == 0);
  es_snapshot_destroy(&got);
  commit(t);
}

/* ---- sessions: get, put, list (moved from both old files) ------------------ */

/* The highest bytes a name may hold. Names the core passes are valid UTF-8
 * (store.h), so it is U+10FFFF (0xF4 first) on every backend; memory and
 * sqlite also take a 0xFF byte, which is how the old tests sorted a name
 * last and bounded a prefix that cannot be incremented: they run the same
 * session cases once more with it (bcase.bytes; main sets HI).
 * PostgreSQL's text refuses invalid UTF-8 (STORAGE), which the interface
 * allows, as no name reaches it. */
static const char *HI;
static char hi_buf[8][64];

/* "a" HI "z" and so on: pre, HI n times, post (in one of 8 buffers). */
static const char *hi(int k, const char *pre, int n, const char *post) {
  char *o = hi_buf[k];
  snprintf(o, sizeof hi_buf[k], "%s%s%s%s", pre, n > 0 ? HI : "", n > 1 ? HI : "", post);
  return o;
}
#define MAXCP "\xf4\x8f\xbf\xbf"

/* Moved from memory_backend_test.c: get, replace, listing by prefix, after
 * and limit, beyond one walk chunk. */
static void sessions_listing(es_backend *b) {
  es_txn *t = wbegin(b);
  es_err err;
  es_session_info si;
  es_session_info_init(&si);
  CHECK_RC(OPS->session_get(BK(t), t, "a", &si, &err), ES_NOT_FOUND);
  const char *all[] = {"b", "a", "ab", "a\xc3\xa9", "az", "a/1", "c", HI, "ba"};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK_RC(sess_put(t, all[i], (int64_t)i), ES_OK);
  CHECK_RC(ins(t, mkrow("events-only", 1, "e1", NULL)), ES_OK);  /* no session row: not listed */
  CHECK_RC(OPS->session_get(BK(t), t, "events-only", &si, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->session_get(BK(t), t, "az", &si, &err), ES_OK);
  CHECK(si.session && strcmp(si.session, "az") == 0 && si.head == 4 && si.events == 4 &&
        si.pending == 1);
  CHECK(si.dead == 2 && si.attempts == 3 && si.failures == 4 && si.first_at == 5 && si.updated_at == 10);
  es_session_info_destroy(&si);
  CHECK_RC(sess_put(t, "az", 40), ES_OK);
  CHECK_RC(OPS->session_get(BK(t), t, "az", &si, &err), ES_OK);
  CHECK(si.head == 40);
  es_session_info_destroy(&si);
  commit(t);
  t = rbegin(b);
  names c = list_sessions(t, "", NULL, ES_NONE);
  const char *want[] = {"a", "a/1", "ab", "az", "a\xc3\xa9", "b", "ba", "c", HI};
  CHECK(c.n == 9);
  for (size_t i = 0; i < c.n && i < 9; i++) CHECK(strcmp(c.v[i], want[i]) == 0);
  c = list_sessions(t, "a", NULL, ES_NONE);
  CHECK(c.n == 5 && strcmp(c.v[4], "a\xc3\xa9") == 0);
  c = list_sessions(t, "a", "a/1", 2);
  CHECK(c.n == 2 && strcmp(c.v[0], "ab") == 0 && strcmp(c.v[1], "az") == 0);
  c = list_sessions(t, "a", "0", ES_NONE);  /* after sorts before the prefix */
  CHECK(c.n == 5);
  c = list_sessions(t, "a", "b", ES_NONE);  /* after sorts after every match */
  CHECK(c.n == 0);
  c = list_sessions(t, NULL, "b", ES_NONE);
  CHECK(c.n == 3 && strcmp(c.v[0], "ba") == 0);
  c = list_sessions(t, "q", NULL, ES_NONE);
  CHECK(c.n == 0);
  c = list_sessions(t, "", NULL, 0);
  CHECK(c.n == 0);
  OPS->read_end(BK(t), t);
  /* Beyond one walk chunk. */
  t = wbegin(b);
  for (int i = 0; i < 100; i++) {
    char name[16];
    snprintf(name, sizeof name, "s%03d", i);
    CHECK_RC(sess_put(t, name, i), ES_OK);
  }
  commit(t);
  t = rbegin(b);
  c = list_sessions(t, "s", "s010", ES_NONE);
  CHECK(c.n == 89 && strcmp(c.v[0], "s011") == 0 && strcmp(c.v[88], "s099") == 0);
  c = list_sessions(t, "s0", NULL, 70);
  CHECK(c.n == 70 && strcmp(c.v[69], "s069") == 0);
  OPS->read_end(BK(t), t);
}

/* Moved from sqlite_backend_test.c: byte order with HI last, '%' and '_' in a
 * prefix taken literally (an SQL backend must not LIKE), ES_NONE kept,
 * every field of the row (fence, seal, lease, lineage) set and unset. */
static void sessions_fields(es_backend *b) {
  es_err err = {0};
  names c = {.n = 0};
  /* in byte order */
  const char *sn[] = {"a",  "a%",          "a%b",           "a_",          "ab",
                      hi(0, "a", 1, ""), hi(1, "a", 1, "z"), hi(2, "a", 2, ""), "b",
                      hi(3, "", 1, ""),  hi(4, "", 2, "")};
  const size_t nn = sizeof sn / sizeof sn[0];
  es_txn *t = wbegin(b);
  /* insert in reverse to show the order comes from the index */
  for (size_t i = nn; i-- > 0;) {
    es_session_info si;
    es_session_info_init(&si);
    si.session = (char *)sn[i];
    si.head = (int64_t)i + 1;
    si.events = 10 + (int64_t)i;
    si.first_at = i == 0 ? ES_NONE : 100;
    CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK);
  }
  es_session_info si;
  es_session_info_init(&si);
  si.session = (char *)"ab";
  si.head = 42;
  si.pending = 1;
  si.dead = 2;
  si.attempts = 3;
  si.failures = 4;
  si.first_at = 5;
  si.updated_at = 6;
  CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK); /* replace */
  commit(t);

  t = rbegin(b);
  es_session_info got;
  /* session_get after replace */
  CHECK(OPS->session_get(BK(t), t, "ab", &got, &err) == ES_OK && got.head == 42 && got.events == 0 &&
        got.pending == 1 && got.dead == 2 && got.attempts == 3 && got.failures == 4 &&
        got.first_at == 5 && got.updated_at == 6 && str_eq(got.session, "ab"));
  es_session_info_destroy(&got);
  /* ES_NONE kept */
  CHECK(OPS->session_get(BK(t), t, "a", &got, &err) == ES_OK && got.first_at == ES_NONE &&
        got.updated_at == ES_NONE);
  es_session_info_destroy(&got);
  CHECK(OPS->session_get(BK(t), t, "zz", &got, &err) == ES_NOT_FOUND);
  /* all, in byte order (U+10FFFF sorts last) */
  c = list_sessions(t, "", NULL, 100);
  CHECK(c.n == nn);
  int same = c.n == nn;
  for (size_t i = 0; same && i < nn; i++) same = strcmp(c.v[i], sn[i]) == 0;
  CHECK(same);
  c = list_sessions(t, "a%", NULL, 100); /* '%' in a prefix is literal */
  CHECK(c.n == 2 && !strcmp(c.v[0], "a%") && !strcmp(c.v[1], "a%b"));
  c = list_sessions(t, "a_", NULL, 100); /* '_' in a prefix is literal */
  CHECK(c.n == 1 && !strcmp(c.v[0], "a_"));
  c = list_sessions(t, sn[5], NULL, 100); /* a prefix ending in HI */
  CHECK(c.n == 3 && !strcmp(c.v[0], sn[5]) && !strcmp(c.v[2], sn[7]));
  c = list_sessions(t, sn[9], NULL, 100); /* a prefix of only HI (0xFF: no upper bound) */
  CHECK(c.n == 2);
  c = list_sessions(t, "a", "a%b", 2); /* prefix + after + limit */
  CHECK(c.n == 2 && !strcmp(c.v[0], "a_") && !strcmp(c.v[1], "ab"));
  c = list_sessions(t, "a%", "0", 100); /* after before the prefix is ignored */
  CHECK(c.n == 2);
  c = list_sessions(t, "a%", "b", 100); /* after past the prefix range gives nothing */
  CHECK(c.n == 0);
  c = list_sessions(t, "zzz", NULL, 100);
  CHECK(c.n == 0);
  OPS->read_end(BK(t), t);

  /* the fence, seal, lease and lineage fields (§3.7, §3.8) */
  es_session_info full;
  es_session_info_init(&full);
  full.session = (char *)"full";
  full.head = 9;
  full.fence = 41;
  full.sealed_at = 500;
  full.seal_reason = (char *)"done \xe2\x80\xa6";
  full.lease_holder = (char *)"worker-1";
  full.lease_token = 41;
  full.lease_expires_at = 600;
  full.parent = (char *)"ab";
  full.fork_at = 7;
  full.forked_at = 450;
  full.first_index = 6;
  sess_rows rows = {0};
  t = wbegin(b);
  /* session_put / session_get: every field of the row, set */
  CHECK(OPS->session_put(BK(t), t, &full, &err) == ES_OK &&
        OPS->session_get(BK(t), t, "full", &got, &err) == ES_OK && si_eq(&got, &full));
  es_session_info_destroy(&got);
  /* session_list and session_children return them too */
  CHECK(OPS->session_list(BK(t), t, "full", NULL, ES_NONE, collect_session_row, &rows, &err) ==
            ES_OK &&
        rows.n == 1 && si_eq(&rows.v[0], &full));
  sess_rows_reset(&rows);
  c.n = 0;
  CHECK(OPS->session_children(BK(t), t, "ab", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
        c.n == 1 && !strcmp(c.v[0], "full"));
  es_session_info bare;
  es_session_info_init(&bare);
  bare.session = (char *)"full";
  /* replacing: unset fields come back unset (fence 0, ES_NONE, NULL, first_index 1) */
  CHECK(OPS->session_put(BK(t), t, &bare, &err) == ES_OK &&
        OPS->session_get(BK(t), t, "full", &got, &err) == ES_OK && si_eq(&got, &bare) &&
        got.fence == 0 && got.sealed_at == ES_NONE && got.parent == NULL &&
        got.lease_holder == NULL && got.lease_token == ES_NONE && got.first_index == 1);
  es_session_info_destroy(&got);
  /* ... and the row is no longer a child */
  c.n = 0;
  CHECK(OPS->session_children(BK(t), t, "ab", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
        c.n == 0);
  commit(t);
}

/* ---- session_children (moved from both old files) ---------------------- */

/* Moved from memory_backend_test.c (test_children's listing). */
static void children_listing(es_backend *b) {
  es_txn *t = wbegin(b);
  ntext c = {.n = 0};
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), "") == 0);
  const char *kids[] = {"p/b", "p/a", hi(7, "p/", 1, ""), "p/\xc3\xa9", "q", "p/a/1"};
  for (size_t i = 0; i < sizeof kids / sizeof kids[0]; i++)
    CHECK_RC(sess_put_full(t, kids[i], (int64_t)i, "p", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "p", 0, NULL, NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "q/1", 0, "q", NULL, NULL), ES_OK);
  /* Parents that sort next to "p" share no children with it. */
  CHECK_RC(sess_put_full(t, "o/1", 0, "o", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "p!", 0, "p/", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "p0", 0, "p\x01", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "pp", 0, "", NULL, NULL), ES_OK);  /* the empty name, stored */
  CHECK_RC(ins(t, mkrow("r", 1, "r1", NULL)), ES_OK);  /* events only: no row, no parent */
  commit(t);
  t = rbegin(b);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), hi(0, "p/a p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", "p/a", ES_NONE, &c), hi(1, "p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", "p/a/0", ES_NONE, &c), hi(1, "p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", "", ES_NONE, &c), hi(0, "p/a p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", "p/b", 2, &c), hi(2, "p/\xc3\xa9 p/", 1, " ")) == 0);
  CHECK(strcmp(children(t, "p", NULL, 1, &c), "p/a ") == 0);
  CHECK(strcmp(children(t, "p", "q", ES_NONE, &c), "") == 0);
  CHECK(strcmp(children(t, "p", HI, ES_NONE, &c), "") == 0);
  CHECK(strcmp(children(t, "p", NULL, ES_MAX_LIMIT, &c), hi(0, "p/a p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", NULL, INT64_MAX, &c), hi(0, "p/a p/a/1 p/b p/\xc3\xa9 p/", 1, " q ")) == 0);
  CHECK(strcmp(children(t, "p", NULL, 0, &c), "") == 0);
  /* a negative limit: memory's own case (memory_backend_test.c) */
  CHECK(strcmp(children(t, "q", NULL, ES_NONE, &c), "q/1 ") == 0);
  CHECK(strcmp(children(t, "p/", NULL, ES_NONE, &c), "p! ") == 0);
  CHECK(strcmp(children(t, "", NULL, ES_NONE, &c), "pp ") == 0);
  CHECK(strcmp(children(t, "o", NULL, ES_NONE, &c), "o/1 ") == 0);
  CHECK(strcmp(children(t, "nobody", NULL, ES_NONE, &c), "") == 0);
  CHECK(strcmp(children(t, "r", NULL, ES_NONE, &c), "") == 0);
  c.stop_at = 2;  /* the callback stops the walk */
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), "p/a p/a/1 ") == 0);
  c.stop_at = 0;
  /* a NULL parent: memory's own case (memory_backend_test.c) */
  OPS->read_end(BK(t), t);
}

/* Moved from sqlite_backend_test.c (test_session_children): one range of
 * the (parent, session) index, in byte order. */
static int sp_after_writes; /* 1: children_fixture's savepoint after writes too */

static void children_fixture(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  names c = {.n = 0};
  sess_rows rows = {0};
  /* children of "P" in byte order; inserted in reverse */
  const char *kids[] = {"A", "P%", "P/a", "P_", "a", hi(0, "a", 1, ""), "b", hi(1, "", 1, ""),
                        hi(2, "", 2, "")};
  const int nk = (int)(sizeof kids / sizeof kids[0]);
  t = wbegin(b);
  int ok = 1;
  es_session_info si;
  for (int i = nk - 1; i >= 0; i--) {
    char name[16];
    es_session_info_init(&si);
    snprintf(name, sizeof name, "%s", kids[i]);
    si.session = name;
    si.parent = (char *)"P";
    si.fork_at = i;
    si.forked_at = 1000 + i;
    ok &= OPS->session_put(BK(t), t, &si, &err) == ES_OK;
  }
  /* noise: the parent itself, a sibling tree, sessions without a parent */
  static const char *other[][2] = {{"P", NULL}, {"Q", NULL}, {"c1", "Q"}, {"P0", "PP"},
                                   {"z", NULL}, {"", "P "}};
  for (int i = 0; i < 6; i++) {
    es_session_info_init(&si);
    si.session = (char *)other[i][0];
    si.parent = (char *)other[i][1];
    ok &= OPS->session_put(BK(t), t, &si, &err) == ES_OK;
  }
  /* sessions with and without a parent */
  CHECK(ok && OPS->write_commit(BK(t), t, &err) == ES_OK);

  t = rbegin(b);
  /* session_children: every child of the parent (ES_NONE: no limit) */
  CHECK(OPS->session_children(BK(t), t, "P", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
            c.n == (size_t)nk);
  ok = c.n == (size_t)nk;
  for (int i = 0; ok && i < nk; i++) ok = strcmp(c.v[i], kids[i]) == 0;
  /* session_children: ascending byte order (HI last), whatever the insertion order */
  CHECK(ok);
  c.n = 0;
  /* session_children: a limit of 2^62 is no limit */
  CHECK(
      OPS->session_children(BK(t), t, "P", NULL, ES_MAX_LIMIT, collect_name, &c, &err) == ES_OK &&
          c.n == (size_t)nk);
  c.n = 0;
  /* session_children: name > after, at most limit */
  CHECK(OPS->session_children(BK(t), t, "P", "P_", 3, collect_name, &c, &err) == ES_OK &&
            c.n == 3 && !strcmp(c.v[0], "a") && !strcmp(c.v[1], kids[5]) &&
            !strcmp(c.v[2], "b"));
  c.n = 0;
  /* session_children: after a name that is a child excludes it */
  CHECK(OPS->session_children(BK(t), t, "P", "b", ES_NONE, collect_name, &c, &err) == ES_OK &&
            c.n == 2 && !strcmp(c.v[0], kids[7]));
  c.n = 0;
  /* session_children: after the last child gives nothing */
  CHECK(
      OPS->session_children(BK(t), t, "P", kids[8], ES_NONE, collect_name, &c, &err) == ES_OK &&
          c.n == 0);
  c.n = 0;
  /* session_children: after "" is a bound like any other */
  CHECK(OPS->session_children(BK(t), t, "P", "", 1, collect_name, &c, &err) == ES_OK && c.n == 1 &&
            !strcmp(c.v[0], "A"));
  c.n = 0;
  /* session_children: limit 0 gives nothing */
  CHECK(OPS->session_children(BK(t), t, "P", NULL, 0, collect_name, &c, &err) == ES_OK && c.n == 0);
  c.n = 0;
  /* session_children: only that parent's children, whole rows */
  CHECK(OPS->session_children(BK(t), t, "Q", NULL, ES_NONE, collect_session_row, &rows, &err) ==
                ES_OK &&
            rows.n == 1 && str_eq(rows.v[0].session, "c1") && str_eq(rows.v[0].parent, "Q"));
  sess_rows_reset(&rows);
  /* session_children: other parents, a parent without children */
  CHECK(OPS->session_children(BK(t), t, "P ", NULL, ES_NONE, collect_session_row, &rows, &err) ==
                ES_OK &&
            rows.n == 1 && str_eq(rows.v[0].session, "") &&
            OPS->session_children(BK(t), t, "z", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
            c.n == 0 &&
            OPS->session_children(BK(t), t, "PP", NULL, 5, collect_name, &c, &err) == ES_OK &&
            c.n == 1);
  sess_rows_reset(&rows);
  c.n = 0;
  /* session_children: the lineage fields come with the rows */
  CHECK(OPS->session_children(BK(t), t, "P", NULL, 2, collect_session_row, &rows, &err) == ES_OK &&
            rows.n == 2 && rows.v[1].fork_at == 1 && rows.v[1].forked_at == 1001);
  sess_rows_reset(&rows);
  OPS->read_end(BK(t), t);

  /* a replaced row leaves its old parent's children (the index follows) */
  t = wbegin(b);
  es_session_info_init(&si);
  si.session = (char *)"a";
  si.parent = (char *)"Q";
  ok = OPS->session_put(BK(t), t, &si, &err) == ES_OK;
  si.session = (char *)"b";
  si.parent = NULL;
  ok &= OPS->session_put(BK(t), t, &si, &err) == ES_OK;
  ok &= OPS->session_children(BK(t), t, "P", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
        c.n == (size_t)nk - 2;
  c.n = 0;
  ok &= OPS->session_children(BK(t), t, "Q", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
        c.n == 2 && !strcmp(c.v[0], "a") && !strcmp(c.v[1], "c1");
  c.n = 0;
  /* session_put replacing a row moves it between parents (seen inside the write txn) */
  CHECK(ok);
  /* savepoint rollback undoes a new child (after writes outside any
   * savepoint: see case_children_savepoint) */
  if (sp_after_writes) {
  ok = OPS->savepoint(BK(t), t, &err) == ES_OK;
  si.session = (char *)"new-kid";
  si.parent = (char *)"Q";
  ok &= OPS->session_put(BK(t), t, &si, &err) == ES_OK;
  OPS->savepoint_rollback(BK(t), t);
  ok &= OPS->session_children(BK(t), t, "Q", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
        c.n == 2;
  c.n = 0;
  /* savepoint_rollback undoes a child added in it */
  CHECK(ok);
  }
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  /* ... and write_rollback the moves */
  CHECK(OPS->session_children(BK(t), t, "P", NULL, ES_NONE, collect_name, &c, &err) == ES_OK &&
            c.n == (size_t)nk);
  c.n = 0;
  OPS->read_end(BK(t), t);
}

static void case_children_fixture(es_backend *b) {
  sp_after_writes = 0;
  children_fixture(b);
}

/* The same with its savepoint opened after writes made outside any
 * savepoint. backend.h lets a backend rely on the core never doing that
 * (PostgreSQL's first savepoint is virtual: rolling it back rolls back the
 * whole transaction), so this runs where the backend keeps such writes
 * anyway (memory, sqlite) and is outside the interface elsewhere. */
static void case_children_savepoint(es_backend *b) {
  sp_after_writes = 1;
  children_fixture(b);
}

/* ---- lanes, queues, types, dead letters (moved from both old files) -------- */

/* Collects callback rows (deep copies), as sqlite_backend_test.c did. */
typedef struct collect {
  es_events evs;
} collect;

static int collect_event(void *ctx, const es_event *row) {
  collect *c = ctx;
  es_events_push_copy(&c->evs, row);
  return 0;
}

static void collect_reset(collect *c) {
  es_events_destroy(&c->evs);
  memset(c, 0, sizeof *c);
}

/* Fills a new pending, unqueued event row with borrowed strings. */
static void ev_make(es_event *e, const char *session, int64_t idx, const char *id, const char *payload) {
  es_event_init(e);
  e->session = (char *)session;
  e->index = idx;
  e->id = (char *)id;
  e->type = (char *)"t";
  e->payload = (char *)payload;
  e->payload_len = payload ? strlen(payload) : 0;
  e->created_at = 1000 + idx;
}

/* Moved from memory_backend_test.c: over populate()'s store. */
static void case_lane_next(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  CHECK(lane_next(t, "a", "l1", 0) == 1);
  CHECK(lane_next(t, "a", "l1", 1) == 2);
  CHECK(lane_next(t, "a", "l1", 2) == 0);
  CHECK(lane_next(t, "a", "l2", 0) == 4);  /* a dead letter counts */
  CHECK(lane_next(t, "a", "l2", 4) == 5);
  CHECK(lane_next(t, "b", "l1", 0) == 3);  /* lanes are per session */
  CHECK(lane_next(t, "a", "nolane", 0) == 0);
  CHECK(lane_next(t, "nobody", "l1", 0) == 0);
  CHECK(lane_next(t, "a", "l1", ES_NONE) == 1);
  /* a NULL lane: memory's own case (memory_backend_test.c) */
  /* Out of order processing: the set does not assume the core's order. */
  CHECK_RC(ins(t, mkrow("a", 7, "a7", "l1")), ES_OK);
  CHECK_RC(set_state(t, "a", 2, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);
  CHECK(lane_next(t, "a", "l1", 1) == 7);
  CHECK_RC(set_state(t, "a", 1, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);
  CHECK(lane_next(t, "a", "l1", 0) == 7);
  CHECK_RC(set_state(t, "a", 4, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);  /* settled dead letter */
  CHECK(lane_next(t, "a", "l2", 0) == 5);
  CHECK_RC(set_state(t, "a", 4, ES_STATUS_PENDING, 0, ES_NONE), ES_OK);  /* un-processed again */
  CHECK(lane_next(t, "a", "l2", 0) == 4);
  commit(t);
}

static void case_queued(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  /* queued: a1 1001 (pos 1), a6 1010 (6), b1 1003 (7), b2 1001 (8), b3 5000 (9) */
  ints c = due_pos(t, NULL, INT64_MAX, ES_NONE);
  WANT(c, 1, 8, 7, 6, 9);
  c = due_pos(t, NULL, 1003, ES_NONE);
  WANT(c, 1, 8, 7);
  c = due_pos(t, NULL, 1003, 2);
  WANT(c, 1, 8);
  c = due_pos(t, NULL, 1000, ES_NONE);
  WANT_NONE(c);
  c = due_pos(t, "b", 1003, ES_NONE);  /* a session's: by index */
  WANT(c, 7, 8);
  c = due_pos(t, "b", 1003, 1);
  WANT(c, 7);
  c = due_pos(t, "b", 1002, 1);  /* b1 is not due yet: passed over */
  WANT(c, 8);
  c = due_pos(t, "a", INT64_MAX, ES_NONE);
  CHECK(c.n == 2);
  c = due_pos(t, "nobody", INT64_MAX, ES_NONE);
  WANT_NONE(c);
  CHECK(next_due(t, NULL, 0) == 1001);
  CHECK(next_due(t, NULL, 1001) == 1003);
  CHECK(next_due(t, NULL, 1010) == 5000);
  CHECK(next_due(t, NULL, 5000) == ES_NONE);
  CHECK(next_due(t, "a", 1001) == 1010);
  CHECK(next_due(t, "a", 1010) == ES_NONE);
  CHECK(next_due(t, "nobody", 0) == ES_NONE);
  /* Moving due_at, dequeuing, re-queuing keep both sets right. */
  CHECK_RC(set_state(t, "b", 3, ES_STATUS_PENDING, 1, 900), ES_OK);
  CHECK_RC(set_state(t, "a", 1, ES_STATUS_PENDING, 0, 1001), ES_OK);
  c = due_pos(t, NULL, INT64_MAX, ES_NONE);
  WANT(c, 9, 8, 7, 6);
  CHECK(next_due(t, "b", 900) == 1001);
  CHECK_RC(set_state(t, "a", 1, ES_STATUS_PENDING, 1, 1001), ES_OK);
  c = due_pos(t, NULL, 1001, ES_NONE);
  WANT(c, 9, 1, 8);
  /* More rows than a walk chunk, with equal due_at. */
  for (int64_t i = 2; i <= 100; i++) {
    char id[32];
    snprintf(id, sizeof id, "m%lld", (long long)i);
    es_event e = mkrow("m", i - 1, id, NULL);
    e.due_at = 2000 + (i % 3);
    CHECK_RC(ins(t, e), ES_OK);
  }
  c = due_pos(t, "m", INT64_MAX, ES_NONE);
  CHECK(c.n == 99);
  /* index j is due at 2000 + (j + 1) % 3; position 10 + j */
  c = due_pos(t, "m", 2001, 10);
  WANT(c, 12, 13, 15, 16, 18, 19, 21, 22, 24, 25);
  c = due_pos(t, "m", 2000, ES_NONE);
  CHECK(c.n == 33 && c.v[0] == 12 && c.v[32] == 108);
  c = due_pos(t, NULL, 2002, ES_NONE);
  CHECK(c.n == 5 + 99);
  int sorted = 1;
  /* (due_at, position) order: 33 rows at 2000, 33 at 2001, 33 at 2002. */
  for (size_t i = 6; i < c.n; i++) {
    int64_t pa = c.v[i - 1], pb = c.v[i];
    int64_t da = 2000 + ((pa - 10 + 1) % 3), db = 2000 + ((pb - 10 + 1) % 3);
    if (da > db || (da == db && pa >= pb)) sorted = 0;
  }
  CHECK(sorted);
  c = due_pos(t, NULL, 2002, 40);
  CHECK(c.n == 40);
  commit(t);
}

/* The per-type queues and counts (claim_next with types, pending_types).
 * populate's types: t = a1 a2 a3 a4 a6 b2 c1, u = a5 b1 b3. */
static void case_types(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  type_text tt;
  /* queued t: a1 1001 (pos 1), b2 1001 (8), a6 1010 (6); u: b1 1003 (7), b3 5000 (9) */
  ints c = due_type_pos(t, "t", INT64_MAX, ES_NONE);
  WANT(c, 1, 8, 6);
  c = due_type_pos(t, "t", 1003, ES_NONE);
  WANT(c, 1, 8);
  c = due_type_pos(t, "t", 1003, 1);
  WANT(c, 1);
  c = due_type_pos(t, "u", INT64_MAX, ES_NONE);
  WANT(c, 7, 9);
  c = due_type_pos(t, "u", 1002, ES_NONE);
  WANT_NONE(c);
  c = due_type_pos(t, "none", INT64_MAX, ES_NONE);
  WANT_NONE(c);
  CHECK(next_due_type(t, "t", 0) == 1001);
  CHECK(next_due_type(t, "t", 1001) == 1010);
  CHECK(next_due_type(t, "u", 1003) == 5000);
  CHECK(next_due_type(t, "u", 5000) == ES_NONE);
  CHECK(next_due_type(t, "none", 0) == ES_NONE);
  /* pending: t a1 a2 a6 b2 (a3, c1 processed, a4 dead); u a5 b1 b3 */
  CHECK(strcmp(pending_text(t, &tt), "t=4 u=3 ") == 0);
  /* Processing, reviving, moving and killing keep queues and counts. */
  CHECK_RC(set_state(t, "a", 1, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);
  CHECK_RC(set_state(t, "a", 4, ES_STATUS_PENDING, 1, 1004), ES_OK);
  CHECK_RC(set_state(t, "b", 3, ES_STATUS_PENDING, 1, 900), ES_OK);
  CHECK_RC(set_state(t, "b", 1, ES_STATUS_DEAD, 0, ES_NONE), ES_OK);
  c = due_type_pos(t, "t", INT64_MAX, ES_NONE);
  WANT(c, 8, 4, 6);
  c = due_type_pos(t, "u", INT64_MAX, ES_NONE);
  WANT(c, 9);
  CHECK(strcmp(pending_text(t, &tt), "t=4 u=2 ") == 0);
  /* A new type, in byte order among the others; types with none pending
   * are left out. */
  es_event e = mkrow("b", 4, "b4", NULL);
  e.type = "T";
  CHECK_RC(ins(t, e), ES_OK);
  CHECK_RC(set_state(t, "b", 3, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);
  CHECK_RC(set_state(t, "a", 5, ES_STATUS_PROCESSED, 0, ES_NONE), ES_OK);
  CHECK(strcmp(pending_text(t, &tt), "T=1 t=4 ") == 0);
  c = due_type_pos(t, "T", INT64_MAX, ES_NONE);
  WANT(c, 11);
  /* The store-wide queue still holds every type. */
  c = due_pos(t, NULL, INT64_MAX, ES_NONE);
  WANT(c, 8, 4, 11, 6);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  CHECK(strcmp(pending_text(t, &tt), "t=4 u=3 ") == 0);
  c = due_type_pos(t, "T", INT64_MAX, ES_NONE);
  WANT_NONE(c);
  c = due_type_pos(t, "t", INT64_MAX, ES_NONE);
  WANT(c, 1, 8, 6);
  OPS->read_end(BK(t), t);
}

static void case_dead(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  ints c = dead_pos(t, NULL, 0, ES_NONE);
  WANT(c, 4);
  CHECK_RC(set_state(t, "b", 2, ES_STATUS_DEAD, 0, ES_NONE), ES_OK);
  CHECK_RC(set_state(t, "a", 1, ES_STATUS_DEAD, 0, ES_NONE), ES_OK);
  c = dead_pos(t, NULL, 0, ES_NONE);
  WANT(c, 1, 4, 8);
  c = dead_pos(t, NULL, 1, ES_NONE);
  WANT(c, 4, 8);
  c = dead_pos(t, NULL, ES_NONE, 2);
  WANT(c, 1, 4);
  c = dead_pos(t, "a", 0, ES_NONE);
  WANT(c, 1, 4);
  c = dead_pos(t, "a", 1, 1);
  WANT(c, 4);
  c = dead_pos(t, "b", 0, ES_NONE);
  WANT(c, 8);
  c = dead_pos(t, "c", 0, ES_NONE);
  WANT_NONE(c);
  CHECK_RC(set_state(t, "a", 4, ES_STATUS_PENDING, 1, 1), ES_OK);  /* revived */
  c = dead_pos(t, NULL, 0, ES_NONE);
  WANT(c, 1, 8);
  /* Beyond one walk chunk. */
  for (int64_t i = 1; i <= 70; i++) {
    char id[32];
    snprintf(id, sizeof id, "d%lld", (long long)i);
    es_event e = mkrow("dd", i, id, NULL);
    e.status = ES_STATUS_DEAD;
    e.queued = 0;
    CHECK_RC(ins(t, e), ES_OK);
  }
  c = dead_pos(t, NULL, 0, ES_NONE);
  CHECK(c.n == 72 && c.v[2] == 11 && c.v[71] == 80);
  c = dead_pos(t, "dd", 40, ES_NONE);
  CHECK(c.n == 40 && c.v[0] == 41);
  commit(t);
}

/* Moved from sqlite_backend_test.c (test_lanes_queue_dead). */
static void case_lanes_queue_dead(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  es_event e;
  char ids[64][16];
  collect c = {0};
  int64_t idx, due;
  t = wbegin(b);
  /* session L: 1 a processed, 2 a dead, 3 a pending, 4 b pending, 5 unlaned */
  struct {
    const char *lane;
    int status;
  } L[] = {{"a", ES_STATUS_PROCESSED}, {"a", ES_STATUS_DEAD}, {"a", ES_STATUS_PENDING},
           {"b", ES_STATUS_PENDING}, {NULL, ES_STATUS_PENDING}};
  int n = 0, ok = 1;
  for (int i = 0; i < 5; i++, n++) {
    snprintf(ids[n], sizeof ids[n], "L%d", i + 1);
    ev_make(&e, "L", i + 1, ids[n], "1");
    e.lane = (char *)L[i].lane;
    e.status = L[i].status;
    ok &= OPS->event_insert(BK(t), t, &e, &err) == ES_OK;
  }
  /* queue: (session, idx, due_at); q1 and q2 share a due time */
  struct {
    const char *s;
    int64_t due;
    int queued;
  } Q[] = {{"q1", 300, 1}, {"q1", 100, 1}, {"q2", 100, 1}, {"q2", 50, 0}, {"q3", 900, 1}, {"q3", 200, 1}};
  int64_t qpos[6];
  for (int i = 0; i < 6; i++, n++) {
    snprintf(ids[n], sizeof ids[n], "Q%d", i);
    /* indexes dense per session, as the core appends (memory insists) */
    ev_make(&e, Q[i].s, i % 2 + 1, ids[n], "2");
    e.queued = Q[i].queued;
    e.due_at = Q[i].due;
    ok &= OPS->event_insert(BK(t), t, &e, &err) == ES_OK;
    qpos[i] = e.position;
  }
  /* dead letters in two sessions */
  int64_t dpos[4];
  for (int i = 0; i < 4; i++, n++) {
    snprintf(ids[n], sizeof ids[n], "D%d", i);
    ev_make(&e, i % 2 ? "d1" : "d2", i / 2 + 1, ids[n], "3");
    e.status = ES_STATUS_DEAD;
    ok &= OPS->event_insert(BK(t), t, &e, &err) == ES_OK;
    dpos[i] = e.position;
  }
  /* insert lane/queue/dead fixtures */
  CHECK(ok);
  /* commit fixtures */
  CHECK(OPS->write_commit(BK(t), t, &err) == ES_OK);

  t = rbegin(b);
  /* lane_next skips processed, counts dead letters */
  CHECK(OPS->lane_next(BK(t), t, "L", "a", 0, &idx, &err) == ES_OK && idx == 2);
  /* lane_next after an index */
  CHECK(OPS->lane_next(BK(t), t, "L", "a", 2, &idx, &err) == ES_OK && idx == 3);
  /* lane_next: none is 0 */
  CHECK(OPS->lane_next(BK(t), t, "L", "a", 3, &idx, &err) == ES_OK && idx == 0);
  /* lane_next: other lane */
  CHECK(OPS->lane_next(BK(t), t, "L", "b", 0, &idx, &err) == ES_OK && idx == 4);
  /* lane_next: unknown lane */
  CHECK(OPS->lane_next(BK(t), t, "L", "zz", 0, &idx, &err) == ES_OK && idx == 0);

  /* queued_due(all): due_at <= now, by (due_at, position), unqueued rows skipped */
  CHECK(OPS->queued_due(BK(t), t, NULL, NULL, 250, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 3 && c.evs.v[0].position == qpos[1] && c.evs.v[1].position == qpos[2] &&
            c.evs.v[2].position == qpos[5]);
  collect_reset(&c);
  /* queued_due(all): limit */
  CHECK(OPS->queued_due(BK(t), t, NULL, NULL, 1000, 2, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 2 && c.evs.v[0].position == qpos[1]);
  collect_reset(&c);
  /* queued_due(session): only that session, all of them, in index order */
  CHECK(OPS->queued_due(BK(t), t, "q1", NULL, 1000, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 2 && str_eq(c.evs.v[0].session, "q1") && str_eq(c.evs.v[1].session, "q1") &&
            c.evs.v[0].index == 1 && c.evs.v[1].index == 2);
  collect_reset(&c);
  /* queued_due(session): limit takes the lowest indexes (not the earliest due) */
  CHECK(OPS->queued_due(BK(t), t, "q1", NULL, 1000, 1, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1 && c.evs.v[0].index == 1);
  collect_reset(&c);
  /* queued_due(session): rows not yet due are skipped */
  CHECK(OPS->queued_due(BK(t), t, "q1", NULL, 150, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1 && c.evs.v[0].index == 2);
  collect_reset(&c);
  /* queued_due(session): unqueued rows skipped */
  CHECK(OPS->queued_due(BK(t), t, "q2", NULL, 1000, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1);
  collect_reset(&c);
  /* queued_next_due(all): smallest due_at > now */
  CHECK(OPS->queued_next_due(BK(t), t, NULL, NULL, 100, &due, &err) == ES_OK && due == 200);
  /* queued_next_due(session) */
  CHECK(OPS->queued_next_due(BK(t), t, "q3", NULL, 200, &due, &err) == ES_OK && due == 900);
  /* queued_next_due: none is ES_NONE */
  CHECK(OPS->queued_next_due(BK(t), t, NULL, NULL, 900, &due, &err) == ES_OK && due == ES_NONE);

  /* dead_list(all): every dead row by position */
  CHECK(OPS->dead_list(BK(t), t, NULL, NULL, 0, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 5 && c.evs.v[1].position == dpos[0] && c.evs.v[4].position == dpos[3]);
  collect_reset(&c);
  /* dead_list(session) */
  CHECK(OPS->dead_list(BK(t), t, "d1", NULL, 0, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 2 && c.evs.v[0].position == dpos[1] && c.evs.v[1].position == dpos[3]);
  collect_reset(&c);
  /* dead_list: after and limit */
  CHECK(OPS->dead_list(BK(t), t, NULL, NULL, dpos[1], 1, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1 && c.evs.v[0].position == dpos[2]);
  collect_reset(&c);
  OPS->read_end(BK(t), t);
}

/* Moved from sqlite_backend_test.c (test_types; its migration from
 * version 2 stays there). */
static void case_types_fixture(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  es_event e;
  collect c = {0};
  type_text tt;
  int64_t due, pos[8];
  /* (type, status, queued, due_at) */
  struct {
    const char *type;
    int status, queued;
    int64_t due;
  } R[] = {{"a", ES_STATUS_PENDING, 1, 300}, {"b", ES_STATUS_PENDING, 1, 100},
           {"a", ES_STATUS_PENDING, 1, 100}, {"a", ES_STATUS_PENDING, 0, 50},
           {"a", ES_STATUS_PROCESSED, 0, 10}, {"c", ES_STATUS_DEAD, 0, 10},
           {"b", ES_STATUS_PENDING, 1, 900}, {"a", ES_STATUS_PENDING, 1, 100}};
  char ids[8][16];
  int ok = 1;
  t = wbegin(b);
  for (int i = 0; i < 8; i++) {
    snprintf(ids[i], sizeof ids[i], "T%d", i);
    ev_make(&e, "s", i + 1, ids[i], "1");
    e.type = (char *)R[i].type;
    e.status = R[i].status;
    e.queued = R[i].queued;
    e.due_at = R[i].due;
    ok &= OPS->event_insert(BK(t), t, &e, &err) == ES_OK;
    pos[i] = e.position;
  }
  /* insert typed fixtures */
  CHECK(ok && OPS->write_commit(BK(t), t, &err) == ES_OK);

  t = rbegin(b);
  /* queued_due_type: that type's queued rows due by now, by (due_at, position) */
  CHECK(OPS->queued_due_type(BK(t), t, NULL, "a", 250, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 2 && c.evs.v[0].position == pos[2] && c.evs.v[1].position == pos[7]);
  collect_reset(&c);
  /* queued_due_type: limit */
  CHECK(OPS->queued_due_type(BK(t), t, NULL, "a", 1000, 1, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1 && c.evs.v[0].position == pos[2]);
  collect_reset(&c);
  /* queued_due_type: unqueued, processed rows skipped */
  CHECK(OPS->queued_due_type(BK(t), t, NULL, "a", 1000, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 3 && c.evs.v[2].position == pos[0]);
  collect_reset(&c);
  /* queued_due_type: only rows of that type */
  CHECK(OPS->queued_due_type(BK(t), t, NULL, "b", 250, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 1 && c.evs.v[0].position == pos[1] && str_eq(c.evs.v[0].type, "b"));
  collect_reset(&c);
  /* queued_due_type: an unknown type has none */
  CHECK(OPS->queued_due_type(BK(t), t, NULL, "zz", 1000, ES_NONE, collect_event, &c, &err) == ES_OK &&
            c.evs.n == 0);
  collect_reset(&c);
  /* queued_next_due_type: smallest due_at > now of that type */
  CHECK(OPS->queued_next_due_type(BK(t), t, NULL, "a", 100, &due, &err) == ES_OK && due == 300 &&
            OPS->queued_next_due_type(BK(t), t, NULL, "b", 100, &due, &err) == ES_OK && due == 900);
  /* queued_next_due_type: none is ES_NONE */
  CHECK(OPS->queued_next_due_type(BK(t), t, NULL, "a", 300, &due, &err) == ES_OK && due == ES_NONE &&
            OPS->queued_next_due_type(BK(t), t, NULL, "zz", 0, &due, &err) == ES_OK && due == ES_NONE);
  /* pending_types: pending rows per type (queued or not), byte order, no dead or processed */
  CHECK(strcmp(pending_text(t, &tt), "a=4 b=2 ") == 0);
  OPS->read_end(BK(t), t);

  /* an update moves rows out of (and back into) the counts and queues */
  t = wbegin(b);
  ev_make(&e, "s", 3, ids[2], "1");
  e.type = "a";
  e.status = ES_STATUS_PROCESSED;
  e.queued = 0;
  /* pending_types inside the write transaction sees its update */
  CHECK(
      OPS->event_update(BK(t), t, &e, &err) == ES_OK && strcmp(pending_text(t, &tt), "a=3 b=2 ") == 0);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  /* ... and not after a rollback */
  CHECK(strcmp(pending_text(t, &tt), "a=4 b=2 ") == 0);
  OPS->read_end(BK(t), t);
}

/* ---- presence (moved from both old files) -------------------------------- */

/* Moved from memory_backend_test.c (test_presence), over populate()'s store. */
static void case_presence(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  es_err err;
  es_presence_row r;
  es_presence_row_init(&r);
  CHECK_RC(pres_put(t, "ns1", "p0", "f9", "9", 1, 5000), ES_OK);
  CHECK_RC(pres_put(t, "ns1", "p1", "f0", "0", 1, 5000), ES_OK);
  prows c = list_pres(t, "ns1", 0);
  CHECK(c.n == 5);
  const char *want[] = {"p0.f9", "p1.f0", "p1.f1", "p1.f2", "p2.f1"};
  for (size_t i = 0; i < c.n && i < 5; i++) CHECK(strcmp(c.key[i], want[i]) == 0);
  CHECK(c.tomb[3] && !c.tomb[2]);
  c = list_pres(t, "ns1", 900);  /* expires_at <= now is gone */
  CHECK(c.n == 4 && strcmp(c.key[3], "p1.f2") == 0);
  c = list_pres(t, "ns1", 2000);
  CHECK(c.n == 2);
  c = list_pres(t, "nons", 0);
  CHECK(c.n == 0);
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p1", "f1", &r, &err), ES_OK);
  CHECK(strcmp(r.value, "1") == 0 && r.value_len == 1 && r.seen == 20 && r.at == 10 && r.expires_at == 2000);
  es_presence_row_destroy(&r);
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p1", "f2", &r, &err), ES_OK);
  CHECK(r.value == NULL && r.at == 11);
  es_presence_row_destroy(&r);
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p2", "f1", &r, &err),
           ES_OK); /* get does not filter */
  es_presence_row_destroy(&r);
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p9", "f1", &r, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->presence_get(BK(t), t, "nons", "p1", "f1", &r, &err), ES_NOT_FOUND);
  CHECK_RC(pres_put(t, "ns1", "p1", "f1", NULL, 30, 2100), ES_OK);  /* replace with a tombstone */
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p1", "f1", &r, &err), ES_OK);
  CHECK(r.value == NULL && r.at == 30 && r.expires_at == 2100);
  es_presence_row_destroy(&r);
  CHECK_RC(OPS->presence_expire(BK(t), t, "ns1", 2000, &err), ES_OK);
  c = list_pres(t, "ns1", INT64_MIN);
  CHECK(c.n == 3 && strcmp(c.key[2], "p1.f1") == 0);
  CHECK_RC(OPS->presence_get(BK(t), t, "ns1", "p2", "f1", &r, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->presence_expire(BK(t), t, "nons", 2000, &err), ES_OK);
  c = list_pres(t, "ns2", 0);
  CHECK(c.n == 1);
  /* Beyond one walk chunk. */
  for (int i = 0; i < 50; i++) {
    char f[16];
    snprintf(f, sizeof f, "g%02d", i);
    CHECK_RC(pres_put(t, "big", "p", f, "1", i, 10 + i), ES_OK);
  }
  c = list_pres(t, "big", 0);
  CHECK(c.n == 50);
  prows only = list_pres(t, "big", 40);
  CHECK(only.n == 19 && strcmp(only.key[0], "p.g31") == 0);
  CHECK_RC(OPS->presence_expire(BK(t), t, "big", 29, &err), ES_OK);
  only = list_pres(t, "big", INT64_MIN);
  CHECK(only.n == 30 && strcmp(only.key[0], "p.g20") == 0);
  commit(t);
}


/* presence rows as "participant/field=value" ("(tomb)": a tombstone) */
typedef struct pnames {
  char v[32][64];
  size_t n;
} pnames;

static int collect_pname(void *ctx, const es_presence_row *row) {
  pnames *c = ctx;
  if (c->n < 32) {
    snprintf(c->v[c->n], sizeof c->v[0], "%s/%s=%s", row->participant, row->field,
             row->value ? row->value : "(tomb)");
  }
  c->n++;
  return 0;
}

/* Moved from sqlite_backend_test.c (test_snapshots_presence's presence). */
static void case_presence_fixture(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  pnames c = {.n = 0};
  int ok;
  t = wbegin(b);

  /* presence */
  es_presence_row r;
  es_presence_row_init(&r);
  ok = 1;
  struct {
    const char *part, *field, *value;
    int64_t exp;
  } P[] = {{"bob", "typing", "true", 500}, {"alice", "status", "\"away\"", 500},
           {"alice", "cursor", NULL, 500},  {"carol", "x", "1", 100}, {"alice", "a", "[]", 500}};
  for (int i = 0; i < 5; i++) {
    r.participant = (char *)P[i].part;
    r.field = (char *)P[i].field;
    r.value = (char *)P[i].value;
    r.value_len = P[i].value ? strlen(P[i].value) : 0;
    r.seen = i;
    r.at = 10 + i;
    r.expires_at = P[i].exp;
    ok &= OPS->presence_put(BK(t), t, "ns", &r, &err) == ES_OK;
  }
  r.participant = (char *)"zed";
  r.value = (char *)"\"other ns\"";
  r.value_len = strlen(r.value);
  ok &= OPS->presence_put(BK(t), t, "ns2", &r, &err) == ES_OK;
  /* presence_put */
  CHECK(ok);
  es_presence_row pg;
  /* presence_get: tombstone has NULL value */
  CHECK(OPS->presence_get(BK(t), t, "ns", "alice", "cursor", &pg, &err) == ES_OK &&
            pg.value == NULL && pg.at == 12 && pg.seen == 2 && pg.expires_at == 500);
  es_presence_row_destroy(&pg);
  /* presence_get: value */
  CHECK(OPS->presence_get(BK(t), t, "ns", "bob", "typing", &pg, &err) == ES_OK &&
            str_eq(pg.value, "true") && pg.value_len == 4);
  es_presence_row_destroy(&pg);
  /* presence_get: missing */
  CHECK(OPS->presence_get(BK(t), t, "ns", "bob", "none", &pg, &err) == ES_NOT_FOUND);
  /* presence_list: live rows by (participant, field), tombstones included, expired skipped */
  CHECK(OPS->presence_list(BK(t), t, "ns", 200, collect_pname, &c, &err) == ES_OK && c.n == 4 &&
            !strcmp(c.v[0], "alice/a=[]") && !strcmp(c.v[1], "alice/cursor=(tomb)") &&
            !strcmp(c.v[2], "alice/status=\"away\"") && !strcmp(c.v[3], "bob/typing=true"));
  c.n = 0;
  /* presence_expire drops rows with expires_at <= now only */
  CHECK(OPS->presence_expire(BK(t), t, "ns", 100, &err) == ES_OK &&
            OPS->presence_get(BK(t), t, "ns", "carol", "x", &pg, &err) == ES_NOT_FOUND &&
            OPS->presence_get(BK(t), t, "ns", "bob", "typing", &pg, &err) == ES_OK);
  es_presence_row_destroy(&pg);
  /* presence: namespaces are separate */
  CHECK(OPS->presence_list(BK(t), t, "ns2", 0, collect_pname, &c, &err) == ES_OK && c.n == 1);
  c.n = 0;
  /* commit presence */
  CHECK(OPS->write_commit(BK(t), t, &err) == ES_OK);
}

/* ---- counts: the backend's sums follow the core's rule --------------------- */

/* The model: the store's sums and those of up to 8 scopes, moved by
 * es_counts_move exactly as counts.h says a backend must. */
typedef struct model {
  es_counts all;
  char scope[8][ES_SCOPE_MAX_BYTES + 1];
  es_counts by[8];
  int n;
  es_session_info rows[16]; /* the session rows as stored, by name */
  char names[16][ES_SCOPE_MAX_BYTES + 8];
  int nrows;
} model;

static es_counts *model_scope(model *m, const char *name) {
  size_t k = es_scope_len(name);
  if (!k) return NULL;
  for (int i = 0; i < m->n; i++)
    if (strlen(m->scope[i]) == k && memcmp(m->scope[i], name, k) == 0) return &m->by[i];
  memcpy(m->scope[m->n], name, k);
  m->scope[m->n][k] = '\0';
  memset(&m->by[m->n], 0, sizeof m->by[m->n]);
  return &m->by[m->n++];
}

static es_session_info *model_row(model *m, const char *name) {
  for (int i = 0; i < m->nrows; i++)
    if (strcmp(m->names[i], name) == 0) return m->rows[i].session ? &m->rows[i] : NULL;
  return NULL;
}

/* Puts (or, row NULL, deletes) the session row of name in the backend and
 * the model. */
static void put_row(model *m, es_txn *t, const char *name, int64_t events, int64_t pending,
                    int64_t dead, int64_t fence, int del) {
  es_err err;
  es_session_info to;
  es_session_info_init(&to);
  to.session = (char *)name;
  to.head = to.events = events;
  to.pending = pending;
  to.dead = dead;
  to.fence = fence;
  es_session_info *from = model_row(m, name);
  es_counts_move(&m->all, name, from, del ? NULL : &to);
  es_counts *sc = model_scope(m, name);
  if (sc) es_counts_move(sc, name, from, del ? NULL : &to);
  int i = 0;
  while (i < m->nrows && strcmp(m->names[i], name) != 0) i++;
  if (i == m->nrows) snprintf(m->names[m->nrows++], sizeof m->names[0], "%s", name);
  if (del) {
    CHECK_RC(OPS->session_delete(BK(t), t, name, &err), ES_OK);
    m->rows[i].session = NULL;
  } else {
    CHECK_RC(OPS->session_put(BK(t), t, &to, &err), ES_OK);
    m->rows[i] = to;
    m->rows[i].session = m->names[i];
  }
}

static int counts_eq(const es_counts *a, const es_counts *b) {
  return a->sessions == b->sessions && a->events == b->events && a->pending == b->pending &&
         a->dead == b->dead;
}

/* The backend's answers for the store and every scope equal the model's. */
static void check_counts(const model *m, es_txn *t, int line) {
  es_err err;
  es_counts got;
  int bad = OPS->counts(BK(t), t, NULL, &got, &err) != ES_OK || !counts_eq(&got, &m->all);
  for (int i = 0; i < m->n; i++) {
    bad |= OPS->counts(BK(t), t, m->scope[i], &got, &err) != ES_OK || !counts_eq(&got, &m->by[i]);
  }
  if (bad) {
    printf("#   counts differ from es_counts_move's (checked at line %d)\n", line);
    cur_failed = 1;
  }
}

static void case_counts(es_backend *b) {
  model m;
  memset(&m, 0, sizeof m);
  char long_tenant[ES_MAX_TENANT_BYTES + 8];
  memset(long_tenant, 't', ES_MAX_TENANT_BYTES + 1);
  strcpy(long_tenant + ES_MAX_TENANT_BYTES + 1, ES_TENANT_SEP "x"); /* no scope: too long */
  char max_tenant[ES_MAX_TENANT_BYTES + 8];
  memset(max_tenant, 'u', ES_MAX_TENANT_BYTES);
  strcpy(max_tenant + ES_MAX_TENANT_BYTES, ES_TENANT_SEP "x"); /* the longest scope */
  CHECK(es_scope_len(long_tenant) == 0 && es_scope_len(max_tenant) == ES_SCOPE_MAX_BYTES);
  CHECK(es_scope_len(ES_TENANT_SEP "x") == 0 && es_scope_len("plain") == 0);
  es_txn *t = wbegin(b);
  put_row(&m, t, "a", 3, 1, 0, 0, 0);
  put_row(&m, t, "acme" ES_TENANT_SEP "x", 5, 2, 1, 0, 0);
  put_row(&m, t, "acme" ES_TENANT_SEP "y", 7, 0, 3, 2, 0);
  put_row(&m, t, "zeta" ES_TENANT_SEP "x", 1, 1, 0, 0, 0);
  put_row(&m, t, "", 0, 0, 0, 5, 0);                  /* a shard's plan record: not counted */
  put_row(&m, t, "moving", 9, 9, 9, -1, 0);           /* a move marker: not counted */
  put_row(&m, t, long_tenant, 2, 1, 1, 0, 0);         /* counted in the store's sums only */
  put_row(&m, t, max_tenant, 4, 0, 0, 0, 0);          /* its own scope */
  put_row(&m, t, ES_TENANT_SEP "lead", 1, 0, 0, 0, 0); /* a separator first: no scope */
  check_counts(&m, t, __LINE__);
  CHECK(m.all.sessions == 7 && m.by[0].sessions == 2); /* the model itself: 7 counted, acme 2 */
  commit(t);
  t = rbegin(b);
  check_counts(&m, t, __LINE__);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  /* as the core does (backend.h): each caller's work inside a savepoint,
   * released into the transaction; a later caller's rolled back alone */
  es_err err;
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  put_row(&m, t, "a", 4, 0, 1, 0, 0);                         /* a replaced row moves by the difference */
  put_row(&m, t, "acme" ES_TENANT_SEP "y", 7, 0, 3, -2, 0);   /* becomes a marker: leaves the sums */
  put_row(&m, t, "moving", 9, 9, 9, 0, 0);                    /* a marker becomes a session */
  put_row(&m, t, "zeta" ES_TENANT_SEP "x", 0, 0, 0, 0, 1);    /* deleted */
  check_counts(&m, t, __LINE__);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  /* A savepoint rolled back takes its moves with it. */
  model before = m;
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  put_row(&m, t, "acme" ES_TENANT_SEP "x", 50, 20, 10, 0, 0);
  put_row(&m, t, "acme" ES_TENANT_SEP "new", 1, 1, 0, 0, 0);
  check_counts(&m, t, __LINE__);
  OPS->savepoint_rollback(BK(t), t);
  m = before;
  check_counts(&m, t, __LINE__);
  commit(t);
  t = rbegin(b);
  check_counts(&m, t, __LINE__);
  es_counts none;
  CHECK_RC(OPS->counts(BK(t), t, "nobody" ES_TENANT_SEP, &none, &err), ES_OK);
  CHECK(none.sessions == 0 && none.events == 0 && none.pending == 0 && none.dead == 0);
  OPS->read_end(BK(t), t);
}

/* ---- events: insert, get, get_by_id, range, all, update, last_position ----- */

/* Moved from memory_backend_test.c (over populate()'s store): every field
 * read back, owned by the caller, missing rows, positions increasing
 * across transactions, a NULL payload and empty strings. */
static void case_insert_get(es_backend *b) {
  populate(b);
  es_txn *t = rbegin(b);
  es_event e;
  es_err err;
  es_event_init(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 6, &e, &err), ES_OK);
  CHECK(strcmp(e.id, "a6") == 0 && strcmp(e.type, "t") == 0 && strcmp(e.session, "a") == 0);
  CHECK(e.payload_len == strlen("[1,\"\\u0000\"]") && memcmp(e.payload, "[1,\"\\u0000\"]", e.payload_len) == 0);
  CHECK(e.payload[e.payload_len] == '\0');
  CHECK(e.lane == NULL && e.index == 6 && e.position == 6 && e.created_at == 1006);
  CHECK(e.cause_index == 3 && e.cause_attempt == 1 && e.not_before == 1010);
  CHECK(e.status == ES_STATUS_PENDING && e.queued == 1 && e.due_at == 1010);
  CHECK(e.attempts == 0 && e.failures == 0 && e.last_error == NULL && e.claim_holder == NULL);
  CHECK(e.processed_at == ES_NONE && e.claim_expires_at == ES_NONE && e.retry_at == ES_NONE);
  CHECK(e.last_failed_attempt == ES_NONE && e.returned == 0);
  /* Owned: the caller may scribble on it and frees it. */
  e.id[0] = 'Z';
  e.session[0] = 'Z';
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 6, &e, &err), ES_OK);
  CHECK(strcmp(e.id, "a6") == 0 && strcmp(e.session, "a") == 0);
  es_event_destroy(&e);

  CHECK_RC(OPS->event_get(BK(t), t, "a", 4, &e, &err), ES_OK);
  CHECK(strcmp(e.lane, "l2") == 0 && e.status == ES_STATUS_DEAD && e.failures == 3);
  CHECK(strcmp(e.last_error, "boom") == 0 && e.last_failed_attempt == 3 && e.attempts == 3);
  CHECK(e.cause_index == ES_NONE && e.not_before == ES_NONE);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 3, &e, &err), ES_OK);
  CHECK(e.status == ES_STATUS_PROCESSED && e.processed_at == e.created_at && e.returned == -1);
  CHECK(e.attempts == 0 && e.claim_holder == NULL && e.retry_at == ES_NONE);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, "c1", &e, &err), ES_OK);
  CHECK(strcmp(e.session, "c") == 0 && e.index == 1 && e.position == 10);
  CHECK(strcmp(e.claim_holder, "w1") == 0 && e.claim_expires_at == 1600 && e.processed_at == 1500);
  CHECK(e.returned == 2 && e.attempts == 1);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, "b3", &e, &err), ES_OK);
  CHECK(strcmp(e.lane, "l1") == 0 && strcmp(e.session, "b") == 0 && e.position == 9);
  es_event_destroy(&e);

  CHECK_RC(OPS->event_get(BK(t), t, "a", 0, &e, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 7, &e, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->event_get(BK(t), t, "zz", 1, &e, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, "nope", &e, &err), ES_NOT_FOUND);
  OPS->read_end(BK(t), t);

  /* Positions keep increasing across sessions and transactions; a NULL
   * payload and empty strings survive. */
  t = wbegin(b);
  es_event r = mkrow("d", 1, "d1", "");
  r.payload = NULL;
  r.payload_len = 0;
  r.type = "";
  CHECK(ins_pos(t, r) == 11);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->event_get(BK(t), t, "d", 1, &e, &err), ES_OK);
  CHECK(e.payload == NULL && e.payload_len == 0 && strcmp(e.type, "") == 0 && strcmp(e.lane, "") == 0);
  es_event_destroy(&e);
  OPS->read_end(BK(t), t);
}

/* Moved from memory_backend_test.c: order, bounds, limits, a stopping
 * callback. */
static void case_range_all(es_backend *b) {
  populate(b);
  es_txn *t = rbegin(b);
  ints c = range(t, "a", 0, ES_NONE, ES_NONE);
  WANT(c, 1, 2, 3, 4, 5, 6);
  c = range(t, "a", ES_NONE, ES_NONE, ES_NONE);
  WANT(c, 1, 2, 3, 4, 5, 6);
  c = range(t, "a", 2, 5, ES_NONE);
  WANT(c, 3, 4, 5);
  c = range(t, "a", 2, 5, 2);
  WANT(c, 3, 4);
  c = range(t, "a", 2, 100, ES_NONE);
  WANT(c, 3, 4, 5, 6);
  c = range(t, "a", 5, 5, ES_NONE);
  WANT_NONE(c);
  c = range(t, "a", 0, ES_NONE, 0);
  WANT_NONE(c);
  c = range(t, "nobody", 0, ES_NONE, ES_NONE);
  WANT_NONE(c);
  c = (ints){.which = 0, .stop_at = 2};
  es_err err;
  CHECK_RC(OPS->event_range(BK(t), t, "a", 0, ES_NONE, ES_NONE, collect_int, &c, &err), ES_OK);
  WANT(c, 1, 2);
  c = all_pos(t, 0, ES_NONE);
  WANT(c, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
  c = all_pos(t, 7, ES_NONE);
  WANT(c, 8, 9, 10);
  c = all_pos(t, 3, 2);
  WANT(c, 4, 5);
  c = all_pos(t, 10, ES_NONE);
  WANT_NONE(c);
  c = all_pos(t, ES_NONE, 1);
  WANT(c, 1);
  OPS->read_end(BK(t), t);
}

/* Moved from memory_backend_test.c: exactly the dispatch fields rewritten,
 * compact forms read back exactly, back to the untouched record. */
static void case_update(es_backend *b) {
  populate(b);
  es_txn *t = wbegin(b);
  es_event e;
  es_err err;
  es_event_init(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 1, &e, &err), ES_OK);
  es_event u = e;
  u.status = ES_STATUS_PENDING;
  u.attempts = 4;
  u.failures = 2;
  u.last_error = "e2";
  u.processed_at = 77;
  u.claim_holder = "h";
  u.claim_expires_at = 88;
  u.retry_at = 99;
  u.queued = 1;
  u.due_at = 1234;
  u.last_failed_attempt = 3;
  u.returned = 5;
  /* Immutable fields are not the update's business. */
  u.type = "changed";
  u.payload = "1";
  u.payload_len = 1;
  u.created_at = 1;
  CHECK_RC(upd(t, &u), ES_OK);
  es_event g;
  es_event_init(&g);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 1, &g, &err), ES_OK);
  CHECK(g.attempts == 4 && g.failures == 2 && strcmp(g.last_error, "e2") == 0);
  CHECK(g.processed_at == 77 && strcmp(g.claim_holder, "h") == 0 && g.claim_expires_at == 88);
  CHECK(g.retry_at == 99 && g.queued == 1 && g.due_at == 1234 && g.last_failed_attempt == 3);
  CHECK(g.returned == 5 && strcmp(g.type, "t") == 0 && strcmp(g.payload, "{}") == 0);
  CHECK(g.created_at == 1001 && g.position == 1 && strcmp(g.lane, "l1") == 0);
  es_event_destroy(&g);
  /* Forms a backend may store compactly read back exactly too. */
  const struct {
    int64_t processed_at, returned, attempts;
  } forms[] = {{1001, -1, 0}, {1001, 0, 0}, {ES_NONE, -1, 0}, {1001, -1, 1}, {1002, -1, 0}, {0, 0, 0}};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    es_event f = e;
    f.processed_at = forms[i].processed_at;
    f.returned = forms[i].returned;
    f.attempts = forms[i].attempts;
    CHECK_RC(upd(t, &f), ES_OK);
    CHECK_RC(OPS->event_get(BK(t), t, "a", 1, &g, &err), ES_OK);
    CHECK(g.processed_at == f.processed_at && g.returned == f.returned && g.attempts == f.attempts);
    es_event_destroy(&g);
  }
  /* Back to the untouched record: the row reads back exactly that. */
  CHECK_RC(upd(t, &e), ES_OK);
  CHECK_RC(OPS->event_get(BK(t), t, "a", 1, &g, &err), ES_OK);
  CHECK(ev_eq(&e, &g));
  es_event_destroy(&g);
  es_event_destroy(&e);
  commit(t);
}

static int64_t last_pos(es_txn *t) {
  int64_t p = -1;
  es_err err;
  CHECK_RC(OPS->last_position(BK(t), t, &p, &err), ES_OK);
  return p;
}

/* Moved from memory_backend_test.c: the writer sees its own rows, a
 * rollback takes them back. */
static void case_last_position(es_backend *b) {
  es_txn *t = rbegin(b);
  CHECK(last_pos(t) == 0);
  OPS->read_end(BK(t), t);
  populate(b);
  t = wbegin(b);
  CHECK(last_pos(t) == 10);
  CHECK_RC(ins(t, mkrow("a", 7, "a7", NULL)), ES_OK);
  CHECK(last_pos(t) == 11);  /* the writer sees its own rows */
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  CHECK(last_pos(t) == 10);
  OPS->read_end(BK(t), t);
}


/* Moved from sqlite_backend_test.c: every field as written (ES_NONE, NUL
 * bytes, the dispatch record's times and the origin, set and unset),
 * missing rows, range and all bounds, last_position, event_update's rules
 * (dispatch fields only, the origin never, NULL / ES_NONE clear). Its
 * update of a missing row stays in sqlite_backend_test.c. */
static void case_events_fixture(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  /* An embedded NUL: every byte must come back. Canonical JSON (the
   * payload store.h promises) has none, and PostgreSQL refuses it, so the
   * 0xFF run (memory and sqlite) uses it and the UTF-8 run its escape. */
  static const char nul_payload[] = "\"a\0b\"", esc_payload[] = "\"a\\u0000b\"";
  const int raw = HI[0] == '\xff';
  const char *pl = raw ? nul_payload : esc_payload;
  const size_t pl_len = raw ? sizeof nul_payload - 1 : sizeof esc_payload - 1;
  es_event e[4], got;
  collect c = {0};
  ev_make(&e[0], "s", 1, "id-1", "{\"x\":1}");
  ev_make(&e[1], "s", 2, "id-2", NULL);
  e[1].payload = (char *)pl;
  e[1].payload_len = pl_len;
  e[1].lane = (char *)"lane-a";
  e[1].cause_index = 1;
  e[1].cause_attempt = 2;
  e[1].not_before = 5000;
  e[1].status = ES_STATUS_PROCESSED;
  e[1].attempts = 3;
  e[1].failures = 1;
  e[1].last_error = (char *)"boom";
  e[1].processed_at = 4242;
  e[1].claim_holder = (char *)"w1";
  e[1].claim_expires_at = 9999;
  e[1].retry_at = 7777;
  e[1].queued = 1;
  e[1].due_at = 8888;
  e[1].last_failed_attempt = 2;
  e[1].returned = 4;
  e[1].first_claimed_at = 4000;
  e[1].last_claimed_at = 4100;
  e[1].failed_at = 4150;
  e[1].processed_by_attempt = 3;
  char origin[32];
  snprintf(origin, sizeof origin, "parent-%s", HI);
  e[1].origin_session = origin;  /* a fork's copy */
  e[1].origin_index = 12;
  ev_make(&e[2], "s", 3, "id-3", "null");
  e[2].created_at = ES_NONE;
  e[2].attempts = ES_NONE;
  e[2].failures = ES_NONE;
  e[2].returned = ES_NONE;
  ev_make(&e[3], "other", 1, "id-4", "[]");

  t = wbegin(b);
  int ok = 1;
  for (int i = 0; i < 4; i++) {
    int rc = OPS->event_insert(BK(t), t, &e[i], &err);
    if (rc != ES_OK) printf("#   event_insert %d: %s\n", i, err.msg);
    ok &= rc == ES_OK;
  }
  CHECK(ok); /* event_insert x4 */
  /* event_insert assigns increasing positions */
  CHECK(e[0].position > 0 && e[1].position > e[0].position && e[2].position > e[1].position &&
        e[3].position > e[2].position);
  commit(t);

  t = rbegin(b);
  ok = 1;
  for (int i = 0; i < 4; i++) {
    es_event_init(&got);
    ok &= OPS->event_get(BK(t), t, e[i].session, e[i].index, &got, &err) == ES_OK &&
          ev_eq(&got, &e[i]);
    es_event_destroy(&got);
  }
  /* event_get returns every field as written (ES_NONE as NULL, NUL bytes
   * kept; the dispatch record's times and the origin, set and unset) */
  CHECK(ok);
  es_event_init(&got);
  /* payload with an embedded NUL round-trips, NUL-terminated */
  CHECK(OPS->event_get(BK(t), t, "s", 2, &got, &err) == ES_OK && got.payload_len == pl_len &&
        memcmp(got.payload, pl, pl_len) == 0 && got.payload[pl_len] == '\0');
  es_event_destroy(&got);
  CHECK(OPS->event_get(BK(t), t, "s", 9, &got, &err) == ES_NOT_FOUND);    /* missing index */
  CHECK(OPS->event_get(BK(t), t, "nope", 1, &got, &err) == ES_NOT_FOUND); /* missing session */
  /* event_get_by_id finds an event of any session */
  CHECK(OPS->event_get_by_id(BK(t), t, "id-4", &got, &err) == ES_OK && ev_eq(&got, &e[3]));
  es_event_destroy(&got);
  CHECK(OPS->event_get_by_id(BK(t), t, "id-x", &got, &err) == ES_NOT_FOUND); /* unknown id */

  /* event_range: whole session in index order */
  CHECK(OPS->event_range(BK(t), t, "s", 0, ES_NONE, ES_NONE, collect_event, &c, &err) == ES_OK &&
        c.evs.n == 3 && c.evs.v[0].index == 1 && c.evs.v[2].index == 3 &&
        ev_eq(&c.evs.v[1], &e[1]));
  collect_reset(&c);
  /* event_range: after/through/limit */
  CHECK(OPS->event_range(BK(t), t, "s", 1, 3, 1, collect_event, &c, &err) == ES_OK &&
        c.evs.n == 1 && c.evs.v[0].index == 2);
  collect_reset(&c);
  /* event_range: through bounds inclusive */
  CHECK(OPS->event_range(BK(t), t, "s", 0, 2, ES_NONE, collect_event, &c, &err) == ES_OK &&
        c.evs.n == 2);
  collect_reset(&c);
  /* event_range: callback returning nonzero stops early */
  ints st = {.which = 0, .stop_at = 1};
  CHECK(OPS->event_range(BK(t), t, "s", 0, ES_NONE, ES_NONE, collect_int, &st, &err) == ES_OK &&
        st.n == 1);
  /* event_all: position > after, ascending */
  CHECK(OPS->event_all(BK(t), t, NULL, e[0].position, ES_NONE, collect_event, &c, &err) == ES_OK &&
        c.evs.n == 3 && c.evs.v[0].position == e[1].position &&
        c.evs.v[2].position == e[3].position);
  collect_reset(&c);
  /* event_all: limit */
  CHECK(OPS->event_all(BK(t), t, NULL, 0, 2, collect_event, &c, &err) == ES_OK && c.evs.n == 2);
  collect_reset(&c);
  int64_t last = -1;
  CHECK(OPS->last_position(BK(t), t, &last, &err) == ES_OK && last == e[3].position);
  OPS->read_end(BK(t), t);

  /* event_update rewrites the dispatch fields only */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK); /* the core writes nothing before one */
  es_event u = e[0];
  u.status = ES_STATUS_DEAD;
  u.attempts = 7;
  u.failures = 3;
  u.last_error = (char *)"err\ntrace";
  u.processed_at = 12;
  u.claim_holder = (char *)"h";
  u.claim_expires_at = 13;
  u.retry_at = 14;
  u.queued = 1;
  u.due_at = 15;
  u.last_failed_attempt = 16;
  u.returned = 17;
  u.first_claimed_at = 18;
  u.last_claimed_at = 19;
  u.failed_at = 20;
  u.processed_by_attempt = 21;
  u.type = (char *)"changed-type-ignored";
  u.origin_session = (char *)"origin-ignored"; /* immutable: written by insert only */
  u.origin_index = 22;
  CHECK_RC(OPS->event_update(BK(t), t, &u, &err), ES_OK);
  es_event_init(&got);
  /* dispatch fields rewritten, the rest kept; the write txn sees its own writes */
  CHECK(OPS->event_get(BK(t), t, "s", 1, &got, &err) == ES_OK && got.status == ES_STATUS_DEAD &&
        got.attempts == 7 && got.failures == 3 && str_eq(got.last_error, "err\ntrace") &&
        got.processed_at == 12 && str_eq(got.claim_holder, "h") && got.claim_expires_at == 13 &&
        got.retry_at == 14 && got.queued == 1 && got.due_at == 15 &&
        got.last_failed_attempt == 16 && got.returned == 17 && got.first_claimed_at == 18 &&
        got.last_claimed_at == 19 && got.failed_at == 20 && got.processed_by_attempt == 21 &&
        str_eq(got.type, "t") && got.position == e[0].position);
  /* the origin is not written (none stays none) */
  CHECK(got.origin_session == NULL && got.origin_index == ES_NONE);
  es_event_destroy(&got);
  u = e[1];
  u.origin_session = (char *)"origin-ignored";
  u.origin_index = ES_NONE;
  u.first_claimed_at = ES_NONE;
  /* a fork's copy keeps its origin */
  CHECK(OPS->event_update(BK(t), t, &u, &err) == ES_OK &&
        OPS->event_get(BK(t), t, "s", 2, &got, &err) == ES_OK &&
        str_eq(got.origin_session, origin) && got.origin_index == 12 &&
        got.first_claimed_at == ES_NONE && got.last_claimed_at == 4100);
  es_event_destroy(&got);
  u = e[0];
  u.status = ES_STATUS_DEAD;
  u.claim_holder = NULL;
  u.claim_expires_at = ES_NONE;
  u.last_error = NULL;
  /* NULL / ES_NONE clear fields */
  CHECK(OPS->event_update(BK(t), t, &u, &err) == ES_OK &&
        OPS->event_get(BK(t), t, "s", 1, &got, &err) == ES_OK && got.claim_holder == NULL &&
        got.claim_expires_at == ES_NONE && got.last_error == NULL &&
        got.first_claimed_at == ES_NONE && got.last_claimed_at == ES_NONE &&
        got.failed_at == ES_NONE && got.processed_by_attempt == ES_NONE);
  es_event_destroy(&got);
  /* a missing row: sqlite_backend_test.c (backend.h promises no error for
   * it; PostgreSQL reports it at commit) */
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
}

/* Moved from memory_backend_test.c: e read back through every read op
 * that returns it equals want. */
static void check_reads(es_txn *t, const es_event *want) {
  es_err err;
  es_event g;
  es_event_init(&g);
  CHECK_RC(OPS->event_get(BK(t), t, want->session, want->index, &g, &err), ES_OK);
  CHECK(ev_eq(want, &g));
  /* memory hands out a row in one allocation (store.h: packed) */
  CHECK(OPS != &es_backend_memory || g.packed == 1);
  es_event_destroy(&g);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, want->id, &g, &err), ES_OK);
  CHECK(ev_eq(want, &g));
  es_event_destroy(&g);
  /* The borrowed views of the walks. */
  collect r = {0}, a = {0};
  CHECK_RC(OPS->event_range(BK(t), t, want->session, want->index - 1, want->index, ES_NONE,
                            collect_event, &r, &err),
           ES_OK);
  CHECK(r.evs.n == 1 && ev_eq(want, &r.evs.v[0]));
  CHECK_RC(OPS->event_all(BK(t), t, NULL, want->position - 1, 1, collect_event, &a, &err), ES_OK);
  CHECK(a.evs.n == 1 && ev_eq(want, &a.evs.v[0]));
  collect_reset(&r);
  collect_reset(&a);
}

static int64_t ins_row(es_txn *t, es_event *e) {
  es_err err;
  CHECK_RC(OPS->event_insert(BK(t), t, e, &err), ES_OK);
  return e->position;
}

/* Moved from memory_backend_test.c: origins (none, the own session, a name
 * that is no session, half an origin, new sessions) and the new dispatch
 * fields, through inserts, claims, a failure, a completion, each field
 * alone at the int64 edges, back to untouched, in the write and a read
 * transaction. Its undo compared over the whole state stays there. */
static void case_event_fields(es_backend *b) {
  es_txn *t = wbegin(b);
  es_err err;
  es_event rows[8];
  int n = origin_rows(rows);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  for (int i = 0; i < n; i++) CHECK(ins_row(t, &rows[i]) == i + 1);
  for (int i = 0; i < n; i++) check_reads(t, &rows[i]);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  for (int i = 0; i < n; i++) check_reads(t, &rows[i]);
  /* An origin name is stored, not made a session. */
  es_session_info si;
  es_session_info_init(&si);
  CHECK_RC(OPS->session_get(BK(t), t, "ghost", &si, &err), ES_NOT_FOUND);
  names sl = list_sessions(t, "", NULL, ES_NONE);
  CHECK(sl.n == 0);
  ints c = range(t, "ghost", 0, ES_NONE, ES_NONE);
  WANT_NONE(c);
  OPS->read_end(BK(t), t);

  /* The dispatch fields through claims, a failure, a completion; each new
   * field alone; back to untouched. Origins do not change. */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  es_event u = rows[1];
  u.status = ES_STATUS_PENDING;
  u.queued = 1;
  u.due_at = 50;
  u.attempts = 1;
  u.claim_holder = "w";
  u.claim_expires_at = 60;
  u.first_claimed_at = u.last_claimed_at = 50;
  u.processed_at = ES_NONE;
  u.returned = 0;
  u.origin_session = "changed";  /* immutable: ignored */
  u.origin_index = 77;
  CHECK_RC(upd(t, &u), ES_OK);
  u.origin_session = rows[1].origin_session;
  u.origin_index = rows[1].origin_index;
  check_reads(t, &u);
  ints q = due_pos(t, NULL, 50, ES_NONE);
  WANT(q, 2);
  CHECK_RC(upd(t, &u), ES_OK);  /* the same record again */
  check_reads(t, &u);
  u.status = ES_STATUS_DEAD;
  u.queued = 0;
  u.due_at = ES_NONE;
  u.failures = 1;
  u.failed_at = 61;
  u.last_failed_attempt = 1;
  u.last_error = "bad";
  u.claim_holder = NULL;
  CHECK_RC(upd(t, &u), ES_OK);
  check_reads(t, &u);
  collect d = {0};
  CHECK_RC(OPS->dead_list(BK(t), t, "f", NULL, 0, ES_NONE, collect_event, &d, &err), ES_OK);
  CHECK(d.evs.n == 1 && ev_eq(&u, &d.evs.v[0]));
  collect_reset(&d);
  u.status = ES_STATUS_PENDING;
  u.queued = 1;
  u.due_at = 70;
  u.attempts = 2;
  u.last_claimed_at = 70;
  u.claim_holder = "w2";
  CHECK_RC(upd(t, &u), ES_OK);
  check_reads(t, &u);
  u.status = ES_STATUS_PROCESSED;
  u.queued = 0;
  u.due_at = ES_NONE;
  u.processed_at = 80;
  u.processed_by_attempt = 2;
  u.returned = 3;
  CHECK_RC(upd(t, &u), ES_OK);
  check_reads(t, &u);
  es_event base = rows[3];
  for (int f = 0; f < 4; f++) {
    es_event one = base;
    int64_t *field[] = {&one.first_claimed_at, &one.last_claimed_at, &one.failed_at,
                        &one.processed_by_attempt};
    *field[f] = INT64_MAX - f;
    CHECK_RC(upd(t, &one), ES_OK);
    check_reads(t, &one);
    *field[f] = INT64_MIN + 1;  /* anything but ES_NONE is stored */
    CHECK_RC(upd(t, &one), ES_OK);
    check_reads(t, &one);
  }
  CHECK_RC(upd(t, &base), ES_OK);
  check_reads(t, &base);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  check_reads(t, &u);
  check_reads(t, &base);
  OPS->read_end(BK(t), t);
}

/* Moved from sqlite_backend_test.c: every read of events returns the
 * dispatch times and the origin (an SQL backend: one column list, one
 * decoder; checked anyway, in a read and in the write transaction, which
 * may copy rows differently). */
static int fields_match(const es_events *got, const es_event *want) {
  return got->n == 1 && ev_eq(&got->v[0], want);
}

static void case_event_fields_everywhere(es_backend *b) {
  es_txn *t;
  es_err err = {0};
  es_event q, d, got;
  collect c = {0};
  ev_make(&q, "f", 1, "f-1", "1");
  q.type = (char *)"ft";
  q.queued = 1;
  q.due_at = 10;
  ev_make(&d, "f", 2, "f-2", "2");
  d.status = ES_STATUS_DEAD;
  es_event *both[2] = {&q, &d};
  for (int i = 0; i < 2; i++) {
    both[i]->first_claimed_at = 100 + i;
    both[i]->last_claimed_at = 200 + i;
    both[i]->failed_at = 300 + i;
    both[i]->processed_by_attempt = 4 + i;
    both[i]->origin_session = (char *)"from";
    both[i]->origin_index = 7 + i;
  }
  t = wbegin(b);
  /* insert rows with every dispatch time and the origin set */
  CHECK(OPS->savepoint(BK(t), t, &err) == ES_OK && OPS->event_insert(BK(t), t, &q, &err) == ES_OK &&
        OPS->event_insert(BK(t), t, &d, &err) == ES_OK &&
        OPS->savepoint_release(BK(t), t, &err) == ES_OK);
  commit(t);
  for (int pass = 0; pass < 2; pass++) {
    int ok = 1;
    t = pass == 0 ? rbegin(b) : wbegin(b);
    ok &= OPS->event_get(BK(t), t, "f", 1, &got, &err) == ES_OK && ev_eq(&got, &q);
    es_event_destroy(&got);
    ok &= OPS->event_get_by_id(BK(t), t, "f-2", &got, &err) == ES_OK && ev_eq(&got, &d);
    es_event_destroy(&got);
#define EACH(call, want)                                        \
  do {                                                          \
    ok &= (call) == ES_OK && fields_match(&c.evs, (want));      \
    collect_reset(&c);                                          \
  } while (0)
    EACH(OPS->event_range(BK(t), t, "f", 1, 2, ES_NONE, collect_event, &c, &err), &d);
    EACH(OPS->event_all(BK(t), t, NULL, q.position, ES_NONE, collect_event, &c, &err), &d);
    EACH(OPS->queued_due(BK(t), t, NULL, NULL, 10, ES_NONE, collect_event, &c, &err), &q);
    EACH(OPS->queued_due(BK(t), t, "f", NULL, 10, 1, collect_event, &c, &err),
         &q); /* the index window */
    EACH(OPS->queued_due(BK(t), t, "f", NULL, 10, ES_NONE, collect_event, &c, &err),
         &q); /* by due time */
    EACH(OPS->queued_due_type(BK(t), t, NULL, "ft", 10, ES_NONE, collect_event, &c, &err), &q);
    EACH(OPS->dead_list(BK(t), t, NULL, NULL, 0, ES_NONE, collect_event, &c, &err), &d);
    EACH(OPS->dead_list(BK(t), t, "f", NULL, 0, ES_NONE, collect_event, &c, &err), &d);
#undef EACH
    CHECK(ok); /* in the read (pass 0) and the write transaction (pass 1) */
    if (pass == 0)
      OPS->read_end(BK(t), t);
    else
      OPS->write_rollback(BK(t), t);
  }
}

/* ---- refs: get, put, delete, list (moved from both old files) -------------- */

/* s with every '~' replaced by HI (in one of 4 buffers). */
static const char *hs(int k, const char *s) {
  static char buf[4][512];
  char *o = buf[k];
  size_t n = 0;
  for (; *s && n + 8 < sizeof buf[k]; s++) {
    if (*s == '~') n += (size_t)snprintf(o + n, sizeof buf[k] - n, "%s", HI);
    else o[n++] = *s;
  }
  o[n] = '\0';
  return o;
}

/* Moved from memory_backend_test.c: put, replace, get (the row owned by the
 * caller), byte order with HI last, after and limit, a stopping callback,
 * delete, nested savepoints that undo every kind of ref write, beyond one
 * walk chunk. Its read-transaction writes, NULL names, negative limit,
 * whole-state undo and walks that write stay in memory_backend_test.c. */
static void case_refs(es_backend *b) {
  es_err err;
  es_ref r;
  es_ref_init(&r);
  es_txn *t = rbegin(b);
  rtext c = {.n = 0};
  CHECK_RC(OPS->ref_get(BK(t), t, "main", &r, &err), ES_NOT_FOUND);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), "") == 0);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(ref_put(t, "b", "s1", 1, 2), ES_OK);
  CHECK_RC(ref_put(t, "a", "s2", 3, 4), ES_OK);
  CHECK_RC(ref_put(t, HI, "s3", 5, 6), ES_OK);
  CHECK_RC(ref_put(t, "a/1", "s4", 7, 8), ES_OK);
  CHECK_RC(ref_put(t, "ab", "", 9, 10), ES_OK);
  CHECK_RC(OPS->ref_get(BK(t), t, "a", &r, &err), ES_OK);
  CHECK(strcmp(r.name, "a") == 0 && strcmp(r.session, "s2") == 0 && r.head == ES_NONE);
  CHECK(r.created_at == 3 && r.updated_at == 4);
  es_ref_destroy(&r);
  /* Replaced in place of the old one (insert or replace). */
  CHECK_RC(ref_put(t, "a", "s5", 3, 11), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->ref_get(BK(t), t, "a", &r, &err), ES_OK);
  CHECK(strcmp(r.session, "s5") == 0 && r.created_at == 3 && r.updated_at == 11);
  r.name[0] = 'Z'; /* owned by the caller */
  es_ref_destroy(&r);
  CHECK_RC(OPS->ref_get(BK(t), t, "a", &r, &err), ES_OK);
  CHECK(strcmp(r.name, "a") == 0);
  es_ref_destroy(&r);
  CHECK_RC(OPS->ref_get(BK(t), t, "ab", &r, &err), ES_OK);
  CHECK(strcmp(r.session, "") == 0);
  es_ref_destroy(&r);
  CHECK_RC(OPS->ref_get(BK(t), t, "a/", &r, &err), ES_NOT_FOUND);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s5 a/1=s4 ab= b=s1 ~=s3 ")) == 0);
  CHECK(strcmp(refs(t, "a", ES_NONE, &c), hs(0, "a/1=s4 ab= b=s1 ~=s3 ")) == 0);
  CHECK(strcmp(refs(t, "a0", 2, &c), "ab= b=s1 ") == 0);
  CHECK(strcmp(refs(t, "", 1, &c), "a=s5 ") == 0);
  CHECK(strcmp(refs(t, NULL, ES_MAX_LIMIT, &c), hs(0, "a=s5 a/1=s4 ab= b=s1 ~=s3 ")) == 0);
  CHECK(strcmp(refs(t, NULL, 0, &c), "") == 0);
  CHECK(strcmp(refs(t, HI, ES_NONE, &c), "") == 0);
  c.stop_at = 3;
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), "a=s5 a/1=s4 ab= ") == 0);
  c.stop_at = 0;
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK); /* the core writes nothing before one */
  CHECK_RC(ref_del(t, "ab"), ES_OK);
  CHECK_RC(ref_del(t, "ab"), ES_NOT_FOUND);
  CHECK_RC(ref_del(t, "nope"), ES_NOT_FOUND);
  CHECK_RC(OPS->ref_get(BK(t), t, "ab", &r, &err), ES_NOT_FOUND);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s5 a/1=s4 b=s1 ~=s3 ")) == 0);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);

  /* Undo: every kind of ref write, nested, restores the exact list (an
   * outer savepoint first: the core writes nothing outside one). */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(ref_put(t, "a", "s6", 3, 12), ES_OK);
  CHECK_RC(ref_del(t, "b"), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(ref_put(t, "b", "s7", 13, 13), ES_OK);
  CHECK_RC(ref_put(t, "b", "s8", 13, 14), ES_OK);
  CHECK_RC(ref_del(t, "a/1"), ES_OK);
  CHECK_RC(ref_put(t, "c", "s9", 15, 15), ES_OK);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s6 b=s8 c=s9 ~=s3 ")) == 0);
  OPS->savepoint_rollback(BK(t), t);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s6 a/1=s4 ~=s3 ")) == 0);
  OPS->savepoint_rollback(BK(t), t);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s5 a/1=s4 b=s1 ~=s3 ")) == 0);
  CHECK_RC(ref_del(t, "a"), ES_OK);
  CHECK_RC(ref_put(t, "a", "s10", 16, 16), ES_OK);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &c), hs(0, "a=s5 a/1=s4 b=s1 ~=s3 ")) == 0);
  OPS->read_end(BK(t), t);

  /* Beyond one walk chunk. */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(ref_del(t, HI), ES_OK); /* the only name after "r" */
  for (int i = 0; i < 100; i++) {
    char name[16];
    snprintf(name, sizeof name, "r%03d", i);
    CHECK_RC(ref_put(t, name, "s", i, i), ES_OK);
  }
  refs(t, "r", ES_NONE, &c);
  CHECK(c.calls == 100 && strncmp(c.s, "r000=s r001=s ", 14) == 0);
  refs(t, "r049", 60, &c);
  CHECK(c.calls == 50 && strncmp(c.s, "r050=s ", 7) == 0);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);
}

/* Moved from sqlite_backend_test.c: inserted in reverse, listed in byte
 * order; head never stored; no prefix match; after need not be a ref; a
 * replace keeping ES_NONE times, deletes, a savepoint undoing puts,
 * replaces and deletes, a released one's delete committed. Its
 * read-transaction writes, a reader beside the write and reopening the file
 * stay in sqlite_backend_test.c. */
static void case_refs_fixture(es_backend *b) {
  es_err err = {0};
  rtext c = {.n = 0};
  es_ref ref, got;
  /* in byte order; inserted in reverse ('~' is HI) */
  static const char *const rnames[] = {"main", "main%", "main/x", "main_", "prod", "prod~", "~"};
  const int nn = (int)(sizeof rnames / sizeof rnames[0]);
  es_txn *t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  int ok = 1;
  for (int i = nn - 1; i >= 0; i--) {
    char sess[16];
    es_ref_init(&ref);
    snprintf(sess, sizeof sess, "s%d", i);
    ref.name = (char *)hs(0, rnames[i]);
    ref.session = sess;
    ref.head = 999; /* never stored */
    ref.created_at = 10 + i;
    ref.updated_at = 20 + i;
    ok &= OPS->ref_put(BK(t), t, &ref, &err) == ES_OK;
  }
  CHECK(ok); /* ref_put (insert) */
  es_ref_init(&got);
  /* ref_get inside the write transaction; head is not stored (ES_NONE) */
  CHECK(OPS->ref_get(BK(t), t, "main/x", &got, &err) == ES_OK && str_eq(got.name, "main/x") &&
        str_eq(got.session, "s2") && got.created_at == 12 && got.updated_at == 22 &&
        got.head == ES_NONE);
  es_ref_destroy(&got);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  commit(t);

  t = rbegin(b);
  CHECK(OPS->ref_get(BK(t), t, hs(0, "prod~"), &got, &err) == ES_OK && str_eq(got.session, "s5") &&
        got.head == ES_NONE);
  es_ref_destroy(&got);
  /* unknown is ES_NOT_FOUND (no prefix match) */
  CHECK(OPS->ref_get(BK(t), t, "nope", &got, &err) == ES_NOT_FOUND &&
        OPS->ref_get(BK(t), t, "mai", &got, &err) == ES_NOT_FOUND);
  /* all, in ascending byte order (HI last), head ES_NONE (rtext_cb) */
  refs(t, NULL, ES_NONE, &c);
  CHECK(c.calls == nn);
  CHECK(strcmp(c.s, hs(1, "main=s0 main%=s1 main/x=s2 main_=s3 prod=s4 prod~=s5 ~=s6 ")) == 0);
  refs(t, NULL, ES_MAX_LIMIT, &c); /* a limit of 2^62 is no limit */
  CHECK(c.calls == nn);
  /* name > after, at most limit */
  CHECK(strcmp(refs(t, "main%", 2, &c), "main/x=s2 main_=s3 ") == 0);
  /* after need not be a ref */
  refs(t, "n", ES_NONE, &c);
  CHECK(c.calls == 3 && strncmp(c.s, "prod=s4 ", 8) == 0);
  /* after the last, limit 0: nothing */
  CHECK(strcmp(refs(t, HI, ES_NONE, &c), "") == 0 && strcmp(refs(t, NULL, 0, &c), "") == 0);
  c.stop_at = 2; /* a callback returning nonzero stops early */
  refs(t, NULL, ES_NONE, &c);
  CHECK(c.calls == 2);
  c.stop_at = 0;
  OPS->read_end(BK(t), t);

  /* replace, delete, savepoints */
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  es_ref_init(&ref);
  ref.name = (char *)"main";
  ref.session = (char *)"moved";
  ref.created_at = 10;
  ref.updated_at = ES_NONE;
  /* ref_put replaces (ES_NONE times kept) */
  CHECK(OPS->ref_put(BK(t), t, &ref, &err) == ES_OK &&
        OPS->ref_get(BK(t), t, "main", &got, &err) == ES_OK && str_eq(got.session, "moved") &&
        got.created_at == 10 && got.updated_at == ES_NONE);
  es_ref_destroy(&got);
  CHECK(OPS->ref_delete(BK(t), t, "prod", &err) == ES_OK &&
        OPS->ref_get(BK(t), t, "prod", &got, &err) == ES_NOT_FOUND);
  /* absent is ES_NOT_FOUND */
  CHECK(OPS->ref_delete(BK(t), t, "prod", &err) == ES_NOT_FOUND &&
        OPS->ref_delete(BK(t), t, "nope", &err) == ES_NOT_FOUND);
  ok = OPS->savepoint(BK(t), t, &err) == ES_OK;
  ref.name = (char *)"main_";
  ref.session = (char *)"sp";
  ok &= OPS->ref_put(BK(t), t, &ref, &err) == ES_OK;
  ok &= OPS->ref_delete(BK(t), t, "main%", &err) == ES_OK;
  ref.name = (char *)"new";
  ok &= OPS->ref_put(BK(t), t, &ref, &err) == ES_OK;
  OPS->savepoint_rollback(BK(t), t);
  ok &= OPS->ref_get(BK(t), t, "main_", &got, &err) == ES_OK && str_eq(got.session, "s3");
  es_ref_destroy(&got);
  ok &= OPS->ref_get(BK(t), t, "main%", &got, &err) == ES_OK;
  es_ref_destroy(&got);
  ok &= OPS->ref_get(BK(t), t, "new", &got, &err) == ES_NOT_FOUND;
  CHECK(ok); /* savepoint_rollback undoes ref puts, replaces and deletes made in it */
  ok = OPS->savepoint(BK(t), t, &err) == ES_OK;
  ok &= OPS->ref_delete(BK(t), t, HI, &err) == ES_OK;
  ok &= OPS->savepoint_release(BK(t), t, &err) == ES_OK;
  ok &= OPS->savepoint_release(BK(t), t, &err) == ES_OK;
  CHECK(ok && OPS->write_commit(BK(t), t, &err) == ES_OK); /* a released savepoint's delete commits */
  t = rbegin(b);
  /* after commit: the replace and both deletes, nothing of the rolled-back savepoint */
  refs(t, NULL, ES_NONE, &c);
  CHECK(c.calls == nn - 2 && strncmp(c.s, "main=moved ", 11) == 0 &&
        strcmp(c.s + c.n - strlen(hs(0, "prod~=s5 ")), hs(0, "prod~=s5 ")) == 0);
  OPS->read_end(BK(t), t);
}

/* ---- event_copy: the dispatch record is es_event_settle_copy's ------------- */

static int next_id(void *ctx, char *out, size_t cap, es_err *err) {
  (void)err;
  int *n = ctx;
  snprintf(out, cap, "copy-%d", ++*n);
  return ES_OK;
}

static int str_same(const char *a, const char *b) {
  return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* got's dispatch record is want's, field by field. */
static void same_dispatch(const es_event *got, const es_event *want) {
  CHECK(got->status == want->status && got->attempts == want->attempts &&
        got->failures == want->failures && str_same(got->last_error, want->last_error));
  CHECK(got->processed_at == want->processed_at && str_same(got->claim_holder, want->claim_holder) &&
        got->claim_expires_at == want->claim_expires_at && got->retry_at == want->retry_at);
  CHECK(got->queued == want->queued && got->due_at == want->due_at &&
        got->last_failed_attempt == want->last_failed_attempt && got->returned == want->returned);
  CHECK(got->first_claimed_at == want->first_claimed_at &&
        got->last_claimed_at == want->last_claimed_at && got->failed_at == want->failed_at &&
        got->processed_by_attempt == want->processed_by_attempt);
}

/* Into e: session's row at index i (id "<session>-<i>" written into id,
 * at least 24 bytes), claimed by attempt 2 after a failed first one. */
static void claimed_row(es_event *e, const char *session, int64_t i, char *id, const char *lane) {
  es_event_init(e);
  snprintf(id, 24, "%s-%lld", session, (long long)i);
  e->session = (char *)session;
  e->index = i;
  e->id = id;
  e->type = "t";
  e->payload = "{}";
  e->payload_len = 2;
  e->lane = (char *)lane;
  e->created_at = 100;
  e->status = ES_STATUS_PENDING;
  e->attempts = 2;
  e->failures = 1;
  e->last_error = "boom";
  e->claim_holder = "worker";
  e->claim_expires_at = 900;
  e->queued = 1;
  e->due_at = 900;
  e->last_failed_attempt = 1;
  e->returned = 0;
  e->first_claimed_at = 200;
  e->last_claimed_at = 300;
  e->failed_at = 250;
}

static void case_event_copy(es_backend *b) {
  es_txn *t = wbegin(b);
  es_err err;
  for (int i = 1; i <= 3; i++) {
    /* a source row with every dispatch field set, none of which a copy keeps */
    es_event e;
    char id[24];
    claimed_row(&e, "src", i, id, i == 2 ? "ln" : NULL);
    e.payload = "{\"i\":1}";
    e.payload_len = strlen(e.payload);
    e.created_at = 100 + i;
    e.cause_index = i > 1 ? i - 1 : ES_NONE;
    e.cause_attempt = i > 1 ? 1 : ES_NONE;
    e.not_before = 150;
    e.status = i == 3 ? ES_STATUS_DEAD : ES_STATUS_PENDING;
    e.retry_at = 800;
    e.due_at = 800;
    e.returned = 2;
    e.failed_at = 400;
    e.processed_by_attempt = 2;
    CHECK_RC(OPS->event_insert(BK(t), t, &e, &err), ES_OK);
  }
  int n = 0;
  int64_t copied = 0;
  CHECK_RC(OPS->event_copy(BK(t), t, "src", 2, "dst", 77, next_id, &n, &copied, &err), ES_OK);
  CHECK(copied == 2 && n == 2);
  for (int i = 1; i <= 3; i++) {
    es_event src, got;
    CHECK_RC(OPS->event_get(BK(t), t, "src", i, &src, &err), ES_OK);
    int rc = OPS->event_get(BK(t), t, "dst", i, &got, &err);
    if (i == 3) {
      CHECK(rc == ES_NOT_FOUND); /* beyond `through` */
      es_event_destroy(&src);
      continue;
    }
    CHECK(rc == ES_OK);
    if (rc != ES_OK) {
      es_event_destroy(&src);
      continue;
    }
    es_event want = src; /* borrows src's strings */
    es_event_settle_copy(&want, 77);
    same_dispatch(&got, &want);
    /* what a copy keeps of its source, and its origin */
    CHECK(str_same(got.type, src.type) && got.payload_len == src.payload_len &&
          memcmp(got.payload, src.payload, src.payload_len) == 0 && str_same(got.lane, src.lane));
    CHECK(got.created_at == src.created_at && got.cause_index == src.cause_index &&
          got.cause_attempt == src.cause_attempt && got.not_before == src.not_before &&
          str_same(got.key, src.key));
    CHECK(str_same(got.origin_session, "src") && got.origin_index == i && got.position > 0);
    char id[24];
    snprintf(id, sizeof id, "copy-%d", i);
    CHECK(str_same(got.id, id));
    es_event_destroy(&got);
    es_event_destroy(&src);
  }
  OPS->write_rollback(BK(t), t);
}

/* ---- event_complete: es_rule_owns's checks, es_event_complete_record's row -- */

/* A claimed row of session "c" at index i with a failure behind it. */
static void put_claimed(es_txn *t, int64_t i, const char *lane, es_err *err) {
  es_event e;
  char id[24];
  claimed_row(&e, "c", i, id, lane);
  CHECK_RC(OPS->event_insert(BK(t), t, &e, err), ES_OK);
}

static void case_event_complete(es_backend *b) {
  es_txn *t = wbegin(b);
  es_err err;
  put_claimed(t, 1, NULL, &err);
  put_claimed(t, 2, "ln", &err); /* laned: left to the core's general path */
  put_claimed(t, 3, NULL, &err);
  es_event no_claim;
  CHECK_RC(OPS->event_get(BK(t), t, "c", 3, &no_claim, &err), ES_OK);
  free(no_claim.claim_holder);
  no_claim.claim_holder = NULL; /* a failed attempt: pending, no claim */
  CHECK_RC(OPS->event_update(BK(t), t, &no_claim, &err), ES_OK);
  put_claimed(t, 4, NULL, &err);
  es_event frozen;
  CHECK_RC(OPS->event_get(BK(t), t, "c", 4, &frozen, &err), ES_OK);
  frozen.returned = -3; /* a shard move's frozen row (es_sh_encode_frozen) */
  CHECK_RC(OPS->event_update(BK(t), t, &frozen, &err), ES_OK);
  es_event before[5];
  for (int i = 1; i <= 4; i++) CHECK_RC(OPS->event_get(BK(t), t, "c", i, &before[i], &err), ES_OK);
  /* none of these match: another attempt, a laned row, no claim, frozen, no row */
  struct { int64_t index, attempt; } miss[] = {{1, 1}, {1, 3}, {2, 2}, {3, 2}, {4, 2}, {9, 2}};
  for (size_t k = 0; k < sizeof miss / sizeof miss[0]; k++) {
    int done = 1;
    CHECK_RC(OPS->event_complete(BK(t), t, "c", miss[k].index, miss[k].attempt, 0, 777, &done, &err),
             ES_OK);
    CHECK(done == 0);
  }
  int done = 0;
  /* the attempt returned 3 events (the core inserts them): returned 3 */
  CHECK_RC(OPS->event_complete(BK(t), t, "c", 1, 2, 3, 777, &done, &err), ES_OK);
  CHECK(done == 1);
  for (int i = 1; i <= 4; i++) {
    es_event got;
    CHECK_RC(OPS->event_get(BK(t), t, "c", i, &got, &err), ES_OK);
    es_event want = before[i]; /* borrows before[i]'s strings */
    if (i == 1) es_event_complete_record(&want, 777, 2, 3);
    same_dispatch(&got, &want);
    es_event_destroy(&got);
    es_event_destroy(&before[i]);
  }
  es_event_destroy(&no_claim);
  es_event_destroy(&frozen);
  OPS->write_rollback(BK(t), t);
}

/* ---- main ------------------------------------------------------------------- */

typedef struct bcase {
  const char *name;
  void (*fn)(es_backend *b);
  int needs_copy; /* 1: only where the backend has the optional event_copy; 2: event_complete */
  int bytes;      /* 1: HI is 0xFF, not UTF-8: memory and sqlite only; 0: HI is U+10FFFF */
  const char *pg_bug; /* set: outside backend.h's interface on postgres (said, not run, there) */
} bcase;

int main(void) {
  const char *pg = getenv("ES_PG_URL");
  const es_backend_ops *pg_ops = NULL;
  if (pg && strncmp(pg, "postgresql:", 11) == 0) pg_ops = &es_backend_postgresql;
  else if (pg && strncmp(pg, "postgres:", 9) == 0) pg_ops = &es_backend_postgres;
  target targets[] = {
      {"memory", &es_backend_memory, NULL},
      {"sqlite", &es_backend_sqlite, NULL},
      {"postgres", pg_ops,
       pg ? "ES_PG_URL is not a postgres:// URL" : "ES_PG_URL is not set (make test sets it)"},
  };
  static const bcase cases[] = {
      {"snapshots: put, replace, get, list by reducer", case_snapshots, 0, 0, NULL},
      {"projection rows: put, replace, delete, get, prefix/after/limit listing, drop, savepoints",
       case_projection_rows, 0, 0, NULL},
      {"snapshots: binary and empty states, listing without states, replacing",
       case_snapshots_binary, 0, 0, NULL},
      {"sessions: get, replace, listing by prefix, after and limit", sessions_listing, 0, 0, NULL},
      {"sessions: byte order to U+10FFFF, literal '%' and '_', every field set and unset",
       sessions_fields, 0, 0, NULL},
      {"sessions: the same listing with a 0xFF byte sorting last", sessions_listing, 0, 1, NULL},
      {"sessions: the same byte order, prefix ending in 0xFF and all-0xFF prefix",
       sessions_fields, 0, 1, NULL},
      {"session_children: byte order, after, limits, parents apart, a put that moves a child",
       children_listing, 0, 0, NULL},
      {"session_children: whole rows, lineage fields, replaced rows, savepoint and write rollback",
       case_children_fixture, 0, 0, NULL},
      {"session_children: a savepoint after writes outside any, rolled back, keeps them",
       case_children_savepoint, 0, 0,
       "the first savepoint is virtual: the core writes nothing before it, backend.h"},
      {"session_children: the same with a 0xFF byte sorting last", children_listing, 0, 1, NULL},
      {"session_children: the same rows with 0xFF names", case_children_savepoint, 0, 1, NULL},
      {"lane_next: lowest unprocessed index per (session, lane)", case_lane_next, 0, 0, NULL},
      {"queued_due / queued_next_due: store by (due_at, position), session by index", case_queued,
       0, 0, NULL},
      {"queued_due_type / queued_next_due_type / pending_types: per-type queues and counts",
       case_types, 0, 0, NULL},
      {"dead_list: position order, per session, limits", case_dead, 0, 0, NULL},
      {"lane_next, queued_due, queued_next_due, dead_list over a small fixture",
       case_lanes_queue_dead, 0, 0, NULL},
      {"queued_due_type, queued_next_due_type, pending_types; an update, a rollback",
       case_types_fixture, 0, 0, NULL},
      {"presence: put, get, list by (participant, field), expire", case_presence, 0, 0, NULL},
      {"presence: tombstones, missing rows, expired rows skipped, namespaces apart",
       case_presence_fixture, 0, 0, NULL},
      {"event_insert / event_get / event_get_by_id round-trip every field", case_insert_get, 0, 0,
       NULL},
      {"event_range and event_all: order, bounds, limits", case_range_all, 0, 0, NULL},
      {"event_update rewrites exactly the dispatch fields", case_update, 0, 0, NULL},
      {"last_position: the highest position stored", case_last_position, 0, 0, NULL},
      {"events: every field as written, bounds, last_position, event_update's rules",
       case_events_fixture, 0, 0, NULL},
      {"events: the same with a 0xFF byte in an origin and a NUL byte in a payload",
       case_events_fixture, 0, 1, NULL},
      {"event origins and the new dispatch fields through inserts, updates and every read",
       case_event_fields, 0, 0, NULL},
      {"every event read returns the dispatch times and the origin, in read and write transactions",
       case_event_fields_everywhere, 0, 0, NULL},
      {"refs: put, replace, get, delete, list in byte order, nested savepoints, one walk chunk",
       case_refs, 0, 0, NULL},
      {"refs: the same with a 0xFF byte sorting last", case_refs, 0, 1, NULL},
      {"refs: reverse inserts in byte order, after, limits, replace, delete, savepoints",
       case_refs_fixture, 0, 0, NULL},
      {"refs: the same fixture with 0xFF names", case_refs_fixture, 0, 1, NULL},
      {"counts follow the core's rule (es_counts_move): puts, markers, deletes, savepoints",
       case_counts, 0, 0, NULL},
      {"event_copy writes es_event_settle_copy's dispatch record and the origin", case_event_copy,
       1, 0, NULL},
      {"event_complete: es_rule_owns's checks, es_event_complete_record's row, nothing else",
       case_event_complete, 2, 0, NULL},
  };
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    const target *x = &targets[i];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      char name[256];
      snprintf(name, sizeof name, "%s: %s", x->name, cases[k].name);
      if (!x->ops) {
        char why[320];
        snprintf(why, sizeof why, "%s: %s", name, x->why);
        skip(why);
        continue;
      }
      if (cases[k].needs_copy == 2 && !x->ops->event_complete) {
        /* optional: the core then reads the row and writes es_event_complete_record */
        printf("# %s: no event_complete (optional), nothing to test\n", name);
        continue;
      }
      if (cases[k].needs_copy == 1 && !x->ops->event_copy) {
        /* optional: the core then copies row by row with es_event_settle_copy */
        printf("# %s: no event_copy (optional), nothing to test\n", name);
        continue;
      }
      if (cases[k].pg_bug && x->ops != &es_backend_memory && x->ops != &es_backend_sqlite) {
        printf("# %s: outside the interface here (%s)\n", name, cases[k].pg_bug);
        continue;
      }
      if (cases[k].bytes && x->ops != &es_backend_memory && x->ops != &es_backend_sqlite) {
        printf("# %s: names that are not UTF-8 are outside the interface here\n", name);
        continue;
      }
      OPS = x->ops;
      HI = cases[k].bytes ? "\xff" : MAXCP;
      cur_failed = 0;
      es_backend *b = open_fresh(x, "case");
      if (b) cases[k].fn(b);
      else cur_failed = 1;
      close_fresh(x, b);
      ok(!cur_failed, name);
      fflush(stdout);
    }
  }
  printf("1..%d\n", test_no);
  return tap_done();
}
