// Cache-blocked GEMM (the BLIS / Goto scheme, written plainly):
//
//   for each block of C, MC rows x NC columns          (one parallel_for task each)
//     for each slice of K, KC deep
//       pack op(B)[KC, NC] into panels NR columns wide  (B panel: L1-sized)
//       pack op(A)[MC, KC] into panels MR rows tall     (A block: L2-sized)
//       for each NR-wide B panel, for each MR-tall A panel:
//         micro-kernel: an MR x NR register tile += A panel (x) B panel over KC
//         add alpha * tile into C (plus beta * C on the first K slice)
//
// Packing makes the micro-kernel's reads contiguous whatever the transposes and
// leading dimensions are, and zero-pads the ragged edges so that the micro-kernel
// always computes a full tile. The micro-kernel holds its tile in GCC/Clang vector
// extension types (portable, no intrinsics), so -O2 keeps it in SIMD registers
// with the baseline ISA (SSE2) and uses wider vectors when built with -mavx*.
#include "gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "fusebox/core/parallel.h"

namespace fusebox::cpu {

namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float Vec __attribute__((vector_size(kVecBytes)));
};
template <>
struct Simd<double> {
  typedef double Vec __attribute__((vector_size(kVecBytes)));
};

// Register tile: MR rows x NR columns, NR = kVecsPerRow vectors. 6 x 2 vectors are
// 12 accumulators, which with 2 B vectors and an A value fit the 16 SIMD registers.
constexpr int kMR = 6;
constexpr int kVecsPerRow = 2;
template <class T>
constexpr int kLanes = kVecBytes / int(sizeof(T));
template <class T>
constexpr int kNR = kVecsPerRow* kLanes<T>;

// Cache blocks: the packed A block (MC x KC) stays in L2, one B panel (KC x NR) in L1.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 16 * kMR;
constexpr int64_t kMaxNC = 512;

template <class T>
struct GemmProblem {
  bool trans_a, trans_b;
  int64_t m, n, k;
  T alpha;
  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  T beta;
  T* c;
  int64_t ldc;
};

// a_pack[ir*kc + p*MR + r] = op(A)(i0 + ir + r, p0 + p) for each MR-row panel at ir.
template <class T>
void pack_a(const GemmProblem<T>& g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, T* a_pack) {
  for (int64_t ir = 0; ir < mc; ir += kMR) {
    T* dst = a_pack + ir * kc;
    int64_t rows = std::min<int64_t>(kMR, mc - ir);
    if (!g.trans_a) {  // op(A)(i, p) = a[i*lda + p]
      for (int64_t r = 0; r < rows; ++r) {
        const T* src = g.a + (i0 + ir + r) * g.lda + p0;
        for (int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = src[p];
      }
      for (int64_t r = rows; r < kMR; ++r)
        for (int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = T(0);
    } else {  // op(A)(i, p) = a[p*lda + i]
      for (int64_t p = 0; p < kc; ++p) {
        const T* src = g.a + (p0 + p) * g.lda + i0 + ir;
        for (int64_t r = 0; r < rows; ++r) dst[p * kMR + r] = src[r];
        for (int64_t r = rows; r < kMR; ++r) dst[p * kMR + r] = T(0);
      }
    }
  }
}

// b_pack[jr*kc + p*NR + col] = op(B)(p0 + p, j0 + jr + col) for each NR-column panel at jr.
template <class T>
void pack_b(const GemmProblem<T>& g, int64_t p0, int64_t kc, int64_t j0, int64_t nc, T* b_pack) {
  constexpr int64_t nr = kNR<T>;
  for (int64_t jr = 0; jr < nc; jr += nr) {
    T* dst = b_pack + jr * kc;
    int64_t cols = std::min<int64_t>(nr, nc - jr);
    if (!g.trans_b) {  // op(B)(p, j) = b[p*ldb + j]
      for (int64_t p = 0; p < kc; ++p) {
        const T* src = g.b + (p0 + p) * g.ldb + j0 + jr;
        for (int64_t col = 0; col < cols; ++col) dst[p * nr + col] = src[col];
        for (int64_t col = cols; col < nr; ++col) dst[p * nr + col] = T(0);
      }
    } else {  // op(B)(p, j) = b[j*ldb + p]
      for (int64_t col = 0; col < cols; ++col) {
        const T* src = g.b + (j0 + jr + col) * g.ldb + p0;
        for (int64_t p = 0; p < kc; ++p) dst[p * nr + col] = src[p];
      }
      for (int64_t col = cols; col < nr; ++col)
        for (int64_t p = 0; p < kc; ++p) dst[p * nr + col] = T(0);
    }
  }
}

// tile[MR x NR] = sum over p < kc of a_panel[p][:] (outer product) b_panel[p][:].
template <class T>
void micro_kernel(int64_t kc, const T* __restrict a_panel, const T* __restrict b_panel,
                  T* __restrict tile) {
  using Vec = typename Simd<T>::Vec;
  constexpr int lanes = kLanes<T>;
  constexpr int nr = kNR<T>;
  Vec acc[kMR][kVecsPerRow];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecsPerRow; ++v) acc[r][v] = Vec{};
  for (int64_t p = 0; p < kc; ++p) {
    Vec b[kVecsPerRow];
#pragma GCC unroll 4
    for (int v = 0; v < kVecsPerRow; ++v) std::memcpy(&b[v], b_panel + v * lanes, sizeof(Vec));
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      T a = a_panel[r];
#pragma GCC unroll 4
      for (int v = 0; v < kVecsPerRow; ++v) acc[r][v] += a * b[v];
    }
    a_panel += kMR;
    b_panel += nr;
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecsPerRow; ++v)
      std::memcpy(tile + r * nr + v * lanes, &acc[r][v], sizeof(Vec));
}

// C[i0:i0+mc, j0:j0+nc] for one problem; a_pack / b_pack are this thread's scratch.
template <class T>
void compute_block(const GemmProblem<T>& g, int64_t i0, int64_t mc, int64_t j0, int64_t nc,
                   T* a_pack, T* b_pack) {
  constexpr int64_t nr = kNR<T>;
  alignas(64) T tile[kMR * nr];
  for (int64_t p0 = 0; p0 < g.k; p0 += kKC) {
    int64_t kc = std::min(kKC, g.k - p0);
    pack_b(g, p0, kc, j0, nc, b_pack);
    pack_a(g, i0, mc, p0, kc, a_pack);
    bool first_slice = p0 == 0;
    for (int64_t jr = 0; jr < nc; jr += nr) {
      int64_t cols = std::min(nr, nc - jr);
      for (int64_t ir = 0; ir < mc; ir += kMR) {
        int64_t rows = std::min<int64_t>(kMR, mc - ir);
        micro_kernel(kc, a_pack + ir * kc, b_pack + jr * kc, tile);
        for (int64_t r = 0; r < rows; ++r) {
          T* c_row = g.c + (i0 + ir + r) * g.ldc + j0 + jr;
          const T* t_row = tile + r * nr;
          if (!first_slice) {
            for (int64_t col = 0; col < cols; ++col) c_row[col] += g.alpha * t_row[col];
          } else if (g.beta == T(0)) {  // C is not read: it may hold garbage
            for (int64_t col = 0; col < cols; ++col) c_row[col] = g.alpha * t_row[col];
          } else {
            for (int64_t col = 0; col < cols; ++col)
              c_row[col] = g.alpha * t_row[col] + g.beta * c_row[col];
          }
        }
      }
    }
  }
}

// C = beta * C (K == 0: the product is empty).
template <class T>
void scale_c(const GemmProblem<T>& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    T* c_row = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) c_row[j] = g.beta == T(0) ? T(0) : g.beta * c_row[j];
  }
}

}  // namespace

template <class T>
void blas_gemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                       int64_t stride_b, T beta, T* c, int64_t ldc, int64_t stride_c) {
  if (batch <= 0 || m <= 0 || n <= 0) return;
  auto problem = [&](int64_t i) {
    return GemmProblem<T>{
        trans_a, trans_b,          m,  n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
        beta,    c + i * stride_c, ldc};
  };
  if (k <= 0) {
    for (int64_t i = 0; i < batch; ++i) scale_c(problem(i));
    return;
  }
  // Blocks of C are the parallel tasks. Narrow the column blocks until there are a
  // few tasks per thread, so that small-M problems (a conv layer's K_out) still
  // spread over the threads.
  constexpr int64_t nr = kNR<T>;
  const int64_t m_blocks = (m + kMC - 1) / kMC;
  int64_t nc = std::min(kMaxNC, (n + nr - 1) / nr * nr);
  const int64_t wanted_tasks = 4 * int64_t(num_threads());
  while (nc > 4 * nr && batch * m_blocks * ((n + nc - 1) / nc) < wanted_tasks)
    nc = (nc / 2 + nr - 1) / nr * nr;
  const int64_t n_blocks = (n + nc - 1) / nc;
  const int64_t tasks = batch * m_blocks * n_blocks;
  // Below about a megaflop the threads cost more than they save.
  const bool tiny = 2.0 * double(batch) * double(m) * double(n) * double(k) < 1e6;
  parallel_for(tasks, tiny ? tasks : 1, [&](int64_t begin, int64_t end) {
    std::vector<T> a_pack(size_t(kMC * kKC)), b_pack(size_t(kKC * nc));
    for (int64_t t = begin; t < end; ++t) {
      int64_t bi = t / (m_blocks * n_blocks);
      int64_t mi = t / n_blocks % m_blocks;
      int64_t ni = t % n_blocks;
      int64_t i0 = mi * kMC, j0 = ni * nc;
      compute_block(problem(bi), i0, std::min(kMC, m - i0), j0, std::min(nc, n - j0), a_pack.data(),
                    b_pack.data());
    }
  });
}

template <class T>
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  blas_gemm_batched<T>(1, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0);
}

template void blas_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                               const float*, int64_t, float, float*, int64_t);
template void blas_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                int64_t, const double*, int64_t, double, double*, int64_t);
template void blas_gemm_batched<float>(int64_t, bool, bool, int64_t, int64_t, int64_t, float,
                                       const float*, int64_t, int64_t, const float*, int64_t,
                                       int64_t, float, float*, int64_t, int64_t);
template void blas_gemm_batched<double>(int64_t, bool, bool, int64_t, int64_t, int64_t, double,
                                        const double*, int64_t, int64_t, const double*, int64_t,
                                        int64_t, double, double*, int64_t, int64_t);

}  // namespace fusebox::cpu
