// Whole-file reads and atomic writes.
//
// write_file_atomic: write to "<path>.tmp.<pid>.<n>" in the same directory (so that the
// rename stays on one filesystem), fsync it, rename it over `path`, then fsync the directory
// so the rename itself is durable. Readers therefore see the old file or the new one, never
// a partial one. On any failure the temporary file is removed; a process killed while writing
// (SIGKILL) leaves its temporary file, which remove_stale_temporaries takes away later.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
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

// write_file_atomic's temporary files for `path`: "<path>.tmp.<pid>.<n>". One counter for
// the process, so that two writes (threads) never pick the same name.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
}

// The pid in `file_name` when it is a name temporary_name makes for a file named `base`
// ("<base>.tmp.<pid>.<n>", exactly: no sign, no leading zeros, nothing after), else 0.
pid_t temporary_owner(const std::string& file_name, const std::string& base) {
  const std::string prefix = base + ".tmp.";
  if (!file_name.starts_with(prefix)) return 0;
  const char* last = file_name.data() + file_name.size();
  pid_t pid = 0;
  const auto [dot, pid_error] = std::from_chars(file_name.data() + prefix.size(), last, pid);
  if (pid_error != std::errc() || pid <= 0 || dot == last || *dot != '.') return 0;
  uint64_t n = 0;
  const auto [end, n_error] = std::from_chars(dot + 1, last, n);
  return n_error == std::errc() && end == last && file_name == cat(prefix, pid, ".", n) ? pid : 0;
}

// Whether process `pid` exists on this machine (kill(pid, 0): EPERM means it does, as
// another user's).
bool process_exists(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

std::string folder_of(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

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
  // Read straight into the string (a model's weights are copied once, not twice), until EOF
  // rather than trusting st_size: pipes and files that grow or shrink both work.
  std::string bytes(S_ISREG(st.st_mode) ? size_t(st.st_size) : 0, '\0');
  size_t filled = 0;
  char chunk[1 << 16];  // past the expected size: EOF, or the rest of a pipe / growing file
  for (;;) {
    const bool in_place = filled < bytes.size();
    char* to = in_place ? bytes.data() + filled : chunk;
    const size_t room = in_place ? bytes.size() - filled : sizeof(chunk);
    const ssize_t n = ::read(file.fd, to, room);
    if (n < 0 && errno == EINTR) continue;
    FUSEBOX_CHECK(n >= 0, where, "read failed: ", errno_text(errno));
    if (n == 0) break;
    if (!in_place) bytes.append(chunk, size_t(n));
    filled += size_t(n);
  }
  bytes.resize(filled);
  return bytes;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string where = "write: " + path;
  const std::string temp = temporary_name(path);

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
  const std::string dir = folder_of(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void check_writable(const std::string& path, const std::string& where) {
  const std::string dir = folder_of(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    FUSEBOX_CHECK(err != ENOENT, where, "the folder '", dir, "' does not exist");
    FUSEBOX_CHECK(err != ENOTDIR, where, "'", dir, "' is not a folder (a part of it is a file)");
    throw Error(where, cat("cannot reach the folder '", dir, "': ", errno_text(err)));
  }
  FUSEBOX_CHECK(S_ISDIR(st.st_mode), where, "'", dir, "' is not a folder");
  FUSEBOX_CHECK(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), where,
                "is a folder (give a file name)");
  // Whether a file can be made there is what the write needs (permissions, read-only mounts,
  // ACLs, root's rights): asked of the filesystem by making one, not guessed from the mode.
  const std::string probe = temporary_name(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FUSEBOX_CHECK(fd >= 0, where, "cannot create a file in the folder '", dir,
                "': ", errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const std::filesystem::path target(path);
  const std::string base = target.filename().string();
  std::vector<std::string> removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(folder_of(path), ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const pid_t owner = temporary_owner(name, base);
    if (owner == 0 || owner == ::getpid() || process_exists(owner)) continue;
    std::error_code type_ec;  // never a folder or a link of that name
    if (it->symlink_status(type_ec).type() != std::filesystem::file_type::regular) continue;
    if (::unlink(it->path().c_str()) == 0) removed.push_back(it->path().string());
  }
  return removed;
}

}  // namespace fusebox
