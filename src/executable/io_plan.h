// What both executables resolve once at compile: the inputs and outputs by name, which are
// bound, which alias which (fusebox/runtime/executable.h).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fusebox/runtime/executable.h"

namespace fusebox::runtime {

struct IoPlan {
  std::vector<std::string> input_names, output_names;  // in the graph's order
  std::map<std::string, size_t> input_index, output_index;
  std::vector<int> alias_of_output;   // by output: the input it is written into, or -1
  std::vector<int> aliased_by_input;  // by input: the output written into it, or -1
  std::vector<bool> bound;            // by input
};

// Checks the options against the graph (Errors name `where` and the name at fault: an
// unknown or repeated name, a bound array of another dtype, shape or device, an alias
// between values of different types).
IoPlan plan_io(const Graph& g, const CompileOptions& options, const std::string& where);

// The type of a feed: an Error naming the input and both types unless it is `want`.
void check_feed(const TensorType& want, const std::string& input, DType dtype, const Shape& shape,
                const std::string& where);

// Every name of `feeds` is an input that may be fed (not bound), and every name of
// `to_host` an output, else an Error.
void check_request(const IoPlan& io, const Feeds& feeds, const std::set<std::string>& to_host,
                   const std::string& where);

// "f32[16, 3, 3, 3]"
std::string type_str(DType dtype, const Shape& shape);

// An Error's message without its "[where] " prefix.
std::string error_message(const Error& e);

}  // namespace fusebox::runtime
