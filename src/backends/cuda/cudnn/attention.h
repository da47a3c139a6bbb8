// cuDNN's fused attention (SDPA, flash attention) for the attention op (ir/ops.h): the
// plan of one problem, built once per process and kept in memory, and its execution.
// cudnn/attention_graph.cpp is the translation unit that includes cudnn_frontend.h.
//
// Tensor uids: q = 1, k = 2, v = 3, o = 4, lse = 5 (f32 [B, H, Tq, 1]), do = 6, dq = 7,
// dk = 8, dv = 9, bias = 10 and dbias = 11 ([Bb, Hb, Tq, Tk] in the io dtype, Bb 1 or B and
// Hb 1 or H: cuDNN broadcasts those two); every tensor dense (row-major) [B, H, T, d], except
// that q, k, v and do may come with strides of their own (views: a head split of a packed
// projection read where it lies).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/core/dtype.h"

namespace fusebox::cuda {

struct AttentionProblem {
  DType dtype = DType::bf16;
  int64_t batch = 1, heads = 1, tq = 1, tk = 1, d = 1, dv = 1;
  double scale = 1.0;
  bool causal = false;
  int64_t bias_batch = 0, bias_heads = 1;  // the bias [Bb, Hb, Tq, Tk]; Bb = 0: none
  bool bias_grad = false;                  // the backward also writes dbias
  bool with_lse = false;                   // forward: also write lse (training)
  bool backward = false;                   // the backward: dq, dk, dv from do, q, k, v, o, lse
  // Strides (elements) of q, k, v, do and (the backward's input) o over [B, H, T, d]; empty:
  // dense.
  std::vector<int64_t> q_strides, k_strides, v_strides, do_strides, o_strides;
  std::string describe() const;  // "bf16 b64 h12 tq197 tk197 d64 dv64 scale 0.125"
};

// The device addresses a plan reads and writes (null where its direction has none).
struct AttentionBuffers {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;  // written by the forward, read by the backward
  void* lse = nullptr;
  const void* d_o = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const void* bias = nullptr;
  void* dbias = nullptr;
};

struct AttentionPlan;  // a built cudnn-frontend graph (cudnn/attention_graph.cpp)

// The problem's plan from the process's cache, built on first use; nullptr with `why` set
// when cuDNN refuses it (the refusal is cached too). Throws only for CUDA failures.
std::shared_ptr<AttentionPlan> attention_plan(cudnnHandle_t handle, const AttentionProblem& p,
                                              std::string& why);
int64_t attention_workspace_bytes(const AttentionPlan& plan);
// Runs the plan on the handle's stream; false with `why` when cuDNN reports a failure.
bool execute_attention(AttentionPlan& plan, cudnnHandle_t handle, const AttentionBuffers& b,
                       void* workspace, std::string& why);

}  // namespace fusebox::cuda
