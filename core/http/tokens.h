/*
 * http/tokens.h: the bearer tokens `eventstore serve` accepts (docs/http.md
 * "Tokens"). A tokens file holds one token a line, `TOKEN TENANT RIGHTS`:
 * TOKEN is `sha256:<64 hex>` (the SHA-256 of the token, what `eventstore
 * token hash` prints) or the token itself in plain text (accepted, with a
 * warning); TENANT a tenant name or `*` (every tenant: the root store);
 * RIGHTS a comma list of read, append, work, admin. `#` starts a comment
 * line; blank lines are skipped.
 *
 * Only SHA-256 digests are kept in memory, and a presented token is found
 * by comparing digests in constant time (sodium_memcmp) against every
 * entry, so neither the file's plain tokens nor the time a lookup takes
 * tell an attacker anything about a token.
 */
#ifndef ES_HTTP_TOKENS_H
#define ES_HTTP_TOKENS_H

#include <stddef.h>

#include "es.h"
#include "store/store.h"

typedef struct es_tokens es_tokens;

/* "sha256:" + 64 hex digits + NUL */
#define ES_TOKEN_HASH_CHARS (7 + 64 + 1)
/* The random tokens es_token_new makes: 32 bytes as 64 hex digits + NUL. */
#define ES_TOKEN_NEW_CHARS (64 + 1)

/* Bounds on the file, so that a wrong path (a device, a log) cannot make
 * the server read without end: a longer line or a larger file is refused
 * (INVALID_ARGUMENT). A line holds a 71-byte hash, a tenant name and the
 * rights; 1 MiB is some 8000 such lines. */
#define ES_TOKENS_MAX_LINE 4096
#define ES_TOKENS_MAX_BYTES (1024 * 1024)

/* Reads the tokens file at path (a regular file: a device or a FIFO is
 * refused). Tenant names are checked with the store's
 * rules (es_store_tenant on root, borrowed, which must not be a tenant
 * handle). *plain_lines (may be NULL) receives a malloc'd array of the line
 * numbers holding plain-text tokens, ending with 0 (the caller frees it), so
 * the caller can warn. Returns ES_OK with *out (reference count 1, the
 * caller releases it), or INVALID_ARGUMENT naming the file and line (a bad
 * line, a duplicate token, no token at all), STORAGE (cannot read it, out
 * of memory). */
int es_tokens_load(const char *path, es_store *root, es_tokens **out, int **plain_lines,
                   es_err *err);

/* Reference counting: a request keeps the set it was authenticated with
 * while the set may be replaced (the file reloaded). Thread-safe. */
void es_tokens_retain(es_tokens *t); /* t may be NULL */
void es_tokens_release(es_tokens *t);

/* Looks up the presented token (n bytes) in t (NULL: no usable file, so
 * no token is valid). Returns 1 with *tenant (borrowed
 * from t: NULL for `*`) and *rights (ES_RIGHT_* bits) set, 0 when it is
 * not in the set. Every entry is compared, in constant time. */
int es_tokens_find(const es_tokens *t, const char *token, size_t n, const char **tenant,
                   int *rights);

/* The tokens file form of a token: "sha256:<hex>" into out. ES_OK, or
 * STORAGE when libsodium cannot start. */
int es_token_hash(const char *token, size_t n, char out[ES_TOKEN_HASH_CHARS], es_err *err);

/* A fresh random token (32 bytes from libsodium's randombytes_buf, as 64
 * lower-case hex digits) into out. ES_OK or STORAGE. */
int es_token_new(char out[ES_TOKEN_NEW_CHARS], es_err *err);

#endif
