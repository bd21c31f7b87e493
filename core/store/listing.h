/*
 * listing.h: the one listing helper of the tenant view (tenant.c) and the
 * shard router (shards.c): merging listings by name and paging a listing
 * through a filter. Works on any of store.h's lists (es_sessions,
 * es_lineages, es_refs, ...), which all begin with {v, n, cap}. Not a
 * public header.
 */
#ifndef ES_STORE_LISTING_H
#define ES_STORE_LISTING_H

#include "store/store.h"

/* A list of store.h seen generically: its first three members. */
typedef struct es_list {
  void *v;
  size_t n, cap;
} es_list;

/* What the helper needs to know of a list's elements. */
typedef struct es_list_kind {
  size_t elem;                  /* bytes of one element */
  size_t name_off;              /* offset of its name (a char *): the listing's order */
  void (*destroy)(void *e);     /* frees what one element owns */
} es_list_kind;

/* Frees every element of l and its array; l becomes empty. */
void es_list_clear(const es_list_kind *k, es_list *l);
/* Moves every element of part to the end of out and frees part's array
 * (part becomes empty). ES_STORAGE when out cannot grow: then part's
 * elements are freed and out is unchanged. */
int es_list_take(const es_list_kind *k, es_list *out, es_list *part, es_err *err);
/* Sorts l by name (byte order), keeps the first of equal names (a session
 * two shards list in the middle of a move), then at most limit of them
 * (ES_NONE: all). Returns 1 when the limit dropped some, else 0. */
int es_list_sort_unique(const es_list_kind *k, es_list *l, int64_t limit);

/* One page of a listing by name: at most limit elements with names after
 * `after`, in name order, into *page (empty on entry). */
typedef int (*es_list_page_fn)(void *ctx, const char *after, int64_t limit, es_list *page,
                               es_err *err);
/* Whether a name read belongs to the listing: 1 keep it, 0 skip it, -1
 * stop (every later name is past it too). */
typedef int (*es_list_keep_fn)(void *ctx, const char *name);
/* Reads the listing page by page after `from` and appends to out the
 * names keep keeps, until limit (>= 1) are kept, keep says stop, or the
 * listing ends. On an error out is cleared. */
int es_list_page_through(const es_list_kind *k, es_list_page_fn fetch, es_list_keep_fn keep,
                         void *ctx, const char *from, int64_t limit, es_list *out, es_err *err);

#endif
