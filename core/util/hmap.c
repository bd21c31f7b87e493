/*
 * hmap.c: the string-keyed hash set of hmap.h.
 *
 * The slot of a hash h is (h * cap) >> 32 (a multiply instead of a modulo,
 * so cap need not be a power of two and can grow by 1.5x).
 */
#include "util/hmap.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EMPTY 0u
#define REMOVED 1u

/* 64-bit multiply-xorshift over 8-byte words, folded to 32 bits; never 0 or
 * 1 (those mark empty and removed slots). */
uint32_t es_hmap_hash(const char *s) { return es_hmap_hash_bytes(s, strlen(s)); }

uint32_t es_hmap_hash_bytes(const void *p, size_t len) {
  const unsigned char *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xC2B2AE3D27D4EB4Full);
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
    s += 8;
    len -= 8;
  }
  if (len) {
    uint64_t w = 0;
    memcpy(&w, s, len);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
  }
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  uint32_t r = (uint32_t)(h ^ (h >> 32));
  return r < 2 ? r + 2 : r;
}

/* A table's arrays: a large one is its own mapping on transparent huge
 * pages where the system allows them (THP "madvise"): filling a fresh
 * array of millions of slots otherwise takes a page fault every 4 KiB. */
#define BIG (4u << 20)
#define HUGE_PAGE (2u << 20)

static atomic_size_t mapped;

size_t es_hmap_mapped_bytes(void) { return atomic_load(&mapped); }

static size_t big_size(size_t bytes) { return (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

static void *arr_alloc(size_t bytes, int zero) {
  if (bytes < BIG) return zero ? calloc(1, bytes) : malloc(bytes);
  void *p = mmap(NULL, big_size(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  (void)madvise(p, big_size(bytes), MADV_HUGEPAGE);
  atomic_fetch_add(&mapped, big_size(bytes));
  return p;
}

static void arr_free(void *p, size_t bytes) {
  if (!p) return;
  if (bytes < BIG) free(p);
  else {
    munmap(p, big_size(bytes));
    atomic_fetch_sub(&mapped, big_size(bytes));
  }
}

static size_t home(uint32_t h, size_t cap) { return (size_t)(((uint64_t)h * cap) >> 32); }

void es_hmap_init(es_hmap *m, es_hmap_key_fn key) {
  memset(m, 0, sizeof *m);
  m->key = key;
}

void es_hmap_destroy(es_hmap *m) {
  arr_free(m->items, m->cap * sizeof *m->items);
  arr_free(m->hashes, m->cap * sizeof *m->hashes);
  es_hmap_init(m, m->key);
}

void *es_hmap_get(const es_hmap *m, const char *key) {
  return m->count ? es_hmap_get_h(m, key, es_hmap_hash(key)) : NULL;
}

/* The slot holding key (hash h), or -1: the one probe every lookup,
 * removal and replacement uses. match NULL: key is a string, compared
 * with the items' keys (m->key); else match says which item is key's. */
static ptrdiff_t find_by(const es_hmap *m, uint32_t h, es_hmap_match_fn match, const void *key) {
  if (!m->count) return -1;
  size_t i = home(h, m->cap);
  for (;;) {
    uint32_t s = m->hashes[i];
    if (s == EMPTY) return -1;
    if (s == h && (match ? match(m->items[i], key) : strcmp(m->key(m->items[i]), key) == 0))
      return (ptrdiff_t)i;
    if (++i == m->cap) i = 0;
  }
}

static ptrdiff_t find(const es_hmap *m, const char *key, uint32_t h) {
  return find_by(m, h, NULL, key);
}

/* es_hmap_remove_item's match: the very item. */
static int same_item(const void *item, const void *key) { return item == key; }

void *es_hmap_get_h(const es_hmap *m, const char *key, uint32_t h) {
  ptrdiff_t i = find(m, key, h);
  return i < 0 ? NULL : m->items[i];
}

void *es_hmap_find(const es_hmap *m, uint32_t h, es_hmap_match_fn match, const void *key) {
  ptrdiff_t i = find_by(m, h, match, key);
  return i < 0 ? NULL : m->items[i];
}

/* Places an item known to be absent, in a table known to have room. */
static void place(void **items, uint32_t *hashes, size_t cap, uint32_t h, void *item) {
  size_t i = home(h, cap);
  while (hashes[i] > REMOVED)
    if (++i == cap) i = 0;
  hashes[i] = h;
  items[i] = item;
}

static int full(size_t used, size_t cap) { return used * 8 > cap * 7; }

/* Moves every live item into fresh arrays of cap slots (removed slots are
 * dropped). -1 when out of memory (m unchanged). */
static int rehash(es_hmap *m, size_t cap) {
  if (cap > UINT32_MAX || cap > SIZE_MAX / sizeof(void *)) return -1;
  void **items = arr_alloc(cap * sizeof *items, 0);
  uint32_t *hashes = arr_alloc(cap * sizeof *hashes, 1);
  if (!items || !hashes) {
    arr_free(items, cap * sizeof *items);
    arr_free(hashes, cap * sizeof *hashes);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->hashes[i] > REMOVED) place(items, hashes, cap, m->hashes[i], m->items[i]);
  arr_free(m->items, m->cap * sizeof *m->items);
  arr_free(m->hashes, m->cap * sizeof *m->hashes);
  m->items = items;
  m->hashes = hashes;
  m->cap = cap;
  m->removed = 0;
  return 0;
}

static int rebuild(es_hmap *m, size_t need) {
  /* Sized for the live items only (removed slots are dropped), to at most
   * 3/4 load, so a rebuild forced by removed slots keeps the capacity and
   * one forced by growth leaves room for many puts. */
  size_t cap = m->cap ? m->cap : 8;
  while ((m->count + need) * 4 > cap * 3) cap += cap / 2;
  return rehash(m, cap);
}

int es_hmap_reserve(es_hmap *m, size_t n) {
  if (m->cap && !full(m->count + m->removed + n, m->cap)) return 0;
  return rebuild(m, n);
}

int es_hmap_put(es_hmap *m, void *item) { return es_hmap_put_h(m, item, es_hmap_hash(m->key(item))); }

int es_hmap_put_h(es_hmap *m, void *item, uint32_t h) {
  if (es_hmap_reserve(m, 1) != 0) return -1;
  size_t i = home(h, m->cap);
  /* Reuse a removed slot: every later lookup still probes past it to the
   * same first empty slot. */
  while (m->hashes[i] > REMOVED)
    if (++i == m->cap) i = 0;
  if (m->hashes[i] == REMOVED) m->removed--;
  m->hashes[i] = h;
  m->items[i] = item;
  m->count++;
  return 0;
}

/* Empties slot i, returning its item (i < 0: NULL). */
static void *take(es_hmap *m, ptrdiff_t i) {
  if (i < 0) return NULL;
  void *item = m->items[i];
  m->hashes[i] = REMOVED;
  m->items[i] = NULL;
  m->count--;
  m->removed++;
  return item;
}

/* Puts item in slot i, returning the one it held (i < 0: NULL). */
static void *swap(es_hmap *m, ptrdiff_t i, void *item) {
  if (i < 0) return NULL;
  void *old = m->items[i];
  m->items[i] = item;
  return old;
}

void *es_hmap_remove(es_hmap *m, const char *key) {
  return take(m, find(m, key, es_hmap_hash(key)));
}

int es_hmap_remove_item(es_hmap *m, const void *item, uint32_t h) {
  return take(m, find_by(m, h, same_item, item)) != NULL;
}

void *es_hmap_replace(es_hmap *m, void *item) {
  const char *key = m->key(item);
  return swap(m, find(m, key, es_hmap_hash(key)), item);
}

void *es_hmap_replace_by(es_hmap *m, void *item, uint32_t h, es_hmap_match_fn match,
                         const void *key) {
  return swap(m, find_by(m, h, match, key), item);
}

int es_hmap_shrink(es_hmap *m) {
  if (m->cap <= 64 || m->count * 8 > m->cap) return 0;
  size_t cap = 8;
  while (m->count * 4 > cap * 3) cap += cap / 2;
  return rehash(m, cap);
}

void *es_hmap_next(const es_hmap *m, size_t *pos) {
  while (*pos < m->cap) {
    size_t i = (*pos)++;
    if (m->hashes[i] > REMOVED) return m->items[i];
  }
  return NULL;
}
