/*
 * http.h: `eventstore serve` (docs/contract.md §6, docs/http.md): the store, and
 * the engine's reducers, over HTTP/1.1 on libmicrohttpd. A JSON API for
 * every store call a remote client needs, Server-Sent Events for live
 * tails, Prometheus metrics and the browser inspector's static files.
 *
 * The room is linked into the binary only (not into the Lua module or
 * libeventstore.a): embedders who never serve HTTP never load
 * libmicrohttpd. The binary's `serve` command (lua/eventstore/cli.lua)
 * reaches it through the Lua module `eventstore.http` (main/lua_http.c),
 * which core/main/main.c registers in package.preload.
 */
#ifndef ES_HTTP_H
#define ES_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "store/store.h"

typedef struct es_http es_http;

/* Limits (docs/http.md "Limits"); 0 in es_http_opts_init's result means
 * the default written beside each field. */
typedef struct es_http_limits {
  size_t max_body;             /* bytes of a request body (413 past it); default 16 MiB */
  size_t max_batch;            /* events in one append or complete (413); default 1000 */
  unsigned max_connections;    /* open connections at once; default 256 */
  unsigned request_timeout_s;  /* a request (headers and body) must arrive within it; an
                                  idle keep-alive connection is closed after it; default 30 */
  unsigned header_timeout_ms;  /* a request's headers must all arrive within it of the
                                  connection's accept (or of the previous answer on a
                                  keep-alive connection), else it is closed; default 10000 */
  unsigned max_per_client;     /* open connections from one client address; default
                                  max_connections / 2 (at least 1) */
  unsigned max_streams;        /* open SSE streams at once (503 past it); default 128 */
  size_t stream_buffer;        /* bytes an SSE client may leave unread before it is dropped;
                                  default 1 MiB */
  int64_t max_limit;           /* the largest `limit` a listing takes; default 1000 */
  size_t max_response_bytes;   /* a listing's page ends before the item that would take its
                                  answer past this (the first item is always sent);
                                  default 8 MiB */
} es_http_limits;

typedef struct es_http_opts {
  const char *listen;       /* "HOST:PORT", "[V6]:PORT" or ":PORT" (all addresses); port 0
                               picks a free one (es_http_port tells which) */
  const char *tokens_path;  /* the tokens file (docs/http.md "Tokens"); required */
  const char *static_dir;   /* the inspector's files; NULL: none served */
  const char *tls_cert_path; /* PEM certificate (chain) file: HTTPS only when given, with */
  const char *tls_key_path;  /* its unencrypted PEM private key; both or neither */
  es_http_limits limits;
} es_http_opts;

void es_http_opts_init(es_http_opts *o);

/* Starts serving root (retained) with engine's reducers for state (engine
 * borrowed, may be NULL: state is then NOT_FOUND; the caller runs or does
 * not run it, and keeps it open until es_http_stop returns). Returns once
 * the socket listens. Errors: INVALID_ARGUMENT (listen address, tokens
 * file: the message names the line; a TLS certificate or key that is
 * missing, unreadable, not PEM or not a pair: the message names the file;
 * TLS asked of a libmicrohttpd built without it), STORAGE (cannot bind,
 * out of memory). */
int es_http_start(es_store *root, es_engine *engine, const es_http_opts *o, es_http **out,
                  es_err *err);

/* The TCP port it listens on. */
int es_http_port(const es_http *h);

/* Whether it serves HTTPS (started with a certificate and key). */
int es_http_tls(const es_http *h);

/* Stops accepting, ends open SSE streams, waits for requests in flight
 * (each is one atomic store call, answered or not), frees everything. */
void es_http_stop(es_http *h);

#endif
