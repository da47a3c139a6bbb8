// ImageStream (fusebox/train/image_stream.h): batches of images decoded on worker threads ahead
// of the step that takes them.
//
// The algorithm: batch(i) puts i, i+s, .. i+read_ahead s on a queue (those not on it yet; s the
// stride, 1 but for a data-parallel rank) and
// waits for i. A worker takes the oldest queued batch and fills it sample by sample: stream
// position p = i * B + b names image epoch_order(epoch p / n)[p % n], decoded and transformed
// with a random stream seeded by (seed, p). An image that does not decode is remembered, and the
// sample takes the stream's next position instead (p + n, p + 2n, ... would be the same image
// again: the next position p + 1, ...), so every batch is full and still a function of i alone.
#include "fusebox/train/image_stream.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/io/image.h"
#include "train/labelled_images.h"
#include "zoo/layers.h"

namespace fusebox {
namespace {

// torchvision's RandomResizedCrop.get_params: the box, drawn from `rng`.
CropBox random_resized_box(int64_t height, int64_t width, const ImageTransform& t, zoo::Rng& rng) {
  const double area = double(height) * double(width);
  const double log_lo = std::log(t.ratio_min), log_hi = std::log(t.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(t.scale_min, t.scale_max);
    const double ratio = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = std::llround(std::sqrt(target * ratio));
    const int64_t h = std::llround(std::sqrt(target / ratio));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const int64_t top = int64_t(rng.next() % uint64_t(height - h + 1));
      const int64_t left = int64_t(rng.next() % uint64_t(width - w + 1));
      return {top, left, h, w};
    }
  }
  // The largest centred box whose ratio is in range.
  const double in_ratio = double(width) / double(height);
  int64_t w = width, h = height;
  if (in_ratio < t.ratio_min) {
    h = std::max<int64_t>(1, std::llround(double(w) / t.ratio_min));
  } else if (in_ratio > t.ratio_max) {
    w = std::max<int64_t>(1, std::llround(double(h) * t.ratio_max));
  }
  h = std::min(h, height), w = std::min(w, width);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

}  // namespace

struct ImageStream::Impl {
  int64_t count, batch;
  std::function<LabelledImage(int64_t)> image;
  ImageTransform transform;
  bool shuffle;
  uint64_t seed;
  bool strict;
  int64_t read_ahead, stride;
  std::string where;

  struct Slot {
    bool ready = false;
    Tensor x, y;
    std::optional<Error> error;
  };
  mutable std::mutex mutex;
  std::condition_variable queued, finished;
  std::vector<int64_t> queue;     // batch indices waiting for a worker, oldest first
  std::map<int64_t, Slot> slots;  // queued, being decoded or decoded, by batch index
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders;  // by epoch
  std::set<int64_t> failed;  // images that did not decode
  std::string first_failure;
  bool stopping = false;
  std::vector<std::thread> workers;

  int64_t image_at(int64_t position) {
    const int64_t epoch = position / count;
    std::shared_ptr<const std::vector<int64_t>> order;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = orders.find(epoch);
      if (it != orders.end()) {
        order = it->second;
      } else {
        order =
            std::make_shared<const std::vector<int64_t>>(epoch_order(count, shuffle, seed, epoch));
        // The epochs of the batches in flight: a few, around the one asked for.
        if (orders.size() >= 8) orders.erase(orders.begin());
        orders.emplace(epoch, order);
      }
    }
    return (*order)[size_t(position % count)];
  }

  // Sample `position` of the stream into x (3 x size x size floats); returns its label. Moves
  // to the next position while an image does not decode (strict: an Error).
  int64_t sample(int64_t position, float* x) {
    for (int64_t tried = 0; tried < count; ++tried, ++position) {
      const int64_t i = image_at(position);
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failed.count(i)) continue;
      }
      try {
        const LabelledImage item = image(i);
        const DecodedImage decoded = decode_image(item.bytes, item.name);
        if (transform.augment) {
          zoo::Rng rng = zoo::tensor_rng(seed, cat("augment.", position));
          const CropBox box = random_resized_box(decoded.height, decoded.width, transform, rng);
          crop_resize_normalise(decoded, box, transform.size, rng.uniform(0, 1) < 0.5, x);
        } else {
          resize_crop_normalise(decoded, transform.size, x);
        }
        return item.label;
      } catch (const Error& e) {
        if (strict) throw Error(where, cat("--strict-data: ", e.what()));
        std::lock_guard<std::mutex> lock(mutex);
        if (failed.insert(i).second && first_failure.empty()) first_failure = e.what();
      }
    }
    throw Error(where, cat("none of its ", count, " images decodes (the first: ", first_failure,
                           "); image decoding in this build: ", image_decoding()));
  }

  void decode(int64_t index, Slot& out) {
    const int64_t size = transform.size, per_image = 3 * size * size;
    Tensor x = Tensor::empty(DType::f32, {batch, 3, size, size});
    Tensor y = Tensor::empty(DType::i64, {batch});
    for (int64_t b = 0; b < batch; ++b)
      y.data<int64_t>()[b] = sample(index * batch + b, x.data<float>() + b * per_image);
    out.x = std::move(x), out.y = std::move(y);
  }

  void work() {
    for (;;) {
      int64_t index;
      {
        std::unique_lock<std::mutex> lock(mutex);
        queued.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        index = queue.front();
        queue.erase(queue.begin());
      }
      Slot done;
      try {
        decode(index, done);
      } catch (const Error& e) {
        done.error = e;
      } catch (const std::exception& e) {  // a worker must not end the process
        done.error = Error(where, cat("batch ", index, ": ", e.what()));
      }
      done.ready = true;
      {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = slots.find(index);
        if (it != slots.end()) it->second = std::move(done);  // else: dropped meanwhile
      }
      finished.notify_all();
    }
  }

  void schedule(int64_t index) {  // with the mutex held
    if (slots.count(index)) return;
    slots.emplace(index, Slot{});
    queue.push_back(index);
    queued.notify_one();
  }
};

ImageStream::ImageStream(int64_t count, std::function<LabelledImage(int64_t)> image,
                         int64_t batch_size, ImageTransform transform, bool shuffle, uint64_t seed,
                         bool strict, int64_t read_ahead, int threads, std::string where,
                         int64_t stride)
    : impl_(std::make_unique<Impl>()) {
  FUSEBOX_CHECK(count >= 1, where, "holds no image");
  FUSEBOX_CHECK(batch_size >= 1, where, "batch size must be >= 1, got ", batch_size);
  FUSEBOX_CHECK(transform.size >= 1, where, "the image size must be positive, got ",
                transform.size);
  FUSEBOX_CHECK(read_ahead >= 1, where, "read-ahead must be >= 1 batch, got ", read_ahead);
  FUSEBOX_CHECK(stride >= 1, where, "the stride must be >= 1, got ", stride);
  FUSEBOX_CHECK(0 < transform.scale_min && transform.scale_min <= transform.scale_max &&
                    transform.scale_max <= 1 && 0 < transform.ratio_min &&
                    transform.ratio_min <= transform.ratio_max,
                where, "augmentation scale (", transform.scale_min, ", ", transform.scale_max,
                ") must be within (0, 1] and ratio (", transform.ratio_min, ", ",
                transform.ratio_max, ") positive, each lo <= hi");
  Impl& s = *impl_;
  s.count = count, s.batch = batch_size, s.image = std::move(image), s.transform = transform;
  s.shuffle = shuffle, s.seed = seed, s.strict = strict, s.read_ahead = read_ahead;
  s.stride = stride;
  s.where = std::move(where);
  if (threads <= 0) threads = std::max(1, int(std::thread::hardware_concurrency()) / 2);
  for (int t = 0; t < threads; ++t) s.workers.emplace_back([&s] { s.work(); });
}

ImageStream::~ImageStream() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->queued.notify_all();
  for (std::thread& t : impl_->workers) t.join();
}

std::pair<Tensor, Tensor> ImageStream::batch(int64_t index) {
  Impl& s = *impl_;
  FUSEBOX_CHECK(index >= 0, s.where, "batch index must be >= 0, got ", index);
  std::unique_lock<std::mutex> lock(s.mutex);
  // Batches behind this one were skipped (a resumed run starts further on): not decoded.
  for (auto it = s.slots.begin(); it != s.slots.end() && it->first < index;) {
    s.queue.erase(std::remove(s.queue.begin(), s.queue.end(), it->first), s.queue.end());
    it = s.slots.erase(it);
  }
  for (int64_t k = 0; k <= s.read_ahead; ++k) s.schedule(index + k * s.stride);
  s.finished.wait(lock, [&] { return s.slots.at(index).ready; });
  Impl::Slot slot = std::move(s.slots.at(index));
  s.slots.erase(index);
  lock.unlock();
  if (slot.error) throw *slot.error;
  return {std::move(slot.x), std::move(slot.y)};
}

int64_t ImageStream::batch_size() const {
  return impl_->batch;
}
int64_t ImageStream::dataset_size() const {
  return impl_->count;
}

int64_t ImageStream::skipped() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return int64_t(impl_->failed.size());
}

std::string ImageStream::first_skipped() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->first_failure;
}

std::function<LabelledImage(int64_t)> folder_images(std::shared_ptr<const ImageFolder> folder) {
  return [folder = std::move(folder)](int64_t i) { return folder_image(*folder, i); };
}

std::function<LabelledImage(int64_t)> shard_images(std::shared_ptr<const ImageShards> shards) {
  return [shards = std::move(shards)](int64_t i) { return shard_image(*shards, i); };
}

}  // namespace fusebox
