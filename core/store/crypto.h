/*
 * store/crypto.h: sealed payloads and shredding (docs/contract.md §3.10), the part
 * of the store's insides that store.c calls (crypto.c). Not a public
 * header: store.h has the public calls (es_store_shred,
 * es_store_read_at_rest) and docs/shredding.md the guarantees.
 */
#ifndef ES_STORE_CRYPTO_H
#define ES_STORE_CRYPTO_H

#include "store/internal.h"
#include "util/hmap.h"

/* Data keys met during one call, unwrapped once each (a read of a
 * thousand events under one key unwraps it once). Holds key material:
 * es_keyring_destroy wipes it. Lives on the caller's stack for one call,
 * inside one transaction (what it caches is only valid there). */
typedef struct es_keyring {
  es_hmap by_name;   /* owned es_keyring_entry items (crypto.c) */
} es_keyring;

void es_keyring_init(es_keyring *r);
void es_keyring_destroy(es_keyring *r);

/* Opens the master key file (creating it 0600 when missing) and checks it
 * against the store's check row (writing that row on first use); sets
 * s->crypto. INVALID_ARGUMENT names the file: permissions, format, or a key
 * other than the one the store was sealed with (nothing is changed then).
 * STORAGE: I/O. */
int es_crypto_open(es_store *s, const char *path, es_err *err);
/* The stored length of an n-byte payload once sealed ("es1:" and the
 * base64 of nonce, ciphertext and tag): about 4/3 of n. SIZE_MAX when it
 * would not fit a size_t. */
size_t es_crypto_sealed_len(size_t n);
/* Wipes and frees (NULL: nothing). */
void es_crypto_free(struct es_crypto *c);

/* Seals row's payload (plain, n bytes) under data key row->key inside
 * write transaction t: the data key is created at its first use, and a
 * key_uses row records (row->key, row->session, row->index) once per
 * session and call. row->id, key, session, index and created_at must be
 * set. *out (malloc'd, NUL-terminated, *out_len bytes) is the text to
 * store. INVALID_ARGUMENT: the key was shredded, or the store has no
 * master key. */
int es_crypto_seal(es_store *s, es_txn *t, es_keyring *r, const es_event *row, const char *plain,
                   size_t n, char **out, size_t *out_len, es_err *err);

/* Opens the payloads of the keyed events among v[0..n) in place (payload
 * replaced, see es_event.payload_own), or marks them shredded (payload
 * NULL, shredded = 1). r: a keyring to use (NULL: one for this call).
 * Errors: STORAGE (a payload fails authentication, a key row is missing
 * or cannot be unwrapped), INVALID_ARGUMENT (a live key, but the store
 * was opened without keys). Events without a key are untouched: a list
 * without keyed events costs one pass over it. */
int es_crypto_reveal(es_store *s, es_txn *t, es_keyring *r, es_event *v, size_t n, es_err *err);

/* For read_at_rest: sets shredded = 1 on the keyed events whose key was
 * shredded; payloads stay as stored. */
int es_crypto_mark_at_rest(es_store *s, es_txn *t, es_event *v, size_t n, es_err *err);

/* For fork: the payload the copy `row` (id, key, session, index set) of
 * the keyed event src stores. A live key: src opened and sealed again for
 * the copy's id (the id is associated data), *out malloc'd, and a key use
 * recorded for the copy's session. A shredded key: *out NULL, the copy
 * keeps src's sealed text (it reads as shredded). */
int es_crypto_fork_payload(es_store *s, es_txn *t, es_keyring *r, const es_event *src,
                           const es_event *row, char **out, size_t *out_len, es_err *err);

/* Checks the store's check row (if any) against this handle's master key:
 * INVALID_ARGUMENT naming the keys file when it does not open. */
int es_crypto_check(es_store *s, es_txn *t, es_err *err);

/* 1 when data keys were ever used in this store (its check row exists) or
 * the store has a master key: a fork must then copy row by row. */
int es_crypto_in_use(es_store *s, es_txn *t, int *yes, es_err *err);

#endif
