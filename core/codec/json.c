/*
 * json.c: the C face of the exact payload codec (json.h) and the scanner,
 * writers and member sort (json_scan.h) that its other faces share: the
 * document reader (json_doc.c) and the bridge's Lua face
 * (bridge/json_lua.c). No Lua here, nor anywhere in codec/: pure C
 * programs link it (docs/architecture.md).
 *
 * Numbers are read and written independently of the process locale: a
 * library must not misbehave because its host called setlocale().
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l and newlocale; implicitly declared, strtod_l would return int */
#endif
#include "codec/json.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json_scan.h"

/* The "C" locale ---------------------------------------------------------- */

/* Written once, then only read: a process-wide constant rather than mutable
 * state. strtod_l with it parses '.' whatever LC_NUMERIC says. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static locale_t get_c_locale(void) {
  pthread_once(&c_locale_once, c_locale_init);
  return c_locale;
}

/* Scanner ------------------------------------------------------------------ */

void esj_parser_init(esj_parser *P, const char *text, size_t len, es_err *err) {
  P->start = P->p = (const unsigned char *)text;
  P->end = P->start + len;
  P->err = err;
  es_buf_init(&P->num);
}

void esj_parser_destroy(esj_parser *P) { es_buf_destroy(&P->num); }

int esj_fail(esj_parser *P, const unsigned char *at, const char *fmt, ...) {
  char reason[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  return es_fail(P->err, ES_INVALID_ARGUMENT, "invalid JSON at byte %zu: %s", (size_t)(at - P->start), reason);
}

int esj_fail_unexpected(esj_parser *P, const char *expected) {
  unsigned char c;
  if (P->p >= P->end) return esj_fail(P, P->p, "unexpected end of input, expected %s", expected);
  c = *P->p;
  if (c > 0x20 && c < 0x7f) return esj_fail(P, P->p, "unexpected character '%c', expected %s", c, expected);
  return esj_fail(P, P->p, "unexpected byte 0x%02x, expected %s", c, expected);
}

int esj_fail_oom(esj_parser *P) { return es_fail(P->err, ES_STORAGE, "out of memory while parsing JSON"); }

size_t esj_utf8_seq(const unsigned char *p, const unsigned char *end) {
  /* Unicode Table 3-7 (well-formed byte sequences): the second byte's range
   * depends on the first, which is what excludes overlongs, UTF-16
   * surrogates and code points above U+10FFFF. */
  unsigned char c = p[0], lo = 0x80, hi = 0xBF;
  size_t n, i;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
  } else
    return 0;
  if ((size_t)(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

int esj_next_element(esj_parser *P, char close, int *more) {
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == ',') {
    P->p++;
    esj_skip_ws(P);
    *more = 1;
    return ES_OK;
  }
  if (P->p < P->end && *P->p == (unsigned char)close) {
    P->p++;
    *more = 0;
    return ES_OK;
  }
  return esj_fail_unexpected(P, close == '}' ? "',' or '}'" : "',' or ']'");
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Reads the 4 hex digits after "\u" at p (p points at the backslash). */
static long read_u4(const unsigned char *p, const unsigned char *end) {
  long v = 0;
  int i, h;
  if (end - p < 6 || p[1] != 'u') return -1;
  for (i = 2; i < 6; i++) {
    if ((h = hexval(p[i])) < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

static void put_utf8(es_buf *b, unsigned long cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) {
    u[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  esj_put(b, u, n);
}

int esj_parse_string(esj_parser *P, es_buf *dst, const char **s, size_t *n, int *copied) {
  const unsigned char *open = P->p, *p = P->p + 1, *end = P->end, *run = p;
  size_t mark = dst->len;
  int escaped = 0;
  for (;;) {
    unsigned char c;
    /* Most string bytes are plain ASCII: skip them in a tight loop. */
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
    if (p >= end) return esj_fail(P, open, "unterminated string");
    c = *p;
    if (c == '"') break;
    if (c >= 0x80) {
      size_t k = esj_utf8_seq(p, end);
      if (!k) return esj_fail(P, p, "invalid UTF-8 in string");
      p += k;
      continue;
    }
    if (c < 0x20) return esj_fail(P, p, "unescaped control character 0x%02x in string", c);
    /* A backslash: flush the raw run, decode the escape. */
    escaped = 1;
    esj_put(dst, run, (size_t)(p - run));
    if (p + 1 >= end) return esj_fail(P, open, "unterminated string");
    switch (p[1]) {
      case '"': esj_putc(dst, '"'); p += 2; break;
      case '\\': esj_putc(dst, '\\'); p += 2; break;
      case '/': esj_putc(dst, '/'); p += 2; break;
      case 'b': esj_putc(dst, '\b'); p += 2; break;
      case 'f': esj_putc(dst, '\f'); p += 2; break;
      case 'n': esj_putc(dst, '\n'); p += 2; break;
      case 'r': esj_putc(dst, '\r'); p += 2; break;
      case 't': esj_putc(dst, '\t'); p += 2; break;
      case 'u': {
        long cp = read_u4(p, end), lo;
        if (cp < 0) return esj_fail(P, p, "invalid \\u escape (expected 4 hex digits)");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return esj_fail(P, p, "lone low surrogate \\u%04lx", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          lo = read_u4(p + 6, end);
          if (p + 6 >= end || p[6] != '\\' || lo < 0xDC00 || lo > 0xDFFF)
            return esj_fail(P, p, "lone high surrogate \\u%04lx", cp);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        }
        put_utf8(dst, (unsigned long)cp);
        p += 6;
        break;
      }
      default:
        return esj_fail(P, p, "invalid escape '\\%c'", p[1] >= 0x20 && p[1] < 0x7f ? p[1] : '?');
    }
    run = p;
  }
  if (escaped) {
    esj_put(dst, run, (size_t)(p - run));
    if (dst->oom) return esj_fail_oom(P);
    *s = dst->data + mark;
    *n = dst->len - mark;
  } else {
    *s = (const char *)open + 1;
    *n = (size_t)(p - open - 1);
  }
  *copied = escaped;
  P->p = p + 1;
  return ES_OK;
}

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

int esj_parse_number(esj_parser *P, esj_number *num) {
  const unsigned char *s = P->p, *p = s, *end = P->end;
  uint64_t acc = 0;
  int neg = 0, overflow = 0, is_float = 0;
  char small[64], *lit;
  size_t len;
  double d;

  if (p < end && *p == '-') {
    neg = 1;
    p++;
  }
  if (p >= end || !IS_DIGIT(*p)) {
    P->p = p;
    return esj_fail_unexpected(P, "a digit");
  }
  if (*p == '0') {
    p++;
    if (p < end && IS_DIGIT(*p)) return esj_fail(P, p, "leading zero in number");
  } else {
    for (; p < end && IS_DIGIT(*p); p++) {
      unsigned dig = (unsigned)(*p - '0');
      if (acc > (UINT64_MAX - dig) / 10) overflow = 1;
      else acc = acc * 10 + dig;
    }
  }
  if (p < end && *p == '.') {
    is_float = 1;
    p++;
    if (p >= end || !IS_DIGIT(*p)) {
      P->p = p;
      return esj_fail_unexpected(P, "a digit after '.'");
    }
    while (p < end && IS_DIGIT(*p)) p++;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    is_float = 1;
    p++;
    if (p < end && (*p == '+' || *p == '-')) p++;
    if (p >= end || !IS_DIGIT(*p)) {
      P->p = p;
      return esj_fail_unexpected(P, "a digit in the exponent");
    }
    while (p < end && IS_DIGIT(*p)) p++;
  }
  P->p = p;

  if (!is_float && !overflow) {
    if (!neg && acc <= (uint64_t)INT64_MAX) {
      num->is_int = 1;
      num->i = (int64_t)acc;
      return ES_OK;
    }
    if (neg && acc <= (uint64_t)INT64_MAX + 1) {
      num->is_int = 1;
      /* Negating in unsigned arithmetic covers -2^63 without overflow. */
      num->i = acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc;
      return ES_OK;
    }
  }

  /* strtod needs a NUL-terminated copy: the input need not be terminated,
   * and the byte after the literal is not ours to read. */
  len = (size_t)(p - s);
  if (len < sizeof small) {
    memcpy(small, s, len);
    small[len] = '\0';
    lit = small;
  } else {
    P->num.len = 0;
    esj_put(&P->num, s, len);
    if (!(lit = (char *)es_buf_cstr(&P->num))) return esj_fail_oom(P);
  }
  if (!get_c_locale()) return esj_fail_oom(P);
  d = strtod_l(lit, NULL, get_c_locale());
  if (isinf(d)) return esj_fail(P, s, "number out of range");
  num->is_int = 0;
  num->d = d;
  return ES_OK;
}

int esj_parse_word(esj_parser *P, const char *word, size_t len) {
  if ((size_t)(P->end - P->p) < len || memcmp(P->p, word, len) != 0) {
    /* Point at the first byte that differs, so "tru" and "trux" both say where. */
    const unsigned char *q = P->p;
    size_t i = 0;
    while (q < P->end && i < len && *q == (unsigned char)word[i]) q++, i++;
    P->p = q;
    return esj_fail_unexpected(P, "a JSON value");
  }
  P->p += len;
  return ES_OK;
}

void esj_describe_key(char *dst, size_t cap, const char *k, size_t n) {
  size_t i, j = 0;
  for (i = 0; i < n && j + 4 < cap; i++) {
    unsigned char ch = (unsigned char)k[i];
    dst[j++] = (ch >= 0x20 && ch != 0x7f && ch != '"' && ch != '\\') ? (char)ch : '?';
  }
  if (i < n) {
    memcpy(dst + j, "...", 3);
    j += 3;
  }
  dst[j] = '\0';
}

/* Writers ------------------------------------------------------------------ */

void esj_write_int(es_buf *out, int64_t v) {
  char tmp[24], *q = tmp + sizeof tmp;
  /* Work on the magnitude in unsigned arithmetic: -INT64_MIN overflows. */
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    *--q = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) *--q = '-';
  esj_put(out, q, (size_t)(tmp + sizeof tmp - q));
}

/* 0: copy as is; 1: must be escaped; 2: starts a multi-byte sequence
 * (checked only when validating). */
static const unsigned char esc_class[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};

int esj_write_string(es_buf *out, const char *str, size_t n, size_t *bad) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *s = (const unsigned char *)str, *p = s, *end = s + n, *run;
  size_t mark = out->len;
  /* Without bad, bytes >= 0x80 come from the parser, already checked. */
  int trusted = bad == NULL;
  esj_putc(out, '"');
  run = p;
  while (p < end) {
    unsigned char c = *p, cls = esc_class[c];
    if (cls == 0 || (cls == 2 && trusted)) {
      p++;
      continue;
    }
    if (cls == 2) {
      size_t k = esj_utf8_seq(p, end);
      if (!k) {
        /* Take back what was written, so a rejected string leaves out as it was. */
        *bad = (size_t)(p - s);
        out->len = mark;
        return ES_INVALID_ARGUMENT;
      }
      p += k;
      continue;
    }
    esj_put(out, run, (size_t)(p - run));
    switch (c) {
      case '"': esj_put(out, "\\\"", 2); break;
      case '\\': esj_put(out, "\\\\", 2); break;
      case '\b': esj_put(out, "\\b", 2); break;
      case '\f': esj_put(out, "\\f", 2); break;
      case '\n': esj_put(out, "\\n", 2); break;
      case '\r': esj_put(out, "\\r", 2); break;
      case '\t': esj_put(out, "\\t", 2); break;
      default: {
        char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        esj_put(out, u, 6);
      }
    }
    run = ++p;
  }
  esj_put(out, run, (size_t)(p - run));
  esj_putc(out, '"');
  return ES_OK;
}

/* Doubles ------------------------------------------------------------------ */

/* The significant digits and decimal exponent of d >= 0 rounded to prec
 * digits: d ~= D[0].D[1].. * 10^exp, digits[0] != '0' unless d == 0. Uses
 * %.*e, whose output differs between locales only in the decimal point,
 * which is skipped whatever it is. Returns the number of digits. */
static int round_digits(double d, int prec, char *digits, int *exp) {
  char tmp[64];
  const char *p = tmp;
  int n = 0, e = 0, eneg = 0;
  snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
  while (*p && *p != 'e') {
    if (IS_DIGIT(*p) && n < 17) digits[n++] = *p; /* prec <= 17: never more */
    p++;
  }
  if (*p == 'e') p++;
  if (*p == '-') eneg = 1;
  if (*p == '-' || *p == '+') p++;
  while (IS_DIGIT(*p)) e = e * 10 + (*p++ - '0');
  *exp = eneg ? -e : e;
  return n;
}

/* Whether the digits read back as exactly |d|. */
static int reads_back(double ad, const char *digits, int n, int exp, locale_t loc) {
  char tmp[48], *q = tmp;
  unsigned ue = (unsigned)(exp < 0 ? -exp : exp);
  int i;
  *q++ = digits[0];
  *q++ = '.';
  for (i = 1; i < n; i++) *q++ = digits[i];
  *q++ = 'e';
  if (exp < 0) *q++ = '-';
  if (ue >= 100) *q++ = (char)('0' + ue / 100);
  if (ue >= 10) *q++ = (char)('0' + ue / 10 % 10);
  *q++ = (char)('0' + ue % 10);
  *q = '\0';
  return strtod_l(tmp, NULL, loc) == ad;
}

static int strip_zeros(const char *digits, int n) {
  while (n > 1 && digits[n - 1] == '0') n--;
  return n;
}

/* Adds one unit in the last of the n digits, carrying (999 -> 100, exp+1). */
static void digits_up(char *digits, int n, int *exp) {
  int i;
  for (i = n - 1; i >= 0 && digits[i] == '9'; i--) digits[i] = '0';
  if (i >= 0) {
    digits[i]++;
  } else {
    digits[0] = '1';
    (*exp)++;
  }
}

/* d's 17 correctly rounded significant digits, formatted once: the
 * shorter candidates are rounded from them (snprintf costs several times
 * a strtod, and it was the bulk of formatting a double). */
typedef struct digits17 {
  char s[17];
  int exp;
} digits17;

/* The correctly rounded prec-digit (prec <= 17) form of d, in digits/exp.
 * Rounding the 17-digit string again is exact unless its dropped tail is
 * a 5 followed by zeros (the 17 digits may themselves have been rounded
 * to that tie from either side); only then snprintf is asked. */
static int rounded(double ad, const digits17 *d17, int prec, char *digits, int *exp) {
  int i, tie;
  if (prec >= 17) {
    memcpy(digits, d17->s, 17);
    *exp = d17->exp;
    return 17;
  }
  tie = d17->s[prec] == '5';
  for (i = prec + 1; tie && i < 17; i++)
    if (d17->s[i] != '0') tie = 0;
  if (tie) return round_digits(ad, prec, digits, exp);
  memcpy(digits, d17->s, (size_t)prec);
  *exp = d17->exp;
  if (d17->s[prec] >= '5') digits_up(digits, prec, exp); /* not a tie: above half */
  return prec;
}

/* Whether some prec-digit decimal reads back as d (1: the correctly
 * rounded one, 2: the one above it, 0: none); if so, leaves it in
 * digits/n/exp. The nearest is the correctly rounded one, and if it
 * misses, another prec-digit decimal can only hit when d's rounding
 * interval is lopsided: at a power of two the gap below is half the gap
 * above, so the decimal just above d may read back although the nearer
 * one below does not (2^-1017 is 7.120236347223045e-307, not
 * 7.1202363472230444e-307). */
static int probe(double ad, const digits17 *d17, int prec, int pow2, char *digits, int *n, int *exp,
                 locale_t loc) {
  *n = rounded(ad, d17, prec, digits, exp);
  if (reads_back(ad, digits, *n, *exp, loc)) return 1;
  if (!pow2) return 0;
  digits_up(digits, *n, exp);
  return reads_back(ad, digits, *n, *exp, loc) ? 2 : 0;
}

int es_json_format_double(double d, es_buf *out, es_err *err) {
  char digits[32], best[32], text[64];
  digits17 d17;
  int n, exp, bn, bexp, k = 0, i, e2, pow2, hit;
  double ad = fabs(d);
  locale_t loc;

  if (isnan(d) || isinf(d)) return es_fail(err, ES_INVALID_ARGUMENT, "NaN and infinity cannot be encoded in JSON");

  if (ad < 9007199254740992.0 && ad == (double)(int64_t)ad) {
    /* Integral and below 2^53: every such value is exact, its shortest
     * digits are its own, and it prints positionally (< 1e16). */
    if (signbit(d)) esj_putc(out, '-');
    esj_write_int(out, (int64_t)ad);
    esj_put(out, ".0", 2);
    return out->oom ? es_fail(err, ES_STORAGE, "out of memory") : ES_OK;
  }

  if (!(loc = get_c_locale())) return es_fail(err, ES_STORAGE, "out of memory (newlocale)");
  pow2 = frexp(ad, &e2) == 0.5;

  /* The shortest digit string that reads back exactly (the nearest to d
   * among those of that length): the smallest P in 1..17 for which some
   * P-digit decimal reads back. That is monotonic in P (every P-digit
   * decimal is also a (P+1)-digit one), so a binary search finds it.
   * Probing 15 first settles most human-written values in one step. */
  if (round_digits(ad, 17, d17.s, &d17.exp) != 17) return es_fail(err, ES_STORAGE, "cannot format a double");
  if ((hit = probe(ad, &d17, 15, pow2, digits, &n, &exp, loc)) != 0) {
    int lo = 1, hi = strip_zeros(digits, n);
    bn = hi;
    memcpy(best, digits, (size_t)bn);
    bexp = exp;
    /* When the correctly rounded 15 digits D of a normal double read back,
     * D without its trailing zeros (k digits) is already the shortest: a
     * shorter decimal differs from D by at least 10^(e-14) and from d by at
     * least half that, while d's rounding interval reaches at most
     * 2^-53 * |d| < 1.2 * 10^(e-15) to each side (10^e <= |d| < 10^(e+1)).
     * Subnormals (relatively wider intervals) and the digits-above case
     * need the search. */
    if (hit == 1 && ad >= DBL_MIN) lo = hi;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2;
      if (probe(ad, &d17, mid, pow2, digits, &n, &exp, loc)) {
        hi = bn = strip_zeros(digits, n);
        memcpy(best, digits, (size_t)bn);
        bexp = exp;
      } else {
        lo = mid + 1;
      }
    }
  } else {
    /* 17 correctly rounded digits always read back. */
    if (!probe(ad, &d17, 16, pow2, digits, &n, &exp, loc)) n = rounded(ad, &d17, 17, digits, &exp);
    bn = strip_zeros(digits, n);
    memcpy(best, digits, (size_t)bn);
    bexp = exp;
  }

  /* Layout as Python's repr, so other tools can produce the same text:
   * positional for 1e-4 <= |d| < 1e16, else d.ddde+XX with at least two
   * exponent digits; a positional float always shows a '.' so it reads
   * back as a float. */
  if (signbit(d)) text[k++] = '-';
  if (bexp >= -4 && bexp < 16) {
    if (bexp < 0) {
      text[k++] = '0';
      text[k++] = '.';
      for (i = -1; i > bexp; i--) text[k++] = '0';
      for (i = 0; i < bn; i++) text[k++] = best[i];
    } else if (bn <= bexp + 1) {
      for (i = 0; i < bn; i++) text[k++] = best[i];
      for (i = bn; i <= bexp; i++) text[k++] = '0';
      text[k++] = '.';
      text[k++] = '0';
    } else {
      for (i = 0; i <= bexp; i++) text[k++] = best[i];
      text[k++] = '.';
      for (; i < bn; i++) text[k++] = best[i];
    }
  } else {
    int ae = bexp < 0 ? -bexp : bexp;
    text[k++] = best[0];
    if (bn > 1) {
      text[k++] = '.';
      for (i = 1; i < bn; i++) text[k++] = best[i];
    }
    text[k++] = 'e';
    text[k++] = bexp < 0 ? '-' : '+';
    if (ae >= 100) text[k++] = (char)('0' + ae / 100);
    text[k++] = (char)('0' + ae / 10 % 10);
    text[k++] = (char)('0' + ae % 10);
  }
  esj_put(out, text, (size_t)k);
  return out->oom ? es_fail(err, ES_STORAGE, "out of memory") : ES_OK;
}

/* Object members ----------------------------------------------------------- */

void esj_members_init(esj_members *m, esj_member *local, size_t n) {
  m->v = m->local = local;
  m->len = 0;
  m->cap = local ? n : 0;
}

void esj_members_destroy(esj_members *m) {
  if (m->v != m->local) free(m->v);
  esj_members_init(m, NULL, 0);
}

int esj_members_push(esj_members *m, const esj_member *x) {
  if (m->len == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 32;
    esj_member *v;
    if (cap > SIZE_MAX / sizeof *v) return ES_STORAGE;
    if (m->v && m->v == m->local) {
      if (!(v = malloc(cap * sizeof *v))) return ES_STORAGE;
      memcpy(v, m->v, m->len * sizeof *v);
    } else if (!(v = realloc(m->v, cap * sizeof *v))) {
      return ES_STORAGE;
    }
    m->v = v;
    m->cap = cap;
  }
  m->v[m->len++] = *x;
  return ES_OK;
}

int esj_keycmp(const char *a, size_t an, const char *b, size_t bn) {
  int c = (an && bn) ? memcmp(a, b, an < bn ? an : bn) : 0;
  if (c) return c;
  return an < bn ? -1 : an > bn;
}

static int member_cmp(const void *x, const void *y) {
  const esj_member *a = x, *b = y;
  return esj_keycmp(a->key, a->klen, b->key, b->klen);
}

size_t esj_members_sort(esj_member *v, size_t n, const char *keys_base) {
  size_t i, j, dup = (size_t)-1;
  for (i = 0; i < n; i++)
    if (v[i].in_keys) {
      v[i].key = keys_base + v[i].koff;
      v[i].in_keys = 0;
    }
  if (n <= 16) {
    /* Insertion sort: small objects are the common case and qsort's
     * indirect calls cost more than they save there. */
    for (i = 1; i < n; i++) {
      esj_member x = v[i];
      for (j = i; j > 0 && member_cmp(&v[j - 1], &x) > 0; j--) v[j] = v[j - 1];
      v[j] = x;
    }
  } else {
    qsort(v, n, sizeof *v, member_cmp);
  }
  /* Report the first key, in input order, that repeats an earlier one (the
   * second occurrence within each run of equal keys), which is what a
   * reader stopping at the first repeat would report. */
  for (i = 0; i < n; i = j) {
    size_t first = i, second = (size_t)-1;
    for (j = i + 1; j < n && member_cmp(&v[i], &v[j]) == 0; j++) {
      if (v[j].at < v[first].at) {
        second = first;
        first = j;
      } else if (second == (size_t)-1 || v[j].at < v[second].at) {
        second = j;
      }
    }
    if (second != (size_t)-1 && (dup == (size_t)-1 || v[second].at < v[dup].at)) dup = second;
  }
  return dup;
}

int esj_members_permute(const esj_member *v, size_t n, es_buf *out, size_t body, es_buf *tmp) {
  /* A small object's members are copied aside on the stack: tmp is often
   * a fresh buffer per call (an encoder's), and its allocation and free
   * cost more than a typical payload's whole reordering. */
  char local[512];
  const char *from = local;
  size_t len = out->len - body;
  if (out->oom) return ES_STORAGE;
  if (len <= sizeof local) {
    memcpy(local, out->data + body, len);
  } else {
    tmp->len = 0;
    esj_put(tmp, out->data + body, len);
    if (tmp->oom) return ES_STORAGE;
    from = tmp->data;
  }
  out->len = body;
  for (size_t i = 0; i < n; i++) {
    if (i) esj_putc(out, ',');
    esj_put(out, from + (v[i].start - body), v[i].end - v[i].start);
  }
  return out->oom ? ES_STORAGE : ES_OK;
}

/* Canonicalize / validate ------------------------------------------------ */

typedef struct canon {
  esj_parser P;
  es_buf *out;     /* borrowed; NULL when only validating */
  es_buf keys;     /* owned: keys that had escapes, stack-like per object */
  es_buf str;      /* owned: decoded string values that had escapes */
  es_buf tmp;      /* owned: scratch for reordering members */
  esj_members m;   /* owned: members of every open object */
} canon;

static int canon_value(canon *c, int depth);

static int canon_object(canon *c, int depth) {
  esj_parser *P = &c->P;
  es_buf *out = c->out;
  size_t base = c->m.len, kmark = c->keys.len, body = 0;
  int sorted = 1, rc;
  P->p++; /* '{' */
  if (out) {
    esj_putc(out, '{');
    body = out->len;
  }
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == '}') {
    P->p++;
    if (out) esj_putc(out, '}');
    return ES_OK;
  }
  for (;;) {
    esj_member mem;
    const char *k;
    size_t kn;
    int copied;
    if (P->p >= P->end || *P->p != '"') return esj_fail_unexpected(P, "a string key");
    mem.at = (size_t)(P->p - P->start);
    if ((rc = esj_parse_string(P, &c->keys, &k, &kn, &copied)) != ES_OK) return rc;
    mem.in_keys = copied;
    mem.key = copied ? NULL : k;
    mem.koff = copied ? (size_t)(k - c->keys.data) : 0;
    mem.klen = kn;
    mem.start = mem.end = 0;
    if (out) {
      if (c->m.len > base) esj_putc(out, ',');
      mem.start = out->len;
      esj_write_string(out, k, kn, NULL);
      esj_putc(out, ':');
    }
    if (sorted && c->m.len > base) {
      /* Canonical input arrives sorted: noticing that here skips the sort. */
      const esj_member *prev = &c->m.v[c->m.len - 1];
      const char *pk = prev->in_keys ? c->keys.data + prev->koff : prev->key;
      if (esj_keycmp(pk, prev->klen, k, kn) >= 0) sorted = 0;
    }
    esj_skip_ws(P);
    if (P->p >= P->end || *P->p != ':') return esj_fail_unexpected(P, "':'");
    P->p++;
    if ((rc = canon_value(c, depth)) != ES_OK) return rc;
    if (out) mem.end = out->len;
    if (esj_members_push(&c->m, &mem) != ES_OK) return esj_fail_oom(P);
    int more;
    if ((rc = esj_next_element(P, '}', &more)) != ES_OK) return rc;
    if (!more) break;
  }
  if (!sorted) {
    esj_member *v = c->m.v + base;
    size_t n = c->m.len - base;
    size_t dup = esj_members_sort(v, n, c->keys.data);
    if (dup != (size_t)-1) {
      char kd[ESJ_KEY_DESC];
      esj_describe_key(kd, sizeof kd, v[dup].key, v[dup].klen);
      P->p = P->start + v[dup].at;
      return esj_fail(P, P->p, "duplicate object key \"%s\"", kd);
    }
    if (out && esj_members_permute(v, n, out, body, &c->tmp) != ES_OK) return esj_fail_oom(P);
  }
  c->m.len = base;
  c->keys.len = kmark;
  if (out) esj_putc(out, '}');
  return ES_OK;
}

static int canon_array(canon *c, int depth) {
  esj_parser *P = &c->P;
  int rc;
  P->p++; /* '[' */
  if (c->out) esj_putc(c->out, '[');
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == ']') {
    P->p++;
    if (c->out) esj_putc(c->out, ']');
    return ES_OK;
  }
  for (;;) {
    if ((rc = canon_value(c, depth)) != ES_OK) return rc;
    int more;
    if ((rc = esj_next_element(P, ']', &more)) != ES_OK) return rc;
    if (!more) break;
    if (c->out) esj_putc(c->out, ',');
  }
  if (c->out) esj_putc(c->out, ']');
  return ES_OK;
}

/* depth: how many arrays/objects enclose the value. */
static int canon_value(canon *c, int depth) {
  esj_parser *P = &c->P;
  es_buf *out = c->out;
  int rc;
  esj_skip_ws(P);
  if (P->p >= P->end) return esj_fail_unexpected(P, "a JSON value");
  switch (*P->p) {
    case '{':
    case '[':
      if (depth >= ES_JSON_MAX_DEPTH) return esj_fail(P, P->p, "nesting deeper than %d", ES_JSON_MAX_DEPTH);
      return *P->p == '{' ? canon_object(c, depth + 1) : canon_array(c, depth + 1);
    case '"': {
      const char *s;
      size_t n, mark = c->str.len;
      int copied;
      if ((rc = esj_parse_string(P, &c->str, &s, &n, &copied)) != ES_OK) return rc;
      if (out) esj_write_string(out, s, n, NULL);
      c->str.len = mark;
      return ES_OK;
    }
    case 't':
      if ((rc = esj_parse_word(P, "true", 4)) == ES_OK && out) esj_put(out, "true", 4);
      return rc;
    case 'f':
      if ((rc = esj_parse_word(P, "false", 5)) == ES_OK && out) esj_put(out, "false", 5);
      return rc;
    case 'n':
      if ((rc = esj_parse_word(P, "null", 4)) == ES_OK && out) esj_put(out, "null", 4);
      return rc;
    default: {
      esj_number num;
      if (*P->p != '-' && !IS_DIGIT(*P->p)) return esj_fail_unexpected(P, "a JSON value");
      if ((rc = esj_parse_number(P, &num)) != ES_OK) return rc;
      if (!out) return ES_OK;
      if (num.is_int) {
        esj_write_int(out, num.i);
        return ES_OK;
      }
      rc = es_json_format_double(num.d, out, P->err);
      return rc == ES_STORAGE ? esj_fail_oom(P) : rc;
    }
  }
}

static int canon_run(const char *text, size_t len, es_buf *out, es_err *err) {
  canon c;
  esj_member local[ESJ_LOCAL_MEMBERS];
  size_t mark = out ? out->len : 0;
  int rc;
  esj_parser_init(&c.P, text, len, err);
  c.out = out;
  es_buf_init(&c.keys);
  es_buf_init(&c.str);
  es_buf_init(&c.tmp);
  esj_members_init(&c.m, local, ESJ_LOCAL_MEMBERS);
  rc = canon_value(&c, 0);
  if (rc == ES_OK) {
    esj_skip_ws(&c.P);
    if (c.P.p < c.P.end) rc = esj_fail(&c.P, c.P.p, "trailing characters after the JSON value");
  }
  if (rc == ES_OK && out && out->oom) rc = esj_fail_oom(&c.P);
  if (rc != ES_OK && out) out->len = mark; /* leave out as it was (but for a sticky oom) */
  esj_parser_destroy(&c.P);
  es_buf_destroy(&c.keys);
  es_buf_destroy(&c.str);
  es_buf_destroy(&c.tmp);
  esj_members_destroy(&c.m);
  return rc;
}

int es_json_validate(const char *text, size_t len, es_err *err) {
  if (!text && len) return es_fail(err, ES_INVALID_ARGUMENT, "invalid JSON: NULL text");
  return canon_run(text ? text : "", len, NULL, err);
}

int es_json_canonicalize(const char *text, size_t len, es_buf *out, es_err *err) {
  if (!text && len) return es_fail(err, ES_INVALID_ARGUMENT, "invalid JSON: NULL text");
  return canon_run(text ? text : "", len, out, err);
}

void es_json_write_int(es_buf *out, int64_t v) { esj_write_int(out, v); }

void es_json_write_text(es_buf *out, const char *s, size_t n) {
  size_t bad;
  if (esj_write_string(out, s, n, &bad) == ES_OK) return;
  /* Not UTF-8: the valid runs as they are, each stray byte as the four
   * characters \xHH (a backslash escaped as JSON wants: "\\x"). */
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  esj_putc(out, '"');
  while (p < end) {
    const unsigned char *run = p;
    while (p < end) {
      if (*p < 0x80) p++;
      else {
        size_t k = esj_utf8_seq(p, end);
        if (k == 0) break;
        p += k;
      }
    }
    if (p > run) {
      size_t before = out->len;
      esj_write_string(out, (const char *)run, (size_t)(p - run), NULL);
      /* drop the quotes esj_write_string put around the run */
      if (!out->oom && out->len >= before + 2) {
        memmove(out->data + before, out->data + before + 1, out->len - before - 2);
        out->len -= 2;
      }
    }
    if (p < end) {
      char hex[8];
      snprintf(hex, sizeof hex, "\\\\x%02X", *p);
      esj_put(out, hex, strlen(hex));
      p++;
    }
  }
  esj_putc(out, '"');
}
