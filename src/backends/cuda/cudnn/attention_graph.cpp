// cuDNN's fused attention through cudnn-frontend's SDPA nodes (cudnn/attention.h): the
// forward (with the softmax statistics lse for training) and the backward; f32 scores and
// softmax, io in the problem's dtype.
#include <cudnn_frontend.h>

#include <map>
#include <mutex>

#include "backends/cuda/cudnn/attention.h"
#include "backends/cuda/cudnn/plan.h"  // one_line, CudnnRefused
#include "fusebox/core/error.h"
#include "fusebox/core/shape.h"

namespace fusebox::cuda {

namespace fe = cudnn_frontend;

struct AttentionPlan {
  fe::graph::Graph graph;
  int64_t workspace = 0;
};

namespace {

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidLse = 5, kUidDo = 6, kUidDq = 7,
                  kUidDk = 8, kUidDv = 9, kUidBias = 10, kUidDbias = 11;

void check_fe(fe::error_t status, const char* step) {
  if (status.is_bad()) throw CudnnRefused{cat(step, ": ", one_line(status.get_message()))};
}

std::shared_ptr<AttentionPlan> build(cudnnHandle_t handle, const AttentionProblem& p) {
  if (p.dtype != DType::bf16 && p.dtype != DType::f16)
    throw CudnnRefused{cat("cuDNN's fused attention takes bf16 or f16, not ", dtype_name(p.dtype))};
  auto plan = std::make_shared<AttentionPlan>();
  fe::graph::Graph& g = plan->graph;
  const fe::DataType_t io =
      p.dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  g.set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, std::vector<int64_t> dims,
                    const std::vector<int64_t>& given = {}) {
    const std::vector<int64_t> strides = given.empty() ? contiguous_strides(dims) : given;
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(std::move(dims))
                        .set_stride(strides));
  };
  auto q = tensor("q", kUidQ, {p.batch, p.heads, p.tq, p.d}, p.q_strides);
  auto k = tensor("k", kUidK, {p.batch, p.heads, p.tk, p.d}, p.k_strides);
  auto v = tensor("v", kUidV, {p.batch, p.heads, p.tk, p.dv}, p.v_strides);
  const std::vector<int64_t> o_dims = {p.batch, p.heads, p.tq, p.dv},
                             lse_dims = {p.batch, p.heads, p.tq, 1},
                             bias_dims = {p.bias_batch, p.bias_heads, p.tq, p.tk};
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (p.bias_batch > 0) bias = tensor("bias", kUidBias, bias_dims);
  if (!p.backward) {
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("attention")
                          .set_generate_stats(p.with_lse)
                          .set_attn_scale(float(p.scale));
    if (p.causal) attributes.set_causal_mask(true);
    if (bias) attributes.set_bias(bias);
    auto [o, stats] = g.sdpa(q, k, v, attributes);
    o->set_output(true).set_uid(kUidO).set_dim(o_dims).set_stride(contiguous_strides(o_dims));
    if (p.with_lse)
      stats->set_output(true)
          .set_uid(kUidLse)
          .set_dim(lse_dims)
          .set_stride(contiguous_strides(lse_dims))
          .set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = tensor("o", kUidO, o_dims, p.o_strides);
    auto d_o = tensor("do", kUidDo, o_dims, p.do_strides);
    auto lse = tensor("lse", kUidLse, lse_dims);
    lse->set_data_type(fe::DataType_t::FLOAT);
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("attention_backward")
                          .set_attn_scale(float(p.scale));
    if (p.causal) attributes.set_causal_mask(true);
    if (bias) attributes.set_bias(bias);
    if (p.bias_grad) attributes.set_dbias(tensor("dbias", kUidDbias, bias_dims));
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, d_o, lse, attributes);
    dq->set_output(true)
        .set_uid(kUidDq)
        .set_dim({p.batch, p.heads, p.tq, p.d})
        .set_stride(contiguous_strides({p.batch, p.heads, p.tq, p.d}));
    dk->set_output(true)
        .set_uid(kUidDk)
        .set_dim({p.batch, p.heads, p.tk, p.d})
        .set_stride(contiguous_strides({p.batch, p.heads, p.tk, p.d}));
    dv->set_output(true)
        .set_uid(kUidDv)
        .set_dim({p.batch, p.heads, p.tk, p.dv})
        .set_stride(contiguous_strides({p.batch, p.heads, p.tk, p.dv}));
  }
  check_fe(g.validate(), "validate");
  check_fe(g.build_operation_graph(handle), "build_operation_graph");
  check_fe(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check_fe(g.check_support(handle), "check_support");
  check_fe(g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  int64_t workspace = 0;
  check_fe(g.get_workspace_size(workspace), "get_workspace_size");
  plan->workspace = workspace;
  return plan;
}

struct Cached {
  std::shared_ptr<AttentionPlan> plan;
  std::string why;
};

}  // namespace

std::string AttentionProblem::describe() const {
  auto strides = [](const char* name, const std::vector<int64_t>& s) {
    return s.empty() ? std::string()
                     : cat(" ", name, " strides [", s[0], ", ", s[1], ", ", s[2], ", ", s[3], "]");
  };
  return cat(backward ? "backward " : "", dtype_name(dtype), " b", batch, " h", heads, " tq", tq,
             " tk", tk, " d", d, " dv", dv, " scale ", scale, causal ? " causal" : "",
             bias_batch > 0 ? cat(" bias [", bias_batch, ", ", bias_heads, ", ", tq, ", ", tk, "]")
                            : std::string(),
             bias_grad ? " dbias" : "", with_lse && !backward ? " with lse" : "",
             strides("q", q_strides), strides("k", k_strides), strides("v", v_strides),
             strides("do", do_strides), strides("o", o_strides));
}

std::shared_ptr<AttentionPlan> attention_plan(cudnnHandle_t handle, const AttentionProblem& p,
                                              std::string& why) {
  static std::mutex mutex;
  static std::map<std::string, Cached> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::string key = p.describe();
  auto it = cache.find(key);
  if (it == cache.end()) {
    Cached c;
    try {
      c.plan = build(handle, p);
    } catch (const CudnnRefused& r) {
      c.why = r.message;
    } catch (const fe::cudnnException& e) {
      c.why = one_line(e.what());
    }
    it = cache.emplace(key, std::move(c)).first;
  }
  why = it->second.why;
  return it->second.plan;
}

int64_t attention_workspace_bytes(const AttentionPlan& plan) {
  return plan.workspace;
}

bool execute_attention(AttentionPlan& plan, cudnnHandle_t handle, const AttentionBuffers& b,
                       void* workspace, std::string& why) {
  std::unordered_map<int64_t, void*> pack;
  auto bind = [&](int64_t uid, const void* p) {
    if (p != nullptr) pack[uid] = const_cast<void*>(p);
  };
  bind(kUidQ, b.q), bind(kUidK, b.k), bind(kUidV, b.v), bind(kUidO, b.o), bind(kUidLse, b.lse);
  bind(kUidDo, b.d_o), bind(kUidDq, b.dq), bind(kUidDk, b.dk), bind(kUidDv, b.dv);
  bind(kUidBias, b.bias), bind(kUidDbias, b.dbias);
  fe::error_t status = plan.graph.execute(handle, pack, workspace);
  if (status.is_bad()) why = one_line(status.get_message());
  return status.is_good();
}

}  // namespace fusebox::cuda
