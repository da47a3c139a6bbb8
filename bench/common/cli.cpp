#include "cli.h"

#include <cstdio>
#include <exception>

namespace fusebox::bench {

Cli::Cli(std::string name, std::string description, std::string& json_path)
    : name_(std::move(name)), app_(std::move(description), name_) {
  app_.add_option("--json", json_path, "Write the results as JSON to FILE")->type_name("FILE");
}

void Cli::add_iters(int& iters, const std::string& description) {
  add_count("--iters", iters, description);
}

void Cli::add_timing(TimingOptions& timing) {
  add_iters(timing.iters, "Calls per timed run");
  add_count("--repeats", timing.repeats, "Timed runs; their median is reported");
}

int Cli::run(int argc, char** argv, const std::function<int()>& body) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help arrives here too, with exit code 0.
    return app_.exit(e) == 0 ? 0 : 2;
  }
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name_.c_str(), e.what());
    return 1;
  }
}

}  // namespace fusebox::bench
