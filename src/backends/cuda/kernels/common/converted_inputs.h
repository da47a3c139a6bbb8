// A node's inputs with some replaced by dense copies: what a kernel that takes only dense
// operands gets from strided views (the dispatcher's layouts, attention's fallbacks).
#pragma once

#include <optional>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

// A dense copy of `t` in `format`: a temporary of the operation (context.h temporary_tensor).
inline DeviceTensor converted(Context& ctx, const DeviceTensor& t, MemoryFormat format) {
  DeviceTensor c = temporary_tensor(ctx, t.dtype, t.shape, format);
  copy_strided(ctx, t, c);
  return c;
}

// A node's inputs, each as given or replaced by a dense copy in the format `want(t)` names
// (nullopt: as given). The copies live here (and with the encoder until the work is done).
class ConvertedInputs {
 public:
  template <class Want>
  ConvertedInputs(Context& ctx, Inputs in, Want&& want) : ptrs_(in.begin(), in.end()) {
    copies_.reserve(in.size());  // ptrs_ point into it
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == nullptr) continue;
      if (const std::optional<MemoryFormat> format = want(*in[i])) {
        copies_.push_back(converted(ctx, *in[i], *format));
        ptrs_[i] = &copies_.back();
      }
    }
  }
  ConvertedInputs(const ConvertedInputs&) = delete;
  ConvertedInputs& operator=(const ConvertedInputs&) = delete;
  Inputs get() const { return ptrs_; }

 private:
  std::vector<DeviceTensor> copies_;
  std::vector<const DeviceTensor*> ptrs_;
};

// Contiguous copies of the inputs that are not contiguous.
inline std::optional<MemoryFormat> unless_contiguous(const DeviceTensor& t) {
  return t.is_contiguous() ? std::nullopt : std::optional(MemoryFormat::contiguous);
}

}  // namespace fusebox::cuda
