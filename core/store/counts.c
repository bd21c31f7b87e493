/*
 * counts.c: the §3.12 counts rule (counts.h).
 */
#include "store/counts.h"

#include <string.h>

_Static_assert(ES_SCOPE_MAX_BYTES == ES_MAX_TENANT_BYTES + 1,
               "a scope is a tenant of at most ES_MAX_TENANT_BYTES bytes and the separator");
_Static_assert(ES_SCOPE_MIN_BYTES == 2,
               "a scope is a tenant of at least one byte and the separator");
_Static_assert(sizeof ES_TENANT_SEP == 2, "the separator is one byte (ES_SQL_SEP, es_scope_len)");

size_t es_scope_len(const char *name) {
  const char *sep = strchr(name, ES_TENANT_SEP[0]);
  size_t n = sep ? (size_t)(sep - name) + 1 : 0;
  return n >= ES_SCOPE_MIN_BYTES && n <= ES_SCOPE_MAX_BYTES ? n : 0;
}

int es_counted(const char *name, const es_session_info *row) {
  return row && *name && row->fence >= 0;
}

void es_counts_move(es_counts *c, const char *name, const es_session_info *from,
                    const es_session_info *to) {
  const es_session_info *rows[2] = {from, to};
  for (int i = 0; i < 2; i++) {
    if (!es_counted(name, rows[i])) continue;
    int64_t sign = i ? 1 : -1;
    c->sessions += sign;
    c->events += sign * rows[i]->events;
    c->pending += sign * rows[i]->pending;
    c->dead += sign * rows[i]->dead;
  }
}
