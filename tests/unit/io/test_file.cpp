// read_file and write_file_atomic.
#include <filesystem>

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

}  // namespace
}  // namespace fusebox
