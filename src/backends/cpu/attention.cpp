// attention and attention_backward (ir/ops.h), in f64, rounded once into the outputs.
//
// Forward, per leading index (batch, head) and query row i, rows in parallel:
//   s_j = scale q_i . k_j + bias_ij (the kept keys), lse_i = log sum_j exp(s_j),
//   y_i = sum_j p_j v_j with p_j = exp(s_j - lse_i).
// Backward, per leading index (its rows write dk and dv together, so leading indices run in
// parallel and rows in order): p_j again from lse, D_i = dy_i . y_i, ds_j = p_j (dy_i . v_j -
// D_i); dq_i = scale sum_j ds_j k_j, dk_j += scale ds_j q_i, dv_j += p_j dy_i; dbias = ds
// summed over the dims the bias broadcasts (a full [lead, Tq, Tk] ds first, then the sums).
#include <cmath>
#include <limits>
#include <vector>

#include "fusebox/core/parallel.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

struct Dims {
  int64_t lead, tq, tk, d, dv;
};

// The scores' shape [lead dims..., Tq, Tk].
Shape scores_shape(const Tensor& q, const Tensor& k) {
  Shape s = q.shape();
  s.back() = k.shape()[s.size() - 2];
  return s;
}

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  const size_t r = q.shape().size();
  // lead from the shape, not numel / (Tq * d): a head dim of 0 (scores of the bias alone)
  // still has its rows.
  return {numel(Shape(q.shape().begin(), q.shape().end() - 2)), q.shape()[r - 2], k.shape()[r - 2],
          q.shape()[r - 1], v.shape()[r - 1]};
}

int64_t kept_keys(const AttentionAttrs& a, const Dims& m, int64_t i) {
  return a.causal ? std::min(m.tk, i + 1) : m.tk;
}

// s_j = scale q_i . k_j + bias_j (bias_row: the row's Tk biases, or null) for the kept keys
// into `s`; returns their log-sum-exp.
template <class T>
double scores(const AttentionAttrs& a, const Dims& m, const T* qi, const T* kb,
              const double* bias_row, int64_t keys, std::vector<double>& s) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < m.d; ++c)
      dot += double(to_compute(qi[c])) * double(to_compute(kb[j * m.d + c]));
    s[size_t(j)] = a.scale * dot + (bias_row ? bias_row[j] : 0.0);
    mx = std::max(mx, s[size_t(j)]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) sum += std::exp(s[size_t(j)] - mx);
  return mx + std::log(sum);
}

}  // namespace

void attention(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AttentionAttrs>(n.attrs);
  const Tensor &q = *in[0], &k = *in[1], &v = *in[2];
  const Dims m = dims_of(q, k, v);
  const std::vector<double> bias =
      in.size() > 3 ? broadcast_values<double>(*in[3], scores_shape(q, k)) : std::vector<double>{};
  visit_float(n, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T* py = out[0].data<T>();
    float* plse = a.with_lse ? out[1].data<float>() : nullptr;
    parallel_for(m.lead * m.tq, 4, [&](int64_t begin, int64_t end) {
      std::vector<double> s(static_cast<size_t>(m.tk)), acc(static_cast<size_t>(m.dv));
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / m.tq, i = row % m.tq, keys = kept_keys(a, m, i);
        const double* bias_row = bias.empty() ? nullptr : bias.data() + row * m.tk;
        const double lse = scores(a, m, pq + row * m.d, pk + b * m.tk * m.d, bias_row, keys, s);
        std::fill(acc.begin(), acc.end(), 0.0);
        const T* vb = pv + b * m.tk * m.dv;
        for (int64_t j = 0; j < keys; ++j) {
          const double p = std::exp(s[size_t(j)] - lse);
          for (int64_t c = 0; c < m.dv; ++c)
            acc[size_t(c)] += p * double(to_compute(vb[j * m.dv + c]));
        }
        for (int64_t c = 0; c < m.dv; ++c) py[row * m.dv + c] = convert<T>(acc[size_t(c)]);
        if (plse) plse[row] = float(lse);
      }
    });
  });
}

void attention_backward(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AttentionAttrs>(n.attrs);
  const Tensor &dy = *in[0], &q = *in[1], &k = *in[2], &v = *in[3], &y = *in[4], &lse_t = *in[5];
  const Dims m = dims_of(q, k, v);
  const Shape scores_dims = scores_shape(q, k);
  const std::vector<double> bias =
      in.size() > 6 ? broadcast_values<double>(*in[6], scores_dims) : std::vector<double>{};
  std::vector<double> ds_all(a.bias_grad ? size_t(numel(scores_dims)) : 0, 0.0);
  visit_float(n, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pdy = dy.data<T>(), *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>(),
            *py = y.data<T>();
    const float* plse = lse_t.data<float>();
    T *pdq = out[0].data<T>(), *pdk = out[1].data<T>(), *pdv = out[2].data<T>();
    parallel_for(m.lead, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> s(static_cast<size_t>(m.tk)), dk(static_cast<size_t>(m.tk * m.d)),
          dv(static_cast<size_t>(m.tk * m.dv)), dq(static_cast<size_t>(m.d));
      for (int64_t b = begin; b < end; ++b) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        const T* kb = pk + b * m.tk * m.d;
        const T* vb = pv + b * m.tk * m.dv;
        for (int64_t i = 0; i < m.tq; ++i) {
          const int64_t row = b * m.tq + i, keys = kept_keys(a, m, i);
          const T* qi = pq + row * m.d;
          const T* dyi = pdy + row * m.dv;
          scores(a, m, qi, kb, bias.empty() ? nullptr : bias.data() + row * m.tk, keys, s);
          double D = 0;
          for (int64_t c = 0; c < m.dv; ++c)
            D += double(to_compute(dyi[c])) * double(to_compute(py[row * m.dv + c]));
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < keys; ++j) {
            const double p = std::exp(s[size_t(j)] - double(plse[row]));
            double dp = 0;
            for (int64_t c = 0; c < m.dv; ++c) {
              const double g = double(to_compute(dyi[c]));
              dp += g * double(to_compute(vb[j * m.dv + c]));
              dv[size_t(j * m.dv + c)] += p * g;
            }
            const double ds = p * (dp - D);
            if (!ds_all.empty()) ds_all[size_t(row * m.tk + j)] = ds;
            for (int64_t c = 0; c < m.d; ++c) {
              dq[size_t(c)] += a.scale * ds * double(to_compute(kb[j * m.d + c]));
              dk[size_t(j * m.d + c)] += a.scale * ds * double(to_compute(qi[c]));
            }
          }
          for (int64_t c = 0; c < m.d; ++c) pdq[row * m.d + c] = convert<T>(dq[size_t(c)]);
        }
        for (int64_t e = 0; e < m.tk * m.d; ++e)
          pdk[b * m.tk * m.d + e] = convert<T>(dk[size_t(e)]);
        for (int64_t e = 0; e < m.tk * m.dv; ++e)
          pdv[b * m.tk * m.dv + e] = convert<T>(dv[size_t(e)]);
      }
    });
  });
  if (a.bias_grad) store_values(out[3], sum_to_shape(ds_all, scores_dims, in[6]->shape()));
}

}  // namespace fusebox::cpu
