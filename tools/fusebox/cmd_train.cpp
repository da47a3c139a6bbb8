// fusebox train: train a zoo model or an ONNX model on an .npz data set or a synthetic
// one, with checkpoints and resume.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>

#include "common.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/dist/launcher.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/train/checkpoint.h"
#include "fusebox/train/data.h"
#include "fusebox/train/data_parallel.h"
#include "fusebox/train/evaluate.h"
#include "fusebox/train/image_stream.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"
#include "stop_signals.h"

namespace fusebox::cli {
namespace {

struct TrainArgs {
  std::string model;
  std::string memory_limit;
  std::string loss = "cross_entropy";
  std::string optimizer = "sgd";
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
  int64_t batch_size = 16;
  int64_t steps = 100;
  std::string device = "cpu";
  std::string precision = "tf32";
  uint64_t seed = 0;
  std::string checkpoint;
  std::string export_path;  // --export: the trained model as ONNX
  int64_t checkpoint_every = 0;
  std::string resume;
  int64_t image_size = 32;
  int64_t num_classes = 10;
  int64_t seq_len = 0;
  std::string data;
  std::string eval_data;        // --eval-data: a held-out set evaluated each epoch
  bool strict_data = false;     // --strict-data: an image that does not decode is an error
  bool augment = false;         // --augment: random-resized-crop and flip of --data's images
  int64_t read_ahead = 4;       // --read-ahead: batches of --data's images decoded ahead
  int data_threads = 0;         // --data-threads: their decoding threads (0: half the machine's)
  std::string layout = "nchw";  // --layout: how an .npz holds its images
  bool synthetic = false;
  int64_t samples = 64;
  bool shuffle = false;
  int64_t log_every = 0;
  std::vector<std::string> shapes;
  int gpus = 1;
  double bucket_mb = 25;
  std::string reduce_dtype = "f32";
  bool sync_bn = false;

  // Which options were given (CLI11 fills these after parsing).
  CLI::App* app = nullptr;
  bool given(const std::string& option) const { return app->count(option) > 0; }
};

// The optimizer: the checkpoint's when resuming, else the defaults of --optimizer; then
// the hyper-parameters given on the command line. (A resumed run whose options differ
// from the checkpoint's is refused by TrainingSession::restore, naming the difference.)
OptimizerSpec make_optimizer(const TrainArgs& args, const Checkpoint* resume) {
  OptimizerSpec spec = args.optimizer == "adamw" ? OptimizerSpec(AdamWOptions{})
                                                 : SgdOptions{.lr = 0.05, .momentum = 0.9};
  if (resume && (!args.given("--optimizer") || args.optimizer == optimizer_name(resume->optimizer)))
    spec = resume->optimizer;
  if (args.given("--lr")) spec = with_lr(spec, args.lr);
  if (auto* sgd = std::get_if<SgdOptions>(&spec)) {
    if (args.given("--momentum")) sgd->momentum = args.momentum;
    if (args.given("--weight-decay")) sgd->weight_decay = args.weight_decay;
  } else {
    if (args.given("--momentum")) throw UsageError("--momentum applies to --optimizer sgd only");
    if (args.given("--weight-decay")) std::get<AdamWOptions>(spec).weight_decay = args.weight_decay;
  }
  check_optimizer(spec, "fusebox train");
  return spec;
}

std::string describe(const OptimizerSpec& spec) {
  std::ostringstream os;
  os << optimizer_name(spec);
  for (const auto& [name, value] : optimizer_hyper_parameters(spec)) {
    os << " " << name << " ";
    if (name == "nesterov") {
      os << (value != 0 ? "on" : "off");
    } else {
      os << value;
    }
  }
  return os.str();
}

struct Model {
  Graph graph;
  std::string description;
};

// A zoo model in training form, or an imported ONNX model. The image size (a decoder's
// sequence length) of a zoo model follows --data when --image-size (--seq-len) is not given.
Model load_model(const TrainArgs& args, const Dataset* data) {
  ZooOptions opts{.batch = args.batch_size,
                  .image_size = args.image_size,
                  .num_classes = args.num_classes,
                  .seed = args.seed,
                  .training = true,
                  .sequence_length = args.seq_len};
  const bool tokens = data && is_integer(data->x.dtype());
  if (data && !tokens && !args.given("--image-size")) opts.image_size = data->x.dim(-1);
  if (tokens && !args.given("--seq-len")) opts.sequence_length = data->x.dim(-1);
  Graph g = load_model_argument(
      args.model, args.shapes, opts,
      args.given("--image-size") || args.given("--num-classes") || args.given("--seq-len"),
      /*training=*/true, /*onnx_batch=*/args.batch_size);
  if (is_onnx_path(args.model)) return {std::move(g), args.model};
  const Value& in = g.value(g.inputs().at(0));
  if (is_integer(in.type.dtype))
    return {std::move(g),
            cat(args.model, " (zoo, ", in.type.shape.back(), " tokens, seed ", args.seed, ")")};
  return {std::move(g), cat(args.model, " (zoo, ", opts.image_size, "x", opts.image_size, ", ",
                            opts.num_classes, " classes, seed ", args.seed, ")")};
}

// The batches of an unshuffled set repeat: batch i starts at sample i*B mod N, so there are
// N / gcd(N, B) different ones. On the GPU they are uploaded once and fed from device
// memory (a device copy per step instead of a host gather and a PCIe copy), when they
// are few; otherwise (shuffled, many, or on the CPU) batches come from the host.
class DeviceBatches {
 public:
  DeviceBatches(const BatchSampler& batches, const Value& input, Device device, bool shuffle) {
    if (device != Device::cuda || shuffle) return;
    const int64_t n = batches.dataset_size(), b = batches.batch_size();
    const int64_t distinct = n / std::gcd(n, b);
    if (distinct > kMaxDistinct) return;
    for (int64_t i = 0; i < distinct; ++i) {
      auto [x, y] = batches.batch(i);
      if (x.dtype() != input.type.dtype) x = x.cast(input.type.dtype);
      batches_.push_back({{input.name, DeviceArray::upload(x, device)},
                          {"labels", DeviceArray::upload(y, device)}});
    }
  }
  bool active() const { return !batches_.empty(); }
  const Feeds& batch(int64_t index) const { return batches_[size_t(index) % batches_.size()]; }

 private:
  static constexpr int64_t kMaxDistinct = 8;
  std::vector<Feeds> batches_;
};

// This process's command line (/proc/self/cmdline), its program the executable itself.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  FUSEBOX_CHECK(!argv.empty(), "fusebox train", "cannot read /proc/self/cmdline");
  std::vector<char> exe(4096);
  const ssize_t n = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  FUSEBOX_CHECK(n > 0, "fusebox train", "cannot read /proc/self/exe");
  argv[0] = std::string(exe.data(), size_t(n));
  return argv;
}

// --gpus N: the same command without --gpus, once per rank (dist/launcher.h); the ranks find
// each other through the variables launch_local sets. Returns the run's exit status.
int launch_ranks(const TrainArgs& args) {
  if (const std::optional<dist::DistEnv> e = dist::DistEnv::from_env())
    throw Error("fusebox train",
                cat("--gpus starts the ranks itself, but this process is already rank ", e->rank,
                    " of ", e->world_size, " by ", e->launcher,
                    "'s variables (drop --gpus, or start it outside the launcher)"));
  if (parse_device(args.device) != Device::cuda)
    throw UsageError(cat("--gpus ", args.gpus, " trains on CUDA: add --device cuda"));
  if (args.gpus > cuda_device_count())
    throw UsageError(
        cat("--gpus ", args.gpus, ": this machine has ", cuda_device_count(), " GPU(s)"));
  std::vector<std::string> argv;
  const std::vector<std::string> own = own_command_line();
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i] == "--gpus") {
      ++i;  // and its value
      continue;
    }
    if (own[i].rfind("--gpus=", 0) == 0) continue;
    argv.push_back(own[i]);
  }
  const dist::LaunchResult r = dist::launch_local(args.gpus, argv);
  const char* signal = signal_name(r.stop_signal);
  if (!r.ok)
    throw Error("fusebox train", cat("--gpus ", args.gpus, ": ", r.why,
                                     r.stop_signal != 0 ? cat(" (after ", signal, ")") : ""));
  if (r.stop_signal != 0) {
    std::cout << "interrupted (" << signal << "): every rank stopped after the same step\n";
    return 128 + r.stop_signal;
  }
  return 0;
}

// What every rank must agree on before training together (dist::check_same_run).
std::map<std::string, std::string> run_signature(const TrainArgs& args) {
  std::map<std::string, std::string> sig;
  sig["model"] = args.model;
  for (const char* option :
       {"--optimizer",   "--lr",        "--momentum",    "--weight-decay", "--batch-size",
        "--steps",       "--precision", "--seed",        "--resume",       "--image-size",
        "--num-classes", "--seq-len",   "--data",        "--eval-data",    "--synthetic",
        "--samples",     "--shuffle",   "--shape",       "--bucket-mb",    "--reduce-dtype",
        "--sync-bn",     "--layout",    "--strict-data", "--augment"}) {
    const CLI::Option* o = args.app->get_option_no_throw(option);
    if (o != nullptr && o->count() > 0) sig[option] = o->as<std::string>();
  }
  return sig;
}

// Data parallel, after the last step: every rank's parameters must be rank 0's, bit for bit
// (the same averaged gradients, the same update); a drift is an Error naming the rank.
void check_parameters_agree(DataParallelRun& run, const TrainingSession& session) {
  size_t hash = 0;
  for (const auto& [name, t] : session.parameters()) {
    const size_t h = std::hash<std::string_view>{}(
        std::string_view(static_cast<const char*>(t.raw()), t.nbytes()));
    hash = hash * 1000003u ^ h;
  }
  dist::check_same_run(
      *run.store, run.env.rank, run.env.world_size,
      {{cat("parameters after step ", session.step_count(), " (hash)"), std::to_string(hash)}},
      "parameters");
  dist::wait_for_ranks(*run.store, run.env.rank, run.env.world_size, "parameters checked");
}

// The run's last step, and the positions in the batch stream up to it ((step x world + rank) x
// batch: shard_batch_index, BatchSampler), must count in 64 bits: a resumed checkpoint's step
// count plus --steps too large is an error naming the file, not a run that overflows.
void check_step_count(const TrainArgs& args, int64_t batch, int world, const Checkpoint* resume) {
  const int64_t most = std::numeric_limits<int64_t>::max() / batch / world - 1;
  const std::string limit =
      cat("the last step a run can reach (batch ", batch,
          world > 1 ? cat(" on each of ", world, " ranks") : "", ") is ", most);
  if (!resume) {
    if (args.steps > most) throw UsageError(cat("--steps ", args.steps, " is too many: ", limit));
    return;
  }
  FUSEBOX_CHECK(args.steps <= most - resume->step, "checkpoint: " + args.resume, "its step count ",
                resume->step, " plus --steps ", args.steps, " is too many: ", limit);
}

// --data / --eval-data as images: a folder of class folders, or WebDataset tar shards (a
// path ending in .tar, or a pattern of them with braces); nullopt for anything else (an .npz).
struct ImageSet {
  std::string source;
  std::shared_ptr<const ImageFolder> folder;  // one of the two
  std::shared_ptr<const ImageShards> shards;

  int64_t classes() const { return folder ? int64_t(folder->classes.size()) : shards->classes; }
  int64_t ignored() const { return folder ? folder->ignored : shards->ignored; }
  const char* ignored_what() const {
    return folder ? "files that are no image ignored" : "samples without an image ignored";
  }
  // "    classes: 0=cat 1=dog\n" for a folder (labels from its names), "" for shards.
  std::string class_names() const {
    if (!folder) return "";
    std::string out = "    classes:";
    for (size_t i = 0; i < folder->classes.size(); ++i) out += cat(" ", i, "=", folder->classes[i]);
    return out + "\n";
  }
  int64_t size() const {
    return folder ? int64_t(folder->files.size()) : int64_t(shards->samples.size());
  }
  DecodedFolder decode(int64_t size, bool strict) const {
    return folder ? decode_image_folder(*folder, size, strict)
                  : decode_image_shards(*shards, size, strict);
  }
  std::function<LabelledImage(int64_t)> images() const {
    return folder ? folder_images(folder) : shard_images(shards);
  }
};

std::optional<ImageSet> image_set(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return ImageSet{path, std::make_shared<const ImageFolder>(scan_image_folder(path)), {}};
  const bool tar = path.size() >= 4 && path.compare(path.size() - 4, 4, ".tar") == 0;
  if (tar || path.find('{') != std::string::npos)
    return ImageSet{path, {}, std::make_shared<const ImageShards>(read_image_shards(path))};
  return std::nullopt;
}

int train(const TrainArgs& args) {
  apply_memory_limit(args.memory_limit);
  if (args.gpus > 1) return launch_ranks(args);
  if (args.loss != "cross_entropy")
    throw UsageError(cat("unknown --loss '", args.loss, "': only cross_entropy is supported"));
  if (args.synthetic == !args.data.empty())
    throw UsageError("give exactly one of --data (DIR, SHARDS.tar or FILE.npz) and --synthetic");
  if (args.given("--checkpoint-every") && args.checkpoint.empty())
    throw UsageError("--checkpoint-every needs --checkpoint FILE");
  if (args.given("--samples") && !args.synthetic)
    throw UsageError("--samples applies to --synthetic only");
  // The data-parallel options would change nothing in one process: refused, not ignored.
  const std::optional<dist::DistEnv> rank_env = dist::DistEnv::from_env();
  if (!rank_env) {
    for (const char* option : {"--sync-bn", "--bucket-mb", "--reduce-dtype"})
      if (args.given(option))
        throw UsageError(cat(option,
                             " applies to data-parallel runs (--gpus N with N > 1, or a rank "
                             "started by torchrun, srun, mpirun or the FUSEBOX_* rendezvous "
                             "variables)"));
  }

  // Before anything is loaded or compiled: a run that could not save its checkpoint fails now,
  // not after its training. (Rank 0 alone writes it.)
  if (!args.checkpoint.empty() && (!rank_env || rank_env->rank == 0)) {
    for (const std::string& stale : prepare_checkpoint_path(args.checkpoint))
      std::cout << "removed " << stale << " (left by a killed run)\n";
  }
  if (!args.export_path.empty() && (!rank_env || rank_env->rank == 0))
    check_writable(args.export_path, "--export " + args.export_path);
  std::optional<Checkpoint> resume;
  if (!args.resume.empty()) resume = load_checkpoint(args.resume);
  const OptimizerSpec optimizer = make_optimizer(args, resume ? &*resume : nullptr);
  // Image folders and tar shards are read now (a bad one fails before compiling) and decoded
  // once the model says its input size; a zoo model takes their class count.
  const ImageLayout layout = args.layout == "nhwc" ? ImageLayout::nhwc : ImageLayout::nchw;
  std::optional<ImageSet> images, eval_images;
  std::optional<Dataset> data, eval_data;
  if (!args.data.empty()) {
    images = image_set(args.data);
    if (!images) data = load_dataset(args.data, layout);
  }
  // The stream's options would change nothing for an in-memory set: refused, not ignored.
  if (!images) {
    for (const char* option : {"--augment", "--read-ahead", "--data-threads"})
      if (args.given(option))
        throw UsageError(cat(option,
                             " applies to --data as a folder of images or tar shards (decoded "
                             "as the run draws them), not to ",
                             args.synthetic ? "--synthetic" : "an .npz set"));
  }
  if (!args.eval_data.empty()) {
    eval_images = image_set(args.eval_data);
    if (!eval_images) eval_data = load_dataset(args.eval_data, layout);
  }
  if (images && eval_images && images->folder && eval_images->folder &&
      eval_images->folder->classes != images->folder->classes)
    throw Error(
        "fusebox train",
        cat("--eval-data ", args.eval_data, " has classes other than --data ", args.data, "'s (",
            eval_images->classes(), " vs ", images->classes(), " class folders, matched by name)"));
  TrainArgs model_args = args;
  if (images && !args.given("--num-classes")) model_args.num_classes = images->classes();

  std::optional<TracePhase> loading(std::in_place, "train: load the model");
  Model model = load_model(model_args, data ? &*data : nullptr);
  loading.reset();
  const Graph& g = model.graph;
  if (g.inputs().size() != 1 || g.outputs().size() != 1) {
    throw Error("fusebox train", cat("the model must have one input (images or token ids) and "
                                     "one output (logits), got ",
                                     g.inputs().size(), " and ", g.outputs().size()));
  }
  const Value& input = g.value(g.inputs()[0]);
  const Value& logits = g.value(g.outputs()[0]);
  // Images [N, C, H, W] -> logits [N, classes] (labels [N]) or [N, classes, H', W']
  // (segmentation: labels [N, H', W']); token ids [N, T] -> logits [N, vocab, T] (next-token
  // prediction: labels [N, T]).
  const bool tokens = is_integer(input.type.dtype);
  const Shape& xs = input.type.shape;
  const Shape& ls = logits.type.shape;
  FUSEBOX_CHECK(tokens ? xs.size() == 2 && ls.size() == 3 && ls[0] == xs[0] && ls[2] == xs[1]
                       : xs.size() == 4 && (ls.size() == 2 || ls.size() == 4) && ls[0] == xs[0],
                "fusebox train",
                "the model must take images [N, C, H, W] and give logits [N, classes] or "
                "[N, classes, H, W], or take token ids [N, T] and give logits [N, vocab, T]; got ",
                input.name, " ", dtype_name(input.type.dtype), shape_str(xs), " and ", logits.name,
                " ", shape_str(ls));
  const int64_t batch = xs[0], classes = ls[1];
  const Shape label_shape(ls.begin() + 2, ls.end());  // [], [H', W'] or [T]
  const bool per_pixel = !tokens && ls.size() == 4;
  if (args.given("--batch-size") && args.batch_size != batch)
    throw UsageError(cat("the model's batch size is fixed at ", batch,
                         "; drop --batch-size or use ", "--shape ", input.name, "=",
                         args.batch_size, ",..."));
  const Shape sample(input.type.shape.begin() + 1, input.type.shape.end());
  // An image set decoded to the model's input: RGB, square; what it held goes to
  // `image_notes` (printed with the run's header).
  std::ostringstream image_notes;
  auto check_images = [&](const ImageSet& set, const std::string& option) {
    FUSEBOX_CHECK(!tokens && !per_pixel && sample[0] == 3 && sample[1] == sample[2],
                  "fusebox train", option, " ", set.source,
                  " holds images for a classifier of square RGB images [N, 3, S, S]; the model "
                  "takes ",
                  shape_str(xs), " and gives logits ", shape_str(ls));
    FUSEBOX_CHECK(set.classes() <= classes, "fusebox train", option, " ", set.source, " holds ",
                  set.classes(), " classes; the model's logits have ", classes);
  };
  auto decode_images = [&](const ImageSet& set, const std::string& option) {
    check_images(set, option);
    DecodedFolder decoded = set.decode(sample[1], args.strict_data);
    image_notes << "  " << option << " " << set.source << ": " << decoded.data.size()
                << " images of " << set.classes() << " classes decoded to 3x" << sample[1] << "x"
                << sample[1];
    if (decoded.skipped > 0)
      image_notes << "; " << decoded.skipped
                  << " skipped (do not decode; the first: " << decoded.first_skipped << ")";
    if (set.ignored() > 0) image_notes << "; " << set.ignored() << " " << set.ignored_what();
    image_notes << "\n" << set.class_names();
    return std::move(decoded.data);
  };
  // The training images are decoded as the run draws them (train/image_stream.h); the
  // evaluation set once, here.
  if (images) {
    check_images(*images, "--data");
    image_notes << "  --data " << images->source << ": " << images->size() << " images of "
                << images->classes() << " classes, decoded as drawn to 3x" << sample[1] << "x"
                << sample[1] << " (" << args.read_ahead << " batches ahead)"
                << (args.augment ? ", random-resized-crop and flip" : ", resize and centre crop");
    if (images->ignored() > 0)
      image_notes << "; " << images->ignored() << " " << images->ignored_what();
    image_notes << "\n" << images->class_names();
  }
  if (eval_images) eval_data = decode_images(*eval_images, "--eval-data");
  if (args.synthetic && tokens) {
    data = synthetic_token_dataset(args.samples, sample[0], classes, args.seed);
  } else if (args.synthetic && per_pixel) {
    FUSEBOX_CHECK(sample[1] == sample[2] && label_shape == Shape({sample[1], sample[2]}),
                  "fusebox train", "--synthetic makes square images with labels per pixel; the ",
                  "model takes ", shape_str(sample), " and gives logits ", shape_str(ls));
    data = synthetic_segmentation_dataset(args.samples, sample[0], sample[1], classes, args.seed);
  } else if (args.synthetic) {
    FUSEBOX_CHECK(sample[1] == sample[2], "fusebox train", "--synthetic makes square images; the ",
                  "model takes ", shape_str(sample));
    data = synthetic_dataset(args.samples, sample[0], sample[1], classes, args.seed);
  } else if (data) {
    check_dataset(*data, sample, label_shape, classes, "data: " + args.data);
  }
  if (eval_data)
    check_dataset(*eval_data, sample, label_shape, classes, "eval data: " + args.eval_data);
  const char* unit = tokens ? "sequences" : "images";
  std::optional<BatchSampler> batches;  // the in-memory sets' (else the stream's)
  if (data) batches.emplace(*data, batch, args.shuffle, args.seed);
  const int64_t train_size = data ? data->size() : images->size();

  const Precision precision = parse_precision(args.precision);
  set_float_math(precision);  // before the backend reads its settings
  const Device device = parse_device(args.device);
  reset_peak_device_memory(device);  // the peak printed at the end: the whole run's, weights in
  // A rank of a data-parallel run (--gpus, or a scheduler's variables): rank 0 speaks, writes
  // checkpoints and reports the run's throughput; the loss is the ranks' mean.
  std::optional<DataParallelRun> parallel = join_data_parallel_run(device, run_signature(args));
  // A rank takes SIGINT and SIGTERM (the launcher forwards them) from here on, even while
  // compiling, so that every rank stops after the same step. One process takes them from its
  // first step: before it, a signal ends the run at once, with nothing trained to save.
  std::optional<StopSignals> stop_signals;
  if (parallel) stop_signals.emplace();
  const int rank = parallel ? parallel->env.rank : 0;
  const int world = parallel ? parallel->env.world_size : 1;
  std::optional<ImageStream> stream;  // --data's images (a folder or shards), for this rank
  if (images)
    stream.emplace(images->size(), images->images(), batch,
                   ImageTransform{.size = sample[1], .augment = args.augment}, args.shuffle,
                   args.seed, args.strict_data, args.read_ahead, args.data_threads,
                   "--data " + images->source, world);
  check_step_count(args, batch, world, resume ? &*resume : nullptr);
  std::ostringstream quiet;
  std::ostream& out = rank == 0 ? std::cout : quiet;
  SessionOptions session_options{
      .device = device, .cpu_kernels = cpu_kernels_for(args.device), .precision = precision};
  if (parallel) {
    session_options.data_parallel = {
        .world = parallel->world,
        .bucket_bytes = size_t(args.bucket_mb * double(1 << 20)),
        .reduce_dtype = args.reduce_dtype == "bf16" ? DType::bf16 : DType::f32,
        .sync_batch_norm = args.sync_bn};
  }
  std::optional<TracePhase> setting_up(std::in_place, "train: session setup");
  TrainingSession session(g, LossSpec{}, optimizer, session_options);
  setting_up.reset();
  if (resume) {
    session.restore(*resume, "checkpoint: " + args.resume);
    if (args.given("--lr")) session.set_lr(args.lr);
  }

  int64_t values = 0;
  for (const std::string& name : session.parameter_names())  // shapes only: no download
    values += numel(session.step_executable().input(name).shape());
  out << "training " << model.description << " on " << device_name(device) << ", "
      << precision_name(precision) << "\n"
      << "  " << session.parameter_names().size() << " parameter tensors (" << with_commas(values)
      << " values), " << describe(session.optimizer()) << "\n";
  if (parallel)
    out << "  data parallel: " << world << " ranks (GPUs), batch " << batch << " each ("
        << batch * world << " a step), gradients in " << fixed(args.bucket_mb, 1)
        << " MB buckets reduced as " << args.reduce_dtype
        << (args.sync_bn ? ", batch norms synchronized" : "") << "\n";
  out << "  batch " << batch << " from " << train_size
      << (args.synthetic ? cat(" synthetic ", unit) : cat(" ", unit, " from ", args.data))
      << (args.shuffle ? ", shuffled" : ", in order") << "\n"
      << image_notes.str();
  if (resume)
    out << "  resumed from " << args.resume << " at step " << session.step_count() << "\n";

  const int64_t first = session.step_count() + 1, last = session.step_count() + args.steps;
  Progress progress(first, last,
                    args.log_every > 0 ? args.log_every : std::max<int64_t>(1, args.steps / 10));
  std::optional<DeviceBatches> device_batches;
  if (batches) device_batches.emplace(*batches, input, device, args.shuffle);
  const auto start = std::chrono::steady_clock::now();
  float first_loss = 0, loss = 0;
  // Steps are queued (the device runs behind the host); each loss is reported once it has
  // arrived, so the host never waits for a step it does not need to.
  std::deque<std::pair<int64_t, PendingTensor>> losses;
  // A rank that died or hangs stops this one within the timeout (data_parallel.h).
  std::optional<PeerProgress> peers;  // before the watchdog, whose thread reads it
  std::optional<StepWatchdog> watchdog;
  if (parallel) {
    peers.emplace(*parallel);
    watchdog.emplace(rank, parallel->env.timeout, stop_on_stall(*parallel),
                     [&peers] { return peers->describe(); });
  }
  // Steady state: the time from the arrival of step `settled`'s loss (the first steps hold
  // one-time work: graph instantiation, the allocator's first blocks) to the last one's.
  const int64_t settled = first + std::min<int64_t>(10, args.steps / 5);
  std::optional<std::chrono::steady_clock::time_point> settled_at;
  // The host's time making the batches (drawing, gathering, casting) against the time per
  // step: where data takes most of a step, the data is the bottleneck, not the device.
  double data_seconds = 0;
  int64_t data_batches = 0;
  auto report = [&](bool wait) {
    while (!losses.empty() && (wait || losses.front().second.ready())) {
      const auto [step, pending] = losses.front();
      losses.pop_front();
      loss = float(pending.get().get(0));
      if (step == settled) settled_at = std::chrono::steady_clock::now();
      if (watchdog) {
        watchdog->progress(step);
        peers->publish(step);
      }
      if (step == first) first_loss = loss;
      FUSEBOX_CHECK(std::isfinite(loss), "fusebox train", "the loss is ", loss, " at step ", step,
                    " (is the learning rate too high?)");
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double steps_done = double(step - first + 1);
      if (rank == 0)
        progress.update(
            step,
            cat("loss ", fixed(loss, 4), "  ",
                fixed(steps_done * double(batch * world) / seconds, 1), " ", unit, "/s  step ",
                fixed(1000 * seconds / steps_done, 2), " ms, data ",
                fixed(1000 * data_seconds / double(std::max<int64_t>(1, data_batches)), 2), " ms"));
    }
  };
  if (!stop_signals) stop_signals.emplace();
  // --eval-data: after every epoch (a pass over the training set: ceil(N / (batch x ranks))
  // steps) and after the last step, rank 0 evaluates the model in eval form.
  const int64_t steps_per_epoch = (train_size + batch * world - 1) / (batch * world);
  int64_t evaluated_at = -1;
  auto run_eval = [&] {
    const int64_t step = session.step_count();
    if (!eval_data || rank != 0 || step == evaluated_at) return;
    report(true);
    const EvalResult e = evaluate(session, *eval_data, input.name, logits.name, batch,
                                  "eval data: " + args.eval_data);
    evaluated_at = step;
    const int64_t k = std::min<int64_t>(5, classes);
    out << "eval  epoch " << fixed(double(step) / double(steps_per_epoch), 2) << " (step " << step
        << "): loss " << fixed(e.loss, 4) << "  top-1 " << fixed(100 * e.top1, 2) << "%  top-" << k
        << " " << fixed(100 * e.top5, 2) << "%  (" << e.samples << " " << unit
        << (e.positions != e.samples ? cat(", ", e.positions, " positions") : "") << ")\n";
  };
  auto take_step = [&] {
    const int64_t taking = session.step_count() + 1;  // the step being queued
    const int64_t index = shard_batch_index(session.step_count(), rank, world);
    const auto drawing = std::chrono::steady_clock::now();
    auto data_done = [&] {
      data_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - drawing).count();
      ++data_batches;
    };
    if (device_batches && device_batches->active()) {
      const Feeds& feeds = device_batches->batch(index);
      data_done();
      losses.emplace_back(taking, session.step_async(feeds));
    } else {
      auto [x, y] = batches ? batches->batch(index) : stream->batch(index);
      if (x.dtype() != input.type.dtype) x = x.cast(input.type.dtype);
      data_done();
      losses.emplace_back(taking, session.step_async(NamedTensors{{input.name, x}, {"labels", y}}));
    }
    const int64_t step = session.step_count();
    report(false);
    if (args.checkpoint_every > 0 && step % args.checkpoint_every == 0 && step != last) {
      report(true);  // a checkpoint only of steps known to be good
      if (rank == 0) session.save(args.checkpoint);
    }
    if (step % steps_per_epoch == 0) run_eval();
  };
  if (session.step_count() < last && stop_signal() == 0) {
    const TracePhase first("train: first step (queued)");
    take_step();
  }
  while (session.step_count() < last && stop_signal() == 0) take_step();
  // Data parallel: the launcher forwarded the signal to every rank; they stop after one step
  // (the most any has queued), so that none waits in a collective for a step a peer never takes.
  const int stopped_by = stop_signal();  // later signals change nothing
  if (parallel && stopped_by != 0) {
    const int64_t stop = agree_on_last_step(*parallel, session.step_count());
    while (session.step_count() < stop) take_step();
  }
  report(true);
  watchdog.reset();  // the end's checks wait with the store's own timeout
  const auto finished = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(finished - start).count();
  const int64_t done = session.step_count() - first + 1, end = session.step_count();
  if (stopped_by != 0)
    out << "interrupted (" << signal_name(stopped_by) << ") after step " << end << " of " << last
        << "\n";

  out << std::fixed << "trained " << done << " steps (" << first << " to " << end << ") in "
      << std::setprecision(2) << seconds << " s, " << std::setprecision(1)
      << double(done * batch * world) / seconds << " " << unit << "/s"
      << (world > 1 ? cat(" (", world, " ranks)") : "") << "; loss " << std::setprecision(4)
      << first_loss << " -> " << loss << "\n";
  if (stream && stream->skipped() > 0)
    out << "  --data: " << stream->skipped()
        << (stream->skipped() == 1 ? " image skipped (does not decode"
                                   : " images skipped (do not decode")
        << "; the first: " << stream->first_skipped() << ")\n";
  if (settled_at && end > settled) {
    const double steady = std::chrono::duration<double>(finished - *settled_at).count();
    out << "  steady state (steps " << settled + 1 << " to " << end << "): " << std::setprecision(1)
        << double((end - settled) * batch * world) / steady << " " << unit << "/s, "
        << std::setprecision(2) << 1000 * steady / double(end - settled) << " ms/step\n";
  }
  if (device == Device::cuda) {  // what PyTorch's max_memory_allocated counts (not the context)
    out << "  peak device memory: " << std::setprecision(1)
        << double(device_memory_stats(device).peak) / double(1 << 20)
        << " MiB (fusebox's allocator, the whole run)\n";
  }
  if (precision == Precision::f16) {  // the scaler's state: read once, after every step
    out << "  loss scaling: " << session.skipped_steps()
        << " steps skipped so far (inf/NaN gradients), loss scale " << std::defaultfloat
        << std::setprecision(10) << session.loss_scale() << "\n";
  }
  if (parallel) {
    check_parameters_agree(*parallel, session);
    out << "  parameters identical on all " << world << " ranks (bit for bit)\n";
  }
  run_eval();  // the last step's, unless it ended an epoch
  if (!args.checkpoint.empty() && rank == 0) {
    session.save(args.checkpoint);
    out << "wrote checkpoint " << args.checkpoint << " (step " << session.step_count() << ")\n";
  }
  if (!args.export_path.empty() && rank == 0) {
    // The model as given, its constants the trained weights, batch norms in inference form.
    write_file_atomic(args.export_path, export_onnx_bytes(session.trained_model(g)));
    out << "exported the trained model (step " << session.step_count() << ") to "
        << args.export_path << "\n";
  }
  return stopped_by != 0 ? 128 + stopped_by : 0;  // a shell's status for a program stopped so
}

}  // namespace

Command add_train_command(CLI::App& parent) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* app = parent.add_subcommand(
      "train", "Train a zoo model or an ONNX model (cross-entropy classification)");
  args->app = app;
  app->footer(
      "SIGINT (Ctrl-C) or SIGTERM (a scheduler's pre-emption) while training: the queued steps "
      "finish, the checkpoint (--checkpoint) is written, and train exits with 130 (SIGINT) or "
      "143 (SIGTERM); with --gpus N every rank stops after the same step. A signal before the "
      "first step ends the run at once (nothing trained yet). SIGKILL leaves the last "
      "checkpoint written, whole.");
  app->add_option("model", args->model,
                  "A zoo model name (see `fusebox zoo --list`) or an .onnx file")
      ->required()
      ->type_name("MODEL.onnx|ZOO_NAME");
  app->add_option("--loss", args->loss, "The loss; only cross_entropy (the default)");
  app->add_option("--optimizer", args->optimizer, "sgd (default) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app->add_option("--lr", args->lr, "Learning rate; default 0.05 (sgd), 0.001 (adamw)");
  app->add_option("--momentum", args->momentum, "SGD momentum; default 0.9");
  app->add_option("--weight-decay", args->weight_decay, "Default 0 (sgd), 0.01 (adamw)");
  app->add_option("--batch-size", args->batch_size,
                  "Zoo models, and ONNX models whose batch (dim 0) is symbolic; default 16")
      ->check(integer_range(1));
  app->add_option("--steps", args->steps,
                  "Steps to take (a resumed run takes this many more); "
                  "default 100")
      ->check(integer_range(1));
  app->add_option("--device", args->device,
                  "cpu (the fast kernels where they take a node: oneDNN's forward and backward "
                  "convolutions, products, pooling), cpu-ref (the reference kernels alone, "
                  "exact), cuda, or auto (cuda when available, else cpu); default cpu")
      ->check(CLI::IsMember({"cpu", "cpu-ref", "cuda", "auto"}));
  app->add_option("--precision", args->precision,
                  "f32, tf32 (default: TF32 convolutions and matmuls), bf16 or f16 (mixed "
                  "precision: docs/mixed_precision.md; f16 with dynamic loss scaling: steps "
                  "with inf/NaN gradients are skipped and counted)")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  app->add_option("--seed", args->seed,
                  "Seed for zoo weights, synthetic data and shuffling; "
                  "default 0")
      ->check(seed_number());
  app->add_option("--checkpoint", args->checkpoint,
                  "Write a checkpoint here at the end (and when stopped by SIGINT or SIGTERM). "
                  "Its folder must exist and be writable: checked before training. Temporary "
                  "files of killed runs beside it (FILE.tmp.<pid>.<n>, pid gone) are removed")
      ->type_name("FILE");
  app->add_option("--export", args->export_path,
                  "Write the trained model here as ONNX at the end (also when stopped by SIGINT "
                  "or SIGTERM): the model's graph with the trained weights and running "
                  "statistics, batch norms in inference form, for `fusebox run` or any ONNX "
                  "runtime")
      ->type_name("FILE.onnx");
  app->add_option("--checkpoint-every", args->checkpoint_every, "Also every N steps")
      ->type_name("N")
      ->check(integer_range(1));
  app->add_option("--resume", args->resume,
                  "Continue from a checkpoint (its optimizer settings "
                  "apply unless given)")
      ->type_name("FILE");
  app->add_option("--image-size", args->image_size, "Zoo models; default 32, or the data's")
      ->check(integer_range(1));
  app->add_option("--num-classes", args->num_classes, "Zoo models; default 10")
      ->check(integer_range(1));
  app->add_option("--seq-len", args->seq_len,
                  "Zoo decoders (gpt2*): tokens per sequence; default the model's, or the data's")
      ->check(integer_range(1));
  app->add_option("--data", args->data,
                  "A folder of class folders of PNG / JPEG images (DIR/<class>/<image>: labels "
                  "from the sorted folder names), or WebDataset tar shards ('train-{0000..0127}"
                  ".tar': key.jpg|png + key.cls); each image resized and centre-cropped to the "
                  "model's input, normalised as ImageNet's; or an .npz of arrays x: float "
                  "[N, C, H, W] and y: integer [N] or [N, H, W], or x: token ids [N, T] and y: "
                  "next tokens [N, T]")
      ->type_name("DIR|SHARDS.tar|FILE.npz");
  app->add_option("--layout", args->layout,
                  "How an .npz of --data / --eval-data holds its images: nchw ([N, C, H, W], "
                  "default) or nhwc ([N, H, W, C], as numpy image stacks); uint8 images become "
                  "x / 255 normalised with ImageNet's mean and std")
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  app->add_flag("--augment", args->augment,
                "Training augmentations for --data's images (a folder or shards): "
                "torchvision's RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) and "
                "RandomHorizontalFlip, drawn from --seed and each image's place in the run (the "
                "same seed, the same batches); default: resize and centre crop, as --eval-data");
  app->add_option("--read-ahead", args->read_ahead,
                  "Batches of --data's images (a folder or shards) decoded ahead of the step "
                  "that takes them, on --data-threads threads while the steps run; default 4")
      ->check(integer_range(1));
  app->add_option("--data-threads", args->data_threads,
                  "Threads decoding --data's images; default 0: half the machine's threads")
      ->check(CLI::Range(0, 1024));
  app->add_flag("--strict-data", args->strict_data,
                "An image of --data / --eval-data that does not decode is an error naming it "
                "(default: skipped and counted)");
  app->add_option("--eval-data", args->eval_data,
                  "A held-out set in --data's form: after every epoch (a pass over the training "
                  "set) and after the last step, the model in eval form (batch norms with their "
                  "running statistics) on it: loss, top-1 and top-5 accuracy (per pixel or "
                  "token for such models)")
      ->type_name("DIR|SHARDS.tar|FILE.npz");
  app->add_flag("--synthetic", args->synthetic,
                "A fixed, seeded, learnable set: images (class patterns plus noise), per-pixel "
                "classes for a segmentation model, token sequences for a model of token ids");
  app->add_option("--samples", args->samples, "Size of the synthetic set; default 64")
      ->check(integer_range(1));
  app->add_flag("--shuffle", args->shuffle, "Shuffle each epoch (seeded by --seed)");
  app->add_option("--log-every", args->log_every,
                  "When not on a terminal, print a line every N steps; default steps/10")
      ->type_name("N")
      ->check(integer_range(1));
  add_shape_option(*app, &args->shapes);
  app->add_option("--gpus", args->gpus,
                  "Data-parallel training on N GPUs of this machine: N processes, one per GPU, "
                  "each with --batch-size samples a step, gradients averaged through NCCL "
                  "(docs/distributed.md); default 1. Processes torchrun, srun or mpirun starts "
                  "are ranks by their variables instead (or FUSEBOX_RANK, FUSEBOX_WORLD_SIZE, "
                  "FUSEBOX_MASTER_ADDR/PORT)")
      ->type_name("N")
      ->check(integer_range(1, std::numeric_limits<int>::max()));
  app->add_option("--bucket-mb", args->bucket_mb,
                  "Data parallel: gradient megabytes per all-reduce bucket; default 25")
      ->check(positive_real(1 << 20));
  app->add_option("--reduce-dtype", args->reduce_dtype,
                  "Data parallel: what gradients are summed in, f32 (default) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app->add_flag("--sync-bn", args->sync_bn,
                "Data parallel: batch norms use the statistics of the whole step's batch (all "
                "GPUs), as PyTorch's SyncBatchNorm: each exchanges its per-channel totals, one "
                "small all-gather forward and one backward (docs/distributed.md)");
  add_memory_limit_option(*app, &args->memory_limit);
  return {app, [args] { return train(*args); }};
}

}  // namespace fusebox::cli
