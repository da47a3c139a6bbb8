#include "backends/cuda/runtime/plan_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>

namespace fusebox::cuda {

void plan_cache_warning(std::string_view message) {
  std::string line = "[cuda] ";
  line.append(message);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += char((v >> (8 * i)) & 0xFF);
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += char((v >> (8 * i)) & 0xFF);
}

void put_text32(std::string& out, std::string_view text) {
  put_u32(out, uint32_t(text.size()));
  out.append(text);
}

void put_bytes64(std::string& out, std::string_view bytes) {
  put_u64(out, bytes.size());
  out.append(bytes);
}

uint64_t fnv1a64(std::string_view bytes, uint64_t hash = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string hex64(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

// Reads the fields of a file in memory; every read is checked against the bytes left.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool u32(uint32_t& v) { return little_endian(4, v); }
  bool u64(uint64_t& v) { return little_endian(8, v); }
  bool text32(std::string_view& text) {
    uint32_t size = 0;
    return u32(size) && take(size, text);
  }
  bool bytes64(std::string_view& bytes) {
    uint64_t size = 0;
    return u64(size) && take(size, bytes);
  }
  size_t position() const { return position_; }

 private:
  template <class T>
  bool little_endian(size_t size, T& v) {
    std::string_view raw;
    if (!take(size, raw)) return false;
    v = 0;
    for (size_t i = 0; i < size; ++i) v |= T(uint8_t(raw[i])) << (8 * i);
    return true;
  }
  bool take(uint64_t size, std::string_view& out) {
    if (size > bytes_.size() - position_) return false;  // never trusts a length field
    out = bytes_.substr(position_, size);
    position_ += size;
    return true;
  }
  std::string_view bytes_;
  size_t position_ = 0;
};

constexpr std::string_view kMagic = "FBXPLAN\n";
constexpr size_t kChecksumBytes = 8;
constexpr auto kTemporaryMaxAge = std::chrono::hours(24);
constexpr std::string_view kTemporaryPrefix = ".tmp-";

std::string encode_identity(const PlanCacheIdentity& identity) {
  std::string out;
  put_text32(out, identity.gpu_name);
  put_u64(out, uint64_t(int64_t(identity.sm)));
  put_u64(out, uint64_t(identity.cudnn_version));
  put_text32(out, identity.frontend_version);
  return out;
}

// Letters, digits, '.', '-' and '_' of `text` (others become '_'), at most `limit` of them.
std::string file_name_part(std::string_view text, size_t limit) {
  std::string part;
  for (char c : text.substr(0, limit)) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_';
    part += plain ? c : '_';
  }
  return part;
}

std::string identity_directory(const PlanCacheIdentity& identity) {
  std::string gpu = identity.gpu_name.empty() ? "unknown_gpu" : identity.gpu_name;
  return file_name_part(gpu, 64) + "-sm" + std::to_string(identity.sm) + "-cudnn" +
         std::to_string(identity.cudnn_version) + "-fe" +
         file_name_part(identity.frontend_version, 32);
}

std::string describe_identity(const PlanCacheIdentity& identity) {
  return "'" + identity.gpu_name + "' sm" + std::to_string(identity.sm) + ", cuDNN " +
         std::to_string(identity.cudnn_version) + ", cudnn-frontend '" + identity.frontend_version +
         "'";
}

std::string errno_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// Writes all of `bytes` to `fd`; false with errno set on failure.
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (written == 0) {
      errno = EIO;
      return false;
    }
    bytes.remove_prefix(size_t(written));
  }
  return true;
}

// Why load() found no payload.
enum class Verdict { absent, corrupt, stale, collision };

}  // namespace

// ---- CacheKeyBuilder ------------------------------------------------------------------------

void CacheKeyBuilder::add_name(char tag, std::string_view field_name) {
  bytes_ += tag;
  put_text32(bytes_, field_name);
  if (!description_.empty()) description_ += ' ';
  description_.append(field_name);
  description_ += '=';
}

CacheKeyBuilder& CacheKeyBuilder::add(std::string_view field_name, int64_t v) {
  add_name('i', field_name);
  put_u64(bytes_, uint64_t(v));
  description_ += std::to_string(v);
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::add(std::string_view field_name, std::span<const int64_t> v) {
  add_name('a', field_name);
  put_u64(bytes_, v.size());
  description_ += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    put_u64(bytes_, uint64_t(v[i]));
    if (i > 0) description_ += ',';
    description_ += std::to_string(v[i]);
  }
  description_ += ']';
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::add(std::string_view field_name, std::string_view v) {
  add_name('s', field_name);
  put_bytes64(bytes_, v);
  description_.append(v);
  return *this;
}

// ---- DiskPlanCache --------------------------------------------------------------------------

DiskPlanCache::DiskPlanCache(std::filesystem::path dir, PlanCacheIdentity identity)
    : DiskPlanCache(std::move(dir), identity, identity_directory(identity)) {}

DiskPlanCache::DiskPlanCache(std::filesystem::path dir, PlanCacheIdentity identity,
                             std::string subdirectory)
    : identity_(std::move(identity)), identity_bytes_(encode_identity(identity_)) {
  if (!dir.empty()) dir_ = dir / subdirectory;
}

std::filesystem::path DiskPlanCache::path_of(const std::string& key) const {
  if (!enabled()) return {};
  std::string named = identity_bytes_;
  put_bytes64(named, key);
  return dir_ / (hex64(fnv1a64(named)) + ".plan");
}

DiskPlanCache::Stats DiskPlanCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::string DiskPlanCache::encode(const std::string& key, std::span<const uint8_t> payload) const {
  std::string out;
  out.reserve(kMagic.size() + 4 + identity_bytes_.size() + 16 + key.size() + payload.size() +
              kChecksumBytes);
  out.append(kMagic);
  put_u32(out, uint32_t(kFormatVersion));
  out += identity_bytes_;
  put_bytes64(out, key);
  put_bytes64(out, std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
  put_u64(out, fnv1a64(out));
  return out;
}

std::optional<std::vector<uint8_t>> DiskPlanCache::load(const std::string& key) {
  auto miss = [&](Verdict verdict, const std::filesystem::path& path, std::string_view reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.misses;
    if (verdict == Verdict::corrupt) ++stats_.corrupt;
    if (verdict == Verdict::stale) ++stats_.stale;
    if (verdict == Verdict::collision) ++stats_.collisions;
    if (verdict != Verdict::absent && warned_files_.insert(path.string()).second) {
      plan_cache_warning("plan cache on disk: ignoring " + path.string() + ": " +
                         std::string(reason) +
                         "; the plan is rebuilt and the file replaced (warned once per file)");
    }
    return std::nullopt;
  };
  if (!enabled()) return miss(Verdict::absent, {}, "");  // disabled: a silent miss

  std::filesystem::path path;
  std::string bytes;
  try {
    path = path_of(key);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int error = errno;
      if (error == ENOENT || error == ENOTDIR)
        return miss(Verdict::absent, path, "");  // not stored
      return miss(Verdict::corrupt, path, "cannot open it: " + errno_text(error));
    }
    // The size comes from the open file: a rename() over the path cannot change it under us.
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      return miss(Verdict::corrupt, path, "not a regular file");
    }
    if (uint64_t(info.st_size) > kMaxFileBytes) {
      ::close(fd);
      return miss(Verdict::corrupt, path,
                  "its " + std::to_string(info.st_size) + " bytes exceed the limit of " +
                      std::to_string(kMaxFileBytes) + " (not read)");
    }
    bytes.resize(size_t(info.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += size_t(got);
    }
    ::close(fd);
    if (done != bytes.size()) {
      return miss(
          Verdict::corrupt, path,
          "read " + std::to_string(done) + " of its " + std::to_string(bytes.size()) + " bytes");
    }
  } catch (const std::exception& e) {  // e.g. bad_alloc: still only a miss
    return miss(Verdict::corrupt, path, std::string("reading it failed: ") + e.what());
  }

  // Checks, cheapest first: magic, format version, checksum over everything, then the fields.
  std::string_view file = bytes;
  const size_t min_bytes = kMagic.size() + 4 + kChecksumBytes;
  if (file.size() < min_bytes) {
    return miss(Verdict::corrupt, path,
                "truncated (" + std::to_string(file.size()) + " bytes, a plan file has more)");
  }
  if (file.substr(0, kMagic.size()) != kMagic) {
    return miss(Verdict::corrupt, path, "not a fusebox plan file (bad magic)");
  }
  Reader header(file.substr(kMagic.size()));
  uint32_t version = 0;
  header.u32(version);
  if (version != kFormatVersion) {
    return miss(Verdict::stale, path,
                "format version " + std::to_string(version) + ", this build reads " +
                    std::to_string(kFormatVersion));
  }
  std::string_view body = file.substr(0, file.size() - kChecksumBytes);
  uint64_t stored_checksum = 0;
  Reader(file.substr(body.size())).u64(stored_checksum);
  if (stored_checksum != fnv1a64(body)) {
    return miss(Verdict::corrupt, path, "checksum mismatch (corrupt or truncated)");
  }
  Reader fields(body.substr(kMagic.size() + 4));
  std::string_view gpu_name, frontend_version, stored_key, payload;
  uint64_t sm = 0, cudnn_version = 0;
  bool parsed = fields.text32(gpu_name) && fields.u64(sm) && fields.u64(cudnn_version) &&
                fields.text32(frontend_version) && fields.bytes64(stored_key) &&
                fields.bytes64(payload);
  if (!parsed || fields.position() != body.size() - kMagic.size() - 4) {
    return miss(Verdict::corrupt, path, "its length fields do not match its size");
  }
  PlanCacheIdentity stored{std::string(gpu_name), int(int64_t(sm)), int64_t(cudnn_version),
                           std::string(frontend_version)};
  if (stored.gpu_name != identity_.gpu_name || stored.sm != identity_.sm ||
      stored.cudnn_version != identity_.cudnn_version ||
      stored.frontend_version != identity_.frontend_version || int64_t(sm) != identity_.sm) {
    return miss(
        Verdict::stale, path,
        "written for " + describe_identity(stored) + ", not " + describe_identity(identity_));
  }
  if (stored_key != key) {
    return miss(Verdict::collision, path, "it holds another key (file-name hash collision)");
  }
  std::vector<uint8_t> result(payload.begin(), payload.end());
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.hits;
  return result;
}

bool DiskPlanCache::store(const std::string& key, std::span<const uint8_t> payload) noexcept {
  if (!enabled()) return false;
  std::filesystem::path temporary;
  try {
    std::filesystem::path target = path_of(key);
    if (payload.size() > kMaxFileBytes) {
      warn_write_once("a plan of " + std::to_string(payload.size()) +
                      " bytes exceeds the file limit of " + std::to_string(kMaxFileBytes));
      return false;
    }
    std::string bytes = encode(key, payload);
    if (bytes.size() > kMaxFileBytes) {
      warn_write_once("a plan file of " + std::to_string(bytes.size()) +
                      " bytes exceeds the limit of " + std::to_string(kMaxFileBytes));
      return false;
    }
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      warn_write_once("cannot create the directory " + dir_.string() + ": " + ec.message());
      return false;
    }
    uint64_t serial = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      serial = temporary_counter_++;
    }
    // Unique among threads and processes: the pid, the thread and a per-cache counter.
    temporary = dir_ / (std::string(kTemporaryPrefix) + target.stem().string() + "-" +
                        std::to_string(::getpid()) + "-" +
                        hex64(std::hash<std::thread::id>{}(std::this_thread::get_id())) + "-" +
                        std::to_string(serial) + "-" + hex64(uintptr_t(this)));
    int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      int error = errno;
      temporary.clear();  // not created: nothing to remove
      warn_write_once("cannot create a file in " + dir_.string() + ": " + errno_text(error));
      return false;
    }
    bool written = write_all(fd, bytes);
    int error = errno;
    // close() may report a deferred write error (NFS, quota).
    if (::close(fd) != 0 && written) {
      written = false;
      error = errno;
    }
    if (!written) {
      ::unlink(temporary.c_str());
      warn_write_once("cannot write " + temporary.string() + ": " + errno_text(error));
      return false;
    }
    if (::rename(temporary.c_str(), target.c_str()) != 0) {
      error = errno;
      ::unlink(temporary.c_str());
      warn_write_once("cannot rename a new plan file to " + target.string() + ": " +
                      errno_text(error));
      return false;
    }
    bool clean = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.writes;
      clean = !cleaned_temporaries_;
      cleaned_temporaries_ = true;
    }
    if (clean) remove_old_temporaries();
    return true;
  } catch (const std::exception& e) {  // bad_alloc and the like: the cache stays in memory
    if (!temporary.empty()) ::unlink(temporary.c_str());
    try {
      warn_write_once(std::string("storing a plan failed: ") + e.what());
    } catch (...) {
    }
    return false;
  }
}

void DiskPlanCache::warn_write_once(std::string_view reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.write_failures;
  if (warned_write_) return;
  warned_write_ = true;
  plan_cache_warning("plan cache on disk: " + std::string(reason) +
                     "; plans are kept in memory only (set FUSEBOX_CACHE_DIR to move the "
                     "cache; warned once)");
}

// Temporary files of a process killed between write and rename. Fresh ones may belong to a
// writer still running, so only those untouched for a day go. Errors are ignored: this is
// housekeeping, and load() never reads temporary files anyway.
void DiskPlanCache::remove_old_temporaries() {
  std::error_code ec;
  auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(kTemporaryPrefix, 0) != 0) continue;
    std::error_code time_ec;
    auto written = std::filesystem::last_write_time(it->path(), time_ec);
    if (!time_ec && now - written > kTemporaryMaxAge) {
      std::error_code remove_ec;
      std::filesystem::remove(it->path(), remove_ec);
    }
  }
}

}  // namespace fusebox::cuda
