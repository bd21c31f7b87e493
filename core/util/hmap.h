/*
 * hmap.h: a hash set of items that carry their own NUL-terminated string key
 * (an event row and its id, a session and its name), looked up by key.
 *
 * Open addressing with linear probing over two parallel arrays: the items and
 * a 32-bit hash per slot. The stored hashes make probing compare integers,
 * not strings, and let the table grow without touching the items (a cache
 * miss each). Capacity grows by 1.5x at 7/8 load, so a slot costs 12 bytes
 * and an item 14 to 24 bytes.
 *
 * The map never owns the items. Not thread-safe: the owner serialises access.
 * The hash is not keyed: adversarial keys can make probes long.
 */
#ifndef ES_HMAP_H
#define ES_HMAP_H

#include <stddef.h>
#include <stdint.h>

/* Returns the item's key (borrowed from the item; must not change while the
 * item is in a map). */
typedef const char *(*es_hmap_key_fn)(const void *item);

typedef struct es_hmap {
  void **items;      /* owned array of cap borrowed item pointers */
  uint32_t *hashes;  /* owned; 0 empty, 1 removed, else the key's hash */
  size_t cap;
  size_t count;      /* items present */
  size_t removed;    /* slots marked removed, reclaimed when the table is rebuilt */
  es_hmap_key_fn key;
} es_hmap;

/* Starts an empty map (no allocation). */
void es_hmap_init(es_hmap *m, es_hmap_key_fn key);
/* Frees the table, not the items. */
void es_hmap_destroy(es_hmap *m);

/* The item whose key equals key, or NULL. */
void *es_hmap_get(const es_hmap *m, const char *key);
/* The hash es_hmap_* computes for key: a caller that looks a key up and then
 * puts it hashes once with es_hmap_hash and passes it to the _h variants. */
uint32_t es_hmap_hash(const char *key);
void *es_hmap_get_h(const es_hmap *m, const char *key, uint32_t hash);
/* Makes room so that the next n es_hmap_put calls cannot fail. Returns 0, or
 * -1 when out of memory (the map is unchanged). */
int es_hmap_reserve(es_hmap *m, size_t n);
/* Adds item (borrowed), whose key must not be present. Grows when needed:
 * returns 0, or -1 when out of memory (the map is unchanged). */
int es_hmap_put(es_hmap *m, void *item);
/* es_hmap_put with the item key's es_hmap_hash. */
int es_hmap_put_h(es_hmap *m, void *item, uint32_t hash);
/* Removes and returns the item with that key (NULL when absent). Never
 * allocates. */
void *es_hmap_remove(es_hmap *m, const char *key);

/* Puts item in the slot of the item with the same key and returns that one
 * (NULL when there is none: then nothing changes). Never allocates: a
 * backend gives a key to a new item while the old one waits for commit, and
 * its undo swaps the old one back the same way. */
void *es_hmap_replace(es_hmap *m, void *item);
/* Rebuilds the table smaller when at most 1/8 of it holds items (after many
 * removals), to at most 3/4 load: 0 (also when there was nothing to do), or
 * -1 when out of memory (the map is unchanged and still correct). */
int es_hmap_shrink(es_hmap *m);

/* Items whose key is not a string (memory.c's event ids, a UUID kept as
 * its 16 bytes): the caller hashes the key (es_hmap_hash_bytes) and says
 * which item matches it; the map is then used only through the calls
 * below, es_hmap_reserve, es_hmap_put_h, es_hmap_shrink and es_hmap_next
 * (es_hmap_init with key NULL). One table, one probing and growth policy
 * for both kinds. */
typedef int (*es_hmap_match_fn)(const void *item, const void *key);
/* es_hmap_hash of len bytes (es_hmap_hash(s) is that of strlen(s) bytes). */
uint32_t es_hmap_hash_bytes(const void *p, size_t len);
/* The item with hash h that match says is key's, or NULL. */
void *es_hmap_find(const es_hmap *m, uint32_t h, es_hmap_match_fn match, const void *key);
/* es_hmap_replace by a caller's key: item takes the slot of the item that
 * matches key (hash h), which is returned (NULL: none, nothing changes). */
void *es_hmap_replace_by(es_hmap *m, void *item, uint32_t h, es_hmap_match_fn match,
                         const void *key);
/* Removes this very item (put with hash h); 0 when it is not in the map
 * (another item may hold its key). Never allocates. */
int es_hmap_remove_item(es_hmap *m, const void *item, uint32_t h);

/* Walks the items: start with *pos = 0; returns NULL at the end. Any put or
 * remove invalidates the walk. */
void *es_hmap_next(const es_hmap *m, size_t *pos);

/* Bytes the process's tables hold in their own mappings (arrays of 4 MiB
 * or more, on huge pages: hmap.c), which malloc's statistics (mallinfo2)
 * do not see: memory measurements add it. */
size_t es_hmap_mapped_bytes(void);

#endif
