/* contract.h - `drama contract`: every registered kernel against a float64 reference, with
 * adversarial fixtures, a tolerance derived from its precision contract, precision-discriminating
 * fixtures and planted controls that must fail. Rules: docs/contract.md.
 *
 * Output: one line per kernel and per control, then exactly
 *   SUMMARY N kernels: P pass, F fail; C controls: R red as planted, M missed
 * The run is green when F == 0 and M == 0. */
#ifndef DRAMA_TOOLS_CONTRACT_H
#define DRAMA_TOOLS_CONTRACT_H

#include <stdint.h>
#include <stdio.h>

typedef struct dr_contract_options {
    const char *only;   /* glob (fnmatch) or substring over "<name>" or "<backend>/<name>"; NULL = all */
    int no_limits;      /* skip the timing runs */
    int threads;        /* worker threads for kernels that take a pool (0 = 2) */
    uint64_t seed;      /* fixture seed (0 = the fixed default) */
    int list;           /* only list the registry */
    const char *golden; /* golden data folder for the format fixtures (NULL: $DRAMA_GOLDEN, else none) */
} dr_contract_options;

typedef struct dr_contract_summary {
    int kernels, pass, fail;
    int controls, red, missed;
    int listed;            /* --list: entries listed */
    int not_run;           /* set only when every selected entry was unavailable (e.g. no CUDA device) */
    char not_run_why[200]; /* and why */
} dr_contract_summary;

/* Runs the contract and prints to `out`. Returns 0 when green, 1 otherwise. */
int dr_contract_run(const dr_contract_options *o, FILE *out, dr_contract_summary *summary);

#endif
