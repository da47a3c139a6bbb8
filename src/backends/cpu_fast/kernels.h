// The fast kernels' planners, one per op family (plan.cpp's table calls them).
#pragma once

#include "fusebox/backends/cpu_fast.h"

namespace fusebox::cpu_fast {

Planned plan_conv(const Graph& g, const Node& n);                // conv.cpp
Planned plan_winograd_conv(const Graph& g, const Node& n);       // winograd.cpp (plan_conv's first)
Planned plan_conv_backward_data(const Graph& g, const Node& n);  // conv.cpp
Planned plan_conv_backward_filter(const Graph& g, const Node& n);  // conv.cpp
Planned plan_gemm(const Graph& g, const Node& n);                  // matmul.cpp
Planned plan_matmul(const Graph& g, const Node& n);                // matmul.cpp
Planned plan_pool(const Graph& g, const Node& n);                  // pool.cpp: max, average, global
Planned plan_softmax(const Graph& g, const Node& n);               // norm.cpp: softmax, log_softmax
Planned plan_layer_norm(const Graph& g, const Node& n);            // norm.cpp
Planned plan_eltwise(const Graph& g, const Node& n);               // eltwise.cpp: unary activations
Planned plan_binary(const Graph& g, const Node& n);     // eltwise.cpp: add, sub, mul, div
Planned plan_attention(const Graph& g, const Node& n);  // attention.cpp: inference
Planned plan_transpose(const Graph& g, const Node& n);  // copy.cpp: a reorder
Planned plan_slice(const Graph& g, const Node& n);      // copy.cpp: a reorder
// Not on oneDNN: a block interpreter of the program, in every build.
Planned plan_fused_pointwise(const Graph& g, const Node& n);  // pointwise.cpp
// Not on oneDNN: the training batch norms (batch_norm, batch_norm_backward), in every build.
Planned plan_batch_norm(const Graph& g, const Node& n);  // batch_norm.cpp
// Not on oneDNN: sgd_update and adamw_update, in every build.
Planned plan_optimizer_update(const Graph& g, const Node& n);  // optimizer.cpp
// Not on oneDNN: max_pool_backward of 2-D f32 pools, in every build.
Planned plan_max_pool_backward(const Graph& g, const Node& n);  // pool_backward.cpp

}  // namespace fusebox::cpu_fast
