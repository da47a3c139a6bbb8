// recognize_gelu (passes/simplify.h): each erf or tanh node anchors one match, checked from it
// outwards (the add of one it feeds, the product with x and a half after that; its argument back
// to x), then every match becomes one gelu node in a single rebuild.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "fusebox/passes/simplify.h"
#include "passes/fusion/fusion_rewrite.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

// sqrt(2), 1/sqrt(2), sqrt(2/pi) and the cubic's coefficient as GELU's definitions give them.
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kCubic = 0.044715;

struct GeluMatch {
  ValueId x = kNoValue;
  NodeId root = -1;           // the last product: the gelu takes its place and its value
  std::vector<NodeId> nodes;  // every node the gelu replaces, root included
  bool tanh_approximation = false;
};

class GeluMatcher {
 public:
  explicit GeluMatcher(const Graph& g) : g_(g), readers_(g) {}

  // The GELU whose erf or tanh is `activation`, if the nodes around it spell one.
  std::optional<GeluMatch> match(const Node& activation) const {
    if (activation.inputs.size() != 1 || activation.outputs.size() != 1) return std::nullopt;
    GeluMatch m;
    m.tanh_approximation = activation.op == OpKind::tanh;
    m.nodes.push_back(activation.id);
    // 1 + erf(u) (or 1 + tanh(u)), read once.
    const Node* one_plus = only_reader(activation.outputs[0], OpKind::add);
    if (one_plus == nullptr || !intermediate(one_plus->outputs[0])) return std::nullopt;
    const ValueId one = other_operand(*one_plus, activation.outputs[0]);
    if (!constant_near(one, 1.0)) return std::nullopt;
    m.nodes.push_back(one_plus->id);
    add_constant_node(m, one);
    // x * 0.5 * (1 + ...), the three factors in any order and association: climb the products
    // from the sum until they hold three factors.
    const ValueId sum = one_plus->outputs[0];
    ValueId climbed = sum;
    std::vector<ValueId> factors;
    std::vector<NodeId> products;
    for (int level = 0; level < 3 && factors.size() < 3; ++level) {
      const Node* product = only_reader(climbed, OpKind::mul);
      if (product == nullptr) return std::nullopt;
      factors.clear();
      products.clear();
      collect_factors(*product, factors, products);
      climbed = product->outputs[0];
      m.root = product->id;
    }
    if (factors.size() != 3 || std::count(factors.begin(), factors.end(), sum) != 1)
      return std::nullopt;
    std::erase(factors, sum);
    const auto half = std::find_if(factors.begin(), factors.end(),
                                   [&](ValueId v) { return constant_near(v, 0.5); });
    if (half == factors.end()) return std::nullopt;
    add_constant_node(m, *half);
    factors.erase(half);
    m.x = factors[0];
    if (known_tensor(m.x) != nullptr) return std::nullopt;
    const TensorType& x_type = g_.value(m.x).type;
    if (x_type != g_.value(climbed).type ||
        (x_type.dtype != DType::f32 && x_type.dtype != DType::f16 && x_type.dtype != DType::bf16))
      return std::nullopt;
    for (NodeId p : products) m.nodes.push_back(p);
    // The argument u, read by the erf or tanh alone.
    const ValueId u = activation.inputs[0];
    if (!intermediate(u)) return std::nullopt;
    const bool argument = m.tanh_approximation ? tanh_argument(u, m) : erf_argument(u, m);
    if (!argument) return std::nullopt;
    std::sort(m.nodes.begin(), m.nodes.end());
    return m;
  }

 private:
  // x / sqrt(2) or x * (1 / sqrt(2)).
  bool erf_argument(ValueId u, GeluMatch& m) const {
    if (const Node* div = intermediate_producer(u, OpKind::div)) {
      if (div->inputs[0] != m.x || !constant_near(div->inputs[1], kSqrt2)) return false;
      m.nodes.push_back(div->id);
      add_constant_node(m, div->inputs[1]);
      return true;
    }
    const Node* scaled = intermediate_producer(u, OpKind::mul);
    return scaled != nullptr && product_of(*scaled, {kInvSqrt2}, {m.x}, m);
  }

  // sqrt(2/pi) * (x + 0.044715 * x^3), x^3 as pow(x, 3) or x * x * x.
  bool tanh_argument(ValueId u, GeluMatch& m) const {
    const Node* scaled = intermediate_producer(u, OpKind::mul);
    if (scaled == nullptr) return false;
    std::vector<ValueId> factors;
    std::vector<NodeId> products;
    collect_factors(*scaled, factors, products);
    if (factors.size() != 2) return false;
    const bool k_first = constant_near(factors[0], kSqrt2OverPi);
    if (!k_first && !constant_near(factors[1], kSqrt2OverPi)) return false;
    add_constant_node(m, factors[k_first ? 0 : 1]);
    for (NodeId p : products) m.nodes.push_back(p);
    // x + 0.044715 x^3.
    const ValueId inner = factors[k_first ? 1 : 0];
    const Node* sum = intermediate_producer(inner, OpKind::add);
    if (sum == nullptr) return false;
    const bool x_first = sum->inputs[0] == m.x;
    if (!x_first && sum->inputs[1] != m.x) return false;
    const ValueId cubic_term = sum->inputs[x_first ? 1 : 0];
    m.nodes.push_back(sum->id);
    const Node* cubic = intermediate_producer(cubic_term, OpKind::mul);
    if (cubic == nullptr) return false;
    factors.clear();
    products.clear();
    collect_factors(*cubic, factors, products);
    const auto c = std::find_if(factors.begin(), factors.end(),
                                [&](ValueId v) { return constant_near(v, kCubic); });
    if (c == factors.end()) return false;
    add_constant_node(m, *c);
    factors.erase(c);
    for (NodeId p : products) m.nodes.push_back(p);
    if (factors.size() == 3) return std::count(factors.begin(), factors.end(), m.x) == 3;
    if (factors.size() != 1) return false;
    const Node* pow = intermediate_producer(factors[0], OpKind::pow);
    if (pow == nullptr || pow->inputs[0] != m.x) return false;
    const Tensor* exponent = known_tensor(pow->inputs[1]);
    if (exponent == nullptr || exponent->numel() != 1 || exponent->get(0) != 3.0) return false;
    m.nodes.push_back(pow->id);
    add_constant_node(m, pow->inputs[1]);
    return true;
  }

  // A product whose factors are the constants near `constants` and the values `values`, each
  // once, in any order and association.
  bool product_of(const Node& n, std::vector<double> constants, std::vector<ValueId> values,
                  GeluMatch& m) const {
    std::vector<ValueId> factors;
    std::vector<NodeId> products;
    collect_factors(n, factors, products);
    if (factors.size() != constants.size() + values.size()) return false;
    for (ValueId f : factors) {
      if (const auto v = std::find(values.begin(), values.end(), f); v != values.end()) {
        values.erase(v);
        continue;
      }
      const auto c = std::find_if(constants.begin(), constants.end(),
                                  [&](double want) { return constant_near(f, want); });
      if (c == constants.end()) return false;
      constants.erase(c);
      add_constant_node(m, f);
    }
    for (NodeId p : products) m.nodes.push_back(p);
    return true;
  }

  // The factors of the product `n` writes: its operands, through every operand that is itself
  // a product read only by it (those products go to `products`, `n` first).
  void collect_factors(const Node& n, std::vector<ValueId>& factors,
                       std::vector<NodeId>& products) const {
    products.push_back(n.id);
    for (ValueId v : n.inputs) {
      if (const Node* p = intermediate_producer(v, OpKind::mul))
        collect_factors(*p, factors, products);
      else
        factors.push_back(v);
    }
  }

  // Read by one node and not a graph output: a value the pattern may drop.
  bool intermediate(ValueId v) const { return readers_.only_reader(v) >= 0; }

  // The node of `op` writing v, when v is an intermediate.
  const Node* intermediate_producer(ValueId v, OpKind op) const {
    const NodeId p = g_.value(v).producer;
    if (p < 0 || g_.node(p).op != op || !intermediate(v)) return nullptr;
    return &g_.node(p);
  }

  // The node of `op` reading v, when v is an intermediate.
  const Node* only_reader(ValueId v, OpKind op) const {
    const NodeId r = readers_.only_reader(v);
    return r >= 0 && g_.node(r).op == op ? &g_.node(r) : nullptr;
  }

  static ValueId other_operand(const Node& binary, ValueId operand) {
    return binary.inputs[0] == operand ? binary.inputs[1] : binary.inputs[0];
  }

  const Tensor* known_tensor(ValueId v) const { return fusion::known_tensor(g_, v); }

  // A one-element float constant within its dtype's rounding of `want` (exporters write the
  // constants rounded to the graph's dtype: sqrt(2) as 1.4142135381698608 in f32).
  bool constant_near(ValueId v, double want) const {
    const Tensor* t = known_tensor(v);
    if (t == nullptr || t->numel() != 1 || !is_floating(t->dtype())) return false;
    return std::abs(t->get(0) - want) <= relative_tolerance(t->dtype()) * std::abs(want);
  }

  // Twice the unit roundoff of f16 and bf16; 1e-6 for f32 and f64, which takes sqrt(2/pi) as
  // exporters round it (0.7978845834732056) or write it (0.7978845608), not a different value.
  static double relative_tolerance(DType dtype) {
    switch (dtype) {
      case DType::f16:
        return 0x1p-10;
      case DType::bf16:
        return 0x1p-7;
      default:
        return 1e-6;
    }
  }

  // A constant node read by the pattern alone goes with it.
  void add_constant_node(GeluMatch& m, ValueId v) const {
    const NodeId p = g_.value(v).producer;
    if (p >= 0 && g_.node(p).op == OpKind::constant && intermediate(v)) m.nodes.push_back(p);
  }

  const Graph& g_;
  const fusion::Readers readers_;
};

}  // namespace

size_t recognize_gelu(Graph& g, FusionLog* /*log*/) {
  const GeluMatcher matcher(g);
  std::vector<bool> replaced(g.nodes().size(), false);
  std::vector<std::optional<GeluMatch>> at_root(g.nodes().size());
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::erf && n.op != OpKind::tanh) continue;
    std::optional<GeluMatch> m = matcher.match(n);
    if (!m) continue;
    // Matches share no intermediate (each is read once); a node claimed twice would be a
    // matcher bug, so such a match is left alone rather than trusted.
    if (std::any_of(m->nodes.begin(), m->nodes.end(), [&](NodeId id) { return replaced[id]; }))
      continue;
    for (NodeId id : m->nodes) replaced[size_t(id)] = true;
    at_root[size_t(m->root)] = std::move(m);
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (const std::optional<GeluMatch>& m = at_root[size_t(n.id)]) {
      // The last product's name and value: its readers (or the graph output) read the gelu.
      rw.emit(n, OpKind::gelu, GeluAttrs{m->tanh_approximation}, {rw.mapped(m->x)},
              rw.output_names(n));
    } else if (!replaced[size_t(n.id)]) {
      rw.copy(n);
    }
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
