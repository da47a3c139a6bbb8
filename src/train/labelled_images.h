// What the image sources of train/data.h share (image_folder.cpp, image_shards.cpp): one decode
// of n labelled images into a Dataset, the shape, skipping and errors decode_image_folder states.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fusebox/train/data.h"

namespace fusebox {

// `image(i)` for i in [0, n) is called once each, on parallel_for's threads; an Error it throws
// counts as an image that does not decode. `where` names the source in errors.
DecodedFolder decode_labelled_images(int64_t n, const std::function<LabelledImage(int64_t)>& image,
                                     int64_t size, bool strict, const std::string& where);

}  // namespace fusebox
