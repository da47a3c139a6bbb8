// Reverse-mode autodiff (passes/autodiff.h).
//
// Algorithm:
//   1. needed = (float values that depend on some wrt) ∩ (values the loss depends on):
//      one forward sweep from the wrt values, one backward sweep from the loss. Only
//      those values get gradients, so nothing is built for a branch that no wrt reaches
//      or that does not reach the loss.
//   2. Seed the loss's gradient, then walk the forward nodes in reverse (the node list is
//      a topological order). For a node with a needed output: run the op's VJP rule on
//      its outputs' gradients for the inputs that are needed, and add what it returns to
//      those inputs' running sums (one add as each contribution arrives: a value read by
//      many branches, an ASPP head's input by five convolutions, holds one sum, not every
//      branch's gradient until its producer is reached).
//   3. Each wrt's gradient is the sum of its contributions, or zeros when it has none.
#include "fusebox/passes/autodiff.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/ir/op_groups.h"

#include <set>

#include "vjp.h"

namespace fusebox {
namespace autodiff {
namespace {

Grads no_gradient_second_order(VjpArgs& a) {
  a.no_gradient(cat(op_name(a.node.op),
                    " has no gradient rule (second-order differentiation is not supported)"));
}

Grads pass_through(VjpArgs& a) {
  return {a.dy[0]};
}

Grads vjp(VjpArgs& a) {
  switch (a.node.op) {
    case OpKind::conv:
      return vjp_conv(a);
    case OpKind::conv_backward_data:
      return vjp_conv_backward_data(a);
    case OpKind::max_pool:
    case OpKind::avg_pool:
      return vjp_pool(a);
    case OpKind::global_avg_pool:
      return vjp_global_avg_pool(a);
    case OpKind::batch_norm:
      return vjp_batch_norm(a);
    case OpKind::layer_norm:
      return vjp_layer_norm(a);
    case OpKind::rms_norm:
      return vjp_rms_norm(a);
    case OpKind::softmax:
    case OpKind::log_softmax:
      return vjp_softmax(a);
    case OpKind::cross_entropy:
      return vjp_cross_entropy(a);
      FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return vjp_unary(a);
      FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return vjp_binary(a);
    case OpKind::matmul:
      return vjp_matmul(a);
    case OpKind::gemm:
      return vjp_gemm(a);
      FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return vjp_reduce(a);
    case OpKind::reshape:
    case OpKind::flatten:
    case OpKind::squeeze:
    case OpKind::unsqueeze:
      return vjp_reshape(a);
    case OpKind::transpose:
      return vjp_transpose(a);
    case OpKind::concat:
      return vjp_concat(a);
    case OpKind::slice:
      return vjp_slice(a);
    case OpKind::pad:
      return vjp_pad(a);
    case OpKind::cast:
      return vjp_cast(a);
    case OpKind::expand:
      return vjp_expand(a);
    case OpKind::gather:
    case OpKind::gather_elements:
      return vjp_gather(a);
    case OpKind::cumsum:
      return vjp_cumsum(a);
    case OpKind::top_k:
      return vjp_top_k(a);
    case OpKind::resize:
      return vjp_resize(a);
    case OpKind::identity:
      return pass_through(a);
    case OpKind::constant:
      return {};
    // Indices and bools have no gradient (OpInfo::differentiable is false); autodiff never
    // asks, since only float values are on a path to the loss.
    case OpKind::arg_max:
    case OpKind::arg_min:
      FUSEBOX_LOGIC_OPS(FUSEBOX_OP_CASE)
      a.no_gradient(cat(op_name(a.node.op), " has no gradient rule (its output is not float)"));
    case OpKind::where:
      return vjp_where(a);
    // Not differentiable (OpInfo::differentiable; tests/unit/ops checks that they agree).
    case OpKind::conv_backward_filter:
      FUSEBOX_BACKWARD_OPS(FUSEBOX_OP_CASE)
    case OpKind::sgd_update:
    case OpKind::adamw_update:
    case OpKind::nonfinite_any:
    case OpKind::loss_scale_update:
      return no_gradient_second_order(a);
    case OpKind::all_reduce:
      return vjp_all_reduce(a);
    case OpKind::fused_pointwise:
      a.no_gradient(
          "fused_pointwise has no gradient rule: fuse pointwise chains only in graphs that are "
          "not differentiated (passes/fuse_pointwise.h)");
    case OpKind::batch_norm_apply:
      a.no_gradient(
          "batch_norm_apply has no gradient rule: the training step's memory pass emits it "
          "(passes/rematerialize.h), after autodiff");
    case OpKind::attention:
      return vjp_attention(a);
  }
  a.no_gradient("unknown op kind");
}

bool is_float_value(const Graph& g, ValueId v) {
  return is_floating(g.value(v).type.dtype);
}

// Float values on a path from some wrt to the loss (step 1 above).
std::vector<bool> values_needing_gradients(const Graph& g, ValueId loss,
                                           const std::vector<ValueId>& wrt, size_t num_nodes) {
  const size_t num_values = g.values().size();
  std::vector<bool> depends(num_values, false), reaches(num_values, false);
  for (ValueId v : wrt) depends[size_t(v)] = true;
  for (size_t i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[i];
    bool any = false;
    for (ValueId v : n.inputs) any = any || (v != kNoValue && depends[size_t(v)]);
    if (!any) continue;
    for (ValueId v : n.outputs) depends[size_t(v)] = is_float_value(g, v);
  }
  reaches[size_t(loss)] = true;
  for (size_t i = num_nodes; i-- > 0;) {
    const Node& n = g.nodes()[i];
    bool any = false;
    for (ValueId v : n.outputs) any = any || reaches[size_t(v)];
    if (!any) continue;
    for (ValueId v : n.inputs)
      if (v != kNoValue) reaches[size_t(v)] = true;
  }
  std::vector<bool> needed(num_values);
  for (size_t v = 0; v < num_values; ++v) needed[v] = depends[v] && reaches[v];
  return needed;
}

class Pass {
 public:
  Pass(Graph& g, const GradOptions& opts) : g_(g), opts_(opts), e_(g, opts.name_prefix) {}

  GradResult run(ValueId loss, const std::vector<ValueId>& wrt) {
    check_arguments(loss, wrt);
    const size_t num_nodes = g_.nodes().size();  // the forward graph; backward nodes follow
    needed_ = values_needing_gradients(g_, loss, wrt, num_nodes);

    GradResult result;
    result.seed = make_seed(loss);
    gradients_[loss] = result.seed;

    for (size_t i = num_nodes; i-- > 0;) {
      const Node node = g_.nodes()[i];  // a copy: emitting grows the node storage
      bool on_path = false;
      for (ValueId v : node.outputs) on_path = on_path || needed_[size_t(v)];
      if (on_path) differentiate(node);
    }

    std::set<ValueId> named;  // gradient values already named after a wrt
    for (ValueId v : wrt) {
      if (result.grads.count(v)) continue;
      e_.set_scope(g_.value(v).name);
      ValueId grad = gradient_of(v);
      if (grad == kNoValue) grad = e_.zeros(g_.value(v).type);
      result.grads[v] = name_gradient(v, grad, named);
    }
    if (opts_.mark_outputs) {
      std::set<ValueId> marked;
      for (ValueId v : wrt)
        if (marked.insert(v).second) g_.mark_output(result.grads[v]);
    }
    return result;
  }

 private:
  void check_arguments(ValueId loss, const std::vector<ValueId>& wrt) const {
    const int64_t count = int64_t(g_.values().size());
    FUSEBOX_CHECK(loss >= 0 && loss < count, "autodiff", "loss value id ", loss, " does not exist");
    FUSEBOX_CHECK(is_float_value(g_, loss), "autodiff", "loss '", g_.value(loss).name, "' is ",
                  dtype_name(g_.value(loss).type.dtype),
                  "; only floating-point values have "
                  "gradients");
    for (ValueId v : wrt) {
      FUSEBOX_CHECK(v >= 0 && v < count, "autodiff", "wrt value id ", v, " does not exist");
      FUSEBOX_CHECK(is_float_value(g_, v), "autodiff", "cannot differentiate with respect to '",
                    g_.value(v).name, "': it is ", dtype_name(g_.value(v).type.dtype),
                    " and only floating-point values have gradients");
    }
  }

  ValueId make_seed(ValueId loss) {
    const Value& l = g_.value(loss);
    const TensorType type = l.type;
    const std::string name = l.name + ":grad";
    if (opts_.seed_input) {
      FUSEBOX_CHECK(!g_.find_value(name), "autodiff", "cannot add the seed input '", name,
                    "': the name is taken");
      return g_.add_input(name, type.dtype, type.shape);
    }
    e_.set_scope(l.name);
    return e_.expand(e_.scalar(type.dtype, 1.0), type.shape);
  }

  // The summed gradient of v, or kNoValue when nothing contributed.
  ValueId gradient_of(ValueId v) const {
    auto it = gradients_.find(v);
    return it == gradients_.end() ? kNoValue : it->second;
  }

  void differentiate(const Node& node) {
    e_.set_scope(node.name);
    std::vector<ValueId> dy;
    bool any = false;
    for (ValueId v : node.outputs) {
      dy.push_back(needed_[size_t(v)] ? gradient_of(v) : kNoValue);
      any = any || dy.back() != kNoValue;
    }
    if (!any) return;  // every path through this node ended in a zero contribution
    std::vector<bool> needs;
    for (ValueId v : node.inputs) needs.push_back(v != kNoValue && needed_[size_t(v)]);

    VjpArgs args{node, std::move(dy), needs, e_};
    const Grads grads = vjp(args);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!needs[i] || i >= grads.size() || grads[i] == kNoValue) continue;
      const TensorType& want = g_.value(node.inputs[i]).type;
      const TensorType& got = g_.value(grads[i]).type;
      FUSEBOX_CHECK(got == want, node_label(node), "internal: the gradient of input ", i, " is ",
                    dtype_name(got.dtype), " ", shape_str(got.shape), " but the input is ",
                    dtype_name(want.dtype), " ", shape_str(want.shape));
      // The running sum (step 2 above).
      const auto [sum, first] = gradients_.try_emplace(node.inputs[i], grads[i]);
      if (!first) sum->second = e_.add(sum->second, grads[i]);
    }
  }

  // Names the gradient "<wrt>:grad" when free. A value that already carries another
  // wrt's gradient name (one gradient shared by two wrt values) gets an identity copy.
  ValueId name_gradient(ValueId wrt, ValueId grad, std::set<ValueId>& named) {
    const std::string name = g_.value(wrt).name + ":grad";
    if (g_.value(grad).name == name) {
      named.insert(grad);
      return grad;
    }
    const bool free = !g_.find_value(name);
    const bool shared = named.count(grad) || g_.value(grad).producer < 0;  // a graph input
    if (shared) {
      grad = e_.op1(OpKind::identity, {}, {grad}, "copy");
    }
    if (free) g_.rename_value(grad, name);
    named.insert(grad);
    return grad;
  }

  Graph& g_;
  const GradOptions& opts_;
  Emitter e_;
  std::vector<bool> needed_;
  std::map<ValueId, ValueId> gradients_;  // by value: the sum of its contributions so far
};

}  // namespace
}  // namespace autodiff

ValueId GradResult::of(ValueId wrt) const {
  auto it = grads.find(wrt);
  FUSEBOX_CHECK(it != grads.end(), "autodiff", "no gradient was asked for value id ", wrt);
  return it->second;
}

GradResult grad(Graph& g, ValueId loss, const std::vector<ValueId>& wrt, const GradOptions& opts) {
  const TracePhase trace("autodiff");
  autodiff::Pass pass(g, opts);
  return pass.run(loss, wrt);
}

}  // namespace fusebox
