#include "runtime/runtime.h"

#include <push/core/errors.h>

namespace push::detail {
namespace {

PushOptions checked(PushOptions options, const ModuleFactory& factory) {
  PUSH_CHECK(factory != nullptr, "push::Push", "the module factory is empty");
  PUSH_CHECK(options.cache_size() >= 1, "push::Push", "cache_size must be at least 1, got ", options.cache_size());
  PUSH_CHECK(options.view_size() >= 1, "push::Push", "view_size must be at least 1, got ", options.view_size());
  PUSH_CHECK(options.stack_size() >= 64 * 1024, "push::Push", "stack_size must be at least 64 KiB, got ",
             options.stack_size());
  Lanes::count(options);  // a bad device count fails before any rank is met
  PUSH_CHECK(!options.world() || options.placement() == Placement::round_robin, "push::Push",
             "placement by_size needs every particle's size on every rank: it is for one process (no world)");
  return options;
}

}  // namespace

Runtime::Runtime(ModuleFactory factory, PushOptions options)
    : options_(checked(std::move(options), factory)),
      peers_(options_.world() ? Peers::create(*options_.world(), Lanes::count(options_)) : nullptr),
      // Ranks on one host share its cores too.
      lanes_(options_, Lanes::count(options_), peers_ ? peers_->ranks_on_host() : 1),
      registry_(peers_.get(), peers_ ? peers_->rank() : 0, lanes_.size(), options_.placement()),
      builder_(std::move(factory), options_.seed()),
      local_(lanes_),
      collectives_(peers_.get(), registry_),
      checkpointer_(lanes_, registry_, builder_, collectives_, *this) {
  if (peers_) {
    remote_.emplace(*peers_, lanes_, registry_, local_, options_.world()->options().rpc_timeout());
    try {
      peers_->start([this](PeerRequest request) { return remote_->serve(std::move(request)); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
}

Runtime::~Runtime() { shutdown(); }

void Runtime::shutdown() {
  // The other ranks may still message this rank's particles until every rank is here.
  if (peers_) peers_->leave();
  stopping_.store(true);
  lanes_.stop();
}

void Runtime::check_open(const char* origin) const {
  if (stopping_.load()) throw CancelledError(c10::str("[", origin, "] the distribution is shutting down"));
}

Pid Runtime::create(const ParticleOptions& options, std::optional<Pid> wanted) {
  constexpr const char* origin = "push::Push::p_create";
  check_open(origin);
  Pid pid;
  if (wanted) {
    PUSH_CHECK(*wanted >= 0, origin, "particle ids are non-negative, got ", *wanted);
    pid = *wanted;
    registry_.claim(pid, origin);
  } else {
    pid = registry_.claim_next();
  }
  try {
    const Where at = registry_.place(pid, options, origin);
    if (at.rank == registry_.rank()) {
      const int lane = registry_.lane_for(at, options);
      add_particle(lanes_, registry_, builder_.build(options, pid, lane, lanes_.at(lane).device(), *this, origin));
    } else {
      // Another rank builds it (p_create is collective): this one only learns where it is.
      registry_.add_elsewhere(pid, at);
    }
  } catch (...) {
    // Other ranks counted this id as this rank's: their requests for it fail with why.
    if (peers_) registry_.mark_failed(pid, describe(std::current_exception()));
    registry_.release(pid);
    throw;
  }
  return pid;
}

PFuture Runtime::send(Pid pid, const std::string& message, Args args, const char* origin) {
  if (stopping_.load()) {
    return PFuture::failed(
        std::make_exception_ptr(CancelledError(c10::str("[", origin, "] the distribution is shutting down"))));
  }
  const Where at = registry_.where(pid, origin);
  if (at.rank != registry_.rank()) return remote_->send(pid, at, message, std::move(args));
  return local_.send(*at.record, message, std::move(args));
}

Future<ParticleView> Runtime::view(Pid pid, const ParticleRecord& caller, Lane& lane, const char* origin) {
  const Where at = registry_.where(pid, origin);
  if (at.rank != registry_.rank()) return remote_->view(pid, at, lane);
  return local_.view(*at.record, caller, lane);
}

ParticleView::Data Runtime::parameters(Pid pid, const char* origin) {
  const Where at = registry_.where(pid, origin);
  if (at.rank != registry_.rank()) return remote_->parameters(pid, at);
  return local_.parameters(*at.record).wait();
}

void Runtime::save(const std::filesystem::path& dir, const std::optional<std::set<Pid>>& only, const char* origin) {
  check_open(origin);
  checkpointer_.save(dir, only, origin);
}

std::vector<Pid> Runtime::load(const std::filesystem::path& dir,
                               const std::function<ParticleOptions(Pid)>& make_options, bool whole,
                               const char* origin) {
  check_open(origin);
  return checkpointer_.load(dir, make_options, whole, origin);
}

}  // namespace push::detail
