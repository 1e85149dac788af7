// bf16 x bf16 -> f32 GEMM for x86-64 with AVX512-BF16, exposed to JAX as an XLA FFI handler.
//
//   C[M,N] (f32) = A @ B, bf16 operands, f32 accumulation.
//   A is [M,K] row-major (a_trans == 0) or [K,M] row-major (a_trans != 0);
//   B is [K,N] row-major (b_trans == 0) or [N,K] row-major (b_trans != 0).
//
// Design (BLIS-like; the threading is described above GemmJob): K is split into blocks of KC and
// N into blocks of NC. A is packed once into panels MR rows tall, each 32-bit word holding the pair
// (A[m,k], A[m,k+1]); each B[pc:pc+KC, jc:jc+NC] block is packed into panels NR columns wide, each
// word holding (B[k,n], B[k+1,n]) -- the operand layout of vdpbf16ps. The micro-kernel keeps an
// MR x NR tile of C in MR*NR/16 zmm accumulators; per pair of k it loads NR/16 vectors of packed B,
// broadcasts one word of A per row and issues MR*NR/16 vdpbf16ps. Tails in M and N are zero-padded
// at packing time and handled with masked stores; an odd K is zero-padded to even.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace {

#ifndef BG_PFC
#define BG_PFC 1
#endif
#ifndef BG_MR
#define BG_MR 6
#endif
#ifndef BG_NV
#define BG_NV 4
#endif
#ifndef BG_KC
#define BG_KC 768
#endif
#ifndef BG_NC
#define BG_NC 256
#endif

constexpr int MR = BG_MR;           // rows of the register tile
constexpr int NV = BG_NV;           // zmm vectors across the register tile
constexpr int NR = 16 * NV;         // columns of the register tile
constexpr int KC = BG_KC;           // k elements per block (even)
constexpr int NC = (BG_NC / NR) * NR;
static_assert(KC % 2 == 0, "KC must be even");

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

inline __mmask16 lane_mask(int valid) {  // valid in [0, 16]
  return valid >= 16 ? (__mmask16)0xFFFF : (valid <= 0 ? (__mmask16)0 : (__mmask16)((1u << valid) - 1));
}

// C tile (mr x nr valid) (+)= Ap panel @ Bp panel over kp pairs of k.
void micro_kernel(int kp, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* __restrict c,
                  long ldc, int mr, int nr, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();

#if BG_PFC
  // Pull the C tile toward L1 while the k loop runs; it is read/written only at the end.
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * j), _MM_HINT_T0);
#endif

#pragma GCC unroll 2
  for (int p = 0; p < kp; ++p) {
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = as_bh(_mm512_load_si512(bp + 16 * j));
    _mm_prefetch(reinterpret_cast<const char*>(bp + 8 * NR), _MM_HINT_T0);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = as_bh(_mm512_set1_epi32(static_cast<int>(ap[i])));
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
    ap += MR;
    bp += NR;
  }

  if (mr == MR && nr == NR) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc;
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        __m512 v = acc[i][j];
        if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(ci + 16 * j));
        _mm512_storeu_ps(ci + 16 * j, v);
      }
    }
    return;
  }
  __mmask16 masks[NV];
  for (int j = 0; j < NV; ++j) masks[j] = lane_mask(nr - 16 * j);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
    float* ci = c + i * ldc;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      __m512 v = acc[i][j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[j], ci + 16 * j));
      _mm512_mask_storeu_ps(ci + 16 * j, masks[j], v);
    }
  }
}

// Loads 16 rows (rows >= nrows read as zero) of 16 32-bit words (= 32 bf16, of which the first
// nelem are valid, the rest zero) starting at src + i*ld, and transposes them: out[c] word i is
// row i's word c, i.e. the pair (src[i*ld + 2c], src[i*ld + 2c + 1]).
inline void load_transpose_16x16(const uint16_t* src, long ld, int nrows, int nelem, __m512i out[16]) {
  const __mmask32 emask = nelem >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << nelem) - 1);
  __m512i r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    r[i] = i < nrows ? _mm512_maskz_loadu_epi16(emask, src + i * ld) : _mm512_setzero_si512();
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g+q], 128-bit lane L = rows 4g..4g+3 of word 4L+q.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // 4x4 transpose of 128-bit lanes across g for each q.
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i s0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44);
    const __m512i s1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xEE);
    out[0 + q] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    out[4 + q] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    out[8 + q] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    out[12 + q] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
}

// Packs one A micro-panel: rows [0, rows) of a (row stride lda), k in [0, kc), into
// out[p*MR + i] = (a[i][2p], a[i][2p+1]); rows >= rows and the odd-k tail are zero.
void pack_a_panel(const uint16_t* a, long lda, int rows, int kc, uint32_t* __restrict out) {
  static_assert(MR <= 16, "MR must be <= 16");
  const int kp = (kc + 1) / 2;
  const __mmask16 store_mask = (__mmask16)((1u << MR) - 1);
  __m512i v[16];
  for (int p0 = 0; p0 < kp; p0 += 16) {
    load_transpose_16x16(a + 2 * p0, lda, rows, kc - 2 * p0, v);
    const int n = std::min(16, kp - p0);
    for (int c = 0; c < n; ++c) _mm512_mask_storeu_epi32(out + (long)(p0 + c) * MR, store_mask, v[c]);
  }
}

// Packs one B panel from Bt [N,K] row-major (stride ldb): columns n in [0, cols) (rows of Bt),
// k in [0, kc): out[p*NR + j] = (bt[j][2p], bt[j][2p+1]); padding is zero.
void pack_b_nk_panel(const uint16_t* bt, long ldb, int cols, int kc, uint32_t* __restrict out) {
  const int kp = (kc + 1) / 2;
  __m512i v[16];
  for (int j0 = 0; j0 < NR; j0 += 16) {
    const int rows = std::max(0, std::min(16, cols - j0));
    for (int p0 = 0; p0 < kp; p0 += 16) {
      if (rows == 0) {
        for (int c = 0; c < 16; ++c) v[c] = _mm512_setzero_si512();
      } else {
        load_transpose_16x16(bt + (long)j0 * ldb + 2 * p0, ldb, rows, kc - 2 * p0, v);
      }
      const int n = std::min(16, kp - p0);
      for (int c = 0; c < n; ++c) _mm512_store_si512(out + (long)(p0 + c) * NR + j0, v[c]);
    }
  }
}

// vpermt2w indices interleaving two rows of 32 bf16 into pairs: lo takes elements 0..15 of both,
// hi takes 16..31.
alignas(64) const uint16_t idx_lo_arr[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                             8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) const uint16_t idx_hi_arr[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                             24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

// Packs one A micro-panel from At [K,M] row-major (stride lda; A = At^T): columns m in [0, rows)
// of At, k in [0, kc): out[p*MR + i] = (at[2p][i], at[2p+1][i]); padding is zero.
void pack_a_panel_t(const uint16_t* at, long lda, int rows, int kc, uint32_t* __restrict out) {
  const int kp = (kc + 1) / 2;
  const __m512i idx_lo = _mm512_load_si512(idx_lo_arr);
  const __mmask32 lmask = (__mmask32)((1u << rows) - 1);
  const __mmask16 smask = (__mmask16)((1u << MR) - 1);
  for (int p = 0; p < kp; ++p) {
    const uint16_t* r0p = at + (long)(2 * p) * lda;
    const __m512i r0 = _mm512_maskz_loadu_epi16(lmask, r0p);
    const __m512i r1 = 2 * p + 1 < kc ? _mm512_maskz_loadu_epi16(lmask, r0p + lda) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(out + (long)p * MR, smask, _mm512_permutex2var_epi16(r0, idx_lo, r1));
  }
}

// Packs one B panel from B [K,N] row-major (stride ldb): columns [0, cols), k in [0, kc).
void pack_b_kn_panel(const uint16_t* b, long ldb, int cols, int kc, uint32_t* __restrict out) {
  const int kp = (kc + 1) / 2;
  const __m512i idx_lo = _mm512_load_si512(idx_lo_arr);
  const __m512i idx_hi = _mm512_load_si512(idx_hi_arr);
  for (int p = 0; p < kp; ++p) {
    const uint16_t* r0p = b + (long)(2 * p) * ldb;
    const bool has1 = 2 * p + 1 < kc;
    uint32_t* o = out + (long)p * NR;
    for (int h = 0; h < NR; h += 32) {
      const int valid = cols - h;
      __m512i r0, r1;
      if (valid >= 32) {
        r0 = _mm512_loadu_si512(r0p + h);
        r1 = has1 ? _mm512_loadu_si512(r0p + ldb + h) : _mm512_setzero_si512();
      } else {
        const __mmask32 m = valid <= 0 ? 0u : (__mmask32)((1ull << valid) - 1);
        r0 = _mm512_maskz_loadu_epi16(m, r0p + h);
        r1 = has1 ? _mm512_maskz_loadu_epi16(m, r0p + ldb + h) : _mm512_setzero_si512();
      }
      _mm512_store_si512(o + h, _mm512_permutex2var_epi16(r0, idx_lo, r1));
      if (h + 16 < NR) _mm512_store_si512(o + h + 16, _mm512_permutex2var_epi16(r0, idx_hi, r1));
    }
  }
}

// Packing buffers are recycled across calls (a small mutex-protected free list): fresh multi-MB
// allocations would cost page faults on every call.
class BufferPool {
 public:
  uint32_t* Acquire(size_t words, size_t* cap_words) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].words >= words && (best == free_.size() || free_[i].words < free_[best].words)) best = i;
    if (best != free_.size()) {
      Entry e = free_[best];
      free_.erase(free_.begin() + best);
      cached_ -= e.words;
      *cap_words = e.words;
      return e.ptr;
    }
    size_t bytes = ((std::max<size_t>(words, 16) * 4 + 4095) / 4096) * 4096;
    *cap_words = bytes / 4;
    return static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
  }
  void Release(uint32_t* ptr, size_t words) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back({ptr, words});
    cached_ += words;
    // Keep at most kMaxCachedWords; drop the smallest buffers first.
    while (cached_ > kMaxCachedWords && !free_.empty()) {
      auto it = std::min_element(free_.begin(), free_.end(),
                                 [](const Entry& a, const Entry& b) { return a.words < b.words; });
      cached_ -= it->words;
      std::free(it->ptr);
      free_.erase(it);
    }
  }

 private:
  struct Entry {
    uint32_t* ptr;
    size_t words;
  };
  static constexpr size_t kMaxCachedWords = (size_t)96 << 20;  // 384 MiB
  std::mutex mu_;
  std::vector<Entry> free_;
  size_t cached_ = 0;
};

BufferPool& pool() {
  static BufferPool* p = new BufferPool();  // leaked on purpose: no destruction-order issues at exit
  return *p;
}

struct PooledBuf {
  uint32_t* ptr = nullptr;
  size_t cap = 0;
  explicit PooledBuf(size_t words) { ptr = pool().Acquire(words, &cap); }
  ~PooledBuf() { pool().Release(ptr, cap); }
  PooledBuf(const PooledBuf&) = delete;
  PooledBuf& operator=(const PooledBuf&) = delete;
};

// Reusable sense-free barrier for a fixed set of threads; spins briefly, then yields (the machine
// may be shared, and a preempted partner must not be starved by a spinning waiter).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    if (n_ <= 1) return;
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spin = 0; gen_.load(std::memory_order_acquire) == gen; ++spin) {
      if (spin < 2000)
        _mm_pause();
      else
        std::this_thread::yield();
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<unsigned> gen_{0};
};

// All threads cooperate on one GEMM. A is packed once, whole (panels of MR rows per KC block).
// B is processed in (NC x KC) blocks (jc outer, pc inner) packed into one of two shared buffers
// (sized for L2); every A micro-panel (in L1) then sweeps the packed block. Packing and compute
// units are handed out dynamically through atomic counters, so a thread that is slowed down
// (shared machine) does not hold the others back. Double buffering the B block needs only one
// barrier per block: a thread can start packing block t+1 as soon as it runs out of compute units
// of block t, and nobody overwrites block t's buffer (reused by t+2) before everyone passed the
// barrier after packing t+1, i.e. finished computing t.
struct GemmJob {
  const uint16_t* a;
  const uint16_t* b;
  bool at, bt;
  float* c;
  int M, N, K;
  long mpad, kpairs;
  int nblocks_n, nblocks_k, apanels;
  uint32_t* apack;
  uint32_t* bpack[2];
  long bpack_stride;
  Barrier barrier;
  std::atomic<int> a_next{0};
  std::atomic<int>* counters;  // per block t: [2t] hands out B panels to pack, [2t+1] A panels to compute
  explicit GemmJob(int nthreads) : barrier(nthreads) {}
};

void run_block_pack(GemmJob& job, int t) {
  const int jc = (t / job.nblocks_k) * NC, pc = (t % job.nblocks_k) * KC;
  const int nc = std::min(NC, job.N - jc), kc = std::min(KC, job.K - pc), kp = (kc + 1) / 2;
  const int npanels = (nc + NR - 1) / NR;
  uint32_t* dst = job.bpack[t & 1];
  std::atomic<int>& next = job.counters[2 * t];
  for (int u; (u = next.fetch_add(1, std::memory_order_relaxed)) < npanels;) {
    const int jr = u * NR, cols = std::min(NR, nc - jr);
    uint32_t* o = dst + (long)u * kp * NR;
    if (job.bt)
      pack_b_nk_panel(job.b + (long)(jc + jr) * job.K + pc, job.K, cols, kc, o);
    else
      pack_b_kn_panel(job.b + (long)pc * job.N + jc + jr, job.N, cols, kc, o);
  }
}

void run_block_compute(GemmJob& job, int t) {
  const int jc = (t / job.nblocks_k) * NC, pc = (t % job.nblocks_k) * KC;
  const int nc = std::min(NC, job.N - jc), kc = std::min(KC, job.K - pc), kp = (kc + 1) / 2;
  const uint32_t* bpk = job.bpack[t & 1];
  const uint32_t* apc = job.apack + job.mpad * (pc / 2);
  std::atomic<int>& next = job.counters[2 * t + 1];
  for (int u; (u = next.fetch_add(1, std::memory_order_relaxed)) < job.apanels;) {
    const int ir = u * MR;
    const uint32_t* ap = apc + (long)u * kp * MR;
    for (int jr = 0; jr < nc; jr += NR) {
      micro_kernel(kp, ap, bpk + (long)(jr / NR) * kp * NR, job.c + (long)ir * job.N + jc + jr, job.N,
                   std::min(MR, job.M - ir), std::min(NR, nc - jr), pc > 0);
    }
  }
}

void gemm_worker(GemmJob& job) {
  // Phase 0: pack all of A; units are (k block, panel).
  const int aunits = job.nblocks_k * job.apanels;
  for (int u; (u = job.a_next.fetch_add(1, std::memory_order_relaxed)) < aunits;) {
    const int q = u / job.apanels, r = u % job.apanels;
    const int pc = q * KC, kc = std::min(KC, job.K - pc), kp = (kc + 1) / 2;
    uint32_t* o = job.apack + job.mpad * (pc / 2) + (long)r * kp * MR;
    const int rows = std::min(MR, job.M - r * MR);
    if (job.at)
      pack_a_panel_t(job.a + (long)pc * job.M + (long)r * MR, job.M, rows, kc, o);
    else
      pack_a_panel(job.a + (long)r * MR * job.K + pc, job.K, rows, kc, o);
  }
  const int nblocks = job.nblocks_n * job.nblocks_k;
  run_block_pack(job, 0);
  for (int t = 0; t < nblocks; ++t) {
    job.barrier.Wait();  // block t packed (and, for t == 0, all of A); block t-1 computed by all.
    run_block_compute(job, t);
    if (t + 1 < nblocks) run_block_pack(job, t + 1);
  }
}

int default_threads() {
  static const int n = [] {
    if (const char* e = std::getenv("BERT_JAX_GEMM_THREADS")) {
      int v = std::atoi(e);
      if (v > 0) return v;
    }
    unsigned h = std::thread::hardware_concurrency();
    return h == 0 ? 1 : (int)h;
  }();
  return n;
}

void gemm(const uint16_t* a, bool at, const uint16_t* b, bool bt, float* c, int M, int N, int K, int nthreads) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    std::memset(c, 0, sizeof(float) * (size_t)M * N);
    return;
  }
  // Minimum work per thread before adding one: ~4 MFLOP (thread start-up is ~10-50 us).
  const double flops = 2.0 * M * N * (double)K;
  const int nt = std::max(1, std::min(nthreads, (int)(flops / 4e6)));
  GemmJob job(nt);
  job.a = a;
  job.at = at;
  job.b = b;
  job.bt = bt;
  job.c = c;
  job.M = M;
  job.N = N;
  job.K = K;
  job.apanels = (M + MR - 1) / MR;
  job.mpad = (long)job.apanels * MR;
  job.kpairs = (K + 1) / 2;
  job.nblocks_n = (N + NC - 1) / NC;
  job.nblocks_k = (K + KC - 1) / KC;
  const int nc_max = std::min(NC, ((N + NR - 1) / NR) * NR);
  const int kc_max = std::min(KC, K + (K & 1));
  PooledBuf abuf((size_t)job.mpad * job.kpairs);
  PooledBuf bbuf(2 * (size_t)nc_max * (kc_max / 2) + 16);
  job.apack = abuf.ptr;
  job.bpack_stride = ((long)nc_max * (kc_max / 2) + 15) / 16 * 16;
  job.bpack[0] = bbuf.ptr;
  job.bpack[1] = bbuf.ptr + job.bpack_stride;
  const int nblocks = job.nblocks_n * job.nblocks_k;
  std::vector<std::atomic<int>> counters(2 * (size_t)nblocks);
  for (auto& x : counters) x.store(0, std::memory_order_relaxed);
  job.counters = counters.data();
  if (nt == 1) {
    gemm_worker(job);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(nt - 1);
  for (int t = 1; t < nt; ++t) workers.emplace_back([&job] { gemm_worker(job); });
  gemm_worker(job);
  for (auto& w : workers) w.join();
}

namespace ffi = xla::ffi;

ffi::Error Bf16GemmImpl(ffi::Buffer<ffi::BF16> a, ffi::Buffer<ffi::BF16> b, ffi::ResultBuffer<ffi::F32> c,
                        int32_t a_trans, int32_t b_trans, int32_t num_threads) {
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto cd = c->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || cd.size() != 2)
    return ffi::Error::InvalidArgument("bf16_gemm: operands must be 2-D");
  const int64_t M = a_trans ? ad[1] : ad[0], K = a_trans ? ad[0] : ad[1];
  const int64_t N = b_trans ? bd[0] : bd[1];
  const int64_t Kb = b_trans ? bd[1] : bd[0];
  if (Kb != K) return ffi::Error::InvalidArgument("bf16_gemm: contraction sizes differ");
  if (cd[0] != M || cd[1] != N) return ffi::Error::InvalidArgument("bf16_gemm: bad output shape");
  if (M > INT32_MAX / 2 || N > INT32_MAX / 2 || K > INT32_MAX / 2)
    return ffi::Error::InvalidArgument("bf16_gemm: dimension too large");
  gemm(reinterpret_cast<const uint16_t*>(a.typed_data()), a_trans != 0,
       reinterpret_cast<const uint16_t*>(b.typed_data()), b_trans != 0, c->typed_data(), (int)M, (int)N, (int)K,
       num_threads > 0 ? num_threads : default_threads());
  return ffi::Error::Success();
}

}  // namespace

// Attributes: a_trans (A given as [K,M]), b_trans (B given as [N,K]), num_threads (<= 0: all
// hardware threads, or BERT_JAX_GEMM_THREADS).
XLA_FFI_DEFINE_HANDLER_SYMBOL(BertJaxBf16Gemm, Bf16GemmImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::BF16>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::BF16>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<int32_t>("a_trans")
                                  .Attr<int32_t>("b_trans")
                                  .Attr<int32_t>("num_threads"));

// Plain C entry point (standalone benchmarks / debugging through ctypes).
extern "C" void bert_jax_bf16_gemm_raw(const uint16_t* a, int a_trans, const uint16_t* b, int b_trans, float* c,
                                       int M, int N, int K, int num_threads) {
  gemm(a, a_trans != 0, b, b_trans != 0, c, M, N, K, num_threads > 0 ? num_threads : default_threads());
}
