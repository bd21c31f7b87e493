/*
 * redis_bench.c: eventstore beside Redis Streams on the same machine, the
 * workloads of issue 26's "Targets" table (bench/README.md, "Redis
 * Streams (issue 26)"). make bench-redis runs it (bench/redis_bench.sh).
 *
 *   redis_bench DIR      DIR: an empty scratch directory (database files,
 *                        the Redis servers' directories, the scripts)
 *
 * Environment:
 *   REDIS_BENCH_ROUNDS   rounds (5; at most 15)
 *   REDIS_BENCH_SCALE    scales every workload's size and time (1: several
 *                        minutes; 0.05: about 15 seconds)
 *   REDIS_BENCH_COUNT    XREADGROUP's COUNT (per stream) for the consumers (10)
 *   REDIS_BENCH_ONLY     run only the workloads whose key contains this
 *                        (keys: append100 append1 memappend memappend-lua
 *                        memappend-lua-ids consume8 produce8 memconsume1
 *                        bound8 rawqueue rawsqlite100 rawsqlite1 bytes)
 *   REDIS_SERVER         the redis-server binary (redis-server on PATH)
 *
 * Needs lua/eventstore/loader.lua on LUA_PATH for the engine (make sets it).
 *
 * Every round runs every workload once on each side, the side that goes
 * first alternating from round to round, so that a busy moment of this
 * shared machine hits both alike; a round's ratio is eventstore/Redis from
 * the same round (higher is better for us), and the figure is the median
 * of those ratios. Each Redis measurement gets a fresh redis-server (its
 * own port on 127.0.0.1, its own directory), as each eventstore one gets a
 * fresh store: neither side inherits the other round's data.
 *
 * Redis durable = appendonly yes + appendfsync always (no RDB snapshots):
 * every write is in the AOF and fsynced before its reply (one fdatasync per
 * event-loop pass: a group commit). Redis in-memory = save "" + appendonly
 * no. eventstore durable = sqlite: with its default durability (WAL,
 * synchronous=FULL); in-memory = memory:.
 *
 * Payload: the ~85-byte JSON of the other benches; 100 sessions (eventstore)
 * / 100 streams (Redis). Every Redis reply is checked: an error reply, a
 * reply of the wrong type or a wrong count stops the bench.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hiredis/hiredis.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "raw_queue.h" /* the rawqueue bound */
#include "engine/engine.h"
#include "module/module.h" /* open_core: the engine's states preload this library's module */
#include "store/store.h"
#include "util/hmap.h" /* es_hmap_mapped_bytes: the tables malloc does not count */

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";
#define PAYLOAD_LEN (sizeof PAYLOAD - 1)

#define SESSIONS 100
#define MAX_ROUNDS 15
#define MAX_THREADS 16

static const char *dir;
static const char *redis_server = "redis-server";
static double scale = 1;
static int xcount = 10;
static char scripts_ack[1100], scripts_produce[1100];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static pid_t redis_pid; /* the running server, killed by die() */

__attribute__((noreturn)) static void die(const char *what, const char *msg) {
  fprintf(stderr, "redis_bench: %s: %s\n", what, msg);
  if (redis_pid > 0) {
    kill(redis_pid, SIGTERM);
    waitpid(redis_pid, NULL, 0);
  }
  exit(1);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void remove_db(const char *path) {
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[1200];
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
}

static char session_name[SESSIONS][16];

/* ---- Redis: a server of our own ------------------------------------------ */

typedef struct server {
  pid_t pid;
  int port;
  char dir[1100];
} server;

/* A port the kernel says is free on 127.0.0.1 now; the server binding it a
 * moment later may still lose a race, which start_redis retries. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket", strerror(errno));
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
    die("bind", strerror(errno));
  close(fd);
  return ntohs(a.sin_port);
}

/* NULL when nothing answers on the port. */
static redisContext *rconnect(int port) {
  redisContext *c = redisConnect("127.0.0.1", port);
  if (!c) die("redis", "cannot allocate a context");
  if (c->err) { /* not up yet (start_redis polls), or gone */
    redisFree(c);
    return NULL;
  }
  return c;
}

/* A reply of the expected type or the end of the bench: NULL (the
 * connection failed), an error reply, or another type. */
static redisReply *check(redisContext *c, redisReply *r, int type, const char *what) {
  if (!r) die(what, c->errstr[0] ? c->errstr : "no reply");
  if (r->type == REDIS_REPLY_ERROR) die(what, r->str);
  if (r->type != type) {
    char msg[64];
    snprintf(msg, sizeof msg, "reply of type %d, expected %d", r->type, type);
    die(what, msg);
  }
  return r;
}

static redisContext *must_connect(int port) {
  redisContext *c = rconnect(port);
  if (!c) die("redis", "cannot connect to our server");
  return c;
}

static redisReply *next_reply(redisContext *c, int type, const char *what) {
  void *r = NULL;
  if (redisGetReply(c, &r) != REDIS_OK) die(what, c->errstr);
  return check(c, r, type, what);
}

static void command_ok(redisContext *c, const char *what, int type, int argc, const char **argv) {
  freeReplyObject(check(c, redisCommandArgv(c, argc, argv, NULL), type, what));
}

/* The server runs with the persistence asked for (a figure of a server
 * configured otherwise would be a figure of something else). */
static void check_config(int port, int durable) {
  redisContext *c = must_connect(port);
  static const char *const keys[3] = {"appendonly", "appendfsync", "save"};
  const char *want[3] = {durable ? "yes" : "no", durable ? "always" : "everysec", ""};
  for (int i = 0; i < 3; i++) {
    const char *argv[3] = {"CONFIG", "GET", keys[i]};
    redisReply *r = check(c, redisCommandArgv(c, 3, argv, NULL), REDIS_REPLY_ARRAY, "CONFIG GET");
    if (r->elements != 2 || r->element[1]->type != REDIS_REPLY_STRING || strcmp(r->element[1]->str, want[i]))
      die("CONFIG GET", keys[i]);
    freeReplyObject(r);
  }
  redisFree(c);
}

static server start_redis(int durable) {
  static int serial;
  server s;
  for (int attempt = 0; attempt < 5; attempt++) {
    s.port = free_port();
    snprintf(s.dir, sizeof s.dir, "%s/redis-%d", dir, ++serial);
    if (mkdir(s.dir, 0700)) die("mkdir", strerror(errno));
    char port[16], log[1200], pidfile[1200];
    snprintf(port, sizeof port, "%d", s.port);
    snprintf(log, sizeof log, "%s/log", s.dir);
    /* in DIR itself, where redis_bench.sh's cleanup looks for a server
     * this process could not stop */
    snprintf(pidfile, sizeof pidfile, "%s/redis.pid", dir);
    s.pid = fork();
    if (s.pid < 0) die("fork", strerror(errno));
    if (s.pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM); /* a killed bench leaves no server behind */
      int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      const char *durable_args[] = {"--appendonly", "yes", "--appendfsync", "always"};
      const char *memory_args[] = {"--appendonly", "no", "--appendfsync", "everysec"};
      const char **p = durable ? durable_args : memory_args;
      execlp(redis_server, redis_server, "--port", port, "--bind", "127.0.0.1", "--dir", s.dir,
             "--save", "", p[0], p[1], p[2], p[3], "--daemonize", "no", "--pidfile", pidfile,
             "--loglevel", "warning", (char *)NULL);
      _exit(127);
    }
    redis_pid = s.pid;
    for (int i = 0; i < 500; i++) {
      int status;
      if (waitpid(s.pid, &status, WNOHANG) == s.pid) break; /* exited: port taken? retry */
      redisContext *c = rconnect(s.port);
      if (c) {
        redisReply *r = redisCommand(c, "PING");
        int up = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
        if (r) freeReplyObject(r);
        redisFree(c);
        if (up) {
          check_config(s.port, durable);
          return s;
        }
      }
      usleep(10000);
    }
    kill(s.pid, SIGTERM);
    waitpid(s.pid, NULL, 0);
    redis_pid = 0;
    fprintf(stderr, "redis_bench: %s did not start on port %d (see its log below); retrying\n", redis_server,
            s.port);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "tail -5 '%s' >&2", log);
    if (system(cmd)) { /* the log is a hint only */
    }
    rm_tree(s.dir);
  }
  die("redis-server", "did not start (is it installed? make deps-bench-redis)");
}

static void stop_redis(server *s) {
  kill(s->pid, SIGTERM);
  int status;
  waitpid(s->pid, &status, 0);
  redis_pid = 0;
  char pidfile[1200];
  snprintf(pidfile, sizeof pidfile, "%s/redis.pid", dir);
  unlink(pidfile);
  rm_tree(s->dir);
}

/* ---- Redis workloads ------------------------------------------------------ */

typedef struct rworker {
  int port;
  int thread;
  int batch;
  int produce;
  double until;
  atomic_long *events;
} rworker;

/* XADD stream * type order.placed data PAYLOAD, batch of them per round trip
 * (pipelined), each reply checked for the new entry's id. */
static void *redis_append_loop(void *arg) {
  rworker *w = arg;
  redisContext *c = must_connect(w->port);
  const char *argv[7] = {"XADD", NULL, "*", "type", "order.placed", "data", PAYLOAD};
  size_t lens[7] = {4, 0, 1, 4, 12, 4, PAYLOAD_LEN};
  long k = 0, n = 0;
  while (now_s() < w->until) {
    argv[1] = session_name[(w->thread * 7 + k++) % SESSIONS];
    lens[1] = strlen(argv[1]);
    for (int i = 0; i < w->batch; i++)
      if (redisAppendCommandArgv(c, 7, argv, lens) != REDIS_OK) die("XADD", c->errstr);
    for (int i = 0; i < w->batch; i++) freeReplyObject(next_reply(c, REDIS_REPLY_STRING, "XADD"));
    n += w->batch;
  }
  atomic_fetch_add(w->events, n);
  redisFree(c);
  return NULL;
}

static double redis_append(int durable, int threads, int batch, double seconds) {
  server s = start_redis(durable);
  atomic_long events = 0;
  pthread_t tid[MAX_THREADS];
  rworker w[MAX_THREADS];
  double t0 = now_s();
  for (int i = 0; i < threads; i++) {
    w[i] = (rworker){s.port, i, batch, 0, t0 + seconds, &events};
    pthread_create(&tid[i], NULL, redis_append_loop, &w[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double rate = (double)atomic_load(&events) / (now_s() - t0);
  stop_redis(&s);
  return rate;
}

/* n entries in the 100 streams, 100 per stream in turn (as the eventstore
 * side fills its sessions), pipelined 1,000 per round trip; then one
 * consumer group "g" per stream from its start. Not timed. */
static void redis_fill(redisContext *c, long n) {
  const char *argv[7] = {"XADD", NULL, "*", "type", "job", "data", PAYLOAD};
  size_t lens[7] = {4, 0, 1, 4, 3, 4, PAYLOAD_LEN};
  long sent = 0;
  while (sent < n) {
    long chunk = n - sent < 1000 ? n - sent : 1000;
    for (long i = 0; i < chunk; i++) {
      argv[1] = session_name[((sent + i) / 100) % SESSIONS];
      lens[1] = strlen(argv[1]);
      if (redisAppendCommandArgv(c, 7, argv, lens) != REDIS_OK) die("XADD", c->errstr);
    }
    for (long i = 0; i < chunk; i++) freeReplyObject(next_reply(c, REDIS_REPLY_STRING, "XADD"));
    sent += chunk;
  }
}

static void redis_groups(redisContext *c) {
  for (int i = 0; i < SESSIONS; i++) {
    const char *argv[6] = {"XGROUP", "CREATE", session_name[i], "g", "0", "MKSTREAM"};
    command_ok(c, "XGROUP CREATE", REDIS_REPLY_STATUS, 6, argv);
  }
}

/* One consumer of group "g": XREADGROUP ... COUNT xcount STREAMS <100
 * streams> > ..., then, per stream in the reply, one XACK of its ids (all
 * pipelined: one round trip); or (produce) per entry MULTI, XACK, XADD of
 * one result entry to the stream "out:<stream>" (a stream the group does
 * not read: in eventstore the result lands in the event's session stored
 * processed, as nobody handles its type), EXEC, all pipelined. Ends when a
 * read returns nothing: every entry was delivered. */
static void *redis_consume_loop(void *arg) {
  rworker *w = arg;
  redisContext *c = must_connect(w->port);
  char consumer[16], count[16];
  snprintf(consumer, sizeof consumer, "c%d", w->thread);
  snprintf(count, sizeof count, "%d", xcount);
  const char *rargv[7 + 2 * SESSIONS] = {"XREADGROUP", "GROUP", "g", consumer, "COUNT", count, "STREAMS"};
  for (int i = 0; i < SESSIONS; i++) {
    rargv[7 + i] = session_name[i];
    rargv[7 + SESSIONS + i] = ">";
  }
  const char **ack = malloc(sizeof *ack * (size_t)(3 + xcount));
  long expect[SESSIONS];
  long n = 0;
  size_t bytes = 0;
  for (;;) {
    redisReply *r = redisCommandArgv(c, 7 + 2 * SESSIONS, rargv, NULL);
    if (r && r->type == REDIS_REPLY_NIL) {
      freeReplyObject(r);
      break;
    }
    check(c, r, REDIS_REPLY_ARRAY, "XREADGROUP");
    int sent = 0;
    for (size_t s = 0; s < r->elements; s++) {
      redisReply *st = r->element[s];
      if (st->type != REDIS_REPLY_ARRAY || st->elements != 2 || st->element[1]->type != REDIS_REPLY_ARRAY)
        die("XREADGROUP", "unexpected reply shape");
      const char *stream = st->element[0]->str;
      redisReply *entries = st->element[1];
      if (entries->elements == 0) continue;
      if (entries->elements > (size_t)xcount) die("XREADGROUP", "more entries than COUNT");
      ack[0] = "XACK";
      ack[1] = stream;
      ack[2] = "g";
      for (size_t e = 0; e < entries->elements; e++) {
        redisReply *en = entries->element[e];
        if (en->type != REDIS_REPLY_ARRAY || en->elements != 2 || en->element[1]->type != REDIS_REPLY_ARRAY ||
            en->element[1]->elements != 4)
          die("XREADGROUP", "unexpected entry shape");
        redisReply *data = en->element[1]->element[3]; /* type, job, data, <payload> */
        bytes += data->len;                           /* read, as a handler would */
        ack[3 + e] = en->element[0]->str;
        if (w->produce) {
          char out[32];
          snprintf(out, sizeof out, "out:%s", stream);
          const char *xa[6] = {"XACK", stream, "g", en->element[0]->str};
          const char *xd[7] = {"XADD", out, "*", "type", "job.done", "data", data->str};
          const char *multi[1] = {"MULTI"}, *exec[1] = {"EXEC"};
          if (redisAppendCommandArgv(c, 1, multi, NULL) != REDIS_OK ||
              redisAppendCommandArgv(c, 4, xa, NULL) != REDIS_OK ||
              redisAppendCommandArgv(c, 7, xd, NULL) != REDIS_OK ||
              redisAppendCommandArgv(c, 1, exec, NULL) != REDIS_OK)
            die("MULTI", c->errstr);
          sent++;
        }
      }
      if (!w->produce) {
        if (redisAppendCommandArgv(c, 3 + (int)entries->elements, ack, NULL) != REDIS_OK) die("XACK", c->errstr);
        expect[sent++] = (long)entries->elements;
      }
      n += (long)entries->elements;
    }
    /* the replies: a pipelined command's arguments were copied when it was
     * appended, so r (whose strings they point at) may go now */
    for (int i = 0; i < sent; i++) {
      if (!w->produce) {
        redisReply *a = next_reply(c, REDIS_REPLY_INTEGER, "XACK");
        if (a->integer != expect[i]) die("XACK", "acknowledged fewer entries than read");
        freeReplyObject(a);
      } else {
        freeReplyObject(next_reply(c, REDIS_REPLY_STATUS, "MULTI"));
        freeReplyObject(next_reply(c, REDIS_REPLY_STATUS, "XACK (queued)"));
        freeReplyObject(next_reply(c, REDIS_REPLY_STATUS, "XADD (queued)"));
        redisReply *x = next_reply(c, REDIS_REPLY_ARRAY, "EXEC");
        if (x->elements != 2 || x->element[0]->type != REDIS_REPLY_INTEGER || x->element[0]->integer != 1 ||
            x->element[1]->type != REDIS_REPLY_STRING)
          die("EXEC", "XACK or XADD failed inside the transaction");
        freeReplyObject(x);
      }
    }
    freeReplyObject(r);
  }
  if (bytes == 0 && n > 0) die("XREADGROUP", "no payload read");
  atomic_fetch_add(w->events, n);
  free(ack);
  redisFree(c);
  return NULL;
}

/* The consumers over a filled server's group; returns entries/s and
 * checks that every entry was consumed once. */
static double redis_consume_filled(const server *s, long n, int workers, int produce) {
  atomic_long events = 0;
  pthread_t tid[MAX_THREADS];
  rworker w[MAX_THREADS];
  double t0 = now_s();
  for (int i = 0; i < workers; i++) {
    w[i] = (rworker){s->port, i, 0, produce, 0, &events};
    pthread_create(&tid[i], NULL, redis_consume_loop, &w[i]);
  }
  for (int i = 0; i < workers; i++) pthread_join(tid[i], NULL);
  double rate = (double)n / (now_s() - t0);
  if (atomic_load(&events) != n) {
    char msg[96];
    snprintf(msg, sizeof msg, "consumed %ld of %ld entries", (long)atomic_load(&events), n);
    die("redis consume", msg);
  }
  return rate;
}

static double redis_consume(int durable, long n, int workers, int produce) {
  server s = start_redis(durable);
  redisContext *c = must_connect(s.port);
  redis_fill(c, n);
  redis_groups(c);
  redisFree(c);
  double rate = redis_consume_filled(&s, n, workers, produce);
  stop_redis(&s);
  return rate;
}

/* ---- eventstore workloads ------------------------------------------------- */

typedef struct eworker {
  es_store *s;
  int thread;
  int batch;
  double until;
  atomic_long *events;
} eworker;

/* es_store_append of batch settled events (history, as the Redis side's
 * entries that no group reads) to a session in turn. */
static void *es_append_loop(void *arg) {
  eworker *w = arg;
  es_new_event *evs = calloc((size_t)w->batch, sizeof *evs);
  for (int i = 0; i < w->batch; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = PAYLOAD_LEN;
    evs[i].settled = 1;
  }
  long k = 0, n = 0;
  while (now_s() < w->until) {
    int pending;
    es_err err = {0};
    if (es_store_append(w->s, session_name[(w->thread * 7 + k++) % SESSIONS], evs, (size_t)w->batch, ES_NONE,
                        ES_NONE, NULL, &pending, &err))
      die("append", err.msg);
    n += w->batch;
  }
  atomic_fetch_add(w->events, n);
  free(evs);
  return NULL;
}

static void store_url(char *url, size_t cap, int durable, char *path, size_t pcap) {
  if (!durable) {
    snprintf(url, cap, "memory:");
    return;
  }
  snprintf(path, pcap, "%s/redis_bench.db", dir);
  remove_db(path);
  snprintf(url, cap, "sqlite:%s", path);
}

static double es_append(int durable, int threads, int batch, double seconds) {
  char url[1300], path[1200];
  store_url(url, sizeof url, durable, path, sizeof path);
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open", err.msg);
  atomic_long events = 0;
  pthread_t tid[MAX_THREADS];
  eworker w[MAX_THREADS];
  double t0 = now_s();
  for (int i = 0; i < threads; i++) {
    w[i] = (eworker){s, i, batch, t0 + seconds, &events};
    pthread_create(&tid[i], NULL, es_append_loop, &w[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double rate = (double)atomic_load(&events) / (now_s() - t0);
  es_store_release(s);
  if (durable) remove_db(path);
  return rate;
}

/* The ceiling of any store kept in SQLite, for the durable append rows
 * (rawsqlite100, rawsqlite1): plain SQLite from one thread, as a perfect
 * group commit of the 16 writers would write, `rows` rows a commit (1,600:
 * 16 batches of 100; 16: 16 batches of 1), WAL and synchronous=FULL as the
 * store's durability. The table is the least an event log can be: an id
 * unique across the log and an index unique in its session, the payload;
 * no dispatch record, no session row, no JSON check. Ids are 36-character
 * texts in time order, as the store's UUIDv7 ids are, made by a counter. */
static double raw_sqlite_append(int rows, double seconds) {
  char path[1200];
  snprintf(path, sizeof path, "%s/raw.db", dir);
  remove_db(path);
  sqlite3 *db;
  if (sqlite3_open(path, &db) != SQLITE_OK) die("raw sqlite", sqlite3_errmsg(db));
  char *msg = NULL;
  if (sqlite3_exec(db,
                   "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
                   "CREATE TABLE ev(id TEXT NOT NULL UNIQUE, session TEXT NOT NULL, idx INTEGER NOT NULL,"
                   " payload TEXT NOT NULL, PRIMARY KEY(session, idx)) WITHOUT ROWID;",
                   NULL, NULL, &msg) != SQLITE_OK)
    die("raw sqlite", msg ? msg : "schema");
  sqlite3_stmt *ins;
  if (sqlite3_prepare_v2(db, "INSERT INTO ev(id, session, idx, payload) VALUES (?, ?, ?, ?)", -1, &ins, NULL) !=
      SQLITE_OK)
    die("raw sqlite", sqlite3_errmsg(db));
  long n = 0, head[SESSIONS] = {0};
  double t0 = now_s(), t1 = t0;
  for (long k = 0; t1 - t0 < seconds; k++) {
    if (sqlite3_exec(db, "BEGIN", NULL, NULL, &msg) != SQLITE_OK) die("raw sqlite", msg ? msg : "begin");
    for (int i = 0; i < rows; i++, n++) {
      char id[64];
      int sess = (int)((n / (rows >= 100 ? 100 : 1)) % SESSIONS); /* batches of 100 (or 1) to a session in turn */
      snprintf(id, sizeof id, "0193a5c4-%04lx-7%03lx-8%03lx-%012lx", (unsigned long)(n >> 32) & 0xffff,
               (unsigned long)(n >> 20) & 0xfff, (unsigned long)(n >> 8) & 0xfff, (unsigned long)n & 0xffffffffffffUL);
      sqlite3_bind_text(ins, 1, id, 36, SQLITE_TRANSIENT);
      sqlite3_bind_text(ins, 2, session_name[sess], -1, SQLITE_STATIC);
      sqlite3_bind_int64(ins, 3, ++head[sess]);
      sqlite3_bind_text(ins, 4, PAYLOAD, (int)PAYLOAD_LEN, SQLITE_STATIC);
      if (sqlite3_step(ins) != SQLITE_DONE) die("raw sqlite", sqlite3_errmsg(db));
      sqlite3_reset(ins);
    }
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) die("raw sqlite", msg ? msg : "commit");
    t1 = now_s();
  }
  sqlite3_finalize(ins);
  sqlite3_close(db);
  remove_db(path);
  return (double)n / (t1 - t0);
}

/* The ceiling of any queue kept in SQLite, for the durable consume rows
 * (rawqueue): n jobs in bench/raw_queue.h's table (one partial index),
 * claimed 1,024 at a time (synchronous=NORMAL) and completed in one synced
 * commit per claim, from one thread (a SQLite file has one writer at a
 * time), no handler. */
static double raw_queue_consume(long n) {
  char path[1200];
  snprintf(path, sizeof path, "%s/rawq.db", dir);
  remove_db(path);
  raw_queue q = {.path = path, .payload = PAYLOAD, .payload_len = PAYLOAD_LEN, .n = n, .sessions = SESSIONS,
                 .batch = RAW_QUEUE_MAX_BATCH};
  double rate = raw_queue_run(&q);
  if (rate < 0) die("raw queue", q.err);
  remove_db(path);
  return rate;
}

/* n pending "job" events (settled: stored processed, as history), 100 per
 * session in turn, batches of 100. */
static void es_fill(es_store *s, long n, int settled) {
  es_err err = {0};
  es_new_event b[100];
  for (int k = 0; k < 100; k++) {
    es_new_event_init(&b[k]);
    b[k].type = "job";
    b[k].payload = PAYLOAD;
    b[k].payload_len = PAYLOAD_LEN;
    b[k].settled = settled;
  }
  for (long i = 0; i < n; i += 100) {
    int pending;
    size_t m = n - i < 100 ? (size_t)(n - i) : 100;
    if (es_store_append(s, session_name[(i / 100) % SESSIONS], b, m, ES_NONE, ES_NONE, NULL, &pending, &err))
      die("fill", err.msg);
  }
}

/* The engine (es_engine_run until idle, workers threads) over n pending
 * events; the handler is scripts/handlers/job.lua (trivial, or returning
 * one event). Opening the engine (its Lua states) is not timed. */
static double es_consume(int durable, long n, int workers, int produce) {
  char url[1300], path[1200];
  store_url(url, sizeof url, durable, path, sizeof path);
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open", err.msg);
  es_fill(s, n, 0);
  es_engine_opts o;
  es_engine_opts_init(&o);
  o.scripts = produce ? scripts_produce : scripts_ack;
  o.open_core = luaopen_eventstore_core;
  o.workers = workers;
  es_engine *e;
  if (es_engine_open(s, &o, &e, &err)) die("engine", err.msg);
  es_run_opts ro = {0};
  ro.until_idle = 1;
  es_engine_stats st;
  double t0 = now_s();
  if (es_engine_run(e, &ro, &st, &err)) die("run", err.msg);
  double rate = (double)n / (now_s() - t0);
  if (st.handled != n) {
    char msg[128];
    snprintf(msg, sizeof msg, "handled %lld of %ld", (long long)st.handled, n);
    die("engine", msg);
  }
  es_engine_close(e);
  es_store_release(s);
  if (durable) remove_db(path);
  return rate;
}

/* store:append of 100 events from Lua (the Lua module linked into this
 * program, as lua_path_bench does), one thread, memory:. */
static const char LUA_APPEND[] =
    "local seconds, sessions, now, answer = ...\n"
    "local eventstore = require 'eventstore'\n"
    "local s = eventstore.open('memory:')\n"
    "local payload = {customer = 'c-000123', items = {{qty = 2, sku = 'SKU-42'}}, note = 'leave at the door'}\n"
    "local b = {}\n"
    "for i = 1, 100 do b[i] = {type = 'order.placed', payload = payload, settled = true} end\n"
    "local n, k, t0 = 0, 0, now()\n"
    "local t1 = t0\n"
    "while t1 - t0 < seconds do\n"
    "  s:append(sessions[k % #sessions + 1], b, {answer = answer})\n"
    "  k = k + 1; n = n + 100; t1 = now()\n"
    "end\n"
    "s:close()\n"
    "return n / (t1 - t0)\n";

static int l_now(lua_State *L) {
  lua_pushnumber(L, now_s());
  return 1;
}

/* answer: append's opts.answer ("events": every stored event back, as
 * tables; "ids": their ids alone, what XADD answers). */
static double es_append_lua(double seconds, const char *answer) {
  lua_State *L = luaL_newstate();
  if (!L) die("lua", "no state");
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_eventstore_core);
  lua_setfield(L, -2, "eventstore.core");
  lua_pop(L, 1);
  if (luaL_loadstring(L, LUA_APPEND) != LUA_OK) die("lua", lua_tostring(L, -1));
  lua_pushnumber(L, seconds);
  lua_createtable(L, SESSIONS, 0);
  for (int i = 0; i < SESSIONS; i++) {
    lua_pushstring(L, session_name[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushcfunction(L, l_now);
  lua_pushstring(L, answer);
  if (lua_pcall(L, 4, 1, 0) != LUA_OK) die("lua", lua_tostring(L, -1));
  double rate = lua_tonumber(L, -1);
  lua_close(L);
  return rate;
}

/* ---- bytes per event ------------------------------------------------------- */

/* Heap in use (every arena, mmapped chunks included; malloc's chunk
 * headers included): what the store holds, without RSS's page rounding or
 * the freed memory glibc keeps. bench/README.md "Memory per event" found it
 * within a byte of the RSS growth. */
static double heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return (double)m.uordblks + (double)m.hblkhd + (double)es_hmap_mapped_bytes();
}

static long used_memory(redisContext *c) {
  redisReply *r = check(c, redisCommand(c, "INFO memory"), REDIS_REPLY_STRING, "INFO");
  const char *p = strstr(r->str, "used_memory:");
  if (!p) die("INFO", "no used_memory");
  long v = atol(p + strlen("used_memory:"));
  freeReplyObject(r);
  return v;
}

static void bytes_per_event(long n, double out[6]) {
  /* eventstore, memory:: n pending events, then all claimed and completed
   * through the C API (claim_next 64 + complete, no Lua) */
  es_store *s;
  es_err err = {0};
  double h0 = heap_bytes();
  if (es_store_open("memory:", NULL, &s, &err)) die("open", err.msg);
  es_fill(s, n, 0);
  double h1 = heap_bytes();
  long handled = 0;
  for (;;) {
    es_events got, done;
    int64_t retry;
    int outcome;
    if (es_store_claim_next(s, "bench", 30000, 64, NULL, 0, NULL, 0, &got, &retry, &err)) die("claim_next", err.msg);
    if (got.n == 0) break;
    for (size_t i = 0; i < got.n; i++) {
      if (es_store_complete(s, got.v[i].session, got.v[i].index, got.v[i].attempts, NULL, 0, ES_NONE, &outcome,
                            &done, &err))
        die("complete", err.msg);
      es_events_destroy(&done);
    }
    handled += (long)got.n;
    es_events_destroy(&got);
  }
  if (handled != n) die("bytes", "not every event was processed");
  double h2 = heap_bytes();
  es_store_release(s);
  out[0] = (h1 - h0) / (double)n;
  out[1] = (h2 - h0) / (double)n;
  /* and the same events appended settled (history never dispatched) */
  h0 = heap_bytes();
  if (es_store_open("memory:", NULL, &s, &err)) die("open", err.msg);
  es_fill(s, n, 1);
  out[5] = (heap_bytes() - h0) / (double)n;
  es_store_release(s);

  /* Redis in-memory: used_memory before, after XADD (entries no group has
   * read yet), after one consumer read and acknowledged them all; and the
   * streams' MEMORY USAGE (SAMPLES 0: every node counted) */
  server sv = start_redis(0);
  redisContext *c = must_connect(sv.port);
  long m0 = used_memory(c);
  redis_fill(c, n);
  long m1 = used_memory(c);
  long long usage = 0;
  for (int i = 0; i < SESSIONS; i++) {
    const char *argv[5] = {"MEMORY", "USAGE", session_name[i], "SAMPLES", "0"};
    redisReply *r = check(c, redisCommandArgv(c, 5, argv, NULL), REDIS_REPLY_INTEGER, "MEMORY USAGE");
    usage += r->integer;
    freeReplyObject(r);
  }
  redis_groups(c);
  redis_consume_filled(&sv, n, 1, 0);
  long m2 = used_memory(c);
  redisFree(c);
  stop_redis(&sv);
  out[2] = (double)(m1 - m0) / (double)n;
  out[3] = (double)(m2 - m0) / (double)n;
  out[4] = (double)usage / (double)n;
}

/* ---- rounds ---------------------------------------------------------------- */

typedef struct workload {
  const char *key;
  const char *what;
  const char *target;
} workload;

enum { APP100, APP1, MEMAPP, MEMAPP_LUA, MEMAPP_LUA_IDS, CON8, PROD8, MEMCON1, BOUND8, RAWQ, RAW100, RAW1, NW };

static const workload W[NW] = {
    {"append100", "durable append, 16 threads x batch 100", ">= 1.0"},
    {"append1", "durable append, 16 threads x batch 1", ">= 1.0"},
    {"memappend", "in-memory append, batch 100, C API", "(1.20 in issue)"},
    {"memappend-lua", "in-memory append, batch 100, Lua", ">= 1.0"},
    {"memappend-lua-ids", "in-memory append, batch 100, Lua, ids answer", "(as XADD)"},
    {"consume8", "durable consume + ack, 8 workers", ">= 1.0"},
    {"produce8", "durable consume + produce one, 8 workers", ">= 1.0"},
    {"memconsume1", "in-memory consume + ack, 1 worker", ">= 1.0"},
    {"bound8", "bound: in-memory engine / durable Redis, 8", "(consume8's ceiling)"},
    {"rawqueue", "bound: raw SQLite queue / durable Redis, 8", "(consume8's ceiling)"},
    {"rawsqlite100", "bound: raw SQLite 1,600 rows a commit / 16x100", "(append100's ceiling)"},
    {"rawsqlite1", "bound: raw SQLite 16 rows a commit / 16x1", "(append1's ceiling)"},
};

static void run_side(int w, int redis, double *rate) {
  double secs = 2.0 * scale < 0.2 ? 0.2 : 2.0 * scale;
  long n8 = (long)(100000 * scale), n1 = (long)(200000 * scale);
  if (n8 < 1000) n8 = 1000;
  if (n1 < 1000) n1 = 1000;
  switch (w) {
    case APP100: *rate = redis ? redis_append(1, 16, 100, secs) : es_append(1, 16, 100, secs); break;
    case APP1: *rate = redis ? redis_append(1, 16, 1, secs) : es_append(1, 16, 1, secs); break;
    case MEMAPP: *rate = redis ? redis_append(0, 1, 100, secs) : es_append(0, 1, 100, secs); break;
    case MEMAPP_LUA: *rate = redis ? redis_append(0, 1, 100, secs) : es_append_lua(secs, "events"); break;
    case MEMAPP_LUA_IDS: *rate = redis ? redis_append(0, 1, 100, secs) : es_append_lua(secs, "ids"); break;
    case CON8: *rate = redis ? redis_consume(1, n8, 8, 0) : es_consume(1, n8, 8, 0); break;
    case PROD8: *rate = redis ? redis_consume(1, n8, 8, 1) : es_consume(1, n8, 8, 1); break;
    case MEMCON1: *rate = redis ? redis_consume(0, n1, 1, 0) : es_consume(0, n1, 1, 0); break;
    /* consume8 with nothing stored on our side: what the engine would do
     * if durable storage cost nothing, against the same durable Redis */
    case BOUND8: *rate = redis ? redis_consume(1, n8, 8, 0) : es_consume(0, n8, 8, 0); break;
    /* the durable rows' Redis side against plain SQLite (raw_queue_consume,
     * raw_sqlite_append) */
    case RAWQ: *rate = redis ? redis_consume(1, n8, 8, 0) : raw_queue_consume(n8); break;
    case RAW100: *rate = redis ? redis_append(1, 16, 100, secs) : raw_sqlite_append(1600, secs); break;
    case RAW1: *rate = redis ? redis_append(1, 16, 1, secs) : raw_sqlite_append(16, secs); break;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double s[MAX_ROUNDS];
  memcpy(s, v, sizeof *v * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void make_scripts(char *out, size_t cap, const char *name, const char *handler) {
  snprintf(out, cap, "%s/%s", dir, name);
  char sub[1200];
  mkdir(out, 0755);
  snprintf(sub, sizeof sub, "%s/handlers", out);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/handlers/job.lua", out);
  FILE *f = fopen(sub, "w");
  if (!f) die("scripts", sub);
  fputs(handler, f);
  fclose(f);
}

static int selected(const char *key) {
  const char *only = getenv("REDIS_BENCH_ONLY");
  if (!only || !*only) return 1;
  /* a whole key of a space-separated list */
  size_t len = strlen(key);
  for (const char *p = only; (p = strstr(p, key)); p += len)
    if ((p == only || p[-1] == ' ') && (p[len] == 0 || p[len] == ' ')) return 1;
  return 0;
}

int main(int argc, char **argv) {
  dir = argc > 1 ? argv[1] : ".";
  const char *v;
  int rounds = (v = getenv("REDIS_BENCH_ROUNDS")) && *v ? atoi(v) : 5;
  if ((v = getenv("REDIS_BENCH_SCALE")) && *v) scale = atof(v);
  if ((v = getenv("REDIS_BENCH_COUNT")) && *v) xcount = atoi(v);
  if ((v = getenv("REDIS_SERVER")) && *v) redis_server = v;
  if (rounds < 1) rounds = 1;
  if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
  if (scale <= 0) scale = 1;
  if (xcount < 1) xcount = 1;
  if (xcount > 10000) xcount = 10000;
  for (int i = 0; i < SESSIONS; i++) snprintf(session_name[i], sizeof session_name[i], "s-%02d", i);
  make_scripts(scripts_ack, sizeof scripts_ack, "scripts_ack", "return function(e) return nil end\n");
  make_scripts(scripts_produce, sizeof scripts_produce, "scripts_produce",
               "return function(e) return {{type = \"job.done\", payload = e.payload}} end\n");

  printf("# redis_bench: eventstore / Redis Streams (%s), same machine, %d alternating rounds, scale %g,\n"
         "# XREADGROUP COUNT %d; ratio = eventstore/Redis per round (higher is better for us), median of them\n",
         redis_server, rounds, scale, xcount);
  fflush(stdout);

  /* Bytes first, in a heap that no workload has grown yet (the figure is
   * a difference of allocated bytes, so that is tidiness, not a need). */
  if (selected("bytes")) {
    long n = (long)(500000 * scale);
    if (n < 10000) n = 10000;
    double b[6];
    bytes_per_event(n, b);
    printf("%-44s es pending %.0f B, processed %.0f B, settled %.0f B | Redis XADDed %.0f B, acked %.0f B"
           " (MEMORY USAGE %.0f B) | processed/acked %.2fx  target <= 1.2x\n",
           "bytes per event, memory: / in-memory Redis", b[0], b[1], b[5], b[2], b[3], b[4], b[1] / b[3]);
    fflush(stdout);
  }

  double es[NW][MAX_ROUNDS], rd[NW][MAX_ROUNDS], ratio[NW][MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    for (int w = 0; w < NW; w++) {
      if (!selected(W[w].key)) continue;
      if (r % 2 == 0) {
        run_side(w, 0, &es[w][r]);
        run_side(w, 1, &rd[w][r]);
      } else {
        run_side(w, 1, &rd[w][r]);
        run_side(w, 0, &es[w][r]);
      }
      ratio[w][r] = es[w][r] / rd[w][r];
      fprintf(stderr, "redis_bench: round %d/%d %-14s %9.0f / %9.0f = %.2f\n", r + 1, rounds, W[w].key, es[w][r],
              rd[w][r], ratio[w][r]);
    }
  }
  int any = 0;
  for (int w = 0; w < NW; w++) any |= selected(W[w].key);
  if (any)
    printf("%-44s %11s %11s %6s  %-*s %s\n", "# workload (events/s, medians)", "eventstore", "Redis", "ratio",
         rounds * 5, "per round", "target");
  for (int w = 0; w < NW; w++) {
    if (!selected(W[w].key)) continue;
    char per[MAX_ROUNDS * 8] = "";
    for (int r = 0; r < rounds; r++)
      snprintf(per + strlen(per), sizeof per - strlen(per), "%s%.2f", r ? " " : "", ratio[w][r]);
    printf("%-44s %11.0f %11.0f %6.2f  %-*s %s\n", W[w].what, median(es[w], rounds), median(rd[w], rounds),
           median(ratio[w], rounds), rounds * 5, per, W[w].target);
  }
  rm_tree(scripts_ack);
  rm_tree(scripts_produce);
  return 0;
}
