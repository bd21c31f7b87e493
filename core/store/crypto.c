/*
 * store/crypto.c: crypto-shredding (docs/contract.md §3.10): the master key file,
 * data keys wrapped by it, payloads sealed under data keys, opening them on
 * the way out, and shred. docs/shredding.md is the user's side: what is
 * guaranteed and what is not.
 *
 * Keys, with libsodium's XChaCha20-Poly1305 (IETF) everywhere: a random
 * 192-bit nonce per message, so random nonces never repeat in practice and
 * no counter has to survive crashes or be shared between processes.
 *   - master key: 32 random bytes in a file (64 hex digits and a newline),
 *     0600, never stored in the database. Kept in sodium_malloc'd memory
 *     (guard pages, not swapped where the OS allows, read-only once
 *     loaded, wiped when freed).
 *   - check row: the keys row named "" (no key can have that name: names
 *     are non-empty) holds CHECK_TEXT sealed by the master key, so opening
 *     a store with another key file is refused at once instead of failing
 *     on the first sealed event.
 *   - data keys: one per key name, 32 random bytes made inside the append
 *     that first uses the name, stored sealed by the master key with the
 *     name as associated data (a wrapped key moved to another name does
 *     not open). Shredding replaces the row by a tombstone (wrapped NULL).
 *   - payloads: "es1:" + base64url(nonce || ciphertext) of the canonical
 *     JSON, associated data "es1" NUL key NUL event id: a sealed payload
 *     copied onto another event, or relabelled with another key, fails
 *     authentication (STORAGE) instead of showing one event's data as
 *     another's.
 *
 * Unwrapped data keys live only in an es_keyring for the length of one
 * call and are wiped after it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/crypto.h"
#include "util/dirsync.h"

#define KEY_BYTES crypto_aead_xchacha20poly1305_ietf_KEYBYTES
#define NONCE_BYTES crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TAG_BYTES crypto_aead_xchacha20poly1305_ietf_ABYTES
#define B64 sodium_base64_VARIANT_URLSAFE_NO_PADDING
#define SEALED_PREFIX "es1:"
#define SEALED_PREFIX_LEN 4
#define CHECK_NAME ""
#define CHECK_TEXT "eventstore master key check, version 1"
#define KEY_FILE_HEX (2 * KEY_BYTES)

struct es_crypto {
  unsigned char *master;  /* sodium_malloc'd KEY_BYTES; read-only once loaded */
  char *path;             /* owned: the key file as given, for messages */
};

static int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

void es_key_row_destroy(es_key_row *k) {
  if (!k) return;
  free(k->name);
  free(k->wrapped);
  memset(k, 0, sizeof *k);
}

/* ---- AEAD helpers ------------------------------------------------------- */

/* nonce || ciphertext of m under key with ad, into *out (malloc'd). */
static int seal_bytes(const unsigned char *key, const unsigned char *m, size_t n,
                      const unsigned char *ad, size_t ad_len, unsigned char **out, size_t *out_len,
                      es_err *err) {
  if (n > SIZE_MAX - NONCE_BYTES - TAG_BYTES - 1) return es_fail(err, ES_TOO_LARGE, "payload too large to seal");
  unsigned char *b = malloc(NONCE_BYTES + n + TAG_BYTES);
  if (!b) return nomem(err);
  randombytes_buf(b, NONCE_BYTES);
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(b + NONCE_BYTES, &clen, m, n, ad, ad_len, NULL, b, key);
  *out = b;
  *out_len = NONCE_BYTES + (size_t)clen;
  return ES_OK;
}

/* Opens nonce || ciphertext; *out malloc'd with a NUL after *out_len bytes.
 * ES_STORAGE without a message when authentication fails (the caller names
 * what failed). */
static int open_bytes(const unsigned char *key, const unsigned char *c, size_t n,
                      const unsigned char *ad, size_t ad_len, unsigned char **out, size_t *out_len) {
  if (n < NONCE_BYTES + TAG_BYTES) return ES_STORAGE;
  size_t mlen_max = n - NONCE_BYTES - TAG_BYTES;
  unsigned char *m = malloc(mlen_max + 1);
  if (!m) return ES_STORAGE;
  unsigned long long mlen = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(m, &mlen, NULL, c + NONCE_BYTES, n - NONCE_BYTES, ad,
                                                 ad_len, c, key) != 0) {
    free(m);
    return ES_STORAGE;
  }
  m[mlen] = '\0';
  *out = m;
  *out_len = (size_t)mlen;
  return ES_OK;
}

/* Associated data: a format tag, then NUL-separated names, copied whole.
 * Every name is checked (es_check_name) and a stored name is at most
 * ES_MAX_NAME_BYTES (a tenant's prefix included), so AD_CAP always holds
 * the tag and two names; should one not fit, the answer is 0 and the
 * caller refuses, because cutting the associated data short would leave
 * the end of a name unauthenticated (a payload could then be moved
 * between events whose ids differ only there). */
#define AD_CAP (16 + 2 * (ES_MAX_NAME_BYTES + 1))

static size_t ad_build(const char *tag, const char *a, const char *b, unsigned char *ad, size_t cap) {
  const char *parts[3] = {tag, a, b};
  size_t n = 0;
  for (int i = 0; i < 3 && parts[i]; i++) {
    size_t k = strlen(parts[i]) + (i + 1 < 3 && parts[i + 1] ? 1 : 0); /* the NUL between */
    if (n + k > cap) return 0;
    memcpy(ad + n, parts[i], k);
    n += k;
  }
  return n;
}

/* Associated data of a wrapped data key: binds the key to its name. */
static size_t wrap_ad(const char *name, unsigned char *ad, size_t cap) {
  return ad_build("es-key", name, NULL, ad, cap);
}

/* Associated data of a sealed payload: the format, the key, the event id. */
static size_t payload_ad(const char *key, const char *id, unsigned char *ad, size_t cap) {
  return ad_build("es1", key, id, ad, cap);
}

static int ad_too_long(es_err *err) {
  return es_fail(err, ES_INVALID_ARGUMENT, "a key name or event id is too long to seal under");
}

/* ---- the master key file ------------------------------------------------ */

/* Writes a new key file at path, atomically: the whole content goes to a
 * private temporary file (mkstemp: 0600) that is then linked to path, so
 * a concurrent opener never reads half a key, and two processes creating
 * the file at once end up using the same one (link fails with EEXIST for
 * the second, which then reads the first's). */
static int create_key_file(const char *path, es_err *err) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) return nomem(err);
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp-XXXXXX", 12);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return es_fail(err, ES_STORAGE, "keys file %s: cannot create it: %s", path, strerror(e));
  }
  unsigned char key[KEY_BYTES];
  char text[KEY_FILE_HEX + 2];
  randombytes_buf(key, sizeof key);
  sodium_bin2hex(text, sizeof text, key, sizeof key);
  sodium_memzero(key, sizeof key);
  text[KEY_FILE_HEX] = '\n';
  int rc = ES_OK;
  /* fchmod: mkstemp already makes it 0600, but say so rather than rely on it */
  if (fchmod(fd, 0600) != 0 || write(fd, text, KEY_FILE_HEX + 1) != KEY_FILE_HEX + 1 ||
      fsync(fd) != 0)
    rc = es_fail(err, ES_STORAGE, "keys file %s: cannot write it: %s", path, strerror(errno));
  sodium_memzero(text, sizeof text);
  if (close(fd) != 0 && rc == ES_OK)
    rc = es_fail(err, ES_STORAGE, "keys file %s: cannot write it: %s", path, strerror(errno));
  if (rc == ES_OK && link(tmp, path) != 0 && errno != EEXIST)
    rc = es_fail(err, ES_STORAGE, "keys file %s: cannot create it: %s", path, strerror(errno));
  unlink(tmp);
  free(tmp);
  /* the new name must survive a crash as well as the data under it: a key
   * lost with its name would make every payload sealed under it unreadable */
  if (rc == ES_OK && es_sync_parent_dir(path) != 0)
    rc = es_fail(err, ES_STORAGE, "keys file %s: cannot sync its directory: %s", path,
                 strerror(errno));
  return rc;
}

/* Reads the master key from path into key (creating the file when it does
 * not exist). Refuses a file others may read or write, anything but a
 * regular file, and any content but 64 hex digits (and a newline). */
static int load_key_file(const char *path, unsigned char *key, es_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0 && errno == ENOENT) {
    int rc = create_key_file(path, err);
    if (rc) return rc;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  }
  if (fd < 0)
    return es_fail(err, errno == EACCES ? ES_INVALID_ARGUMENT : ES_STORAGE,
                   "keys file %s: cannot open it: %s", path, strerror(errno));
  struct stat st;
  int rc = ES_OK;
  if (fstat(fd, &st) != 0) {
    rc = es_fail(err, ES_STORAGE, "keys file %s: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "keys file %s is not a regular file", path);
  } else if (st.st_mode & 077) {
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "keys file %s may be read or changed by other users (mode %04o): it must be "
                 "readable by its owner only (chmod 600 %s)",
                 path, (unsigned)(st.st_mode & 07777), path);
  }
  if (rc) {
    close(fd);
    return rc;
  }
  char text[KEY_FILE_HEX + 3];
  size_t n = 0;
  for (;;) {
    ssize_t got = read(fd, text + n, sizeof text - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      rc = es_fail(err, ES_STORAGE, "keys file %s: cannot read it: %s", path, strerror(errno));
      break;
    }
    if (got == 0) break;
    n += (size_t)got;
    if (n == sizeof text) break;
  }
  close(fd);
  if (rc == ES_OK) {
    size_t bin = 0;
    const char *end = NULL;
    int ok = (n == KEY_FILE_HEX || (n == KEY_FILE_HEX + 1 && text[KEY_FILE_HEX] == '\n')) &&
             sodium_hex2bin(key, KEY_BYTES, text, KEY_FILE_HEX, NULL, &bin, &end) == 0 &&
             bin == KEY_BYTES && end == text + KEY_FILE_HEX;
    if (!ok)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "keys file %s is not a master key (expected exactly 64 hex digits and a newline)",
                   path);
  }
  sodium_memzero(text, sizeof text);
  return rc;
}

/* The master key for one use. It stays read-only for the store's life:
 * toggling it to no-access between uses would race with other threads
 * (engine workers) using it at the same time. */
static const unsigned char *master_open(struct es_crypto *c) { return c->master; }
static void master_close(struct es_crypto *c) { (void)c; }

void es_crypto_free(struct es_crypto *c) {
  if (!c) return;
  if (c->master) sodium_free(c->master); /* wipes */
  free(c->path);
  free(c);
}

/* Checks the store's check row against the master key. *found: whether
 * the store has one. */
static int check_row(es_store *s, es_txn *t, int *found, es_err *err) {
  es_key_row row;
  memset(&row, 0, sizeof row);
  int rc = s->ops->key_get(s->bk, t, CHECK_NAME, &row, err);
  *found = rc == ES_OK;
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  unsigned char ad[] = "es-check";
  unsigned char *m = NULL;
  size_t mlen = 0;
  int bad = !row.wrapped || open_bytes(master_open(s->crypto), row.wrapped, row.wrapped_len, ad,
                                       sizeof ad - 1, &m, &mlen) != ES_OK;
  master_close(s->crypto);
  bad = bad || mlen != strlen(CHECK_TEXT) || memcmp(m, CHECK_TEXT, mlen) != 0;
  free(m);
  es_key_row_destroy(&row);
  if (bad)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "keys file %s does not match the key this store was sealed with",
                   s->crypto->path);
  return ES_OK;
}

/* §10 import: the check row just written (the source's) must open under
 * this handle's master key, or nothing imported could be read. */
int es_crypto_check(es_store *s, es_txn *t, es_err *err) {
  int found = 0;
  return check_row(s, t, &found, err);
}

/* Writes the check row when the store has none (the first data key). */
static int ensure_check_row(es_store *s, es_txn *t, int64_t now, es_err *err) {
  int found = 0;
  int rc = check_row(s, t, &found, err);
  if (rc || found) return rc;
  unsigned char ad[] = "es-check";
  es_key_row row = {0};
  row.name = CHECK_NAME;
  row.created_at = now;
  row.shredded_at = ES_NONE;
  rc = seal_bytes(master_open(s->crypto), (const unsigned char *)CHECK_TEXT, strlen(CHECK_TEXT), ad,
                  sizeof ad - 1, &row.wrapped, &row.wrapped_len, err);
  master_close(s->crypto);
  if (rc == ES_OK) rc = s->ops->key_put(s->bk, t, &row, err);
  free(row.wrapped);
  return rc;
}

static int do_check(es_store *s, es_txn *t, void *arg, es_err *err) {
  int found;
  (void)arg;
  return check_row(s, t, &found, err);
}

/* Whether the store has data keys wrapped by some master key (*(int *)arg;
 * s->crypto is not set yet, so es_crypto_in_use looks at the check row). */
static int do_has_check(es_store *s, es_txn *t, void *arg, es_err *err) {
  return es_crypto_in_use(s, t, arg, err);
}

int es_crypto_open(es_store *s, const char *path, es_err *err) {
  if (sodium_init() < 0) return es_fail(err, ES_STORAGE, "libsodium cannot be initialised");
  if (!*path) return es_fail(err, ES_INVALID_ARGUMENT, "keys: the key file path is empty");
  /* §3.10: a missing file is made only for a store with no wrapped keys.
   * For one that has them a new key could never open them, and the stray
   * file would have to be overwritten when the real one is restored. */
  struct stat st;
  if (stat(path, &st) != 0 && errno == ENOENT) {
    int has = 0;
    int rc = es_core_read(s, do_has_check, &has, err);
    if (rc) return rc;
    if (has)
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "keys file %s is missing, and this store has data keys wrapped by its master "
                     "key: restore that file (no new one was made)", path);
  }
  struct es_crypto *c = calloc(1, sizeof *c);
  if (!c || !(c->path = strdup(path)) || !(c->master = sodium_malloc(KEY_BYTES))) {
    es_crypto_free(c);
    return nomem(err);
  }
  int rc = load_key_file(path, c->master, err);
  sodium_mprotect_readonly(c->master); /* nothing writes it again */
  if (rc) {
    es_crypto_free(c);
    return rc;
  }
  s->crypto = c;
  /* A key file that is not this store's is refused now, before anything
   * is sealed under it. A store without a check row is checked again when
   * its first data key is made (ensure_check_row): writing it here would
   * make every open with keys a write. */
  rc = es_core_read(s, do_check, NULL, err);
  if (rc) {
    s->crypto = NULL;
    es_crypto_free(c);
  }
  return rc;
}

/* ---- the keyring -------------------------------------------------------- */

enum { KEY_LIVE = 1, KEY_SHREDDED, KEY_LOCKED /* live, but this store has no master key */ };

typedef struct ring_entry {
  int state;
  unsigned char key[KEY_BYTES];
  char *use_session;  /* the session whose key use this call recorded last (owned) */
  char name[];
} ring_entry;

static const char *ring_key(const void *item) { return ((const ring_entry *)item)->name; }

void es_keyring_init(es_keyring *r) { es_hmap_init(&r->by_name, ring_key); }

void es_keyring_destroy(es_keyring *r) {
  size_t it = 0;
  ring_entry *e;
  while ((e = es_hmap_next(&r->by_name, &it))) {
    sodium_memzero(e->key, sizeof e->key);
    free(e->use_session);
    free(e);
  }
  es_hmap_destroy(&r->by_name);
}

/* The keyring's entry for name, loaded (and, with create, made when the
 * name was never used) on first sight. */
static int ring_get(es_store *s, es_txn *t, es_keyring *r, const char *name, int create,
                    int64_t now, ring_entry **out, es_err *err) {
  ring_entry *e = es_hmap_get(&r->by_name, name);
  if (e) {
    *out = e;
    return ES_OK;
  }
  size_t ln = strlen(name) + 1;
  if (es_hmap_reserve(&r->by_name, 1) != 0 || !(e = calloc(1, sizeof *e + ln))) return nomem(err);
  memcpy(e->name, name, ln);
  es_key_row row;
  memset(&row, 0, sizeof row);
  unsigned char ad[AD_CAP];
  size_t ad_len = wrap_ad(name, ad, sizeof ad);
  if (ad_len == 0) {
    free(e);
    return ad_too_long(err);
  }
  int rc = s->ops->key_get(s->bk, t, name, &row, err);
  if (rc == ES_NOT_FOUND && create) {
    /* First use: a new data key, stored wrapped. */
    if (!s->crypto) {
      rc = es_fail(err, ES_INVALID_ARGUMENT, "key '%s': the store was opened without keys", name);
    } else if ((rc = ensure_check_row(s, t, now, err)) == ES_OK) {
      es_key_row neu = {0};
      neu.name = (char *)name;
      neu.created_at = now;
      neu.shredded_at = ES_NONE;
      randombytes_buf(e->key, sizeof e->key);
      rc = seal_bytes(master_open(s->crypto), e->key, sizeof e->key, ad, ad_len, &neu.wrapped,
                      &neu.wrapped_len, err);
      master_close(s->crypto);
      if (rc == ES_OK) rc = s->ops->key_put(s->bk, t, &neu, err);
      free(neu.wrapped);
      e->state = KEY_LIVE;
    }
  } else if (rc == ES_NOT_FOUND) {
    rc = es_fail(err, ES_STORAGE, "key '%s' of a sealed event is not in the keys table", name);
  } else if (rc == ES_OK) {
    if (!row.wrapped) {
      e->state = KEY_SHREDDED;
    } else if (!s->crypto) {
      e->state = KEY_LOCKED;
    } else {
      unsigned char *k = NULL;
      size_t klen = 0;
      int bad = open_bytes(master_open(s->crypto), row.wrapped, row.wrapped_len, ad, ad_len, &k,
                           &klen) != ES_OK || klen != KEY_BYTES;
      master_close(s->crypto);
      if (k) {
        if (!bad) memcpy(e->key, k, KEY_BYTES);
        sodium_memzero(k, klen);
        free(k);
      }
      if (bad)
        rc = es_fail(err, ES_STORAGE,
                     "data key '%s' does not open with the master key (the keys table is damaged)",
                     name);
      e->state = KEY_LIVE;
    }
  }
  es_key_row_destroy(&row);
  if (rc) {
    sodium_memzero(e->key, sizeof e->key);
    free(e);
    return rc;
  }
  es_hmap_put(&r->by_name, e); /* reserved: cannot fail */
  *out = e;
  return ES_OK;
}

/* ---- payloads ----------------------------------------------------------- */

/* Replaces e's payload by p (malloc'd, or NULL), freeing what e owned. */
static void set_payload(es_event *e, char *p, size_t n) {
  if (!e->packed || e->payload_own) free(e->payload);
  e->payload = p;
  e->payload_len = n;
  if (e->packed) e->payload_own = p != NULL;
}

/* seal_text writes exactly this many bytes: one formula for the text and
 * for the check against the backend's limit. */
size_t es_crypto_sealed_len(size_t n) {
  if (n > SIZE_MAX / 2) return SIZE_MAX;
  return SEALED_PREFIX_LEN + sodium_base64_ENCODED_LEN(NONCE_BYTES + n + TAG_BYTES, B64) - 1;
}

static int seal_text(const unsigned char *key, const char *key_name, const char *id,
                     const char *plain, size_t n, char **out, size_t *out_len, es_err *err) {
  unsigned char ad[AD_CAP];
  size_t ad_len = payload_ad(key_name, id, ad, sizeof ad);
  if (ad_len == 0) return ad_too_long(err);
  unsigned char *bin = NULL;
  size_t bin_len = 0;
  /* the length the append's checks held against the backend's limit */
  size_t total = es_crypto_sealed_len(n);
  if (total == SIZE_MAX) return es_fail(err, ES_TOO_LARGE, "payload too large to seal");
  int rc = seal_bytes(key, (const unsigned char *)plain, n, ad, ad_len, &bin, &bin_len, err);
  if (rc) return rc;
  char *text = malloc(total + 1);
  if (!text) {
    free(bin);
    return nomem(err);
  }
  memcpy(text, SEALED_PREFIX, SEALED_PREFIX_LEN);
  sodium_bin2base64(text + SEALED_PREFIX_LEN, total - SEALED_PREFIX_LEN + 1, bin, bin_len, B64);
  free(bin);
  *out = text;
  *out_len = total;
  return ES_OK;
}

/* Opens e's sealed payload (stored under e->id) into *out. */
static int open_text(const unsigned char *key, const es_event *e, const char *id, char **out,
                     size_t *out_len, es_err *err) {
  unsigned char ad[AD_CAP];
  size_t ad_len = payload_ad(e->key, id, ad, sizeof ad);
  if (ad_len == 0) return ad_too_long(err);
  int rc = ES_STORAGE;
  if (e->payload && e->payload_len > SEALED_PREFIX_LEN &&
      memcmp(e->payload, SEALED_PREFIX, SEALED_PREFIX_LEN) == 0) {
    const char *b64 = e->payload + SEALED_PREFIX_LEN;
    size_t b64_len = e->payload_len - SEALED_PREFIX_LEN;
    size_t cap = b64_len / 4 * 3 + 3;
    unsigned char *bin = malloc(cap);
    size_t bin_len = 0;
    const char *end = NULL;
    if (!bin) return nomem(err);
    if (sodium_base642bin(bin, cap, b64, b64_len, NULL, &bin_len, &end, B64) == 0 &&
        end == b64 + b64_len)
      rc = open_bytes(key, bin, bin_len, ad, ad_len, (unsigned char **)out, out_len);
    free(bin);
  }
  if (rc)
    return es_fail(err, ES_STORAGE,
                   "event %lld of session '%s' (id %s): its sealed payload does not open under key "
                   "'%s' (damaged or altered); refusing to return it",
                   (long long)e->index, e->session ? e->session : "?", e->id ? e->id : "?", e->key);
  return ES_OK;
}

static int record_use(es_store *s, es_txn *t, ring_entry *k, const char *session, int64_t index,
                      es_err *err) {
  if (k->use_session && strcmp(k->use_session, session) == 0) return ES_OK;
  char *copy = strdup(session);
  if (!copy) return nomem(err);
  int rc = s->ops->key_use_put(s->bk, t, k->name, session, index, err);
  if (rc) {
    free(copy);
    return rc;
  }
  free(k->use_session);
  k->use_session = copy;
  return ES_OK;
}

int es_crypto_seal(es_store *s, es_txn *t, es_keyring *r, const es_event *row, const char *plain,
                   size_t n, char **out, size_t *out_len, es_err *err) {
  ring_entry *k;
  *out = NULL;
  if (!s->crypto)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "key '%s': the store was opened without keys (open it with {keys = PATH})",
                   row->key);
  int rc = ring_get(s, t, r, row->key, 1, row->created_at, &k, err);
  if (rc) return rc;
  if (k->state == KEY_SHREDDED)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "key '%s' was shredded: nothing can be sealed under that name again", row->key);
  if ((rc = record_use(s, t, k, row->session, row->index, err))) return rc;
  return seal_text(k->key, row->key, row->id, plain, n, out, out_len, err);
}

static int locked(const es_event *e, es_err *err) {
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "event %lld of session '%s' is sealed under key '%s': open the store with its "
                 "master key file ({keys = PATH}, eventstore --keys PATH) to read it",
                 (long long)e->index, e->session ? e->session : "?", e->key);
}

int es_crypto_reveal(es_store *s, es_txn *t, es_keyring *r, es_event *v, size_t n, es_err *err) {
  size_t i = 0;
  while (i < n && !v[i].key) i++;
  if (i == n) return ES_OK;
  es_keyring own;
  if (!r) {
    es_keyring_init(&own);
    r = &own;
  }
  int rc = ES_OK;
  for (; i < n && rc == ES_OK; i++) {
    es_event *e = &v[i];
    if (!e->key || e->shredded) continue;
    ring_entry *k;
    if ((rc = ring_get(s, t, r, e->key, 0, 0, &k, err))) break;
    if (k->state == KEY_SHREDDED) {
      set_payload(e, NULL, 0);
      e->shredded = 1;
    } else if (k->state == KEY_LOCKED) {
      rc = locked(e, err);
    } else {
      char *p = NULL;
      size_t pn = 0;
      if ((rc = open_text(k->key, e, e->id, &p, &pn, err)) == ES_OK) set_payload(e, p, pn);
    }
  }
  if (r == &own) es_keyring_destroy(&own);
  return rc;
}

int es_crypto_mark_at_rest(es_store *s, es_txn *t, es_event *v, size_t n, es_err *err) {
  es_keyring ring;
  es_keyring_init(&ring);
  int rc = ES_OK;
  for (size_t i = 0; i < n && rc == ES_OK; i++) {
    ring_entry *k;
    if (!v[i].key) continue;
    if ((rc = ring_get(s, t, &ring, v[i].key, 0, 0, &k, err)) == ES_OK)
      v[i].shredded = k->state == KEY_SHREDDED;
  }
  es_keyring_destroy(&ring);
  return rc;
}

int es_crypto_fork_payload(es_store *s, es_txn *t, es_keyring *r, const es_event *src,
                           const es_event *row, char **out, size_t *out_len, es_err *err) {
  ring_entry *k;
  *out = NULL;
  *out_len = 0;
  int rc = ring_get(s, t, r, src->key, 0, 0, &k, err);
  if (rc) return rc;
  if (k->state == KEY_SHREDDED) return ES_OK;
  if (k->state == KEY_LOCKED) return locked(src, err);
  char *plain = NULL;
  size_t pn = 0;
  if ((rc = open_text(k->key, src, src->id, &plain, &pn, err))) return rc;
  rc = record_use(s, t, k, row->session, row->index, err);
  if (rc == ES_OK) rc = seal_text(k->key, src->key, row->id, plain, pn, out, out_len, err);
  sodium_memzero(plain, pn);
  free(plain);
  return rc;
}

int es_crypto_in_use(es_store *s, es_txn *t, int *yes, es_err *err) {
  *yes = s->crypto != NULL;
  if (*yes) return ES_OK;
  es_key_row row;
  memset(&row, 0, sizeof row);
  int rc = s->ops->key_get(s->bk, t, CHECK_NAME, &row, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  es_key_row_destroy(&row);
  *yes = rc == ES_OK;
  return rc;
}

/* ---- shred -------------------------------------------------------------- */

typedef struct {
  const char *name;
  int64_t now;
  int was_live;
  /* the key's (session, first_index) rows, collected before any is acted on */
  char **sessions;
  int64_t *firsts;
  size_t n, cap;
  int oom;
} shred_args;

static int collect_use(void *ctx, const char *session, int64_t first_index) {
  shred_args *a = ctx;
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 8;
    char **sv = realloc(a->sessions, cap * sizeof *sv);
    if (sv) a->sessions = sv;
    int64_t *fv = sv ? realloc(a->firsts, cap * sizeof *fv) : NULL;
    if (fv) a->firsts = fv;
    if (!sv || !fv) {
      a->oom = 1;
      return 1;
    }
    a->cap = cap;
  }
  if (!(a->sessions[a->n] = strdup(session))) {
    a->oom = 1;
    return 1;
  }
  a->firsts[a->n++] = first_index;
  return 0;
}

static void shred_args_clear(shred_args *a) {
  for (size_t i = 0; i < a->n; i++) free(a->sessions[i]);
  free(a->sessions);
  free(a->firsts);
  a->sessions = NULL;
  a->firsts = NULL;
  a->n = a->cap = 0;
}

static int do_shred(es_store *s, es_txn *t, void *arg, es_err *err) {
  shred_args *a = arg;
  es_key_row row;
  memset(&row, 0, sizeof row);
  a->was_live = 0;
  int rc = s->ops->key_get(s->bk, t, a->name, &row, err);
  if (rc != ES_OK && rc != ES_NOT_FOUND) return rc;
  int found = rc == ES_OK;
  rc = ES_OK;
  if (!found || row.wrapped) {
    /* live, or never used: the tombstone burns the name either way */
    es_key_row tomb = {0};
    tomb.name = (char *)a->name;
    tomb.created_at = found ? row.created_at : a->now;
    tomb.shredded_at = a->now;
    a->was_live = found;
    rc = s->ops->key_put(s->bk, t, &tomb, err);
  }
  if (row.wrapped) sodium_memzero(row.wrapped, row.wrapped_len);
  es_key_row_destroy(&row);
  /* Dropped again on every shred, even of a shredded key: a fold that read
   * the plaintext before the first shred may have put its snapshot after. */
  if (rc == ES_OK) rc = s->ops->key_use_list(s->bk, t, a->name, collect_use, a, err);
  if (rc == ES_OK && a->oom) rc = nomem(err);
  for (size_t i = 0; rc == ES_OK && i < a->n; i++)
    rc = s->ops->snapshot_delete_from(s->bk, t, a->sessions[i], a->firsts[i], err);
  return rc;
}

static int scrub(es_store *s, void *arg, es_err *err) {
  (void)arg;
  return s->ops->scrub ? s->ops->scrub(s->bk, err) : ES_OK;
}

int es_core_shred(es_store *s, const char *name, int *was_live, es_err *err) {
  int rc;
  *was_live = 0;
  if ((rc = es_check_name("key", name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  shred_args a = {0};
  a.name = name;
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_shred, &a, err);
  shred_args_clear(&a);
  if (rc == ES_OK) {
    *was_live = a.was_live;
    es_err serr = {0};
    int src = es_core_outside_txn(s, scrub, NULL, &serr);
    if (src)
      rc = es_fail(err, src,
                   "key '%s' was shredded, but the storage could not be scrubbed yet (%s): call "
                   "shred again to finish",
                   name, serr.msg);
  }
  es_core_leave(s);
  return rc;
}
