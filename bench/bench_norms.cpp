// LayerNorm and RMSNorm on the CUDA backend, forward and backward, against the device's
// copy bandwidth measured in the same process.
//
//   bench_norms [--json FILE] [--iters N] [--repeats N] [--variants all|I[,J...]]
//               [--cases DTYPE:ROWSxCOLS[,...]]
//
// Every tuning variant of the kernels (norm_tuning.h; default: all of them) runs every
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
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_tuning.h"
#include "fusebox/ir/graph.h"
#include "kernel_bench.h"

namespace fusebox::cuda {
namespace {

using Bench = bench::KernelBench;
using bench::random_host;

struct Options {
  std::string json;
  int iters = 50;
  int repeats = 5;
  std::vector<int> variants;  // empty: all
  std::vector<std::string> cases;  // "bf16:4096x16384"; empty: every dtype and shape
};

struct Result {
  std::string variant, layout, op, pass, dtype;
  int64_t rows, cols;
  double us, gbps, copy_gbps;
};

// The normalised node of a one-node graph: layer_norm(x, scale, bias) or rms_norm(x, scale).
Node norm_node(OpKind op, DType dtype, int64_t rows, int64_t cols) {
  Graph g("bench_norms");
  std::vector<ValueId> in = {g.add_input("x", dtype, {rows, cols}),
                             g.add_input("scale", dtype, {cols})};
  if (op == OpKind::layer_norm) in.push_back(g.add_input("bias", dtype, {cols}));
  g.add_node(op, NormAttrs{-1, 1e-5}, in, "norm");
  return g.nodes().back();
}

void print_row(const Result& r);
void run_variant(Bench& b, const Options& o, const std::string& variant, DType dtype, int64_t rows,
                 int64_t cols, int sets, const std::vector<DeviceTensor>& xs,
                 const std::vector<DeviceTensor>& dys, const DeviceTensor& scale,
                 const DeviceTensor& bias, std::vector<DeviceTensor>& ys,
                 std::vector<DeviceTensor>& dxs, DeviceTensor& mean, DeviceTensor& rstd,
                 DeviceTensor& dscale, DeviceTensor& dbias, std::vector<Result>& results);

// Every variant in `variants` on one shape and dtype (inputs made once); each result row is
// printed as it completes, so that a variant that fails leaves the others' figures behind.
// (The cluster variant's layout says "cluster unavailable" while the encoder cannot launch
// thread-block clusters: it then runs the ordinary layout.)
void run_shape(Bench& b, const Options& o, const std::vector<int>& variants, DType dtype,
               int64_t rows, int64_t cols, std::vector<Result>& results) {
  const size_t elem = dtype_size(dtype);
  const size_t tensor_bytes = size_t(rows * cols) * elem;
  // Enough input sets that the rotation's working set exceeds L2 several times over.
  const int sets = int(std::clamp<size_t>((size_t(256) << 20) / (3 * tensor_bytes) + 1, 2, 8));
  std::vector<DeviceTensor> xs, dys;
  for (int s = 0; s < sets; ++s) {
    xs.push_back(b.upload(random_host(dtype, {rows, cols}, 10 + s, -1.0, 3.0)));
    dys.push_back(b.upload(random_host(dtype, {rows, cols}, 100 + s, -1.0, 1.0)));
  }
  const DeviceTensor scale = b.upload(random_host(dtype, {cols}, 1, 0.5, 1.5));
  const DeviceTensor bias = b.upload(random_host(dtype, {cols}, 2, -1.0, 1.0));
  std::vector<DeviceTensor> ys, dxs;
  for (int s = 0; s < sets; ++s) {
    ys.push_back(b.empty(dtype, {rows, cols}));
    dxs.push_back(b.empty(dtype, {rows, cols}));
  }
  DeviceTensor mean = b.empty(DType::f32, {rows, 1}), rstd = b.empty(DType::f32, {rows, 1});
  DeviceTensor dscale = b.empty(DType::f32, {cols}), dbias = b.empty(DType::f32, {cols});

  for (int v : variants) {
    norm::select_norm_variant(v);
    const std::string variant = norm::norm_variants()[size_t(v)].name;
    const size_t before = results.size();
    try {
      run_variant(b, o, variant, dtype, rows, cols, sets, xs, dys, scale, bias, ys, dxs, mean, rstd,
                  dscale, dbias, results);
    } catch (const std::exception& e) {
      std::printf("variant %s failed: %s\n", variant.c_str(), e.what());
      if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        throw std::runtime_error("the CUDA context is unusable after that; stopping");
      }
    }
    for (size_t i = before; i < results.size(); ++i) print_row(results[i]);
    std::fflush(stdout);
  }
}

void run_variant(Bench& b, const Options& o, const std::string& variant, DType dtype, int64_t rows,
                 int64_t cols, int sets, const std::vector<DeviceTensor>& xs,
                 const std::vector<DeviceTensor>& dys, const DeviceTensor& scale,
                 const DeviceTensor& bias, std::vector<DeviceTensor>& ys,
                 std::vector<DeviceTensor>& dxs, DeviceTensor& mean, DeviceTensor& rstd,
                 DeviceTensor& dscale, DeviceTensor& dbias, std::vector<Result>& results) {
  const size_t elem = dtype_size(dtype);
  const size_t tensor_bytes = size_t(rows * cols) * elem;
  for (OpKind op : {OpKind::layer_norm, OpKind::rms_norm}) {
    const bool layer = op == OpKind::layer_norm;
    const Node node = norm_node(op, dtype, rows, cols);
    const size_t params = size_t(cols) * elem * (layer ? 2 : 1);
    const size_t stats = size_t(rows) * 4 * (layer ? 2 : 1);
    // Forward.
    const size_t fwd_bytes = 2 * tensor_bytes + params + stats;
    const double fwd_us = b.time_us(o.iters, o.repeats, [&](int i) {
      const DeviceTensor& x = xs[size_t(i % sets)];
      std::vector<const DeviceTensor*> in = {&x, &scale};
      if (layer) in.push_back(&bias);
      std::vector<DeviceTensor> out = {ys[size_t(i % sets)]};
      if (layer) out.push_back(mean);
      out.push_back(rstd);
      if (layer)
        layer_norm(b.ctx(), node, in, out);
      else
        rms_norm(b.ctx(), node, in, out);
    });
    const double copy_fwd = b.copy_gbps(o.iters, o.repeats, fwd_bytes);
    results.push_back({variant, norm::norm_layout(b.ctx(), dtype, rows, cols, layer, false),
                       op_name(op), "fwd", dtype_name(dtype), rows, cols, fwd_us,
                       double(fwd_bytes) / fwd_us / 1e3, copy_fwd});
    // Backward (statistics from the last forward: any values time the same).
    const size_t grads = size_t(cols) * 4 * (layer ? 2 : 1);
    const size_t bwd_bytes = 3 * tensor_bytes + size_t(cols) * elem + stats + grads;
    const double bwd_us = b.time_us(o.iters, o.repeats, [&](int i) {
      const size_t s = size_t(i % sets);
      if (layer) {
        layer_norm_backward(b.ctx(), xs[s], dys[s], &scale, mean, rstd, dxs[s], &dscale, &dbias);
      } else {
        rms_norm_backward(b.ctx(), xs[s], dys[s], &scale, rstd, dxs[s], &dscale);
      }
    });
    const double copy_bwd = b.copy_gbps(o.iters, o.repeats, bwd_bytes);
    results.push_back({variant, norm::norm_layout(b.ctx(), dtype, rows, cols, layer, true),
                       op_name(op), "bwd", dtype_name(dtype), rows, cols, bwd_us,
                       double(bwd_bytes) / bwd_us / 1e3, copy_bwd});
  }
}

std::string shape_text(const Result& r) {
  return std::to_string(r.rows) + "x" + std::to_string(r.cols);
}

void print_row(const Result& r) {
  std::printf("%-12s %-11s %-4s %-5s %11s %9.1f %7.0f %7.0f %6.1f%%  %s\n", r.variant.c_str(),
              r.op.c_str(), r.pass.c_str(), r.dtype.c_str(), shape_text(r).c_str(), r.us, r.gbps,
              r.copy_gbps, 100.0 * r.gbps / r.copy_gbps, r.layout.c_str());
}

void print_header() {
  std::printf("%-12s %-11s %-4s %-5s %11s %9s %7s %7s %7s  %s\n", "variant", "op", "pass", "dtype",
              "shape", "us", "GB/s", "copy", "% copy", "layout");
}

int run(const Options& o) {
  Bench b;
  std::printf("device: %s\n", b.properties().describe().c_str());
  std::vector<int> variants = o.variants;
  if (variants.empty()) {
    for (size_t v = 0; v < norm::norm_variants().size(); ++v) variants.push_back(int(v));
  }
  std::vector<Result> results;
  const int64_t shapes[][2] = {{16384, 1024}, {8192, 4096}, {4096, 16384}};
  print_header();
  auto wanted = [&](DType dtype, int64_t rows, int64_t cols) {
    const std::string name = std::string(dtype_name(dtype)) + ":" + std::to_string(rows) + "x" +
                             std::to_string(cols);
    return o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), name) != o.cases.end();
  };
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (const auto& s : shapes) {
      if (wanted(dtype, s[0], s[1])) run_shape(b, o, variants, dtype, s[0], s[1], results);
    }
  }
  if (results.empty()) throw std::runtime_error("no case matches --cases");

  std::printf("\nAll variants (GB/s = bytes read + written; copy = cudaMemcpy D2D, same bytes):\n");
  print_header();
  for (const Result& r : results) print_row(r);
  // The best variant per case, in the order of the first variant's rows.
  std::map<std::string, const Result*> best;
  std::vector<std::string> order;
  for (const Result& r : results) {
    const std::string key = r.op + " " + r.pass + " " + r.dtype + " " + shape_text(r);
    auto [it, fresh] = best.try_emplace(key, &r);
    if (fresh) order.push_back(key);
    if (r.us < it->second->us) it->second = &r;
  }
  std::printf("\nBest variant per case:\n");
  print_header();
  for (const std::string& key : order) print_row(*best[key]);

  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) {
      std::fprintf(stderr, "bench_norms: cannot write %s\n", o.json.c_str());
      return 1;
    }
    f << "{\n  \"device\": \"" << b.properties().name << "\",\n  \"default_variant\": \""
      << norm::norm_variants()[0].name << "\",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const std::string key = r.op + " " + r.pass + " " + r.dtype + " " + shape_text(r);
      f << "    {\"variant\": \"" << r.variant << "\", \"layout\": \"" << r.layout
        << "\", \"best\": " << (best[key] == &r ? "true" : "false") << ", \"op\": \"" << r.op
        << "\", \"pass\": \"" << r.pass << "\", \"dtype\": \"" << r.dtype
        << "\", \"rows\": " << r.rows << ", \"cols\": " << r.cols << ", \"us\": " << r.us
        << ", \"gbps\": " << r.gbps << ", \"copy_gbps\": " << r.copy_gbps
        << ", \"pct_copy\": " << 100.0 * r.gbps / r.copy_gbps << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  return 0;
}

// "all" or a comma-separated list of variant indices.
std::vector<int> parse_variants(const std::string& text) {
  std::vector<int> list;
  if (text == "all") return list;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int v = std::atoi(item.c_str());
    if (v < 0 || size_t(v) >= norm::norm_variants().size() || item.empty()) {
      throw std::runtime_error("bad --variants entry '" + item + "'");
    }
    list.push_back(v);
  }
  return list;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  std::string variants = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else if (arg == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--repeats" && i + 1 < argc) {
      o.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--variants" && i + 1 < argc) {
      variants = argv[++i];
    } else if (arg == "--cases" && i + 1 < argc) {
      std::stringstream in(argv[++i]);
      for (std::string item; std::getline(in, item, ',');) o.cases.push_back(item);
    } else {
      std::fprintf(stderr,
                   "usage: bench_norms [--json FILE] [--iters N] [--repeats N] "
                   "[--variants all|I[,J...]] [--cases DTYPE:ROWSxCOLS[,...]]\n");
      return 2;
    }
  }
  try {
    o.variants = fusebox::cuda::parse_variants(variants);
    return fusebox::cuda::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_norms: %s\n", e.what());
    return 1;
  }
}
