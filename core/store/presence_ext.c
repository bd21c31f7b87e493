/*
 * presence_ext.c: §3.6 presence patches written by other processes reach
 * this handle's presence watches (es_store_presence_watch: the Lua
 * presence_subscribe, the HTTP presence streams) on backends shared
 * between processes (sqlite:, postgres:).
 *
 * A write made through this handle tells its watches itself, after its
 * commit (presence.c). Another process's write is seen here: while a
 * namespace has a watch, the handle keeps the namespace's rows as last
 * seen (tombstones included, sorted by participant and field), and when
 * wakes.c's ext_watch thread sees another process commit (postgres: a
 * NOTIFY, which every write commit sends; sqlite: data_version), the rows
 * are read again and every row that is new or changed (value, at, seen,
 * expires_at) is handed to the watches as a patch, exactly what a write
 * that won those fields gives. A row that expired is gone from the read
 * and gives no patch (expiry is not a change, docs/http-live.md). The
 * handle's own writes update the rows as seen before they tell the
 * watches, so they are not told twice; and an own write's rows that are
 * already seen as they are were handed over by that thread (it can read
 * the write between its commit and es_presence_ext_own: the backend
 * learns that a commit was its own only after it), so the write tells
 * only the others.
 *
 * The ext_watch thread runs only while the handle has a wait key: a
 * watched namespace holds one (PRESENCE_KEY, a name no session can start
 * with, so no commit of this handle wakes it; nothing sleeps on it).
 *
 * Cost: each commit of another process re-reads each watched namespace
 * (presence is small state, and a namespace is read by index). Under pmu
 * throughout, so patches reach the watches in commit order: a write of
 * this handle committed after the re-read tells its watches after the
 * patches of the re-read.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "store/internal.h"
#include "store/rules.h"

/* Not valid UTF-8, so no session name starts with it (names.c). */
#define PRESENCE_KEY "\xff presence"

struct presence_seen {
  char *ns;
  int watches;                /* watches of this handle on ns */
  int known;                  /* rows were read (a failed first read leaves it 0) */
  es_presence_rows rows;      /* as last seen, sorted by (participant, field) */
  struct presence_seen *next;
};

static int key_cmp(const es_presence_row *a, const es_presence_row *b) {
  int c = strcmp(a->participant, b->participant);
  return c ? c : strcmp(a->field, b->field);
}

static int row_qcmp(const void *a, const void *b) { return key_cmp(a, b); }

static int same_row(const es_presence_row *a, const es_presence_row *b) {
  if (a->at != b->at || a->seen != b->seen || a->expires_at != b->expires_at) return 0;
  if (!a->value || !b->value) return a->value == b->value;
  return a->value_len == b->value_len && memcmp(a->value, b->value, a->value_len) == 0;
}

static int collect_all(void *ctx, const es_presence_row *row) {
  collector *c = ctx;
  if (es_presence_push(c->list, row) == ES_OK) return 0;
  c->oom = 1;
  return 1;
}

typedef struct {
  const char *ns;
  int64_t now;
  es_presence_rows *out;
} read_args;

static int do_read(es_store *s, es_txn *t, void *arg, es_err *err) {
  read_args *a = arg;
  collector c = {a->out, 0};
  return es_rule_collected(s->ops->presence_list(s->bk, t, a->ns, a->now, collect_all, &c, err), &c,
                           err);
}

/* Every live row of ns, tombstones included, sorted. */
static int read_rows(es_store *s, const char *ns, es_presence_rows *out) {
  es_err err = {0};
  memset(out, 0, sizeof *out);
  int rc = es_core_enter(s, &err);
  if (rc) return rc;
  read_args a = {ns, 0, out};
  rc = es_store_now(s, &a.now, &err);
  if (rc == ES_OK) rc = es_core_read(s, do_read, &a, &err);
  es_core_leave(s);
  if (rc) es_presence_rows_destroy(out);
  else if (out->n > 1) qsort(out->v, out->n, sizeof *out->v, row_qcmp);
  return rc;
}

static struct presence_seen *find_seen(es_store *s, const char *ns) {
  struct presence_seen *p = s->pseen;
  while (p && strcmp(p->ns, ns) != 0) p = p->next;
  return p;
}

void es_presence_ext_watched(es_store *s, const char *ns) {
  if (!s->ops->ext_version) return; /* one process only (memory:) */
  wait_key *key = es_core_wait_key_get(s, PRESENCE_KEY);
  if (!key) return; /* out of memory: other processes' writes show in the next read only */
  es_err err = {0};
  es_core_ext_start(s, &err); /* failing: the same */
  pthread_mutex_lock(&s->pmu);
  struct presence_seen *p = find_seen(s, ns);
  if (!p && (p = calloc(1, sizeof *p)) != NULL) {
    if (!(p->ns = strdup(ns))) {
      free(p);
      p = NULL;
    } else {
      p->known = read_rows(s, ns, &p->rows) == ES_OK;
      p->next = s->pseen;
      s->pseen = p;
    }
  }
  if (p) p->watches++;
  /* One key for the handle, held while any namespace is watched. */
  int keep = p && !s->pkey;
  if (keep) s->pkey = key;
  pthread_mutex_unlock(&s->pmu);
  if (!keep) es_core_wait_key_put(s, key);
}

void es_presence_ext_unwatched(es_store *s, const char *ns) {
  wait_key *drop = NULL;
  pthread_mutex_lock(&s->pmu);
  for (struct presence_seen **pp = &s->pseen; *pp; pp = &(*pp)->next) {
    struct presence_seen *p = *pp;
    if (strcmp(p->ns, ns) != 0) continue;
    if (--p->watches == 0) {
      *pp = p->next;
      es_presence_rows_destroy(&p->rows);
      free(p->ns);
      free(p);
    }
    break;
  }
  if (!s->pseen) {
    drop = s->pkey;
    s->pkey = NULL;
  }
  pthread_mutex_unlock(&s->pmu);
  if (drop) es_core_wait_key_put(s, drop);
}

/* Where row's (participant, field) is or would go in the sorted rows. */
static size_t seen_at(const es_presence_rows *rows, const es_presence_row *row) {
  size_t lo = 0, hi = rows->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (key_cmp(&rows->v[mid], row) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Replaces or inserts row in the sorted rows (out of memory: forgotten,
 * so the next change of another process reports it again, harmless). */
static void seen_put(es_presence_rows *rows, const es_presence_row *row) {
  size_t lo = seen_at(rows, row);
  es_presence_row copy;
  if (es_presence_row_copy(&copy, row)) return;
  if (lo < rows->n && key_cmp(&rows->v[lo], row) == 0) {
    es_presence_row_destroy(&rows->v[lo]);
    rows->v[lo] = copy;
    return;
  }
  if (es_grow((void **)&rows->v, &rows->cap, rows->n + 1, sizeof *rows->v)) {
    es_presence_row_destroy(&copy);
    return;
  }
  memmove(&rows->v[lo + 1], &rows->v[lo], (rows->n - lo) * sizeof *rows->v);
  rows->v[lo] = copy;
  rows->n++;
}

void es_presence_ext_own(es_store *s, const char *ns, const es_presence_rows *applied,
                         es_presence_rows *fresh, const es_presence_rows **give) {
  struct presence_seen *p = s->pseen ? find_seen(s, ns) : NULL;
  *give = applied;
  if (!p || !p->known) return;
  /* out of memory: every row is told (at worst one twice) */
  fresh->v = malloc((applied->n ? applied->n : 1) * sizeof *fresh->v);
  fresh->n = 0;
  fresh->cap = applied->n;
  for (size_t i = 0; i < applied->n; i++) {
    const es_presence_row *row = &applied->v[i];
    size_t at = seen_at(&p->rows, row);
    int told = at < p->rows.n && key_cmp(&p->rows.v[at], row) == 0 && same_row(&p->rows.v[at], row);
    if (fresh->v && !told) fresh->v[fresh->n++] = *row;
    seen_put(&p->rows, row);
  }
  if (fresh->v) *give = fresh;
}

/* The rows of now that are not in seen as they are (both sorted). */
static int changed_rows(const es_presence_rows *seen, const es_presence_rows *now,
                        es_presence_rows *out) {
  size_t i = 0;
  for (size_t j = 0; j < now->n; j++) {
    while (i < seen->n && key_cmp(&seen->v[i], &now->v[j]) < 0) i++;
    if (i < seen->n && key_cmp(&seen->v[i], &now->v[j]) == 0 && same_row(&seen->v[i], &now->v[j]))
      continue;
    if (es_presence_push(out, &now->v[j])) return ES_STORAGE;
  }
  return ES_OK;
}

/* Hands changed (sorted by participant, field) to the watches of ns one
 * write at a time, as an in-process write reaches them: the rows of one
 * participant with one (at, seen). A watch's patch is one participant's
 * fields (§3.6 `{participant, values, seen, at}`), so rows of several
 * participants in one callback would be read as the first one's. The
 * groups borrow the rows. */
static void deliver_writes(es_store *s, const char *ns, const es_presence_rows *changed) {
  es_presence_row *group = malloc(changed->n * sizeof *group);
  char *done = calloc(changed->n, 1);
  if (group && done) {
    for (size_t i = 0; i < changed->n;) {
      size_t j = i;
      while (j < changed->n && strcmp(changed->v[j].participant, changed->v[i].participant) == 0) j++;
      for (size_t a = i; a < j; a++) {
        if (done[a]) continue;
        es_presence_rows g = {group, 0, changed->n};
        for (size_t b = a; b < j; b++)
          if (!done[b] && changed->v[b].at == changed->v[a].at && changed->v[b].seen == changed->v[a].seen) {
            group[g.n++] = changed->v[b];
            done[b] = 1;
          }
        for (presence_watch *w = s->watches; w; w = w->next)
          if (strcmp(w->ns, ns) == 0) w->cb(w->ctx, ns, &g);
      }
      i = j;
    }
  }
  free(group);
  free(done);
}

void es_presence_ext_change(es_store *s) {
  pthread_mutex_lock(&s->pmu);
  for (struct presence_seen *p = s->pseen; p; p = p->next) {
    es_presence_rows now;
    if (read_rows(s, p->ns, &now)) continue; /* the next change reads again */
    es_presence_rows changed = {0};
    int rc = p->known ? changed_rows(&p->rows, &now, &changed) : ES_OK;
    es_presence_rows_destroy(&p->rows);
    p->rows = now;
    p->known = 1;
    if (rc == ES_OK && changed.n) deliver_writes(s, p->ns, &changed);
    es_presence_rows_destroy(&changed);
  }
  pthread_mutex_unlock(&s->pmu);
}

void es_presence_ext_free(es_store *s) {
  struct presence_seen *p = s->pseen;
  while (p) {
    struct presence_seen *next = p->next;
    es_presence_rows_destroy(&p->rows);
    free(p->ns);
    free(p);
    p = next;
  }
  s->pseen = NULL;
  if (s->pkey) es_core_wait_key_put(s, s->pkey);
  s->pkey = NULL;
}
