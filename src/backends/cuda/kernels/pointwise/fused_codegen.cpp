#include "backends/cuda/kernels/pointwise/fused_codegen.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/op_info.h"

namespace fusebox::cuda {

namespace {

const char* element_type(DType t) {
  switch (t) {
    case DType::f64:
      return "fb_f64";
    case DType::f32:
      return "fb_f32";
    case DType::f16:
      return "fb_f16";
    case DType::bf16:
      return "fb_bf16";
    default:
      break;
  }
  throw Error("fused_pointwise codegen", cat("no element type for ", dtype_name(t)));
}

const char* compute_type(DType t) {
  return t == DType::f64 ? "double" : "float";
}

// `v` as a literal of the compute type of `t`: exact (hex floats), infinities spelled out.
std::string literal(DType t, double v) {
  char text[64];
  if (t == DType::f64) {
    if (std::isinf(v))
      return v > 0 ? "__longlong_as_double(0x7ff0000000000000LL)"
                   : "__longlong_as_double((long long)0xfff0000000000000ULL)";
    std::snprintf(text, sizeof text, "%a", v);
    return text;
  }
  const float f = float(v);
  if (std::isinf(f))
    return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float((int)0xff800000u)";
  std::snprintf(text, sizeof text, "%af", double(f));
  return text;
}

// Whether rounding `v` (a float value) to `t` leaves it unchanged.
bool exact_in(DType t, double v) {
  const float f = float(v);
  if (std::isinf(f)) return true;
  if (t == DType::bf16) return float(BFloat16(f)) == f;
  if (t == DType::f16) return float(Half(f)) == f;
  return true;
}

// Whether instruction `ins`, whose result has dtype `t`, can give a value that its dtype
// does not hold: the rounding it needs.
bool needs_rounding(const PointwiseInstr& ins, DType t) {
  if (t == DType::f32 || t == DType::f64) return false;
  switch (ins.op) {
    case OpKind::relu:
    case OpKind::neg:
    case OpKind::abs:
    case OpKind::max:
    case OpKind::min:
    case OpKind::cast:  // rounds as it converts
      return false;
    case OpKind::clip:
      return !exact_in(t, ins.min) || !exact_in(t, ins.max);
    default:
      return true;
  }
}

bool is_half(DType t) {
  return t == DType::f16 || t == DType::bf16;
}

// The packed operation (fb_half_type) computing `op` on 16-bit words, or nullptr.
const char* packed_op(OpKind op) {
  switch (op) {
    case OpKind::add:
      return "add2";
    case OpKind::sub:
      return "sub2";
    case OpKind::mul:
      return "mul2";
    case OpKind::max:
      return "max2";
    case OpKind::min:
      return "min2";
    case OpKind::relu:
      return "relu2";
    case OpKind::neg:
      return "neg2";
    case OpKind::abs:
      return "abs2";
    default:
      return nullptr;
  }
}

// Writes the kernel. In a vectorised step every value is either `lanes` (W values: the
// array x<k> / t<i> in its compute type, and for 16-bit dtypes the same lanes packed in
// 32-bit words, x<k>w / t<i>w) or uniform (one value for the step, and one word holding it
// twice). Both forms of a value are written as it is computed (words by rounding, lanes
// by unpacking); the compiler drops the form nothing reads.
class Emitter {
 public:
  explicit Emitter(const FusedKernelSpec& s) : s_(s), p_(s.program), k_(size_t(s.program.inputs)) {}

  std::string source() {
    out_ = header();
    out_ += fused_kernel_preamble();
    out_ += cat("\nextern \"C\" __global__ void __launch_bounds__(256) ", kFusedKernelName,
                "(const FbParams p) {\n");
    out_ += cat("  typedef ", s_.index32 ? "unsigned" : "unsigned long long", " I;\n");
    out_ += "  const I n = (I)p.n;\n";
    out_ += "  const I step = (I)gridDim.x * (I)blockDim.x;\n";
    out_ += "  const I first = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;\n";
    const int w = s_.vector_width;
    if (w > 1) {
      out_ += cat("  const I vectors = n / ", w, ";\n");
      // Unrolled: several steps' loads in flight per thread (memory-level parallelism).
      out_ +=
          cat("#pragma unroll ", s_.unroll, "\n  for (I v = first; v < vectors; v += step) {\n");
      out_ += cat("    const I i = v * ", w, ";\n");
      body(w);
      out_ += "  }\n";
      out_ += cat("  for (I i = vectors * ", w, " + first; i < n; i += step) {\n");
    } else {
      out_ += "  for (I i = first; i < n; i += step) {\n";
    }
    body(1);
    out_ += "  }\n}\n";
    return out_;
  }

 private:
  std::string header() const {
    std::string h =
        "// fusebox generated kernel: fused_pointwise (kernels/pointwise/fused_codegen.h)\n";
    h += "// program: " + pointwise_program_text(p_) + "\n// inputs:";
    for (size_t k = 0; k < k_; ++k)
      h += cat(k ? "," : "", " in", k, " ", dtype_name(s_.values[k]), " ",
               fused_access_name(s_.access[k]), " (moves along dims ", dims_text(s_.moves[k]), ")");
    h += cat("\n// output: ", dtype_name(s_.values.back()), "; ",
             s_.vector_width > 1 ? cat(s_.vector_width, " elements per vectorised step, ",
                                       s_.unroll, " steps per iteration")
                                 : std::string("general path"),
             "; walk rank ", s_.rank, "; ", s_.index32 ? "32" : "64", "-bit index\n");
    return h;
  }

  static std::string dims_text(uint32_t moves) {
    std::string text;
    for (int d = 0; d < kFusedMaxDims; ++d)
      if (moves >> d & 1u) text += cat(text.empty() ? "" : ",", d);
    return text.empty() ? "none" : text;
  }

  // Inputs other than the contiguous ones are read at their own offsets of index i.
  bool by_offset(size_t k) const { return s_.access[k] != FusedAccess::contiguous; }

  // o<k> = the offset of input k at flat index i, for every input read by offset: the
  // coordinates along the dims up to the outermost one any of them moves along.
  void offsets() {
    uint32_t used = 0;
    for (size_t k = 0; k < k_; ++k)
      if (by_offset(k)) used |= s_.moves[k];
    if (used != 0) {
      const int top = 31 - std::countl_zero(used);  // the outermost dim any offset needs
      out_ += "    I r = i;\n";
      for (int d = 0; d <= top; ++d) {
        if (d == s_.rank - 1) {  // the outermost dim: what is left of i
          out_ += cat("    const I c", d, " = r;\n");
          break;
        }
        out_ += cat("    const I q", d, " = ", quotient(d), ";\n");
        if (used >> d & 1u)
          out_ += cat("    const I c", d, " = r - q", d, " * (I)p.extent[", d, "];\n");
        if (d < top) out_ += cat("    r = q", d, ";\n");
      }
    }
    for (size_t k = 0; k < k_; ++k) {
      if (!by_offset(k)) continue;
      std::string sum;
      for (int d = 0; d < s_.rank; ++d)
        if (s_.moves[k] >> d & 1u)
          sum += cat(sum.empty() ? "" : " + ", "(long long)c", d, " * p.stride[", k, "][", d, "]");
      out_ += cat("    const long long o", k, " = ", sum.empty() ? "0" : sum, ";\n");
    }
  }

  std::string quotient(int d) const {
    if (s_.index32) return cat("fb_fastdiv(r, p.div_mul[", d, "], p.div_shift[", d, "])");
    return cat("r / (I)p.extent[", d, "]");
  }

  // Words of a value of dtype t in a step of w lanes.
  static int words(DType t, int w) { return w * int(dtype_size(t)) / 4; }

  // The loads, the instructions and the store of one step of width w.
  void body(int w) {
    offsets();
    lanes_.assign(s_.values.size(), false);
    for (size_t k = 0; k < k_; ++k) {
      const DType t = s_.values[k];
      const char* e = element_type(t);
      const std::string at = s_.access[k] == FusedAccess::contiguous ? "i" : cat("o", k);
      const std::string ptr = cat("static_cast<const ", e, "::S*>(p.in[", k, "])");
      if (w > 1 && s_.access[k] != FusedAccess::uniform) {
        lanes_[k] = true;
        const int n = words(t, w);
        out_ += cat("    unsigned x", k, "w[", n, "];\n    fb_load_words<", n, ">(", ptr, " + ", at,
                    ", x", k, "w);\n");
        out_ += cat("    ", compute_type(t), " x", k, "[", w, "];\n    ", e, "::unpack<", w, ">(x",
                    k, "w, x", k, ");\n");
      } else {
        // Read-only path as fb_load_words (a per-channel value: an L1 hit after the first).
        out_ += cat("    const ", compute_type(t), " x", k, " = ", e, "::load(__ldg(", ptr, " + ",
                    at, "));\n");
        if (w > 1 && is_half(t))
          out_ += cat("    const unsigned x", k, "w = ", e, "::pack2(x", k, ", x", k, ");\n");
      }
    }
    for (size_t i = 0; i < p_.instrs.size(); ++i) instruction(i, w);
    store(w);
  }

  void store(int w) {
    const size_t last = s_.values.size() - 1;
    const DType t = s_.values[last];
    const char* e = element_type(t);
    if (w == 1) {
      out_ += cat("    static_cast<", e, "::S*>(p.out)[i] = ", e, "::store(", name(last), ");\n");
      return;
    }
    const int n = words(t, w);
    std::string value = name(last) + "w";
    if (!lanes_[last]) {  // every input uniform: the one value in every lane
      out_ += cat("    ", compute_type(t), " y[", w, "];\n#pragma unroll\n    for (int j = 0; j < ",
                  w, "; ++j) y[j] = ", name(last), ";\n    unsigned yw[", n, "];\n    ", e,
                  "::pack<", w, ">(y, yw);\n");
      value = "yw";
    }
    out_ += cat("    fb_store_words<", n, ">(static_cast<", e, "::S*>(p.out) + i, ", value, ");\n");
  }

  std::string name(size_t v) const { return v < k_ ? cat("x", v) : cat("t", v - k_); }

  // Value v as lane j (or its one value) in compute type `as` (a conversion where the
  // value's own is the other width: pow's exponent).
  std::string ref(size_t v, DType as) const {
    std::string r = lanes_[v] ? name(v) + "[j]" : name(v);
    if ((s_.values[v] == DType::f64) != (as == DType::f64))
      r = cat("(", compute_type(as), ")(", r, ")");
    return r;
  }
  // Value v's word j (or its one word).
  std::string word(size_t v) const { return lanes_[v] ? name(v) + "w[j]" : name(v) + "w"; }

  std::string expression(const PointwiseInstr& ins, DType t) const {
    const size_t a_value = size_t(ins.operands[0]);
    const std::string a = ref(a_value, ins.op == OpKind::cast ? s_.values[a_value] : t);
    const std::string b = ins.operands.size() > 1 ? ref(size_t(ins.operands[1]), t) : "";
    switch (ins.op) {
      case OpKind::relu:
      case OpKind::silu:
      case OpKind::sigmoid:
      case OpKind::rsqrt:
      case OpKind::reciprocal:
      case OpKind::tanh:
      case OpKind::exp:
      case OpKind::log:
      case OpKind::sqrt:
      case OpKind::erf:
      case OpKind::sin:
      case OpKind::cos:
      case OpKind::floor:
      case OpKind::ceil:
      case OpKind::round:
        return cat("fb_", op_name(ins.op), "(", a, ")");
      case OpKind::abs:
        return cat("fb_abs(", a, ")");
      case OpKind::neg:
        return cat("(-", a, ")");
      case OpKind::leaky_relu:
        return cat("fb_leaky_relu(", a, ", ", literal(t, ins.alpha), ")");
      case OpKind::gelu:
        return cat(ins.tanh_approximation ? "fb_gelu_tanh(" : "fb_gelu(", a, ")");
      case OpKind::clip:
        return cat("fb_clip(", a, ", ", literal(t, ins.min), ", ", literal(t, ins.max), ")");
        FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
        return cat("fb_", op_name(ins.op), "(", a, ", ", b, ")");
      case OpKind::cast:
        return cast(a, s_.values[a_value], t);
      case OpKind::unary_backward:  // dy * f'(x), kernels/pointwise/backward.cu's UnaryGrad
        return cat("fb_mul(", a, ", ", derivative(ins, b, t), ")");
      default:
        break;
    }
    throw Error("fused_pointwise codegen", cat(op_name(ins.op), " is not a pointwise op"));
  }

  // f'(x) of unary_backward's forward op (fused_preamble.cpp: backward.cu's formulas).
  static std::string derivative(const PointwiseInstr& ins, const std::string& x, DType t) {
    switch (ins.of) {
      case OpKind::relu:
      case OpKind::silu:
      case OpKind::sigmoid:
      case OpKind::tanh:
        return cat("fb_", op_name(ins.of), "_grad(", x, ")");
      case OpKind::leaky_relu:
        return cat("fb_leaky_relu_grad(", x, ", ", literal(t, ins.alpha), ")");
      case OpKind::gelu:
        return cat(ins.tanh_approximation ? "fb_gelu_tanh_grad(" : "fb_gelu_grad(", x, ")");
      default:
        break;
    }
    throw Error("fused_pointwise codegen",
                cat("the derivative of ", op_name(ins.of), " is not generated"));
  }

  // a (a value of dtype `from`, in its compute type) converted to `to`, in to's compute type.
  static std::string cast(const std::string& a, DType from, DType to) {
    const bool wide = from == DType::f64;
    switch (to) {
      case DType::f64:
        return wide ? a : cat("(double)(", a, ")");
      case DType::f32:
        return wide ? cat("__double2float_rn(", a, ")") : a;
      default:
        return cat(element_type(to), wide ? "::from_double(" : "::round(", a, ")");
    }
  }

  void instruction(size_t i, int w) {
    const PointwiseInstr& ins = p_.instrs[i];
    const size_t v = k_ + i;
    const DType t = s_.values[v];
    const char* e = element_type(t);
    const char* c = compute_type(t);
    bool lanes = false;
    for (int32_t o : ins.operands) lanes = lanes || lanes_[size_t(o)];
    lanes_[v] = lanes;
    const bool round = needs_rounding(ins, t);
    if (!lanes) {  // once per step (or per element)
      out_ += cat("    ", c, " t", i, " = ", expression(ins, t), ";\n");
      if (round) out_ += cat("    t", i, " = ", e, "::round(t", i, ");\n");
      if (w > 1 && is_half(t))
        out_ += cat("    const unsigned t", i, "w = ", e, "::pack2(t", i, ", t", i, ");\n");
      return;
    }
    const int n = words(t, w);
    const char* packed = is_half(t) ? packed_op(ins.op) : nullptr;
    if (packed != nullptr) {  // on the words: two lanes per instruction
      std::string args = word(size_t(ins.operands[0]));
      if (ins.operands.size() > 1) args += ", " + word(size_t(ins.operands[1]));
      out_ += cat("    unsigned t", i, "w[", n, "];\n#pragma unroll\n    for (int j = 0; j < ", n,
                  "; ++j) t", i, "w[j] = ", e, "::", packed, "(", args, ");\n");
      out_ += cat("    ", c, " t", i, "[", w, "];\n    ", e, "::unpack<", w, ">(t", i, "w, t", i,
                  ");\n");
      return;
    }
    out_ += cat("    ", c, " t", i, "[", w, "];\n#pragma unroll\n    for (int j = 0; j < ", w,
                "; ++j) t", i, "[j] = ", expression(ins, t), ";\n");
    // The words round; the lanes take the rounded values back where rounding changes them.
    out_ +=
        cat("    unsigned t", i, "w[", n, "];\n    ", e, "::pack<", w, ">(t", i, ", t", i, "w);\n");
    if (round) out_ += cat("    ", e, "::unpack<", w, ">(t", i, "w, t", i, ");\n");
  }

  const FusedKernelSpec& s_;
  const PointwiseProgram& p_;
  size_t k_;
  std::string out_;
  std::vector<bool> lanes_;  // per value: W lanes (else one value for the whole step)
};

}  // namespace

FastDivisor fast_divisor(uint32_t d) {
  FUSEBOX_CHECK(d >= 1, "fused_pointwise", "division by ", d);
  if (d == 1) return {0, 0};
  const uint32_t log2 = uint32_t(std::bit_width(d - 1));  // ceil(log2(d)), >= 1
  const uint64_t p = 31 + log2;
  return {uint32_t(((uint64_t(1) << p) + d - 1) / d), uint32_t(p - 32)};
}

uint32_t fast_divide(uint32_t n, uint32_t d, const FastDivisor& f) {
  (void)d;
  if (f.mul == 0) return n;
  return uint32_t((uint64_t(n) * f.mul) >> 32) >> f.shift;
}

namespace {
std::atomic<int> vectors_per_step{1};
std::atomic<int> steps_per_iteration{4};
}  // namespace

int fused_steps_per_iteration() {
  return steps_per_iteration.load();
}

void set_fused_steps_per_iteration(int steps) {
  FUSEBOX_CHECK(steps == 1 || steps == 2 || steps == 4, "fused_pointwise",
                "steps per iteration must be 1, 2 or 4, not ", steps);
  steps_per_iteration.store(steps);
}

int fused_vectors_per_step() {
  return vectors_per_step.load();
}

void set_fused_vectors_per_step(int vectors) {
  FUSEBOX_CHECK(vectors == 1 || vectors == 2 || vectors == 4, "fused_pointwise",
                "vectors per step must be 1, 2 or 4, not ", vectors);
  vectors_per_step.store(vectors);
}

const char* fused_access_name(FusedAccess a) {
  switch (a) {
    case FusedAccess::contiguous:
      return "contiguous";
    case FusedAccess::uniform:
      return "uniform";
    case FusedAccess::row:
      return "row";
    case FusedAccess::strided:
      return "strided";
  }
  return "?";
}

std::string fused_kernel_source(const FusedKernelSpec& spec) {
  const size_t k = size_t(spec.program.inputs);
  FUSEBOX_CHECK(spec.values.size() == k + spec.program.instrs.size() && spec.access.size() == k &&
                    spec.moves.size() == k && spec.rank >= 1 && spec.rank <= kFusedMaxDims &&
                    (spec.vector_width == 1 || spec.vector_width % 2 == 0) &&
                    (spec.unroll == 1 || spec.unroll == 2 || spec.unroll == 4),
                "fused_pointwise codegen", "an inconsistent kernel spec");
  return Emitter(spec).source();
}

}  // namespace fusebox::cuda
