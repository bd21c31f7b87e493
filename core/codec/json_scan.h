/*
 * codec/json_scan.h: the text primitives of the JSON codec, shared by its
 * faces so that all read and write exactly the same text: the strict
 * scanner (strings, numbers, literals, errors with byte offsets), the
 * canonical writers (integers, doubles, strings), the UTF-8 rule and the
 * object-member sort. Public on purpose, though low-level: the C face
 * (json.c, json_doc.c) and the Lua face (bridge/json_lua.c) are built on
 * it, and the HTTP room checks header text with esj_utf8_seq (the one
 * UTF-8 rule). Callers that only want JSON text use codec/json.h.
 */
#ifndef ES_JSON_SCAN_H
#define ES_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "codec/json.h"

#include <string.h>

/* Appending ---------------------------------------------------------------- */

/* es_buf_add / es_buf_addc with the common case inlined: the codec appends
 * a few bytes at a time, and a call per piece (through the PLT, in the Lua
 * module) costs more than the copy. Same semantics: nothing is appended
 * once the buffer is out of memory; errors show in b->oom. Room for the
 * NUL that es_buf_cstr adds is kept, as es_buf_add does. */
static inline void esj_put(es_buf *b, const void *p, size_t n) {
  if (n < b->cap - b->len && !b->oom) {
    memcpy(b->data + b->len, p, n);
    b->len += n;
  } else {
    es_buf_add(b, p, n);
  }
}

static inline void esj_putc(es_buf *b, char c) {
  if (b->len + 1 < b->cap && !b->oom) b->data[b->len++] = c;
  else es_buf_addc(b, c);
}

/* Scanner ------------------------------------------------------------------ */

/* A cursor over the input. Offsets in error messages are p - start. */
typedef struct esj_parser {
  const unsigned char *start; /* borrowed: the whole input */
  const unsigned char *p;     /* next byte to read */
  const unsigned char *end;   /* one past the last byte */
  es_err *err;                /* the caller's; may be NULL */
  es_buf num;                 /* owned: copies of float literals too long for the stack */
} esj_parser;

void esj_parser_init(esj_parser *P, const char *text, size_t len, es_err *err);
void esj_parser_destroy(esj_parser *P);

/* Records "invalid JSON at byte N: <reason>" (N = at - start) and returns
 * ES_INVALID_ARGUMENT. */
int esj_fail(esj_parser *P, const unsigned char *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Reports what was found at P->p where a value or punctuation was expected
 * ("unexpected end of input", "unexpected character 'x'", ...). */
int esj_fail_unexpected(esj_parser *P, const char *expected);
/* Out of memory while parsing: ES_STORAGE. */
int esj_fail_oom(esj_parser *P);

/* After an element of an array or object (both faces parse the same
 * syntax): skips white space, then ',' and the white space after it
 * (*more = 1) or the closing `close` (*more = 0). ES_OK, or
 * ES_INVALID_ARGUMENT naming what was expected. */
int esj_next_element(esj_parser *P, char close, int *more);

static inline void esj_skip_ws(esj_parser *P) {
  const unsigned char *p = P->p, *end = P->end;
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  P->p = p;
}

/* Parses the string whose opening quote is at P->p and moves P->p past the
 * closing quote. The decoded bytes come back in (*s, *n): a span of the
 * input when the string has no escapes (so no copy), else appended to dst
 * (*copied = 1; *s is then valid until dst next changes, and the caller
 * owns the tail of dst from the old dst->len). The bytes are valid UTF-8.
 * ES_INVALID_ARGUMENT (bad escape, lone surrogate, control character,
 * invalid UTF-8, unterminated) or ES_STORAGE. */
int esj_parse_string(esj_parser *P, es_buf *dst, const char **s, size_t *n, int *copied);

typedef struct esj_number {
  int is_int; /* 1: i holds the value; 0: d does */
  int64_t i;
  double d;
} esj_number;

/* Parses the number at P->p. A literal without '.' or exponent that fits
 * int64 is an integer; anything else is a double (correctly rounded,
 * locale-independent). A literal beyond the double range (1e400) is
 * ES_INVALID_ARGUMENT: no canonical text could carry it. */
int esj_parse_number(esj_parser *P, esj_number *num);

/* Matches the literal word (e.g. "true") at P->p and moves past it. */
int esj_parse_word(esj_parser *P, const char *word, size_t len);

/* A printable, truncated copy of key k[0..n) for messages ("duplicate
 * object key ..."): bytes that would need escaping become '?'. cap must be
 * at least 8; ESJ_KEY_DESC is the size both faces use. */
#define ESJ_KEY_DESC 48
void esj_describe_key(char *dst, size_t cap, const char *k, size_t n);

/* Writers ------------------------------------------------------------------ */

/* Appends the decimal text of v (all of int64). Errors only through out->oom. */
void esj_write_int(es_buf *out, int64_t v);

/* Appends s[0..n) as a JSON string (quotes included), escaping only '"',
 * '\\' and bytes below 0x20. When bad is not NULL the bytes are first
 * checked to be UTF-8 and, if not, nothing is written, *bad is the offset
 * of the first invalid byte and the result is ES_INVALID_ARGUMENT.
 * Memory errors only through out->oom. */
int esj_write_string(es_buf *out, const char *s, size_t n, size_t *bad);

/* Length (2..4) of the valid multi-byte UTF-8 sequence at p, 0 if the bytes
 * at p are not one (overlong, surrogate, above U+10FFFF, truncated). */
size_t esj_utf8_seq(const unsigned char *p, const unsigned char *end);

/* Object members ----------------------------------------------------------- */

/* One member of an object being written: its key and where its text
 * ("key":value, without the separating comma) lies in the output. */
typedef struct esj_member {
  const char *key; /* borrowed: the decoded key bytes (see in_keys) */
  size_t koff;     /* when in_keys: offset of the key in the caller's key buffer */
  size_t klen;
  int in_keys;     /* 1: key is resolved from koff just before sorting, as
                      the key buffer may move while later members are parsed */
  size_t start;    /* the member's text in out: [start, end) */
  size_t end;
  size_t at;       /* input byte offset of the key, for duplicate-key errors */
} esj_member;

/* A stack of members shared by every nesting level of one call: an object
 * owns [base, len) while it is open and pops back to base when it closes,
 * so nested objects reuse the same allocation. */
typedef struct esj_members {
  esj_member *v;     /* owned, unless it is `local` */
  size_t len;
  size_t cap;
  esj_member *local; /* the caller's array v starts in (NULL: none): most
                        texts have a few small objects, so a validation or
                        an encoding mallocs nothing for its members */
} esj_members;

/* How many members a caller's own array holds (16 x 56 bytes of stack). */
#define ESJ_LOCAL_MEMBERS 16

/* Starts empty in local[0..n) (local may be NULL, n 0); grows onto the heap. */
void esj_members_init(esj_members *m, esj_member *local, size_t n);
void esj_members_destroy(esj_members *m);
/* ES_OK or ES_STORAGE. */
int esj_members_push(esj_members *m, const esj_member *x);

/* Byte-order comparison: memcmp, a proper prefix first. */
int esj_keycmp(const char *a, size_t an, const char *b, size_t bn);

/* Resolves keys (in_keys ones against keys_base), sorts v[0..n) by key and
 * returns the index of the first member, in input order (by `at`), whose
 * key repeats an earlier one; (size_t)-1 when all keys are distinct. */
size_t esj_members_sort(esj_member *v, size_t n, const char *keys_base);

/* Rewrites out[body, out->len), which holds the members' texts separated
 * by commas in any order, as the same members in v's order. tmp is a
 * scratch buffer for objects too long for the stack copy (its content is
 * replaced). ES_OK or ES_STORAGE. */
int esj_members_permute(const esj_member *v, size_t n, es_buf *out, size_t body, es_buf *tmp);

#endif
