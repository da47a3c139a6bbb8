#include "executable.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <map>

namespace fusebox::python {

namespace {

TensorSpec spec_of(const Graph& g, ValueId v) {
  const Value& value = g.value(v);
  return {value.name, value.type.dtype, value.type.shape};
}

std::string names_of(const std::vector<TensorSpec>& specs) {
  std::string names;
  for (const TensorSpec& s : specs) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

struct ByteRange {
  const std::byte* begin;
  const std::byte* end;
  bool overlaps(const ByteRange& o) const { return begin < o.end && o.begin < end; }
};

ByteRange bytes_of(const Tensor& t) {
  const auto* p = static_cast<const std::byte*>(t.raw());
  return {p, p + t.nbytes()};
}

}  // namespace

PyExecutable::PyExecutable(std::unique_ptr<Executable> exe)
    : exe_(std::move(exe)), where_("run " + exe_->graph().name()) {
  const Graph& g = exe_->graph();
  for (ValueId v : g.inputs()) inputs_.push_back(spec_of(g, v));
  for (ValueId v : g.outputs()) outputs_.push_back(spec_of(g, v));
  for (const auto& [v, t] : g.constants()) {
    const ByteRange r = bytes_of(t);
    constant_bytes_.emplace_back(r.begin, r.end);
  }
}

std::vector<InputArray> PyExecutable::gather_inputs(const nb::args& args,
                                                    const nb::kwargs& kwargs) const {
  const size_t n = inputs_.size();
  FUSEBOX_CHECK(args.size() <= n, where_, "the model has ", n, n == 1 ? " input" : " inputs", " (",
                names_of(inputs_), ") but was given ", args.size(), " arrays");
  std::vector<nb::handle> given(n);
  for (size_t i = 0; i < args.size(); ++i) given[i] = nb::handle(PyTuple_GET_ITEM(args.ptr(), i));
  for (auto [key, value] : kwargs) {
    const std::string name = nb::cast<std::string>(key);
    auto it = std::find_if(inputs_.begin(), inputs_.end(),
                           [&](const TensorSpec& s) { return s.name == name; });
    FUSEBOX_CHECK(it != inputs_.end(), where_, "'", name, "' is not an input of the model (its ",
                  n == 1 ? "input: " : "inputs: ", names_of(inputs_), ")");
    const size_t i = size_t(it - inputs_.begin());
    FUSEBOX_CHECK(!given[i].is_valid(), where_, "input '", name,
                  "' is given twice (by position and by name)");
    given[i] = value;
  }
  std::vector<InputArray> arrays;
  for (size_t i = 0; i < n; ++i) {
    const TensorSpec& spec = inputs_[i];
    FUSEBOX_CHECK(given[i].is_valid(), where_, "input '", spec.name, "' (", dtype_name(spec.dtype),
                  shape_str(spec.shape), ") is not given");
    arrays.push_back(import_array(given[i], spec.name, where_));
    check_input(arrays.back(), spec);
  }
  return arrays;
}

void PyExecutable::check_input(const InputArray& a, const TensorSpec& spec) const {
  check_type(a, spec, where_);
  check_device(a, spec.name, device(), where_);
}

nb::tuple PyExecutable::call(nb::args args, nb::kwargs kwargs) {
  // The arrays outlive the run: CPU feeds are tensors over their memory.
  const std::vector<InputArray> arrays = gather_inputs(args, kwargs);
  std::vector<Tensor> host_outputs;
  std::vector<DeviceArray> device_outputs;
  Feeds feeds;
  {
    nb::gil_scoped_release released;
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const TensorSpec& spec = inputs_[i];
      if (device() == Device::cpu)
        feeds[spec.name] = host_tensor(arrays[i], spec.dtype);
      else
        feeds[spec.name] = cuda_feed(arrays[i], spec.dtype);
    }
    std::set<std::string> to_host;
    if (device() == Device::cpu)
      for (const TensorSpec& s : outputs_) to_host.insert(s.name);
    StepResult result = exe_->run_async(feeds, to_host);
    if (device() == Device::cpu) {
      for (const TensorSpec& s : outputs_) host_outputs.push_back(result.host.at(s.name).get());
    } else {
      exe_->check_errors();  // waits for the run; throws a kernel's error
      std::vector<DeviceArray> own;
      for (const TensorSpec& s : outputs_) own.push_back(result.outputs.at(s.name));
      device_outputs = own_copies(own);
    }
  }
  if (device() == Device::cpu) return cpu_outputs(host_outputs, feeds);
  nb::list out;
  for (const DeviceArray& a : device_outputs) out.append(to_dlpack(a));
  return nb::tuple(out);
}

nb::tuple PyExecutable::cpu_outputs(const std::vector<Tensor>& outputs, const Feeds& feeds) const {
  std::vector<ByteRange> held;
  for (const auto& [begin, end] : constant_bytes_) held.push_back({begin, end});
  for (const auto& [name, feed] : feeds) held.push_back(bytes_of(std::get<Tensor>(feed)));
  nb::list out;
  for (const Tensor& t : outputs) {
    const ByteRange r = bytes_of(t);
    const bool shared =
        std::any_of(held.begin(), held.end(), [&](const ByteRange& h) { return h.overlaps(r); });
    out.append(to_numpy(shared ? t.clone() : t));
    held.push_back(r);
  }
  return nb::tuple(out);
}

std::vector<NodeTime> PyExecutable::profile(std::optional<int> repeats) {
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  return exe_->profile(repeats.value_or(device() == Device::cuda ? 10 : 1));
}

}  // namespace fusebox::python
