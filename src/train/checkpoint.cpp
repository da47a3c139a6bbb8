// Checkpoints as .npz: the layout is in include/fusebox/train/checkpoint.h.
#include "fusebox/train/checkpoint.h"

#include "fusebox/io/tensor_file.h"

namespace fusebox {

namespace {

constexpr const char* kMeta = "__meta__/";
constexpr const char* kParam = "param/";
constexpr const char* kBuffer = "buffer/";
constexpr const char* kOptim = "optim/";
constexpr const char* kAmp = "amp/";

// __meta__/optimizer's codes.
constexpr int64_t kSgdCode = 1;
constexpr int64_t kAdamWCode = 2;

// Reads the metadata arrays one by one, remembering which were used.
class MetaReader {
 public:
  MetaReader(const std::map<std::string, Tensor>& arrays, std::string where)
      : arrays_(arrays), where_(std::move(where)) {}

  const Tensor& scalar(const std::string& name, DType dtype) {
    const std::string key = kMeta + name;
    auto it = arrays_.find(key);
    FUSEBOX_CHECK(it != arrays_.end(), where_, "no '", key,
                  "' array: not a fusebox checkpoint, or a damaged one");
    FUSEBOX_CHECK(it->second.dtype() == dtype && it->second.rank() == 0, where_, "'", key,
                  "' must be a ", dtype_name(dtype), " scalar, got ",
                  dtype_name(it->second.dtype()), shape_str(it->second.shape()));
    return it->second;
  }
  int64_t integer(const std::string& name) { return scalar(name, DType::i64).values<int64_t>()[0]; }
  double real(const std::string& name) { return scalar(name, DType::f64).values<double>()[0]; }

 private:
  const std::map<std::string, Tensor>& arrays_;
  std::string where_;
};

// Fills the spec's hyper-parameters from __meta__/<name>, in the order
// optimizer_hyper_parameters lists them (so the two never disagree on names).
OptimizerSpec read_optimizer(MetaReader& meta, int64_t code, const std::string& where) {
  FUSEBOX_CHECK(code == kSgdCode || code == kAdamWCode, where, "unknown optimizer code ", code,
                " in '__meta__/optimizer' (1 = sgd, 2 = adamw)");
  OptimizerSpec spec = code == kSgdCode ? OptimizerSpec(SgdOptions{}) : AdamWOptions{};
  std::map<std::string, double> values;
  for (const auto& [name, unused] : optimizer_hyper_parameters(spec))
    values[name] = meta.real(name);
  if (auto* sgd = std::get_if<SgdOptions>(&spec)) {
    *sgd = SgdOptions{.lr = values["lr"],
                      .momentum = values["momentum"],
                      .dampening = values["dampening"],
                      .weight_decay = values["weight_decay"],
                      .nesterov = values["nesterov"] != 0};
  } else {
    spec = AdamWOptions{.lr = values["lr"],
                        .beta1 = values["beta1"],
                        .beta2 = values["beta2"],
                        .eps = values["eps"],
                        .weight_decay = values["weight_decay"]};
  }
  check_optimizer(spec, where);
  return spec;
}

}  // namespace

std::string serialize_checkpoint(const Checkpoint& ckpt) {
  std::map<std::string, Tensor> arrays;
  auto put = [&](const std::string& key, const Tensor& t) {
    FUSEBOX_CHECK(t.defined(), "checkpoint", "tensor '", key, "' has no data");
    FUSEBOX_CHECK(arrays.emplace(key, t).second, "checkpoint", "two arrays named '", key, "'");
  };
  put(cat(kMeta, "format"), Tensor::scalar(DType::i64, double(kCheckpointFormat)));
  put(cat(kMeta, "step"), Tensor::from_vector<int64_t>({}, {ckpt.step}));
  const bool sgd = std::holds_alternative<SgdOptions>(ckpt.optimizer);
  put(cat(kMeta, "optimizer"), Tensor::scalar(DType::i64, double(sgd ? kSgdCode : kAdamWCode)));
  for (const auto& [name, value] : optimizer_hyper_parameters(ckpt.optimizer))
    put(kMeta + name, Tensor::from_vector<double>({}, {value}));
  for (const auto& [name, t] : ckpt.parameters) put(kParam + name, t);
  for (const auto& [name, t] : ckpt.buffers) put(kBuffer + name, t);
  for (const auto& [name, t] : ckpt.optimizer_state) put(kOptim + name, t);
  for (const auto& [name, t] : ckpt.scaler) put(kAmp + name, t);
  return serialize_npz(arrays);
}

Checkpoint parse_checkpoint(const std::string& bytes, const std::string& where) {
  const std::map<std::string, Tensor> arrays = parse_npz(bytes, where);
  MetaReader meta(arrays, where);
  const int64_t format = meta.integer("format");
  FUSEBOX_CHECK(format == kCheckpointFormat, where, "checkpoint format version ", format,
                "; this fusebox reads version ", kCheckpointFormat);
  Checkpoint ckpt;
  ckpt.step = meta.integer("step");
  FUSEBOX_CHECK(ckpt.step >= 0, where, "'__meta__/step' is negative (", ckpt.step, ")");
  ckpt.optimizer = read_optimizer(meta, meta.integer("optimizer"), where);

  for (const auto& [key, t] : arrays) {
    auto starts = [&](const char* prefix) { return key.starts_with(prefix); };
    const std::string_view k(key);
    if (starts(kParam)) {
      ckpt.parameters[std::string(k.substr(std::string_view(kParam).size()))] = t;
    } else if (starts(kBuffer)) {
      ckpt.buffers[std::string(k.substr(std::string_view(kBuffer).size()))] = t;
    } else if (starts(kOptim)) {
      ckpt.optimizer_state[std::string(k.substr(std::string_view(kOptim).size()))] = t;
    } else if (starts(kAmp)) {
      ckpt.scaler[std::string(k.substr(std::string_view(kAmp).size()))] = t;
    } else {
      // Metadata was read above; anything else under __meta__/ is from another format.
      FUSEBOX_CHECK(starts(kMeta), where, "unexpected array '", key,
                    "' (expected __meta__/, param/, buffer/, optim/ or amp/ keys)");
    }
  }
  for (const auto& [key, t] : arrays) {
    if (!key.starts_with(kMeta)) continue;
    const std::string name = key.substr(std::string_view(kMeta).size());
    bool known = name == "format" || name == "step" || name == "optimizer";
    for (const auto& [hyper, unused] : optimizer_hyper_parameters(ckpt.optimizer))
      known = known || name == hyper;
    FUSEBOX_CHECK(known, where, "unexpected metadata array '", key, "' for a ",
                  optimizer_name(ckpt.optimizer), " checkpoint");
  }
  return ckpt;
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  write_file_atomic(path, serialize_checkpoint(ckpt));
}

Checkpoint load_checkpoint(const std::string& path) {
  return parse_checkpoint(read_file(path), "checkpoint: " + path);
}

std::vector<std::string> prepare_checkpoint_path(const std::string& path) {
  check_writable(path, "checkpoint: " + path);
  return remove_stale_temporaries(path);
}

}  // namespace fusebox
