/*
 * backend_txn.h: for the C tests that call a backend's ops directly
 * (store/backend.h). Every op takes its backend first, but these tests'
 * helpers pass only a transaction around (as the core once did), so the
 * backend is found from the transaction: each transaction a test begins
 * goes through tx_write_begin / tx_read_begin / tx_claim_begin, which note
 * its backend, and BK(t) looks it up. Header-only, thread-safe (tests
 * begin transactions on several threads).
 */
#ifndef ES_SPEC_BACKEND_TXN_H
#define ES_SPEC_BACKEND_TXN_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/backend.h"

/* An address belongs to one live transaction at a time, so the latest
 * note for an address is the right one: notes are replaced, never removed
 * (a backend's read transactions may share one address, as memory's do). */
typedef struct {
  es_txn *t;
  es_backend *b;
} tx_note_entry;

static pthread_mutex_t tx_notes_mu = PTHREAD_MUTEX_INITIALIZER;
static tx_note_entry *tx_notes;
static size_t tx_notes_n, tx_notes_cap;

static inline void tx_note(es_txn *t, es_backend *b) {
  pthread_mutex_lock(&tx_notes_mu);
  for (size_t i = 0; i < tx_notes_n; i++)
    if (tx_notes[i].t == t) {
      tx_notes[i].b = b;
      pthread_mutex_unlock(&tx_notes_mu);
      return;
    }
  if (tx_notes_n == tx_notes_cap) {
    tx_notes_cap = tx_notes_cap ? 2 * tx_notes_cap : 64;
    tx_notes = realloc(tx_notes, tx_notes_cap * sizeof *tx_notes);
    if (!tx_notes) {
      printf("# backend_txn.h: out of memory\n");
      exit(2);
    }
  }
  tx_notes[tx_notes_n++] = (tx_note_entry){t, b};
  pthread_mutex_unlock(&tx_notes_mu);
}

/* The backend of a transaction a test began; a transaction begun without
 * tx_*_begin is the test's bug: it stops the test. */
static inline es_backend *BK(es_txn *t) {
  es_backend *b = NULL;
  pthread_mutex_lock(&tx_notes_mu);
  for (size_t i = 0; i < tx_notes_n && !b; i++)
    if (tx_notes[i].t == t) b = tx_notes[i].b;
  pthread_mutex_unlock(&tx_notes_mu);
  if (!b) {
    printf("# backend_txn.h: a transaction begun without tx_*_begin\n");
    exit(2);
  }
  return b;
}

static inline int tx_write_begin(const es_backend_ops *ops, es_backend *b, es_txn **t,
                                 es_err *err) {
  int rc = ops->write_begin(b, t, err);
  if (rc == ES_OK) tx_note(*t, b);
  return rc;
}

static inline int tx_read_begin(const es_backend_ops *ops, es_backend *b, es_txn **t, es_err *err) {
  int rc = ops->read_begin(b, t, err);
  if (rc == ES_OK) tx_note(*t, b);
  return rc;
}

static inline int tx_claim_begin(const es_backend_ops *ops, es_backend *b, const char *const *skip,
                                 size_t n_skip, es_txn **t, es_err *err) {
  int rc = ops->claim_begin(b, skip, n_skip, t, err);
  if (rc == ES_OK) tx_note(*t, b);
  return rc;
}

#endif
