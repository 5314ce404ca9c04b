#include "dist/transport/wire.h"

#include "dist/transport/receive_pool.h"

#include <push/core/errors.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <limits>
#include "dist/transport/rpc_origin.h"

namespace push::dist::detail::wire {
namespace {

enum Tag : uint8_t {
  kNone = 0,
  kBool = 1,
  kInt = 2,
  kDouble = 3,
  kString = 4,
  kTensor = 5,
  kTuple = 6,
  kList = 7,
  kDict = 8,
  kComplex = 9,
};
// Element kinds of lists and dicts: the static type a receiver rebuilds.
enum Kind : uint8_t { kAny = 0, kBoolKind = 1, kIntKind = 2, kDoubleKind = 3, kStringKind = 4, kTensorKind = 5 };
constexpr uint32_t kUndefinedTensor = std::numeric_limits<uint32_t>::max();

template <typename T>
void put(std::vector<char>& out, T v) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

uint32_t checked_count(std::size_t n, const char* what) {
  PUSH_CHECK(n <= std::numeric_limits<uint32_t>::max(), kRpcOrigin, "cannot send a ", what, " of ", n,
             " elements (at most 2^32-1)");
  return static_cast<uint32_t>(n);
}

Kind kind_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::BoolType:
      return kBoolKind;
    case c10::TypeKind::IntType:
      return kIntKind;
    case c10::TypeKind::FloatType:
      return kDoubleKind;
    case c10::TypeKind::StringType:
      return kStringKind;
    case c10::TypeKind::TensorType:
      return kTensorKind;
    default:
      return kAny;
  }
}

c10::TypePtr type_of(Kind kind) {
  switch (kind) {
    case kBoolKind:
      return c10::BoolType::get();
    case kIntKind:
      return c10::IntType::get();
    case kDoubleKind:
      return c10::FloatType::get();
    case kStringKind:
      return c10::StringType::get();
    case kTensorKind:
      return c10::TensorType::get();
    default:
      return c10::AnyType::get();
  }
}

bool matches(Kind kind, const c10::IValue& v) {
  switch (kind) {
    case kBoolKind:
      return v.isBool();
    case kIntKind:
      return v.isInt();
    case kDoubleKind:
      return v.isDouble();
    case kStringKind:
      return v.isString();
    case kTensorKind:
      return v.isTensor();
    default:
      return true;
  }
}

struct Writer {
  std::vector<char> out;
  std::vector<at::Tensor> tensors;

  void value(const c10::IValue& v, int depth) {
    PUSH_CHECK(depth < kMaxDepth, kRpcOrigin, "cannot send a value nested deeper than ", kMaxDepth);
    if (v.isNone()) {
      put<uint8_t>(out, kNone);
    } else if (v.isBool()) {
      put<uint8_t>(out, kBool);
      put<uint8_t>(out, v.toBool() ? 1 : 0);
    } else if (v.isInt()) {
      put<uint8_t>(out, kInt);
      put<int64_t>(out, v.toInt());
    } else if (v.isDouble()) {
      put<uint8_t>(out, kDouble);
      put<double>(out, v.toDouble());
    } else if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      put<uint8_t>(out, kComplex);
      put<double>(out, c.real());
      put<double>(out, c.imag());
    } else if (v.isString()) {
      const auto& s = v.toStringRef();
      put<uint8_t>(out, kString);
      put<uint32_t>(out, checked_count(s.size(), "string"));
      out.insert(out.end(), s.begin(), s.end());
    } else if (v.isTensor()) {
      put<uint8_t>(out, kTensor);
      put<uint32_t>(out, tensor(v.toTensor()));
    } else if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      put<uint8_t>(out, kTuple);
      put<uint32_t>(out, checked_count(elements.size(), "tuple"));
      for (const auto& e : elements) value(e, depth + 1);
    } else if (v.isList()) {
      const auto list = v.toList();
      put<uint8_t>(out, kList);
      put<uint8_t>(out, kind_of(list.elementType()));
      put<uint32_t>(out, checked_count(list.size(), "list"));
      for (std::size_t i = 0; i < list.size(); ++i) value(list.get(i), depth + 1);
    } else if (v.isGenericDict()) {
      const auto dict = v.toGenericDict();
      put<uint8_t>(out, kDict);
      put<uint8_t>(out, kind_of(dict.keyType()));
      put<uint8_t>(out, kind_of(dict.valueType()));
      put<uint32_t>(out, checked_count(dict.size(), "dict"));
      for (const auto& entry : dict) {
        value(entry.key(), depth + 1);
        value(entry.value(), depth + 1);
      }
    } else {
      throw Error(c10::str("[", kRpcOrigin, "] cannot send a value of type ", v.tagKind(),
                           " (send None, bools, numbers, strings, tensors, and tuples, lists "
                           "and dicts of them)"));
    }
  }

  uint32_t tensor(const at::Tensor& t) {
    if (!t.defined()) return kUndefinedTensor;
    PUSH_CHECK(t.layout() == at::kStrided && !t.is_quantized(), kRpcOrigin, "cannot send a tensor with layout ",
               t.layout(), " (only dense tensors)");
    // Bytes go straight from the storage: a view sends only its own elements.
    at::Tensor dense = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
    tensors.push_back(dense.detach());
    return checked_count(tensors.size() - 1, "tensor table");
  }
};

bool sendable_dtype(int8_t code) {
  switch (static_cast<at::ScalarType>(code)) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kBool:
    case at::kBFloat16:
      return true;
    default:
      return false;
  }
}

struct Reader {
  const char* p;
  const char* end;
  const std::vector<at::Tensor>* tensors = nullptr;

  template <typename T>
  T get(const char* what) {
    PUSH_CHECK(static_cast<std::size_t>(end - p) >= sizeof(T), kRpcOrigin, "malformed message: truncated ", what);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }

  c10::IValue value(int depth) {
    PUSH_CHECK(depth < kMaxDepth, kRpcOrigin, "malformed message: nested deeper than ", kMaxDepth);
    const auto tag = get<uint8_t>("value tag");
    switch (tag) {
      case kNone:
        return c10::IValue();
      case kBool:
        return c10::IValue(get<uint8_t>("bool") != 0);
      case kInt:
        return c10::IValue(get<int64_t>("int"));
      case kDouble:
        return c10::IValue(get<double>("double"));
      case kComplex: {
        const double re = get<double>("complex");
        const double im = get<double>("complex");
        return c10::IValue(c10::complex<double>(re, im));
      }
      case kString: {
        const auto n = get<uint32_t>("string length");
        PUSH_CHECK(static_cast<std::size_t>(end - p) >= n, kRpcOrigin, "malformed message: a string of ", n,
                   " bytes overruns the message");
        std::string s(p, n);
        p += n;
        return c10::IValue(std::move(s));
      }
      case kTensor: {
        const auto index = get<uint32_t>("tensor index");
        if (index == kUndefinedTensor) return c10::IValue(at::Tensor());
        PUSH_CHECK(index < tensors->size(), kRpcOrigin, "malformed message: tensor ", index, " of a table of ",
                   tensors->size());
        return c10::IValue((*tensors)[index]);
      }
      case kTuple: {
        const auto n = count("tuple");
        std::vector<c10::IValue> elements;
        elements.reserve(n);
        for (uint32_t i = 0; i < n; ++i) elements.push_back(value(depth + 1));
        return c10::IValue(c10::ivalue::Tuple::create(std::move(elements)));
      }
      case kList: {
        const auto kind = element_kind("list");
        const auto n = count("list");
        c10::impl::GenericList list(type_of(kind));
        list.reserve(n);
        for (uint32_t i = 0; i < n; ++i) list.push_back(element(kind, depth, "list"));
        return c10::IValue(list);
      }
      case kDict: {
        const auto key_kind = element_kind("dict key");
        PUSH_CHECK(key_kind != kAny && key_kind != kTensorKind, kRpcOrigin,
                   "malformed message: a dict needs keys of one hashable type");
        const auto value_kind = element_kind("dict value");
        const auto n = count("dict");
        c10::impl::GenericDict dict(type_of(key_kind), type_of(value_kind));
        for (uint32_t i = 0; i < n; ++i) {
          auto k = element(key_kind, depth, "dict key");
          auto v = element(value_kind, depth, "dict value");
          dict.insert_or_assign(std::move(k), std::move(v));
        }
        return c10::IValue(dict);
      }
      default:
        throw Error(c10::str("[", kRpcOrigin, "] malformed message: unknown value tag ", static_cast<int>(tag)));
    }
  }

  uint32_t count(const char* what) {
    const auto n = get<uint32_t>(what);
    // Every element takes at least one byte: a count beyond the bytes left is a lie.
    PUSH_CHECK(n <= static_cast<std::size_t>(end - p), kRpcOrigin, "malformed message: a ", what, " of ", n,
               " elements in ", end - p, " bytes");
    return n;
  }
  Kind element_kind(const char* what) {
    const auto k = get<uint8_t>(what);
    PUSH_CHECK(k <= kTensorKind, kRpcOrigin, "malformed message: unknown ", what, " type ", static_cast<int>(k));
    return static_cast<Kind>(k);
  }
  c10::IValue element(Kind kind, int depth, const char* what) {
    auto v = value(depth + 1);
    PUSH_CHECK(matches(kind, v), kRpcOrigin, "malformed message: a ", what, " of type ", v.tagKind(),
               " in a container of ", type_of(kind)->str());
    return v;
  }
};

}  // namespace

bool is_request(uint16_t t) { return t >= kCall && t <= kFetchPaired; }
bool is_reply(uint16_t t) { return t == kReplyOk || t == kReplyError; }
bool is_handshake(uint16_t t) { return t == kHello || t == kChallenge || t == kProof; }
bool is_known(uint16_t t) { return is_handshake(t) || t == kRing || t == kHeartbeat || is_request(t) || is_reply(t); }

void write_header(const Header& h, char* out) {
  std::memcpy(out, &kMagic, 4);
  std::memcpy(out + 4, &h.type, 2);
  std::memcpy(out + 6, &h.flags, 2);
  std::memcpy(out + 8, &h.id, 8);
  std::memcpy(out + 16, &h.meta_bytes, 4);
  std::memcpy(out + 20, &h.tensor_count, 4);
  std::memcpy(out + 24, &h.data_bytes, 8);
}

Header read_header(const char* in, uint64_t max_bytes) {
  uint32_t magic;
  std::memcpy(&magic, in, 4);
  PUSH_CHECK(magic == kMagic, kRpcOrigin, "malformed frame: bad magic 0x", std::hex, magic,
             " (not a push RPC peer, or the stream lost its place)");
  Header h;
  std::memcpy(&h.type, in + 4, 2);
  std::memcpy(&h.flags, in + 6, 2);
  std::memcpy(&h.id, in + 8, 8);
  std::memcpy(&h.meta_bytes, in + 16, 4);
  std::memcpy(&h.tensor_count, in + 20, 4);
  std::memcpy(&h.data_bytes, in + 24, 8);
  PUSH_CHECK(is_known(h.type), kRpcOrigin, "malformed frame: unknown message type ", h.type);
  PUSH_CHECK(h.meta_bytes <= max_bytes && h.data_bytes <= max_bytes - h.meta_bytes, kRpcOrigin, "frame of ",
             h.meta_bytes, " + ", h.data_bytes, " bytes is over the limit of ", max_bytes,
             " bytes (RpcGroupOptions::max_message_bytes)");
  // Each table entry takes at least 2 bytes of meta.
  PUSH_CHECK(h.tensor_count <= h.meta_bytes / 2, kRpcOrigin, "malformed frame: ", h.tensor_count,
             " tensors announced in ", h.meta_bytes, " bytes of meta");
  return h;
}

Encoded encode(const c10::IValue& value) {
  Writer w;
  w.value(value, 0);
  Encoded e;
  put<uint32_t>(e.meta, checked_count(w.tensors.size(), "tensor table"));
  for (const auto& t : w.tensors) {
    PUSH_CHECK(t.dim() <= kMaxDims, kRpcOrigin, "cannot send a tensor of ", t.dim(), " dimensions");
    put<int8_t>(e.meta, static_cast<int8_t>(t.scalar_type()));
    put<uint8_t>(e.meta, static_cast<uint8_t>(t.dim()));
    for (auto s : t.sizes()) put<int64_t>(e.meta, s);
    e.data_bytes += t.nbytes();
  }
  e.meta.insert(e.meta.end(), w.out.begin(), w.out.end());
  e.tensors = std::move(w.tensors);
  return e;
}

namespace {
// The table's entries, checked; the reader stops after the table.
Reader table_reader(const std::vector<char>& meta) { return Reader{meta.data(), meta.data() + meta.size()}; }
}  // namespace

std::vector<at::Tensor> read_tensor_table(const std::vector<char>& meta, const Header& header, ReceivePool* pool) {
  Reader r = table_reader(meta);
  const auto n = r.get<uint32_t>("tensor table");
  PUSH_CHECK(n == header.tensor_count, kRpcOrigin, "malformed message: a table of ", n,
             " tensors where the header announced ", header.tensor_count);
  std::vector<at::Tensor> tensors;
  tensors.reserve(n);
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const auto dtype = r.get<int8_t>("tensor dtype");
    PUSH_CHECK(sendable_dtype(dtype), kRpcOrigin, "malformed message: tensor ", i, " has unknown dtype code ",
               static_cast<int>(dtype));
    const auto dims = r.get<uint8_t>("tensor rank");
    PUSH_CHECK(dims <= kMaxDims, kRpcOrigin, "malformed message: tensor ", i, " has ", static_cast<int>(dims),
               " dimensions");
    std::vector<int64_t> sizes(dims);
    const auto itemsize = static_cast<uint64_t>(c10::elementSize(static_cast<at::ScalarType>(dtype)));
    uint64_t bytes = itemsize;
    for (auto& s : sizes) {
      s = r.get<int64_t>("tensor size");
      PUSH_CHECK(s >= 0, kRpcOrigin, "malformed message: tensor ", i, " has size ", s);
      const auto u = static_cast<uint64_t>(s);
      PUSH_CHECK(u == 0 || bytes <= header.data_bytes / u, kRpcOrigin, "malformed message: tensor ", i,
                 " is larger than the ", header.data_bytes, " data bytes announced");
      bytes *= u;
    }
    total += bytes;
    PUSH_CHECK(total <= header.data_bytes, kRpcOrigin, "malformed message: its tensors need more than the ",
               header.data_bytes, " data bytes announced");
    const auto type = static_cast<at::ScalarType>(dtype);
    tensors.push_back(pool != nullptr ? pool->empty(sizes, type) : at::empty(sizes, at::TensorOptions().dtype(type)));
  }
  PUSH_CHECK(total == header.data_bytes, kRpcOrigin, "malformed message: its tensors need ", total,
             " bytes where the header announced ", header.data_bytes);
  return tensors;
}

c10::IValue decode(const std::vector<char>& meta, const std::vector<at::Tensor>& tensors) {
  Reader r = table_reader(meta);
  const auto n = r.get<uint32_t>("tensor table");
  PUSH_CHECK(n == tensors.size(), kRpcOrigin, "malformed message: tensor table mismatch");
  for (uint32_t i = 0; i < n; ++i) {
    r.get<int8_t>("tensor dtype");
    const auto dims = r.get<uint8_t>("tensor rank");
    for (uint8_t d = 0; d < dims; ++d) r.get<int64_t>("tensor size");
  }
  r.tensors = &tensors;
  auto value = r.value(0);
  PUSH_CHECK(r.p == r.end, kRpcOrigin, "malformed message: ", r.end - r.p, " bytes left over after the value");
  return value;
}

c10::IValue copy_value(const c10::IValue& value) {
  auto e = encode(value);
  std::vector<at::Tensor> copies;
  copies.reserve(e.tensors.size());
  for (const auto& t : e.tensors) copies.push_back(t.clone());
  return decode(e.meta, copies);
}

}  // namespace push::dist::detail::wire
