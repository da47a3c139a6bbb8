// The backends' executables, made by Executable::compile (runtime/executable.cpp).
#pragma once

#include <memory>

#include "fusebox/runtime/executable.h"

namespace fusebox::runtime {

std::unique_ptr<Executable> compile_cpu(const Graph& g, const CompileOptions& options);
std::unique_ptr<Executable> compile_cuda(const Graph& g, const CompileOptions& options);

}  // namespace fusebox::runtime
