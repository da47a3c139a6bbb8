// Executable::profile on CUDA: each node recorded `repeats` times into a graph of its own
// and timed (cuda_executable.h), an output planned in its input's bytes into its own buffer.
#include "executable/cuda/cuda_executable.h"

namespace fusebox::runtime {

std::vector<NodeTime> CudaExecutable::profile(int repeats) {
  FUSEBOX_CHECK(repeats >= 1, where_, "profile: repeats must be at least 1, got ", repeats);
  FUSEBOX_CHECK(options_.aliases.empty(), where_,
                "profile: not for a step with aliased state (repeating would change it)");
  FUSEBOX_CHECK(!direct_, where_,
                "profile: needs CUDA graphs (FUSEBOX_CUDA_GRAPHS=0 launches directly)");
  check_errors();
  for (size_t i = 0; i < inputs_.size(); ++i)
    FUSEBOX_CHECK(inputs_[i].has_contents, where_, "profile: input '", io_.input_names[i],
                  "' has not been fed (the profile runs on the last feeds)");
  cudaEvent_t events[2] = {nullptr, nullptr};
  std::vector<NodeTime> times;
  const cuda::ConvReportScope reporting(report_);
  try {
    for (cudaEvent_t& e : events) FUSEBOX_CUDA_CHECK(cudaEventCreate(&e));
    Walk w = begin_walk(false);
    ctx_.encoder.commit();
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      const Node& n = graph_.nodes()[i];
      std::vector<DeviceTensor> outs = node_outputs(w, n);
      // An output computed in its input's bytes would read its own result on the repeats
      // (and leave the next nodes that): profiled into a buffer of its own.
      for (size_t k = 0; k < outs.size(); ++k) {
        const ValueId v = n.outputs[k];
        if (!computed_in_input_[size_t(v)]) continue;
        const TensorType& t = graph_.value(v).type;
        outs[k] = DeviceTensor::empty(ctx_.allocator, t.dtype, t.shape, layout_.of(v));
      }
      std::vector<DeviceTensor> written;
      for (int r = 0; r < repeats; ++r) {
        written = outs;
        record_node(i, w, written);
      }
      const cuda::RecordedGraph node_graph = ctx_.encoder.finish_recording();
      ctx_.encoder.replay(node_graph);  // the execution the next nodes read; warms up
      FUSEBOX_CUDA_CHECK(cudaEventRecord(events[0], ctx_.encoder.stream()));
      ctx_.encoder.replay(node_graph);
      FUSEBOX_CUDA_CHECK(cudaEventRecord(events[1], ctx_.encoder.stream()));
      FUSEBOX_CUDA_CHECK(cudaEventSynchronize(events[1]));
      float ms = 0;
      FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[1]));
      cuda::check_error_flags(ctx_);
      for (size_t k = 0; k < n.outputs.size(); ++k) w.slots[size_t(n.outputs[k])] = written[k];
      times.push_back({n.name, n.op, double(ms) / repeats});
    }
    end_walk(w);
    ctx_.encoder.synchronize();
    cuda::check_error_flags(ctx_);
  } catch (...) {
    ctx_.encoder.discard_recording();
    cuda::ErrorFlags::of(ctx_.encoder).take();
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : events) FUSEBOX_CUDA_CHECK(cudaEventDestroy(e));
  return times;
}

}  // namespace fusebox::runtime
