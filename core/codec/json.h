/*
 * json.h: the exact payload codec (docs/contract.md §1).
 *
 * Canonical text: object keys in byte order, no spaces, integers as integers
 * (all of int64), floats in the shortest form that reads back exactly and
 * still reads as a float ("3.0", "0.1", "1e+300"), strings as UTF-8 with
 * only '"', '\\' and control characters escaped. Decoding is strict: one
 * value, no trailing garbage, no duplicate object keys, valid UTF-8, no lone
 * surrogates, nesting at most ES_JSON_MAX_DEPTH deep. An integer literal
 * outside int64 decodes as a float.
 *
 * This is the C face: text only, plain C, no Lua (for C callers, the store,
 * the binary's HTTP room). The Lua face, which converts between Lua values
 * and the same text, is the bridge's (bridge/json_lua.h); both share the
 * scanner and writers of codec/json_scan.h, so they cannot drift apart.
 */
#ifndef ES_JSON_H
#define ES_JSON_H

#include "util/buf.h"
#include "es.h"

#define ES_JSON_MAX_DEPTH 512

/* Checks that text[0..len) is one strict JSON value (text need not be
 * NUL-terminated). ES_OK, ES_INVALID_ARGUMENT with "invalid JSON at byte N:
 * reason" in err (N 0-based), or ES_STORAGE (out of memory: duplicate-key
 * detection needs scratch space). Accepts and rejects exactly what
 * es_json_canonicalize does, with the same messages. */
int es_json_validate(const char *text, size_t len, es_err *err);

/* Parses text[0..len) strictly and appends its canonical form to out.
 * ES_OK, ES_INVALID_ARGUMENT (bad JSON, message as es_json_validate) or
 * ES_STORAGE (out of memory). On failure out->len is as it was (a buffer
 * that ran out of memory keeps its sticky oom flag). */
int es_json_canonicalize(const char *text, size_t len, es_buf *out, es_err *err);

/* Appends the canonical text of a double: the shortest digits that read
 * back exactly (nearest first), positional for 1e-4 <= |d| < 1e16, else
 * exponent form; always reads as a float ("3.0", "1e+300", "-0.0"). The
 * same text as Python's repr(float); independent of the locale. NaN and
 * infinities are ES_INVALID_ARGUMENT (nothing appended); ES_STORAGE when
 * out runs out of memory. */
int es_json_format_double(double d, es_buf *out, es_err *err);

/* Appends the decimal text of v (all of int64). Memory errors only
 * through out->oom. */
void es_json_write_int(es_buf *out, int64_t v);

/* Appends s[0..n) as a JSON string (quotes included). Bytes that are not
 * valid UTF-8 cannot be in a JSON string: each is written as the four
 * characters \xHH (so text the store did not clean is shown, never
 * refused; docs/cli.md). Memory errors only through out->oom. */
void es_json_write_text(es_buf *out, const char *s, size_t n);

#endif
