// Host-side helpers of the norm kernels (kernels/norm/forward.cu, kernels/norm/backward.cu): the
// [rows, cols] view of a normalised tensor, scale/bias broadcast to the normalised dims, and the
// buffer lists the encoder is given. Include from .cu files only (kernels/common/indexing.cuh).
#pragma once

#include <initializer_list>
#include <string>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/indexing.cuh"

namespace fusebox::cuda::norm {

// x seen as rows x cols: cols is the product of the dims from `axis` on.
struct RowsView {
  int64_t rows = 0;
  int64_t cols = 0;
  Shape norm_shape;  // the normalised dims
};

inline RowsView rows_view(const std::string& where, const Shape& x, int64_t axis) {
  FUSEBOX_CHECK(axis >= 0 && axis < int64_t(x.size()), where, "axis ", axis,
                " is not normalised for x ", shape_str(x));
  RowsView v;
  v.norm_shape.assign(x.begin() + axis, x.end());
  v.cols = numel(v.norm_shape);
  v.rows = numel(Shape(x.begin(), x.begin() + axis));
  FUSEBOX_CHECK(v.cols >= 1, where, "the normalised dims ", shape_str(v.norm_shape), " of x ",
                shape_str(x), " hold no elements");
  return v;
}

// A scale or bias input as a contiguous [cols] tensor: the input itself when it has cols
// elements (its shape can then differ from the normalised dims only by leading 1s), else
// its broadcast to the normalised dims, copied once into `storage` (a temporary).
inline const DeviceTensor* expand_param(Context& ctx, const std::string& where,
                                        const DeviceTensor* p, const RowsView& view,
                                        DeviceTensor& storage) {
  if (p == nullptr) return nullptr;
  Shape merged;
  FUSEBOX_CHECK(broadcast_shapes(p->shape, view.norm_shape, &merged) && merged == view.norm_shape,
                where, "parameter of shape ", shape_str(p->shape),
                " does not broadcast to the normalised dims ", shape_str(view.norm_shape));
  if (p->numel() == view.cols && p->is_contiguous()) return p;
  DeviceTensor broadcast = *p;
  broadcast.shape = view.norm_shape;
  broadcast.strides = broadcast_strides(p->shape, p->strides, view.norm_shape);
  storage = DeviceTensor::empty(ctx.allocator, p->dtype, view.norm_shape);
  copy_strided(ctx, broadcast, storage);
  ctx.encoder.add_temporary(storage.buffer);
  return &storage;
}

// The byte ranges of the given tensors, skipping null ones.
inline BufferList ranges(std::initializer_list<const DeviceTensor*> tensors) {
  BufferList list;
  for (const DeviceTensor* t : tensors)
    if (t != nullptr) list.push_back(t->range());
  return list;
}

}  // namespace fusebox::cuda::norm
