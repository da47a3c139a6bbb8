// swap_transposed_products (passes/simplify.h): one walk over the transposes; each that takes a
// large product's last two dims, with the product's second operand transposable for free,
// becomes the swapped product writing that order itself.
#include <cstring>
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

// Products smaller than this keep their transpose: it costs little.
constexpr size_t kMinProductBytes = size_t(16) << 20;

size_t bytes_of(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  return size_t(numel(t.shape)) * dtype_size(t.dtype);
}

// The permutation of a rank-r value that swaps its last two dims.
std::vector<int64_t> last_two_swapped(size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = int64_t(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return perm;
}

bool swaps_last_two(const Node& n) {
  if (n.op != OpKind::transpose) return false;
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  return perm.size() >= 2 && perm == last_two_swapped(perm.size());
}

// `t` with its last two dims swapped (a constant, at compile).
Tensor transposed(const Tensor& t) {
  Shape shape = t.shape();
  const size_t r = shape.size();
  const int64_t rows = shape[r - 2], cols = shape[r - 1];
  std::swap(shape[r - 1], shape[r - 2]);
  Tensor out = Tensor::empty(t.dtype(), shape);
  const size_t elem = dtype_size(t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  const int64_t matrices = rows * cols == 0 ? 0 : t.numel() / (rows * cols);
  for (int64_t m = 0; m < matrices; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        std::memcpy(dst + size_t((m * cols + j) * rows + i) * elem,
                    src + size_t((m * rows + i) * cols + j) * elem, elem);
  return out;
}

}  // namespace

size_t swap_transposed_products(Graph& g, FusionLog* /*log*/) {
  std::vector<int> readers(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++readers[size_t(v)];
  for (ValueId v : g.outputs()) readers[size_t(v)] += 1 << 20;  // never dropped
  std::vector<NodeId> swapped(g.nodes().size(), -1);            // by transpose: its product
  std::vector<bool> dropped(g.nodes().size(), false);
  size_t count = 0;
  for (const Node& t : g.nodes()) {
    if (!swaps_last_two(t)) continue;
    const ValueId product = t.inputs[0];
    const NodeId m = g.value(product).producer;
    if (m < 0 || g.node(m).op != OpKind::matmul || readers[size_t(product)] != 1) continue;
    const Node& mm = g.node(m);
    const ValueId a = mm.inputs[0], b = mm.inputs[1];
    if (g.value(a).type.shape.size() < 2 || g.value(b).type.shape.size() < 2) continue;
    // Pays where the product is large and a, transposed at run time, small beside it.
    if (bytes_of(g, product) < kMinProductBytes || 8 * bytes_of(g, a) > bytes_of(g, product))
      continue;
    // b^T for free: a constant (transposed now), or a transpose's input that only this product
    // reads through it.
    const NodeId bp = g.value(b).producer;
    const bool b_transposed = bp >= 0 && swaps_last_two(g.node(bp)) && readers[size_t(b)] == 1;
    if (!g.is_constant(b) && !b_transposed) continue;
    swapped[size_t(t.id)] = m;
    dropped[size_t(m)] = true;
    if (b_transposed) dropped[size_t(bp)] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (dropped[size_t(n.id)]) continue;
    const NodeId m = swapped[size_t(n.id)];
    if (m < 0) {
      rw.copy(n);
      continue;
    }
    const Node& mm = g.node(m);
    const ValueId a = mm.inputs[0], b = mm.inputs[1];
    const NodeId bp = g.value(b).producer;
    const ValueId bt = g.is_constant(b)
                           ? rw.graph().add_constant(rw.fresh_name(g.value(b).name + ":T"),
                                                     transposed(*g.constant(b)))
                           : rw.mapped(g.node(bp).inputs[0]);
    const ValueId at = rw.graph().add_node(
        OpKind::transpose, TransposeAttrs{last_two_swapped(g.value(a).type.shape.size())},
        {rw.mapped(a)}, mm.name + "/a_transposed", {rw.fresh_name(g.value(a).name + ":T")})[0];
    rw.map(n.outputs[0],
           rw.graph().add_node(OpKind::matmul, {}, {bt, at}, n.name, rw.output_names(n))[0]);
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
