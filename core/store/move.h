/*
 * move.h: moving a store (§10, docs/moving.md): the export stream and
 * the import that recreates a store from it, on any backend.
 *
 * The stream is NDJSON, one record a line (docs/moving.md "The format"):
 * a header {"eventstore_export":VERSION,"backend":NAME,"position":P},
 * then the data keys (as stored: wrapped), where each key is used, the
 * session rows, the events by position (every field of the row, dispatch
 * record and bookkeeping included, sealed payloads as ciphertext), the
 * archived events by session and index (with their segments' ranges), the
 * snapshots, the refs, and a last line {"end":{...counts}} without which
 * an import refuses the stream as cut short. Every record is written from
 * one table of fields (move.c), in a fixed order, so two exports of equal
 * stores are byte-identical apart from the header's backend.
 */
#ifndef ES_STORE_MOVE_H
#define ES_STORE_MOVE_H

#include "store/store.h"

/* The format version this build writes and the newest it reads (2 added
 * archived events, §10; 1 still reads). */
#define ES_EXPORT_VERSION 2

/* One line of an export (without its newline); nonzero stops. */
typedef int (*es_line_fn)(void *ctx, const char *line, size_t len);

/* What an export holds (all zero: the whole store). */
typedef struct es_export_opts {
  const char *prefix; /* only sessions whose names start with it (NULL or "": all) */
  int64_t after;      /* > 0: an increment for a follower (eventstore copy --follow): the
                         sessions with events past this position, whole (every event, as
                         their older events' dispatch records may have moved too), their
                         rows and the keys they use; no snapshots or refs */
  int rows_only;      /* session rows, the master key's check row and refs only: what a
                         follower compares to find the sessions that changed */
  const char *const *names; /* non-NULL: only these sessions (and no refs), read session by
                               session rather than by a walk of every event */
  size_t n_names;
} es_export_opts;

/* Writes the export of s that o asks for (NULL: all of it). Consistent:
 * one read transaction per backend (on shards: one per shard, plus the
 * catalog's for refs). The lines are made in memory and handed to fn
 * after every transaction ended, so fn may call the store. Archived
 * events are inline (§10): each segment's events, whole, each with its
 * segment's range and time, read from the files as a read checks them (a
 * damaged or missing segment is STORAGE naming it). A tenant handle is
 * INVALID_ARGUMENT (export the store). */
int es_store_export(es_store *s, const es_export_opts *o, es_line_fn fn, void *ctx, es_err *err);

/* An import being read: es_import_line each line of a stream in order,
 * then es_import_run. */
typedef struct es_import es_import;
int es_import_new(es_import **out, es_err *err);
void es_import_free(es_import *im);
/* Checks and keeps one line (INVALID_ARGUMENT naming the line). */
int es_import_line(es_import *im, const char *line, size_t len, es_err *err);

enum {
  ES_IMPORT_EMPTY = 0, /* into an empty store (§10); a store that already holds exactly
                          this stream (a rerun) is left as it is */
  ES_IMPORT_UPSERT = 1 /* a follower's increment: session rows, snapshots and refs
                          replaced, events added past the target's last position, or
                          their dispatch record brought up to date when present */
};

typedef struct es_import_result {
  int already;      /* 1: every part of the target already held the stream; nothing written */
  int64_t sessions; /* records written */
  int64_t events;
  int64_t position; /* the stream's header position */
} es_import_result;

/* Writes what was read into s: one write transaction per backend (on
 * shards, one per shard and the catalog's), after checking every part
 * first, so a refused import writes nothing. Archived events become
 * segments again, in the archive directory of the part that holds their
 * session (none there: INVALID_ARGUMENT naming the option); their files
 * are written before the commit that records them, so an import killed
 * halfway leaves orphans that its rerun sweeps. A stream cut short (no end
 * record), of a newer version, or into a non-empty store:
 * INVALID_ARGUMENT, nothing written. */
int es_import_run(es_store *s, es_import *im, int mode, es_import_result *out, es_err *err);

/* eventstore backup (docs/moving.md "Backups"): a verified copy of the
 * store's storage at `to` (a new file), made while writers go on, by the
 * backend's backup op (sqlite:). A backend without one (memory:,
 * postgres://: pg_basebackup or pg_dump is its backup), a sharded store or
 * a tenant handle: INVALID_ARGUMENT saying what to use. */
int es_store_backup(es_store *s, const char *to, es_err *err);

#endif
