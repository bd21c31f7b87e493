/*
 * parse.h: strict parsing of the numbers found in URL options
 * (sqlite:PATH?busy_timeout=..., postgres://...?readers=...).
 */
#ifndef ES_UTIL_PARSE_H
#define ES_UTIL_PARSE_H

#include <stdint.h>

/* A whole base-10 integer in [lo, hi]: 0 with *out set, or -1 (empty,
 * trailing bytes, out of range) with *out unchanged. */
int es_parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out);

#endif
