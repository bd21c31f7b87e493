/* parse.c: see parse.h. */
#include "util/parse.h"

#include <errno.h>
#include <stdlib.h>

int es_parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) return -1;
  *out = x;
  return 0;
}
