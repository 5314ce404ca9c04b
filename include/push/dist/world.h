#pragma once
// World: the processes of one job, found through c10d's TCPStore (rank 0 hosts it).
//
//   auto world = push::dist::World(push::dist::WorldOptions::from_env().timeout(std::chrono::seconds(30)));
//   world.rank(); world.size(); world.name();          // "worker<rank>" unless named
//   push::dist::CollectiveGroup all = world.collective();
//   push::dist::CollectiveGroup pair = world.new_group({0, 1});   // only ranks 0 and 1 call this
//   world.store().set("myjob/ready", {1});                        // the job's key-value store
//
// A World is a cheap, copyable handle; groups keep it alive. Its members are thread-safe.
// The constructor blocks until every rank has joined (or throws after init_timeout).
#include <torch/arg.h>

#include <push/core/errors.h>
#include <push/dist/store.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace push::dist {

using Milliseconds = std::chrono::milliseconds;

/// How a process joins the job: `WorldOptions().rank(1).world_size(4).master_port(29500)`.
struct WorldOptions {
  TORCH_ARG(int, rank) = 0;
  TORCH_ARG(int, world_size) = 1;
  TORCH_ARG(int, local_rank) = 0;
  /// Host of rank 0, which runs the TCPStore every rank meets at.
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 29500;
  /// The launcher already serves the store at master_addr:master_port (torchrun 2.x does,
  /// and says so with TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects to it like every
  /// other rank instead of hosting its own.
  TORCH_ARG(bool, launcher_hosts_store) = false;
  /// The job this rank belongs to: ranks of another job that meet at the same store (two
  /// jobs on one MASTER_PORT) are refused, never mixed. from_env takes PUSH_JOB_ID, else the
  /// launcher's (torchrun's run id and restart count, Slurm's job and step, Open MPI's
  /// namespace); `push launch` draws one. Empty: ranks without a job id form one job.
  TORCH_ARG(std::string, job_id) = "";
  /// The job's secret, 64 hexadecimal digits (PUSH_JOB_SECRET; `push launch` draws one):
  /// every RPC connection proves it knows it. Empty: rank 0 draws one and hands it to the
  /// others through a file only this user can read (ranks on hosts that share rank 0's
  /// file system; others fail, saying how to set one), never through the store
  /// (docs/distributed.md, "A job started without a secret").
  TORCH_ARG(std::string, job_secret) = "";
  /// This rank's name; empty means "worker<rank>".
  TORCH_ARG(std::string, name) = "";
  /// Rendezvous: connecting to the store, every rank joining, connecting the groups.
  TORCH_ARG(Milliseconds, init_timeout) = std::chrono::seconds(120);
  /// Default of every collective, point-to-point transfer and barrier.
  TORCH_ARG(Milliseconds, timeout) = std::chrono::seconds(300);
  /// Default of every RPC call (from sending the request to receiving the answer).
  TORCH_ARG(Milliseconds, rpc_timeout) = std::chrono::seconds(60);
  /// How long rank 0 waits, when it leaves, for the others to leave (it hosts the store).
  TORCH_ARG(Milliseconds, shutdown_timeout) = std::chrono::seconds(30);
  /// Network interface Gloo and RPC bind to (GLOO_SOCKET_IFNAME); empty: loopback when the
  /// master is local, else this host's address on its route to the master (an IPv6
  /// master: Gloo's default, the address the host name resolves to).
  TORCH_ARG(std::string, interface) = "";
  /// Gloo's worker threads per process group.
  TORCH_ARG(int, gloo_threads) = 2;

 public:
  /// Reads an environment variable; the default is std::getenv.
  using Lookup = std::function<std::optional<std::string>(const std::string&)>;
  /// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; falling back to
  /// OpenMPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} and Slurm's SLURM_{PROCID,NTASKS,
  /// LOCALID}. Also GLOO_SOCKET_IFNAME, TORCHELASTIC_USE_AGENT_STORE, PUSH_JOB_SECRET and the
  /// job id (job_id). Throws
  /// push::Error naming what is missing/wrong.
  static WorldOptions from_env(const Lookup& lookup = {});
  /// The rank a launcher gave this process (RANK, else OMPI_COMM_WORLD_RANK, else
  /// SLURM_PROCID); nullopt when none is set.
  static std::optional<int> launched_rank(const Lookup& lookup = {});
  /// The number of ranks a launcher started, from the same variables as from_env
  /// (WORLD_SIZE, else OMPI_COMM_WORLD_SIZE, else SLURM_NTASKS); nullopt when none is set.
  static std::optional<int> launched_world_size(const Lookup& lookup = {});
  /// The ranks per node a launcher started (LOCAL_WORLD_SIZE, else
  /// OMPI_COMM_WORLD_LOCAL_SIZE, else SLURM_NTASKS_PER_NODE); nullopt when none is set.
  static std::optional<int> launched_local_world_size(const Lookup& lookup = {});
  /// Throws push::Error when the options cannot describe a job (rank >= world size, ...).
  void validate() const;
};

namespace detail {
struct WorldState;
class WorldAccess;
}  // namespace detail
class CollectiveGroup;
struct CollectiveGroupOptions;
class RpcGroup;
struct RpcGroupOptions;

/// A fresh job secret for WorldOptions::job_secret (PUSH_JOB_SECRET): 32 bytes from the
/// kernel's random source as 64 hexadecimal digits. `push launch` gives its ranks one.
std::string new_job_secret();

class World {
 public:
  /// Joins the job: rank 0 starts the store, everyone connects, names are exchanged and
  /// the default Gloo group is built. Throws push::Error on a bad address, a port nobody
  /// listens on, or a rank missing after init_timeout.
  explicit World(WorldOptions options);
  /// World(WorldOptions::from_env()).
  static World from_env();

  int rank() const;
  int size() const;
  int local_rank() const;
  const std::string& name() const;
  /// Every rank's name, indexed by rank.
  const std::vector<std::string>& names() const;
  /// The rank called `name`; throws push::Error for an unknown name.
  int rank_of(const std::string& name) const;
  const WorldOptions& options() const;

  /// The group of every rank (built once, shared by every caller).
  CollectiveGroup collective() const;
  /// A group over `ranks` (global ranks, any order). Only the members call this, and
  /// they create their groups over the same rank set in the same order.
  CollectiveGroup new_group(std::vector<int> ranks) const;
  CollectiveGroup new_group(std::vector<int> ranks, const CollectiveGroupOptions& options) const;
  /// An RPC group named `name` over `members` (names). Only the members call this.
  RpcGroup rpc_group(const std::string& name, std::vector<std::string> members) const;
  RpcGroup rpc_group(const std::string& name, std::vector<std::string> members, const RpcGroupOptions& options) const;

  /// Blocks until every rank calls barrier() (through the store; any number of times).
  void barrier(std::optional<Milliseconds> timeout = std::nullopt) const;

  /// The job's key-value store (store.h), for control-plane data.
  Store store() const;

 private:
  friend class detail::WorldAccess;
  std::shared_ptr<detail::WorldState> state_;
};

}  // namespace push::dist
