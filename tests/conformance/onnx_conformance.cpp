// ONNX backend node tests through the importer and a backend.
//
//   fusebox_onnx_conformance --data DIR --skips FILE [--device cpu|cpu-ref|cuda|auto]
//                            [--filter SUBSTR] [--verbose]
//
// For every test directory under DIR whose op is in our set (see kFamilies), and each
// of its test_data_set_*: import model.onnx, feed the input_*.pb tensors, run, and
// compare each output with output_*.pb by position. Outcomes:
//   passed       every data set matches;
//   failed       wrong dtype, shape or values, or any error (import, run) that is not
//                an "unsupported" one; also an unsupported test missing from the skip
//                list, and a listed test that now passes (a stale skip), so that the
//                list stays true;
//   unsupported  listed in the skip list, and the importer (or the test data reader)
//                says "unsupported";
//   skipped      listed in the skip list, and failing for another reason.
// The skip list (skips.txt): one "test_name  # reason" per line; '#' starts a comment line.
// Prints one line per test that did not pass, then
//   onnx-conformance: P passed, F failed, U unsupported
//   onnx-conformance: S skipped
// and exits non-zero iff F > 0 (2 for bad arguments or a malformed skip list).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace fusebox;

namespace {

// ---- which tests are ours --------------------------------------------------
// A family "x" takes the test "test_x" and every "test_x_*". The trailing '_' rule
// keeps neighbours apart: test_max_* is Max but test_maxpool_* is not; test_log_example
// is Log but test_logsoftmax_* is not; test_exp_* is Exp but test_expand_* is not;
// test_conv_* and test_basic_conv_* are Conv but test_convinteger_* is not.
// clang-format off
constexpr const char* kFamilies[] = {
    "conv", "basic_conv", "convtranspose",                            // Conv, ConvTranspose
    "batchnorm", "layer_normalization", "instancenorm",               // incl. *_expanded
    "relu", "leakyrelu", "sigmoid", "tanh", "erf", "exp", "log", "sqrt", "reciprocal", "neg",
    "abs", "clip", "cast", "identity", "sin", "cos", "floor", "ceil", "round",  // unary
    "hardsigmoid", "hardswish", "softplus", "elu", "prelu",           // as chains of the above
    "add", "sub", "mul", "div", "pow", "max", "min",                  // binary; Max/Min variadic
    "matmul", "gemm", "einsum",
    "maxpool", "averagepool", "globalaveragepool",
    "softmax", "logsoftmax",                                          // incl. *_expanded
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_l1", "reduce_l2",
    "reduce_sum_square", "reduce_log_sum",                            // incl. reduce_log_sum_exp
    "argmax", "argmin", "cumsum", "tril", "triu",
    "sum", "mean", "globalmaxpool", "dropout", "sce", "nllloss",      // sce: SoftmaxCrossEntropyLoss
    "shape", "size", "constantofshape", "range", "gather",            // incl. gather_elements
    "where", "equal", "less", "greater", "not", "and", "or", "xor", "mod",  // incl. *_equal
    "reshape", "transpose", "concat", "flatten", "slice", "squeeze", "unsqueeze", "expand",
    "split", "tile", "resize", "scatternd", "scatter_elements", "gathernd", "top_k",
    "pad", "constant_pad", "edge_pad", "reflect_pad",                 // Pad, by mode
};
// clang-format on

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool in_scope(const std::string& test) {
  for (const char* family : kFamilies) {
    std::string stem = std::string("test_") + family;
    if (test == stem || starts_with(test, stem + "_")) return true;
  }
  return false;
}

// ---- tolerances --------------------------------------------------------------
// |actual - expected| <= atol + rtol * |expected|. The expected values come from
// numpy (mostly computed in f64, then rounded to the output dtype), so the bound is
// a few ulps of the output dtype plus reordering of sums: f32 rtol 1e-4 is ~800 ulp,
// ample for the reductions (softmax, layer norm, pooling, conv) of these small tests.
// f16 / bf16 results are rounded once from f32 arithmetic: about one ulp (2^-11,
// 2^-8) of the value. Integers and bools must match exactly; NaN matches NaN.
struct Tolerance {
  double rtol, atol;
};
Tolerance tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-7, 1e-7};
    case DType::f32:
      return {1e-4, 1e-5};
    case DType::f16:
      return {1e-3, 1e-3};
    case DType::bf16:
      return {1e-2, 1e-2};
    default:
      return {0, 0};
  }
}

// ---- one test ----------------------------------------------------------------
enum class Outcome { passed, failed, unsupported };

struct Result {
  Outcome outcome = Outcome::passed;
  std::string reason;
};

// The importer marks what fusebox lacks (an op, an attribute value, a dtype) with
// "unsupported: "; the tensor reader says a dtype "is not supported". Any other
// error is a failure.
Result import_error(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  bool unsupported = error && onnx_error_is_unsupported(*error);
  return {unsupported ? Outcome::unsupported : Outcome::failed, e.what()};
}
Result test_data_error(const std::exception& e) {
  std::string what = e.what();
  bool unsupported = what.find("not supported") != std::string::npos ||
                     what.find("unsupported") != std::string::npos;
  return {unsupported ? Outcome::unsupported : Outcome::failed, "test data: " + what};
}

// input_0.pb, input_1.pb, ..., input_10.pb in numeric order.
std::vector<fs::path> numbered_files(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> files;
  for (int i = 0;; ++i) {
    fs::path p = dir / cat(prefix, i, ".pb");
    if (!fs::exists(p)) break;
    files.push_back(p);
  }
  return files;
}

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

Result run_data_set(const fs::path& test_dir, const fs::path& data_dir, const RunOptions& run) {
  std::vector<NamedTensor> inputs, expected;
  OnnxImportOptions import_opts;
  try {
    for (const fs::path& p : numbered_files(data_dir, "input_")) {
      NamedTensor nt;
      nt.tensor = read_tensor_pb(p.string(), &nt.name);
      FUSEBOX_CHECK(!nt.name.empty(), p.string(), "test input has no name");
      // Our IR is static: operands that decide shapes (Reshape's shape, Slice's
      // starts, Squeeze's axes, Pad's pads: all integer tensors) or that are
      // attributes in our ops (Clip's bounds, Pad's value: scalars) must be known at
      // import. ONNX tests feed them as graph inputs, so freeze every integer and
      // every scalar input to its test value. The ops still run on the tensor inputs.
      if (is_integer(nt.tensor.dtype()) || nt.tensor.rank() == 0)
        import_opts.constant_inputs[nt.name] = nt.tensor;
      inputs.push_back(std::move(nt));
    }
    for (const fs::path& p : numbered_files(data_dir, "output_")) {
      NamedTensor nt;
      nt.tensor = read_tensor_pb(p.string(), &nt.name);
      expected.push_back(std::move(nt));
    }
  } catch (const std::exception& e) {
    return test_data_error(e);
  }

  // Other operands the importer names as "must be known at import" (Resize's float scales and
  // roi: constants in real models) are frozen too, one at a time, never the first input.
  Graph g;
  for (int attempt = 0;; ++attempt) {
    try {
      g = import_onnx_file((test_dir / "model.onnx").string(), import_opts);
      break;
    } catch (const Error& e) {
      const std::string message = e.what();
      const size_t known = message.find("') must be known at import");
      const size_t quote = known == std::string::npos ? known : message.rfind(", '", known);
      const std::string name =
          quote == std::string::npos ? "" : message.substr(quote + 3, known - quote - 3);
      auto it = std::find_if(inputs.begin(), inputs.end(),
                             [&](const NamedTensor& nt) { return nt.name == name; });
      if (attempt >= 4 || it == inputs.end() || it == inputs.begin() ||
          import_opts.constant_inputs.count(name))
        return import_error(e);
      import_opts.constant_inputs[name] = it->tensor;
    } catch (const std::exception& e) {
      return import_error(e);
    }
  }

  try {
    NamedTensors feeds;
    for (ValueId v : g.inputs()) {
      const std::string& name = g.value(v).name;
      auto it = std::find_if(inputs.begin(), inputs.end(),
                             [&](const NamedTensor& nt) { return nt.name == name; });
      FUSEBOX_CHECK(it != inputs.end(), "conformance", "graph input '", name,
                    "' has no input_*.pb");
      feeds[name] = it->tensor;
    }
    NamedTensors actual = run_graph(g, feeds, run);
    FUSEBOX_CHECK(g.outputs().size() == expected.size(), "conformance", "the graph has ",
                  g.outputs().size(), " outputs, the test expects ", expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const std::string& name = g.value(g.outputs()[i]).name;
      const Tensor& want = expected[i].tensor;
      Tolerance tol = tolerance(want.dtype());
      auto close = fusebox::testing::all_close(actual.at(name), want, tol.rtol, tol.atol);
      if (!close) return {Outcome::failed, cat("output ", i, " '", name, "': ", close.message())};
    }
  } catch (const std::exception& e) {
    return {Outcome::failed, e.what()};
  }
  return {};
}

Result run_test(const fs::path& test_dir, const RunOptions& run) {
  std::vector<fs::path> data_sets;
  for (const auto& entry : fs::directory_iterator(test_dir))
    if (entry.is_directory() && starts_with(entry.path().filename().string(), "test_data_set_"))
      data_sets.push_back(entry.path());
  std::sort(data_sets.begin(), data_sets.end());
  if (data_sets.empty()) return {Outcome::failed, "no test_data_set_* directory"};
  for (const fs::path& ds : data_sets) {
    Result r = run_data_set(test_dir, ds, run);
    if (r.outcome != Outcome::passed) {
      if (data_sets.size() > 1) r.reason = cat(ds.filename().string(), ": ", r.reason);
      return r;
    }
  }
  return {};
}

// ---- the skip list -----------------------------------------------------------
// Returns test name -> reason; throws an Error for a malformed line.
std::map<std::string, std::string> read_skips(const std::string& path) {
  std::ifstream in(path);
  FUSEBOX_CHECK(in, "skips: " + path, "cannot open the file");
  std::map<std::string, std::string> skips;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const std::string where = cat("skips: ", path, ":", line_no);
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    size_t hash = line.find('#');
    FUSEBOX_CHECK(hash != std::string::npos, where, "expected 'test_name  # reason'");
    std::string name = line.substr(first, line.find_first_of(" \t#", first) - first);
    std::string reason = line.substr(hash + 1);
    reason.erase(0, reason.find_first_not_of(" \t"));
    reason.erase(reason.find_last_not_of(" \t\r") + 1);
    FUSEBOX_CHECK(line.find_first_not_of(" \t", first + name.size()) == hash, where,
                  "expected one test name before '#'");
    FUSEBOX_CHECK(!reason.empty(), where, "'", name, "' has no reason");
    FUSEBOX_CHECK(skips.emplace(name, reason).second, where, "'", name, "' is listed twice");
  }
  return skips;
}

struct Args {
  std::string data, skips, device = "cpu", filter;
  bool verbose = false;
};

int usage(const std::string& message) {
  std::cerr << "onnx-conformance: " << message
            << "\nusage: fusebox_onnx_conformance --data DIR --skips FILE [--device "
               "cpu|cpu-ref|cuda|auto] [--filter SUBSTR] [--verbose]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--data")
      ok = value(&args.data);
    else if (a == "--skips")
      ok = value(&args.skips);
    else if (a == "--device")
      ok = value(&args.device);
    else if (a == "--filter")
      ok = value(&args.filter);
    else if (a == "--verbose")
      args.verbose = true;
    else
      return usage("unknown argument '" + a + "'");
    if (!ok) return usage(a + " needs a value");
  }
  if (args.data.empty() || args.skips.empty()) return usage("--data and --skips are required");
  if (!fs::is_directory(args.data)) return usage("no test data directory '" + args.data + "'");

  RunOptions run;  // --device cpu: the fast kernels; cpu-ref: the reference's (the CLI's rule)
  std::map<std::string, std::string> skips;
  try {
    run.device = parse_device(args.device);
    run.cpu_kernels = cpu_kernels_for(args.device);
    skips = read_skips(args.skips);
  } catch (const std::exception& e) {
    return usage(e.what());
  }

  std::vector<std::string> tests;
  for (const auto& entry : fs::directory_iterator(args.data)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory() && in_scope(name) && name.find(args.filter) != std::string::npos)
      tests.push_back(name);
  }
  std::sort(tests.begin(), tests.end());

  int passed = 0, failed = 0, unsupported = 0, skipped = 0;
  for (const std::string& test : tests) {
    Result r = run_test(fs::path(args.data) / test, run);
    auto skip = skips.find(test);
    const bool listed = skip != skips.end();
    if (r.outcome == Outcome::passed && !listed) {
      ++passed;
      if (args.verbose) std::cout << "passed      " << test << "\n";
    } else if (r.outcome == Outcome::passed) {
      ++failed;
      std::cout << "STALE SKIP  " << test << ": passes now; remove it from the skip list\n";
    } else if (!listed) {
      ++failed;
      std::cout << "FAILED      " << test << ": "
                << (r.outcome == Outcome::unsupported ? "unsupported, and not in the skip list: "
                                                      : "")
                << r.reason << "\n";
    } else if (r.outcome == Outcome::unsupported) {
      ++unsupported;
      std::cout << "unsupported " << test << ": " << skip->second
                << (args.verbose ? " [" + r.reason + "]" : "") << "\n";
    } else {
      ++skipped;
      std::cout << "skipped     " << test << ": " << skip->second
                << (args.verbose ? " [" + r.reason + "]" : "") << "\n";
    }
  }
  // Without a filter every listed test must be one we ran: a name that matches no
  // test in scope (a typo, a test gone from the data) is a stale entry too.
  if (args.filter.empty()) {
    for (const auto& [name, reason] : skips) {
      if (!std::binary_search(tests.begin(), tests.end(), name)) {
        ++failed;
        std::cout << "STALE SKIP  " << name << ": no such test in scope under " << args.data
                  << "\n";
      }
    }
  }

  std::cout << "onnx-conformance: " << passed << " passed, " << failed << " failed, " << unsupported
            << " unsupported\n";
  std::cout << "onnx-conformance: " << skipped << " skipped\n";
  return failed > 0 ? 1 : 0;
}
