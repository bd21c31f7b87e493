/*
 * archive_bench.c: what archive segments cost (docs/contract.md §3.9, issue 10 #6).
 *
 *   build/bench/archive_bench DIR [EVENTS] [SEGMENT]
 *
 * For memory: and sqlite:DIR/archive_bench.db, with the archive directory
 * under DIR: fills session "old" and session "live" with EVENTS settled
 * events each (the sample payload of store_bench.c), then
 *   - archives "old" in steps of SEGMENT events: events/s, MB/s of segment
 *     file written (write + fsync + rename + directory sync + the commit
 *     that drops the rows), and the compression ratio (decoded body bytes
 *     / file bytes; the body holds every field of each event);
 *   - reads both sessions the same ways in alternating rounds, so the
 *     ratio archived / live compares figures from the same run: a full
 *     scan (read of everything, 10,000 at a time) and reads of 100 events
 *     at random offsets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/segment.h"
#include "store/store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const es_err *err) {
  fprintf(stderr, "archive_bench: %s: %s: %s\n", what, es_strerror(err->code), err->msg);
  exit(1);
}

static void fill(es_store *s, const char *session, long n) {
  es_new_event evs[1000];
  for (int i = 0; i < 1000; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = sizeof PAYLOAD - 1;
    evs[i].settled = 1;
  }
  for (long done = 0; done < n;) {
    size_t k = (size_t)(n - done < 1000 ? n - done : 1000);
    int pending;
    es_err err = {0};
    if (es_store_append(s, session, evs, k, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", &err);
    done += (long)k;
  }
}

/* The decoded body size of a segment file (its header says). */
static double raw_bytes(const char *dir, const es_segment *g) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, g->file);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  unsigned char *buf = malloc((size_t)g->bytes);
  size_t n = fread(buf, 1, (size_t)g->bytes, f);
  fclose(f);
  es_seg_info info;
  double raw = 0;
  if (n == (size_t)g->bytes && es_seg_parse(buf, n, &info, NULL) == 0) raw = (double)info.raw_len;
  free(buf);
  return raw;
}

static double scan(es_store *s, const char *session, long n) {
  double t0 = now_s();
  for (long after = 0; after < n; after += 10000) {
    es_events out = {0};
    es_err err = {0};
    if (es_store_read(s, session, after, ES_NONE, 10000, &out, &err)) die("read", &err);
    es_events_destroy(&out);
  }
  return now_s() - t0;
}

static double random_reads(es_store *s, const char *session, long n, int calls, unsigned seed) {
  srand(seed);
  double t0 = now_s();
  for (int i = 0; i < calls; i++) {
    long after = rand() % (n - 100);
    es_events out = {0};
    es_err err = {0};
    if (es_store_read(s, session, after, ES_NONE, 100, &out, &err)) die("read", &err);
    es_events_destroy(&out);
  }
  return now_s() - t0;
}

static void run(const char *label, const char *url, const char *dir, long n, long seg) {
  es_open_opts o = {0};
  o.archive_dir = dir;
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open(url, &o, &s, &err)) die("open", &err);
  fill(s, "old", n);
  fill(s, "live", n);

  double t0 = now_s(), file = 0, raw = 0;
  for (long through = seg; through <= n; through += seg) {
    int written;
    es_segment g;
    if (es_store_archive(s, "old", through, &written, &g, &err)) die("archive", &err);
    file += (double)g.bytes;
    es_segment_destroy(&g);
  }
  double secs = now_s() - t0;
  es_segments list = {0};
  if (es_store_segments(s, "old", &list, &err)) die("segments", &err);
  for (size_t i = 0; i < list.n; i++) raw += raw_bytes(dir, &list.v[i]);
  es_segments_destroy(&list);

  double scan_a = 0, scan_l = 0, rand_a = 0, rand_l = 0;
  int calls = 300;
  for (int round = 0; round < 3; round++) {
    scan_a += scan(s, "old", n);
    scan_l += scan(s, "live", n);
    rand_a += random_reads(s, "old", n, calls, (unsigned)round + 1);
    rand_l += random_reads(s, "live", n, calls, (unsigned)round + 1);
  }
  printf("\n%s: %ld events, archived in segments of %ld\n", label, n, seg);
  printf("  archive: %.0f events/s, %.1f MB/s of segment file written, %.1f MB/s decoded\n",
         (double)n / secs, file / secs / 1e6, raw / secs / 1e6);
  printf("  segment files: %.1f bytes/event, compression ratio %.1f (decoded %.0f bytes/event, payload %zu)\n",
         file / (double)n, raw / file, raw / (double)n, sizeof PAYLOAD - 1);
  printf("  %-34s %12s %12s %8s\n", "read", "archived", "live", "ratio");
  printf("  %-34s %12.0f %12.0f %8.2f\n", "full scan, events/s", 3.0 * (double)n / scan_a,
         3.0 * (double)n / scan_l, scan_a / scan_l);
  printf("  %-34s %12.0f %12.0f %8.2f\n", "100 events at a random offset, /s", 3.0 * calls / rand_a,
         3.0 * calls / rand_l, rand_a / rand_l);
  es_store_release(s);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: archive_bench DIR [EVENTS] [SEGMENT]\n");
    return 2;
  }
  long n = argc > 2 ? atol(argv[2]) : 200000;
  long seg = argc > 3 ? atol(argv[3]) : 10000;
  if (n < 1000 || seg < 1 || n % seg) {
    fprintf(stderr, "archive_bench: EVENTS >= 1000 and a multiple of SEGMENT\n");
    return 2;
  }
  char dir[4096], url[4200];
  snprintf(dir, sizeof dir, "%s/archive-mem", argv[1]);
  run("memory:", "memory:", dir, n, seg);
  snprintf(dir, sizeof dir, "%s/archive-sqlite", argv[1]);
  snprintf(url, sizeof url, "sqlite:%s/archive_bench.db", argv[1]);
  run("sqlite: (durable)", url, dir, n, seg);
  printf("\n(ratio: archived time / live time for the same reads: above 1, archived is slower)\n");
  return 0;
}
