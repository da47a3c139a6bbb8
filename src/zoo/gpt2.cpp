// A GPT-2-style decoder with Hugging Face's GPT2LMHeadModel names and layout: gpt2 (12
// layers, width 768, 12 heads, vocabulary 50257, 1024 positions: 124M parameters) and
// gpt2_test (2 layers, width 64, 4 heads, vocabulary 128, 32 positions: tests, CPU runs).
//
//   h = wte[input] + wpe[0..T)                        (an embedding gather, i64 token ids)
//   each h.i: h += c_proj(attention(ln_1(h)));  h += mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(h))))
//   logits = ln_f(h) wte^T                             (the head tied to the embedding)
//
// Attention is written as Hugging Face's eager form, q k^T / sqrt(d) -> where(causal mask,
// s, f32 min) -> softmax -> v, so that the ONNX export reads as a transformers export would,
// and fuse_attention turns it into one causal attention (cuDNN's SDPA on the GPU). c_attn,
// c_proj and c_fc are HF's Conv1D: weight [in, out], y = x W + b. Weights ~N(0, 0.02^2),
// the residual projections N(0, (0.02 / sqrt(2 layers))^2) (GPT-2's init), biases 0,
// LayerNorm scale 1. Input "input" i64 [batch, T]; output "logits" [batch, vocab, T]: classes
// on dim 1, so cross_entropy takes labels [batch, T] (`fusebox train` on token data).
#include <cmath>
#include <limits>

#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

struct Gpt2Config {
  int64_t layers, width, heads, vocab, positions;
};

Gpt2Config config_of(const std::string& name) {
  if (name == "gpt2") return {12, 768, 12, 50257, 1024};
  return {2, 64, 4, 128, 32};  // gpt2_test
}

class Gpt2 {
 public:
  Gpt2(Graph& g, const ZooOptions& opts) : g_(g), l_(g, opts), b_(l_.builder()), opts_(opts) {}

  // HF's Conv1D on [B, T, in]: one gemm over the B*T rows, weight [in, out].
  ValueId conv1d(ValueId x, const std::string& name, int64_t out, double stddev) {
    const Shape s = g_.value(x).type.shape;
    const int64_t in = s.back(), rows = s[0] * s[1];
    const ValueId w = l_.normal_parameter(name + ".weight", {in, out}, stddev);
    const ValueId bias = l_.filled_parameter(name + ".bias", {out}, 0.0);
    const ValueId flat = b_.name(name + ".rows").reshape(x, {rows, in});
    const ValueId y = b_.name(name).gemm(flat, w, bias);
    return b_.name(name + ".unrows").reshape(y, {s[0], s[1], out});
  }

  ValueId attention(ValueId x, const std::string& name, const Gpt2Config& c, ValueId mask) {
    const ValueId qkv = conv1d(x, name + ".c_attn", 3 * c.width, 0.02);
    const auto [q, k, v] = l_.split_heads(qkv, name, c.heads);
    const ValueId scaled = l_.scaled_scores(q, k, name);
    const ValueId fill = l_.scalar(double(std::numeric_limits<float>::lowest()));
    const ValueId masked =
        b_.name(name + ".causal").op(OpKind::where, {}, {mask, scaled, fill}).at(0);
    const ValueId context = l_.attend(masked, v, name);
    return conv1d(context, name + ".c_proj", c.width, 0.02 / std::sqrt(2.0 * double(c.layers)));
  }

  void build(const Gpt2Config& c, int64_t tokens) {
    const ValueId ids = g_.add_input("input", DType::i64, {opts_.batch, tokens});
    const ValueId wte = l_.normal_parameter("transformer.wte.weight", {c.vocab, c.width}, 0.02);
    const ValueId wpe = l_.normal_parameter("transformer.wpe.weight", {c.positions, c.width}, 0.01);
    const ValueId embedded =
        b_.name("transformer.wte").op(OpKind::gather, GatherAttrs{0}, {wte, ids}).at(0);
    const ValueId positions =
        b_.name("transformer.wpe").slice(wpe, SliceAttrs{{0}, {tokens}, {0}, {1}});
    ValueId h = b_.name("transformer.embed_add").add(embedded, positions);
    // HF's causal mask buffer: key j visible to query i where j <= i.
    Tensor lower = Tensor::empty(DType::boolean, {tokens, tokens});
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t j = 0; j < tokens; ++j) lower.data<bool>()[i * tokens + j] = j <= i;
    const ValueId mask = g_.add_constant("transformer.causal_mask", lower);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string layer = "transformer.h." + std::to_string(i);
      const ValueId a =
          attention(l_.layer_norm(h, layer + ".ln_1", 1e-5), layer + ".attn", c, mask);
      h = b_.name(layer + ".attn_add").add(h, a);
      ValueId m =
          conv1d(l_.layer_norm(h, layer + ".ln_2", 1e-5), layer + ".mlp.c_fc", 4 * c.width, 0.02);
      m = b_.name(layer + ".mlp.act").gelu(m, /*tanh_approximation=*/true);
      m = conv1d(m, layer + ".mlp.c_proj", c.width, 0.02 / std::sqrt(2.0 * double(c.layers)));
      h = b_.name(layer + ".mlp_add").add(h, m);
    }
    h = l_.layer_norm(h, "transformer.ln_f", 1e-5);
    const ValueId head = b_.name("lm_head.tied").transpose(wte, {1, 0});  // [width, vocab]
    const ValueId logits = b_.name("lm_head").matmul(h, head);            // [B, T, vocab]
    l_.mark_logits(b_.name("logits_classes_first").transpose(logits, {0, 2, 1}));
  }

 private:
  Graph& g_;
  Layers l_;
  Builder& b_;
  ZooOptions opts_;
};

}  // namespace

Graph build_gpt2(const std::string& name, const ZooOptions& opts) {
  const Gpt2Config c = config_of(name);
  const int64_t tokens = opts.sequence_length > 0 ? opts.sequence_length : c.positions;
  FUSEBOX_CHECK(tokens <= c.positions, "zoo " + name, "sequence length ", tokens,
                " exceeds the model's ", c.positions, " positions");
  Graph g(name);
  Gpt2(g, opts).build(c, tokens);
  return g;
}

}  // namespace fusebox::zoo
