// A probe, not a check: grouped conv_backward_filter with asymmetric padding on cuDNN (config
// 191 of the matrix gave a wrong dw on the H100 with cuDNN 9.19). This probe found the cause
// (2026-11-22): engines eng1 and eng20 are wrong for 3-D f16/bf16 grouped wgrads, which
// barred_engines() now bars. With the bar lifted (FUSEBOX_CONV_ALLOW_BARRED_ENGINES=1, a
// setting for diagnosis) a small sweep runs on cuDNN: rank 1/2/3 x f32/bf16 x groups 2, 3 and
// depthwise x the asymmetric dim and side (pads 2/0 or 0/2; the other dims 1/1) x stride
// 1/2 x NCHW/channels-last, plus config 191 itself and two controls next to it. One line per
// configuration: engine, PASS/FAIL against the CPU, relative L2 and max relative error; then the
// failures by attribute and by engine, and for the first failures every heuristics candidate
// (FUSEBOX_CONV_PLAN_INDEX) with its result, so the table says whether one engine is wrong.
//
// The test fails only if something crashes (an Error that is not cuDNN refusing the
// problem) or the sweep did not run; a wrong dw is printed, never a failure.
#include <algorithm>
#include <map>
#include <sstream>

#include "conv_test_util.h"

namespace fusebox::cuda::testing {
namespace {

class ConvCudnnProbeTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

struct ProbeCase {
  ConvConfig config;
  std::string tag;    // "3d bf16 g3 nchw dim2 lo>hi s1": the sweep's attributes, as words
  bool sweep = true;  // false: config 191 and its controls (not tallied by attribute)
};

// max |got - want| / max |want|.
double max_relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  if (g.size() != w.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    diff = std::max(diff, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<ProbeCase> probe_cases() {
  std::vector<ProbeCase> cases;
  for (int rank = 1; rank <= 3; ++rank) {
    const Shape extents = rank == 1 ? Shape{9} : rank == 2 ? Shape{7, 6} : Shape{5, 4, 6};
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (int grouping = 0; grouping < 3; ++grouping) {  // groups 2, 3, depthwise
        for (int dim = 0; dim < rank; ++dim) {
          for (bool low_side : {true, false}) {
            for (int64_t stride : {1, 2}) {
              for (bool channels_last : {false, true}) {
                ConvConfig c;
                c.op = OpKind::conv_backward_filter;
                c.dtype = dtype;
                c.batch = 2;
                if (grouping == 0) {
                  c.groups = 2, c.in_channels = 6, c.out_channels = 4;
                } else if (grouping == 1) {
                  c.groups = 3, c.in_channels = 9, c.out_channels = 6;
                } else {
                  c.groups = 4, c.in_channels = 4, c.out_channels = 4;
                }
                c.spatial = extents;
                c.filter.assign(size_t(rank), 3);
                c.strides.assign(size_t(rank), stride);
                c.dilations.assign(size_t(rank), 1);
                c.pads_begin.assign(size_t(rank), 1);
                c.pads_end.assign(size_t(rank), 1);
                // 2/0 or 0/2 on the filter of 3 stays asymmetric after the high-pad
                // normalisation for stride 1 and 2 (the output extent differs).
                c.pads_begin[size_t(dim)] = low_side ? 2 : 0;
                c.pads_end[size_t(dim)] = low_side ? 0 : 2;
                c.channels_last = channels_last;
                const char* kind = grouping == 0 ? "g2" : grouping == 1 ? "g3" : "dw";
                cases.push_back({c, cat(rank, "d ", dtype_name(dtype), " ", kind,
                                        channels_last ? " nhwc" : " nchw", " dim", dim,
                                        low_side ? " lo>hi" : " hi>lo", " s", stride)});
              }
            }
          }
        }
      }
    }
  }
  ConvConfig c;  // config 191 of the matrix
  c.op = OpKind::conv_backward_filter;
  c.dtype = DType::bf16;
  c.batch = 3, c.in_channels = 9, c.out_channels = 6, c.groups = 3;
  c.spatial = {3, 7, 4}, c.filter = {3, 1, 3};
  c.strides = {1, 1, 1}, c.dilations = {1, 1, 1}, c.pads_begin = {0, 0, 2}, c.pads_end = {0, 0, 0};
  // Controls: 191 without extent-1 dims (filter 3x3x3, so neither w nor dy has a dim of
  // extent 1 whose stride ties with its neighbour's), and 191 with symmetric pads 1/1
  // (the same dy extents; cuDNN takes that case).
  ConvConfig no_unit_dims = c;
  no_unit_dims.filter = {3, 3, 3}, no_unit_dims.pads_begin = {1, 1, 2},
  no_unit_dims.pads_end = {1, 1, 0};
  cases.push_back({no_unit_dims, "191 without extent-1 dims", false});
  ConvConfig symmetric = c;
  symmetric.pads_begin = {0, 0, 1}, symmetric.pads_end = {0, 0, 1};
  cases.push_back({symmetric, "191 symmetric 1/1 (control)", false});
  cases.push_back({c, "config 191", false});  // last: its candidates are always swept
  return cases;
}

struct ProbeResult {
  enum Kind { pass, fail, refused } kind = refused;
  std::string engine, message;
  double l2 = 0, max_rel = 0;
};

// Runs `c` on cuDNN (the current environment) and compares with `want`. A refusal by
// cuDNN is a result; any other Error is a test failure (it crashed).
ProbeResult probe(OpHarness& h, const ConvConfig& c, const std::vector<Tensor>& in,
                  const Tensor& want) {
  ProbeResult r;
  clear_conv_decisions();
  try {
    const Tensor got = run_conv_on_gpu(h, c, in);
    r.l2 = relative_l2_error(got, want);
    r.max_rel = max_relative_error(got, want);
    r.kind = r.l2 <= conv_l2_tolerance(c.dtype, true) ? ProbeResult::pass : ProbeResult::fail;
    const std::vector<ConvDecision> d = conv_decisions();
    r.engine = d.empty() ? "?" : d.back().plan;
    EXPECT_TRUE(!d.empty() && d.back().path.rfind("cudnn", 0) == 0)
        << c.describe() << ": did not run on cuDNN (" << (d.empty() ? "?" : d.back().path) << ")";
  } catch (const Error& e) {
    r.message = e.what();
    const bool refusal = r.message.find("but cuDNN refused") != std::string::npos;
    EXPECT_TRUE(refusal) << c.describe() << ": " << r.message;
    r.kind = ProbeResult::refused;
  }
  return r;
}

const char* kind_name(ProbeResult::Kind k) {
  return k == ProbeResult::pass ? "PASS" : k == ProbeResult::fail ? "FAIL" : "refused";
}

TEST_F(ConvCudnnProbeTest, GroupedAsymmetricWgradProbe) {
  OpHarness h;
  TempDir cache("conv_probe");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", cache.str());
  ScopedEnv backend("FUSEBOX_CONV_BACKEND", "cudnn");
  ScopedEnv allow("FUSEBOX_CONV_ALLOW_BARRED_ENGINES", "1");
  ScopedEnv autotune("FUSEBOX_AUTOTUNE", "0"), tf32("FUSEBOX_ALLOW_TF32", std::nullopt),
      index("FUSEBOX_CONV_PLAN_INDEX", std::nullopt);
  const std::vector<ProbeCase> cases = probe_cases();
  std::map<std::string, std::pair<int, int>> by_attribute;  // "g3" -> {fail, ran}
  std::map<std::string, std::pair<int, int>> by_engine;
  std::vector<size_t> failed;
  int ran = 0, refused = 0, failures = 0;
  uint64_t seed = 7000;
  std::vector<std::vector<Tensor>> inputs;
  std::vector<Tensor> wants;
  std::printf("[probe] grouped wgrad, asymmetric padding, on cuDNN (%zu configurations)\n",
              cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ProbeCase& k = cases[i];
    SCOPED_TRACE(k.tag + ": " + k.config.describe());
    inputs.push_back(conv_inputs(k.config, seed += 10));
    wants.push_back(run_op(k.config.op, k.config.node_attrs(), inputs.back())[0]);
    const ProbeResult r = probe(h, k.config, inputs.back(), wants.back());
    std::printf("[probe] %-30s %-7s engine %-44s rel. L2 %.3g, max rel. %.3g%s%s\n", k.tag.c_str(),
                kind_name(r.kind), r.engine.c_str(), r.l2, r.max_rel,
                r.message.empty() ? "" : " | ", r.message.c_str());
    if (r.kind == ProbeResult::refused) {
      ++refused;
      continue;
    }
    ++ran;
    const bool fail = r.kind == ProbeResult::fail;
    failures += fail;
    if (fail) failed.push_back(i);
    by_engine[r.engine].first += fail;
    by_engine[r.engine].second += 1;
    // The tag's words are the attributes: "2d", "bf16", "g3", "nchw", "dim1", "lo>hi", "s2".
    std::istringstream words(k.sweep ? k.tag : "");
    for (std::string w; words >> w;) {
      by_attribute[w].first += fail;
      by_attribute[w].second += 1;
    }
  }
  std::printf("[probe] %zu configurations: %d ran on cuDNN (%d wrong), %d refused\n", cases.size(),
              ran, failures, refused);
  for (const auto& [attribute, counts] : by_attribute)
    std::printf("[probe]   %-8s wrong %3d of %3d\n", attribute.c_str(), counts.first,
                counts.second);
  for (const auto& [engine, counts] : by_engine)
    std::printf("[probe]   engine %-44s wrong %3d of %3d\n", engine.c_str(), counts.first,
                counts.second);

  // Every heuristics candidate for the first failures (and config 191): which engines are
  // wrong, which are right.
  std::vector<size_t> sweep(failed.begin(),
                            failed.begin() + long(std::min<size_t>(failed.size(), 8)));
  if (std::find(sweep.begin(), sweep.end(), cases.size() - 1) == sweep.end())
    sweep.push_back(cases.size() - 1);
  for (size_t i : sweep) {
    const ProbeCase& k = cases[i];
    SCOPED_TRACE(k.tag + " [every candidate]");
    for (int64_t index = 0; index < 64; ++index) {
      ScopedEnv forced("FUSEBOX_CONV_PLAN_INDEX", std::to_string(index));
      const ProbeResult r = probe(h, k.config, inputs[i], wants[i]);
      if (r.kind == ProbeResult::refused && r.message.find("candidates") != std::string::npos &&
          r.message.find("FUSEBOX_CONV_PLAN_INDEX") != std::string::npos) {
        break;  // past the last candidate
      }
      std::printf("[probe]   %-30s candidate %2lld: %-7s engine %-44s rel. L2 %.3g\n",
                  k.tag.c_str(), (long long)index, kind_name(r.kind),
                  r.kind == ProbeResult::refused ? "-" : r.engine.c_str(), r.l2);
    }
  }
  // The sweep ran: every configuration was tried, and cuDNN took some of them.
  EXPECT_EQ(size_t(ran + refused), cases.size());
  EXPECT_GT(ran, 0) << "cuDNN ran none of the probe's configurations";

  // The check: with the bar on (the default), every configuration that was wrong, and
  // config 191, runs on cuDNN with another engine and is right.
  ScopedEnv bar("FUSEBOX_CONV_ALLOW_BARRED_ENGINES", "0");
  if (std::find(failed.begin(), failed.end(), cases.size() - 1) == failed.end())
    failed.push_back(cases.size() - 1);
  int fixed = 0;
  for (size_t i : failed) {
    const ProbeCase& k = cases[i];
    SCOPED_TRACE(k.tag + " [engines barred]");
    const ProbeResult r = probe(h, k.config, inputs[i], wants[i]);
    EXPECT_EQ(r.kind, ProbeResult::pass)
        << k.tag << ": engine " << r.engine << ", rel. L2 " << r.l2 << " " << r.message;
    fixed += r.kind == ProbeResult::pass;
  }
  std::printf("[probe] with the known-wrong engines barred: %d of %zu right\n", fixed,
              failed.size());
}

}  // namespace
}  // namespace fusebox::cuda::testing
