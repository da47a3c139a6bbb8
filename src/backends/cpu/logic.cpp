// Comparisons, logic ops and where (ops.h): numpy broadcasting, each operand's values
// broadcast to the output's shape first (broadcast_values), then one pass.
//   comparisons  in compute_t<T> (f16 / bf16 as f32: exact; integers exactly); a NaN
//                compares false -> bool
//   logic        not / and / or / xor of bools -> bool
//   where        condition ? a : b, a's dtype (elements moved unchanged)
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {
// The element type values are held in (std::vector<bool> has no data(): bools as bytes).
template <class T>
using held_t = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
}  // namespace

void logic(const Node& n, Inputs in, Outputs out) {
  Tensor& y = out[0];
  bool* py = y.data<bool>();
  const int64_t count = y.numel();
  if (n.op == OpKind::logical_not) {
    const std::vector<uint8_t> x = broadcast_values<uint8_t>(*in[0], y.shape());
    for (int64_t i = 0; i < count; ++i) py[i] = !x[size_t(i)];
    return;
  }
  visit_dtype(in[0]->dtype(), [&](auto tag) {
    using C = held_t<compute_t<decltype(tag)>>;
    const std::vector<C> a = broadcast_values<C>(*in[0], y.shape());
    const std::vector<C> b = broadcast_values<C>(*in[1], y.shape());
    auto apply = [&](auto f) {
      parallel_for(count, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) py[i] = f(a[size_t(i)], b[size_t(i)]);
      });
    };
    switch (n.op) {
      case OpKind::equal:
        return apply([](C u, C v) { return u == v; });
      case OpKind::less:
        return apply([](C u, C v) { return u < v; });
      case OpKind::greater:
        return apply([](C u, C v) { return u > v; });
      case OpKind::less_equal:
        return apply([](C u, C v) { return u <= v; });
      case OpKind::greater_equal:
        return apply([](C u, C v) { return u >= v; });
      case OpKind::logical_and:
        return apply([](C u, C v) { return bool(u) && bool(v); });
      case OpKind::logical_or:
        return apply([](C u, C v) { return bool(u) || bool(v); });
      case OpKind::logical_xor:
        return apply([](C u, C v) { return bool(u) != bool(v); });
      default:
        throw Error(node_label(n), "is not a comparison or logic op");
    }
  });
}

void where(const Node& n, Inputs in, Outputs out) {
  Tensor& y = out[0];
  const std::vector<uint8_t> cond = broadcast_values<uint8_t>(*in[0], y.shape());
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::vector<held_t<T>> a = broadcast_values<held_t<T>>(*in[1], y.shape());
    const std::vector<held_t<T>> b = broadcast_values<held_t<T>>(*in[2], y.shape());
    T* py = y.data<T>();
    for (size_t i = 0; i < cond.size(); ++i) py[i] = T(cond[i] ? a[i] : b[i]);
  });
}

}  // namespace fusebox::cpu
