// Whole-file reads and atomic writes.
//
// write_file_atomic: write to "<path>.tmp.<pid>.<n>" in the same directory (so that the
// rename stays on one filesystem), fsync it, rename it over `path`, then fsync the directory
// so the rename itself is durable. Readers therefore see the old file or the new one, never
// a partial one. On any failure the temporary file is removed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fusebox/io/tensor_file.h"

namespace fusebox {

namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// Closes a file descriptor on scope exit (unless reset to -1 first).
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_file(const std::string& path) {
  const std::string where = "read: " + path;
  FdGuard file;
  do {
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (file.fd < 0 && errno == EINTR);
  FUSEBOX_CHECK(file.fd >= 0, where, "cannot open: ", errno_text(errno));
  struct stat st;
  FUSEBOX_CHECK(::fstat(file.fd, &st) == 0, where, "cannot stat: ", errno_text(errno));
  FUSEBOX_CHECK(!S_ISDIR(st.st_mode), where, "is a directory");
  std::string bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(size_t(st.st_size));
  // Read until EOF rather than trusting st_size: pipes and files that grow both work.
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    FUSEBOX_CHECK(n >= 0, where, "read failed: ", errno_text(errno));
    if (n == 0) break;
    bytes.append(chunk, size_t(n));
  }
  return bytes;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string where = "write: " + path;
  static std::atomic<uint64_t> counter{0};
  const std::string temp = cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));

  FdGuard file;
  file.fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FUSEBOX_CHECK(file.fd >= 0, where, "cannot create temporary file '", temp,
                "': ", errno_text(errno));
  // From here on, every failure removes the temporary file before throwing.
  auto fail = [&](const char* what) {
    const int err = errno;
    if (file.fd >= 0) ::close(file.fd);
    file.fd = -1;
    ::unlink(temp.c_str());
    throw Error(where, cat(what, ": ", errno_text(err)));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(file.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write failed");
    done += size_t(n);
  }
  if (::fsync(file.fd) != 0) fail("fsync failed");
  const int fd = file.fd;
  file.fd = -1;
  if (::close(fd) != 0) fail("close failed");
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename failed");

  // Best effort: make the rename durable. A failure here leaves a correct file behind.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace fusebox
