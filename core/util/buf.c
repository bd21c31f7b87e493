/*
 * buf.c: the growable byte buffer of buf.h.
 *
 * Out of memory is sticky (b->oom): encoders append many small pieces and
 * check once at the end instead of after every append, so a failed append
 * must leave the buffer in a state where later appends are harmless no-ops.
 */
#include "util/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void es_buf_init(es_buf *b) {
  b->data = NULL;
  b->len = 0;
  b->cap = 0;
  b->oom = 0;
  b->max = 0;
  b->over = 0;
}

void es_buf_destroy(es_buf *b) {
  free(b->data);
  es_buf_init(b);
}

/* Makes room for n more bytes plus a NUL, so es_buf_cstr/es_buf_take never
 * need to grow (and so never fail) after a successful append. */
static int reserve(es_buf *b, size_t n) {
  size_t need, cap;
  char *p;
  if (b->oom) return ES_STORAGE;
  if (n > SIZE_MAX - 1 - b->len) goto fail;
  if (b->max && b->len + n > b->max) {
    /* Checked while writing, so an encoder stops at the limit instead of
     * building a gigabyte to refuse it afterwards. */
    b->over = 1;
    goto fail;
  }
  need = b->len + n + 1;
  if (need <= b->cap) return ES_OK;
  /* Doubling keeps appends amortised O(1); 64 avoids a string of tiny
   * reallocations for the many small payloads of a typical append. */
  cap = b->cap ? b->cap : 64;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) {
      cap = need;
      break;
    }
    cap *= 2;
  }
  p = realloc(b->data, cap);
  if (!p) goto fail;
  b->data = p;
  b->cap = cap;
  return ES_OK;
fail:
  b->oom = 1;
  return ES_STORAGE;
}

int es_buf_add(es_buf *b, const void *p, size_t n) {
  if (reserve(b, n) != ES_OK) return ES_STORAGE;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  return ES_OK;
}

int es_buf_addc(es_buf *b, char c) {
  if (b->len + 1 < b->cap && !b->oom) { /* the hot path: no call into reserve */
    b->data[b->len++] = c;
    return ES_OK;
  }
  if (reserve(b, 1) != ES_OK) return ES_STORAGE;
  b->data[b->len++] = c;
  return ES_OK;
}

int es_buf_adds(es_buf *b, const char *s) { return es_buf_add(b, s, strlen(s)); }

int es_buf_addf(es_buf *b, const char *fmt, ...) {
  va_list ap;
  int n;
  size_t room;
  if (reserve(b, 0) != ES_OK) return ES_STORAGE;
  room = b->cap - b->len; /* >= 1 after reserve */
  va_start(ap, fmt);
  n = vsnprintf(b->data + b->len, room, fmt, ap);
  va_end(ap);
  if (n < 0) {
    /* An encoding error, not memory; the buffer is unchanged. */
    return ES_STORAGE;
  }
  if ((size_t)n >= room) {
    if (reserve(b, (size_t)n) != ES_OK) return ES_STORAGE;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
  return ES_OK;
}

const char *es_buf_cstr(es_buf *b) {
  if (reserve(b, 0) != ES_OK) return NULL;
  b->data[b->len] = '\0';
  return b->data;
}

char *es_buf_take(es_buf *b, size_t *len) {
  char *p;
  if (!es_buf_cstr(b)) {
    /* Out of memory: the caller gets nothing, and the half-built data is
     * released here so it cannot leak. */
    es_buf_destroy(b);
    if (len) *len = 0;
    return NULL;
  }
  p = b->data;
  if (len) *len = b->len;
  es_buf_init(b);
  return p;
}
