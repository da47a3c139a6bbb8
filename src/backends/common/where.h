// What an error is about, for backend code that checks on every launch: a node, a name
// already formatted, or a component such as "copy_strided". The text is built only when an
// error is thrown: node_label formats a string, a cost not worth paying on every launch of
// a replayed step. Converts implicitly, so a function taking `const Where&` takes any of them.
#pragma once

#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox {

class Where {
 public:
  Where(const Node& node) : node_(&node) {}                // NOLINT: implicit on purpose
  Where(const std::string& name) : name_(&name) {}         // NOLINT: implicit on purpose
  Where(const char* component) : component_(component) {}  // NOLINT: implicit on purpose
  std::string str() const {
    if (node_ != nullptr) return node_label(*node_);
    if (name_ != nullptr) return *name_;
    return component_;
  }

 private:
  const Node* node_ = nullptr;
  const std::string* name_ = nullptr;  // outlives the Where: it names the caller's string
  const char* component_ = "backend";
};

}  // namespace fusebox
