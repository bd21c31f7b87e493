/*
 * http/tls.c: reading and checking the TLS certificate and key (tls.h).
 * The checks are GnuTLS's own, the calls libmicrohttpd makes when it
 * starts TLS, made here one file at a time so that the error names the
 * file at fault.
 */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "http/tls.h"

#define MAX_PEM_FILE (1024 * 1024) /* a certificate chain is a few KiB */

/* Reads path whole into a NUL-terminated malloc'd string. what names the
 * file in errors ("certificate", "key"). */
static int read_pem(const char *what, const char *path, char **out, es_err *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return es_fail(err, ES_INVALID_ARGUMENT, "cannot read the TLS %s file '%s': %s", what, path, strerror(errno));
  char *text = malloc(MAX_PEM_FILE + 1);
  if (!text) {
    fclose(f);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  size_t n = fread(text, 1, MAX_PEM_FILE + 1, f);
  int bad = ferror(f);
  int e = errno;
  fclose(f);
  const char *why = bad ? strerror(e) : n == 0 ? "it is empty" : n > MAX_PEM_FILE ? "it is over 1 MiB"
                    : memchr(text, '\0', n) ? "it holds a NUL byte (PEM is text)" : NULL;
  if (why) {
    sodium_memzero(text, n < MAX_PEM_FILE ? n : MAX_PEM_FILE);
    free(text);
    return es_fail(err, ES_INVALID_ARGUMENT, "cannot use the TLS %s file '%s': %s", what, path, why);
  }
  text[n] = '\0';
  *out = text;
  return ES_OK;
}

int es_tls_pem_load(const char *cert_path, const char *key_path, es_tls_pem *out, es_err *err) {
  memset(out, 0, sizeof *out);
  if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "this libmicrohttpd is built without TLS: --tls-cert and --tls-key cannot be served "
                   "(Debian's libmicrohttpd12 has it; or put a TLS proxy in front)");
  if (read_pem("certificate", cert_path, &out->cert, err) != ES_OK) return err->code;
  if (read_pem("key", key_path, &out->key, err) != ES_OK) {
    es_tls_pem_free(out);
    return err->code;
  }
  gnutls_datum_t cd = {(unsigned char *)out->cert, (unsigned)strlen(out->cert)};
  gnutls_datum_t kd = {(unsigned char *)out->key, (unsigned)strlen(out->key)};

  gnutls_x509_crt_t *list = NULL;
  unsigned nlist = 0;
  int rc = gnutls_x509_crt_list_import2(&list, &nlist, &cd, GNUTLS_X509_FMT_PEM, 0);
  for (unsigned i = 0; rc >= 0 && i < nlist; i++) gnutls_x509_crt_deinit(list[i]);
  gnutls_free(list);
  if (rc < 0 || nlist == 0) {
    es_fail(err, ES_INVALID_ARGUMENT,
            "the TLS certificate file '%s' holds no usable PEM certificate (-----BEGIN CERTIFICATE-----): %s",
            cert_path, rc < 0 ? gnutls_strerror(rc) : "none found");
    es_tls_pem_free(out);
    return err->code;
  }

  gnutls_x509_privkey_t key = NULL;
  rc = gnutls_x509_privkey_init(&key);
  if (rc >= 0) rc = gnutls_x509_privkey_import2(key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
  if (key) gnutls_x509_privkey_deinit(key);
  if (rc < 0) {
    es_fail(err, ES_INVALID_ARGUMENT,
            "the TLS key file '%s' holds no usable private key (an unencrypted PEM key is needed): %s",
            key_path, gnutls_strerror(rc));
    es_tls_pem_free(out);
    return err->code;
  }

  /* The pair, as libmicrohttpd will load it: GnuTLS refuses a key that is
   * not the first certificate's. */
  gnutls_certificate_credentials_t cred = NULL;
  rc = gnutls_certificate_allocate_credentials(&cred);
  if (rc >= 0) rc = gnutls_certificate_set_x509_key_mem2(cred, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
  if (cred) gnutls_certificate_free_credentials(cred);
  if (rc < 0) {
    es_fail(err, ES_INVALID_ARGUMENT, "the TLS certificate file '%s' and key file '%s' cannot be served together: %s",
            cert_path, key_path, gnutls_strerror(rc));
    es_tls_pem_free(out);
    return err->code;
  }

  struct stat st;
  if (stat(key_path, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    fprintf(stderr,
            "eventstore serve: warning: the TLS key file %s has mode %04o: others than its owner may "
            "read it (chmod 600 it)\n", key_path, (unsigned)(st.st_mode & 07777));
    fflush(stderr);
  }
  return ES_OK;
}

void es_tls_pem_free(es_tls_pem *p) {
  if (!p) return;
  if (p->key) sodium_memzero(p->key, strlen(p->key));
  free(p->key);
  free(p->cert);
  p->key = p->cert = NULL;
}
