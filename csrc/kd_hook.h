/* kd_hook.h - the Inductor launch hooks (kd_hook.c): the run and runner hooks,
 * C++ kernels, and what the runner hook captures.  KernelInfo is in
 * kd_kernel_info.h. */
#ifndef KD_HOOK_H
#define KD_HOOK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_kernel_info.h"

extern PyTypeObject kd_RunHookType;
extern PyTypeObject kd_RunnerHookType;
extern PyTypeObject kd_CppKernelType;

/* What the runner hook captures during a recorded launch. */
typedef struct kd_capture {
    int active;
    int have_grid;
    int have_config;
    uint32_t grid[3];
    uint32_t config_id;
    uint16_t num_warps;
    uint8_t num_stages;
    uint32_t shared_mem;
} kd_capture;

extern _Thread_local kd_capture kd_tls_capture;

/* Is Inductor benchmarking right now (upstream's _IN_INDUCTOR_BENCHMARK)? */
int kd_in_benchmark(void);

/* Adds the hook types and functions to module m; -1 with an exception on failure. */
int kd_hook_module_init(PyObject *m);

#endif
