// decode_image (fusebox/io/image.h): PNG through libpng's simplified API (png_image: errors
// come back as a message, no longjmp), JPEG through libjpeg-turbo with an error manager that
// longjmps out of the library (its default one exits the process) and counts warnings: a
// truncated JPEG only warns ("Premature end of JPEG file") and pads with grey, which is no
// image to train on, so a warning is an error here too.
#include "fusebox/io/image.h"

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>

#include "fusebox/core/error.h"

#ifdef FUSEBOX_WITH_PNG
#include <png.h>
#endif
#ifdef FUSEBOX_WITH_JPEG
#include <jpeglib.h>
#endif

namespace fusebox {
namespace {

bool starts_with(const std::vector<uint8_t>& bytes, std::initializer_list<uint8_t> signature) {
  return bytes.size() >= signature.size() &&
         std::equal(signature.begin(), signature.end(), bytes.begin());
}

#ifdef FUSEBOX_WITH_PNG
DecodedImage decode_png(const std::vector<uint8_t>& bytes, const std::string& where) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    throw Error(where, cat("not a readable PNG (", image.message, ")"));
  image.format = PNG_FORMAT_RGB;  // grey, palette and 16-bit converted; alpha composited on black
  DecodedImage out;
  out.height = image.height, out.width = image.width;
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw Error(where, cat("a corrupt or truncated PNG (", message, ")"));
  }
  return out;
}
#endif

#ifdef FUSEBOX_WITH_JPEG
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  int warnings = 0;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void jpeg_fail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  info->err->format_message(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_note(j_common_ptr info, int level) {
  if (level >= 0) return;  // trace messages
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  if (errors->warnings++ == 0) info->err->format_message(info, errors->message);
}

// No C++ object is made between setjmp and a longjmp back to it (`out` and `errors` are made
// before; the library only writes into them), so the jump skips no destructor.
DecodedImage decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& where) {
  jpeg_decompress_struct info{};
  JpegErrors errors;
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_fail;
  errors.manager.emit_message = jpeg_note;
  DecodedImage out;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&info);
    throw Error(where, cat("a corrupt JPEG (", errors.message, ")"));
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  info.out_color_space = JCS_RGB;  // grey and CMYK/YCCK converted
  jpeg_start_decompress(&info);
  out.height = info.output_height, out.width = info.output_width;
  out.rgb.resize(size_t(out.height) * size_t(out.width) * 3);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out.rgb.data() + size_t(info.output_scanline) * size_t(out.width) * 3;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  if (errors.warnings > 0)
    throw Error(where, cat("a corrupt or truncated JPEG (", errors.message, ")"));
  return out;
}
#endif

}  // namespace

std::string image_decoding() {
#if defined(FUSEBOX_WITH_PNG) && defined(FUSEBOX_WITH_JPEG)
  return "PNG and JPEG";
#elif defined(FUSEBOX_WITH_PNG)
  return "PNG only (no libjpeg: scripts/setup.sh installs libjpeg62-turbo-dev)";
#elif defined(FUSEBOX_WITH_JPEG)
  return "JPEG only (no libpng: scripts/setup.sh installs libpng-dev)";
#else
  return "none (no libpng or libjpeg: scripts/setup.sh installs libpng-dev and "
         "libjpeg62-turbo-dev)";
#endif
}

bool is_image_path(const std::string& path) {
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == "png" || ext == "jpg" || ext == "jpeg";
}

DecodedImage decode_image(const std::vector<uint8_t>& bytes, const std::string& where) {
  if (starts_with(bytes, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'})) {
#ifdef FUSEBOX_WITH_PNG
    return decode_png(bytes, where);
#else
    throw Error(where, "a PNG, which this build cannot decode: " + image_decoding());
#endif
  }
  if (starts_with(bytes, {0xff, 0xd8, 0xff})) {
#ifdef FUSEBOX_WITH_JPEG
    return decode_jpeg(bytes, where);
#else
    throw Error(where, "a JPEG, which this build cannot decode: " + image_decoding());
#endif
  }
  throw Error(where, bytes.empty() ? "an empty file, not an image"
                                   : "neither PNG nor JPEG (no known signature)");
}

}  // namespace fusebox
