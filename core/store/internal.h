/*
 * internal.h: the store's insides, shared by the files of core/store/
 * (store.c: the rules; archive.c: segment files, §3.9; crypto.c: sealed
 * payloads and shredding, §3.10; tenant.c: tenant handles, §3.11). Not a
 * public header: bindings and the engine use store.h only.
 */
#ifndef ES_STORE_INTERNAL_H
#define ES_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "store/backend.h"

typedef struct group_waiter {
  int done;
  int rc;
  es_err err;
  struct group_waiter *next;
} group_waiter;

typedef struct presence_watch {
  uint64_t token;
  char *ns;
  es_presence_cb cb;
  void *ctx;
  struct presence_watch *next;
} presence_watch;

struct es_store {
  const es_backend_ops *ops;
  es_backend *bk;
  es_clock_fn clock;
  void *clock_ctx;
  es_id_fn ids;              /* NULL: UUIDv7 */
  void *ids_ctx;
  size_t max_payload;
  size_t max_batch;

  /* lifecycle */
  pthread_mutex_t lmu;       /* guards closed, inflight */
  pthread_cond_t lcond;      /* inflight reached 0 */
  int closed;
  int inflight;
  atomic_int refs;

  /* writes */
  pthread_mutex_t wmu;       /* one writer in the backend at a time */
  pthread_cond_t wcond;      /* a group committed */
  atomic_int arriving;       /* writers waiting for wmu: the group waits for them */
  es_txn *wtxn;              /* the open group transaction, or NULL */
  group_waiter *members;     /* callers whose work is in wtxn */
  int n_members;

  /* change notification (es_store_wait, subscriptions) */
  pthread_mutex_t vmu;
  pthread_cond_t vcond;      /* broadcast after every commit */
  atomic_uint_least64_t version;

  /* UUIDv7 generation: strictly increasing within this handle */
  pthread_mutex_t umu;
  int64_t uuid_ms;
  uint32_t uuid_seq;         /* 12-bit counter within one millisecond */
  unsigned char rand_pool[4000];
  size_t rand_used;          /* bytes of rand_pool already handed out */

  /* presence watchers */
  pthread_mutex_t pmu;
  presence_watch *watches;
  uint64_t next_token;

  /* §3.9 archive (archive.c): NULL when the store was opened without one */
  char *archive_dir;         /* owned, absolute or as given; created at open */

  /* §3.10 crypto-shredding (crypto.c): NULL when opened without keys */
  struct es_crypto *crypto;  /* owned: the master key and its check */

  /* §3.11 tenants (tenant.c). A tenant handle is an es_store whose base is
   * the store it was made from: every es_store_* call on it maps names
   * (tenant_prefix + name) and calls the base. Only base, tenant_*, refs
   * and the t_closed flag are used in a tenant handle. */
  es_store *base;            /* retained; NULL: a store, not a tenant handle */
  char *tenant_prefix;       /* owned: tenant name + ES_TENANT_SEP */
  size_t tenant_len;         /* strlen(tenant_prefix) */
  atomic_int t_closed;       /* a tenant handle's own close() */
};


/* Every call is bracketed by enter/leave so close() can wait for it.
 * enter: ES_OK or ES_CLOSED. */
int es_core_enter(es_store *s, es_err *err);
void es_core_leave(es_store *s);

/* A unit of work inside a backend transaction. */
typedef int (*txn_fn)(es_store *s, es_txn *t, void *arg, es_err *err);
/* Runs fn in a write transaction (a savepoint of the open group on
 * group-commit backends) and returns once it is committed (durable), or
 * failed with nothing written. fn runs with the write lock held: one write
 * at a time per store (and, on SQLite, per file across processes). */
int es_core_write(es_store *s, txn_fn fn, void *arg, es_err *err);
/* Runs fn in a read transaction (a consistent view of committed data). */
int es_core_read(es_store *s, txn_fn fn, void *arg, es_err *err);
/* Runs fn with the write lock held and no transaction open (an open group
 * is committed first): for backend work that cannot run inside one, like
 * SQLite's WAL checkpoint after a shred (§3.10). */
int es_core_outside_txn(es_store *s, int (*fn)(es_store *s, void *arg, es_err *err), void *arg,
                        es_err *err);

#endif
