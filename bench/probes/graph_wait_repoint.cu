// nvcc -arch=sm_90 -o /tmp/graph_wait_repoint bench/probes/graph_wait_repoint.cu &&
// /tmp/graph_wait_repoint (session 45, H200: every "destroy" case fails with invalid argument; the
// others re-point fine) Re-pointing event-wait nodes each run as the executable does: W waits
// (chained), each before a memset of its piece, then a kernel; two execs of one graph alternating;
// per run, W D2H piece copies on a non-blocking stream, a fresh event after each; SetEvent on both
// execs before the next launch. Variants: events pending or not, one exec or two.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
__global__ void k(float* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] += 1;
}
int run(int execs, int W, bool wait_done, bool timing, bool destroy = false) {
  const size_t piece = size_t(64) << 20, bytes = piece * W;
  char* d;
  cudaMalloc(&d, bytes);
  void* h;
  cudaMallocHost(&h, bytes);
  cudaStream_t s, c;
  cudaStreamCreate(&s);
  cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking);
  cudaGraph_t g;
  cudaGraphCreate(&g, 0);
  std::vector<cudaGraphNode_t> w(W), m(W);
  unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  std::vector<cudaEvent_t> init(W);
  for (int i = 0; i < W; ++i) {
    cudaEventCreateWithFlags(&init[i], flags);
    cudaEventRecord(init[i], s);
  }
  cudaGraphNode_t last = nullptr;
  for (int i = 0; i < W; ++i) {
    cudaError_t e =
        cudaGraphAddEventWaitNode(&w[i], g, last ? &last : nullptr, last ? 1 : 0, init[i]);
    if (e) {
      printf("add wait %d: %s\n", i, cudaGetErrorString(e));
      return 1;
    }
    last = w[i];
    cudaMemsetParams mp = {};
    mp.dst = d + piece * i;
    mp.value = 0;
    mp.elementSize = 1;
    mp.width = piece;
    mp.height = 1;
    cudaGraphAddMemsetNode(&m[i], g, &w[i], 1, &mp);
  }
  size_t n = bytes / 4;
  float* f = (float*)d;
  void* args[] = {&f, &n};
  cudaKernelNodeParams kp = {};
  kp.func = (void*)k;
  kp.gridDim = 1024;
  kp.blockDim = 256;
  kp.kernelParams = args;
  cudaGraphNode_t kn;
  cudaGraphAddKernelNode(&kn, g, m.data(), W, &kp);
  std::vector<cudaGraphExec_t> x(execs);
  for (auto& e : x) {
    cudaError_t r = cudaGraphInstantiate(&e, g, 0);
    if (r) {
      printf("inst %s\n", cudaGetErrorString(r));
      return 1;
    }
  }
  std::vector<cudaEvent_t> cur = init;
  std::vector<std::vector<cudaEvent_t>> keep;
  for (int r = 0; r < 6; ++r) {
    if (destroy && r >= 2)  // the events the nodes wait on now go before they are re-pointed
      for (cudaEvent_t e : keep[r - 2]) cudaEventDestroy(e);
    if (r > 0)
      for (int i = 0; i < W; ++i)
        for (int ex = 0; ex < execs; ++ex) {
          cudaError_t e = cudaGraphExecEventWaitNodeSetEvent(x[ex], w[i], cur[i]);
          if (e) {
            printf("  run %d wait %d exec %d: %s (event query: %s)\n", r, i, ex,
                   cudaGetErrorString(e), cudaGetErrorString(cudaEventQuery(cur[i])));
            return 1;
          }
        }
    cudaGraphLaunch(x[r % execs], s);
    cudaEvent_t written;
    cudaEventCreateWithFlags(&written, flags);
    cudaEventRecord(written, s);
    cudaStreamWaitEvent(c, written, 0);
    std::vector<cudaEvent_t> next(W);
    for (int i = 0; i < W; ++i) {
      cudaMemcpyAsync((char*)h + piece * i, d + piece * i, piece, cudaMemcpyDeviceToHost, c);
      cudaEventCreateWithFlags(&next[i], flags);
      cudaEventRecord(next[i], c);
    }
    keep.push_back(next);
    cur = next;
    if (wait_done) cudaStreamSynchronize(c);
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("  sync: %s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
int main() {
  struct {
    int execs, W;
    bool done, timing, destroy;
  } cases[] = {{1, 1, false, false, false},  {2, 2, false, false, false},
               {2, 16, false, false, false}, {2, 1, false, false, true},
               {2, 2, false, false, true},   {1, 2, true, false, true},
               {2, 16, true, false, true}};
  for (auto c : cases) {
    printf("execs %d waits %d events done %d timing %d destroy %d\n", c.execs, c.W, c.done,
           c.timing, c.destroy);
    printf("  -> %s\n", run(c.execs, c.W, c.done, c.timing, c.destroy) ? "FAILED" : "ok");
  }
}
