// fused_pointwise's program (ir/ops.h PointwiseProgram): which ops it may hold, the checks
// inference runs on it, the dtype of every value it computes, conversions between an
// instruction and the node it stands for, and the text form dumps print:
//
//   program: t0=mul(in0,in1); t1=add(t0,in2); t2=gelu(t1,approximate=tanh)
//
// The backends read the values' dtypes here (check_pointwise_program), so the rounding rule
// (every instruction rounded to the dtype its op gives) is decided in one place.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox {

inline constexpr int kMaxPointwiseInputs = 16;

// Whether `op` may be an instruction: a unary or binary pointwise op, cast, or
// unary_backward (of a forward op is_program_derivative accepts).
bool is_pointwise_program_op(OpKind op);
// Whether unary_backward of forward op `op` may be an instruction: the activations whose
// derivative the CUDA generator writes with the unfused kernel's formula (relu, leaky_relu,
// gelu, silu, sigmoid, tanh). Autodiff's other unary_backward nodes stay unfused.
bool is_program_derivative(OpKind op);
// Whether node `n` may be an instruction: its op may, and a unary_backward's forward op too.
bool is_pointwise_instr_node(const Node& n);
// The operands an instruction of `op` takes: 1 (unary ops, cast) or 2 (binary ops,
// unary_backward).
int pointwise_arity(OpKind op);

// Checks `p` against its inputs' dtypes (k = inputs.size() must equal p.inputs) and returns
// the dtype of every value: the k inputs, then each instruction's result (the dtype its op
// gives). Throws an Error naming `where` (the node) and the instruction at fault for: no
// instructions, an op that is not a pointwise op or cast, a unary_backward of a forward op
// is_program_derivative refuses, a wrong operand count, an operand
// index that is not an input or an earlier instruction, a non-float dtype, binary operands
// of different dtypes (pow's exponent aside), bad attributes (leaky alpha not finite, clip
// bounds NaN or min > max, cast to a non-float dtype), an input or an instruction other than
// the last that nothing reads.
std::vector<DType> check_pointwise_program(const PointwiseProgram& p, std::span<const DType> inputs,
                                           const std::string& where);

// The instruction that computes node `n` (a unary or binary pointwise op or a cast), with
// its attributes, reading `operands`; and back: the attributes such a node holds.
PointwiseInstr pointwise_instr(const Node& n, std::vector<int32_t> operands);
Attrs pointwise_instr_attrs(const PointwiseInstr& instr);

// "t0=mul(in0,in1); t1=add(t0,in2); t2=relu(t1)", attributes after the operands
// ("leaky_relu(t0,alpha=0.1)", "clip(t1,min=-1,max=1)", "cast(t2,to=bf16)",
// "unary_backward(t0,in2,of=gelu,approximate=tanh)").
std::string pointwise_program_text(const PointwiseProgram& p);
// "in3" for an input, "t2" for instruction 2's result.
std::string pointwise_operand_name(const PointwiseProgram& p, int32_t index);

}  // namespace fusebox
