// Which transport should carry push::dist::RpcGroup? One run, two processes on 127.0.0.1
// (the binary starts its own rank 1, as push_bench_dist does), every row a round trip of a
// float tensor of 16 B, 1 MiB or 64 MiB echoed by rank 1:
//   push/<size>            RpcGroup::rpc_sync of an echo function (push's own sockets)
//   tensorpipe_uv/<size>   TensorPipe's own API: pipe write, then readDescriptor + read of the
//                          echo; "uv" transport (TCP through libuv) + "basic" channel
//   tensorpipe_shm/<size>  the same over the "shm" transport (shared-memory ring buffers)
//   tensorpipe_cma/<size>  "uv" transport + "cma" channel (tensor bytes read straight from
//                          the other process with process_vm_readv)
//   agent/<size>           LibTorch 1.13's torch::distributed::rpc::TensorPipeAgent with its
//                          default options (every viable transport and channel, 16 worker
//                          threads), a C++ RequestCallback echoing the request, no Python
//   tcp/<size>             the raw TCP echo itself (ratio ~1 shows the run's noise)
// Rows whose transport or channel TensorPipe reports not viable on this machine (on either
// rank) are skipped with the reason. Every row opens its transport on both ranks, makes
// one checked warm-up round trip, measures, and closes it again before its TCP baseline:
// TensorPipe's shm reactor busy-polls a core in each process while its context lives, which
// would slow whatever runs beside it.
// Counters (every row has all of them, so CSV output works):
//   us          microseconds per round trip
//   cpu_us      CPU time of both processes (every thread) per round trip
//   threads     threads of both processes while the row's transport is open
//   tcp_us, tcp_cpu_us  the same for the raw TCP echo (length-prefixed bytes over one
//               TCP_NODELAY connection), run right after the row with as many round trips
//   ratio       us / tcp_us (for 64 MiB, 1/ratio is the throughput relative to TCP)
// Receive buffers: TensorPipe's rows and TCP read into one buffer per connection, reused;
// push reads into its pooled buffers; the agent allocates a fresh tensor per message.
// Reading 16 B rows on a machine with few cores: a wakeup that crosses cores costs most of
// such a round trip (on a 2-vCPU VM, TCP's 16 B echo took 20 us or 40-60 us depending on
// where the scheduler had put the two processes), so compare several runs, or run once
// under `taskset -c 0` for the cost without cross-core wakeups.
//   push_bench_transport --benchmark_counters_tabular=true 2>/dev/null   (the agent logs)
#include <tensorpipe/tensorpipe.h>
#include <torch/csrc/distributed/rpc/tensorpipe_agent.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <benchmark/benchmark.h>
#include <push/dist.h>

#include <sys/wait.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>

#include "transport_bench_util.h"

namespace {

using namespace transport_bench;
namespace rpc = torch::distributed::rpc;

c10::IValue bench_echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(bench_echo);

enum class Kind { push, tensorpipe_uv, tensorpipe_shm, tensorpipe_cma, agent, tcp };
constexpr const char* kKindNames[] = {"push", "tensorpipe_uv", "tensorpipe_shm", "tensorpipe_cma", "agent", "tcp"};

Kind kind_named(const std::string& name) {
  const auto* end = std::end(kKindNames);
  const auto* it = std::find_if(std::begin(kKindNames), end, [&](const char* n) { return name == n; });
  if (it == end) fail("unknown row " + name);
  return static_cast<Kind>(it - std::begin(kKindNames));
}

struct Job {
  push::dist::World world;
  push::dist::RpcGroup rpc;
  Control control;
  pid_t peer = 0;
  int agents = 0;  // each agent gets store keys of its own: they count arrivals at join
};
Job* g_job = nullptr;
TcpEcho* g_tcp = nullptr;

/// What rank 0's row talks to; closing it closes rank 1's side too.
class Client {
 public:
  virtual ~Client() = default;
  /// Sends `arg`, waits for its echo, returns where the echo's bytes are (valid until the
  /// next call).
  virtual const void* round_trip(const at::Tensor& arg) = 0;
};

/// What rank 1 holds open for rank 0's current row.
class Server {
 public:
  virtual ~Server() = default;
};

// ---- push -------------------------------------------------------------------------------

class PushClient final : public Client {
 public:
  const void* round_trip(const at::Tensor& arg) override {
    last_ = g_job->rpc.rpc_sync(1, "bench_echo", {arg}).toTensor();
    return last_.data_ptr();
  }

 private:
  at::Tensor last_;
};

// ---- TensorPipe's own API ---------------------------------------------------------------

struct TpSetup {
  std::string transport, channel;
};

TpSetup tp_setup(Kind kind) {
  if (kind == Kind::tensorpipe_shm) return {"shm", "basic"};
  if (kind == Kind::tensorpipe_cma) return {"uv", "cma"};
  return {"uv", "basic"};
}

/// A context with just `setup`'s transport and channel, or nullptr and why when TensorPipe
/// finds either not viable here.
std::shared_ptr<tensorpipe::Context> tp_context(const TpSetup& setup, std::string& why) {
  auto transport =
      setup.transport == "shm" ? tensorpipe::transport::shm::create() : tensorpipe::transport::uv::create();
  auto channel = setup.channel == "cma" ? tensorpipe::channel::cma::create() : tensorpipe::channel::basic::create();
  for (const auto& [viable, name] : {std::pair{transport->isViable(), "transport " + setup.transport},
                                     std::pair{channel->isViable(), "channel " + setup.channel}}) {
    if (!viable) {
      why = "TensorPipe's " + name + " is not viable here (rank " + std::to_string(g_job->world.rank()) + ")";
      return nullptr;
    }
  }
  auto context = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(g_job->world.name()));
  context->registerTransport(0, setup.transport, std::move(transport));
  context->registerChannel(0, setup.channel, std::move(channel));
  return context;
}

tensorpipe::Message tensor_message(void* data, size_t bytes) {
  tensorpipe::Message message;
  message.tensors.push_back({tensorpipe::CpuBuffer{data}, bytes});
  return message;
}

void check_tp(const tensorpipe::Error& error, const char* what) {
  if (error) fail(std::string("TensorPipe ") + what + ": " + error.what());
}

/// Rank 1: accepts pipes and echoes every message (one tensor) from one reused buffer.
class TpServer final : public Server {
 public:
  TpServer(std::shared_ptr<tensorpipe::Context> context, const std::string& transport)
      : context_(std::move(context)),
        listener_(context_->listen({transport + "://" + (transport == "uv" ? "127.0.0.1" : "")})) {
    accept();
  }
  ~TpServer() override {
    context_->close();
    context_->join();
  }
  std::string url(const std::string& transport) const { return listener_->url(transport); }

 private:
  void accept() {
    listener_->accept([this](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
      if (error) return;  // the context is closing
      accept();
      echo(std::move(pipe), std::make_shared<std::vector<char>>());
    });
  }
  // Errors below mean rank 0 closed the pipe: the chain of callbacks ends there.
  static void echo(std::shared_ptr<tensorpipe::Pipe> pipe, std::shared_ptr<std::vector<char>> buffer) {
    pipe->readDescriptor([pipe, buffer](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
      if (error) return;
      if (descriptor.tensors.size() != 1 || !descriptor.payloads.empty()) fail("TensorPipe echo: expected one tensor");
      const size_t bytes = descriptor.tensors[0].length;
      buffer->resize(bytes);
      tensorpipe::Allocation allocation;
      allocation.tensors.push_back({tensorpipe::CpuBuffer{buffer->data()}});
      pipe->read(std::move(allocation), [pipe, buffer, bytes](const tensorpipe::Error& error) {
        if (error) return;
        pipe->write(tensor_message(buffer->data(), bytes), [pipe, buffer](const tensorpipe::Error& error) {
          if (!error) echo(pipe, buffer);
        });
      });
    });
  }

  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Listener> listener_;
};

/// Rank 0: one pipe to rank 1's TpServer; a round trip is a write and a read of the echo,
/// both started at once, waited for together.
class TpClient final : public Client {
 public:
  TpClient(std::shared_ptr<tensorpipe::Context> context, const std::string& url)
      : context_(std::move(context)), pipe_(context_->connect(url)) {}
  ~TpClient() override {
    g_job->control.post("close");
    context_->close();
    context_->join();
    g_job->control.answer();
  }

  const void* round_trip(const at::Tensor& arg) override {
    back_.resize(arg.nbytes());
    pending_ = 2;
    pipe_->write(tensor_message(arg.data_ptr(), arg.nbytes()), [this](const tensorpipe::Error& error) {
      check_tp(error, "write");
      done();
    });
    pipe_->readDescriptor([this](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
      check_tp(error, "readDescriptor");
      if (descriptor.tensors.size() != 1 || descriptor.tensors[0].length != back_.size()) fail("TensorPipe: bad echo");
      tensorpipe::Allocation allocation;
      allocation.tensors.push_back({tensorpipe::CpuBuffer{back_.data()}});
      pipe_->read(std::move(allocation), [this](const tensorpipe::Error& error) {
        check_tp(error, "read");
        done();
      });
    });
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [this] { return pending_ == 0; });
    return back_.data();
  }

 private:
  void done() {
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) finished_.notify_one();
  }

  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Pipe> pipe_;
  std::vector<char> back_;
  std::mutex mutex_;
  std::condition_variable finished_;
  int pending_ = 0;
};

// ---- LibTorch's TensorPipeAgent ---------------------------------------------------------

/// Answers every request with its own payload and tensors. The agent accepts any request
/// type from a custom callback and sets the response's id itself; a response of any type
/// but EXCEPTION completes the caller's future with the message.
class EchoCallback final : public rpc::RequestCallback {
 protected:
  c10::intrusive_ptr<rpc::JitFuture> processMessage(rpc::Message& request, std::vector<c10::Stream>) const override {
    auto response = c10::make_intrusive<rpc::Message>(std::move(request.payload()), std::move(request.tensors()),
                                                      rpc::MessageType::SCRIPT_RET, request.id());
    auto future = c10::make_intrusive<rpc::JitFuture>(at::AnyClassType::get());
    auto storages = response->getStorages();
    future->markCompleted(c10::IValue(std::move(response)), std::move(storages));
    return future;
  }
};

/// Both ranks build it at once (it exchanges names and addresses through the store);
/// closing it is a barrier of both (join), then its threads stop (shutdown).
class Agent final : public Server {
 public:
  Agent() {
    const auto& world = g_job->world;
    auto store = c10::make_intrusive<c10d::PrefixStore>("bench/agent/" + std::to_string(g_job->agents++) + "/",
                                                        push_bench::c10d_store(world));
    rpc::TensorPipeRpcBackendOptions options(rpc::kDefaultNumWorkerThreads, c10::nullopt, c10::nullopt,
                                             rpc::kDefaultRpcTimeoutSeconds, rpc::kDefaultInitMethod);
    agent = std::make_shared<rpc::TensorPipeAgent>(store, world.name(), static_cast<rpc::worker_id_t>(world.rank()),
                                                   world.size(), std::move(options),
                                                   std::unordered_map<std::string, rpc::DeviceMap>{},
                                                   std::vector<c10::Device>{}, std::make_unique<EchoCallback>());
    agent->start();
  }
  ~Agent() override {
    agent->join(/*shutdown=*/true);
    agent->shutdown();
  }
  std::shared_ptr<rpc::TensorPipeAgent> agent;
};

class AgentClient final : public Client {
 public:
  AgentClient() {
    g_job->control.post("open agent");
    agent_ = std::make_unique<Agent>();
    g_job->control.answer();
    peer_ = &agent_->agent->getWorkerInfo(rpc::worker_id_t{1});
  }
  ~AgentClient() override {
    g_job->control.post("close");
    agent_.reset();
    g_job->control.answer();
  }

  const void* round_trip(const at::Tensor& arg) override {
    auto request = c10::make_intrusive<rpc::Message>(std::vector<char>{}, std::vector<at::Tensor>{arg},
                                                     rpc::MessageType::SCRIPT_CALL);
    auto future = agent_->agent->send(*peer_, std::move(request));
    future->waitAndThrow();
    auto response = future->value().toCustomClass<rpc::Message>();
    if (response->tensors().size() != 1) fail("agent: bad echo");
    last_ = response->tensors()[0];
    return last_.data_ptr();
  }

 private:
  std::unique_ptr<Agent> agent_;
  const rpc::WorkerInfo* peer_ = nullptr;
  at::Tensor last_;
};

// ---- the raw TCP echo as a row ----------------------------------------------------------

class TcpClient final : public Client {
 public:
  const void* round_trip(const at::Tensor& arg) override { return g_tcp->round_trip(arg); }
};

// ---- rows -------------------------------------------------------------------------------

/// Rank 0: opens `kind` on both ranks; nullptr and why if it cannot run here.
std::unique_ptr<Client> open(Kind kind, std::string& why) {
  switch (kind) {
    case Kind::push:
      return std::make_unique<PushClient>();
    case Kind::tcp:
      return std::make_unique<TcpClient>();
    case Kind::agent:
      return std::make_unique<AgentClient>();
    default:
      break;
  }
  const TpSetup setup = tp_setup(kind);
  auto context = tp_context(setup, why);
  if (!context) return nullptr;
  const std::string url = g_job->control.call(std::string("open ") + kKindNames[static_cast<int>(kind)]);
  if (url.rfind("!", 0) == 0) {
    why = url.substr(1);
    return nullptr;
  }
  return std::make_unique<TpClient>(std::move(context), url);
}

/// Rank 1: carries out rank 0's commands until "stop".
void follow() {
  std::unique_ptr<Server> server;
  for (;;) {
    const std::string command = g_job->control.next();
    std::string answer;
    if (command == "stop") {
      g_job->control.reply(answer);
      return;
    }
    if (command == "close") {
      server.reset();
    } else if (command == "open agent") {
      server = std::make_unique<Agent>();
    } else {
      const TpSetup setup = tp_setup(kind_named(command.substr(std::strlen("open "))));
      if (auto context = tp_context(setup, answer)) {
        auto tp = std::make_unique<TpServer>(std::move(context), setup.transport);
        answer = tp->url(setup.transport);
        server = std::move(tp);
      } else {
        answer = "!" + answer;
      }
    }
    g_job->control.reply(answer);
  }
}

void BM_Echo(benchmark::State& state, Kind kind) {
  for (const char* name : {"us", "cpu_us", "threads", "tcp_us", "tcp_cpu_us", "ratio"}) state.counters[name] = 0;
  std::string why;
  auto client = open(kind, why);
  if (!client) {
    state.SkipWithError(why.c_str());
    return;
  }
  const int64_t bytes = state.range(0);
  const auto arg = torch::arange(bytes / 4, torch::kFloat);
  if (std::memcmp(client->round_trip(arg), arg.data_ptr(), arg.nbytes()) != 0)
    fail("the echo differs from the argument");
  const pid_t peer = g_job->peer;
  state.counters["threads"] = thread_count(peer);
  double seconds = 0;
  const double cpu = cpu_seconds(peer);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(client->round_trip(arg));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double row_cpu = cpu_seconds(peer) - cpu;
  client.reset();

  const auto n = static_cast<double>(state.iterations());
  g_tcp->round_trip(arg);  // warm-up
  const double tcp_cpu = cpu_seconds(peer);
  const auto tcp_start = std::chrono::steady_clock::now();
  for (benchmark::IterationCount i = 0; i < state.iterations(); ++i) benchmark::DoNotOptimize(g_tcp->round_trip(arg));
  const double tcp = std::chrono::duration<double>(std::chrono::steady_clock::now() - tcp_start).count();
  state.counters["us"] = seconds / n * 1e6;
  state.counters["cpu_us"] = row_cpu / n * 1e6;
  state.counters["tcp_us"] = tcp / n * 1e6;
  state.counters["tcp_cpu_us"] = (cpu_seconds(peer) - tcp_cpu) / n * 1e6;
  state.counters["ratio"] = seconds / tcp;
}

}  // namespace

int main(int argc, char** argv) {
  // The agent binds to the address of TP_SOCKET_IFNAME, else of the host name: keep it on
  // loopback like every other row.
  setenv("TP_SOCKET_IFNAME", "lo", 0);
  const pid_t peer = start_second_rank(argv[0]);
  auto world = push::dist::World::from_env();
  auto rpc = world.rpc_group("bench", world.names());
  Control control(world.store());
  Job job{std::move(world), std::move(rpc), std::move(control), peer};
  g_job = &job;
  if (peer == 0) {
    std::thread echo = serve_tcp_echo(job.world.store());
    follow();
    job.rpc.shutdown();
    echo.join();  // ends when rank 0 closes its connection
    return 0;
  }
  auto tcp = std::make_unique<TcpEcho>(job.world.store());
  g_tcp = tcp.get();
  const std::pair<const char*, int64_t> sizes[] = {{"16B", 16}, {"1MiB", 1 << 20}, {"64MiB", int64_t{64} << 20}};
  for (const auto& [label, bytes] : sizes) {
    for (int k = 0; k < static_cast<int>(std::size(kKindNames)); ++k) {
      auto* b = benchmark::RegisterBenchmark((std::string(kKindNames[k]) + "/" + label).c_str(), BM_Echo,
                                             static_cast<Kind>(k));
      b->Arg(bytes)->UseRealTime()->Unit(bytes > (1 << 20) ? benchmark::kMillisecond : benchmark::kMicrosecond);
      if (bytes > (1 << 20)) b->Iterations(10);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  job.control.call("stop");
  tcp.reset();
  job.rpc.shutdown();
  const int failed = push_bench::wait_ranks({peer});
  benchmark::Shutdown();
  return failed;
}
