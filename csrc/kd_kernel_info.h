/* kd_kernel_info.h - KernelInfo (kd_kernel_info.c): per-kernel facts the
 * launch hooks and the launch path read. */
#ifndef KD_KERNEL_INFO_H
#define KD_KERNEL_INFO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* kdebug._C.KernelInfo; added to the module by kd_hook_module_init. */
extern PyTypeObject kd_KernelInfoType;

/* Per-kernel facts, computed once when a kernel is first recorded. */
typedef struct kd_kernel_info {
    PyObject_HEAD
    uint32_t name_id;
    uint8_t kind;
    uint8_t device_type;
    int8_t device_index;
    uint32_t nnames;
    uint32_t *name_ids; /* argument names, in call order */
    uint8_t *roles;     /* KD_ROLE_* per argument */
    uint32_t launcher_args; /* trailing arguments the launcher takes and the kernel does not
                             * (Inductor's extra_launcher_args: the grid of a user kernel) */
} kd_kernel_info;

#endif
