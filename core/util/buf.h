/*
 * buf.h: a growable byte buffer (the encoders' output). Out of memory is
 * reported as ES_STORAGE through es_err, never by exiting (docs/architecture.md "Conventions" 6: not
 * lua-cjson's strbuf).
 */
#ifndef ES_BUF_H
#define ES_BUF_H

#include "es.h"

typedef struct es_buf {
  char *data;  /* owned; NUL-terminated after es_buf_cstr(); may be NULL when cap == 0 */
  size_t len;  /* bytes used */
  size_t cap;  /* bytes allocated */
  int oom;     /* set once an append failed (no memory, or past max); later appends do nothing */
  size_t max;  /* 0: no cap; else len may not exceed it (an encoder's size limit) */
  int over;    /* set with oom when an append would have passed max */
} es_buf;

/* Works in place: starts an empty buffer (no allocation). */
void es_buf_init(es_buf *b);
/* Frees the data and resets to empty. */
void es_buf_destroy(es_buf *b);
/* Appends n bytes (copied). Returns ES_OK or ES_STORAGE (out of memory). */
int es_buf_add(es_buf *b, const void *p, size_t n);
int es_buf_addc(es_buf *b, char c);
int es_buf_adds(es_buf *b, const char *s);
int es_buf_addf(es_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Ensures a NUL after the data; returns b->data (borrowed, valid until the
 * next change to b) or NULL when out of memory. */
const char *es_buf_cstr(es_buf *b);
/* Hands the data to the caller (who frees it) and leaves b empty. NUL-terminated.
 * NULL (and *len = 0) when out of memory; the data is then freed here. */
char *es_buf_take(es_buf *b, size_t *len);

#endif
