// The fusebox command-line tool, end to end through the built binary.
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "fusebox/backends/cpu_fast.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace fusebox {
namespace {

struct ToolResult {
  int exit_code = -1;
  std::string out, err;
};

// A fresh directory per test, removed afterwards.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / cat("fusebox_cli_", ::getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `fusebox <args>` through the shell; stdout and stderr are captured to files.
  ToolResult tool(const std::string& args) const {
    const std::string out = path("stdout.txt"), err = path("stderr.txt");
    const std::string command =
        cat("'", FUSEBOX_TOOL_PATH, "' ", args, " > '", out, "' 2> '", err, "'");
    int status = std::system(command.c_str());
    ToolResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static std::string slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // small_cnn at 8x8 with 10 classes, batch 2, written by `fusebox zoo`.
  std::string make_small_cnn() const {
    const std::string model = path("small_cnn.onnx");
    ToolResult r = tool(cat("zoo small_cnn --out '", model,
                            "' --batch 2 --image-size 8 --num-classes 10 --seed 5"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(model));
    return model;
  }

  // make_small_cnn's model with the batch dim of its input and logits made symbolic.
  std::string make_small_cnn_any_batch() const {
    onnx::ModelProto proto;
    {
      std::ifstream in(make_small_cnn(), std::ios::binary);
      EXPECT_TRUE(proto.ParseFromIstream(&in));
    }
    onnx::GraphProto& graph = *proto.mutable_graph();
    for (auto* values : {graph.mutable_input(), graph.mutable_output()})
      for (onnx::ValueInfoProto& v : *values)
        if (v.name() == "input" || v.name() == "logits")
          v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param(
              "batch");
    const std::string model = path("small_cnn_any_batch.onnx");
    std::ofstream out(model, std::ios::binary);
    EXPECT_TRUE(proto.SerializeToOstream(&out));
    return model;
  }

  fs::path dir_;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(Cli, HelpForEveryCommand) {
  ToolResult top = tool("--help");
  EXPECT_EQ(top.exit_code, 0) << top.err;
  for (const char* sub : {"run", "inspect", "zoo"}) EXPECT_TRUE(contains(top.out, sub)) << sub;

  const std::pair<const char*, const char*> options[] = {{"run", "--device"},
                                                         {"run", "--output-dir"},
                                                         {"inspect", "--shape"},
                                                         {"zoo", "--num-classes"}};
  for (const auto& [sub, option] : options) {
    ToolResult r = tool(cat(sub, " --help"));
    EXPECT_EQ(r.exit_code, 0) << sub << ": " << r.err;
    EXPECT_TRUE(contains(r.out, option)) << sub << " --help lacks " << option << ":\n" << r.out;
  }
}

TEST_F(Cli, VersionAndUsageErrors) {
  ToolResult v = tool("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_TRUE(contains(v.out, "fusebox 0.1.0")) << v.out;

  EXPECT_EQ(tool("").exit_code, 2);            // no subcommand
  EXPECT_EQ(tool("frobnicate").exit_code, 2);  // unknown subcommand
  EXPECT_EQ(tool("run").exit_code, 2);         // missing MODEL
  EXPECT_EQ(tool("run m.onnx --device tpu").exit_code, 2);
  EXPECT_EQ(tool("zoo small_cnn").exit_code, 2);  // missing --out
  EXPECT_EQ(tool("zoo --batch 0 small_cnn --out x.onnx").exit_code, 2);
  ToolResult bad_input = tool(cat("run '", make_small_cnn(), "' --input just_a_name"));
  EXPECT_EQ(bad_input.exit_code, 2);
  EXPECT_TRUE(contains(bad_input.err, "NAME=VALUE")) << bad_input.err;
}

// The longest run of digits in `text`.
size_t longest_number(const std::string& text) {
  size_t longest = 0, run = 0;
  for (char c : text) {
    run = std::isdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

// Every numeric option of train, bench, zoo and run: a value out of its range (or no number,
// or past 64 bits) is a usage error naming the option and its range in plain numbers; never
// the largest double's 309 digits (CLI::PositiveNumber's message), never a silent wrap-around
// (CLI11 alone takes "-1" for an unsigned seed as 2^64 - 1).
TEST_F(Cli, NumericOptionsPrintTheirRangesInPlainNumbers) {
  const std::pair<const char*, std::vector<const char*>> commands[] = {
      {"train small_cnn --synthetic",
       {"--batch-size", "--steps", "--checkpoint-every", "--image-size", "--num-classes",
        "--seq-len", "--samples", "--log-every", "--gpus", "--bucket-mb"}},
      {"bench small_cnn", {"--batch-size", "--steps", "--image-size", "--num-classes"}},
      {"zoo small_cnn --out m.onnx",
       {"--batch-size", "--image-size", "--num-classes", "--seq-len"}},
  };
  for (const auto& [command, options] : commands) {
    for (const char* option : options) {
      for (const char* value : {"0", "-1", "99999999999999999999", "1.5", "abc"}) {
        if (std::string(option) == "--bucket-mb" && std::string(value) == "1.5") continue;
        const ToolResult r = tool(cat(command, " ", option, " ", value));
        const std::string what = cat(command, " ", option, " ", value, ": ");
        EXPECT_EQ(r.exit_code, 2) << what << r.err;
        EXPECT_TRUE(contains(r.err, cat(option, ": must be "))) << what << r.err;
        EXPECT_TRUE(contains(r.err, cat("got '", value, "'"))) << what << r.err;
        EXPECT_LE(longest_number(r.err), 20u) << what << r.err;
      }
    }
  }
  // --batch-size is every command's spelling; bench's and zoo's old --batch is its alias.
  for (const char* command : {"bench small_cnn", "zoo small_cnn --out m.onnx"}) {
    const ToolResult old = tool(cat(command, " --batch 0"));
    EXPECT_EQ(old.exit_code, 2) << command << ": " << old.err;
    EXPECT_TRUE(contains(old.err, "--batch-size: must be an integer from 1")) << old.err;
  }
  ToolResult r = tool("train small_cnn --synthetic --steps 0");
  EXPECT_TRUE(contains(r.err, "--steps: must be an integer from 1 to 2^63 - 1, got '0'")) << r.err;
  r = tool("train small_cnn --synthetic --gpus 0");
  EXPECT_TRUE(contains(r.err, "--gpus: must be an integer from 1 to 2^31 - 1, got '0'")) << r.err;
  r = tool("bench small_cnn --warmup -1");
  EXPECT_TRUE(contains(r.err, "--warmup: must be an integer from 0 to 2^63 - 1, got '-1'"))
      << r.err;
  r = tool("train small_cnn --synthetic --bucket-mb 0");
  EXPECT_TRUE(contains(r.err, "--bucket-mb: must be a number > 0 and <= 2^20, got '0'")) << r.err;
  for (const char* command :
       {"train small_cnn --synthetic", "zoo small_cnn --out m.onnx", "run m.onnx"}) {
    for (const char* seed : {"-1", "18446744073709551616", "x"}) {
      r = tool(cat(command, " --seed ", seed));
      EXPECT_EQ(r.exit_code, 2) << command << " --seed " << seed << ": " << r.err;
      EXPECT_TRUE(
          contains(r.err, cat("--seed: must be an integer from 0 to 2^64 - 1, got '", seed, "'")))
          << r.err;
    }
  }
}

TEST_F(Cli, ZooListsModels) {
  ToolResult r = tool("zoo --list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& name : zoo_models()) EXPECT_TRUE(contains(r.out, name + "\n")) << name;
}

TEST_F(Cli, ZooUnknownModelIsAnError) {
  ToolResult r = tool(cat("zoo resnet7 --out '", path("x.onnx"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, "resnet7")) << r.err;
  EXPECT_FALSE(fs::exists(path("x.onnx")));
}

TEST_F(Cli, ZooInspectRun) {
  const std::string model = make_small_cnn();

  ToolResult inspect = tool(cat("inspect '", model, "'"));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_TRUE(contains(inspect.out, "f32[2, 3, 8, 8]")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "f32[2, 10]")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "conv: 2\n")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "folded at import: 0\n")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "batch_norm: 2\n")) << inspect.out;
  // small_cnn's parameters and running stats: 432 + 4*16 + 4608 + 4*32 + 320 + 10.
  EXPECT_TRUE(contains(inspect.out, "5,562 values")) << inspect.out;
  // MACs: conv1 2*16*8*8*27 + conv2 2*32*4*4*144 + fc 2*10*32.
  EXPECT_TRUE(contains(inspect.out, "multiply-adds in conv/gemm/matmul: 203,392 ")) << inspect.out;
  // The CUDA layout plan: the input and both filters converted at load, the convolution
  // region channels-last, no conversion inside (passes/layout.h).
  EXPECT_TRUE(contains(inspect.out, "(3 inputs/constants converted at load), 0 conversions"))
      << inspect.out;

  const std::string out_dir = path("out");
  ToolResult run = tool(cat("run '", model, "' --device cpu --output-dir '", out_dir, "'"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(contains(run.out, "output logits: f32[2, 10]")) << run.out;
  EXPECT_TRUE(contains(run.out, " ms")) << run.out;
  Tensor logits = read_npy((fs::path(out_dir) / "logits.npy").string());
  ASSERT_EQ(logits.dtype(), DType::f32);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  for (int64_t i = 0; i < logits.numel(); ++i) EXPECT_TRUE(std::isfinite(logits.get(i)));
}

// --report on the CPU: the time part (Executable::profile) lists every node, the slowest
// first, and the time by op.
TEST_F(Cli, RunReportTimesEachNode) {
  const std::string model = make_small_cnn();
  ToolResult run = tool(cat("run '", model, "' --device cpu --report"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(contains(run.out, "time by node (each timed on its own; the ")) << run.out;
  EXPECT_TRUE(contains(run.out, "time by op:\n")) << run.out;
  EXPECT_TRUE(contains(run.out, "  conv" + std::string(16, ' ') + "conv1\n")) << run.out;
  EXPECT_TRUE(contains(run.out, "  conv                  2 nodes ")) << run.out;
  EXPECT_TRUE(contains(run.out, "sum of node times ")) << run.out;
}

// bench --report on the CPU names each fusion group's CPU kernel (the fast kernel's own words, or
// the reference kernel and why), never the CUDA lowering; `--device cpu-ref` the reference.
TEST_F(Cli, BenchReportOnTheCpuNamesCpuKernels) {
  const std::string model = make_small_cnn();
  ToolResult fast = tool(cat("bench '", model, "' --device cpu --steps 1 --warmup 0 --report"));
  ASSERT_EQ(fast.exit_code, 0) << fast.err;
  EXPECT_TRUE(contains(fast.out, "group 1: conv 'conv1'")) << fast.out;
  EXPECT_FALSE(contains(fast.out, "cuDNN")) << fast.out;
  EXPECT_TRUE(contains(
      fast.out, cpu_fast::built_with_onednn() ? "-> oneDNN conv " : "-> the reference kernel ("))
      << fast.out;
  ToolResult ref = tool(cat("bench '", model, "' --device cpu-ref --steps 1 --warmup 0 --report"));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_TRUE(contains(ref.out, "-> the reference kernel (--device cpu-ref)")) << ref.out;
}

// `--device cpu-ref` is the in-process reference run; the default (`cpu`, the fast kernels
// through the inference pipeline) within docs/cpu_fast.md's tolerance.
TEST_F(Cli, RunMatchesTheInProcessGraph) {
  const std::string model = make_small_cnn();
  Tensor x = testing::random_tensor(DType::f32, {2, 3, 8, 8}, 21);
  write_npy(path("x.npy"), x);
  Graph g =
      build_zoo_model("small_cnn", {.batch = 2, .image_size = 8, .num_classes = 10, .seed = 5});
  Tensor want = run_graph(g, {{"input", x}}).at("logits");
  for (const std::string device : {"cpu-ref", "cpu"}) {
    const std::string out_dir = path("out_" + device);
    ToolResult run = tool(cat("run '", model, "' --device ", device,
                              " --input 'input=", path("x.npy"), "' --output-dir '", out_dir, "'"));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    Tensor got = read_npy((fs::path(out_dir) / "logits.npy").string());
    if (device == "cpu-ref")
      EXPECT_TRUE(testing::all_close(got, want, 1e-5, 1e-6)) << device;
    else
      EXPECT_TRUE(testing::all_close(got, want, 1e-4, 1e-5)) << device;
  }
}

TEST_F(Cli, RandomInputsFollowTheSeed) {
  const std::string model = make_small_cnn();
  int runs = 0;
  auto logits = [&](int seed) {
    const std::string dir = path(cat("out", runs++));
    ToolResult r = tool(cat("run '", model, "' --seed ", seed, " --output-dir '", dir, "'"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_npy((fs::path(dir) / "logits.npy").string());
  };
  Tensor a = logits(1), b = logits(1), c = logits(2);
  EXPECT_TRUE(testing::all_close(a, b, 0, 0));
  EXPECT_FALSE(testing::all_close(a, c, 1e-6, 0));
}

TEST_F(Cli, BadInputFileIsAnError) {
  const std::string model = make_small_cnn();
  const std::string missing = path("missing.npy");
  ToolResult r = tool(cat("run '", model, "' --input 'input=", missing, "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, missing)) << r.err;

  const std::string garbage = path("garbage.npy");
  std::ofstream(garbage) << "this is not a numpy file";
  r = tool(cat("run '", model, "' --input 'input=", garbage, "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, garbage)) << r.err;

  // A readable file of the wrong dtype: the error names the input.
  write_npy(path("x64.npy"), testing::random_tensor(DType::f64, {2, 3, 8, 8}, 1));
  r = tool(cat("run '", model, "' --input 'input=", path("x64.npy"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, "'input'")) << r.err;
}

// --memory-limit (run, bench, train): what does not fit is one line naming what asked, the
// bytes and the limit, never a bare std::bad_alloc or the OOM killer; a malformed value is a
// usage error.
TEST_F(Cli, MemoryLimitIsEnforcedByNameAndChecked) {
  const std::string model = make_small_cnn();
  ToolResult r = tool(cat("run '", model, "' --memory-limit 2K"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("fusebox: error: [host memory] out of host memory: f32[", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, "of the 2.0 KiB host memory limit")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  r = tool(cat("run '", model, "' --memory-limit 64M"));
  EXPECT_EQ(r.exit_code, 0) << r.err;

  for (const char* command : {"run", "bench", "train"}) {
    r = tool(cat(command, " '", model, "' --memory-limit 5x"));
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "--memory-limit='5x' is not a byte count")) << r.err;
  }
}

// bench --mode train of a decoder: one label per token (cross_entropy's [N, tokens] labels for
// [N, vocab, tokens] logits), not one per sample.
TEST_F(Cli, BenchTrainsADecoder) {
  const ToolResult r =
      tool("bench gpt2_test --mode train --batch 2 --steps 2 --warmup 1 --device cpu");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "final loss")) << r.out;
}

// bench --mode train --optimizer: train's optimizers and defaults, named in the first line and
// the JSON; refused for inference.
TEST_F(Cli, BenchTrainsWithTheOptimizerAsked) {
  const std::string model = make_small_cnn();
  const ToolResult r = tool(cat("bench '", model, "' --mode train --optimizer adamw --steps 2 ",
                                "--warmup 1 --device cpu --json '", path("b.json"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, ", adamw, 1 warm-up")) << r.out;
  EXPECT_TRUE(contains(slurp(path("b.json")), "\"optimizer\": \"adamw\"")) << r.out;
  const ToolResult infer = tool(cat("bench '", model, "' --optimizer adamw --device cpu"));
  EXPECT_EQ(infer.exit_code, 2) << infer.err;
  EXPECT_TRUE(contains(infer.err, "--optimizer is for --mode train")) << infer.err;
}

// run --precision: bf16 through the inference pipeline's mixed precision (f32 outputs close to
// the f32 run's), refused on the reference kernels, which run the model as imported.
TEST_F(Cli, RunTakesAPrecision) {
  const std::string model = make_small_cnn();
  const ToolResult f32 =
      tool(cat("run '", model, "' --device cpu --output-dir '", path("f32"), "'"));
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  const ToolResult bf16 = tool(
      cat("run '", model, "' --device cpu --precision bf16 --output-dir '", path("bf16"), "'"));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  const Tensor a = read_npy(path("f32/logits.npy")), b = read_npy(path("bf16/logits.npy"));
  EXPECT_EQ(b.dtype(), DType::f32);
  EXPECT_LE(fusebox::testing::relative_l2(b, a), 0.05);
  EXPECT_GT(fusebox::testing::relative_l2(b, a), 0.0);  // it did run in bf16
  const ToolResult ref = tool(cat("run '", model, "' --device cpu-ref --precision bf16"));
  EXPECT_EQ(ref.exit_code, 2) << ref.err;
  EXPECT_TRUE(contains(ref.err, "--precision bf16 needs the inference pipeline")) << ref.err;
}

// bench of an ONNX model reports the batch it ran (the model's own, 2 here), not --batch's
// default (32), in its lines and its JSON; the JSON also says which build ran where (version,
// commit, CPU, threads).
TEST_F(Cli, BenchReportsTheBatchItRan) {
  const std::string json = path("bench.json");
  const ToolResult r = tool(
      cat("bench '", make_small_cnn(), "' --device cpu --steps 2 --warmup 1 --json '", json, "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "the model's batch")) << r.out;
  EXPECT_TRUE(contains(r.out, "batch                 2\n")) << r.out;
  EXPECT_TRUE(contains(slurp(json), "\"batch\": 2,")) << slurp(json);
  for (const char* key : {"\"version\": \"", "\"commit\": \"", "\"cpu\": \"", "\"threads\": "})
    EXPECT_TRUE(contains(slurp(json), key)) << key << " in " << slurp(json);
}

// A batch of 0 through convolutions, batch norm, pools and the classifier (issue 38: it
// died with SIGFPE): small_cnn with its batch dim made symbolic, run with --shape at batch
// 0, writes an empty logits.npy [0, 10]; on CUDA too where a GPU is present.
TEST_F(Cli, RunsABatchOfZero) {
  const std::string model = make_small_cnn_any_batch();
  std::vector<std::string> devices = {"cpu"};
  if (cuda_available()) devices.push_back("cuda");
  for (const std::string& device : devices) {
    SCOPED_TRACE(device);
    const std::string out_dir = path(cat("out_", device));
    ToolResult run = tool(cat("run '", model, "' --device ", device,
                              " --shape input=0,3,8,8 --output-dir '", out_dir, "'"));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_TRUE(contains(run.out, "output logits: f32[0, 10]")) << run.out;
    const Tensor logits = read_npy((fs::path(out_dir) / "logits.npy").string());
    EXPECT_EQ(logits.dtype(), DType::f32);
    EXPECT_EQ(logits.shape(), (Shape{0, 10}));
  }
}

// An ONNX model whose batch is symbolic trains at --batch-size (16 without it), where a fixed
// one needs its own; --shape still decides where it names the input.
TEST_F(Cli, TrainSizesASymbolicBatch) {
  const std::string model = make_small_cnn_any_batch();
  const std::string common =
      cat("train '", model, "' --synthetic --samples 12 --steps 2 --device cpu");
  ToolResult r = tool(cat(common, " --batch-size 3"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "batch 3 from 12")) << r.out;
  r = tool(common);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "batch 16 from 12")) << r.out;
  r = tool(cat(common, " --batch-size 3 --shape input=4,3,8,8"));
  ASSERT_EQ(r.exit_code, 2) << r.out << r.err;  // --shape fixed 4: --batch-size contradicts it
  EXPECT_TRUE(contains(r.err, "fixed at 4")) << r.err;
}

TEST_F(Cli, MissingModelIsAnError) {
  const std::string model = path("nope.onnx");
  for (const char* sub : {"run", "inspect"}) {
    ToolResult r = tool(cat(sub, " '", model, "'"));
    EXPECT_EQ(r.exit_code, 1) << sub;
    EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
    EXPECT_TRUE(contains(r.err, model)) << r.err;
  }
}

TEST_F(Cli, CudaWithoutADeviceIsAnError) {
  if (cuda_available()) GTEST_SKIP() << "this machine has a CUDA device";
  ToolResult r = tool(cat("run '", make_small_cnn(), "' --device cuda"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("fusebox: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(contains(r.err, "CUDA")) << r.err;
  // auto falls back to the CPU.
  ToolResult a = tool(cat("run '", make_small_cnn(), "' --device auto"));
  EXPECT_EQ(a.exit_code, 0) << a.err;
  EXPECT_TRUE(contains(a.out, " on cpu ")) << a.out;
}

// The inference pipeline's plan (passes/pipeline.h) through `inspect --fusion` and `--dot`:
// each group with its CUDA lowering, the summary line; FUSEBOX_FUSION=0 forms none.
TEST_F(Cli, InspectFusionPrintsThePlan) {
  const std::string model = make_small_cnn();
  ToolResult r = tool(cat("inspect --fusion '", model, "' --dot '", path("plan.dot"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "fusion plan of small_cnn (11 nodes, f32, inference):\n"
            "group 1: conv 'conv1' + batch_norm 'bn1' (folded) + relu 'relu1' -> cuDNN graph "
            "conv_fprop+bias+relu\n"
            "group 2: conv 'conv2' + batch_norm 'bn2' (folded) + relu 'relu2' -> cuDNN graph "
            "conv_fprop+bias+relu\n"
            "fusion: 2 groups, 6 fused ops, 5 unfused ops\n");
  EXPECT_TRUE(contains(slurp(path("plan.dot")),
                       "n0 [label=\"conv 'conv1'\\nbatch_norm 'bn1' (folded)\\nrelu 'relu1'\\n-> "
                       "cuDNN graph conv_fprop+bias+relu\", style=filled"));
  testing::ScopedEnv off("FUSEBOX_FUSION", "0");
  ToolResult none = tool(cat("inspect --fusion '", model, "'"));
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_TRUE(contains(none.out, "fusion: 0 groups, 0 fused ops, 11 unfused ops\n")) << none.out;
}

// FUSEBOX_COMPILE_TRACE=1: the compile's phases, printed to stderr at exit (an ONNX import,
// autodiff and the training step's passes of a small_cnn trained for one step on the CPU);
// unset, nothing.
TEST_F(Cli, CompileTracePrintsThePhases) {
  const std::string model = make_small_cnn();
  const std::string train = cat("train '", model, "' --synthetic --steps 1 --device cpu");
  {
    testing::ScopedEnv on("FUSEBOX_COMPILE_TRACE", "1");
    const ToolResult r = tool(train);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "fusebox: compile trace (FUSEBOX_COMPILE_TRACE): ")) << r.err;
    for (const char* phase : {"  onnx import\n", "  autodiff\n", "  training step graph\n",
                              "  pass fuse_pointwise_chains\n"})
      EXPECT_TRUE(contains(r.err, phase)) << phase << " in:\n" << r.err;
  }
  const ToolResult quiet = tool(train);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_FALSE(contains(quiet.err, "compile trace")) << quiet.err;
}

}  // namespace
}  // namespace fusebox
