// The command line every benchmark shares (CLI11): --json FILE, and --iters / --repeats where
// a benchmark times repeated calls. Each benchmark adds its own options on app().
#pragma once

#include <CLI/CLI.hpp>
#include <concepts>
#include <functional>
#include <limits>
#include <string>

#include "timing.h"

namespace fusebox::bench {

class Cli {
 public:
  // `name`: the program, for --help and for error messages. Every benchmark takes
  // --json FILE: where the report goes (none when not given).
  Cli(std::string name, std::string description, std::string& json_path);

  CLI::App& app() { return app_; }
  // An option `name` N (N >= 1), defaulting to `count`'s value.
  template <std::integral Count>
  void add_count(const std::string& name, Count& count, const std::string& description) {
    // CLI::Range's message names the bound (PositiveNumber's prints DBL_MAX).
    app_.add_option(name, count, description)
        ->type_name("N")
        ->check(CLI::Range(Count(1), std::numeric_limits<Count>::max()))
        ->capture_default_str();
  }

  // --iters N (N >= 1), defaulting to `iters`' value.
  void add_iters(int& iters, const std::string& description);
  // --iters N and --repeats N, for KernelBench's timing.
  void add_timing(TimingOptions& timing);

  // Parses argv, then runs body(): its status; 0 after --help, 2 for a usage error, 1 with
  // "name: message" on stderr when body throws.
  int run(int argc, char** argv, const std::function<int()>& body);

 private:
  std::string name_;
  CLI::App app_;
};

}  // namespace fusebox::bench
