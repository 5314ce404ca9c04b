#include "runtime/peer_messages.h"

#include <push/core/errors.h>

#include <torch/torch.h>

namespace push::detail {
namespace {

constexpr const char* kOrigin = "push::Push";

[[noreturn]] void malformed(const char* what) {
  throw Error(c10::str("[", kOrigin, "] a malformed ", what, " from another rank"));
}

c10::IValue list_of(std::vector<torch::Tensor> tensors) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (auto& t : tensors) out.push_back(t.defined() ? c10::IValue(std::move(t)) : c10::IValue());
  return out;
}

c10::IValue list_of(std::vector<std::string> strings) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (auto& s : strings) out.push_back(c10::IValue(std::move(s)));
  return out;
}

/// The tensors (undefined for None) of `v`, a list of tensors and Nones, on `device`.
std::vector<torch::Tensor> tensors_of(const c10::IValue& v, const torch::Device& device, const char* what) {
  if (!v.isList()) malformed(what);
  std::vector<torch::Tensor> out;
  for (const auto& item : v.toListRef()) {
    if (!item.isTensor() && !item.isNone()) malformed(what);
    out.push_back(item.isTensor() ? item.toTensor().to(device) : torch::Tensor());
  }
  return out;
}

std::vector<std::string> strings_of(const c10::IValue& v, const char* what) {
  if (!v.isList()) malformed(what);
  std::vector<std::string> out;
  for (const auto& item : v.toListRef()) {
    if (!item.isString()) malformed(what);
    out.push_back(item.toStringRef());
  }
  return out;
}

}  // namespace

// A request travels as (distribution, op, fields of the op...):
//   send        pid, message, [args]
//   view        pid, known version
//   parameters  pid
//   gather      round, from, call, value
dist::RpcArgs PeerRequest::encode() && {
  dist::RpcArgs out{c10::IValue(std::move(distribution)), c10::IValue(static_cast<int64_t>(op))};
  switch (op) {
    case PeerOp::send: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (auto& a : args) list.push_back(std::move(a));
      out.insert(out.end(), {c10::IValue(pid), c10::IValue(std::move(message)), c10::IValue(std::move(list))});
      break;
    }
    case PeerOp::view:
      out.insert(out.end(), {c10::IValue(pid), c10::IValue(static_cast<int64_t>(known_version))});
      break;
    case PeerOp::parameters:
      out.emplace_back(pid);
      break;
    case PeerOp::gather:
      out.insert(out.end(), {c10::IValue(round), c10::IValue(static_cast<int64_t>(from)), c10::IValue(std::move(call)),
                             std::move(value)});
      break;
  }
  return out;
}

PeerRequest PeerRequest::decode(const dist::RpcArgs& body) {
  constexpr const char* what = "request";
  if (body.size() < 2 || !body[0].isString() || !body[1].isInt()) malformed(what);
  PeerRequest r;
  r.distribution = body[0].toStringRef();
  r.op = static_cast<PeerOp>(body[1].toInt());
  auto fields = [&](std::size_t n) {
    if (body.size() != 2 + n) malformed(what);
  };
  switch (r.op) {
    case PeerOp::send:
      fields(3);
      if (!body[2].isInt() || !body[3].isString() || !body[4].isList()) malformed("message");
      r.pid = body[2].toInt();
      r.message = body[3].toStringRef();
      r.args = body[4].toListRef().vec();
      return r;
    case PeerOp::view:
      fields(2);
      if (!body[2].isInt() || !body[3].isInt()) malformed("view request");
      r.pid = body[2].toInt();
      r.known_version = static_cast<uint64_t>(body[3].toInt());
      return r;
    case PeerOp::parameters:
      fields(1);
      if (!body[2].isInt()) malformed("parameters request");
      r.pid = body[2].toInt();
      return r;
    case PeerOp::gather:
      fields(4);
      if (!body[2].isInt() || !body[3].isInt() || !body[4].isString()) malformed("gather");
      r.round = body[2].toInt();
      r.from = static_cast<int>(body[3].toInt());
      r.call = body[4].toStringRef();
      r.value = body[5];
      return r;
  }
  throw Error(c10::str("[", kOrigin, "] an unknown request (", body[1].toInt(), ") from another rank"));
}

// A view travels as (version) when current, else (version, names, parameters, gradients, buffers).
c10::IValue ViewReply::encode() && {
  const auto v = c10::IValue(static_cast<int64_t>(version));
  if (current) return c10::ivalue::Tuple::create({v});
  return c10::ivalue::Tuple::create({v, list_of(std::move(names)), list_of(std::move(parameters)),
                                     list_of(std::move(gradients)), list_of(std::move(buffers))});
}

ViewReply ViewReply::decode(const c10::IValue& reply, const torch::Device& device) {
  constexpr const char* what = "view";
  if (!reply.isTuple()) malformed(what);
  const auto& items = reply.toTupleRef().elements();
  if ((items.size() != 1 && items.size() != 5) || !items[0].isInt()) malformed(what);
  ViewReply r;
  r.version = static_cast<uint64_t>(items[0].toInt());
  r.current = items.size() == 1;
  if (r.current) return r;
  r.names = strings_of(items[1], what);
  r.parameters = tensors_of(items[2], device, what);
  r.gradients = tensors_of(items[3], device, what);
  r.buffers = tensors_of(items[4], device, what);
  if (r.parameters.size() != r.names.size() || r.gradients.size() != r.names.size()) malformed(what);
  return r;
}

c10::IValue ParametersReply::encode() && {
  return c10::ivalue::Tuple::create({list_of(std::move(names)), list_of(std::move(parameters))});
}

ParametersReply ParametersReply::decode(const c10::IValue& reply) {
  constexpr const char* what = "parameters reply";
  if (!reply.isTuple() || reply.toTupleRef().elements().size() != 2) malformed(what);
  const auto& items = reply.toTupleRef().elements();
  ParametersReply r;
  r.names = strings_of(items[0], what);
  r.parameters = tensors_of(items[1], torch::kCPU, what);
  if (r.parameters.size() != r.names.size()) malformed(what);
  return r;
}

}  // namespace push::detail
