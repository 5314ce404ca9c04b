#include "runtime/message_values.h"

#include <torch/torch.h>

#include <unordered_set>

namespace push::detail {

// `value` with `fn` applied to every tensor in it (lists, tuples and dicts rebuilt).
c10::IValue map_tensors(const c10::IValue& value, const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  if (value.isTensor()) return fn(value.toTensor());
  if (value.isTensorList()) {
    c10::List<torch::Tensor> out;
    for (const torch::Tensor& t : value.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (value.isList()) {
    auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& v : list) out.push_back(map_tensors(v, fn));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& v : value.toTupleRef().elements()) elements.push_back(map_tensors(v, fn));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) out.insert(entry.key(), map_tensors(entry.value(), fn));
    return out;
  }
  return value;
}

// Whether `pred` holds for some defined tensor in `value`.
bool any_tensor(const c10::IValue& value, const std::function<bool(const torch::Tensor&)>& pred) {
  if (value.isTensor()) return value.toTensor().defined() && pred(value.toTensor());
  if (value.isTensorList()) {
    for (const torch::Tensor& t : value.toTensorList()) {
      if (t.defined() && pred(t)) return true;
    }
    return false;
  }
  if (value.isList()) {
    for (const c10::IValue& v : value.toList()) {
      if (any_tensor(v, pred)) return true;
    }
    return false;
  }
  if (value.isTuple()) {
    for (const auto& v : value.toTupleRef().elements()) {
      if (any_tensor(v, pred)) return true;
    }
    return false;
  }
  if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      if (any_tensor(entry.value(), pred)) return true;
    }
  }
  return false;
}

torch::Tensor to_device(const torch::Tensor& t, const torch::Device& device) {
  return t.defined() && t.device() != device ? t.to(device) : t;
}

// Tensors in a message are moved to the receiver's device (a no-op when already there).
c10::IValue to_device(const c10::IValue& value, const torch::Device& device) {
  return map_tensors(value, [&](const torch::Tensor& t) { return to_device(t, device); });
}

bool has_tensor_off(const Args& args, const torch::Device& device) {
  for (const auto& a : args) {
    if (any_tensor(a, [&](const torch::Tensor& t) { return t.device() != device; })) return true;
  }
  return false;
}

// Messages and results are values. A tensor that shares storage with a particle
// resident on this lane (its parameters, buffers, gradients or optimizer state: what a
// handler can reach of its own particle) would change when that particle trains and
// become empty when it is evicted, so it is copied here, at send or return time; any
// other tensor is passed by reference. Only the lane that owns a particle can reach its
// live tensors, so the sending lane is the one to ask.
//
// Listing the resident particles' storages costs a walk over every particle of the lane,
// so it is skipped when the values can share nothing with anyone: when each is a tensor
// (or holds none) and every holder of each tensor, and of each tensor's storage, is one
// of the values themselves (a fresh result: the common case). A particle's own tensor has
// its module, optimizer or autograd as another holder, and a view of one has the
// particle's tensor (or the view's base) as another holder of its storage. Only values
// that are tensors themselves are counted: a list, tuple or dict may appear several times
// and hold its tensor once, so values with one always take the full check. A lane of N
// particles answering N messages with fresh tensors costs O(N), not O(N^2).
static bool held_only_by_themselves(const std::vector<c10::IValue>& values) {
  // A message has a handful of values: linear scans, nothing allocated per message.
  auto stored = [](const c10::IValue& v) {
    return v.isTensor() && v.toTensor().defined() && v.toTensor().has_storage();
  };
  for (const auto& v : values) {
    if (!v.isTensor() && any_tensor(v, [](const torch::Tensor&) { return true; })) return false;
  }
  for (const auto& v : values) {
    if (!stored(v)) continue;
    const torch::Tensor& t = v.toTensor();
    size_t same_impl = 0, impls_on_storage = 0;  // values that are t; distinct TensorImpls sharing its storage
    for (size_t i = 0; i < values.size(); ++i) {
      if (!stored(values[i])) continue;
      const torch::Tensor& u = values[i].toTensor();
      same_impl += u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
      if (u.storage().unsafeGetStorageImpl() != t.storage().unsafeGetStorageImpl()) continue;
      bool first = true;  // count each TensorImpl once
      for (size_t j = 0; j < i && first; ++j) {
        first = !(stored(values[j]) && values[j].toTensor().unsafeGetTensorImpl() == u.unsafeGetTensorImpl());
      }
      impls_on_storage += first;
    }
    if (t.use_count() > same_impl || t.storage().use_count() > impls_on_storage) return false;
  }
  return true;
}

void detach_from_particles(std::vector<c10::IValue>& values, const ParticleCache& cache) {
  auto has_storage = [](const torch::Tensor& t) { return t.has_storage(); };
  bool any = false;
  for (const auto& v : values) any = any || any_tensor(v, has_storage);
  if (!any || held_only_by_themselves(values)) return;
  const std::unordered_set<const void*> owned = cache.resident_storages();
  auto is_owned = [&](const torch::Tensor& t) {
    return t.has_storage() && owned.count(t.storage().unsafeGetStorageImpl()) > 0;
  };
  for (auto& v : values) {
    if (!any_tensor(v, is_owned)) continue;
    v = map_tensors(v, [&](const torch::Tensor& t) {
      if (!t.defined() || !is_owned(t)) return t;
      torch::NoGradGuard no_grad;
      return t.detach().clone();
    });
  }
}

}  // namespace push::detail
