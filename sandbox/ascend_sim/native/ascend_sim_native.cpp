// ascend-sim native engine: the emulated `npu` device as a C++ PrivateUse1 backend.
//
// An npu tensor is a PrivateUse1 tensor whose storage memory belongs to a CPU storage (its "shadow",
// held in the npu DataPtr's context). Every aten op on npu tensors reaches one boxed kernel
// (`npu_kernel`) that swaps npu tensors for CPU aliases of the same memory (no copies), runs the CPU
// kernel and hands the outputs back as npu tensors; view outputs share the input's npu storage.
// The porting policy (which ops have an NPU kernel, dtype allow-lists, warnings, call sites) stays in
// Python: this file only calls back into it for events (fallback, dtype problem, float64, host sync),
// which are rare, so the common op costs a few hundred nanoseconds instead of a Python round trip.

#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/Dtype.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

static_assert(static_cast<int>(c10::ScalarType::NumOptions) <= 64, "dtype masks are 64-bit");

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
const c10::Device kNpuDevice(kNpu, 0);

// ---- storage: npu memory is the memory of a CPU StorageImpl ------------------------------------------

std::atomic<int64_t> g_bytes{0};
std::atomic<int64_t> g_peak{0};

struct Shadow {
  c10::intrusive_ptr<c10::StorageImpl> cpu;
  int64_t nbytes;
};

void delete_shadow(void* ctx) {
  auto* s = static_cast<Shadow*>(ctx);
  g_bytes.fetch_sub(s->nbytes, std::memory_order_relaxed);
  delete s;
}

c10::DataPtr shadow_data_ptr(c10::intrusive_ptr<c10::StorageImpl> cpu) {
  const auto n = static_cast<int64_t>(cpu->nbytes());
  void* data = n > 0 ? cpu->mutable_data() : nullptr;
  auto* s = new Shadow{std::move(cpu), n};
  const int64_t now = g_bytes.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return c10::DataPtr(data, s, &delete_shadow, kNpuDevice);
}

struct NpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* cpu_alloc = c10::GetCPUAllocator();
    auto cpu = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), n, cpu_alloc->allocate(n), cpu_alloc, /*resizable=*/true);
    return shadow_data_ptr(std::move(cpu));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

NpuAllocator g_allocator;

c10::Storage npu_storage_over(c10::intrusive_ptr<c10::StorageImpl> cpu) {
  const size_t n = cpu->nbytes();
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), n, shadow_data_ptr(std::move(cpu)), &g_allocator, /*resizable=*/true));
}

// The CPU StorageImpl behind an npu storage. Repairs the npu side when the CPU storage was reallocated
// (resize_ / out= on the CPU alias) and adopts npu storages allocated outside this file.
c10::StorageImpl* shadow_of(c10::StorageImpl* impl) {
  const c10::DataPtr& dp = impl->data_ptr();
  if (dp.get_deleter() == &delete_shadow) {
    auto* s = static_cast<Shadow*>(dp.get_context());
    c10::StorageImpl* cpu = s->cpu.get();
    if (cpu->data() != dp.get() || static_cast<int64_t>(cpu->nbytes()) != s->nbytes) {
      impl->set_data_ptr_noswap(shadow_data_ptr(s->cpu));
      impl->set_nbytes(cpu->nbytes());
    }
    return cpu;
  }
  c10::DataPtr old = impl->set_data_ptr(c10::DataPtr(nullptr, kNpuDevice));
  old.unsafe_set_device(c10::Device(c10::kCPU));
  auto cpu = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), std::move(old), c10::GetCPUAllocator(), true);
  c10::StorageImpl* raw = cpu.get();
  impl->set_data_ptr_noswap(shadow_data_ptr(std::move(cpu)));
  return raw;
}

// Storages seen in one op call: CPU shadow -> npu storage, so view outputs share the input's npu storage.
// `keys` is the input tensor's key set (views keep their base's autograd keys, even in inference mode);
// empty for storages of fresh outputs.
struct SeenStorage {
  c10::StorageImpl* cpu;
  c10::Storage npu;
  c10::DispatchKeySet keys;
};
using AliasMap = c10::SmallVector<SeenStorage, 8>;

bool is_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNpu; }

void copy_meta(const at::Tensor& from, c10::TensorImpl* to) {
  to->set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
  to->_set_conj(from.is_conj());
  to->_set_neg(from.is_neg());
}

at::Tensor to_cpu_alias(const at::Tensor& t, AliasMap* seen) {
  const c10::Storage& st = t.unsafeGetTensorImpl()->unsafe_storage();
  c10::StorageImpl* cpu = shadow_of(st.unsafeGetStorageImpl());
  if (seen != nullptr) {
    seen->push_back(SeenStorage{cpu, st, t.key_set()});
  }
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cpu)),
      c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  copy_meta(t, out.unsafeGetTensorImpl());
  return out;
}

at::Tensor to_npu(const at::Tensor& c, AliasMap& seen) {
  TORCH_CHECK(c.layout() == c10::kStrided, "ascend-sim: only strided tensors can live on the npu device");
  c10::StorageImpl* cs = c.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  for (auto& entry : seen) {
    if (entry.cpu == cs && !entry.keys.empty()) {
      // A view of an input: same npu storage, the base's keys (like a CPU view of a CPU tensor).
      auto out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(entry.npu),
                                                          entry.keys, c.dtype());
      copy_meta(c, out.unsafeGetTensorImpl());
      return out;
    }
    if (entry.cpu == cs) {
      auto out = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(entry.npu), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c.dtype());
      copy_meta(c, out.unsafeGetTensorImpl());
      return out;
    }
  }
  c10::Storage ns = npu_storage_over(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cs));
  seen.push_back(SeenStorage{cs, ns, c10::DispatchKeySet()});
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(ns), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c.dtype());
  copy_meta(c, out.unsafeGetTensorImpl());
  return out;
}

// After an op wrote into `alias` (the CPU alias of npu tensor `t`): follow resizes and set_.
void follow_alias(const at::Tensor& t, const at::Tensor& alias) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::StorageImpl* npu_st = impl->unsafe_storage().unsafeGetStorageImpl();
  c10::StorageImpl* cpu_now = alias.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (shadow_of(npu_st) != cpu_now) {
    impl->set_storage_keep_dtype(npu_storage_over(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cpu_now)));
  }
  if (t.sizes() != alias.sizes() || t.strides() != alias.strides() ||
      t.storage_offset() != alias.storage_offset()) {
    impl->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
  }
}

// ---- policy callbacks (Python) -----------------------------------------------------------------------

py::object* g_hooks = nullptr;  // leaked on purpose: must outlive interpreter-shutdown ordering
uint64_t g_bad_mask = 0;        // dtypes that always need a policy check on this chip (complex, bf16 on 310p)

[[noreturn]] void rethrow_python(py::error_already_set& e) {
  e.restore();
  python_error err;
  err.persist();
  throw err;
}

// Calls hooks.<name>(*args) under the GIL; a Python exception propagates to the caller unchanged.
template <typename... Args>
void call_hook(const char* name, Args&&... args) {
  py::gil_scoped_acquire gil;
  TORCH_CHECK(g_hooks != nullptr, "ascend-sim native engine used before install()");
  try {
    g_hooks->attr(name)(std::forward<Args>(args)...);
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
}

// A torch.dtype for a hook argument (a borrowed singleton; only touched under the GIL).
PyObject* py_dtype(c10::ScalarType st) { return reinterpret_cast<PyObject*>(torch::getTHPDtype(st)); }

inline uint64_t bit(c10::ScalarType st) { return uint64_t{1} << static_cast<int>(st); }

uint64_t dtype_bit(py::handle d) {
  TORCH_CHECK(THPDtype_Check(d.ptr()), "ascend-sim: expected a torch.dtype");
  return bit(reinterpret_cast<THPDtype*>(d.ptr())->scalar_type);
}

// ---- per-operator decisions ----------------------------------------------------------------------------

enum class Kind : uint8_t { kGeneric, kCopy, kCopyFrom, kCopyFromAndResize, kLocalScalar };

struct OpEntry {
  std::string name;  // "aten::add.Tensor", as torch prints it
  std::atomic<int64_t> count{0};
  bool supported = true;
  bool cross_device_ok = false;
  bool has_allow_list = false;
  uint64_t allow_mask = 0;
  std::string sync_kind;  // host sync recorded on every call ("" = none)
  Kind kind = Kind::kGeneric;
  std::vector<int> return_writes;  // per return: the argument it writes into, or -1
  std::vector<char> arg_written;   // per argument: written in place
  bool any_written = false;
  std::vector<char> arg_is_dtype;
  std::vector<char> arg_is_device;
  bool fast = false;  // the unboxed path may run it (no policy event, no writes, no device arguments)
};

// Decisions live in a global table (filled under a mutex, once per operator); each thread reads them
// through its own cache, so the per-op path takes no lock. install() bumps the generation to drop them;
// dropped entries are kept alive (a thread may still hold one mid-call).
std::mutex g_entries_mutex;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpEntry>> g_entries;
std::vector<std::unique_ptr<OpEntry>> g_dropped;
std::atomic<uint64_t> g_generation{1};

struct ThreadEntries {
  uint64_t generation = 0;
  std::unordered_map<const c10::FunctionSchema*, OpEntry*> map;
};
thread_local ThreadEntries t_entries;

std::string printed_name(const c10::FunctionSchema& s) {
  return s.overload_name().empty() ? s.name() : s.name() + "." + s.overload_name();
}

bool is_type(const c10::TypePtr& t, c10::TypeKind kind) {
  if (t->kind() == kind) {
    return true;
  }
  if (auto opt = t->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == kind;
  }
  return false;
}

std::unique_ptr<OpEntry> make_entry(const c10::FunctionSchema& schema) {
  auto e = std::make_unique<OpEntry>();
  e->name = printed_name(schema);
  const auto& args = schema.arguments();
  e->arg_written.assign(args.size(), 0);
  e->arg_is_dtype.assign(args.size(), 0);
  e->arg_is_device.assign(args.size(), 0);
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* ai = args[i].alias_info();
    if (ai != nullptr && ai->isWrite()) {
      e->arg_written[i] = 1;
      e->any_written = true;
    }
    e->arg_is_dtype[i] = args[i].name() == "dtype" && is_type(args[i].real_type(), c10::TypeKind::ScalarTypeType);
    e->arg_is_device[i] = is_type(args[i].type(), c10::TypeKind::DeviceObjType);
  }
  for (const auto& r : schema.returns()) {
    int writes = -1;
    const auto* ri = r.alias_info();
    if (ri != nullptr && ri->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i) {
        const auto* ai = args[i].alias_info();
        if (ai != nullptr && ai->isWrite() && ai->beforeSets() == ri->beforeSets()) {
          writes = static_cast<int>(i);
          break;
        }
      }
    }
    e->return_writes.push_back(writes);
  }
  const std::string& base = schema.name();
  if (base == "aten::copy_") {
    e->kind = Kind::kCopy;
  } else if (base == "aten::_copy_from") {
    e->kind = Kind::kCopyFrom;
  } else if (base == "aten::_copy_from_and_resize") {
    e->kind = Kind::kCopyFromAndResize;
  } else if (base == "aten::_local_scalar_dense") {
    e->kind = Kind::kLocalScalar;
  }
  // Ask the Python policy once per operator: (supported, sync kind, cross-device ok, dtype allow-list|None).
  py::gil_scoped_acquire gil;
  py::tuple d;
  try {
    d = g_hooks->attr("decide")(e->name).cast<py::tuple>();
  } catch (py::error_already_set& err) {
    rethrow_python(err);
  }
  e->supported = d[0].cast<bool>();
  e->sync_kind = d[1].cast<std::string>();
  e->cross_device_ok = d[2].cast<bool>();
  e->fast = e->supported && e->sync_kind.empty() && !e->any_written && e->kind == Kind::kGeneric &&
            std::none_of(e->arg_is_device.begin(), e->arg_is_device.end(), [](char c) { return c != 0; });
  e->has_allow_list = !d[3].is_none();
  if (e->has_allow_list) {
    for (const auto& dt : d[3].cast<py::list>()) {
      e->allow_mask |= dtype_bit(dt);
    }
  }
  return e;
}

OpEntry& entry_for(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  ThreadEntries& te = t_entries;
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (te.generation != gen) {
    te.map.clear();
    te.generation = gen;
  }
  auto hit = te.map.find(key);
  if (hit != te.map.end()) {
    return *hit->second;
  }
  OpEntry* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    auto it = g_entries.find(key);
    if (it != g_entries.end()) {
      found = it->second.get();
    }
  }
  if (found == nullptr) {
    auto e = make_entry(op.schema());  // outside the lock: calls Python
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    found = g_entries.emplace(key, std::move(e)).first->second.get();
  }
  te.map.emplace(key, found);
  return *found;
}


// Set while a view op runs its metadata kernel directly on npu tensors: the ops it calls internally
// (transpose -> as_strided ...) are part of that one op, as they are when the CPU kernel runs on an alias.
thread_local bool t_inside_view = false;

// ---- the kernel --------------------------------------------------------------------------------------

struct CallState {
  AliasMap seen;
  bool saw_npu = false;
  bool saw_cpu = false;  // a CPU tensor with dim > 0
  std::string cpu_device;
};

at::Tensor unwrap_tensor(const at::Tensor& t, OpEntry& e, size_t pos, CallState& cs) {
  if (!t.defined()) {
    return t;
  }
  if (t.device().type() == kNpu) {
    cs.saw_npu = true;
    const uint64_t b = bit(t.scalar_type());
    if ((g_bad_mask & b) != 0 || (e.has_allow_list && (e.allow_mask & b) == 0)) {
      call_hook("check_dtype", e.name, static_cast<int>(pos), py::handle(py_dtype(t.scalar_type())));
    }
    return to_cpu_alias(t, &cs.seen);
  }
  if (!cs.saw_cpu && t.dim() > 0) {
    cs.saw_cpu = true;
    cs.cpu_device = t.device().str();
  }
  return t;
}

c10::IValue unwrap_value(const c10::IValue& v, OpEntry& e, size_t pos, CallState& cs) {
  if (v.isTensor()) {
    return unwrap_tensor(v.toTensor(), e, pos, cs);
  }
  if (v.isTensorList()) {
    auto in = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(in.size());
    for (const at::Tensor& t : in) {
      out.push_back(unwrap_tensor(t, e, pos, cs));
    }
    return out;
  }
  if (v.isList()) {
    auto in = v.toList();
    if (in.empty() || !in.elementType()->cast<c10::OptionalType>() ||
        in.elementType()->cast<c10::OptionalType>()->getElementType()->kind() != c10::TypeKind::TensorType) {
      return v;
    }
    c10::List<std::optional<at::Tensor>> out;
    out.reserve(in.size());
    for (const c10::IValue& x : in) {
      if (x.isTensor()) {
        out.push_back(unwrap_tensor(x.toTensor(), e, pos, cs));
      } else {
        out.push_back(std::nullopt);
      }
    }
    return out;
  }
  if (v.isStorage()) {
    const c10::Storage& st = v.toStorage();
    if (st.device_type() == kNpu) {
      return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(shadow_of(st.unsafeGetStorageImpl())));
    }
  }
  return v;
}

at::Tensor wrap_output(at::Tensor c, OpEntry& e, CallState& cs) {
  if (!c.defined() || c.device().type() != c10::kCPU) {
    return c;
  }
  if (c.scalar_type() == c10::kDouble) {
    call_hook("double", e.name);  // torch_npu warns once and computes in float32
    c = c.to(c10::kFloat);
  }
  return to_npu(c, cs.seen);
}

void npu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpEntry& e = entry_for(op);
  if (!t_inside_view) {
    e.count.fetch_add(1, std::memory_order_relaxed);
  }
  const size_t nargs = op.schema().arguments().size();
  const size_t first = stack->size() - nargs;

  CallState cs;
  bool to_host = false;
  std::optional<c10::ScalarType> out_dtype;  // a dtype= argument this chip may not produce
  const c10::IValue& arg0 = (*stack)[first];
  const std::optional<c10::ScalarType> in_dtype =
      nargs > 0 && arg0.isTensor() && arg0.toTensor().defined() ? std::optional(arg0.toTensor().scalar_type())
                                                                 : std::nullopt;
  c10::SmallVector<c10::IValue, 4> originals;  // written arguments, as the caller passed them
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> written;  // (npu tensor, its CPU alias)
  if (e.any_written) {
    originals.resize(nargs);
  }
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (e.arg_is_device[i] && v.isDevice()) {
      if (v.toDevice().type() == kNpu) {
        v = c10::IValue(c10::Device(c10::kCPU));
      } else if (v.toDevice().type() == c10::kCPU) {
        to_host = true;
      }
      continue;
    }
    if (e.arg_is_dtype[i] && v.isInt() && (g_bad_mask & bit(static_cast<c10::ScalarType>(v.toInt()))) != 0) {
      out_dtype = static_cast<c10::ScalarType>(v.toInt());
    }
    if (!(v.isTensor() || v.isList() || v.isStorage())) {
      continue;
    }
    if (e.arg_written[i]) {
      originals[i] = v;
      c10::IValue u = unwrap_value(v, e, i, cs);
      if (v.isTensor() && is_npu(v.toTensor())) {
        written.emplace_back(v.toTensor(), u.toTensor());
      } else if (v.isTensorList()) {
        auto a = v.toTensorList();
        auto b = u.toTensorList();
        for (size_t k = 0; k < a.size(); ++k) {
          if (is_npu(a[k])) {
            written.emplace_back(a[k], b[k]);
          }
        }
      }
      v = std::move(u);
    } else {
      v = unwrap_value(v, e, i, cs);
    }
  }
  if (cs.saw_cpu && cs.saw_npu && !e.cross_device_ok) {
    call_hook("device_mismatch", cs.cpu_device);
  }
  // Producing a dtype the chip lacks: factories, and casts that change the dtype (an upload of a
  // tensor that already has it is a plain copy on a real host).
  if (out_dtype && out_dtype != in_dtype) {
    call_hook("check_out_dtype", e.name, py::handle(py_dtype(*out_dtype)));
  }
  if (!e.supported) {
    call_hook("fallback", e.name);
  }
  if (!e.sync_kind.empty()) {
    call_hook("sync", e.sync_kind);
  }

  switch (e.kind) {
    case Kind::kCopy:
      if (originals.size() > 0 && originals[0].isTensor() && !is_npu(originals[0].toTensor())) {
        call_hook("sync", "d2h");  // device -> host copy into a CPU tensor
      }
      break;
    case Kind::kCopyFrom:
    case Kind::kCopyFromAndResize: {
      // _copy_from(self=src, dst): no CPU kernel; a copy into the destination's memory.
      const at::Tensor src = (*stack)[first].toTensor();
      const at::Tensor dst_orig = (*stack)[first + 1].toTensor();
      const bool dst_npu = is_npu(dst_orig);
      if (!dst_npu) {
        call_hook("sync", "d2h");
      }
      at::Tensor dst = dst_npu ? to_cpu_alias(dst_orig, nullptr) : dst_orig;
      if (e.kind == Kind::kCopyFromAndResize) {
        dst.resize_(src.sizes());
      }
      dst.copy_(src);
      if (dst_npu) {
        follow_alias(dst_orig, dst);
      }
      torch::jit::drop(*stack, nargs);
      stack->emplace_back(dst_orig);
      return;
    }
    default:
      break;
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (auto& [t, alias] : written) {
    follow_alias(t, alias);
  }
  const size_t nret = e.return_writes.size();
  const size_t rfirst = stack->size() - nret;
  for (size_t r = 0; r < nret; ++r) {
    c10::IValue& v = (*stack)[rfirst + r];
    const int w = e.return_writes[r];
    if (w >= 0 && !originals.empty()) {
      v = originals[w];  // in-place / out=: hand back the caller's tensor
      continue;
    }
    if (to_host) {
      if (e.sync_kind.empty() && op.schema().name() == "aten::_to_copy") {
        call_hook("sync", "d2h");
      }
      continue;
    }
    if (v.isTensor()) {
      v = wrap_output(v.toTensor(), e, cs);
    } else if (v.isTensorList()) {
      auto in = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (const at::Tensor& t : in) {
        out.push_back(wrap_output(t, e, cs));
      }
      v = out;
    }
  }
}

// ---- device guard: one device, one stream, synchronous -----------------------------------------------

struct NpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device) const override { return kNpuDevice; }
  c10::Device getDevice() const override { return kNpuDevice; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(c10::DeviceIndex) const override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
};

// ---- unboxed path for the hottest ops --------------------------------------------------------------
// The boxed kernel above costs a boxing round trip per op; for these ops a typed kernel calls the CPU
// kernel directly when nothing needs the policy (else it hands the call to the boxed kernel).

template <class T>
struct FastArg {  // anything but tensors and dtypes passes through
  using type = std::decay_t<T>;
  static type get(T v, const OpEntry&, CallState&, bool&) { return v; }
};

template <>
struct FastArg<const at::Tensor&> {
  using type = at::Tensor;
  static type get(const at::Tensor& t, const OpEntry& e, CallState& cs, bool& ok) {
    if (!ok || !t.defined()) {
      return t;
    }
    if (t.device().type() == kNpu) {
      const uint64_t b = bit(t.scalar_type());
      if ((g_bad_mask & b) != 0 || (e.has_allow_list && (e.allow_mask & b) == 0)) {
        ok = false;  // a dtype the policy must look at
        return t;
      }
      cs.saw_npu = true;
      return to_cpu_alias(t, &cs.seen);
    }
    if (t.dim() > 0) {
      ok = false;  // a CPU tensor beside npu ones: the boxed kernel decides
    }
    return t;
  }
};

template <>
struct FastArg<const std::optional<at::Tensor>&> {
  using type = std::optional<at::Tensor>;
  static type get(const std::optional<at::Tensor>& t, const OpEntry& e, CallState& cs, bool& ok) {
    if (!t.has_value()) {
      return t;
    }
    return FastArg<const at::Tensor&>::get(*t, e, cs, ok);
  }
};

template <>
struct FastArg<std::optional<c10::ScalarType>> {
  using type = std::optional<c10::ScalarType>;
  static type get(std::optional<c10::ScalarType> d, const OpEntry&, CallState&, bool& ok) {
    if (d.has_value() && (g_bad_mask & bit(*d)) != 0) {
      ok = false;
    }
    return d;
  }
};

template <class R>
struct FastRet;

template <>
struct FastRet<at::Tensor> {
  static at::Tensor wrap(at::Tensor r, OpEntry& e, CallState& cs) { return wrap_output(std::move(r), e, cs); }
};

template <>
struct FastRet<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> wrap(std::vector<at::Tensor> r, OpEntry& e, CallState& cs) {
    for (auto& t : r) {
      t = wrap_output(std::move(t), e, cs);
    }
    return r;
  }
};

template <class... T>
struct FastRet<std::tuple<T...>> {
  static std::tuple<T...> wrap(std::tuple<T...> r, OpEntry& e, CallState& cs) {
    return std::apply([&](auto&... x) { return std::tuple<T...>(FastRet<T>::wrap(std::move(x), e, cs)...); }, r);
  }
};

// Half-precision matmuls as the Cube unit computes them: fp16/bf16 operands, fp32 accumulation, one rounding
// to the operands' dtype. The CPU's own half kernels take 3-5x the float time on a prefill; a matmul of fewer
// rows (a decode step) stays on them, where converting the weight would cost more than it saves. The same rule
// and threshold as the Python engine's (half_matmul.py HALF_VIA_FLOAT_ROWS).
constexpr int64_t kHalfViaFloatRows = 16;

bool half_via_float(const at::Tensor& a, const at::Tensor& b, int64_t rows) {
  const c10::ScalarType d = a.scalar_type();
  return (d == at::kHalf || d == at::kBFloat16) && b.scalar_type() == d && rows >= kHalfViaFloatRows;
}

template <class Op>
struct HalfViaFloat {
  static constexpr bool kEnabled = false;
};

template <>
struct HalfViaFloat<at::_ops::mm> {
  static constexpr bool kEnabled = true;
  template <class Tup>
  static std::optional<at::Tensor> run(const Tup& a) {
    const at::Tensor& x = std::get<0>(a);
    const at::Tensor& w = std::get<1>(a);
    if (!half_via_float(x, w, x.size(0))) {
      return std::nullopt;
    }
    return at::mm(x.to(at::kFloat), w.to(at::kFloat)).to(x.scalar_type());
  }
};

template <>
struct HalfViaFloat<at::_ops::bmm> {
  static constexpr bool kEnabled = true;
  template <class Tup>
  static std::optional<at::Tensor> run(const Tup& a) {
    const at::Tensor& x = std::get<0>(a);
    const at::Tensor& w = std::get<1>(a);
    if (!half_via_float(x, w, x.size(0) * x.size(1))) {
      return std::nullopt;
    }
    return at::bmm(x.to(at::kFloat), w.to(at::kFloat)).to(x.scalar_type());
  }
};

template <>
struct HalfViaFloat<at::_ops::addmm> {
  static constexpr bool kEnabled = true;
  template <class Tup>
  static std::optional<at::Tensor> run(const Tup& a) {
    const at::Tensor& bias = std::get<0>(a);
    const at::Tensor& x = std::get<1>(a);
    const at::Tensor& w = std::get<2>(a);
    if (!half_via_float(x, w, x.size(0)) || bias.scalar_type() != x.scalar_type()) {
      return std::nullopt;
    }
    return at::addmm(bias.to(at::kFloat), x.to(at::kFloat), w.to(at::kFloat), std::get<3>(a), std::get<4>(a))
        .to(x.scalar_type());
  }
};

// "add.Tensor" for at::_ops::add_Tensor: the name Library::impl takes in the aten namespace.
template <class Op>
std::string op_name() {
  const std::string overload = Op::overload_name;
  return std::string(Op::name).substr(6) + (overload.empty() ? "" : "." + overload);
}

template <class Op, class Sig = typename Op::schema>
struct Fast;

template <class Op, class R, class... Args>
struct Fast<Op, R(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle h = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return h;
  }

  // This op's decision without the per-thread map: one pointer per op, re-read after install()
  // (which never runs concurrently with ops; dropped entries stay valid).
  static OpEntry& entry() {
    static std::atomic<OpEntry*> cached{nullptr};
    static std::atomic<uint64_t> cached_generation{0};
    const uint64_t gen = g_generation.load(std::memory_order_acquire);
    OpEntry* e = cached.load(std::memory_order_acquire);
    if (e != nullptr && cached_generation.load(std::memory_order_acquire) == gen) {
      return *e;
    }
    OpEntry& fresh = entry_for(handle());
    cached.store(&fresh, std::memory_order_release);
    cached_generation.store(gen, std::memory_order_release);
    return fresh;
  }

  static R call(c10::DispatchKeySet ks, Args... args) {
    const c10::OperatorHandle& op = handle();
    OpEntry& e = entry();
    if (e.fast) {
      CallState cs;
      bool ok = true;
      std::tuple<typename FastArg<Args>::type...> cpu_args{FastArg<Args>::get(args, e, cs, ok)...};
      if (ok && cs.saw_npu) {
        if (!t_inside_view) {
          e.count.fetch_add(1, std::memory_order_relaxed);
        }
        if constexpr (HalfViaFloat<Op>::kEnabled) {
          if (std::optional<at::Tensor> h = HalfViaFloat<Op>::run(cpu_args)) {
            return FastRet<R>::wrap(std::move(*h), e, cs);
          }
        }
        R r = std::apply(
            [](auto&... a) -> R { return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...); },
            cpu_args);
        return FastRet<R>::wrap(std::move(r), e, cs);
      }
    }
    return c10::impl::BoxedKernelWrapper<R(Args...)>::call(c10::BoxedKernel::makeFromFunction<&npu_kernel>(), op,
                                                           ks, args...);
  }

  static void impl(torch::Library& lib) { lib.impl(op_name<Op>().c_str(), TORCH_FN(call)); }
};

// View ops: their CPU kernels only build a TensorImpl over the input's storage and are device-agnostic
// (CUDA registers the same ones), so they run directly on the npu tensor: the view shares its npu
// storage and keys without a CPU alias in between.
template <class Op, class Sig = typename Op::schema>
struct FastView;

template <class Op, class R, class... Args>
struct FastView<Op, R(const at::Tensor&, Args...)> {
  static R call(c10::DispatchKeySet ks, const at::Tensor& self, Args... args) {
    const c10::OperatorHandle& op = Fast<Op>::handle();
    OpEntry& e = Fast<Op>::entry();
    if (t_inside_view || (e.fast && is_npu(self) && (g_bad_mask & bit(self.scalar_type())) == 0)) {
      const bool outer = !t_inside_view;
      if (outer) {
        e.count.fetch_add(1, std::memory_order_relaxed);
      }
      t_inside_view = true;
      try {
        R r = Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self, args...);
        t_inside_view = !outer;
        return r;
      } catch (...) {
        t_inside_view = !outer;
        throw;
      }
    }
    return c10::impl::BoxedKernelWrapper<R(const at::Tensor&, Args...)>::call(
        c10::BoxedKernel::makeFromFunction<&npu_kernel>(), op, ks, self, args...);
  }

  static void impl(torch::Library& lib) { lib.impl(op_name<Op>().c_str(), TORCH_FN(call)); }
};

#define NPU_VIEW_OPS(_)                                                                                        \
  _(t) _(view) _(_unsafe_view) _(_reshape_alias) _(unsqueeze) _(squeeze_dim) _(expand) _(permute)            \
  _(transpose_int) _(select_int) _(slice_Tensor) _(as_strided) _(alias) _(detach) _(split_Tensor)           \
  _(split_with_sizes) _(unbind_int)

// The ops a transformer decode step spends its time in (ocr_mini, tiny_llm and the usual HF models).
#define NPU_FAST_OPS(_)                                                                                       \
  _(mm) _(bmm) _(addmm) _(clone) _(mul_Tensor) _(mul_Scalar) _(add_Tensor) _(add_Scalar)                   \
  _(sub_Tensor) _(div_Tensor) _(div_Scalar) _(neg) _(rsqrt) _(sqrt) _(exp) _(pow_Tensor_Scalar) _(silu)       \
  _(gelu) _(relu) _(sigmoid) _(tanh) _(cos) _(sin) _(_softmax) _(sum_dim_IntList) _(mean_dim) _(amax)        \
  _(argmax) _(topk) _(where_self) _(masked_fill_Scalar) _(embedding) _(native_layer_norm) _(index_select)   \
  _(gather) _(eq_Scalar) _(lt_Scalar) _(gt_Scalar) _(triu) _(tril) _(repeat) _(reciprocal)

std::vector<std::string> fast_op_names() {
  std::vector<std::string> out;
#define NPU_FAST_NAME(op) out.push_back(op_name<at::_ops::op>());
  NPU_FAST_OPS(NPU_FAST_NAME)
  NPU_VIEW_OPS(NPU_FAST_NAME)
#undef NPU_FAST_NAME
  return out;
}

std::unique_ptr<torch::Library> g_lib;

void register_kernels(const std::vector<std::string>& names) {
  if (!g_lib) {
    g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                             __FILE__, __LINE__);
  }
  const std::vector<std::string> fast = fast_op_names();
  for (const auto& n : names) {
    if (std::find(fast.begin(), fast.end(), n) == fast.end()) {
      g_lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_kernel>());
    }
  }
#define NPU_FAST_IMPL(op) Fast<at::_ops::op>::impl(*g_lib);
  NPU_FAST_OPS(NPU_FAST_IMPL)
#undef NPU_FAST_IMPL
#define NPU_VIEW_IMPL(op) FastView<at::_ops::op>::impl(*g_lib);
  NPU_VIEW_OPS(NPU_VIEW_IMPL)
#undef NPU_VIEW_IMPL
}

// ---- fused ops: C++ twins of fused_ops.py for the common call shapes ------------------------------------
// Same aten ops in the same order as the Python references (so the same numbers), without Python's
// per-op cost. npu tensors in, npu tensors out; npu_api.py decides when a call may take this path.

at::Tensor cpu_of(const at::Tensor& t) { return is_npu(t) ? to_cpu_alias(t, nullptr) : t; }

// Without autograd (the Python references stay differentiable; npu_api.py only comes here under no_grad):
// the ops below then skip the autograd layer.
struct BelowAutograd {
  at::AutoDispatchBelowADInplaceOrView guard;
};

at::Tensor npu_of(const at::Tensor& c) {
  AliasMap seen;
  return to_npu(c, seen);
}

// Each returns None when a tensor argument is not on the npu device or the arguments are invalid: the
// Python path then runs the reference, which reports the problem in its own words.
std::optional<std::tuple<at::Tensor, at::Tensor>> rms_norm(const at::Tensor& self_npu, const at::Tensor& gamma_npu,
                                                          double eps) {
  if (!is_npu(self_npu) || !is_npu(gamma_npu)) {
    return std::nullopt;
  }
  BelowAutograd below;
  const at::Tensor self = cpu_of(self_npu);
  const at::Tensor gamma = cpu_of(gamma_npu);
  const int64_t nd = gamma.dim();
  if (nd > self.dim() || !self.sizes().slice(self.dim() - nd).equals(gamma.sizes())) {
    return std::nullopt;  // the Python reference raises its error
  }
  const at::Tensor x = self.to(at::kFloat);
  std::vector<int64_t> dims;
  for (int64_t d = self.dim() - nd; d < self.dim(); ++d) {
    dims.push_back(d);
  }
  at::Tensor rstd = x.pow(2).mean(dims, /*keepdim=*/true).add_(eps).rsqrt_();
  at::Tensor y = (x * rstd).mul_(gamma.to(at::kFloat)).to(self.scalar_type());
  return std::make_tuple(npu_of(y), npu_of(rstd));
}

std::optional<at::Tensor> rotary_mul_half(const at::Tensor& input_npu, const at::Tensor& r1_npu,
                                          const at::Tensor& r2_npu) {
  if (!is_npu(input_npu) || !is_npu(r1_npu) || !is_npu(r2_npu)) {
    return std::nullopt;
  }
  BelowAutograd below;
  const at::Tensor input = cpu_of(input_npu);
  if (input.dim() != 3 && input.dim() != 4) {
    return std::nullopt;  // the Python reference raises its error
  }
  const at::Tensor x = input.to(at::kFloat);
  auto halves = at::chunk(x, 2, -1);
  const at::Tensor rot = at::cat({halves[1].neg(), halves[0]}, -1);
  return npu_of((x * cpu_of(r1_npu).to(at::kFloat) + rot * cpu_of(r2_npu).to(at::kFloat)).to(input.scalar_type()));
}

// npu_fusion_attention, BNSD layout, no mask, no dropout: (out, softmax_max, softmax_sum, softmax_out).
std::optional<std::vector<at::Tensor>> fusion_attention_bnsd(const at::Tensor& query, const at::Tensor& key,
                                                            const at::Tensor& value,
                                                            const std::optional<at::Tensor>& pse, double scale) {
  if (!is_npu(query) || !is_npu(key) || !is_npu(value) || (pse.has_value() && !is_npu(*pse)) || query.dim() != 4 ||
      key.dim() != 4 || value.dim() != 4) {
    return std::nullopt;
  }
  BelowAutograd below;
  const auto dtype = query.scalar_type();
  const at::Tensor q = cpu_of(query).to(at::kFloat);
  at::Tensor k = cpu_of(key).to(at::kFloat);
  at::Tensor v = cpu_of(value).to(at::kFloat);
  const int64_t b = q.size(0), n = q.size(1), sq = q.size(2);
  if (k.size(1) != n || v.size(1) != n) {  // grouped key/value heads
    if (k.size(1) != v.size(1) || n % k.size(1) != 0) {
      return std::nullopt;  // the Python reference handles (or reports) the rest
    }
    k = k.repeat_interleave(n / k.size(1), 1);
    v = v.repeat_interleave(n / v.size(1), 1);
  }
  at::Tensor s = at::matmul(q, k.transpose(-1, -2));
  const bool has_bias = pse.has_value() && pse->defined();
  if (has_bias) {
    s = s.add_(cpu_of(*pse).to(at::kFloat));
  }
  if (scale != 1.0) {
    s = s.mul_(scale);
  }
  const at::Tensor row_max = s.amax(-1, /*keepdim=*/true);
  at::Tensor p = at::softmax(s, -1);
  at::Tensor safe_max = row_max;
  at::Tensor row_sum;
  if (has_bias) {
    p = p.nan_to_num_(0.0);
    safe_max = row_max.nan_to_num(std::nullopt, std::nullopt, 0.0);
    row_sum = p.amax(-1, /*keepdim=*/true).reciprocal_().nan_to_num_(std::nullopt, 0.0);
  } else {
    row_sum = p.amax(-1, /*keepdim=*/true).reciprocal_();
  }
  const at::Tensor out = at::matmul(p, v).to(dtype);
  return std::vector<at::Tensor>{npu_of(out), npu_of(safe_max.expand({b, n, sq, 8})),
                                 npu_of(row_sum.expand({b, n, sq, 8})),
                                 npu_of(at::empty({0}, at::TensorOptions().dtype(dtype)))};
}

}  // namespace

// torch.autocast(device_type="npu"): the ops that run in the autocast dtype, cast in C++ as torch_npu casts
// them (the same list as the Python engine's _AUTOCAST_LOWER in device.py; a Python kernel per matmul cost a
// small model's generate 2.4x its CPU time). Every other op passes through autocast untouched.
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv1d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv3d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv3d, padding, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(convolution, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_convolution, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(_convolution, deprecated, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmv, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mv, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(prelu, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_transpose2d, input, lower_precision_fp)
}
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

// Everything else on PrivateUse1 (ops with CPU/backend kernels) reaches the kernel as a fallback.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_kernel>()); }

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ascend-sim native engine (see sandbox/ascend_sim/native/ascend_sim_native.cpp)";
  m.def("set_hooks", [](py::object hooks) {
    delete g_hooks;
    g_hooks = new py::object(std::move(hooks));
  });
  m.def("set_bad_dtypes", [](const std::vector<py::object>& dtypes) {
    uint64_t mask = 0;
    for (const auto& d : dtypes) {
      mask |= dtype_bit(d);
    }
    g_bad_mask = mask;
  });
  m.def("register_kernels", &register_kernels,
        "Route these aten ops' PrivateUse1 key to the npu kernel (ops whose composite kernel would win).");
  m.def("forget_decisions", []() {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    for (auto& kv : g_entries) {
      g_dropped.push_back(std::move(kv.second));
    }
    g_entries.clear();
    g_generation.fetch_add(1, std::memory_order_release);
  });
  m.def("zero_counts", []() {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    for (auto& kv : g_entries) {
      kv.second->count.store(0);
    }
  });
  m.def("op_counts", []() {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    std::vector<std::pair<std::string, int64_t>> out;
    for (auto& kv : g_entries) {
      const int64_t n = kv.second->count.load();
      if (n != 0) {
        out.emplace_back(kv.second->name, n);
      }
    }
    return out;
  });
  m.def("op_total", []() {
    std::lock_guard<std::mutex> lock(g_entries_mutex);
    int64_t n = 0;
    for (auto& kv : g_entries) {
      n += kv.second->count.load();
    }
    return n;
  });
  m.def("to_cpu", [](const at::Tensor& t) {
    TORCH_CHECK(is_npu(t), "to_cpu expects an npu tensor");
    return to_cpu_alias(t, nullptr);
  }, "A CPU tensor over the same memory as the npu tensor (no copy).");
  m.def("to_npu", [](const at::Tensor& c) {
    TORCH_CHECK(c.device().type() == c10::kCPU, "to_npu expects a CPU tensor");
    AliasMap seen;
    return to_npu(c, seen);
  }, "An npu tensor over the same memory as the CPU tensor (no copy).");
  m.def("rms_norm", &rms_norm, "npu_rms_norm on npu tensors (see fused_ops.npu_rms_norm).");
  m.def("rotary_mul_half", &rotary_mul_half, "npu_rotary_mul, rotary_mode='half' (see fused_ops).");
  m.def("fusion_attention_bnsd", &fusion_attention_bnsd,
        "npu_fusion_attention, BNSD, no mask or dropout: (out, softmax_max, softmax_sum, softmax_out).");
  m.def("memory_allocated", []() { return g_bytes.load(); });
  m.def("max_memory_allocated", []() { return g_peak.load(); });
  m.def("reset_peak", []() { g_peak.store(g_bytes.load()); });
}
