/*
 * segment_fuzz.c: a libFuzzer target for the archive segment file codec
 * (store/segment.h, docs/retention.md "Archive"). Segment files are outside
 * input: anything on disk under the archive directory may have been
 * damaged or replaced. Built and run by `make fuzz`; see fuzz/README.md.
 *
 * Each input is used twice:
 *   1. as a whole file image: es_seg_parse must refuse it or accept it, and
 *      an accepted image must inflate and walk (or be refused) without a
 *      memory error. Random bytes almost never pass the checksum, so this
 *      mostly exercises the header checks;
 *   2. as a raw body behind a valid header and checksum (es_seg_build
 *      makes them), so the decompressor's output and the event walk see
 *      arbitrary bytes: es_seg_each must reject a malformed body with a
 *      reason, and every event it does hand out must have NUL-terminated
 *      strings inside the body and an index in the declared range.
 * A broken invariant aborts, which libFuzzer reports with the input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/segment.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  const es_seg_info *info;
  int64_t seen;
} walk;

static int check_event(void *ctx, const es_event *e) {
  walk *w = ctx;
  if (e->index < w->info->from || e->index > w->info->through) abort();
  /* touching every byte lets AddressSanitizer catch a string that runs
   * past the body */
  const char *strs[] = {e->id, e->type, e->lane, e->last_error, e->claim_holder,
                        e->origin_session, e->key};
  size_t sum = 0;
  for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
    if (strs[i]) sum += strlen(strs[i]);
  for (size_t i = 0; e->payload && i < e->payload_len; i++) sum += (unsigned char)e->payload[i];
  w->seen += (int64_t)(sum & 1) + 1;
  return 0;
}

static void walk_image(const unsigned char *file, size_t len, int must_parse) {
  es_seg_info info;
  const char *why = NULL;
  if (es_seg_parse(file, len, &info, &why) != 0) {
    if (must_parse || !why) abort(); /* a refusal says why; our own image parses */
    return;
  }
  unsigned char *raw = NULL;
  if (es_seg_inflate(file, &info, &raw, &why) != 0) {
    if (raw || !why) abort();
    return;
  }
  walk w = {&info, 0};
  why = NULL;
  int rc = es_seg_each(&info, raw, INT64_MIN, INT64_MAX, check_event, &w, &why);
  if (rc < 0 && !why) abort();
  if (rc == 0 && w.seen < info.count) abort(); /* a clean walk handed out every event */
  free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  walk_image(data, size, 0);
  if (size < 2) return 0;
  int64_t from = 1 + data[0];
  int64_t count = data[1] % 8;
  unsigned char *file = NULL;
  size_t len = 0;
  es_seg_info info;
  es_err err = {0};
  if (es_seg_build("fuzz-session", from, from + count - 1, count, data + 2, size - 2, 1, &file,
                   &len, &info, &err) == ES_OK) {
    walk_image(file, len, 1);
    free(file);
  }
  return 0;
}
