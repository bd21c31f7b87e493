/*
 * tree.c: the intrusive AVL tree of tree.h.
 *
 * No parent pointers (a node costs 16 bytes): insert records its path down
 * and rebalances back up it (an append, the common case, costs one
 * comparison and a walk down the right spine), remove recurses from the
 * root, iteration keeps its own ancestor stack. Balance = height(right)
 * - height(left), stored as balance + 1 in the two low bits of the left
 * pointer.
 *
 * Augmented trees (an update callback) get update(n) for every node whose
 * subtree changed, children before parents: the new leaf and its path up,
 * both or all three nodes of a rotation, the path of a removal.
 */
#include "util/tree.h"

#include <assert.h>
#include <stdalign.h>

_Static_assert(alignof(es_tree_node) >= 4, "balance bits need 4-byte aligned nodes");

#define BAL_MASK ((uintptr_t)3)

static es_tree_node *L(const es_tree_node *n) { return (es_tree_node *)(n->left_bal & ~BAL_MASK); }
static int B(const es_tree_node *n) { return (int)(n->left_bal & BAL_MASK) - 1; }
static void set_L(es_tree_node *n, es_tree_node *l) {
  n->left_bal = (uintptr_t)l | (n->left_bal & BAL_MASK);
}
static void set_B(es_tree_node *n, int b) {
  n->left_bal = (n->left_bal & ~BAL_MASK) | (uintptr_t)(b + 1);
}

void es_tree_init(es_tree *t, es_tree_cmp_fn cmp) { es_tree_init_augmented(t, cmp, NULL); }

void es_tree_init_augmented(es_tree *t, es_tree_cmp_fn cmp, es_tree_update_fn update) {
  t->root = NULL;
  t->cmp = cmp;
  t->update = update;
}

/* x is two levels taller on the left. Rotates; *same_height tells whether
 * the subtree kept the height it had before the rotation (only possible
 * after a removal, when the left child was balanced). */
static es_tree_node *fix_left_heavy(es_tree_node *x, int *same_height, es_tree_update_fn upd) {
  es_tree_node *y = L(x);
  if (B(y) <= 0) {
    set_L(x, y->right);
    y->right = x;
    if (B(y) == 0) {
      set_B(x, -1);
      set_B(y, 1);
      *same_height = 1;
    } else {
      set_B(x, 0);
      set_B(y, 0);
      *same_height = 0;
    }
    if (upd) upd(x), upd(y);
    return y;
  }
  es_tree_node *z = y->right;
  int bz = B(z);
  y->right = L(z);
  set_L(x, z->right);
  set_L(z, y);
  z->right = x;
  set_B(x, bz == -1 ? 1 : 0);
  set_B(y, bz == 1 ? -1 : 0);
  set_B(z, 0);
  *same_height = 0;
  if (upd) upd(x), upd(y), upd(z);
  return z;
}

/* Mirror of fix_left_heavy. */
static es_tree_node *fix_right_heavy(es_tree_node *x, int *same_height, es_tree_update_fn upd) {
  es_tree_node *y = x->right;
  if (B(y) >= 0) {
    x->right = L(y);
    set_L(y, x);
    if (B(y) == 0) {
      set_B(x, 1);
      set_B(y, -1);
      *same_height = 1;
    } else {
      set_B(x, 0);
      set_B(y, 0);
      *same_height = 0;
    }
    if (upd) upd(x), upd(y);
    return y;
  }
  es_tree_node *z = L(y);
  int bz = B(z);
  set_L(y, z->right);
  x->right = L(z);
  set_L(z, x);
  z->right = y;
  set_B(x, bz == 1 ? -1 : 0);
  set_B(y, bz == -1 ? 1 : 0);
  set_B(z, 0);
  *same_height = 0;
  if (upd) upd(x), upd(y), upd(z);
  return z;
}

/* Walks back up the insertion path (path[i] was left via dir[i]; the last
 * one got the new leaf) while subtrees grow, rotating at most once; an
 * augmented tree goes on while summaries change. */
static void grew_up(es_tree *t, es_tree_node **path, const unsigned char *dir, int d) {
  es_tree_update_fn upd = t->update;
  int growing = 1, same;
  while (d-- > 0) {
    es_tree_node *n = path[d];
    if (growing) {
      int b = B(n) + (dir[d] ? 1 : -1);
      if (b == 2 || b == -2) {
        es_tree_node *sub = b < 0 ? fix_left_heavy(n, &same, upd) : fix_right_heavy(n, &same, upd);
        if (d == 0) t->root = sub;
        else if (dir[d - 1]) path[d - 1]->right = sub;
        else set_L(path[d - 1], sub);
        growing = 0;
        if (!upd) return;
        continue;  /* the rotation updated the nodes it moved */
      }
      set_B(n, b);
      if (b == 0) growing = 0;
    }
    /* Above the last rotation, an unchanged summary leaves every ancestor's
     * unchanged too. */
    if ((!upd || !upd(n)) && !growing) return;
  }
}

es_tree_node *es_tree_insert(es_tree *t, es_tree_node *n) {
  es_tree_node *path[ES_TREE_MAX_HEIGHT];
  unsigned char dir[ES_TREE_MAX_HEIGHT];
  int d = 0;
  n->left_bal = 0;
  n->right = NULL;
  set_B(n, 0);
  if (t->update) t->update(n);
  if (!t->root) {
    t->root = n;
    return NULL;
  }
  /* Appending (the usual case: keys grow with time and position) needs one
   * comparison, against the maximum at the end of the right spine. */
  for (es_tree_node *x = t->root; x; x = x->right) {
    path[d] = x;
    dir[d++] = 1;
  }
  if (t->cmp(n, path[d - 1]) <= 0) {
    d = 0;
    for (es_tree_node *x = t->root; x;) {
      int c = t->cmp(n, x);
      if (c == 0) return x;
      path[d] = x;
      dir[d++] = c > 0;
      x = c > 0 ? x->right : L(x);
    }
  }
  if (dir[d - 1]) path[d - 1]->right = n;
  else set_L(path[d - 1], n);
  grew_up(t, path, dir, d);
  return NULL;
}

/* The left subtree of root got one shorter. */
static es_tree_node *left_shrunk(es_tree_node *root, int *shrunk, es_tree_update_fn upd) {
  int same;
  switch (B(root)) {
    case -1: set_B(root, 0); return root;             /* shrunk stays 1 */
    case 0: set_B(root, 1); *shrunk = 0; return root;
    default: root = fix_right_heavy(root, &same, upd); *shrunk = !same; return root;
  }
}

static es_tree_node *right_shrunk(es_tree_node *root, int *shrunk, es_tree_update_fn upd) {
  int same;
  switch (B(root)) {
    case 1: set_B(root, 0); return root;
    case 0: set_B(root, -1); *shrunk = 0; return root;
    default: root = fix_left_heavy(root, &same, upd); *shrunk = !same; return root;
  }
}

/* Detaches the smallest node of root's subtree into *min. */
static es_tree_node *del_min(es_tree_node *root, es_tree_node **min, int *shrunk,
                             es_tree_update_fn upd) {
  if (!L(root)) {
    *min = root;
    *shrunk = 1;
    return root->right;
  }
  set_L(root, del_min(L(root), min, shrunk, upd));
  if (*shrunk) root = left_shrunk(root, shrunk, upd);
  if (upd) upd(root);
  return root;
}

static es_tree_node *del(es_tree *t, es_tree_node *root, es_tree_node *n, int *shrunk) {
  es_tree_update_fn upd = t->update;
  assert(root != NULL);  /* n is linked: the search cannot fall off the tree */
  if (root == n) {
    es_tree_node *l = L(n), *r = n->right, *m;
    if (!l || !r) {
      *shrunk = 1;
      return l ? l : r;
    }
    /* The successor takes n's place: nodes are the caller's objects, so
     * they are relinked, never copied. */
    r = del_min(r, &m, shrunk, upd);
    m->left_bal = n->left_bal;  /* n's left child and balance */
    m->right = r;
    if (*shrunk) m = right_shrunk(m, shrunk, upd);
    if (upd) upd(m);
    return m;
  }
  int c = t->cmp(n, root);
  assert(c != 0);  /* two linked nodes with one key: the caller broke uniqueness */
  if (c < 0) {
    set_L(root, del(t, L(root), n, shrunk));
    if (*shrunk) root = left_shrunk(root, shrunk, upd);
  } else {
    root->right = del(t, root->right, n, shrunk);
    if (*shrunk) root = right_shrunk(root, shrunk, upd);
  }
  if (upd) upd(root);
  return root;
}

void es_tree_remove(es_tree *t, es_tree_node *n) {
  int shrunk = 0;
  t->root = del(t, t->root, n, &shrunk);
}

static void clear(es_tree_node *n, void (*fn)(es_tree_node *n)) {
  if (!n) return;
  clear(L(n), fn);
  clear(n->right, fn);
  if (fn) fn(n);
}

void es_tree_clear(es_tree *t, void (*fn)(es_tree_node *n)) {
  es_tree_node *root = t->root;
  t->root = NULL;
  clear(root, fn);
}

es_tree_node *es_tree_left(const es_tree_node *n) { return L(n); }

es_tree_node *es_tree_first(const es_tree *t) {
  es_tree_node *n = t->root;
  if (!n) return NULL;
  while (L(n)) n = L(n);
  return n;
}

es_tree_node *es_tree_seek(const es_tree *t, es_tree_probe_fn probe, const void *key, int strict) {
  es_tree_node *n = t->root, *best = NULL;
  while (n) {
    int c = probe(key, n);
    if (c < 0 || (c == 0 && !strict)) {
      best = n;
      n = L(n);
    } else {
      n = n->right;
    }
  }
  return best;
}

/* The stack holds the nodes whose left subtree the walk entered: exactly the
 * ancestors still to be visited, nearest on top. */
es_tree_node *es_tree_iter_seek(es_tree_iter *it, const es_tree *t, es_tree_probe_fn probe,
                                const void *key, int strict) {
  es_tree_node *n = t->root;
  it->depth = 0;
  while (n) {
    int c = probe ? probe(key, n) : -1;
    if (c < 0 || (c == 0 && !strict)) {
      it->stack[it->depth++] = n;
      n = L(n);
    } else {
      n = n->right;
    }
  }
  return it->depth ? it->stack[it->depth - 1] : NULL;
}

es_tree_node *es_tree_iter_next(es_tree_iter *it) {
  if (!it->depth) return NULL;
  es_tree_node *n = it->stack[--it->depth]->right;
  while (n) {
    it->stack[it->depth++] = n;
    n = L(n);
  }
  return it->depth ? it->stack[it->depth - 1] : NULL;
}

/* Height of the subtree, -1 when malformed; *count accumulates nodes and
 * *prev walks in order to check the ordering. */
static int check(es_tree_cmp_fn cmp, const es_tree_node *n, long *count, const es_tree_node **prev) {
  if (!n) return 0;
  if ((n->left_bal & BAL_MASK) == BAL_MASK) return -1;
  int hl = check(cmp, L(n), count, prev);
  if (hl < 0) return -1;
  if (*prev && cmp(*prev, n) >= 0) return -1;
  *prev = n;
  (*count)++;
  int hr = check(cmp, n->right, count, prev);
  if (hr < 0 || hr - hl != B(n)) return -1;
  return 1 + (hl > hr ? hl : hr);
}

long es_tree_check(const es_tree *t) {
  long count = 0;
  const es_tree_node *prev = NULL;
  return check(t->cmp, t->root, &count, &prev) < 0 ? -1 : count;
}
