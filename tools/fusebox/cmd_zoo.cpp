// fusebox zoo: write one of the zoo's models (seeded random weights) as ONNX.
#include <iostream>

#include "common.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/zoo.h"

namespace fusebox::cli {
namespace {

struct ZooArgs {
  std::string name;
  std::string out;
  bool list = false;
  ZooOptions opts;
};

int zoo(const ZooArgs& args) {
  if (args.list) {
    for (const std::string& name : zoo_models()) std::cout << name << "\n";
    return 0;
  }
  if (args.name.empty() || args.out.empty())
    throw UsageError("zoo needs a model NAME and --out FILE.onnx (or --list)");
  Graph g = build_zoo_model(args.name, args.opts);
  export_onnx_file(g, args.out);

  int64_t values = 0;
  for (const auto& [v, t] : g.constants()) values += t.numel();
  const Value& in = g.value(g.inputs().at(0));
  const Value& out = g.value(g.outputs().at(0));
  std::cout << "wrote " << args.out << ": " << args.name << ", " << g.nodes().size() << " nodes, "
            << with_commas(values) << " constant values, input " << in.name << " "
            << dtype_name(in.type.dtype) << shape_str(in.type.shape) << ", output " << out.name
            << " " << dtype_name(out.type.dtype) << shape_str(out.type.shape) << "\n";
  return 0;
}

}  // namespace

Command add_zoo_command(CLI::App& parent) {
  auto args = std::make_shared<ZooArgs>();
  CLI::App* app =
      parent.add_subcommand("zoo", "Write a model from the zoo (seeded random weights) as ONNX");
  app->add_option("name", args->name, "Model name (see --list)")->type_name("NAME");
  app->add_option("--out", args->out, "Where to write the model")->type_name("FILE.onnx");
  app->add_flag("--list", args->list, "List the zoo's models and exit");
  app->add_option("--batch-size,--batch", args->opts.batch, "Batch size; default 1")
      ->check(integer_range(1));
  app->add_option("--image-size", args->opts.image_size, "Input height and width; default 224")
      ->check(integer_range(1));
  app->add_option("--num-classes", args->opts.num_classes, "Classifier outputs; default 1000")
      ->check(integer_range(1));
  app->add_option("--seq-len", args->opts.sequence_length,
                  "Decoders (gpt2*): tokens per sequence; default the model's context")
      ->check(integer_range(1));
  app->add_option("--seed", args->opts.seed, "Weight seed; default 0")->check(seed_number());
  return {app, [args] { return zoo(*args); }};
}

}  // namespace fusebox::cli
