// World: rendezvous through push's own store (rendezvous/; c10d's TCPStore under a launcher
// that hosts one), names, the default Gloo group, groups.
#include "core/clock.h"
#include "core/torch_compat.h"
#include "dist/c10d.h"
#include "dist/rendezvous/store_deadline.h"
#include "dist/rendezvous/world_join.h"
#include "dist/transport/transport.h"
#include "dist/world_access.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

namespace push::dist {
namespace detail {

std::string bytes_to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> string_to_bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }
std::string current_message() { return push::detail::describe(std::current_exception()); }

WorldState::~WorldState() {
  // Rank 0 hosts the store: it stays until the others have left (or shutdown_timeout),
  // so that nobody loses the store in the middle of its own shutdown. Ranks an RPC group
  // lost (killed, cut off) will never leave: it does not wait for them.
  if (!secret_file.empty()) ::unlink(secret_file.c_str());  // the others read it while joining
  if (!store || !joined) return;
  try {
    const std::string left = "push/world/left/";
    if (options.rank() != 0) {
      {
        std::lock_guard<std::mutex> lock(lost_mutex);
        if (lost_ranks.count(0) && !options.launcher_hosts_store()) return;  // the store went with rank 0
      }
      // Bounded: a stopped rank 0 never answers (LibTorch 1.13's client has no deadline).
      detail::StoreDeadline bound(options.master_addr(), options.master_port(),
                                  push::detail::Clock::deadline_after(options.shutdown_timeout()));
      store->set(left + std::to_string(options.rank()), std::vector<uint8_t>{1});
      return;
    }
    store->set(left + std::to_string(options.rank()), std::vector<uint8_t>{1});
    using push::detail::Clock;
    const bool all_left =
        Clock::poll_until(Clock::deadline_after(options.shutdown_timeout()), std::chrono::milliseconds(5), [&] {
          std::vector<std::string> keys;
          {
            std::lock_guard<std::mutex> lock(lost_mutex);
            for (int r = 1; r < options.world_size(); ++r) {
              if (!lost_ranks.count(r)) keys.push_back(left + std::to_string(r));
            }
          }
          return keys.empty() || store->check(keys);
        });
    if (!all_left) {
      std::cerr << "[push::dist::World] rank 0 leaves before every rank did (waited "
                << options.shutdown_timeout().count() << " ms)\n";
    }
  } catch (const std::exception&) {
    // The store is gone already (rank 0 left): nothing to coordinate.
  }
}

void WorldState::mark_lost(int rank, bool lost) {
  std::lock_guard<std::mutex> lock(lost_mutex);
  if (lost) {
    lost_ranks.insert(rank);
  } else {
    lost_ranks.erase(rank);
  }
}

JobStore::Options WorldState::store_client() const {
  JobStore::Options jo;
  jo.host = options.master_addr();
  jo.port = options.master_port();
  jo.job_id = options.job_id();
  jo.rank = options.rank();
  jo.world_size = options.world_size();
  jo.timeout = options.init_timeout();
  return jo;
}

c10::intrusive_ptr<c10d::Store> WorldState::new_client() const {
  if (!options.launcher_hosts_store()) {
    return c10::make_intrusive<JobStore>(store_client(), store_key(),
                                         std::chrono::steady_clock::now() + options.init_timeout());
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(options.master_port());
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = options.init_timeout();
  return c10::make_intrusive<c10d::TCPStore>(options.master_addr(), o);
}

c10::intrusive_ptr<c10d::ProcessGroupGloo> WorldState::make_gloo(const std::string& prefix,
                                                                 const std::vector<int>& ranks,
                                                                 Milliseconds timeout) const {
  auto it = std::find(ranks.begin(), ranks.end(), options.rank());
  TORCH_INTERNAL_ASSERT(it != ranks.end());
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo_options->devices.push_back(device);
  gloo_options->threads = options.gloo_threads();
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(it - ranks.begin()),
                                                     static_cast<int>(ranks.size()), gloo_options);
}

}  // namespace detail

namespace {

constexpr const char* kFromEnv = "push::dist::WorldOptions::from_env";

int parse_int(const std::string& variable, const std::string& text, const char* origin) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PUSH_CHECK(used == text.size() && !text.empty(), origin, variable, "='", text, "' is not an integer");
  return value;
}

// The launchers' names of each variable: torchrun's (and push launch's), OpenMPI's, Slurm's.
constexpr std::initializer_list<const char*> kRankKeys = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
constexpr std::initializer_list<const char*> kSizeKeys = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
constexpr std::initializer_list<const char*> kLocalRankKeys = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                                               "SLURM_LOCALID"};
constexpr std::initializer_list<const char*> kLocalSizeKeys = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                               "SLURM_NTASKS_PER_NODE"};

WorldOptions::Lookup or_getenv(const WorldOptions::Lookup& lookup) {
  if (lookup) return lookup;
  return [](const std::string& key) -> std::optional<std::string> {
    const char* value = std::getenv(key.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
}

// The first of `keys` that is set, with its name.
std::optional<std::pair<std::string, std::string>> first_set(const WorldOptions::Lookup& lookup,
                                                             std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (auto value = lookup(key)) return std::make_pair(std::string(key), *value);
  }
  return std::nullopt;
}

std::optional<int> first_int(const WorldOptions::Lookup& lookup, std::initializer_list<const char*> keys) {
  auto found = first_set(or_getenv(lookup), keys);
  if (!found) return std::nullopt;
  return parse_int(found->first, found->second, kFromEnv);
}

/// The job id a launcher gave: PUSH_JOB_ID, else torchrun's run and restart, Slurm's job and
/// step, Open MPI's namespace; empty when none is set.
std::string launched_job_id(const WorldOptions::Lookup& lookup) {
  if (auto id = lookup("PUSH_JOB_ID")) return *id;
  if (auto run = lookup("TORCHELASTIC_RUN_ID")) {
    return c10::str("torchrun:", *run, ".", lookup("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  }
  if (auto job = lookup("SLURM_JOB_ID")) return c10::str("slurm:", *job, ".", lookup("SLURM_STEP_ID").value_or("0"));
  if (auto ns = lookup("PMIX_NAMESPACE")) return c10::str("mpi:", *ns);
  if (auto id = lookup("OMPI_MCA_ess_base_jobid")) return c10::str("mpi:", *id);
  return "";
}

}  // namespace

std::optional<int> WorldOptions::launched_rank(const Lookup& lookup) { return first_int(lookup, kRankKeys); }

std::optional<int> WorldOptions::launched_world_size(const Lookup& lookup) { return first_int(lookup, kSizeKeys); }

std::optional<int> WorldOptions::launched_local_world_size(const Lookup& lookup) {
  return first_int(lookup, kLocalSizeKeys);
}

WorldOptions WorldOptions::from_env(const Lookup& lookup_in) {
  const Lookup lookup = or_getenv(lookup_in);
  auto first = [&](std::initializer_list<const char*> keys) { return first_set(lookup, keys); };
  WorldOptions o;
  auto rank = first(kRankKeys);
  auto size = first(kSizeKeys);
  PUSH_CHECK(size.has_value(), kFromEnv,
             "WORLD_SIZE is not set (nor OMPI_COMM_WORLD_SIZE, SLURM_NTASKS): start the program "
             "with `push launch`, torchrun --no-python, mpirun or srun, or set it");
  PUSH_CHECK(rank.has_value(), kFromEnv,
             "RANK is not set (nor OMPI_COMM_WORLD_RANK, SLURM_PROCID): start the program with "
             "`push launch`, torchrun --no-python, mpirun or srun, or set it");
  o.world_size(parse_int(size->first, size->second, kFromEnv));
  o.rank(parse_int(rank->first, rank->second, kFromEnv));
  if (auto local = first(kLocalRankKeys)) {
    o.local_rank(parse_int(local->first, local->second, kFromEnv));
  }
  if (auto addr = lookup("MASTER_ADDR")) o.master_addr(*addr);
  if (auto port = lookup("MASTER_PORT")) o.master_port(parse_int("MASTER_PORT", *port, kFromEnv));
  if (auto ifname = lookup("GLOO_SOCKET_IFNAME")) o.interface(*ifname);
  if (auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE")) o.launcher_hosts_store(*agent == "True" || *agent == "1");
  if (auto secret = lookup("PUSH_JOB_SECRET")) o.job_secret(*secret);
  o.job_id(launched_job_id(lookup));
  o.validate();
  return o;
}

void WorldOptions::validate() const {
  constexpr const char* origin = "push::dist::WorldOptions";
  PUSH_CHECK(world_size_ >= 1, origin, "world size must be at least 1, got ", world_size_);
  PUSH_CHECK(rank_ >= 0 && rank_ < world_size_, origin, "rank ", rank_, " is out of range for world size ", world_size_,
             " (ranks are 0..", world_size_ - 1, ")");
  PUSH_CHECK(local_rank_ >= 0, origin, "local rank must be >= 0, got ", local_rank_);
  PUSH_CHECK(!master_addr_.empty(), origin, "master address (MASTER_ADDR) is empty");
  PUSH_CHECK(master_port_ > 0 && master_port_ < 65536, origin, "master port (MASTER_PORT) ", master_port_,
             " is not in 1..65535");
  for (auto [what, t] : {std::pair{"init_timeout", init_timeout_},
                         {"timeout", timeout_},
                         {"rpc_timeout", rpc_timeout_},
                         {"shutdown_timeout", shutdown_timeout_}}) {
    PUSH_CHECK(t.count() > 0, origin, what, " must be positive, got ", t.count(), " ms");
  }
  PUSH_CHECK(gloo_threads_ >= 1, origin, "gloo_threads must be >= 1, got ", gloo_threads_);
  if (!job_secret_.empty()) detail::handshake::from_hex(job_secret_, "the job secret (PUSH_JOB_SECRET)");
}

World::World(WorldOptions options) : state_(std::make_shared<detail::WorldState>()) {
  constexpr const char* origin = "push::dist::World";
  options.validate();
  if (options.name().empty()) options.name(c10::str("worker", options.rank()));
  auto& s = *state_;
  s.options = options;
  const std::string where = c10::str(options.master_addr(), ":", options.master_port());
  PUSH_CHECK(!options.launcher_hosts_store() || compat::kJoinsTorchrun2Store, origin,
             "the launcher (torchrun) serves the store at ", where, ", but push was built against LibTorch ",
             TORCH_VERSION,
             ", whose store client cannot talk to torchrun 2.x's: start this build with push launch, mpirun or "
             "srun, or use the LibTorch 2.x build (./scripts/setup --libtorch wheel)");
  const bool own_store = !options.launcher_hosts_store();
  const auto deadline = push::detail::Clock::deadline_after(options.init_timeout());
  // Every store call until the job is joined ends by the deadline, even against a store that
  // accepts and never answers (LibTorch 1.13's client has no timeout of its own; push's own
  // store bounds each call itself).
  // (A little after the deadline: a store that answers reports its own timeouts first.)
  detail::StoreDeadline bounded(options.master_addr(), options.master_port(),
                                deadline + std::chrono::milliseconds(500) + options.init_timeout() / 10);
  auto late = [&](const std::string& doing) {
    return Error(c10::str("[", origin, "] rank ", options.rank(), " of ", options.world_size(), ": the store at ",
                          where, " did not answer ", doing, " within ", options.init_timeout().count(),
                          " ms (init_timeout): is rank 0 stopped, or is another program listening on MASTER_PORT?"));
  };
  detail::take_secret(s);
  if (own_store) {
    // push's own store (rendezvous/store_server.h): only ranks that prove the job's secret
    // read or write it, and it listens on MASTER_ADDR only, on both LibTorch builds.
    try {
      s.store = detail::open_own_store(s, std::chrono::steady_clock::now() + options.init_timeout());
    } catch (const Error& e) {
      throw Error(c10::str("[", origin, "] rank ", options.rank(), " of ", options.world_size(),
                           (options.rank() == 0 ? " cannot host the store at " : " cannot reach the store at "), where,
                           " (MASTER_ADDR:MASTER_PORT) within ", options.init_timeout().count(), " ms: ", e.what()));
    }
  } else {
    // The launcher's (torchrun's) c10d TCPStore: push is only its client.
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port());
    store_options.isServer = false;
    store_options.numWorkers = static_cast<size_t>(options.world_size());
    store_options.waitWorkers = false;
    store_options.timeout = options.init_timeout();
    try {
      s.store = c10::make_intrusive<c10d::TCPStore>(options.master_addr(), store_options);
    } catch (const std::exception&) {
      if (bounded.fired()) throw late("the connection");
      throw Error(c10::str("[", origin, "] rank ", options.rank(), " of ", options.world_size(),
                           " cannot reach the launcher's store at ", where, " (MASTER_ADDR:MASTER_PORT) within ",
                           options.init_timeout().count(), " ms: ", detail::current_message()));
    }
  }
  try {
    detail::join_job(s, deadline);
  } catch (const Error&) {
    if (bounded.fired()) throw late("while the ranks joined");
    throw;
  } catch (const std::exception&) {
    if (bounded.fired()) throw late("while the ranks joined");
    throw Error(c10::str("[", origin, "] rank ", options.rank(), ": the store at ", where,
                         " failed while the ranks joined: ", detail::current_message()));
  }
  try {
    if (!options.interface().empty()) {
      s.device = c10d::ProcessGroupGloo::createDeviceForInterface(options.interface());
    } else {
      // Where the other ranks reach this one: 127.0.0.1 for a local MASTER_ADDR, else this
      // host's IPv4 address on the route to it, as for RPC. (Gloo's default, the address
      // the host name resolves to, can be a loopback one no other host reaches.) With no
      // IPv4 route (an IPv6 MASTER_ADDR), Gloo's default.
      std::string here;
      try {
        here = detail::advertised_host(options.master_addr(), options.master_port(), "");
      } catch (const Error&) {
      }
      s.device = here.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                              : c10d::ProcessGroupGloo::createDeviceForHostname(here);
    }
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] cannot open a Gloo device (interface '", options.interface(),
                         "'): ", detail::current_message()));
  }
  s.barrier = std::make_unique<detail::StoreBarrier>(s.new_client(), "push/world/barrier/", options.world_size(),
                                                     options.master_addr(), options.master_port());
  s.joined = true;
}

std::string new_job_secret() { return detail::handshake::to_hex(detail::handshake::random_bytes()); }

World World::from_env() { return World(WorldOptions::from_env()); }

int World::rank() const { return state_->options.rank(); }
int World::size() const { return state_->options.world_size(); }
int World::local_rank() const { return state_->options.local_rank(); }
const std::string& World::name() const { return state_->options.name(); }
const std::vector<std::string>& World::names() const { return state_->names; }
const WorldOptions& World::options() const { return state_->options; }
Store World::store() const { return detail::WorldAccess::make_store(state_->store); }

int World::rank_of(const std::string& name) const {
  auto& names = state_->names;
  auto it = std::find(names.begin(), names.end(), name);
  PUSH_CHECK(it != names.end(), "push::dist::World::rank_of", "no rank is named '", name,
             "' (ranks: ", c10::Join(", ", names), ")");
  return static_cast<int>(it - names.begin());
}

void World::barrier(std::optional<Milliseconds> timeout) const {
  state_->barrier->arrive_and_wait(timeout.value_or(state_->options.timeout()), "push::dist::World::barrier");
}

}  // namespace push::dist
