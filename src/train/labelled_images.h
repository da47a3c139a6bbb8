// What the image sources of train/data.h share (image_folder.cpp, image_shards.cpp): one decode
// of n labelled images into a Dataset, the shape, skipping and errors decode_image_folder states.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fusebox/io/image.h"
#include "fusebox/train/data.h"

namespace fusebox {

// Image i of a folder, its file read now (image_folder.cpp).
LabelledImage folder_image(const ImageFolder& folder, int64_t i);

// torchvision's Resize(size) + CenterCrop(size) of `image` (bilinear, no antialiasing), then
// ImageNet's normalisation, into out [3, size, size] (image_folder.cpp).
void resize_crop_normalise(const DecodedImage& image, int64_t size, float* out);

// A box of an image: rows top .. top + height - 1, columns left .. left + width - 1.
struct CropBox {
  int64_t top = 0, left = 0, height = 1, width = 1;
};
// The box resized to size x size (bilinear, no antialiasing), mirrored left to right with
// `flip`, then ImageNet's normalisation, into out [3, size, size] (image_folder.cpp): the
// second half of torchvision's RandomResizedCrop and RandomHorizontalFlip.
void crop_resize_normalise(const DecodedImage& image, const CropBox& box, int64_t size, bool flip,
                           float* out);

// `image(i)` for i in [0, n) is called once each, on parallel_for's threads; an Error it throws
// counts as an image that does not decode. `where` names the source in errors.
DecodedFolder decode_labelled_images(int64_t n, const std::function<LabelledImage(int64_t)>& image,
                                     int64_t size, bool strict, const std::string& where);

}  // namespace fusebox
