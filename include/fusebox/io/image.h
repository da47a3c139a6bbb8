// Image files decoded on the CPU: PNG (libpng) and JPEG (libjpeg-turbo), Debian's libraries,
// where the build found them (image_decoding(); scripts/setup.sh installs both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusebox {

// 8-bit RGB rows, [height, width, 3]: grey, palette and alpha images converted (alpha dropped).
struct DecodedImage {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> rgb;
};

// "PNG and JPEG", or what the build lacks ("JPEG only (no libpng)", "none: ...").
std::string image_decoding();

// Whether `path` names an image file by its extension (.png, .jpg, .jpeg, any case).
bool is_image_path(const std::string& path);

// Decodes `bytes` as PNG or JPEG, told apart by their signatures; an Error naming `where` for
// anything else, a corrupt or truncated file, or a format this build cannot decode.
DecodedImage decode_image(const std::vector<uint8_t>& bytes, const std::string& where);

}  // namespace fusebox
