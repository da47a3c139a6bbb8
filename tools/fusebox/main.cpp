// fusebox: the command-line tool. Subcommands live in cmd_*.cpp.
//
// Exit status: 0 on success, 1 for any error while working (printed as
// "fusebox: error: <message>"), 2 for a usage error (bad or missing arguments).
#include <iostream>

#include "common.h"
#include "fusebox/core/memory.h"

int main(int argc, char** argv) {
  using namespace fusebox::cli;
  CLI::App app{"fusebox: a neural-network compiler and runtime", "fusebox"};
  app.set_version_flag("--version", std::string("fusebox ") + kVersion);
  app.require_subcommand(1);
  std::vector<Command> commands = {add_run_command(app), add_inspect_command(app),
                                   add_zoo_command(app), add_train_command(app),
                                   add_bench_command(app)};
  try {
    app.parse(argc, argv);
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
    return 0;
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::bad_alloc&) {
    // Tensors are counted by the host budget and name themselves when refused; this is memory
    // beyond them (a library's own), so say what is known.
    std::cerr << "fusebox: error: out of memory outside fusebox's tensors (std::bad_alloc), "
              << fusebox::host_memory_summary() << "\n";
  } catch (const std::exception& e) {  // fusebox::Error, and anything else the libraries throw
    std::cerr << "fusebox: error: " << e.what() << "\n";
  }
  return 1;
}
