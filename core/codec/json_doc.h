/*
 * json_doc.h: a strict JSON document read into a small tree, for callers
 * that take JSON from outside and must look at its fields (the HTTP API's
 * request bodies, http/api.c; an event's meta, §3.1, §4: the engine reads
 * its correlation, and es_json_object_defaults adds members to it).
 *
 * Acceptance is exactly es_json_validate's (duplicate keys, trailing
 * characters, invalid UTF-8, lone surrogates, nesting deeper than
 * ES_JSON_MAX_DEPTH: INVALID_ARGUMENT "invalid JSON at byte N: ..."), and
 * numbers are read as the codec reads them: a literal without '.' or
 * exponent that fits int64 is an integer, anything else a double. Every
 * value keeps its raw text span in the input, so a part of the document
 * (a payload) can be handed to the store as es_json_canonicalize(span):
 * exact, never through a double.
 *
 * Memory: one arena per document (every node, key and decoded string);
 * es_json_doc_free frees it all. The input is borrowed: raw spans point
 * into it, so it must outlive the document.
 */
#ifndef ES_JSON_DOC_H
#define ES_JSON_DOC_H

#include <stddef.h>
#include <stdint.h>

#include "es.h"
#include "util/buf.h"

typedef enum es_jtype {
  ES_JNULL,
  ES_JBOOL,
  ES_JINT,    /* an integer literal within int64: i */
  ES_JFLOAT,  /* any other number (a fraction, an exponent, beyond int64): d */
  ES_JSTRING, /* str / len */
  ES_JARRAY,  /* items[0..n) */
  ES_JOBJECT  /* keys[k] / key_lens[k] -> items[k], k in 0..n, in input order */
} es_jtype;

typedef struct es_jval {
  es_jtype type;
  int boolean;             /* ES_JBOOL */
  int64_t i;               /* ES_JINT */
  double d;                /* ES_JFLOAT */
  const char *str;         /* ES_JSTRING: the decoded bytes, NUL-terminated after len; may
                              hold NUL bytes (callers that need a name refuse them) */
  size_t len;
  const char *raw;         /* the value's text in the input (borrowed) */
  size_t raw_len;
  size_t offset;           /* where the value starts in the input (for messages) */
  size_t n;                /* ES_JARRAY, ES_JOBJECT: elements or members */
  struct es_jval *items;
  const char **keys;       /* ES_JOBJECT: decoded keys, NUL-terminated (may hold NUL) */
  size_t *key_lens;
} es_jval;

typedef struct es_json_doc es_json_doc;

/* Parses text[0..len) (borrowed, need not be NUL-terminated). ES_OK and
 * *out (es_json_doc_free it), ES_INVALID_ARGUMENT (bad JSON, the
 * es_json_validate message) or ES_STORAGE (out of memory); *out is NULL on
 * failure. */
int es_json_doc_parse(const char *text, size_t len, es_json_doc **out, es_err *err);

/* The document's value (borrowed: valid until es_json_doc_free). */
const es_jval *es_json_doc_root(const es_json_doc *d);

/* Frees the document and every value of it. NULL is harmless. */
void es_json_doc_free(es_json_doc *d);

/* The member `key` of an object (NULL when v is not an object or has no
 * such member; a key holding NUL bytes never matches a C string). */
const es_jval *es_jval_get(const es_jval *v, const char *key);

/* The element i of an array (NULL when v is not an array or i >= n). */
const es_jval *es_jval_at(const es_jval *v, size_t i);

/* Appends to out the JSON object obj (obj_len bytes of canonical text;
 * NULL: an empty object) with a string member keys[k] = vals[k] added for
 * each k whose key obj lacks (vals[k] NULL: none); members obj has are
 * kept as they are. The result is canonical: members in key byte order.
 * ES_OK, ES_INVALID_ARGUMENT (obj is not a JSON object; nothing appended)
 * or ES_STORAGE. Used to add correlation and tracing members to an
 * event's meta (§4, §6). */
int es_json_object_defaults(const char *obj, size_t obj_len, const char *const *keys,
                            const char *const *vals, size_t n, es_buf *out, es_err *err);

/* The name of a type, for messages ("an object", "a string", ...). */
const char *es_jtype_name(es_jtype t);

#endif
