/*
 * es.h: what every eventstore C file shares: result codes, the error
 * out-parameter, the "no value" marker for optional integers, and the
 * clock hook.
 *
 * Convention (docs/architecture.md "Conventions" 4): every function returns int, ES_OK (0) on success,
 * otherwise one of the codes below; a human-readable message goes into the
 * caller's es_err (never a global, never errno).
 */
#ifndef ES_H
#define ES_H

#include <stddef.h>
#include <stdint.h>

/* Result codes. The first block is the public contract (docs/contract.md §2): each
 * maps 1:1 to the Lua error code of the same name. */
enum {
  ES_OK = 0,
  ES_PARTIAL_DUPLICATE_BATCH, /* batch repeats an id, mixes stored/fresh ids, or uses another session's id */
  ES_ID_CONFLICT,             /* idempotent replay names an id whose stored type/payload differs */
  ES_SUPERSEDED_ATTEMPT,      /* an append's cause names an attempt that no longer owns its event */
  ES_NO_SUCH_EVENT,           /* an index that does not exist in that session */
  ES_WRONG_EXPECTED_HEAD,     /* append{expected = n} and the head is not n */
  ES_STALE_FENCE,             /* a write's fence token is not the session's current one (§3.8) */
  ES_SEALED,                  /* an append to a sealed session (§3.8) */
  ES_TRUNCATED,               /* a read or fold that needs events dropped by truncate (§3.9) */
  ES_REF_CONFLICT,            /* a compare-and-set on a branch ref lost (§3.7) */
  ES_NOT_FOUND,               /* a ref, session or snapshot that does not exist where required;
                                 backends also return it for "no such row" */
  ES_INVALID_ARGUMENT,        /* well-typed but unacceptable value */
  ES_TOO_LARGE,               /* a payload or batch over its limit */
  ES_STORAGE,                 /* the backend failed (I/O, disk full, out of memory) */
  ES_CLOSED,                  /* the store was closed */
  ES_NCODES
};

/* "No value" for optional integer fields (times, indexes). Chosen over 0
 * because 0 is a legitimate time under an injected clock. */
#define ES_NONE INT64_MIN

#define ES_ERRMSG_MAX 512

/* Where a failing call explains itself. Owned by the caller, one per call
 * (so several threads can share a store without sharing messages). */
typedef struct es_err {
  int code;                 /* the code the call returned */
  char msg[ES_ERRMSG_MAX];  /* NUL-terminated, without the code prefix */
} es_err;

/* The code's contract name, e.g. "WRONG_EXPECTED_HEAD"; "OK" for 0. Static. */
const char *es_strerror(int code);

/* Records code and a printf-style message into err (err may be NULL) and
 * returns code, so callers can write `return es_fail(err, ES_X, "...")`. */
int es_fail(es_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A clock: writes milliseconds since the Unix epoch into *now_ms. Returns
 * ES_OK or an error code (with err filled) when the clock cannot answer.
 * Called once per store call, on the calling thread. */
typedef int (*es_clock_fn)(void *ctx, int64_t *now_ms, es_err *err);

/* The system clock (CLOCK_REALTIME), usable as an es_clock_fn with ctx NULL. */
int es_clock_system(void *ctx, int64_t *now_ms, es_err *err);

#endif
