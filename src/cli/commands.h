/* The subcommands of `megatrain`; each returns the process exit code. */
#ifndef MT_COMMANDS_H
#define MT_COMMANDS_H

int mt_cmd_info(int argc, char **argv);
int mt_cmd_convert(int argc, char **argv);
int mt_cmd_merge(int argc, char **argv);
int mt_cmd_bench(int argc, char **argv);
int mt_bench_adamw(int argc, char **argv); /* megatrain bench adamw */
int mt_cmd_train(int argc, char **argv);
int mt_cmd_eval(int argc, char **argv);
int mt_cmd_plan(int argc, char **argv);
int mt_cmd_generate(int argc, char **argv);
int mt_cmd_tokenize(int argc, char **argv);
int mt_cmd_plot(int argc, char **argv);
int mt_cmd_version(int argc, char **argv); /* also `megatrain --version` */

/* Prints "megatrain: <message>" for the current bad-input error and returns 1. */
int mt_cli_fail(void);

#endif
