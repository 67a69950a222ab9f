// CPU emulation of the CUDA execution model, so that the kernels in
// src/kernels/*.cu compile as plain C++ (g++ -include cuda_emu.h) and run on a
// machine without a GPU. Every CUDA thread is a user-space fiber; the blocks
// of a grid run one after another. Threads switch only at block barriers and
// warp collectives, and the runtime (runtime.cpp) picks the order in which
// runnable threads go on (forward, reverse or random), so a result that
// depends on that order exposes a missing barrier.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#define CUDA_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// All fibers of a block share one OS thread and blocks run in turn, so a
// thread-local static is exactly per-block shared storage.
#define __shared__ static thread_local

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace emu {
struct Block {
    uint3 bid;
    dim3 gdim, bdim;
    unsigned char* dyn_smem;
};
struct Thread;
extern thread_local Thread* cur_thread;
extern thread_local Block* cur_block;
const uint3& thread_idx();
void syncthreads(int line);
// Blocks until every lane of `mask` has arrived at the same op; copies the
// lane's first `n_out` results to `out`.
void warp_collective(int op, unsigned mask, int line, const uint64_t* in, int n_in, uint64_t* out, int n_out);
[[noreturn]] void fail(const char* what, int line);
// Shared-memory instructions the PTX wrappers emulate (see common.cuh).
enum Op {
    OP_SHFL_IDX = 1,
    OP_SHFL_UP,
    OP_SHFL_DOWN,
    OP_SHFL_XOR,
    OP_BALLOT,
    OP_SYNCWARP,
    OP_MMA_F16,
    OP_MMA_BF16,
    OP_LDMATRIX_X4,
    OP_LDMATRIX_X4_T,
    OP_LDMATRIX_X2,
    OP_LDMATRIX_X2_T,
};
// cp.async: copies are queued per thread and land only at wait_group, so a
// missing wait reads stale shared memory in the emulator as on the GPU.
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
void cp_async_wait(int n);
}  // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::cur_block->bid)
#define blockDim (emu::cur_block->bdim)
#define gridDim (emu::cur_block->gdim)
#define warpSize 32
#define __syncthreads() emu::syncthreads(__LINE__)
#define EMU_DYN_SMEM() (emu::cur_block->dyn_smem)

template <class T>
inline T emu_shfl(int op, unsigned mask, T v, int arg, int width, int line) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 64 bits");
    uint64_t in[3] = {0, (uint64_t)(int64_t)arg, (uint64_t)width}, out[1];
    memcpy(&in[0], &v, sizeof(T));
    emu::warp_collective(op, mask, line, in, 3, out, 1);
    T r;
    memcpy(&r, &out[0], sizeof(T));
    return r;
}
#define __shfl_sync(m, v, s, ...) emu_shfl(emu::OP_SHFL_IDX, m, v, s, emu_width(__VA_ARGS__ + 0), __LINE__)
#define __shfl_up_sync(m, v, s, ...) emu_shfl(emu::OP_SHFL_UP, m, v, s, emu_width(__VA_ARGS__ + 0), __LINE__)
#define __shfl_down_sync(m, v, s, ...) emu_shfl(emu::OP_SHFL_DOWN, m, v, s, emu_width(__VA_ARGS__ + 0), __LINE__)
#define __shfl_xor_sync(m, v, s, ...) emu_shfl(emu::OP_SHFL_XOR, m, v, s, emu_width(__VA_ARGS__ + 0), __LINE__)
inline int emu_width(int w) { return w == 0 ? 32 : w; }
inline unsigned emu_ballot(unsigned mask, int pred, int line) {
    uint64_t in[1] = {(uint64_t)(pred != 0)}, out[1];
    emu::warp_collective(emu::OP_BALLOT, mask, line, in, 1, out, 1);
    return (unsigned)out[0];
}
#define __ballot_sync(m, p) emu_ballot(m, p, __LINE__)
#define __any_sync(m, p) (emu_ballot(m, p, __LINE__) != 0)
#define __all_sync(m, p) (emu_ballot(m, p, __LINE__) == (unsigned)(m))
#define __syncwarp(...) emu::warp_collective(emu::OP_SYNCWARP, emu_mask(__VA_ARGS__ + 0u), __LINE__, nullptr, 0, nullptr, 0)
inline unsigned emu_mask(unsigned m) { return m == 0 ? 0xffffffffu : m; }

inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float v) { int i; memcpy(&i, &v, 4); return i; }
inline unsigned __float_as_uint(float v) { unsigned i; memcpy(&i, &v, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline float fmaf_emu(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// Blocks run one at a time on one OS thread, so atomics need no locking.
inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long o = *p; *p = o + v; return o;
}
inline int atomicMax(int* p, int v) { int o = *p; if (v > o) *p = v; return o; }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { unsigned o = *p; if (o == c) *p = v; return o; }

#include <tuple>
#include <type_traits>
#include <utility>
namespace emu {
using Invoker = void (*)(void**);
// Adds a kernel to the registry that `emu_launch` looks names up in, with
// the byte size of each parameter so a launch with the wrong arguments is an
// error instead of a read past the argument array.
void register_kernel(const char* name, Invoker invoker, const size_t* param_sizes, size_t n_params);
// Calls a kernel with arguments packed as cuLaunchKernel packs them: one
// pointer per parameter, pointing at the parameter's bytes.
template <class... A, size_t... I>
void call_packed(void (*k)(A...), void** args, std::index_sequence<I...>) {
    std::tuple<std::decay_t<A>...> vals;
    ((memcpy((void*)&std::get<I>(vals), args[I], sizeof(std::decay_t<A>))), ...);
    k(std::get<I>(vals)...);
}
template <class... A>
void add(const char* name, void (*)(A...), Invoker invoker) {
    static const size_t sizes[sizeof...(A) + 1] = {sizeof(std::decay_t<A>)..., 0};
    register_kernel(name, invoker, sizes, sizeof...(A));
}
template <class... A>
constexpr size_t arity(void (*)(A...)) { return sizeof...(A); }
template <auto K>
void invoke_kernel(void** args) {
    call_packed(K, args, std::make_index_sequence<arity(K)>{});
}
}  // namespace emu
// One line per kernel in the registration function that the build script
// generates for each kernel family.
#define EMU_KERNEL(name) emu::add(#name, &name, &emu::invoke_kernel<&name>);
