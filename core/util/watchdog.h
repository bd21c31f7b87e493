/*
 * watchdog.h: deadlines for blocking calls on a socket. A call that waits
 * on a peer (a PostgreSQL round trip) arms a slot with its socket and a
 * time limit; if the slot is still armed when the time is up, a thread of
 * the watchdog shuts the socket down (shutdown(2), both ways), which wakes
 * the call with "end of stream" and makes it fail as on a dropped
 * connection. That covers the peer that goes silent without closing
 * (a network that drops every packet, a stalled relay), which TCP itself
 * never reports while the kernel at the other end still acknowledges;
 * and it needs no change to the library doing the wait (libpq's blocking
 * calls poll() with no timeout of their own).
 *
 * The thread starts at the first arm and is stopped by es_watchdog_free.
 * Arming and disarming are a mutex each; the thread is signalled only when
 * it has nothing armed, so a busy connection costs no wake-ups.
 */
#ifndef ES_WATCHDOG_H
#define ES_WATCHDOG_H

#include <stdint.h>

typedef struct es_watchdog es_watchdog;

/* One armed call: embedded in its owner (no allocation); zero it first. */
typedef struct es_wd_slot {
  int fd;
  int armed;
  int fired;                       /* the deadline passed: fd was shut down */
  int64_t due_ms;                  /* monotonic */
  struct es_wd_slot *next, *prev;
} es_wd_slot;

/* NULL when out of memory. */
es_watchdog *es_watchdog_new(void);
/* Stops the thread (if any). No slot may be armed. NULL is a no-op. */
void es_watchdog_free(es_watchdog *w);
/* Arms s: fd is shut down if s is still armed ms from now. When the
 * thread cannot be started, the call goes without a deadline (returns -1). */
int es_watchdog_arm(es_watchdog *w, es_wd_slot *s, int fd, int64_t ms);
/* Disarms s (a no-op when it is not armed); 1 when its deadline had
 * passed and its socket was shut down, else 0. */
int es_watchdog_disarm(es_watchdog *w, es_wd_slot *s);
/* Whether s's deadline passed while it is still armed (the call it
 * guards, woken by the shutdown, may look before disarming). */
int es_watchdog_fired(es_watchdog *w, const es_wd_slot *s);

#endif
