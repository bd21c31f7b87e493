/*
 * es.c: result-code names, the error helper and the system clock (es.h).
 */
#include "es.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static const char *const code_names[ES_NCODES] = {
    [ES_OK] = "OK",
    [ES_PARTIAL_DUPLICATE_BATCH] = "PARTIAL_DUPLICATE_BATCH",
    [ES_ID_CONFLICT] = "ID_CONFLICT",
    [ES_SUPERSEDED_ATTEMPT] = "SUPERSEDED_ATTEMPT",
    [ES_NO_SUCH_EVENT] = "NO_SUCH_EVENT",
    [ES_WRONG_EXPECTED_HEAD] = "WRONG_EXPECTED_HEAD",
    [ES_STALE_FENCE] = "STALE_FENCE",
    [ES_SEALED] = "SEALED",
    [ES_TRUNCATED] = "TRUNCATED",
    [ES_REF_CONFLICT] = "REF_CONFLICT",
    [ES_NOT_FOUND] = "NOT_FOUND",
    [ES_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
    [ES_TOO_LARGE] = "TOO_LARGE",
    [ES_STORAGE] = "STORAGE",
    [ES_CLOSED] = "CLOSED",
};

const char *es_strerror(int code) {
  if (code < 0 || code >= ES_NCODES) return "STORAGE";
  return code_names[code];
}

/* A message cut at ES_ERRMSG_MAX bytes may end inside a multi-byte UTF-8
 * character: drop that partial character, so a cut message is still valid
 * text (it may be stored, e.g. as a failed attempt's last_error, and
 * printed as JSON). */
static void drop_partial_char(char *s, size_t n) {
  size_t i = n;
  while (i > 0 && n - i < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
  if (i == 0) return;
  unsigned char lead = (unsigned char)s[i - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if ((lead & 0x80) && n - (i - 1) < need) s[i - 1] = '\0';
}

int es_fail(es_err *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof err->msg) drop_partial_char(err->msg, sizeof err->msg - 1);
  }
  return code;
}

int es_clock_system(void *ctx, int64_t *now_ms, es_err *err) {
  struct timespec ts;
  (void)ctx;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return es_fail(err, ES_STORAGE, "clock_gettime failed");
  *now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  return ES_OK;
}
