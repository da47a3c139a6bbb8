// apply_mixed_precision (passes/mixed_precision.h): one walk over the source graph's nodes
// in order, adding each to a new graph (so inference re-checks every node) with its inputs
// cast as its op's autocast rule says (passes/rewrite/graph_rewriter.h). Value ids differ
// between the graphs: the rewriter maps a source value to its rewritten one, whose dtype is the
// source's or, for f32 values, maybe the low dtype.
#include "fusebox/passes/mixed_precision.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "fusebox/ir/op_groups.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16:
      return "bf16";
    case Precision::f16:
      return "f16";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  for (Precision p : {Precision::f32, Precision::tf32, Precision::bf16, Precision::f16})
    if (s == precision_name(p)) return p;
  throw Error("mixed precision",
              cat("unknown precision '", s, "' (choose f32, tf32, bf16 or f16)"));
}

DType precision_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::f16:
      return DType::f16;
    case Precision::f32:
    case Precision::tf32:
      return DType::f32;
  }
  return DType::f32;
}

const char* autocast_rule_name(AutocastRule r) {
  switch (r) {
    case AutocastRule::low:
      return "low";
    case AutocastRule::f32:
      return "f32";
    case AutocastRule::follow:
      return "follow";
    case AutocastRule::batch_norm:
      return "batch_norm";
    case AutocastRule::keep:
      return "keep";
  }
  return "?";
}

// PyTorch's CUDA autocast lists (torch.amp docs, "Autocast Op Reference") mapped to the op
// set; docs/mixed_precision.md explains each row. No default: a new op must be placed here.
AutocastRule autocast_rule(OpKind op) {
  switch (op) {
    // The lower-precision list (conv*d, conv_transpose*d, matmul, mm, addmm, linear): tensor
    // cores, where the time goes.
    case OpKind::conv:
    case OpKind::conv_backward_data:  // transposed convolution in a forward graph
    case OpKind::matmul:
    case OpKind::gemm:
      return AutocastRule::low;
    // The float32 list: range (exp, log, pow, reciprocal, rsqrt), long accumulations
    // (sum; mean as fusebox's reduce_mean), normalisation statistics (layer_norm; rms_norm
    // likewise) and probabilities (softmax, log_softmax, cross_entropy).
    case OpKind::layer_norm:
    case OpKind::rms_norm:
    case OpKind::exp:
    case OpKind::log:
    case OpKind::pow:
    case OpKind::reciprocal:
    case OpKind::rsqrt:
    case OpKind::reduce_sum:
    case OpKind::reduce_mean:
    case OpKind::softmax:
    case OpKind::log_softmax:
    case OpKind::cross_entropy:
    case OpKind::cumsum:  // a long accumulation (PyTorch's fp32 list too)
      return AutocastRule::f32;
    // On no list: cuDNN's and fusebox's kernels take low-precision x with f32 parameters
    // and statistics, which keeps the running statistics f32.
    case OpKind::batch_norm:
    case OpKind::batch_norm_apply:
      return AutocastRule::batch_norm;
    // On no list (so they run in their inputs' dtype), or the promote list (binary ops of
    // mixed dtypes run in the widest). Their kernels compute in f32 whatever the storage.
    case OpKind::relu:
    case OpKind::leaky_relu:
    case OpKind::gelu:
    case OpKind::silu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::sqrt:
    case OpKind::neg:
    case OpKind::abs:
    case OpKind::erf:
    case OpKind::sin:
    case OpKind::cos:
    case OpKind::floor:  // exact in any dtype
    case OpKind::ceil:
    case OpKind::round:
    case OpKind::clip:
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::max:
    case OpKind::min:
    case OpKind::reduce_max:  // exact in any dtype
    case OpKind::arg_max:     // compares only
    case OpKind::arg_min:
    case OpKind::top_k:  // compares and copies
      FUSEBOX_LOGIC_OPS(FUSEBOX_OP_CASE)
    case OpKind::where:
    case OpKind::max_pool:
    case OpKind::avg_pool:
    case OpKind::global_avg_pool:  // adaptive_avg_pool2d: on no list
    case OpKind::reshape:
    case OpKind::flatten:
    case OpKind::transpose:
    case OpKind::concat:
    case OpKind::slice:
    case OpKind::pad:
    case OpKind::squeeze:
    case OpKind::unsqueeze:
    case OpKind::identity:
    case OpKind::expand:
    case OpKind::gather:  // moves data; the indices are integers
    case OpKind::gather_elements:
    case OpKind::resize:    // a weighted sum of a few taps, summed in f32 by the kernels
    case OpKind::cast:      // its target dtype is explicit
    case OpKind::constant:  // no inputs; its readers cast it (folded: see Rewriter::cast)
      return AutocastRule::follow;
    // Emitted by autodiff or the step graph, after this pass: seen here, they keep the
    // dtypes they were built for.
    case OpKind::conv_backward_filter:
      FUSEBOX_BACKWARD_OPS(FUSEBOX_OP_CASE)
    case OpKind::sgd_update:
    case OpKind::adamw_update:
    case OpKind::nonfinite_any:
    case OpKind::loss_scale_update:
    case OpKind::all_reduce:
    case OpKind::fused_pointwise:  // formed after this pass (passes/fuse_pointwise.h)
    case OpKind::attention:        // likewise (passes/fusion.h)
      return AutocastRule::keep;
  }
  return AutocastRule::keep;
}

namespace {

class Rewriter {
 public:
  Rewriter(const Graph& src, DType low, const MixedPrecisionOptions& opts,
           MixedPrecisionReport& report)
      : src_(src),
        rewriter_(src),
        dst_(rewriter_.graph()),
        low_(low),
        opts_(opts),
        report_(report),
        outputs_(src.outputs().begin(), src.outputs().end()) {}

  Graph run() {
    for (const Node& n : src_.nodes()) rewrite(n);
    // Constants nothing read stay; those read only through folded casts are gone.
    std::set<ValueId> folded;
    for (const auto& [key, v] : folded_) folded.insert(key.first);
    for (const auto& [v, t] : src_.constants())
      if (rewriter_.lookup(v) == kNoValue && !folded.count(v)) rewriter_.mapped(v);
    return rewriter_.finish([&](ValueId v) { return as(v, original(v)); });
  }

 private:
  DType original(ValueId src_v) const { return src_.value(src_v).type.dtype; }
  DType now(ValueId dst_v) const { return dst_.value(dst_v).type.dtype; }
  // A source value's dtype in the rewrite so far (a constant not copied yet: its own).
  DType current(ValueId src_v) const {
    const ValueId m = rewriter_.lookup(src_v);
    return m == kNoValue ? original(src_v) : now(m);
  }

  // A name that neither graph uses, so that no later source value's name is taken.
  std::string fresh(const std::string& base) const { return rewriter_.fresh_name(base); }

  // Source value src_v in dtype `to`: itself, folded (a graph constant, with
  // fold_constants: the f32 original is then copied only if something reads it as is) or
  // cast.
  ValueId as(ValueId src_v, DType to) {
    if (opts_.fold_constants && src_.is_constant(src_v) && original(src_v) != to) {
      auto [it, added] = folded_.try_emplace({src_v, to}, kNoValue);
      if (added) {
        it->second = dst_.add_constant(fresh(cat(src_.value(src_v).name, ":", dtype_name(to))),
                                       src_.constant(src_v)->cast(to));
        ++report_.constants_folded;
      }
      return it->second;
    }
    return cast(rewriter_.mapped(src_v), to);
  }

  // v (a rewritten value) in dtype `to`: itself, or one shared cast per (v, to). A
  // `constant` node's output (a literal, never a trained parameter) is folded into a new
  // constant node.
  ValueId cast(ValueId v, DType to) {
    if (now(v) == to) return v;
    auto [it, added] = casts_.try_emplace({v, to}, kNoValue);
    if (!added) return it->second;
    const std::string name = fresh(cat(dst_.value(v).name, ":", dtype_name(to)));
    const NodeId producer = dst_.value(v).producer;
    if (producer >= 0 && dst_.node(producer).op == OpKind::constant) {
      const Tensor& t = std::get<ConstantAttrs>(dst_.node(producer).attrs).value;
      it->second = dst_.add_node(OpKind::constant, ConstantAttrs{t.cast(to)}, {}, name, {name})[0];
      ++report_.constants_folded;
    } else {
      it->second = dst_.add_node(OpKind::cast, CastAttrs{to}, {v}, name, {name})[0];
      ++report_.casts_inserted;
    }
    return it->second;
  }

  // The node's inputs as its rule wants them (kNoValue stays absent).
  std::vector<ValueId> inputs_for(const Node& n, AutocastRule rule) {
    // Promotion (follow), as PyTorch's type promotion: the inputs that were f32 run in f32
    // when one of them with dims still is; a rank-0 one (a scalar) does not decide the
    // dtype and joins low-precision operands instead. With fold_constants (inference) a
    // graph constant does not decide it either: it is folded to the low dtype beside a low
    // operand, as in a model whose weights are all low (PyTorch's model.to(bfloat16), what
    // users deploy). Why: ViT-B/16's class token and position embedding (f32 constants) made
    // its whole residual stream f32 under autocast's rule: every residual add and layer
    // norm moved twice the bytes.
    bool any_f32 = false, any_low = false;
    for (ValueId v : n.inputs) {
      if (v == kNoValue) continue;
      any_low = any_low || current(v) == low_;
      const bool folds = opts_.fold_constants && src_.is_constant(v);
      any_f32 = any_f32 || (original(v) == DType::f32 && current(v) == DType::f32 &&
                            !src_.value(v).type.shape.empty() && !folds);
    }
    std::vector<ValueId> in;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (v == kNoValue) {
        in.push_back(kNoValue);
        continue;
      }
      DType want = current(v);
      switch (rule) {
        case AutocastRule::low:
          if (want == DType::f32) want = low_;
          break;
        case AutocastRule::f32:
          if (want == low_) want = DType::f32;
          break;
        case AutocastRule::follow:
          if (any_f32 && want == low_) want = DType::f32;
          if (!any_f32 && any_low && want == DType::f32) want = low_;  // f32 scalars only
          break;
        case AutocastRule::batch_norm:  // x as it comes; scale, bias, statistics as they were
          if (i > 0) want = original(v);
          break;
        case AutocastRule::keep:
          want = original(v);
          break;
      }
      in.push_back(as(v, want));
    }
    return in;
  }

  void rewrite(const Node& n) {
    const AutocastRule rule = autocast_rule(n.op);
    std::vector<ValueId> inputs = inputs_for(n, rule);
    const std::vector<std::string> names = rewriter_.output_names(n);
    const std::vector<ValueId> outs = rewriter_.emit(n, n.op, n.attrs, std::move(inputs), names);
    FUSEBOX_CHECK(outs.size() == n.outputs.size(), node_label(n), "internal: the rewrite has ",
                  outs.size(), " outputs instead of ", n.outputs.size());
    count(rule, outs.empty() ? DType::boolean : now(outs[0]));
    for (size_t i = 0; i < outs.size(); ++i) {
      const DType was = original(n.outputs[i]);
      if (!outputs_.count(n.outputs[i]) || now(outs[i]) == was) continue;
      // A graph output keeps its name and dtype: the cast back takes both.
      const std::string name = names[i];
      dst_.rename_value(outs[i], fresh(cat(name, ":", dtype_name(now(outs[i])))));
      casts_[{outs[i], was}] = dst_.add_node(OpKind::cast, CastAttrs{was}, {outs[i]},
                                             cat(name, ":", dtype_name(was)), {name})[0];
      ++report_.casts_inserted;
      ++report_.outputs_cast;
    }
  }

  void count(AutocastRule rule, DType out) {
    const bool low = out == low_, f32 = out == DType::f32;
    switch (rule) {
      case AutocastRule::low:
        report_.ops_low += low;
        break;
      case AutocastRule::f32:
        report_.ops_f32 += f32;
        break;
      case AutocastRule::follow:
      case AutocastRule::batch_norm:
        report_.ops_follow_low += low;
        report_.ops_follow_f32 += f32;
        break;
      case AutocastRule::keep:
        break;
    }
  }

  const Graph& src_;
  GraphRewriter rewriter_;  // source value -> rewritten value
  Graph& dst_;              // the rewriter's graph
  const DType low_;
  const MixedPrecisionOptions& opts_;
  MixedPrecisionReport& report_;
  std::set<ValueId> outputs_;  // the source's graph outputs
  // (rewritten value, dtype) -> its cast (or folded constant node).
  std::map<std::pair<ValueId, DType>, ValueId> casts_;
  // (source graph constant, dtype) -> its folded copy (fold_constants).
  std::map<std::pair<ValueId, DType>, ValueId> folded_;
};

}  // namespace

Graph apply_mixed_precision(const Graph& forward, Precision p, MixedPrecisionReport* report,
                            const MixedPrecisionOptions& opts) {
  MixedPrecisionReport local;
  MixedPrecisionReport& r = report ? *report : local;
  r = {};
  const DType low = precision_dtype(p);
  if (low == DType::f32) return forward;
  Graph out = Rewriter(forward, low, opts, r).run();
  out.verify();
  return out;
}

}  // namespace fusebox
