/*
 * json_test.c: unit tests of the C face of the JSON codec (json.h, buf.h),
 * plus a deterministic mutation fuzzer. Prints TAP-style "ok N - name" /
 * "not ok N - name" lines (spec/run.sh counts them) and exits non-zero on
 * any failure.
 *
 * The fuzzer mutates a corpus of valid JSON texts with a seeded PRNG and
 * checks the codec's invariants on every mutant: validate and canonicalize
 * agree, canonical text is a fixed point, no crash, no leak (glibc's heap
 * counters here; LeakSanitizer when built with -fsanitize=address). Each
 * mutant lives in a buffer of exactly its length, so an over-read is caught
 * by ASan. Iterations: JSON_FUZZ_ITERS (default 200000); seed JSON_FUZZ_SEED.
 */
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "codec/json.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static int test_no = 0, failures = 0;

#if defined(__GLIBC__) && !defined(UNDER_ASAN)
/* Counting allocator: the fuzzer's leak check. glibc supports replacing
 * malloc by defining these four in the program; they forward to glibc's
 * own. (Heap statistics such as mallinfo2 cannot serve: glibc's per-thread
 * cache keeps freed blocks counted as in use.) Under ASan, LeakSanitizer
 * does this job instead. */
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
static long live_blocks;
static long fail_countdown = -1; /* >= 0: that many more allocations succeed, then they fail */

/* Whether this program's malloc is the counting one: valgrind puts its own
 * in front of ours, and then nothing is counted nor injected. */
static int allocs_counted(void) {
  void *(*volatile alloc)(size_t) = malloc;
  fail_countdown = 0;
  void *probe = alloc(1);
  fail_countdown = -1;
  free(probe);
  return probe == NULL;
}

static int inject_failure(void) {
  if (fail_countdown < 0) return 0;
  if (fail_countdown == 0) return 1;
  fail_countdown--;
  return 0;
}

void *malloc(size_t n) {
  void *p = inject_failure() ? NULL : __libc_malloc(n);
  if (p) live_blocks++;
  return p;
}

void *calloc(size_t n, size_t size) {
  void *p = inject_failure() ? NULL : __libc_calloc(n, size);
  if (p) live_blocks++;
  return p;
}

void *realloc(void *p, size_t n) {
  void *q;
  if (inject_failure()) return NULL;
  q = __libc_realloc(p, n);
  if (!p && q) live_blocks++;
  else if (p && n == 0 && !q) live_blocks--; /* glibc: realloc(p, 0) frees p */
  return q;
}

void free(void *p) {
  if (p) live_blocks--;
  __libc_free(p);
}
#endif

/* A printable form of s[0..n) for test names (TAP lines must stay one
 * line). Returns one of a few rotating static buffers. */
static const char *show(const char *s, size_t n) {
  static char ring[4][160];
  static int next;
  char *d = ring[next++ % 4];
  size_t i, j = 0;
  for (i = 0; i < n && j + 8 < sizeof ring[0]; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f) d[j++] = (char)c;
    else j += (size_t)snprintf(d + j, 8, "\\x%02x", c);
  }
  if (i < n) d[j++] = '.', d[j++] = '.', d[j++] = '.';
  d[j] = '\0';
  return d;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void ok(int cond, const char *fmt, ...) {
  va_list ap;
  printf("%sok %d - ", cond ? "" : "not ", ++test_no);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (!cond) failures++;
}

/* A case this build cannot check: TAP's SKIP, counted apart (spec/run.sh). */
static void skip_case(const char *why) {
  printf("ok %d - # SKIP %s\n", ++test_no, why);
}

/* Canonicalizes text[0..len) from an exact-size heap copy (so reading past
 * the end is an ASan error, not luck). Returns the code; *out gets the text
 * (malloc'd, NUL-terminated) on success. */
static int canon(const char *text, size_t len, char **out, es_err *err) {
  char *copy = malloc(len ? len : 1);
  es_buf b;
  int rc;
  memcpy(copy, text, len);
  es_buf_init(&b);
  rc = es_json_canonicalize(copy, len, &b, err);
  free(copy);
  *out = NULL;
  if (rc == ES_OK) *out = es_buf_take(&b, NULL);
  es_buf_destroy(&b);
  return rc;
}

static int validate(const char *text, size_t len, es_err *err) {
  char *copy = malloc(len ? len : 1);
  int rc;
  memcpy(copy, text, len);
  rc = es_json_validate(copy, len, err);
  free(copy);
  return rc;
}

/* Vectors -------------------------------------------------------------- */

typedef struct {
  const char *in;
  size_t len; /* 0: strlen(in) */
  const char *out;
} canon_case;

static const canon_case good[] = {
    {"null", 0, "null"},
    {"true", 0, "true"},
    {" \t\r\nfalse \t\r\n", 0, "false"},
    {"0", 0, "0"},
    {"-0", 0, "0"},
    {"9223372036854775807", 0, "9223372036854775807"},
    {"-9223372036854775808", 0, "-9223372036854775808"},
    {"9223372036854775808", 0, "9.223372036854776e+18"},
    {"-9223372036854775809", 0, "-9.223372036854776e+18"},
    {"18446744073709551616", 0, "1.8446744073709552e+19"},
    {"9007199254740993", 0, "9007199254740993"},
    {"3.0", 0, "3.0"},
    {"3e0", 0, "3.0"},
    {"1E2", 0, "100.0"},
    {"1.50", 0, "1.5"},
    {"0.1", 0, "0.1"},
    {"1e300", 0, "1e+300"},
    {"1e-400", 0, "0.0"},
    {"-0.0", 0, "-0.0"},
    {"5e-324", 0, "5e-324"},
    {"0.00001", 0, "1e-05"},
    {"123456789012345678", 0, "123456789012345678"},
    {"123456789012345678.0", 0, "1.2345678901234568e+17"},
    {"\"\"", 0, "\"\""},
    {"\"\\u0000\"", 0, "\"\\u0000\""},
    {"\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"", 0, "\"/\\b\\f\\n\\r\\t\\\"\\\\\""},
    {"\"\\u0001\\u001F\\u007f\"", 0, "\"\\u0001\\u001f\x7f\""},
    {"\"\\u00e9\\uD83D\\uDE00\"", 0, "\"\xc3\xa9\xf0\x9f\x98\x80\""},
    {"\"\xf4\x8f\xbf\xbf\"", 0, "\"\xf4\x8f\xbf\xbf\""},
    {"[]", 0, "[]"},
    {"{}", 0, "{}"},
    {"[ ]", 0, "[]"},
    {"{ }", 0, "{}"},
    {" [ 1 , [ ] , { } ] ", 0, "[1,[],{}]"},
    {"{\"b\":1,\"a\":2}", 0, "{\"a\":2,\"b\":1}"},
    {"{\"aa\":1,\"a\":2,\"\":3,\"A\":4,\"b\":5}", 0, "{\"\":3,\"A\":4,\"a\":2,\"aa\":1,\"b\":5}"},
    /* byte order of the decoded keys, not of their escaped spelling */
    {"{\"A\":1,\"\\u0001\":2}", 0, "{\"\\u0001\":2,\"A\":1}"},
    {"{\"a\\u0000\":1,\"a\":2}", 0, "{\"a\":2,\"a\\u0000\":1}"},
    {"{\"\xc3\xa9\":1,\"z\":2}", 0, "{\"z\":2,\"\xc3\xa9\":1}"},
    {"{\"b\":{\"d\":[{\"f\":1,\"e\":2}],\"c\":3},\"a\":[{\"y\":1,\"x\":2}]}", 0,
     "{\"a\":[{\"x\":2,\"y\":1}],\"b\":{\"c\":3,\"d\":[{\"e\":2,\"f\":1}]}}"},
    {"[1,1.0,-1.5e-7,true,false,null,\"s\"]", 0, "[1,1.0,-1.5e-07,true,false,null,\"s\"]"},
};

typedef struct {
  const char *in;
  size_t len;
  const char *why; /* a fragment the message must contain */
} bad_case;

static const bad_case bad[] = {
    {"", 0, "at byte 0: unexpected end of input"},
    {"   ", 0, "at byte 3"},
    {"[1,2] x", 0, "at byte 6: trailing"},
    {"1 2", 0, "at byte 2: trailing"},
    {"{\"a\":1,\"a\":2}", 0, "at byte 7: duplicate object key \"a\""},
    {"{\"a\":1,\"\\u0061\":2}", 0, "at byte 7: duplicate"},
    {"{\"b\":1,\"a\":2,\"b\":3}", 0, "at byte 13: duplicate"},
    {"{\"b\":1,\"a\":1,\"b\":2,\"a\":2}", 0, "at byte 13: duplicate object key \"b\""},
    {"{\"a\":1,\"a\":2,\"c\":x}", 0, "at byte 17: unexpected character 'x'"},
    {"[{\"x\":1,\"x\":1}]", 0, "duplicate"},
    {"\"\\ud800\"", 0, "lone high surrogate"},
    {"\"\\udc00\"", 0, "lone low surrogate"},
    {"\"\\ud800\\u0041\"", 0, "surrogate"},
    {"\"\\ud800\\ud800\"", 0, "surrogate"},
    {"\"\\x\"", 0, "invalid escape"},
    {"\"\\u12\"", 0, "\\u escape"},
    {"\"\\u12", 0, "\\u escape"},
    {"\"a\nb\"", 0, "control character"},
    {"\"a\0b\"", 5, "control character"},
    {"\"abc", 0, "unterminated"},
    {"\"\xff\"", 0, "at byte 1: invalid UTF-8"},
    {"\"\xc0\x80\"", 0, "invalid UTF-8"},
    {"\"\xed\xa0\x80\"", 0, "invalid UTF-8"},
    {"\"\xf4\x90\x80\x80\"", 0, "invalid UTF-8"},
    {"\"\xe2\x82\"", 0, "invalid UTF-8"},
    {"[1,]", 0, "at byte 3"},
    {"{\"a\":1,}", 0, "at byte 7"},
    {"{\"a\" 1}", 0, "expected ':'"},
    {"{1:1}", 0, "expected a string key"},
    {"01", 0, "leading zero"},
    {"-", 0, "digit"},
    {"1.", 0, "digit after '.'"},
    {"1e", 0, "exponent"},
    {".5", 0, "at byte 0"},
    {"+1", 0, "at byte 0"},
    {"1e400", 0, "out of range"},
    {"NaN", 0, "at byte 0"},
    {"Infinity", 0, "at byte 0"},
    {"nul", 0, "at byte 3"},
    {"trux", 0, "at byte 3"},
    {"\xef\xbb\xbf" "1", 0, "at byte 0"},
    {"[", 0, "end of input"},
    {"1\0", 2, "at byte 1: trailing"},
};

static void test_vectors(void) {
  size_t i;
  for (i = 0; i < sizeof good / sizeof good[0]; i++) {
    const canon_case *c = &good[i];
    size_t len = c->len ? c->len : strlen(c->in);
    es_err err = {0, ""};
    char *out;
    int rc = canon(c->in, len, &out, &err);
    ok(rc == ES_OK && strcmp(out, c->out) == 0, "canonicalize %s -> %s%s%s", show(c->in, len),
       show(c->out, strlen(c->out)), rc ? ": " : "", rc ? err.msg : "");
    ok(validate(c->in, len, &err) == ES_OK, "validate accepts %s", show(c->in, len));
    if (out) {
      char *again;
      rc = canon(out, strlen(out), &again, &err);
      ok(rc == ES_OK && strcmp(out, again) == 0, "canonical %s is a fixed point", show(out, strlen(out)));
      free(again);
    }
    free(out);
  }
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const bad_case *c = &bad[i];
    size_t len = c->len ? c->len : strlen(c->in);
    es_err err = {0, ""}, verr = {0, ""};
    char *out;
    int rc = canon(c->in, len, &out, &err);
    int vrc = validate(c->in, len, &verr);
    ok(rc == ES_INVALID_ARGUMENT && err.code == ES_INVALID_ARGUMENT && strstr(err.msg, c->why) != NULL,
       "canonicalize rejects %s (%s): %s", show(c->in, len), c->why, show(err.msg, strlen(err.msg)));
    ok(vrc == ES_INVALID_ARGUMENT && strcmp(err.msg, verr.msg) == 0, "validate rejects input %zu the same way", i);
    free(out);
  }
}

static void test_nesting(void) {
  size_t n = ES_JSON_MAX_DEPTH, i;
  char *s = malloc(2 * 200000 + 2), *out;
  es_err err;
  for (i = 0; i < n; i++) s[i] = '[', s[n + i] = ']';
  ok(canon(s, 2 * n, &out, &err) == ES_OK && strlen(out) == 2 * n, "%zu nested arrays are accepted", n);
  free(out);
  for (i = 0; i <= n; i++) s[i] = '[', s[n + 1 + i] = ']';
  ok(canon(s, 2 * n + 2, &out, &err) == ES_INVALID_ARGUMENT && strstr(err.msg, "nesting deeper than 512"),
     "%zu nested arrays are rejected: %s", n + 1, err.msg);
  for (i = 0; i < 200000; i++) s[i] = '[';
  ok(validate(s, 200000, &err) == ES_INVALID_ARGUMENT, "200000 open brackets are rejected without a crash");
  free(s);
}

/* Objects whose members outgrow the array on the validator's stack
 * (ESJ_LOCAL_MEMBERS): still sorted, duplicates still found, at any depth. */
static void test_many_members(void) {
  char in[4096], want[4096];
  size_t n = 0, w = 0;
  es_err err;
  char *out = NULL;
  /* {"k39":39, ..., "k00":0, "in":{"j19":..., "j00":...}}: 41 + 20 members, in reverse */
  n += (size_t)snprintf(in + n, sizeof in - n, "{");
  for (int i = 39; i >= 0; i--) n += (size_t)snprintf(in + n, sizeof in - n, "\"k%02d\":%d,", i, i);
  n += (size_t)snprintf(in + n, sizeof in - n, "\"in\":{");
  for (int i = 19; i >= 0; i--) n += (size_t)snprintf(in + n, sizeof in - n, "\"j%02d\":%d%s", i, i, i ? "," : "");
  n += (size_t)snprintf(in + n, sizeof in - n, "}}");
  w += (size_t)snprintf(want + w, sizeof want - w, "{\"in\":{");
  for (int i = 0; i < 20; i++) w += (size_t)snprintf(want + w, sizeof want - w, "%s\"j%02d\":%d", i ? "," : "", i, i);
  w += (size_t)snprintf(want + w, sizeof want - w, "}");
  for (int i = 0; i < 40; i++) w += (size_t)snprintf(want + w, sizeof want - w, ",\"k%02d\":%d", i, i);
  w += (size_t)snprintf(want + w, sizeof want - w, "}");
  ok(canon(in, n, &out, &err) == ES_OK && strcmp(out, want) == 0, "60 members in two objects are put in key order");
  free(out);
  ok(validate(in, n, &err) == ES_OK, "60 members in two objects validate");
  /* the 41st member repeats the 3rd */
  memcpy(in + n - 1, ",\"k02\":7}", 10);
  ok(validate(in, n + 8, &err) == ES_INVALID_ARGUMENT && strstr(err.msg, "duplicate object key \"k02\""),
     "a duplicate past the 16th member is found: %s", err.msg);
}

static void test_output_untouched_on_error(void) {
  es_buf b;
  es_err err;
  es_buf_init(&b);
  es_buf_adds(&b, "keep");
  ok(es_json_canonicalize("{\"b\":[1,2,{\"a\":x}]}", 19, &b, &err) == ES_INVALID_ARGUMENT && b.len == 4 &&
         memcmp(b.data, "keep", 4) == 0,
     "a failed canonicalize leaves the output as it was");
  ok(es_json_canonicalize("[1]", 3, &b, &err) == ES_OK && strcmp(es_buf_cstr(&b), "keep[1]") == 0,
     "canonicalize appends to the output");
  es_buf_destroy(&b);
}

/* Every allocation in turn fails: the result is OK or ES_STORAGE, nothing
 * leaks and a buffer that was not hit keeps its content. */
static void test_out_of_memory(void) {
#if defined(COUNT_ALLOCS)
  static const char *texts[] = {
      "{\"b\":[1,2.5,{\"y\":\"\\u00e9\",\"x\":[]}],\"a\":\"q\\n\",\"c\\u0000\":null}",
      "[\"0.10000000000000000000000000000000000000000000000000000000000000000001\",1e-7]",
      /* more members than the caller's own array holds: they move to the heap */
      "{\"t\":1,\"s\":1,\"r\":1,\"q\":1,\"p\":1,\"o\":1,\"n\":1,\"m\":1,\"l\":1,\"k\":1,"
      "\"j\":1,\"i\":1,\"h\":{\"z\":[{\"y\":2,\"x\":3}]},\"g\":1,\"f\":1,\"e\":1,\"d\":1,\"c\":1,\"b\":1}",
  };
  size_t t;
  int bad_n = 0, hits = 0;
  if (!allocs_counted()) {
    skip_case("allocation failures cannot be injected here (valgrind)");
    return;
  }
  for (t = 0; t < sizeof texts / sizeof texts[0]; t++) {
    long k, base = live_blocks;
    for (k = 0; k < 40; k++) {
      es_buf b;
      es_err err, verr;
      int rc, vrc;
      es_buf_init(&b);
      fail_countdown = k;
      rc = es_json_canonicalize(texts[t], strlen(texts[t]), &b, &err);
      fail_countdown = k;
      vrc = es_json_validate(texts[t], strlen(texts[t]), &verr);
      fail_countdown = -1;
      if (rc == ES_STORAGE) hits++;
      if ((rc != ES_OK && !(rc == ES_STORAGE && err.code == ES_STORAGE)) ||
          (vrc != ES_OK && !(vrc == ES_STORAGE && verr.code == ES_STORAGE)) || (rc == ES_OK && b.oom))
        bad_n++;
      es_buf_destroy(&b);
      if (live_blocks != base) bad_n++;
    }
  }
  ok(bad_n == 0 && hits > 0, "out of memory at any allocation is ES_STORAGE and leaks nothing (%d failures hit)", hits);
#else
  test_no++;
  printf("ok %d - # SKIP allocation failure injection needs glibc without ASan\n", test_no);
#endif
}

/* Doubles --------------------------------------------------------------- */

/* Python's repr(float) for these bit patterns (shortest digits that read
 * back, nearest first; positional for 1e-4 <= |d| < 1e16). */
static const struct {
  uint64_t bits;
  const char *text;
} doubles[] = {
    {0x0060000000000000ULL, "7.120236347223045e-307"}, {0x0000000000000001ULL, "5e-324"},
    {0x0010000000000000ULL, "2.2250738585072014e-308"}, {0x7fe0000000000000ULL, "8.98846567431158e+307"},
    {0x7fefffffffffffffULL, "1.7976931348623157e+308"}, {0x3d30000000000000ULL, "5.684341886080802e-14"},
    {0x4630000000000000ULL, "1.2676506002282294e+30"}, {0x39b0000000000000ULL, "7.888609052210118e-31"},
    {0x3fb999999999999aULL, "0.1"}, {0x3fc999999999999aULL, "0.2"}, {0x3fd3333333333333ULL, "0.3"},
    {0x3fd5555555555555ULL, "0.3333333333333333"}, {0x3fe5555555555555ULL, "0.6666666666666666"},
    {0x44b52d02c7e14af6ULL, "1e+23"}, {0x4340000000000000ULL, "9007199254740992.0"},
    {0x43e0000000000000ULL, "9.223372036854776e+18"}, {0x43f0000000000000ULL, "1.8446744073709552e+19"},
    {0x4341c37937e08000ULL, "1e+16"}, {0x4341c37937e07fffULL, "9999999999999998.0"},
    {0x3f1a36e2eb1c432dULL, "0.0001"}, {0x3f1a36d1bd105b06ULL, "9.9999e-05"}, {0x3ee4f8b588e368f1ULL, "1e-05"},
    {0x405edd2f1a9fbe77ULL, "123.456"}, {0xbe8421f5f40d8376ULL, "-1.5e-07"}, {0x7e41eb2d66005835ULL, "1.5e+300"},
    {0x4011666666666666ULL, "4.35"}, {0x3fd3333333333334ULL, "0.30000000000000004"},
    {0x4480f0cf064dd592ULL, "1e+22"}, {0x444b1ae4d6e2ef50ULL, "1e+21"}, {0x4059000000000000ULL, "100.0"},
    {0x3ff0000000000000ULL, "1.0"}, {0x8000000000000000ULL, "-0.0"}, {0x0000000000000000ULL, "0.0"},
    {0x4008000000000000ULL, "3.0"}, {0x000fffffffffffffULL, "2.225073858507201e-308"},
    {0x01aa74fe1c1e8908ULL, "1.2345678901234568e-300"}, {0x41b1de784a000000ULL, "299792458.0"},
    {0x44dfe185ca57c517ULL, "6.02214076e+23"}, {0x3c07a4da290c1653ULL, "1.602176634e-19"},
    {0x0100000000000000ULL, "7.291122019556398e-304"}, {0x0420000000000000ULL, "8.209073602596753e-289"},
    {0x0d70000000000000ULL, "5.858190679279809e-244"}, {0x1da0000000000000ULL, "5.426657103235053e-166"},
    {0x2910000000000000ULL, "6.653062250012736e-111"}, {0x2d70000000000000ULL, "7.854549544476363e-90"},
};

static double from_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

static uint64_t to_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static void test_doubles(const char *tag) {
  size_t i, bad_n = 0;
  es_buf b;
  es_err err;
  for (i = 0; i < sizeof doubles / sizeof doubles[0]; i++) {
    double d = from_bits(doubles[i].bits);
    es_buf_init(&b);
    if (es_json_format_double(d, &b, &err) != ES_OK || strcmp(es_buf_cstr(&b), doubles[i].text) != 0) {
      if (bad_n++ < 5) printf("# %s: got %s, want %s\n", tag, es_buf_cstr(&b), doubles[i].text);
    }
    es_buf_destroy(&b);
  }
  ok(bad_n == 0, "%s: format_double matches %zu reference texts", tag, sizeof doubles / sizeof doubles[0]);

  {
    /* Regression: json_fuzz found format_double reading one byte past its
     * 17-digit buffer for doubles needing all 17 digits (seen under UBSan),
     * with the input "\u000E" taken as a double. */
    static const unsigned char bytes[8] = {0x22, 0x5c, 0x75, 0x30, 0x30, 0x30, 0x45, 0x22};
    double d;
    char *end;
    int rc;
    memcpy(&d, bytes, sizeof d);
    es_buf_init(&b);
    rc = es_json_format_double(d, &b, &err);
    es_buf_cstr(&b);
    ok(rc == ES_OK && strtod(b.data, &end) == d && *end == '\0',
       "%s: regression: a 17-digit double (fuzz input \"\\u000E\") formats within bounds: %s", tag, b.data);
    es_buf_destroy(&b);
  }

  es_buf_init(&b);
  ok(es_json_format_double(NAN, &b, &err) == ES_INVALID_ARGUMENT && b.len == 0 && err.code == ES_INVALID_ARGUMENT,
     "%s: NaN is INVALID_ARGUMENT", tag);
  ok(es_json_format_double(INFINITY, &b, &err) == ES_INVALID_ARGUMENT, "%s: +inf is INVALID_ARGUMENT", tag);
  ok(es_json_format_double(-INFINITY, &b, &err) == ES_INVALID_ARGUMENT, "%s: -inf is INVALID_ARGUMENT", tag);
  es_buf_destroy(&b);
}

static uint64_t rng_state;
static uint64_t rnd(void) {
  /* xorshift64*: deterministic across platforms, unlike rand(). */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

/* Every finite double: its text reads back bit for bit, reads as a float
 * (has '.' or 'e'), and is already canonical. */
static void test_random_doubles(int n) {
  int i, bad_n = 0;
  es_buf b, c;
  es_err err;
  es_buf_init(&b);
  es_buf_init(&c);
  for (i = 0; i < n; i++) {
    double d = from_bits(rnd());
    char *end;
    if (i % 3 == 1) d = (double)(int64_t)(rnd() >> (rnd() % 64)) / (double)(1 + rnd() % 1000);
    if (i % 3 == 2) d = ldexp((double)(rnd() >> 11), (int)(rnd() % 2100) - 1100);
    if (isnan(d) || isinf(d)) continue;
    b.len = c.len = 0;
    if (es_json_format_double(d, &b, &err) != ES_OK) {
      bad_n++;
      continue;
    }
    es_buf_cstr(&b);
    if (to_bits(strtod(b.data, &end)) != to_bits(d) || *end || !strpbrk(b.data, ".e") ||
        es_json_canonicalize(b.data, b.len, &c, &err) != ES_OK || c.len != b.len || memcmp(b.data, c.data, b.len)) {
      if (bad_n++ < 5) printf("# %a formats as %s\n", d, b.data);
    }
  }
  es_buf_destroy(&b);
  es_buf_destroy(&c);
  ok(bad_n == 0, "%d random doubles read back exactly, read as floats, and are canonical", n);
}

static void test_locale(void) {
  static const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8"};
  const char *got = NULL;
  size_t i;
  es_buf b;
  es_err err;
  for (i = 0; i < sizeof names / sizeof names[0] && !got; i++) got = setlocale(LC_NUMERIC, names[i]);
  if (!got || strcmp(localeconv()->decimal_point, ".") == 0) {
    test_no++;
    printf("ok %d - # SKIP no comma-decimal locale (build one: localedef -i de_DE -f UTF-8 DIR/de_DE.UTF-8; LOCPATH=DIR)\n",
           test_no);
    setlocale(LC_NUMERIC, "C");
    return;
  }
  test_doubles(got);
  es_buf_init(&b);
  ok(es_json_canonicalize("[2.5,1.25e-10,0.1]", 18, &b, &err) == ES_OK &&
         strcmp(es_buf_cstr(&b), "[2.5,1.25e-10,0.1]") == 0,
     "%s: floats parse and print with '.'", got);
  es_buf_destroy(&b);
  setlocale(LC_NUMERIC, "C");
}

/* es_buf --------------------------------------------------------------- */

static void test_buf(void) {
  es_buf b;
  char *p;
  size_t n, i;
  es_buf_init(&b);
  ok(strcmp(es_buf_cstr(&b), "") == 0 && b.len == 0, "an empty buffer gives \"\"");
  es_buf_addf(&b, "%s-%d", "x", 42);
  for (i = 0; i < 1000; i++) es_buf_addc(&b, 'a' + (char)(i % 26));
  es_buf_addf(&b, "%0300d", 7);
  ok(b.len == 4 + 1000 + 300 && memcmp(b.data, "x-42abc", 7) == 0 && b.data[b.len - 1] == '7',
     "add, addc and addf append");
  p = es_buf_take(&b, &n);
  ok(p && n == 1304 && p[n] == '\0' && b.data == NULL && b.len == 0, "take hands over NUL-terminated data");
  free(p);
  p = es_buf_take(&b, &n);
  ok(p && n == 0 && p[0] == '\0', "take on an empty buffer gives an empty string");
  free(p);
  es_buf_destroy(&b);
}

/* Fuzzer --------------------------------------------------------------- */

#define CORPUS_MAX 256
#define TEXT_MAX 512

static const char *seeds[] = {
    "null", "true", "false", "0", "-1", "9223372036854775807", "-9223372036854775808", "1.5e-07", "0.1",
    "1e+300", "\"\"", "\"a\\u0000b\\n\\\"\\\\\"", "\"\\ud83d\\ude00\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"",
    "[]", "{}", "[1,[2,[3,[4]]]]", "{\"a\":{\"b\":{\"c\":[]}}}", "{\"b\":1,\"a\":2,\"c\":{\"z\":[],\"y\":{}}}",
    "[1,1.0,-0.0,true,false,null,\"s\",{\"k\":\"v\"}]", "{\"\":0,\"a\\u0000\":1,\"a\":2}",
    " { \"x\" : [ 1 , 2 ] , \"w\" : null } ", "[123456789012345678901234567890,1e-400,0.000001]",
};

static char corpus[CORPUS_MAX][TEXT_MAX];
static size_t corpus_len[CORPUS_MAX];
static size_t corpus_n;

static void corpus_add(const char *s, size_t n) {
  size_t slot;
  if (n == 0 || n > TEXT_MAX) return;
  slot = corpus_n < CORPUS_MAX ? corpus_n++ : (size_t)(rnd() % CORPUS_MAX);
  if (slot < sizeof seeds / sizeof seeds[0]) return; /* keep the seeds */
  memcpy(corpus[slot], s, n);
  corpus_len[slot] = n;
}

static const char interesting[] = "{}[]\",:\\0123456789-+.eEtfnu \t\n";

static size_t mutate(char *t, size_t n, size_t cap) {
  int k, rounds = 1 + (int)(rnd() % 4);
  for (k = 0; k < rounds; k++) {
    size_t at = n ? (size_t)(rnd() % n) : 0;
    switch (rnd() % 9) {
      case 0: /* flip a bit */
        if (n) t[at] ^= (char)(1u << (rnd() % 8));
        break;
      case 1: /* replace with a JSON-ish byte */
        if (n) t[at] = interesting[rnd() % (sizeof interesting - 1)];
        break;
      case 2: /* replace with any byte */
        if (n) t[at] = (char)rnd();
        break;
      case 3: /* insert a JSON-ish byte */
        if (n < cap) {
          memmove(t + at + 1, t + at, n - at);
          t[at] = interesting[rnd() % (sizeof interesting - 1)];
          n++;
        }
        break;
      case 4: /* delete a run */
        if (n) {
          size_t len = 1 + (size_t)(rnd() % 4);
          if (len > n - at) len = n - at;
          memmove(t + at, t + at + len, n - at - len);
          n -= len;
        }
        break;
      case 5: { /* duplicate a run */
        size_t len = 1 + (size_t)(rnd() % 16);
        if (len > n - at) len = n - at;
        if (n + len <= cap) {
          memmove(t + at + len, t + at, n - at);
          n += len;
        }
        break;
      }
      case 6: { /* splice in a piece of another corpus entry */
        size_t j = (size_t)(rnd() % corpus_n), from, len;
        if (!corpus_len[j]) break;
        from = (size_t)(rnd() % corpus_len[j]);
        len = 1 + (size_t)(rnd() % (corpus_len[j] - from));
        if (n + len > cap) break;
        memmove(t + at + len, t + at, n - at);
        memcpy(t + at, corpus[j] + from, len);
        n += len;
        break;
      }
      case 7: /* truncate */
        n = at;
        break;
      default: { /* insert a multi-byte sequence, valid or not */
        static const char *seqs[] = {"\xc3\xa9", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\x80", "\\u",
                                     "\\ud800", "\\udc00", "\\u0000", "e+", "1e999", "\"a\":"};
        const char *q = seqs[rnd() % (sizeof seqs / sizeof seqs[0])];
        size_t len = strlen(q);
        if (n + len > cap) break;
        memmove(t + at + len, t + at, n - at);
        memcpy(t + at, q, len);
        n += len;
      }
    }
  }
  return n;
}

static void fuzz(long iters, uint64_t seed) {
  char t[TEXT_MAX];
  long i, disagree = 0, unstable = 0, accepted = 0, other = 0;
  size_t k;
#if defined(COUNT_ALLOCS)
  long before, after;
#endif
  rng_state = seed ? seed : 1;
  corpus_n = 0;
  for (k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
    corpus_len[corpus_n] = strlen(seeds[k]);
    memcpy(corpus[corpus_n++], seeds[k], strlen(seeds[k]));
  }
#if defined(COUNT_ALLOCS)
  before = live_blocks;
#endif
  for (i = 0; i < iters; i++) {
    size_t j = (size_t)(rnd() % corpus_n), n = corpus_len[j];
    es_err verr, cerr;
    char *out;
    int vrc, crc;
    memcpy(t, corpus[j], n);
    n = mutate(t, n, sizeof t);
    vrc = validate(t, n, &verr);
    crc = canon(t, n, &out, &cerr);
    if (vrc != crc) {
      if (disagree++ < 3) printf("# validate %d, canonicalize %d on %s\n", vrc, crc, show(t, n));
    } else if (crc != ES_OK && crc != ES_INVALID_ARGUMENT) {
      other++;
    } else if (crc == ES_OK) {
      char *again;
      size_t m = strlen(out);
      accepted++;
      if (canon(out, m, &again, &cerr) != ES_OK || strcmp(out, again) != 0 || validate(out, m, &verr) != ES_OK) {
        if (unstable++ < 3) printf("# not a fixed point: %s\n", show(out, strlen(out)));
      }
      free(again);
      corpus_add(out, m);
    }
    free(out);
  }
#if defined(COUNT_ALLOCS)
  after = live_blocks;
#endif
  ok(disagree == 0, "fuzz: validate and canonicalize agree on %ld mutants (seed %llu)", iters,
     (unsigned long long)seed);
  ok(unstable == 0, "fuzz: canonicalize is idempotent on the %ld accepted mutants", accepted);
  ok(other == 0, "fuzz: no result other than OK or INVALID_ARGUMENT");
  ok(accepted > iters / 50, "fuzz: mutants are accepted often enough to be meaningful (%ld)", accepted);
#if defined(COUNT_ALLOCS)
  if (allocs_counted())
    ok(after == before, "fuzz: no leaked allocation (%ld live blocks before, %ld after)", before, after);
  else
    skip_case("fuzz: no leak count here (valgrind's malloc replaces the counting one; valgrind checks leaks)");
#else
  skip_case("fuzz: no leak count under ASan (LeakSanitizer checks leaks at exit)");
#endif
}

int main(void) {
  const char *iters = getenv("JSON_FUZZ_ITERS"), *seed = getenv("JSON_FUZZ_SEED");
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("# json_test: the C face of the JSON codec\n");
  test_buf();
  test_vectors();
  test_nesting();
  test_many_members();
  test_output_untouched_on_error();
  test_out_of_memory();
  test_doubles("C locale");
  rng_state = 0x9E3779B97F4A7C15ULL;
  test_random_doubles(100000);
  test_locale();
  fuzz(iters ? atol(iters) : 200000, seed ? strtoull(seed, NULL, 10) : 20240601);
  printf("# %d tests, %d failed\n", test_no, failures);
  return failures ? 1 : 0;
}
