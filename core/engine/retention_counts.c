/*
 * retention_counts.c: the counts of §3.9 retention policies (engine.h
 * ES_RETAIN_*). The policy itself is Lua (lua/eventstore/retention.lua):
 * these counters live on the engine so that the HTTP server, which holds
 * the C engine, can show them at /metrics.
 */
#include "engine/internal.h"

static const char *const kind_names[ES_RETAIN_KINDS] = {"truncate", "archive", "delete", "failed",
                                                        "sweeps"};

const char *es_retain_kind_name(int kind) {
  return kind >= 0 && kind < ES_RETAIN_KINDS ? kind_names[kind] : NULL;
}

int es_engine_retain_count(es_engine *e, int kind) {
  if (kind < 0 || kind >= ES_RETAIN_KINDS) return -1;
  atomic_fetch_add_explicit(&e->retained[kind], 1, memory_order_relaxed);
  return 0;
}

int64_t es_engine_retain_counted(es_engine *e, int kind) {
  if (kind < 0 || kind >= ES_RETAIN_KINDS) return 0;
  return atomic_load_explicit(&e->retained[kind], memory_order_relaxed);
}
