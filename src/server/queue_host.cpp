// The queue of one member, served to the others.
#include <push/server/queue_host.h>

namespace push::server {
namespace {
constexpr const char* kQueueHost = "push::server::QueueHost";
constexpr const char* kQueueClient = "push::server::RemoteQueue";
}  // namespace

QueueHost::QueueHost(dist::RpcGroup group, std::string name)
    : queue_(std::make_shared<parallel::SimpleQueue<c10::IValue>>()), services_(std::move(group)) {
  PUSH_CHECK(!name.empty(), kQueueHost, "the queue needs a name");
  auto q = queue_;
  services_.add(name + "/put", [q](const dist::RpcArgs& a) {
    q->put(a.at(0));
    return c10::IValue();
  });
  services_.add(name + "/get", [q](const dist::RpcArgs& a) {
    auto v = q->get(std::chrono::milliseconds(a.at(0).toInt()));
    // (found, value): a queued None is a value too.
    return c10::IValue(c10::ivalue::Tuple::create({v.has_value(), v.value_or(c10::IValue())}));
  });
  services_.add(name + "/size", [q](const dist::RpcArgs&) { return c10::IValue(static_cast<int64_t>(q->size())); });
  services_.add(name + "/close", [q](const dist::RpcArgs&) {
    q->close();
    return c10::IValue();
  });
}

RemoteQueue::RemoteQueue(dist::RpcGroup group, std::string name) : group_(std::move(group)), name_(std::move(name)) {
  PUSH_CHECK(!name_.empty(), kQueueClient, "the queue needs a name");
}

c10::IValue RemoteQueue::call(const std::string& op, dist::RpcArgs args,
                              std::optional<dist::Milliseconds> timeout) const {
  try {
    return group_.registered_sync(name_ + "/" + op, std::move(args), timeout);
  } catch (const dist::RemoteError& e) {
    throw Error(c10::str("[", kQueueClient, "] ", op, " on queue '", name_, "': ", e.remote_message()));
  } catch (const std::exception& e) {
    throw Error(c10::str("[", kQueueClient, "] ", op, " on queue '", name_, "': ", e.what()));
  }
}

void RemoteQueue::put(c10::IValue value) const { call("put", {std::move(value)}); }

std::optional<c10::IValue> RemoteQueue::get(std::chrono::milliseconds timeout) const {
  // The host waits `timeout`; the call waits that long plus the group's own timeout.
  const dist::Milliseconds grace = std::chrono::seconds(60);
  const dist::Milliseconds deadline =
      timeout >= dist::Milliseconds::max() - grace ? dist::Milliseconds::max() : timeout + grace;
  auto reply = call("get", {static_cast<int64_t>(timeout.count())}, deadline);
  const auto& t = reply.toTupleRef().elements();
  if (!t.at(0).toBool()) return std::nullopt;
  return t.at(1);
}

size_t RemoteQueue::size() const { return static_cast<size_t>(call("size", {}).toInt()); }

void RemoteQueue::close() const { call("close", {}); }

}  // namespace push::server
