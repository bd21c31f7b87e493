/*
 * http/tls.h: the certificate and key `eventstore serve --tls-cert FILE
 * --tls-key FILE` serves HTTPS with (docs/http.md "TLS"). libmicrohttpd
 * does the TLS itself (GnuTLS); this file reads the two PEM files and
 * checks them first, so that a bad file is refused with its name before
 * anything listens (libmicrohttpd would only say that TLS did not start).
 */
#ifndef ES_HTTP_TLS_H
#define ES_HTTP_TLS_H

#include "es.h"

/* The two files' PEM text, NUL-terminated (libmicrohttpd takes C strings). */
typedef struct es_tls_pem {
  char *cert;
  char *key;
} es_tls_pem;

/* Reads and checks cert_path (one or more PEM certificates, the server's
 * first) and key_path (its unencrypted PEM private key). Errors
 * (INVALID_ARGUMENT, the message naming the file): this libmicrohttpd has
 * no TLS; a file missing, unreadable, empty, over 1 MiB or holding a NUL
 * byte; no certificate or no usable key in it; a key that is not the
 * certificate's. Warns on stderr when others than its owner may read the
 * key file. On success *out owns both texts (es_tls_pem_free). */
int es_tls_pem_load(const char *cert_path, const char *key_path, es_tls_pem *out, es_err *err);

/* Frees both texts, the key's overwritten first. */
void es_tls_pem_free(es_tls_pem *p);

#endif
