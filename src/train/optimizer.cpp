#include "fusebox/train/optimizer.h"

#include <cmath>

#include "fusebox/core/error.h"

namespace fusebox {

const char* optimizer_name(const OptimizerSpec& spec) {
  return std::holds_alternative<SgdOptions>(spec) ? "sgd" : "adamw";
}

double optimizer_lr(const OptimizerSpec& spec) {
  return std::visit([](const auto& o) { return o.lr; }, spec);
}

OptimizerSpec with_lr(OptimizerSpec spec, double lr) {
  std::visit([&](auto& o) { o.lr = lr; }, spec);
  return spec;
}

std::vector<std::pair<std::string, double>> optimizer_hyper_parameters(const OptimizerSpec& spec) {
  if (const auto* sgd = std::get_if<SgdOptions>(&spec)) {
    return {{"lr", sgd->lr},
            {"momentum", sgd->momentum},
            {"dampening", sgd->dampening},
            {"weight_decay", sgd->weight_decay},
            {"nesterov", sgd->nesterov ? 1.0 : 0.0}};
  }
  const auto& adamw = std::get<AdamWOptions>(spec);
  return {{"lr", adamw.lr},
          {"beta1", adamw.beta1},
          {"beta2", adamw.beta2},
          {"eps", adamw.eps},
          {"weight_decay", adamw.weight_decay}};
}

void check_optimizer(const OptimizerSpec& spec, const std::string& where) {
  const std::string name = optimizer_name(spec);
  for (const auto& [key, value] : optimizer_hyper_parameters(spec))
    FUSEBOX_CHECK(std::isfinite(value), where, name, " ", key, " must be finite, got ", value);
  auto in_range = [&](const char* key, double v, double lo, double hi, bool hi_open) {
    FUSEBOX_CHECK(v >= lo && (hi_open ? v < hi : v <= hi), where, name, " ", key, " must be in [",
                  lo, ", ", hi, hi_open ? ")" : "]", ", got ", v);
  };
  FUSEBOX_CHECK(optimizer_lr(spec) >= 0, where, name, " lr must be >= 0, got ", optimizer_lr(spec));
  if (const auto* sgd = std::get_if<SgdOptions>(&spec)) {
    FUSEBOX_CHECK(sgd->momentum >= 0, where, "sgd momentum must be >= 0, got ", sgd->momentum);
    in_range("dampening", sgd->dampening, 0, 1, false);
    FUSEBOX_CHECK(sgd->weight_decay >= 0, where, "sgd weight_decay must be >= 0, got ",
                  sgd->weight_decay);
    FUSEBOX_CHECK(!sgd->nesterov || (sgd->momentum > 0 && sgd->dampening == 0), where,
                  "sgd nesterov needs momentum > 0 and dampening 0 (as PyTorch)");
    return;
  }
  const auto& adamw = std::get<AdamWOptions>(spec);
  in_range("beta1", adamw.beta1, 0, 1, true);
  in_range("beta2", adamw.beta2, 0, 1, true);
  FUSEBOX_CHECK(adamw.eps > 0, where, "adamw eps must be > 0, got ", adamw.eps);
  FUSEBOX_CHECK(adamw.weight_decay >= 0, where, "adamw weight_decay must be >= 0, got ",
                adamw.weight_decay);
}

}  // namespace fusebox
