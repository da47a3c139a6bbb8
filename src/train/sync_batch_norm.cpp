// Synchronized batch norm (session.h DataParallel::sync_batch_norm): each training batch_norm
// of the step graph, before autodiff, becomes its computation over the whole step's batch,
// every rank's shard together:
//
//   xf = x in its compute type (f32 for f16 / bf16 activations, as the fused kernels)
//   mean = all_reduce_mean(reduce_mean(xf))              per channel, [1, C, 1...]
//   d = xf - mean
//   var = all_reduce_mean(reduce_mean(d * d))            population variance: two passes, as
//                                                        the fused kernels' Welford (no
//                                                        E[x^2] - E[x]^2 cancellation)
//   y = d * (rsqrt(var + eps) * scale) + bias            rounded to x's dtype
//   running = running * momentum + batch * (1 - momentum)   (ops.h batch_norm)
//
// The ranks' shards have one size, so the mean of the ranks' means is the batch mean and the
// mean of their centred second moments is the batch variance. Autodiff then derives the
// synchronized backward from these ops (all_reduce's VJP reduces the cotangents the same
// way), so no hand-written backward is needed. The relu and residual fusions find no
// batch_norm to fuse afterwards; fuse_pointwise (CUDA) fuses the pointwise chains.
#include "train/sync_batch_norm.h"

#include "fusebox/ir/builder.h"
#include "passes/fusion_rewrite.h"

namespace fusebox::train {

std::vector<std::pair<std::string, std::string>> synchronize_batch_norms(Graph& g) {
  std::vector<std::pair<std::string, std::string>> statistics;
  const Graph& src = g;  // read while the rebuild runs; replaced at its end
  fusion::rebuild_expanding(
      g,
      [&](const Node& n, Graph& out,
          const std::function<ValueId(ValueId)>& mapped) -> std::optional<std::vector<ValueId>> {
        if (n.op != OpKind::batch_norm) return std::nullopt;
        const auto& a = std::get<BatchNormAttrs>(n.attrs);
        if (!a.training) return std::nullopt;
        FUSEBOX_CHECK(!a.relu && (n.inputs.size() < 6 || n.inputs[5] == kNoValue),
                      "sync batch norm", node_label(n),
                      " is already fused with its relu or residual: synchronize first");
        const ValueId x = mapped(n.inputs[0]), scale = mapped(n.inputs[1]),
                      bias = mapped(n.inputs[2]), running_mean = mapped(n.inputs[3]),
                      running_var = mapped(n.inputs[4]);
        const TensorType xt = out.value(x).type;
        const DType stats = out.value(running_mean).type.dtype;  // the per-channel dtype
        const DType compute = xt.dtype == DType::f64 ? DType::f64 : DType::f32;
        const int64_t rank = int64_t(xt.shape.size()), channels = xt.shape.at(1);
        std::vector<int64_t> axes = {0};
        for (int64_t d = 2; d < rank; ++d) axes.push_back(d);
        std::vector<int64_t> per_channel(size_t(rank), 1);  // [1, C, 1...]
        per_channel[1] = channels;

        // One node per statement: Builder::name names the next node made.
        Builder b(out);
        const std::string prefix = n.name + "/sync";
        auto named = [&](const std::string& part) -> Builder& {
          return b.name(prefix + "/" + part);
        };
        auto in_compute = [&](ValueId v, const std::string& part) {
          return out.value(v).type.dtype == compute ? v : named(part).cast(v, compute);
        };
        auto literal = [&](double value) { return b.constant(Tensor::scalar(compute, value)); };
        auto across_ranks = [&](ValueId v, const std::string& part) {
          return out.add_node(OpKind::all_reduce, AllReduceAttrs{}, {v}, prefix + "/" + part)[0];
        };

        const ValueId xf = in_compute(x, "x");
        const ValueId local_mean = named("local_mean").reduce_mean(xf, axes);
        const ValueId mean = across_ranks(local_mean, "mean");
        const ValueId d = named("centred").sub(xf, mean);
        const ValueId square = named("square").mul(d, d);
        const ValueId local_var = named("local_var").reduce_mean(square, axes);
        const ValueId var = across_ranks(local_var, "var");
        const ValueId eps = literal(a.epsilon);
        const ValueId var_eps = named("var_eps").add(var, eps);
        const ValueId inv_std = named("inv_std").rsqrt(var_eps);
        const ValueId scale_c = in_compute(scale, "scale_cast");
        const ValueId scale_b = named("scale").reshape(scale_c, per_channel);
        const ValueId k = named("k").mul(inv_std, scale_b);
        const ValueId bias_c = in_compute(bias, "bias_cast");
        const ValueId bias_b = named("bias").reshape(bias_c, per_channel);
        const ValueId dk = named("dk").mul(d, k);
        ValueId y = named("y").add(dk, bias_b);
        if (xt.dtype != compute) y = named("y_cast").cast(y, xt.dtype);
        out.rename_value(y, src.value(n.outputs[0]).name);

        // The running statistics, in their own dtype.
        const ValueId keep = literal(a.momentum), take = literal(1.0 - a.momentum);
        auto running = [&](ValueId old, ValueId batch, const std::string& part) {
          const ValueId batch_c = named(part + "/batch").reshape(batch, {channels});
          const ValueId old_c = in_compute(old, part + "/cast");
          const ValueId kept = named(part + "/kept").mul(old_c, keep);
          const ValueId taken = named(part + "/taken").mul(batch_c, take);
          ValueId next = named(part + "/blend").add(kept, taken);
          if (out.value(next).type.dtype != stats) next = named(part + "/round").cast(next, stats);
          const std::string name = prefix + "/next_" + part;
          out.rename_value(next, name);
          statistics.push_back({out.value(old).name, name});
          return next;
        };
        const ValueId next_mean = running(running_mean, mean, "running_mean");
        const ValueId next_var = running(running_var, var, "running_var");
        // saved_mean and saved_inv_std: only the fused backward reads them, and there is none.
        return std::vector<ValueId>{y, next_mean, next_var, kNoValue, kNoValue};
      });
  return statistics;
}

}  // namespace fusebox::train
