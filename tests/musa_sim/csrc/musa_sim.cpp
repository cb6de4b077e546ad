// Simulated MUSA device for tests: a PrivateUse1 backend whose memory is host memory.
//
// What it is for: CI has no MUSA GPU. This extension gives torch (2.13 CPU wheel) a device that is NOT the
// host: tensors on it have device type PrivateUse1 (renamed "musa" from Python), live in host memory owned by
// a counting allocator, and every aten op without a native kernel here runs the op's CPU kernel on zero-copy
// host aliases (the boxed fallback). Host tensors meeting device tensors raise torch's usual same-device error,
// as they do on CUDA, so "left on the host" bugs become visible.
//
// What it may assume: torch >= 2.7 C++ API (PrivateUse1HooksInterface, DeviceGuardImplInterface); one process
// owns the devices (no IPC); everything is synchronous (streams and events are bookkeeping only).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace musa_sim {

using c10::DeviceIndex;
using c10::DeviceType;
constexpr DeviceType kDev = DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 64;

// ---- devices -------------------------------------------------------------------------------------------
int compute_device_count() {
  if (const char* vis = std::getenv("MUSA_VISIBLE_DEVICES")) {
    std::string s(vis);
    if (s.find_first_not_of(" ") == std::string::npos) return 0;
    return std::min<int>(kMaxDevices, 1 + std::count(s.begin(), s.end(), ','));
  }
  const char* n = std::getenv("MUSA_SIM_DEVICE_COUNT");
  int count = n ? std::atoi(n) : 8;
  return std::max(0, std::min(kMaxDevices, count));
}

int device_count() {
  static const int count = compute_device_count();
  return count;
}

thread_local DeviceIndex t_device = 0;
thread_local c10::StreamId t_stream[kMaxDevices] = {};
std::atomic<c10::StreamId> g_next_stream{0};

void check_index(int index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "musa error: invalid device ordinal ", index,
              " (the simulator has ", device_count(), " devices; MUSA_SIM_DEVICE_COUNT / MUSA_VISIBLE_DEVICES)");
}

DeviceIndex resolve(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    check_index(device->index());
    return device->index();
  }
  return t_device;
}

// RAII: make `index` the current device of this thread (the allocator allocates on the current device).
struct CurrentDevice {
  DeviceIndex saved;
  explicit CurrentDevice(DeviceIndex index) : saved(t_device) { t_device = index; }
  ~CurrentDevice() { t_device = saved; }
};

// ---- memory accounting ---------------------------------------------------------------------------------
struct DeviceStats {
  std::atomic<int64_t> current{0}, peak{0}, num_allocs{0}, num_frees{0};
};
DeviceStats g_stats[kMaxDevices];

void count_alloc(int dev, int64_t n) {
  auto& s = g_stats[dev];
  int64_t now = s.current.fetch_add(n) + n;
  int64_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
  s.num_allocs.fetch_add(1);
}

void count_free(int dev, int64_t n) {
  g_stats[dev].current.fetch_sub(n);
  g_stats[dev].num_frees.fetch_add(1);
}

struct Header {  // lives in the kAlign bytes before every native device allocation
  int64_t nbytes;
  int32_t device;
};

void free_native(void* raw) {
  auto* h = static_cast<Header*>(raw);
  count_free(h->device, h->nbytes);
  std::free(raw);
}

// Memory a CPU kernel allocated, adopted as device memory without a copy (the CPU storage is kept alive).
struct Adopted {
  c10::Storage cpu;
  int64_t nbytes;
  int32_t device;
};

void free_adopted(void* ctx) {
  auto* a = static_cast<Adopted*>(ctx);
  count_free(a->device, a->nbytes);
  delete a;
}

c10::DataPtr alloc_on(int dev, size_t n) {
  if (n == 0) return c10::DataPtr(nullptr, c10::Device(kDev, dev));
  void* raw = std::aligned_alloc(kAlign, ((n + kAlign - 1) / kAlign + 1) * kAlign);
  TORCH_CHECK(raw, "musa simulator: out of host memory allocating ", n, " bytes");
  auto* h = static_cast<Header*>(raw);
  h->nbytes = static_cast<int64_t>(n);
  h->device = dev;
  count_alloc(dev, static_cast<int64_t>(n));
  return c10::DataPtr(static_cast<char*>(raw) + kAlign, raw, &free_native, c10::Device(kDev, dev));
}

struct SimAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override { return alloc_on(t_device, n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
SimAllocator g_allocator;

// Pinned host memory: plain host memory whose ranges are remembered so is_pinned() answers truthfully.
std::mutex g_pinned_mutex;
std::map<uintptr_t, size_t> g_pinned;

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = std::aligned_alloc(kAlign, std::max<size_t>(kAlign, (n + kAlign - 1) / kAlign * kAlign));
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned[reinterpret_cast<uintptr_t>(p)] = n;
    return c10::DataPtr(p, p, &free_pinned, c10::Device(DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
PinnedAllocator g_pinned_allocator;

bool is_pinned_ptr(const void* p) {
  auto key = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.upper_bound(key);
  if (it == g_pinned.begin()) return false;
  --it;
  return key < it->first + std::max<size_t>(it->second, 1);
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  int dev = storage->device().has_index() ? storage->device().index() : t_device;
  c10::DataPtr fresh = alloc_on(dev, nbytes);
  size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

// ---- generators: one CPU-algorithm generator per device ----------------------------------------------
struct SimGenerator final : c10::GeneratorImpl {
  at::Generator cpu;
  SimGenerator(DeviceIndex index, uint64_t seed)
      : c10::GeneratorImpl(c10::Device(kDev, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  void set_current_seed(uint64_t seed) override { cpu.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { cpu.set_offset(offset); }
  uint64_t get_offset() const override { return cpu.get_offset(); }
  uint64_t current_seed() const override { return cpu.current_seed(); }
  uint64_t seed() override { return cpu.seed(); }
  void set_state(const c10::TensorImpl& state) override { cpu.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return cpu.unsafeGetGeneratorImpl()->get_state(); }
  static DeviceType device_type() { return kDev; }

 private:
  SimGenerator* clone_impl() const override {
    auto* copy = new SimGenerator(device().index(), 0);
    copy->cpu = cpu.clone();
    return copy;
  }
};

const at::Generator& default_generator(DeviceIndex index) {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    for (int i = 0; i < device_count(); ++i) v.push_back(at::make_generator<SimGenerator>(i, c10::default_rng_seed_val));
    return v;
  }();
  if (index < 0) index = t_device;
  check_index(index);
  return gens[index];
}

// ---- device guard and hooks ----------------------------------------------------------------------------
struct SimGuardImpl final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kDev; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d.index());
    c10::Device old(kDev, t_device);
    t_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kDev, t_device); }
  void setDevice(c10::Device d) const override {
    check_index(d.index());
    t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::UNSAFE, d, t_stream[d.index()]); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, ++g_next_stream);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  DeviceIndex deviceCount() const noexcept override { return static_cast<DeviceIndex>(device_count()); }
  void record(void** event, const c10::Stream&, const DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new double(0);
    *static_cast<double*>(*event) =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const DeviceIndex) const noexcept override { delete static_cast<double*>(event); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
  double elapsedTime(void* start, void* end, const DeviceIndex) const override {
    TORCH_CHECK(start && end, "musa simulator: both events must be recorded before elapsed_time");
    return *static_cast<double*>(end) - *static_cast<double*>(start);
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl);

struct SimHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(DeviceIndex index) const override {
    if (index < 0) index = t_device;
    check_index(index);
    return at::make_generator<SimGenerator>(index, c10::default_rng_seed_val);
  }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kDev, t_device); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return static_cast<DeviceIndex>(device_count()); }
  void setCurrentDevice(DeviceIndex d) const override {
    check_index(d);
    t_device = d;
  }
  DeviceIndex getCurrentDevice() const override { return t_device; }
  DeviceIndex exchangeDevice(DeviceIndex d) const override {
    check_index(d);
    DeviceIndex old = t_device;
    t_device = d;
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};
SimHooks g_hooks;

// ---- host aliases --------------------------------------------------------------------------------------
struct AliasCtx {
  c10::Storage device_storage;  // keeps the device memory alive while the alias lives
};
void free_alias(void* ctx) { delete static_cast<AliasCtx*>(ctx); }

c10::Storage host_storage_for(const c10::Storage& device_storage) {
  void* data = device_storage.unsafeGetStorageImpl()->data_ptr().get();
  c10::DataPtr ptr(data, new AliasCtx{device_storage}, &free_alias, c10::Device(DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            device_storage.nbytes(), std::move(ptr),
                                                            c10::GetCPUAllocator(), /*resizable=*/true));
}

at::Tensor with_storage(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

at::Tensor host_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kDev) return t;
  return with_storage(host_storage_for(t.storage()), c10::DispatchKey::CPU, t);
}

// Memory of `cpu` (a CPU storage a kernel produced) becomes device memory on `dev`, without a copy.
c10::Storage adopt(const c10::Storage& cpu, int dev) {
  int64_t n = static_cast<int64_t>(cpu.nbytes());
  void* data = cpu.unsafeGetStorageImpl()->data_ptr().get();
  count_alloc(dev, n);
  c10::DataPtr ptr(data, new Adopted{cpu, n, dev}, &free_adopted, c10::Device(kDev, dev));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), cpu.nbytes(),
                                                            std::move(ptr), &g_allocator, /*resizable=*/true));
}

// ---- native kernels: allocation, views, copies ---------------------------------------------------------
at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  CurrentDevice guard(resolve(device));
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  CurrentDevice guard(resolve(device));
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  size_t needed = impl->numel() == 0 ? 0 : (impl->storage_offset() + impl->numel()) * self.itemsize();
  // A resize never shrinks storage (as on CPU/CUDA) but must grow it, resizable or not.
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor as_host(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().type() == kDev || t.device().type() == DeviceType::CPU, op,
              ": the musa simulator copies only between cpu and musa, got ", t.device());
  return host_alias(t);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  as_host(dst, "copy_").copy_(as_host(self, "copy_"), non_blocking);
  return dst;
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  as_host(self, "copy_").copy_(as_host(src, "copy_"), non_blocking);
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset, at::IntArrayRef size,
                               at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kDev, "set_: expected a musa storage for a musa tensor, got ",
              source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  impl->set_sizes_and_strides(size, stride, offset);
  size_t needed = 0;
  if (impl->numel() > 0) {
    int64_t last = offset;
    for (size_t i = 0; i < size.size(); ++i) last += (size[i] - 1) * stride[i];
    needed = (last + 1) * self.itemsize();
  }
  if (needed > impl->storage().nbytes()) resize_storage_bytes(impl->storage().unsafeGetStorageImpl(), needed);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes()) / static_cast<int64_t>(self.itemsize());
  return set_storage_offset(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  int dev = self.device().index();
  c10::Storage empty(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0, alloc_on(dev, 0),
                                                           &g_allocator, true));
  return set_storage_offset(self, empty, 0, {0}, {1});
}

void record_stream(at::Tensor&, c10::Stream) {}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  // Same algorithm as the CPU kernel, but through musa ops so bernoulli_ draws from the device generator
  // (the CPU kernel would draw from the host's default generator).
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (!train.has_value() || *train) {
    double keep = 1. - p;
    at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous).bernoulli_(keep);
    return {input.mul(mask).mul_(keep == 0 ? 0. : 1. / keep), mask};
  }
  return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
}

// ---- the boxed fallback: CPU kernels on host aliases ---------------------------------------------------
struct Call {
  const c10::OperatorHandle& op;
  const c10::FunctionSchema& schema;
  int device = -1;                // the musa device this op runs on (-1: none seen yet)
  std::string host_arg;           // name of a non-scalar host tensor argument, if any
  bool allow_host_indices = false;
  // alias storage (CPU) -> device storage, for every storage this call touched or produced
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages;
  std::vector<std::pair<c10::Storage, c10::Storage>> aliases;  // (device storage, its host alias)

  Call(const c10::OperatorHandle& o) : op(o), schema(o.schema()) {
    const auto& name = schema.name();
    allow_host_indices = name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
                         name == "aten::_index_put_impl_";
  }

  [[noreturn]] void mismatch(const std::string& a, const std::string& b) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ",
                b, "! (in the musa simulator, for ", schema.name(), ")");
  }

  void see_device(int dev) {
    if (device >= 0 && device != dev) mismatch("musa:" + std::to_string(device), "musa:" + std::to_string(dev));
    device = dev;
  }

  // After every argument went through to_host: a host tensor among device tensors is torch's device error.
  void check_no_host_arg() {
    if (!host_arg.empty() && device >= 0) {
      mismatch("musa:" + std::to_string(device), "cpu (argument '" + host_arg + "')");
    }
    if (device < 0) device = t_device;
  }

  at::Tensor to_host(const at::Tensor& t, const std::string& arg, bool is_index) {
    if (!t.defined()) return t;
    if (t.device().type() != kDev) {
      if (t.device().type() == DeviceType::CPU && t.dim() > 0 && !(is_index && allow_host_indices) &&
          host_arg.empty())
        host_arg = arg;
      return t;
    }
    see_device(t.device().index());
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    for (auto& [dev_storage, alias] : aliases) {
      if (dev_storage.unsafeGetStorageImpl() == key) return with_storage(alias, c10::DispatchKey::CPU, t);
    }
    c10::Storage alias = host_storage_for(t.storage());
    aliases.emplace_back(t.storage(), alias);
    storages.emplace_back(alias.unsafeGetStorageImpl(), t.storage());
    return with_storage(alias, c10::DispatchKey::CPU, t);
  }

  at::Tensor to_device(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != DeviceType::CPU) return t;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    for (auto& [alias, dev_storage] : storages) {
      if (alias == key) return with_storage(dev_storage, c10::DispatchKey::PrivateUse1, t);
    }
    c10::Storage dev_storage = adopt(t.storage(), device);
    storages.emplace_back(key, dev_storage);
    return with_storage(dev_storage, c10::DispatchKey::PrivateUse1, t);
  }

  // After the kernel: an out=/in-place argument the CPU kernel resized must show the new shape (and memory).
  void sync_back(const at::Tensor& dev_t, const at::Tensor& host_t) {
    if (!dev_t.defined() || dev_t.device().type() != kDev) return;
    auto* dev_storage = dev_t.storage().unsafeGetStorageImpl();
    for (auto& [ds, alias] : aliases) {
      if (ds.unsafeGetStorageImpl() != dev_storage) continue;
      if (alias.unsafeGetStorageImpl()->data_ptr().get() != dev_storage->data_ptr().get() ||
          alias.nbytes() != dev_storage->nbytes()) {
        // The CPU kernel reallocated: the device storage takes over the new memory.
        c10::Storage moved = adopt(alias, dev_t.device().index());
        dev_storage->set_data_ptr_noswap(std::move(moved.unsafeGetStorageImpl()->mutable_data_ptr()));
        dev_storage->set_nbytes(alias.nbytes());
      }
    }
    if (dev_t.sizes() != host_t.sizes() || dev_t.strides() != host_t.strides() ||
        dev_t.storage_offset() != host_t.storage_offset()) {
      dev_t.unsafeGetTensorImpl()->set_sizes_and_strides(host_t.sizes(), host_t.strides(), host_t.storage_offset());
    }
  }
};

bool is_generator_arg(const c10::Argument& a) {
  const auto& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto opt = t->cast<c10::OptionalType>()) return opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
  return false;
}

bool is_device_arg(const c10::Argument& a) {
  const auto& t = a.type();
  if (t->kind() == c10::TypeKind::DeviceObjType) return true;
  if (auto opt = t->cast<c10::OptionalType>()) return opt->getElementType()->kind() == c10::TypeKind::DeviceObjType;
  return false;
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  Call call(op);
  const auto& args = call.schema.arguments();
  const size_t num_args = args.size();
  const size_t first = stack->size() - num_args;
  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  std::vector<size_t> generator_slots;

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    const auto& arg = args[i];
    bool is_index = arg.name() == "indices";
    if (v.isTensor()) {
      v = call.to_host(v.toTensor(), arg.name(), is_index);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(call.to_host(t, arg.name(), is_index));
      v = out;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& elem : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = elem;
        out.push_back(t.has_value() ? std::optional<at::Tensor>(call.to_host(*t, arg.name(), is_index)) : t);
      }
      v = out;
    } else if (v.isDevice() && v.toDevice().type() == kDev) {
      call.see_device(resolve(v.toDevice()));
      v = c10::IValue(c10::Device(DeviceType::CPU));
    } else if (is_generator_arg(arg)) {
      generator_slots.push_back(i);
    }
  }
  call.check_no_host_arg();
  for (size_t i : generator_slots) {  // random ops draw from the musa device's generator, never the host's
    c10::IValue& v = (*stack)[first + i];
    if (v.isNone()) {
      v = c10::IValue(default_generator(call.device).get<SimGenerator>()->cpu);
    } else {
      at::Generator g = v.toGenerator();
      TORCH_CHECK(g.device().type() == kDev, "Expected a 'musa' device type for generator but found '",
                  g.device().type(), "'");
      v = c10::IValue(g.get<SimGenerator>()->cpu);
    }
  }

  {
    CurrentDevice guard(static_cast<DeviceIndex>(call.device));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  // Results aliasing a mutable argument (in-place, out=) are returned as the original device tensor.
  const auto& rets = call.schema.returns();
  const size_t num_rets = rets.size();
  const size_t rfirst = stack->size() - num_rets;
  for (size_t r = 0; r < num_rets; ++r) {
    c10::IValue& v = (*stack)[rfirst + r];
    const auto* ralias = rets[r].alias_info();
    if (ralias && ralias->isWrite() && v.isTensor()) {
      for (size_t i = 0; i < num_args; ++i) {
        const auto* aalias = args[i].alias_info();
        if (aalias && aalias->beforeSets() == ralias->beforeSets() && originals[i].isTensor()) {
          const at::Tensor& dev_t = originals[i].toTensor();
          if (dev_t.defined() && dev_t.device().type() == kDev) {
            call.sync_back(dev_t, v.toTensor());
            v = originals[i];
          }
          break;
        }
      }
      if (v.toTensor().device().type() == DeviceType::CPU) v = call.to_device(v.toTensor());
    } else if (v.isTensor()) {
      v = call.to_device(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(call.to_device(t));
      v = out;
    }
  }
  // Mutable list arguments (e.g. _foreach_*_ ops) return nothing; resized out= lists are not supported.
}

// ---- convolutions ----------------------------------------------------------------------------------------
// For a PrivateUse1 input, aten::convolution picks the "overrideable" backend: the forward dispatches to
// convolution_overrideable and autograd to convolution_backward_overrideable, whose only kernels throw
// NotImplementedError (there is no CPU kernel for the fallback to borrow). torch_musa implements both (muDNN);
// here they run torch's CPU convolution (at::convolution / at::convolution_backward, the kernels the cpu
// backend uses) on host aliases, with the same device checks and results as the fallback.
c10::OperatorHandle aten_op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

std::optional<at::Tensor> optional_to_host(Call& call, const std::optional<at::Tensor>& t, const char* arg) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return call.to_host(*t, arg, false);
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                    at::IntArrayRef output_padding, int64_t groups) {
  static const c10::OperatorHandle op = aten_op("aten::convolution_overrideable");
  Call call(op);
  at::Tensor host_input = call.to_host(input, "input", false);
  at::Tensor host_weight = call.to_host(weight, "weight", false);
  std::optional<at::Tensor> host_bias = optional_to_host(call, bias, "bias");
  call.check_no_host_arg();
  CurrentDevice guard(static_cast<DeviceIndex>(call.device));
  return call.to_device(at::convolution(host_input, host_weight, host_bias, stride, padding, dilation, transposed,
                                        output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  static const c10::OperatorHandle op = aten_op("aten::convolution_backward_overrideable");
  Call call(op);
  at::Tensor host_grad = call.to_host(grad_output, "grad_output", false);
  at::Tensor host_input = call.to_host(input, "input", false);
  at::Tensor host_weight = call.to_host(weight, "weight", false);
  call.check_no_host_arg();
  CurrentDevice guard(static_cast<DeviceIndex>(call.device));
  // the bias has one entry per output channel (dim 1 of grad_output, transposed or not); undefined results
  // where output_mask is false, as torch's kernels return
  std::vector<int64_t> bias_sizes{host_grad.size(1)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(host_grad, host_input, host_weight, bias_sizes, stride, padding, dilation,
                               transposed, output_padding, groups, output_mask);
  return {call.to_device(grad_input), call.to_device(grad_weight), call.to_device(grad_bias)};
}

}  // namespace musa_sim

// ---- registration --------------------------------------------------------------------------------------
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&musa_sim::fallback>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &musa_sim::empty_memory_format);
  m.impl("empty_strided", &musa_sim::empty_strided);
  m.impl("resize_", &musa_sim::resize_);
  m.impl("copy_", &musa_sim::copy_);
  m.impl("_copy_from", &musa_sim::copy_from);
  m.impl("_copy_from_and_resize", &musa_sim::copy_from_and_resize);
  m.impl("set_.source_Storage", &musa_sim::set_storage);
  m.impl("set_.source_Storage_storage_offset", &musa_sim::set_storage_offset);
  m.impl("set_.source_Tensor", &musa_sim::set_tensor);
  m.impl("set_", &musa_sim::set_empty);
  m.impl("record_stream", &musa_sim::record_stream);
  m.impl("native_dropout", &musa_sim::native_dropout);
  m.impl("convolution_overrideable", &musa_sim::convolution_overrideable);
  m.impl("convolution_backward_overrideable", &musa_sim::convolution_backward_overrideable);
  m.impl("view", &at::native::view);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
  // Ops with a CPU/CUDA kernel *and* a CompositeImplicitAutograd decomposition: without a PrivateUse1 kernel the
  // dispatcher takes the decomposition (e.g. silu_backward becomes sigmoid/sub/mul..., rounding after each op in
  // bf16), where CUDA and torch_musa run one kernel. Send them to the CPU kernel like every other op.
  // (torch 2.13: these are all aten ops with both a CPU kernel and a CompositeImplicitAutograd one.)
  for (const char* name : {"silu_backward", "mish_backward", "native_channel_shuffle"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&musa_sim::fallback>());
  }
}

// Autocast on musa uses the same op lists and cast policies as CUDA (torch_musa does the same).
#define SIM_AUTOCAST_LP(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, lower_precision_fp)
#define SIM_AUTOCAST_FP32(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, fp32)
#define SIM_AUTOCAST_PROMOTE(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  using namespace at;
  using namespace at::autocast;
  AT_FORALL_LOWER_PRECISION_FP(SIM_AUTOCAST_LP)
  AT_FORALL_FP32(SIM_AUTOCAST_FP32)
  AT_FORALL_PROMOTE(SIM_AUTOCAST_PROMOTE)
}

namespace {
struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(&musa_sim::g_hooks); }
} register_hooks;
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Simulated MUSA device (PrivateUse1 over host memory) for tests";
  m.def("device_count", &musa_sim::device_count);
  m.def("current_device", [] { return static_cast<int>(musa_sim::t_device); });
  m.def("set_device", [](int d) {
    musa_sim::check_index(d);
    musa_sim::t_device = static_cast<c10::DeviceIndex>(d);
  });
  m.def("memory_stats", [](int d) {
    musa_sim::check_index(d);
    auto& s = musa_sim::g_stats[d];
    return std::map<std::string, int64_t>{{"allocated_bytes", s.current.load()},
                                          {"peak_allocated_bytes", s.peak.load()},
                                          {"num_allocs", s.num_allocs.load()},
                                          {"num_frees", s.num_frees.load()}};
  });
  m.def("reset_peak", [](int d) {
    musa_sim::check_index(d);
    musa_sim::g_stats[d].peak.store(musa_sim::g_stats[d].current.load());
  });
  m.def("host_alias", &musa_sim::host_alias, "CPU tensor sharing the memory of a musa tensor (keeps it alive)");
  m.def("default_generator", [](int d) { return musa_sim::default_generator(static_cast<c10::DeviceIndex>(d)); });
}
