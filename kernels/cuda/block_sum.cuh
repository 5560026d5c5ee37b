// Block-wide double sum for the CUDA kernels (kernels/cuda/ops_kernels.cuh, head_kernels.cuh; also compiled
// as host C++ under tests/kernels/cuda/cuda_emu.h): warp shuffles, then thread 0 adds the warps' sums in warp
// order. WARPS: the most warps a block has (blockDim.x <= 32 WARPS, a multiple of 32).
#ifndef PFCPS_KERNELS_CUDA_BLOCK_SUM_CUH
#define PFCPS_KERNELS_CUDA_BLOCK_SUM_CUH

/* Sum of v over the block; every thread gets the result. */
template <int WARPS> static __device__ double block_sum_d(double v)
{
    __shared__ double part[WARPS];
    __shared__ double total;
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            t += part[w];
        total = t;
    }
    __syncthreads();
    double r = total;
    __syncthreads(); /* part / total may be rewritten by the next call */
    return r;
}

#endif
