/*
 * http_server_test.c: the HTTP server's C face (http/http.h) and its
 * tokens file (http/tokens.h), without the binary: listen addresses,
 * start/port/stop (again and again, so leaks show under ASan and
 * valgrind), a bound port refused, the tokens file's rules (digests,
 * constant-time lookup results, rights, tenants checked by the store),
 * and TLS: a certificate and key (made with openssl, which `make deps`
 * installs) served, and the files it refuses, named.
 * TAP-style output; non-zero exit on failure.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http.h"
#include "http/internal.h"
#include "http/tokens.h"
#include "store/store.h"

#include "tap.h"

static int says(const es_err *err, const char *part) { return strstr(err->msg, part) != NULL; }

static char dir[] = "/tmp/es_http_test_XXXXXX";

static const char *write_tokens(const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/tokens", dir);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

/* Whether a TCP connection to 127.0.0.1:port succeeds. */
static int can_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  close(fd);
  return rc == 0;
}

static void tokens_file(es_store *root) {
  es_err err = {0};
  es_tokens *t = NULL;
  int *plain = NULL;
  char hash[ES_TOKEN_HASH_CHARS];
  es_token_hash("abc", 3, hash, &err);
  ok(strcmp(hash, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0,
     "token hash: sha256: and the SHA-256 in hex (FIPS 180-2 'abc')");
  es_token_hash("secret-1", 8, hash, &err);
  char text[512];
  snprintf(text, sizeof text, "# ops\n\n%s * admin\n  plain-2\tacme  read,append\nw3 globex work\n", hash);
  int rc = es_tokens_load(write_tokens(text), root, &t, &plain, &err);
  ok(rc == ES_OK, "tokens: a good file loads");
  if (rc == ES_OK) {
    const char *tenant = "x";
    int rights = 0;
    ok(es_tokens_find(t, "secret-1", 8, &tenant, &rights) && tenant == NULL && rights == ES_RIGHT_ADMIN,
       "tokens: a hashed token is found by its plain text, '*' is no tenant");
    ok(es_tokens_find(t, "plain-2", 7, &tenant, &rights) && strcmp(tenant, "acme") == 0 &&
           rights == (ES_RIGHT_READ | ES_RIGHT_APPEND),
       "tokens: a plain token, its tenant and rights");
    ok(!es_tokens_find(t, "plain-", 6, &tenant, &rights), "tokens: a prefix of a token is not it");
    ok(!es_tokens_find(t, hash, strlen(hash), &tenant, &rights), "tokens: the hash is not a token");
    ok(plain && plain[0] == 4 && plain[1] == 5 && plain[2] == 0, "tokens: plain-text lines are reported");
    es_tokens_release(t);
    free(plain);
  }
  static const struct { const char *text, *says; } bad[] = {
      {"a b\n", "tokens:1: expected 'TOKEN TENANT RIGHTS'"},
      {"a b c d\n", "tokens:1: expected"},
      {"a acme reed\n", "tokens:1: unknown right 'reed'"},
      {"a acme read,\n", "unknown right ''"},
      {"sha256:zz acme read\n", "tokens:1: a hashed token"},
      {"a acme read\n#\na globex read\n", "tokens:3: the same token as line 1"},
      {"a \x1b" "bad read\n", "tokens:1: tenant"},
      {"\n# none\n", "holds no token"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    t = NULL;
    memset(&err, 0, sizeof err);
    rc = es_tokens_load(write_tokens(bad[i].text), root, &t, NULL, &err);
    char name[160];
    snprintf(name, sizeof name, "tokens: refused with '%s'", bad[i].says);
    ok(rc == ES_INVALID_ARGUMENT && t == NULL && says(&err, bad[i].says), name);
    if (rc != ES_INVALID_ARGUMENT) printf("# got %d: %s\n", rc, err.msg);
  }
  char missing[300];
  snprintf(missing, sizeof missing, "%s/none", dir);
  rc = es_tokens_load(missing, root, &t, NULL, &err);
  ok(rc != ES_OK && says(&err, "none"), "tokens: a missing file is named");
  char a[ES_TOKEN_NEW_CHARS], b[ES_TOKEN_NEW_CHARS];
  es_token_new(a, &err);
  es_token_new(b, &err);
  ok(strlen(a) == 64 && strcmp(a, b) != 0, "token new: 64 hex digits, fresh each time");
}

static void start_stop(es_store *root) {
  const char *tokens = write_tokens("t * admin\n");
  es_err err = {0};
  es_http_opts o;
  es_http *h = NULL;
  static const char *const bad[] = {"", "8080", "localhost", "127.0.0.1:", "127.0.0.1:65536",
                                    "127.0.0.1:-1", "1.2.3:80", "[::1:80", "example.com:80",
                                    "::1:80", "127.0.0.1:80x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    es_http_opts_init(&o);
    o.listen = bad[i];
    o.tokens_path = tokens;
    char name[128];
    snprintf(name, sizeof name, "listen: '%s' refused naming it", bad[i]);
    ok(es_http_start(root, NULL, &o, &h, &err) == ES_INVALID_ARGUMENT && h == NULL &&
           says(&err, "listen address"),
       name);
  }
  es_http_opts_init(&o);
  o.listen = "127.0.0.1:0";
  ok(es_http_start(root, NULL, &o, &h, &err) == ES_INVALID_ARGUMENT && says(&err, "tokens file"),
     "start: a tokens file is required");
  o.tokens_path = tokens;
  int first = 0;
  for (int i = 0; i < 3; i++) {
    h = NULL;
    int rc = es_http_start(root, NULL, &o, &h, &err);
    ok(rc == ES_OK && h && es_http_port(h) > 0, "start: port 0 picks a free port");
    if (rc != ES_OK) {
      printf("# %s\n", err.msg);
      continue;
    }
    int port = es_http_port(h);
    ok(can_connect(port), "start: it listens once start returns");
    if (i == 0) {
      first = port;
      char busy[64];
      snprintf(busy, sizeof busy, "127.0.0.1:%d", port);
      es_http_opts o2 = o;
      o2.listen = busy;
      es_http *h2 = NULL;
      ok(es_http_start(root, NULL, &o2, &h2, &err) == ES_STORAGE && h2 == NULL && says(&err, busy),
         "start: a port in use is STORAGE naming the address");
    }
    es_http_stop(h);
    ok(!can_connect(port), "stop: the port is free again");
  }
  (void)first;
  es_store *tenant = NULL;
  es_store_tenant(root, "acme", &tenant, &err);
  ok(es_http_start(tenant, NULL, &o, &h, &err) == ES_INVALID_ARGUMENT, "start: not on a tenant handle");
  es_store_release(tenant);
  es_http_stop(NULL);
}

/* dir/NAME into buf. */
static const char *in_dir(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
  return buf;
}

static void tls_start(es_store *root) {
  char cmd[1024], cert[300], key[300], other[300], missing[300];
  in_dir(cert, sizeof cert, "cert.pem");
  in_dir(key, sizeof key, "key.pem");
  in_dir(other, sizeof other, "other.key");
  in_dir(missing, sizeof missing, "missing.pem");
  snprintf(cmd, sizeof cmd,
           "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
           "-subj /CN=127.0.0.1 -keyout key.pem -out cert.pem >/dev/null 2>&1 && "
           "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out other.key >/dev/null 2>&1 && "
           "chmod 600 key.pem other.key",
           dir);
  int made = system(cmd) == 0;
  ok(made, "tls: openssl made a certificate and two keys (make deps installs openssl)");
  if (!made) return;
  const char *tokens = write_tokens("t * admin\n");
  es_err err = {0};
  es_http_opts o;
  es_http *h = NULL;
  es_http_opts_init(&o);
  o.listen = "127.0.0.1:0";
  o.tokens_path = tokens;
  o.tls_cert_path = cert;
  ok(es_http_start(root, NULL, &o, &h, &err) == ES_INVALID_ARGUMENT && h == NULL &&
         says(&err, "both a certificate and its key"),
     "tls: a certificate without its key is refused");
  static const struct { int cert, key; const char *says; } bad[] = {
      {2, 1, "cannot read the TLS certificate file"},
      {0, 2, "cannot read the TLS key file"},
      {0, 0, "holds no usable private key"},
      {1, 1, "holds no usable PEM certificate"},
      {0, 3, "cannot be served together"},
  };
  const char *files[] = {cert, key, missing, other};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.tls_cert_path = files[bad[i].cert];
    o.tls_key_path = files[bad[i].key];
    int rc = es_http_start(root, NULL, &o, &h, &err);
    char name[160];
    snprintf(name, sizeof name, "tls: refused, naming the file: %s", bad[i].says);
    ok(rc == ES_INVALID_ARGUMENT && h == NULL && says(&err, bad[i].says) &&
           (says(&err, o.tls_cert_path) || says(&err, o.tls_key_path)),
       name);
    if (rc != ES_INVALID_ARGUMENT) printf("# %s\n", err.msg);
  }
  o.tls_cert_path = cert;
  o.tls_key_path = key;
  for (int i = 0; i < 2; i++) { /* twice: leaks of a start show under ASan and valgrind */
    h = NULL;
    int rc = es_http_start(root, NULL, &o, &h, &err);
    ok(rc == ES_OK && es_http_tls(h) == 1 && can_connect(es_http_port(h)),
       "tls: a certificate and its key are served");
    if (rc != ES_OK) printf("# %s\n", err.msg);
    es_http_stop(h);
  }
  o.tls_cert_path = o.tls_key_path = NULL;
  h = NULL;
  ok(es_http_start(root, NULL, &o, &h, &err) == ES_OK && es_http_tls(h) == 0,
     "tls: without them, plain HTTP");
  es_http_stop(h);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  es_store *root = NULL;
  es_err err = {0};
  if (es_store_open("memory:", NULL, &root, &err) != ES_OK) {
    printf("not ok 1 - open memory: %s\n", err.msg);
    return 1;
  }
  tokens_file(root);
  start_stop(root);
  tls_start(root);
  es_store_release(root);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("# could not remove %s\n", dir);
  printf("1..%d\n", test_no);
  return failures ? 1 : 0;
}
