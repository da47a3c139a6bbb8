// The CUDA executable's runs: feeds, staging, the replay, the copies back, and the runs
// in flight (cuda_executable.h).
#include <algorithm>
#include <cstring>

#include "executable/cuda/cuda_executable.h"

namespace fusebox::runtime {

RunTiming::RunTiming() {
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&start));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&end));
}

RunTiming::~RunTiming() {
  (void)cudaEventDestroy(start);  // a destructor must not throw
  (void)cudaEventDestroy(end);
}

// Runs issue copies that hold nothing (the executable's buffers outlive them): wait for
// them before the buffers go.
CudaExecutable::~CudaExecutable() {
  try {
    ctx_.encoder.synchronize();
  } catch (...) {  // a destructor must not throw; the device's error shows at its next use
  }
}

StepResult CudaExecutable::run_async(const Feeds& feeds, const std::set<std::string>& to_host,
                                     const std::string& label) {
  check_request(io_, feeds, to_host, where_);
  // Runs that have completed are checked (an error surfaces at the next run), and the host
  // queues at most a few runs ahead of the device, which bounds the pinned slots and
  // error records in flight (and the launch queue).
  while (!in_flight_.empty() &&
         (in_flight_.size() >= kMaxRunsInFlight || in_flight_.front().run->fence.done()))
    retire_oldest_run();
  feed_inputs(feeds);
  const int64_t index = halt_ ? halt_->issued++ : 0;
  if (direct_) {
    record_step();
    ctx_.encoder.commit();
    try {
      cuda::check_error_flags(ctx_);
    } catch (const Error& e) {
      const std::string halted = halt_ ? release_halt(*halt_, index) : "";
      throw Error(e.where(), (label.empty() ? "" : label + ": ") + error_message(e) + halted);
    }
  } else {
    for (ReadbackPiece& p : readback_pieces_) {
      if (p.stale && p.op != cuda::CommandEncoder::kNoOp) {
        step_.set_wait(p.op, p.read);
        p.pointed = p.read;
      }
      p.stale = false;
      next_run_.waited.push_back(p.read);
    }
    if (time_runs_) {
      ctx_.encoder.commit();  // the feeds' copies before the start event
      next_run_.timing = std::make_shared<RunTiming>();
      FUSEBOX_CUDA_CHECK(cudaEventRecord(next_run_.timing->start, ctx_.encoder.stream()));
    }
    copy_staged_inputs();  // timed with the step, as the step's own first operation would be
    ctx_.encoder.replay(step_);
    if (time_runs_)
      FUSEBOX_CUDA_CHECK(cudaEventRecord(next_run_.timing->end, ctx_.encoder.stream()));
  }

  auto run = std::make_shared<RunCheck>();
  run->label = label;
  run->halt = halt_;
  run->index = index;
  if (errors_ && !errors_->pending.empty()) {
    run->reserved = errors_;
    run->records = error_staging_.acquire(errors_->bytes());
    size_t at = 0;
    for (const cuda::DeviceBuffer& chunk : errors_->chunks) {
      const size_t n = std::min(cuda::ErrorFlags::kRecordsPerChunk, errors_->pending.size() - at);
      ctx_.encoder.copy_to_host_async(run->records->bytes.get() + at * sizeof(cuda::ErrorRecord),
                                      cuda::BufferRange(chunk, 0, n * sizeof(cuda::ErrorRecord)));
      at += n;
    }
  }
  StepResult result;
  std::vector<std::shared_ptr<PendingTensor::State>> copies;
  std::vector<DeviceTensor> sources;
  std::vector<int> copied_outputs;
  size_t copy_bytes = 0;
  for (size_t i = 0; i < io_.output_names.size(); ++i) {
    const std::string& name = io_.output_names[i];
    result.outputs[name] = outputs_[i];
    if (!to_host.count(name)) continue;
    auto state = std::make_shared<PendingTensor::State>();
    const DeviceTensor& t = outputs_[i].storage()->tensor;
    state->dtype = t.dtype;
    state->shape = t.shape;
    // At most a slot per run in flight, beyond those the caller holds: a loop whose copies
    // are the bottleneck (GPT-2's 3.3 GB of logits) then waits for the oldest copy (which
    // the next run's outputs wait for anyway) instead of pinning another 3.3 GB (~1 s) in
    // the middle of its steps: a bench loop that holds its last result pinned a fourth
    // buffer inside its timed steps.
    state->slot = output_staging_[i].acquire(t.nbytes(), kMaxRunsInFlight);
    state->run = run;
    DeviceTensor src = t;
    if (!t.is_contiguous()) {  // read back through a contiguous copy of its own
      if (!readback_[i].buffer)
        readback_[i] = DeviceTensor::empty(ctx_.allocator, t.dtype, t.shape);
      src = readback_[i];
      // Not over the last run's copy out of it, which may still be going on.
      if (outputs_read_ && readback_stream_) ctx_.encoder.wait(outputs_read_);
      cuda::copy_strided(ctx_, t, src);
    }
    copy_bytes += t.nbytes();
    copied_outputs.push_back(int(i));
    copies.push_back(state);
    sources.push_back(src);
    result.host[name] = PendingTensor(std::move(state));
  }
  // Large outputs on the readback stream, after the step: the next run computes meanwhile
  // and waits for these copies only where it writes an output again (cuda_executable.h).
  const bool overlapped = !direct_ && copy_bytes >= kOverlappedOutputBytes;
  if (overlapped) {
    if (!readback_stream_) readback_stream_ = std::make_unique<cuda::CopyStream>(ctx_.device.id());
    const cuda::Fence written = ctx_.encoder.fence();
    for (size_t k = 0; k < copies.size(); ++k) {
      std::byte* host = copies[k]->slot->bytes.get();
      const cuda::BufferRange src = sources[k].range();
      bool in_pieces = false;
      for (ReadbackPiece& p : readback_pieces_) {  // a large output's pieces, each fenced
        if (p.output != copied_outputs[k]) continue;
        readback_stream_->copy_to_host(
            host + p.begin, cuda::BufferRange(src.buffer, src.offset + p.begin, p.bytes), written);
        p.read = readback_stream_->fence();
        p.stale = in_pieces = true;
      }
      if (!in_pieces) readback_stream_->copy_to_host(host, src, written);
    }
    outputs_read_ = readback_stream_->fence();
    if (!readback_pieces_.empty()) {  // the small outputs' piece
      readback_pieces_[0].read = outputs_read_;
      readback_pieces_[0].stale = true;
    }
  } else {
    for (size_t k = 0; k < copies.size(); ++k)
      ctx_.encoder.copy_to_host_async(copies[k]->slot->bytes.get(), sources[k].range());
  }
  run->fence = ctx_.encoder.fence();
  for (auto& state : copies) {
    if (overlapped) state->copied = outputs_read_;
    state->slot->last_use = overlapped ? outputs_read_ : run->fence;
  }
  if (run->records) run->records->last_use = run->fence;
  for (auto& slot : fed_slots_) slot->last_use = run->fence;
  fed_slots_.clear();
  next_run_.run = run;
  in_flight_.push_back(std::move(next_run_));
  next_run_ = {};
  return result;
}

void CudaExecutable::check_errors() {
  ctx_.encoder.synchronize();
  while (!in_flight_.empty()) retire_oldest_run();
  last_timed_.reset();  // the caller waited: the next run's wait for it is no idle time
}

void CudaExecutable::feed_inputs(const Feeds& feeds) {
  // Every feed checked before any is copied: a bad one leaves all inputs as they were.
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const std::string& name = io_.input_names[i];
    const TensorType& type = graph_.value(inputs_[i].value).type;
    auto it = feeds.find(name);
    if (it == feeds.end()) {
      FUSEBOX_CHECK(inputs_[i].has_contents, where_, "no tensor given for input '", name, "' (",
                    dtype_name(type.dtype), shape_str(type.shape), ")");
    } else if (const Tensor* t = std::get_if<Tensor>(&it->second)) {
      check_feed(type, name, t->dtype(), t->shape(), where_);
    } else {
      const DeviceArray& a = std::get<DeviceArray>(it->second);
      FUSEBOX_CHECK(a.defined() && a.device() == Device::cuda, where_, "input '", name,
                    "' was fed an array that is not on the GPU");
      check_feed(type, name, a.dtype(), a.shape(), where_);
    }
  }
  for (size_t i = 0; i < inputs_.size(); ++i) {
    Input& in = inputs_[i];
    const std::string& name = io_.input_names[i];
    auto it = feeds.find(name);
    if (it == feeds.end()) continue;
    const DeviceTensor& dst = in.array.storage()->tensor;
    if (const Tensor* t = std::get_if<Tensor>(&it->second)) {
      if (!dst.is_contiguous()) {
        in.array.copy_from(*t);  // resident state in another order: converted (blocking)
      } else if (in.staged && t->nbytes() > kSmallFeedBytes) {
        const void* source = t->raw();
        if (is_pinned(source)) {
          next_run_.pinned_feeds.push_back(*t);  // not written until copied: executable.h
        } else {
          std::shared_ptr<cuda::PinnedSlot> slot = input_staging_[i].acquire(t->nbytes(), 2);
          std::memcpy(slot->bytes.get(), t->raw(), t->nbytes());
          source = slot->bytes.get();
          fed_slots_.push_back(std::move(slot));
        }
        // The copy into `stage` waits for the last copy out of it (the run before's first
        // device operation), then the step's stream waits for it.
        ctx_.encoder.wait(copy_stream_->copy_to_device(
            cuda::BufferRange(stage_buffer(in), 0, t->nbytes()), source, in.stage_free));
        staged_now_.push_back(&in);
        in.has_contents = true;
        continue;
      } else if (t->nbytes() > 0) {
        std::shared_ptr<cuda::PinnedSlot> slot = input_staging_[i].acquire(t->nbytes(), 2);
        std::memcpy(slot->bytes.get(), t->raw(), t->nbytes());
        ctx_.encoder.copy_to_device_async(dst.range(), slot->bytes.get());
        fed_slots_.push_back(std::move(slot));
      }
    } else {
      const DeviceArray& a = std::get<DeviceArray>(it->second);
      const DeviceTensor& src = a.storage()->tensor;
      if (a.same_storage(in.array)) {
        // already there
      } else if (src.strides == dst.strides) {
        ctx_.encoder.copy_now(dst.range(), src.range());  // same order: a plain copy
        next_run_.array_feeds.push_back(a);  // the caller's array, until the copy is done
      } else {
        cuda::copy_strided(ctx_, src, dst);
      }
    }
    in.has_contents = true;
  }
}

const cuda::DeviceBuffer& CudaExecutable::stage_buffer(Input& in) {
  if (!in.stage) {  // with the first feed from the host: a loop fed from device arrays needs none
    const size_t bytes = in.array.nbytes();
    try {
      in.stage = ctx_.allocator.allocate(bytes);
    } catch (const Error& e) {
      throw Error(where_, cat("out of device memory for the staging buffer of input '",
                              io_.input_names[size_t(&in - inputs_.data())], "' (",
                              bytes_str(bytes), "): ", error_message(e)));
    }
  }
  return in.stage;
}

// The batches fed through `stage` this run, copied into their inputs' buffers on the step's
// stream (after the run before has read them); `stage_free` then lets the next batch's copy
// into `stage` start while this step runs.
void CudaExecutable::copy_staged_inputs() {
  for (Input* in : staged_now_) {
    const cuda::DeviceTensor& dst = in->array.storage()->tensor;
    ctx_.encoder.copy_now(dst.range(), cuda::BufferRange(in->stage, 0, dst.nbytes()));
    in->stage_free = ctx_.encoder.fence();
  }
  staged_now_.clear();
}

// Waits for the oldest run in flight, lets go of what it held, checks its error records.
void CudaExecutable::retire_oldest_run() {
  const std::shared_ptr<RunCheck> run = std::move(in_flight_.front().run);
  std::shared_ptr<RunTiming> timing = std::move(in_flight_.front().timing);
  in_flight_.pop_front();
  run->check();
  if (!timing) return;
  FUSEBOX_CUDA_CHECK(cudaEventSynchronize(timing->end));
  float ms = 0;
  FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, timing->start, timing->end));
  stats_.run_device_ms += ms;
  if (last_timed_) {
    FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, last_timed_->end, timing->start));
    stats_.run_idle_ms += ms;
  }
  ++stats_.timed_runs;
  last_timed_ = std::move(timing);
}

}  // namespace fusebox::runtime
