// Datasets: the synthetic set, .npz loading and checks, and batch drawing.
#include "fusebox/train/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusebox/io/tensor_file.h"
#include "train/image_normalise.h"
#include "zoo/layers.h"

namespace fusebox {

namespace {

// A triangle wave of period 1 with range [-1, 1]: a portable stand-in for a cosine
// (plain arithmetic, so the synthetic set is the same everywhere).
double triangle(double t) {
  return 4 * std::abs(t - std::floor(t) - 0.5) - 1;
}

}  // namespace

Dataset synthetic_dataset(int64_t samples, int64_t channels, int64_t image_size,
                          int64_t num_classes, uint64_t seed) {
  const std::string where = "synthetic data";
  FUSEBOX_CHECK(samples >= 1 && channels >= 1 && image_size >= 1 && num_classes >= 1, where,
                "samples, channels, image size and classes must be >= 1, got ", samples, ", ",
                channels, ", ", image_size, ", ", num_classes);
  const int64_t plane = image_size * image_size, image = channels * plane;

  // Each class's pattern: 0.5 * offset[c] + 0.5 * triangle(fx * w / S + fy * h / S + phase[c]).
  std::vector<float> patterns(size_t(num_classes * image));
  for (int64_t k = 0; k < num_classes; ++k) {
    zoo::Rng rng = zoo::tensor_rng(seed, cat("synthetic.class", k));
    const double fx = rng.uniform(-2, 2), fy = rng.uniform(-2, 2);
    for (int64_t c = 0; c < channels; ++c) {
      const double offset = rng.uniform(-1, 1), phase = rng.uniform(0, 1);
      for (int64_t h = 0; h < image_size; ++h) {
        for (int64_t w = 0; w < image_size; ++w) {
          const double t = (fx * double(w) + fy * double(h)) / double(image_size) + phase;
          patterns[size_t(k * image + c * plane + h * image_size + w)] =
              float(0.5 * offset + 0.5 * triangle(t));
        }
      }
    }
  }

  Dataset data{Tensor::empty(DType::f32, {samples, channels, image_size, image_size}),
               Tensor::empty(DType::i64, {samples})};
  float* x = data.x.data<float>();
  int64_t* y = data.y.data<int64_t>();
  zoo::Rng noise = zoo::tensor_rng(seed, "synthetic.noise");
  for (int64_t i = 0; i < samples; ++i) {
    y[i] = i % num_classes;
    const float* pattern = &patterns[size_t(y[i] * image)];
    for (int64_t j = 0; j < image; ++j)
      x[i * image + j] = pattern[j] + float(0.3 * noise.uniform(-1, 1));
  }
  return data;
}

Dataset synthetic_token_dataset(int64_t samples, int64_t tokens, int64_t vocab, uint64_t seed) {
  FUSEBOX_CHECK(samples >= 1 && tokens >= 1 && vocab >= 2, "synthetic tokens",
                "samples and tokens must be >= 1 and the vocabulary >= 2, got ", samples, ", ",
                tokens, ", ", vocab);
  Dataset data{Tensor::empty(DType::i64, {samples, tokens}),
               Tensor::empty(DType::i64, {samples, tokens})};
  int64_t* x = data.x.data<int64_t>();
  int64_t* y = data.y.data<int64_t>();
  zoo::Rng rng = zoo::tensor_rng(seed, "synthetic.tokens");
  auto next = [vocab](int64_t t) { return (5 * t + 3) % vocab; };
  for (int64_t i = 0; i < samples; ++i) {
    int64_t t = int64_t(rng.next() % uint64_t(vocab));
    for (int64_t j = 0; j < tokens; ++j) {
      x[i * tokens + j] = t;
      t = next(t);
      y[i * tokens + j] = t;
    }
  }
  return data;
}

Dataset synthetic_segmentation_dataset(int64_t samples, int64_t channels, int64_t image_size,
                                       int64_t num_classes, uint64_t seed) {
  FUSEBOX_CHECK(samples >= 1 && channels >= 1 && image_size >= 1 && num_classes >= 1,
                "synthetic segmentation data",
                "samples, channels, image size and classes must be >= 1, got ", samples, ", ",
                channels, ", ", image_size, ", ", num_classes);
  const int64_t plane = image_size * image_size, image = channels * plane;
  Dataset data{Tensor::empty(DType::f32, {samples, channels, image_size, image_size}),
               Tensor::empty(DType::i64, {samples, image_size, image_size})};
  float* x = data.x.data<float>();
  int64_t* y = data.y.data<int64_t>();
  zoo::Rng rng = zoo::tensor_rng(seed, "synthetic.segmentation");
  for (int64_t i = 0; i < samples * image; ++i) x[i] = float(rng.uniform(-1, 1));
  for (int64_t i = 0; i < samples; ++i)
    for (int64_t p = 0; p < plane; ++p) {
      const double v = (double(x[i * image + p]) + 1) / 2;  // channel 0, in [0, 1)
      y[i * plane + p] = std::min(num_classes - 1, int64_t(v * double(num_classes)));
    }
  return data;
}

namespace {

// Images x [N, C, H, W] (nhwc: [N, H, W, C]) as f32 [N, C, H, W]: bytes (integer) normalised
// (imagenet_normalised for 3 channels, else / 255), floats checked finite.
Tensor images_as_nchw_f32(const Tensor& x, ImageLayout layout, const std::string& where) {
  const bool nhwc = layout == ImageLayout::nhwc;
  const int64_t n = x.dim(0), c = x.dim(nhwc ? 3 : 1), h = x.dim(nhwc ? 1 : 2),
                w = x.dim(nhwc ? 2 : 3);
  const bool bytes = is_integer(x.dtype());  // uint8 images (read_npy widens u1 to i32)
  const Tensor f = x.dtype() == DType::f32 ? x : x.cast(DType::f32);
  const float* in = f.data<float>();
  Tensor out = Tensor::empty(DType::f32, {n, c, h, w});
  float* o = out.data<float>();
  for (int64_t s = 0; s < n; ++s)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < h * w; ++i) {
        const int64_t from = nhwc ? (s * h * w + i) * c + ch : (s * c + ch) * h * w + i;
        float v = in[from];
        if (bytes) {
          if (!(v >= 0 && v <= 255))
            throw Error(where, cat("array 'x' of integer images holds ", int64_t(v), " in sample ",
                                   s, " (image bytes are 0 to 255)"));
          v = c == 3 ? imagenet_normalised(int(ch), v) : v / 255.f;
        } else if (!std::isfinite(v)) {
          throw Error(where, cat("array 'x' holds ", std::isnan(v) ? "a NaN" : "an infinity",
                                 " in sample ", s, " (channel ", ch,
                                 "): training on it would "
                                 "give a NaN loss whatever the learning rate"));
        }
        o[(s * c + ch) * h * w + i] = v;
      }
  return out;
}

}  // namespace

Dataset load_dataset(const std::string& path, ImageLayout layout) {
  const std::string where = "data: " + path;
  std::map<std::string, Tensor> arrays = read_npz(path);
  auto get = [&](const char* name) {
    auto it = arrays.find(name);
    FUSEBOX_CHECK(it != arrays.end(), where, "no array '", name,
                  "' (expected x: float [N, C, H, W] and y: integer [N], or token ids x and "
                  "next tokens y: integer [N, T] each)");
    return it->second;
  };
  Tensor x = get("x"), y = get("y");
  const bool tokens = is_integer(x.dtype()) && x.rank() != 4;  // rank 4: uint8 images
  if (tokens) {
    FUSEBOX_CHECK(x.rank() == 2, where, "array 'x' of token ids must be [N, T], got ",
                  dtype_name(x.dtype()), shape_str(x.shape()));
    FUSEBOX_CHECK(is_integer(y.dtype()) && y.shape() == x.shape(), where,
                  "array 'y' must be integer ", shape_str(x.shape()), " (x's shape), got ",
                  dtype_name(y.dtype()), shape_str(y.shape()));
  } else {
    FUSEBOX_CHECK((is_floating(x.dtype()) || is_integer(x.dtype())) && x.rank() == 4, where,
                  "array 'x' must be float or uint8 images ",
                  layout == ImageLayout::nhwc ? "[N, H, W, C]" : "[N, C, H, W]",
                  " or integer token ids [N, T], got ", dtype_name(x.dtype()),
                  shape_str(x.shape()));
    FUSEBOX_CHECK(is_integer(y.dtype()) && (y.rank() == 1 || y.rank() == 3), where,
                  "array 'y' must be integer [N] (classes) or [N, H, W] (per-pixel classes), got ",
                  dtype_name(y.dtype()), shape_str(y.shape()));
  }
  FUSEBOX_CHECK(x.dim(0) == y.dim(0), where, "'x' holds ", x.dim(0), " samples but 'y' ", y.dim(0),
                " labels");
  FUSEBOX_CHECK(x.dim(0) >= 1, where, "the set is empty");
  y = y.dtype() == DType::i64 ? y : y.cast(DType::i64);
  if (tokens) return {x.dtype() == DType::i64 ? x : x.cast(DType::i64), y};
  return {images_as_nchw_f32(x, layout, where), y};
}

void check_dataset(const Dataset& data, const Shape& sample_shape, const Shape& label_shape,
                   int64_t num_classes, const std::string& where) {
  Shape shape = data.x.shape();
  shape.erase(shape.begin());
  // Channels-last images read as [H, W, C] where [C, H, W] was wanted: say what to give.
  const bool channels_last = shape.size() == 3 && sample_shape.size() == 3 &&
                             shape == Shape({sample_shape[1], sample_shape[2], sample_shape[0]});
  FUSEBOX_CHECK(shape == sample_shape, where, "samples are ", shape_str(shape),
                " but the model takes ", shape_str(sample_shape), " per sample",
                channels_last ? " (channels-last images? give --layout nhwc)" : "");
  Shape labels = data.y.shape();
  labels.erase(labels.begin());
  FUSEBOX_CHECK(labels == label_shape, where, "labels are ", shape_str(labels),
                " per sample but the model's logits need ", shape_str(label_shape));
  const std::span<const int64_t> y = data.y.values<int64_t>();
  for (size_t i = 0; i < y.size(); ++i) {
    FUSEBOX_CHECK(y[i] >= 0 && y[i] < num_classes, where, "label ", y[i], " at index ", i,
                  " is outside [0, ", num_classes, ") (the model has ", num_classes, " classes)");
  }
}

BatchSampler::BatchSampler(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed)
    : data_(data), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  FUSEBOX_CHECK(data.size() >= 1, "batches", "the data set is empty");
  FUSEBOX_CHECK(batch_size >= 1, "batches", "batch size must be >= 1, got ", batch_size);
}

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  if (!shuffle) return order;
  // Fisher-Yates with the zoo's portable stream: the same order everywhere.
  zoo::Rng rng = zoo::tensor_rng(seed, cat("shuffle.epoch", epoch));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[size_t(i)], order[rng.next() % uint64_t(i + 1)]);
  return order;
}

int64_t BatchSampler::sample_index(int64_t position) const {
  const int64_t n = data_.size(), epoch = position / n, offset = position % n;
  if (!shuffle_) return offset;
  if (epoch != cached_epoch_) {
    cached_order_ = epoch_order(n, shuffle_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return cached_order_[size_t(offset)];
}

std::pair<Tensor, Tensor> BatchSampler::batch(int64_t index) const {
  FUSEBOX_CHECK(index >= 0, "batches", "batch index must be >= 0, got ", index);
  Shape xs = data_.x.shape(), ys = data_.y.shape();
  xs[0] = ys[0] = batch_size_;
  Tensor x = Tensor::empty(data_.x.dtype(), xs), y = Tensor::empty(data_.y.dtype(), ys);
  const size_t sample = size_t(data_.x.numel() / data_.size()) * dtype_size(x.dtype());
  const size_t label = size_t(data_.y.numel() / data_.size()) * dtype_size(y.dtype());
  for (int64_t b = 0; b < batch_size_; ++b) {
    const size_t i = size_t(sample_index(index * batch_size_ + b));
    std::memcpy(static_cast<char*>(x.raw()) + size_t(b) * sample,
                static_cast<const char*>(data_.x.raw()) + i * sample, sample);
    std::memcpy(static_cast<char*>(y.raw()) + size_t(b) * label,
                static_cast<const char*>(data_.y.raw()) + i * label, label);
  }
  return {x, y};
}

}  // namespace fusebox
