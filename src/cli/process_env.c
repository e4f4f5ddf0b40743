#include "process_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set with the policy by the re-exec, so the run header can say whose choice it was. */
#define MARKER "MT_DEFAULT_OMP_WAIT_POLICY"

void mt_process_env_init(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0 || setenv(MARKER, "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* no /proc (or exec refused): go on with libgomp's own default */
    unsetenv("OMP_WAIT_POLICY");
    unsetenv(MARKER);
}

const char *mt_process_wait_policy(void) {
    static char text[96];
    const char *p = getenv("OMP_WAIT_POLICY");
    if (!p) return "libgomp's default (spin, then sleep)";
    snprintf(text, sizeof text, "%s (%s)", p, getenv(MARKER) ? "megatrain's default" : "OMP_WAIT_POLICY");
    return text;
}
