/*
 * watchdog.c: deadlines for blocking calls on a socket (watchdog.h).
 */
#include "util/watchdog.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "util/clock.h"

struct es_watchdog {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int started;
  int stopping;
  int64_t wake_ms;                 /* when the thread wakes next (INT64_MAX: when told) */
  es_wd_slot *armed;               /* a list, oldest first (every slot has one time limit) */
};

static int64_t wd_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wd_unlink(es_watchdog *w, es_wd_slot *s) {
  if (s->prev) s->prev->next = s->next;
  else w->armed = s->next;
  if (s->next) s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->armed = 0;
}

static void *wd_main(void *arg) {
  es_watchdog *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->stopping) {
    /* the earliest deadline: slots may carry different limits, so scan */
    es_wd_slot *first = NULL;
    for (es_wd_slot *s = w->armed; s; s = s->next)
      if (!first || s->due_ms < first->due_ms) first = s;
    if (!first) {
      w->wake_ms = INT64_MAX;
      pthread_cond_wait(&w->cv, &w->mu);
      continue;
    }
    int64_t left = first->due_ms - wd_now_ms();
    if (left <= 0) {
      /* under the mutex: the owner cannot disarm (and then close fd)
       * meanwhile, so fd is still the call's socket */
      first->fired = 1;
      shutdown(first->fd, SHUT_RDWR);
      wd_unlink(w, first);
      continue;
    }
    w->wake_ms = first->due_ms;
    struct timespec until = es_timespec_in(CLOCK_MONOTONIC, left);
    pthread_cond_clockwait(&w->cv, &w->mu, CLOCK_MONOTONIC, &until);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

es_watchdog *es_watchdog_new(void) {
  es_watchdog *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->wake_ms = INT64_MAX;
  return w;
}

void es_watchdog_free(es_watchdog *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->started) pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

int es_watchdog_arm(es_watchdog *w, es_wd_slot *s, int fd, int64_t ms) {
  s->fired = 0;
  if (!w || fd < 0) return -1;
  pthread_mutex_lock(&w->mu);
  if (!w->started) {
    if (pthread_create(&w->thread, NULL, wd_main, w) != 0) {
      pthread_mutex_unlock(&w->mu);
      return -1;
    }
    w->started = 1;
  }
  if (s->armed) wd_unlink(w, s);
  s->fd = fd;
  s->due_ms = wd_now_ms() + ms;
  s->prev = NULL;
  s->next = w->armed;
  if (w->armed) w->armed->prev = s;
  w->armed = s;
  s->armed = 1;
  /* a thread asleep until an earlier deadline wakes then and sees this
   * one (a busy connection arms and disarms without waking it); only a
   * later or no wake-up must be brought forward */
  if (s->due_ms < w->wake_ms) pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int es_watchdog_disarm(es_watchdog *w, es_wd_slot *s) {
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  if (s->armed) wd_unlink(w, s);
  int fired = s->fired;
  s->fired = 0;
  pthread_mutex_unlock(&w->mu);
  return fired;
}

int es_watchdog_fired(es_watchdog *w, const es_wd_slot *s) {
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int fired = s->fired;
  pthread_mutex_unlock(&w->mu);
  return fired;
}
