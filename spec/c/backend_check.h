/*
 * backend_check.h: what the C tests of the backend ops (backend_test.c,
 * memory_backend_test.c) share: CHECK / CHECK_RC, which note a failure of
 * the running case (cur_failed) with its line, and small collectors of
 * listed sessions and snapshots. The including file defines OPS (the ops
 * under test) before including it, and backend_txn.h's BK.
 */
#ifndef ES_SPEC_BACKEND_CHECK_H
#define ES_SPEC_BACKEND_CHECK_H

#include <stdio.h>
#include <string.h>

#include "backend_txn.h"

static int cur_failed;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      printf("#   %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
      cur_failed = 1;                                                        \
    }                                                                        \
  } while (0)
#define CHECK_RC(call, want)                                                           \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != (want)) {                                                               \
      printf("#   %s:%d: %s returned %s, wanted %s\n", __FILE__, __LINE__, #call,     \
             es_strerror(rc_), es_strerror(want));                                     \
      cur_failed = 1;                                                                  \
    }                                                                                  \
  } while (0)

typedef struct names {
  char v[200][16];
  size_t n;
} names;

static int collect_name(void *ctx, const es_session_info *si) {
  names *c = ctx;
  if (c->n < 200) snprintf(c->v[c->n++], 16, "%s", si->session);
  return 0;
}

static inline names list_sessions(es_txn *t, const char *prefix, const char *after, int64_t limit) {
  names c = {.n = 0};
  es_err err;
  CHECK_RC(OPS->session_list(BK(t), t, prefix, after, limit, collect_name, &c, &err), ES_OK);
  return c;
}

static int snap_put(es_txn *t, const char *s, const char *reducer, int64_t index, const char *state,
                    const char *version) {
  es_snapshot sn;
  es_err err;
  es_snapshot_init(&sn);
  sn.reducer = (char *)reducer;
  sn.index = index;
  sn.state = (char *)state;
  sn.state_len = state ? strlen(state) : 0;
  sn.version = (char *)version;
  sn.updated_at = 70 + index;
  return OPS->snapshot_put(BK(t), t, s, &sn, &err);
}

typedef struct snaps {
  char reducer[8][8];
  int64_t index[8];
  int state_null[8];
  size_t n;
} snaps;

static int collect_snap(void *ctx, const es_snapshot *sn) {
  snaps *c = ctx;
  if (c->n < 8) {
    snprintf(c->reducer[c->n], 8, "%s", sn->reducer);
    c->index[c->n] = sn->index;
    c->state_null[c->n++] = sn->state == NULL;
  }
  return 0;
}

#endif
