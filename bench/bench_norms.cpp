// LayerNorm and RMSNorm on the CUDA backend, forward and backward, against the device's
// copy bandwidth measured in the same process.
//
//   bench_norms [--json FILE] [--iters N] [--repeats N] [--variants all|I[,J...]]
//               [--cases DTYPE:ROWSxCOLS[,...]]
//
// Every tuning variant of the kernels (kernels/norm/tuning.h; default: all of them) runs every
// case, so that one run tells which layout wins; the table shows each variant's figures
// and the layout it chose, then the best variant per case. FUSEBOX_NORM_VARIANT picks the
// default variant for the library (0 unless set).
//
// Shapes 16384x1024, 8192x4096 and 4096x16384 in bf16 and f32. Forward: layer_norm with
// scale and bias (y, mean, inv_std), rms_norm with scale (y, inv_rms). Backward: dx, dscale
// and dbias (layer_norm) or dx and dscale (rms_norm), dscale / dbias in f32.
// Bytes (read + written, each tensor once): forward x + y + scale (+ bias) + statistics;
// backward x + dy + dx + scale + statistics + dscale (+ dbias). The kernels' own partial
// sums are not counted (they are overhead, not traffic the op must move).
// Timing: CUDA events around `iters` launches (direct launches, no graph, so the events
// bracket only GPU work; each launch takes far less host time than the kernel runs), the
// median per-iteration time over `repeats` runs after a warm-up of at least 50 ms. Inputs are
// random and rotate over enough copies that the working set exceeds the 50 MB L2. The copy
// reference is cudaMemcpyAsync device-to-device of half the op's bytes (so equal traffic),
// timed the same way.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/norm/tuning.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

using bench::KernelBench;
using bench::random_host;

struct Options {
  std::string json;
  bench::TimingOptions timing{.iters = 50, .repeats = 5};
  std::vector<std::string> variants = {"all"};  // or variant indices

  std::vector<std::string> cases;  // "bf16:4096x16384"; empty: every dtype and shape
};

struct Result {
  std::string variant, layout, op, pass, dtype;
  int64_t rows, cols;
  bench::Bandwidth bandwidth;

  std::string shape() const { return cat(rows, "x", cols); }
  // What the variants compete on.
  std::string case_key() const { return cat(op, " ", pass, " ", dtype, " ", shape()); }
};

const bench::Table& result_table() {
  static const bench::Table table(
      bench::joined({{"variant", 12, true},
                     {"op", 11, true},
                     {"pass", 4, true},
                     {"dtype", 5, true},
                     {"shape", 11}},
                    bench::joined(bench::Bandwidth::columns(), {{"layout", 0, true}})));
  return table;
}

void print_row(const Result& r) {
  result_table().print_row(bench::joined({r.variant, r.op, r.pass, r.dtype, r.shape()},
                                         bench::joined(r.bandwidth.cells(), {r.layout})));
}

// The normalised node of a one-node graph: layer_norm(x, scale, bias) or rms_norm(x, scale).
Node norm_node(OpKind op, DType dtype, int64_t rows, int64_t cols) {
  Graph g("bench_norms");
  std::vector<ValueId> in = {g.add_input("x", dtype, {rows, cols}),
                             g.add_input("scale", dtype, {cols})};
  if (op == OpKind::layer_norm) in.push_back(g.add_input("bias", dtype, {cols}));
  g.add_node(op, NormAttrs{-1, 1e-5}, in, "norm");
  return g.nodes().back();
}

// One shape and dtype's device tensors, made once for every variant: `sets` copies of the
// inputs and outputs, rotated so that the working set exceeds L2 several times over.
struct Operands {
  DType dtype;
  int64_t rows, cols;
  int sets;
  std::vector<DeviceTensor> xs, dys, ys, dxs;
  DeviceTensor scale, bias, mean, rstd, dscale, dbias;

  Operands(KernelBench& b, DType dtype, int64_t rows, int64_t cols)
      : dtype(dtype), rows(rows), cols(cols) {
    const size_t tensor_bytes = size_t(rows * cols) * dtype_size(dtype);
    sets = int(std::clamp<size_t>((size_t(256) << 20) / (3 * tensor_bytes) + 1, 2, 8));
    for (int s = 0; s < sets; ++s) {
      xs.push_back(b.upload(random_host(dtype, {rows, cols}, 10 + s, -1.0, 3.0)));
      dys.push_back(b.upload(random_host(dtype, {rows, cols}, 100 + s, -1.0, 1.0)));
      ys.push_back(b.empty(dtype, {rows, cols}));
      dxs.push_back(b.empty(dtype, {rows, cols}));
    }
    scale = b.upload(random_host(dtype, {cols}, 1, 0.5, 1.5));
    bias = b.upload(random_host(dtype, {cols}, 2, -1.0, 1.0));
    mean = b.empty(DType::f32, {rows, 1});
    rstd = b.empty(DType::f32, {rows, 1});
    dscale = b.empty(DType::f32, {cols});
    dbias = b.empty(DType::f32, {cols});
  }
};

void run_variant(KernelBench& b, const Options& o, const std::string& variant, Operands& d,
                 std::vector<Result>& results) {
  const size_t elem = dtype_size(d.dtype);
  const size_t tensor_bytes = size_t(d.rows * d.cols) * elem;
  for (OpKind op : {OpKind::layer_norm, OpKind::rms_norm}) {
    const bool layer = op == OpKind::layer_norm;
    const Node node = norm_node(op, d.dtype, d.rows, d.cols);
    const size_t params = size_t(d.cols) * elem * (layer ? 2 : 1);
    const size_t stats = size_t(d.rows) * 4 * (layer ? 2 : 1);
    auto add = [&](const char* pass, bool backward, size_t bytes, double us) {
      results.push_back({variant,
                         norm::norm_layout(b.ctx(), d.dtype, d.rows, d.cols, layer, backward),
                         op_name(op), pass, dtype_name(d.dtype), d.rows, d.cols,
                         b.bandwidth(o.timing, bytes, us)});
    };
    const double fwd_us = b.time_us(o.timing, [&](int i) {
      const size_t s = size_t(i % d.sets);
      std::vector<const DeviceTensor*> in = {&d.xs[s], &d.scale};
      if (layer) in.push_back(&d.bias);
      std::vector<DeviceTensor> out = {d.ys[s]};
      if (layer) out.push_back(d.mean);
      out.push_back(d.rstd);
      if (layer)
        layer_norm(b.ctx(), node, in, out);
      else
        rms_norm(b.ctx(), node, in, out);
    });
    add("fwd", false, 2 * tensor_bytes + params + stats, fwd_us);
    // Backward (statistics from the last forward: any values time the same).
    const size_t grads = size_t(d.cols) * 4 * (layer ? 2 : 1);
    const double bwd_us = b.time_us(o.timing, [&](int i) {
      const size_t s = size_t(i % d.sets);
      if (layer) {
        layer_norm_backward(b.ctx(), d.xs[s], d.dys[s], &d.scale, d.mean, d.rstd, d.dxs[s],
                            &d.dscale, &d.dbias);
      } else {
        rms_norm_backward(b.ctx(), d.xs[s], d.dys[s], &d.scale, d.rstd, d.dxs[s], &d.dscale);
      }
    });
    add("bwd", true, 3 * tensor_bytes + size_t(d.cols) * elem + stats + grads, bwd_us);
  }
}

// Every variant in `variants` on one shape and dtype (inputs made once); each result row is
// printed as it completes, so that a variant that fails leaves the others' figures behind.
// (The cluster variant's layout says "cluster unavailable" while the encoder cannot launch
// thread-block clusters: it then runs the ordinary layout.)
void run_shape(KernelBench& b, const Options& o, const std::vector<int>& variants, DType dtype,
               int64_t rows, int64_t cols, std::vector<Result>& results) {
  Operands operands(b, dtype, rows, cols);
  for (int v : variants) {
    norm::select_norm_variant(v);
    const std::string variant = norm::norm_variants()[size_t(v)].name;
    const size_t before = results.size();
    try {
      run_variant(b, o, variant, operands, results);
    } catch (const std::exception& e) {
      std::printf("variant %s failed: %s\n", variant.c_str(), e.what());
      if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        throw std::runtime_error("the CUDA context is unusable after that; stopping");
      }
    }
    for (size_t i = before; i < results.size(); ++i) print_row(results[i]);
  }
}

// The variant indices --variants names ("all": every variant).
std::vector<int> variant_indices(const std::vector<std::string>& names) {
  const size_t count = norm::norm_variants().size();
  std::vector<int> list;
  if (names == std::vector<std::string>{"all"}) {
    for (size_t v = 0; v < count; ++v) list.push_back(int(v));
    return list;
  }
  for (const std::string& name : names) {
    const int v = std::atoi(name.c_str());
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos ||
        size_t(v) >= count) {
      throw std::runtime_error("bad --variants entry '" + name + "'");
    }
    list.push_back(v);
  }
  return list;
}

int run(const Options& o) {
  const std::vector<int> variants = variant_indices(o.variants);
  KernelBench b;
  std::printf("device: %s\n", b.properties().describe().c_str());
  std::vector<Result> results;
  const int64_t shapes[][2] = {{16384, 1024}, {8192, 4096}, {4096, 16384}};
  result_table().print_header();
  auto wanted = [&](DType dtype, int64_t rows, int64_t cols) {
    const std::string name = cat(dtype_name(dtype), ":", rows, "x", cols);
    return o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), name) != o.cases.end();
  };
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (const auto& s : shapes) {
      if (wanted(dtype, s[0], s[1])) run_shape(b, o, variants, dtype, s[0], s[1], results);
    }
  }
  if (results.empty()) throw std::runtime_error("no case matches --cases");

  std::printf("\nAll variants (GB/s = bytes read + written; copy = cudaMemcpy D2D, same bytes):\n");
  result_table().print_header();
  for (const Result& r : results) print_row(r);
  // The best variant per case, in the order of the first variant's rows.
  std::map<std::string, const Result*> best;
  std::vector<std::string> order;
  for (const Result& r : results) {
    auto [it, fresh] = best.try_emplace(r.case_key(), &r);
    if (fresh) order.push_back(r.case_key());
    if (r.bandwidth.us < it->second->bandwidth.us) it->second = &r;
  }
  std::printf("\nBest variant per case:\n");
  result_table().print_header();
  for (const std::string& key : order) print_row(*best[key]);

  bench::Json rows = bench::Json::array();
  for (const Result& r : results) {
    rows.push(r.bandwidth.appended_to(bench::Json::object({{"variant", r.variant},
                                                           {"layout", r.layout},
                                                           {"best", best[r.case_key()] == &r},
                                                           {"op", r.op},
                                                           {"pass", r.pass},
                                                           {"dtype", r.dtype},
                                                           {"rows", r.rows},
                                                           {"cols", r.cols}})));
  }
  bench::Json report = bench::report("norms");
  report.set("default_variant", norm::norm_variants()[0].name).set("results", std::move(rows));
  bench::write_report(o.json, report);
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  fusebox::bench::Cli cli(
      "bench_norms", "LayerNorm and RMSNorm, every variant, against the copy bandwidth", o.json);
  cli.add_timing(o.timing);
  cli.app()
      .add_option("--variants", o.variants, "all, or variant indices I[,J...]")
      ->type_name("all|I[,J...]")
      ->delimiter(',');
  cli.app()
      .add_option("--cases", o.cases, "Only these cases (default: every dtype and shape)")
      ->type_name("DTYPE:ROWSxCOLS[,...]")
      ->delimiter(',');
  return cli.run(argc, argv, [&] { return fusebox::cuda::run(o); });
}
