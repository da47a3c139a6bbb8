// The generated fused_pointwise kernels (kernels/pointwise/fused_codegen.h): the source is a
// pure function of the spec, names the program, and compiles with NVRTC for every dtype,
// access pattern and path; the fast 32-bit division is exact. No GPU needed.
#include <gtest/gtest.h>

#include <random>

#include "backends/cuda/kernels/pointwise/fused_codegen.h"
#include "backends/cuda/runtime/nvrtc.h"
#include "random_pointwise.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cuda {
namespace {

// x*a+b -> gelu -> *c -> +d -> relu: x contiguous, a..d per channel.
FusedKernelSpec per_channel_spec(DType t, int width) {
  FusedKernelSpec s;
  s.program = {5,
               {{OpKind::mul, {0, 1}},
                {OpKind::add, {5, 2}},
                {OpKind::gelu, {6}},
                {OpKind::mul, {7, 3}},
                {OpKind::add, {8, 4}},
                {OpKind::relu, {9}}}};
  s.values = check_pointwise_program(s.program, std::vector<DType>(5, t), "spec");
  s.vector_width = width;
  const FusedAccess bcast = width > 1 ? FusedAccess::uniform : FusedAccess::strided;
  s.access = {FusedAccess::contiguous, bcast, bcast, bcast, bcast};
  s.rank = 3;
  s.moves = {7, 2, 2, 2, 2};
  return s;
}

TEST(FusedCodegen, SourceIsAPureFunctionOfTheSpec) {
  const FusedKernelSpec s = per_channel_spec(DType::bf16, 8);
  const std::string source = fused_kernel_source(s);
  EXPECT_EQ(source, fused_kernel_source(per_channel_spec(DType::bf16, 8)));
  EXPECT_EQ(source.rfind("// fusebox generated kernel: fused_pointwise", 0), 0u);
  EXPECT_NE(source.find("// program: t0=mul(in0,in1); t1=add(t0,in2); t2=gelu(t1); "
                        "t3=mul(t2,in3); t4=add(t3,in4); t5=relu(t4)\n"),
            std::string::npos);
  EXPECT_NE(source.find(cat("void __launch_bounds__(256) ", kFusedKernelName, "(")),
            std::string::npos);
  // Every part of the spec shows in the source.
  FusedKernelSpec other = s;
  other.index32 = false;
  EXPECT_NE(fused_kernel_source(other), source);
  other = s;
  other.moves[1] = 3;
  EXPECT_NE(fused_kernel_source(other), source);
  EXPECT_NE(fused_kernel_source(per_channel_spec(DType::f16, 8)), source);
  EXPECT_NE(fused_kernel_source(per_channel_spec(DType::bf16, 1)), source);
}

TEST(FusedCodegen, EveryDtypeAndPathCompiles) {
  const NvrtcTarget target = nvrtc_target(90);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int width : {1, int(16 / dtype_size(t))}) {
      SCOPED_TRACE(cat(dtype_name(t), " width ", width));
      FusedKernelSpec s = per_channel_spec(t, width);
      if (width > 1) s.access[4] = FusedAccess::row;
      EXPECT_GT(nvrtc_compile(fused_kernel_source(s), target, "codegen test").size(), 0u);
    }
  }
}

// Random programs, mixed dtypes (casts, pow with another exponent width), every op.
TEST(FusedCodegen, RandomProgramsCompile) {
  const NvrtcTarget target = nvrtc_target(90);
  fusebox::testing::ChainOptions o;
  o.dtypes = {DType::f32, DType::bf16, DType::f16, DType::f64};
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    const fusebox::testing::RandomChain c = fusebox::testing::random_chain(seed, o);
    std::vector<DType> inputs;
    for (const Tensor& t : c.inputs) inputs.push_back(t.dtype());
    FusedKernelSpec s;
    s.program = c.program;
    s.values = check_pointwise_program(c.program, inputs, "spec");
    s.rank = 2;
    s.vector_width = seed % 2 == 0 ? 8 : 1;
    for (size_t k = 0; k < inputs.size(); ++k) {
      s.access.push_back(k == 0               ? FusedAccess::contiguous
                         : s.vector_width > 1 ? (k % 2 ? FusedAccess::uniform : FusedAccess::row)
                                              : FusedAccess::strided);
      s.moves.push_back(k == 0 ? 3u : uint32_t(k % 4));
    }
    EXPECT_GT(nvrtc_compile(fused_kernel_source(s), target, "codegen test").size(), 0u)
        << pointwise_program_text(c.program);
  }
}

TEST(FusedCodegen, FastDivisionIsExact) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> divisors = {1,  2,   3,    5,    7,     8,     49,
                                    56, 224, 1000, 4096, 65535, 65536, (1u << 31) - 1};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + uint32_t(rng() % (1u << (1 + i % 31))));
  for (uint32_t d : divisors) {
    const FastDivisor f = fast_divisor(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - 2};
    for (int j = 0; j < 2000; ++j) ns.push_back(uint32_t(rng() % (1u << 31)));
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(fast_divide(n, d, f), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda
