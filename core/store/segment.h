/*
 * segment.h: the archive segment file format (§3.9; archive.c does the
 * files, this does the bytes). No I/O: whole file images in memory.
 *
 * A file, little-endian (docs/retention.md, "Segment files"):
 *
 *   off  size  field
 *   0    8     magic "ESSEGMNT"
 *   8    4     format version (2; 1 still reads)
 *   12   4     session name length L (bytes, at most ES_SEG_MAX_SESSION)
 *   16   8     from       first index it holds
 *   24   8     through    last index it holds
 *   32   8     count      events (through - from + 1)
 *   40   8     raw length       of the decoded body
 *   48   8     compressed length of the body as stored
 *   56   L+1   session name, NUL-terminated
 *   57+L 32    checksum: BLAKE2b-256 of bytes 0 .. 56+L and of the stored body
 *   89+L ...   the body: one zstd frame of the raw body
 *
 * The file is exactly header + compressed length bytes. The raw body is the
 * events one after the other, each: 21 signed 64-bit integers (index,
 * position, created_at, cause_index, cause_attempt, not_before, status,
 * attempts, failures, processed_at, claim_expires_at, retry_at,
 * first_claimed_at, last_claimed_at, failed_at, processed_by_attempt,
 * origin_index, returned, last_failed_attempt, queued, due_at), then 8
 * strings (id, type, payload, lane, last_error, claim_holder,
 * origin_session, key), each a 32-bit length (0xFFFFFFFF: absent), the
 * bytes and a NUL. Version 2 (§3.1) adds a 22nd integer, revision, and a
 * 9th string, meta; a version 1 file (written before events had them)
 * reads its events with revision 1 and no meta. Payloads are kept as
 * stored (a sealed payload's ciphertext with its key name), so a read
 * gives back exactly the row. The raw bodies of adjacent segments of the
 * current version concatenate into the raw body of their merge
 * (compact_archive re-encodes only the events of older files).
 *
 * Decoding never trusts a length: every read is bounds-checked, so a
 * damaged or hostile file is an error naming what is wrong, never a read
 * out of bounds (spec/c/segment_test.c flips and cuts bytes).
 */
#ifndef ES_SEGMENT_H
#define ES_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "store/backend.h"
#include "util/buf.h"

#define ES_SEG_MAGIC "ESSEGMNT"
#define ES_SEG_VERSION 2
#define ES_SEG_FIXED 56          /* header bytes before the session name */
#define ES_SEG_SUM 32            /* checksum bytes */
#define ES_SEG_MAX_SESSION 4096  /* a session name longer than this is not ours */
#define ES_SEG_INTS 22             /* version 1: 21 (no revision) */
#define ES_SEG_STRS 9              /* version 1: 8 (no meta) */

/* What a file's header says (session borrowed from the file image). */
typedef struct es_seg_info {
  const char *session;
  size_t session_len;
  int64_t from, through, count;
  uint64_t raw_len, comp_len;
  unsigned char checksum[ES_SEG_SUM];
  size_t header_len;
  int version;               /* the body's format: 1 or ES_SEG_VERSION */
} es_seg_info;

/* Appends one event to a raw body, in the current version (the caller
 * keeps indexes dense). */
int es_seg_raw_add(es_buf *raw, const es_event *e);

/* Builds a whole file image from a raw body of count events from..through
 * of session, compressing at zstd level `level`. *file (malloc'd, *len
 * bytes) and info (session borrowed from *file) on success. ES_OK, or
 * ES_STORAGE with err filled. */
int es_seg_build(const char *session, int64_t from, int64_t through, int64_t count,
                 const unsigned char *raw, size_t raw_len, int level, unsigned char **file,
                 size_t *len, es_seg_info *info, es_err *err);

/* Checks a file image: magic, version, lengths, that its size is what the
 * header says, and the checksum. *why: a static text saying what is wrong
 * (when it returns nonzero). */
int es_seg_parse(const unsigned char *file, size_t len, es_seg_info *info, const char **why);

/* Decompresses the body of a parsed image into *raw (malloc'd,
 * info->raw_len bytes). Nonzero with *why on failure (NULL *raw). */
int es_seg_inflate(const unsigned char *file, const es_seg_info *info, unsigned char **raw,
                   const char **why);

/* Walks the events of a raw body: checks each (lengths, NULs, dense
 * indexes from info->from, status processed) and hands those with
 * lo <= index <= hi to cb as views (strings borrowed from raw and from
 * info->session; the event's session is info->session). cb returns nonzero
 * to stop early. Walking to the end also checks the count and that no
 * byte is left over. Returns 0, 1 when cb stopped it, or -1 with *why. */
int es_seg_each(const es_seg_info *info, const unsigned char *raw, int64_t lo, int64_t hi,
                es_event_cb cb, void *ctx, const char **why);

/* Lowercase hex of n bytes into out (2n + 1 bytes). */
void es_seg_hex(const unsigned char *v, size_t n, char *out);

#endif
