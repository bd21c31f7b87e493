/*
 * new_events.h: an array of events to append, each of one type and one
 * payload, shared by the C tests that only need some events in a session
 * (store_rules_test.c, store_threads_test.c, pg_claims_test.c).
 */
#ifndef ES_SPEC_NEW_EVENTS_H
#define ES_SPEC_NEW_EVENTS_H

#include <string.h>

#include "store/store.h"

/* e[0..n) initialised, of type `type`, payload `payload` (NULL: none). */
static inline void new_events(es_new_event *e, int n, const char *type, const char *payload) {
  for (int i = 0; i < n; i++) {
    es_new_event_init(&e[i]);
    e[i].type = type;
    e[i].payload = payload;
    e[i].payload_len = payload ? strlen(payload) : 0;
  }
}

#endif
