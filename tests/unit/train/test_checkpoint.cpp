// Checkpoints: round trips, bit-exact resume, damaged files and mismatched sessions.
#include <unistd.h>

#include <filesystem>

#include "fusebox/io/tensor_file.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace fusebox::testing {
namespace {

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / cat("fusebox_ckpt_", ::getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// Substring check on an Error's message.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' in " << e.what();
  }
}

const OptimizerSpec kSgd = SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
const OptimizerSpec kAdamW = AdamWOptions{.lr = 0.01};

BatchSampler sampler() {
  return BatchSampler(synthetic_dataset(16, 3, 8, 10, 5), 4, true, 9);
}

TEST_F(Checkpoints, RoundTripRestoresEveryStateTensor) {
  for (const OptimizerSpec& spec : {kSgd, kAdamW}) {
    SCOPED_TRACE(optimizer_name(spec));
    TrainingSession a(small_cnn(4, 8), LossSpec{}, spec);
    BatchSampler s = sampler();
    for (int i = 0; i < 2; ++i) a.step(zoo_batch(s, i));
    a.set_lr(0.123);
    a.save(path("a.npz"));

    TrainingSession b(small_cnn(4, 8), LossSpec{}, spec);
    b.load(path("a.npz"));
    EXPECT_EQ(b.step_count(), 2);
    EXPECT_EQ(b.lr(), 0.123);
    EXPECT_TRUE(same_tensors(a.parameters(), b.parameters()));
    EXPECT_TRUE(same_tensors(a.buffers(), b.buffers()));
    EXPECT_TRUE(same_tensors(a.optimizer_state(), b.optimizer_state()));
    EXPECT_FALSE(a.optimizer_state().empty());

    // The file is a plain .npz with the documented keys.
    std::map<std::string, Tensor> arrays = read_npz(path("a.npz"));
    EXPECT_EQ(arrays.at("__meta__/format").get(0), double(kCheckpointFormat));
    EXPECT_EQ(arrays.at("__meta__/step").get(0), 2.0);
    EXPECT_TRUE(same_bits(arrays.at("param/fc.weight"), a.parameters().at("fc.weight")));
    EXPECT_TRUE(arrays.count("buffer/bn1.running_mean"));
    EXPECT_TRUE(arrays.count(std::holds_alternative<SgdOptions>(spec)
                                 ? "optim/conv1.weight/momentum_buffer"
                                 : "optim/conv1.weight/exp_avg_sq"));
  }
}

// 6 steps straight == 3 steps, checkpoint, a fresh session, 3 steps: bit for bit.
TEST_F(Checkpoints, ResumeReproducesTheLossesBitForBit) {
  for (const OptimizerSpec& spec :
       {kSgd, kAdamW, OptimizerSpec(SgdOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.5})}) {
    SCOPED_TRACE(cat(optimizer_name(spec)));
    BatchSampler s = sampler();
    TrainingSession straight(small_cnn(4, 8), LossSpec{}, spec);
    std::vector<float> expected;
    for (int i = 0; i < 6; ++i) expected.push_back(straight.step(zoo_batch(s, i)));

    TrainingSession first(small_cnn(4, 8), LossSpec{}, spec);
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(same_bits(first.step(zoo_batch(s, i)), expected[size_t(i)]));
    first.save(path("half.npz"));

    TrainingSession resumed(small_cnn(4, 8), LossSpec{}, spec);
    resumed.load(path("half.npz"));
    for (int i = 3; i < 6; ++i) {
      const float loss = resumed.step(zoo_batch(s, resumed.step_count()));
      EXPECT_TRUE(same_bits(loss, expected[size_t(i)]))
          << "step " << i + 1 << ": " << loss << " vs " << expected[size_t(i)];
    }
    EXPECT_TRUE(same_tensors(resumed.parameters(), straight.parameters()));
    EXPECT_TRUE(same_tensors(resumed.optimizer_state(), straight.optimizer_state()));
    EXPECT_TRUE(same_tensors(resumed.buffers(), straight.buffers()));
  }
}

TEST_F(Checkpoints, CorruptAndTruncatedFilesAreClearErrors) {
  TrainingSession a(small_cnn(4, 8), LossSpec{}, kSgd);
  a.save(path("good.npz"));
  const std::string bytes = read_file(path("good.npz"));

  // A bit flipped in the middle (inside some tensor's data): the CRC catches it.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = char(flipped[flipped.size() / 2] ^ 0x10);
  write_file_atomic(path("flipped.npz"), flipped);
  TrainingSession b(small_cnn(4, 8), LossSpec{}, kSgd);
  expect_error([&] { b.load(path("flipped.npz")); }, {path("flipped.npz")});

  for (size_t keep : {bytes.size() - 1, bytes.size() / 2, size_t(30), size_t(0)}) {
    write_file_atomic(path("short.npz"), bytes.substr(0, keep));
    SCOPED_TRACE(cat("truncated to ", keep, " bytes"));
    expect_error([&] { b.load(path("short.npz")); }, {path("short.npz")});
  }
  expect_error([&] { b.load(path("missing.npz")); }, {path("missing.npz")});
  EXPECT_EQ(b.step_count(), 0);
  EXPECT_TRUE(same_tensors(b.parameters(),
                           TrainingSession(small_cnn(4, 8), LossSpec{}, kSgd).parameters()));
}

TEST_F(Checkpoints, AnotherModelOrOptimizerIsRejectedNamingTheMismatch) {
  TrainingSession sgd(small_cnn(4, 8), LossSpec{}, kSgd);
  sgd.save(path("sgd.npz"));
  const std::string file = "checkpoint: " + path("sgd.npz");

  TrainingSession adamw(small_cnn(4, 8), LossSpec{}, kAdamW);
  expect_error([&] { adamw.load(path("sgd.npz")); }, {file, "sgd", "adamw"});

  TrainingSession other_momentum(small_cnn(4, 8), LossSpec{},
                                 SgdOptions{.lr = 0.05, .momentum = 0.5, .weight_decay = 1e-4});
  expect_error([&] { other_momentum.load(path("sgd.npz")); }, {file, "momentum", "0.9", "0.5"});

  // Another width: same names, other shapes.
  TrainingSession wider(
      build_zoo_model("small_cnn",
                      {.batch = 4, .image_size = 8, .num_classes = 7, .training = true}),
      LossSpec{}, kSgd);
  expect_error([&] { wider.load(path("sgd.npz")); }, {file, "fc.bias", "f32[10]", "f32[7]"});

  // Another architecture: names missing.
  TrainingSession resnet(
      build_zoo_model("resnet18",
                      {.batch = 2, .image_size = 8, .num_classes = 10, .training = true}),
      LossSpec{}, kSgd);
  expect_error([&] { resnet.load(path("sgd.npz")); }, {file, "parameter '"});

  // Momentum 0 keeps no buffers: a momentum checkpoint is refused for the hyper-parameter.
  TrainingSession plain(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.05, .weight_decay = 1e-4});
  expect_error([&] { plain.load(path("sgd.npz")); }, {file, "momentum"});
}

TEST_F(Checkpoints, LayoutIsValidatedOnParse) {
  TrainingSession a(small_cnn(4, 8), LossSpec{}, kAdamW);
  std::map<std::string, Tensor> arrays = parse_npz(serialize_checkpoint(a.checkpoint()), "mem");
  auto reparsed = [&](const std::map<std::string, Tensor>& changed) {
    return [changed] { parse_checkpoint(serialize_npz(changed), "ckpt.npz"); };
  };

  auto future = arrays;
  future["__meta__/format"] = Tensor::scalar(DType::i64, 99);
  expect_error(reparsed(future), {"ckpt.npz", "format version 99"});

  auto no_step = arrays;
  no_step.erase("__meta__/step");
  expect_error(reparsed(no_step), {"ckpt.npz", "__meta__/step"});

  auto float_step = arrays;
  float_step["__meta__/step"] = Tensor::scalar(DType::f32, 3);
  expect_error(reparsed(float_step), {"__meta__/step", "i64 scalar"});

  auto no_beta = arrays;
  no_beta.erase("__meta__/beta2");
  expect_error(reparsed(no_beta), {"__meta__/beta2"});

  auto bad_code = arrays;
  bad_code["__meta__/optimizer"] = Tensor::scalar(DType::i64, 7);
  expect_error(reparsed(bad_code), {"optimizer code 7"});

  auto stray = arrays;
  stray["weights/x"] = Tensor::zeros(DType::f32, {1});
  expect_error(reparsed(stray), {"'weights/x'"});

  auto extra_param = arrays;
  extra_param["param/extra.weight"] = Tensor::zeros(DType::f32, {1});
  TrainingSession b(small_cnn(4, 8), LossSpec{}, kAdamW);
  Checkpoint ckpt = parse_checkpoint(serialize_npz(extra_param), "x.npz");
  expect_error([&] { b.restore(ckpt, "x.npz"); }, {"x.npz", "extra.weight", "does not have"});

  auto dtype = arrays;
  dtype["optim/fc.bias/exp_avg"] = Tensor::zeros(DType::f64, {10});
  ckpt = parse_checkpoint(serialize_npz(dtype), "y.npz");
  expect_error([&] { b.restore(ckpt, "y.npz"); },
               {"y.npz", "fc.bias/exp_avg", "f64[10]", "f32[10]"});
}

// A checkpoint written over an existing one replaces it whole, and leaves no temporary
// file behind.
TEST_F(Checkpoints, SavingReplacesAtomically) {
  TrainingSession a(small_cnn(4, 8), LossSpec{}, kSgd);
  a.save(path("c.npz"));
  BatchSampler s = sampler();
  a.step(zoo_batch(s, 0));
  a.save(path("c.npz"));
  EXPECT_EQ(load_checkpoint(path("c.npz")).step, 1);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

}  // namespace
}  // namespace fusebox::testing
