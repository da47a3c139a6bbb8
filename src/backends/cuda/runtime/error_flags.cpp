#include "backends/cuda/runtime/error_flags.h"

#include <map>
#include <memory>
#include <mutex>

#include "backends/cuda/runtime/context.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<const CommandEncoder*, std::unique_ptr<ErrorFlags>> flags;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: encoders may outlive statics
  return *r;
}

}  // namespace

ErrorFlags& ErrorFlags::of(CommandEncoder& encoder) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.flags[&encoder];
  if (!slot) slot = std::make_unique<ErrorFlags>(encoder);
  return *slot;
}

void ErrorFlags::forget(CommandEncoder& encoder) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.flags.erase(&encoder);
}

ErrorSlot ErrorFlags::reserve(std::string where, Describe describe) {
  const size_t i = pending_.size();
  const size_t chunk = i / kRecordsPerChunk;
  if (chunk == chunks_.size()) {
    chunks_.push_back(CachingAllocator::for_device(encoder_.device().id())
                          .allocate(kRecordsPerChunk * sizeof(ErrorRecord)));
  }
  const size_t offset = (i % kRecordsPerChunk) * sizeof(ErrorRecord);
  BufferRange range(chunks_[chunk], offset, sizeof(ErrorRecord));
  encoder_.memset(range, 0);
  pending_.push_back({std::move(where), std::move(describe)});
  return {static_cast<ErrorRecord*>(range.data()), range};
}

void ErrorFlags::check() {
  if (pending_.empty()) return;
  std::vector<ErrorRecord> records(pending_.size());
  for (size_t chunk = 0; chunk * kRecordsPerChunk < records.size(); ++chunk) {
    const size_t first = chunk * kRecordsPerChunk;
    const size_t count = std::min(kRecordsPerChunk, records.size() - first);
    encoder_.copy_to_host(records.data() + first,
                          BufferRange(chunks_[chunk], 0, count * sizeof(ErrorRecord)));
  }
  // The copies waited for all recorded work, so the chunks can be reused from here on.
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].raised != 0)
      throw Error(pending[i].where, pending[i].describe(records[i].index, records[i].value));
  }
}

ErrorFlags::Reserved ErrorFlags::take() {
  Reserved r;
  r.chunks = std::move(chunks_);
  r.pending = std::move(pending_);
  chunks_.clear();
  pending_.clear();
  return r;
}

void ErrorFlags::throw_first_raised(const Reserved& reserved, const ErrorRecord* records,
                                    const std::string& prefix) {
  for (size_t i = 0; i < reserved.pending.size(); ++i) {
    if (records[i].raised == 0) continue;
    const Pending& p = reserved.pending[i];
    const std::string message = p.describe(records[i].index, records[i].value);
    throw Error(p.where, prefix.empty() ? message : prefix + ": " + message);
  }
}

void check_error_flags(Context& ctx) {
  ErrorFlags::of(ctx.encoder).check();
}

}  // namespace fusebox::cuda
