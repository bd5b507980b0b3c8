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

namespace {

struct Tracker {
  int64_t cur = 0;
  int64_t peak = 0;
};

std::mutex g_mu;
std::unordered_map<int64_t, Tracker> g_trackers;
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

// A plan's arena: one block. While a thread has entered it, every allocation is recorded
// (schedule op, ordinal in the op, size, when it is freed) and placed:
// - replaying (an assignment was given, made from an earlier step's record): the allocation
//   with this (op, ordinal) goes to its assigned offset if it has the assigned size;
// - otherwise: at the offset of one of the current op's planned buffers of its size;
// both unless the region overlaps a placed allocation still alive. The heap serves the rest.
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

std::unordered_map<int64_t, Arena> g_arenas;
std::unordered_map<void*, Placed> g_placed;
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

void counted_delete(void* data) {
  if (g_arena_count.load() > 0) {
    std::lock_guard<std::mutex> g(g_mu);
    auto p = g_placed.find(data);
    if (p != g_placed.end()) {
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
        if (a != g_arenas.end()) {
          Arena& ar = a->second;
          int64_t want = static_cast<int64_t>(n);
          ri = static_cast<int64_t>(ar.rec.size());
          ar.rec.push_back(Rec{ar.epoch, ar.ordinal, want, ar.seq++, -1, -1});
          int64_t ord = ar.ordinal++;
          rec_arena = t_arena;
          bool overlap = false;
          int64_t at = -1;
          if (ar.replay) {
            const std::pair<int64_t, int64_t>* s = nullptr;
            if (ar.epoch < static_cast<int64_t>(ar.assign.size()) &&
                ord < static_cast<int64_t>(ar.assign[ar.epoch].size())) {
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
            void* data = ar.base + at;
            g_placed[data] = Placed{t_arena, t, at, want, ri};
            return c10::DataPtr(data, data, &counted_delete, c10::Device(c10::DeviceType::CPU));
          }
          ar.stats[2] += want;
          ar.stats[3] += 1;
          ar.stats[4] += overlap ? 1 : 0;
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

// GroupedMm::apply(input, weight, offs) as a new tensor (null on error).
at::Tensor* fsdp_grouped_mm(const at::Tensor* input, const at::Tensor* weight, const at::Tensor* offs) {
  at::Tensor* out = nullptr;
  if (guarded([&] { out = new at::Tensor(GroupedMm::apply(*input, *weight, *offs)); }) != 0) {
    return nullptr;
  }
  return out;
}

const char* fsdp_last_error() { return t_error.c_str(); }

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

// Installs the counting allocator (once per process) and returns a new tracker id.
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

// Places this thread's tracked allocations in arena `id` (0: none).
void fsdp_arena_enter(int64_t id) { t_arena = id; }

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
  std::lock_guard<std::mutex> g(g_mu);
  auto a = g_arenas.find(id);
  if (a == g_arenas.end()) {
    return 0;
  }
  if (!a->second.live.empty()) {
    a->second.expect.clear();
    return 1;
  }
  std::free(a->second.base);
  g_arenas.erase(a);
  g_arena_count.fetch_sub(1);
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
// `inputs` into `out[i]` (a new tensor, undefined when none reaches it).
int fsdp_backward(void* root, at::Tensor* grad, void** inputs, int64_t ninputs, at::Tensor** out) {
  return guarded([&] {
    auto src = std::shared_ptr<GradSource>(new GradSource(), torch::autograd::deleteNode);
    src->grad = std::move(*grad);
    *grad = at::Tensor();
    src->add_next_edge(static_cast<EdgeBox*>(root)->edge);
    at::Tensor dummy = at::zeros({}, at::TensorOptions().dtype(at::kFloat));
    src->add_input_metadata(dummy);
    torch::autograd::edge_list roots{torch::autograd::Edge(src, 0)};
    torch::autograd::variable_list grads{dummy};
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
