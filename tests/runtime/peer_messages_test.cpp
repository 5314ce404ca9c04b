// The messages between the ranks of one distribution (src/runtime/peer_messages.h): each
// request and reply round-trips through its one encoding, and what another rank sends
// that does not decode is refused by name before anything acts on it.
#include <gtest/gtest.h>

#include <test_util.h>

#include <torch/torch.h>

#include "runtime/peer_messages.h"

using push::detail::ParametersReply;
using push::detail::PeerOp;
using push::detail::PeerRequest;
using push::detail::ViewReply;

namespace {

PeerRequest request_of(PeerOp op) {
  PeerRequest r;
  r.distribution = "push/3";
  r.op = op;
  r.pid = 17;
  r.message = "step";
  r.args = {c10::IValue(torch::ones({2})), c10::IValue(int64_t{5})};
  r.known_version = 9;
  r.round = 4;
  r.from = 2;
  r.call = "save";
  r.value = c10::IValue(std::string("v"));
  return r;
}

}  // namespace

TEST(PeerMessages, EveryRequestRoundTripsThroughItsOneEncoding) {
  for (const PeerOp op : {PeerOp::send, PeerOp::view, PeerOp::parameters, PeerOp::gather}) {
    PeerRequest sent = request_of(op);
    const PeerRequest got = PeerRequest::decode(PeerRequest(sent).encode());
    EXPECT_EQ(got.distribution, "push/3");
    EXPECT_EQ(got.op, op);
    switch (op) {
      case PeerOp::send:
        EXPECT_EQ(got.pid, 17);
        EXPECT_EQ(got.message, "step");
        ASSERT_EQ(got.args.size(), 2u);
        EXPECT_TRUE(torch::equal(got.args[0].toTensor(), torch::ones({2})));
        EXPECT_EQ(got.args[1].toInt(), 5);
        break;
      case PeerOp::view:
        EXPECT_EQ(got.pid, 17);
        EXPECT_EQ(got.known_version, 9u);
        break;
      case PeerOp::parameters:
        EXPECT_EQ(got.pid, 17);
        break;
      case PeerOp::gather:
        EXPECT_EQ(got.round, 4);
        EXPECT_EQ(got.from, 2);
        EXPECT_EQ(got.call, "save");
        EXPECT_EQ(got.value.toStringRef(), "v");
        break;
    }
  }
}

TEST(PeerMessages, ARequestThatDoesNotDecodeIsRefusedByName) {
  using push::dist::RpcArgs;
  const c10::IValue name("push/0");
  auto op = [](PeerOp o) { return c10::IValue(static_cast<int64_t>(o)); };
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{}), "a malformed request from another rank");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{c10::IValue(int64_t{1}), op(PeerOp::send)}), "a malformed request");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, c10::IValue(int64_t{99})}), "an unknown request (99)");
  // Each op: one field too few, and a field of the wrong type.
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, op(PeerOp::send), c10::IValue(int64_t{1})}),
                    "a malformed request");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, op(PeerOp::send), c10::IValue(int64_t{1}), c10::IValue("m"),
                                                c10::IValue(int64_t{0})}),
                    "a malformed message");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, op(PeerOp::view), c10::IValue(int64_t{1}), c10::IValue("9")}),
                    "a malformed view request");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, op(PeerOp::parameters), c10::IValue(1.5)}),
                    "a malformed parameters request");
  EXPECT_PUSH_ERROR(PeerRequest::decode(RpcArgs{name, op(PeerOp::gather), c10::IValue(int64_t{0}),
                                                c10::IValue(int64_t{1}), c10::IValue(int64_t{2}), c10::IValue()}),
                    "a malformed gather");
}

TEST(PeerMessages, RepliesRoundTripAndAMalformedOneIsRefused) {
  ViewReply view;
  view.version = 3;
  view.names = {"w", "b"};
  view.parameters = {torch::ones({2, 2}), torch::zeros({2})};
  view.gradients = {torch::full({2, 2}, 0.5), torch::Tensor()};  // b has no gradient
  view.buffers = {torch::arange(3)};
  const ViewReply got = ViewReply::decode(ViewReply(view).encode(), torch::kCPU);
  EXPECT_FALSE(got.current);
  EXPECT_EQ(got.version, 3u);
  EXPECT_EQ(got.names, view.names);
  EXPECT_TRUE(torch::equal(got.parameters[0], view.parameters[0]));
  EXPECT_TRUE(torch::equal(got.gradients[0], view.gradients[0]));
  EXPECT_FALSE(got.gradients[1].defined());
  EXPECT_TRUE(torch::equal(got.buffers[0], view.buffers[0]));
  ViewReply current;
  current.version = 7;
  current.current = true;
  const ViewReply unchanged = ViewReply::decode(std::move(current).encode(), torch::kCPU);
  EXPECT_TRUE(unchanged.current);
  EXPECT_EQ(unchanged.version, 7u);
  EXPECT_TRUE(unchanged.parameters.empty());
  EXPECT_PUSH_ERROR(ViewReply::decode(c10::IValue(int64_t{1}), torch::kCPU), "a malformed view");
  EXPECT_PUSH_ERROR(
      ViewReply::decode(c10::ivalue::Tuple::create({c10::IValue(int64_t{1}), c10::IValue()}), torch::kCPU),
      "a malformed view");

  ParametersReply parameters;
  parameters.names = {"w"};
  parameters.parameters = {torch::ones({3})};
  const ParametersReply back = ParametersReply::decode(ParametersReply(parameters).encode());
  EXPECT_EQ(back.names, parameters.names);
  EXPECT_TRUE(torch::equal(back.parameters[0], parameters.parameters[0]));
  EXPECT_PUSH_ERROR(ParametersReply::decode(c10::ivalue::Tuple::create({c10::IValue(), c10::IValue()})),
                    "a malformed parameters reply");
}
