// Vision transformers (torchvision's VisionTransformer layout and names): vit_b_16 (patch 16,
// width 768, 12 layers of 12 heads, MLP 3072) and vit_test (patch 8, width 64, 2 layers of 4
// heads, MLP 256: the small one the tests and CPU runs use).
//
//   patches = conv_proj(x) (kernel = stride = patch) -> [B, N, D]
//   h = concat(class_token, patches) + encoder.pos_embedding
//   each encoder_layer_i: h += self_attention(ln_1(h)); h += mlp(ln_2(h)) (Linear, GELU, Linear)
//   logits = heads.head(encoder.ln(h)[:, 0])
// Attention is spelled out (in_proj, per-head q k^T / sqrt(d), softmax, v, out_proj), the form
// an ONNX export of it has. Linear layers on [B, T, C] run as one gemm over B*T rows (with
// its bias: the gemm-epilogue fusion takes it). Weights ~N(0, 0.02^2), LayerNorm scale 1,
// biases 0; eps 1e-6 as torchvision.
#include <cmath>

#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

struct VitConfig {
  int64_t patch, width, layers, heads, mlp;
};

VitConfig config_of(const std::string& name) {
  if (name == "vit_b_16") return {16, 768, 12, 12, 3072};
  return {8, 64, 2, 4, 256};  // vit_test
}

class Vit {
 public:
  Vit(Graph& g, const ZooOptions& opts) : g_(g), l_(g, opts), b_(l_.builder()), opts_(opts) {}

  // Multi-head self-attention over [B, T, D] with torchvision's packed in_proj.
  ValueId attention(ValueId x, const std::string& name, int64_t heads) {
    const int64_t width = g_.value(x).type.shape[2];
    const ValueId qkv = l_.linear(x, name + ".in_proj", 3 * width, name + ".in_proj_weight",
                                  name + ".in_proj_bias");
    const auto [q, k, v] = l_.split_heads(qkv, name, heads);
    const ValueId context = l_.attend(l_.scaled_scores(q, k, name), v, name);
    return l_.linear(context, name + ".out_proj", width);
  }

  void build(const VitConfig& c) {
    const ValueId x = l_.input();
    const int64_t grid = opts_.image_size / c.patch, tokens = grid * grid + 1;
    const ValueId w = l_.normal_parameter("conv_proj.weight", {c.width, 3, c.patch, c.patch}, 0.02);
    const ValueId wb = l_.filled_parameter("conv_proj.bias", {c.width}, 0.0);
    ConvAttrs patchify;
    patchify.strides = {c.patch, c.patch};
    const ValueId p = b_.name("conv_proj").conv(x, w, wb, patchify);
    const ValueId seq = b_.name("patches").reshape(p, {opts_.batch, c.width, grid * grid});
    const ValueId patches = b_.name("patches_t").transpose(seq, {0, 2, 1});
    const ValueId token = l_.normal_parameter("class_token", {1, 1, c.width}, 0.02);
    const ValueId tokens_b =
        g_.add_node(OpKind::expand, ExpandAttrs{{opts_.batch, 1, c.width}}, {token}, "class_tokens")
            .at(0);
    ValueId h = b_.name("tokens").concat({tokens_b, patches}, 1);
    const ValueId pos = l_.normal_parameter("encoder.pos_embedding", {1, tokens, c.width}, 0.02);
    h = b_.name("encoder.pos_add").add(h, pos);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string layer = "encoder.layers.encoder_layer_" + std::to_string(i);
      const ValueId a =
          attention(l_.layer_norm(h, layer + ".ln_1", 1e-6), layer + ".self_attention", c.heads);
      h = b_.name(layer + ".attention_add").add(h, a);
      ValueId m = l_.linear(l_.layer_norm(h, layer + ".ln_2", 1e-6), layer + ".mlp.0", c.mlp);
      m = b_.name(layer + ".mlp.1").gelu(m);
      m = l_.linear(m, layer + ".mlp.3", c.width);
      h = b_.name(layer + ".mlp_add").add(h, m);
    }
    h = l_.layer_norm(h, "encoder.ln", 1e-6);
    const ValueId cls = b_.name("class_slice").slice(h, SliceAttrs{{0}, {1}, {1}, {1}});
    const ValueId feature = b_.name("class_feature").reshape(cls, {opts_.batch, c.width});
    l_.logits(feature, "heads.head", opts_.num_classes);
  }

 private:
  Graph& g_;
  Layers l_;
  Builder& b_;
  ZooOptions opts_;
};

}  // namespace

Graph build_vit(const std::string& name, const ZooOptions& opts) {
  const VitConfig c = config_of(name);
  FUSEBOX_CHECK(opts.image_size % c.patch == 0, "zoo " + name, "image size ", opts.image_size,
                " is not a multiple of the patch size ", c.patch);
  Graph g(name);
  Vit(g, opts).build(c);
  return g;
}

}  // namespace fusebox::zoo
