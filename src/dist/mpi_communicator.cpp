// mpi_world() (fusebox/dist/communicator.h): Open MPI (Debian's libopenmpi-dev) under the CPU
// backend's data-parallel runs and tests. A sum is reduced to rank 0 and broadcast from it,
// so every rank holds the bits rank 0 computed (an all-reduce's ranks may add in different
// orders).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include "fusebox/core/error.h"
#include "fusebox/dist/communicator.h"

namespace fusebox::dist {
namespace {

constexpr const char* kWhere = "mpi";

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(kWhere, cat(call, " failed: ", std::string(text, size_t(len))));
}

// MPI counts are ints: a buffer goes in chunks of at most 2^30 elements.
constexpr int64_t kChunk = int64_t(1) << 30;

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int initialised = 0;
    check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    // Failures come back as codes (turned into Errors), not as an abort of every rank.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  ~MpiWorld() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owns_mpi_ && !finalised) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void all_reduce_sum(Tensor& t) override {
    const DType d = t.dtype();
    if (d == DType::f16 || d == DType::bf16) {
      Tensor wide = t.cast(DType::f32);
      all_reduce_sum(wide);
      const Tensor narrow = wide.cast(d);
      std::memcpy(t.raw(), narrow.raw(), t.nbytes());  // in t's buffer: views of it see the sum
      return;
    }
    MPI_Datatype type = MPI_DATATYPE_NULL;
    if (d == DType::f32) type = MPI_FLOAT;
    if (d == DType::f64) type = MPI_DOUBLE;
    if (d == DType::i64) type = MPI_INT64_T;
    FUSEBOX_CHECK(type != MPI_DATATYPE_NULL, kWhere, "all_reduce_sum of ", dtype_name(d),
                  " is not supported (f32, f64, i64, f16, bf16)");
    const size_t elem = dtype_size(d);
    auto* bytes = static_cast<char*>(t.raw());
    for (int64_t at = 0; at < t.numel(); at += kChunk) {
      const int n = int(std::min(kChunk, t.numel() - at));
      void* p = bytes + size_t(at) * elem;
      check(MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : p, rank_ == 0 ? p : nullptr, n, type, MPI_SUM, 0,
                       MPI_COMM_WORLD),
            "MPI_Reduce");
      check(MPI_Bcast(p, n, type, 0, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  Tensor all_gather(const Tensor& t) override {
    Shape shape = t.shape();
    shape.insert(shape.begin(), size_);
    Tensor all = Tensor::empty(t.dtype(), shape);
    FUSEBOX_CHECK(t.nbytes() <= size_t(std::numeric_limits<int>::max()), kWhere, "all_gather of ",
                  t.nbytes(), " bytes per rank (at most 2^31 - 1)");
    const int n = int(t.nbytes());
    check(MPI_Allgather(t.raw(), n, MPI_BYTE, all.raw(), n, MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Allgather");
    return all;
  }

  void broadcast(Tensor& t, int root) override {
    FUSEBOX_CHECK(root >= 0 && root < size_, kWhere, "broadcast from rank ", root, " of ", size_);
    auto* bytes = static_cast<char*>(t.raw());
    for (size_t at = 0; at < t.nbytes(); at += size_t(kChunk)) {
      const int n = int(std::min<size_t>(size_t(kChunk), t.nbytes() - at));
      check(MPI_Bcast(bytes + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  void abort() override { MPI_Abort(MPI_COMM_WORLD, 1); }

 private:
  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  static std::mutex mutex;
  static std::shared_ptr<Communicator> world;
  std::lock_guard<std::mutex> lock(mutex);
  if (!world) world = std::make_shared<MpiWorld>();
  return world;
}

}  // namespace fusebox::dist
