/* Debugging device "cpu-fenced" (kernels/cpu/ops_fenced.c): the CPU device whose device memory
 * is fenced off from the host. It proves, on a machine without a GPU, that the model and the
 * training loop treat device memory as device memory.
 *
 * mem_alloc returns its own mmap'd pages, kept PROT_NONE except while one of this device's entries
 * runs: every entry unprotects all live allocations, calls the same entry of ops_cpu (so results
 * are bit for bit the CPU device's), and protects them again. Host code that reads or writes device
 * memory outside a device call gets SIGSEGV at the faulting instruction. Every pointer argument of
 * every entry is also checked to lie inside a live allocation (host pointers where device memory is
 * expected fail with -EFAULT naming the entry and the argument; mem_h2d / mem_d2h / mem_d2d check
 * the whole byte range, and that the host side is NOT device memory); mem_free of a pointer that is
 * not a live allocation prints the pointer and aborts (a double free or a host pointer: a bug).
 *
 * For tests only: slow (two mprotect calls per live allocation per entry) and a page per
 * allocation at least. The allocation list is guarded by a mutex, but the fence is exact only
 * single-threaded: while any thread is inside an entry, all allocations are open to every thread. */
#ifndef PFCPS_KERNELS_CPU_OPS_FENCED_H
#define PFCPS_KERNELS_CPU_OPS_FENCED_H

#include "kernels/ops.h"

extern const ops_device ops_cpu_fenced;

#endif
