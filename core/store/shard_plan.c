/*
 * shard_plan.c: the shard router's plans (docs/contract.md §5, docs/sharding.md):
 * rendezvous hashing of a session over the plan's shards, checking and
 * copying plans, and the catalog that holds them as JSON events. Moved
 * out of shards.c as it was.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "store/internal.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store.h"
#include "util/buf.h"

/* ---- hashing ------------------------------------------------------------ */

uint64_t es_shard_score(const char *key, const char *shard) {
  uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
  h = (h ^ 0) * 0x100000001b3ULL;
  for (const unsigned char *p = (const unsigned char *)shard; *p; p++)
    h = (h ^ *p) * 0x100000001b3ULL;
  /* splitmix64's finaliser: FNV's low bits mix poorly for similar keys */
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

size_t es_shard_owner(const es_shard_plan *p, const char *key) {
  size_t best = 0;
  uint64_t top = 0;
  for (size_t i = 0; i < p->n; i++) {
    uint64_t sc = es_shard_score(key, p->v[i].name);
    /* names are sorted: on a tie the earlier (smaller) name stays */
    if (i == 0 || sc > top) {
      best = i;
      top = sc;
    }
  }
  return best;
}

/* The owner among a list of names (a shard's plan record). */
const char *es_sh_owner_of_names(char *const *names, size_t n, const char *key) {
  const char *best = NULL;
  uint64_t top = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t sc = es_shard_score(key, names[i]);
    if (!best || sc > top || (sc == top && strcmp(names[i], best) < 0)) {
      best = names[i];
      top = sc;
    }
  }
  return best;
}

/* ---- plans -------------------------------------------------------------- */

void es_shard_plan_destroy(es_shard_plan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) {
    free(p->v[i].name);
    free(p->v[i].url);
  }
  free(p->v);
  memset(p, 0, sizeof *p);
}

int es_sh_plan_copy(es_shard_plan *dst, const es_shard_plan *src) {
  memset(dst, 0, sizeof *dst);
  dst->version = src->version;
  dst->v = calloc(src->n ? src->n : 1, sizeof *dst->v);
  if (!dst->v) return ES_STORAGE;
  for (size_t i = 0; i < src->n; i++) {
    dst->v[i].name = strdup(src->v[i].name);
    dst->v[i].url = strdup(src->v[i].url);
    dst->n++;
    if (!dst->v[i].name || !dst->v[i].url) {
      es_shard_plan_destroy(dst);
      return ES_STORAGE;
    }
  }
  return ES_OK;
}

static int cmp_def(const void *a, const void *b) {
  return strcmp(((const es_shard_def *)a)->name, ((const es_shard_def *)b)->name);
}

static int check_shard_name(const char *name, es_err *err) {
  if (!name) return es_fail(err, ES_INVALID_ARGUMENT, "a shard name is missing");
  int rc = es_check_name("shard name", name, err);
  if (rc) return rc;
  size_t n = strlen(name);
  if (n > ES_MAX_SHARD_NAME_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "shard name '%s' is %zu bytes, at most %d allowed",
                   name, n, ES_MAX_SHARD_NAME_BYTES);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20)
      return es_fail(err, ES_INVALID_ARGUMENT, "shard name holds the control byte 0x%02x",
                     (unsigned)(unsigned char)name[i]);
  return ES_OK;
}

int es_shard_plan_check(es_shard_plan *p, es_err *err) {
  if (p->version < 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "plan version must be a positive integer (got %lld)",
                   (long long)p->version);
  if (p->n < 1 || p->n > ES_MAX_SHARDS)
    return es_fail(err, ES_INVALID_ARGUMENT, "a plan has 1 to %d shards (got %zu)", ES_MAX_SHARDS,
                   p->n);
  for (size_t i = 0; i < p->n; i++) {
    int rc = check_shard_name(p->v[i].name, err);
    if (rc) return rc;
    const char *u = p->v[i].url;
    if (!u || !*u)
      return es_fail(err, ES_INVALID_ARGUMENT, "shard '%s' has no url", p->v[i].name);
    if (strncmp(u, "shards:", 7) == 0)
      return es_fail(err, ES_INVALID_ARGUMENT, "shard '%s': a shard cannot itself be shards:",
                     p->v[i].name);
    if (strlen(u) > 4096)
      return es_fail(err, ES_INVALID_ARGUMENT, "shard '%s': url longer than 4096 bytes",
                     p->v[i].name);
  }
  qsort(p->v, p->n, sizeof *p->v, cmp_def);
  for (size_t i = 1; i < p->n; i++)
    if (strcmp(p->v[i - 1].name, p->v[i].name) == 0)
      return es_fail(err, ES_INVALID_ARGUMENT, "shard name '%s' appears twice", p->v[i].name);
  /* one store under two names would hold one session twice over (the
   * same url is caught here; other spellings of one store by its
   * identity when the plan is installed). "memory:" opens a new store
   * each time. */
  for (size_t i = 0; i < p->n; i++)
    for (size_t j = i + 1; j < p->n; j++)
      if (strcmp(p->v[i].url, p->v[j].url) == 0 && strcmp(p->v[i].url, "memory:") != 0)
        return es_fail(err, ES_INVALID_ARGUMENT, "shards '%s' and '%s' have the same url",
                       p->v[i].name, p->v[j].name);
  return ES_OK;
}

int es_sh_plan_same_shards(const es_shard_plan *a, const es_shard_plan *b) {
  if (a->n != b->n) return 0;
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->v[i].name, b->v[i].name) || strcmp(a->v[i].url, b->v[i].url)) return 0;
  return 1;
}

const es_shard_def *es_sh_plan_find(const es_shard_plan *p, const char *name) {
  for (size_t i = 0; p && i < p->n; i++)
    if (strcmp(p->v[i].name, name) == 0) return &p->v[i];
  return NULL;
}

/* ---- the catalog: plans as JSON events ---------------------------------- */

/* {"shards":{name:url,...},"state":state,"version":n}, canonical. The
 * strings are written by the codec's writer. */
static int plan_json(const es_shard_plan *p, const char *state, es_buf *out, es_err *err) {
  es_buf b;
  es_buf_init(&b);
  es_buf_adds(&b, "{\"shards\":{");
  for (size_t i = 0; i < p->n; i++) {
    if (i) es_buf_addc(&b, ',');
    es_json_write_text(&b, p->v[i].name, strlen(p->v[i].name));
    es_buf_addc(&b, ':');
    es_json_write_text(&b, p->v[i].url, strlen(p->v[i].url));
  }
  es_buf_addf(&b, "},\"state\":\"%s\",\"version\":%lld}", state, (long long)p->version);
  int rc = b.oom ? nomem(err) : es_json_canonicalize(b.data, b.len, out, err);
  es_buf_destroy(&b);
  return rc;
}

typedef struct {
  const char *p, *end;
} jcur;

static void jws(jcur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static int jlit(jcur *c, char ch) {
  jws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

int es_sh_hex4(const char *p, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char ch = p[i];
    unsigned d = ch >= '0' && ch <= '9' ? (unsigned)(ch - '0')
                 : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                 : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A' + 10)
                                          : 16u;
    if (d > 15) return 0;
    *v = *v * 16 + d;
  }
  return 1;
}

/* A JSON string (the catalog's own canonical text; its escapes). NULL on
 * a malformed one or no memory. */
static char *jstring(jcur *c) {
  if (!jlit(c, '"')) return NULL;
  es_buf b;
  es_buf_init(&b);
  int bad = 0;
  while (!bad && c->p < c->end && *c->p != '"') {
    char ch = *c->p++;
    if (ch != '\\') {
      bad |= es_buf_addc(&b, ch) != ES_OK;
      continue;
    }
    if (c->p >= c->end) break;
    char e = *c->p++;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      bad |= es_buf_addc(&b, map[simple - "\"\\/bfnrt"]) != ES_OK;
    } else if (e == 'u' && c->end - c->p >= 4) {
      unsigned u;
      if (!es_sh_hex4(c->p, &u)) {
        bad = 1;
        break;
      }
      c->p += 4;
      if (u >= 0xD800 && u < 0xDC00 && c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u') {
        unsigned lo;
        if (!es_sh_hex4(c->p + 2, &lo)) {
          bad = 1;
          break;
        }
        c->p += 6;
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
      }
      char enc[4];
      size_t k;
      if (u < 0x80) {
        enc[0] = (char)u, k = 1;
      } else if (u < 0x800) {
        enc[0] = (char)(0xC0 | (u >> 6)), enc[1] = (char)(0x80 | (u & 63)), k = 2;
      } else if (u < 0x10000) {
        enc[0] = (char)(0xE0 | (u >> 12)), enc[1] = (char)(0x80 | ((u >> 6) & 63));
        enc[2] = (char)(0x80 | (u & 63)), k = 3;
      } else {
        enc[0] = (char)(0xF0 | (u >> 18)), enc[1] = (char)(0x80 | ((u >> 12) & 63));
        enc[2] = (char)(0x80 | ((u >> 6) & 63)), enc[3] = (char)(0x80 | (u & 63)), k = 4;
      }
      bad |= es_buf_add(&b, enc, k) != ES_OK;
    } else {
      bad = 1;
    }
  }
  if (bad || c->p >= c->end) {
    es_buf_destroy(&b);
    return NULL;
  }
  c->p++; /* the closing quote */
  if (es_buf_addc(&b, '\0') != ES_OK) {
    es_buf_destroy(&b);
    return NULL;
  }
  return es_buf_take(&b, NULL);
}

/* Reads a catalog event's payload into *p and its state. */
static int plan_parse(const char *text, size_t len, es_shard_plan *p, int *pending, es_err *err) {
  memset(p, 0, sizeof *p);
  *pending = 0;
  jcur c = {text, text + len};
  int ok = jlit(&c, '{'), have_v = 0;
  size_t cap = 0;
  while (ok && !jlit(&c, '}')) {
    char *key = jstring(&c);
    ok = key && jlit(&c, ':');
    if (ok && strcmp(key, "shards") == 0) {
      ok = jlit(&c, '{');
      while (ok && !jlit(&c, '}')) {
        if (p->n && !jlit(&c, ',')) {
          ok = 0;
          break;
        }
        char *name = jstring(&c);
        char *url = name && jlit(&c, ':') ? jstring(&c) : NULL;
        if (!url || es_grow((void **)&p->v, &cap, p->n + 1, sizeof *p->v)) {
          free(name);
          free(url);
          ok = 0;
          break;
        }
        p->v[p->n].name = name;
        p->v[p->n].url = url;
        p->n++;
      }
    } else if (ok && strcmp(key, "state") == 0) {
      char *st = jstring(&c);
      ok = st != NULL;
      if (ok) *pending = strcmp(st, "pending") == 0;
      free(st);
    } else if (ok && strcmp(key, "version") == 0) {
      jws(&c);
      char *end = NULL;
      errno = 0;
      long long v = strtoll(c.p, &end, 10);
      ok = end && end > c.p && end <= c.end && errno == 0;
      if (ok) {
        p->version = v;
        c.p = end;
        have_v = 1;
      }
    } else {
      ok = 0;
    }
    free(key);
    if (ok && !jlit(&c, ',')) {
      ok = jlit(&c, '}');
      break;
    }
  }
  if (ok && have_v && es_shard_plan_check(p, err) == ES_OK) return ES_OK;
  es_shard_plan_destroy(p);
  return es_fail(err, ES_STORAGE, "the shard catalog holds a plan that does not read back");
}


void es_sh_view_destroy(catalog_view *v) {
  es_shard_plan_destroy(&v->cur);
  es_shard_plan_destroy(&v->pend);
}

int es_sh_catalog_load(es_store *cat, catalog_view *v, es_err *err) {
  memset(v, 0, sizeof *v);
  es_events evs = {0};
  /* a plan change is rare: reading every plan event stays cheap */
  int rc = es_store_read(cat, CATALOG_SESSION, 0, ES_NONE, ES_NONE, &evs, err);
  for (size_t i = evs.n; rc == ES_OK && i-- > 0;) {
    es_shard_plan p;
    int pending;
    rc = plan_parse(evs.v[i].payload, evs.v[i].payload_len, &p, &pending, err);
    if (rc) break;
    if (i + 1 == evs.n) v->head = evs.v[i].index;
    if (pending && i + 1 == evs.n) {
      v->pend = p;
    } else if (!pending) {
      v->cur = p;
      break;
    } else {
      es_shard_plan_destroy(&p);
    }
  }
  es_events_destroy(&evs);
  if (rc) es_sh_view_destroy(v);
  /* a pending plan no newer than the current one is history */
  if (rc == ES_OK && v->pend.version && v->pend.version <= v->cur.version)
    es_shard_plan_destroy(&v->pend);
  return rc;
}

/* Appends one settled event (nothing to dispatch) of `type` with the
 * canonical JSON in text to the catalog's `session`; head: ES_NONE, or
 * the head to compare-and-set on. */
static int catalog_append(es_store *cat, const char *session, const char *type, es_buf *text,
                          int64_t head, es_err *err) {
  es_new_event ev;
  es_new_event_init(&ev);
  ev.type = type;
  ev.payload = es_buf_cstr(text);
  ev.payload_len = text->len;
  ev.settled = 1;
  int pending = 0;
  return es_store_append(cat, session, &ev, 1, head, ES_NONE, NULL, &pending, err);
}

/* Appends a plan event with compare-and-set on the head: ES_OK, or
 * WRONG_EXPECTED_HEAD when another process installed one first. */
int es_sh_catalog_put(es_store *cat, const es_shard_plan *p, const char *state, int64_t head,
                      es_err *err) {
  es_buf text;
  es_buf_init(&text);
  int rc = plan_json(p, state, &text, err);
  if (rc == ES_OK)
    rc = catalog_append(cat, CATALOG_SESSION,
                        strcmp(state, "pending") == 0 ? "plan_pending" : "plan", &text, head, err);
  es_buf_destroy(&text);
  return rc;
}

/* ---- shredded key names ------------------------------------------------------ */

/* §3.10 on a sharded store: every key name shredded through the router,
 * one event each (payload: the name as a JSON string) in the catalog's
 * session SHREDDED_SESSION. A shard that joins the fleet later is given a
 * tombstone for each (run_moves), so a name burnt by shred stays burnt
 * on every shard a session may land on. */
int es_sh_catalog_shredded_put(es_store *cat, const char *name, es_err *err) {
  es_buf text, raw;
  es_buf_init(&text);
  es_buf_init(&raw);
  es_json_write_text(&raw, name, strlen(name));
  int rc = raw.oom ? nomem(err) : es_json_canonicalize(raw.data, raw.len, &text, err);
  es_buf_destroy(&raw);
  if (rc == ES_OK) rc = catalog_append(cat, SHREDDED_SESSION, "shredded", &text, ES_NONE, err);
  es_buf_destroy(&text);
  return rc;
}

int es_sh_catalog_shredded_each(es_store *cat, int (*fn)(void *ctx, const char *name, es_err *err),
                                void *ctx, es_err *err) {
  int64_t after = 0;
  for (;;) {
    es_events evs = {0};
    int rc = es_store_read(cat, SHREDDED_SESSION, after, ES_NONE, 1000, &evs, err);
    for (size_t i = 0; rc == ES_OK && i < evs.n; i++) {
      jcur c = {evs.v[i].payload, evs.v[i].payload + evs.v[i].payload_len};
      char *name = evs.v[i].payload ? jstring(&c) : NULL;
      rc = name ? fn(ctx, name, err)
                : es_fail(err, ES_STORAGE, "the shard catalog's shredded key %lld is not a name",
                          (long long)evs.v[i].index);
      free(name);
      after = evs.v[i].index;
    }
    size_t n = evs.n;
    es_events_destroy(&evs);
    if (rc || n < 1000) return rc;
  }
}
