/*
 * store.h: the eventstore C API (docs/contract.md §3): open a backend by URL,
 * append and read events, claim / renew / complete / fail them, dead
 * letters, snapshots, inspection, waiting, presence, branches (fork,
 * lineage, refs, promote) and fences, leases and seals.
 *
 * The functions below are the front door (front.c): each forwards to its
 * store's table of operations (store_impl.h), which the core store (the
 * rules, once, in core/store/'s rule files), a tenant view and the shard
 * router implement. Backends (backend.h) only store and find rows inside
 * transactions.
 *
 * Threads: one es_store may be used from any number of threads at once.
 * Every call is atomic: on failure nothing was written.
 *
 * Ownership: strings passed in are borrowed for the duration of the call;
 * results (es_event, es_events, ...) are owned by the caller and released
 * with the matching _destroy function.
 */
#ifndef ES_STORE_H
#define ES_STORE_H

#include "es.h"

typedef struct es_store es_store;

/* An id source (es_open_opts.ids): writes the next event id, a
 * NUL-terminated name (es_check_name) of at most ES_MAX_ID_BYTES bytes, into
 * out (cap = ES_MAX_ID_BYTES + 1 bytes). Called inside the write call that
 * needs the id, on the calling thread. Every id it returns must be new: an
 * id already stored is refused (INVALID_ARGUMENT naming the source) and the
 * call changes nothing. ES_OK or an error code with err filled. */
typedef int (*es_id_fn)(void *ctx, char *out, size_t cap, es_err *err);

#define ES_DEFAULT_MAX_PAYLOAD (1024 * 1024)
#define ES_DEFAULT_MAX_BATCH 10000
#define ES_MAX_ID_BYTES 255
/* Free text the store keeps (a failure's error, a settle reason, together
 * as last_error): at most this many bytes, cut at a character boundary. */
#define ES_MAX_TEXT_BYTES 65536
/* Count limits (`limit` of reads, claims, listings) above this act as this:
 * no call can return that many rows, and backends may add to a limit
 * without overflowing. */
#define ES_MAX_LIMIT ((int64_t)1 << 62)
/* claim_next's `types`: at most this many names (an engine lists the types
 * it has handlers for; a list this long is a bug, not a scripts directory). */
#define ES_MAX_CLAIM_TYPES 1000

/* Options for es_store_open; zero-initialise and set what you need. */
typedef struct es_open_opts {
  es_clock_fn clock;         /* NULL: the system clock */
  void *clock_ctx;           /* borrowed; must outlive the store */
  size_t max_payload_bytes;  /* 0: ES_DEFAULT_MAX_PAYLOAD; capped by the backend (es_store_max_payload) */
  size_t max_batch_events;   /* 0: ES_DEFAULT_MAX_BATCH (more is TOO_LARGE) */
  int durability;            /* backend-specific; 0: the backend's durable default */
  es_id_fn ids;              /* NULL: UUIDv7; else where generated event ids come from */
  void *ids_ctx;             /* borrowed; must outlive the store */
  const char *archive_dir;   /* §3.9: where segment files go; NULL: no archive (archive()
                                is INVALID_ARGUMENT). Created (0700) when missing. */
  const char *keys_path;     /* §3.10: the master key file; NULL: no encryption (an
                                append with a key is INVALID_ARGUMENT). Created 0600
                                when missing; a file others may read is refused. */
  int secure_delete;         /* set by the core when keys_path is given: the backend
                                overwrites what it deletes (SQLite PRAGMA secure_delete) */
} es_open_opts;

/* Dispatch status of a stored event. */
enum { ES_STATUS_PENDING = 0, ES_STATUS_PROCESSED = 1, ES_STATUS_DEAD = 2 };

/* A stored event with its dispatch record: the row every call returns and
 * every backend stores. Strings are owned (malloc'd) unless a comment says
 * otherwise; optional integers are ES_NONE when absent. */
typedef struct es_event {
  char *id;               /* unique across the store */
  char *type;
  char *payload;          /* canonical JSON text, NUL-terminated */
  size_t payload_len;
  char *session;
  char *lane;             /* NULL: unlaned */
  int64_t index;          /* 1-based, dense per session */
  int64_t position;       /* store-wide, increasing in commit order */
  int64_t created_at;
  int64_t cause_index;    /* ES_NONE: no cause */
  int64_t cause_attempt;
  int64_t not_before;     /* ES_NONE: ready at once */
  int status;             /* ES_STATUS_* */
  int64_t attempts;       /* claims so far */
  int64_t failures;
  char *last_error;       /* NULL: none */
  int64_t processed_at;   /* ES_NONE while not processed */
  char *claim_holder;     /* NULL: no live-or-expired claim owns the event */
  int64_t claim_expires_at;
  int64_t retry_at;       /* end of the current backoff, ES_NONE: none */
  int64_t first_claimed_at;     /* ES_NONE: never claimed */
  int64_t last_claimed_at;      /* the latest claim's time; ES_NONE: never claimed */
  int64_t failed_at;            /* the latest failure's time; ES_NONE: never failed */
  int64_t processed_by_attempt; /* the attempt whose completion processed it; ES_NONE otherwise
                                   (pending, dead, settled, a fork's copy) */
  char *origin_session;   /* a fork's copy: the session it was copied from; NULL otherwise */
  int64_t origin_index;   /* its index there (ES_NONE unless origin_session) */
  char *key;              /* §3.10: the data key the payload is sealed under; NULL: plaintext.
                             Backends store payload as given (the sealed text for keyed
                             rows); the core opens it on the way out. */
  int shredded;           /* 1: the key was shredded; payload is NULL (set by the core) */
  /* Bookkeeping for the rules (written by store.c, stored verbatim by
   * backends, not shown to users): */
  int queued;             /* 1: a dispatch candidate (pending, not dead, head of its lane) */
  int64_t due_at;         /* when queued: the time it is or becomes ready */
  int64_t last_failed_attempt; /* ES_NONE: no failure; makes fail() idempotent */
  int64_t returned;       /* events appended by the completing attempt; -1 when
                             processed without a completion (settled) */
  int packed;             /* 1: id, type, payload, session, lane, origin_session and key share
                             one allocation starting at id (es_event_copy's); never
                             replace those fields of a packed event (but see payload_own) */
  int payload_own;        /* 1: payload is its own allocation even in a packed event (the
                             core replaced the sealed text with the opened payload) */
  /* §3.1: the payload's schema revision (1..ES_MAX_REVISION; rows stored
   * before revisions existed read 1) and the event's metadata: canonical
   * JSON object text, NUL-terminated, NULL: none. Both immutable like the
   * payload; meta is never sealed (§3.10: it carries correlation and
   * tracing data, not secrets). In a packed event meta shares the
   * allocation. */
  int64_t revision;
  char *meta;
} es_event;

typedef struct es_events {
  es_event *v;  /* owned array */
  size_t n;
  size_t cap;
} es_events;

void es_event_init(es_event *e);          /* zero strings, ES_NONE optionals */
void es_event_destroy(es_event *e);       /* frees the strings */
int es_event_copy(es_event *dst, const es_event *src); /* deep copy; ES_STORAGE on OOM */
void es_events_destroy(es_events *list);  /* frees every event and the array */
/* Appends a deep copy of e. ES_OK or ES_STORAGE. */
int es_events_push_copy(es_events *list, const es_event *e);

/* An event to append. Borrowed strings. */
typedef struct es_new_event {
  const char *id;          /* NULL: generated (UUIDv7) */
  const char *type;        /* required, non-empty */
  const char *payload;     /* canonical JSON (see json.h); NULL: null */
  size_t payload_len;
  int payload_encoded;     /* 1: the payload is text this process's own encoder wrote from a
                              value (es_json_encode_lua), valid JSON by construction, so the
                              append does not parse it again. 0 (es_new_event_init): text from
                              outside, checked with es_json_validate. */
  const char *lane;        /* NULL: unlaned */
  int settled;             /* 1: stored processed, never dispatched */
  int64_t cause_index;     /* ES_NONE: none (complete() sets its own) */
  int64_t cause_attempt;
  int64_t not_before;      /* ES_NONE: none */
  const char *key;         /* §3.10: the data key to seal the payload under (a name); NULL:
                              stored as given. Needs a store opened with keys_path. */
  int64_t revision;        /* §3.1: 1..ES_MAX_REVISION; ES_NONE: not given, stored as 1 */
  const char *meta;        /* §3.1: canonical JSON object text (at most ES_MAX_META_BYTES),
                              NUL-terminated after meta_len; NULL: none */
  size_t meta_len;
} es_new_event;

#define ES_MAX_REVISION 2147483647 /* 2^31 - 1 (§3.1) */
#define ES_MAX_META_BYTES 8192     /* a meta's canonical text (§3.1) */

void es_new_event_init(es_new_event *e);  /* NULL strings, ES_NONE optionals */

/* Argument rules shared with the bindings ------------------------------- */

/* A name (session, event id, type, lane, holder, reducer, presence
 * namespace, participant or field): a non-empty UTF-8 string of at most
 * ES_MAX_ID_BYTES bytes. `what` names the argument in the message.
 * ES_OK or ES_INVALID_ARGUMENT. Every es_store_* call applies it to its
 * names; bindings call it for names that reach no store call (e.g. a
 * presence subscription's namespace). The C API takes NUL-terminated
 * strings, so a NUL byte inside a name can only be seen (and must be
 * refused) by a caller holding the string with its length (lua/events.h). */
int es_check_name(const char *what, const char *v, es_err *err);
/* A text that is compared with names but need not be one (a listing's
 * `prefix` or `after`, a snapshot's `version`): NULL or valid UTF-8, by
 * the same rule, else ES_INVALID_ARGUMENT naming `what`. PostgreSQL keeps
 * these as text and refuses other bytes, so without this check one backend
 * would fail with STORAGE where the others answer (docs/limits.md). */
int es_check_utf8(const char *what, const char *v, es_err *err);

/* Free text as the store keeps it (a failure's `error`, a settle `reason`):
 * n bytes of s, which may hold anything, made valid UTF-8 without NUL:
 * each NUL byte and each byte that does not start a valid UTF-8 sequence
 * becomes U+FFFD; text over max bytes is cut at a character boundary and
 * ends with U+2026 ("..."). max >= 3. *out (NUL-terminated, *out_len bytes
 * when out_len is not NULL) is malloc'd, the caller frees it. ES_OK or
 * ES_STORAGE (out of memory; *out is NULL then). Text that is already
 * valid and short enough comes back unchanged. */
int es_text_clean(const char *s, size_t n, size_t max, char **out, size_t *out_len);

/* The one timer rule (docs/contract.md §4: a handler's returned events and
 * engine:append): `delay_ms` counts from now, `at` is absolute; either
 * becomes the event's not_before. has_delay / has_at say whether each was
 * given. Both given, a negative value, or now + delay_ms beyond the largest
 * time (INT64_MAX): ES_INVALID_ARGUMENT, the message naming `what` (e.g.
 * "events[2]") and the field. Neither given: *not_before = ES_NONE.
 * Checking that values are integers at all is the caller's (the binding's)
 * part. */
int es_timer_not_before(const char *what, int64_t now, int has_delay, int64_t delay_ms,
                        int has_at, int64_t at, int64_t *not_before, es_err *err);

/* Opens a store. url: NULL or "memory:", "sqlite:PATH". Unknown schemes are
 * ES_INVALID_ARGUMENT; backend failures ES_STORAGE. *out is owned by the
 * caller: es_store_release() it. */
int es_store_open(const char *url, const es_open_opts *opts, es_store **out, es_err *err);
/* Closes the backend once calls in flight finish; later calls return
 * ES_CLOSED. Harmless when already closed. */
void es_store_close(es_store *s);
/* Reference counting, so several threads (engine workers) can hold one
 * store: retain adds a reference; release drops one and, at zero, closes
 * and frees. es_store_open returns one reference. */
void es_store_retain(es_store *s);
void es_store_release(es_store *s);

/* The payload size limit: max_payload_bytes as opened, capped by what the
 * backend stores (memory: 4 GiB - 1; sqlite: its row limit less 1 MiB;
 * postgres: 1 GiB less 9 MiB), so a payload the backend could not store
 * is TOO_LARGE before any write. */
size_t es_store_max_payload(const es_store *s);

/* The current time by the store's clock. */
int es_store_now(es_store *s, int64_t *now, es_err *err);
/* Writes a new event id into out: from the store's id source (open's
 * `ids`) when it has one, else a UUIDv7 (time-ordered, unique, 36 bytes).
 * For callers that must fix ids before a call so that retrying it is
 * idempotent (the engine's completions). */
int es_store_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err);
/* A counter bumped by every commit through this handle (cheap change check
 * for subscriptions). */
uint64_t es_store_version(es_store *s);
/* A number that changes when any process commits to the same storage
 * (sqlite: PRAGMA data_version); always 0 for backends that cannot tell
 * (memory:, where nothing else can write). */
int es_store_data_version(es_store *s, uint64_t *version, es_err *err);

/* 3.1 Append and read ---------------------------------------------------- */

/* Appends n events (n may be 0). expected: ES_NONE or the required head.
 * fence: ES_NONE (an unfenced write) or the writer's fence token (§3.8):
 * refused with STALE_FENCE unless it is the session's current token.
 * out receives the stored events in batch order (for a full replay, the
 * originals), or is NULL when the caller does not need them; *pending
 * whether the session has pending events afterwards. A full replay is
 * answered before the head, fence and seal checks (it writes nothing).
 * Errors: INVALID_ARGUMENT, TOO_LARGE, PARTIAL_DUPLICATE_BATCH, ID_CONFLICT,
 * SUPERSEDED_ATTEMPT, NO_SUCH_EVENT, WRONG_EXPECTED_HEAD, STALE_FENCE,
 * SEALED, STORAGE, CLOSED. */
int es_store_append(es_store *s, const char *session, const es_new_event *evs, size_t n,
                    int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err);

/* §3.1 one batch of es_store_append_many: append's arguments, and its
 * results once the call succeeded (out is then the caller's to destroy). */
typedef struct es_append_batch {
  const char *session;
  const es_new_event *evs;
  size_t n;
  int64_t expected;  /* ES_NONE: any head */
  int64_t fence;     /* ES_NONE: unfenced */
  es_events out;     /* the stored events, in the batch's order */
  int pending;       /* the session has pending events after the call */
} es_append_batch;

/* §3.1 several appends, to one or more sessions, in one transaction: every
 * batch commits or none does. Each batch follows append's rules
 * (idempotency, expected, fence, sealed) in the order given, so a later
 * batch of the same session sees the earlier one's events. A refused
 * batch fails the call with its error, the message starting with
 * "batches[i]"; every out is then empty. The batches together hold at
 * most max_batch events (else TOO_LARGE). On shards: every session must
 * live on one shard, else INVALID_ARGUMENT naming two that do not. */
int es_store_append_many(es_store *s, es_append_batch *v, size_t n, es_err *err);

/* Events with after < index <= through (ES_NONE: the head), at most limit
 * (ES_NONE: no limit), in index order. */
int es_store_read(es_store *s, const char *session, int64_t after, int64_t through,
                  int64_t limit, es_events *out, es_err *err);
int es_store_head(es_store *s, const char *session, int64_t *head, es_err *err);
/* Events of every session with position > after, in position order. */
int es_store_read_all(es_store *s, int64_t after, int64_t limit, es_events *out, es_err *err);
/* §5 read_all for any store, resumed from a cursor: events after `cursor`
 * (NULL or "": from the start), at most limit (ES_NONE: 1000); cursors[i]
 * (an owned array of owned strings, n = out->n; es_store_cursors_free) is
 * the cursor just after out->v[i]. A sharded store's cursors are opaque
 * strings (shards.h es_shards_read_all_cursor); every other store's are
 * positions written in decimal, so a client that keeps cursors works on
 * both. A cursor the store cannot read: INVALID_ARGUMENT. */
int es_store_read_all_cursor(es_store *s, const char *cursor, int64_t limit, es_events *out,
                             char ***cursors, es_err *err);
void es_store_cursors_free(char **cursors, size_t n);
/* The highest position stored so far (0 when empty): where a subscriber
 * to every session starts. */
int es_store_last_position(es_store *s, int64_t *position, es_err *err);
/* Looks one event up by (session, index). NO_SUCH_EVENT when absent. */
int es_store_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err);

/* 3.2 Dispatch ----------------------------------------------------------- */

enum { ES_CLAIMED = 1, ES_BUSY, ES_SETTLED, ES_COMPLETED, ES_SUPERSEDED, ES_FAILED, ES_DEAD_LETTERED };

typedef struct es_claim_opts {
  const char *holder;       /* required */
  int64_t ttl_ms;           /* used when expires_at is ES_NONE; must be > 0 then */
  int64_t expires_at;       /* ES_NONE: now + ttl_ms */
  const int64_t *exclude;   /* indexes not to claim (borrowed) */
  size_t n_exclude;
  int64_t limit;            /* ES_NONE: no limit */
} es_claim_opts;

/* Claims the ready events of one session. *outcome: ES_CLAIMED (events in
 * out, index order), ES_BUSY (*retry_at or ES_NONE) or ES_SETTLED. */
int es_store_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                   es_events *out, int64_t *retry_at, es_err *err);
/* Claims up to limit (ES_NONE: 1) ready events across sessions, earliest
 * ready first (the time it became ready, then position).
 * types: NULL claims events of every type; otherwise only events whose type
 * is one of the n_types names (borrowed; duplicates harmless; n_types 0
 * claims nothing), found through a per-type index, so events of other
 * types cost nothing however many are ready: O(n_types log n + limit) rows
 * looked at for small limits. Lanes still hold: a laned event of a listed
 * type behind an unprocessed one of another type is not ready.
 * skip: n_skip sessions (borrowed; NULL: none) whose events are not
 * claimed: an engine fenced out of a session leaves its events to the
 * lease's holder. Their ready rows are still looked at (and passed over).
 * *retry_at: when the next not-yet-ready event (of those types) becomes
 * ready (ES_NONE).
 * Errors: INVALID_ARGUMENT (holder, ttl_ms, limit, a type that is not a
 * name, more than ES_MAX_CLAIM_TYPES types), STORAGE, CLOSED. */
int es_store_claim_next(es_store *s, const char *holder, int64_t ttl_ms, int64_t limit,
                        const char *const *types, size_t n_types, const char *const *skip,
                        size_t n_skip, es_events *out, int64_t *retry_at, es_err *err);

typedef struct es_claim_ref {
  int64_t index;
  int64_t attempt;
} es_claim_ref;

typedef struct es_renew_result {
  int64_t *renewed;     /* owned */
  size_t n_renewed;
  int64_t *superseded;  /* owned */
  size_t n_superseded;
} es_renew_result;
void es_renew_result_destroy(es_renew_result *r);

/* Extends the listed claims to expires_at, or (expires_at ES_NONE) to
 * now + ttl_ms (> 0). */
int es_store_renew(es_store *s, const char *session, const char *holder, const es_claim_ref *claims,
                   size_t n, int64_t ttl_ms, int64_t expires_at, es_renew_result *out, es_err *err);

/* *outcome: ES_COMPLETED (out: the appended events) or ES_SUPERSEDED.
 * fence as for es_store_append (STALE_FENCE); events on a sealed session:
 * SEALED (a completion without events still works). */
int es_store_complete(es_store *s, const char *session, int64_t index, int64_t attempt,
                      const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                      es_events *out, es_err *err);

/* Gives back claims holder took and never started (an engine's prefetched
 * events at a stop, or waiting behind slow handlers): each listed attempt
 * that still owns its event under holder is undone, as if that claim had
 * never been made (the event's attempts go back to attempt - 1, and the
 * next claim makes that attempt number again), and the event is ready
 * again at once (or at its not_before). So the attempt counts neither as a
 * failure nor, later, as an attempt that never finished. The caller must
 * never complete, fail or renew a released attempt: another holder may
 * hold its number by then. out: the indexes released (in renewed) and
 * those whose attempt no longer owned the event (superseded); others
 * (another holder's) are in neither list. */
int es_store_release_claims(es_store *s, const char *session, const char *holder,
                            const es_claim_ref *claims, size_t n, es_renew_result *out,
                            es_err *err);

/* §3.2 an event to cancel with a completion: its index in the completed
 * event's session and the reason (NULL: "cancelled"); `cancelled` is the
 * answer: 1 when it is cancelled after the call, 0 when it was no longer
 * cancellable (processed, dead, live-claimed or missing: not_cancelled). */
typedef struct es_cancel {
  int64_t index;
  const char *reason;
  int cancelled;
} es_cancel;

/* One completion of es_store_complete_many: the arguments of
 * es_store_complete (borrowed), and its answer. */
typedef struct es_completion {
  const char *session;
  int64_t index, attempt;
  const es_new_event *evs;
  size_t n;
  int64_t fence;
  /* §3.2 complete{cancel}: events of the same session cancelled in the
   * same step as the completion (answers written into the array); only
   * when the completion itself is ES_COMPLETED and not a replay. */
  es_cancel *cancel;
  size_t n_cancel;
  int rc;        /* out: what es_store_complete would have returned */
  int outcome;   /* out: ES_COMPLETED or ES_SUPERSEDED when rc is ES_OK */
  es_err err;    /* out: when rc is not ES_OK */
} es_completion;

/* The n completions in one transaction (one commit, one sync), each with
 * es_store_complete's rules and its own answer in v[i] (the appended events
 * are not returned). Returns ES_OK when every item has its own answer; a
 * failure of the whole call (STORAGE: the transaction did not commit,
 * CLOSED) is returned and also set on every item that passed the argument
 * checks. A tenant or sharded store completes the items one by one. */
int es_store_complete_many(es_store *s, es_completion *v, size_t n, es_err *err);
/* One completion with its cancels (es_store_complete with c->cancel):
 * c's rc is also returned, c->outcome set, *out the appended events. */
int es_store_complete_cancel(es_store *s, es_completion *c, es_events *out, es_err *err);

/* *outcome: ES_FAILED, ES_DEAD_LETTERED or ES_SUPERSEDED; *failures the
 * count after the call. max_failures >= 1; retry_after_ms >= 0. */
int es_store_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                  const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                  int64_t *failures, es_err *err);

/* A dead letter back to pending (failures reset) / marked processed.
 * NO_SUCH_EVENT for a missing index; INVALID_ARGUMENT when it is not dead. */
int es_store_revive(es_store *s, const char *session, int64_t index, es_err *err);
int es_store_settle(es_store *s, const char *session, int64_t index, const char *reason, es_err *err);

/* §3.2 cancel: a pending event that no live claim holds (a timer not yet
 * due included) becomes processed without being handled; reason (NULL:
 * "cancelled") is kept as its record's `cancelled`. *out (may be NULL)
 * the event after the call. Cancelling a cancelled event changes nothing;
 * a processed, dead or live-claimed one is INVALID_ARGUMENT naming its
 * state; a missing index NO_SUCH_EVENT. */
int es_store_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                    es_event *out, es_err *err);
/* The reason an event was cancelled with, NULL when it was not. A
 * cancelled event is stored processed by no attempt
 * (processed_by_attempt 0) with the reason as its last_error; every face
 * shows it as `cancelled` through this. Borrowed from e. */
const char *es_event_cancelled(const es_event *e);

/* Dead letters (session NULL: all) with position > after, position order. */
int es_store_dead_letters(es_store *s, const char *session, int64_t after, int64_t limit,
                          es_events *out, es_err *err);

/* 3.3 Snapshots ---------------------------------------------------------- */

typedef struct es_snapshot {
  char *reducer;
  int64_t index;
  char *state;      /* bytes, owned */
  size_t state_len;
  char *version;
  int64_t updated_at;
} es_snapshot;

typedef struct es_snapshots {
  es_snapshot *v;
  size_t n;
  size_t cap;
} es_snapshots;

void es_snapshot_destroy(es_snapshot *sn);
void es_snapshots_destroy(es_snapshots *list);

/* The newest snapshot (*found = 0 when none) and the events after it. */
int es_store_read_state(es_store *s, const char *session, const char *reducer, int *found,
                        es_snapshot *snap, es_events *events, es_err *err);
/* Guarded upsert: ignored (*stored = 0) when a snapshot of a higher index
 * exists; an equal index replaces. index must be 0..head (NO_SUCH_EVENT). */
int es_store_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                          const char *state, size_t state_len, const char *version, int *stored,
                          es_err *err);
/* The session's snapshots by reducer name (state left NULL). */
int es_store_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err);

/* 3.4 Inspection --------------------------------------------------------- */

typedef struct es_session_info {
  char *session;
  int64_t head;       /* highest index */
  int64_t events;
  int64_t pending;
  int64_t dead;
  int64_t attempts;
  int64_t failures;
  int64_t first_at;
  int64_t updated_at;
  /* §3.8, kept on the session row so every write checks them for free: */
  int64_t fence;            /* the current fence token; 0: never fenced */
  int64_t sealed_at;        /* ES_NONE: open */
  char *seal_reason;        /* owned; NULL: none given (or open) */
  char *lease_holder;       /* owned; NULL: never leased or released (may have expired) */
  int64_t lease_token;      /* the fence token the lease took */
  int64_t lease_expires_at;
  /* §3.7 lineage, written once by fork: */
  char *parent;             /* owned; NULL: not made by fork */
  int64_t fork_at;          /* the parent's index the fork copied through */
  int64_t forked_at;        /* when */
  /* §3.9: */
  int64_t first_index;      /* the lowest index still in the live store (head + 1 when all
                               were dropped); 1 until a truncate. Backends store it; 0 read
                               back from an old row means 1. */
  int64_t archived_through; /* §3.9: events first_index..archived_through live in segment
                               files, not rows; 0: none archived */
} es_session_info;

typedef struct es_sessions {
  es_session_info *v;
  size_t n;
  size_t cap;
  char *cursor;  /* owned; NULL when no more pages */
} es_sessions;

void es_session_info_destroy(es_session_info *si);
void es_sessions_destroy(es_sessions *list);

/* Sessions whose name starts with prefix and sorts after `after` (NULL:
 * from the start), byte order, at most limit (> 0). */
int es_store_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                      es_sessions *out, es_err *err);
/* One page; through ES_NONE pins the current head into *through_out. */
int es_store_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                         int64_t limit, es_events *out, int64_t *through_out, es_err *err);

/* Pending events per type: what claim_next{types} leaves behind for other
 * engines ("N pending events of types a, b have no handler here"). */
typedef struct es_type_count {
  char *type;       /* owned */
  int64_t pending;  /* events of that type neither processed nor dead (> 0) */
} es_type_count;

typedef struct es_type_counts {
  es_type_count *v;  /* owned array */
  size_t n;
} es_type_counts;

void es_type_counts_destroy(es_type_counts *list);

/* Every type that has pending events (claimed or not, waiting in a lane or
 * on a timer; not dead, not processed), with their number, in byte order
 * of type. Read from the backends' per-type bookkeeping, never a scan of
 * the history: memory O(T log T) for T types ever stored, sqlite a walk of
 * its index of pending rows by type (O(pending events)). */
int es_store_pending_types(es_store *s, es_type_counts *out, es_err *err);

/* Many sessions' read_state in one call (one read transaction, so the
 * answers are consistent with each other): out[i] for sessions[i]. At most
 * ES_DEFAULT_MAX_BATCH sessions (more: TOO_LARGE). */
typedef struct es_state_read {
  int found;            /* 1: snap holds the newest snapshot */
  es_snapshot snap;
  es_events events;     /* after the snapshot (all events when none) */
} es_state_read;
void es_state_reads_destroy(es_state_read *v, size_t n); /* each entry; not v itself */
int es_store_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                         es_state_read *out, es_err *err);

/* 3.5 Waiting ------------------------------------------------------------ */

/* Events after `after` (an index; a position when session is NULL), waiting
 * up to timeout_ms for some to exist. Sees other processes' commits where
 * the backend can (sqlite: within ~100 ms). Returns ES_OK with an empty
 * list on timeout. */
int es_store_wait(es_store *s, const char *session, int64_t after, int64_t timeout_ms,
                  int64_t limit, es_events *out, es_err *err);

/* 3.6 Presence ----------------------------------------------------------- */

typedef struct es_presence_row {
  char *participant;
  char *field;
  char *value;       /* canonical JSON; NULL: a tombstone (deleted field) */
  size_t value_len;
  int64_t seen;
  int64_t at;
  int64_t expires_at;
} es_presence_row;

typedef struct es_presence_rows {
  es_presence_row *v;
  size_t n;
  size_t cap;
} es_presence_rows;

void es_presence_rows_destroy(es_presence_rows *rows);

/* One field of a presence write: value NULL deletes (tombstone). Borrowed. */
typedef struct es_presence_field {
  const char *field;
  const char *value;
  size_t value_len;
} es_presence_field;

/* Applies each field whose stored `at` is not newer than at (ES_NONE: now).
 * applied receives the fields that won (value NULL for a deletion), with
 * participant/seen/at set. ttl_ms > 0. */
int es_store_presence_set(es_store *s, const char *ns, const char *participant,
                          const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                          int64_t seen, es_presence_rows *applied, es_err *err);
/* Live rows of ns (no tombstones, nothing expired), by participant, field. */
int es_store_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err);

/* In-process presence notification: cb runs after commit, on the writing
 * thread, with the applied fields (borrowed for the call). Returns a token
 * for es_store_presence_unwatch, or 0 when out of memory. */
typedef void (*es_presence_cb)(void *ctx, const char *ns, const es_presence_rows *applied);
uint64_t es_store_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx);
void es_store_presence_unwatch(es_store *s, uint64_t token);

/* 3.7 Branches ----------------------------------------------------------- */

/* A lineage record: `session` was forked from `parent` at index `at`. */
typedef struct es_lineage {
  char *session;  /* owned */
  char *parent;   /* owned */
  int64_t at;
  int64_t created_at;
} es_lineage;

typedef struct es_lineages {
  es_lineage *v;
  size_t n;
  size_t cap;
} es_lineages;

void es_lineage_destroy(es_lineage *l);
void es_lineages_destroy(es_lineages *list);

/* Creates session `to` whose events 1..at are copies of `from`'s (same
 * type, payload, lane, cause, not_before, created_at; fresh ids; origin =
 * {from, index}; all processed) and carries over from's snapshots at index
 * <= at, in one atomic call; records the lineage (*out). `from` is not
 * changed. Errors: NOT_FOUND (`from` does not exist), INVALID_ARGUMENT (`to`
 * has events or was forked before, `to` == `from`, at < 0), NO_SUCH_EVENT
 * (at > head(from)), SEALED (`to` is sealed), TOO_LARGE, STORAGE, CLOSED. */
int es_store_fork(es_store *s, const char *from, int64_t at, const char *to, es_lineage *out,
                  es_err *err);
/* The session's lineage record; *found = 0 when it was not made by fork. */
int es_store_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err);
/* Lineage records of sessions forked from `session`, by session name in
 * byte order, names > after (NULL: from the start), at most limit (>= 1). */
int es_store_children(es_store *s, const char *session, const char *after, int64_t limit,
                      es_lineages *out, es_err *err);

/* A ref: a named pointer to a session. */
typedef struct es_ref {
  char *name;     /* owned */
  char *session;  /* owned */
  int64_t head;   /* the session's head when read (never stored) */
  int64_t created_at;
  int64_t updated_at;
  /* §3.7 the lineage of the session it names (never stored with the ref):
   * the session it was forked from (owned) and at which index; NULL and
   * ES_NONE when it was not forked. */
  char *parent;
  int64_t at;
} es_ref;

typedef struct es_refs {
  es_ref *v;
  size_t n;
  size_t cap;
} es_refs;

void es_ref_init(es_ref *r);
void es_ref_destroy(es_ref *r);
void es_refs_destroy(es_refs *list);
int es_ref_copy(es_ref *dst, const es_ref *src);

/* Points ref `name` at `session` (insert or move); *out the ref after. */
int es_store_put_ref(es_store *s, const char *name, const char *session, es_ref *out, es_err *err);
/* *found = 0 when the ref does not exist. */
int es_store_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
/* Refs with name > after (NULL: from the start), byte order, at most limit
 * (>= 1, else INVALID_ARGUMENT). */
int es_store_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err);
/* Removes the ref; absent: ES_OK (*deleted = 0). */
int es_store_delete_ref(es_store *s, const char *name, int *deleted, es_err *err);
/* Points to_ref at the session from_ref names (NOT_FOUND when from_ref is
 * missing). has_expect 0: last writer wins. has_expect 1: a compare-and-set:
 * to_ref must name `expect` now (expect NULL: must not exist), else
 * REF_CONFLICT with *actual set (malloc'd, the session to_ref names, NULL
 * when it does not exist; the caller frees it) and nothing moves. *out the
 * ref after the move. */
int es_store_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                     const char *expect, es_ref *out, char **actual, es_err *err);

/* 3.8 Fences, leases, seals --------------------------------------------- */

/* A new fence token for the session (greater than every earlier one;
 * the first is 1). if_token: ES_NONE, or the token that must still be
 * current (0: never fenced), else STALE_FENCE and nothing changes. */
int es_store_fence(es_store *s, const char *session, int64_t if_token, int64_t *token, es_err *err);

typedef struct es_lease {
  int acquired;        /* 1: holder has the lease; 0: another holder has it */
  char *holder;        /* owned: the lease's holder */
  int64_t token;       /* the lease's fence token (when acquired) */
  int64_t expires_at;
} es_lease;
void es_lease_destroy(es_lease *l);

/* Takes (or, for the same holder, renews) the session's lease until now +
 * ttl_ms (> 0). A holder that already holds a live lease keeps its token
 * (unless a fence was taken since: then it gets a new one); anyone else
 * acquiring a free or expired lease takes a new fence token, so the
 * previous holder's fenced writes fail with STALE_FENCE. A live lease of
 * another holder: out->acquired = 0 with that holder and its expiry. */
int es_store_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                   es_lease *out, es_err *err);
/* Ends the lease early when holder and token name the current lease
 * (*released = 1); otherwise changes nothing (*released = 0). */
int es_store_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                           int *released, es_err *err);
/* Seals the session (no more events; reason may be NULL, kept cleaned as
 * es_text_clean does). Sealing a sealed session changes nothing. */
int es_store_seal(es_store *s, const char *session, const char *reason, es_err *err);

/* 3.9 Retention ---------------------------------------------------------- */

/* Drops events 1..through of the session from the live store: indexes and
 * positions never shift, the head stays; reads below the new first_index
 * are TRUNCATED. through: 0..head (NO_SUCH_EVENT above; a session without a
 * row has head 0). Already dropped (through < first_index): nothing to do.
 * Any event in the range pending or dead: INVALID_ARGUMENT, nothing
 * dropped. Costs O(events dropped). *first_index: the session's after. */
int es_store_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                      es_err *err);
/* Removes the session: its events (pending ones are never dispatched),
 * snapshots, the refs naming it, its lineage record, lease, fence and seal
 * (its row). Its ids and its name may be used again; other sessions'
 * positions do not change. *deleted: whether it existed. Costs O(its
 * events + its snapshots + the refs naming it). */
int es_store_delete(es_store *s, const char *session, int *deleted, es_err *err);

/* 3.9 Archive (archive.c) ------------------------------------------------ */

/* One segment file of a session: events from..through (all of them, dense)
 * in an immutable, compressed, checksummed file (docs/retention.md,
 * "Archive"). The row the store keeps for it; the file's header repeats
 * from, through, count and the checksum, and a read checks both agree. */
typedef struct es_segment {
  int64_t from, through;   /* the index range it holds */
  int64_t count;           /* events in it (through - from + 1) */
  int64_t bytes;           /* the file's size */
  char checksum[65];       /* BLAKE2b-256 of header fields and compressed body, lowercase hex */
  char *file;              /* owned: its path relative to the archive directory */
  int64_t created_at;      /* when it was written */
} es_segment;

typedef struct es_segments {
  es_segment *v;  /* owned array, ascending from */
  size_t n;
  size_t cap;
} es_segments;

void es_segment_init(es_segment *g);
void es_segment_destroy(es_segment *g);
int es_segment_copy(es_segment *dst, const es_segment *src); /* ES_OK or ES_STORAGE */
void es_segments_destroy(es_segments *list);

/* §3.9 archived: one session that has segments, and the highest index
 * they hold. */
typedef struct es_archived_row {
  char *session;             /* owned */
  int64_t archived_through;
} es_archived_row;

typedef struct es_archived {
  es_archived_row *v;        /* owned array, byte order of session */
  size_t n;
  size_t cap;
  char *cursor;              /* owned: the last session when more follow, else NULL */
} es_archived;
void es_archived_destroy(es_archived *list);

/* The sessions that have segments, name > after (NULL: from the start),
 * byte order, at most limit (>= 1, else INVALID_ARGUMENT). */
int es_store_archived(es_store *s, const char *after, int64_t limit, es_archived *out, es_err *err);

/* Moves the session's events first_index..through (those not archived
 * yet) into a new segment file under the store's archive directory and
 * drops their rows, in one write step: the file is written under a
 * temporary name, synced, renamed and its directory synced before the
 * transaction that records it and drops the rows commits. *written 1 and
 * *out the new segment; *written 0 (out untouched) when everything through
 * there is archived already (or dropped by truncate): archiving is
 * idempotent. Errors: INVALID_ARGUMENT (no archive directory, through < 0,
 * a pending or dead event in the range: named, nothing changed),
 * NO_SUCH_EVENT (through > head), STORAGE (the file could not be written:
 * nothing changed), CLOSED. */
int es_store_archive(es_store *s, const char *session, int64_t through, int *written,
                     es_segment *out, es_err *err);
/* The session's segments, ascending from (empty when none). */
int es_store_segments(es_store *s, const char *session, es_segments *out, es_err *err);
/* Merges the session's adjacent segments into as few files as the size
 * cap allows (ES_ARCHIVE_MERGE_MAX_RAW bytes of decoded events per file),
 * with compare-and-set on the segment list: the merged files are built
 * without the write lock, and installed only if the list is still the one
 * they were built from (else built again, a few times, then STORAGE
 * saying the list kept changing). *before / *after: segments before and
 * after. Nothing to merge: *after == *before, nothing written. */
#define ES_ARCHIVE_MERGE_MAX_RAW ((int64_t)64 << 20)
int es_store_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                             es_err *err);

/* What verify_archive found wrong with one file. */
typedef struct es_archive_problem {
  char *session;   /* owned; NULL for an orphan file (its directory names no session) */
  char *file;      /* owned, relative to the archive directory */
  char *problem;   /* owned: "missing", "corrupt: ...", "mismatch: ...", or for
                      orphans "orphan: ..." */
} es_archive_problem;

typedef struct es_archive_report {
  es_archive_problem *problems;  /* owned array: recorded segments that do not read back */
  size_t n_problems, cap_problems;
  es_archive_problem *orphans;   /* owned array: files in the archive no segment row names */
  size_t n_orphans, cap_orphans;
  int64_t checked;               /* segment files re-read */
} es_archive_report;

void es_archive_report_destroy(es_archive_report *r);
/* Re-reads every segment file of the session (NULL: of every session),
 * recomputes its checksum and compares its header with its row. Orphans
 * (files no row names: left by a crash, or being written right now by
 * another process) are listed apart and are not problems. */
int es_store_verify_archive(es_store *s, const char *session, es_archive_report *out,
                            es_err *err);

/* 3.10 Crypto-shredding (crypto.c) ---------------------------------------- */

/* A store opened with es_open_opts.keys_path seals the payload of every
 * event appended with es_new_event.key (append, complete, fork copies):
 * XChaCha20-Poly1305 under that key's data key, the event id and key name
 * bound in as associated data. Backends keep the sealed text ("es1:" +
 * base64url of nonce || ciphertext) and es_event.key; every call that
 * returns events opens them again, so callers see the plaintext payload,
 * or payload NULL with shredded = 1 once the key was shredded. A keyed
 * event whose key is live, read through a store opened without keys_path,
 * is INVALID_ARGUMENT (the call names the event and the key); a sealed
 * payload that fails authentication is STORAGE naming the event, never
 * other data. docs/shredding.md says what is and is not guaranteed. */

/* Destroys data key `name` (a name, es_check_name) in one write
 * transaction: its wrapped copy is erased (the row stays as a tombstone
 * with shredded_at, so the name can never seal new data), and in every
 * session holding events under it the snapshots at or after the first
 * such event are dropped (they may have folded the plaintext). Then the
 * backend scrubs what it freed (sqlite: secure_delete, plus a TRUNCATE
 * checkpoint so the WAL keeps no old page). *was_live: 1 when a live key
 * was destroyed by this call; 0 when it was already shredded or never
 * used (a tombstone is written then too). Irreversible and idempotent;
 * needs no master key (works on a store opened without keys_path).
 * Errors: INVALID_ARGUMENT (name), STORAGE (also when the shred committed
 * but the scrub could not finish: calling shred again finishes it),
 * CLOSED. */
int es_store_shred(es_store *s, const char *name, int *was_live, es_err *err);

/* Events as stored, for audits: es_store_read's range rules, but keyed
 * events keep their sealed text as payload (not JSON), with key set and
 * shredded = 1 when their key was shredded. Needs no master key. */
int es_store_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, es_err *err);

/* 3.11 Tenants (tenant.c) -------------------------------------------------- */

/* A tenant's names are stored as tenant + ES_TENANT_SEP + name: the unit
 * separator, a byte no tenant name may hold, so "a" + SEP + "b\x1fc" can
 * only be tenant "a"'s name "b\x1fc". The root handle (the store as
 * opened) sees every tenant's data under these stored names. */
#define ES_TENANT_SEP "\x1f"
#define ES_MAX_TENANT_BYTES 64
/* A name as stored: a tenant prefix and a name of ES_MAX_ID_BYTES. Buffers
 * that may hold a stored name (an id generated inside a tenant's call)
 * are this long plus the NUL. */
#define ES_MAX_NAME_BYTES (ES_MAX_TENANT_BYTES + 1 + ES_MAX_ID_BYTES)

/* A handle scoped to tenant `name` (1..ES_MAX_TENANT_BYTES bytes of valid
 * UTF-8, no byte below 0x20) of the store s, which must not itself be a
 * tenant handle (no nesting): INVALID_ARGUMENT otherwise. Every es_store_*
 * call through *out takes and returns the tenant's own names (without the
 * prefix) and sees only the tenant's sessions, events, refs, dead letters,
 * presence namespaces and pending types. *out holds a reference to s
 * (es_store_release(*out) drops it); es_store_close(*out) closes only the
 * handle, es_store_close(s) makes its tenant handles' calls CLOSED. */
int es_store_tenant(es_store *s, const char *name, es_store **out, es_err *err);
/* The tenant's name, or NULL for a store that is not a tenant handle.
 * Borrowed: valid while the handle lives. */
const char *es_store_tenant_name(const es_store *s);

/* §3.1 what a handle can do, so callers need not guess from its URL.
 * The strings are static or borrowed from the handle (valid while it
 * lives). CLOSED on a closed handle. */
typedef struct es_capabilities {
  const char *backend; /* "memory", "sqlite", "postgres" or "shards" */
  const char *tenant;  /* the tenant's name on a tenant handle, else NULL */
  int durable;         /* 1: a commit survives the process that made it */
  int processes;       /* 1: other processes may use the same store at once */
  int keys;            /* 1: opened with keys (§3.10): appends may seal payloads */
  int archive;         /* 1: opened with an archive (§3.9): archive() may move events out */
  int sharded;         /* 1: a shards: router (§5) */
} es_capabilities;
int es_store_capabilities(es_store *s, es_capabilities *out, es_err *err);

/* Row helpers (rows.c): init to empty, deep copy (ES_STORAGE on OOM). */
/* Makes room for `need` elements of `elem` bytes in the array *v of *cap
 * (doubling); ES_OK or ES_STORAGE (then *v and *cap are unchanged). */
int es_grow(void **v, size_t *cap, size_t need, size_t elem);
void es_session_info_init(es_session_info *si);
int es_session_info_copy(es_session_info *dst, const es_session_info *src);
void es_snapshot_init(es_snapshot *sn);
int es_snapshot_copy(es_snapshot *dst, const es_snapshot *src);
void es_presence_row_init(es_presence_row *r);
void es_presence_row_destroy(es_presence_row *r);
int es_presence_row_copy(es_presence_row *dst, const es_presence_row *src);

/* 3.12 Stats (stats.c, docs/stats.md) -------------------------------------- */

/* Store-wide counts, kept by the backend as rows change (never a walk):
 * sessions (with a session row, as es_store_sessions lists them), events
 * (readable: live rows and archived ones, not truncated or deleted),
 * pending (stored, not processed, not dead) and dead (dead letters). */
typedef struct es_counts {
  int64_t sessions, events, pending, dead;
} es_counts;

/* The counts of the store (a tenant handle: of its tenant's sessions; a
 * sharded handle: summed over its shards). O(1) (a sharded handle: one
 * read per shard). Errors: STORAGE, CLOSED. */
int es_store_counts(es_store *s, es_counts *out, es_err *err);

/* One op's figures since the handle was opened (latencies in ns: a
 * percentile is the upper bound of its histogram bucket, at most 12.5%
 * above the true value and never above max_ns). */
typedef struct es_call_stats {
  const char *op;            /* static: the Lua method's name, e.g. "append" */
  uint64_t count, errors;    /* calls, and those that returned an error */
  uint64_t p50_ns, p99_ns, max_ns;
} es_call_stats;

/* Fills out[0..n) with the ops called at least once on this handle (a
 * store's include its tenant handles' calls), in a fixed order; *n <= cap.
 * ES_STATS_MAX_OPS is always enough. Never fails, takes no lock. */
#define ES_STATS_MAX_OPS 64
void es_store_call_stats(es_store *s, es_call_stats *out, size_t cap, size_t *n);
/* Bench only (bench/README.md "Stats cost"): on 0 this handle stops
 * counting its calls, on 1 starts again. Stats are otherwise always on. */
void es_store_stats_enable(es_store *s, int on);

#endif
