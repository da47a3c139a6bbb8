// read_image_shards, shard_image and decode_image_shards (fusebox/train/data.h): WebDataset tar
// shards scanned by their headers, each image read from its shard when asked for, then the
// same decode as an image folder (labelled_images.h).
//
// Tar: 512-byte ustar headers (name, prefix for long paths, size in octal, a checksum over
// the header with its own field as spaces, type '0' or NUL for a file), each file's bytes
// padded to 512, two zero blocks at the end. Only regular files are samples' members; links,
// folders and the pax / GNU long-name records are passed over.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "fusebox/core/error.h"
#include "fusebox/io/image.h"
#include "fusebox/train/data.h"
#include "train/labelled_images.h"

namespace fusebox {
namespace {

constexpr size_t kBlock = 512;

// "a{00..02}b{x,y}" -> a00bx a00by a01bx ... (ranges keep the first bound's zero padding).
std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) return {pattern};
  const size_t close = pattern.find('}', open);
  FUSEBOX_CHECK(close != std::string::npos, "shards " + pattern, "a '{' without its '}'");
  const std::string body = pattern.substr(open + 1, close - open - 1);
  std::vector<std::string> choices;
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string from = body.substr(0, dots), to = body.substr(dots + 2);
    int64_t a = 0, b = 0;
    const bool numbers =
        !from.empty() && !to.empty() &&
        std::from_chars(from.data(), from.data() + from.size(), a).ptr ==
            from.data() + from.size() &&
        std::from_chars(to.data(), to.data() + to.size(), b).ptr == to.data() + to.size();
    FUSEBOX_CHECK(numbers && a <= b && b - a < 1000000, "shards " + pattern, "the range {", body,
                  "} must be {first..last} of integers, first <= last");
    for (int64_t i = a; i <= b; ++i) {
      std::string digits = std::to_string(i);
      if (digits.size() < from.size()) digits.insert(0, from.size() - digits.size(), '0');
      choices.push_back(digits);
    }
  } else {
    for (size_t start = 0;;) {
      const size_t comma = body.find(',', start);
      choices.push_back(body.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  std::vector<std::string> out;
  for (const std::string& choice : choices)
    for (std::string& rest : expand_braces(pattern.substr(close + 1)))
      out.push_back(pattern.substr(0, open) + choice + rest);
  return out;
}

std::string field(const char* header, size_t offset, size_t length) {
  const char* begin = header + offset;
  return std::string(begin, std::find(begin, begin + length, '\0'));
}

uint64_t octal(const char* header, size_t offset, size_t length, const std::string& where) {
  uint64_t value = 0;
  bool digits = false;
  for (size_t i = offset; i < offset + length; ++i) {
    const char c = header[i];
    if (c >= '0' && c <= '7') {
      value = value * 8 + uint64_t(c - '0');
      digits = true;
    } else if (c == ' ' || c == '\0') {
      if (digits) break;
    } else {
      throw Error(where, "a malformed tar header (a number that is not octal)");
    }
  }
  return value;
}

// A regular file of a tar: its path, and where its bytes lie.
struct Member {
  std::string path;
  uint64_t offset = 0, size = 0;
};

// The regular files of one tar, in order, from its headers alone: each header read, each
// body passed over (a seek), so a scan reads 512 bytes per member whatever the images' sizes.
std::vector<Member> tar_members(std::ifstream& in, uint64_t file_size, const std::string& shard) {
  std::vector<Member> members;
  char header[kBlock];
  for (uint64_t at = 0;;) {
    const std::string where = cat(shard, " at byte ", at);
    FUSEBOX_CHECK(at + kBlock <= file_size, where,
                  "the tar ends early (no end-of-archive blocks): truncated?");
    in.seekg(std::streamoff(at));
    in.read(header, kBlock);
    FUSEBOX_CHECK(in.gcount() == std::streamsize(kBlock), where, "cannot be read");
    if (std::all_of(header, header + kBlock, [](char c) { return c == 0; })) return members;
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i)
      sum +=
          (i >= 148 && i < 156) ? uint64_t(' ') : uint64_t(static_cast<unsigned char>(header[i]));
    FUSEBOX_CHECK(sum == octal(header, 148, 8, where), where,
                  "a tar header whose checksum does not match: not a tar, or corrupt");
    const uint64_t size = octal(header, 124, 12, where);
    const char type = header[156];
    const uint64_t body = at + kBlock;
    FUSEBOX_CHECK(size <= file_size - body, where, "a member of ", size,
                  " bytes runs past the end of the file: truncated?");
    if (type == '0' || type == '\0') {
      const std::string prefix = field(header, 345, 155), name = field(header, 0, 100);
      members.push_back({prefix.empty() ? name : prefix + "/" + name, body, size});
    }
    at = body + (size + kBlock - 1) / kBlock * kBlock;
  }
}

// `size` bytes at `offset` of the file `in` reads (an Error naming `where` when short).
std::string read_at(std::ifstream& in, uint64_t offset, uint64_t size, const std::string& where) {
  std::string bytes(size, '\0');
  in.clear();
  in.seekg(std::streamoff(offset));
  in.read(bytes.data(), std::streamsize(size));
  FUSEBOX_CHECK(in.gcount() == std::streamsize(size), where, "cannot read its ", size,
                " bytes at byte ", offset,
                " of the shard: removed, or changed since it was scanned?");
  return bytes;
}

// WebDataset's key and extension of a member path: split at the file name's first dot.
std::pair<std::string, std::string> key_and_extension(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {path, ""};
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return {path.substr(0, dot), ext};
}

}  // namespace

ImageShards read_image_shards(const std::string& pattern) {
  ImageShards out;
  out.pattern = pattern;
  out.shards = expand_braces(pattern);
  for (size_t shard_index = 0; shard_index < out.shards.size(); ++shard_index) {
    const std::string& shard = out.shards[shard_index];
    std::ifstream in(shard, std::ios::binary);
    std::error_code error;
    const uint64_t file_size = std::filesystem::file_size(shard, error);
    FUSEBOX_CHECK(in && !error, "shards " + pattern, "cannot read ", shard,
                  error ? ": " + error.message() : std::string(": missing or unreadable"));
    const std::vector<Member> members = tar_members(in, file_size, shard);
    // Consecutive members of one key form a sample.
    for (size_t i = 0; i < members.size();) {
      const std::string key = key_and_extension(members[i].path).first;
      const Member* image = nullptr;
      const Member* label = nullptr;
      size_t j = i;
      for (; j < members.size() && key_and_extension(members[j].path).first == key; ++j) {
        const std::string ext = key_and_extension(members[j].path).second;
        if (ext == "jpg" || ext == "jpeg" || ext == "png") image = &members[j];
        if (ext == "cls") label = &members[j];
      }
      i = j;
      if (image == nullptr) {
        ++out.ignored;
        continue;
      }
      const std::string name = cat(shard, ":", image->path);
      FUSEBOX_CHECK(label != nullptr, "shards " + pattern, "sample '", key, "' of ", shard,
                    " has an image and no .cls label");
      // A label is a short integer: a .cls of more bytes than this is not one.
      const std::string bytes = read_at(in, label->offset, std::min<uint64_t>(label->size, 64),
                                        cat(shard, ":", label->path));
      std::string text = label->size > 64 ? std::string("(too long)") : bytes;
      text.erase(
          std::remove_if(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); }),
          text.end());
      int64_t value = -1;
      const bool parsed =
          !text.empty() && std::from_chars(text.data(), text.data() + text.size(), value).ptr ==
                               text.data() + text.size();
      FUSEBOX_CHECK(parsed && value >= 0, "shards " + pattern, "sample '", key, "' of ", shard,
                    ": its .cls holds '", bytes.substr(0, 40), "', not a class number >= 0");
      out.samples.push_back({name, shard_index, image->offset, image->size, value});
      out.classes = std::max(out.classes, value + 1);
    }
  }
  FUSEBOX_CHECK(!out.samples.empty(), "shards " + pattern, "no sample holds an image (",
                out.shards.size(), " shards, ", out.ignored, " samples without one)");
  return out;
}

LabelledImage shard_image(const ImageShards& shards, int64_t i) {
  const ShardSample& sample = shards.samples.at(size_t(i));
  std::ifstream in(shards.shards.at(sample.shard), std::ios::binary);
  FUSEBOX_CHECK(in, sample.name, "cannot open the shard any more: removed?");
  const std::string bytes = read_at(in, sample.offset, sample.size, sample.name);
  return {sample.name, {bytes.begin(), bytes.end()}, sample.label};
}

DecodedFolder decode_image_shards(const ImageShards& shards, int64_t size, bool strict) {
  return decode_labelled_images(
      int64_t(shards.samples.size()), [&](int64_t i) { return shard_image(shards, i); }, size,
      strict, "shards " + shards.pattern);
}

}  // namespace fusebox
