// all_reduce (ops.h): every input, rounded to reduce_dtype, packed into one bucket; the world
// sums the bucket (Communicator::all_reduce_sum: f16 and bf16 summed in f32 and rounded once,
// the same bits on every rank); each output is its slice of the sum times the scale (1 / world
// size for a mean, as an f32), rounded to its dtype. Without a world (a world of one) the sum
// is the bucket itself, so the result is the input rounded through reduce_dtype; a world of
// one rank still goes through its communicator.
#include "fusebox/core/communicator.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

void all_reduce(dist::Communicator* world, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AllReduceAttrs>(n.attrs);
  int64_t total = 0;
  for (const Tensor* t : in) total += t->numel();
  Tensor bucket = Tensor::empty(a.reduce_dtype, {total});
  int64_t offset = 0;
  for (const Tensor* t : in) {
    visit_float(n, t->dtype(), [&](auto src_tag) {
      visit_float(n, a.reduce_dtype, [&](auto dst_tag) {
        using S = decltype(src_tag);
        using D = decltype(dst_tag);
        const S* src = t->data<S>();
        D* dst = bucket.data<D>() + offset;
        parallel_for(t->numel(), kGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = convert<D>(src[i]);
        });
      });
    });
    offset += t->numel();
  }
  const int ranks = world != nullptr ? world->world_size() : 1;
  if (world != nullptr) world->all_reduce_sum(bucket);
  const float scale = a.mean ? 1.0f / float(ranks) : 1.0f;
  offset = 0;
  for (Tensor& t : out) {
    visit_float(n, a.reduce_dtype, [&](auto src_tag) {
      visit_float(n, t.dtype(), [&](auto dst_tag) {
        using S = decltype(src_tag);
        using D = decltype(dst_tag);
        const S* src = bucket.data<S>() + offset;
        D* dst = t.data<D>();
        parallel_for(t.numel(), kGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = convert<D>(float(src[i]) * scale);
        });
      });
    });
    offset += t.numel();
  }
}

std::vector<double> gather_ranks(dist::Communicator* world, const std::vector<double>& own) {
  if (world == nullptr) return own;
  const Tensor all =
      world->all_gather(Tensor::from_doubles(DType::f64, {int64_t(own.size())}, own));
  const double* p = all.data<double>();
  return std::vector<double>(p, p + all.numel());
}

}  // namespace fusebox::cpu
