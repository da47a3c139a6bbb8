// Einsum as the graph's existing ops: every equation of one or two operands in which each
// label appears at most once per operand (no diagonals) and dims that share a label have
// equal extents (no broadcasting of 1s), ellipsis included. Others are refused as unsupported.
//
//   one operand:  reduce_sum over the labels the output lacks, then transpose.
//   two operands: sum each operand's private labels away; transpose A to
//                 [batch, a-only, contracted] and B to [batch, contracted, b-only]; reshape
//                 to [Bt, M, K] x [Bt, K, N]; batched matmul; reshape to
//                 [batch, a-only, b-only]; transpose to the output's order.
// (batch: in A, B and the output; contracted: in A and B only; a-only / b-only: in one
// operand and the output.)
#include <algorithm>
#include <map>

#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {
namespace {

// One operand's (or the output's) labels, ellipsis expanded into upper-case labels
// 'A', 'B', ... for its dims (right-aligned over the widest ellipsis).
struct Term {
  std::string labels;
  bool had_ellipsis = false;
};

std::string trim(const std::string& s) {
  std::string out;
  for (char ch : s)
    if (ch != ' ') out += ch;
  return out;
}

// Splits "ab,bc->ac" into its operand terms and output (implicit output: the labels that
// appear once, sorted, after the ellipsis dims).
void parse(NodeContext& c, const std::string& equation, std::vector<std::string>* inputs,
           std::string* output, bool* explicit_output) {
  const std::string eq = trim(equation);
  const size_t arrow = eq.find("->");
  const std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  *explicit_output = arrow != std::string::npos;
  if (*explicit_output) *output = eq.substr(arrow + 2);
  size_t start = 0;
  for (;;) {
    const size_t comma = lhs.find(',', start);
    inputs->push_back(
        lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const std::string& t : *inputs)
    for (size_t i = 0; i < t.size(); ++i) {
      const char ch = t[i];
      const bool dots = t.compare(i, 3, "...") == 0;
      if (dots) {
        i += 2;
        continue;
      }
      if (!(ch >= 'a' && ch <= 'z') && !(ch >= 'A' && ch <= 'Z'))
        c.attrs().fail("equation", cat("'", equation, "' has '", std::string(1, ch),
                                       "' where a letter or '...' belongs"));
    }
}

// Expands "..." in `term` to `count` labels ("0", "1"... mapped to upper-case letters past
// the ones the equation uses are avoided by using chars '0'.. which no user label takes).
std::string expand_ellipsis(const std::string& term, int64_t count, int64_t widest) {
  const size_t at = term.find("...");
  if (at == std::string::npos) return term;
  std::string dims;
  for (int64_t i = widest - count; i < widest; ++i) dims += char('0' + i);
  return term.substr(0, at) + dims + term.substr(at + 3);
}

int64_t explicit_labels(const std::string& term) {
  int64_t n = 0;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term.compare(i, 3, "...") == 0) {
      i += 2;
      continue;
    }
    ++n;
  }
  return n;
}

std::vector<int64_t> positions(const std::string& from, const std::string& labels) {
  std::vector<int64_t> p;
  for (char ch : labels) p.push_back(int64_t(from.find(ch)));
  return p;
}

bool identity_order(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != int64_t(i)) return false;
  return true;
}

void import_einsum(NodeContext& c) {
  const std::string equation = c.attrs().get_string("equation", "");
  if (equation.empty()) c.attrs().fail("equation", "is required");
  std::vector<std::string> terms;
  std::string out_term;
  bool explicit_output = false;
  parse(c, equation, &terms, &out_term, &explicit_output);
  if (int(terms.size()) != c.input_count())
    c.fail(cat("equation '", equation, "' has ", terms.size(), " operands for ", c.input_count(),
               " inputs"));
  if (terms.size() > 2)
    c.unsupported(cat("equation '", equation, "': Einsum of more than two operands"));

  // Expand ellipses and bind every label to its extent.
  int64_t widest = 0;
  std::vector<int64_t> ellipsis_dims(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t rank = c.input_rank(int(i));
    const bool has = terms[i].find("...") != std::string::npos;
    ellipsis_dims[i] = has ? rank - explicit_labels(terms[i]) : 0;
    c.check(ellipsis_dims[i] >= 0 && (has || rank == explicit_labels(terms[i])), "operand ", i,
            " '", terms[i], "' does not match input ", i, "'s rank ", rank);
    widest = std::max(widest, ellipsis_dims[i]);
  }
  std::map<char, int64_t> extent;
  std::map<char, int> count;
  for (size_t i = 0; i < terms.size(); ++i) {
    terms[i] = expand_ellipsis(terms[i], ellipsis_dims[i], widest);
    const Shape& s = c.input_shape(int(i));
    for (size_t d = 0; d < terms[i].size(); ++d) {
      const char ch = terms[i][d];
      if (terms[i].find(ch) != d)
        c.unsupported(cat("equation '", equation, "': label '", std::string(1, ch),
                          "' twice in one operand (a diagonal)"));
      auto [it, fresh] = extent.emplace(ch, s[d]);
      if (!fresh && it->second != s[d])
        c.unsupported(cat("equation '", equation, "': label '", std::string(1, ch),
                          "' has extents ", it->second, " and ", s[d],
                          " (broadcasting in Einsum is not supported)"));
      ++count[ch];
    }
  }
  if (explicit_output) {
    out_term = expand_ellipsis(out_term, widest, widest);
    for (char ch : out_term)
      c.check(extent.count(ch) && std::count(out_term.begin(), out_term.end(), ch) == 1,
              "equation '", equation, "': output label '", std::string(1, ch),
              "' is not an operand label, or repeats");
  } else {  // implicit: the ellipsis dims, then the labels seen once, in alphabetical order
    for (int64_t i = 0; i < widest; ++i) out_term += char('0' + i);
    std::string once;
    for (const auto& [ch, n] : count)
      if (n == 1 && !(ch >= '0' && ch <= '9')) once += ch;
    out_term += once;
  }
  auto in_out = [&](char ch) { return out_term.find(ch) != std::string::npos; };

  // Sums an operand's labels that neither the output nor the other operand has.
  auto sum_private = [&](int i, const std::string& other) {
    ValueId v = c.input(i);
    std::string labels;
    std::vector<int64_t> axes;
    for (size_t d = 0; d < terms[size_t(i)].size(); ++d) {
      const char ch = terms[size_t(i)][d];
      if (!in_out(ch) && other.find(ch) == std::string::npos)
        axes.push_back(int64_t(d));
      else
        labels += ch;
    }
    if (!axes.empty())
      v = c.emit1(OpKind::reduce_sum, ReduceAttrs{axes, false}, {v}, cat("sum", i));
    return std::make_pair(v, labels);
  };

  if (terms.size() == 1) {
    auto [v, labels] = sum_private(0, "");
    const std::vector<int64_t> perm = positions(labels, out_term);
    if (!identity_order(perm)) v = c.emit1(OpKind::transpose, TransposeAttrs{perm}, {v}, "order");
    c.set_output(0, v);  // an input passed through gets an identity node from the loader
    return;
  }

  auto [a, la] = sum_private(0, terms[1]);
  auto [b, lb] = sum_private(1, terms[0]);
  std::string batch, contracted, a_only, b_only;
  for (char ch : la) {
    const bool in_b = lb.find(ch) != std::string::npos;
    (in_b ? (in_out(ch) ? batch : contracted) : a_only) += ch;
  }
  for (char ch : lb)
    if (la.find(ch) == std::string::npos) b_only += ch;
  auto product = [&](const std::string& labels) {
    int64_t p = 1;
    for (char ch : labels) p *= extent[ch];
    return p;
  };
  auto arrange = [&](ValueId v, const std::string& from, const std::string& to,
                     const std::string& suffix) {
    const std::vector<int64_t> perm = positions(from, to);
    return identity_order(perm) ? v : c.emit1(OpKind::transpose, TransposeAttrs{perm}, {v}, suffix);
  };
  a = arrange(a, la, batch + a_only + contracted, "a_order");
  b = arrange(b, lb, batch + contracted + b_only, "b_order");
  const int64_t bt = product(batch), m = product(a_only), k = product(contracted),
                n = product(b_only);
  a = c.emit1(OpKind::reshape, ReshapeAttrs{{bt, m, k}, true}, {a}, "a_matrix");
  b = c.emit1(OpKind::reshape, ReshapeAttrs{{bt, k, n}, true}, {b}, "b_matrix");
  ValueId y = c.emit1(OpKind::matmul, {}, {a, b}, "product");
  const std::string result = batch + a_only + b_only;
  Shape result_shape;
  for (char ch : result) result_shape.push_back(extent[ch]);
  y = c.emit1(OpKind::reshape, ReshapeAttrs{result_shape, true}, {y}, "unflatten");
  c.set_output(0, arrange(y, result, out_term, "order"));
}

const OpSpec kOps[] = {
    {"Einsum", 12, 1, kVariadic, 1, import_einsum},
};

}  // namespace

std::span<const OpSpec> einsum_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
