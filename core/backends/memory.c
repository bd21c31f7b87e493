/*
 * backends/memory.c: the "memory:" backend (backend.h), everything in RAM.
 * One file, though long: every op writes through the one undo log and the
 * intrusive indexes below, all static; its sections follow backend.h.
 *
 * Layout (docs/memory-backend.md has the picture and the cost of each op):
 *   - a row is one allocation: a 64-byte header, the optional immutable
 *     values (cause, not_before, the lane, a fork copy's origin) only when
 *     present, then the id (16 bytes when it is a canonical UUID, else
 *     text) and payload bytes; a queued row's due_at is in its links
 *     block; the session, type, lane and origin session names are shared,
 *     the dispatch record (attempts, claim, errors, ...) is a separate
 *     block that exists only once it differs from "never touched" and
 *     holds only the fields that differ, but for the commonest processed
 *     record (claimed once, completed by that attempt), which a word in
 *     the header holds (RF_COMPACT);
 *   - rows are found by position (a dense array: position p at p - 1 -
 *     pbase), by (session, index) (a dense array per session: index i at
 *     i - 1 - base) and by id (an open-addressing index of its own);
 *   - sessions are found by name (hmap.h, and a tree for listing) and by
 *     (parent, name) (a tree of the forked ones); refs by name and by
 *     (session, name) (two trees);
 *   - the dispatch indexes are intrusive AVL trees (tree.h): queued rows by
 *     (due_at, position) store-wide and per type, and by index per session
 *     (each subtree knowing its least due_at), dead rows by position
 *     store-wide and per session, unprocessed laned rows by index per
 *     (session, lane). Their
 *     nodes sit in a block hung off the row, sized for the sets it is in and
 *     freed at commit once it is in none, so history rows do not pay for
 *     them.
 *
 * Transactions: one writer at a time (a rwlock, writer-preferring) and an
 * undo log. Every write op first makes every allocation it needs, then
 * changes the structures (which cannot fail), then logs how to undo. Undo
 * never allocates: the trees are intrusive and a replaced block (dispatch
 * record, session row, snapshot, presence row, ref) is kept until commit, so
 * savepoint_rollback and write_rollback always restore the exact previous
 * state, even out of memory.
 *
 * Removal (retention, backend.h §3.9): a session's rows are removed from
 * the front (index <= through). They leave every set at once, their slot in
 * the position array becomes a hole (a bit in a summary tree, so walks skip
 * a gap of any length in O(log64 n)), and the session's `gone` says which
 * indexes are no longer there; the rows themselves, their ids in the id map
 * and the slots stay until commit, so undo puts them back without
 * allocating. Commit frees them, and gives back the front of the two arrays
 * once it is mostly holes. Positions are never handed out twice: npos only
 * grows (but by the undo of an insert). A session with no row, no event and
 * no snapshot left is detached (found by no lookup, its name free for a new
 * one) and freed at commit, unless rows of other sessions still name it as
 * their fork origin.
 */
#include <assert.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "store/backend.h"
#include "store/counts.h"
#include "util/hmap.h"
#include "util/tree.h"

typedef struct mrow mrow;
typedef struct msess msess;
typedef struct mtype mtype;

/* The ordered sets a row can be in; bit i of a set mask is slot i. A links
 * block holds the nodes of slots 0 .. n-1 only, so the order puts the sets
 * of a pending row first: a queued row needs 3 nodes, a laned one 4.
 *   QG   queued rows of the store by (due_at, position): claim_next
 *   QS   queued rows of a session by index, each subtree knowing its least
 *        due_at (mlinks.qmin): claim takes the first due rows in index
 *        order without walking the ones not due yet
 *   QT   queued rows of one type by (due_at, position): claim_next limited
 *        to some types never walks the rows of the others
 *   LANE unprocessed rows of a (session, lane) by index: lane_next
 *   DG, DS  dead rows of the store, of a session, by position */
enum { SLOT_QG, SLOT_QS, SLOT_QT, SLOT_LANE, SLOT_DG, SLOT_DS, NSLOTS };
#define SETS_QUEUED ((1u << SLOT_QG) | (1u << SLOT_QS) | (1u << SLOT_QT))
#define SETS_DEAD ((1u << SLOT_DG) | (1u << SLOT_DS))
#define SETS_LANE (1u << SLOT_LANE)

typedef struct mlinks {
  mrow *row;             /* back pointer: a node leads to its row */
  int64_t qmin;          /* least due_at in this row's QS subtree */
  /* The row's due_at while it is queued (it is in QG, QS and QT then, so it
   * has this block): the key of those sets lives beside their nodes, and a
   * row that is not queued pays nothing for it (row_due). */
  int64_t due;
  es_tree_node node[];   /* indexed by SLOT_*, as many as mrow.nslots */
} mlinks;

/* The integers of the dispatch record beyond status/queued/due_at, in the
 * order of an mdisp's mask bits, and their values in a fresh event. */
enum {
  DF_ATTEMPTS, DF_FAILURES, DF_RETURNED, DF_PROCESSED_AT, DF_CLAIM_EXPIRES_AT, DF_RETRY_AT,
  DF_LAST_FAILED_ATTEMPT, DF_FIRST_CLAIMED_AT, DF_LAST_CLAIMED_AT, DF_FAILED_AT,
  DF_PROCESSED_BY_ATTEMPT,
  /* due_at of a row that is not queued (a queued row's is in its links
   * block): the core sets it to ES_NONE when it unqueues a row, so this is
   * almost never stored, but whatever it writes reads back. */
  DF_DUE_AT, NDF
};
static const int64_t DF_DEFAULT[NDF] = {0, 0, 0, ES_NONE, ES_NONE, ES_NONE,
                                        ES_NONE, ES_NONE, ES_NONE, ES_NONE, ES_NONE, ES_NONE};

/* The dispatch record beyond status/queued/due_at. Sparse: each state an
 * event goes through (claimed, failed, completed) sets a few of the eleven
 * integers and history keeps its block forever, so a block stores only the
 * integers that differ from a fresh event's. Copy-on-write: an update
 * installs a new block and the undo log keeps the old one until commit. */
typedef struct mdisp {
  uint16_t mask;                   /* bit i: DF_ field i is stored in v */
  unsigned char has_error, has_holder;
  int64_t v[];  /* the fields of mask in DF_ order, then last_error NUL, claim_holder NUL
                   (each only when present) */
} mdisp;

enum {
  RF_LANE = 1,            /* tail holds the mlane pointer */
  RF_CAUSE = 2,           /* tail holds cause_index, cause_attempt */
  RF_NOT_BEFORE = 4,      /* tail holds not_before */
  RF_NO_PAYLOAD = 8,      /* payload was NULL */
  /* Without a disp block, a settled event (processed at creation, never
   * completed) still reads back exactly: */
  RF_PROC_AT_CREATED = 16, /* processed_at == created_at */
  RF_RETURNED_NONE = 32,   /* returned == -1 */
  /* A fork's copy: tail holds the origin's msess pointer (NULL for a row
   * given an origin_index without origin_session) and origin_index. The
   * session is shared like the row's own, so a fork of k rows pays 16
   * bytes a row, not k copies of the name. */
  RF_ORIGIN = 64,
  /* §3.10: the payload is sealed under a data key whose name follows the
   * payload's NUL (names are short and rare enough not to be shared). */
  RF_KEY = 128,
  /* The id is a UUID in its canonical text form (36 characters, lowercase
   * hex): stored as its 16 bytes, written back as text by row_view. Other
   * ids are stored as text, NUL-terminated. A canonical UUID text is always
   * stored binary, so each id has one representation (the id index relies
   * on it). */
  RF_BINID = 256,
  /* §3.1: a revision other than 1 (the default, which costs nothing):
   * the last tail word holds it. */
  RF_REVISION = 512,
  /* §3.1: meta's canonical text and its NUL end the row (after the key) */
  RF_META = 1024,
  /* The dispatch record is the common processed one (cdisp_fit): claimed
   * once and completed by that attempt, nothing else set. Most of history
   * is such events, and a block for them costs 64 bytes with malloc's
   * overhead; so the few integers that vary live in the row's disp slot as
   * a word (mrow.cdisp) and the rest is implied. */
  RF_COMPACT = 2048
};
/* The flags an update recomputes: those of the dispatch record. */
#define RF_DISP ((unsigned)(RF_PROC_AT_CREATED | RF_RETURNED_NONE | RF_COMPACT))

/* A row: a 64-byte header, then only what the event has. Its due_at is
 * not here (row_due): a queued row keeps it in its links block, any other
 * row has ES_NONE unless its dispatch block says otherwise. */
struct mrow {
  msess *sess;     /* shared: the session name lives there */
  mtype *type;     /* shared: the type name lives there */
  union {
    mdisp *disp;     /* without RF_COMPACT; NULL: the untouched dispatch record */
    uint64_t cdisp;  /* with RF_COMPACT: the packed word of cdisp_fit */
  };
  mlinks *links;   /* NULL: in no ordered set; never NULL while queued */
  int64_t index, position, created_at;
  uint32_t payload_len;
  unsigned status : 2, queued : 1;
  unsigned nslots : 3;   /* nodes in the links block */
  unsigned flags : 12;   /* RF_* */
  uint64_t tail[]; /* [lane ptr][cause_index cause_attempt][not_before][origin ptr origin_index]
                      [revision] id (16 bytes, or text NUL) payload NUL [key NUL] [meta NUL] */
};

/* An event type: shared by its rows, with its own ready queue and the count
 * of its pending rows (pending_types), both kept by row_set_state. */
struct mtype {
  es_tree queued;       /* SLOT_QT nodes by (due_at, position) */
  int64_t pending;      /* rows with status PENDING */
  size_t rows;          /* rows pointing here; the type is freed at 0 (by undo) */
  char name[];
};

typedef struct mlane {
  es_tree unprocessed;  /* SLOT_LANE nodes by index */
  size_t rows;          /* rows pointing here; the lane is freed at 0 */
  char name[];
} mlane;

typedef struct msnap {
  int64_t index, updated_at;
  size_t state_len;
  unsigned char has_state, has_version;
  char data[];  /* reducer NUL [version NUL] [state bytes NUL] */
} msnap;

struct msess {
  es_tree_node by_name;   /* in es_backend.names while info != NULL */
  es_tree_node by_parent; /* in es_backend.children while info && info->parent */
  /* Owned, one block: its strings point into the block itself and session
   * is NULL (the name is ours). NULL: never put (or deleted). */
  es_session_info *info;
  mrow **rows;            /* owned array; index i at rows[i - 1 - base] */
  size_t n, cap;          /* n: the highest index stored, removed ones included */
  size_t gone;            /* indexes 1..gone were removed (event_delete_range) */
  size_t base;            /* indexes 1..base are out of rows[] (<= gone; moved at commit) */
  es_tree queued;         /* SLOT_QS, augmented with mlinks.qmin */
  es_tree dead;           /* SLOT_DS */
  es_hmap *lanes;         /* owned, of owned mlane; NULL until the first laned row */
  msnap **snaps;          /* owned, sorted by reducer */
  size_t nsnaps, capsnaps;
  size_t origin_refs;     /* rows that name this session as their fork origin */
  /* A session made while a detached one of the same name waits for commit
   * takes its slot in es_backend.sessions; undo swaps it back. */
  struct msess *prev;
  /* 1: removed (no row, no event, no snapshot left): found by no lookup,
   * kept in es_backend.sessions for undo until commit frees it. */
  unsigned char detached;
  /* 1: detached and committed, kept (as its name only) because rows still
   * name it as their origin; freed with the last of them. */
  unsigned char zombie;
  char name[];
};

typedef struct prow {
  es_tree_node ord;  /* in mns.rows by (participant, field) */
  es_tree_node exp;  /* in mns.expiry by (expires_at, address) */
  int64_t seen, at, expires_at;
  size_t value_len;
  unsigned char has_value;
  char data[];       /* participant NUL field NUL [value NUL] */
} prow;

typedef struct mns {
  es_tree rows, expiry;
  size_t count;
  char name[];
} mns;

/* A ref: one block, replaced (not changed) by a put. */
typedef struct mref {
  es_tree_node node;  /* first: in es_backend.refs by name while current */
  es_tree_node by_sess; /* in es_backend.refs_by_sess by (session, name) while current */
  int64_t created_at, updated_at;
  unsigned char linked;  /* 0: replaced or deleted (kept for undo until commit) */
  char data[];           /* name NUL session NUL */
} mref;

/* One undo step. */
enum { U_EV_INSERT, U_EV_UPDATE, U_SESS_PUT, U_SNAP_PUT, U_PRES_PUT, U_PRES_DEL, U_REF_PUT,
       U_REF_DEL, U_EV_DELETE, U_SNAP_DEL, U_SESS_DETACH, U_SEG /* §3.9 */,
       U_KEY_PUT, U_USE_PUT, U_USE_DEL, U_SNAP_DEL_FROM /* §3.10 */,
       U_PROJ_PUT, U_PROJ_DEL /* §8 */ };
typedef struct urec {
  /* Bit fields, so that a step stays 48 bytes (a big transaction's log). */
  unsigned kind : 5;
  unsigned created : 1;     /* this op created the session (or namespace): undo frees it */
  unsigned new_links : 1;   /* U_EV_UPDATE: the op installed a bigger links block */
  unsigned disp_kept : 1;   /* U_EV_UPDATE: the dispatch block did not change */
  unsigned old_nslots : 3;
  unsigned old_status : 2, old_queued : 1;
  unsigned old_flags : 12;  /* every RF_ bit: undo puts them all back */
  void *obj;                /* the row, session or namespace */
  void *old;                /* the replaced block (owned by the log until commit), or NULL;
                               U_EV_INSERT: the removed row whose id the new row took;
                               U_SNAP_DEL: the session's snapshot array */
  void *neu;                /* U_SNAP_PUT, U_PRES_PUT, U_REF_PUT: the block put;
                               U_EV_UPDATE: the old links; U_EV_INSERT: the origin session
                               the op created (undo frees it), or NULL */
  int64_t old_due;          /* U_EV_DELETE: the session's gone before; U_SNAP_DEL: its
                               snapshot count */
  int64_t aux;              /* U_EV_DELETE: its gone after; U_SNAP_DEL_FROM: the index from
                               which snapshots were removed; U_EV_UPDATE: the old cdisp
                               (old_flags has RF_COMPACT) */
} urec;
_Static_assert(sizeof(urec) <= 48, "an undo step fits in 48 bytes");

struct es_txn {
  es_backend *b;
  int write;
};


/* The removed slots of the position array: bit j of level 0 is slot j (1:
 * its row was removed), and bit w of level k + 1 says that word w of level
 * k is all ones, so the next or previous slot that still holds a row is
 * found in O(log64 n) however long the gap. Sized with the array, so that
 * removing and undoing never allocate; a store that never removes pays a
 * bit per slot of the array (1/64 of the array) and a compare per insert. */
#define HMAXLEV 11  /* 64^11 > 2^64 slots */
typedef struct mholes {
  uint64_t *w;                       /* owned: the levels one after the other */
  size_t at[HMAXLEV], nw[HMAXLEV];   /* where each level starts in w, its words */
  int nlev;
  size_t cap;                        /* slots covered */
  size_t count;                      /* bits set at level 0 */
} mholes;

struct es_backend {
  pthread_rwlock_t lock;
  es_txn wtxn, rtxn;
  /* Owned array; position p at pos[p - 1 - pbase], NULL once removed.
   * npos: the highest position handed out, which only an undone insert
   * takes back; pbase: positions 1..pbase are all removed and out of the
   * array (a multiple of 64, so that holes moves by whole words). */
  mrow **pos;
  size_t npos, cappos, pbase;
  mholes holes;
  es_hmap ids;       /* rows by id: an idkey's hash, matched by id_match (below) */
  es_hmap sessions;  /* owned msess by name */
  msess *last;       /* the session found last: batches stay in one */
  msess *last_origin; /* the origin session found last: a fork copies from one */
  es_tree names;     /* sessions with a session row, by name */
  es_tree children;  /* sessions whose row has a parent, by (parent, name) */
  es_tree refs;      /* mref by name */
  es_tree refs_by_sess; /* mref by (session, name): ref_delete_session */
  es_tree queued;    /* SLOT_QG */
  es_tree dead;      /* SLOT_DG */
  es_hmap types;     /* owned mtype by name */
  es_hmap spaces;    /* owned mns by name */
  es_hmap segs;      /* §3.9 archive: owned mseglist by session name */
  es_tree keys;      /* §3.10: mkey by name */
  es_tree uses;      /* §3.10: muse by (key, session) */
  es_tree uses_by_sess; /* §3.10: muse by (session, key): key_use_delete_session */
  es_tree projs;     /* §8: mproj by (ns, key) */
  urec *undo;        /* owned log of the open write transaction */
  size_t nundo, capundo;
  size_t *marks;     /* savepoint stack: undo log lengths */
  size_t nmarks, capmarks;
  /* §3.12 counts ("counts" below): the sums over the counted session rows,
   * of the store and per tenant scope */
  es_counts counts;
  es_hmap scopes;    /* owned mscope by scope */
  es_hmap floors;    /* §3.8: owned mfloor by the name of a deleted session */
};

/* §3.9 archive: a session's segment rows, ascending `from`. Immutable:
 * a put or delete installs a new list in the map and the undo log keeps
 * the old one until commit (U_SEG), so undo never allocates. A list left
 * empty by a commit leaves the map. */
typedef struct mseglist {
  size_t n;
  es_segment *v;   /* owned rows (and their file strings) */
  char name[];     /* the session */
} mseglist;

/* ---- small helpers ------------------------------------------------------ */

static int oom(es_err *err) { return es_fail(err, ES_STORAGE, "memory backend: out of memory"); }

/* The array arr (*cap elements of size sz) with room for n: arr itself, or
 * a reallocation (*cap updated), or NULL when out of memory (arr intact). */
static void *grow(void *arr, size_t *cap, size_t n, size_t sz) {
  if (n <= *cap) return arr;
  size_t c = *cap ? *cap : 8;
  while (c < n) c += c;  /* doubling: a big array grows by mremap, not copying */
  if (c > SIZE_MAX / sz) return NULL;
  void *p = realloc(arr, c * sz);
  if (p) *cap = c;
  return p;
}

static int undo_reserve(es_backend *b, size_t n) {
  urec *p = grow(b->undo, &b->capundo, b->nundo + n, sizeof *p);
  if (!p) return -1;
  b->undo = p;
  return 0;
}

/* ---- removed positions (mholes) ----------------------------------------- */

/* The levels for cap slots: words per level and offsets; the total. */
static size_t holes_layout(size_t cap, size_t at[HMAXLEV], size_t nw[HMAXLEV], int *nlev) {
  size_t total = 0, words = (cap + 63) / 64;
  int k = 0;
  while (words) {
    at[k] = total;
    nw[k] = words;
    total += words;
    k++;
    words = words > 1 ? (words + 63) / 64 : 0;
  }
  *nlev = k;
  return total;
}

/* Remakes h for cap slots, level 0 starting at its word `shift` (the slots
 * before it dropped), the levels above recomputed: O(cap / 64). -1 when out
 * of memory (h unchanged). The caller keeps count right. */
static int holes_rebuild(mholes *h, size_t cap, size_t shift) {
  size_t at[HMAXLEV] = {0}, nw[HMAXLEV] = {0};
  int nlev;
  size_t total = holes_layout(cap, at, nw, &nlev);
  uint64_t *w = NULL;
  if (total && !(w = calloc(total, sizeof *w))) return -1;
  size_t keep = h->nlev && h->nw[0] > shift ? h->nw[0] - shift : 0;
  if (keep > nw[0]) keep = nw[0];  /* nw[0] is 0 without levels */
  if (keep) memcpy(w, h->w + shift, keep * sizeof *w);
  for (int k = 0; k + 1 < nlev; k++)
    for (size_t i = 0; i < nw[k]; i++)
      if (w[at[k] + i] == ~0ull) w[at[k + 1] + (i >> 6)] |= 1ull << (i & 63);
  free(h->w);
  h->w = w;
  memcpy(h->at, at, sizeof at);
  memcpy(h->nw, nw, sizeof nw);
  h->nlev = nlev;
  h->cap = nlev ? nw[0] * 64 : 0;
  return 0;
}

static void holes_set(mholes *h, size_t j) {
  h->count++;
  for (int k = 0; k < h->nlev; k++, j >>= 6) {
    uint64_t *x = &h->w[h->at[k] + (j >> 6)];
    *x |= 1ull << (j & 63);
    if (*x != ~0ull) return;  /* the word is not full: the levels above stay */
  }
}

static void holes_clear(mholes *h, size_t j) {
  h->count--;
  for (int k = 0; k < h->nlev; k++, j >>= 6) {
    uint64_t *x = &h->w[h->at[k] + (j >> 6)];
    int was_full = *x == ~0ull;
    *x &= ~(1ull << (j & 63));
    if (!was_full) return;
  }
}

/* The first slot >= j that was not removed (slots past the array's end
 * count as not removed; SIZE_MAX past what h covers). */
static size_t holes_next(const mholes *h, size_t j) {
  if (!h->count) return j;
  size_t i = j;
  int k = 0;
  for (;; k++) {  /* up until a level has a clear bit at or after i */
    size_t w = i >> 6;
    if (k == h->nlev || w >= h->nw[k]) return SIZE_MAX;
    uint64_t bits = ~h->w[h->at[k] + w] & (~0ull << (i & 63));
    if (bits) {
      i = (w << 6) + (size_t)__builtin_ctzll(bits);
      break;
    }
    i = w + 1;
  }
  while (k-- > 0) {  /* down: the word under a clear bit is not full */
    if (i >= h->nw[k]) return SIZE_MAX;
    i = (i << 6) + (size_t)__builtin_ctzll(~h->w[h->at[k] + i]);
  }
  return i;
}

/* The last slot <= j (j < h->cap) that was not removed; SIZE_MAX when none. */
static size_t holes_prev(const mholes *h, size_t j) {
  if (!h->count) return j;
  size_t i = j;
  int k = 0;
  for (;; k++) {
    if (k == h->nlev) return SIZE_MAX;
    size_t w = i >> 6;
    uint64_t bits = ~h->w[h->at[k] + w] & (~0ull >> (63 - (i & 63)));
    if (bits) {
      i = (w << 6) + 63 - (size_t)__builtin_clzll(bits);
      break;
    }
    if (w == 0) return SIZE_MAX;
    i = w - 1;
  }
  while (k-- > 0) i = (i << 6) + 63 - (size_t)__builtin_clzll(~h->w[h->at[k] + i]);
  return i;
}

/* ---- arrays ------------------------------------------------------------- */

static size_t pos_len(const es_backend *b) { return b->npos - b->pbase; }

static int pos_reserve(es_backend *b) {
  size_t need = pos_len(b) + 1;
  mrow **p = grow(b->pos, &b->cappos, need, sizeof *p);
  if (!p) return -1;
  b->pos = p;
  /* Every slot of the array has its bit, so removal never allocates. */
  if (b->holes.cap < need && holes_rebuild(&b->holes, b->cappos, 0) != 0) return -1;
  return 0;
}

static int rows_reserve(msess *s) {
  mrow **p = grow(s->rows, &s->cap, s->n - s->base + 1, sizeof *p);
  if (!p) return -1;
  s->rows = p;
  return 0;
}

static int snaps_reserve(msess *s) {
  msnap **p = grow(s->snaps, &s->capsnaps, s->nsnaps + 1, sizeof *p);
  if (!p) return -1;
  s->snaps = p;
  return 0;
}

/* Logs a step; undo_reserve made room. */
static urec *undo_push(es_backend *b, int kind, void *obj) {
  urec *u = &b->undo[b->nundo++];
  memset(u, 0, sizeof *u);
  u->kind = (unsigned char)kind;
  u->obj = obj;
  return u;
}

static int check_write(es_txn *t, es_err *err) {
  if (!t || !t->write)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: write outside a write transaction");
  return ES_OK;
}

/* ---- rows: layout ------------------------------------------------------- */

static size_t tail_words(unsigned flags) {
  return ((flags & RF_LANE) ? 1 : 0) + ((flags & RF_CAUSE) ? 2 : 0) +
         ((flags & RF_NOT_BEFORE) ? 1 : 0) + ((flags & RF_ORIGIN) ? 2 : 0) +
         ((flags & RF_REVISION) ? 1 : 0);
}

static mlane *row_lane(const mrow *r) {
  mlane *l = NULL;
  if (r->flags & RF_LANE) memcpy(&l, &r->tail[0], sizeof l);
  return l;
}

/* A fork copy's origin session (NULL: none, or an origin_index alone). */
static msess *row_origin(const mrow *r) {
  msess *o = NULL;
  if (r->flags & RF_ORIGIN)
    memcpy(&o, &r->tail[tail_words(r->flags & ~(unsigned)(RF_ORIGIN | RF_REVISION))], sizeof o);
  return o;
}

/* Removed by event_delete_range (kept until commit for undo). */
static int row_removed(const mrow *r) { return (uint64_t)r->index <= r->sess->gone; }

/* ---- ids ---------------------------------------------------------------- */

/* The stored id: 16 bytes (RF_BINID) or text and its NUL. */
static const unsigned char *row_idp(const mrow *r) {
  return (const unsigned char *)(r->tail + tail_words(r->flags));
}

/* 8 lowercase hex digits (w: the 8 characters, the first in the lowest
 * byte) as 4 bytes in *out, in order; 0 when one is not a digit. SWAR: a
 * byte b < 0x80 plus 0x50 has bit 7 set when b >= 0x30, plus 0x46 when
 * b >= 0x3A (so '0'..'9'), plus 0x1F and 0x19 likewise for 'a'..'f'; no
 * sum carries into the next byte. */
static inline int hex8(uint64_t w, unsigned char out[4]) {
  const uint64_t ones = 0x0101010101010101ull, high = 0x80 * ones;
  uint64_t digit = (w + 0x50 * ones) & ~(w + 0x46 * ones);
  uint64_t af = (w + 0x1F * ones) & ~(w + 0x19 * ones);
  if ((w & high) || ((digit | af) & high) != high) return 0;
  uint64_t v = (w & 0x0F * ones) + ((af & high) >> 7) * 9;  /* a nibble a byte */
  v = ((v & 0x000F000F000F000Full) << 4) | ((v >> 8) & 0x000F000F000F000Full);
  v = (v | (v >> 8)) & 0x0000FFFF0000FFFFull;
  uint32_t x = (uint32_t)(v | (v >> 16));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  x = __builtin_bswap32(x);
#endif
  memcpy(out, &x, 4);
  return 1;
}

static uint64_t load8(const unsigned char *p) {
  uint64_t w;
  memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  return w;
}

/* Whether id is a UUID in canonical text form (8-4-4-4-12 lowercase hex
 * digits, nothing after), its 16 bytes in out. Every insert and lookup by
 * id asks: the length first (no byte past the NUL is read), then the
 * digits 8 at a time. */
static int uuid_parse(const char *id, unsigned char out[16]) {
  const unsigned char *s = (const unsigned char *)id;
  if (strnlen(id, 37) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-')
    return 0;
  unsigned char mid[8];  /* the 4-4-4 groups without their dashes */
  memcpy(mid, s + 9, 4);
  memcpy(mid + 4, s + 14, 4);
  unsigned char last[8];
  memcpy(last, s + 19, 4);
  memcpy(last + 4, s + 24, 4);
  return hex8(load8(s), out) && hex8(load8(mid), out + 4) && hex8(load8(last), out + 8) &&
         hex8(load8(s + 28), out + 12);
}

#define ID_TEXT 37  /* a formatted UUID and its NUL */

/* 4 bytes (p) as 8 lowercase hex digits at out, SWAR: each nibble spread
 * to a byte, then '0' + nibble, + 39 more for 10..15 ('a' - '0' - 10). */
static inline void hex4_put(const unsigned char *p, char *out) {
  const uint64_t ones = 0x0101010101010101ull;
  uint32_t x;
  memcpy(&x, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  x = __builtin_bswap32(x);
#endif
  uint64_t y = x;                                       /* byte k: input byte k */
  y = (y | (y << 16)) & 0x0000FFFF0000FFFFull;
  y = (y | (y << 8)) & 0x00FF00FF00FF00FFull;           /* byte 2k: input byte k */
  uint64_t v = ((y >> 4) & 0x000F000F000F000Full) | ((y & 0x000F000F000F000Full) << 8);
  uint64_t letter = ((v + 6 * ones) >> 4) & ones;       /* 1 where the nibble is >= 10 */
  v += 0x30 * ones + letter * 39;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  memcpy(out, &v, 8);
}

/* Every row read with a UUID id formats it: without a loop per digit. */
static void uuid_format(const unsigned char u[16], char out[ID_TEXT]) {
  char h[32];
  for (int i = 0; i < 4; i++) hex4_put(u + 4 * i, h + 8 * i);
  memcpy(out, h, 8);
  out[8] = '-';
  memcpy(out + 9, h + 8, 4);
  out[13] = '-';
  memcpy(out + 14, h + 12, 4);
  out[18] = '-';
  memcpy(out + 19, h + 16, 4);
  out[23] = '-';
  memcpy(out + 24, h + 20, 12);
  out[36] = '\0';
}

/* An id as the index looks it up: its stored representation and hash. */
typedef struct idkey {
  const char *text;       /* NULL: a UUID, in u */
  unsigned char u[16];
  uint32_t h;             /* never 0 or 1 (they mark empty and removed slots) */
} idkey;

static void idkey_of_text(idkey *k, const char *id) {
  if (uuid_parse(id, k->u)) {
    k->text = NULL;
    k->h = es_hmap_hash_bytes(k->u, 16);
  } else {
    k->text = id;
    k->h = es_hmap_hash_bytes(id, strlen(id));
  }
}

static void idkey_of_row(idkey *k, const mrow *r) {
  const unsigned char *p = row_idp(r);
  if (r->flags & RF_BINID) {
    memcpy(k->u, p, 16);
    k->text = NULL;
    k->h = es_hmap_hash_bytes(p, 16);
  } else {
    k->text = (const char *)p;
    k->h = es_hmap_hash_bytes(p, strlen(k->text));
  }
}

/* The id index (b->ids): util/hmap.h's table keyed by an idkey, so a
 * UUID id is compared as its 16 bytes. */
static int id_match(const void *item, const void *key) {
  const mrow *r = item;
  const idkey *k = key;
  const unsigned char *p = row_idp(r);
  if (!k->text) return (r->flags & RF_BINID) && memcmp(p, k->u, 16) == 0;
  return !(r->flags & RF_BINID) && strcmp((const char *)p, k->text) == 0;
}

static mrow *ids_get(const es_hmap *m, const idkey *k) { return es_hmap_find(m, k->h, id_match, k); }

/* r takes the slot of the row with its id, which is returned (NULL: none,
 * nothing changes). Never allocates. */
static mrow *ids_replace(es_hmap *m, mrow *r) {
  idkey k;
  idkey_of_row(&k, r);
  return es_hmap_replace_by(m, r, k.h, id_match, &k);
}

/* Removes r if the slot of its id holds r (a new row may have taken it). */
static void ids_remove_row(es_hmap *m, mrow *r) {
  idkey k;
  idkey_of_row(&k, r);
  es_hmap_remove_item(m, r, k.h);
}
static const char *sess_key(const void *item) { return ((const msess *)item)->name; }
static const char *lane_key(const void *item) { return ((const mlane *)item)->name; }
static const char *type_key(const void *item) { return ((const mtype *)item)->name; }
static const char *ns_key(const void *item) { return ((const mns *)item)->name; }
static const char *seg_key(const void *item) { return ((const mseglist *)item)->name; }

static void disp_fields(const es_event *e, int64_t f[NDF]) {
  f[DF_ATTEMPTS] = e->attempts;
  f[DF_FAILURES] = e->failures;
  f[DF_RETURNED] = e->returned;
  f[DF_PROCESSED_AT] = e->processed_at;
  f[DF_CLAIM_EXPIRES_AT] = e->claim_expires_at;
  f[DF_RETRY_AT] = e->retry_at;
  f[DF_LAST_FAILED_ATTEMPT] = e->last_failed_attempt;
  f[DF_FIRST_CLAIMED_AT] = e->first_claimed_at;
  f[DF_LAST_CLAIMED_AT] = e->last_claimed_at;
  f[DF_FAILED_AT] = e->failed_at;
  f[DF_PROCESSED_BY_ATTEMPT] = e->processed_by_attempt;
  f[DF_DUE_AT] = e->queued ? ES_NONE : e->due_at;  /* a queued row's is in its links */
}

static void disp_set_fields(es_event *e, const int64_t f[NDF]) {
  e->attempts = f[DF_ATTEMPTS];
  e->failures = f[DF_FAILURES];
  e->returned = f[DF_RETURNED];
  e->processed_at = f[DF_PROCESSED_AT];
  e->claim_expires_at = f[DF_CLAIM_EXPIRES_AT];
  e->retry_at = f[DF_RETRY_AT];
  e->last_failed_attempt = f[DF_LAST_FAILED_ATTEMPT];
  e->first_claimed_at = f[DF_FIRST_CLAIMED_AT];
  e->last_claimed_at = f[DF_LAST_CLAIMED_AT];
  e->failed_at = f[DF_FAILED_AT];
  e->processed_by_attempt = f[DF_PROCESSED_BY_ATTEMPT];
  e->due_at = f[DF_DUE_AT];
}

/* The mask of the fields of f that differ from a fresh event's. */
static unsigned disp_mask(const int64_t f[NDF]) {
  unsigned m = 0;
  for (int i = 0; i < NDF; i++)
    if (f[i] != DF_DEFAULT[i]) m |= 1u << i;
  return m;
}

/* Whether any field of f differs from a fresh event's: what every insert
 * asks, most rows being fresh, so unrolled and without branches (the
 * array then lives in registers). */
static int disp_any(const int64_t f[NDF]) {
  uint64_t x = 0;
#pragma GCC unroll 16
  for (int i = 0; i < NDF; i++) x |= (uint64_t)f[i] ^ (uint64_t)DF_DEFAULT[i];
  return x != 0;
}

static void disp_unpack(const mdisp *d, int64_t f[NDF]) {
  for (int i = 0, j = 0; i < NDF; i++) f[i] = (d->mask & (1u << i)) ? d->v[j++] : DF_DEFAULT[i];
}

/* The compact record (RF_COMPACT): an event a handler claimed once and
 * that attempt completed, with nothing else set. Such a record differs
 * from a fresh event's only in attempts = processed_by_attempt = 1,
 * first_claimed_at = last_claimed_at, processed_at and returned; the word
 * holds the three that vary, relative to created_at so that they fit:
 *   bits  0..31  first_claimed_at - created_at   (ms: 49 days)
 *   bits 32..51  processed_at - first_claimed_at (ms: 17 minutes, a handler's run)
 *   bits 52..63  returned                        (0..4095)
 * Anything else (a failure, a second attempt, an error or holder text, a
 * due_at, a status other than PROCESSED, a time before the one it follows,
 * a value too big for its bits) takes a block: exactness first, the common
 * case second. */
#define CD_PROC_BITS 20
#define CD_RET_BITS 12
static int cdisp_fit(const es_event *e, const int64_t f[NDF], int64_t created_at, uint64_t *word) {
  if (e->status != ES_STATUS_PROCESSED || e->queued || e->due_at != ES_NONE || e->last_error ||
      e->claim_holder || created_at == ES_NONE)
    return 0;
  if (f[DF_ATTEMPTS] != 1 || f[DF_PROCESSED_BY_ATTEMPT] != 1 ||
      f[DF_LAST_CLAIMED_AT] != f[DF_FIRST_CLAIMED_AT])
    return 0;
  static const int fresh[] = {DF_FAILURES, DF_CLAIM_EXPIRES_AT, DF_RETRY_AT, DF_LAST_FAILED_ATTEMPT,
                              DF_FAILED_AT, DF_DUE_AT};
  for (size_t i = 0; i < sizeof fresh / sizeof fresh[0]; i++)
    if (f[fresh[i]] != DF_DEFAULT[fresh[i]]) return 0;
  int64_t claimed, ran, ret = f[DF_RETURNED];
  if (__builtin_sub_overflow(f[DF_FIRST_CLAIMED_AT], created_at, &claimed) || claimed < 0 ||
      claimed > (int64_t)UINT32_MAX)
    return 0;
  if (__builtin_sub_overflow(f[DF_PROCESSED_AT], f[DF_FIRST_CLAIMED_AT], &ran) || ran < 0 ||
      ran >= (INT64_C(1) << CD_PROC_BITS))
    return 0;
  if (ret < 0 || ret >= (INT64_C(1) << CD_RET_BITS)) return 0;
  *word = (uint64_t)claimed | (uint64_t)ran << 32 | (uint64_t)ret << (32 + CD_PROC_BITS);
  return 1;
}

/* The record cdisp_fit packed, back into e (created_at: the row's). */
static void cdisp_view(uint64_t w, int64_t created_at, es_event *e) {
  disp_set_fields(e, DF_DEFAULT);
  e->attempts = e->processed_by_attempt = 1;
  e->first_claimed_at = e->last_claimed_at = created_at + (int64_t)(w & UINT32_MAX);
  e->processed_at = e->first_claimed_at + (int64_t)(w >> 32 & ((UINT64_C(1) << CD_PROC_BITS) - 1));
  e->returned = (int64_t)(w >> (32 + CD_PROC_BITS));
}

/* How a row keeps e's dispatch record: no block (the flags RF_PROC_AT_CREATED
 * / RF_RETURNED_NONE make up the difference), the compact word (RF_COMPACT,
 * *word), or a block. *disp_flags: the RF_DISP flags of the row. */
enum { DISP_NONE, DISP_COMPACT, DISP_BLOCK };
static int disp_form(const es_event *e, int64_t created_at, unsigned *disp_flags, uint64_t *word) {
  int64_t f[NDF];
  unsigned flags = 0;
  disp_fields(e, f);
  if (cdisp_fit(e, f, created_at, word)) {
    *disp_flags = RF_COMPACT;
    return DISP_COMPACT;
  }
  if (f[DF_PROCESSED_AT] == created_at && created_at != ES_NONE) {
    f[DF_PROCESSED_AT] = ES_NONE;
    flags |= RF_PROC_AT_CREATED;
  }
  if (f[DF_RETURNED] == -1) {
    f[DF_RETURNED] = 0;
    flags |= RF_RETURNED_NONE;
  }
  int needed = disp_any(f) || e->last_error || e->claim_holder;
  *disp_flags = needed ? 0 : flags;
  return needed ? DISP_BLOCK : DISP_NONE;
}

static int str_eq(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

static const char *disp_text(const mdisp *d) {
  return (const char *)(d->v + __builtin_popcount(d->mask));
}
static const char *disp_error(const mdisp *d) { return d->has_error ? disp_text(d) : NULL; }
static const char *disp_holder(const mdisp *d) {
  if (!d->has_holder) return NULL;
  const char *p = disp_text(d);
  return d->has_error ? p + strlen(p) + 1 : p;
}

static int disp_same(const mdisp *d, const es_event *e) {
  if (!d) return 0;
  int64_t have[NDF], want[NDF];
  disp_unpack(d, have);
  disp_fields(e, want);
  return memcmp(have, want, sizeof have) == 0 && str_eq(disp_error(d), e->last_error) &&
         str_eq(disp_holder(d), e->claim_holder);
}

static mdisp *disp_new(const es_event *e) {
  int64_t f[NDF];
  disp_fields(e, f);
  unsigned mask = disp_mask(f);
  size_t nv = (size_t)__builtin_popcount(mask);
  size_t le = e->last_error ? strlen(e->last_error) + 1 : 0;
  size_t lh = e->claim_holder ? strlen(e->claim_holder) + 1 : 0;
  mdisp *d = malloc(sizeof *d + nv * sizeof d->v[0] + le + lh);
  if (!d) return NULL;
  d->mask = (uint16_t)mask;
  d->has_error = e->last_error != NULL;
  d->has_holder = e->claim_holder != NULL;
  for (int i = 0, j = 0; i < NDF; i++)
    if (mask & (1u << i)) d->v[j++] = f[i];
  char *text = (char *)(d->v + nv);
  if (le) memcpy(text, e->last_error, le);
  if (lh) memcpy(text + le, e->claim_holder, lh);
  return d;
}

/* A borrowed es_event over the row (valid while the row is unchanged). */
static void row_view(const mrow *r, es_event *e, char idbuf[ID_TEXT]) {
  size_t w = 0;
  mlane *lane = row_lane(r);
  if (r->flags & RF_LANE) w++;
  e->cause_index = e->cause_attempt = ES_NONE;
  e->not_before = ES_NONE;
  if (r->flags & RF_CAUSE) {
    e->cause_index = (int64_t)r->tail[w];
    e->cause_attempt = (int64_t)r->tail[w + 1];
    w += 2;
  }
  if (r->flags & RF_NOT_BEFORE) e->not_before = (int64_t)r->tail[w++];
  e->origin_session = NULL;
  e->origin_index = ES_NONE;
  if (r->flags & RF_ORIGIN) {
    msess *o;
    memcpy(&o, &r->tail[w], sizeof o);
    e->origin_session = o ? o->name : NULL;
    e->origin_index = (int64_t)r->tail[w + 1];
    w += 2;
  }
  e->revision = (r->flags & RF_REVISION) ? (int64_t)r->tail[w++] : 1;
  char *id = (char *)(r->tail + w);
  char *payload;
  if (r->flags & RF_BINID) {
    uuid_format((const unsigned char *)id, idbuf);
    e->id = idbuf;
    payload = id + 16;
  } else {
    e->id = id;
    payload = id + strlen(id) + 1;
  }
  e->type = r->type->name;
  e->payload = (r->flags & RF_NO_PAYLOAD) ? NULL : payload;
  e->payload_len = r->payload_len;
  e->session = (char *)r->sess->name;
  e->lane = lane ? lane->name : NULL;
  e->index = r->index;
  e->position = r->position;
  e->created_at = r->created_at;
  e->status = r->status;
  e->queued = r->queued;
  e->packed = 0;
  e->payload_own = 0;
  e->key = (r->flags & RF_KEY) ? payload + r->payload_len + 1 : NULL; /* §3.10 */
  e->meta = NULL;
  if (r->flags & RF_META) e->meta = e->key ? e->key + strlen(e->key) + 1 : payload + r->payload_len + 1;
  e->shredded = 0;
  const mdisp *d = (r->flags & RF_COMPACT) ? NULL : r->disp;
  if (r->flags & RF_COMPACT) {
    cdisp_view(r->cdisp, r->created_at, e);
    e->last_error = e->claim_holder = NULL;
  } else if (d) {
    int64_t f[NDF];
    disp_unpack(d, f);
    disp_set_fields(e, f);
    e->last_error = (char *)disp_error(d);
    e->claim_holder = (char *)disp_holder(d);
  } else {
    disp_set_fields(e, DF_DEFAULT);
    if (r->flags & RF_RETURNED_NONE) e->returned = -1;
    if (r->flags & RF_PROC_AT_CREATED) e->processed_at = r->created_at;
    e->last_error = e->claim_holder = NULL;
  }
  if (r->queued) e->due_at = r->links->due;  /* else the dispatch block's (ES_NONE) */
}

static void row_free(mrow *r) {
  if (!(r->flags & RF_COMPACT)) free(r->disp);
  free(r->links);
  free(r);
}

/* ---- rows: ordered sets ------------------------------------------------- */

/* The sets a row with these fields belongs in. */
static unsigned sets_of(int status, int queued, unsigned flags) {
  unsigned m = 0;
  if (queued) m |= SETS_QUEUED;
  if (status == ES_STATUS_DEAD) m |= SETS_DEAD;
  if ((flags & RF_LANE) && status != ES_STATUS_PROCESSED) m |= SETS_LANE;
  return m;
}
static unsigned row_sets(const mrow *r) { return sets_of(r->status, r->queued, r->flags); }

/* Nodes a links block needs for the sets of mask. */
static unsigned slots_for(unsigned mask) {
  unsigned n = 0;
  while (mask >> n) n++;
  return n;
}

static mlinks *links_new(mrow *r, unsigned nslots) {
  mlinks *l = malloc(sizeof *l + nslots * sizeof l->node[0]);
  if (l) {
    l->row = r;
    l->qmin = INT64_MAX;
  }
  return l;
}

typedef struct tkey {
  int64_t a, b;
} tkey;

/* The row's due_at (row_view's): its links block's while it is queued,
 * else its dispatch block's or ES_NONE. */
static int64_t row_due(const mrow *r) {
  if (r->queued) return r->links->due;
  if (r->flags & RF_COMPACT) return ES_NONE;  /* cdisp_fit: only with due_at ES_NONE */
  const mdisp *d = r->disp;
  if (!d || !(d->mask & (1u << DF_DUE_AT))) return ES_NONE;
  return d->v[__builtin_popcount(d->mask) - 1];  /* the last field of DF_ order */
}

static tkey slot_key(int slot, const mrow *r) {
  tkey k = {0, 0};
  switch (slot) {
    case SLOT_QG:
    case SLOT_QT: k.a = r->links->due; k.b = r->position; break;
    case SLOT_QS: k.a = r->index; break;
    case SLOT_DG:
    case SLOT_DS: k.a = r->position; break;
    default: k.a = r->index; break;
  }
  return k;
}

/* A set's node leads to its links block (the slot says which node it is),
 * and that to the row. */
static mlinks *node_links(const es_tree_node *n, int slot) {
  return (mlinks *)((const char *)(n - slot) - offsetof(mlinks, node));
}
static mrow *node_row(const es_tree_node *n, int slot) { return node_links(n, slot)->row; }

static int tkey_cmp(tkey x, tkey y) {
  if (x.a != y.a) return x.a < y.a ? -1 : 1;
  if (x.b != y.b) return x.b < y.b ? -1 : 1;
  return 0;
}

#define SLOT_FUNCS(slot, name)                                                     \
  static int cmp_##name(const es_tree_node *x, const es_tree_node *y) {            \
    return tkey_cmp(slot_key(slot, node_row(x, slot)), slot_key(slot, node_row(y, slot))); \
  }                                                                                \
  static int probe_##name(const void *key, const es_tree_node *n) {                \
    return tkey_cmp(*(const tkey *)key, slot_key(slot, node_row(n, slot)));         \
  }
SLOT_FUNCS(SLOT_QG, qg)
SLOT_FUNCS(SLOT_QS, qs)
SLOT_FUNCS(SLOT_QT, qt)
SLOT_FUNCS(SLOT_DG, dg)
SLOT_FUNCS(SLOT_DS, ds)
SLOT_FUNCS(SLOT_LANE, lane)

static es_tree_probe_fn const slot_probe[NSLOTS] = {
    [SLOT_QG] = probe_qg, [SLOT_QS] = probe_qs, [SLOT_QT] = probe_qt, [SLOT_LANE] = probe_lane,
    [SLOT_DG] = probe_dg, [SLOT_DS] = probe_ds};

static es_tree *slot_tree(es_backend *b, mrow *r, int slot) {
  switch (slot) {
    case SLOT_QG: return &b->queued;
    case SLOT_QS: return &r->sess->queued;
    case SLOT_QT: return &r->type->queued;
    case SLOT_DG: return &b->dead;
    case SLOT_DS: return &r->sess->dead;
    default: return &row_lane(r)->unprocessed;
  }
}

static int64_t qs_min(const es_tree_node *n) { return n ? node_links(n, SLOT_QS)->qmin : INT64_MAX; }

static int qs_update(es_tree_node *n) {
  mlinks *l = node_links(n, SLOT_QS);
  int64_t m = l->due, c;
  if ((c = qs_min(es_tree_left(n))) < m) m = c;
  if ((c = qs_min(n->right)) < m) m = c;
  if (l->qmin == m) return 0;
  l->qmin = m;
  return 1;
}

/* Links or unlinks r in the sets of mask (r->links must exist). */
static void row_link(es_backend *b, mrow *r, unsigned mask) {
  assert(slots_for(mask) <= r->nslots);
  for (int s = 0; s < NSLOTS; s++)
    if (mask & (1u << s)) es_tree_insert(slot_tree(b, r, s), &r->links->node[s]);
}
static void row_unlink(es_backend *b, mrow *r, unsigned mask) {
  for (int s = 0; s < NSLOTS; s++)
    if (mask & (1u << s)) es_tree_remove(slot_tree(b, r, s), &r->links->node[s]);
}

/* Moves r to a new dispatch state, relinking only the sets whose membership
 * or key changes; with another links block (big enough for the new sets),
 * every set moves to it. The record is cdisp when flags has RF_COMPACT,
 * else disp. Cannot fail. */
static void row_set_state(es_backend *b, mrow *r, int status, int queued, int64_t due_at,
                          unsigned flags, mdisp *disp, uint64_t cdisp, mlinks *links,
                          unsigned nslots) {
  unsigned before = row_sets(r), after = sets_of(status, queued, flags);
  unsigned moved = 0;
  /* QS is keyed by index but summarises due_at: relinking refreshes it. */
  if (row_due(r) != due_at) moved = before & after & SETS_QUEUED;
  if (links != r->links) moved = before & after;
  /* Unlinked under the old keys: the old links block and its due. */
  row_unlink(b, r, (before & ~after) | moved);
  r->type->pending += (status == ES_STATUS_PENDING) - (r->status == ES_STATUS_PENDING);
  r->status = (unsigned)status & 3u;
  r->queued = queued != 0;
  r->flags = flags;
  if (flags & RF_COMPACT) r->cdisp = cdisp;
  else r->disp = disp;
  r->links = links;
  r->nslots = nslots;
  /* A queued row's due_at lives in its links block (there is one: the
   * queued sets are in it); any other row's is in disp (the caller made it
   * from the same event, so they agree). */
  if (queued) links->due = due_at;
  row_link(b, r, (after & ~before) | moved);
}

/* ---- sessions ----------------------------------------------------------- */

static int cmp_name(const es_tree_node *x, const es_tree_node *y) {
  return strcmp(((const msess *)x)->name, ((const msess *)y)->name);
}
static int probe_name(const void *key, const es_tree_node *n) {
  return strcmp(key, ((const msess *)n)->name);
}

/* The children index: (parent, name), the parent read from the session
 * row, which only a session_put changes (it unlinks first when it does). */
typedef struct ckey {
  const char *parent, *name;
} ckey;

static msess *child_sess(const es_tree_node *n) {
  return (msess *)((const char *)n - offsetof(msess, by_parent));
}
static int ckey_cmp(const ckey *k, const msess *s) {
  int c = strcmp(k->parent, s->info->parent);
  return c ? c : strcmp(k->name, s->name);
}
static int probe_child(const void *key, const es_tree_node *n) { return ckey_cmp(key, child_sess(n)); }
static int cmp_child(const es_tree_node *x, const es_tree_node *y) {
  const msess *a = child_sess(x);
  ckey k = {a->info->parent, a->name};
  return ckey_cmp(&k, child_sess(y));
}

static msess *sess_alloc(const char *name) {
  size_t len = strlen(name);
  msess *s = calloc(1, sizeof *s + len + 1);
  if (!s) return NULL;
  memcpy(s->name, name, len + 1);
  es_tree_init_augmented(&s->queued, cmp_qs, qs_update);
  es_tree_init(&s->dead, cmp_ds);
  return s;
}

/* Everything a session owns but its name (and its counters). */
static void sess_free_contents(msess *s) {
  if (s->lanes) {
    size_t it = 0;
    mlane *l;
    while ((l = es_hmap_next(s->lanes, &it))) free(l);
    es_hmap_destroy(s->lanes);
    free(s->lanes);
    s->lanes = NULL;
  }
  for (size_t i = 0; i < s->nsnaps; i++) free(s->snaps[i]);
  free(s->snaps);
  s->snaps = NULL;
  s->nsnaps = s->capsnaps = 0;
  free(s->rows);
  s->rows = NULL;
  s->cap = 0;
  free(s->info);
  s->info = NULL;
}

static void sess_free(msess *s) {
  sess_free_contents(s);
  free(s);
}

/* Only a writer moves the cache: readers run concurrently with each other
 * (never with the writer), so they may read it but not write it. A
 * detached session is found by no lookup (and never cached). */
static msess *sess_find(es_txn *t, const char *name) {
  es_backend *b = t->b;
  if (!name) return NULL;
  if (b->last && strcmp(b->last->name, name) == 0) return b->last;
  msess *s = es_hmap_get(&b->sessions, name);
  if (s && s->detached) return NULL;
  if (s && t->write) b->last = s;
  return s;
}

/* Finds the session, or prepares a new one (*fresh, not yet in the map; the
 * map has room for it). */
static int sess_prepare(es_txn *t, const char *name, msess **out, int *fresh, es_err *err) {
  es_backend *b = t->b;
  if (!name) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: no session name");
  *fresh = 0;
  *out = sess_find(t, name);
  if (*out) return ES_OK;
  if (es_hmap_reserve(&b->sessions, 1) != 0 || !(*out = sess_alloc(name))) return oom(err);
  *fresh = 1;
  return ES_OK;
}

static void sess_publish(es_backend *b, msess *s, int fresh) {
  if (!fresh) return;
  /* A detached session of that name waits for commit in the map: the new
   * one takes its slot (no allocation) and remembers it for undo. */
  msess *old = es_hmap_replace(&b->sessions, s);
  if (old) s->prev = old;
  else es_hmap_put(&b->sessions, s);  /* reserved: cannot fail */
}

/* Undo of the op that created s: it holds nothing any more. */
static void sess_unpublish(es_backend *b, msess *s) {
  if (b->last == s) b->last = NULL;
  if (b->last_origin == s) b->last_origin = NULL;
  if (s->prev) es_hmap_replace(&b->sessions, s->prev);
  else es_hmap_remove(&b->sessions, s->name);
  sess_free(s);
}

/* A session with no row, no event and no snapshot left is gone: detached
 * (found by no lookup, so its name starts afresh), freed at commit. The
 * caller reserved the undo record. The order in which the core removes a
 * session's parts does not matter: the last removal detaches it, and
 * before that it is an ordinary session with less in it. */
static void sess_gc(es_backend *b, msess *s) {
  if (s->info || s->gone < s->n || s->nsnaps) return;
  s->detached = 1;
  if (b->last == s) b->last = NULL;
  if (b->last_origin == s) b->last_origin = NULL;
  undo_push(b, U_SESS_DETACH, s);
}

/* Commit of a detach: out of the map (unless a new session took its slot),
 * then freed, or kept as a zombie holding its name while rows name it as
 * their origin (origin_drop frees it with the last). */
static void sess_drop(es_backend *b, msess *s) {
  msess *cur = es_hmap_get(&b->sessions, s->name);
  if (cur == s) es_hmap_remove(&b->sessions, s->name);
  else if (cur && cur->prev == s) cur->prev = NULL;
  sess_free_contents(s);
  if (s->origin_refs) s->zombie = 1;
  else free(s);
}

static void origin_drop(msess *o) {
  if (--o->origin_refs == 0 && o->zombie) free(o);
}

/* A lane or a type that no row points to any more is freed. */
static void lane_drop(msess *s, mlane *l) {
  if (--l->rows) return;
  es_hmap_remove(s->lanes, l->name);
  free(l);
  if (!s->lanes->count) {
    es_hmap_destroy(s->lanes);
    free(s->lanes);
    s->lanes = NULL;
  }
}

static void type_drop(es_backend *b, mtype *ty) {
  if (--ty->rows) return;
  es_hmap_remove(&b->types, ty->name);
  free(ty);
}

/* ---- removal: commit ---------------------------------------------------- */

/* Frees the rows an event_delete_range removed (u: its step): their ids
 * leave the map unless a new row took them, their lane, type and origin
 * lose a row. Then the front of the session's array is given back once it
 * is at least half removed slots: the move costs no more than the removals
 * it follows. */
static void drop_rows(es_backend *b, const urec *u) {
  msess *s = u->obj;
  for (size_t i = (size_t)u->old_due + 1; i <= (size_t)u->aux; i++) {
    mrow **slot = &s->rows[i - 1 - s->base];
    mrow *r = *slot;
    ids_remove_row(&b->ids, r);
    mlane *l = row_lane(r);
    if (l) lane_drop(s, l);
    type_drop(b, r->type);
    msess *o = row_origin(r);
    if (o) origin_drop(o);
    row_free(r);
    *slot = NULL;
  }
  /* The last removal of the session in this transaction (gone only grows
   * within one), and not a session freed further down the log. */
  size_t dropped = s->gone - s->base, live = s->n - s->gone;
  if ((size_t)u->aux != s->gone || s->detached || dropped < live) return;
  memmove(s->rows, s->rows + dropped, live * sizeof *s->rows);
  s->base = s->gone;
  if (!live) {
    free(s->rows);
    s->rows = NULL;
    s->cap = 0;
  } else if (s->cap >= 4 * live) {
    mrow **p = realloc(s->rows, 2 * live * sizeof *p);
    if (p) {  /* else the bigger array stays: nothing lost */
      s->rows = p;
      s->cap = 2 * live;
    }
  }
}

/* Gives back the front of the position array once at least half of it is
 * removed slots (in whole words of holes): the move costs no more than the
 * removals it follows. Out of memory: the array stays as it is. */
static void pos_compact(es_backend *b) {
  size_t len = pos_len(b);
  if (!b->holes.count || !len || b->pos[0]) return;
  size_t j = holes_next(&b->holes, 0);
  if (j > len) j = len;
  size_t d = j & ~(size_t)63, keep = len - d;
  if (!d || d < keep) return;
  size_t cap = b->cappos;
  if (cap >= 4 * keep) cap = keep > 4 ? 2 * keep : 8;
  if (holes_rebuild(&b->holes, cap, d / 64) != 0) return;
  memmove(b->pos, b->pos + d, keep * sizeof *b->pos);
  b->pbase += d;
  b->holes.count -= d;
  if (cap < b->cappos) {
    mrow **p = realloc(b->pos, cap * sizeof *p);
    if (p) {  /* else the bigger array stays (pos_reserve copes) */
      b->pos = p;
      b->cappos = cap;
    }
  }
}

/* ---- transactions ------------------------------------------------------- */

static void undo_one(es_backend *b, urec *u);
static void commit_seg(es_backend *b, urec *u);
static void snap_del_from_commit(urec *u);
static void key_block_free(void *m);

static void undo_to(es_backend *b, size_t mark) {
  while (b->nundo > mark) undo_one(b, &b->undo[--b->nundo]);
}

static int mem_write_begin(es_backend *b, es_txn **t, es_err *err) {
  if (pthread_rwlock_wrlock(&b->lock) != 0) return es_fail(err, ES_STORAGE, "memory backend: lock failed");
  b->nundo = 0;
  b->nmarks = 0;
  *t = &b->wtxn;
  return ES_OK;
}

/* Frees what the log kept for undo and the links blocks no set uses. */
static void finish_commit(es_backend *b) {
  int removed = 0;
  for (size_t i = 0; i < b->nundo; i++) {
    urec *u = &b->undo[i];
    switch (u->kind) {
      case U_EV_UPDATE:
        if (!u->disp_kept) free(u->old);
        if (u->new_links) free(u->neu);
        /* fall through */
      case U_EV_INSERT: {
        /* (A removed row, freed further down the log, is still here.) */
        mrow *r = u->obj;
        if (r->links && !row_sets(r)) {
          free(r->links);
          r->links = NULL;
          r->nslots = 0;
        }
        break;
      }
      case U_EV_DELETE: drop_rows(b, u); removed = 1; break;
      case U_SESS_DETACH: sess_drop(b, u->obj); break;
      case U_SEG: commit_seg(b, u); break;
      case U_SNAP_DEL: {
        msnap **v = u->old;
        for (int64_t k = 0; k < u->old_due; k++) free(v[k]);
        free(v);
        break;
      }
      case U_SNAP_DEL_FROM: snap_del_from_commit(u); break;
      case U_KEY_PUT: key_block_free(u->old); break;
      /* session row (also one session_delete removed), snapshot, presence
       * row, ref */
      default: free(u->old); break;
    }
  }
  if (removed) {
    pos_compact(b);
    (void)es_hmap_shrink(&b->ids);  /* out of memory: the bigger table stays */
  }
  b->nundo = 0;
  b->nmarks = 0;
  /* A huge transaction should not pin its log forever. */
  if (b->capundo > 65536) {
    free(b->undo);
    b->undo = NULL;
    b->capundo = 0;
  }
}

static int mem_write_commit(es_backend *b, es_txn *t, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  (void)err;
  finish_commit(b);
  pthread_rwlock_unlock(&b->lock);
  return ES_OK;
}

static void mem_write_rollback(es_backend *b, es_txn *t) {
  (void)t; /* the backend (b) is all it needs */
  undo_to(b, 0);
  b->nmarks = 0;
  pthread_rwlock_unlock(&b->lock);
}

static int mem_savepoint(es_backend *b, es_txn *t, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  size_t *marks = grow(b->marks, &b->capmarks, b->nmarks + 1, sizeof *marks);
  if (!marks) return oom(err);
  b->marks = marks;
  b->marks[b->nmarks++] = b->nundo;
  return ES_OK;
}

static int mem_savepoint_release(es_backend *b, es_txn *t, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  if (!b->nmarks) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: no savepoint to release");
  b->nmarks--;  /* its steps stay in the log for an outer rollback */
  return ES_OK;
}

static void mem_savepoint_rollback(es_backend *b, es_txn *t) {
  (void)t; /* the backend (b) is all it needs */
  if (!b->nmarks) return;
  undo_to(b, b->marks[--b->nmarks]);
}

static int mem_read_begin(es_backend *b, es_txn **t, es_err *err) {
  if (pthread_rwlock_rdlock(&b->lock) != 0) return es_fail(err, ES_STORAGE, "memory backend: lock failed");
  *t = &b->rtxn;
  return ES_OK;
}

static void mem_read_end(es_backend *b, es_txn *t) {
  (void)t; /* readers share b->rtxn */
  pthread_rwlock_unlock(&b->lock);
}

/* ---- archive segments (§3.9) -------------------------------------------- */

static void seglist_free(mseglist *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) es_segment_destroy(&l->v[i]);
  free(l->v);
  free(l);
}

/* A new list: old's rows without the one keyed `drop` (ES_NONE: none),
 * with `add` (NULL: none) in its place by `from`. NULL when out of memory. */
static mseglist *seglist_with(const char *name, const mseglist *old, int64_t drop,
                              const es_segment *add) {
  size_t len = strlen(name), n = old ? old->n : 0;
  mseglist *l = calloc(1, sizeof *l + len + 1);
  if (!l) return NULL;
  memcpy(l->name, name, len + 1);
  l->v = calloc(n + 1, sizeof *l->v);
  if (!l->v) {
    free(l);
    return NULL;
  }
  int placed = add == NULL;
  for (size_t i = 0; i < n || !placed; ) {
    const es_segment *src;
    if (!placed && (i == n || add->from <= old->v[i].from)) {
      src = add;
      placed = 1;
    } else {
      src = &old->v[i++];
      if (src->from == drop || (add && src->from == add->from)) continue; /* replaced or dropped */
    }
    if (es_segment_copy(&l->v[l->n++], src) != ES_OK) {
      seglist_free(l);
      return NULL;
    }
  }
  return l;
}

/* Installs `neu` as the session's list (old: the current one or NULL). */
static int seglist_install(es_backend *b, mseglist *old, mseglist *neu, es_err *err) {
  if (undo_reserve(b, 1) != 0 || (!old && es_hmap_reserve(&b->segs, 1) != 0)) {
    seglist_free(neu);
    return oom(err);
  }
  if (old) es_hmap_replace(&b->segs, neu);
  else es_hmap_put(&b->segs, neu); /* reserved: cannot fail */
  urec *u = undo_push(b, U_SEG, neu);
  u->old = old;
  return ES_OK;
}

static int mem_segment_list(es_backend *b, es_txn *t, const char *session, es_segment_cb cb,
                            void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  const mseglist *l = es_hmap_get(&t->b->segs, session);
  for (size_t i = 0; l && i < l->n; i++)
    if (cb(ctx, &l->v[i])) break;
  return ES_OK;
}

static int cmp_seglist(const void *x, const void *y) {
  return strcmp((*(const mseglist *const *)x)->name, (*(const mseglist *const *)y)->name);
}

/* The map has no order: the lists that match are sorted per call, which
 * costs the archived sessions (not all sessions) per page. */
static int mem_segment_sessions(es_backend *b, es_txn *t, const char *prefix, const char *after,
                                int64_t limit,
                                int (*cb)(void *ctx, const char *session, int64_t through),
                                void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  size_t plen = prefix ? strlen(prefix) : 0, n = 0, cap = 0, pos = 0;
  const mseglist **v = NULL;
  for (const mseglist *l; (l = es_hmap_next(&t->b->segs, &pos));) {
    if (l->n == 0 || strncmp(l->name, prefix ? prefix : "", plen) != 0) continue;
    if (after && strcmp(l->name, after) <= 0) continue;
    if (es_grow((void **)&v, &cap, n + 1, sizeof *v)) {
      free(v);
      return oom(err);
    }
    v[n++] = l;
  }
  if (n) qsort(v, n, sizeof *v, cmp_seglist);
  for (size_t i = 0; i < n && (limit == ES_NONE || (int64_t)i < limit); i++)
    if (cb(ctx, v[i]->name, v[i]->v[v[i]->n - 1].through)) break;
  free(v);
  return ES_OK;
}

static int mem_segment_put(es_backend *b, es_txn *t, const char *session, const es_segment *row,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mseglist *old = es_hmap_get(&t->b->segs, session);
  mseglist *neu = seglist_with(session, old, ES_NONE, row);
  if (!neu) return oom(err);
  return seglist_install(t->b, old, neu, err);
}

static int mem_segment_delete(es_backend *b, es_txn *t, const char *session, int64_t from,
                              es_err *err) {
  (void)b; /* t carries it (t->b) */
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mseglist *old = es_hmap_get(&t->b->segs, session);
  size_t i = 0;
  while (old && i < old->n && old->v[i].from != from) i++;
  if (!old || i == old->n) return ES_NOT_FOUND;
  mseglist *neu = seglist_with(session, old, from, NULL);
  if (!neu) return oom(err);
  return seglist_install(t->b, old, neu, err);
}

/* Undo: the old list back in its slot (or the new one out of the map). */
static void undo_seg(es_backend *b, urec *u) {
  mseglist *neu = u->obj, *old = u->old;
  if (old) es_hmap_replace(&b->segs, old);
  else es_hmap_remove(&b->segs, neu->name);
  seglist_free(neu);
}

/* Commit: the replaced list goes; the installed one too when it is empty
 * and still current (a later step of this transaction replaced it
 * otherwise, and frees it as its own `old`). */
static void commit_seg(es_backend *b, urec *u) {
  mseglist *neu = u->obj;
  if (neu->n == 0 && es_hmap_get(&b->segs, neu->name) == neu) {
    es_hmap_remove(&b->segs, neu->name);
    seglist_free(neu);
  }
  seglist_free(u->old);
}

/* ---- §3.12 counts --------------------------------------------------------- */

/* The store's and each tenant scope's sums over the counted session rows
 * (backend.h counts; the rule, which rows count and a name's scope, is
 * store/counts.h's): sess_swap_info, the one place a session row changes
 * (put, delete and their undo), moves them by the difference, so undo
 * restores them too. A scope's entry is made by session_put before
 * anything changes (a swap cannot allocate) and kept until close. */
typedef struct mscope {
  es_counts c;
  char name[];
} mscope;

static const char *scope_key(const void *item) { return ((const mscope *)item)->name; }

/* The scope of a session name into buf (ES_SCOPE_MAX_BYTES + 1 bytes);
 * 0 when it has none. */
static int scope_of(const char *name, char *buf) {
  size_t n = es_scope_len(name);
  memcpy(buf, name, n);
  buf[n] = '\0';
  return n > 0;
}

static int scope_prepare(es_backend *b, const char *name) {
  char sc[ES_SCOPE_MAX_BYTES + 1];
  if (!scope_of(name, sc) || es_hmap_get(&b->scopes, sc)) return 0;
  size_t n = strlen(sc) + 1;
  mscope *m = calloc(1, sizeof *m + n);
  if (!m) return -1;
  memcpy(m->name, sc, n);
  if (es_hmap_put(&b->scopes, m) != 0) {
    free(m);
    return -1;
  }
  return 0;
}

static void scopes_free(es_backend *b) {
  size_t it = 0;
  mscope *m;
  while ((m = es_hmap_next(&b->scopes, &it))) free(m);
  es_hmap_destroy(&b->scopes);
}

/* §3.8 fence floors (backend.h fence_floor_get): the token a deleted
 * session had, by its name. Kept outside the undo log: a floor is never
 * above the token of the row it came from, so one left by a delete that
 * was rolled back changes no answer (that row still holds a token at
 * least as high). */
typedef struct mfloor {
  int64_t token;
  char name[];
} mfloor;

static const char *floor_key(const void *item) { return ((const mfloor *)item)->name; }

static int mem_fence_floor_get(es_backend *b, es_txn *t, const char *session, int64_t *token,
                               es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  const mfloor *f = es_hmap_get(&t->b->floors, session);
  *token = f ? f->token : 0;
  return ES_OK;
}

static int mem_fence_floor_put(es_backend *b, es_txn *t, const char *session, int64_t token,
                               es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mfloor *f = es_hmap_get(&b->floors, session);
  if (f) {
    if (token > f->token) f->token = token;
    return ES_OK;
  }
  size_t n = strlen(session) + 1;
  if (!(f = malloc(sizeof *f + n))) return oom(err);
  f->token = token;
  memcpy(f->name, session, n);
  if (es_hmap_put(&b->floors, f) != 0) {
    free(f);
    return oom(err);
  }
  return ES_OK;
}

static void floors_free(es_backend *b) {
  size_t it = 0;
  mfloor *f;
  while ((f = es_hmap_next(&b->floors, &it))) free(f);
  es_hmap_destroy(&b->floors);
}

static void counts_swap(es_backend *b, const char *name, const es_session_info *from,
                        const es_session_info *to) {
  if (!es_counted(name, from) && !es_counted(name, to)) return;
  es_counts_move(&b->counts, name, from, to);
  char sc[ES_SCOPE_MAX_BYTES + 1];
  mscope *m = scope_of(name, sc) ? es_hmap_get(&b->scopes, sc) : NULL;
  if (m) es_counts_move(&m->c, name, from, to);
}

static int mem_counts(es_backend *b, es_txn *t, const char *scope, es_counts *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  memset(out, 0, sizeof *out);
  if (!scope) {
    *out = t->b->counts;
    return ES_OK;
  }
  const mscope *m = es_hmap_get(&t->b->scopes, scope);
  if (m) *out = m->c;
  return ES_OK;
}

/* ---- open / close ------------------------------------------------------- */

static int cmp_pres(const es_tree_node *x, const es_tree_node *y);
static int cmp_pexp(const es_tree_node *x, const es_tree_node *y);
static int cmp_ref(const es_tree_node *x, const es_tree_node *y);
static int cmp_ref_sess(const es_tree_node *x, const es_tree_node *y);
static int cmp_key(const es_tree_node *x, const es_tree_node *y);
static int cmp_use(const es_tree_node *x, const es_tree_node *y);
static int cmp_use_sess(const es_tree_node *x, const es_tree_node *y);

static int cmp_proj(const es_tree_node *x, const es_tree_node *y); /* §8, below */

static int mem_open(const char *url_rest, const es_open_opts *opts, es_backend **out, es_err *err) {
  (void)opts;
  *out = NULL;
  if (url_rest && *url_rest)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend takes no path: \"memory:%s\"", url_rest);
  es_backend *b = calloc(1, sizeof *b);
  if (!b) return oom(err);
  pthread_rwlockattr_t attr;
  int rc = pthread_rwlockattr_init(&attr);
  if (rc == 0) {
    /* Readers must not starve the single writer. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    rc = pthread_rwlock_init(&b->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  if (rc != 0) {
    free(b);
    return es_fail(err, ES_STORAGE, "memory backend: cannot create its lock");
  }
  b->wtxn.b = b->rtxn.b = b;
  b->wtxn.write = 1;
  es_hmap_init(&b->sessions, sess_key);
  es_hmap_init(&b->types, type_key);
  es_hmap_init(&b->spaces, ns_key);
  es_hmap_init(&b->segs, seg_key);
  es_hmap_init(&b->ids, NULL); /* keyed by idkey: es_hmap_find with id_match */
  es_tree_init(&b->names, cmp_name);
  es_tree_init(&b->children, cmp_child);
  es_tree_init(&b->refs, cmp_ref);
  es_tree_init(&b->refs_by_sess, cmp_ref_sess);
  es_tree_init(&b->keys, cmp_key);
  es_tree_init(&b->uses, cmp_use);
  es_tree_init(&b->uses_by_sess, cmp_use_sess);
  es_tree_init(&b->projs, cmp_proj);
  es_tree_init(&b->queued, cmp_qg);
  es_tree_init(&b->dead, cmp_dg);
  es_hmap_init(&b->scopes, scope_key); /* §3.12 */
  es_hmap_init(&b->floors, floor_key); /* §3.8 */
  *out = b;
  return ES_OK;
}


/* ord is the first member of a prow, node of an mref: the node is the
 * allocation. */
static void free_node(es_tree_node *n) { free(n); }

static void mem_close(es_backend *b) {
  if (!b) return;
  /* A transaction left open (a caller's bug) is undone so that everything
   * below frees exactly what is committed. */
  undo_to(b, 0);
  for (size_t i = 0; i < pos_len(b); i++) {
    mrow *r = b->pos[i];
    if (!r) continue;  /* removed and freed at commit */
    msess *o = row_origin(r);
    if (o && o->zombie) origin_drop(o);  /* the others are in the map, freed below */
    row_free(r);
  }
  free(b->pos);
  free(b->holes.w);
  size_t it = 0;
  msess *s;
  while ((s = es_hmap_next(&b->sessions, &it))) sess_free(s);
  mtype *ty;
  it = 0;
  while ((ty = es_hmap_next(&b->types, &it))) free(ty);
  mns *ns;
  it = 0;
  while ((ns = es_hmap_next(&b->spaces, &it))) {
    es_tree_clear(&ns->expiry, NULL);
    es_tree_clear(&ns->rows, free_node);
    free(ns);
  }
  es_tree_clear(&b->refs, free_node);
  es_tree_clear(&b->projs, free_node);
  mseglist *sl;
  it = 0;
  while ((sl = es_hmap_next(&b->segs, &it))) seglist_free(sl);
  es_hmap_destroy(&b->segs);
  es_tree_clear(&b->keys, free_node);
  es_tree_clear(&b->uses, free_node);
  es_hmap_destroy(&b->ids);
  es_hmap_destroy(&b->sessions);
  es_hmap_destroy(&b->types);
  es_hmap_destroy(&b->spaces);
  scopes_free(b); /* §3.12 */
  floors_free(b); /* §3.8 */
  free(b->undo);
  free(b->marks);
  pthread_rwlock_destroy(&b->lock);
  free(b);
}

/* ---- sessions: ops ------------------------------------------------------ */

static int mem_session_get(es_backend *b, es_txn *t, const char *session, es_session_info *out,
                           es_err *err) {
  (void)b; /* t carries it (t->b) */
  msess *s = sess_find(t, session);
  if (!s || !s->info) return ES_NOT_FOUND;
  es_session_info v = *s->info;
  v.session = s->name;
  return es_session_info_copy(out, &v) == ES_OK ? ES_OK : oom(err);
}

/* A copy of row in one block, its strings after the struct. */
static es_session_info *info_new(const es_session_info *row) {
  const char *strs[3] = {row->seal_reason, row->lease_holder, row->parent};
  size_t lens[3], total = sizeof(es_session_info);
  for (int i = 0; i < 3; i++) total += lens[i] = strs[i] ? strlen(strs[i]) + 1 : 0;
  es_session_info *info = malloc(total);
  if (!info) return NULL;
  *info = *row;
  info->session = NULL;
  char **outs[3] = {&info->seal_reason, &info->lease_holder, &info->parent};
  char *p = (char *)(info + 1);
  for (int i = 0; i < 3; i++) {
    *outs[i] = strs[i] ? memcpy(p, strs[i], lens[i]) : NULL;
    p += lens[i];
  }
  return info;
}

static void counts_swap(es_backend *b, const char *name, const es_session_info *from,
                        const es_session_info *to);

/* Makes `to` s's session row in place of `from` (s->info), keeping the
 * by-name and children indexes right. Cannot fail; used by put and undo. */
static void sess_swap_info(es_backend *b, msess *s, es_session_info *to) {
  es_session_info *from = s->info;
  counts_swap(b, s->name, from, to); /* §3.12 */
  const char *pf = from ? from->parent : NULL, *pt = to ? to->parent : NULL;
  /* The tree reads the parent through s->info: unlink under the old key,
   * link under the new one; an unchanged parent keeps its node. */
  int moved = !str_eq(pf, pt);
  if (pf && moved) es_tree_remove(&b->children, &s->by_parent);
  if (from && !to) es_tree_remove(&b->names, &s->by_name);
  s->info = to;
  if (to && !from) es_tree_insert(&b->names, &s->by_name);
  if (pt && moved) es_tree_insert(&b->children, &s->by_parent);
}

static int mem_session_put(es_backend *b, es_txn *t, const es_session_info *row, es_err *err) {
  msess *s;
  int fresh, rc;
  if ((rc = check_write(t, err)) || (rc = sess_prepare(t, row->session, &s, &fresh, err))) return rc;
  if (scope_prepare(b, row->session) != 0) { /* §3.12: counts_swap cannot allocate */
    if (fresh) sess_free(s);
    return oom(err);
  }
  es_session_info *info = info_new(row);
  if (!info || undo_reserve(b, 1) != 0) {
    free(info);
    if (fresh) sess_free(s);
    return oom(err);
  }
  sess_publish(b, s, fresh);
  urec *u = undo_push(b, U_SESS_PUT, s);
  u->created = (unsigned char)fresh;
  u->old = s->info;
  sess_swap_info(b, s, info);
  return ES_OK;
}

/* The row goes (listing, children); the rows, snapshots and refs are the
 * core's to remove first, and the session is detached once nothing is
 * left (sess_gc), whatever the order. O(log s + log f). */
static int mem_session_delete(es_backend *b, es_txn *t, const char *session, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  msess *s = sess_find(t, session);
  if (!s || !s->info) return ES_NOT_FOUND;
  if (undo_reserve(b, 2) != 0) return oom(err);  /* this step and a detach */
  /* A put of no row: its undo (U_SESS_PUT) puts the old one back. */
  urec *u = undo_push(b, U_SESS_PUT, s);
  u->old = s->info;
  sess_swap_info(b, s, NULL);
  sess_gc(b, s);
  return ES_OK;
}

static int starts_with(const char *s, const char *prefix, size_t plen) {
  return strncmp(s, prefix, plen) == 0;
}

#define CHUNK 32

/* Walks in chunks and re-seeks after each, so a callback may write to the
 * store without invalidating the walk. */
static int mem_session_list(es_backend *b, es_txn *t, const char *prefix, const char *after,
                            int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  (void)err;
  const char *pre = prefix ? prefix : "";
  size_t plen = strlen(pre);
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  /* Start at the later of the prefix and `after`. */
  const char *key = pre;
  int strict = 0;
  if (after && strcmp(after, pre) >= 0) {
    key = after;
    strict = 1;
  }
  es_tree_iter it;
  for (;;) {
    msess *chunk[CHUNK];
    int n = 0, more = 1;
    for (es_tree_node *nd = es_tree_iter_seek(&it, &b->names, probe_name, key, strict); nd;
         nd = es_tree_iter_next(&it)) {
      msess *s = (msess *)nd;
      if (!starts_with(s->name, pre, plen)) {
        more = 0;
        break;
      }
      if (n == CHUNK) break;
      chunk[n++] = s;
    }
    if (n < CHUNK) more = 0;
    for (int i = 0; i < n; i++) {
      msess *s = chunk[i];
      if (!s->info) continue;
      es_session_info v = *s->info;
      v.session = s->name;
      if (cb(ctx, &v)) return ES_OK;
      if (limit != ES_NONE && --limit == 0) return ES_OK;
    }
    if (!more || n == 0) return ES_OK;
    key = chunk[n - 1]->name;
    strict = 1;
  }
}

/* O(log f + k), f = sessions with a parent: a seek in the children tree.
 * Chunked like mem_session_list; a session whose parent a callback changed
 * is checked again before its turn. */
static int mem_session_children(es_backend *b, es_txn *t, const char *parent, const char *after,
                                int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  if (!parent)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: session_children needs a parent");
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  ckey key = {parent, after ? after : ""};
  int strict = after != NULL;
  es_tree_iter it;
  for (;;) {
    msess *chunk[CHUNK];
    int n = 0;
    for (es_tree_node *nd = es_tree_iter_seek(&it, &b->children, probe_child, &key, strict);
         nd && n < CHUNK; nd = es_tree_iter_next(&it)) {
      msess *c = child_sess(nd);
      if (strcmp(c->info->parent, parent) != 0) break;
      chunk[n++] = c;
    }
    for (int i = 0; i < n; i++) {
      msess *c = chunk[i];
      if (!c->info || !c->info->parent || strcmp(c->info->parent, parent) != 0) continue;
      es_session_info v = *c->info;
      v.session = c->name;
      if (cb(ctx, &v)) return ES_OK;
      if (limit != ES_NONE && --limit == 0) return ES_OK;
    }
    if (n < CHUNK) return ES_OK;
    key.name = chunk[n - 1]->name;
    strict = 1;
  }
}

/* ---- events: ops -------------------------------------------------------- */

static int row_lookup(es_txn *t, const char *session, int64_t index, mrow **out) {
  msess *s = sess_find(t, session);
  if (!s || index < 1 || (uint64_t)index <= s->gone || (uint64_t)index > s->n) return ES_NOT_FOUND;
  *out = s->rows[index - 1 - s->base];
  return ES_OK;
}

static int copy_out(const mrow *r, es_event *out, es_err *err) {
  es_event v;
  char idb[ID_TEXT];
  row_view(r, &v, idb);
  return es_event_copy(out, &v) == ES_OK ? ES_OK : oom(err);
}

static int mem_event_get(es_backend *b, es_txn *t, const char *session, int64_t index,
                         es_event *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  mrow *r;
  if (row_lookup(t, session, index, &r) != ES_OK) return ES_NOT_FOUND;
  return copy_out(r, out, err);
}

static int mem_event_get_by_id(es_backend *b, es_txn *t, const char *id, es_event *out,
                               es_err *err) {
  (void)b; /* t carries it (t->b) */
  idkey key;
  if (id) idkey_of_text(&key, id);
  mrow *r = id ? ids_get(&t->b->ids, &key) : NULL;
  if (!r || row_removed(r)) return ES_NOT_FOUND;
  return copy_out(r, out, err);
}

static int check_status(const es_event *row, es_err *err) {
  if (row->status < ES_STATUS_PENDING || row->status > ES_STATUS_DEAD)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: bad status %d", row->status);
  return ES_OK;
}

/* The writer's lookup of a fork copy's origin session: a cache of its own,
 * so that copying rows from one session into another keeps both cached. */
static msess *origin_find(es_backend *b, const char *name) {
  if (b->last_origin && strcmp(b->last_origin->name, name) == 0) return b->last_origin;
  msess *s = es_hmap_get(&b->sessions, name);
  if (s) b->last_origin = s;
  return s;
}

/* a row keeps its payload's length in 32 bits */
static size_t mem_max_payload(es_backend *b) {
  (void)b;
  return UINT32_MAX;
}

static int mem_event_insert(es_backend *b, es_txn *t, es_event *row, es_err *err) {
  int rc;
  if ((rc = check_write(t, err)) || (rc = check_status(row, err))) return rc;
  if (!row->id || !*row->id || !row->type)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: an event needs an id and a type");
  if (row->payload && row->payload_len > mem_max_payload(b)) /* the core checked it; never wrapped */
    return es_fail(err, ES_TOO_LARGE, "memory backend: payload over 4 GiB");
  idkey key;
  idkey_of_text(&key, row->id);
  /* A removed row keeps its id in the map until commit: the new row takes
   * its slot, and undo gives it back. */
  mrow *was = ids_get(&b->ids, &key);
  if (was && !row_removed(was))
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: id \"%s\" is already stored", row->id);

  msess *s;
  int fresh;
  if ((rc = sess_prepare(t, row->session, &s, &fresh, err))) return rc;
  if ((uint64_t)row->index != s->n + 1) {
    size_t next = s->n + 1;
    if (fresh) sess_free(s);
    /* Rows are found by index in a dense array; the core appends in order. */
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "memory backend: index %lld of \"%s\" is not the next one (%zu)",
                   (long long)row->index, row->session, next);
  }

  /* Every allocation first; nothing is visible until they all succeeded. */
  unsigned flags;
  uint64_t cdisp = 0;
  int form = disp_form(row, row->created_at, &flags, &cdisp);
  if (row->lane) flags |= RF_LANE;
  if (row->cause_index != ES_NONE || row->cause_attempt != ES_NONE) flags |= RF_CAUSE;
  if (row->not_before != ES_NONE) flags |= RF_NOT_BEFORE;
  if (row->origin_session || row->origin_index != ES_NONE) flags |= RF_ORIGIN;
  if (!row->payload) flags |= RF_NO_PAYLOAD;
  if (row->key) flags |= RF_KEY;
  if (!key.text) flags |= RF_BINID;
  if (row->revision != 1) flags |= RF_REVISION;
  if (row->meta) flags |= RF_META;
  size_t lkey = row->key ? strlen(row->key) + 1 : 0;
  size_t lmeta = row->meta ? strlen(row->meta) + 1 : 0;
  size_t lid = key.text ? strlen(row->id) + 1 : 16;
  size_t lpay = row->payload ? row->payload_len : 0;
  unsigned sets = sets_of(row->status, row->queued, flags);

  mlane *lane = NULL, *new_lane = NULL;
  msess *origin = NULL, *new_origin = NULL;
  mtype *type = es_hmap_get(&b->types, row->type), *new_type = NULL;
  es_hmap *new_lanes = NULL;
  mdisp *disp = NULL;
  mlinks *links = NULL;
  mrow *r = NULL;
  if (undo_reserve(b, 1) || pos_reserve(b) || es_hmap_reserve(&b->ids, 1) || rows_reserve(s))
    goto fail;
  if (!type) {
    size_t lt = strlen(row->type) + 1;
    if (es_hmap_reserve(&b->types, 1) || !(new_type = malloc(sizeof *new_type + lt))) goto fail;
    memcpy(new_type->name, row->type, lt);
    new_type->pending = 0;
    new_type->rows = 0;
    es_tree_init(&new_type->queued, cmp_qt);
    type = new_type;
  }
  if (row->lane) {
    if (!s->lanes) {
      if (!(new_lanes = malloc(sizeof *new_lanes))) goto fail;
      es_hmap_init(new_lanes, lane_key);
      s->lanes = new_lanes;
    }
    lane = es_hmap_get(s->lanes, row->lane);
    if (!lane) {
      size_t ll = strlen(row->lane) + 1;
      if (es_hmap_reserve(s->lanes, 1) || !(new_lane = malloc(sizeof *new_lane + ll))) goto fail;
      memcpy(new_lane->name, row->lane, ll);
      new_lane->rows = 0;
      es_tree_init(&new_lane->unprocessed, cmp_lane);
      lane = new_lane;
    }
  }
  if (row->origin_session) {
    origin = strcmp(row->origin_session, s->name) == 0 ? s : origin_find(b, row->origin_session);
    if (!origin) {
      /* Not a session here (the core copies from one that is): an empty
       * msess holds the name, seen by no op but through this row. */
      if (es_hmap_reserve(&b->sessions, (size_t)fresh + 1) ||
          !(new_origin = sess_alloc(row->origin_session)))
        goto fail;
      origin = new_origin;
    }
  }
  if (form == DISP_BLOCK && !(disp = disp_new(row))) goto fail;
  if (sets && !(links = links_new(NULL, slots_for(sets)))) goto fail;
  r = malloc(sizeof *r + tail_words(flags) * 8 + lid + lpay + 1 + lkey + lmeta);
  if (!r) goto fail;

  /* Nothing below can fail. */
  r->sess = s;
  r->type = type;
  if (form == DISP_COMPACT) r->cdisp = cdisp;
  else r->disp = disp;
  r->links = links;
  if (links) links->row = r;
  r->index = row->index;
  r->position = (int64_t)b->npos + 1;
  r->created_at = row->created_at;
  r->payload_len = (uint32_t)lpay;
  r->status = (unsigned)row->status & 3u;
  r->queued = row->queued != 0;
  r->flags = flags;
  r->nslots = slots_for(sets);
  if (r->queued) links->due = row->due_at;  /* else disp has it, unless ES_NONE */
  size_t w = 0;
  if (flags & RF_LANE) memcpy(&r->tail[w++], &lane, sizeof lane);
  if (flags & RF_CAUSE) {
    r->tail[w++] = (uint64_t)row->cause_index;
    r->tail[w++] = (uint64_t)row->cause_attempt;
  }
  if (flags & RF_NOT_BEFORE) r->tail[w++] = (uint64_t)row->not_before;
  if (flags & RF_ORIGIN) {
    memcpy(&r->tail[w++], &origin, sizeof origin);
    r->tail[w++] = (uint64_t)row->origin_index;
  }
  if (flags & RF_REVISION) r->tail[w++] = (uint64_t)row->revision;
  char *p = (char *)(r->tail + w);
  memcpy(p, key.text ? (const void *)row->id : key.u, lid);
  if (lpay) memcpy(p + lid, row->payload, lpay);
  p[lid + lpay] = '\0';
  if (lkey) memcpy(p + lid + lpay + 1, row->key, lkey);
  if (lmeta) memcpy(p + lid + lpay + 1 + lkey, row->meta, lmeta);

  sess_publish(b, s, fresh);
  if (new_origin) {
    es_hmap_put(&b->sessions, new_origin);  /* reserved: cannot fail */
    b->last_origin = new_origin;
  }
  if (new_lane) es_hmap_put(s->lanes, new_lane);
  if (lane) lane->rows++;
  if (new_type) es_hmap_put(&b->types, new_type);  /* reserved: cannot fail */
  type->rows++;
  if (r->status == ES_STATUS_PENDING) type->pending++;
  if (origin) origin->origin_refs++;
  b->pos[pos_len(b)] = r;
  b->npos++;
  s->rows[s->n - s->base] = r;
  s->n++;
  if (was) ids_replace(&b->ids, r);
  else (void)es_hmap_put_h(&b->ids, r, key.h); /* room reserved: cannot fail */
  row_link(b, r, sets);
  urec *u = undo_push(b, U_EV_INSERT, r);
  u->created = (unsigned char)fresh;
  u->neu = new_origin;
  u->old = was;
  row->position = r->position;
  return ES_OK;

fail:
  free(r);
  free(links);
  free(disp);
  if (new_origin) sess_free(new_origin);
  free(new_type);
  free(new_lane);
  if (new_lanes) {
    es_hmap_destroy(new_lanes);
    free(new_lanes);
    s->lanes = NULL;
  }
  if (fresh) sess_free(s);
  return oom(err);
}

static void undo_insert(es_backend *b, urec *u) {
  mrow *r = u->obj;
  msess *s = r->sess;
  mlane *lane = row_lane(r);
  msess *origin = row_origin(r);
  row_unlink(b, r, row_sets(r));
  if (r->status == ES_STATUS_PENDING) r->type->pending--;
  type_drop(b, r->type);
  if (u->old) ids_replace(&b->ids, u->old);  /* the removed row had the id */
  else ids_remove_row(&b->ids, r);
  b->npos--;  /* undone newest first: r is the last row of both arrays */
  s->n--;
  if (lane) lane_drop(s, lane);
  if (origin) origin->origin_refs--;  /* not a zombie: those only exist after commit */
  row_free(r);
  if (u->created) sess_unpublish(b, s);
  if (u->neu) sess_unpublish(b, u->neu);
}

static int mem_event_update(es_backend *b, es_txn *t, const es_event *row, es_err *err) {
  mrow *r;
  int rc;
  if ((rc = check_write(t, err)) || (rc = check_status(row, err))) return rc;
  if (row_lookup(t, row->session, row->index, &r) != ES_OK) return ES_NOT_FOUND;
  unsigned dflags;
  uint64_t cdisp = 0;
  int form = disp_form(row, r->created_at, &dflags, &cdisp);
  unsigned flags = (r->flags & ~RF_DISP) | dflags;
  /* kept: the block (or its absence: a compact word is no block) stays. */
  mdisp *cur = (r->flags & RF_COMPACT) ? NULL : r->disp;
  int kept = form == DISP_BLOCK ? disp_same(cur, row) : cur == NULL;
  mdisp *disp = kept ? cur : NULL;
  if (undo_reserve(b, 1) != 0) return oom(err);
  if (form == DISP_BLOCK && !kept && !(disp = disp_new(row))) return oom(err);
  /* A links block only grows (within a transaction, undo needs the old one). */
  unsigned nslots = slots_for(sets_of(row->status, row->queued, flags));
  mlinks *links = r->links;
  if (nslots > r->nslots) {
    if (!(links = links_new(r, nslots))) {
      if (!kept) free(disp);
      return oom(err);
    }
  } else {
    nslots = r->nslots;
  }
  urec *u = undo_push(b, U_EV_UPDATE, r);
  u->new_links = links != r->links;
  u->neu = r->links;
  u->old_nslots = r->nslots;
  u->disp_kept = (unsigned char)kept;
  u->old_status = r->status;
  u->old_queued = r->queued;
  u->old_flags = r->flags;
  u->old_due = row_due(r);
  u->old = cur;
  u->aux = (r->flags & RF_COMPACT) ? (int64_t)r->cdisp : 0;
  row_set_state(b, r, row->status, row->queued, row->due_at, flags, disp, cdisp, links, nslots);
  return ES_OK;
}

static void undo_update(es_backend *b, urec *u) {
  mrow *r = u->obj;
  mdisp *cur = (r->flags & RF_COMPACT) ? NULL : r->disp;
  mlinks *cur_links = r->links;
  row_set_state(b, r, u->old_status, u->old_queued, u->old_due, u->old_flags, u->old,
                (uint64_t)u->aux, u->neu, u->old_nslots);
  if (!u->disp_kept) free(cur);
  if (u->new_links) free(cur_links);
}

/* ---- events: removal ---------------------------------------------------- */

/* Takes r out of every set it is in, its type's pending count, and its
 * position slot (a hole). Its fields stay as they are, so that row_restore
 * knows where it was. Cannot fail. */
static void row_remove(es_backend *b, mrow *r) {
  row_unlink(b, r, row_sets(r));
  if (r->status == ES_STATUS_PENDING) r->type->pending--;
  size_t j = (size_t)r->position - 1 - b->pbase;
  b->pos[j] = NULL;
  holes_set(&b->holes, j);
}

static void row_restore(es_backend *b, mrow *r) {
  size_t j = (size_t)r->position - 1 - b->pbase;
  b->pos[j] = r;
  holes_clear(&b->holes, j);
  if (r->status == ES_STATUS_PENDING) r->type->pending++;
  row_link(b, r, row_sets(r));
}

/* O(k) for k rows removed, + O(log n) for each set a row was in (pending,
 * dead, laned rows); commit then frees them in O(k). One undo step, however
 * many rows: they stay in the session's array until commit. */
static int mem_event_delete_range(es_backend *b, es_txn *t, const char *session, int64_t through,
                                  es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  msess *s = sess_find(t, session);
  if (!s || through <= 0) return ES_OK;
  size_t to = (uint64_t)through < s->n ? (size_t)through : s->n;
  if (to <= s->gone) return ES_OK;
  if (undo_reserve(b, 2) != 0) return oom(err);  /* this step and a detach */
  for (size_t i = s->gone + 1; i <= to; i++) row_remove(b, s->rows[i - 1 - s->base]);
  urec *u = undo_push(b, U_EV_DELETE, s);
  u->old_due = (int64_t)s->gone;
  u->aux = (int64_t)to;
  s->gone = to;
  sess_gc(b, s);
  return ES_OK;
}

static void undo_delete(es_backend *b, urec *u) {
  msess *s = u->obj;
  for (size_t i = (size_t)u->old_due + 1; i <= (size_t)u->aux; i++)
    row_restore(b, s->rows[i - 1 - s->base]);
  s->gone = (size_t)u->old_due;
}

static int mem_event_range(es_backend *b, es_txn *t, const char *session, int64_t after,
                           int64_t through, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  msess *s = sess_find(t, session);
  if (!s || (limit != ES_NONE && limit <= 0)) return ES_OK;
  /* i: the index before the next row. gone is read again each turn: a
   * callback may remove rows. */
  uint64_t i = after < 0 ? 0 : (uint64_t)after;
  uint64_t last = through == ES_NONE ? UINT64_MAX : through < 0 ? 0 : (uint64_t)through;
  for (;; i++) {
    if (i < s->gone) i = s->gone;
    if (i >= s->n || i >= last) break;
    es_event v;
    char idb[ID_TEXT];
    row_view(s->rows[i - s->base], &v, idb);
    if (cb(ctx, &v)) break;
    if (limit != ES_NONE && --limit == 0) break;
  }
  return ES_OK;
}

/* §3.11 scoped listings: the rows of the sets walked in their own order,
 * those of sessions outside the scope passed over (the cost the docs state:
 * a tenant's listing walks past other tenants' rows). The walk runs
 * without a limit; the filter counts the caller's. */
typedef struct {
  const char *scope;
  size_t n;
  int64_t limit;
  es_event_cb cb;
  void *ctx;
} scope_filter;

static int scope_pass(void *ctx, const es_event *row) {
  scope_filter *f = ctx;
  if (strncmp(row->session, f->scope, f->n) != 0) return 0;
  if (f->cb(f->ctx, row)) return 1;
  return f->limit != ES_NONE && --f->limit == 0;
}

/* Points *cb / *ctx at f when scope is set; the walk then takes no limit. */
static void scope_wrap(scope_filter *f, const char *scope, int64_t *limit, es_event_cb *cb,
                       void **ctx) {
  if (!scope) return;
  *f = (scope_filter){scope, strlen(scope), *limit, *cb, *ctx};
  *limit = ES_NONE;
  *cb = scope_pass;
  *ctx = f;
}

/* A session's place in a scoped walk: its next row's index and position. */
typedef struct {
  msess *s;
  size_t i;
  int64_t pos;
} scursor;

static void sheap_down(scursor *h, size_t n, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    if (l < n && h[l].pos < h[m].pos) m = l;
    if (l + 1 < n && h[l + 1].pos < h[m].pos) m = l + 1;
    if (m == i) return;
    scursor tmp = h[i];
    h[i] = h[m];
    h[m] = tmp;
    i = m;
  }
}

/* The row at index i of s, NULL when i is not live (removed, or past n). */
static mrow *sess_row(const msess *s, size_t i) {
  return i > s->gone && i <= s->n ? s->rows[i - 1 - s->base] : NULL;
}

/* event_all with a scope: the scope's sessions are one range of the names
 * tree, and each session's rows are in position order by index, so the
 * answer is a merge of the sessions' rows after `after` (each found by a
 * binary search): O(the scope's sessions * log n + rows returned * log
 * sessions), whatever the rest of the store holds. A tenant with no
 * session costs one tree seek (issue 24: its tails and waits used to walk
 * every later row of the store). The callback must not insert or remove
 * rows (the core's collector does not). */
static int mem_event_all_scoped(es_backend *b, const char *scope, int64_t after, int64_t limit,
                                es_event_cb cb, void *ctx, es_err *err) {
  size_t plen = strlen(scope), n = 0, cap = 0;
  scursor *h = NULL;
  es_tree_iter it;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->names, probe_name, scope, 0); nd;
       nd = es_tree_iter_next(&it)) {
    msess *m = (msess *)nd;
    if (!starts_with(m->name, scope, plen)) break;
    /* the first live index whose position is past `after` */
    size_t lo = m->gone + 1, hi = m->n + 1;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (sess_row(m, mid)->position > after) hi = mid;
      else lo = mid + 1;
    }
    mrow *r = sess_row(m, lo);
    if (!r) continue;
    scursor *g = n == cap ? grow(h, &cap, n + 1, sizeof *h) : h;
    if (!g) {
      free(h);
      return oom(err);
    }
    h = g;
    h[n++] = (scursor){m, lo, r->position};
  }
  for (size_t i = n / 2; i-- > 0;) sheap_down(h, n, i);
  while (n > 0) {
    es_event v;
    char idb[ID_TEXT];
    row_view(sess_row(h[0].s, h[0].i), &v, idb);
    if (cb(ctx, &v)) break;
    if (limit != ES_NONE && --limit == 0) break;
    mrow *next = sess_row(h[0].s, ++h[0].i);
    if (next) h[0].pos = next->position;
    else h[0] = h[--n];
    sheap_down(h, n, 0);
  }
  free(h);
  return ES_OK;
}

static int mem_event_all(es_backend *b, es_txn *t, const char *scope, int64_t after, int64_t limit,
                         es_event_cb cb, void *ctx, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  if (scope) return mem_event_all_scoped(b, scope, after, limit, cb, ctx, err);
  /* j: the slot of the next position; removed slots are skipped in
   * O(log64 n) per gap. Array and holes are read again each turn: a
   * callback may insert or remove rows (they move only at commit). */
  size_t j = after <= (int64_t)b->pbase ? 0 : (size_t)after - b->pbase;
  for (;; j++) {
    j = holes_next(&b->holes, j);
    if (j >= pos_len(b)) break;
    es_event v;
    char idb[ID_TEXT];
    row_view(b->pos[j], &v, idb);
    if (cb(ctx, &v)) break;
    if (limit != ES_NONE && --limit == 0) break;
  }
  return ES_OK;
}

/* The highest position of a row still stored, as SQLite's max(position):
 * after the newest rows are removed it goes down, but event_insert still
 * hands out npos + 1 (positions are never reused). O(log64 n). */
static int mem_last_position(es_backend *b, es_txn *t, int64_t *position, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  (void)err;
  size_t len = pos_len(b);
  size_t j = len ? holes_prev(&b->holes, len - 1) : SIZE_MAX;
  *position = j == SIZE_MAX ? 0 : (int64_t)(b->pbase + j + 1);
  return ES_OK;
}

static int mem_lane_next(es_backend *b, es_txn *t, const char *session, const char *lane,
                         int64_t after, int64_t *index, es_err *err) {
  (void)b; /* t carries it (t->b) */
  *index = 0;
  if (!lane) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: lane_next needs a lane");
  msess *s = sess_find(t, session);
  mlane *l = s && s->lanes ? es_hmap_get(s->lanes, lane) : NULL;
  if (!l) return ES_OK;
  tkey k = {after, 0};
  es_tree_node *n = es_tree_seek(&l->unprocessed, probe_lane, &k, 1);
  if (n) *index = node_row(n, SLOT_LANE)->index;
  return ES_OK;
}

/* Calls cb for the rows of one set from `from` on (strict: after it) while
 * their key's first part is <= stop_a, at most limit. Chunked like
 * mem_session_list; a row changed by a callback is re-checked before its
 * turn. */
static int walk_set(es_tree *tree, int slot, tkey from, int strict, int64_t stop_a, int64_t limit,
                    es_event_cb cb, void *ctx) {
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  es_tree_iter it;
  for (;;) {
    mrow *rows[CHUNK];
    tkey keys[CHUNK];
    int n = 0, more = 0;
    for (es_tree_node *nd = es_tree_iter_seek(&it, tree, slot_probe[slot], &from, strict); nd;
         nd = es_tree_iter_next(&it)) {
      mrow *r = node_row(nd, slot);
      tkey k = slot_key(slot, r);
      if (k.a > stop_a) break;
      from = k;
      strict = 1;
      rows[n] = r;
      keys[n++] = k;
      if (n == CHUNK) {
        more = 1;
        break;
      }
    }
    for (int i = 0; i < n; i++) {
      mrow *r = rows[i];
      if (row_removed(r) || !(row_sets(r) & (1u << slot)) ||
          tkey_cmp(slot_key(slot, r), keys[i]) != 0)
        continue;
      es_event v;
      char idb[ID_TEXT];
      row_view(r, &v, idb);
      if (cb(ctx, &v)) return ES_OK;
      if (limit != ES_NONE && --limit == 0) return ES_OK;
    }
    if (!more) return ES_OK;
  }
}

/* Up to cap rows of the QS subtree n with index > after and due_at <= now,
 * in index order. A subtree whose least due_at is later than now is never
 * entered, so this costs O((found + 1) log n) however many rows wait. */
static void qs_collect(const es_tree_node *n, int64_t after, int64_t now, mrow **out, int *k,
                       int cap) {
  while (n && *k < cap && qs_min(n) <= now) {
    mrow *r = node_row(n, SLOT_QS);
    if (r->index > after) {
      qs_collect(es_tree_left(n), after, now, out, k, cap);
      if (*k < cap && r->index > after && r->links->due <= now) out[(*k)++] = r;
    }
    n = n->right;  /* the loop is the tail call */
  }
}

/* The least due_at > now in the QS subtree n (or best, if smaller). Only
 * subtrees holding a row due by now are searched inside. */
static int64_t qs_next_due(const es_tree_node *n, int64_t now, int64_t best) {
  while (n) {
    int64_t m = qs_min(n);
    if (m >= best) break;
    if (m > now) return m;
    best = qs_next_due(es_tree_left(n), now, best);
    int64_t d = node_links(n, SLOT_QS)->due;
    if (d > now && d < best) best = d;
    n = n->right;
  }
  return best;
}

static int mem_queued_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                          int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)err;
  tkey from = {INT64_MIN, INT64_MIN};
  if (!session) {
    if (limit != ES_NONE && limit <= 0) return ES_OK;
    scope_filter f;
    scope_wrap(&f, scope, &limit, &cb, &ctx);
    return walk_set(&b->queued, SLOT_QG, from, 0, now, limit, cb, ctx);
  }
  msess *s = sess_find(t, session);
  if (!s || (limit != ES_NONE && limit <= 0)) return ES_OK;
  /* In chunks, re-collected after each (callbacks may write). */
  int64_t after = INT64_MIN;
  for (;;) {
    mrow *rows[CHUNK];
    int k = 0;
    qs_collect(s->queued.root, after, now, rows, &k, CHUNK);
    for (int i = 0; i < k; i++) {
      mrow *r = rows[i];
      after = r->index;
      if (row_removed(r) || !r->queued || r->links->due > now) continue;
      es_event v;
      char idb[ID_TEXT];
      row_view(r, &v, idb);
      if (cb(ctx, &v)) return ES_OK;
      if (limit != ES_NONE && --limit == 0) return ES_OK;
    }
    if (k < CHUNK) return ES_OK;
  }
}

/* The first row of a scoped walk: its due_at. */
static int first_due(void *ctx, const es_event *row) {
  *(int64_t *)ctx = row->due_at;
  return 1;
}

/* The least due_at > now of scope's queued rows in one (due_at, position)
 * set: the set's order, other sessions' rows passed over. */
static void scoped_next_due(es_tree *set, int slot, const char *scope, int64_t now, int64_t *due) {
  scope_filter f = {scope, strlen(scope), 1, first_due, due};
  tkey from = {now, INT64_MAX};
  walk_set(set, slot, from, 1, INT64_MAX, ES_NONE, scope_pass, &f);
}

static int mem_queued_next_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                               int64_t now, int64_t *due, es_err *err) {
  (void)err;
  *due = ES_NONE;
  if (!session && scope) {
    scoped_next_due(&b->queued, SLOT_QG, scope, now, due);
    return ES_OK;
  }
  if (!session) {
    tkey k = {now, INT64_MAX};
    es_tree_node *n = es_tree_seek(&b->queued, probe_qg, &k, 1);
    if (n) *due = node_links(n, SLOT_QG)->due;
    return ES_OK;
  }
  msess *s = sess_find(t, session);
  int64_t d = s && now != INT64_MAX ? qs_next_due(s->queued.root, now, INT64_MAX) : INT64_MAX;
  if (d != INT64_MAX) *due = d;
  return ES_OK;
}

static int mem_queued_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                               int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  mtype *m = type ? es_hmap_get(&t->b->types, type) : NULL;
  tkey from = {INT64_MIN, INT64_MIN};
  if (!m || (limit != ES_NONE && limit <= 0)) return ES_OK;
  scope_filter f;
  scope_wrap(&f, scope, &limit, &cb, &ctx);
  return walk_set(&m->queued, SLOT_QT, from, 0, now, limit, cb, ctx);
}

static int mem_queued_next_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                                    int64_t now, int64_t *due, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  mtype *m = type ? es_hmap_get(&t->b->types, type) : NULL;
  *due = ES_NONE;
  if (!m) return ES_OK;
  if (scope) {
    scoped_next_due(&m->queued, SLOT_QT, scope, now, due);
    return ES_OK;
  }
  tkey k = {now, INT64_MAX};
  es_tree_node *n = es_tree_seek(&m->queued, probe_qt, &k, 1);
  if (n) *due = node_links(n, SLOT_QT)->due;
  return ES_OK;
}

static int cmp_type_ptr(const void *x, const void *y) {
  return strcmp((*(mtype *const *)x)->name, (*(mtype *const *)y)->name);
}

/* O(T log T), T = types ever stored: every type keeps its own count, so no
 * row is visited. The types are collected (and sorted) before the first
 * callback, so a callback may write. */
/* Scoped (§3.11): the per-type counts are store-wide, so the pending rows
 * of scope's sessions that have any are counted: O(events of those
 * sessions + P log P) for P pending rows. Counted before the first
 * callback (a callback may write). */
static int mem_pending_types_scoped(es_txn *t, const char *scope, es_type_count_cb cb, void *ctx,
                                    es_err *err) {
  es_backend *b = t->b;
  size_t plen = strlen(scope), n = 0, cap = 0;
  mtype **v = NULL;
  es_tree_iter it;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->names, probe_name, scope, 0); nd;
       nd = es_tree_iter_next(&it)) {
    msess *ss = (msess *)nd;
    if (!starts_with(ss->name, scope, plen)) break;
    if (!ss->info || ss->info->pending <= 0) continue;
    for (size_t i = ss->gone; i < ss->n; i++) {
      mrow *r = ss->rows[i - ss->base];
      if (!r || r->status != ES_STATUS_PENDING) continue;
      mtype **g = grow(v, &cap, n + 1, sizeof *v);
      if (!g) {
        free(v);
        return oom(err);
      }
      v = g;
      v[n++] = r->type;
    }
  }
  if (n > 1) qsort(v, n, sizeof *v, cmp_type_ptr);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && v[j] == v[i]) j++;
    if (cb(ctx, v[i]->name, (int64_t)(j - i))) break;
    i = j;
  }
  free(v);
  return ES_OK;
}

static int mem_pending_types(es_backend *b, es_txn *t, const char *scope, es_type_count_cb cb,
                             void *ctx, es_err *err) {
  if (scope) return mem_pending_types_scoped(t, scope, cb, ctx, err);
  mtype **v = NULL, *m;
  size_t n = 0, cap = 0, it = 0;
  while ((m = es_hmap_next(&b->types, &it))) {
    if (m->pending <= 0) continue;
    mtype **g = grow(v, &cap, n + 1, sizeof *v);
    if (!g) {
      free(v);
      return oom(err);
    }
    v = g;
    v[n++] = m;
  }
  if (n > 1) qsort(v, n, sizeof *v, cmp_type_ptr);
  for (size_t i = 0; i < n; i++)
    if (cb(ctx, v[i]->name, v[i]->pending)) break;
  free(v);
  return ES_OK;
}

static int mem_dead_list(es_backend *b, es_txn *t, const char *session, const char *scope,
                         int64_t after, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  (void)err;
  tkey from = {after, INT64_MAX};
  if (!session) {
    if (limit != ES_NONE && limit <= 0) return ES_OK;
    scope_filter f;
    scope_wrap(&f, scope, &limit, &cb, &ctx);
    return walk_set(&b->dead, SLOT_DG, from, 1, INT64_MAX, limit, cb, ctx);
  }
  msess *s = sess_find(t, session);
  if (!s) return ES_OK;
  return walk_set(&s->dead, SLOT_DS, from, 1, INT64_MAX, limit, cb, ctx);
}

/* ---- snapshots ---------------------------------------------------------- */

static const char *snap_version(const msnap *m) {
  return m->has_version ? m->data + strlen(m->data) + 1 : NULL;
}

static void snap_view(const msnap *m, es_snapshot *v, int with_state) {
  v->reducer = (char *)m->data;
  v->index = m->index;
  v->updated_at = m->updated_at;
  v->version = (char *)snap_version(m);
  v->state = NULL;
  v->state_len = 0;
  if (with_state && m->has_state) {
    const char *ver = snap_version(m);
    v->state = (char *)(ver ? ver + strlen(ver) + 1 : m->data + strlen(m->data) + 1);
    v->state_len = m->state_len;
  }
}

/* Index of reducer in s->snaps, or where it would go (*found = 0). */
static size_t snap_find(const msess *s, const char *reducer, int *found) {
  size_t lo = 0, hi = s->nsnaps;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(s->snaps[mid]->data, reducer);
    if (c == 0) {
      *found = 1;
      return mid;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  *found = 0;
  return lo;
}

static int mem_snapshot_get(es_backend *b, es_txn *t, const char *session, const char *reducer,
                            es_snapshot *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  msess *s = sess_find(t, session);
  int found = 0;
  size_t i = s && reducer ? snap_find(s, reducer, &found) : 0;
  if (!found) return ES_NOT_FOUND;
  es_snapshot v;
  snap_view(s->snaps[i], &v, 1);
  return es_snapshot_copy(out, &v) == ES_OK ? ES_OK : oom(err);
}

static int mem_snapshot_put(es_backend *b, es_txn *t, const char *session, const es_snapshot *row,
                            es_err *err) {
  int rc, fresh, found;
  msess *s;
  if ((rc = check_write(t, err))) return rc;
  if (!row->reducer) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: a snapshot needs a reducer");
  if ((rc = sess_prepare(t, session, &s, &fresh, err))) return rc;
  size_t i = snap_find(s, row->reducer, &found);
  size_t lr = strlen(row->reducer) + 1, lv = row->version ? strlen(row->version) + 1 : 0;
  size_t ls = row->state ? row->state_len + 1 : 0;
  msnap *m = NULL;
  if (undo_reserve(b, 1) || (!found && snaps_reserve(s)) ||
      !(m = malloc(sizeof *m + lr + lv + ls))) {
    free(m);
    if (fresh) sess_free(s);
    return oom(err);
  }
  m->index = row->index;
  m->updated_at = row->updated_at;
  m->state_len = row->state ? row->state_len : 0;
  m->has_state = row->state != NULL;
  m->has_version = row->version != NULL;
  memcpy(m->data, row->reducer, lr);
  if (lv) memcpy(m->data + lr, row->version, lv);
  if (ls) {
    memcpy(m->data + lr + lv, row->state, row->state_len);
    m->data[lr + lv + row->state_len] = '\0';
  }
  sess_publish(b, s, fresh);
  urec *u = undo_push(b, U_SNAP_PUT, s);
  u->created = (unsigned char)fresh;
  u->neu = m;
  if (found) {
    u->old = s->snaps[i];
  } else {
    memmove(&s->snaps[i + 1], &s->snaps[i], (s->nsnaps - i) * sizeof *s->snaps);
    s->nsnaps++;
  }
  s->snaps[i] = m;
  return ES_OK;
}

static void undo_snap(es_backend *b, urec *u) {
  msess *s = u->obj;
  msnap *m = u->neu;
  int found;
  size_t i = snap_find(s, m->data, &found);
  if (u->old) {
    s->snaps[i] = u->old;
  } else {
    s->nsnaps--;
    memmove(&s->snaps[i], &s->snaps[i + 1], (s->nsnaps - i) * sizeof *s->snaps);
  }
  free(m);
  if (u->created) sess_unpublish(b, s);
}

/* O(1): the array moves to the undo log; commit frees it in O(r). */
static int mem_snapshot_delete_all(es_backend *b, es_txn *t, const char *session, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  msess *s = sess_find(t, session);
  if (!s || !s->nsnaps) return ES_OK;
  if (undo_reserve(b, 2) != 0) return oom(err);  /* this step and a detach */
  urec *u = undo_push(b, U_SNAP_DEL, s);
  u->old = s->snaps;
  u->old_due = (int64_t)s->nsnaps;
  s->snaps = NULL;
  s->nsnaps = s->capsnaps = 0;
  sess_gc(b, s);
  return ES_OK;
}

static void undo_snap_del(urec *u) {
  msess *s = u->obj;
  free(s->snaps);  /* empty: made by puts undone before this step */
  s->snaps = u->old;
  s->nsnaps = s->capsnaps = (size_t)u->old_due;
}

static int mem_snapshot_list(es_backend *b, es_txn *t, const char *session, es_snapshot_cb cb,
                             void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  msess *s = sess_find(t, session);
  /* By position in the sorted array, re-read each turn: a callback that
   * puts a snapshot shifts it at most by the one it added. */
  for (size_t i = 0; s && i < s->nsnaps; i++) {
    es_snapshot v;
    snap_view(s->snaps[i], &v, 0);
    if (cb(ctx, &v)) break;
  }
  return ES_OK;
}

/* ---- presence ----------------------------------------------------------- */

typedef struct pkey {
  const char *participant, *field;
} pkey;

static const char *prow_field(const prow *p) { return p->data + strlen(p->data) + 1; }
static const char *prow_value(const prow *p) {
  if (!p->has_value) return NULL;
  const char *f = prow_field(p);
  return f + strlen(f) + 1;
}

static int pkey_cmp(const pkey *k, const prow *p) {
  int c = strcmp(k->participant, p->data);
  return c ? c : strcmp(k->field, prow_field(p));
}
static int probe_pres(const void *key, const es_tree_node *n) { return pkey_cmp(key, (const prow *)n); }
static int cmp_pres(const es_tree_node *x, const es_tree_node *y) {
  const prow *a = (const prow *)x;
  pkey k = {a->data, prow_field(a)};
  return pkey_cmp(&k, (const prow *)y);
}
static const prow *exp_prow(const es_tree_node *n) {
  return (const prow *)((const char *)n - offsetof(prow, exp));
}
static int cmp_pexp(const es_tree_node *x, const es_tree_node *y) {
  const prow *a = exp_prow(x), *c = exp_prow(y);
  if (a->expires_at != c->expires_at) return a->expires_at < c->expires_at ? -1 : 1;
  uintptr_t pa = (uintptr_t)a, pc = (uintptr_t)c;  /* unique tie-break */
  return pa < pc ? -1 : pa > pc;
}

static void prow_view(const prow *p, es_presence_row *v) {
  v->participant = (char *)p->data;
  v->field = (char *)prow_field(p);
  v->value = (char *)prow_value(p);
  v->value_len = p->has_value ? p->value_len : 0;
  v->seen = p->seen;
  v->at = p->at;
  v->expires_at = p->expires_at;
}

static prow *prow_find(const mns *ns, const char *participant, const char *field) {
  pkey k = {participant, field};
  es_tree_node *n = es_tree_seek(&ns->rows, probe_pres, &k, 0);
  return n && probe_pres(&k, n) == 0 ? (prow *)n : NULL;
}

static void prow_link(mns *ns, prow *p) {
  es_tree_insert(&ns->rows, &p->ord);
  es_tree_insert(&ns->expiry, &p->exp);
  ns->count++;
}
static void prow_unlink(mns *ns, prow *p) {
  es_tree_remove(&ns->rows, &p->ord);
  es_tree_remove(&ns->expiry, &p->exp);
  ns->count--;
}

static int mem_presence_get(es_backend *b, es_txn *t, const char *ns, const char *participant,
                            const char *field, es_presence_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  mns *n = ns ? es_hmap_get(&t->b->spaces, ns) : NULL;
  prow *p = n && participant && field ? prow_find(n, participant, field) : NULL;
  if (!p) return ES_NOT_FOUND;
  es_presence_row v;
  prow_view(p, &v);
  return es_presence_row_copy(out, &v) == ES_OK ? ES_OK : oom(err);
}

static int mem_presence_put(es_backend *b, es_txn *t, const char *ns, const es_presence_row *row,
                            es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!ns || !row->participant || !row->field)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: presence needs ns, participant and field");
  mns *n = es_hmap_get(&b->spaces, ns);
  int fresh = 0;
  size_t lp = strlen(row->participant) + 1, lf = strlen(row->field) + 1;
  size_t lv = row->value ? row->value_len + 1 : 0;
  prow *p = NULL;
  if (undo_reserve(b, 1) != 0) return oom(err);
  if (!n) {
    size_t ln = strlen(ns) + 1;
    if (es_hmap_reserve(&b->spaces, 1) != 0 || !(n = malloc(sizeof *n + ln))) return oom(err);
    memcpy(n->name, ns, ln);
    es_tree_init(&n->rows, cmp_pres);
    es_tree_init(&n->expiry, cmp_pexp);
    n->count = 0;
    fresh = 1;
  }
  if (!(p = malloc(sizeof *p + lp + lf + lv))) {
    if (fresh) free(n);
    return oom(err);
  }
  p->seen = row->seen;
  p->at = row->at;
  p->expires_at = row->expires_at;
  p->value_len = row->value ? row->value_len : 0;
  p->has_value = row->value != NULL;
  memcpy(p->data, row->participant, lp);
  memcpy(p->data + lp, row->field, lf);
  if (lv) {
    memcpy(p->data + lp + lf, row->value, row->value_len);
    p->data[lp + lf + row->value_len] = '\0';
  }
  if (fresh) es_hmap_put(&b->spaces, n);
  prow *old = prow_find(n, row->participant, row->field);
  if (old) prow_unlink(n, old);
  prow_link(n, p);
  urec *u = undo_push(b, U_PRES_PUT, n);
  u->created = (unsigned char)fresh;
  u->old = old;
  u->neu = p;
  return ES_OK;
}

static int mem_presence_expire(es_backend *b, es_txn *t, const char *ns, int64_t now, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mns *n = ns ? es_hmap_get(&b->spaces, ns) : NULL;
  es_tree_node *e;
  while (n && (e = es_tree_first(&n->expiry)) && exp_prow(e)->expires_at <= now) {
    /* Each removal is logged before the next: out of memory stops here with
     * every removal so far undoable. */
    if (undo_reserve(b, 1) != 0) return oom(err);
    prow *p = (prow *)exp_prow(e);
    prow_unlink(n, p);
    urec *u = undo_push(b, U_PRES_DEL, n);
    u->old = p;
  }
  return ES_OK;
}

static int mem_presence_list(es_backend *b, es_txn *t, const char *ns, int64_t now,
                             es_presence_cb_row cb, void *ctx, es_err *err) {
  (void)b; /* t carries it (t->b) */
  (void)err;
  mns *n = ns ? es_hmap_get(&t->b->spaces, ns) : NULL;
  if (!n) return ES_OK;
  es_tree_iter it;
  pkey from = {"", ""};
  int strict = 0;
  for (;;) {
    prow *chunk[CHUNK];
    int k = 0;
    for (es_tree_node *nd = es_tree_iter_seek(&it, &n->rows, probe_pres, &from, strict); nd && k < CHUNK;
         nd = es_tree_iter_next(&it))
      chunk[k++] = (prow *)nd;
    for (int i = 0; i < k; i++) {
      if (chunk[i]->expires_at <= now) continue;
      es_presence_row v;
      prow_view(chunk[i], &v);
      if (cb(ctx, &v)) return ES_OK;
    }
    if (k < CHUNK) return ES_OK;
    /* The last prow stays allocated until commit even if a callback replaced it. */
    from.participant = chunk[k - 1]->data;
    from.field = prow_field(chunk[k - 1]);
    strict = 1;
  }
}

static void undo_pres(es_backend *b, urec *u) {
  mns *n = u->obj;
  if (u->kind == U_PRES_DEL) {
    prow_link(n, u->old);
    return;
  }
  prow_unlink(n, u->neu);
  free(u->neu);
  if (u->old) prow_link(n, u->old);
  if (u->created) {
    es_hmap_remove(&b->spaces, n->name);
    free(n);
  }
}

/* ---- refs --------------------------------------------------------------- */

static const char *ref_session(const mref *m) { return m->data + strlen(m->data) + 1; }
static int probe_ref(const void *key, const es_tree_node *n) {
  return strcmp(key, ((const mref *)n)->data);
}
static int cmp_ref(const es_tree_node *x, const es_tree_node *y) {
  return strcmp(((const mref *)x)->data, ((const mref *)y)->data);
}

/* The (session, name) index: ref_delete_session finds the refs naming a
 * session without visiting the others. */
typedef struct rkey {
  const char *session, *name;
} rkey;

static const mref *sess_mref(const es_tree_node *n) {
  return (const mref *)((const char *)n - offsetof(mref, by_sess));
}
static int rkey_cmp(const rkey *k, const mref *m) {
  int c = strcmp(k->session, ref_session(m));
  return c ? c : strcmp(k->name, m->data);
}
static int probe_ref_sess(const void *key, const es_tree_node *n) { return rkey_cmp(key, sess_mref(n)); }
static int cmp_ref_sess(const es_tree_node *x, const es_tree_node *y) {
  const mref *a = sess_mref(x);
  rkey k = {ref_session(a), a->data};
  return rkey_cmp(&k, sess_mref(y));
}

static mref *ref_find(const es_backend *b, const char *name) {
  es_tree_node *n = es_tree_seek(&b->refs, probe_ref, name, 0);
  return n && probe_ref(name, n) == 0 ? (mref *)n : NULL;
}

static void ref_view(const mref *m, es_ref *v) {
  es_ref_init(v); /* parent and at are the core's to fill */
  v->name = (char *)m->data;
  v->session = (char *)ref_session(m);
  v->head = ES_NONE;  /* not stored: the core reads it from the session row */
  v->created_at = m->created_at;
  v->updated_at = m->updated_at;
}

static void ref_link(es_backend *b, mref *m) {
  es_tree_insert(&b->refs, &m->node);
  es_tree_insert(&b->refs_by_sess, &m->by_sess);
  m->linked = 1;
}
static void ref_unlink(es_backend *b, mref *m) {
  es_tree_remove(&b->refs, &m->node);
  es_tree_remove(&b->refs_by_sess, &m->by_sess);
  m->linked = 0;
}

static int mem_ref_get(es_backend *b, es_txn *t, const char *name, es_ref *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  mref *m = name ? ref_find(t->b, name) : NULL;
  if (!m) return ES_NOT_FOUND;
  es_ref v;
  ref_view(m, &v);
  return es_ref_copy(out, &v) == ES_OK ? ES_OK : oom(err);
}

static int mem_ref_put(es_backend *b, es_txn *t, const es_ref *row, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!row->name || !row->session)
    return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: a ref needs a name and a session");
  size_t ln = strlen(row->name) + 1, ls = strlen(row->session) + 1;
  mref *m = NULL;
  if (undo_reserve(b, 1) != 0 || !(m = malloc(sizeof *m + ln + ls))) {
    free(m);
    return oom(err);
  }
  m->created_at = row->created_at;
  m->updated_at = row->updated_at;
  memcpy(m->data, row->name, ln);
  memcpy(m->data + ln, row->session, ls);
  mref *old = ref_find(b, row->name);
  if (old) ref_unlink(b, old);
  ref_link(b, m);
  urec *u = undo_push(b, U_REF_PUT, NULL);
  u->old = old;
  u->neu = m;
  return ES_OK;
}

static int mem_ref_delete(es_backend *b, es_txn *t, const char *name, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mref *m = name ? ref_find(b, name) : NULL;
  if (!m) return ES_NOT_FOUND;
  if (undo_reserve(b, 1) != 0) return oom(err);
  ref_unlink(b, m);
  urec *u = undo_push(b, U_REF_DEL, NULL);
  u->old = m;
  return ES_OK;
}

/* O((k + 1) log R), k = refs naming the session: counted first (one undo
 * step each, reserved at once), then unlinked one by one. */
static int mem_ref_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!session) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: no session name");
  rkey key = {session, ""};
  es_tree_iter it;
  size_t k = 0;
  for (es_tree_node *n = es_tree_iter_seek(&it, &b->refs_by_sess, probe_ref_sess, &key, 0);
       n && strcmp(ref_session(sess_mref(n)), session) == 0; n = es_tree_iter_next(&it))
    k++;
  if (!k) return ES_OK;
  if (undo_reserve(b, k) != 0) return oom(err);
  es_tree_node *n;
  while ((n = es_tree_seek(&b->refs_by_sess, probe_ref_sess, &key, 0)) &&
         strcmp(ref_session(sess_mref(n)), session) == 0) {
    mref *m = (mref *)sess_mref(n);
    ref_unlink(b, m);
    urec *u = undo_push(b, U_REF_DEL, NULL);
    u->old = m;
  }
  return ES_OK;
}

static void undo_ref(es_backend *b, urec *u) {
  if (u->kind == U_REF_PUT) {
    ref_unlink(b, u->neu);
    free(u->neu);
  }
  if (u->old) ref_link(b, u->old);
}

/* O(log r + k). Chunked like mem_session_list; a ref a callback replaced is
 * read again by name before its turn (its old block lives until commit), a
 * ref it deleted is skipped. */
static int mem_ref_list(es_backend *b, es_txn *t, const char *after, int64_t limit, es_ref_cb cb,
                        void *ctx, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  (void)err;
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  const char *key = after ? after : "";
  int strict = after != NULL;
  es_tree_iter it;
  for (;;) {
    mref *chunk[CHUNK];
    int n = 0;
    for (es_tree_node *nd = es_tree_iter_seek(&it, &b->refs, probe_ref, key, strict);
         nd && n < CHUNK; nd = es_tree_iter_next(&it))
      chunk[n++] = (mref *)nd;
    for (int i = 0; i < n; i++) {
      mref *m = chunk[i];
      if (!m->linked && !(m = ref_find(b, m->data))) continue;
      es_ref v;
      ref_view(m, &v);
      if (cb(ctx, &v)) return ES_OK;
      if (limit != ES_NONE && --limit == 0) return ES_OK;
    }
    if (n < CHUNK) return ES_OK;
    key = chunk[n - 1]->data;
    strict = 1;
  }
}

/* ---- crypto-shredding (§3.10) -------------------------------------------- */

/* A key row: one block, replaced (never changed) by a put, like a ref. */
typedef struct mkey {
  es_tree_node node;     /* first: in es_backend.keys by name while current */
  int64_t created_at, shredded_at;
  size_t wrapped_len;
  unsigned char has_wrapped;
  char data[];           /* name NUL [wrapped bytes] */
} mkey;

/* A key use: (key, session) -> first_index, in two trees. */
typedef struct muse {
  es_tree_node by_key;   /* first: in es_backend.uses by (key, session) */
  es_tree_node by_sess;  /* in es_backend.uses_by_sess by (session, key) */
  int64_t first_index;
  char data[];           /* key NUL session NUL */
} muse;

static int probe_key(const void *key, const es_tree_node *n) { return strcmp(key, ((const mkey *)n)->data); }
static int cmp_key(const es_tree_node *x, const es_tree_node *y) {
  return strcmp(((const mkey *)x)->data, ((const mkey *)y)->data);
}

typedef struct ukey {
  const char *a, *b;  /* (key, session) in uses; (session, key) in uses_by_sess */
} ukey;
static const char *use_session(const muse *m) { return m->data + strlen(m->data) + 1; }
static const muse *sess_muse(const es_tree_node *n) {
  return (const muse *)((const char *)n - offsetof(muse, by_sess));
}
static int probe_use(const void *key, const es_tree_node *n) {
  const ukey *k = key;
  const muse *m = (const muse *)n;
  int c = strcmp(k->a, m->data);
  return c ? c : strcmp(k->b, use_session(m));
}
static int cmp_use(const es_tree_node *x, const es_tree_node *y) {
  const muse *m = (const muse *)x;
  ukey k = {m->data, use_session(m)};
  return probe_use(&k, y);
}
static int probe_use_sess(const void *key, const es_tree_node *n) {
  const ukey *k = key;
  const muse *m = sess_muse(n);
  int c = strcmp(k->a, use_session(m));
  return c ? c : strcmp(k->b, m->data);
}
static int cmp_use_sess(const es_tree_node *x, const es_tree_node *y) {
  const muse *m = sess_muse(x);
  ukey k = {use_session(m), m->data};
  return probe_use_sess(&k, y);
}

/* Frees a replaced key block, its wrapped key wiped first (the memory
 * allocator would hand the bytes to the next malloc as they are). */
static void key_block_free(void *p) {
  mkey *m = p;
  if (!m) return;
  volatile unsigned char *w = (volatile unsigned char *)m->data + strlen(m->data) + 1;
  for (size_t i = 0; i < m->wrapped_len; i++) w[i] = 0;
  free(m);
}

static mkey *key_find(const es_backend *b, const char *name) {
  es_tree_node *n = es_tree_seek(&b->keys, probe_key, name, 0);
  return n && probe_key(name, n) == 0 ? (mkey *)n : NULL;
}

static int mem_key_get(es_backend *b, es_txn *t, const char *name, es_key_row *out, es_err *err) {
  (void)b; /* t carries it (t->b) */
  memset(out, 0, sizeof *out);
  mkey *m = name ? key_find(t->b, name) : NULL;
  if (!m) return ES_NOT_FOUND;
  size_t ln = strlen(m->data) + 1;
  out->name = strdup(m->data);
  out->created_at = m->created_at;
  out->shredded_at = m->shredded_at;
  if (m->has_wrapped) {
    out->wrapped = malloc(m->wrapped_len ? m->wrapped_len : 1);
    if (out->wrapped) memcpy(out->wrapped, m->data + ln, m->wrapped_len);
    out->wrapped_len = m->wrapped_len;
  }
  if (!out->name || (m->has_wrapped && !out->wrapped)) {
    es_key_row_destroy(out);
    return oom(err);
  }
  return ES_OK;
}

static int mem_key_put(es_backend *b, es_txn *t, const es_key_row *row, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!row->name) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: a key needs a name");
  size_t ln = strlen(row->name) + 1, lw = row->wrapped ? row->wrapped_len : 0;
  mkey *m = NULL;
  if (undo_reserve(b, 1) != 0 || !(m = malloc(sizeof *m + ln + lw))) {
    free(m);
    return oom(err);
  }
  m->created_at = row->created_at;
  m->shredded_at = row->shredded_at;
  m->has_wrapped = row->wrapped != NULL;
  m->wrapped_len = lw;
  memcpy(m->data, row->name, ln);
  if (lw) memcpy(m->data + ln, row->wrapped, lw);
  mkey *old = key_find(b, row->name);
  if (old) es_tree_remove(&b->keys, &old->node);
  es_tree_insert(&b->keys, &m->node);
  urec *u = undo_push(b, U_KEY_PUT, NULL);
  u->old = old;
  u->neu = m;
  return ES_OK;
}

static muse *use_find(const es_backend *b, const char *key, const char *session) {
  ukey k = {key, session};
  es_tree_node *n = es_tree_seek(&b->uses, probe_use, &k, 0);
  return n && probe_use(&k, n) == 0 ? (muse *)n : NULL;
}
static void use_link(es_backend *b, muse *m) {
  es_tree_insert(&b->uses, &m->by_key);
  es_tree_insert(&b->uses_by_sess, &m->by_sess);
}
static void use_unlink(es_backend *b, muse *m) {
  es_tree_remove(&b->uses, &m->by_key);
  es_tree_remove(&b->uses_by_sess, &m->by_sess);
}

static int mem_key_use_put(es_backend *b, es_txn *t, const char *key, const char *session,
                           int64_t first_index, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!key || !session) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: a key use needs a key and a session");
  muse *old = use_find(b, key, session);
  if (old && old->first_index <= first_index) return ES_OK;
  size_t lk = strlen(key) + 1, ls = strlen(session) + 1;
  muse *m = NULL;
  if (undo_reserve(b, 1) != 0 || !(m = malloc(sizeof *m + lk + ls))) {
    free(m);
    return oom(err);
  }
  m->first_index = first_index;
  memcpy(m->data, key, lk);
  memcpy(m->data + lk, session, ls);
  if (old) use_unlink(b, old);
  use_link(b, m);
  urec *u = undo_push(b, U_USE_PUT, NULL);
  u->old = old;
  u->neu = m;
  return ES_OK;
}

/* The rows are gathered before the first callback: a callback may write. */
static int mem_key_use_list(es_backend *b, es_txn *t, const char *key, es_key_use_cb cb, void *ctx,
                            es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  if (!key) return ES_OK;
  ukey k = {key, ""};
  es_tree_iter it;
  muse **v = NULL;
  size_t n = 0, cap = 0;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->uses, probe_use, &k, 0);
       nd && strcmp(((muse *)nd)->data, key) == 0; nd = es_tree_iter_next(&it)) {
    muse **g = grow(v, &cap, n + 1, sizeof *v);
    if (!g) {
      free(v);
      return oom(err);
    }
    v = g;
    v[n++] = (muse *)nd;
  }
  for (size_t i = 0; i < n; i++)
    if (cb(ctx, use_session(v[i]), v[i]->first_index)) break;
  free(v);
  return ES_OK;
}

static int mem_key_use_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  if (!session) return es_fail(err, ES_INVALID_ARGUMENT, "memory backend: no session name");
  ukey k = {session, ""};
  es_tree_iter it;
  size_t n = 0;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->uses_by_sess, probe_use_sess, &k, 0);
       nd && strcmp(use_session(sess_muse(nd)), session) == 0; nd = es_tree_iter_next(&it))
    n++;
  if (!n) return ES_OK;
  if (undo_reserve(b, n) != 0) return oom(err);
  es_tree_node *nd;
  while ((nd = es_tree_seek(&b->uses_by_sess, probe_use_sess, &k, 0)) &&
         strcmp(use_session(sess_muse(nd)), session) == 0) {
    muse *m = (muse *)sess_muse(nd);
    use_unlink(b, m);
    urec *u = undo_push(b, U_USE_DEL, NULL);
    u->old = m;
  }
  return ES_OK;
}

static void undo_key_use(es_backend *b, urec *u) {
  if (u->kind == U_KEY_PUT) {
    es_tree_remove(&b->keys, &((mkey *)u->neu)->node);
    key_block_free(u->neu);
    if (u->old) es_tree_insert(&b->keys, &((mkey *)u->old)->node);
    return;
  }
  if (u->kind == U_USE_PUT) {
    use_unlink(b, u->neu);
    free(u->neu);
  }
  if (u->old) use_link(b, u->old);
}

/* The kept snapshots move to a new array (made first: undo must not
 * allocate); the old array and the removed blocks stay in the log until
 * commit frees them (snap_del_from_commit), so undo puts the old array
 * back as it was. */
static int mem_snapshot_delete_from(es_backend *b, es_txn *t, const char *session, int64_t index,
                                    es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  msess *s = sess_find(t, session);
  if (!s || !s->nsnaps) return ES_OK;
  size_t keep = 0;
  for (size_t i = 0; i < s->nsnaps; i++) keep += s->snaps[i]->index < index;
  if (keep == s->nsnaps) return ES_OK;
  msnap **v = NULL;
  if (undo_reserve(b, 2) != 0 || (keep && !(v = malloc(keep * sizeof *v)))) return oom(err);
  size_t k = 0;
  for (size_t i = 0; i < s->nsnaps; i++)
    if (s->snaps[i]->index < index) v[k++] = s->snaps[i];
  urec *u = undo_push(b, U_SNAP_DEL_FROM, s);
  u->old = s->snaps;
  u->old_due = (int64_t)s->nsnaps;
  u->aux = index;
  s->snaps = v;
  s->nsnaps = s->capsnaps = keep;
  if (!keep) sess_gc(b, s);
  return ES_OK;
}

static void undo_snap_del_from(urec *u) {
  msess *s = u->obj;
  free(s->snaps); /* holds only kept blocks (and puts undone before this step) */
  s->snaps = u->old;
  s->nsnaps = s->capsnaps = (size_t)u->old_due;
}

static void snap_del_from_commit(urec *u) {
  msnap **v = u->old;
  for (int64_t k = 0; k < u->old_due; k++)
    if (v[k]->index >= u->aux) free(v[k]);
  free(v);
}

/* ---- projections (§8) --------------------------------------------------- */

/* A projection row: one block, replaced (never changed) by a put, like a
 * ref, so undo re-links the old block and commit frees it. */
typedef struct mproj {
  es_tree_node node;   /* first: in es_backend.projs by (ns, key) while current */
  unsigned char linked;
  size_t klen, vlen;   /* key and value bytes (no NUL counted) */
  char data[];         /* ns NUL key NUL value NUL */
} mproj;

typedef struct projkey {
  const char *ns, *key;
} projkey;

static const char *proj_key(const mproj *m) { return m->data + strlen(m->data) + 1; }
static const char *proj_value(const mproj *m) { return proj_key(m) + m->klen + 1; }

static int projkey_cmp(const projkey *k, const mproj *m) {
  int c = strcmp(k->ns, m->data);
  return c ? c : strcmp(k->key, proj_key(m));
}
static int probe_proj(const void *key, const es_tree_node *n) { return projkey_cmp(key, (const mproj *)n); }
static int cmp_proj(const es_tree_node *x, const es_tree_node *y) {
  const mproj *a = (const mproj *)x;
  projkey k = {a->data, proj_key(a)};
  return projkey_cmp(&k, (const mproj *)y);
}

static mproj *proj_find(const es_backend *b, const char *ns, const char *key) {
  projkey k = {ns, key};
  es_tree_node *n = es_tree_seek(&b->projs, probe_proj, &k, 0);
  return n && probe_proj(&k, n) == 0 ? (mproj *)n : NULL;
}

static void proj_link(es_backend *b, mproj *m) {
  es_tree_insert(&b->projs, &m->node);
  m->linked = 1;
}
static void proj_unlink(es_backend *b, mproj *m) {
  es_tree_remove(&b->projs, &m->node);
  m->linked = 0;
}

static int mem_proj_get(es_backend *b, es_txn *t, const char *ns, const char *key, char **value,
                        size_t *len, es_err *err) {
  (void)b; /* t carries it (t->b) */
  mproj *m = proj_find(t->b, ns, key);
  *value = NULL;
  *len = 0;
  if (!m) return ES_NOT_FOUND;
  char *v = malloc(m->vlen + 1);
  if (!v) return oom(err);
  memcpy(v, proj_value(m), m->vlen + 1);
  *value = v;
  *len = m->vlen;
  return ES_OK;
}

static int mem_proj_put(es_backend *b, es_txn *t, const char *ns, const char *key, const char *value,
                        size_t len, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  mproj *old = proj_find(b, ns, key), *m = NULL;
  if (!value && !old) return ES_OK;
  size_t ln = strlen(ns) + 1, lk = strlen(key);
  if (undo_reserve(b, 1) != 0 || (value && !(m = malloc(sizeof *m + ln + lk + len + 2)))) {
    free(m);
    return oom(err);
  }
  if (m) {
    m->klen = lk;
    m->vlen = len;
    memcpy(m->data, ns, ln);
    memcpy(m->data + ln, key, lk + 1);
    memcpy(m->data + ln + lk + 1, value, len);
    m->data[ln + lk + 1 + len] = 0;
  }
  if (old) proj_unlink(b, old);
  if (m) proj_link(b, m);
  urec *u = undo_push(b, m ? U_PROJ_PUT : U_PROJ_DEL, NULL);
  u->old = old;
  u->neu = m;
  return ES_OK;
}

static void undo_proj(es_backend *b, urec *u) {
  if (u->neu) {
    proj_unlink(b, u->neu);
    free(u->neu);
  }
  if (u->old) proj_link(b, u->old);
}

/* Chunked like mem_ref_list (the tree may not change under a walk, and
 * callbacks do not write, but a chunk costs nothing more). */
static int mem_proj_list(es_backend *b, es_txn *t, const char *ns, const char *prefix,
                         const char *after, int64_t limit, es_proj_cb cb, void *ctx, es_err *err) {
  (void)t; /* the backend (b) is all it needs */
  (void)err;
  const char *pre = prefix ? prefix : "";
  size_t plen = strlen(pre);
  if (limit != ES_NONE && limit <= 0) return ES_OK;
  projkey k = {ns, pre};
  int strict = 0;
  if (after && strcmp(after, pre) >= 0) {
    k.key = after;
    strict = 1;
  }
  es_tree_iter it;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->projs, probe_proj, &k, strict); nd;
       nd = es_tree_iter_next(&it)) {
    mproj *m = (mproj *)nd;
    if (strcmp(m->data, ns) != 0 || strncmp(proj_key(m), pre, plen) != 0) break;
    if (cb(ctx, proj_key(m), proj_value(m), m->vlen)) break;
    if (limit != ES_NONE && --limit == 0) break;
  }
  return ES_OK;
}

/* O((k + 1) log P): counted first (one undo step each, reserved at once). */
static int mem_proj_drop(es_backend *b, es_txn *t, const char *ns, es_err *err) {
  int rc;
  if ((rc = check_write(t, err))) return rc;
  projkey k = {ns, ""};
  es_tree_iter it;
  size_t n = 0;
  for (es_tree_node *nd = es_tree_iter_seek(&it, &b->projs, probe_proj, &k, 0);
       nd && strcmp(((mproj *)nd)->data, ns) == 0; nd = es_tree_iter_next(&it))
    n++;
  if (!n) return ES_OK;
  if (undo_reserve(b, n) != 0) return oom(err);
  es_tree_node *nd;
  while ((nd = es_tree_seek(&b->projs, probe_proj, &k, 0)) && strcmp(((mproj *)nd)->data, ns) == 0) {
    proj_unlink(b, (mproj *)nd);
    urec *u = undo_push(b, U_PROJ_DEL, NULL);
    u->old = nd;
  }
  return ES_OK;
}

/* ---- undo dispatch ------------------------------------------------------ */

static void undo_one(es_backend *b, urec *u) {
  switch (u->kind) {
    case U_EV_INSERT: undo_insert(b, u); break;
    case U_EV_UPDATE: undo_update(b, u); break;
    case U_SESS_PUT: {
      msess *s = u->obj;
      es_session_info *cur = s->info;
      sess_swap_info(b, s, u->old);
      free(cur);
      if (u->created) sess_unpublish(b, s);
      break;
    }
    case U_REF_PUT:
    case U_REF_DEL: undo_ref(b, u); break;
    case U_SNAP_PUT: undo_snap(b, u); break;
    case U_EV_DELETE: undo_delete(b, u); break;
    case U_SNAP_DEL: undo_snap_del(u); break;
    case U_SESS_DETACH: ((msess *)u->obj)->detached = 0; break;
    case U_SEG: undo_seg(b, u); break;
    case U_KEY_PUT:
    case U_USE_PUT:
    case U_USE_DEL: undo_key_use(b, u); break;
    case U_SNAP_DEL_FROM: undo_snap_del_from(u); break;
    case U_PROJ_PUT:
    case U_PROJ_DEL: undo_proj(b, u); break;
    default: undo_pres(b, u); break;
  }
}

const es_backend_ops es_backend_memory = {
    .scheme = "memory",
    .group_commit = 0,
    .open = mem_open,
    .close = mem_close,
    .write_begin = mem_write_begin,
    .write_commit = mem_write_commit,
    .write_rollback = mem_write_rollback,
    .savepoint = mem_savepoint,
    .savepoint_release = mem_savepoint_release,
    .savepoint_rollback = mem_savepoint_rollback,
    .read_begin = mem_read_begin,
    .read_end = mem_read_end,
    .session_get = mem_session_get,
    .session_put = mem_session_put,
    .session_list = mem_session_list,
    .session_children = mem_session_children,
    .event_get = mem_event_get,
    .event_get_by_id = mem_event_get_by_id,
    .event_insert = mem_event_insert,
    .event_update = mem_event_update,
    .event_range = mem_event_range,
    .event_all = mem_event_all,
    .last_position = mem_last_position,
    .lane_next = mem_lane_next,
    .queued_due = mem_queued_due,
    .queued_next_due = mem_queued_next_due,
    .queued_due_type = mem_queued_due_type,
    .queued_next_due_type = mem_queued_next_due_type,
    .pending_types = mem_pending_types,
    .dead_list = mem_dead_list,
    .snapshot_get = mem_snapshot_get,
    .snapshot_put = mem_snapshot_put,
    .snapshot_list = mem_snapshot_list,
    .ref_get = mem_ref_get,
    .ref_put = mem_ref_put,
    .ref_delete = mem_ref_delete,
    .ref_list = mem_ref_list,
    .presence_get = mem_presence_get,
    .presence_put = mem_presence_put,
    .presence_expire = mem_presence_expire,
    .presence_list = mem_presence_list,
    .event_delete_range = mem_event_delete_range,
    .session_delete = mem_session_delete,
    .fence_floor_get = mem_fence_floor_get,
    .fence_floor_put = mem_fence_floor_put,
    .snapshot_delete_all = mem_snapshot_delete_all,
    .ref_delete_session = mem_ref_delete_session,
    .key_get = mem_key_get,
    .key_put = mem_key_put,
    .key_use_put = mem_key_use_put,
    .key_use_list = mem_key_use_list,
    .key_use_delete_session = mem_key_use_delete_session,
    .snapshot_delete_from = mem_snapshot_delete_from,
    .scrub = NULL,
    .data_version = NULL,
    .segment_list = mem_segment_list,
    .segment_sessions = mem_segment_sessions,
    .segment_put = mem_segment_put,
    .segment_delete = mem_segment_delete,
    .counts = mem_counts,
    .max_payload = mem_max_payload,
    .proj_get = mem_proj_get,
    .proj_put = mem_proj_put,
    .proj_list = mem_proj_list,
    .proj_drop = mem_proj_drop,
};
