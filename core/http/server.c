/*
 * http/server.c: the daemon behind `eventstore serve` (http.h,
 * docs/http.md). libmicrohttpd parses HTTP; this file owns everything
 * between it and the handlers: connection and body limits, the path's
 * percent-decoding, routing (routes.c), bearer-token authentication
 * (tokens.c), one tenant handle per tenant, the inspector's static files,
 * and turning a handler's es_http_resp into a response (a buffer, or an
 * SSE stream), each with the same security headers. With a certificate
 * and key (tls.c checks them) libmicrohttpd serves HTTPS only.
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): handlers make
 * blocking store calls and SSE streams block in es_store_wait, so a slow
 * client or a slow call holds its own thread only. A reaper thread closes
 * connections whose request headers are late (header_timeout_ms), which
 * MHD's idle timeout alone cannot do against a client trickling bytes.
 *
 * libmicrohttpd would percent-decode the path before we see it, which
 * makes "a%2Fb" indistinguishable from two segments and cuts a "%00" short;
 * an identity unescape callback keeps the raw text and this file decodes
 * each segment and query value itself, refusing NUL bytes, invalid UTF-8
 * and bad escapes with a 400 that names them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codec/json_scan.h" /* esj_utf8_seq: the one UTF-8 rule */
#include "http/internal.h"
#include "http/tls.h"
#include "http/tokens.h"

#define STREAM_BLOCK (16 * 1024)          /* bytes MHD asks a stream for at once */
#define MAX_STATIC_FILE (16 * 1024 * 1024) /* the inspector's files are small */
#define DROP_SLACK (1024 * 1024)          /* bytes of an oversized chunked body read to answer 413 */
#define TOKENS_CHECK_MS 1000               /* how often the tokens file's mtime is looked at */

#define REAP_TICK_MS 100                  /* how often header deadlines are looked at */
#define SLACK_HEADER_MS 1000               /* a connection past max_connections: its headers' deadline */

/* One open connection (MHD's socket context), on es_http's list while it
 * is open, so the reaper can close one whose headers are late. */
typedef struct conn_slot {
  int fd;
  int64_t deadline_ms;     /* its request headers must be in by then; 0: they are */
  struct conn_slot *prev, *next;
} conn_slot;

typedef struct tenant_entry {
  char *name;   /* owned */
  es_store *s;  /* owned: one reference */
  struct tenant_entry *next;
} tenant_entry;

struct es_http {
  struct MHD_Daemon *d;
  es_store *root;          /* one reference */
  es_engine *engine;       /* borrowed; NULL: no reducers */
  es_http_limits limits;
  atomic_int stopping;
  atomic_int streams;
  atomic_int conns;        /* connections open now (MHD's notify callback counts) */
  pthread_mutex_t conns_mu; /* guards conn_list and each slot's deadline */
  conn_slot *conn_list;
  pthread_t reaper;        /* closes connections whose headers are late */
  int reaper_started;
  es_http_counters counters;
  es_http_ctx ctx;
  char *static_dir;        /* owned; NULL: no static files */
  char *tokens_path;       /* owned */
  pthread_mutex_t mu;      /* guards tokens, tokens_*, tenants */
  es_tokens *tokens;       /* one reference; replaced when the file changes */
  struct stat tokens_st;    /* the version of the file h->tokens was read from */
  int64_t tokens_checked_ms;
  tenant_entry *tenants;
  int port;
  es_tls_pem tls;          /* owned; tls.cert NULL: plain HTTP */
  /* While MHD_start_daemon runs, its log lines are kept here instead of
   * printed: they say "Failed to bind to port 0" (it does not know the
   * address we gave it), and the start's own error says it better. */
  atomic_int starting;
  char start_msg[256];
};

/* One request: MHD's *con_cls. Reference-counted: the request's end
 * (MHD_OPTION_NOTIFY_COMPLETED) holds one reference and an SSE stream's
 * response another, because the handler's strings (r.seg, r.tenant, ...)
 * must outlive whichever ends last. */
typedef struct rec {
  es_http *h;
  atomic_int refs;
  int started;             /* the headers were looked at */
  int answered;            /* a response is queued */
  int route;               /* es_http_routes index; -1: a static file; -2: decided early */
  int too_large;           /* the body grew past max_body: its rest is dropped */
  size_t dropped;          /* bytes of such a body dropped so far */
  int64_t started_ms;      /* when the headers were looked at */
  int head;                /* a HEAD request (answered as GET, without the body) */
  es_buf body;
  es_tokens *tokens;       /* retained: req.tenant points into it */
  char *path;              /* owned copies of what req borrows */
  char *method;
  char *seg[ES_HTTP_MAX_SEGS];
  char *qk[ES_HTTP_MAX_QUERY];
  char *qv[ES_HTTP_MAX_QUERY];
  char *last_event_id;
  char traceparent[ES_HTTP_TRACEPARENT_MAX + 1];
  char static_name[256];
  es_http_req req;
} rec;

/* ---- small helpers ------------------------------------------------------- */

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void rec_release(rec *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  es_buf_destroy(&r->body);
  if (r->tokens) es_tokens_release(r->tokens);
  free(r->path);
  free(r->method);
  for (size_t i = 0; i < ES_HTTP_MAX_SEGS; i++) free(r->seg[i]);
  for (size_t i = 0; i < ES_HTTP_MAX_QUERY; i++) {
    free(r->qk[i]);
    free(r->qv[i]);
  }
  free(r->last_event_id);
  free(r);
}

/* Percent-decodes s[0..n) into a malloc'd NUL-terminated string. Returns
 * NULL with *why set: "a bad %-escape", "a NUL byte (%00)", "invalid
 * UTF-8", or "out of memory". */
static char *pct_decode(const char *s, size_t n, const char **why) {
  char *out = malloc(n + 1);
  size_t o = 0;
  if (!out) {
    *why = "out of memory";
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= n) {
        free(out);
        *why = "a bad %-escape (% must be followed by two hex digits)";
        return NULL;
      }
      int a = s[i + 1], b = s[i + 2];
      int va = (a >= '0' && a <= '9') ? a - '0' : (a >= 'a' && a <= 'f') ? a - 'a' + 10
               : (a >= 'A' && a <= 'F') ? a - 'A' + 10 : -1;
      int vb = (b >= '0' && b <= '9') ? b - '0' : (b >= 'a' && b <= 'f') ? b - 'a' + 10
               : (b >= 'A' && b <= 'F') ? b - 'A' + 10 : -1;
      if (va < 0 || vb < 0) {
        free(out);
        *why = "a bad %-escape (% must be followed by two hex digits)";
        return NULL;
      }
      c = (unsigned char)(va * 16 + vb);
      i += 2;
    }
    if (c == 0) {
      free(out);
      *why = "a NUL byte (%00)";
      return NULL;
    }
    out[o++] = (char)c;
  }
  out[o] = '\0';
  const unsigned char *p = (const unsigned char *)out, *end = p + o;
  while (p < end) {
    if (*p < 0x80) {
      p++;
      continue;
    }
    size_t k = esj_utf8_seq(p, end);
    if (!k) {
      free(out);
      *why = "invalid UTF-8";
      return NULL;
    }
    p += k;
  }
  return out;
}

/* ---- answers -------------------------------------------------------------- */

typedef struct stream_ctx {
  rec *r;                  /* one reference */
  char *head;              /* the handler's body, sent first */
  size_t head_len, head_off;
  es_http_stream_fn fn;
  void *state;
  void (*state_free)(void *state);
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream_ctx *s = cls;
  (void)pos;
  if (s->head_off < s->head_len) {
    size_t n = s->head_len - s->head_off;
    if (n > max) n = max;
    memcpy(buf, s->head + s->head_off, n);
    s->head_off += n;
    return (ssize_t)n;
  }
  for (;;) {
    ssize_t n = s->fn(s->state, buf, max);
    if (n > 0) return n;
    if (n == -1) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* 0 breaks the stream contract (it should block and send a
     * keep-alive): asking again is right unless the server stops. */
    if (atomic_load(&s->r->h->stopping)) return MHD_CONTENT_READER_END_OF_STREAM;
  }
}

static void stream_done(void *cls) {
  stream_ctx *s = cls;
  if (s->state_free) s->state_free(s->state);
  rec_release(s->r);
  free(s->head);
  free(s);
}

static void count_answer(es_http *h, int route, int status) {
  int cls = status / 100;
  if (cls >= 1 && cls <= 5) atomic_fetch_add_explicit(&h->counters.by_class[cls], 1, memory_order_relaxed);
  if (route >= 0 && route < 64)
    atomic_fetch_add_explicit(&h->counters.by_route[route], 1, memory_order_relaxed);
}

/* The headers every answer carries (docs/http.md "Security headers"). The
 * policy is the inspector's own (its index.html repeats it in a meta
 * tag): everything from this origin, nothing inline, and frame-ancestors
 * 'none', which only a header can say, so no page (not even this
 * server's) can frame the inspector to steal a click. JSON and streams
 * get the same: one policy, nothing to choose per answer.
 * Strict-Transport-Security only over TLS: over plain HTTP a browser
 * ignores it, and it would promise HTTPS this server does not serve. */
#define CSP "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " \
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "   \
            "frame-ancestors 'none'"
#define HSTS "max-age=31536000"

static void security_headers(const es_http *h, struct MHD_Response *mr) {
  MHD_add_response_header(mr, "Content-Security-Policy", CSP);
  MHD_add_response_header(mr, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(mr, "Referrer-Policy", "no-referrer");
  if (h->tls.cert) MHD_add_response_header(mr, "Strict-Transport-Security", HSTS);
}

/* Queues o (its body and stream are consumed) as the answer to r. api: the
 * JSON API's Cache-Control; www: a 401's WWW-Authenticate value. */
static enum MHD_Result answer(struct MHD_Connection *c, rec *r, es_http_resp *o, const char *www,
                              int close) {
  es_http *h = r->h;
  struct MHD_Response *mr = NULL;
  if (o->body.oom) {
    if (o->stream && o->stream_free) o->stream_free(o->stream_state);
    o->stream = NULL;
    es_buf_destroy(&o->body);
    es_buf_init(&o->body);
    es_http_fail(o, 503, "STORAGE", "out of memory writing the answer");
  }
  int status = o->status ? o->status : 200;
  r->answered = 1;
  if (o->stream) {
    stream_ctx *s = calloc(1, sizeof *s);
    size_t len = 0;
    char *head = es_buf_take(&o->body, &len);
    if (!s || (!head && len)) {
      free(s);
      free(head);
      if (o->stream_free) o->stream_free(o->stream_state);
      return MHD_NO;
    }
    s->r = r;
    atomic_fetch_add(&r->refs, 1);
    s->head = head;
    s->head_len = len;
    s->fn = o->stream;
    s->state = o->stream_state;
    s->state_free = o->stream_free;
    mr = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, s,
                                           stream_done);
    if (!mr) {
      stream_done(s);
      return MHD_NO;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE,
                            o->content_type ? o->content_type : "text/event-stream");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(mr, "X-Accel-Buffering", "no");
  } else {
    size_t len = 0;
    char *data = es_buf_take(&o->body, &len);
    mr = MHD_create_response_from_buffer_with_free_callback(len, data, free);
    if (!mr) {
      free(data);
      return MHD_NO;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE,
                            o->content_type ? o->content_type : "application/json");
    if (r->route != -1) MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    else MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  }
  security_headers(h, mr);
  if (o->allow) MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, o->allow);
  if (www) MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, www);
  if (close) MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, mr);
  MHD_destroy_response(mr); /* frees a stream's state too when it was not queued */
  if (ret == MHD_YES) count_answer(h, r->route, status);
  return ret;
}

/* An error answer decided by the server itself. */
static enum MHD_Result refuse(struct MHD_Connection *c, rec *r, int status, const char *code,
                              const char *www, int close, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;
static enum MHD_Result refuse(struct MHD_Connection *c, rec *r, int status, const char *code,
                              const char *www, int close, const char *fmt, ...) {
  char msg[ES_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  es_http_resp o;
  memset(&o, 0, sizeof o);
  es_buf_init(&o.body);
  es_http_fail(&o, status, code, "%s", msg);
  if (r->route >= 0) r->route = -2; /* counted as the server's, not the route's */
  return answer(c, r, &o, www, close);
}

/* ---- tenants and tokens ---------------------------------------------------- */

/* The tenant's handle, made on first use and kept until es_http_stop
 * (borrowed by the caller). NULL with err on failure. */
static es_store *tenant_store(es_http *h, const char *name, es_err *err) {
  pthread_mutex_lock(&h->mu);
  for (tenant_entry *t = h->tenants; t; t = t->next) {
    if (strcmp(t->name, name) == 0) {
      pthread_mutex_unlock(&h->mu);
      return t->s;
    }
  }
  tenant_entry *t = calloc(1, sizeof *t);
  es_store *s = NULL;
  if (!t || !(t->name = strdup(name))) {
    free(t);
    pthread_mutex_unlock(&h->mu);
    es_fail(err, ES_STORAGE, "out of memory");
    return NULL;
  }
  if (es_store_tenant(h->root, name, &s, err) != ES_OK) {
    free(t->name);
    free(t);
    pthread_mutex_unlock(&h->mu);
    return NULL;
  }
  t->s = s;
  t->next = h->tenants;
  h->tenants = t;
  pthread_mutex_unlock(&h->mu);
  return s;
}

/* Warns on stderr about a freshly read file: each plain-text token, and
 * a file others than its owner may read or write (a plain token there is
 * anyone's; a writer adds tokens). A warning, not a refusal: a file of
 * hashed tokens holds no secret, and who may write it is the directory's
 * business too (docs/http.md "Tokens"). */
static void warn_loaded(const char *path, const int *lines) {
  for (size_t i = 0; lines && lines[i]; i++)
    fprintf(stderr,
            "eventstore serve: warning: %s:%d: the token is in plain text; put its hash there "
            "instead (eventstore token hash TOKEN prints it)\n", path, lines[i]);
  struct stat st;
  if (stat(path, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)))
    fprintf(stderr,
            "eventstore serve: warning: the tokens file %s has mode %04o: others than its owner "
            "may read or change it (chmod 600 it)\n", path, (unsigned)(st.st_mode & 07777));
  fflush(stderr);
}

/* Says on stderr that every token is refused now, and why. Said at every
 * look at the file (at most once every TOKENS_CHECK_MS, when a request
 * comes) until the file is usable again, so the log shows the cause for
 * as long as it lasts. */
static void revoke_all(es_http *h, const char *why) {
  if (h->tokens) es_tokens_release(h->tokens);
  h->tokens = NULL;
  fprintf(stderr, "eventstore serve: the tokens file is not usable, so every token is refused until "
                  "it is: %s\n", why);
  fflush(stderr);
}

/* Whether two stats are the same version of the file: a rewrite, a rename
 * over it, a truncation or a chmod changes one of these. */
static int same_version(const struct stat *a, const struct stat *b) {
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
         a->st_mode == b->st_mode && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
         a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
         a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* The current token set (retained for the caller; NULL: none is valid).
 * Looks at the file at most once every TOKENS_CHECK_MS and rereads it when
 * it is another version, or at every look while it is not usable. Fails
 * closed: a file that is missing, unreadable, empty or bad revokes every
 * token until it is usable again. */
static es_tokens *current_tokens(es_http *h) {
  pthread_mutex_lock(&h->mu);
  int64_t now = mono_ms();
  if (now - h->tokens_checked_ms >= TOKENS_CHECK_MS) {
    h->tokens_checked_ms = now;
    struct stat st;
    if (stat(h->tokens_path, &st) != 0) {
      char why[ES_ERRMSG_MAX];
      snprintf(why, sizeof why, "tokens file '%s': %s", h->tokens_path, strerror(errno));
      revoke_all(h, why);
    } else if (!h->tokens || !same_version(&st, &h->tokens_st)) {
      es_tokens *fresh = NULL;
      int *plain = NULL;
      es_err err = {0};
      h->tokens_st = st;
      if (es_tokens_load(h->tokens_path, h->root, &fresh, &plain, &err) == ES_OK) {
        if (h->tokens) es_tokens_release(h->tokens);
        h->tokens = fresh;
        fprintf(stderr, "eventstore serve: reloaded the tokens file %s\n", h->tokens_path);
        warn_loaded(h->tokens_path, plain);
        free(plain);
      } else {
        revoke_all(h, err.msg);
      }
    }
  }
  es_tokens *t = h->tokens;
  es_tokens_retain(t);
  pthread_mutex_unlock(&h->mu);
  return t;
}

static const char *right_name(int right) {
  switch (right) {
  case ES_RIGHT_READ: return "read";
  case ES_RIGHT_APPEND: return "append";
  case ES_RIGHT_WORK: return "work";
  default: return "admin";
  }
}

/* ---- static files ---------------------------------------------------------- */

static const char *content_type_of(const char *name) {
  static const struct { const char *ext, *type; } types[] = {
      {".html", "text/html; charset=utf-8"},  {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},    {".svg", "image/svg+xml"},
      {".png", "image/png"},                  {".json", "application/json"},
      {".txt", "text/plain; charset=utf-8"},  {".ico", "image/x-icon"},
      {".map", "application/json"},
  };
  const char *dot = strrchr(name, '.');
  if (dot)
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
      if (strcmp(dot, types[i].ext) == 0) return types[i].type;
  return "application/octet-stream";
}

/* A name the static files may have: letters, digits, '.', '-', '_', not
 * starting with '.' (no dotfiles, no "..", no '/': one directory only). */
static int static_name_ok(const char *name) {
  if (!name[0] || name[0] == '.' || strlen(name) > 200) return 0;
  for (const char *p = name; *p; p++) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == '_'))
      return 0;
  }
  return 1;
}

/* Reads static_dir/name into o (a regular file only: O_NOFOLLOW refuses a
 * symlink, so nothing outside the directory is served). */
static void serve_static(es_http *h, const char *name, es_http_resp *o) {
  if (!h->static_dir) {
    es_http_fail(o, 404, "NOT_FOUND",
                 "this server has no inspector files (start it with --static DIR; see docs/http.md)");
    return;
  }
  if (!static_name_ok(name)) {
    es_http_fail(o, 404, "NOT_FOUND", "no such file");
    return;
  }
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", h->static_dir, name) >= sizeof path) {
    es_http_fail(o, 404, "NOT_FOUND", "no such file");
    return;
  }
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_STATIC_FILE) {
    if (fd >= 0) close(fd);
    if (strcmp(name, "index.html") == 0)
      es_http_fail(o, 404, "NOT_FOUND", "the inspector's index.html is not in %s (--static DIR)",
                   h->static_dir);
    else
      es_http_fail(o, 404, "NOT_FOUND", "no such file");
    return;
  }
  size_t want = (size_t)st.st_size, got = 0;
  if (want == 0) es_buf_add(&o->body, "", 0);
  while (got < want && !o->body.oom) {
    char chunk[16384];
    size_t n = want - got < sizeof chunk ? want - got : sizeof chunk;
    ssize_t k = read(fd, chunk, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    es_buf_add(&o->body, chunk, (size_t)k);
    got += (size_t)k;
  }
  close(fd);
  if (got != want) {
    es_http_fail(o, 503, "STORAGE", "cannot read %s", name);
    return;
  }
  o->status = 200;
  o->content_type = content_type_of(name);
}

/* ---- the request ---------------------------------------------------------- */

/* Splits the raw path into decoded segments. Returns 0, or the status of
 * an answer already made in o (400 for a bad segment, 404 for too many or
 * empty ones). */
static int split_path(rec *r, const char *url, es_http_resp *o) {
  const char *p = url;
  if (*p != '/') return es_http_fail(o, 404, "NOT_FOUND", "no such path"), 404;
  p++;
  r->req.nseg = 0;
  if (*p == '\0') return 0; /* "/" */
  for (;;) {
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || r->req.nseg == ES_HTTP_MAX_SEGS)
      return es_http_fail(o, 404, "NOT_FOUND", "no such path"), 404;
    const char *why = NULL;
    char *seg = pct_decode(p, n, &why);
    if (!seg) {
      if (strcmp(why, "out of memory") == 0)
        return es_http_fail(o, 503, "STORAGE", "out of memory"), 503;
      return es_http_fail(o, 400, "INVALID_ARGUMENT", "path segment %zu holds %s", r->req.nseg + 1,
                          why),
             400;
    }
    r->seg[r->req.nseg] = seg;
    r->req.seg[r->req.nseg] = seg;
    r->req.nseg++;
    if (!slash) break;
    p = slash + 1;
  }
  return 0;
}

typedef struct query_walk {
  rec *r;
  es_http_resp *o;
  int status; /* 0, or the error answer's status */
} query_walk;

static enum MHD_Result query_one(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                 const char *value, size_t value_size) {
  query_walk *w = cls;
  rec *r = w->r;
  (void)kind;
  const char *why = NULL;
  char *k = pct_decode(key, key_size, &why);
  if (!k) {
    w->status = 400;
    es_http_fail(w->o, 400, "INVALID_ARGUMENT", "a query parameter's name holds %s", why);
    return MHD_NO;
  }
  for (size_t i = 0; i < r->req.nq; i++) {
    if (strcmp(r->qk[i], k) == 0) { /* the first of a repeated name wins */
      free(k);
      return MHD_YES;
    }
  }
  char *v = pct_decode(value ? value : "", value ? value_size : 0, &why);
  if (!v) {
    w->status = 400;
    es_http_fail(w->o, 400, "INVALID_ARGUMENT", "query parameter '%s' holds %s", k, why);
    free(k);
    return MHD_NO;
  }
  if (r->req.nq == ES_HTTP_MAX_QUERY) {
    w->status = 400;
    es_http_fail(w->o, 400, "INVALID_ARGUMENT", "more than %d query parameters", ES_HTTP_MAX_QUERY);
    free(k);
    free(v);
    return MHD_NO;
  }
  r->qk[r->req.nq] = k;
  r->qv[r->req.nq] = v;
  r->req.qk[r->req.nq] = k;
  r->req.qv[r->req.nq] = v;
  r->req.nq++;
  return MHD_YES;
}

/* Whether route pattern matches the request's segments. */
static int pattern_matches(const char *pattern, const es_http_req *q) {
  size_t i = 0;
  const char *p = pattern;
  for (;;) {
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (i >= q->nseg) return 0;
    if (!(n == 1 && p[0] == '*') && (strlen(q->seg[i]) != n || memcmp(q->seg[i], p, n) != 0))
      return 0;
    i++;
    if (!slash) break;
    p = slash + 1;
  }
  return i == q->nseg;
}

/* Appends "M" to an Allow list once. */
static void allow_add(char *allow, size_t cap, const char *m) {
  size_t ml = strlen(m);
  for (const char *p = allow; (p = strstr(p, m)) != NULL; p += ml)
    if ((p == allow || p[-1] == ' ') && (p[ml] == ',' || p[ml] == '\0')) return;
  if (allow[0]) strncat(allow, ", ", cap - strlen(allow) - 1);
  strncat(allow, m, cap - strlen(allow) - 1);
}

/* What the headers say of the request's body (RFC 9112 §6): its
 * Content-Length headers and whether a Transfer-Encoding header came. */
typedef struct framing {
  int n_cl;                /* Content-Length headers seen */
  unsigned long long cl;   /* the first one's value */
  int cl_bad;              /* one is not a plain number, or two disagree */
  int te;                  /* a Transfer-Encoding header came */
} framing;

static enum MHD_Result framing_one(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size) {
  framing *f = cls;
  (void)kind;
  (void)key_size;
  if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
    f->te = 1;
  } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
    unsigned long long n = 0;
    size_t digits = 0;
    for (size_t i = 0; value && i < value_size; i++) {
      if (value[i] < '0' || value[i] > '9' || ++digits > 18) {
        f->cl_bad = 1;
        break;
      }
      n = n * 10 + (unsigned)(value[i] - '0');
    }
    if (!digits) f->cl_bad = 1;
    if (f->n_cl++ && n != f->cl) f->cl_bad = 1;
    if (f->n_cl == 1) f->cl = n;
  }
  return MHD_YES;
}

/* Whether a request with this method may carry a body: GET, HEAD and
 * DELETE take none on any route (static files and /healthz included). */
static int method_takes_body(const char *method) {
  return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 &&
         strcmp(method, "DELETE") != 0;
}

/* The first look at a request (headers only). Decides everything that
 * needs no body: a refusal is answered at once, before the body is read
 * (libmicrohttpd then closes the connection instead of reading it).
 * Returns MHD_YES with r->answered clear when the body should be read. */
static enum MHD_Result first_look(struct MHD_Connection *c, rec *r, const char *url,
                                  const char *method) {
  es_http *h = r->h;
  es_http_resp o;
  memset(&o, 0, sizeof o);
  es_buf_init(&o.body);
  r->route = -2;

  if ((unsigned)atomic_load(&h->conns) > h->limits.max_connections) {
    atomic_fetch_add_explicit(&h->counters.refused, 1, memory_order_relaxed);
    return refuse(c, r, 503, "UNAVAILABLE", NULL, 1,
                  "too many open connections (the server takes %u at once); try again later",
                  h->limits.max_connections);
  }
  r->head = strcmp(method, "HEAD") == 0;
  r->method = strdup(r->head ? "GET" : method);
  r->path = strdup(url);
  if (!r->method || !r->path) return MHD_NO;
  r->req.method = r->method;
  r->req.head = r->head;
  r->req.path = r->path;
  r->req.ctx = &h->ctx;

  /* A body where the method takes none is refused before a byte of it is
   * read, token or not: otherwise anyone could make the server hold
   * max_body per connection on /healthz or the inspector's files. */
  framing f = {0, 0, 0, 0};
  MHD_get_connection_values_n(c, MHD_HEADER_KIND, framing_one, &f);
  /* Two framings that disagree are how a request is smuggled past a proxy
   * that reads the other one (RFC 9112 §6.3): 400, nothing read. */
  if (f.cl_bad)
    return refuse(c, r, 400, "INVALID_ARGUMENT", NULL, 1,
                  "Content-Length must be one decimal number (headers that disagree or a list are refused)");
  if (f.te && f.n_cl)
    return refuse(c, r, 400, "INVALID_ARGUMENT", NULL, 1,
                  "a request may not send both Content-Length and Transfer-Encoding");
  if (!method_takes_body(method) && (f.te || f.cl > 0)) {
    if (f.te)
      return refuse(c, r, 413, "TOO_LARGE", NULL, 1, "%s takes no body (this request sends a chunked one)",
                    method);
    return refuse(c, r, 413, "TOO_LARGE", NULL, 1, "%s takes no body (this request announces %llu bytes)",
                  method, f.cl);
  }

  int st = split_path(r, url, &o);
  if (st) return answer(c, r, &o, NULL, 1);
  query_walk w = {r, &o, 0};
  MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, query_one, &w);
  if (w.status) return answer(c, r, &o, NULL, 1);

  /* Routing: the first route whose method and pattern match; a pattern
   * that matches with another method makes a 405 with Allow. */
  char allow[64] = "";
  int route = -1;
  for (int i = 0; es_http_routes[i].method; i++) {
    if (!pattern_matches(es_http_routes[i].pattern, &r->req)) continue;
    if (strcmp(es_http_routes[i].method, r->method) == 0) {
      route = i;
      break;
    }
    allow_add(allow, sizeof allow, es_http_routes[i].method);
    if (strcmp(es_http_routes[i].method, "GET") == 0) allow_add(allow, sizeof allow, "HEAD");
  }
  if (route < 0) {
    if (allow[0]) {
      es_http_fail(&o, 405, "METHOD_NOT_ALLOWED", "%s is not allowed on %s (allowed: %s)", method,
                   url, allow);
      o.allow = allow;
      return answer(c, r, &o, NULL, 1);
    }
    /* "/" and "/<file>": the inspector's files, no token needed. */
    if (r->req.nseg <= 1 && strcmp(r->method, "GET") == 0) {
      r->route = -1;
      snprintf(r->static_name, sizeof r->static_name, "%s",
               r->req.nseg ? r->req.seg[0] : "index.html");
      return MHD_YES;
    }
    return refuse(c, r, 404, "NOT_FOUND", NULL, 1, "no such path: %s %s (docs/http.md lists the routes)",
                  method, url);
  }
  r->route = route;

  /* Authentication and the route's right. */
  int need = es_http_routes[route].right;
  if (need != ES_RIGHT_NONE) {
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!auth)
      return refuse(c, r, 401, "UNAUTHORIZED", "Bearer", 1,
                    "this path needs a token: send 'Authorization: Bearer TOKEN'");
    if (strncasecmp(auth, "Bearer ", 7) != 0)
      return refuse(c, r, 401, "UNAUTHORIZED", "Bearer", 1,
                    "the Authorization header must be 'Bearer TOKEN'");
    const char *tok = auth + 7;
    while (*tok == ' ') tok++;
    size_t tn = strlen(tok);
    while (tn && tok[tn - 1] == ' ') tn--;
    for (size_t i = 0; i < tn; i++)
      if ((unsigned char)tok[i] < 0x21 || (unsigned char)tok[i] > 0x7e) tn = 0;
    if (tn == 0)
      return refuse(c, r, 401, "UNAUTHORIZED", "Bearer error=\"invalid_token\"", 1,
                    "the Authorization header must be 'Bearer TOKEN'");
    r->tokens = current_tokens(h);
    const char *tenant = NULL;
    int rights = 0;
    if (!es_tokens_find(r->tokens, tok, tn, &tenant, &rights))
      return refuse(c, r, 401, "UNAUTHORIZED", "Bearer error=\"invalid_token\"", 1,
                    "unknown token");
    if (!(rights & need) && !(rights & ES_RIGHT_ADMIN))
      return refuse(c, r, 403, "FORBIDDEN", NULL, 1, "this token lacks the '%s' right %s needs",
                    right_name(need), method);
    r->req.rights = (rights & ES_RIGHT_ADMIN) ? (ES_RIGHT_READ | ES_RIGHT_APPEND | ES_RIGHT_WORK |
                                                  ES_RIGHT_ADMIN)
                                               : rights;
    r->req.tenant = tenant;
    if (tenant) {
      es_err err = {0};
      r->req.store = tenant_store(h, tenant, &err);
      if (!r->req.store)
        return refuse(c, r, es_http_status_of(err.code), es_strerror(err.code), NULL, 1, "%s",
                      err.msg);
    } else {
      r->req.store = h->root;
    }
  } else {
    r->req.store = h->root;
  }

  /* A body announced bigger than the limit is refused before it is read. */
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (errno == 0 && end != cl && n > h->limits.max_body)
      return refuse(c, r, 413, "TOO_LARGE", NULL, 1,
                    "the body is %llu bytes; this server takes at most %zu (--max-body)", n,
                    h->limits.max_body);
  }
  const char *tp = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "traceparent");
  if (tp && es_http_traceparent_ok(tp)) {
    memcpy(r->traceparent, tp, strlen(tp) + 1);
    r->req.traceparent = r->traceparent;
  }
  const char *lei = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  if (lei) {
    /* Dropping it would resume the stream from the start (or the live
     * end) as if the client had not said where it was. */
    if (!(r->last_event_id = strdup(lei)))
      return refuse(c, r, 503, "STORAGE", NULL, 1, "out of memory reading Last-Event-ID");
    r->req.last_event_id = r->last_event_id;
  }
  return MHD_YES;
}

static void set_header_deadline(es_http *h, struct MHD_Connection *c, int64_t deadline_ms);

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  es_http *h = cls;
  rec *r = *con_cls;
  (void)version;
  if (!r) {
    set_header_deadline(h, c, 0); /* the headers are in */
    r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->h = h;
    atomic_init(&r->refs, 1);
    es_buf_init(&r->body);
    *con_cls = r;
    r->started = 1;
    r->started_ms = mono_ms();
    return first_look(c, r, url, method);
  }
  if (r->answered) { /* an early answer: the rest of the body is dropped */
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    /* The whole request, body included, has request_timeout_s: a client
     * trickling bytes forever would never trip MHD's idle timeout. */
    if (mono_ms() - r->started_ms > (int64_t)h->limits.request_timeout_s * 1000) return MHD_NO;
    if (r->too_large) {
      /* libmicrohttpd cannot answer in the middle of a body: the rest is
       * read and dropped, and the 413 comes at its end; a body that goes
       * on for another max_body (at least DROP_SLACK) past the limit is
       * cut by closing the connection, without an answer. */
      size_t slack = h->limits.max_body > DROP_SLACK ? h->limits.max_body : DROP_SLACK;
      r->dropped += n;
      return r->dropped - h->limits.max_body > slack ? MHD_NO : MHD_YES;
    }
    if (r->body.len + n > h->limits.max_body) {
      r->too_large = 1;
      r->dropped = r->body.len + n;
      es_buf_destroy(&r->body);
      return MHD_YES;
    }
    es_buf_add(&r->body, upload_data, n);
    if (r->body.oom) return MHD_NO;
    return MHD_YES;
  }
  if (r->too_large)
    return refuse(c, r, 413, "TOO_LARGE", NULL, 1,
                  "the body is over %zu bytes, the most this server takes (--max-body)",
                  h->limits.max_body);

  /* The whole request is here. */
  es_http_resp o;
  memset(&o, 0, sizeof o);
  es_buf_init(&o.body);
  if (r->route == -1) {
    serve_static(h, r->static_name, &o);
    return answer(c, r, &o, NULL, 0);
  }
  if (r->body.len) {
    r->req.body = es_buf_cstr(&r->body);
    r->req.body_len = r->body.len;
  }
  es_http_routes[r->route].fn(&r->req, &o);
  return answer(c, r, &o, NULL, 0);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  es_http *h = cls;
  (void)toe;
  rec_release(*con_cls);
  *con_cls = NULL;
  /* A keep-alive connection's next request has the same time for its
   * headers, counted from this answer. */
  set_header_deadline(h, c, mono_ms() + h->limits.header_timeout_ms);
}

/* Sets the header deadline of c's slot (0: none), under conns_mu. */
static void set_header_deadline(es_http *h, struct MHD_Connection *c, int64_t deadline_ms) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  conn_slot *slot = ci ? ci->socket_context : NULL;
  if (!slot) return;
  pthread_mutex_lock(&h->conns_mu);
  slot->deadline_ms = deadline_ms;
  pthread_mutex_unlock(&h->conns_mu);
}

/* Keeps the list of open connections. A connection has header_timeout_ms
 * from its accept for its request headers, so a client trickling a byte
 * at a time cannot hold it (MHD's own timeout is per idle gap only); one
 * past max_connections, which is only there to be told 503, has at most
 * SLACK_HEADER_MS, so trickling clients cannot keep that slack either. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  es_http *h = cls;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    unsigned n = (unsigned)atomic_fetch_add(&h->conns, 1) + 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn_slot *slot = ci ? calloc(1, sizeof *slot) : NULL;
    if (!slot) return; /* not watched: MHD's idle timeout still applies */
    unsigned ms = h->limits.header_timeout_ms;
    if (n > h->limits.max_connections && ms > SLACK_HEADER_MS) ms = SLACK_HEADER_MS;
    slot->fd = ci->connect_fd;
    slot->deadline_ms = mono_ms() + ms;
    pthread_mutex_lock(&h->conns_mu);
    slot->next = h->conn_list;
    if (h->conn_list) h->conn_list->prev = slot;
    h->conn_list = slot;
    pthread_mutex_unlock(&h->conns_mu);
    *socket_context = slot;
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    atomic_fetch_sub(&h->conns, 1);
    conn_slot *slot = *socket_context;
    if (!slot) return;
    /* MHD closes the socket after this: while the slot is listed, the
     * reaper's fd is this connection's. */
    pthread_mutex_lock(&h->conns_mu);
    if (slot->prev) slot->prev->next = slot->next;
    else h->conn_list = slot->next;
    if (slot->next) slot->next->prev = slot->prev;
    pthread_mutex_unlock(&h->conns_mu);
    free(slot);
    *socket_context = NULL;
  }
}

/* The reaper: every REAP_TICK_MS, shuts down the socket of each connection
 * whose headers are past their deadline; its MHD thread then sees the
 * connection end and closes it, without an answer (a client that sends
 * headers this slowly is not one to answer). */
static void *reaper_main(void *arg) {
  es_http *h = arg;
  while (!atomic_load(&h->stopping)) {
    struct timespec ts = {0, REAP_TICK_MS * 1000000L};
    nanosleep(&ts, NULL);
    int64_t now = mono_ms();
    pthread_mutex_lock(&h->conns_mu);
    for (conn_slot *s = h->conn_list; s; s = s->next) {
      if (s->deadline_ms && now >= s->deadline_ms) {
        s->deadline_ms = 0;
        shutdown(s->fd, SHUT_RDWR);
        atomic_fetch_add_explicit(&h->counters.header_timeouts, 1, memory_order_relaxed);
      }
    }
    pthread_mutex_unlock(&h->conns_mu);
  }
  return NULL;
}

/* libmicrohttpd's own messages (a client gone mid-answer, a request it
 * could not parse), on stderr like the server's other lines. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
  es_http *h = cls;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
  if (atomic_load(&h->starting)) { /* the first says why; es_http_start reports it */
    if (!h->start_msg[0])
      snprintf(h->start_msg, sizeof h->start_msg, "%.*s", (int)sizeof h->start_msg - 1, msg);
    return;
  }
  fprintf(stderr, "eventstore serve: %s\n", msg);
  fflush(stderr);
}

/* Keeps the path and the query as sent: this file decodes them itself
 * (see the header comment). */
static size_t keep_escapes(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls;
  (void)c;
  return strlen(s);
}

/* ---- start and stop -------------------------------------------------------- */

void es_http_opts_init(es_http_opts *o) { memset(o, 0, sizeof *o); }

static void apply_defaults(es_http_limits *l) {
  if (!l->max_body) l->max_body = 16u * 1024 * 1024;
  if (!l->max_batch) l->max_batch = 1000;
  if (!l->max_connections) l->max_connections = 256;
  if (!l->request_timeout_s) l->request_timeout_s = 30;
  if (!l->max_streams) l->max_streams = 128;
  if (!l->header_timeout_ms) l->header_timeout_ms = 10000;
  if (!l->max_per_client) l->max_per_client = l->max_connections / 2 ? l->max_connections / 2 : 1;
  if (!l->stream_buffer) l->stream_buffer = 1024 * 1024;
  if (!l->max_limit) l->max_limit = 1000;
  if (!l->max_response_bytes) l->max_response_bytes = (size_t)8 << 20;
}

/* "HOST:PORT", "[V6]:PORT" or ":PORT" -> a socket address. */
static int parse_listen(const char *s, struct sockaddr_storage *ss, socklen_t *len, int *v6,
                        es_err *err) {
  char host[128];
  const char *port;
  memset(ss, 0, sizeof *ss);
  *v6 = 0;
  if (!s || !*s) goto bad;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host) goto bad;
    memcpy(host, s + 1, (size_t)(close - s - 1));
    host[close - s - 1] = '\0';
    port = close + 2;
    *v6 = 1;
  } else {
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host || memchr(s, ':', (size_t)(colon - s))) goto bad;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    port = colon + 1;
  }
  if (!*port || strlen(port) > 5) goto bad;
  unsigned long pn = 0;
  for (const char *p = port; *p; p++) {
    if (*p < '0' || *p > '9') goto bad;
    pn = pn * 10 + (unsigned long)(*p - '0');
  }
  if (pn > 65535) goto bad;
  if (*v6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)pn);
    if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) goto bad;
    *len = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)pn);
    if (!host[0]) a->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (strcmp(host, "localhost") == 0) a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &a->sin_addr) != 1) goto bad;
    *len = sizeof *a;
  }
  return ES_OK;
bad:
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "listen address '%s': expected HOST:PORT, [IPV6]:PORT or :PORT (HOST a numeric "
                 "address or localhost, PORT 0 to 65535; 0 picks a free port)", s ? s : "");
}

static void http_free(es_http *h) {
  if (!h) return;
  while (h->tenants) {
    tenant_entry *t = h->tenants;
    h->tenants = t->next;
    es_store_release(t->s);
    free(t->name);
    free(t);
  }
  if (h->tokens) es_tokens_release(h->tokens);
  if (h->root) es_store_release(h->root);
  free(h->static_dir);
  free(h->tokens_path);
  es_tls_pem_free(&h->tls);
  pthread_mutex_destroy(&h->mu);
  pthread_mutex_destroy(&h->conns_mu);
  free(h);
}

int es_http_start(es_store *root, es_engine *engine, const es_http_opts *o, es_http **out,
                  es_err *err) {
  *out = NULL;
  if (!root || !o) return es_fail(err, ES_INVALID_ARGUMENT, "es_http_start needs a store and options");
  if (es_store_tenant_name(root))
    return es_fail(err, ES_INVALID_ARGUMENT, "serve the store itself, not a tenant handle (tokens choose tenants)");
  if (!o->tokens_path || !*o->tokens_path)
    return es_fail(err, ES_INVALID_ARGUMENT, "a tokens file is required (eventstore token new TENANT RIGHTS makes a line of one)");
  if (!o->tls_cert_path != !o->tls_key_path)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "TLS needs both a certificate and its key (--tls-cert FILE --tls-key FILE), or neither");
  struct sockaddr_storage ss;
  socklen_t sslen = 0;
  int v6 = 0;
  if (parse_listen(o->listen, &ss, &sslen, &v6, err)) return err->code;

  es_http *h = calloc(1, sizeof *h);
  if (!h) return es_fail(err, ES_STORAGE, "out of memory");
  pthread_mutex_init(&h->mu, NULL);
  pthread_mutex_init(&h->conns_mu, NULL);
  es_store_retain(root);
  h->root = root;
  h->engine = engine;
  h->limits = o->limits;
  apply_defaults(&h->limits);
  atomic_init(&h->stopping, 0);
  atomic_init(&h->streams, 0);
  atomic_init(&h->conns, 0);
  h->ctx.root = root;
  h->ctx.engine = engine;
  h->ctx.limits = &h->limits;
  h->ctx.stopping = &h->stopping;
  h->ctx.streams = &h->streams;
  h->ctx.counters = &h->counters;
  h->ctx.tenant_sep = ES_TENANT_SEP;
  h->tokens_path = strdup(o->tokens_path);
  if (!h->tokens_path || (o->static_dir && !(h->static_dir = strdup(o->static_dir)))) {
    http_free(h);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  stat(h->tokens_path, &h->tokens_st); /* a failure reads the file again at the first look */
  h->tokens_checked_ms = mono_ms();
  int *plain = NULL;
  if (es_tokens_load(h->tokens_path, root, &h->tokens, &plain, err) != ES_OK) {
    http_free(h);
    return err->code;
  }
  warn_loaded(h->tokens_path, plain);
  free(plain);
  if (o->tls_cert_path && es_tls_pem_load(o->tls_cert_path, o->tls_key_path, &h->tls, err) != ES_OK) {
    http_free(h);
    return err->code;
  }
  /* HTTPS only, when asked: libmicrohttpd then answers nothing to plain
   * HTTP (its handshake fails and the connection is closed). An array,
   * so that the call below is the same with TLS or without. */
  struct MHD_OptionItem tls_opts[] = {
      {MHD_OPTION_HTTPS_MEM_CERT, 0, h->tls.cert},
      {MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls.key},
      {MHD_OPTION_END, 0, NULL},
  };

  /* MHD's own cap sits a little above ours so that the connections past
   * max_connections get a 503 that says why, instead of a silent close. */
  unsigned slack = h->limits.max_connections / 8 + 8;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
  if (v6) flags |= MHD_USE_IPv6;
  if (h->tls.cert) flags |= MHD_USE_TLS;
  errno = 0;
  atomic_store(&h->starting, 1);
  h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                          MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* first: it says so otherwise */
                          MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                          MHD_OPTION_CONNECTION_LIMIT, h->limits.max_connections + slack,
                          MHD_OPTION_PER_IP_CONNECTION_LIMIT, h->limits.max_per_client,
                          MHD_OPTION_CONNECTION_TIMEOUT, h->limits.request_timeout_s,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                          MHD_OPTION_UNESCAPE_CALLBACK, keep_escapes, h,
                          MHD_OPTION_ARRAY, h->tls.cert ? tls_opts : tls_opts + 2,
                          MHD_OPTION_END);
  int e = errno;
  atomic_store(&h->starting, 0);
  if (!h->d) {
    /* One line naming the address and port as given (":PORT" is every
     * address); the OS's reason when there is one, else MHD's. */
    int rc = es_fail(err, ES_STORAGE, "cannot listen on %s%s: %s", o->listen[0] == ':' ? "0.0.0.0" : "",
                     o->listen, e ? strerror(e) : h->start_msg[0] ? h->start_msg : "unknown error");
    http_free(h);
    return rc;
  }
  if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
    atomic_store(&h->stopping, 1);
    MHD_stop_daemon(h->d);
    http_free(h);
    return es_fail(err, ES_STORAGE, "cannot start the server's reaper thread");
  }
  h->reaper_started = 1;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? info->port : 0;
  (void)sslen;
  *out = h;
  return ES_OK;
}

int es_http_port(const es_http *h) { return h ? h->port : 0; }

int es_http_tls(const es_http *h) { return h && h->tls.cert; }

void es_http_stop(es_http *h) {
  if (!h) return;
  /* Streams see `stopping` within about a second and end; requests in
   * flight finish their one store call; then MHD joins every thread. */
  atomic_store(&h->stopping, 1);
  if (h->reaper_started) pthread_join(h->reaper, NULL);
  if (h->d) MHD_stop_daemon(h->d);
  h->d = NULL;
  http_free(h);
}
