// read_file, write_file_atomic, check_writable and remove_stale_temporaries.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fusebox/io/tensor_file.h"
#include "io_test_util.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;

// Files in `dir` whose names contain ".tmp." (leftover temporaries).
int temporaries_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    n += e.path().filename().string().find(".tmp.") != std::string::npos;
  }
  return n;
}

TEST(File, WritesAndReadsBack) {
  iotest::ScratchDir dir;
  const std::string bytes = std::string("\0binary\xff", 8) + std::string(200000, 'q');
  write_file_atomic(dir.file("a"), bytes);
  EXPECT_EQ(read_file(dir.file("a")), bytes);
  write_file_atomic(dir.file("a"), "short");  // replaces, never appends
  EXPECT_EQ(read_file(dir.file("a")), "short");
  write_file_atomic(dir.file("empty"), "");
  EXPECT_EQ(read_file(dir.file("empty")), "");
  EXPECT_EQ(temporaries_in(dir.path()), 0);
}

// A pipe has no size to trust: read_file reads it to EOF (the path past a regular file's size).
TEST(File, ReadsAPipeToItsEnd) {
  iotest::ScratchDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string bytes(300000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 % 251);
  std::thread writer([&] {
    std::FILE* f = std::fopen(fifo.c_str(), "wb");
    if (f == nullptr) return;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  });
  const std::string read = read_file(fifo);
  writer.join();
  EXPECT_EQ(read, bytes);
}

TEST(File, ReadErrorsNameThePath) {
  iotest::ScratchDir dir;
  EXPECT_IO_ERROR(read_file(dir.file("nope")),
                  cat("[read: ", dir.file("nope"), "] cannot open: No such file or directory"));
  EXPECT_IO_ERROR(read_file(dir.path().string()), "is a directory");
}

TEST(File, WriteErrorsCarryErrnoAndLeaveNoTemporary) {
  iotest::ScratchDir dir;
  EXPECT_IO_ERROR(write_file_atomic(dir.file("no/such/dir/f"), "x"),
                  cat("[write: ", dir.file("no/such/dir/f"), "] cannot create temporary file"));
  EXPECT_IO_ERROR(write_file_atomic(dir.file("no/such/dir/f"), "x"), "No such file or directory");
  // Renaming over a non-empty directory fails after the temporary was written.
  fs::create_directories(dir.path() / "target" / "child");
  EXPECT_IO_ERROR(write_file_atomic(dir.file("target"), "x"), "rename failed: ");
  EXPECT_EQ(temporaries_in(dir.path()), 0);
  EXPECT_TRUE(fs::is_directory(dir.path() / "target" / "child"));
}

// A pid no process has: a child that has ended and been reaped (a pid is reused only after
// the kernel's pid space wraps, far beyond a test's few forks).
pid_t gone_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A write killed by SIGKILL leaves "<path>.tmp.<pid>.<n>": removed once its process is gone;
// a running process's (a write in progress) stays, and so does every other name.
TEST(File, StaleTemporariesOfGoneProcessesAreRemovedAndNothingElse) {
  iotest::ScratchDir dir;
  const pid_t gone = gone_pid(), alive = ::getppid();
  const std::vector<std::string> stale = {cat("c.npz.tmp.", gone, ".0"),
                                          cat("c.npz.tmp.", gone, ".17")};
  const std::vector<std::string> kept = {
      "c.npz",
      cat("c.npz.tmp.", alive, ".0"),       // a running process's write
      cat("c.npz.tmp.", ::getpid(), ".3"),  // this one's
      cat("c.npz.tmp.", gone, ".1.bak"),    // not a name write_file_atomic makes
      cat("c.npz.tmp.0", gone, ".1"),       // (nor this: a leading zero)
      cat("c.npz.tmp.-", gone, ".1"),       //
      cat("c.npz.tmp.", gone, "."),         //
      cat("d.npz.tmp.", gone, ".0"),        // another file's
      cat("xc.npz.tmp.", gone, ".0"),       //
      "c.npz.tmp.notes"};
  for (const auto& name : stale) write_file_atomic(dir.file(name), "x");
  for (const auto& name : kept) write_file_atomic(dir.file(name), "x");
  fs::create_directory(dir.path() / cat("c.npz.tmp.", gone, ".5"));  // a folder: never removed
  fs::create_symlink("c.npz", dir.path() / cat("c.npz.tmp.", gone, ".6"));  // a link: neither

  std::vector<std::string> removed = remove_stale_temporaries(dir.file("c.npz"));
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{dir.file(stale[0]), dir.file(stale[1])}));
  std::vector<std::string> expected = kept;
  expected.push_back(cat("c.npz.tmp.", gone, ".5"));
  expected.push_back(cat("c.npz.tmp.", gone, ".6"));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names_in(dir.path()), expected);
  EXPECT_TRUE(remove_stale_temporaries(dir.file("c.npz")).empty());
  EXPECT_TRUE(remove_stale_temporaries(dir.file("no/such/folder/c.npz")).empty());
}

TEST(File, CheckWritableSaysWhyNot) {
  iotest::ScratchDir dir;
  check_writable(dir.file("new.npz"), "here");  // a new file in a folder that exists
  EXPECT_EQ(temporaries_in(dir.path()), 0);     // the probe is gone again
  std::ofstream(dir.file("plain")) << "a file";
  fs::create_directory(dir.path() / "sub");
  EXPECT_IO_ERROR(check_writable(dir.file("missing/c.npz"), "here"),
                  cat("[here] the folder '", dir.file("missing"), "' does not exist"));
  EXPECT_IO_ERROR(check_writable(dir.file("plain/c.npz"), "here"),
                  cat("'", dir.file("plain"), "' is not a folder"));
  EXPECT_IO_ERROR(check_writable(dir.file("plain/x/c.npz"), "here"),
                  cat("'", dir.file("plain/x"), "' is not a folder (a part of it is a file)"));
  EXPECT_IO_ERROR(check_writable(dir.file("sub"), "here"), "[here] is a folder");
  // A folder without write permission: refused, unless this is root, whom the filesystem lets
  // write anyway (what the check asks is whether the write would succeed).
  ASSERT_EQ(::chmod(dir.file("sub").c_str(), 0555), 0);
  if (::geteuid() != 0) {
    EXPECT_IO_ERROR(
        check_writable(dir.file("sub/c.npz"), "here"),
        cat("cannot create a file in the folder '", dir.file("sub"), "': Permission denied"));
  } else {
    check_writable(dir.file("sub/c.npz"), "here");
  }
  ::chmod(dir.file("sub").c_str(), 0755);
}

}  // namespace
}  // namespace fusebox
