// push::dist benchmarks on 127.0.0.1. The binary starts its own ranks 1 and 2 (fork + exec
// of itself), so it runs like any other benchmark:
//   push_bench_dist --benchmark_counters_tabular=true
// AllReduce/<bytes>: bus bandwidth (2(n-1)/n * bytes / time) through CollectiveGroup and
// through the same c10d ProcessGroupGloo called directly, both on ranks 0 and 1, in the
// same run; `ratio` is push / raw (target >= 0.95).
// Rpc/<bytes>: round-trip latency and calls/s of rpc_sync from rank 0's main thread (a
// plain user thread) to rank 1 with a float tensor argument echoed back (the _sockets rows through a group with shared
// memory off); tcp_us is the round trip of the same bytes echoed over one plain TCP connection (TCP_NODELAY) between
// the same two processes, in the same run, and ratio = rpc / tcp (for the large rows, 1/ratio is the throughput ratio);
// vs_memcpy is the time of two memcpy of the same bytes (there and back: the floor through shared memory) over the
// round trip's.
// Rpc/small and Rpc/small_fiber: 16-byte calls from the main thread and from a fiber of an
// event loop (where particle handlers and RPC handlers run), in batches of 250 that
// alternate with 250 calls through a group whose callers sleep at once (asleep_us:
// RpcGroupOptions::reply_spin 0) and 250 raw echoes from the main thread
// (paired_small_calls), 8 of each per repetition, 3 repetitions. Two more batches of raw
// echoes there give the floor of a design with an RPC's thread wake-ups (tcp_echo.h):
// tcp_3wake_us, the echo written by a second thread the reading one hands it to (as a
// request goes from the I/O thread to a handler), and tcp_4wake_us, the same with the
// caller woken by a thread that reads its connection (as a reply comes to a caller).
// Rpc/inflight64: calls per second into rank 1 from 2 caller processes (ranks 0 and 2)
// that keep 32 rpc_async calls in flight each; tcp_us is then the time per message of the
// raw echo driven the same way: ranks 0 and 2 each on a connection of their own, 32
// messages in flight on each (written 32 at a time, then read), rank 1 echoing each
// connection on a thread of its own.
// Store/<c10d|push>/<add|set_get/bytes>: one add, or a set and a get, from rank 0 to the
// job's store it hosts: push's own (authenticated, sealed) against a c10d TCPStore rank 0
// hosts beside it, in the same run; `ratio` is push's time over c10d's.
// Every row has a `ratio`, so CSV output works.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <benchmark/benchmark.h>
#include <push/dist.h>

#include "bench_ranks.h"
#include "core/event_loop.h"
#include "tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

namespace {

c10::IValue bench_echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(bench_echo);

constexpr int kWorldSize = 3;
constexpr int kReduceRanks = 2;  // the all_reduce rows run on ranks 0 and 1
// Commands from rank 0 (a broadcast to every rank): rank 1 mirrors every measured
// collective and serves the calls; rank 2 joins the 2-caller rows.
enum Command : int64_t {
  kStop = 0,
  kAllReducePush = 1,
  kAllReduceRaw = 2,
  kRpc = 3,
  kRpcInFlight = 4,
  kTcpInFlight = 5
};
constexpr int kCallers = 2, kDepth = 32, kPerCaller = 4000;

struct Job {
  push::dist::World world;
  push::dist::CollectiveGroup commands;            // every rank
  push::dist::CollectiveGroup pair;                // ranks 0 and 1
  c10::intrusive_ptr<c10d::ProcessGroupGloo> raw;  // ranks 0 and 1: Gloo called directly
  push::dist::RpcGroup rpc;
  push::dist::RpcGroup sockets;  // the same members, shared memory off
  push::dist::RpcGroup asleep;   // the same members, callers never look for replies (reply_spin 0)
};
Job* g_job = nullptr;

// ---- the raw TCP baseline (tcp_echo.h): rank 1 echoes, ranks 0 and 2 call ---------------

using push_bench::read_all;
using push_bench::write_all;

int g_tcp = -1;
int g_tcp_hand = -1;                                       // rank 0's connection for tcp_4wake_us
std::unique_ptr<push_bench::HandOffReader> g_hand_reader;  // reads it

/// Seconds to copy `bytes` there and back (two memcpy between buffers reused `count` times):
/// the floor of a round trip through shared memory.
double memcpy_round_trip(int64_t bytes, int64_t count) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(a.size(), 2);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(b.data(), a.data(), a.size());
    std::memcpy(a.data(), b.data(), a.size());
    benchmark::ClobberMemory();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(count);
}

/// Seconds per round trip of `bytes` echoed `count` times over the raw connection.
double tcp_round_trip(int64_t bytes, int64_t count, bool hand_off = false) {
  std::vector<char> out(static_cast<size_t>(bytes), 1), back(out.size());
  const uint64_t n = out.size() | (hand_off ? push_bench::kHandOff : 0);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < count; ++i) {
    write_all(g_tcp, &n, sizeof(n));
    write_all(g_tcp, out.data(), out.size());
    read_all(g_tcp, back.data(), back.size());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(count);
}

/// Seconds for `count` 16-byte echoes written by the echo's second thread and read by a
/// thread of this rank that wakes the caller (tcp_4wake_us).
double handed_off_echoes(int64_t count) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < count; ++i) g_hand_reader->round_trip(true);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_raw(const push::dist::World& world) {
  auto options = c10d::ProcessGroupGloo::Options::create(world.options().timeout());
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = world.options().gloo_threads();
  auto store = c10::make_intrusive<c10d::PrefixStore>("bench/raw/", push_bench::c10d_store(world));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, world.rank(), kReduceRanks, options);
}

/// Rank 0 tells rank 1 what to run next: [command, bytes, iterations].
void command(int64_t what, int64_t bytes, int64_t iterations) {
  auto c = torch::tensor({what, bytes, iterations}, torch::kLong);
  g_job->commands.broadcast(c, 0);
}

/// Exactly `count` all_reduces of `bytes` through push (or the raw Gloo group).
void all_reduce_loop(bool raw, int64_t bytes, int64_t count) {
  auto t = torch::ones({bytes / 4}, torch::kFloat);
  std::vector<at::Tensor> v{t};
  for (int64_t i = 0; i < count; ++i) {
    if (raw)
      g_job->raw->allreduce(v)->wait();
    else
      g_job->pair.all_reduce(t);
  }
}

double g_raw_busbw[64] = {};

/// Google Benchmark's CSV writer needs the same counters in every row: fills the ones a
/// row does not measure with 0.
void same_counters(benchmark::State& state) {
  for (const char* name : {"busbw_GBps", "us_per_call", "calls_per_s", "rpc_us", "asleep_us", "tcp_us", "tcp_3wake_us",
                           "tcp_4wake_us", "ratio", "vs_memcpy"}) {
    state.counters.try_emplace(name, 0.0);
  }
}

/// The job's store from rank 0 (which hosts it): `bytes` 0 is one add, else a set and a get
/// of a value of `bytes`. Through push's store (World::store: the handshake's proof at
/// connect, every message sealed) or a c10d TCPStore that rank 0 also hosts (`raw`).
double g_raw_store_us[32] = {};

void BM_Store(benchmark::State& state, bool raw) {
  const int64_t bytes = state.range(0);
  static const c10::intrusive_ptr<c10d::Store> c10d = push_bench::c10d_store(g_job->world);
  const push::dist::Store store = g_job->world.store();
  const std::vector<uint8_t> value(static_cast<std::size_t>(bytes), 7);
  int64_t calls = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (bytes == 0) {
      benchmark::DoNotOptimize(raw ? c10d->add("bench/store/n", 1) : store.add("bench/store/n", 1));
    } else if (raw) {
      c10d->set("bench/store/v", value);
      benchmark::DoNotOptimize(c10d->get("bench/store/v"));
    } else {
      store.set("bench/store/v", value);
      benchmark::DoNotOptimize(store.get("bench/store/v"));
    }
    ++calls;
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
  const int slot = bytes == 0 ? 0 : static_cast<int>(std::log2(static_cast<double>(bytes)));
  if (raw) g_raw_store_us[slot] = us;
  state.counters["us_per_call"] = us;
  // push's time over c10d's, measured just before (raw rows: 1).
  state.counters["ratio"] = g_raw_store_us[slot] > 0 ? us / g_raw_store_us[slot] : 0.0;
  same_counters(state);
}

void BM_AllReduce(benchmark::State& state, bool raw) {
  const int64_t bytes = state.range(0);
  // Rank 1 needs the iteration count before the loop starts: measure in fixed batches.
  const int64_t iterations = std::max<int64_t>(3, std::min<int64_t>(200, (int64_t{64} << 20) / bytes));
  double seconds = 0;
  int64_t total = 0;
  for (auto _ : state) {
    command(raw ? kAllReduceRaw : kAllReducePush, bytes, iterations);
    all_reduce_loop(raw, bytes, 1);  // warm-up (rank 1 does the same)
    const auto start = std::chrono::steady_clock::now();
    all_reduce_loop(raw, bytes, iterations);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total += iterations;
  }
  const double per_call = seconds / static_cast<double>(total);
  const double busbw = 2.0 * (kReduceRanks - 1) / kReduceRanks * static_cast<double>(bytes) / per_call;
  state.counters["busbw_GBps"] = busbw / 1e9;
  state.counters["us_per_call"] = per_call * 1e6;
  const int slot = static_cast<int>(std::log2(static_cast<double>(bytes)));
  if (raw) g_raw_busbw[slot] = busbw;
  // raw rows compare with themselves (1), so that every row has the same counters.
  state.counters["ratio"] = g_raw_busbw[slot] > 0 ? busbw / g_raw_busbw[slot] : 0.0;
  same_counters(state);
}

/// The counters of an Rpc row: `calls` calls took `rpc_s` seconds; the raw TCP echo of the
/// same `bytes` runs as many round trips now, and two memcpy of them as the floor.
void report_calls(benchmark::State& state, double rpc_s, int64_t calls, std::size_t bytes) {
  const double rpc_per_call = rpc_s / static_cast<double>(calls);
  tcp_round_trip(static_cast<int64_t>(bytes), 1);  // warm-up
  const double tcp_per_call = tcp_round_trip(static_cast<int64_t>(bytes), calls);
  state.counters["calls_per_s"] = 1.0 / rpc_per_call;
  state.counters["rpc_us"] = rpc_per_call * 1e6;
  state.counters["tcp_us"] = tcp_per_call * 1e6;
  state.counters["ratio"] = rpc_per_call / tcp_per_call;
  // Throughput as a fraction of memcpy's (1 = as fast as copying the bytes there and back).
  state.counters["vs_memcpy"] = memcpy_round_trip(static_cast<int64_t>(bytes), calls) / rpc_per_call;
  same_counters(state);
}

void BM_Rpc(benchmark::State& state, bool sockets) {
  auto& rpc = sockets ? g_job->sockets : g_job->rpc;
  const int64_t bytes = state.range(0);
  command(kRpc, bytes, 0);
  auto arg = torch::ones({std::max<int64_t>(1, bytes / 4)}, torch::kFloat);
  rpc.rpc_sync(1, "bench_echo", {arg});
  double rpc_s = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    auto back = rpc.rpc_sync(1, "bench_echo", {arg});
    benchmark::DoNotOptimize(back);
    rpc_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  report_calls(state, rpc_s, static_cast<int64_t>(state.iterations()), arg.nbytes());
}

/// The small rows: batches of 16-byte calls alternate with as many calls through a group
/// whose callers sleep at once (reply_spin 0: the code before callers looked for replies)
/// and as many raw TCP round trips, so that all three see the same machine (on a VM a
/// round trip's cost swings with where its threads run); the figures are of the sums.
/// `batch(group, calls)` makes `calls` calls through `group` and returns their seconds.
template <class Batch>
void paired_small_calls(benchmark::State& state, Batch batch) {
  constexpr int64_t kBatch = 250, kRounds = 8;
  batch(g_job->rpc, 50);  // warm-up
  batch(g_job->asleep, 50);
  tcp_round_trip(16, 50);
  tcp_round_trip(16, 50, true);
  handed_off_echoes(50);
  double rpc_s = 0, asleep_s = 0, tcp_s = 0, tcp3_s = 0, tcp4_s = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    for (int64_t r = 0; r < kRounds; ++r) {
      rpc_s += batch(g_job->rpc, kBatch);
      asleep_s += batch(g_job->asleep, kBatch);
      tcp_s += tcp_round_trip(16, kBatch) * kBatch;
      tcp3_s += tcp_round_trip(16, kBatch, true) * kBatch;
      tcp4_s += handed_off_echoes(kBatch);
      calls += kBatch;
    }
  }
  const auto n = static_cast<double>(calls);
  state.counters["calls_per_s"] = n / rpc_s;
  state.counters["rpc_us"] = rpc_s / n * 1e6;
  state.counters["asleep_us"] = asleep_s / n * 1e6;
  state.counters["tcp_us"] = tcp_s / n * 1e6;
  state.counters["tcp_3wake_us"] = tcp3_s / n * 1e6;
  state.counters["tcp_4wake_us"] = tcp4_s / n * 1e6;
  state.counters["ratio"] = rpc_s / tcp_s;
  state.counters["vs_memcpy"] = memcpy_round_trip(16, calls) * n / rpc_s;
  same_counters(state);
}

/// Rpc/small: from rank 0's main thread (a plain user thread).
void BM_RpcSmall(benchmark::State& state) {
  command(kRpc, 16, 0);
  auto arg = torch::ones({4}, torch::kFloat);
  paired_small_calls(state, [&](push::dist::RpcGroup& group, int64_t calls) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) benchmark::DoNotOptimize(group.rpc_sync(1, "bench_echo", {arg}));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

/// Rpc/small_fiber: from a fiber of an event loop (where particle handlers and RPC handlers
/// run).
void BM_RpcFromFiber(benchmark::State& state) {
  command(kRpc, 16, 0);
  auto arg = torch::ones({4}, torch::kFloat);
  auto loop = std::make_shared<push::detail::EventLoop>(push::detail::EventLoop::Options{.name = "bench-fiber"});
  loop->start();
  paired_small_calls(state, [&](push::dist::RpcGroup& group, int64_t calls) {
    push::Promise<double> seconds;
    loop->post_fiber(
        [&, calls] {
          const auto start = std::chrono::steady_clock::now();
          for (int64_t i = 0; i < calls; ++i) benchmark::DoNotOptimize(group.rpc_sync(1, "bench_echo", {arg}));
          seconds.set_value(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        },
        [&](std::exception_ptr e) { seconds.set_error(e); });
    return seconds.future().wait();
  });
  loop->stop();
}

/// One caller's share of Rpc/inflight64 (ranks 0 and 2): kPerCaller echo calls into rank 1,
/// kDepth in flight.
void rpc_caller() {
  auto arg = torch::ones({4}, torch::kFloat);
  std::deque<push::Future<c10::IValue>> window;
  for (int i = 0; i < kPerCaller; ++i) {
    if (window.size() == kDepth) {
      window.front().wait();
      window.pop_front();
    }
    window.push_back(g_job->rpc.rpc_async(1, "bench_echo", {arg}));
  }
  for (auto& f : window) f.wait();
}

/// One caller's share of the raw baseline: kPerCaller messages of 16 bytes echoed over
/// this rank's connection, kDepth in flight (written kDepth at a time, then read).
void tcp_caller() {
  constexpr uint64_t kBytes = 16;
  std::vector<char> batch, back(kBytes);
  for (int i = 0; i < kDepth; ++i) {
    const auto* n = reinterpret_cast<const char*>(&kBytes);
    batch.insert(batch.end(), n, n + sizeof(kBytes));
    batch.insert(batch.end(), kBytes, 1);
  }
  for (int done = 0; done < kPerCaller; done += kDepth) {
    write_all(g_tcp, batch.data(), batch.size());
    for (int i = 0; i < kDepth; ++i) read_all(g_tcp, back.data(), back.size());
  }
}

/// Seconds for ranks 0 and 2 to run `what` together: the command starts rank 2, a
/// barrier after both callers have finished ends the measurement.
double two_callers(Command what, void (*caller)()) {
  const auto start = std::chrono::steady_clock::now();
  command(what, 0, 0);
  caller();
  g_job->commands.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BM_RpcInFlight(benchmark::State& state) {
  two_callers(kRpcInFlight, rpc_caller);  // warm-up
  double seconds = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    seconds += two_callers(kRpcInFlight, rpc_caller);
    calls += kCallers * kPerCaller;
  }
  two_callers(kTcpInFlight, tcp_caller);  // warm-up
  double tcp_seconds = 0;
  for (int64_t i = 0; i < state.iterations(); ++i) tcp_seconds += two_callers(kTcpInFlight, tcp_caller);
  const double per_call = seconds / static_cast<double>(calls);
  const double tcp = tcp_seconds / static_cast<double>(calls);
  state.counters["calls_per_s"] = 1.0 / per_call;
  state.counters["rpc_us"] = per_call * 1e6;
  state.counters["tcp_us"] = tcp * 1e6;
  state.counters["ratio"] = per_call / tcp;
  same_counters(state);
}

// Ranks 1 and 2: follow rank 0's commands until told to stop. Rank 1 mirrors the
// collectives (its RPC group's threads serve the calls); rank 2 is the second caller.
void follow() {
  for (;;) {
    auto c = torch::zeros({3}, torch::kLong);
    g_job->commands.broadcast(c, 0);
    const int64_t what = c[0].item<int64_t>(), bytes = c[1].item<int64_t>(), n = c[2].item<int64_t>();
    if (what == kStop) return;
    if (what == kRpcInFlight || what == kTcpInFlight) {
      if (g_job->world.rank() == 2) (what == kRpcInFlight ? rpc_caller : tcp_caller)();
      g_job->commands.barrier();
    } else if ((what == kAllReducePush || what == kAllReduceRaw) && g_job->world.rank() == 1) {
      all_reduce_loop(what == kAllReduceRaw, bytes, 1);
      all_reduce_loop(what == kAllReduceRaw, bytes, n);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool child = std::getenv("PUSH_DIST_BENCH_CHILD") != nullptr;
  const std::vector<pid_t> peers = push_bench::start_ranks(argv[0], kWorldSize);
  Job job{push::dist::World::from_env(), {}, {}, {}, {}, {}};
  job.commands = job.world.collective();
  if (job.world.rank() < kReduceRanks) {
    job.pair = job.world.new_group({0, 1});
    job.raw = make_raw(job.world);
  }
  job.rpc = job.world.rpc_group("bench", job.world.names());
  job.sockets =
      job.world.rpc_group("bench-sockets", job.world.names(), push::dist::RpcGroupOptions().shared_memory(false));
  job.asleep = job.world.rpc_group("bench-asleep", job.world.names(),
                                   push::dist::RpcGroupOptions().reply_spin(std::chrono::microseconds(0)));
  g_job = &job;
  std::thread echo;
  if (job.world.rank() == 1)
    echo = push_bench::serve_tcp_echo(job.world.store(), kCallers + 1);  // rank 0 connects twice
  else
    g_tcp = push_bench::connect_tcp_echo(job.world.store());
  if (job.world.rank() == 0) {
    g_tcp_hand = push_bench::connect_tcp_echo(job.world.store());
    g_hand_reader = std::make_unique<push_bench::HandOffReader>(g_tcp_hand, 16);
  }
  if (child) {
    follow();
    job.rpc.shutdown();
    job.sockets.shutdown();
    job.asleep.shutdown();
    if (g_tcp >= 0) close(g_tcp);
    if (echo.joinable()) echo.join();  // ends when ranks 0 and 2 close their connections
    return 0;
  }
  for (int64_t bytes = 1 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    benchmark::RegisterBenchmark(("AllReduce/raw_gloo/" + std::to_string(bytes)).c_str(), BM_AllReduce, true)
        ->Arg(bytes)
        ->Iterations(3)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("AllReduce/push/" + std::to_string(bytes)).c_str(), BM_AllReduce, false)
        ->Arg(bytes)
        ->Iterations(3)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (const int64_t bytes : {int64_t{0}, int64_t{1} << 10, int64_t{1} << 20}) {
    const std::string what = bytes == 0 ? std::string("add") : "set_get/" + std::to_string(bytes);
    benchmark::RegisterBenchmark(("Store/c10d/" + what).c_str(), BM_Store, true)
        ->Arg(bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Store/push/" + what).c_str(), BM_Store, false)
        ->Arg(bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("Rpc/small", BM_RpcSmall)->Iterations(3)->UseRealTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Rpc/small_fiber", BM_RpcFromFiber)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Rpc/1MiB", BM_Rpc, false)->Arg(1 << 20)->UseRealTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Rpc/64MiB", BM_Rpc, false)
      ->Arg(64 << 20)
      ->Iterations(10)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("Rpc/1MiB_sockets", BM_Rpc, true)
      ->Arg(1 << 20)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Rpc/64MiB_sockets", BM_Rpc, true)
      ->Arg(64 << 20)
      ->Iterations(10)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("Rpc/inflight64", BM_RpcInFlight)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  command(kStop, 0, 0);
  close(g_tcp);
  g_hand_reader.reset();  // ends the connection and its reading thread
  close(g_tcp_hand);
  job.rpc.shutdown();
  job.sockets.shutdown();
  job.asleep.shutdown();
  const int failed = push_bench::wait_ranks(peers);
  benchmark::Shutdown();
  return failed;
}
