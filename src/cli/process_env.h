/* The process's OpenMP defaults, chosen before any parallel region runs. */
#ifndef MT_PROCESS_ENV_H
#define MT_PROCESS_ENV_H

/* When OMP_WAIT_POLICY is not set, sets it to PASSIVE and re-executes the program (libgomp reads
 * its environment once, when it is loaded, so setting it in main is too late). An idle OpenMP
 * thread then sleeps instead of spinning, which on a machine that is busy with other work keeps
 * our own spinning threads from taking the cores the working ones need: measured on the 2-core
 * box (bench/RESULTS.md, "threads on a busy machine"), generate ran 8-10x and a CPU training run
 * 3x faster with other processes running, and at most a few percent slower on free cores. A user's OMP_WAIT_POLICY is kept as it is.
 * Returns only when no re-exec happened (or it failed: then the process goes on as it is). */
void mt_process_env_init(char **argv);

/* "passive (megatrain's default)", "active (OMP_WAIT_POLICY)", ... for the run header. */
const char *mt_process_wait_policy(void);

#endif
