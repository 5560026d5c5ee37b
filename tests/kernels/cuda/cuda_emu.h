// A CPU emulator for simple CUDA kernels (tests only, host C++): one block at a time, its threads as
// fibers (ucontext) on one OS thread, so that kernel code written for the GPU runs unchanged on a
// machine without one. Supported: threadIdx/blockIdx/blockDim/gridDim (.x), __shared__ (static
// storage: blocks never overlap), __syncthreads (all live threads of the block meet; a thread that
// returns while others wait is a divergence error and aborts), __shfl_down_sync on float/double
// (implemented as a block-wide exchange: every thread of the block must call it, as the head
// kernels' reductions do; lanes beyond the warp keep their value, as on the GPU).
// Not modelled: concurrency between blocks, memory ordering, atomics, warp divergence, streams.
// Fibers switch with a 6-register swap on x86-64 (glibc's swapcontext makes a signal-mask system
// call per switch, ten times slower), with ucontext elsewhere or when PFCPS_EMU_UCONTEXT is defined.
// Use: #include this, then the kernel source (__global__ functions become host functions), and
// launch with emu_launch(grid, block, [&] { kernel(args...); }).
#ifndef PFCPS_TESTS_KERNELS_CUDA_CUDA_EMU_H
#define PFCPS_TESTS_KERNELS_CUDA_CUDA_EMU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define PFCPS_CUDA_EMU 1
#define __global__
#define __device__
#define __shared__ static

struct emu_dim {
    unsigned x, y, z;
};
static emu_dim threadIdx, blockIdx, blockDim, gridDim;

#if defined(__x86_64__) && !defined(PFCPS_EMU_UCONTEXT)
// emu_switch(save, to): pushes the callee-saved registers, stores rsp in *save, loads `to`, pops, ret.
extern "C" void emu_switch(void **save, void *to);
__asm__(".pushsection .text\n" // the compiler's current section is restored below
        ".p2align 4\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n"
        ".popsection\n");
#endif

namespace emu
{
enum { MAX_THREADS = 1024, STACK = 64 * 1024 };
enum { READY = 0, AT_BARRIER = 1, DONE = 2 };
static std::vector<char> stacks((size_t)MAX_THREADS *STACK + 64);
static std::vector<int> state(MAX_THREADS);
static std::vector<double> slot(MAX_THREADS);
static unsigned cur;
static std::function<void()> body;
static long switches; // fiber resumptions, for the test's report
#if defined(__x86_64__) && !defined(PFCPS_EMU_UCONTEXT)
static void *main_sp;
static std::vector<void *> sp(MAX_THREADS);
static void to_main()
{
    emu_switch(&sp[cur], main_sp);
}
static void to_fiber(unsigned i)
{
    emu_switch(&main_sp, sp[i]);
}
#else
static ucontext_t main_ctx;
static std::vector<ucontext_t> ctx(MAX_THREADS);
static void to_main()
{
    swapcontext(&ctx[cur], &main_ctx);
}
static void to_fiber(unsigned i)
{
    swapcontext(&main_ctx, &ctx[i]);
}
#endif

static void entry()
{
    body();
    state[cur] = DONE;
    to_main();
    abort(); // a finished fiber is never resumed
}

static void start(unsigned i)
{
    char *base = &stacks[(size_t)i * STACK];
#if defined(__x86_64__) && !defined(PFCPS_EMU_UCONTEXT)
    uintptr_t top = ((uintptr_t)(base + STACK)) & ~(uintptr_t)15;
    void **p = (void **)top;
    *--p = NULL;          // so that rsp % 16 == 8 at entry's first instruction, as after a call
    *--p = (void *)entry; // emu_switch's ret lands here
    for (int r = 0; r < 6; r++)
        *--p = NULL; // rbp rbx r12 r13 r14 r15
    sp[i] = p;
#else
    getcontext(&ctx[i]);
    ctx[i].uc_stack.ss_sp = base;
    ctx[i].uc_stack.ss_size = STACK;
    ctx[i].uc_link = &main_ctx;
    makecontext(&ctx[i], (void (*)())entry, 0);
#endif
}

static void run_block(unsigned nthreads)
{
    for (unsigned i = 0; i < nthreads; i++) {
        start(i);
        state[i] = READY;
    }
    for (;;) {
        for (unsigned i = 0; i < nthreads; i++) {
            if (state[i] != READY)
                continue;
            cur = i;
            threadIdx = {i, 0, 0};
            switches++;
            to_fiber(i);
        }
        unsigned waiting = 0, done = 0;
        for (unsigned i = 0; i < nthreads; i++) {
            waiting += state[i] == AT_BARRIER;
            done += state[i] == DONE;
        }
        if (!waiting)
            return;
        if (done) {
            fprintf(stderr,
                    "emu: block %u: %u threads wait at __syncthreads while %u returned (divergent barrier)\n",
                    blockIdx.x, waiting, done);
            abort();
        }
        for (unsigned i = 0; i < nthreads; i++)
            state[i] = READY;
    }
}
} // namespace emu

static inline void __syncthreads()
{
    emu::state[emu::cur] = emu::AT_BARRIER;
    emu::to_main();
}

static inline double emu_shfl_down(double v, int off)
{
    unsigned t = threadIdx.x;
    emu::slot[t] = v;
    __syncthreads();
    unsigned lane = t & 31u;
    double r = (lane + (unsigned)off < 32u && t + (unsigned)off < blockDim.x) ? emu::slot[t + off] : v;
    __syncthreads();
    return r;
}
static inline float __shfl_down_sync(unsigned, float v, int off)
{
    return (float)emu_shfl_down(v, off);
}
static inline double __shfl_down_sync(unsigned, double v, int off)
{
    return emu_shfl_down(v, off);
}

// Runs `kernel` (a callable invoking the __global__ function) for grid blocks of `block` threads.
template <class F> static void emu_launch(unsigned grid, unsigned block, F kernel)
{
    if (block == 0 || block > emu::MAX_THREADS) {
        fprintf(stderr, "emu: block of %u threads\n", block);
        abort();
    }
    emu::body = kernel;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        emu::run_block(block);
    }
}

#endif
