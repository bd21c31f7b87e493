/*
 * json_doc.c: strict JSON read into a tree (json_doc.h), on the codec's
 * own scanner (json_scan.h), so strings and numbers are read exactly
 * as every other face of the codec reads them.
 *
 * The text is first checked by es_json_validate: acceptance and error
 * messages are then es_json_validate's by construction (not a second
 * implementation of the duplicate-key rule that could drift), and the tree
 * builder below only ever sees valid JSON. Bodies are bounded by the
 * caller (the HTTP server's max_body), so reading twice costs little.
 *
 * Children of an array or object are gathered on one scratch stack shared
 * by every nesting level (as the canonicalizer's members) and copied into
 * the arena when their container closes, so each container's items are
 * one contiguous array.
 */
#include "codec/json_doc.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_scan.h"

/* The arena ---------------------------------------------------------------- */

typedef struct chunk {
  struct chunk *next;
  size_t used, cap;
  alignas(max_align_t) unsigned char data[];
} chunk;

#define CHUNK_MIN 16384

struct es_json_doc {
  chunk *chunks;  /* newest first */
  es_jval root;
};

static void *arena_alloc(es_json_doc *d, size_t n) {
  const size_t align = alignof(max_align_t);
  n = (n + align - 1) & ~(align - 1);
  if (n == 0) n = align;
  chunk *c = d->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK_MIN ? n : CHUNK_MIN;
    if (cap > SIZE_MAX - sizeof *c) return NULL;
    c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->used = 0;
    c->cap = cap;
    c->next = d->chunks;
    d->chunks = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}

/* A NUL-terminated copy of s[0..n) in the arena. */
static char *arena_str(es_json_doc *d, const char *s, size_t n) {
  if (n == SIZE_MAX) return NULL;
  char *p = arena_alloc(d, n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

/* The builder ------------------------------------------------------------- */

typedef struct slot {
  es_jval v;
  const char *key; /* arena copy (objects' members) */
  size_t klen;
} slot;

typedef struct builder {
  esj_parser P;
  es_json_doc *doc;
  es_buf str;    /* decoded strings with escapes (the scanner's dst) */
  slot *stack;   /* children of the open containers */
  size_t len, cap;
} builder;

static int push_slot(builder *b, const slot *s) {
  if (b->len == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    slot *v = realloc(b->stack, cap * sizeof *v);
    if (!v) return esj_fail_oom(&b->P);
    b->stack = v;
    b->cap = cap;
  }
  b->stack[b->len++] = *s;
  return ES_OK;
}

/* A string at P->p, decoded into the arena. */
static int read_string(builder *b, const char **s, size_t *n) {
  const char *raw;
  size_t rn;
  int copied, rc;
  b->str.len = 0;
  if ((rc = esj_parse_string(&b->P, &b->str, &raw, &rn, &copied)) != ES_OK) return rc;
  if (!(*s = arena_str(b->doc, raw, rn))) return esj_fail_oom(&b->P);
  *n = rn;
  return ES_OK;
}

static int read_value(builder *b, es_jval *v);

/* Moves the children stacked since base into the arena as v's items. */
static int close_container(builder *b, es_jval *v, size_t base, int object) {
  size_t n = b->len - base;
  v->n = n;
  v->items = NULL;
  v->keys = NULL;
  v->key_lens = NULL;
  if (n) {
    if (n > SIZE_MAX / sizeof *v->items) return esj_fail_oom(&b->P);
    v->items = arena_alloc(b->doc, n * sizeof *v->items);
    if (!v->items) return esj_fail_oom(&b->P);
    if (object) {
      v->keys = arena_alloc(b->doc, n * sizeof *v->keys);
      v->key_lens = arena_alloc(b->doc, n * sizeof *v->key_lens);
      if (!v->keys || !v->key_lens) return esj_fail_oom(&b->P);
    }
    for (size_t k = 0; k < n; k++) {
      v->items[k] = b->stack[base + k].v;
      if (object) {
        v->keys[k] = b->stack[base + k].key;
        v->key_lens[k] = b->stack[base + k].klen;
      }
    }
  }
  b->len = base;
  return ES_OK;
}

static int read_object(builder *b, es_jval *v) {
  esj_parser *P = &b->P;
  size_t base = b->len;
  int rc;
  v->type = ES_JOBJECT;
  P->p++; /* '{' */
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == '}') {
    P->p++;
    return close_container(b, v, base, 1);
  }
  for (;;) {
    slot s;
    memset(&s, 0, sizeof s);
    if (P->p >= P->end || *P->p != '"') return esj_fail_unexpected(P, "a string key");
    if ((rc = read_string(b, &s.key, &s.klen)) != ES_OK) return rc;
    esj_skip_ws(P);
    if (P->p >= P->end || *P->p != ':') return esj_fail_unexpected(P, "':'");
    P->p++;
    if ((rc = read_value(b, &s.v)) != ES_OK) return rc;
    if ((rc = push_slot(b, &s)) != ES_OK) return rc;
    int more;
    if ((rc = esj_next_element(P, '}', &more)) != ES_OK) return rc;
    if (!more) break;
  }
  return close_container(b, v, base, 1);
}

static int read_array(builder *b, es_jval *v) {
  esj_parser *P = &b->P;
  size_t base = b->len;
  int rc;
  v->type = ES_JARRAY;
  P->p++; /* '[' */
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == ']') {
    P->p++;
    return close_container(b, v, base, 0);
  }
  for (;;) {
    slot s;
    memset(&s, 0, sizeof s);
    if ((rc = read_value(b, &s.v)) != ES_OK) return rc;
    if ((rc = push_slot(b, &s)) != ES_OK) return rc;
    int more;
    if ((rc = esj_next_element(P, ']', &more)) != ES_OK) return rc;
    if (!more) break;
  }
  return close_container(b, v, base, 0);
}

/* Reads the value at P->p (after white space) into v. Depth needs no
 * check of its own: es_json_validate refused anything deeper than
 * ES_JSON_MAX_DEPTH, which bounds this recursion. */
static int read_value(builder *b, es_jval *v) {
  esj_parser *P = &b->P;
  int rc = ES_OK;
  memset(v, 0, sizeof *v);
  esj_skip_ws(P);
  if (P->p >= P->end) return esj_fail_unexpected(P, "a JSON value");
  const unsigned char *start = P->p;
  v->offset = (size_t)(start - P->start);
  switch (*P->p) {
    case '{': rc = read_object(b, v); break;
    case '[': rc = read_array(b, v); break;
    case '"':
      v->type = ES_JSTRING;
      rc = read_string(b, &v->str, &v->len);
      break;
    case 't':
      v->type = ES_JBOOL;
      v->boolean = 1;
      rc = esj_parse_word(P, "true", 4);
      break;
    case 'f':
      v->type = ES_JBOOL;
      rc = esj_parse_word(P, "false", 5);
      break;
    case 'n':
      v->type = ES_JNULL;
      rc = esj_parse_word(P, "null", 4);
      break;
    default: {
      esj_number num;
      if ((rc = esj_parse_number(P, &num)) != ES_OK) return rc;
      if (num.is_int) {
        v->type = ES_JINT;
        v->i = num.i;
      } else {
        v->type = ES_JFLOAT;
        v->d = num.d;
      }
    }
  }
  if (rc != ES_OK) return rc;
  v->raw = (const char *)start;
  v->raw_len = (size_t)(P->p - start);
  return ES_OK;
}

int es_json_doc_parse(const char *text, size_t len, es_json_doc **out, es_err *err) {
  *out = NULL;
  if (!text && len) return es_fail(err, ES_INVALID_ARGUMENT, "invalid JSON: NULL text");
  if (!text) text = "";
  int rc = es_json_validate(text, len, err);
  if (rc != ES_OK) return rc;
  es_json_doc *d = calloc(1, sizeof *d);
  if (!d) return es_fail(err, ES_STORAGE, "out of memory while parsing JSON");
  builder b;
  memset(&b, 0, sizeof b);
  esj_parser_init(&b.P, text, len, err);
  b.doc = d;
  es_buf_init(&b.str);
  rc = read_value(&b, &d->root);
  esj_parser_destroy(&b.P);
  es_buf_destroy(&b.str);
  free(b.stack);
  if (rc != ES_OK) {
    es_json_doc_free(d);
    return rc;
  }
  *out = d;
  return ES_OK;
}

const es_jval *es_json_doc_root(const es_json_doc *d) { return &d->root; }

void es_json_doc_free(es_json_doc *d) {
  if (!d) return;
  chunk *c = d->chunks;
  while (c) {
    chunk *next = c->next;
    free(c);
    c = next;
  }
  free(d);
}

const es_jval *es_jval_get(const es_jval *v, const char *key) {
  if (!v || v->type != ES_JOBJECT) return NULL;
  size_t kn = strlen(key);
  for (size_t k = 0; k < v->n; k++)
    if (v->key_lens[k] == kn && memcmp(v->keys[k], key, kn) == 0) return &v->items[k];
  return NULL;
}

const es_jval *es_jval_at(const es_jval *v, size_t i) {
  if (!v || v->type != ES_JARRAY || i >= v->n) return NULL;
  return &v->items[i];
}

const char *es_jtype_name(es_jtype t) {
  switch (t) {
    case ES_JNULL: return "null";
    case ES_JBOOL: return "a boolean";
    case ES_JINT: return "an integer";
    case ES_JFLOAT: return "a number that is not an int64 integer";
    case ES_JSTRING: return "a string";
    case ES_JARRAY: return "an array";
    case ES_JOBJECT: return "an object";
  }
  return "a value";
}

typedef struct member {
  const char *key;
  size_t key_len;
  const char *raw; /* a member obj had: its canonical value text */
  size_t raw_len;
  const char *str; /* else: the string value added */
} member;

static int member_cmp(const void *a, const void *b) {
  const member *x = a, *y = b;
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->key, y->key, n);
  return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

int es_json_object_defaults(const char *obj, size_t obj_len, const char *const *keys,
                            const char *const *vals, size_t n, es_buf *out, es_err *err) {
  es_json_doc *doc = NULL;
  const es_jval *root = NULL;
  int rc;
  if (obj) {
    if ((rc = es_json_doc_parse(obj, obj_len, &doc, err)) != ES_OK) return rc;
    root = es_json_doc_root(doc);
    if (root->type != ES_JOBJECT) {
      es_json_doc_free(doc);
      return es_fail(err, ES_INVALID_ARGUMENT, "not a JSON object");
    }
  }
  size_t have = root ? root->n : 0, m = 0;
  member *v = malloc((have + n + 1) * sizeof *v);
  if (!v) {
    es_json_doc_free(doc);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  for (size_t k = 0; k < have; k++)
    v[m++] = (member){root->keys[k], root->key_lens[k], root->items[k].raw, root->items[k].raw_len, NULL};
  for (size_t k = 0; k < n; k++)
    if (vals[k] && !es_jval_get(root, keys[k]))
      v[m++] = (member){keys[k], strlen(keys[k]), NULL, 0, vals[k]};
  qsort(v, m, sizeof *v, member_cmp);
  es_buf_addc(out, '{');
  for (size_t k = 0; k < m; k++) {
    if (k) es_buf_addc(out, ',');
    es_json_write_text(out, v[k].key, v[k].key_len);
    es_buf_addc(out, ':');
    if (v[k].raw) es_buf_add(out, v[k].raw, v[k].raw_len);
    else es_json_write_text(out, v[k].str, strlen(v[k].str));
  }
  es_buf_addc(out, '}');
  free(v);
  es_json_doc_free(doc);
  return out->oom ? es_fail(err, ES_STORAGE, "out of memory") : ES_OK;
}
