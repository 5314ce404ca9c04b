// The gradient server: secondaries add pushed gradients up and forward the sums (bounded,
// with back-pressure); the primary adds the sums up, steps the managed model and publishes it.
#include <push/server/grad_server.h>

#include <push/core/errors.h>
#include <push/parallel/thread_pool.h>
#include <push/server/model_server.h>

#include <torch/torch.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "core/seed.h"
#include "core/torch_compat.h"

namespace push::server {
namespace {

constexpr const char* kGradHost = "push::server::GradServerHost";
constexpr const char* kGradClient = "push::server::GradServer";
// Waits on forwarded sums end when the primary answers or the call times out.
constexpr auto kForever = std::chrono::hours(24 * 365);

using Grads = std::map<std::string, at::Tensor>;

// The primary's own ordered server's name, and the model's key in any store.
std::string model_server(const std::string& name) { return name + "/model"; }
std::string info_service(const std::string& name) { return name + "/info"; }
std::string apply_service(const std::string& name) { return name + "/apply"; }
std::string step_service(const std::string& name) { return name + "/step"; }
std::string reduce_service(const std::string& name, const std::string& member) { return name + "/reduce/" + member; }
std::string flush_service(const std::string& name, const std::string& member) { return name + "/flush/" + member; }

Grads grads_of(const c10::IValue& value, const char* origin) {
  PUSH_CHECK(value.isGenericDict(), origin, "gradients must be a dict of tensors by parameter name");
  Grads out;
  for (const auto& e : value.toGenericDict()) out.emplace(e.key().toStringRef(), e.value().toTensor());
  return out;
}

c10::IValue to_ivalue(const Grads& grads) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, t] : grads) out.insert(name, t);
  return out;
}

// sum += add on `device`; names and shapes must agree.
void add_into(Grads& sum, const Grads& add, const torch::Device& device, const char* origin, const std::string& what) {
  if (sum.empty()) {
    // On the CPU in double: a float32 sum of many gradients would round where their mean
    // need not. A GPU's double throughput is a small fraction of its float's on most parts.
    for (const auto& [name, t] : add) {
      const auto type = device.is_cpu() ? torch::kFloat64 : t.scalar_type();
      sum.emplace(name, t.to(device, type, /*non_blocking=*/false, /*copy=*/true));
    }
    return;
  }
  PUSH_CHECK(add.size() == sum.size(), origin, what, " has ", add.size(), " gradients, earlier ones had ", sum.size());
  // Every name and shape first: a refused gradient leaves the sum as it was.
  for (const auto& [name, t] : add) {
    auto it = sum.find(name);
    PUSH_CHECK(it != sum.end(), origin, what, " has a gradient '", name, "' that earlier ones had not");
    PUSH_CHECK(it->second.sizes() == t.sizes(), origin, what, ": gradient '", name, "' has shape ", t.sizes(),
               ", earlier ones ", it->second.sizes());
  }
  for (const auto& [name, t] : add) sum.at(name).add_(t.to(device));
}

}  // namespace

// ---- primary ---------------------------------------------------------------------------

struct GradServerHost::Primary {
  std::string name;
  GradServerOptions options;
  std::vector<std::string> secondaries;
  std::shared_ptr<const OrderedServerBase> published;  // shared with the host: handlers may outlive it

  // Publishing is a call to the store (a round trip when it is another member's), so it is
  // never made under `mutex`: a handler waiting on it there would hold up every other one.
  // One thread makes the pushes, in step order; the first that fails is remembered here.
  struct PublishLog {
    std::mutex mutex;
    std::string failed;
  };
  std::shared_ptr<PublishLog> log = std::make_shared<PublishLog>();
  std::unique_ptr<parallel::ThreadPool> publisher = std::make_unique<parallel::ThreadPool>(1);
  Future<bool> last_publish = Future<bool>::ready(true);

  std::mutex mutex;
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  std::function<void()> after_step;
  Grads sum;
  int64_t count = 0, partials = 0, steps = 0, version = 0;
  bool closed = false;  // the host is gone: model and optimizer may be too

  // may_step false (a flush): the step waits for the flush's own call.
  void add(const Grads& partial, int64_t n, bool may_step) {
    std::lock_guard lock(mutex);
    PUSH_CHECK(!closed, kGradHost, "server '", name, "' is shutting down");
    throw_if_publish_failed();
    PUSH_CHECK(model != nullptr, kGradHost, "server '", name,
               "': no model is managed yet (call manage_model on the primary before clients push)");
    PUSH_CHECK(n > 0, kGradHost, "server '", name, "': a forwarded sum of ", n, " gradients");
    // The sum must hold exactly the trainable parameters: checked before anything changes.
    size_t trainable = 0;
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) continue;
      ++trainable;
      auto it = partial.find(item.key());
      PUSH_CHECK(it != partial.end(), kGradHost, "server '", name, "': no gradient for parameter '", item.key(), "'");
      PUSH_CHECK(it->second.sizes() == item.value().sizes(), kGradHost, "server '", name, "': gradient '", item.key(),
                 "' has shape ", it->second.sizes(), ", the parameter ", item.value().sizes());
    }
    PUSH_CHECK(partial.size() == trainable, kGradHost, "server '", name, "': ", partial.size() - trainable,
               " gradients are not of trainable parameters of the managed model");
    add_into(sum, partial, options.reduce_device(), kGradHost, "a forwarded sum");
    count += n;
    if (++partials >= options.reduce_batch_size() && may_step) step_locked();
  }

  // Sets the model's gradients to the sum (or mean over every gradient), steps, publishes.
  // The sum is taken first: whatever throws below, it is never stepped on twice.
  void step_locked() {
    if (count == 0 || closed) return;
    Grads taken;
    taken.swap(sum);
    const auto n = static_cast<double>(count);
    count = 0;
    partials = 0;
    {
      torch::NoGradGuard no_grad;
      for (auto& item : model->named_parameters(/*recurse=*/true)) {
        if (!item.value().requires_grad()) continue;
        const auto& total = taken.at(item.key());  // add() checked every name
        auto g = options.reduce_method() == ReduceMethod::mean ? total / n : total;
        item.value().mutable_grad() = g.to(item.value().device(), item.value().scalar_type());
      }
    }
    optimizer->step();
    ++steps;
    if (after_step) after_step();
    publish_locked();
  }

  // Queues the model's state (copied now) as the next version; last_publish completes once
  // it is stored.
  void publish_locked() {
    const int64_t v = ++version;
    last_publish =
        publisher->apply_async([store = published, log = log, key = model_server(name), state = state_of(*model), v] {
          std::string failed;
          try {
            const bool ok = store->push(key, state, v, v == 1 ? std::nullopt : std::optional<int64_t>(v - 1));
            if (!ok) failed = "the published model changed behind the primary";
          } catch (...) {
            failed = detail::describe(std::current_exception());
          }
          if (!failed.empty()) {
            std::lock_guard lock(log->mutex);
            if (log->failed.empty()) log->failed = c10::str("publishing version ", v, ": ", failed);
          }
          return failed.empty();
        });
  }

  void throw_if_publish_failed() {
    std::lock_guard lock(log->mutex);
    PUSH_CHECK(log->failed.empty(), kGradHost, "server '", name, "': ", log->failed);
  }

  // Outside `mutex`: waits until every version queued so far is stored (or failed).
  void wait_published(const Future<bool>& last) {
    last.wait_ready();
    throw_if_publish_failed();
  }
};

// ---- secondary -------------------------------------------------------------------------

struct GradServerHost::Secondary {
  dist::RpcGroup group;
  std::string name, member;
  GradServerOptions options;

  struct Flight {
    Future<c10::IValue> done;
    int64_t count;
  };
  std::mutex mutex;
  Grads sum;
  int64_t count = 0;           // gradients in sum
  int64_t held = 0;            // in sum or in flight
  std::deque<Flight> flights;  // forwarded, oldest first
  std::string lost;            // why a forwarded sum failed, until a client hears it

  // A sum on its way to the primary; its completion frees its room.
  struct Outgoing {
    std::shared_ptr<Promise<c10::IValue>> promise;
    c10::IValue body;
    int64_t count;
    bool may_step;
  };

  Outgoing take_locked(bool may_step) {
    Outgoing out{std::make_shared<Promise<c10::IValue>>(), to_ivalue(sum), count, may_step};
    flights.push_back({out.promise->future(), count});
    sum.clear();
    count = 0;
    return out;
  }

  // Outside the lock: a call may wait (a lookup of the primary), and a fiber must not wait
  // while it holds a mutex another fiber of its thread may want.
  void send(const Outgoing& out) {
    auto promise = out.promise;
    try {
      auto reply = group.registered_async(apply_service(name), {out.body, out.count, out.may_step});
      reply.on_complete([promise, reply] {
        if (auto error = reply.error()) {
          promise->set_error(error);
        } else {
          promise->set_value(reply.wait());
        }
      });
    } catch (...) {
      promise->set_error(std::current_exception());
    }
  }

  // Frees the room of forwarded sums the primary has answered; remembers a failure.
  void reap_locked() {
    while (!flights.empty() && flights.front().done.is_ready()) {
      if (auto error = flights.front().done.error()) {
        if (lost.empty()) lost = detail::describe(error);
      }
      held -= flights.front().count;
      flights.pop_front();
    }
  }

  void throw_lost_locked() {
    if (lost.empty()) return;
    const std::string why = std::move(lost);
    lost.clear();
    throw Error(c10::str("[", kGradHost, "] server '", name, "', secondary ", member,
                         ": gradients forwarded earlier were not applied, and this push was not taken either",
                         " (push it again): ", why));
  }

  void push(const Grads& grads) {
    for (;;) {
      Future<c10::IValue> oldest;
      std::optional<Outgoing> out;
      {
        std::lock_guard lock(mutex);
        reap_locked();
        throw_lost_locked();
        if (held < options.max_queue_size()) {
          add_into(sum, grads, options.reduce_device(), kGradHost, c10::str("a push to server '", name, "'"));
          ++count;
          ++held;
          if (count < options.reduce_batch_size()) return;
          out = take_locked(/*may_step=*/true);
        } else {
          oldest = flights.front().done;  // full: wait for the primary (held > 0 means flights)
        }
      }
      if (out) {
        send(*out);
        return;
      }
      oldest.wait_for(kForever);
    }
  }

  // Waits until everything forwarded is answered, then forwards the partial batch (after
  // them: the primary must not see it before a full batch that would make it step) and
  // waits for that too.
  void flush() {
    auto answered = [&] {
      std::vector<Future<c10::IValue>> waits;
      {
        std::lock_guard lock(mutex);
        for (const auto& f : flights) waits.push_back(f.done);
      }
      for (const auto& f : waits) f.wait_for(kForever);
    };
    answered();
    std::optional<Outgoing> out;
    {
      std::lock_guard lock(mutex);
      if (count > 0) out = take_locked(/*may_step=*/false);
    }
    if (out) send(*out);
    answered();
    std::lock_guard lock(mutex);
    reap_locked();
    throw_lost_locked();
  }
};

// ---- host ------------------------------------------------------------------------------

GradServerHost::GradServerHost(dist::RpcGroup group, std::string name, std::string primary,
                               std::vector<std::string> secondaries, GradServerOptions options)
    : group_(std::move(group)), name_(std::move(name)), services_(group_) {
  PUSH_CHECK(!name_.empty(), kGradHost, "the server needs a name");
  PUSH_CHECK(options.reduce_batch_size() >= 1, kGradHost, "reduce_batch_size must be >= 1, got ",
             options.reduce_batch_size());
  PUSH_CHECK(options.max_queue_size() >= options.reduce_batch_size(), kGradHost, "max_queue_size (",
             options.max_queue_size(), ") must be >= reduce_batch_size (", options.reduce_batch_size(), ")");
  PUSH_CHECK(!secondaries.empty(), kGradHost, "server '", name_, "' needs at least one secondary reducer");
  const auto& device = options.reduce_device();
  PUSH_CHECK(device.is_cpu() ||
                 (device.is_cuda() && compat::cuda_device_count() > 0 && device.index() < compat::cuda_device_count()),
             kGradHost, "server '", name_, "': reduce_device ", device, " is not a device of this process (",
             compat::cuda_device_count(), " CUDA devices)");
  PUSH_CHECK(group_.is_member(primary), kGradHost, "primary reducer '", primary, "' is not a member of group '",
             group_.name(), "'");
  for (const auto& s : secondaries) {
    PUSH_CHECK(group_.is_member(s), kGradHost, "secondary reducer '", s, "' is not a member of group '", group_.name(),
               "'");
  }
  const std::string self = group_.self();
  const bool is_secondary = std::find(secondaries.begin(), secondaries.end(), self) != secondaries.end();
  PUSH_CHECK(self == primary || is_secondary, kGradHost, "server '", name_, "': ", self,
             " is neither its primary reducer nor a secondary: only they build a GradServerHost");
  // Services registered before a failure below go with services_.
  if (self == primary) {
    primary_ = std::make_shared<Primary>();
    primary_->name = name_;
    primary_->options = options;
    primary_->secondaries = secondaries;
    primary_->published = options.model_store() ? options.model_store()
                                                : std::make_shared<OrderedServerHost>(group_, model_server(name_));
    auto p = primary_;
    services_.add(info_service(name_), [p](const dist::RpcArgs&) { return c10::IValue(p->secondaries); });
    services_.add(apply_service(name_), [p](const dist::RpcArgs& a) {
      p->add(grads_of(a.at(0), kGradHost), a.at(1).toInt(), a.at(2).toBool());
      return c10::IValue();
    });
    services_.add(step_service(name_), [p](const dist::RpcArgs&) {
      Future<bool> last;
      {
        std::lock_guard lock(p->mutex);
        p->throw_if_publish_failed();
        if (p->model != nullptr) p->step_locked();
        last = p->last_publish;
      }
      p->wait_published(last);  // flush returns once its step is published
      return c10::IValue();
    });
  }
  if (is_secondary) {
    secondary_ = std::make_shared<Secondary>();
    secondary_->group = group_;
    secondary_->name = name_;
    secondary_->member = self;
    secondary_->options = options;
    auto s = secondary_;
    services_.add(reduce_service(name_, self), [s](const dist::RpcArgs& a) {
      s->push(grads_of(a.at(0), kGradHost));
      return c10::IValue();
    });
    services_.add(flush_service(name_, self), [s](const dist::RpcArgs&) {
      s->flush();
      return c10::IValue();
    });
  }
}

GradServerHost::~GradServerHost() {
  // A handler already running finishes under the mutex; later ones find the server closed
  // (the model and optimizer are the caller's and may go next); the services go after.
  if (primary_) {
    std::lock_guard lock(primary_->mutex);
    primary_->closed = true;
    primary_->model = nullptr;
    primary_->optimizer = nullptr;
    primary_->after_step = nullptr;
  }
}

void GradServerHost::manage_model(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                  std::function<void()> after_step) {
  PUSH_CHECK(primary_ != nullptr, kGradHost, "server '", name_, "': manage_model is called on the primary reducer");
  Future<bool> first;
  {
    std::lock_guard lock(primary_->mutex);
    PUSH_CHECK(primary_->model == nullptr, kGradHost, "server '", name_, "' manages a model already");
    primary_->model = &model;
    primary_->optimizer = &optimizer;
    primary_->after_step = std::move(after_step);
    primary_->publish_locked();
    first = primary_->last_publish;
  }
  primary_->wait_published(first);  // version 1 is there for clients when this returns
}

int64_t GradServerHost::steps() const {
  if (!primary_) return 0;
  std::lock_guard lock(primary_->mutex);
  return primary_->steps;
}

// ---- client ----------------------------------------------------------------------------

namespace {
uint64_t next_handle() {
  static std::atomic<uint64_t> count{0};
  return count.fetch_add(1);
}
}  // namespace

GradServer::GradServer(dist::RpcGroup group, std::string name, std::optional<dist::Milliseconds> timeout,
                       std::shared_ptr<const OrderedServerBase> model_store)
    : group_(std::move(group)),
      name_(std::move(name)),
      timeout_(timeout),
      model_store_(std::move(model_store)),
      // Handles differ by rank and by their order on it: several on one rank spread their
      // pushes over the secondaries as handles on different ranks do.
      random_(push::detail::mix_seed(group_.rank_of(group_.self()), std::hash<std::string>{}(name_), next_handle(),
                                     push::detail::seed_purpose::kServer)) {
  PUSH_CHECK(!name_.empty(), kGradClient, "the server needs a name");
}

const std::vector<std::string>& GradServer::secondaries() {
  if (secondaries_.empty()) {
    try {
      auto list = group_.registered_sync(info_service(name_), {}, timeout_);
      for (const auto& s : list.toListRef()) secondaries_.push_back(s.toStringRef());
    } catch (const std::exception& e) {
      throw Error(c10::str("[", kGradClient, "] server '", name_, "': ", e.what()));
    }
  }
  return secondaries_;
}

void GradServer::push(const torch::nn::Module& module, const std::string& secondary) {
  c10::Dict<std::string, at::Tensor> grads;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    const auto& g = item.value().grad();
    PUSH_CHECK(g.defined(), kGradClient, "server '", name_, "': parameter '", item.key(),
               "' has no gradient (run backward before push)");
    grads.insert(item.key(), g.detach().to(torch::kCPU));
  }
  const auto& all = secondaries();
  std::string to = secondary;
  if (to.empty()) {
    to = all[std::uniform_int_distribution<size_t>(0, all.size() - 1)(random_)];
  } else {
    PUSH_CHECK(std::find(all.begin(), all.end(), to) != all.end(), kGradClient, "server '", name_, "': '", to,
               "' is not one of its secondary reducers");
  }
  try {
    group_.registered_sync(reduce_service(name_, to), {grads}, timeout_);
  } catch (const std::exception& e) {
    throw Error(c10::str("[", kGradClient, "] push to server '", name_, "' (secondary ", to, "): ", e.what()));
  }
}

int64_t GradServer::pull(torch::nn::Module& module) {
  ModelServer models(
      model_store_ ? model_store_ : std::make_shared<OrderedServer>(group_, model_server(name_), timeout_),
      model_server(name_));
  bool pulled = false;
  try {
    pulled = models.pull(module);
  } catch (const std::exception& e) {
    throw Error(c10::str("[", kGradClient, "] pull from server '", name_, "': ", e.what()));
  }
  PUSH_CHECK(pulled, kGradClient, "server '", name_, "' has published no model yet");
  return models.version();
}

void GradServer::flush() {
  try {
    for (const auto& s : secondaries()) group_.registered_sync(flush_service(name_, s), {}, timeout_);
    group_.registered_sync(step_service(name_), {}, timeout_);
  } catch (const std::exception& e) {
    throw Error(c10::str("[", kGradClient, "] flush of server '", name_, "': ", e.what()));
  }
}

}  // namespace push::server
