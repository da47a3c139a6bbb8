#include <map>

#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {

const OpSpec* find_op(const std::string& op_type) {
  static const std::map<std::string, const OpSpec*> table = [] {
    std::map<std::string, const OpSpec*> t;
    for (auto family :
         {conv_pool_ops(), norm_ops(), math_ops(), shape_ops(), known_ops(), einsum_ops()})
      for (const OpSpec& s : family) t[s.op_type] = &s;
    return t;
  }();
  auto it = table.find(op_type);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace fusebox::onnx_import
