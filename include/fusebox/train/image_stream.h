// Training images decoded as a run draws them (issue 42), not all before the first step: while
// the step of batch i runs, worker threads read and decode batches i+1 .. i+read_ahead, each
// image cropped and resized into the step's size, with torchvision's training augmentations
// (RandomResizedCrop, RandomHorizontalFlip) where asked. A set of any size trains in the memory
// of a few batches, and the first step waits for one batch instead of the whole set.
//
// The stream's order is BatchSampler's (epoch_order: an epoch in order, or a permutation seeded
// by (seed, epoch)), and an image's crop and flip are drawn from a stream seeded by (seed, its
// position in the stream): batch i depends only on i and the seed, whatever the threads' timing,
// so the same seed gives the same batches and a resumed run draws the batches it would have.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "fusebox/train/data.h"

namespace fusebox {

// How a decoded image becomes a sample [3, size, size] (then ImageNet's normalisation):
// augment: torchvision's RandomResizedCrop(size, scale, ratio) (ten draws of a box of area
// scale x the image's and aspect ratio log-uniform in ratio, the first that fits; else the
// largest centred box of a ratio in range) and RandomHorizontalFlip(0.5); else Resize(size) +
// CenterCrop(size), decode_image_folder's transform (the evaluation transform). Bilinear,
// without antialiasing.
struct ImageTransform {
  int64_t size = 224;
  bool augment = false;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

class ImageStream {
 public:
  // `count` images; image(i) reads image i (its bytes, label and name), called on the worker
  // threads (so it must be safe to call concurrently). `threads` workers (0: half the
  // hardware's threads, at least 1), `read_ahead` batches decoded ahead of the one asked for
  // (>= 1): index + stride, index + 2 stride, ... (a data-parallel rank of `stride` ranks takes
  // every stride-th batch of the run's stream). An image that does not decode is counted once and
  // replaced by the next image of the stream that does (so a batch is always full); with `strict`
  // it is an Error naming it. `where` names the source in errors.
  ImageStream(int64_t count, std::function<LabelledImage(int64_t)> image, int64_t batch_size,
              ImageTransform transform, bool shuffle, uint64_t seed, bool strict,
              int64_t read_ahead, int threads, std::string where, int64_t stride = 1);
  ~ImageStream();
  ImageStream(const ImageStream&) = delete;
  ImageStream& operator=(const ImageStream&) = delete;

  // {images f32 [B, 3, size, size], labels i64 [B]}: waits for batch `index` (decoding it now
  // if it was not ahead), and starts the read_ahead batches after it. An Error of the batch's
  // decoding (--strict-data, an unreadable file, a set of which nothing decodes) is thrown here.
  std::pair<Tensor, Tensor> batch(int64_t index);

  int64_t batch_size() const;
  int64_t dataset_size() const;
  // Images that did not decode so far, and the first one's "[name] why".
  int64_t skipped() const;
  std::string first_skipped() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// image(i) of a scanned folder (the file read when called) and of read shards; the function
// keeps what it reads from.
std::function<LabelledImage(int64_t)> folder_images(std::shared_ptr<const ImageFolder> folder);
std::function<LabelledImage(int64_t)> shard_images(std::shared_ptr<const ImageShards> shards);

}  // namespace fusebox
