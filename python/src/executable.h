// fusebox.Executable: a compiled model called on arrays (docs/python.md).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"

namespace fusebox::python {

class PyExecutable {
 public:
  explicit PyExecutable(std::unique_ptr<Executable> exe);

  // exe(*arrays, **named): positional arrays in the inputs' order, named ones by input name.
  // Returns the outputs in the executable's order, as a tuple.
  nb::tuple call(nb::args args, nb::kwargs kwargs);

  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  Device device() const { return exe_->device(); }
  const Executable& executable() const { return *exe_; }
  // Executable::profile (repeats: 10 on CUDA, 1 on the CPU when not given), the GIL released.
  std::vector<NodeTime> profile(std::optional<int> repeats);

 private:
  // The arrays of every input, in the inputs' order; Errors name what is missing, extra or
  // given twice.
  std::vector<InputArray> gather_inputs(const nb::args& args, const nb::kwargs& kwargs) const;
  // Checks one array against its input: dtype, shape, device (and on CUDA, layout).
  void check_input(const InputArray& a, const TensorSpec& spec) const;
  // The outputs of a CPU run as numpy arrays: the run's own tensors where no one else holds
  // their memory (the feeds, the constants, another output), else a copy.
  nb::tuple cpu_outputs(const std::vector<Tensor>& outputs, const Feeds& feeds) const;

  std::unique_ptr<Executable> exe_;
  std::vector<TensorSpec> inputs_, outputs_;
  std::string where_;
  // The constants' bytes: a CPU output over them is handed out as a copy.
  std::vector<std::pair<const std::byte*, const std::byte*>> constant_bytes_;
  // One thread at a time runs an executable (Executable's contract); the GIL is released
  // while it runs, so Python threads are kept in line here.
  std::mutex mutex_;
};

}  // namespace fusebox::python
