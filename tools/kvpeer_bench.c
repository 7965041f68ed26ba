/* kvpeer_bench.c -- `kvpeer bench` (in progress). */
#include "kvpeer_cli.h"

#include <stdio.h>

int cli_cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvpeer bench: not yet\n");
    return CLI_EXIT_FAIL;
}
