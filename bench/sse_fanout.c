/*
 * sse_fanout.c: many Server-Sent Events clients on one session of a running
 * `eventstore serve` (bench/http_bench.sh; bench/README.md, "HTTP (issue
 * 13)"). Opens CLIENTS streams on GET /v1/sessions/SESSION/stream, each
 * from Last-Event-ID 0 (so no event can fall between "connected" and
 * "subscribed"), waits until every one has its 200 header, then a second
 * thread appends EVENTS events in batches of BATCH over one keep-alive
 * connection while this one reads every stream with epoll. Measures the
 * time from the first append until every client has seen index EVENTS
 * (the fan-out: CLIENTS x EVENTS events delivered), and each client's own
 * completion time.
 *
 *   sse_fanout HOST PORT TOKEN SESSION CLIENTS EVENTS [BATCH]
 *
 * C with epoll rather than Lua, so the clients are not what is measured.
 * Responses may be chunked (libmicrohttpd's for a stream of unknown
 * length): a small decoder strips the chunk framing before the SSE lines
 * are read. Prints a readable line and a machine-readable one:
 *   SSE clients events batch append_s all_s delivered_per_s p50_s p99_s dropped
 * Exit 1 when a client is dropped or an event never arrives (timeout).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_S 120.0 /* give up when the fan-out takes longer */
#define LINE_KEEP 32    /* bytes of a line kept: enough for "id: <int64>" */

typedef struct fan_opts {
  const char *host;
  int port;
  const char *token;
  const char *session;
  int clients;
  int64_t events;
  int batch;
} fan_opts;

/* The chunked-transfer decoder's state (RFC 9112 §7.1). */
enum { CH_SIZE, CH_EXT, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF, CH_END };

typedef struct fan_client {
  int fd;
  int headers_done; /* the response header was read */
  int status;       /* its status code */
  int chunked;      /* Transfer-Encoding: chunked */
  char head[4096];  /* the response header while it arrives */
  size_t head_len;
  int ch_state;     /* chunk decoder */
  uint64_t ch_left; /* bytes left in the current chunk */
  char line[LINE_KEEP]; /* the start of the SSE line being read */
  size_t line_len;
  int64_t last_id;  /* the highest id: seen */
  double done_at;   /* when last_id reached the last index; 0 before */
  int closed;       /* EOF or error before done */
} fan_client;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what) {
  fprintf(stderr, "sse_fanout: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int connect_to(const fan_opts *o) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)o->port);
  if (inet_pton(AF_INET, o->host, &a.sin_addr) != 1) {
    fprintf(stderr, "sse_fanout: HOST must be an IPv4 address, got '%s'\n", o->host);
    exit(2);
  }
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    p += w;
    n -= (size_t)w;
  }
}

/* One byte of the event stream (after the chunk framing): keeps the start
 * of each line and reads "id:" lines. */
static void sse_byte(fan_client *c, char ch, const fan_opts *o) {
  if (ch == '\n') {
    if (c->line_len >= 3 && memcmp(c->line, "id:", 3) == 0) {
      char num[LINE_KEEP];
      size_t n = c->line_len - 3;
      memcpy(num, c->line + 3, n);
      num[n] = '\0';
      int64_t id = strtoll(num[0] == ' ' ? num + 1 : num, NULL, 10);
      if (id > c->last_id) c->last_id = id;
      if (c->last_id >= o->events && c->done_at == 0) c->done_at = now_s();
    }
    c->line_len = 0;
  } else if (ch != '\r' && c->line_len < LINE_KEEP - 1) {
    c->line[c->line_len++] = ch;
  }
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

/* Body bytes of a response: through the chunk decoder when chunked. */
static void body_bytes(fan_client *c, const char *p, size_t n, const fan_opts *o) {
  if (!c->chunked) {
    for (size_t i = 0; i < n; i++) sse_byte(c, p[i], o);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char ch = p[i];
    switch (c->ch_state) {
    case CH_SIZE: {
      int h = hexval(ch);
      if (h >= 0) {
        c->ch_left = c->ch_left * 16 + (uint64_t)h;
      } else if (ch == ';') {
        c->ch_state = CH_EXT;
      } else if (ch == '\r') {
        c->ch_state = CH_SIZE_LF;
      } else if (ch == '\n') {
        c->ch_state = c->ch_left ? CH_DATA : CH_END;
      }
      break;
    }
    case CH_EXT:
      if (ch == '\n') c->ch_state = c->ch_left ? CH_DATA : CH_END;
      break;
    case CH_SIZE_LF:
      c->ch_state = c->ch_left ? CH_DATA : CH_END;
      break;
    case CH_DATA: {
      /* the run of data bytes in this read, at once */
      size_t take = n - i;
      if ((uint64_t)take > c->ch_left) take = (size_t)c->ch_left;
      for (size_t k = 0; k < take; k++) sse_byte(c, p[i + k], o);
      c->ch_left -= take;
      i += take - 1;
      if (c->ch_left == 0) c->ch_state = CH_DATA_CR;
      break;
    }
    case CH_DATA_CR: /* the CRLF after a chunk's data */
      c->ch_state = ch == '\r' ? CH_DATA_LF : CH_SIZE;
      c->ch_left = 0;
      break;
    case CH_DATA_LF:
      c->ch_state = CH_SIZE;
      c->ch_left = 0;
      break;
    default: /* CH_END: the stream ended */
      break;
    }
  }
}

/* Bytes read from a client: the response header first, then the body. */
static void client_bytes(fan_client *c, const char *p, size_t n, const fan_opts *o) {
  if (!c->headers_done) {
    size_t room = sizeof c->head - 1 - c->head_len;
    size_t take = n < room ? n : room;
    memcpy(c->head + c->head_len, p, take);
    c->head_len += take;
    c->head[c->head_len] = '\0';
    char *end = strstr(c->head, "\r\n\r\n");
    if (end == NULL) {
      if (c->head_len == sizeof c->head - 1) {
        fprintf(stderr, "sse_fanout: a response header over %zu bytes\n", sizeof c->head);
        exit(1);
      }
      return;
    }
    c->headers_done = 1;
    c->status = atoi(c->head + 9); /* "HTTP/1.1 200 OK" */
    for (char *q = c->head; q < end; q++) {
      if (strncasecmp(q, "\ntransfer-encoding:", 19) == 0 && strstr(q, "chunked") != NULL &&
          strstr(q, "chunked") < end) {
        c->chunked = 1;
      }
    }
    size_t header_bytes = (size_t)(end + 4 - c->head);
    /* what followed the header in this read: body (the header buffer
     * held c->head_len - take bytes of earlier reads) */
    size_t earlier = c->head_len - take;
    size_t used = header_bytes - earlier;
    if (c->status != 200) {
      fprintf(stderr, "sse_fanout: the stream answered %d:\n%s\n", c->status, c->head);
      exit(1);
    }
    if (used < n) body_bytes(c, p + used, n - used, o);
    return;
  }
  body_bytes(c, p, n, o);
}

/* ---- the appender ---- */

typedef struct appender {
  const fan_opts *o;
  double first_sent; /* when the first append was sent */
  double last_acked; /* when the last one was acknowledged */
} appender;

/* Reads one response to an append on fd; returns its status. Content-Length
 * bodies only (what the API answers an append with). */
static int read_response(int fd) {
  static char buf[1 << 16]; /* the appender thread's only */
  size_t len = 0;
  char *end = NULL;
  while (end == NULL) {
    if (len == sizeof buf - 1) {
      fprintf(stderr, "sse_fanout: an append's response header is too long\n");
      exit(1);
    }
    ssize_t r = recv(fd, buf + len, sizeof buf - 1 - len, 0);
    if (r <= 0) die("append: recv");
    len += (size_t)r;
    buf[len] = '\0';
    end = strstr(buf, "\r\n\r\n");
  }
  int status = atoi(buf + 9);
  long body = 0;
  for (char *q = buf; q < end; q++) {
    if (strncasecmp(q, "\ncontent-length:", 16) == 0) body = atol(q + 16);
  }
  size_t have = len - (size_t)(end + 4 - buf);
  while ((long)have < body) {
    ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
    if (r <= 0) die("append: recv body");
    have += (size_t)r;
  }
  return status;
}

static void *appender_main(void *arg) {
  appender *a = arg;
  const fan_opts *o = a->o;
  int fd = connect_to(o);
  size_t cap = (size_t)o->batch * 64 + 64;
  char *body = malloc(cap);
  char *req = malloc(cap + 1024);
  if (body == NULL || req == NULL) die("malloc");
  a->first_sent = now_s();
  for (int64_t done = 0; done < o->events;) {
    int n = o->events - done < o->batch ? (int)(o->events - done) : o->batch;
    size_t bl = (size_t)snprintf(body, cap, "{\"events\":[");
    for (int i = 0; i < n; i++) {
      bl += (size_t)snprintf(body + bl, cap - bl, "%s{\"type\":\"tick\",\"payload\":{\"n\":%lld}}",
                             i ? "," : "", (long long)(done + i + 1));
    }
    bl += (size_t)snprintf(body + bl, cap - bl, "]}");
    int rl = snprintf(req, cap + 1024,
                      "POST /v1/sessions/%s/events HTTP/1.1\r\nHost: %s:%d\r\n"
                      "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n%s",
                      o->session, o->host, o->port, o->token, bl, body);
    send_all(fd, req, (size_t)rl);
    int status = read_response(fd);
    if (status < 200 || status > 299) {
      fprintf(stderr, "sse_fanout: an append answered %d\n", status);
      exit(1);
    }
    done += n;
  }
  a->last_acked = now_s();
  free(body);
  free(req);
  close(fd);
  return NULL;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: sse_fanout HOST PORT TOKEN SESSION CLIENTS EVENTS [BATCH]\n");
    return 2;
  }
  fan_opts o = {argv[1], atoi(argv[2]), argv[3], argv[4], atoi(argv[5]), atoll(argv[6]),
                argc > 7 ? atoi(argv[7]) : 100};
  if (o.clients < 1 || o.events < 1 || o.batch < 1) {
    fprintf(stderr, "sse_fanout: CLIENTS, EVENTS and BATCH must be at least 1\n");
    return 2;
  }
  /* one descriptor per client, plus a few */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)o.clients + 64) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)o.clients + 64 ? rl.rlim_max : (rlim_t)o.clients + 64;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  fan_client *cs = calloc((size_t)o.clients, sizeof *cs);
  if (cs == NULL) die("calloc");
  int ep = epoll_create1(0);
  if (ep < 0) die("epoll_create1");
  char req[2048];
  int rlen = snprintf(req, sizeof req,
                      "GET /v1/sessions/%s/stream HTTP/1.1\r\nHost: %s:%d\r\n"
                      "Authorization: Bearer %s\r\nAccept: text/event-stream\r\n"
                      "Last-Event-ID: 0\r\n\r\n",
                      o.session, o.host, o.port, o.token);
  for (int i = 0; i < o.clients; i++) {
    cs[i].fd = connect_to(&o);
    send_all(cs[i].fd, req, (size_t)rlen);
    fcntl(cs[i].fd, F_SETFL, fcntl(cs[i].fd, F_GETFL) | O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) != 0) die("epoll_ctl");
  }

  static char buf[1 << 16];
  struct epoll_event evs[256];
  appender app = {&o, 0, 0};
  pthread_t tid;
  int started = 0, with_headers = 0, done = 0, dropped = 0;
  /* the timeout runs from the connections, then again from the appends'
   * start (app.first_sent is the appender's until it is joined) */
  double deadline = now_s() + TIMEOUT_S;
  while (done + dropped < o.clients) {
    if (!started && with_headers == o.clients) {
      if (pthread_create(&tid, NULL, appender_main, &app) != 0) die("pthread_create");
      started = 1;
      deadline = now_s() + TIMEOUT_S;
    }
    if (now_s() > deadline) break;
    int n = epoll_wait(ep, evs, 256, 200);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    for (int k = 0; k < n; k++) {
      fan_client *c = &cs[evs[k].data.u32];
      for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r > 0) {
          int had_headers = c->headers_done, was_done = c->done_at != 0;
          client_bytes(c, buf, (size_t)r, &o);
          if (!had_headers && c->headers_done) with_headers++;
          if (!was_done && c->done_at != 0) done++;
          continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r < 0 && errno == EINTR) continue;
        /* EOF or error: the server closed this stream */
        if (c->done_at == 0 && !c->closed) {
          c->closed = 1;
          dropped++;
        }
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        break;
      }
    }
  }
  if (started) pthread_join(tid, NULL);

  double *times = calloc((size_t)o.clients, sizeof *times);
  if (times == NULL) die("calloc");
  int finished = 0;
  double last = 0;
  for (int i = 0; i < o.clients; i++) {
    if (cs[i].done_at != 0) {
      times[finished++] = cs[i].done_at - app.first_sent;
      if (cs[i].done_at > last) last = cs[i].done_at;
    }
    close(cs[i].fd);
  }
  qsort(times, (size_t)finished, sizeof *times, cmp_double);
  double all = last - app.first_sent;
  double append_s = app.last_acked - app.first_sent;
  double p50 = finished ? times[(finished - 1) / 2] : 0;
  double p99 = finished ? times[(size_t)((finished - 1) * 0.99)] : 0;
  int ok = finished == o.clients;
  printf("sse fan-out: %d clients, %lld events in batches of %d: appends acknowledged in %.3f s; "
         "%s after %.3f s (%.0f events delivered/s); client completion p50 %.3f s, p99 %.3f s; "
         "dropped %d\n",
         o.clients, (long long)o.events, o.batch, append_s,
         ok ? "every client had every event" : "NOT every client had every event", all,
         finished ? (double)finished * (double)o.events / all : 0.0, p50, p99, dropped);
  printf("SSE %d %lld %d %.3f %.3f %.0f %.3f %.3f %d\n", o.clients, (long long)o.events, o.batch,
         append_s, all, finished ? (double)finished * (double)o.events / all : 0.0, p50, p99,
         o.clients - finished);
  free(times);
  free(cs);
  close(ep);
  return ok ? 0 : 1;
}
