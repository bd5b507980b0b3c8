// What tch does not expose and the executor needs, in a few C functions over libtorch:
//
// - a counting CPU allocator: every CPU allocation libtorch makes while a thread is tagged with
//   a tracker id is charged to that tracker (current and peak bytes) until it is freed, by any
//   thread. This is the CPU counterpart of torch.cuda.max_memory_allocated: params, grads,
//   collective buffers, activations and everything autograd saves, measured, not modelled.
// - storage resize (FSDP2's `untyped_storage().resize_(0)` / resize back): unsharded params
//   keep their tensor (and autograd's saved references to it) while their memory is freed.
// - a copy that keeps the destination's version counter (FSDP2 copies the all-gather output
//   into unsharded params under `_unsafe_preserve_version_counter`), so tensors autograd saved
//   in forward stay valid after the backward re-gather.
// - autograd edges and `Engine::execute` with upstream gradients: backward of one op from its
//   output edge with grad_output, capturing the grads that reach its input edges
//   (torch.autograd.grad(outputs, inputs, grad_outputs)), without holding the tensors.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <map>
#include <vector>
#include <cstdlib>
#include <stdexcept>
#include <unordered_set>
#include <functional>
#include <dlfcn.h>

#ifdef FSDP_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
// The only functions of CUDA and libc10_cuda the headers make us name (CUDAAllocator's inline
// getMemoryInfo, which the wrapper overrides and never calls): weak, so that the binaries
// neither link libcudart/libc10_cuda nor fail to load without them.
#pragma weak cudaMemGetInfo
namespace c10::cuda {
void c10_cuda_check_implementation(const int32_t err, const char* filename, const char* function_name,
                                   const uint32_t line_number, const bool include_device_assertions) __attribute__((weak));
}
#endif

namespace {

struct Tracker {
  int64_t cur = 0;
  int64_t peak = 0;
};

// The shim's tables are never destroyed (nor is anything in them freed at exit): libtorch
// frees tensors from its own static destructors, after ours would have run.
std::mutex& g_mu = *new std::mutex();
std::unordered_map<int64_t, Tracker>& g_trackers = *new std::unordered_map<int64_t, Tracker>();
std::atomic<int64_t> g_next{1};
thread_local int64_t t_tracker = 0;
thread_local std::string t_error;

// A counted allocation carries this header in the 64 bytes before its data (keeping the inner
// allocator's 64-byte alignment), so that the DataPtr's context is its data pointer, as
// `Allocator::raw_allocate` (used by oneDNN's bf16 kernels) requires.
constexpr size_t kHeader = 64;

struct Header {
  void* inner_ctx;
  c10::DeleterFnPtr inner_delete;
  int64_t tracker;
  int64_t bytes;
  int64_t arena;  // the arena that recorded it (0: none)
  int64_t rec;    // its index in that arena's record
};
static_assert(sizeof(Header) <= kHeader, "header too large");

// A plan's arena: one block. While a thread has entered a CPU arena (or, for a GPU arena, while
// the process has: the autograd engine runs a CUDA backward on its own device thread), every
// allocation is recorded (schedule op, ordinal in the op, size, when it is freed) and placed
// (`arena_place`); the heap (the inner allocator) serves the rest.
struct Slot {
  int64_t off;
  int64_t size;
  bool used;
};

struct Rec {
  int64_t epoch;  // schedule op (number of expect calls so far)
  int64_t ordinal;
  int64_t bytes;
  int64_t alloc_seq;
  int64_t free_seq;  // -1: not freed
  int64_t free_epoch;
};

struct Arena {
  char* base = nullptr;
  int64_t size = 0;
  int device = -1;       // the CUDA device of a GPU arena; -1: a CPU block (std::aligned_alloc)
  int64_t gran = 1;      // sizes are recorded and placed rounded up to this (a GPU arena: 512,
                         // as the caching allocator and the planner's CUDA buffers round)
  c10::DataPtr block;    // a GPU arena's block, from libtorch's CUDA caching allocator
  std::vector<Slot> expect;
  std::map<int64_t, int64_t> live;  // offset -> bytes of placed allocations alive
  // placed bytes, placed count, heap bytes, heap count, overlaps, replay mismatches
  int64_t stats[6] = {0, 0, 0, 0, 0, 0};
  int64_t epoch = 0;
  int64_t ordinal = 0;
  int64_t seq = 0;
  std::vector<Rec> rec;
  bool replay = false;
  // [epoch][ordinal] -> (offset or -1 for the heap, bytes)
  std::vector<std::vector<std::pair<int64_t, int64_t>>> assign;
};

struct Placed {
  int64_t arena;
  int64_t tracker;
  int64_t off;
  int64_t bytes;
  int64_t rec;
};

std::unordered_map<int64_t, Arena>& g_arenas = *new std::unordered_map<int64_t, Arena>();
std::unordered_map<void*, Placed>& g_placed = *new std::unordered_map<void*, Placed>();
std::atomic<int64_t> g_arena_count{0};
thread_local int64_t t_arena = 0;

// Marks record `ri` of arena `id` freed now (caller holds g_mu).
void rec_free(int64_t id, int64_t ri) {
  auto a = g_arenas.find(id);
  if (a == g_arenas.end() || ri < 0 || ri >= static_cast<int64_t>(a->second.rec.size())) {
    return;
  }
  Arena& ar = a->second;
  ar.rec[ri].free_seq = ar.seq++;
  ar.rec[ri].free_epoch = ar.epoch;
}

bool region_free(const Arena& a, int64_t off, int64_t n) {
  auto it = a.live.lower_bound(off);
  if (it != a.live.end() && it->first < off + n) {
    return false;
  }
  if (it != a.live.begin()) {
    --it;
    if (it->first + it->second > off) {
      return false;
    }
  }
  return true;
}

// Returns a placed allocation's region to its arena (caller holds g_mu); false when `data`
// was not placed.
bool unplace_locked(void* data) {
  auto p = g_placed.find(data);
  if (p == g_placed.end()) {
    return false;
  }
  Placed pl = p->second;
  g_placed.erase(p);
  auto t = g_trackers.find(pl.tracker);
  if (t != g_trackers.end()) {
    t->second.cur -= pl.bytes;
  }
  auto a = g_arenas.find(pl.arena);
  if (a != g_arenas.end()) {
    a->second.live.erase(pl.off);
  }
  rec_free(pl.arena, pl.rec);
  return true;
}

// Records an allocation of `want` bytes in arena `id` and places it: the offset, or -1 when
// the heap is to serve it; `*ri` gets its index in the record (caller holds g_mu).
// - replaying (an assignment was given, made from an earlier step's record): the allocation
//   with this (op, ordinal) goes to its assigned offset if it has the assigned size;
// - otherwise: at the offset of one of the current op's planned buffers of its size;
// both unless the region overlaps a placed allocation still alive.
int64_t arena_place(Arena& ar, int64_t want, int64_t* ri) {
  want = (want + ar.gran - 1) / ar.gran * ar.gran;
  *ri = static_cast<int64_t>(ar.rec.size());
  ar.rec.push_back(Rec{ar.epoch, ar.ordinal, want, ar.seq++, -1, -1});
  int64_t ord = ar.ordinal++;
  bool overlap = false;
  int64_t at = -1;
  if (ar.replay) {
    const std::pair<int64_t, int64_t>* s = nullptr;
    if (ar.epoch < static_cast<int64_t>(ar.assign.size()) && ord < static_cast<int64_t>(ar.assign[ar.epoch].size())) {
      s = &ar.assign[ar.epoch][ord];
    }
    if (s == nullptr || s->second != want) {
      ar.stats[5] += 1;  // not the allocation the assignment was made for
    } else if (s->first >= 0) {
      if (region_free(ar, s->first, want)) {
        at = s->first;
      } else {
        overlap = true;
      }
    }
  } else {
    for (Slot& sl : ar.expect) {
      if (sl.used || sl.size != want) {
        continue;
      }
      if (!region_free(ar, sl.off, want)) {
        overlap = true;
        continue;
      }
      sl.used = true;
      at = sl.off;
      break;
    }
  }
  if (at >= 0) {
    ar.live[at] = want;
    ar.stats[0] += want;
    ar.stats[1] += 1;
  } else {
    ar.stats[2] += want;
    ar.stats[3] += 1;
    ar.stats[4] += overlap ? 1 : 0;
  }
  return at;
}

void counted_delete(void* data) {
  if (g_arena_count.load() > 0) {
    std::lock_guard<std::mutex> g(g_mu);
    if (unplace_locked(data)) {
      return;
    }
  }
  Header* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  if (h->tracker != 0) {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_trackers.find(h->tracker);
    if (it != g_trackers.end()) {
      it->second.cur -= h->bytes;
    }
    if (h->arena != 0) {
      rec_free(h->arena, h->rec);
    }
  }
  c10::DeleterFnPtr del = h->inner_delete;
  void* ctx = h->inner_ctx;
  if (del != nullptr) {
    del(ctx);
  }
}

struct Counting final : c10::Allocator {
  c10::Allocator* inner;
  explicit Counting(c10::Allocator* a) : inner(a) {}
  c10::DataPtr allocate(size_t n) override {
    // every allocation gets the header (raw_deallocate needs one deleter for all of them);
    // only those of a tracked thread are counted
    int64_t t = t_tracker;
    int64_t rec_arena = 0;
    int64_t ri = -1;
    if (t != 0 && n != 0) {
      std::lock_guard<std::mutex> g(g_mu);
      auto it = g_trackers.find(t);
      if (it == g_trackers.end()) {
        t = 0;
      } else {
        it->second.cur += static_cast<int64_t>(n);
        it->second.peak = std::max(it->second.peak, it->second.cur);
      }
      if (t_arena != 0) {
        auto a = g_arenas.find(t_arena);
        if (a != g_arenas.end() && a->second.device < 0) {
          Arena& ar = a->second;
          int64_t want = static_cast<int64_t>(n);
          rec_arena = t_arena;
          int64_t at = arena_place(ar, want, &ri);
          if (at >= 0) {
            void* data = ar.base + at;
            g_placed[data] = Placed{t_arena, t, at, want, ri};
            return c10::DataPtr(data, data, &counted_delete, c10::Device(c10::DeviceType::CPU));
          }
        }
      }
    } else {
      t = 0;
    }
    c10::DataPtr dp = inner->allocate(n + kHeader);
    char* base = static_cast<char*>(dp.get());
    c10::Device dev = dp.device();
    c10::DeleterFnPtr del = dp.get_deleter();
    void* ctx = dp.release_context();
    Header* h = reinterpret_cast<Header*>(base);
    h->inner_ctx = ctx;
    h->inner_delete = del;
    h->tracker = t;
    h->bytes = static_cast<int64_t>(n);
    h->arena = rec_arena;
    h->rec = ri;
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &counted_delete, dev);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// The GPU arena's allocator: wraps libtorch's CUDA caching allocator (the object behind
// `c10::cuda::CUDACachingAllocator::get()`, which every CUDA tensor allocation goes through)
// and, while the process has entered a GPU arena, records every allocation and places it at
// the plan's offset in the arena's block (`arena_place`), as the counting allocator does on
// the CPU. What it does not place, and every allocation outside an arena step, the caching
// allocator serves; the heap ones of an arena step get a deleter that records their free (the
// record is what the next step's assignment is made from). Everything else (statistics,
// streams, pools, IPC) is the caching allocator's: the arena block is one of its allocations,
// so `torch.cuda.max_memory_allocated` counts the block plus what was not placed.
//
// Streams: a placed region is reused as soon as its tensor is freed on the host, which is the
// caching allocator's own rule for memory used on one stream; the NCCL code keeps what its
// stream reads or writes alive until the compute stream has waited for it.
std::atomic<int64_t> g_cuda_arena{0};

#ifdef FSDP_CUDA
namespace cca = c10::cuda::CUDACachingAllocator;

cca::CUDAAllocator* g_cuda_inner = nullptr;

struct HeapRec {
  int64_t arena;
  int64_t rec;
  c10::DeleterFnPtr del;
};
std::unordered_map<void*, HeapRec>& g_cuda_heap = *new std::unordered_map<void*, HeapRec>();  // heap allocations of an arena step

// The deleter of every DataPtr the wrapper made: a placed region goes back to its arena, a
// recorded heap allocation is recorded freed and handed to its own deleter; anything else is
// the caching allocator's (`raw_deleter`, so `Allocator::raw_deallocate` works too).
void cuda_arena_delete(void* data) {
  if (data == nullptr) {
    return;
  }
  c10::DeleterFnPtr del = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (unplace_locked(data)) {
      return;
    }
    auto h = g_cuda_heap.find(data);
    if (h != g_cuda_heap.end()) {
      rec_free(h->second.arena, h->second.rec);
      del = h->second.del;
      g_cuda_heap.erase(h);
    }
  }
  if (del == nullptr) {
    del = g_cuda_inner->raw_deleter();
  }
  del(data);
}

struct ArenaCuda final : cca::CUDAAllocator {
  cca::CUDAAllocator* inner;
  // the caching allocator's allocate, and the device libtorch allocates on now (at::empty sets
  // it to the tensor's), or -1 when the current stream is not that device's default stream
  // (the stream all the runtime's compute runs on: a placed region is reused in the host's
  // order, which is safe on that one stream only); replaced by fakes in the selftest
  std::function<c10::DataPtr(size_t)> heap;
  std::function<int()> device_now;
  explicit ArenaCuda(cca::CUDAAllocator* a)
      : inner(a),
        heap([a](size_t n) { return a->allocate(n); }),
        device_now([] {
          const c10::impl::DeviceGuardImplInterface* g = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
          c10::Device d = g->getDevice();
          return g->getStream(d).id() == 0 ? static_cast<int>(d.index()) : -1;
        }) {}

  c10::DataPtr allocate(size_t n) override {
    int64_t id = g_cuda_arena.load();
    if (id == 0 || n == 0) {
      return heap(n);
    }
    int dev_now = device_now();
    int64_t ri = -1;
    {
      std::lock_guard<std::mutex> g(g_mu);
      auto a = g_arenas.find(id);
      if (a == g_arenas.end() || a->second.device != dev_now) {
        ri = -2;
      } else {
        Arena& ar = a->second;
        int64_t at = arena_place(ar, static_cast<int64_t>(n), &ri);
        if (at >= 0) {
          void* data = ar.base + at;
          g_placed[data] = Placed{id, 0, at, ar.live[at], ri};
          return c10::DataPtr(data, data, &cuda_arena_delete, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ar.device)));
        }
      }
    }
    c10::DataPtr dp = heap(n);
    if (ri < 0 || dp.get() == nullptr || dp.get() != dp.get_context()) {
      return dp;  // not an arena step's, or not a plain pointer: left to its own deleter
    }
    c10::Device dev = dp.device();
    c10::DeleterFnPtr del = dp.get_deleter();
    void* data = dp.release_context();
    {
      std::lock_guard<std::mutex> g(g_mu);
      g_cuda_heap[data] = HeapRec{id, ri, del};
    }
    return c10::DataPtr(data, data, &cuda_arena_delete, dev);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &cuda_arena_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner->copy_data(dest, src, count); }

  // a DataPtr as the caching allocator made it (for the calls that look its block up), or
  // null for a placed one; the caller releases it unowned
  c10::DataPtr as_inner(const c10::DataPtr& p, bool* placed) {
    std::lock_guard<std::mutex> g(g_mu);
    *placed = g_placed.count(p.get()) != 0;
    auto h = g_cuda_heap.find(p.get());
    c10::DeleterFnPtr del = h != g_cuda_heap.end() ? h->second.del : p.get_deleter();
    return c10::DataPtr(p.get(), p.get_context(), del, p.device());
  }

  // c10::DeviceAllocator
  bool initialized() override { return inner->initialized(); }
  void emptyCache(c10::MempoolId_t id) override { inner->emptyCache(id); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override { return inner->getDeviceStats(d); }
  void resetAccumulatedStats(c10::DeviceIndex d) override { inner->resetAccumulatedStats(d); }
  void resetPeakStats(c10::DeviceIndex d) override { inner->resetPeakStats(d); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override { return inner->getMemoryInfo(d); }

  // c10::cuda::CUDACachingAllocator::CUDAAllocator
  void* raw_alloc(size_t n) override { return inner->raw_alloc(n); }
  void* raw_alloc_with_stream(size_t n, cudaStream_t s) override { return inner->raw_alloc_with_stream(n, s); }
  void raw_delete(void* p) override { inner->raw_delete(p); }
  void init(int n) override { inner->init(n); }
  double getMemoryFraction(c10::DeviceIndex d) override { return inner->getMemoryFraction(d); }
  void setMemoryFraction(double f, c10::DeviceIndex d) override { inner->setMemoryFraction(f, d); }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex d) override { return inner->getExpandableSegmentSizes(d); }
  void enable(bool v) override { inner->enable(v); }
  bool isEnabled() const override { return inner->isEnabled(); }
  void cacheInfo(c10::DeviceIndex d, size_t* largest) override { inner->cacheInfo(d, largest); }
  void* getBaseAllocation(void* p, size_t* size) override {
    {
      std::lock_guard<std::mutex> g(g_mu);
      auto it = g_placed.find(p);
      if (it != g_placed.end()) {
        *size = static_cast<size_t>(it->second.bytes);
        return p;
      }
    }
    return inner->getBaseAllocation(p, size);
  }
  void recordStream(const c10::DataPtr& p, c10::cuda::CUDAStream s) override {
    bool placed = false;
    c10::DataPtr q = as_inner(p, &placed);
    try {
      if (!placed) {
        inner->recordStream(q, s);
      }
    } catch (...) {
      q.release_context();  // not ours to free
      throw;
    }
    q.release_context();
  }
  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool traces) override { return inner->snapshot(id, traces); }
  void beginAllocateToPool(c10::DeviceIndex d, c10::MempoolId_t id, std::function<bool(cudaStream_t)> f) override { inner->beginAllocateToPool(d, id, std::move(f)); }
  void endAllocateToPool(c10::DeviceIndex d, c10::MempoolId_t id) override { inner->endAllocateToPool(d, id); }
  void releasePool(c10::DeviceIndex d, c10::MempoolId_t id) override { inner->releasePool(d, id); }
  int getPoolUseCount(c10::DeviceIndex d, c10::MempoolId_t id) override { return inner->getPoolUseCount(d, id); }
  void createOrIncrefPool(c10::DeviceIndex d, c10::MempoolId_t id, std::shared_ptr<cca::CUDAAllocator> a) override { inner->createOrIncrefPool(d, id, std::move(a)); }
  void setUseOnOOM(c10::DeviceIndex d, c10::MempoolId_t id, bool v) override { inner->setUseOnOOM(d, id, v); }
  void setNoSplit(c10::DeviceIndex d, c10::MempoolId_t id) override { inner->setNoSplit(d, id); }
  bool checkPoolLiveAllocations(c10::DeviceIndex d, c10::MempoolId_t id, const std::unordered_set<void*>& live) override { return inner->checkPoolLiveAllocations(d, id, live); }
  cca::ShareableHandle shareIpcHandle(void* p) override { return inner->shareIpcHandle(p); }
  std::shared_ptr<void> getIpcDevPtr(std::string h) override { return inner->getIpcDevPtr(std::move(h)); }
  bool isHistoryEnabled() override { return inner->isHistoryEnabled(); }
  void recordHistory(bool on, c10::cuda::CUDACachingAllocator::CreateContextFn ctx, size_t max, cca::RecordContext when, bool clear, const std::vector<std::string>& skip) override {
    inner->recordHistory(on, ctx, max, when, clear, skip);
  }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override { inner->recordAnnotation(md); }
  void pushCompileContext(std::string& md) override { inner->pushCompileContext(md); }
  void popCompileContext() override { inner->popCompileContext(); }
  void setUserMetadata(const std::string& md) override { inner->setUserMetadata(md); }
  std::string getUserMetadata() override { return inner->getUserMetadata(); }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver o) override { inner->attachOutOfMemoryObserver(std::move(o)); }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker t) override { inner->attachAllocatorTraceTracker(std::move(t)); }
  void enablePeerAccess(c10::DeviceIndex a, c10::DeviceIndex b) override { inner->enablePeerAccess(a, b); }
  cudaError_t memcpyAsync(void* dst, int dd, const void* src, int sd, size_t n, cudaStream_t s, bool p2p) override { return inner->memcpyAsync(dst, dd, src, sd, n, s, p2p); }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex d, c10::MempoolId_t id) override { return inner->getCheckpointState(d, id); }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex d, std::shared_ptr<cca::AllocatorState> s) override { return inner->setCheckpointPoolState(d, std::move(s)); }
  std::string name() override { return inner->name(); }
};

// Adds a GPU arena over `block` (an allocation of the caching allocator on `device`).
int64_t add_gpu_arena(c10::DataPtr block, int64_t bytes, int device) {
  int64_t id = g_next.fetch_add(1);
  std::lock_guard<std::mutex> g(g_mu);
  Arena& a = g_arenas[id];
  a.base = static_cast<char*>(block.get());
  a.size = bytes;
  a.device = device;
  a.gran = 512;
  a.block = std::move(block);
  g_arena_count.fetch_add(1);
  return id;
}

// Puts the wrapper in front of libtorch's CUDA allocator (once per process; libtorch_cuda must
// be loaded). The allocator object is found by its symbol in the loaded libc10_cuda, so that
// the binaries do not link libc10_cuda (they run without CUDA).
void install_cuda_arena() {
  static std::once_flag once;
  static std::string failed;
  std::call_once(once, [] {
    const char* sym = "_ZN3c104cuda20CUDACachingAllocator9allocatorE";
    void* p = dlsym(RTLD_DEFAULT, sym);
    if (p == nullptr) {
      if (void* h = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD)) {
        p = dlsym(h, sym);
      }
    }
    if (p == nullptr) {
      failed = "libtorch's CUDA allocator (c10::cuda::CUDACachingAllocator::allocator in libc10_cuda) is not loaded";
      return;
    }
    auto* slot = static_cast<std::atomic<cca::CUDAAllocator*>*>(p);
    cca::CUDAAllocator* inner = slot->load();
    if (inner == nullptr) {
      failed = "libtorch's CUDA allocator is not initialized";
      return;
    }
    // never destroyed: libtorch's static destructors may still allocate or free at exit
    auto* wrapper = new ArenaCuda(inner);
    g_cuda_inner = inner;
    slot->store(wrapper);
    // what c10::GetAllocator(kCUDA) (and torch.accelerator) returns: the same object
    c10::SetAllocator(c10::DeviceType::CUDA, wrapper, /*priority=*/100);
  });
  if (!failed.empty()) {
    throw std::runtime_error(failed);
  }
}
#endif

std::once_flag g_install;

template <class F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    t_error = e.what();
  } catch (...) {
    t_error = "unknown C++ exception";
  }
  return 1;
}

struct EdgeBox {
  torch::autograd::Edge edge;
};

// Identity node at an op boundary: the gradient reaching it is what the executor captures
// for the op's input; it holds no tensor, only the edge to the producer (if any).
struct Boundary final : torch::autograd::Node {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override { return std::move(grads); }
  std::string name() const override { return "FsdpBoundary"; }
};

// The root of one op's backward: hands the upstream gradient it owns to the op's output edge
// and lets go of it, so that the gradient is freed as soon as the op's first backward node has
// consumed it, as in one whole-model backward (passing it as the engine's input would keep it
// alive, in the caller's list, until the op's whole backward has run).
struct GradSource final : torch::autograd::Node {
  at::Tensor grad;
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    torch::autograd::variable_list out{std::move(grad)};
    grad = at::Tensor();
    return out;
  }
  std::string name() const override { return "FsdpGradSource"; }
};

// Rows [offs[i-1], offs[i]) of `input` times `weight[i]`, for every group i: transformers'
// grouped-mm fallback (`transformers::grouped_mm_fallback`) as a libtorch autograd function.
// It saves the input, the weight and the offsets, and its backward loops over the groups into
// one grad_input and one grad_weight, as that fallback does. (torch._grouped_mm takes neither
// float64 nor unaligned strides on CPU.)
std::vector<std::pair<int64_t, int64_t>> groups_of(const at::Tensor& offs) {
  at::Tensor o = offs.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* p = o.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int64_t i = 0; i < o.numel(); ++i) {
    out.emplace_back(start, p[i]);
    start = p[i];
  }
  return out;
}

struct GroupedMm : public torch::autograd::Function<GroupedMm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& offs) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["offs"] = offs;
    at::Tensor out = at::zeros({input.size(0), weight.size(2)}, input.options());
    int64_t i = 0;
    for (auto [a, b] : groups_of(offs)) {
      if (b > a) {
        at::Tensor o = out.narrow(0, a, b - a);
        at::mm_out(o, input.narrow(0, a, b - a), weight[i]);
      }
      ++i;
    }
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    at::Tensor offs = ctx->saved_data["offs"].toTensor();
    at::Tensor g = grads[0];
    at::Tensor gi = at::zeros_like(input);
    at::Tensor gw = at::zeros_like(weight);
    int64_t i = 0;
    for (auto [a, b] : groups_of(offs)) {
      if (b > a) {
        at::Tensor gs = g.narrow(0, a, b - a);
        at::Tensor gio = gi.narrow(0, a, b - a);
        at::mm_out(gio, gs, weight[i].t());
        at::Tensor gwo = gw[i];
        at::mm_out(gwo, input.narrow(0, a, b - a).t(), gs);
      }
      ++i;
    }
    return {gi, gw, at::Tensor()};
  }
};

}  // namespace

extern "C" {

// w.add_(g, alpha) without grad: torch.optim.SGD's single-tensor update (0 ok, 1 error).
int fsdp_add_scaled_(const at::Tensor* w, const at::Tensor* g, double alpha) {
  return guarded([&] {
    at::NoGradGuard ng;
    at::Tensor t = *w;
    t.add_(*g, alpha);
  });
}

// w += value * t1 * t2 (div == 0: addcmul_) or w += value * t1 / t2 (div != 0: addcdiv_), in
// place: torch's kernels with their `value`, which tch's bindings lack.
int fsdp_addc_(const at::Tensor* w, const at::Tensor* t1, const at::Tensor* t2, double value, int div) {
  return guarded([&] {
    at::NoGradGuard ng;
    at::Tensor t = *w;
    if (div) {
      t.addcdiv_(*t1, *t2, value);
    } else {
      t.addcmul_(*t1, *t2, value);
    }
  });
}

// GroupedMm::apply(input, weight, offs) as a new tensor (null on error).
at::Tensor* fsdp_grouped_mm(const at::Tensor* input, const at::Tensor* weight, const at::Tensor* offs) {
  at::Tensor* out = nullptr;
  if (guarded([&] { out = new at::Tensor(GroupedMm::apply(*input, *weight, *offs)); }) != 0) {
    return nullptr;
  }
  return out;
}

const char* fsdp_last_error() { return t_error.c_str(); }

// The CPU capability libtorch's kernels dispatch to ("DEFAULT", "AVX2", "AVX512", …: what
// torch.backends.cpu.get_cpu_capability() says; ATEN_CPU_CAPABILITY lowers it), copied into
// `out` (NUL-terminated, cut to `cap` bytes); its length.
int64_t fsdp_cpu_capability(char* out, int64_t cap) {
  std::string c = at::get_cpu_capability();
  if (cap > 0) {
    size_t n = std::min(c.size(), static_cast<size_t>(cap - 1));
    std::memcpy(out, c.data(), n);
    out[n] = '\0';
  }
  return static_cast<int64_t>(c.size());
}

// libtorch's CUDA caching allocator on `device`: bytes allocated now and at most since the
// last reset (allocated_bytes, all pools: torch.cuda.memory_allocated /
// max_memory_allocated), through c10's device-allocator interface (what torch.accelerator's
// memory functions use), so no CUDA header is needed; then resets the peak when asked
// (reset_peak_memory_stats). Non-zero when libtorch has no CUDA allocator.
int fsdp_cuda_mem(int device, int reset_peak, int64_t* current, int64_t* peak) {
  return guarded([&] {
    c10::DeviceAllocator* a = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    auto d = static_cast<c10::DeviceIndex>(device);
    auto stats = a->getDeviceStats(d);
    const auto& s = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    *current = s.current;
    *peak = s.peak;
    if (reset_peak != 0) {
      a->resetPeakStats(d);
    }
  });
}

// A new arena of `bytes` (64-byte aligned); its id, or 0 when the block cannot be allocated.
int64_t fsdp_arena_new(int64_t bytes) {
  size_t n = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* block = std::aligned_alloc(64, n == 0 ? 64 : n);
  if (block == nullptr) {
    return 0;
  }
  int64_t id = g_next.fetch_add(1);
  std::lock_guard<std::mutex> g(g_mu);
  Arena& a = g_arenas[id];
  a.base = static_cast<char*>(block);
  a.size = bytes;
  g_arena_count.fetch_add(1);
  return id;
}

// A new GPU arena of `bytes` on CUDA device `device` (the current one), its block allocated by
// libtorch's CUDA caching allocator, with the arena's allocator put in front of that allocator
// (once); its id, or 0 with the reason in fsdp_last_error.
int64_t fsdp_arena_new_cuda(int64_t bytes, int device) {
  int64_t id = 0;
#ifdef FSDP_CUDA
  guarded([&] {
    install_cuda_arena();
    c10::DeviceGuard dg(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    id = add_gpu_arena(g_cuda_inner->allocate(static_cast<size_t>(std::max<int64_t>(bytes, 512))), bytes, device);
  });
#else
  (void)bytes;
  (void)device;
  t_error = "the runtime was built without the CUDA arena (feature `cuda`, with the venv's CUDA headers)";
#endif
  return id;
}

void fsdp_arena_enter(int64_t id);
void fsdp_arena_leave(int64_t id);
void fsdp_arena_expect(int64_t id, const int64_t* offs, const int64_t* sizes, int64_t n);
int64_t fsdp_arena_log(int64_t id, int64_t* out, int64_t cap);
void fsdp_arena_stats(int64_t id, int64_t* out);
int fsdp_arena_free(int64_t id);

// 1 when the GPU arena was compiled in (a `cuda` build that found the CUDA headers).
int fsdp_cuda_arena_built() {
#ifdef FSDP_CUDA
  return 1;
#else
  return 0;
#endif
}

// Puts the GPU arena's allocator in front of libtorch's CUDA caching allocator (once; it passes
// everything through until a GPU arena is entered): 0, 1 with the reason in fsdp_last_error, 2
// in a build without it. Checks that libtorch's CUDA allocator is then the wrapper.
int fsdp_cuda_arena_install() {
#ifdef FSDP_CUDA
  return guarded([] {
    install_cuda_arena();
    if (dynamic_cast<ArenaCuda*>(c10::GetAllocator(c10::DeviceType::CUDA)) == nullptr) {
      throw std::runtime_error("c10::GetAllocator(CUDA) is not the GPU arena's allocator after installing it");
    }
  });
#else
  t_error = "the runtime was built without the CUDA arena (feature `cuda`, with the venv's CUDA headers)";
  return 2;
#endif
}

// The GPU arena's allocator over a fake caching allocator (host memory labelled cuda:0), on a
// machine without a GPU: placement at the plan's offsets, heap allocations recorded with their
// frees, the device check, entering and leaving, the deleters. 0, 1 with the failed check in
// fsdp_last_error, or 2 in a build without it.
int fsdp_cuda_arena_selftest() {
#ifdef FSDP_CUDA
  static std::atomic<int64_t> fake_live{0};
  struct F {
    static void del(void* p) {
      fake_live.fetch_sub(1);
      std::free(p);
    }
  };
  return guarded([&] {
    auto check = [](bool ok, const char* what) {
      if (!ok) {
        throw std::runtime_error(std::string("GPU arena selftest: ") + what);
      }
    };
    const c10::Device cuda0(c10::DeviceType::CUDA, 0);
    ArenaCuda w(nullptr);
    int dev = 0;
    w.heap = [&](size_t n) {
      void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
      fake_live.fetch_add(1);
      return c10::DataPtr(p, p, &F::del, cuda0);
    };
    w.device_now = [&] { return dev; };
    int64_t id = add_gpu_arena(w.heap(4096), 4096, 0);
    char* base = nullptr;
    {
      std::lock_guard<std::mutex> g(g_mu);
      base = g_arenas[id].base;
    }
    c10::DataPtr out0 = w.allocate(100);
    check(out0.get_deleter() == &F::del, "outside a step the caching allocator serves, untouched");
    fsdp_arena_enter(id);
    check(g_cuda_arena.load() == id && t_arena == 0, "a GPU arena is entered for the process");
    int64_t offs[2] = {0, 1024}, sizes[2] = {1024, 512};
    fsdp_arena_expect(id, offs, sizes, 2);
    c10::DataPtr a = w.allocate(1024), b = w.allocate(512), c = w.allocate(300);
    check(a.get() == base && b.get() == base + 1024, "planned buffers at the plan's offsets");
    check(a.device() == cuda0 && a.get_deleter() == &cuda_arena_delete, "a placed allocation is the arena's, on its device");
    check(c.get_deleter() == &cuda_arena_delete && c.get() != nullptr && (static_cast<char*>(c.get()) < base || static_cast<char*>(c.get()) >= base + 4096),
          "an unplanned allocation goes to the caching allocator, its free recorded");
    dev = 1;
    c10::DataPtr d = w.allocate(1024);
    check(d.get_deleter() == &F::del, "another device's allocation is neither placed nor recorded");
    dev = -1;
    c10::DataPtr d2 = w.allocate(1024);
    check(d2.get_deleter() == &F::del, "nor one on a side stream");
    d2.clear();
    dev = 0;
    size_t sz = 0;
    check(w.getBaseAllocation(a.get(), &sz) == a.get() && sz == 1024, "a placed allocation is its own base");
    a.clear();
    c.clear();
    int64_t rec[6 * 8];
    int64_t n = fsdp_arena_log(id, rec, 8);
    check(n == 3, "three allocations recorded");
    check(rec[4] >= 0 && rec[6 + 4] < 0 && rec[12 + 4] >= 0, "the frees of the placed and the heap allocation recorded, the live one not");
    fsdp_arena_expect(id, offs, sizes, 2);
    c10::DataPtr e = w.allocate(1024);
    check(e.get() == base, "a freed region is placed again");
    fsdp_arena_expect(id, offs, sizes, 1);
    c10::DataPtr f = w.allocate(1024);
    check(f.get() != base, "never over a live placed allocation");
    int64_t off3 = 2048, size3 = 1024;
    fsdp_arena_expect(id, &off3, &size3, 1);
    c10::DataPtr h = w.allocate(1000);
    check(h.get() == base + 2048, "sizes are matched rounded up to 512 bytes, as the planner's CUDA buffers");
    h.clear();
    int64_t st[6];
    fsdp_arena_stats(id, st);
    check(st[1] == 4 && st[3] == 2 && st[4] == 1, "4 placed, 2 heap, 1 refused for overlap");
    void* raw = e.release_context();
    w.raw_deleter()(raw);  // Allocator::raw_deallocate's path
    check(fsdp_arena_free(id) == 1, "the block is kept while a placed allocation lives");
    b.clear();
    fsdp_arena_leave(id);
    check(g_cuda_arena.load() == 0, "left");
    c10::DataPtr g2 = w.allocate(64);
    check(g2.get_deleter() == &F::del, "after leaving, the caching allocator's again");
    out0.clear();
    d.clear();
    f.clear();
    g2.clear();
    check(fsdp_arena_free(id) == 0, "the arena goes once nothing placed lives");
    // its block stays allocated: an arena dropped while a placed tensor lived leaks it for good
    check(fake_live.exchange(0) == 1, "every other fake allocation freed exactly once");
  });
#else
  t_error = "built without the CUDA arena";
  return 2;
#endif
}

// Places allocations in arena `id`: a CPU arena this thread's tracked ones, a GPU arena all of
// the process's CUDA allocations (the autograd engine runs a CUDA backward on its own thread).
void fsdp_arena_enter(int64_t id) {
  bool gpu = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto a = g_arenas.find(id);
    gpu = a != g_arenas.end() && a->second.device >= 0;
  }
  if (gpu) {
    g_cuda_arena.store(id);
  } else {
    t_arena = id;
  }
}

// Stops placing allocations in arena `id` (on this thread, or in the process for a GPU arena).
void fsdp_arena_leave(int64_t id) {
  if (t_arena == id) {
    t_arena = 0;
  }
  int64_t e = id;
  g_cuda_arena.compare_exchange_strong(e, 0);
}

// The current op's planned buffers: `n` (offset, bytes) pairs.
void fsdp_arena_expect(int64_t id, const int64_t* offs, const int64_t* sizes, int64_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  if (a == g_arenas.end()) {
    return;
  }
  a->second.expect.clear();
  a->second.epoch += 1;
  a->second.ordinal = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (offs[i] >= 0 && sizes[i] > 0 && offs[i] + sizes[i] <= a->second.size) {
      a->second.expect.push_back(Slot{offs[i], sizes[i], false});
    }
  }
}

// Starts the arena's next step: a new record and new statistics; the block, the assignment
// and the placed tensors still alive are kept.
void fsdp_arena_reset(int64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  if (a == g_arenas.end()) {
    return;
  }
  Arena& ar = a->second;
  ar.rec.clear();
  ar.expect.clear();
  ar.epoch = 0;
  ar.ordinal = 0;
  ar.seq = 0;
  for (int64_t& x : ar.stats) {
    x = 0;
  }
}

// Replays an assignment: `n` (epoch, ordinal, offset or -1 for the heap, bytes) quadruples.
void fsdp_arena_assign(int64_t id, const int64_t* quads, int64_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  if (a == g_arenas.end()) {
    return;
  }
  Arena& ar = a->second;
  ar.replay = true;
  ar.assign.clear();
  for (int64_t i = 0; i < n; ++i) {
    int64_t e = quads[4 * i], o = quads[4 * i + 1], off = quads[4 * i + 2], b = quads[4 * i + 3];
    if (e < 0 || o < 0 || b <= 0) {
      continue;
    }
    if (off + b > ar.size) {
      off = -1;  // the heap
    }
    if (static_cast<int64_t>(ar.assign.size()) <= e) {
      ar.assign.resize(e + 1);
    }
    auto& v = ar.assign[e];
    if (static_cast<int64_t>(v.size()) <= o) {
      v.resize(o + 1, {-1, 0});
    }
    v[o] = {off, b};
  }
}

// The arena's record so far: writes min(n, cap) records of six i64s (epoch, ordinal, bytes,
// alloc seq, free seq or -1, free epoch or -1); returns n.
int64_t fsdp_arena_log(int64_t id, int64_t* out, int64_t cap) {
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  if (a == g_arenas.end()) {
    return 0;
  }
  const auto& r = a->second.rec;
  int64_t n = static_cast<int64_t>(r.size());
  for (int64_t i = 0; i < std::min(n, cap); ++i) {
    const Rec& x = r[i];
    int64_t* o = out + 6 * i;
    o[0] = x.epoch;
    o[1] = x.ordinal;
    o[2] = x.bytes;
    o[3] = x.alloc_seq;
    o[4] = x.free_seq;
    o[5] = x.free_epoch;
  }
  return n;
}

// placed bytes, placed count, heap bytes, heap count, allocations refused for overlap,
// replayed allocations that differed from the assignment
void fsdp_arena_stats(int64_t id, int64_t* out) {
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  for (int i = 0; i < 6; ++i) {
    out[i] = a == g_arenas.end() ? 0 : a->second.stats[i];
  }
}

// Frees the arena's block; 1 (and the block is kept, leaked) while placed tensors are alive.
int fsdp_arena_free(int64_t id) {
  c10::DataPtr block;  // a GPU block, freed after the lock is released
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto a = g_arenas.find(id);
    if (a == g_arenas.end()) {
      return 0;
    }
    fsdp_arena_leave(id);
    if (!a->second.live.empty()) {
      // kept for the placed tensors still alive, but places nothing more
      a->second.expect.clear();
      a->second.replay = false;
      a->second.assign.clear();
      if (a->second.device >= 0) {
        // leaked for good: freeing it at exit could reach an allocator already destroyed
        a->second.block.release_context();
      }
      return 1;
    }
    if (a->second.device >= 0) {
      block = std::move(a->second.block);
    } else {
      std::free(a->second.base);
    }
    g_arenas.erase(a);
    g_arena_count.fetch_sub(1);
  }
  return 0;
}

int64_t fsdp_mem_tracker_new() {
  std::call_once(g_install, [] {
    static Counting counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
  int64_t id = g_next.fetch_add(1);
  std::lock_guard<std::mutex> g(g_mu);
  g_trackers[id] = Tracker{};
  return id;
}

// Tags this thread's future CPU allocations with `id` (0: untracked).
void fsdp_mem_tracker_enter(int64_t id) { t_tracker = id; }

// Current and peak bytes of a tracker; `reset_peak` sets the peak to the current bytes.
void fsdp_mem_tracker_stats(int64_t id, int64_t* cur, int64_t* peak, int reset_peak) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_trackers.find(id);
  if (it == g_trackers.end()) {
    *cur = 0;
    *peak = 0;
    return;
  }
  *cur = it->second.cur;
  *peak = it->second.peak;
  if (reset_peak) {
    it->second.peak = it->second.cur;
  }
}

void fsdp_mem_tracker_drop(int64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  g_trackers.erase(id);
}

// Frees (nbytes = 0) or re-allocates (nbytes > 0, contents undefined) a tensor's storage in
// place: every tensor and saved variable sharing the storage sees the change.
int fsdp_storage_resize(const at::Tensor* t, int64_t nbytes) {
  return guarded([&] {
    c10::StorageImpl* s = t->storage().unsafeGetStorageImpl();
    if (nbytes == 0) {
      s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
      s->set_nbytes(0);
    } else {
      c10::Allocator* a = s->allocator();
      if (a == nullptr) {
        a = c10::GetCPUAllocator();
      }
      // a device allocator allocates on the current device: make it the storage's
      c10::OptionalDeviceGuard dg;
      if (!s->device().is_cpu()) {
        dg.reset_device(s->device());
      }
      s->set_data_ptr_noswap(a->allocate(static_cast<size_t>(nbytes)));
      s->set_nbytes(static_cast<size_t>(nbytes));
    }
  });
}

// dst.copy_(src) without autograd and without bumping dst's version counter.
int fsdp_copy_keep_version(const at::Tensor* dst, const at::Tensor* src) {
  return guarded([&] {
    at::NoGradGuard ng;
    at::Tensor d = *dst;
    int64_t v = d._version();
    d.copy_(*src);
    c10::VariableVersion vc = d.unsafeGetTensorImpl()->version_counter();  // a handle on the shared counter
    vc.set_version(v);
  });
}

// The autograd edge a tensor's gradient flows into (its grad_fn and output number, or the
// grad accumulator of a leaf). Null when the tensor does not require grad.
void* fsdp_edge(const at::Tensor* t) {
  if (!t->defined() || !t->requires_grad()) {
    return nullptr;
  }
  void* out = nullptr;
  if (guarded([&] { out = new EdgeBox{torch::autograd::impl::gradient_edge(*t)}; }) != 0) {
    return nullptr;
  }
  return out;
}

void fsdp_edge_free(void* e) { delete static_cast<EdgeBox*>(e); }

// 1 when both edges name the same node input.
int fsdp_edge_same(void* a, void* b) {
  auto* x = static_cast<EdgeBox*>(a);
  auto* y = static_cast<EdgeBox*>(b);
  return x->edge.function == y->edge.function && x->edge.input_nr == y->edge.input_nr;
}

// A new tensor sharing `t`'s storage and version counter whose grad_fn is a Boundary node
// leading to `t`'s gradient edge (none when `t` does not require grad: the boundary is then a
// source that still requires grad). Backward from an op's output stops at its boundaries
// because nothing else leads to them.
at::Tensor* fsdp_boundary(const at::Tensor* t) {
  at::Tensor* out = nullptr;
  if (guarded([&] {
        at::Tensor y = t->detach();
        auto node = std::shared_ptr<Boundary>(new Boundary(), torch::autograd::deleteNode);
        if (t->requires_grad()) {
          node->add_next_edge(torch::autograd::impl::gradient_edge(*t));
        }
        torch::autograd::set_history(y, node);
        out = new at::Tensor(y);
      }) != 0) {
    return nullptr;
  }
  return out;
}

// Runs backward from `root` with upstream gradient `*grad`, which it takes (leaving `*grad`
// undefined), freeing the graph it runs through, and writes the gradient reaching each of
// `inputs` into `out[i]` (a new tensor, undefined when none reaches it). `seeds[i]`, where not
// null, is a gradient `inputs[i]` already has (from consumers later in the forward), which it
// takes: it enters that input's buffer before anything the op's nodes send there, as in one
// whole-model backward, where those consumers' nodes (later in sequence) run first — so a
// value the op reads twice (a norm's input: `pow` and `mul`) sums as autograd sums it,
// `(seed + a) + b`, not `seed + (a + b)`.
int fsdp_backward(void* root, at::Tensor* grad, void** inputs, int64_t ninputs, at::Tensor** seeds, at::Tensor** out) {
  return guarded([&] {
    auto src = std::shared_ptr<GradSource>(new GradSource(), torch::autograd::deleteNode);
    src->grad = std::move(*grad);
    *grad = at::Tensor();
    src->add_next_edge(static_cast<EdgeBox*>(root)->edge);
    at::Tensor dummy = at::zeros({}, at::TensorOptions().dtype(at::kFloat));
    src->add_input_metadata(dummy);
    torch::autograd::edge_list roots{torch::autograd::Edge(src, 0)};
    torch::autograd::variable_list grads{dummy};
    // (each seed from a source of its own, made after `src`: a later sequence number, so the
    // engine's ready queue runs it first; it lets go of the seed as it hands it on)
    for (int64_t i = 0; i < ninputs; ++i) {
      if (seeds[i] == nullptr || !seeds[i]->defined()) {
        continue;
      }
      auto seed = std::shared_ptr<GradSource>(new GradSource(), torch::autograd::deleteNode);
      seed->grad = std::move(*seeds[i]);
      *seeds[i] = at::Tensor();
      seed->add_next_edge(static_cast<EdgeBox*>(inputs[i])->edge);
      seed->add_input_metadata(dummy);
      roots.emplace_back(seed, 0);
      grads.push_back(dummy);
    }
    torch::autograd::edge_list outs;
    outs.reserve(ninputs);
    for (int64_t i = 0; i < ninputs; ++i) {
      outs.push_back(static_cast<EdgeBox*>(inputs[i])->edge);
    }
    auto res = torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                                                      /*create_graph=*/false,
                                                                      /*accumulate_grad=*/false, outs);
    for (int64_t i = 0; i < ninputs; ++i) {
      out[i] = new at::Tensor(i < static_cast<int64_t>(res.size()) ? res[i] : at::Tensor());
    }
  });
}

}  // extern "C"
