#pragma once
// QueueHost / RemoteQueue: machin's SimpleQueue (push::parallel::SimpleQueue) hosted by one
// member of an RpcGroup and used by all of them, carrying c10::IValues.
//
//   push::server::QueueHost host(rpc, "jobs");              // on one member
//   push::server::RemoteQueue jobs(rpc, "jobs");            // on any member
//   jobs.put(torch::ones(3));  auto item = jobs.get(std::chrono::seconds(1));
//
// A get waiting on the host suspends an RPC handler fiber there, not a thread; values come
// out in the order they went in, and waiting gets are served in the order they started.
#include <push/dist/rpc.h>
#include <push/parallel/queue.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace push::server {

/// Hosts the queue `name` on this member of `group` until destruction (services
/// "<name>/put", "<name>/get", "<name>/size", "<name>/close"). A get waiting on the host is
/// a suspended RPC handler fiber, not a thread.
class QueueHost {
 public:
  QueueHost(dist::RpcGroup group, std::string name);
  ~QueueHost() { queue_->close(); }  // gets waiting on the host fail instead of waiting on
  QueueHost(const QueueHost&) = delete;
  QueueHost& operator=(const QueueHost&) = delete;
  parallel::SimpleQueue<c10::IValue>& queue() { return *queue_; }

 private:
  std::shared_ptr<parallel::SimpleQueue<c10::IValue>> queue_;
  dist::ServiceSet services_;
};

/// Any member's handle on the queue `name` of `group`. Values are copies (tensors arrive
/// as CPU tensors). A get's timeout is its wait on the host; the call itself gives up a
/// minute after that (a host that died fails it at once). A value the host hands to a get
/// whose caller died meanwhile is lost with it.
class RemoteQueue {
 public:
  RemoteQueue(dist::RpcGroup group, std::string name);
  void put(c10::IValue value) const;
  std::optional<c10::IValue> get(std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) const;
  size_t size() const;
  bool empty() const { return size() == 0; }
  void close() const;

 private:
  c10::IValue call(const std::string& op, dist::RpcArgs args,
                   std::optional<dist::Milliseconds> timeout = std::nullopt) const;
  dist::RpcGroup group_;
  std::string name_;
};

}  // namespace push::server
