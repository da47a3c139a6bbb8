// One error type for the whole project. Every message reads "[where] what",
// where "where" names the op and node (or file, or component) at fault.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fusebox {

// Concatenates anything streamable: cat("got ", 3, " dims").
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

class Error : public std::runtime_error {
 public:
  // where: "conv 'stem/conv1'", "onnx import: model.onnx", "npy: x.npy", ...
  Error(std::string where, const std::string& message)
      : std::runtime_error("[" + where + "] " + message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// Memory refused: a budget (core/memory.h, the CUDA allocator's limit) or the system. An Error
// of its own type so that a caller that knows more (the node being run) can say so.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace fusebox

// FUSEBOX_CHECK(cond, where, message parts...) throws fusebox::Error("where", cat(parts...)).
#define FUSEBOX_CHECK(cond, where, ...)                                        \
  do {                                                                         \
    if (!(cond)) throw ::fusebox::Error((where), ::fusebox::cat(__VA_ARGS__)); \
  } while (0)
