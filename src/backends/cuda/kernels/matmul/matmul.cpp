// matmul and gemm through cuBLASLt.
//
// Row-major to column-major. cuBLASLt is column-major, and a row-major matrix [r, c] with
// row stride ld is the column-major matrix [c, r] with the same ld (its transpose). So a
// row-major Y[M, N] = op(A) op(B) is computed as the column-major Y^T[N, M] =
// op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A, each with its
// transpose flag as given (a stored [K, N] B is column-major [N, K]: no transpose; a
// stored [N, K] B (trans_b) is column-major [K, N]: transposed).
//
// matmul: numpy semantics. A 1-D a is [1, K], a 1-D b [K, 1] (the output's shape, from
// inference, already drops the added dim; the bytes agree). Batch dims broadcast: the
// batch is a strided nest over the output's batch dims in which each operand has a
// matrix stride (0 where it broadcasts). Neighbouring dims that every operand walks as
// one merge; the innermost remaining dim becomes one strided-batched call (cuBLASLt
// takes a batch stride of 0 for a broadcast operand) and any outer dims a loop of calls
// inside one captured library call. When b has no batch and a is contiguous, the batch
// folds into M: one plain GEMM of [batch * M, K] x [K, N].
// gemm: y = alpha * op(A) op(B) + beta * C. A bias (C a contiguous vector over y's columns,
// [N] or [1, N], beta 1; a linear layer's) is cuBLASLt's BIAS epilogue (with RELU or GELU
// where gemm has that activation), added in f32 before the store: y is written once. Any
// other C (broadcast to [M, N]) is first copied into y (copy_strided), then the product is
// accumulated onto y with beta; so is a bias where cuBLASLt has no algorithm with the epilogue
// or the vector is not 16-byte aligned.
// K = 0: the product is empty: matmul writes zeros; gemm runs a K = 1 product of zeros so
// that y = beta * C still holds.
// gemm's fused activation (GemmAttrs::activation): relu and gelu (tanh form; not in f64) as
// cuBLASLt's epilogue (RELU, GELU: applied to alpha * AB + beta * C in f32 before the store); where
// cuBLASLt has no algorithm with that epilogue, and for the other activations, the plain
// GEMM and then one pass over y (kernels/conv/epilogue.cu's conv_epilogue on [M, N]).
//
// gemm's mixed form (GemmAttrs::y_dtype f32 with f16/bf16 operands) is cuBLASLt's f32 C/D
// beside the low-precision A/B: the accumulator stored without rounding.
//
// Precision: f32 runs in f32 (CUBLAS_COMPUTE_32F), as PyTorch's default; TF32 tensor-core
// math only with FUSEBOX_ALLOW_TF32_MATMUL=1 (FUSEBOX_ALLOW_TF32 is the convolutions'
// switch, default on, as PyTorch's cudnn.allow_tf32). f16 and bf16 multiply on the
// tensor cores with f32 accumulation and f32 alpha/beta; f64 in f64.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per full problem
// (dtype, transposes, sizes, leading dims, batch and strides, pointer alignments), so a
// repeated shape costs a map look-up. The workspace the algorithm asks for is allocated
// before the capture and held as a temporary.
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t(32) << 20;  // cuBLAS's advice for Hopper
constexpr size_t kMaxCachedPlans = 1024;

// One (batched) GEMM in row-major terms: Y = alpha * op(A) op(B) + beta * Y for each of
// `batch` matrices, operand X's matrices stride_x elements apart.
struct GemmProblem {
  DType dtype = DType::f32;    // the operands'
  DType y_dtype = DType::f32;  // y's: the operands', or f32 in gemm's mixed form
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldy = 0;  // row strides of the stored matrices
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_y = 0;
  // RELU or GELU: gemm's activation; BIAS, RELU_BIAS or GELU_BIAS with a bias vector.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

// The epilogue that also adds a bias vector (per column of the row-major y: per row of
// cuBLASLt's column-major [N, M] result, as its BIAS epilogues add).
cublasLtEpilogue_t with_bias(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_RELU:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case CUBLASLT_EPILOGUE_GELU:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
    default:
      return CUBLASLT_EPILOGUE_BIAS;
  }
}

// The cuBLASLt epilogue computing `a` in `dtype`, or DEFAULT where it has none. Its GELU is
// not f64-accurate (1e-10 off the formula on an H100, 2026-11-24): f64 takes the pass.
cublasLtEpilogue_t cublaslt_epilogue(const FusedActivation& a, DType dtype) {
  switch (a.kind) {
    case Activation::relu:
      return CUBLASLT_EPILOGUE_RELU;
    case Activation::gelu_tanh:
      return dtype == DType::f64 ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_GELU;
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The largest power of two (at most 256) dividing the address and the byte sizes of the
// leading dim and batch stride: what cuBLASLt may assume about every matrix of an operand.
uint32_t alignment(const void* p, int64_t ld, int64_t stride, size_t elem) {
  uint64_t bits =
      reinterpret_cast<uintptr_t>(p) | uint64_t(ld) * elem | uint64_t(stride) * elem | 256;
  return uint32_t(bits & (~bits + 1));
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool scale_is_double = false;
  // A BIAS epilogue's vector is an attribute of the (shared) descriptor: set and used under
  // this lock, so that two recordings of the same plan cannot swap vectors.
  std::mutex bias_mutex;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f64:
      return CUDA_R_64F;
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      break;
  }
  throw Error("matmul", cat("cuBLASLt takes no ", dtype_name(t)));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  FUSEBOX_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    FUSEBOX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    FUSEBOX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

// Builds the descriptors and asks the heuristic for an algorithm; null when it finds none.
std::shared_ptr<Plan> make_plan(cublasLtHandle_t handle, const GemmProblem& p,
                                const std::array<uint32_t, 3>& align) {
  auto plan = std::make_shared<Plan>();
  const cudaDataType_t type = data_type(p.dtype);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if (p.dtype == DType::f64) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
    plan->scale_is_double = true;
  } else if (p.dtype == DType::f32 && settings().allow_tf32_matmul) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, scale));
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &op_first, sizeof op_first));
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &op_second, sizeof op_second));
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &p.epilogue, sizeof p.epilogue));
  }
  // Stored column-major shapes: B is [N, K] (or [K, N] with trans_b), A is [K, M] (or
  // [M, K] with trans_a), Y is [N, M].
  plan->first = p.trans_b ? make_layout(type, p.k, p.n, p.ldb, p.batch, p.stride_b)
                          : make_layout(type, p.n, p.k, p.ldb, p.batch, p.stride_b);
  plan->second = p.trans_a ? make_layout(type, p.m, p.k, p.lda, p.batch, p.stride_a)
                           : make_layout(type, p.k, p.m, p.lda, p.batch, p.stride_a);
  plan->out = make_layout(data_type(p.y_dtype), p.n, p.m, p.ldy, p.batch, p.stride_y);

  cublasLtMatmulPreference_t preference = nullptr;
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      preference_owner(preference, cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace = kMaxWorkspace;
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,  // our A is cuBLASLt's B
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,  // our B is cuBLASLt's A
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
  for (int i = 0; i < 3; ++i) {
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, align_attrs[i],
                                                              &align[size_t(i)], sizeof(uint32_t)));
  }
  FUSEBOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof(uint32_t)));
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->first, plan->second, plan->out,
                                     plan->out, preference, 1, &plan->heuristic, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return nullptr;
  FUSEBOX_CUBLAS_CHECK(status);
  return plan;
}

// The plan of a problem, from the cache or made now; null when cuBLASLt has no algorithm.
std::shared_ptr<Plan> find_plan(Device& device, const GemmProblem& p,
                                const std::array<uint32_t, 3>& align) {
  using Key = std::array<int64_t, 20>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<Plan>> cache;
  const Key key = {device.id(),
                   int64_t(p.dtype),
                   int64_t(p.y_dtype),
                   p.trans_a,
                   p.trans_b,
                   p.m,
                   p.n,
                   p.k,
                   p.lda,
                   p.ldb,
                   p.ldy,
                   p.batch,
                   p.stride_a,
                   p.stride_b,
                   p.stride_y,
                   align[0],
                   align[1],
                   align[2],
                   p.dtype == DType::f32 && settings().allow_tf32_matmul,
                   int64_t(p.epilogue)};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<Plan> plan = make_plan(device.cublaslt_handle(), p, align);
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxCachedPlans) cache.clear();  // plans in use stay alive (shared)
  cache.emplace(key, plan);
  return plan;
}

// The operands of a GEMM call sequence: `offsets` lists each call's element offsets
// (a, b, y) from the tensors' data pointers.
struct GemmOperands {
  const DeviceTensor* a;
  const DeviceTensor* b;
  DeviceTensor* y;
  std::vector<std::array<int64_t, 3>> offsets = {{0, 0, 0}};
};

// The alignments cuBLASLt may assume of the operands (a, b, y) of every call in `ops`.
std::array<uint32_t, 3> operand_alignments(const GemmProblem& p, const GemmOperands& ops) {
  const size_t elem = dtype_size(p.dtype), y_elem = dtype_size(p.y_dtype);
  const char* pa = static_cast<const char*>(ops.a->data());
  const char* pb = static_cast<const char*>(ops.b->data());
  const char* py = static_cast<const char*>(ops.y->data());
  std::array<uint32_t, 3> align = {alignment(pa, p.lda, p.stride_a, elem),
                                   alignment(pb, p.ldb, p.stride_b, elem),
                                   alignment(py, p.ldy, p.stride_y, y_elem)};
  for (const auto& off : ops.offsets) {
    align[0] = std::min(align[0], alignment(pa + off[0] * int64_t(elem), 0, 0, elem));
    align[1] = std::min(align[1], alignment(pb + off[1] * int64_t(elem), 0, 0, elem));
    align[2] = std::min(align[2], alignment(py + off[2] * int64_t(y_elem), 0, 0, y_elem));
  }
  return align;
}

// Captures `plan`'s GEMMs (one per offset) as one library call; `bias`: the BIAS epilogue's
// vector (the plan has one) or null.
void record_plan(Context& ctx, const std::shared_ptr<Plan>& plan, const GemmProblem& p,
                 const GemmOperands& ops, const std::vector<std::array<int64_t, 3>>& offsets,
                 double alpha, double beta, const BufferList& reads, const void* bias) {
  const size_t elem = dtype_size(p.dtype), y_elem = dtype_size(p.y_dtype);
  const char* pa = static_cast<const char*>(ops.a->data());
  const char* pb = static_cast<const char*>(ops.b->data());
  char* py = static_cast<char*>(ops.y->data());
  const size_t workspace_bytes = plan->heuristic.workspaceSize;
  const BufferRange workspace = ctx.encoder.scratch(ctx.allocator, workspace_bytes);
  BufferList writes = {ops.y->range()};
  if (workspace_bytes > 0) writes.push_back(workspace);
  cublasLtHandle_t handle = ctx.device.cublaslt_handle();  // created before the capture
  const float alpha_f = float(alpha), beta_f = float(beta);
  const void* alpha_p = plan->scale_is_double ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = plan->scale_is_double ? static_cast<const void*>(&beta) : &beta_f;
  std::unique_lock<std::mutex> bias_lock(plan->bias_mutex, std::defer_lock);
  if (bias != nullptr) {
    bias_lock.lock();
    FUSEBOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  ctx.encoder.capture_library_call(reads, writes, [&](cudaStream_t stream) {
    for (const auto& off : offsets) {
      void* y = py + off[2] * int64_t(y_elem);
      FUSEBOX_CUBLAS_CHECK(cublasLtMatmul(handle, plan->desc, alpha_p, pb + off[1] * int64_t(elem),
                                          plan->first, pa + off[0] * int64_t(elem), plan->second,
                                          beta_p, y, plan->out, y, plan->out, &plan->heuristic.algo,
                                          workspace.data(), workspace_bytes, stream));
    }
  });
  ctx.encoder.keep_alive(plan);
}

// A column count whose bytes are not a multiple of 16 (GPT-2's LM head: Y [16384, 50257] and
// B [768, 50257] in bf16) leaves cuBLASLt only slow kernels: 10.0 ms (~126 TFLOP/s) for that
// product on an H200, and 14.0 with the leading dims alone padded (N still odd). So a single
// GEMM whose N is not a multiple of 16 bytes' elements runs on padded copies where the copies
// are cheap against the product: N rounded up, B copied into a zero-filled [K, N'] (or
// [N', K]), the bias into a zero-filled [N'], Y written as [rows, N'] blocks whose first N
// columns are copied into place (Inductor pads such dims too). The copies move B and Y twice;
// the product's flops must be at least kPadFlopsPerByte times those bytes (GPT-2's LM head:
// ~380 flops per byte), and large enough that the extra launches do not matter. The padded Y
// is a block of at most kPadBlockBytes of rows at a time, reused by the next block: padded
// whole, GPT-2's f32 logits would need a second 3.3 GB beside the output.
constexpr double kPadFlopsPerByte = 128;
constexpr double kPadMinFlops = double(int64_t(1) << 32);
constexpr int64_t kPadBlockBytes = int64_t(256) << 20;
constexpr int64_t kPadBlockRowMultiple = 128;  // a tile's rows: blocks keep whole tiles

// A matrix stored [rows, cols] with row stride `ld`, `offset` elements into `t`, as a view.
DeviceTensor matrix_view(const DeviceTensor& t, int64_t offset, int64_t rows, int64_t cols,
                         int64_t ld) {
  return t.view(t.offset + offset, {rows, cols}, {ld, 1});
}

// Records the product with N padded (above); false, recording nothing, where N needs no
// padding, A's leading dim is misaligned too, the copies would not pay, or cuBLASLt has no
// algorithm for the padded problem. beta is 0 (y is only written); `bias` as record_plan's.
bool record_padded(Context& ctx, const GemmProblem& p, const GemmOperands& ops, double alpha,
                   const DeviceTensor* bias) {
  const size_t elem = dtype_size(p.dtype), y_elem = dtype_size(p.y_dtype);
  if (p.dtype == DType::f64 || p.batch != 1 || ops.offsets.size() != 1) return false;
  const int64_t per_row = int64_t(16 / elem);  // also a multiple of y's per 16 bytes
  if (p.n % per_row == 0 || (p.lda * int64_t(elem)) % 16 != 0) return false;
  const double copied =
      2.0 * (double(elem) * double(p.k) + double(y_elem) * double(p.m)) * double(p.n);
  const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
  if (flops < kPadMinFlops || flops < kPadFlopsPerByte * copied) return false;

  GemmProblem q = p;
  q.n = (p.n + per_row - 1) / per_row * per_row;
  // Stored B: [K, N] ([N, K] with trans_b); the padded one [K, N'] ([N', K]), zeros past N.
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  q.ldb = p.trans_b ? p.k : q.n;
  q.ldy = q.n;
  int64_t block =
      kPadBlockBytes / (q.n * int64_t(y_elem)) / kPadBlockRowMultiple * kPadBlockRowMultiple;
  block = std::min(p.m, std::max(block, kPadBlockRowMultiple));
  // Row r of op(A) starts r elements into a stored [K, M] (trans_a), r rows into [M, K].
  const int64_t a_row_step = p.trans_a ? 1 : p.lda;
  const auto& off = ops.offsets.front();
  DeviceTensor b = temporary_tensor(ctx, p.dtype, {p.trans_b ? q.n : p.k, q.ldb});
  DeviceTensor y = temporary_tensor(ctx, p.y_dtype, {block, q.ldy});
  // The plans of the whole blocks and of the last, shorter one: all found before anything
  // is recorded.
  std::vector<std::pair<int64_t, std::shared_ptr<Plan>>> blocks;  // (first row, plan)
  for (int64_t r = 0; r < p.m; r += block) {
    GemmProblem qb = q;
    qb.m = std::min(block, p.m - r);
    const GemmOperands padded{ops.a, &b, &y, {{off[0] + r * a_row_step, 0, 0}}};
    std::shared_ptr<Plan> plan = find_plan(ctx.device, qb, operand_alignments(qb, padded));
    if (!plan) return false;
    blocks.emplace_back(r, std::move(plan));
  }
  std::optional<DeviceTensor> padded_bias;
  if (bias) padded_bias = temporary_tensor(ctx, bias->dtype, {q.n});
  ctx.encoder.memset(b.range(), 0);
  copy_strided(ctx, matrix_view(*ops.b, off[1], b_rows, b_cols, p.ldb),
               matrix_view(b, 0, b_rows, b_cols, q.ldb));
  BufferList reads = {ops.a->range(), b.range()};
  if (padded_bias) {
    ctx.encoder.memset(padded_bias->range(), 0);
    copy_strided(ctx, bias->view(bias->offset, {p.n}, {1}),
                 padded_bias->view(padded_bias->offset, {p.n}, {1}));
    reads.push_back(padded_bias->range());
  }
  for (const auto& [r, plan] : blocks) {
    GemmProblem qb = q;
    qb.m = std::min(block, p.m - r);
    const GemmOperands padded{ops.a, &b, &y, {{off[0] + r * a_row_step, 0, 0}}};
    record_plan(ctx, plan, qb, padded, padded.offsets, alpha, 0.0, reads,
                padded_bias ? padded_bias->data() : nullptr);
    copy_strided(ctx, matrix_view(y, 0, qb.m, p.n, q.ldy),
                 matrix_view(*ops.y, off[2] + r * p.ldy, qb.m, p.n, p.ldy));
  }
  return true;
}

// Records y = alpha * op(A) op(B) + bias (a vector over y's columns, p.epilogue one of the
// BIAS epilogues) as one cuBLASLt call. False, recording nothing, where cuBLASLt has no
// algorithm for it.
bool record_gemm_with_bias(Context& ctx, const GemmProblem& p, const GemmOperands& ops,
                           double alpha, const DeviceTensor& bias, BufferList reads) {
  if (record_padded(ctx, p, ops, alpha, &bias)) return true;
  const std::shared_ptr<Plan> plan = find_plan(ctx.device, p, operand_alignments(p, ops));
  if (!plan) return false;
  reads.push_back(bias.range());
  record_plan(ctx, plan, p, ops, ops.offsets, alpha, 0.0, reads, bias.data());
  return true;
}

// Records the GEMMs (one per offset triple) as one library call. Returns whether p's
// epilogue ran in it: where cuBLASLt has no algorithm with it, the GEMM runs without (the
// caller applies the activation).
bool record_gemm(Context& ctx, const std::string& where, GemmProblem p, const GemmOperands& ops,
                 double alpha, double beta, const BufferList& reads) {
  if (beta == 0.0 && record_padded(ctx, p, ops, alpha, nullptr))
    return p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  const size_t elem = dtype_size(p.dtype);
  std::array<uint32_t, 3> align = operand_alignments(p, ops);
  std::vector<std::array<int64_t, 3>> offsets = ops.offsets;
  std::shared_ptr<Plan> plan = find_plan(ctx.device, p, align);
  if (!plan && p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    p.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    plan = find_plan(ctx.device, p, align);
  }
  if (!plan && p.batch > 1) {
    // No strided-batched algorithm (e.g. for a broadcast stride): one call per matrix.
    std::vector<std::array<int64_t, 3>> each;
    for (const auto& off : offsets) {
      for (int64_t i = 0; i < p.batch; ++i) {
        each.push_back({off[0] + i * p.stride_a, off[1] + i * p.stride_b, off[2] + i * p.stride_y});
      }
    }
    offsets = std::move(each);
    p.batch = 1;
    p.stride_a = p.stride_b = p.stride_y = 0;
    for (auto& a : align) a = std::min<uint32_t>(a, uint32_t(elem));
    plan = find_plan(ctx.device, p, align);
  }
  FUSEBOX_CHECK(plan != nullptr, where, "cuBLASLt has no algorithm for a ", dtype_name(p.dtype),
                " GEMM of M ", p.m, ", N ", p.n, ", K ", p.k, " (batch ", p.batch, ")");
  record_plan(ctx, plan, p, ops, offsets, alpha, beta, reads, nullptr);
  return p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
}

// C as a linear layer's bias: a dense vector over y's `cols` columns ([N] or [1, N]),
// added with beta 1, 16-byte aligned (cuBLASLt's epilogue reads it in vectors), not f64;
// null otherwise.
const DeviceTensor* bias_vector(const DeviceTensor* c, const GemmAttrs& attrs, int64_t cols) {
  if (c == nullptr || attrs.beta != 1.0 || c->dtype == DType::f64 || c->numel() != cols ||
      c->shape.empty() || c->shape.back() != cols || c->strides.back() != 1 ||
      reinterpret_cast<uintptr_t>(c->data()) % 16 != 0)
    return nullptr;
  return c;
}

void check_float(const std::string& where, DType t) {
  FUSEBOX_CHECK(t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64, where,
                "expects f32, f16, bf16 or f64 operands, got ", dtype_name(t));
}

// Zero-filled contiguous [rows, cols] temporary of `dtype`.
DeviceTensor zeros(Context& ctx, DType dtype, int64_t rows, int64_t cols) {
  DeviceTensor t = temporary_tensor(ctx, dtype, {rows, cols});
  ctx.encoder.memset(t.range(), 0);
  return t;
}

}  // namespace

void matmul(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor& a = *in[0];
  const DeviceTensor& b = *in[1];
  DeviceTensor& y = out[0];
  check_float(where, a.dtype);
  FUSEBOX_CHECK(b.dtype == a.dtype && y.dtype == a.dtype, where,
                "operands and output must share a dtype");
  Shape sa = a.shape, sb = b.shape;
  FUSEBOX_CHECK(!sa.empty() && !sb.empty(), where, "operands must have rank >= 1, got ",
                shape_str(sa), " and ", shape_str(sb));
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), cols = sb.back();
  FUSEBOX_CHECK(sb[sb.size() - 2] == k, where, "inner dims differ: ", shape_str(a.shape), " x ",
                shape_str(b.shape));
  const Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2);
  Shape batch;
  FUSEBOX_CHECK(broadcast_shapes(batch_a, batch_b, &batch), where,
                "batch dims do not broadcast: ", shape_str(a.shape), " x ", shape_str(b.shape));
  const int64_t count = numel(batch);
  FUSEBOX_CHECK(y.numel() == count * m * cols, where, "output ", shape_str(y.shape),
                " does not match the product's size");
  if (y.numel() == 0) return;
  if (k == 0) {
    ctx.encoder.memset(y.range(), 0);
    return;
  }

  GemmProblem p;
  p.dtype = p.y_dtype = a.dtype;
  p.m = m;
  p.n = cols;
  p.k = k;
  p.lda = k;
  p.ldb = cols;
  p.ldy = cols;
  GemmOperands ops{&a, &b, &y};
  if (numel(batch_b) == 1 && numel(batch_a) == count) {
    p.m = count * m;  // the batch folds into M: a is contiguous [count * M, K]
  } else {
    // Each batch dim's matrix stride per operand (0 where it broadcasts), merged where
    // every operand walks two neighbouring dims as one.
    Shape dims;
    std::array<Shape, 3> strides;  // a, b, y
    const size_t rank = batch.size();
    int64_t sa_stride = m * k, sb_stride = k * cols, sy_stride = m * cols;
    std::array<Shape, 3> full = {Shape(rank, 0), Shape(rank, 0), Shape(rank, 0)};
    for (size_t d = rank; d-- > 0;) {
      const size_t da = d + batch_a.size() - rank, db = d + batch_b.size() - rank;
      const bool has_a = d >= rank - batch_a.size(), has_b = d >= rank - batch_b.size();
      full[0][d] = has_a && batch_a[da] != 1 ? sa_stride : 0;
      full[1][d] = has_b && batch_b[db] != 1 ? sb_stride : 0;
      full[2][d] = sy_stride;
      if (has_a) sa_stride *= batch_a[da];
      if (has_b) sb_stride *= batch_b[db];
      sy_stride *= batch[d];
    }
    for (size_t d = 0; d < rank; ++d) {
      if (batch[d] == 1) continue;
      bool merge = !dims.empty();
      for (int o = 0; o < 3 && merge; ++o) merge = strides[o].back() == full[o][d] * batch[d];
      if (merge) {
        dims.back() *= batch[d];
        for (int o = 0; o < 3; ++o) strides[o].back() = full[o][d];
      } else {
        dims.push_back(batch[d]);
        for (int o = 0; o < 3; ++o) strides[o].push_back(full[o][d]);
      }
    }
    if (!dims.empty()) {
      p.batch = dims.back();
      p.stride_a = strides[0].back();
      p.stride_b = strides[1].back();
      p.stride_y = strides[2].back();
      // One call per entry of the outer dims.
      ops.offsets.clear();
      const int64_t outer = count / p.batch;
      for (int64_t j = 0; j < outer; ++j) {
        std::array<int64_t, 3> off = {0, 0, 0};
        int64_t rem = j;
        for (size_t d = dims.size() - 1; d-- > 0;) {
          const int64_t coord = rem % dims[d];
          rem /= dims[d];
          for (int o = 0; o < 3; ++o) off[size_t(o)] += coord * strides[o][d];
        }
        ops.offsets.push_back(off);
      }
    }
  }
  record_gemm(ctx, where, p, ops, 1.0, 0.0, {a.range(), b.range()});
}

void gemm(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<GemmAttrs>(n.attrs);
  const DeviceTensor& a = *in[0];
  const DeviceTensor& b = *in[1];
  const DeviceTensor* c = in.size() > 2 ? in[2] : nullptr;
  DeviceTensor& y = out[0];
  check_float(where, a.dtype);
  const bool mixed = y.dtype == DType::f32 && is_low_float(a.dtype) && !c;  // ir/ops.h
  FUSEBOX_CHECK(b.dtype == a.dtype && (y.dtype == a.dtype || mixed) && (!c || c->dtype == a.dtype),
                where, "operands and output must share a dtype (or be gemm's mixed form)");
  FUSEBOX_CHECK(a.rank() == 2 && b.rank() == 2, where, "expects 2-D operands, got ",
                shape_str(a.shape), " and ", shape_str(b.shape));
  const int64_t m = attrs.trans_a ? a.shape[1] : a.shape[0];
  const int64_t k = attrs.trans_a ? a.shape[0] : a.shape[1];
  const int64_t cols = attrs.trans_b ? b.shape[0] : b.shape[1];
  FUSEBOX_CHECK((attrs.trans_b ? b.shape[1] : b.shape[0]) == k, where,
                "inner dims differ: ", shape_str(a.shape), " x ", shape_str(b.shape));
  FUSEBOX_CHECK(y.shape == Shape({m, cols}), where, "output ", shape_str(y.shape), " should be [",
                m, ", ", cols, "]");
  Shape c_shape;
  FUSEBOX_CHECK(
      !c || (broadcast_shapes(c->shape, {m, cols}, &c_shape) && c_shape == Shape{m, cols}), where,
      "C ", shape_str(c ? c->shape : Shape{}), " does not broadcast to [", m, ", ", cols, "]");
  if (y.numel() == 0) return;
  const bool add_c = c != nullptr && attrs.beta != 0.0;
  // The activation cuBLASLt did not run (none of its epilogues, or refused): one pass.
  auto finish = [&](bool epilogue_ran) {
    if (attrs.activation && !epilogue_ran)
      conv_epilogue(ctx, n, ConvEpilogueOperands{.activation = attrs.activation}, y);
  };
  GemmProblem p;
  p.dtype = a.dtype;
  p.y_dtype = y.dtype;
  p.trans_a = attrs.trans_a;
  p.trans_b = attrs.trans_b;
  p.m = m;
  p.n = cols;
  p.k = k;
  p.lda = a.shape[1];
  p.ldb = b.shape[1];
  p.ldy = cols;
  p.epilogue = cublaslt_epilogue(attrs.activation, a.dtype);
  if (const DeviceTensor* bias = k > 0 ? bias_vector(c, attrs, cols) : nullptr) {
    GemmProblem pb = p;
    pb.epilogue = with_bias(p.epilogue);
    if (record_gemm_with_bias(ctx, pb, GemmOperands{&a, &b, &y}, attrs.alpha, *bias,
                              {a.range(), b.range()})) {
      finish(p.epilogue != CUBLASLT_EPILOGUE_DEFAULT);
      return;
    }
  }
  if (add_c) {
    DeviceTensor broadcast = *c;
    broadcast.shape = {m, cols};
    broadcast.strides = Shape(2, 0);
    const Shape own = c->strides;
    for (size_t d = 0; d < c->shape.size(); ++d) {
      const size_t to = 2 - c->shape.size() + d;
      broadcast.strides[to] = c->shape[d] == 1 ? 0 : own[d];
    }
    copy_strided(ctx, broadcast, y);
  }
  BufferList reads = {a.range(), b.range()};
  if (add_c) reads.push_back(y.range());
  if (k > 0) {
    GemmOperands ops{&a, &b, &y};
    finish(record_gemm(ctx, where, p, ops, attrs.alpha, add_c ? attrs.beta : 0.0, reads));
    return;
  }
  // K = 0: y = beta * C (or 0), through a K = 1 product of zeros.
  const DeviceTensor za = zeros(ctx, a.dtype, m, 1), zb = zeros(ctx, a.dtype, 1, cols);
  p.trans_a = p.trans_b = false;
  p.k = 1;
  p.lda = 1;
  p.ldb = cols;
  GemmOperands ops{&za, &zb, &y};
  reads = {za.range(), zb.range()};
  if (add_c) reads.push_back(y.range());
  finish(record_gemm(ctx, where, p, ops, 1.0, add_c ? attrs.beta : 0.0, reads));
}

}  // namespace fusebox::cuda
