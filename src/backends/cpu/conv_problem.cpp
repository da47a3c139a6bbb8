#include "conv_problem.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace fusebox::cpu {

namespace {

using Dims3 = std::array<int64_t, 3>;

// For one filter tap r, walks the output positions [o_begin, o_end) in runs along the
// innermost dim and calls
//   segment(col_offset, count, x_offset, x_step)
// where positions col_offset .. col_offset+count-1 (relative to o_begin) read x at
// x_offset + i * x_step, or x_offset < 0: the whole run lies in the padding.
template <class Segment>
void walk_tap(const ConvProblem& p, const Dims3& r, int64_t o_begin, int64_t o_end,
              Segment&& segment) {
  const int64_t o_inner = p.out[2], o_mid = p.out[1];
  // Input position along dim d of output o_d: o_d * stride + shift_d.
  Dims3 shift;
  for (int d = 0; d < 3; ++d) shift[d] = r[d] * p.dilation[d] - p.pad_lo[d];
  // Innermost outputs whose input is inside [0, D2): [inner_lo, inner_hi).
  const int64_t s2 = p.stride[2];
  int64_t inner_lo = std::clamp<int64_t>(floor_div(-shift[2] + s2 - 1, s2), 0, o_inner);
  int64_t inner_hi = std::clamp<int64_t>(floor_div(p.in[2] - 1 - shift[2], s2) + 1, 0, o_inner);
  inner_hi = std::max(inner_hi, inner_lo);
  int64_t o = o_begin;
  while (o < o_end) {
    int64_t o0 = o / (o_mid * o_inner), o1 = o / o_inner % o_mid, o2 = o % o_inner;
    int64_t run_end = std::min(o_end, o - o2 + o_inner);
    int64_t a = o2, b = o2 + (run_end - o);  // innermost range of this run
    int64_t i0 = o0 * p.stride[0] + shift[0], i1 = o1 * p.stride[1] + shift[1];
    int64_t col = o - o_begin;
    if (i0 < 0 || i0 >= p.in[0] || i1 < 0 || i1 >= p.in[1]) {
      segment(col, b - a, int64_t(-1), int64_t(0));
    } else {
      int64_t lo = std::clamp(inner_lo, a, b), hi = std::clamp(inner_hi, lo, b);
      if (lo > a) segment(col, lo - a, int64_t(-1), int64_t(0));
      if (hi > lo)
        segment(col + (lo - a), hi - lo, (i0 * p.in[1] + i1) * p.in[2] + lo * s2 + shift[2], s2);
      if (b > hi) segment(col + (hi - a), b - hi, int64_t(-1), int64_t(0));
    }
    o = run_end;
  }
}

Dims3 tap_of(const ConvProblem& p, int64_t r) {
  return {r / (p.filter[1] * p.filter[2]), r / p.filter[2] % p.filter[1], r % p.filter[2]};
}

}  // namespace

bool ConvProblem::is_pointwise() const {
  for (int d = 0; d < 3; ++d)
    if (filter[d] != 1 || stride[d] != 1 || pad_lo[d] != 0 || in[d] != out[d]) return false;
  return true;
}

template <class T>
void im2col(const ConvProblem& p, const T* x, int64_t o_begin, int64_t o_end, T* col) {
  const int64_t width = o_end - o_begin, taps = p.filter_size(), plane = p.in_size();
  parallel_for(p.col_rows(), 16, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; ++row) {
      const T* x_plane = x + (row / taps) * plane;
      T* col_row = col + row * width;
      walk_tap(p, tap_of(p, row % taps), o_begin, o_end,
               [&](int64_t at, int64_t count, int64_t x_at, int64_t step) {
                 T* dst = col_row + at;
                 if (x_at < 0) {
                   std::fill(dst, dst + count, T(0));
                 } else if (step == 1) {
                   std::memcpy(dst, x_plane + x_at, size_t(count) * sizeof(T));
                 } else {
                   const T* src = x_plane + x_at;
                   for (int64_t i = 0; i < count; ++i) dst[i] = src[i * step];
                 }
               });
    }
  });
}

template <class T>
void col2im(const ConvProblem& p, const T* col, int64_t o_begin, int64_t o_end, T* dx) {
  const int64_t width = o_end - o_begin, taps = p.filter_size(), plane = p.in_size();
  parallel_for(p.in_per_group(), 1, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      T* dx_plane = dx + c * plane;
      for (int64_t r = 0; r < taps; ++r) {
        const T* col_row = col + (c * taps + r) * width;
        walk_tap(p, tap_of(p, r), o_begin, o_end,
                 [&](int64_t at, int64_t count, int64_t x_at, int64_t step) {
                   if (x_at < 0) return;
                   const T* src = col_row + at;
                   T* dst = dx_plane + x_at;
                   for (int64_t i = 0; i < count; ++i) dst[i * step] += src[i];
                 });
      }
    }
  });
}

template <class C>
ComputeInput<C>::ComputeInput(const Tensor* t) {
  if (t == nullptr) return;
  if (t->dtype() == dtype_of<C>::value) {
    data_ = t->data<C>();
    return;
  }
  copy_.resize(size_t(t->numel()));
  visit_dtype(t->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = t->data<T>();
    parallel_for(t->numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) copy_[size_t(i)] = convert<C>(src[i]);
    });
  });
  data_ = copy_.data();
}

template <class C>
ComputeOutput<C>::ComputeOutput(Tensor& t) : tensor_(t) {
  if (t.dtype() == dtype_of<C>::value) {
    data_ = t.data<C>();
  } else {
    scratch_.resize(size_t(t.numel()));
    data_ = scratch_.data();
  }
}

template <class C>
void ComputeOutput<C>::store() {
  if (data_ != scratch_.data() || scratch_.empty()) return;
  store_values(tensor_, scratch_);
}

template void im2col<float>(const ConvProblem&, const float*, int64_t, int64_t, float*);
template void im2col<double>(const ConvProblem&, const double*, int64_t, int64_t, double*);
template void col2im<float>(const ConvProblem&, const float*, int64_t, int64_t, float*);
template void col2im<double>(const ConvProblem&, const double*, int64_t, int64_t, double*);
template class ComputeInput<float>;
template class ComputeInput<double>;
template class ComputeOutput<float>;
template class ComputeOutput<double>;

}  // namespace fusebox::cpu
