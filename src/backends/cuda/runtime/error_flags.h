// Run-time input errors found by kernels (an integer division by zero, a label outside
// [0, C)), reported as a fusebox::Error naming the node, never as a silent wrong answer.
//
// Kernels run asynchronously, so such an error cannot throw where the node is recorded.
// Instead the node reserves an ErrorRecord (a few bytes of device memory, zeroed by a
// memset recorded just before the kernel), passes its pointer to the kernel, and the
// kernel calls raise_error() where it finds bad input. After the run has been committed,
// the executor calls check_error_flags(ctx): it copies the records of the run back
// (blocking; nothing is copied when no node reserved a record), forgets them, and throws
// the Error of the first node in recording order whose kernel raised, with the message
// that node's description makes of the reported index and value:
//
//   ErrorSlot slot = ErrorFlags::of(ctx.encoder).reserve(node_label(n),
//       [](int64_t index, int64_t value) { return cat("integer division by zero (", value,
//                                                     " / 0)"); });
//   ctx.encoder.launch(kernel, grid, block, 0, {reads...}, {writes..., slot.range}, ...,
//                      slot.record);
//   ...
//   ctx.encoder.commit();  check_error_flags(ctx);   // throws the node's Error
//
// A record that no kernel raised costs one 32-byte memset node per checking node, and a
// check costs one small device-to-host copy per 64 reserved records. Until
// check_error_flags runs, records accumulate (the executor checks after every run).
//
// Where the flags live: one ErrorFlags per CommandEncoder, found by ErrorFlags::of(encoder)
// in a process-wide table (kernels.h's Context has no slot for it; see forget()).
// Threads: like the encoder, one thread at a time uses an encoder's flags.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/runtime/allocator.h"

namespace fusebox::cuda {

class CommandEncoder;
struct Context;

// What a kernel reports: raised is 0 until the first raise_error, which fills index and
// value (later raises are dropped, so a report shows one bad element).
struct ErrorRecord {
  int32_t raised;
  int32_t reserved;
  int64_t index;
  int64_t value;
  int64_t padding;  // 32 bytes: records never share a 32-byte sector
};
static_assert(sizeof(ErrorRecord) == 32);

#ifdef __CUDACC__
__device__ inline void raise_error(ErrorRecord* record, int64_t index, int64_t value) {
  if (atomicCAS(&record->raised, 0, 1) == 0) {
    record->index = index;
    record->value = value;
  }
}

// The halt word (ErrorFlags::halt): set by a kernel that finds bad training data; read by
// the kernels that write training state, which then write nothing. Null: no halt word.
__device__ inline void raise_halt(int32_t* halt) {
  if (halt) atomicExch(halt, 1);
}
__device__ inline bool halted(const int32_t* halt) {
  return halt && *static_cast<const volatile int32_t*>(halt) != 0;
}
#endif

// A reserved record: the pointer for the kernel, the range to declare as written.
struct ErrorSlot {
  ErrorRecord* record;
  BufferRange range;
};

class ErrorFlags {
 public:
  // Makes the message of an error from the reported element's index and value.
  using Describe = std::function<std::string(int64_t index, int64_t value)>;
  static constexpr size_t kRecordsPerChunk = 64;

  explicit ErrorFlags(CommandEncoder& encoder) : encoder_(encoder) {}

  // The flags of `encoder`, created on first use.
  static ErrorFlags& of(CommandEncoder& encoder);
  // Drops the flags of `encoder` (call before destroying an encoder that used them, so that
  // a later encoder at the same address starts clean). Unchecked records are lost.
  static void forget(CommandEncoder& encoder);

  // Reserves a record for a node's kernel and records the memset that zeroes it.
  ErrorSlot reserve(std::string where, Describe describe);

  // Copies the reserved records back (blocking, after all work recorded so far), forgets
  // them, and throws the Error of the first one raised. Returns at once when none is
  // reserved.
  void check();

  size_t pending() const { return pending_.size(); }

  // The halt word of the recording (a compiled training step's, runtime/executable.h): a
  // kernel that finds bad training data (a label outside [0, C)) sets it, and every kernel
  // that writes training state in place (optimizer updates, running statistics) then
  // writes nothing, in this run and every later one, until the executable clears it once
  // the error has been reported: the state stays the last good one. Declare it written
  // by the kernels that set it and read by those that obey it. Unset: no word (nullptr).
  void set_halt(const BufferRange& word) { halt_ = word; }
  void clear_halt() { halt_.reset(); }
  int32_t* halt_word() const { return halt_ ? static_cast<int32_t*>(halt_->data()) : nullptr; }
  const std::optional<BufferRange>& halt() const { return halt_; }

  struct Pending {
    std::string where;
    Describe describe;
  };
  // Records reserved by a recording that is kept for replay (runtime/executable): their
  // memsets and kernels run again in every replay, so their owner checks them after each.
  struct Reserved {
    std::vector<DeviceBuffer> chunks;
    std::vector<Pending> pending;
    size_t bytes() const { return pending.size() * sizeof(ErrorRecord); }
  };
  // Hands the reserved records over (the flags start afresh with new chunks).
  Reserved take();
  // Throws the Error of the first raised record of `records` (copies of reserved.chunks'
  // records, in order), its message prefixed by `prefix` when not empty.
  static void throw_first_raised(const Reserved& reserved, const ErrorRecord* records,
                                 const std::string& prefix);

 private:
  CommandEncoder& encoder_;
  std::vector<DeviceBuffer> chunks_;  // kRecordsPerChunk records each, reused after check()
  std::vector<Pending> pending_;      // by record number: chunk = i / kRecordsPerChunk
  std::optional<BufferRange> halt_;
};

// ErrorFlags::of(ctx.encoder).check(): what the executor calls after committing a run.
void check_error_flags(Context& ctx);

}  // namespace fusebox::cuda
