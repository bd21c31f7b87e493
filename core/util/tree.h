/*
 * tree.h: an intrusive AVL tree, the ordered set of the in-memory backend.
 *
 * Intrusive: the caller embeds an es_tree_node in its own object and the tree
 * only links nodes, so inserting and removing never allocate and never fail.
 * That is what lets a backend undo a transaction (re-link what it unlinked)
 * even when memory has run out.
 *
 * Keys live in the caller's objects; the tree orders nodes with a compare
 * callback and requires keys to be unique (break ties with a sequence number
 * or a position). A node's key must not change while it is linked: unlink,
 * change, re-link.
 *
 * Augmented trees keep a per-subtree summary (a minimum, a count) in the
 * caller's objects: the tree calls an update callback on every node whose
 * subtree changed, children first (an insert stops going up once a summary
 * comes out unchanged), so the caller can prune searches with es_tree_left
 * and node->right from t->root.
 *
 * Costs: insert, remove, first, seek O(log n) (an insert that appends after
 * the maximum makes one comparison); iteration O(1) amortised per step. Not
 * thread-safe: the owner serialises access.
 */
#ifndef ES_TREE_H
#define ES_TREE_H

#include <stddef.h>
#include <stdint.h>

/* An AVL tree of n nodes is at most 1.44 * log2(n + 2) high; 96 covers every
 * n that fits in an address space. */
#define ES_TREE_MAX_HEIGHT 96

/* Embedded in the caller's object. 16 bytes: the balance factor hides in
 * the low bits of the left pointer (nodes are at least 4-byte aligned), so
 * read the left child with es_tree_left; right may be read directly. The
 * caller never writes either. */
typedef struct es_tree_node {
  uintptr_t left_bal;          /* left child | (balance + 1) */
  struct es_tree_node *right;  /* right child */
} es_tree_node;

/* Orders two linked-or-linking nodes: <0, 0 (same key), >0. */
typedef int (*es_tree_cmp_fn)(const es_tree_node *a, const es_tree_node *b);
/* Orders a search key (the caller's own type) against a node: <0 when key
 * sorts before n, 0 when equal, >0 after. */
typedef int (*es_tree_probe_fn)(const void *key, const es_tree_node *n);

/* Recomputes n's summary from n and its children (whose summaries are up
 * to date); returns nonzero when the summary changed. */
typedef int (*es_tree_update_fn)(es_tree_node *n);

typedef struct es_tree {
  es_tree_node *root;  /* NULL: empty; readable for custom descents */
  es_tree_cmp_fn cmp;
  es_tree_update_fn update;  /* NULL: not augmented */
} es_tree;

/* Starts an empty tree ordered by cmp. No allocation; nothing to destroy
 * (the nodes belong to the caller). */
void es_tree_init(es_tree *t, es_tree_cmp_fn cmp);
/* The same, with a summary kept up to date by update. */
void es_tree_init_augmented(es_tree *t, es_tree_cmp_fn cmp, es_tree_update_fn update);

/* n's left child (NULL when none); the right child is n->right. */
es_tree_node *es_tree_left(const es_tree_node *n);

/* Links n (borrowed: it must stay valid and unchanged in key while linked).
 * Returns NULL when linked, or the already linked node with an equal key
 * (then n is not linked). Never allocates. */
es_tree_node *es_tree_insert(es_tree *t, es_tree_node *n);

/* Unlinks n, which must be linked in t with its key unchanged. */
void es_tree_remove(es_tree *t, es_tree_node *n);

/* Empties the tree, calling fn (if not NULL) on every node after its
 * children, so fn may free the node. O(n). */
void es_tree_clear(es_tree *t, void (*fn)(es_tree_node *n));

/* The smallest node, NULL when empty. */
es_tree_node *es_tree_first(const es_tree *t);

/* The first node not before key (strict = 0) or after key (strict = 1);
 * NULL when none. */
es_tree_node *es_tree_seek(const es_tree *t, es_tree_probe_fn probe, const void *key, int strict);

/* In-order iteration. The iterator is invalidated by any insert or remove on
 * its tree; re-seek after modifying. Lives on the caller's stack. */
typedef struct es_tree_iter {
  es_tree_node *stack[ES_TREE_MAX_HEIGHT];  /* ancestors still to visit */
  int depth;
} es_tree_iter;

/* Positions it on the first node (probe NULL) or as es_tree_seek would, and
 * returns that node (NULL when none). */
es_tree_node *es_tree_iter_seek(es_tree_iter *it, const es_tree *t, es_tree_probe_fn probe,
                                const void *key, int strict);
/* Advances; returns the next node or NULL at the end. */
es_tree_node *es_tree_iter_next(es_tree_iter *it);

/* Checks the AVL invariants and order (for tests); returns the number of
 * nodes, or -1 when the tree is malformed. O(n). */
long es_tree_check(const es_tree *t);

#endif
