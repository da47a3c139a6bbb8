// scan_image_folder and decode_image_folder (fusebox/train/data.h): a folder of class folders
// of PNG / JPEG files into an in-memory Dataset, decoded on the CPU (io/image.h).
//
// Resize + centre crop in one pass: output pixel (y, x) of the size x size crop is pixel
// (y + top, x + left) of the image resized so that its shorter side is `size`, which samples
// the original at ((y + top + 0.5) / s - 0.5, ...) with s = size / shorter side (half-pixel
// centres, as torchvision's bilinear Resize without antialiasing), clamped at the edges.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <system_error>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/core/parallel.h"
#include "fusebox/io/image.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/train/data.h"
#include "train/image_normalise.h"
#include "train/labelled_images.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;

// One dim's bilinear taps for output index o: the two source indices and the second's weight.
struct Taps {
  int64_t lo, hi;
  float w;
};

Taps taps(int64_t o, int64_t offset, double scale, int64_t extent) {
  const double c = std::max(0.0, (double(o + offset) + 0.5) / scale - 0.5);
  const int64_t lo = std::min(int64_t(c), extent - 1);
  return {lo, std::min(lo + 1, extent - 1), float(c - double(lo))};
}

// out [3, rows, cols]: pixel (y, x) the bilinear sample of `image` between its rows rows[y] and
// columns cols[x] (each pair of taps and its weight, precomputed once per row and column),
// normalised as ImageNet's.
void sample_normalise(const DecodedImage& image, const std::vector<Taps>& rows,
                      const std::vector<Taps>& cols, float* out) {
  const int64_t height = int64_t(rows.size()), width = int64_t(cols.size());
  const uint8_t* rgb = image.rgb.data();
  for (int64_t y = 0; y < height; ++y) {
    const Taps& ty = rows[size_t(y)];
    for (int64_t x = 0; x < width; ++x) {
      const Taps& tx = cols[size_t(x)];
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int64_t r, int64_t col) {
          return float(rgb[(r * image.width + col) * 3 + c]);
        };
        const float top_row = at(ty.lo, tx.lo) * (1 - tx.w) + at(ty.lo, tx.hi) * tx.w;
        const float bottom_row = at(ty.hi, tx.lo) * (1 - tx.w) + at(ty.hi, tx.hi) * tx.w;
        out[(c * height + y) * width + x] =
            imagenet_normalised(c, top_row * (1 - ty.w) + bottom_row * ty.w);
      }
    }
  }
}

}  // namespace

// The crop of `image` into out [3, size, size] (see the header comment).
void resize_crop_normalise(const DecodedImage& image, int64_t size, float* out) {
  const double scale = double(size) / double(std::min(image.height, image.width));
  const int64_t resized_h = std::max(size, int64_t(std::lround(double(image.height) * scale)));
  const int64_t resized_w = std::max(size, int64_t(std::lround(double(image.width) * scale)));
  const int64_t top = (resized_h - size) / 2, left = (resized_w - size) / 2;
  std::vector<Taps> rows(static_cast<size_t>(size)), cols(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) {
    rows[size_t(o)] = taps(o, top, scale, image.height);
    cols[size_t(o)] = taps(o, left, scale, image.width);
  }
  sample_normalise(image, rows, cols, out);
}

// The box (top, left, height, width) of `image` resized to size x size, mirrored left to right
// with `flip`: output (y, x) samples the box at ((y + 0.5) h / size - 0.5, ...) from the box's
// corner, clamped at the box's edges (torchvision's crop, then its bilinear resize).
void crop_resize_normalise(const DecodedImage& image, const CropBox& box, int64_t size, bool flip,
                           float* out) {
  const double sy = double(size) / double(box.height), sx = double(size) / double(box.width);
  std::vector<Taps> rows(static_cast<size_t>(size)), cols(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) {
    const Taps r = taps(o, 0, sy, box.height), c = taps(flip ? size - 1 - o : o, 0, sx, box.width);
    rows[size_t(o)] = {box.top + r.lo, box.top + r.hi, r.w};
    cols[size_t(o)] = {box.left + c.lo, box.left + c.hi, c.w};
  }
  sample_normalise(image, rows, cols, out);
}

ImageFolder scan_image_folder(const std::string& dir) {
  const std::string where = "image folder " + dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(where, ec ? "cannot be read: " + ec.message() : "is not a folder");
  ImageFolder folder;
  folder.dir = dir;
  std::vector<fs::path> class_dirs;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec)) class_dirs.push_back(it->path());
  if (ec) throw Error(where, "cannot be read: " + ec.message());
  std::sort(class_dirs.begin(), class_dirs.end());
  if (class_dirs.empty())
    throw Error(where,
                "holds no class folders (expected DIR/<class>/<image>.png|jpg, "
                "PyTorch's ImageFolder layout)");
  for (const fs::path& class_dir : class_dirs) {
    std::vector<std::string> images;
    for (fs::directory_iterator it(class_dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      if (is_image_path(it->path().string()))
        images.push_back(it->path().string());
      else
        ++folder.ignored;
    }
    if (ec)
      throw Error(where,
                  cat("class folder ", class_dir.string(), " cannot be read: ", ec.message()));
    if (images.empty())
      throw Error(where, cat("class folder '", class_dir.filename().string(),
                             "' holds no image file (.png, .jpg, .jpeg)"));
    std::sort(images.begin(), images.end());
    const int64_t label = int64_t(folder.classes.size());
    folder.classes.push_back(class_dir.filename().string());
    for (std::string& path : images) folder.files.emplace_back(std::move(path), label);
  }
  return folder;
}

DecodedFolder decode_labelled_images(int64_t n, const std::function<LabelledImage(int64_t)>& image,
                                     int64_t size, bool strict, const std::string& where) {
  FUSEBOX_CHECK(size > 0, where, "the image size must be positive, got ", size);
  const int64_t per_image = 3 * size * size;
  std::vector<float> pixels(static_cast<size_t>(n * per_image));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  std::vector<std::string> failures(static_cast<size_t>(n));  // empty: decoded
  parallel_for(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        const LabelledImage item = image(i);
        labels[size_t(i)] = item.label;
        resize_crop_normalise(decode_image(item.bytes, item.name), size,
                              pixels.data() + i * per_image);
      } catch (const Error& e) {
        failures[size_t(i)] = e.what();  // "[name] why"
      }
    }
  });
  DecodedFolder out;
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i) {
    if (failures[size_t(i)].empty()) {
      kept.push_back(i);
      continue;
    }
    const std::string& what = failures[size_t(i)];
    if (strict) throw Error(where, cat("--strict-data: ", what));
    if (out.skipped++ == 0) out.first_skipped = what;
  }
  FUSEBOX_CHECK(!kept.empty(), where, "none of its ", n,
                " images decodes (the first: ", out.first_skipped,
                "); image decoding in this build: ", image_decoding());
  const int64_t count = int64_t(kept.size());
  out.data.x = Tensor::empty(DType::f32, {count, 3, size, size});
  out.data.y = Tensor::empty(DType::i64, {count});
  float* x = out.data.x.data<float>();
  int64_t* y = out.data.y.data<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = kept[size_t(k)];
    std::copy_n(pixels.data() + i * per_image, per_image, x + k * per_image);
    y[k] = labels[size_t(i)];
  }
  return out;
}

DecodedFolder decode_image_folder(const ImageFolder& folder, int64_t size, bool strict) {
  return decode_labelled_images(
      int64_t(folder.files.size()), [&](int64_t i) { return folder_image(folder, i); }, size,
      strict, "image folder " + folder.dir);
}

LabelledImage folder_image(const ImageFolder& folder, int64_t i) {
  const auto& [path, label] = folder.files.at(size_t(i));
  const std::string text = read_file(path);
  return LabelledImage{path, std::vector<uint8_t>(text.begin(), text.end()), label};
}

}  // namespace fusebox
