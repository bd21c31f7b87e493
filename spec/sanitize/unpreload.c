/*
 * spec/sanitize/unpreload.c: a helper of `make check-sanitize`, preloaded
 * into lua5.4 right after the ASan runtime (spec/sanitize/lua5.4).
 *
 * The module under test is built with ASan and the system lua5.4 is not, so
 * the runtime has to be preloaded. Left in the environment, LD_PRELOAD
 * would also put it into every program the specs spawn (sh, mktemp, date,
 * install, make, script, ...): none of them is ours, and with leak
 * detection on, LeakSanitizer fails them at exit on their own leaks (or
 * aborts them when they have closed stderr). So, once loaded, this removes
 * LD_PRELOAD from the process's environment; a lua5.4 spawned by a spec
 * finds spec/sanitize/lua5.4 first on PATH and is preloaded again, and the
 * eventstore binary of build-san links the runtime itself.
 */
#define _POSIX_C_SOURCE 200112L /* unsetenv */
#include <stdlib.h>

__attribute__((constructor)) static void es_unpreload(void) { unsetenv("LD_PRELOAD"); }
