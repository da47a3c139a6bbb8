// Training data: an in-memory set of samples and labels (images and their classes, or token
// sequences and their next tokens), and the batches a training run draws from it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/core/tensor.h"

namespace fusebox {

struct Dataset {
  Tensor x;  // images f32 [N, C, H, W], or token ids i64 [N, T]
  Tensor y;  // i64 labels in [0, classes): [N] (images), [N, H, W] (per pixel), [N, T] (tokens)
  int64_t size() const { return x.defined() ? x.dim(0) : 0; }
};

// A fixed, seeded, learnable set: each class has its own pattern (a colour offset per
// channel and a plane wave of its own frequency and phase), and each image is its class's
// pattern plus uniform noise; labels cycle through the classes. Small sets (64 images of
// 3x32x32, 10 classes) are easily memorised. The same arguments give the same bytes on
// every platform.
Dataset synthetic_dataset(int64_t samples, int64_t channels, int64_t image_size,
                          int64_t num_classes, uint64_t seed);

// A fixed, seeded, learnable per-pixel set: uniform noise images; each pixel's class is
// channel 0's value cut into num_classes equal bins of [-1, 1) (a 1x1 convolution can learn
// it). Labels [N, H, W]. The same arguments give the same bytes everywhere.
Dataset synthetic_segmentation_dataset(int64_t samples, int64_t channels, int64_t image_size,
                                       int64_t num_classes, uint64_t seed);

// A fixed, seeded, learnable set of token sequences over a vocabulary of `vocab`: each
// sequence starts at a random token and follows next(t) = (5 t + 3) mod vocab; y holds each
// position's next token (so x's row shifted by one, then one more step). A decoder learns it
// from the current token alone. The same arguments give the same bytes everywhere.
Dataset synthetic_token_dataset(int64_t samples, int64_t tokens, int64_t vocab, uint64_t seed);

// How an .npz holds its images: [N, C, H, W] (nchw, PyTorch's) or [N, H, W, C] (nhwc, as
// numpy image stacks and TensorFlow have them; transposed to nchw on loading).
enum class ImageLayout { nchw, nhwc };

// Reads arrays "x" and "y" from an .npz file: images (x float or uint8, [N, C, H, W] or with
// `layout` nhwc [N, H, W, C]; y integer [N] or per pixel [N, H, W]) or tokens (x integer
// [N, T], y integer [N, T]). x becomes f32 [N, C, H, W] (uint8 images as x / 255 normalised
// with ImageNet's mean and std when C = 3, else x / 255) or i64 (tokens), y i64. Errors name
// the file and the array (missing, wrong dtype or rank, N mismatch, an empty set, a NaN or
// infinity in float images, naming its sample).
Dataset load_dataset(const std::string& path, ImageLayout layout = ImageLayout::nchw);

// An image folder, PyTorch's ImageFolder layout (`DIR/<class>/<image>`): the class folders'
// names, sorted (label i is classes[i]), and each one's image files (io/image.h
// is_image_path), sorted; other files are counted in `ignored` and left alone.
struct ImageFolder {
  std::string dir;
  std::vector<std::string> classes;
  std::vector<std::pair<std::string, int64_t>> files;  // path, label
  int64_t ignored = 0;
};

// Scans `dir`: an Error naming the path where it is missing or unreadable, holds no class
// folder, or a class folder holds no image file (before anything is decoded or compiled).
ImageFolder scan_image_folder(const std::string& dir);

// Every image of `folder` decoded (on parallel_for's threads) into f32 [N, 3, size, size],
// labels i64 [N]: each resized (bilinear, its shorter side to `size`) and centre-cropped, as
// torchvision's Resize + CenterCrop, then x / 255 normalised with ImageNet's mean and std.
// A file that does not decode (corrupt, truncated, not an image inside) is skipped and
// counted, the first one named; with `strict` it is an Error naming it. A folder of which no
// image decodes is an Error.
struct DecodedFolder {
  Dataset data;
  int64_t skipped = 0;
  std::string first_skipped;  // "[path] why"
};
DecodedFolder decode_image_folder(const ImageFolder& folder, int64_t size, bool strict);

// Tar shards as WebDataset writes them: `pattern` names one .tar, or several through brace
// ranges and lists ("train-{0000..0127}.tar", "{a,b}.tar"); a sample is the members that share
// a key (a member's path up to its file name's first dot): an image (.jpg, .jpeg, .png) and
// its class (.cls: an integer, as text). Samples of no image are ignored (counted); a missing
// shard, a malformed tar or a sample whose image has no .cls is an Error naming the shard
// (and the member). Only the tars' headers and the .cls labels are read here (an ImageNet's
// shards are ~140 GB): each image is read from its shard when it is asked for (shard_image).
struct LabelledImage {
  std::string name;  // for errors: "shard.tar:key.jpg", or the file's path
  std::vector<uint8_t> bytes;
  int64_t label = 0;
};
struct ShardSample {
  std::string name;     // "shard.tar:key.jpg"
  size_t shard = 0;     // index into ImageShards::shards
  uint64_t offset = 0;  // of the image's bytes in the shard
  uint64_t size = 0;    // of the image, bytes
  int64_t label = 0;
};
struct ImageShards {
  std::string pattern;
  std::vector<std::string> shards;  // the pattern expanded, in order
  std::vector<ShardSample> samples;
  int64_t ignored = 0;  // members of samples that hold no image
  int64_t classes = 0;  // the largest label + 1
};
ImageShards read_image_shards(const std::string& pattern);
// Sample i's image read from its shard; an Error naming the sample where the shard cannot be
// read there any more (removed, or shorter than when it was scanned).
LabelledImage shard_image(const ImageShards& shards, int64_t i);
// Every sample decoded as decode_image_folder decodes a folder's images.
DecodedFolder decode_image_shards(const ImageShards& shards, int64_t size, bool strict);

// Throws an Error naming `where` when the samples do not have `sample_shape` ([C, H, W] or
// [T]), the labels `label_shape` per sample ([] or [T]), or a label is outside [0,
// num_classes) (naming the first one and its index).
void check_dataset(const Dataset& data, const Shape& sample_shape, const Shape& label_shape,
                   int64_t num_classes, const std::string& where);

// The order of epoch `epoch` over a set of n samples: 0 .. n-1 without shuffling; with it, a
// permutation seeded by (seed, epoch), the same on every platform.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// Batch i of an endless stream over the set: samples i*B .. i*B+B-1 of the sequence
// epoch 0, epoch 1, ... (so a batch may wrap around into the next epoch), each epoch in
// epoch_order's. Batch i depends only on i, so a resumed run draws the batches it would have.
class BatchSampler {
 public:
  BatchSampler(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed);
  // {samples [B, ...], labels [B, ...]}
  std::pair<Tensor, Tensor> batch(int64_t index) const;
  int64_t batch_size() const { return batch_size_; }
  int64_t dataset_size() const { return data_.size(); }

 private:
  int64_t sample_index(int64_t position) const;  // position in the stream -> sample
  Dataset data_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

}  // namespace fusebox
