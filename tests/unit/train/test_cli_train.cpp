// `fusebox train` through the built binary.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/train/checkpoint.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace fusebox::testing {
namespace {

struct ToolResult {
  int exit_code = -1;
  std::string out, err;
};

class CliTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::path(::testing::TempDir()) / cat("fusebox_cli_train_", ::getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `[env] fusebox train <args>`; stdout is a file, so progress comes one line per
  // --log-every steps.
  ToolResult train(const std::string& args, const std::string& env = "") const {
    return tool("train " + args, env);
  }
  ToolResult tool(const std::string& args, const std::string& env = "") const {
    const std::string out = path("stdout.txt"), err = path("stderr.txt");
    const std::string command =
        cat(env, " '", FUSEBOX_TOOL_PATH, "' ", args, " > '", out, "' 2> '", err, "'");
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  }
  static std::string slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // `fusebox train <args>` started in the background (the shell execs it: the pid is the
  // tool's), for a test to signal; finish() waits for it.
  pid_t start_train(const std::string& args) const {
    const std::string command = cat("exec '", FUSEBOX_TOOL_PATH, "' train ", args, " > '",
                                    path("stdout.txt"), "' 2> '", path("stderr.txt"), "'");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }
  // The exit status, or 128 + the signal that killed it (as a shell reports both).
  ToolResult finish(pid_t pid) const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status)     ? WEXITSTATUS(status)
                     : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                           : -1;
    return {code, slurp(path("stdout.txt")), slurp(path("stderr.txt"))};
  }
  // Whether `file` appeared within two minutes (a loaded CI machine compiles slowly).
  static bool appears(const std::string& file) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!fs::exists(file)) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  // The names in the test's folder holding ".tmp." (temporary files of atomic writes).
  std::vector<std::string> temporaries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) names.push_back(name);
    }
    return names;
  }

  fs::path dir_;
};

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// The losses of the progress lines ("step  5/20  loss 1.2345 ...").
std::vector<double> progress_losses(const std::string& out) {
  std::vector<double> losses;
  std::regex line(R"(step +\d+/\d+ +loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it)
    losses.push_back(std::stod((*it)[1]));
  return losses;
}

const char* kSmall = "small_cnn --synthetic --image-size 8 --batch-size 8 --samples 32";

TEST_F(CliTrain, SmallCnnLossFallsAndResumeContinues) {
  ToolResult r = train(cat(kSmall, " --steps 20 --log-every 5 --checkpoint '", path("c.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::vector<double> losses = progress_losses(r.out);
  ASSERT_EQ(losses.size(), 4u) << r.out;  // steps 5, 10, 15, 20
  EXPECT_LT(losses.back(), losses.front() * 0.7) << r.out;
  EXPECT_TRUE(contains(r.out, "trained 20 steps (1 to 20)")) << r.out;
  EXPECT_TRUE(contains(r.out, "images/s")) << r.out;
  // Each progress line: the time per step and the host's part of it making the batch.
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(step +20/20 .*step [0-9.]+ ms, data [0-9.]+ ms)")))
      << r.out;
  EXPECT_TRUE(contains(r.out, "wrote checkpoint")) << r.out;
  EXPECT_EQ(load_checkpoint(path("c.npz")).step, 20);

  r = train(
      cat(kSmall, " --steps 5 --resume '", path("c.npz"), "' --checkpoint '", path("d.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from")) << r.out;
  EXPECT_TRUE(contains(r.out, "(21 to 25)")) << r.out;
  EXPECT_TRUE(contains(r.out, "step 25/25")) << r.out;
  EXPECT_EQ(load_checkpoint(path("d.npz")).step, 25);
}

// 10 steps straight == 5 + resume + 5, checked on the checkpoints' bytes; and the
// thread count does not change a single bit.
TEST_F(CliTrain, ResumeAndThreadCountAreBitExact) {
  const std::string base = cat(kSmall, " --optimizer adamw --shuffle --seed 3");
  ASSERT_EQ(
      train(cat(base, " --steps 10 --checkpoint '", path("a.npz"), "'"), "FUSEBOX_NUM_THREADS=1")
          .exit_code,
      0);
  ASSERT_EQ(train(cat(base, " --steps 5 --checkpoint '", path("half.npz"), "'")).exit_code, 0);
  ToolResult r = train(
      cat(base, " --steps 5 --resume '", path("half.npz"), "' --checkpoint '", path("b.npz"), "'"),
      "FUSEBOX_NUM_THREADS=3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, Tensor> a = read_npz(path("a.npz")), b = read_npz(path("b.npz"));
  EXPECT_TRUE(same_tensors(a, b));
  EXPECT_EQ(b.at("__meta__/step").get(0), 10.0);
}

TEST_F(CliTrain, CheckpointEveryWritesAlongTheWay) {
  ToolResult r =
      train(cat(kSmall, " --steps 3 --checkpoint-every 2 --checkpoint '", path("e.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(load_checkpoint(path("e.npz")).step, 3);
  EXPECT_EQ(train(cat(kSmall, " --steps 3 --checkpoint-every 2")).exit_code, 2);
}

// Ctrl-C: the steps queued finish, the checkpoint is written whole and train exits with 130;
// a resume continues from it.
TEST_F(CliTrain, InterruptWritesTheCheckpointAndExits130) {
  const ToolResult r =
      tool(cat("train ", kSmall, " --steps 100000000 --log-every 1000 --checkpoint-every 50 ",
               "--checkpoint '", path("i.npz"), "'"),
           "timeout --preserve-status -s INT 4");
  EXPECT_EQ(r.exit_code, 130) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "interrupted (SIGINT) after step")) << r.out;
  const Checkpoint c = load_checkpoint(path("i.npz"));
  EXPECT_GT(c.step, 0);
  EXPECT_LT(c.step, 100000000);
  EXPECT_TRUE(contains(r.out, cat("wrote checkpoint ", path("i.npz"), " (step ", c.step, ")")))
      << r.out;
  const ToolResult resumed = train(cat(kSmall, " --steps 2 --resume '", path("i.npz"), "'"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.out, cat("at step ", c.step))) << resumed.out;
}

// SIGTERM (what a scheduler sends to pre-empt a job) is taken as SIGINT is: the queued steps
// finish, the checkpoint is written whole, exit 143; the step it holds is the one printed.
TEST_F(CliTrain, SigtermWritesTheCheckpointAndExits143) {
  const std::string checkpoint = path("t.npz");
  const pid_t pid = start_train(cat(kSmall, " --steps 100000000 --log-every 1000 ",
                                    "--checkpoint-every 5 --checkpoint '", checkpoint, "'"));
  ASSERT_GT(pid, 0);
  const bool saved = appears(checkpoint);  // the first periodic checkpoint: training is on
  ::kill(pid, SIGTERM);
  const ToolResult r = finish(pid);
  ASSERT_TRUE(saved) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 143) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "interrupted (SIGTERM) after step")) << r.out;
  const Checkpoint c = load_checkpoint(checkpoint);
  EXPECT_GE(c.step, 5);
  EXPECT_TRUE(contains(r.out, cat("wrote checkpoint ", checkpoint, " (step ", c.step, ")")))
      << r.out;
  EXPECT_TRUE(temporaries().empty());
}

// SIGKILL cannot be caught: the checkpoint on disk is the last one written, whole. A kill in
// the middle of a write leaves its temporary file ("<checkpoint>.tmp.<pid>.<n>"); the next run
// writing that checkpoint removes it, and nothing else (not a running process's).
TEST_F(CliTrain, AfterSigkillTheCheckpointLoadsAndTheNextRunRemovesStaleTemporaries) {
  const std::string checkpoint = path("k.npz");
  const pid_t pid = start_train(cat(kSmall, " --steps 100000000 --log-every 1000 ",
                                    "--checkpoint-every 3 --checkpoint '", checkpoint, "'"));
  ASSERT_GT(pid, 0);
  const bool saved = appears(checkpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // more checkpoints: any moment
  ::kill(pid, SIGKILL);
  const ToolResult killed = finish(pid);
  ASSERT_TRUE(saved) << killed.out << killed.err;
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL);
  const int64_t step = load_checkpoint(checkpoint).step;
  EXPECT_GE(step, 3);

  // What a kill during a write leaves (the killed process's pid: no process has it now), and
  // the temporary file of a write in progress (this test's parent's pid: a running process).
  const std::string stale = cat("k.npz.tmp.", pid, ".7"),
                    live = cat("k.npz.tmp.", ::getppid(), ".0");
  std::ofstream(path(stale)) << "torn";
  std::ofstream(path(live)) << "in progress";
  std::ofstream(path("k.npz.tmp.notes")) << "someone's";
  const ToolResult r =
      train(cat(kSmall, " --steps 2 --resume '", checkpoint, "' --checkpoint '", checkpoint, "'"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, cat("removed ", path(stale), " (left by a killed run)"))) << r.out;
  EXPECT_EQ(load_checkpoint(checkpoint).step, step + 2);
  std::vector<std::string> left = temporaries();
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{live, "k.npz.tmp.notes"}));
}

// A checkpoint that could not be written is found before anything is compiled or trained (not
// after the training, losing it): one line naming the path and why, nothing on stdout.
TEST_F(CliTrain, AnUnwritableCheckpointPathFailsBeforeTraining) {
  std::ofstream(path("plain")) << "a file";
  fs::create_directory(path("folder"));
  const std::pair<std::string, std::string> cases[] = {
      {path("missing/c.npz"), cat("the folder '", path("missing"), "' does not exist")},
      {path("plain/c.npz"), cat("'", path("plain"), "' is not a folder")},
      {path("folder"), "is a folder (give a file name)"},
  };
  for (const auto& [checkpoint, why] : cases) {
    const auto start = std::chrono::steady_clock::now();
    const ToolResult r = train(cat(kSmall, " --steps 100000 --checkpoint '", checkpoint, "'"));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << checkpoint;
    EXPECT_EQ(r.err, cat("fusebox: error: [checkpoint: ", checkpoint, "] ", why, "\n"));
    EXPECT_EQ(r.out, "");    // not even the model's summary: nothing was compiled
    EXPECT_LT(seconds, 30);  // (100,000 steps would take minutes)
  }
  // Without write permission (root writes anyway: the check asks the filesystem, which lets it).
  ASSERT_EQ(::chmod(path("folder").c_str(), 0555), 0);
  if (::geteuid() != 0) {
    const ToolResult r = train(cat(kSmall, " --steps 1 --checkpoint '", path("folder/c.npz"), "'"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_TRUE(contains(r.err, "Permission denied")) << r.err;
  }
  ::chmod(path("folder").c_str(), 0755);
}

// A resumed checkpoint's step count: negative is refused on load, and one that --steps more
// would take past what 64 bits count is refused before training, naming the file (it once
// wrapped around: no step ran, and the run exited 0).
// --export writes the trained model as ONNX: its constants are the trained weights and running
// statistics (those of the checkpoint written at the same step), its batch norms inference
// ones, and `fusebox run` runs it; a path that cannot be written fails before training.
TEST_F(CliTrain, ExportWritesTheTrainedModel) {
  const ToolResult r = train(
      cat(kSmall, " --steps 3 --checkpoint '", path("c.npz"), "' --export '", path("m.onnx"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, cat("exported the trained model (step 3) to ", path("m.onnx"))))
      << r.out;
  const Checkpoint ckpt = load_checkpoint(path("c.npz"));
  const Graph exported = import_onnx_file(path("m.onnx"));
  size_t compared = 0;
  for (const auto* tensors : {&ckpt.parameters, &ckpt.buffers}) {
    for (const auto& [name, t] : *tensors) {
      const std::optional<ValueId> v = exported.find_value(name);
      ASSERT_TRUE(v && exported.is_constant(*v)) << name;
      EXPECT_TRUE(all_close(*exported.constant(*v), t, 0, 0)) << name;
      ++compared;
    }
  }
  EXPECT_GE(compared, 8u);  // small_cnn's weights and its batch norms' statistics
  int batch_norms = 0;
  for (const Node& n : exported.nodes()) {
    if (n.op != OpKind::batch_norm) continue;
    ++batch_norms;
    EXPECT_FALSE(std::get<BatchNormAttrs>(n.attrs).training) << n.name;
  }
  EXPECT_EQ(batch_norms, 2);
  const ToolResult run = tool(cat("run '", path("m.onnx"), "' --device cpu"));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;

  const ToolResult bad = train(cat(kSmall, " --steps 100000 --export '", path("no/m.onnx"), "'"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(contains(bad.err, cat("[--export ", path("no/m.onnx"), "] the folder"))) << bad.err;
  EXPECT_EQ(bad.out, "");
}

// --eval-data: after each epoch (32 samples at batch 8: every 4 steps) and after the last step,
// the loss and the top-1 / top-5 accuracy on the held-out set, every sample counted; a set that
// does not fit the model is an error before training.
TEST_F(CliTrain, EvalDataIsEvaluatedEachEpoch) {
  const Dataset val = synthetic_dataset(20, 3, 8, 10, 9);
  write_npz(path("val.npz"), {{"x", val.x}, {"y", val.y}});
  const ToolResult r = train(cat(kSmall, " --steps 10 --eval-data '", path("val.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"eval  epoch 1.00 (step 4): loss ", "eval  epoch 2.00 (step 8): loss ",
                           "eval  epoch 2.50 (step 10): loss "})
    EXPECT_TRUE(contains(r.out, line)) << line << " in " << r.out;
  EXPECT_TRUE(contains(r.out, "%  (20 images)")) << r.out;
  const std::regex accuracy("top-1 ([0-9.]+)%  top-5 ([0-9.]+)%");
  int lines = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), accuracy), end; it != end; ++it) {
    EXPECT_LE(std::stod((*it)[1]), std::stod((*it)[2])) << it->str();
    ++lines;
  }
  EXPECT_EQ(lines, 3);

  const Dataset wrong = synthetic_dataset(4, 3, 16, 10, 9);  // 16x16 images for an 8x8 model
  write_npz(path("wrong.npz"), {{"x", wrong.x}, {"y", wrong.y}});
  const ToolResult bad = train(cat(kSmall, " --steps 1 --eval-data '", path("wrong.npz"), "'"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(contains(bad.err, cat("[eval data: ", path("wrong.npz"), "]"))) << bad.err;
  EXPECT_FALSE(contains(bad.out, "loss")) << bad.out;
}

TEST_F(CliTrain, ResumedStepCountsThatCannotContinueAreRefused) {
  ASSERT_EQ(train(cat(kSmall, " --steps 1 --checkpoint '", path("s.npz"), "'")).exit_code, 0);
  std::map<std::string, Tensor> arrays = read_npz(path("s.npz"));
  for (const int64_t step : {std::numeric_limits<int64_t>::max(), int64_t(-1)}) {
    arrays["__meta__/step"] = Tensor::from_vector<int64_t>({}, {step});
    write_npz(path("edited.npz"), arrays);
    const ToolResult r = train(cat(kSmall, " --steps 100 --resume '", path("edited.npz"), "'"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_TRUE(contains(r.err, cat("[checkpoint: ", path("edited.npz"), "]"))) << r.err;
    EXPECT_TRUE(contains(r.err, step < 0 ? "'__meta__/step' is negative (-1)"
                                         : "its step count 9223372036854775807 plus --steps 100 "
                                           "is too many: the last step a run can reach"))
        << r.err;
    EXPECT_FALSE(contains(r.out, "trained")) << r.out;
  }
  // Without a checkpoint: --steps alone past it is a usage error.
  const ToolResult r = train(cat(kSmall, " --steps 9223372036854775807"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "--steps 9223372036854775807 is too many: the last step a run "
                       "can reach (batch 8) is 1152921504606846974"))
      << r.err;
}

TEST_F(CliTrain, OnnxModelAndDataFile) {
  Graph g = build_zoo_model("small_cnn", {.batch = 4, .image_size = 8, .num_classes = 3});
  export_onnx_file(g, path("m.onnx"));
  Dataset data = synthetic_dataset(12, 3, 8, 3, 1);
  write_npz(path("d.npz"), {{"x", data.x}, {"y", data.y.cast(DType::i32)}});
  ToolResult r = train(cat("'", path("m.onnx"), "' --data '", path("d.npz"),
                           "' --steps 6 --optimizer adamw --lr 0.01"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "batch 4 from 12 images")) << r.out;

  // Labels outside the model's 3 classes.
  write_npz(path("bad.npz"), {{"x", data.x}, {"y", Tensor::full(DType::i64, {12}, 5)}});
  r = train(cat("'", path("m.onnx"), "' --data '", path("bad.npz"), "' --steps 1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "fusebox: error:")) << r.err;
  EXPECT_TRUE(contains(r.err, "label 5 at index 0")) << r.err;
  // A fixed batch size.
  r = train(cat("'", path("m.onnx"), "' --data '", path("d.npz"), "' --batch-size 8"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "fixed at 4")) << r.err;
}

// A decoder on token data: --synthetic makes next-token sequences (the model's input is
// token ids), a .npz of x, y [N, T] trains too, and labels of another shape are named.
TEST_F(CliTrain, DecoderTrainsOnTokens) {
  ToolResult r = train(
      "gpt2_test --synthetic --seq-len 16 --batch-size 4 --samples 16 --steps 30 "
      "--optimizer adamw --lr 0.003 --log-every 10");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "16 tokens")) << r.out;
  EXPECT_TRUE(contains(r.out, "batch 4 from 16 synthetic sequences")) << r.out;
  EXPECT_TRUE(contains(r.out, "sequences/s; loss")) << r.out;  // the summary line too
  const std::vector<double> losses = progress_losses(r.out);
  ASSERT_EQ(losses.size(), 3u) << r.out;
  EXPECT_LT(losses.back(), losses.front() * 0.8) << r.out;

  const Dataset tokens = synthetic_token_dataset(8, 12, 128, 4);
  write_npz(path("t.npz"), {{"x", tokens.x.cast(DType::i32)}, {"y", tokens.y}});
  r = train(cat("gpt2_test --batch-size 4 --steps 2 --data '", path("t.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "12 tokens")) << r.out;  // the data's sequence length
  write_npz(path("short_y.npz"), {{"x", tokens.x}, {"y", Tensor::full(DType::i64, {8}, 1)}});
  r = train(cat("gpt2_test --batch-size 4 --steps 1 --data '", path("short_y.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "'y' must be integer [8, 12]")) << r.err;
  r = train("gpt2_test --synthetic --seq-len 40 --steps 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "exceeds the model's 32 positions")) << r.err;
}

// A segmentation model: logits [N, classes, H, W] against per-pixel labels (--synthetic bins
// channel 0 into the classes).
TEST_F(CliTrain, SegmentationTrainsOnPerPixelLabels) {
  ToolResult r = train(
      "unet_test --synthetic --image-size 16 --num-classes 3 --batch-size 2 "
      "--samples 4 --steps 30 --optimizer adamw --lr 0.003 --log-every 10");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::vector<double> losses = progress_losses(r.out);
  ASSERT_EQ(losses.size(), 3u) << r.out;
  EXPECT_LT(losses.back(), losses.front() * 0.8) << r.out;
  const Dataset d = synthetic_segmentation_dataset(2, 3, 8, 4, 1);
  ASSERT_EQ(d.y.shape(), (Shape{2, 8, 8}));
  EXPECT_EQ(d.y.get(5), double(std::min<int64_t>(3, int64_t((d.x.get(5) + 1) / 2 * 4))));
  write_npz(path("seg.npz"), {{"x", d.x}, {"y", d.y}});
  r = train(
      cat("unet_test --num-classes 4 --batch-size 2 --steps 1 --data '", path("seg.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  write_npz(path("class.npz"), {{"x", d.x}, {"y", Tensor::full(DType::i64, {2}, 1)}});
  r = train(
      cat("unet_test --num-classes 4 --batch-size 2 --steps 1 --data '", path("class.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "labels are [] per sample but the model's logits need [8, 8]"))
      << r.err;
}

TEST_F(CliTrain, BadInputIsAClearError) {
  struct Case {
    std::string args;
    int code;
    std::string needle;
  };
  Dataset data = synthetic_dataset(4, 3, 8, 10, 1);
  write_npz(path("no_y.npz"), {{"x", data.x}});
  write_npz(path("float_y.npz"), {{"x", data.x}, {"y", data.x}});
  write_npz(path("wrong_size.npz"), {{"x", data.x}, {"y", data.y}});
  const std::vector<Case> cases = {
      {"resnet7 --synthetic", 1, "unknown model 'resnet7'"},
      {"small_cnn --synthetic --loss mse", 2, "only cross_entropy"},
      {"small_cnn", 2, "--synthetic"},
      {cat("small_cnn --synthetic --data '", path("no_y.npz"), "'"), 2, "exactly one"},
      {cat("small_cnn --data '", path("no_y.npz"), "'"), 1, "no array 'y'"},
      {cat("small_cnn --data '", path("float_y.npz"), "'"), 1, "'y' must be integer"},
      {cat("small_cnn --image-size 16 --data '", path("wrong_size.npz"), "'"), 1,
       "samples are [3, 8, 8]"},
      {cat("small_cnn --synthetic --resume '", path("none.npz"), "'"), 1, "none.npz"},
      {"small_cnn --synthetic --optimizer adamw --momentum 0.9", 2, "--momentum"},
      {"small_cnn --synthetic --optimizer rmsprop", 2, "rmsprop"},
      {"small_cnn --synthetic --lr -1", 1, "lr"},
      {cat("'", path("absent.onnx"), "' --synthetic"), 1, "absent.onnx"},
  };
  for (const Case& c : cases) {
    ToolResult r = train(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.needle)) << c.args << "\n" << r.err;
    if (c.code == 1) {
      EXPECT_TRUE(contains(r.err, "fusebox: error:")) << r.err;
    }
  }
}

TEST_F(CliTrain, ResumingWithAnotherOptimizerNamesTheMismatch) {
  ASSERT_EQ(train(cat(kSmall, " --steps 1 --checkpoint '", path("s.npz"), "'")).exit_code, 0);
  ToolResult r = train(cat(kSmall, " --steps 1 --optimizer adamw --resume '", path("s.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "sgd")) << r.err;
  EXPECT_TRUE(contains(r.err, "adamw")) << r.err;
  r = train(cat(kSmall, " --steps 1 --momentum 0.5 --resume '", path("s.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "momentum")) << r.err;
  // Another model: its names do not match.
  r =
      train(cat("small_cnn --synthetic --image-size 8 --batch-size 8 --num-classes 4 --steps 1 "
                "--resume '",
                path("s.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "fc.bias")) << r.err;
}

TEST_F(CliTrain, CudaDeviceGivesTheExecutorsError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  ToolResult r = train(cat(kSmall, " --steps 1 --device cuda"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "CUDA")) << r.err;
}

// Data parallel (docs/distributed.md) without GPUs: what is refused, and how. (Ranks that train:
// tests/mpi on the CPU, the GPU runs of --gpus N in bench/results.)
TEST_F(CliTrain, DataParallelRefusalsNameWhatIsWrong) {
  ToolResult r = train(cat(kSmall, " --steps 1 --gpus 2"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--gpus 2 trains on CUDA: add --device cuda")) << r.err;
  const char* rank_env =
      "FUSEBOX_RANK=0 FUSEBOX_WORLD_SIZE=1 FUSEBOX_MASTER_ADDR=127.0.0.1 FUSEBOX_MASTER_PORT=1";
  r = train(cat(kSmall, " --steps 1 --gpus 2 --device cuda"), rank_env);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "--gpus starts the ranks itself")) << r.err;
  if (!cuda_available()) {
    r = train(cat(kSmall, " --steps 1 --gpus 2 --device cuda"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--gpus 2: this machine has 0 GPU(s)")) << r.err;
  }
  // A rank started by a scheduler on the CPU backend: refused (its world is MPI's, under mpirun).
  r = train(
      cat(kSmall, " --steps 1"),
      "FUSEBOX_RANK=0 FUSEBOX_WORLD_SIZE=1 FUSEBOX_MASTER_ADDR=127.0.0.1 FUSEBOX_MASTER_PORT=1");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "data-parallel training runs on CUDA")) << r.err;
  r = train(cat(kSmall, " --steps 1 --reduce-dtype f16"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // The data-parallel options in one process: refused, naming the option.
  for (const char* option : {"--sync-bn", "--bucket-mb 4", "--reduce-dtype bf16"}) {
    r = train(cat(kSmall, " --steps 1 ", option));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, std::string(option).substr(0, std::string(option).find(' ')) +
                                    " applies to data-parallel runs"))
        << r.err;
  }
}

// The image stream's options (train/image_stream.h) without images to stream: refused, naming
// the option.
TEST_F(CliTrain, StreamOptionsWithoutImagesAreRefused) {
  for (const char* option : {"--augment", "--read-ahead 2", "--data-threads 1"}) {
    const ToolResult r = train(cat(kSmall, " --steps 1 ", option));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, std::string(option).substr(0, std::string(option).find(' ')) +
                                    " applies to --data as a folder of images or tar shards"))
        << r.err;
  }
}

// `fusebox bench`: both modes on the CPU print every figure and write them as JSON.
TEST_F(CliTrain, BenchPrintsAndWritesEveryFigure) {
  for (const char* mode : {"train", "infer"}) {
    const std::string json = path(cat(mode, ".json"));
    ToolResult r = tool(cat("bench small_cnn --mode ", mode,
                            " --batch 4 --image-size 16 "
                            "--num-classes 10 --device cpu --steps 2 --warmup 1 --json '",
                            json, "'"));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (const char* figure : {"compile (first step)", "images/s", "ms/step", "host time per step",
                               "peak device memory", "intermediates' peak   at node '"})
      EXPECT_TRUE(contains(r.out, figure)) << mode << ": " << r.out;
    const std::string text = slurp(json);
    for (const char* key : {"\"compile_s\"", "\"images_per_s\"", "\"step_ms_median\"",
                            "\"host_us_per_step\"", "\"peak_device_bytes\"",
                            "\"peak_device_bytes_first_step\"", "\"peak_device_bytes_steps\""})
      EXPECT_TRUE(contains(text, key)) << mode << ": " << text;
    EXPECT_EQ(contains(text, "\"final_loss\""), std::string(mode) == "train") << text;
  }
}

// --report in training mode: each node of the step timed (the backward's and the optimizer's
// nodes among them), on a copy of the step that leaves the session's state alone.
TEST_F(CliTrain, BenchProfilesTheTrainingStep) {
  const ToolResult r = tool(
      "bench small_cnn --mode train --batch 4 --image-size 16 --num-classes 10 "
      "--device cpu --steps 2 --warmup 1 --report");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* part : {"time by op", "conv_backward_filter", "sum of node times", "images/s"})
    EXPECT_TRUE(contains(r.out, part)) << part << ": " << r.out;
}

TEST_F(CliTrain, BenchRefusesWhatItCannotDo) {
  ToolResult r = tool("bench no_such_model --device cpu --steps 1");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "no_such_model")) << r.err;
  // --dot draws the inference pipeline only: in training mode a usage error, not ignored.
  r = tool(cat("bench small_cnn --mode train --device cpu --steps 1 --dot '", path("t.dot"), "'"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--dot is for --mode infer")) << r.err;
  // A --json file that could not be written: refused before benchmarking, not after.
  r = tool(cat("bench small_cnn --device cpu --steps 1 --json '", path("missing/b.json"), "'"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, cat("[--json ", path("missing/b.json"), "] the folder"))) << r.err;
  EXPECT_FALSE(contains(r.out, "images/s")) << r.out;
}

// f16 trains (dynamic loss scaling): the summary gives the skipped steps and the scale, the
// checkpoint holds the scaler, a resume continues it, and a bf16 resume of it is refused.
TEST_F(CliTrain, F16TrainsWithLossScalingAndCountsSkippedSteps) {
  ToolResult r = train(
      cat(kSmall, " --steps 6 --log-every 3 --precision f16 --checkpoint '", path("h.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "on cpu, f16")) << r.out;
  EXPECT_EQ(progress_losses(r.out).size(), 2u) << r.out;
  std::smatch m;
  const std::regex summary(
      R"(loss scaling: (\d+) steps skipped so far \(inf/NaN gradients\), loss scale ([0-9.e+]+))");
  ASSERT_TRUE(std::regex_search(r.out, m, summary)) << r.out;
  const int skipped = std::stoi(m[1]);
  EXPECT_LT(skipped, 6) << r.out;
  EXPECT_EQ(std::stod(m[2]), std::ldexp(1.0, 16 - skipped)) << r.out;  // no growth in 6 steps
  const Checkpoint c = load_checkpoint(path("h.npz"));
  ASSERT_EQ(c.scaler.size(), 3u);
  EXPECT_EQ(c.scaler.at("skipped_steps").get(0), double(skipped));
  EXPECT_EQ(c.scaler.at("loss_scale").get(0), std::ldexp(1.0, 16 - skipped));

  r = train(cat(kSmall, " --steps 2 --precision f16 --resume '", path("h.npz"), "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(contains(r.out, "trained 2 steps (7 to 8)")) << r.out;
  EXPECT_TRUE(contains(r.out, "steps skipped so far")) << r.out;
  r = train(cat(kSmall, " --steps 1 --precision bf16 --resume '", path("h.npz"), "'"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(contains(r.err, "loss-scaling state")) << r.err;
  EXPECT_TRUE(contains(r.err, "bf16")) << r.err;

  // `fusebox bench` trains in f16 too.
  r = tool(
      "bench small_cnn --mode train --precision f16 --batch 4 --image-size 16 --num-classes 10 "
      "--device cpu --steps 1 --warmup 1");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "images/s")) << r.out;
}

}  // namespace
}  // namespace fusebox::testing
