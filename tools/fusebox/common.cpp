#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "fusebox/backends/cuda.h"
#include "fusebox/core/memory.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"

namespace fusebox::cli {

bool is_onnx_path(const std::string& model) {
  return model.ends_with(".onnx") || model.find('/') != std::string::npos;
}

Graph load_model_argument(const std::string& model, const std::vector<std::string>& shapes,
                          const ZooOptions& zoo, bool zoo_options_given, bool training,
                          std::optional<int64_t> onnx_batch) {
  if (is_onnx_path(model)) {
    if (zoo_options_given)
      throw UsageError("--image-size, --num-classes and --seq-len apply to zoo models only");
    OnnxImportOptions opts;
    opts.input_shapes = parse_shape_specs(shapes);
    opts.keep_parameter_transforms = training;
    opts.batch = onnx_batch;
    return import_onnx_file(model, opts);
  }
  if (!shapes.empty()) throw UsageError("--shape applies to ONNX models only");
  return build_zoo_model(model, zoo);
}

namespace {

// `text` as a T when it is exactly a decimal integer that fits ("-" only for a signed T).
template <class T>
std::optional<T> parse_decimal(const std::string& text) {
  T value{};
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (error != std::errc() || end != last || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

std::string plain_number(int64_t n) {
  if (n == std::numeric_limits<int64_t>::max()) return "2^63 - 1";
  if (n >= (int64_t(1) << 20) && (n & (n - 1)) == 0)
    return cat("2^", std::countr_zero(uint64_t(n)));
  if (n == std::numeric_limits<int>::max()) return "2^31 - 1";
  return std::to_string(n);
}

CLI::Validator integer_range(int64_t min, int64_t max) {
  const std::string range = cat(plain_number(min), " to ", plain_number(max));
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        const std::optional<int64_t> value = parse_decimal<int64_t>(input);
        if (!value || *value < min || *value > max)
          return cat("must be an integer from ", range, ", got '", input, "'");
        input = std::to_string(*value);
        return "";
      },
      range);
}

CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        const std::optional<uint64_t> value = parse_decimal<uint64_t>(input);
        if (!value) return cat("must be an integer from 0 to 2^64 - 1, got '", input, "'");
        input = std::to_string(*value);
        return "";
      },
      "");
}

CLI::Validator positive_real(int64_t max) {
  return CLI::Validator(
      [max](std::string& input) -> std::string {
        double value = 0;
        const char* last = input.data() + input.size();
        const auto [end, error] = std::from_chars(input.data(), last, value);
        if (error != std::errc() || end != last || input.empty() ||
            !(value > 0 && value <= double(max)))
          return cat("must be a number > 0 and <= ", plain_number(max), ", got '", input, "'");
        return "";
      },
      cat("> 0 to ", plain_number(max)));
}

void add_shape_option(CLI::App& app, std::vector<std::string>* specs) {
  app.add_option("--shape", *specs,
                 "Concrete shape for an input with symbolic dims, e.g. input=1,3,224,224 "
                 "(repeatable)")
      ->type_name("NAME=DIMS");
}

void add_memory_limit_option(CLI::App& app, std::string* limit) {
  app.add_option("--memory-limit", *limit,
                 "The most memory the command may take, e.g. 8G: host memory for tensors and, on "
                 "CUDA, each GPU's memory (as FUSEBOX_CPU_MEMORY_LIMIT and "
                 "FUSEBOX_CUDA_MEMORY_LIMIT); past it, an error naming what asked. Default: 90% "
                 "of the host's memory, all of each GPU's")
      ->type_name("BYTES");
}

void apply_memory_limit(const std::string& limit) {
  if (limit.empty()) return;
  size_t bytes = 0;
  try {
    bytes = parse_byte_count(limit, "--memory-limit");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  // Through the variables too: the CUDA backend reads its settings once, from the
  // environment, and data-parallel ranks inherit it.
  setenv("FUSEBOX_CPU_MEMORY_LIMIT", limit.c_str(), 1);
  setenv("FUSEBOX_CUDA_MEMORY_LIMIT", limit.c_str(), 1);
  set_host_memory_limit(bytes);
}

std::pair<std::string, std::string> split_assignment(const std::string& spec,
                                                     const std::string& option) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw UsageError(cat(option, " expects NAME=VALUE, got '", spec, "'"));
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}

std::map<std::string, Shape> parse_shape_specs(const std::vector<std::string>& specs) {
  std::map<std::string, Shape> shapes;
  for (const std::string& spec : specs) {
    auto [name, dims] = split_assignment(spec, "--shape");
    Shape shape;
    std::stringstream ss(dims);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      int64_t d = -1;
      try {
        d = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || d < 0)
        throw UsageError(cat("--shape ", spec, ": '", item, "' is not a non-negative integer"));
      shape.push_back(d);
    }
    if (!shapes.emplace(name, shape).second)
      throw UsageError(cat("--shape given twice for '", name, "'"));
  }
  return shapes;
}

Tensor read_tensor_any(const std::string& path) {
  const bool is_pb = path.size() >= 3 && path.compare(path.size() - 3, 3, ".pb") == 0;
  return is_pb ? read_tensor_pb(path) : read_npy(path);
}

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Tensor random_input(DType dtype, const Shape& shape, uint64_t seed, const std::string& name) {
  uint64_t state = seed;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  state = splitmix64(state) ^ h;
  Tensor t = Tensor::empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t r = splitmix64(state);
    if (is_floating(dtype))
      t.set(i, double(r >> 11) * 0x1.0p-52 - 1.0);
    else if (dtype == DType::boolean)
      t.set(i, double(r >> 63));
    else
      t.set(i, double((r >> 32) % 10));
  }
  return t;
}

std::string sanitize_file_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-';
    out += keep ? c : '_';
  }
  if (out.empty() || out[0] == '.') out = "_" + out;
  return out;
}

std::string type_str(const Tensor& t) {
  return cat(dtype_name(t.dtype()), shape_str(t.shape()));
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? "unknown" : line.substr(begin);
  }
  return "unknown";
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string summarize(const Tensor& t) {
  std::ostringstream os;
  os.precision(6);
  if (t.numel() == 0) return "(empty)";
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  int64_t nans = 0, infs = 0, finite = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.get(i);
    if (std::isnan(v)) {
      ++nans;
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    if (std::isinf(v)) {
      ++infs;
      continue;
    }
    sum += v;
    ++finite;
  }
  if (nans < t.numel()) {
    os << "min " << lo << " max " << hi;
    if (finite > 0) os << " mean " << sum / double(finite);
  }
  if (nans > 0) os << (nans < t.numel() ? " " : "") << "nan " << nans;
  if (infs > 0) os << " inf " << infs;
  os << " first [";
  const int64_t shown = std::min<int64_t>(t.numel(), 5);
  for (int64_t i = 0; i < shown; ++i) os << (i ? ", " : "") << t.get(i);
  os << (t.numel() > shown ? ", ...]" : "]");
  return os.str();
}

}  // namespace fusebox::cli

namespace fusebox::cli {

void set_float_math(Precision p) {
  cuda::set_tf32(p != Precision::f32);
}

std::string fixed(double value, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << value;
  return os.str();
}

Progress::Progress(int64_t first, int64_t last, int64_t every)
    : first_(first),
      last_(last),
      every_(std::max<int64_t>(every, 1)),
      tty_(::isatty(STDOUT_FILENO) != 0) {}

void Progress::update(int64_t step, const std::string& text) {
  const bool final_step = step == last_;
  if (!tty_ && !final_step && (step - first_ + 1) % every_ != 0) return;
  std::ostringstream line;
  const int width = int(std::to_string(last_).size());
  line << "step " << std::setw(width) << step << "/" << last_;
  if (tty_) {
    constexpr int kBar = 24;
    const int done = int(kBar * double(step - first_ + 1) / double(last_ - first_ + 1));
    line << " [" << std::string(size_t(done), '#') << std::string(size_t(kBar - done), '.') << "]";
  }
  line << "  " << text;
  if (tty_) {
    std::cout << "\r" << line.str() << "\033[K" << (final_step ? "\n" : "") << std::flush;
  } else {
    std::cout << line.str() << "\n";
  }
}

}  // namespace fusebox::cli
