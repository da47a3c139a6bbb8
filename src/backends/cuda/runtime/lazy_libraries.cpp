// cuBLASLt and NVRTC, loaded at their first call instead of at process start.
//
// Why: the dynamic loader maps and relocates every library a binary links before main(); for
// cuBLASLt that is ~210 MB of resident memory and ~0.1 s, for NVRTC ~35 MB and ~0.03 s, paid by
// every process, a CPU-only `fusebox run` or `fusebox --version` included (issue 43: a CPU run
// should not pay for the CUDA libraries). The CUDA runtime and cuDNN cost ~2 MB each and stay
// linked (cuDNN loads its engine libraries lazily itself).
//
// How: this file defines the entry points the project calls, with the headers' own signatures
// (a mismatch is a compile error: `&::name` would name two overloads). The first call of one
// loads its library by soname (so LD_LIBRARY_PATH and the binary's RUNPATH decide, as they did
// for the linked library; then the toolkit directory the build found), and each resolves its
// symbol once. A library that cannot be loaded is an Error naming it, raised by the call that
// needed it. A new entry point the project calls is an undefined reference at link time until
// it is added below. Defined with hidden visibility (CMakeLists.txt): a process that also links
// the real libraries (PyTorch beside the Python package) keeps its own.
#include <cublasLt.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <mutex>
#include <string>

#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

struct LazyLibrary {
  const char* stem;  // "libcublasLt.so": the soname adds the CUDA major version
  std::once_flag once;
  void* handle = nullptr;
  std::string failure;
};

LazyLibrary cublas_lt_library{"libcublasLt.so", {}, nullptr, {}};
LazyLibrary nvrtc_library{"libnvrtc.so", {}, nullptr, {}};

void load(LazyLibrary& lib) {
  const std::string soname = cat(lib.stem, ".", CUDART_VERSION / 1000);
  lib.handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle != nullptr) return;
  const char* first = ::dlerror();
  const std::string why = first ? first : "?";
  const std::string in_toolkit = cat(FUSEBOX_CUDA_LIBRARY_DIR, "/", soname);
  lib.handle = ::dlopen(in_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle != nullptr) return;
  lib.failure = cat("cannot load ", soname, " (", why, "; nor ", in_toolkit, "): put the CUDA ",
                    CUDART_VERSION / 1000, " toolkit's library directory on LD_LIBRARY_PATH");
}

void* symbol(LazyLibrary& lib, const char* name) {
  std::call_once(lib.once, [&] { load(lib); });
  if (lib.handle == nullptr) throw Error("cuda", lib.failure);
  void* fn = ::dlsym(lib.handle, name);
  FUSEBOX_CHECK(fn != nullptr, "cuda", lib.stem, " has no ", name,
                ": the loaded library is older than the build's headers");
  return fn;
}

}  // namespace
}  // namespace fusebox::cuda

// Defines `name` (declared by its header) as a call through the symbol resolved at first use.
#define FUSEBOX_LAZY(library, ret, name, params, args)                                             \
  ret name params {                                                                                \
    static const auto fn =                                                                         \
        reinterpret_cast<decltype(&::name)>(fusebox::cuda::symbol(fusebox::cuda::library, #name)); \
    return fn args;                                                                                \
  }

FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle),
             (handle))
FUSEBOX_LAZY(cublas_lt_library, const char*, cublasLtGetStatusName, (cublasStatus_t status),
             (status))
FUSEBOX_LAZY(cublas_lt_library, const char*, cublasLtGetStatusString, (cublasStatus_t status),
             (status))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmul,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
              cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc,
              const void* beta, const void* c, cublasLtMatrixLayout_t c_desc, void* d,
              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
              size_t workspace_bytes, cudaStream_t stream),
             (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
              workspace, workspace_bytes, stream))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
              cublasLtMatmulPreference_t preference, int requested,
              cublasLtMatmulHeuristicResult_t results[], int* returned),
             (handle, desc, a, b, c, d, preference, requested, results, returned))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
             (desc, compute, scale))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescDestroy,
             (cublasLtMatmulDesc_t desc), (desc))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
              size_t bytes),
             (desc, attr, buf, bytes))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceCreate,
             (cublasLtMatmulPreference_t * pref), (pref))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceDestroy,
             (cublasLtMatmulPreference_t pref), (pref))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const void* buf, size_t bytes),
             (pref, attr, buf, bytes))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
              int64_t ld),
             (layout, type, rows, cols, ld))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatrixLayoutDestroy,
             (cublasLtMatrixLayout_t layout), (layout))
FUSEBOX_LAZY(cublas_lt_library, cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
             (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
              size_t bytes),
             (layout, attr, buf, bytes))

FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcCompileProgram,
             (nvrtcProgram prog, int count, const char* const* options), (prog, count, options))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcCreateProgram,
             (nvrtcProgram * prog, const char* src, const char* name, int headers,
              const char* const* header_sources, const char* const* include_names),
             (prog, src, name, headers, header_sources, include_names))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin),
             (prog, cubin))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* bytes),
             (prog, bytes))
FUSEBOX_LAZY(nvrtc_library, const char*, nvrtcGetErrorString, (nvrtcResult result), (result))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetNumSupportedArchs, (int* count), (count))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char* log),
             (prog, log))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* bytes),
             (prog, bytes))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetPTX, (nvrtcProgram prog, char* ptx), (prog, ptx))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram prog, size_t* bytes),
             (prog, bytes))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcGetSupportedArchs, (int* archs), (archs))
FUSEBOX_LAZY(nvrtc_library, nvrtcResult, nvrtcVersion, (int* major, int* minor), (major, minor))
