#include "executable/io_plan.h"

#include <set>

namespace fusebox::runtime {

std::string type_str(DType dtype, const Shape& shape) {
  return cat(dtype_name(dtype), shape_str(shape));
}

void check_feed(const TensorType& want, const std::string& input, DType dtype, const Shape& shape,
                const std::string& where) {
  FUSEBOX_CHECK(dtype == want.dtype && shape == want.shape, where, "input '", input, "' expects ",
                type_str(want.dtype, want.shape), " but was given ", type_str(dtype, shape));
}

IoPlan plan_io(const Graph& g, const CompileOptions& options, const std::string& where) {
  IoPlan io;
  for (ValueId v : g.inputs()) {
    io.input_index[g.value(v).name] = io.input_names.size();
    io.input_names.push_back(g.value(v).name);
  }
  for (ValueId v : g.outputs()) {
    const std::string& name = g.value(v).name;
    FUSEBOX_CHECK(!io.output_index.count(name), where, "output '", name, "' is marked twice");
    io.output_index[name] = io.output_names.size();
    io.output_names.push_back(name);
  }
  io.alias_of_output.assign(io.output_names.size(), -1);
  io.aliased_by_input.assign(io.input_names.size(), -1);
  io.bound.assign(io.input_names.size(), false);

  for (const auto& [name, array] : options.bound) {
    auto it = io.input_index.find(name);
    FUSEBOX_CHECK(it != io.input_index.end(), where, "a device array is bound to '", name,
                  "', which is not an input of the graph");
    FUSEBOX_CHECK(array.defined(), where, "the array bound to input '", name, "' is empty");
    FUSEBOX_CHECK(array.device() == options.device, where, "the array bound to input '", name,
                  "' is on ", device_name(array.device()), " but the graph is compiled for ",
                  device_name(options.device));
    check_feed(g.value(g.inputs()[it->second]).type, name, array.dtype(), array.shape(), where);
    io.bound[it->second] = true;
  }
  for (const auto& [out, in] : options.aliases) {
    auto o = io.output_index.find(out);
    auto i = io.input_index.find(in);
    FUSEBOX_CHECK(o != io.output_index.end(), where, "alias: '", out,
                  "' is not an output of the graph");
    FUSEBOX_CHECK(i != io.input_index.end(), where, "alias: '", in,
                  "' is not an input of the graph");
    FUSEBOX_CHECK(io.alias_of_output[o->second] < 0, where, "alias: output '", out,
                  "' is aliased twice");
    FUSEBOX_CHECK(io.aliased_by_input[i->second] < 0, where, "alias: input '", in,
                  "' is the target of two outputs");
    const TensorType& ot = g.value(g.outputs()[o->second]).type;
    const TensorType& it = g.value(g.inputs()[i->second]).type;
    FUSEBOX_CHECK(ot == it, where, "alias: output '", out, "' is ", type_str(ot.dtype, ot.shape),
                  " but input '", in, "' is ", type_str(it.dtype, it.shape));
    io.alias_of_output[o->second] = int(i->second);
    io.aliased_by_input[i->second] = int(o->second);
  }
  return io;
}

void check_request(const IoPlan& io, const Feeds& feeds, const std::set<std::string>& to_host,
                   const std::string& where) {
  for (const auto& [name, feed] : feeds) {
    auto it = io.input_index.find(name);
    FUSEBOX_CHECK(it != io.input_index.end(), where, "a tensor was given for '", name,
                  "', which is not an input of the graph");
    FUSEBOX_CHECK(!io.bound[it->second], where, "input '", name,
                  "' is bound to a device array; it cannot be fed");
  }
  for (const std::string& name : to_host)
    FUSEBOX_CHECK(io.output_index.count(name), where, "'", name,
                  "' was asked for on the host but is not an output of the graph");
}

std::string error_message(const Error& e) {
  const std::string what = e.what();
  const size_t prefix = e.where().size() + 3;  // "[" where "] "
  return what.size() >= prefix ? what.substr(prefix) : what;
}

}  // namespace fusebox::runtime
