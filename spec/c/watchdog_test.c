/*
 * watchdog_test.c: deadlines for blocking calls on a socket
 * (core/util/watchdog.h), what the PostgreSQL backend uses so that a
 * server gone silent without closing fails a call instead of holding it
 * (docs/postgres.md "Deadlines"). A socketpair whose peer never writes
 * stands for the silent server: the call blocks in poll() with no limit,
 * as libpq's does, and only the watchdog can end it.
 */
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/watchdog.h"

#include "tap.h"

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Blocks until fd is readable (no limit); what recv() then says. */
static ssize_t wait_read(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  while (poll(&p, 1, -1) < 0) {
  }
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT);
}

int main(void) {
  es_watchdog *w = es_watchdog_new();
  ok(w != NULL, "a watchdog");
  int sv[2];
  ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "a socket pair (the peer stays silent)");

  /* A silent peer: the wait ends at the deadline, as an end of stream. */
  es_wd_slot s = {0};
  int64_t t0 = now_ms();
  ok(es_watchdog_arm(w, &s, sv[0], 200) == 0, "armed for 200 ms");
  ssize_t got = wait_read(sv[0]);
  int64_t took = now_ms() - t0;
  ok(got == 0, "the blocked wait woke with end of stream");
  ok(took >= 190, "not before the deadline");
  ok(took < 10000, "and not long after it (a hang would never end)");
  ok(es_watchdog_fired(w, &s) == 1, "fired says so while still armed");
  ok(es_watchdog_disarm(w, &s) == 1, "disarm says it fired");
  ok(es_watchdog_disarm(w, &s) == 0, "a second disarm: nothing armed");
  close(sv[0]);
  close(sv[1]);

  /* A peer that answers in time: disarmed before the deadline, the
   * socket is untouched. */
  ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "another pair");
  ok(es_watchdog_arm(w, &s, sv[0], 300) == 0, "armed for 300 ms");
  ok(write(sv[1], "x", 1) == 1, "the peer answers");
  ok(wait_read(sv[0]) == 1, "the answer is read");
  ok(es_watchdog_disarm(w, &s) == 0, "disarmed in time: not fired");
  /* past the old deadline (a probe slot armed after it, with a later
   * deadline, has fired), the socket still works both ways */
  int sp[2];
  es_wd_slot probe = {0};
  ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0 && es_watchdog_arm(w, &probe, sp[0], 400) == 0,
     "a probe armed for 400 ms");
  ok(wait_read(sp[0]) == 0 && es_watchdog_disarm(w, &probe) == 1, "the probe fired");
  ok(write(sv[0], "y", 1) == 1 && write(sv[1], "z", 1) == 1 && wait_read(sv[0]) == 1,
     "a disarmed socket is never shut down later");
  close(sp[0]);
  close(sp[1]);

  /* Two slots, a later one armed first: the earlier deadline still
   * fires first (the thread is woken for it). */
  int sw[2];
  ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sw) == 0, "a third pair");
  es_wd_slot late = {0}, early = {0};
  ok(es_watchdog_arm(w, &late, sv[0], 5000) == 0 && es_watchdog_arm(w, &early, sw[0], 100) == 0,
     "a 5 s slot, then a 100 ms one");
  t0 = now_ms();
  ok(wait_read(sw[0]) == 0 && now_ms() - t0 < 4000, "the 100 ms slot fired without waiting for the 5 s one");
  ok(es_watchdog_disarm(w, &late) == 0, "the 5 s slot had not fired");
  ok(es_watchdog_disarm(w, &early) == 1, "the 100 ms slot had");
  close(sv[0]);
  close(sv[1]);
  close(sw[0]);
  close(sw[1]);

  es_watchdog_free(w);
  es_watchdog_free(NULL);
  ok(1, "freed (the thread stopped and joined)");
  return tap_done();
}
