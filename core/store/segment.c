/*
 * segment.c: encode, check and decode archive segment file images
 * (segment.h has the format).
 */
#include "store/segment.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define NO_STR 0xFFFFFFFFu

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

void es_seg_hex(const unsigned char *v, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[v[i] >> 4];
    out[2 * i + 1] = digits[v[i] & 15];
  }
  out[2 * n] = '\0';
}

/* ---- raw body ------------------------------------------------------------ */

static int add_str(es_buf *raw, const char *s, size_t n) {
  unsigned char len[4];
  if (!s) {
    put_u32(len, NO_STR);
    return es_buf_add(raw, len, 4);
  }
  if (n >= NO_STR) return ES_STORAGE;
  put_u32(len, (uint32_t)n);
  int rc = es_buf_add(raw, len, 4);
  if (rc == ES_OK) rc = es_buf_add(raw, s, n);
  if (rc == ES_OK) rc = es_buf_addc(raw, '\0');
  return rc;
}

int es_seg_raw_add(es_buf *raw, const es_event *e) {
  const int64_t ints[ES_SEG_INTS] = {
      e->index, e->position, e->created_at, e->cause_index, e->cause_attempt, e->not_before,
      e->status, e->attempts, e->failures, e->processed_at, e->claim_expires_at, e->retry_at,
      e->first_claimed_at, e->last_claimed_at, e->failed_at, e->processed_by_attempt,
      e->origin_index, e->returned, e->last_failed_attempt, e->queued, e->due_at, e->revision};
  unsigned char b[ES_SEG_INTS * 8];
  for (int i = 0; i < ES_SEG_INTS; i++) put_u64(b + 8 * i, (uint64_t)ints[i]);
  int rc = es_buf_add(raw, b, sizeof b);
  const char *strs[ES_SEG_STRS] = {e->id,         e->type,         e->payload,
                                   e->lane,       e->last_error,   e->claim_holder,
                                   e->origin_session, e->key,      e->meta};
  for (int i = 0; rc == ES_OK && i < ES_SEG_STRS; i++) {
    size_t n = i == 2 ? e->payload_len : (strs[i] ? strlen(strs[i]) : 0);
    rc = add_str(raw, strs[i], n);
  }
  return rc;
}

/* ---- the file ------------------------------------------------------------ */

/* BLAKE2b-256 of the header before the checksum and of the stored body. */
static void checksum(const unsigned char *file, size_t head, const unsigned char *body,
                     size_t body_len, unsigned char out[ES_SEG_SUM]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, ES_SEG_SUM);
  crypto_generichash_update(&st, file, head);
  crypto_generichash_update(&st, body, body_len);
  crypto_generichash_final(&st, out, ES_SEG_SUM);
}

int es_seg_build(const char *session, int64_t from, int64_t through, int64_t count,
                 const unsigned char *raw, size_t raw_len, int level, unsigned char **file,
                 size_t *len, es_seg_info *info, es_err *err) {
  *file = NULL;
  *len = 0;
  size_t sl = strlen(session);
  if (sl > ES_SEG_MAX_SESSION)
    return es_fail(err, ES_STORAGE, "archive: session name of %zu bytes is too long for a segment", sl);
  size_t head = ES_SEG_FIXED + sl + 1, hl = head + ES_SEG_SUM;
  size_t bound = ZSTD_compressBound(raw_len);
  unsigned char *f = malloc(hl + bound);
  if (!f) return es_fail(err, ES_STORAGE, "archive: out of memory for a segment of %zu bytes", raw_len);
  size_t clen = ZSTD_compress(f + hl, bound, raw, raw_len, level);
  if (ZSTD_isError(clen)) {
    free(f);
    return es_fail(err, ES_STORAGE, "archive: zstd: %s", ZSTD_getErrorName(clen));
  }
  memcpy(f, ES_SEG_MAGIC, 8);
  put_u32(f + 8, ES_SEG_VERSION);
  put_u32(f + 12, (uint32_t)sl);
  put_u64(f + 16, (uint64_t)from);
  put_u64(f + 24, (uint64_t)through);
  put_u64(f + 32, (uint64_t)count);
  put_u64(f + 40, raw_len);
  put_u64(f + 48, clen);
  memcpy(f + ES_SEG_FIXED, session, sl + 1);
  checksum(f, head, f + hl, clen, f + head);
  *file = f;
  *len = hl + clen;
  if (es_seg_parse(f, *len, info, NULL) != 0) {  /* what we wrote must read back */
    free(f);
    *file = NULL;
    return es_fail(err, ES_STORAGE, "archive: a segment just built does not parse");
  }
  return ES_OK;
}

/* The integers and strings of an event in info's format version. */
static size_t seg_ints(const es_seg_info *info) { return info->version == 1 ? 21 : ES_SEG_INTS; }
static size_t seg_strs(const es_seg_info *info) { return info->version == 1 ? 8 : ES_SEG_STRS; }

static int bad(const char **why, const char *text) {
  if (why) *why = text;
  return -1;
}

int es_seg_parse(const unsigned char *file, size_t len, es_seg_info *info, const char **why) {
  memset(info, 0, sizeof *info);
  if (len < ES_SEG_FIXED || memcmp(file, ES_SEG_MAGIC, 8) != 0)
    return bad(why, "not a segment file (no ESSEGMNT header)");
  uint32_t version = get_u32(file + 8);
  if (version != 1 && version != ES_SEG_VERSION) return bad(why, "unknown segment format version");
  info->version = (int)version;
  uint32_t sl = get_u32(file + 12);
  if (sl > ES_SEG_MAX_SESSION) return bad(why, "header: session name length out of range");
  size_t head = ES_SEG_FIXED + (size_t)sl + 1, hl = head + ES_SEG_SUM;
  if (len < hl) return bad(why, "file shorter than its header");
  if (file[ES_SEG_FIXED + sl] != '\0' || memchr(file + ES_SEG_FIXED, '\0', sl))
    return bad(why, "header: session name is not one NUL-terminated string");
  info->session = (const char *)file + ES_SEG_FIXED;
  info->session_len = sl;
  info->from = (int64_t)get_u64(file + 16);
  info->through = (int64_t)get_u64(file + 24);
  info->count = (int64_t)get_u64(file + 32);
  info->raw_len = get_u64(file + 40);
  info->comp_len = get_u64(file + 48);
  info->header_len = hl;
  memcpy(info->checksum, file + head, ES_SEG_SUM);
  if (info->from < 1 || info->through < info->from || info->count != info->through - info->from + 1)
    return bad(why, "header: index range and event count disagree");
  if (info->comp_len != len - hl) return bad(why, "file size differs from its header (cut or extended)");
  /* every event takes at least its integers and its string lengths */
  if (info->raw_len / (seg_ints(info) * 8 + seg_strs(info) * 4) < (uint64_t)info->count)
    return bad(why, "header: raw length too small for its event count");
  unsigned char sum[ES_SEG_SUM];
  checksum(file, head, file + hl, (size_t)info->comp_len, sum);
  if (sodium_memcmp(sum, info->checksum, ES_SEG_SUM) != 0) return bad(why, "checksum mismatch");
  return 0;
}

int es_seg_inflate(const unsigned char *file, const es_seg_info *info, unsigned char **raw,
                   const char **why) {
  *raw = NULL;
  if (info->raw_len > SIZE_MAX / 2) return bad(why, "header: raw length too large");
  unsigned long long fcs = ZSTD_getFrameContentSize(file + info->header_len, (size_t)info->comp_len);
  if (fcs != info->raw_len) return bad(why, "body: zstd frame size differs from the header");
  unsigned char *r = malloc(info->raw_len ? (size_t)info->raw_len : 1);
  if (!r) return bad(why, "out of memory decompressing the body");
  size_t n = ZSTD_decompress(r, (size_t)info->raw_len, file + info->header_len, (size_t)info->comp_len);
  if (ZSTD_isError(n) || n != info->raw_len) {
    free(r);
    return bad(why, "body: zstd cannot decompress it");
  }
  *raw = r;
  return 0;
}

/* Reads one string at *p (bounded by end): NULL for an absent one.
 * name: no NUL inside (a name or text), else any bytes (a payload). */
static int get_str(const unsigned char **p, const unsigned char *end, int name, const char **out,
                   size_t *len) {
  if ((size_t)(end - *p) < 4) return -1;
  uint32_t n = get_u32(*p);
  *p += 4;
  if (n == NO_STR) {
    *out = NULL;
    *len = 0;
    return 0;
  }
  if ((size_t)(end - *p) < (size_t)n + 1 || (*p)[n] != '\0') return -1;
  if (name && memchr(*p, '\0', n)) return -1;
  *out = (const char *)*p;
  *len = n;
  *p += (size_t)n + 1;
  return 0;
}

int es_seg_each(const es_seg_info *info, const unsigned char *raw, int64_t lo, int64_t hi,
                es_event_cb cb, void *ctx, const char **why) {
  const unsigned char *p = raw, *end = raw + info->raw_len;
  int64_t k = 0;
  size_t n_ints = seg_ints(info), n_strs = seg_strs(info);
  for (; p < end; k++) {
    if (k >= info->count) return bad(why, "body: more events than the header says");
    if ((size_t)(end - p) < n_ints * 8) return bad(why, "body: an event is cut short");
    int64_t v[ES_SEG_INTS];
    v[21] = 1; /* version 1: every event had revision 1 */
    for (size_t i = 0; i < n_ints; i++) v[i] = (int64_t)get_u64(p + 8 * i);
    p += n_ints * 8;
    const char *s[ES_SEG_STRS] = {NULL};
    size_t sl[ES_SEG_STRS] = {0};
    for (size_t i = 0; i < n_strs; i++)
      if (get_str(&p, end, i != 2, &s[i], &sl[i]) != 0) return bad(why, "body: a string is cut short or malformed");
    if (v[0] != info->from + k) return bad(why, "body: event indexes are not the header's range");
    if (v[6] != ES_STATUS_PROCESSED) return bad(why, "body: an archived event is not processed");
    if (!s[0] || !s[1] || !sl[0] || !sl[1]) return bad(why, "body: an event without id or type");
    if (v[21] < 1 || v[21] > ES_MAX_REVISION) return bad(why, "body: an event's revision is out of range");
    if (v[0] < lo || v[0] > hi) continue;
    es_event e;
    es_event_init(&e);
    e.index = v[0];
    e.position = v[1];
    e.created_at = v[2];
    e.cause_index = v[3];
    e.cause_attempt = v[4];
    e.not_before = v[5];
    e.status = (int)v[6];
    e.attempts = v[7];
    e.failures = v[8];
    e.processed_at = v[9];
    e.claim_expires_at = v[10];
    e.retry_at = v[11];
    e.first_claimed_at = v[12];
    e.last_claimed_at = v[13];
    e.failed_at = v[14];
    e.processed_by_attempt = v[15];
    e.origin_index = v[16];
    e.returned = v[17];
    e.last_failed_attempt = v[18];
    e.queued = (int)v[19];
    e.due_at = v[20];
    e.id = (char *)s[0];
    e.type = (char *)s[1];
    e.payload = (char *)s[2];
    e.payload_len = sl[2];
    e.lane = (char *)s[3];
    e.last_error = (char *)s[4];
    e.claim_holder = (char *)s[5];
    e.origin_session = (char *)s[6];
    e.key = (char *)s[7];
    e.revision = v[21];
    e.meta = (char *)s[8];
    e.session = (char *)info->session;
    if (cb(ctx, &e)) return 1;
  }
  if (k != info->count) return bad(why, "body: fewer events than the header says");
  return 0;
}
