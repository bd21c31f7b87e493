/*
 * http/tokens.c: the tokens file (tokens.h, docs/http.md "Tokens"). Only
 * digests are kept; a lookup hashes the presented token once and compares
 * its digest with every entry's in constant time, so how long it takes
 * says nothing about which entry, or how much of one, matched.
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/internal.h"
#include "http/tokens.h"

typedef struct token_entry {
  unsigned char digest[crypto_hash_sha256_BYTES];
  char *tenant; /* owned; NULL: every tenant ('*') */
  int rights;
  int line;
} token_entry;

struct es_tokens {
  atomic_int refs;
  token_entry *v;
  size_t n, cap;
};

/* sodium_init is safe to call again and from several threads (it returns 1
 * once done); < 0 only when the library cannot start. */
static int sodium_ready(es_err *err) {
  if (sodium_init() < 0) return es_fail(err, ES_STORAGE, "libsodium cannot start");
  return ES_OK;
}

static void tokens_free(es_tokens *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) free(t->v[i].tenant);
  free(t->v);
  free(t);
}

void es_tokens_retain(es_tokens *t) {
  if (t) atomic_fetch_add(&t->refs, 1);
}

void es_tokens_release(es_tokens *t) {
  if (t && atomic_fetch_sub(&t->refs, 1) == 1) tokens_free(t);
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Rights "read,append" -> bits; -1 with the bad word in err. */
static int parse_rights(const char *s, const char *path, int line, es_err *err) {
  static const struct { const char *name; int bit; } names[] = {
      {"read", ES_RIGHT_READ}, {"append", ES_RIGHT_APPEND},
      {"work", ES_RIGHT_WORK}, {"admin", ES_RIGHT_ADMIN}};
  int bits = 0;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int found = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      if (strlen(names[i].name) == len && memcmp(names[i].name, p, len) == 0) {
        bits |= names[i].bit;
        found = 1;
      }
    }
    if (!found) {
      es_fail(err, ES_INVALID_ARGUMENT,
              "%s:%d: unknown right '%.*s' (rights are a comma list of read, append, work, admin)",
              path, line, (int)(len > 40 ? 40 : len), p);
      return -1;
    }
    if (!comma) break;
    p = comma + 1;
  }
  return bits;
}

/* One non-comment line's three fields into t. */
static int add_line(es_tokens *t, es_store *root, char *text, const char *path, int line,
                    int *plain, es_err *err) {
  char *fields[4] = {0};
  int nf = 0;
  char *save = NULL;
  for (char *w = strtok_r(text, " \t\r", &save); w; w = strtok_r(NULL, " \t\r", &save)) {
    if (nf == 4) break;
    fields[nf++] = w;
  }
  if (nf != 3)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: expected 'TOKEN TENANT RIGHTS' (3 words), got %s%d",
                   path, line, nf > 3 ? "more than " : "", nf > 3 ? 3 : nf);
  token_entry e;
  memset(&e, 0, sizeof e);
  e.line = line;
  const char *tok = fields[0];
  *plain = 0;
  if (strncmp(tok, "sha256:", 7) == 0) {
    const char *hex = tok + 7;
    if (strlen(hex) != 64)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "%s:%d: a hashed token is 'sha256:' and 64 hex digits (eventstore token hash TOKEN)",
                     path, line);
    for (size_t i = 0; i < 32; i++) {
      int hi = hexval((unsigned char)hex[2 * i]), lo = hexval((unsigned char)hex[2 * i + 1]);
      if (hi < 0 || lo < 0)
        return es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: a hashed token is 'sha256:' and 64 hex digits",
                       path, line);
      e.digest[i] = (unsigned char)(hi * 16 + lo);
    }
  } else {
    for (const char *c = tok; *c; c++)
      if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7e)
        return es_fail(err, ES_INVALID_ARGUMENT,
                       "%s:%d: a token is printable ASCII (a byte 0x%02X is not)", path, line,
                       (unsigned char)*c);
    crypto_hash_sha256(e.digest, (const unsigned char *)tok, strlen(tok));
    *plain = 1;
  }
  if (strcmp(fields[1], "*") != 0) {
    /* The store's own rules decide what a tenant name is. */
    es_store *probe = NULL;
    es_err terr = {0};
    if (es_store_tenant(root, fields[1], &probe, &terr) != ES_OK) {
      if (terr.code != ES_INVALID_ARGUMENT) {
        *err = terr;
        return terr.code;
      }
      return es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: tenant: %s", path, line, terr.msg);
    }
    es_store_release(probe);
    e.tenant = strdup(fields[1]);
    if (!e.tenant) return es_fail(err, ES_STORAGE, "out of memory");
  }
  e.rights = parse_rights(fields[2], path, line, err);
  if (e.rights < 0) {
    free(e.tenant);
    return ES_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < t->n; i++) {
    if (sodium_memcmp(t->v[i].digest, e.digest, sizeof e.digest) == 0) {
      free(e.tenant);
      return es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: the same token as line %d", path, line,
                     t->v[i].line);
    }
  }
  if (es_grow((void **)&t->v, &t->cap, t->n + 1, sizeof *t->v) != ES_OK) {
    free(e.tenant);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  t->v[t->n++] = e;
  return ES_OK;
}

int es_tokens_load(const char *path, es_store *root, es_tokens **out, int **plain_lines,
                   es_err *err) {
  *out = NULL;
  if (plain_lines) *plain_lines = NULL;
  if (sodium_ready(err)) return err->code;
  /* O_NONBLOCK: a FIFO would block the open itself; it is refused below
   * as not a regular file, like a device (/dev/zero never ends). */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  struct stat st;
  if (fd < 0)
    return es_fail(err, errno == ENOENT ? ES_INVALID_ARGUMENT : ES_STORAGE,
                   "tokens file '%s': %s", path, strerror(errno));
  int e = fstat(fd, &st) != 0 ? errno : 0;
  if (e || !S_ISREG(st.st_mode)) {
    close(fd);
    return es_fail(err, ES_INVALID_ARGUMENT, "tokens file '%s': %s", path,
                   e ? strerror(e) : "not a regular file");
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return es_fail(err, ES_STORAGE, "tokens file '%s': %s", path, strerror(errno));
  }
  es_tokens *t = calloc(1, sizeof *t);
  int *plain = NULL;
  size_t nplain = 0, plain_cap = 0;
  char line[ES_TOKENS_MAX_LINE + 1];
  size_t total = 0;
  int lineno = 0, rc = ES_OK;
  if (!t) {
    rc = es_fail(err, ES_STORAGE, "out of memory");
    goto done;
  }
  atomic_init(&t->refs, 1);
  /* Read by hand, with both limits checked as bytes arrive: the file may
   * grow while it is read, so neither its size at open nor getline's
   * unbounded line would do. */
  for (;;) {
    size_t len = 0;
    int ch = EOF;
    while ((ch = getc(f)) != EOF) {
      if (++total > ES_TOKENS_MAX_BYTES) {
        rc = es_fail(err, ES_INVALID_ARGUMENT, "tokens file '%s' is over %d bytes", path,
                     ES_TOKENS_MAX_BYTES);
        goto done;
      }
      if (ch == '\n') break;
      if (ch == '\0') {
        rc = es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: the line holds a NUL byte", path, lineno + 1);
        goto done;
      }
      if (len == ES_TOKENS_MAX_LINE) {
        rc = es_fail(err, ES_INVALID_ARGUMENT, "%s:%d: the line is over %d bytes", path, lineno + 1,
                     ES_TOKENS_MAX_LINE);
        goto done;
      }
      line[len++] = (char)ch;
    }
    line[len] = '\0';
    if (ch == EOF && len == 0) break;
    lineno++;
    const char *p = line;
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p == '\0' || *p == '#') continue;
    int is_plain = 0;
    rc = add_line(t, root, line, path, lineno, &is_plain, err);
    if (rc) goto done;
    if (is_plain && plain_lines) {
      if (es_grow((void **)&plain, &plain_cap, nplain + 2, sizeof *plain) != ES_OK) {
        rc = es_fail(err, ES_STORAGE, "out of memory");
        goto done;
      }
      plain[nplain++] = lineno;
      plain[nplain] = 0;
    }
    if (ch == EOF) break;
  }
  if (ferror(f)) {
    rc = es_fail(err, ES_STORAGE, "tokens file '%s': %s", path, strerror(errno));
    goto done;
  }
  if (t->n == 0) {
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "tokens file '%s' holds no token (one a line: TOKEN TENANT RIGHTS; "
                 "eventstore token new TENANT RIGHTS makes one)", path);
    goto done;
  }
done:
  fclose(f);
  if (rc) {
    tokens_free(t);
    free(plain);
    return rc;
  }
  *out = t;
  if (plain_lines) *plain_lines = plain;
  else free(plain);
  return ES_OK;
}

int es_tokens_find(const es_tokens *t, const char *token, size_t n, const char **tenant,
                   int *rights) {
  if (!t) return 0; /* no usable tokens file: every token is revoked */
  unsigned char d[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(d, (const unsigned char *)token, n);
  /* Every entry is compared (no early exit), each in constant time. */
  size_t found = (size_t)-1;
  for (size_t i = 0; i < t->n; i++)
    if (sodium_memcmp(t->v[i].digest, d, sizeof d) == 0) found = i;
  if (found == (size_t)-1) return 0;
  *tenant = t->v[found].tenant;
  *rights = t->v[found].rights;
  return 1;
}

int es_token_hash(const char *token, size_t n, char out[ES_TOKEN_HASH_CHARS], es_err *err) {
  if (sodium_ready(err)) return err->code;
  unsigned char d[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(d, (const unsigned char *)token, n);
  memcpy(out, "sha256:", 7);
  sodium_bin2hex(out + 7, 65, d, sizeof d);
  return ES_OK;
}

int es_token_new(char out[ES_TOKEN_NEW_CHARS], es_err *err) {
  if (sodium_ready(err)) return err->code;
  unsigned char b[32];
  randombytes_buf(b, sizeof b);
  sodium_bin2hex(out, ES_TOKEN_NEW_CHARS, b, sizeof b);
  sodium_memzero(b, sizeof b);
  return ES_OK;
}
