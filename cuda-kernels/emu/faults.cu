// Deliberately broken kernels: the emulator's own tests check that each
// fault is caught and reported with block and thread coordinates.

// Reads a neighbour's shared-memory slot without a barrier.
extern "C" __global__ void fault_missing_barrier(float* out) {
    DYN_SMEM(float, s);
    int t = threadIdx.x;
    s[t] = (float)t;
    out[t] = s[blockDim.x - 1 - t];
}

// The same with the barrier: the correct twin.
extern "C" __global__ void fault_fixed_barrier(float* out) {
    DYN_SMEM(float, s);
    int t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    out[t] = s[blockDim.x - 1 - t];
}

extern "C" __global__ void fault_divergent_barrier(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void fault_early_exit(float* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void fault_shfl_exited_lane(float* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_sync(FULL_MASK, (float)threadIdx.x, 0);
}

// Lane 32 waits at a barrier that warp 1's other lanes never reach, while
// they wait for lane 32 in a shuffle.
extern "C" __global__ void fault_deadlock(float* out) {
    if (threadIdx.x == 32 || threadIdx.x < 32) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_sync(FULL_MASK, 1.0f, 0);
    }
}

// Reads shared memory filled by cp.async before waiting for it.
extern "C" __global__ void fault_cp_async_no_wait(const float* in, float* out) {
    DYN_SMEM(float, s);
    int t = threadIdx.x;
    cp_async16(s + 4 * t, in + 4 * t, 16);
    cp_async_commit();
    out[t] = s[4 * t];
    cp_async_wait<0>();
}

extern "C" __global__ void fault_out_of_bounds(float* out, int n) {
    if (threadIdx.x == 0) out[n] = 1.0f;
}

// A race between blocks: each block's thread 0 takes the next ticket from a
// plain (non-atomic) counter after the block slots, so the tickets record
// the order the blocks ran in.
extern "C" __global__ void fault_block_order(float* out) {
    unsigned n = gridDim.x * gridDim.y;
    if (threadIdx.x == 0) {
        float ticket = out[n];
        out[blockIdx.y * gridDim.x + blockIdx.x] = ticket;
        out[n] = ticket + 1.0f;
    }
}
