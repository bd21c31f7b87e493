/*
 * names.c: names and text the store accepts (store.h es_check_name,
 * es_text_clean): valid UTF-8, at most 255 bytes behind a tenant prefix.
 * Moved out of store.c as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "codec/json_scan.h"
#include "store/internal.h"
#include "store/store.h"

/* The length (1-4) of the valid UTF-8 sequence at s (n bytes left), or 0
 * when s does not start one (a stray continuation byte, an overlong form,
 * a surrogate, a code point above U+10FFFF, a sequence cut short). One
 * UTF-8 rule for the whole project: the codec's (esj_utf8_seq, which
 * judges the multi-byte forms), so a name and a payload string can never
 * disagree on what is valid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  return s[0] < 0x80 ? 1 : esj_utf8_seq(s, s + n);
}

static int utf8_valid(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t len = utf8_seq(s + i, n - i);
    if (len == 0) return 0;
    i += len;
  }
  return 1;
}

int es_check_utf8(const char *what, const char *v, es_err *err) {
  if (v && !utf8_valid((const unsigned char *)v, strlen(v)))
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is not valid UTF-8", what);
  return ES_OK;
}

/* §3.11: the length of the tenant prefix a stored name starts with (the
 * bytes up to and including an ES_TENANT_SEP among its first
 * ES_MAX_TENANT_BYTES + 1 bytes), 0 when it has none. */
size_t es_name_prefix_len(const char *v, size_t n) {
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
  if (n - es_name_prefix_len(v, n) > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s is %zu bytes, at most %d allowed", what,
                   n - es_name_prefix_len(v, n), ES_MAX_ID_BYTES);
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
