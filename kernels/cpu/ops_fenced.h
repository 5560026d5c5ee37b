/* Debugging device "cpu-fenced" (kernels/cpu/ops_fenced.c): the CPU device whose device memory
 * is fenced off from the host. It proves, on a machine without a GPU, that the model and the
 * training loop treat device memory as device memory.
 *
 * mem_alloc returns its own mmap'd pages (one mapping per allocation), kept PROT_NONE except
 * while one of this device's entries uses them: each entry checks that every device pointer
 * argument lies inside a live allocation (else -EFAULT naming the entry and the argument; the
 * copies also check the whole byte range, and that the host side is NOT device memory), opens
 * just those allocations (PROT_READ|PROT_WRITE, reference-counted), calls the same entry of
 * ops_cpu (so results are bit for bit the CPU device's) and closes them again. Host code that
 * reads or writes device memory outside a device call gets SIGSEGV at the faulting instruction;
 * so would an op touching device memory it was not given. mem_free of a pointer that is not a
 * live allocation prints it and aborts (a double free or a host pointer: a bug).
 *
 * For tests only: slow (a linear search of the allocation list per pointer, mprotect calls per
 * entry) and a page per allocation at least. The allocation list is guarded by a mutex, but the
 * fence is exact only single-threaded: while one thread is inside an entry, the allocations that
 * entry opened are open to every thread. */
#ifndef PFCPS_KERNELS_CPU_OPS_FENCED_H
#define PFCPS_KERNELS_CPU_OPS_FENCED_H

#include "kernels/ops.h"

extern const ops_device ops_cpu_fenced;

#endif
