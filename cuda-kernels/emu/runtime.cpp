// Runtime of the CUDA CPU emulator: fibers, the block scheduler, warp
// collectives (shuffles, votes, mma.sync, ldmatrix) and the C ABI entry point
// `emu_launch` that the Rust side (src/emu/) calls. The build script compiles
// it with the kernel families into one static library, together with a
// generated `register_all` that adds every kernel to the registry.
#include "cuda_emu.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace emu {

struct Kernel {
    Invoker invoke;
    std::vector<size_t> param_sizes;
};
// Defined by the build script's generated registration unit.
void register_all();

namespace {
std::map<std::string, Kernel>* filling = nullptr;
}

void register_kernel(const char* name, Invoker f, const size_t* sizes, size_t n) {
    (*filling)[name] = Kernel{f, std::vector<size_t>(sizes, sizes + n)};
}

// Filled on first use (thread-safe: a function-local static).
const std::map<std::string, Kernel>& registry() {
    static const std::map<std::string, Kernel> r = [] {
        std::map<std::string, Kernel> m;
        filling = &m;
        register_all();
        filling = nullptr;
        return m;
    }();
    return r;
}

enum class State { Ready, Barrier, Warp, Done };

struct CpCopy {
    void* dst;
    const void* src;
    int bytes, src_bytes;
};

struct Thread {
    ucontext_t ctx;  // only to start the fiber on its stack
    jmp_buf jb;      // every later switch: _setjmp/_longjmp skip the signal-mask syscalls
    bool started = false;
    uint3 tid;
    int linear = 0;
    State state = State::Ready;
    int line = 0, op = 0;
    unsigned mask = 0;
    uint64_t in[16] = {}, out[8] = {};
    std::vector<std::vector<CpCopy>> cp_groups;
    std::vector<CpCopy> cp_open;
};

struct Abort {};

thread_local Thread* cur_thread = nullptr;
thread_local Block* cur_block = nullptr;

namespace {
constexpr size_t STACK = 256 * 1024;
constexpr size_t GUARD = 4096;

struct Sched {
    ucontext_t main;
    jmp_buf main_jb;
    std::vector<Thread> threads;
    Invoker kernel = nullptr;
    void** args = nullptr;
    std::string error;
};
thread_local Sched* sched = nullptr;

// Fiber stacks, kept per OS thread from one launch to the next: mapping and
// first touching 256 stacks cost more than a small kernel's whole run.
struct StackPool {
    std::vector<char*> stacks;
    // Grows the pool to `n` stacks; false when the system refuses memory.
    bool reserve(size_t n) {
        while (stacks.size() < n) {
            void* mem = mmap(nullptr, STACK + GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (mem == MAP_FAILED) return false;
            // The lowest page traps a stack overflow instead of corrupting the next stack.
            mprotect(mem, GUARD, PROT_NONE);
            stacks.push_back((char*)mem);
        }
        return true;
    }
    ~StackPool() {
        for (char* s : stacks) munmap(s, STACK + GUARD);
    }
};
thread_local StackPool stack_pool;

std::string coords(const Thread& t) {
    char b[160];
    snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", cur_block->bid.x, cur_block->bid.y,
             cur_block->bid.z, t.tid.x, t.tid.y, t.tid.z);
    return b;
}

void yield() {
    Thread* t = cur_thread;
    if (!_setjmp(t->jb)) _longjmp(sched->main_jb, 1);
    if (!sched->error.empty()) throw Abort{};
}

// Runs `t` until it blocks or exits.
void resume(Thread& t) {
    cur_thread = &t;
    if (_setjmp(sched->main_jb)) return;
    if (!t.started) {
        t.started = true;
        swapcontext(&sched->main, &t.ctx);
    } else {
        _longjmp(t.jb, 1);
    }
}

void fiber_main() {
    try {
        if (sched->error.empty()) sched->kernel(sched->args);
    } catch (Abort&) {
    }
    cur_thread->state = State::Done;
    _longjmp(sched->main_jb, 1);
}

void run_copies(std::vector<CpCopy>& g) {
    for (auto& c : g) {
        memcpy(c.dst, c.src, c.src_bytes);
        memset((char*)c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
    }
}

template <class F>
float mma_elem(uint64_t reg, int half, F conv) {
    return conv((uint16_t)((uint32_t)reg >> (16 * half)));
}

float f16_bits_to_float(uint16_t h) {
    uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
float bf16_bits_to_float(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with the
// fragment layouts of the PTX ISA: lane = 4*group + tig.
void resolve_mma(Thread** lanes, bool bf16) {
    auto conv = bf16 ? bf16_bits_to_float : f16_bits_to_float;
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const uint64_t* in = lanes[l]->in;
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 8; ++i) {
            int row = g + ((i & 2) ? 8 : 0), col = 2 * t + (i & 1) + ((i & 4) ? 8 : 0);
            A[row][col] = mma_elem(in[i >> 1], i & 1, conv);
        }
        for (int i = 0; i < 4; ++i) B[2 * t + (i & 1) + ((i & 2) ? 8 : 0)][g] = mma_elem(in[4 + (i >> 1)], i & 1, conv);
        for (int i = 0; i < 4; ++i) C[g + ((i & 2) ? 8 : 0)][2 * t + (i & 1)] = __uint_as_float((uint32_t)in[6 + i]);
    }
    for (int l = 0; l < 32; ++l) {
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; ++i) {
            int row = g + ((i & 2) ? 8 : 0), col = 2 * t + (i & 1);
            float acc = C[row][col];
            for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
            lanes[l]->out[i] = __float_as_uint(acc);
        }
    }
}

// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16: lanes 8i..8i+7 give
// the row addresses of matrix i; lane l receives row l/4, columns 2(l%4)+{0,1}
// of each matrix (of its transpose with .trans).
void resolve_ldmatrix(Thread** lanes, int nmat, bool trans) {
    for (int l = 0; l < 32; ++l) {
        for (int m = 0; m < nmat; ++m) {
            uint16_t v[2];
            for (int j = 0; j < 2; ++j) {
                int r = l >> 2, c = 2 * (l & 3) + j;
                if (trans) std::swap(r, c);
                const uint16_t* row = (const uint16_t*)lanes[8 * m + r]->in[0];
                v[j] = row[c];
            }
            lanes[l]->out[m] = (uint64_t)v[0] | ((uint64_t)v[1] << 16);
        }
    }
}

void resolve(int op, Thread** lanes, unsigned mask) {
    switch (op) {
        case OP_SYNCWARP:
            return;
        case OP_BALLOT: {
            unsigned b = 0;
            for (int l = 0; l < 32; ++l)
                if ((mask >> l & 1) && lanes[l]->in[0]) b |= 1u << l;
            for (int l = 0; l < 32; ++l)
                if (mask >> l & 1) lanes[l]->out[0] = b;
            return;
        }
        case OP_MMA_F16:
        case OP_MMA_BF16:
            return resolve_mma(lanes, op == OP_MMA_BF16);
        case OP_LDMATRIX_X4:
        case OP_LDMATRIX_X4_T:
        case OP_LDMATRIX_X2:
        case OP_LDMATRIX_X2_T:
            return resolve_ldmatrix(lanes, (op == OP_LDMATRIX_X4 || op == OP_LDMATRIX_X4_T) ? 4 : 2,
                                    op == OP_LDMATRIX_X4_T || op == OP_LDMATRIX_X2_T);
        default:
            break;
    }
    // Shuffles: a source lane outside the width segment or the mask reads the
    // caller's own value, as __shfl_*_sync documents for out-of-range lanes.
    for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1)) continue;
        int width = (int)lanes[l]->in[2], arg = (int)(int64_t)lanes[l]->in[1];
        int base = l & ~(width - 1), src = l;
        if (op == OP_SHFL_IDX) src = base + (arg & (width - 1));
        else if (op == OP_SHFL_UP) src = (l - arg >= base) ? l - arg : l;
        else if (op == OP_SHFL_DOWN) src = (l + arg < base + width) ? l + arg : l;
        else if (op == OP_SHFL_XOR) src = ((l ^ arg) < base + width) ? (l ^ arg) : l;
        if (!(mask >> src & 1)) {
            sched->error = "shuffle from lane " + std::to_string(src) + " outside the mask, " + coords(*lanes[l]) +
                           " at line " + std::to_string(lanes[l]->line);
            return;
        }
        lanes[l]->out[0] = lanes[src]->in[0];
    }
}

// Completes every warp collective of warp `w` whose lanes have all arrived.
// Returns whether any thread was released.
bool resolve_warp(int w, int nthreads) {
    Thread* lanes[32] = {};
    for (int l = 0; l < 32 && w * 32 + l < nthreads; ++l) lanes[l] = &sched->threads[w * 32 + l];
    bool released = false;
    // Lanes in the mask of a lane already judged wait in that same
    // collective (or the judgement reported the mismatch), so one judgement
    // covers them: without this, every arrival re-checked every waiting
    // lane against every other, which dominated the emulator's run time.
    unsigned judged = 0;
    for (int l = 0; l < 32; ++l) {
        Thread* t = lanes[l];
        if (!t || t->state != State::Warp || (judged >> l & 1)) continue;
        judged |= t->mask | 1u << l;
        bool ready = true;
        for (int k = 0; k < 32 && ready; ++k) {
            if (!(t->mask >> k & 1)) continue;
            Thread* o = lanes[k];
            bool missing = !o, exited = o && o->state == State::Done;
            bool other_op = o && o->state == State::Warp && (o->op != t->op || o->mask != t->mask);
            if (missing || exited || other_op) {
                std::string why = missing  ? "names lane " + std::to_string(k) + " beyond the block"
                                  : exited ? "waits for lane " + std::to_string(k) + ", which exited"
                                           : "meets lane " + std::to_string(k) + " in a different warp op (line " +
                                                 std::to_string(o->line) + ")";
                sched->error = "warp collective at line " + std::to_string(t->line) + " of " + coords(*t) + " " + why;
                return false;
            }
            if (o->state != State::Warp) ready = false;
        }
        if (!ready) continue;
        int op = t->op;
        unsigned mask = t->mask;
        resolve(op, lanes, mask);
        if (!sched->error.empty()) return false;
        for (int k = 0; k < 32; ++k)
            if (mask >> k & 1) lanes[k]->state = State::Ready;
        released = true;
    }
    return released;
}

bool resolve_warps(int nthreads) {
    bool released = false;
    for (int w = 0; w * 32 < nthreads; ++w) released |= resolve_warp(w, nthreads);
    return released;
}
}  // namespace

const uint3& thread_idx() { return cur_thread->tid; }

void fail(const char* what, int line) {
    if (sched->error.empty())
        sched->error = std::string(what) + " at line " + std::to_string(line) + " in " + coords(*cur_thread);
    throw Abort{};
}

void syncthreads(int line) {
    cur_thread->state = State::Barrier;
    cur_thread->line = line;
    yield();
}

void warp_collective(int op, unsigned mask, int line, const uint64_t* in, int n_in, uint64_t* out, int n_out) {
    Thread* t = cur_thread;
    int lane = t->linear & 31;
    if (!(mask >> lane & 1)) fail("warp collective called by a lane outside its mask", line);
    t->state = State::Warp;
    t->op = op;
    t->mask = mask;
    t->line = line;
    for (int i = 0; i < n_in; ++i) t->in[i] = in[i];
    yield();
    for (int i = 0; i < n_out; ++i) out[i] = t->out[i];
}

void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
    cur_thread->cp_open.push_back({dst, src, bytes, src_bytes});
}
void cp_async_commit() {
    cur_thread->cp_groups.push_back(std::move(cur_thread->cp_open));
    cur_thread->cp_open.clear();
}
void cp_async_wait(int n) {
    auto& g = cur_thread->cp_groups;
    while ((int)g.size() > n) {
        run_copies(g.front());
        g.erase(g.begin());
    }
}

// Runs one block to completion. Returns false (with sched->error set) on a
// divergent barrier, a deadlock or an error raised by a thread.
//
// `order` is a priority list: the scheduler always resumes the first ready
// thread in it, and a warp collective completes as soon as its last lane
// arrives. So the warp holding the first thread runs ahead to the next
// block barrier before any other warp moves: data that another warp writes
// without a barrier in between is read stale, as it can be on a GPU.
static bool run_block(int nthreads, std::mt19937_64& rng, int mode) {
    std::vector<int> order(nthreads);
    for (int i = 0; i < nthreads; ++i) order[i] = mode == 1 ? nthreads - 1 - i : i;
    for (;;) {
        if (mode >= 2) std::shuffle(order.begin(), order.end(), rng);
        for (size_t k = 0; k < order.size();) {
            Thread& t = sched->threads[order[k]];
            if (t.state != State::Ready) {
                ++k;
                continue;
            }
            resume(t);
            if (!sched->error.empty()) return false;
            if (t.state == State::Warp && resolve_warp(t.linear / 32, nthreads)) k = 0;
            else ++k;
            if (!sched->error.empty()) return false;
        }
        bool released = resolve_warps(nthreads);
        if (!sched->error.empty()) return false;
        int done = 0, at_barrier = 0, first_barrier = -1, other_state = -1;
        for (int i = 0; i < nthreads; ++i) {
            State s = sched->threads[i].state;
            if (s == State::Done) done++;
            else if (s == State::Barrier) {
                at_barrier++;
                if (first_barrier < 0) first_barrier = i;
            } else if (other_state < 0) other_state = i;
        }
        if (done == nthreads) return true;
        if (released) continue;
        if (at_barrier == nthreads) {
            int line = sched->threads[0].line;
            for (int i = 1; i < nthreads; ++i)
                if (sched->threads[i].line != line) {
                    sched->error = "divergent __syncthreads: " + coords(sched->threads[0]) + " waits at line " +
                                   std::to_string(line) + ", " + coords(sched->threads[i]) + " at line " +
                                   std::to_string(sched->threads[i].line);
                    return false;
                }
            for (auto& t : sched->threads) t.state = State::Ready;
            continue;
        }
        if (at_barrier > 0 && done > 0) {
            int d = 0;
            while (sched->threads[d].state != State::Done) ++d;
            sched->error = coords(sched->threads[d]) + " exited while " + coords(sched->threads[first_barrier]) +
                           " waits at __syncthreads (line " + std::to_string(sched->threads[first_barrier].line) + ")";
            return false;
        }
        bool any_ready = false;
        for (auto& t : sched->threads) any_ready |= t.state == State::Ready;
        if (!any_ready) {
            const Thread& t = sched->threads[other_state >= 0 ? other_state : first_barrier];
            sched->error = "deadlock: " + coords(t) + " blocked in " +
                           (t.state == State::Barrier ? std::string("__syncthreads") : std::string("a warp collective")) +
                           " at line " + std::to_string(t.line);
            return false;
        }
    }
}

}  // namespace emu

// Launches a registered kernel over the whole grid, on the calling OS
// thread, returning when every block has finished. `args` holds `nargs`
// pointers to the parameters' bytes and `arg_sizes` their sizes, which must
// match the kernel's parameters. `mode` picks the thread order: 0 forward,
// 1 reverse, otherwise random with `mode` as the seed. Returns null on
// success, else a message (owned by the calling OS thread, valid until its
// next launch).
extern "C" const char* emu_launch(const char* name, const unsigned* grid, const unsigned* block, size_t smem,
                                  void** args, const size_t* arg_sizes, size_t nargs, uint64_t mode) {
    using namespace emu;
    static thread_local std::string err;
    auto it = registry().find(name);
    if (it == registry().end()) return (err = std::string("unknown kernel ") + name).c_str();
    const Kernel& k = it->second;
    bool sizes_match = nargs == k.param_sizes.size();
    for (size_t i = 0; sizes_match && i < nargs; ++i) sizes_match = arg_sizes[i] == k.param_sizes[i];
    if (!sizes_match) {
        auto list = [](const size_t* v, size_t n) {
            std::string out = "[";
            for (size_t i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
            return out + "]";
        };
        err = std::string("kernel ") + name + " takes " + std::to_string(k.param_sizes.size()) +
              " parameters of byte sizes " + list(k.param_sizes.data(), k.param_sizes.size()) + ", the launch gave " +
              std::to_string(nargs) + " of sizes " + list(arg_sizes, nargs);
        return err.c_str();
    }
    uint64_t nthreads64 = (uint64_t)block[0] * block[1] * block[2];
    if (nthreads64 == 0 || nthreads64 > 1024) return (err = "block size must be 1..=1024 threads").c_str();
    int nthreads = (int)nthreads64;
    if (smem > 232448) return (err = "dynamic shared memory above 227 KiB").c_str();
    if (!stack_pool.reserve(nthreads)) return (err = "mmap of a fiber stack failed").c_str();
    Sched s;
    sched = &s;
    s.kernel = k.invoke;
    s.args = args;
    s.threads.resize(nthreads);
    // One getcontext per launch: makecontext on a copy is all a fiber needs.
    ucontext_t tmpl;
    getcontext(&tmpl);
    std::vector<unsigned char> dyn(smem + 16);
    std::mt19937_64 rng(mode);
    Block b;
    b.gdim = {grid[0], grid[1], grid[2]};
    b.bdim = {block[0], block[1], block[2]};
    cur_block = &b;
    // Blocks run one after another, in the thread order's sense too:
    // forward, reverse, or (random) the affine permutation i -> a*i + c mod
    // n with a coprime to n, so a kernel that relies on an order between
    // blocks shows it without materialising a list of up to 2^63 blocks.
    const uint64_t nblocks = (uint64_t)grid[0] * grid[1] * grid[2];
    uint64_t mul = 1, add = 0;
    if (mode >= 2 && nblocks > 1) {
        mul = rng() % nblocks | 1;
        while (std::gcd(mul, nblocks) != 1) mul += 2;
        add = rng() % nblocks;
    }
    for (uint64_t seq = 0; seq < nblocks; ++seq) {
        uint64_t l = mode == 1                  ? nblocks - 1 - seq
                     : mode >= 2 && nblocks > 1 ? (uint64_t)(((unsigned __int128)mul * seq + add) % nblocks)
                                                : seq;
        b.bid = {(unsigned)(l % grid[0]), (unsigned)(l / grid[0] % grid[1]), (unsigned)(l / ((uint64_t)grid[0] * grid[1]))};
        // Poison: reading dynamic shared memory before writing it gives NaNs.
        memset(dyn.data(), 0xff, dyn.size());
        b.dyn_smem = dyn.data();
        for (int i = 0; i < nthreads; ++i) {
            Thread& t = s.threads[i];
            t = Thread();
            t.linear = i;
            t.tid = {i % block[0], (i / block[0]) % block[1], i / (block[0] * block[1])};
            t.ctx = tmpl;
            t.ctx.uc_stack.ss_sp = stack_pool.stacks[i] + GUARD;
            t.ctx.uc_stack.ss_size = STACK;
            t.ctx.uc_link = nullptr;
            makecontext(&t.ctx, (void (*)())fiber_main, 0);
        }
        bool ok = run_block(nthreads, rng, mode >= 2 ? 2 : (int)mode);
        if (!ok) {
            err = s.error;
            // Unwind the fibers still parked so their stacks are left cleanly.
            for (auto& t : s.threads)
                if (t.state != State::Done) resume(t);
            sched = nullptr;
            return err.c_str();
        }
    }
    sched = nullptr;
    return nullptr;
}
