// C++ fast path of the eager ops: an autograd node in C++ that launches the kernels Triton compiled.
//
// Why: on the H200 host, LayerNorm fwd+bwd through a Python torch.autograd.Function costs 222 us a call
// with every launch stubbed out, more than PyTorch's whole fwd+bwd (171 us).  The autograd engine runs a
// CUDA node's backward on its device thread, and a Python node makes that thread take the GIL and run
// Python.  Here the node (hand-written, as PyTorch's
// generated ones: torch::autograd::Function cost more than it saved), the allocations and the launches
// are C++, and so is the lookup of a registered shape's plan (norm_fast, softmax_fast, attention_fast).
//
// Kernels: the Python side compiles every kernel through Triton as before (the first call of a plan runs
// the Python path), then registers each compiled kernel: its CUfunction (already loaded by Triton, with
// its shared-memory attribute set), grid, threads, dynamic shared memory, and the kinds of its runtime
// parameters (pointer / i32 / i64 / fp32, '-' for an int Triton specialized into a constant, or 'T' for a
// host TMA descriptor: a 128-byte CUtensorMap the launch encodes from one of the call's pointers, as
// Triton's launcher does for a TensorDescriptor argument).  A launch fills the parameters in the kernel's
// order, then the pointers of Triton's scratch parameters.
//
// The CUDA driver is opened at run time (dlopen libcuda.so.1, as Triton's own launcher does); cuda.h comes
// from Triton's package.  Built on first use by torch.utils.cpp_extension (fused_layers/ops/_cpp.py).
#include <torch/extension.h>
#include <cuda.h>
#include <dlfcn.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define FL_HAVE_C10_CUDA 1
#endif

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace {
// Nodes are held by std::shared_ptr (torch <= 2.1x) or c10::intrusive_ptr (newer torch): whatever an Edge holds.
using NodePtr = decltype(std::declval<torch::autograd::Edge>().function);

template <class T>
struct NodeRef {  // the node as T (to fill its saved state) and as the Edge's pointer type
  NodePtr ptr;
  T* operator->() const { return static_cast<T*>(ptr.get()); }
  operator const NodePtr&() const { return ptr; }
};
template <class T>
NodeRef<T> make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    // deleteNode (found through T's base class) frees long chains of nodes without deep recursion
    return NodeRef<T>{std::shared_ptr<T>(new T(), [](T* n) { deleteNode(n); })};
  } else {
    return NodeRef<T>{c10::make_intrusive<T>()};
  }
}

template <class T>
struct AsNode {  // Node, as a type that depends on T: the branch of the other torch is never instantiated
  using type = Node;
};

// The node itself as the pointer SavedVariable::unpack takes (to give a saved output its grad_fn back).
template <class T>
NodePtr self_ptr(T* n) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return n->shared_from_this();
  } else {
    return c10::intrusive_ptr<typename AsNode<T>::type>::unsafe_reclaim_from_nonowning(n);
  }
}

// Whether a call may take the C++ fast path at all: no autocast on CUDA (the Python path applies autocast's
// dtype policy), and no forward-mode AD tangents (the Python path's custom op handles those).
// A forward-mode AD tangent on t (read from its autograd metadata: x._fw_grad() is a dispatched op).
bool has_tangent(const at::Tensor& t) {
  if (!t.defined()) return false;
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  return meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty();
}

bool plain_call(const at::Tensor& x) { return !at::autocast::is_autocast_enabled(at::kCUDA) && !has_tangent(x); }

// The fast paths' plan tables: (rows, width, dtypes, device, flags) of a contiguous, aligned call -> the plan
// the Python path registered for it.  Read on every call, written once per new shape.
using FastKey = std::array<int64_t, 7>;
struct FastKeyHash {
  size_t operator()(const FastKey& k) const {
    size_t h = 0;
    for (int64_t e : k) h = h * 1000003u ^ std::hash<int64_t>()(e);
    return h;
  }
};
std::shared_mutex g_fast_mutex;
std::unordered_map<FastKey, int64_t, FastKeyHash> g_norm_fast, g_softmax_fast;
double g_rms_eps[3] = {0, 0, 0};  // torch's default RMSNorm eps for float16, bfloat16, float32 inputs

int64_t fast_find(const std::unordered_map<FastKey, int64_t, FastKeyHash>& table, const FastKey& key) {
  std::shared_lock<std::shared_mutex> lock(g_fast_mutex);
  auto it = table.find(key);
  return it == table.end() ? -1 : it->second;
}

bool aligned_contiguous(const at::Tensor& t) {
  // (no storage: a functorch wrapper or a batched tensor; the Python path handles those)
  return t.has_storage() && t.is_contiguous() && ((uintptr_t)t.data_ptr() & 15) == 0;
}

constexpr size_t kMaxParams = 128;  // runtime parameters of one kernel (attention's backward takes ~50)

typedef CUresult (*PFN_Launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void**, void**);
typedef CUresult (*PFN_LaunchEx)(const CUlaunchConfig*, CUfunction, void**, void**);  // CUDA >= 12 (PDL launches)
typedef CUresult (*PFN_ParamInfo)(CUfunction, size_t, size_t*, size_t*);
typedef CUresult (*PFN_CtxGetCurrent)(CUcontext*);
typedef CUresult (*PFN_CtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_DeviceGet)(CUdevice*, int);
typedef CUresult (*PFN_PrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*PFN_TensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                             const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                             CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                             CUtensorMapFloatOOBfill);

struct Driver {
  PFN_Launch launch = nullptr;
  PFN_LaunchEx launch_ex = nullptr;  // programmatic dependent launches (Triton's launch_pdl)
  PFN_ParamInfo param_info = nullptr;  // CUDA >= 12.4
  PFN_CtxGetCurrent ctx_get = nullptr;
  PFN_CtxSetCurrent ctx_set = nullptr;
  PFN_DeviceGet device_get = nullptr;
  PFN_PrimaryCtxRetain primary_retain = nullptr;
  PFN_TensorMapEncodeTiled encode_tiled = nullptr;  // CUDA >= 12 (host TMA descriptors, kind 'T')
};

Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(h != nullptr, "fused_layers C++ fast path: cannot open libcuda.so.1");
    d.launch = (PFN_Launch)dlsym(h, "cuLaunchKernel");
    d.launch_ex = (PFN_LaunchEx)dlsym(h, "cuLaunchKernelEx");
    d.param_info = (PFN_ParamInfo)dlsym(h, "cuFuncGetParamInfo");
    d.ctx_get = (PFN_CtxGetCurrent)dlsym(h, "cuCtxGetCurrent");
    d.ctx_set = (PFN_CtxSetCurrent)dlsym(h, "cuCtxSetCurrent");
    d.device_get = (PFN_DeviceGet)dlsym(h, "cuDeviceGet");
    d.primary_retain = (PFN_PrimaryCtxRetain)dlsym(h, "cuDevicePrimaryCtxRetain");
    d.encode_tiled = (PFN_TensorMapEncodeTiled)dlsym(h, "cuTensorMapEncodeTiled");
    TORCH_CHECK(d.launch && d.ctx_get && d.ctx_set && d.device_get && d.primary_retain,
                "fused_layers C++ fast path: libcuda lacks an entry point it needs");
  });
  return d;
}

void check(CUresult r, const char* what) {
  TORCH_CHECK(r == CUDA_SUCCESS, "fused_layers C++ fast path: ", what, " failed (CUresult ", (int)r, ")");
}

// A host TMA descriptor parameter ('T'): everything but the base address is fixed by the plan; the launch
// encodes it with the call's pointer `ptr` as Triton's fill_tma_descriptor does (no interleave, L2 promotion
// 128 B, no OOB fill).  Sizes in the driver's order (innermost first); strides in bytes (rank - 1 of them).
struct TmaSpec {
  int ptr;                            // index of the base among the call's pointers
  CUtensorMapDataType dtype;
  cuuint32_t rank;
  CUtensorMapSwizzle swizzle;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5];
};
constexpr size_t kMaxTma = 4;

// One kernel at one launch plan.
struct Launch {
  CUfunction fn;
  int device;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  std::string kinds;          // per runtime parameter: 'p' pointer, 'i' i32, 'l' i64, 'f' fp32, '-' constant
  std::vector<int64_t> ints;  // the plan's fixed integer arguments, in order (constants included)
  int extra;                  // Triton's trailing scratch pointers (null unless scratch_bytes)
  int64_t scratch_bytes;      // global scratch of the whole grid (device-side TMA descriptors); 0: none
  std::vector<TmaSpec> tmas;  // the 'T' parameters, in order
  bool pdl;                   // a programmatic dependent launch (the kernel waits for its predecessor on the device)
};

std::vector<Launch> g_launches;
std::mutex g_mutex;  // registration only (launches read entries that are never moved: reserve below)

// Pack the parameters of `L` for a call with these pointers and floats, in the kernel's parameter order:
// one 8-byte slot per parameter (i32 / fp32 in its low 4 bytes), `params` pointing at the slots, Triton's
// trailing scratch pointers null.  Returns the parameter count.
template <typename PtrIt, typename FltIt>
size_t pack(const Launch& L, PtrIt p, PtrIt p_end, FltIt f, FltIt f_end, uint64_t* store, void** params,
            const void* scratch = nullptr, CUtensorMap* maps = nullptr) {
  size_t np = 0;
  size_t ii = 0, ti = 0;
  for (char k : L.kinds) {
    if (k == 'T') {  // the descriptor itself is the parameter (128 bytes, encoded by `launch`)
      TORCH_CHECK(maps != nullptr && ti < L.tmas.size(), "fused_layers C++ fast path: no TMA descriptor to pass");
      params[np++] = &maps[ti++];
      continue;
    }
    switch (k) {
      case 'p':
        TORCH_CHECK(p != p_end, "fused_layers C++ fast path: too few pointers for the kernel");
        store[np] = (uint64_t)(uintptr_t)(*p++);
        break;
      case 'l':
        store[np] = (uint64_t)L.ints.at(ii++);
        break;
      case 'i': {
        int32_t v = (int32_t)L.ints.at(ii++);
        store[np] = 0;
        std::memcpy(&store[np], &v, sizeof v);
        break;
      }
      case 'f': {
        TORCH_CHECK(f != f_end, "fused_layers C++ fast path: too few floats for the kernel");
        float v = (float)(*f++);
        store[np] = 0;
        std::memcpy(&store[np], &v, sizeof v);
        break;
      }
      case '-':  // an int Triton compiled in as a constant: no parameter
        ++ii;
        continue;
      default:
        TORCH_CHECK(false, "fused_layers C++ fast path: unknown parameter kind ", k);
    }
    params[np] = &store[np];
    ++np;
  }
  TORCH_CHECK(p == p_end && f == f_end && ii == L.ints.size(), "fused_layers C++ fast path: arguments left over");
  for (int e = 0; e < L.extra; ++e) {  // global scratch first, then profile scratch (always null here)
    store[np] = e == 0 ? (uint64_t)(uintptr_t)scratch : 0;
    params[np] = &store[np];
    ++np;
  }
  return np;
}

// Launch `L` with the call's pointers and floats.
// Dry run (set_dry_run; a test hook): launches return at once, so everything else (argument conversion,
// allocations, the autograd node, the engine) runs, and is tested, without a GPU.
bool g_dry_run = false;

// A tensor the fast paths take: CUDA; in a dry run CPU tensors too, so that the whole call from Python runs
// on a machine without a GPU.
bool on_device(const at::Tensor& t) { return t.is_cuda() || (g_dry_run && t.device().is_cpu()); }

void launch(const Launch& L, std::initializer_list<const void*> ptrs, std::initializer_list<double> floats) {
  if (g_dry_run) return;
  Driver& d = driver();
  uint64_t store[kMaxParams];  // (register_launch refused plans with more parameters)
  void* params[kMaxParams];
  at::Tensor scratch;  // freed after the launch: the caching allocator reuses it only in stream order
  if (L.scratch_bytes > 0)
    scratch = at::empty({L.scratch_bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, (c10::DeviceIndex)L.device));
  alignas(64) CUtensorMap maps[kMaxTma];  // (register_launch refused plans with more)
  for (size_t t = 0; t < L.tmas.size(); ++t) {
    const TmaSpec& T = L.tmas[t];
    TORCH_CHECK(T.ptr >= 0 && (size_t)T.ptr < ptrs.size(), "fused_layers C++ fast path: TMA base out of range");
    const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    check(d.encode_tiled(&maps[t], T.dtype, T.rank, const_cast<void*>(ptrs.begin()[T.ptr]), T.dims, T.strides, T.box,
                         ones, CU_TENSOR_MAP_INTERLEAVE_NONE, T.swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
  }
  pack(L, ptrs.begin(), ptrs.end(), floats.begin(), floats.end(), store, params,
       scratch.defined() ? scratch.data_ptr() : nullptr, maps);
#ifdef FL_HAVE_C10_CUDA
  // The function belongs to its device's context: make that device current (a model on cuda:1 called
  // while cuda:0 is current), as aten's kernels do for their tensors.
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)L.device);
#endif
  CUcontext ctx = nullptr;
  check(d.ctx_get(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) {  // a thread that has not touched CUDA yet: the device's primary context, as Triton does
    CUdevice dev;
    check(d.device_get(&dev, L.device), "cuDeviceGet");
    check(d.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(d.ctx_set(ctx), "cuCtxSetCurrent");
  }
#ifdef FL_HAVE_C10_CUDA
  CUstream stream = (CUstream)c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)L.device).stream();
#else
  CUstream stream = nullptr;  // a CPU-only build of torch: compiles, never launches (no CUDA tensors)
#endif
  if (L.pdl) {  // as Triton's launcher does for launch_pdl: the launch may start before its predecessor has finished
    CUlaunchAttribute attr[1] = {};
    attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[0].value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg = {};
    cfg.gridDimX = L.grid[0];
    cfg.gridDimY = L.grid[1];
    cfg.gridDimZ = L.grid[2];
    cfg.blockDimX = L.threads;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = L.shared;
    cfg.hStream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    check(d.launch_ex(&cfg, L.fn, params, nullptr), "cuLaunchKernelEx");
    return;
  }
  check(d.launch(L.fn, L.grid[0], L.grid[1], L.grid[2], L.threads, 1, 1, L.shared, stream, params, nullptr),
        "cuLaunchKernel");
}

}  // namespace

// How many parameters a loaded function takes; -1 if this driver cannot say (cuFuncGetParamInfo: CUDA >= 12.4).
int64_t param_count(int64_t function) {
  Driver& d = driver();
  if (!d.param_info) return -1;
  CUfunction fn = (CUfunction)(uintptr_t)function;
  size_t off, size;
  int64_t n = 0;
  while (n < 2 * (int64_t)kMaxParams && d.param_info(fn, (size_t)n, &off, &size) == CUDA_SUCCESS) ++n;
  return n;
}

// The slots `launch` would pass for these arguments (tests: the packing, without a GPU); a 'T' parameter (a
// TMA descriptor, passed by its own storage) shows as -1000 - its index.
std::vector<int64_t> pack_for_test(const std::string& kinds, std::vector<int64_t> ints, int64_t extra,
                                   std::vector<int64_t> ptrs, std::vector<double> floats) {
  Launch L{nullptr, 0, {1, 1, 1}, 32, 0, kinds, std::move(ints), (int)extra, 0, {}};
  TORCH_CHECK(kinds.size() + extra <= kMaxParams, "too many parameters");
  L.tmas.resize((size_t)std::count(kinds.begin(), kinds.end(), 'T'));
  TORCH_CHECK(L.tmas.size() <= kMaxTma, "too many TMA descriptors");
  uint64_t store[kMaxParams];
  void* params[kMaxParams];
  CUtensorMap maps[kMaxTma];
  std::vector<const void*> p;
  for (int64_t v : ptrs) p.push_back((const void*)(uintptr_t)v);
  size_t np = pack(L, p.begin(), p.end(), floats.begin(), floats.end(), store, params, nullptr, maps);
  std::vector<int64_t> out;
  for (size_t i = 0, t = 0; i < np; ++i) {
    if (t < L.tmas.size() && params[i] == &maps[t]) {
      out.push_back(-1000 - (int64_t)t++);
      continue;
    }
    TORCH_CHECK(params[i] == &store[i], "parameter pointers out of order");
    out.push_back((int64_t)store[i]);
  }
  return out;
}

// Register a compiled kernel at one plan; returns its handle.
// `tmas`: one entry per 'T' in `kinds`, [ptr, CUtensorMapDataType, rank, swizzle, dims (rank, innermost
// first), byte strides (rank - 1), box (rank)].
int64_t register_launch(int64_t function, int64_t device, std::vector<int64_t> grid, int64_t threads, int64_t shared,
                        const std::string& kinds, std::vector<int64_t> ints, int64_t extra, int64_t scratch_bytes,
                        std::vector<std::vector<int64_t>> tmas, int64_t pdl) {
  TORCH_CHECK(scratch_bytes == 0 || extra >= 1, "a kernel with global scratch takes a scratch pointer");
  TORCH_CHECK(!pdl || driver().launch_ex != nullptr, "fused_layers C++ fast path: this driver lacks cuLaunchKernelEx");
  TORCH_CHECK(grid.size() == 3, "grid must have 3 entries");
  TORCH_CHECK(tmas.size() == (size_t)std::count(kinds.begin(), kinds.end(), 'T') && tmas.size() <= kMaxTma,
              "fused_layers C++ fast path: one TMA spec per 'T' parameter, at most ", kMaxTma);
  std::vector<TmaSpec> specs;
  for (const auto& v : tmas) {
    TORCH_CHECK(v.size() >= 4, "fused_layers C++ fast path: a TMA spec is [ptr, dtype, rank, swizzle, ...]");
    const int64_t rank = v[2];
    TORCH_CHECK(1 <= rank && rank <= 5 && v.size() == (size_t)(4 + 3 * rank - 1), "fused_layers C++ fast path: bad TMA spec");
    TORCH_CHECK(driver().encode_tiled != nullptr, "fused_layers C++ fast path: this driver lacks cuTensorMapEncodeTiled");
    TmaSpec T{};
    T.ptr = (int)v[0];
    T.dtype = (CUtensorMapDataType)v[1];
    T.rank = (cuuint32_t)rank;
    T.swizzle = (CUtensorMapSwizzle)v[3];
    for (int64_t i = 0; i < rank; ++i) T.dims[i] = (cuuint64_t)v[4 + i];
    for (int64_t i = 0; i + 1 < rank; ++i) T.strides[i] = (cuuint64_t)v[4 + rank + i];
    for (int64_t i = 0; i < rank; ++i) T.box[i] = (cuuint32_t)v[4 + 2 * rank - 1 + i];
    specs.push_back(T);
  }
  // Checked here, where Python falls back to its own path, never at launch time inside a training step.
  TORCH_CHECK(kinds.size() + (size_t)extra <= kMaxParams, "fused_layers C++ fast path: too many kernel parameters");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_launches.capacity() == 0) g_launches.reserve(1 << 16);
  TORCH_CHECK(g_launches.size() < g_launches.capacity(), "fused_layers C++ fast path: too many launch plans");
  g_launches.push_back(Launch{(CUfunction)(uintptr_t)function, (int)device,
                              {(unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]}, (unsigned)threads,
                              (unsigned)shared, kinds, std::move(ints), (int)extra, scratch_bytes, std::move(specs), pdl != 0});
  return (int64_t)g_launches.size() - 1;
}

// ----------------------------------------------------------------------------------------------------
// LayerNorm / RMSNorm (single-block kernels of fused_layers/ops/layer_norm.py)
// ----------------------------------------------------------------------------------------------------
struct NormPlan {
  int64_t fwd, bwd, red;  // launch handles; bwd = -1: forward only; red = -1: no weight or bias
  int64_t nstats, nparts;
  int64_t y_dtype;  // the output's at::ScalarType; -1: x's (RMSNorm variants: promote_types(x, weight))
};

at::TensorOptions y_options(const NormPlan& P, const at::Tensor& x) {
  return P.y_dtype < 0 ? x.options() : x.options().dtype((at::ScalarType)P.y_dtype);
}
std::vector<NormPlan> g_norms;

int64_t register_norm(int64_t fwd, int64_t bwd, int64_t red, int64_t nstats, int64_t nparts, int64_t y_dtype) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_norms.capacity() == 0) g_norms.reserve(1 << 14);
  TORCH_CHECK(g_norms.size() < g_norms.capacity(), "fused_layers C++ fast path: too many norm plans");
  g_norms.push_back(NormPlan{fwd, bwd, red, nstats, nparts, y_dtype});
  return (int64_t)g_norms.size() - 1;
}

// The norm's autograd node.  A hand-written torch::autograd::Node, as PyTorch's generated nodes are
// (NativeLayerNormBackward0): torch::autograd::Function (CppNode) cost 17 us more per forward and 58 us
// more per backward than aten's node on the H200 host.
struct NormBackward : public Node {
  SavedVariable x_, w_, b_, stats_;
  int64_t plan_ = 0;
  std::string name() const override { return "FusedNormBackward"; }
  void release_variables() override {
    x_.reset_data();
    w_.reset_data();
    b_.reset_data();
    stats_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    at::AutoDispatchBelowADInplaceOrView guard;
    variable_list out(3);  // dx, dweight, dbias (one per next edge)
    at::Tensor dy = grads[0];
    if (!dy.defined()) return out;
    const NormPlan& P = g_norms[(size_t)plan_];
    at::Tensor x = x_.unpack(), w = w_.unpack(), b = b_.unpack(), stats = stats_.unpack();
    if (dy.scalar_type() != x.scalar_type()) dy = dy.to(x.scalar_type());
    // The backward kernel was compiled for a contiguous, 16-byte aligned dy of x's dtype.
    if (!dy.is_contiguous() || ((uintptr_t)dy.data_ptr() & 15)) dy = dy.clone(at::MemoryFormat::Contiguous);
    at::Tensor dx = at::empty_like(x);
    at::Tensor parts = P.nparts ? at::empty({P.nparts}, x.options().dtype(at::kFloat)) : stats;
    launch(g_launches[(size_t)P.bwd], {x.data_ptr(), dy.data_ptr(), dx.data_ptr(), (w.defined() ? w : x).data_ptr(),
                                       stats.data_ptr(), parts.data_ptr()}, {});
    // dweight / dbias only when the graph wants one of them (frozen parameters, autograd.grad(x) alone): then
    // no reduce launch and no allocations, as aten skips its gamma / beta kernel.
    const bool want_w = w.defined() && task_should_compute_output(1), want_b = b.defined() && task_should_compute_output(2);
    if (P.red >= 0 && (want_w || want_b)) {
      // The reduce kernel writes both when both exist (HAS_W / HAS_B are compiled in): give it real buffers.
      at::Tensor dw = w.defined() ? at::empty(w.sizes(), w.options()) : at::Tensor();
      at::Tensor db = b.defined() ? at::empty(b.sizes(), b.options()) : at::Tensor();
      launch(g_launches[(size_t)P.red], {parts.data_ptr(), (dw.defined() ? dw : dx).data_ptr(),
                                         (db.defined() ? db : dx).data_ptr()}, {});
      if (want_w) out[1] = dw;
      if (want_b) out[2] = db;
    }
    out[0] = dx;
    return out;
  }
};

// The forward with its node: x contiguous and 16-byte aligned, weight / bias contiguous and aligned
// (checked by the caller), and some input requires grad.
at::Tensor norm_forward_node(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, int64_t plan) {
  const NormPlan& P = g_norms[(size_t)plan];
  at::Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = at::empty_like(x, y_options(P, x));
    stats = at::empty({P.nstats}, x.options().dtype(at::kFloat));
    // Missing parameters: any pointer (HAS_W / HAS_B are constexpr False, never dereferenced).
    launch(g_launches[(size_t)P.fwd], {x.data_ptr(), y.data_ptr(), (w.defined() ? w : x).data_ptr(),
                                       (b.defined() ? b : x).data_ptr(), stats.data_ptr()}, {eps});
  }
  auto node = make_node<NormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->x_ = SavedVariable(x, false);
  node->w_ = SavedVariable(w, false);
  node->b_ = SavedVariable(b, false);
  node->stats_ = SavedVariable(stats, false);
  node->plan_ = plan;
  torch::autograd::set_history(y, node);
  return y;
}

// A forward no backward will follow (no statistics: the plan's kernel was compiled with STORE_STATS=False
// and takes x as its unused statistics pointer, as the Python launcher passes it).
// (weight / bias: undefined when absent)
at::Tensor norm_infer_impl(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, int64_t plan) {
  const NormPlan& P = g_norms.at((size_t)plan);
  at::Tensor y = at::empty_like(x, y_options(P, x));
  launch(g_launches[(size_t)P.fwd], {x.data_ptr(), y.data_ptr(), (w.defined() ? w : x).data_ptr(),
                                     (b.defined() ? b : x).data_ptr(), x.data_ptr()}, {eps});
  return y;
}

at::Tensor norm_infer(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                      double eps, int64_t plan) {
  return norm_infer_impl(x, weight.has_value() ? *weight : at::Tensor(), bias.has_value() ? *bias : at::Tensor(), eps, plan);
}

at::Tensor norm_apply(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                      double eps, int64_t plan) {
  return norm_forward_node(x, weight.has_value() ? *weight : at::Tensor(), bias.has_value() ? *bias : at::Tensor(), eps,
                           plan);
}

void bind_norm(std::vector<int64_t> key, int64_t plan) {
  TORCH_CHECK(key.size() == 7, "a norm key has 7 entries");
  std::unique_lock<std::shared_mutex> lock(g_fast_mutex);
  g_norm_fast[FastKey{key[0], key[1], key[2], key[3], key[4], key[5], key[6]}] = plan;
}

void set_rms_default_eps(double f16, double bf16, double f32) {
  g_rms_eps[0] = f16;
  g_rms_eps[1] = bf16;
  g_rms_eps[2] = f32;
}

// F.layer_norm / F.rms_norm in one C++ call for a shape the Python path has registered: None otherwise (the
// Python path then runs, validates and raises its errors, and registers new shapes).  The key's dtypes are
// c10::ScalarType codes (-1: no weight / bias); flags: 1 RMSNorm, 2 with its autograd node, 4 / 8 the RMSNorm
// variants (norm_fast_impl).
// The lookup and the call: x already checked against a trailing shape of n elements (`shape`); flags as in the
// key (beyond 1 RMSNorm and 2 autograd: 4 the HF rounding before the weight, 8 a float32 output).
std::optional<at::Tensor> norm_fast_impl(const at::Tensor& x, int64_t n, at::IntArrayRef shape, const at::Tensor& w,
                                         const at::Tensor& b, std::optional<double> eps, int64_t flags) {
  bool grad = x.requires_grad();
  for (const at::Tensor* p : {&w, &b}) {
    if (!p->defined()) continue;
    if (p->device() != x.device() || p->sizes() != shape || !aligned_contiguous(*p) || has_tangent(*p)) return {};
    grad = grad || p->requires_grad();
  }
  grad = grad && at::GradMode::is_enabled();
  const FastKey key{x.numel() / n, n, (int64_t)x.scalar_type(), w.defined() ? (int64_t)w.scalar_type() : -1,
                    b.defined() ? (int64_t)b.scalar_type() : -1, (int64_t)x.get_device(), flags | (grad ? 2 : 0)};
  const int64_t plan = fast_find(g_norm_fast, key);
  if (plan < 0) return {};
  double e;
  if (eps.has_value()) {
    e = *eps;
  } else {  // rms_norm's eps=None
    const int slot = x.scalar_type() == at::kHalf ? 0 : x.scalar_type() == at::kBFloat16 ? 1 : 2;
    e = g_rms_eps[slot];
  }
  if (grad) return norm_forward_node(x, w, b, e, plan);
  return norm_infer_impl(x, w, b, e, plan);
}

std::optional<at::Tensor> norm_fast(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                                    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                    std::optional<double> eps, bool is_rms) {
  const int64_t k = (int64_t)normalized_shape.size(), dim = x.dim();
  if (!on_device(x) || k == 0 || k > dim || x.numel() == 0 || !aligned_contiguous(x) || !plain_call(x)) return {};
  int64_t n = 1;
  for (int64_t i = 0; i < k; ++i) {
    if (x.size(dim - k + i) != normalized_shape[i]) return {};
    n *= normalized_shape[i];
  }
  return norm_fast_impl(x, n, normalized_shape, weight.has_value() ? *weight : at::Tensor(),
                        bias.has_value() ? *bias : at::Tensor(), eps, is_rms ? 1 : 0);
}

// fused_rms_norm_variant's call (the HF Llama / Gemma RMSNorms of ops/norm_variants.py): the output is
// promote_types(x, weight), or x's dtype with keep_input_dtype.
std::optional<at::Tensor> rms_variant_fast(const at::Tensor& x, const at::Tensor& weight, double eps, bool cast_before_w,
                                           bool keep_input_dtype) {
  if (!on_device(x) || x.dim() == 0 || x.numel() == 0 || !weight.defined() || weight.dim() != 1 ||
      !aligned_contiguous(x) || !plain_call(x))
    return {};
  const int64_t n = x.size(x.dim() - 1);
  const bool f32_out = !keep_input_dtype && weight.scalar_type() == at::kFloat && x.scalar_type() != at::kFloat;
  return norm_fast_impl(x, n, at::IntArrayRef(&n, 1), weight, at::Tensor(), eps,
                        1 | (cast_before_w ? 4 : 0) | (f32_out ? 8 : 0));
}

// ----------------------------------------------------------------------------------------------------
// Softmax (single-block kernels of fused_layers/ops/softmax.py)
// ----------------------------------------------------------------------------------------------------
struct SoftmaxBackward : public Node {
  SavedVariable y_;  // the node's own output
  int64_t bwd_ = 0;
  std::string name() const override { return "FusedSoftmaxBackward"; }
  void release_variables() override { y_.reset_data(); }
  variable_list apply(variable_list&& grads) override {
    at::AutoDispatchBelowADInplaceOrView guard;
    variable_list out(1);
    at::Tensor dy = grads[0];
    if (!dy.defined()) return out;
    at::Tensor y = y_.unpack(self_ptr(this));
    if (dy.scalar_type() != y.scalar_type()) dy = dy.to(y.scalar_type());
    if (!aligned_contiguous(dy)) dy = dy.clone(at::MemoryFormat::Contiguous);
    at::Tensor dx = at::empty_like(y);
    launch(g_launches[(size_t)bwd_], {y.data_ptr(), dy.data_ptr(), dx.data_ptr()}, {});
    out[0] = dx;
    return out;
  }
};

// x contiguous and 16-byte aligned (checked by the caller); fwd / bwd: launch handles.
at::Tensor softmax_apply(const at::Tensor& x, int64_t fwd, int64_t bwd) {
  at::Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = at::empty_like(x);
    launch(g_launches[(size_t)fwd], {x.data_ptr(), y.data_ptr()}, {});
  }
  auto node = make_node<SoftmaxBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  node->bwd_ = bwd;
  torch::autograd::set_history(y, node);
  node->y_ = SavedVariable(y, true);
  return y;
}

at::Tensor softmax_infer(const at::Tensor& x, int64_t fwd) {
  at::Tensor y = at::empty_like(x);
  launch(g_launches[(size_t)fwd], {x.data_ptr(), y.data_ptr()}, {});
  return y;
}

// Registered softmax plans: (forward, backward) launch handles; backward -1: forward only.
std::vector<std::pair<int64_t, int64_t>> g_softmax;

void bind_softmax(std::vector<int64_t> key, int64_t fwd, int64_t bwd) {
  TORCH_CHECK(key.size() == 7, "a softmax key has 7 entries");
  std::unique_lock<std::shared_mutex> lock(g_fast_mutex);
  if (g_softmax.capacity() == 0) g_softmax.reserve(1 << 14);
  TORCH_CHECK(g_softmax.size() < g_softmax.capacity(), "fused_layers C++ fast path: too many softmax plans");
  g_softmax.emplace_back(fwd, bwd);
  g_softmax_fast[FastKey{key[0], key[1], key[2], key[3], key[4], key[5], key[6]}] = (int64_t)g_softmax.size() - 1;
}

// torch.softmax(x, dim) over the last dim in one C++ call for a registered shape; None otherwise.
// Key: (rows, width, dtype, -1, -1, device, 2 with the autograd node).
std::optional<at::Tensor> softmax_fast(const at::Tensor& x, int64_t dim) {
  const int64_t nd = x.dim();
  if (!on_device(x) || nd == 0 || (dim != -1 && dim != nd - 1) || x.numel() == 0 || !aligned_contiguous(x) ||
      !plain_call(x))
    return {};
  const bool grad = x.requires_grad() && at::GradMode::is_enabled();
  const int64_t n = x.size(nd - 1);
  const int64_t id = fast_find(g_softmax_fast, FastKey{x.numel() / n, n, (int64_t)x.scalar_type(), -1, -1,
                                                       (int64_t)x.get_device(), grad ? 2 : 0});
  if (id < 0) return {};
  const auto& h = g_softmax[(size_t)id];
  return grad ? softmax_apply(x, h.first, h.second) : softmax_infer(x, h.first);
}

// ----------------------------------------------------------------------------------------------------
// Attention (dense: no mask or bias, fixed lengths; dropout or not) of fused_layers/ops/attention.py.  Kernel
// arguments as attention_forward / attention_backward pass them: the unused key-bias and cu_seqlens pointers
// (and the seed's without dropout) get q, never dereferenced (constexpr flags).
// ----------------------------------------------------------------------------------------------------
struct AttnPlan {
  int64_t fwd, pre, dkdv, dq;  // launch handles; pre = -1: forward only
  std::vector<int64_t> out_strides, lse_shape, dq_strides, dk_strides, dv_strides;
};
std::vector<AttnPlan> g_attn;

int64_t register_attention(int64_t fwd, int64_t pre, int64_t dkdv, int64_t dq, std::vector<int64_t> out_strides,
                           std::vector<int64_t> lse_shape, std::vector<int64_t> dq_strides,
                           std::vector<int64_t> dk_strides, std::vector<int64_t> dv_strides) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_attn.capacity() == 0) g_attn.reserve(1 << 14);
  TORCH_CHECK(g_attn.size() < g_attn.capacity(), "fused_layers C++ fast path: too many attention plans");
  g_attn.push_back(AttnPlan{fwd, pre, dkdv, dq, std::move(out_strides), std::move(lse_shape), std::move(dq_strides),
                            std::move(dk_strides), std::move(dv_strides)});
  return (int64_t)g_attn.size() - 1;
}

// out (laid out like q) and the fp32 base-2 LSE.  Dropout: the int64 [1] Philox seed, p and the kept values'
// scale (1 / (1 - p rounded to the mask's steps), computed by the caller); no seed: no dropout.
static std::pair<at::Tensor, at::Tensor> attn_forward(const AttnPlan& P, const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, double qk_scale, const at::Tensor& seed,
                                                      double dropout_p, double dropout_scale) {
  at::Tensor out = at::empty_strided(q.sizes(), P.out_strides, q.options());
  at::Tensor lse = at::empty(P.lse_shape, q.options().dtype(at::kFloat));
  const void* qp = q.data_ptr();
  const void* sp = seed.defined() ? seed.data_ptr() : qp;
  launch(g_launches[(size_t)P.fwd], {qp, k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), qp, qp, qp, sp},
         {qk_scale, dropout_p, dropout_scale});
  return {out, lse};
}

struct AttnBackward : public Node {
  SavedVariable q_, k_, v_, out_, lse_, seed_;  // out_: the node's own output
  int64_t plan_ = 0;
  double qk_scale_ = 0, scale_ = 0, dropout_p_ = 0, dropout_scale_ = 1;
  std::string name() const override { return "FusedAttentionBackward"; }
  void release_variables() override {
    q_.reset_data();
    k_.reset_data();
    v_.reset_data();
    out_.reset_data();
    lse_.reset_data();
    seed_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    at::AutoDispatchBelowADInplaceOrView guard;
    variable_list grads_in(3);  // dq, dk, dv
    at::Tensor dout = grads[0];
    if (!dout.defined()) return grads_in;
    const AttnPlan& P = g_attn[(size_t)plan_];
    at::Tensor q = q_.unpack(), k = k_.unpack(), v = v_.unpack(), out = out_.unpack(self_ptr(this));
    at::Tensor lse = lse_.unpack(), seed = seed_.unpack();
    // The backward kernels were compiled for a dO laid out like out, of q's dtype, 16-byte aligned.
    if (dout.scalar_type() != q.scalar_type() || dout.strides() != out.strides() || ((uintptr_t)dout.data_ptr() & 15)) {
      at::Tensor d = at::empty_strided(out.sizes(), out.strides(), out.options());
      d.copy_(dout);
      dout = d;
    }
    at::Tensor delta = at::empty(P.lse_shape, q.options().dtype(at::kFloat));
    at::Tensor dq = at::empty_strided(q.sizes(), P.dq_strides, q.options());
    at::Tensor dk = at::empty_strided(k.sizes(), P.dk_strides, k.options());
    at::Tensor dv = at::empty_strided(v.sizes(), P.dv_strides, v.options());
    const void* qp = q.data_ptr();
    const void* sp = seed.defined() ? seed.data_ptr() : qp;  // the forward's seed regenerates its mask
    launch(g_launches[(size_t)P.pre], {out.data_ptr(), dout.data_ptr(), delta.data_ptr(), qp}, {});
    launch(g_launches[(size_t)P.dkdv], {qp, k.data_ptr(), v.data_ptr(), dout.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                        lse.data_ptr(), delta.data_ptr(), qp, qp, qp, sp},
           {qk_scale_, scale_, dropout_p_, dropout_scale_});
    launch(g_launches[(size_t)P.dq], {qp, k.data_ptr(), v.data_ptr(), dout.data_ptr(), dq.data_ptr(), lse.data_ptr(),
                                      delta.data_ptr(), qp, qp, qp, sp},
           {qk_scale_, scale_, dropout_p_, dropout_scale_});
    grads_in[0] = dq;
    grads_in[1] = dk;
    grads_in[2] = dv;
    return grads_in;
  }
};

at::Tensor attention_apply(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double qk_scale, double scale,
                           const std::optional<at::Tensor>& seed, double dropout_p, double dropout_scale, int64_t plan) {
  const AttnPlan& P = g_attn.at((size_t)plan);
  at::Tensor sd = seed.has_value() ? *seed : at::Tensor();
  at::Tensor out, lse;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(out, lse) = attn_forward(P, q, k, v, qk_scale, sd, dropout_p, dropout_scale);
  }
  auto node = make_node<AttnBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  node->q_ = SavedVariable(q, false);
  node->k_ = SavedVariable(k, false);
  node->v_ = SavedVariable(v, false);
  node->lse_ = SavedVariable(lse, false);
  node->seed_ = SavedVariable(sd, false);
  node->plan_ = plan;
  node->qk_scale_ = qk_scale;
  node->scale_ = scale;
  node->dropout_p_ = dropout_p;
  node->dropout_scale_ = dropout_scale;
  torch::autograd::set_history(out, node);
  node->out_ = SavedVariable(out, true);
  return out;
}

at::Tensor attention_infer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double qk_scale,
                           const std::optional<at::Tensor>& seed, double dropout_p, double dropout_scale, int64_t plan) {
  return attn_forward(g_attn.at((size_t)plan), q, k, v, qk_scale, seed.has_value() ? *seed : at::Tensor(), dropout_p,
                      dropout_scale).first;
}

// attention_fast: F.scaled_dot_product_attention's dense call (4-D q / k / v, no mask) in one C++ call for a
// layout the Python path has registered.  Key: q's, k's and v's sizes and strides, dtype, device, causal,
// the bits of dropout_p, with-autograd; value: the attention plan and the dropout scale of that p.
struct VecHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    size_t h = 0;
    for (int64_t e : k) h = h * 1000003u ^ std::hash<int64_t>()(e);
    return h;
  }
};
std::unordered_map<std::vector<int64_t>, std::pair<int64_t, double>, VecHash> g_attn_fast;
constexpr double kLog2e = 1.4426950408889634;  // attention.py's LOG2E: the kernels' exponent base 2

std::vector<int64_t> attention_key(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                   double dropout_p, bool grad) {
  std::vector<int64_t> key;
  key.reserve(28);
  for (const at::Tensor* t : {&q, &k, &v}) {
    for (int64_t i = 0; i < 4; ++i) key.push_back(t->size(i));
    for (int64_t i = 0; i < 4; ++i) key.push_back(t->stride(i));
  }
  int64_t bits;
  std::memcpy(&bits, &dropout_p, sizeof bits);
  key.push_back((int64_t)q.scalar_type());
  key.push_back((int64_t)q.get_device());
  key.push_back(bits);
  key.push_back((causal ? 1 : 0) | (grad ? 2 : 0));
  return key;
}

void bind_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double dropout_p,
                    bool grad, int64_t plan, double dropout_scale) {
  auto key = attention_key(q, k, v, causal, dropout_p, grad);
  std::unique_lock<std::shared_mutex> lock(g_fast_mutex);
  g_attn_fast[std::move(key)] = {plan, dropout_scale};
}

std::optional<at::Tensor> attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         double dropout_p, bool is_causal, std::optional<double> scale,
                                         bool enable_gqa) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || !on_device(q) || !q.has_storage() || !k.has_storage() ||
      !v.has_storage() || q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type() ||
      k.device() != q.device() || v.device() != q.device() || !plain_call(q) || has_tangent(k) || has_tangent(v))
    return {};
  if (k.size(1) != q.size(1) && !enable_gqa) return {};  // the Python path raises its error
  for (const at::Tensor* t : {&q, &k, &v})
    if ((uintptr_t)t->data_ptr() & 15) return {};
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  auto key = attention_key(q, k, v, is_causal, dropout_p, grad);
  std::pair<int64_t, double> found{-1, 0.0};
  {
    std::shared_lock<std::shared_mutex> lock(g_fast_mutex);
    auto it = g_attn_fast.find(key);
    if (it == g_attn_fast.end()) return {};
    found = it->second;
  }
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt((double)q.size(3));
  std::optional<at::Tensor> seed;
  if (dropout_p > 0.0)  // as draw_dropout_seed: one int64 from torch's generator of q's device
    seed = at::randint(0, (int64_t)1 << 62, {1}, q.options().dtype(at::kLong));
  if (grad) return attention_apply(q, k, v, sc * kLog2e, sc, seed, dropout_p, found.second, found.first);
  return attention_infer(q, k, v, sc * kLog2e, seed, dropout_p, found.second, found.first);
}

// Forget every fast-path binding (a config override changed the plans): calls go through Python again and
// bind the new plans.
void clear_fast() {
  std::unique_lock<std::shared_mutex> lock(g_fast_mutex);
  g_norm_fast.clear();
  g_softmax_fast.clear();
  g_attn_fast.clear();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("param_count", &param_count);
  m.def("pack_for_test", &pack_for_test);
  m.def("register_launch", &register_launch, py::arg("function"), py::arg("device"), py::arg("grid"), py::arg("threads"),
        py::arg("shared"), py::arg("kinds"), py::arg("ints"), py::arg("extra"), py::arg("scratch_bytes"),
        py::arg("tmas") = std::vector<std::vector<int64_t>>{}, py::arg("pdl") = 0);
  m.def("register_norm", &register_norm);
  m.def("norm_apply", &norm_apply);
  m.def("norm_infer", &norm_infer);
  m.def("bind_norm", &bind_norm);
  m.def("set_rms_default_eps", &set_rms_default_eps);
  m.def("norm_fast", &norm_fast);
  m.def("rms_variant_fast", &rms_variant_fast);
  m.def("bind_softmax", &bind_softmax);
  m.def("softmax_fast", &softmax_fast);
  m.def("softmax_apply", &softmax_apply);
  m.def("softmax_infer", &softmax_infer);
  m.def("register_attention", &register_attention);
  m.def("attention_apply", &attention_apply);
  m.def("attention_infer", &attention_infer);
  m.def("bind_attention", &bind_attention);
  m.def("attention_fast", &attention_fast);
  m.def("clear_fast", &clear_fast);
  m.def("set_dry_run", [](bool on) { g_dry_run = on; });
}
