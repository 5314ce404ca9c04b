// World and CollectiveGroup across 2-4 processes; start-up errors in one process.
#include "dist_test_util.h"

#include <test_util.h>

#include <csignal>
#include <thread>

using namespace std::chrono_literals;
using push::dist::ReduceOp;
using push::dist::World;
using push::dist::WorldOptions;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

double factorial(int n) { return n <= 1 ? 1.0 : n * factorial(n - 1); }

}  // namespace

PUSH_DIST_WORKER(all_reduce) {
  auto world = push::testing::test_world();
  const int n = world.size();
  const double r1 = world.rank() + 1.0;
  auto group = world.collective();
  EXPECT_EQ(group.size(), n);
  EXPECT_EQ(world.name(), "worker" + std::to_string(world.rank()));
  EXPECT_EQ(world.rank_of("worker0"), 0);
  auto t = torch::full({4}, r1);
  group.all_reduce(t);
  EXPECT_TRUE(t.eq(n * (n + 1) / 2.0).all().item<bool>()) << t;
  t.fill_(r1);
  group.all_reduce(t, ReduceOp::product);
  EXPECT_DOUBLE_EQ(t[0].item<double>(), factorial(n));
  t.fill_(r1);
  group.all_reduce(t, ReduceOp::min);
  EXPECT_DOUBLE_EQ(t[3].item<double>(), 1.0);
  t.fill_(r1);
  group.all_reduce(t, ReduceOp::max);
  EXPECT_DOUBLE_EQ(t[1].item<double>(), n);
  t.fill_(r1);
  auto work = group.all_reduce_async(t, ReduceOp::average);
  work.wait(10s);
  EXPECT_TRUE(work.is_completed());
  EXPECT_DOUBLE_EQ(t[2].item<double>(), (n + 1) / 2.0);
  auto ints = torch::full({3}, world.rank() + 1, torch::kLong);
  EXPECT_PUSH_ERROR(group.all_reduce(ints, ReduceOp::average), "floating-point");
  group.all_reduce(ints);
  EXPECT_EQ(ints[0].item<int64_t>(), n * (n + 1) / 2);
  world.barrier();
}

TEST(DistCollective, AllReduceEveryOp) {
  expect_all_ok(run_workers(2, "all_reduce"));
  expect_all_ok(run_workers(4, "all_reduce"));
}

PUSH_DIST_WORKER(collectives) {
  auto world = push::testing::test_world();
  const int n = world.size(), rank = world.rank();
  auto group = world.collective();
  // all_gather: slot i holds rank i's tensor
  std::vector<torch::Tensor> gathered;
  group.all_gather(gathered, torch::full({2}, rank * 3.0));
  ASSERT_EQ(static_cast<int>(gathered.size()), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(gathered[i][1].item<double>(), i * 3.0);
  // broadcast from the last rank
  auto b = torch::full({3}, rank == n - 1 ? 42.0 : -1.0);
  group.broadcast_async(b, n - 1).wait();
  EXPECT_EQ(b[0].item<double>(), 42.0);
  // gather to rank 1
  std::vector<torch::Tensor> at_one;
  group.gather(torch::full({1}, rank * 10.0), at_one, 1);
  if (rank == 1) {
    ASSERT_EQ(static_cast<int>(at_one.size()), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(at_one[i].item<double>(), i * 10.0);
  }
  // scatter from rank 0
  std::vector<torch::Tensor> pieces;
  if (rank == 0) {
    for (int i = 0; i < n; ++i) pieces.push_back(torch::full({2}, 100.0 + i));
  }
  auto mine = torch::empty({2});
  group.scatter(mine, pieces, 0);
  EXPECT_EQ(mine[1].item<double>(), 100.0 + rank);
  // reduce to the last rank
  auto r = torch::full({2}, rank + 1.0);
  group.reduce(r, n - 1);
  if (rank == n - 1) EXPECT_EQ(r[0].item<double>(), n * (n + 1) / 2.0);
  auto avg = torch::full({1}, rank * 2.0);
  group.reduce_async(avg, 0, ReduceOp::average).wait();
  if (rank == 0) EXPECT_DOUBLE_EQ(avg.item<double>(), (n - 1.0));
  for (int i = 0; i < 20; ++i) group.barrier();
  group.barrier_async().wait(5s);
}

TEST(DistCollective, GatherScatterBroadcastReduceBarrier) { expect_all_ok(run_workers(3, "collectives")); }

// Complex tensors cross every collective as their real and imaginary parts, as
// torch.distributed's Python layer sends them; reductions that order values refuse them.
PUSH_DIST_WORKER(complex_collectives) {
  auto world = push::testing::test_world();
  const int n = world.size(), rank = world.rank();
  auto group = world.collective();
  const auto mine = [&](double scale) {
    return torch::complex(torch::full({3}, scale * (rank + 1)), torch::full({3}, -scale * rank));
  };
  auto t = mine(1.0);
  group.all_reduce(t);
  EXPECT_EQ(t.scalar_type(), torch::kComplexFloat);
  EXPECT_TRUE(torch::equal(torch::real(t), torch::full({3}, n * (n + 1) / 2.0)));
  EXPECT_TRUE(torch::equal(torch::imag(t), torch::full({3}, -n * (n - 1) / 2.0)));
  t = mine(2.0);
  group.all_reduce(t, ReduceOp::average);
  EXPECT_TRUE(torch::allclose(torch::real(t), torch::full({3}, n + 1.0)));
  EXPECT_PUSH_ERROR(group.all_reduce(t, ReduceOp::max), "max on complex tensors");
  EXPECT_PUSH_ERROR(group.all_reduce(t, ReduceOp::product), "product on complex tensors");
  std::vector<torch::Tensor> gathered;
  group.all_gather(gathered, mine(1.0));
  ASSERT_EQ(static_cast<int>(gathered.size()), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(gathered[i].is_complex());
    EXPECT_EQ(gathered[i][0].item<c10::complex<float>>(), c10::complex<float>(i + 1.0F, -1.0F * i));
  }
  auto b = rank == 1 ? mine(5.0) : torch::zeros({3}, torch::kComplexFloat);
  group.broadcast(b, 1);
  EXPECT_EQ(b[2].item<c10::complex<float>>(), c10::complex<float>(10.0F, -5.0F));
  if (rank == 0) group.send(torch::complex(torch::ones({2}, torch::kDouble), torch::ones({2}, torch::kDouble)), 1, 3);
  if (rank == 1) {
    auto got = torch::zeros({2}, torch::kComplexDouble);
    EXPECT_EQ(group.recv(got, 0, 3), 0);
    EXPECT_EQ(got[1].item<c10::complex<double>>(), c10::complex<double>(1.0, 1.0));
  }
  world.barrier();
}

TEST(DistCollective, ComplexTensorsCrossAsTheirRealAndImaginaryParts) {
  expect_all_ok(run_workers(3, "complex_collectives"));
}

PUSH_DIST_WORKER(point_to_point) {
  auto world = push::testing::test_world();
  const int n = world.size(), rank = world.rank();
  auto group = world.collective();
  if (rank == 0) {
    // From any source: every other rank once, reporting who sent it.
    std::vector<int> seen;
    for (int i = 1; i < n; ++i) {
      auto t = torch::empty({4});
      const int from = group.recv(t, std::nullopt, 5);
      EXPECT_EQ(t[0].item<double>(), from * 7.0);
      seen.push_back(from);
    }
    std::sort(seen.begin(), seen.end());
    for (int i = 1; i < n; ++i) EXPECT_EQ(seen[i - 1], i);
    // Tags: rank 1 sent tag 1 then tag 2; take tag 2 first.
    auto t2 = torch::empty({1}), t1 = torch::empty({1});
    auto w2 = group.irecv(t2, 1, 2);
    w2.wait(10s);
    EXPECT_EQ(w2.source_rank(), 1);
    EXPECT_EQ(group.recv(t1, 1, 1), 1);
    EXPECT_EQ(t1.item<double>(), 1.0);
    EXPECT_EQ(t2.item<double>(), 2.0);
  } else {
    group.send(torch::full({4}, rank * 7.0), 0, 5);
    if (rank == 1) {
      auto a = group.isend(torch::full({1}, 1.0), 0, 1);
      auto b = group.isend(torch::full({1}, 2.0), 0, 2);
      a.wait(10s);
      b.wait(10s);
    }
  }
  EXPECT_PUSH_ERROR(group.send(torch::ones({1}), rank, 0), "itself");
  EXPECT_PUSH_ERROR(group.send(torch::ones({1}), n + 5, 0), "not a member");
  EXPECT_PUSH_ERROR(group.send(torch::ones({1}), (rank + 1) % n, -1), "tags are >= 0");
  world.barrier();
}

TEST(DistCollective, TaggedSendRecvAndAnySource) { expect_all_ok(run_workers(3, "point_to_point")); }

PUSH_DIST_WORKER(subgroups) {
  auto world = push::testing::test_world();
  const int rank = world.rank();
  const std::vector<int> mine = rank % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
  EXPECT_PUSH_ERROR(world.new_group(rank % 2 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}),
                    "only members create a group");
  auto group = world.new_group(mine);
  EXPECT_EQ(group.ranks(), mine);
  auto t = torch::full({1}, rank + 1.0);
  group.all_reduce(t);
  EXPECT_EQ(t.item<double>(), mine[0] + mine[1] + 2.0);
  // Any-source receive reports the *global* rank of the sender.
  auto x = torch::empty({1});
  if (rank == mine[0]) {
    EXPECT_EQ(group.recv(x), mine[1]);
    EXPECT_EQ(x.item<double>(), mine[1] * 1.0);
  } else {
    group.send(torch::full({1}, rank * 1.0), mine[0]);
  }
  // A second group over the same ranks is a different group.
  auto again = world.new_group(mine, push::dist::CollectiveGroupOptions().timeout(5s));
  EXPECT_EQ(again.timeout(), 5s);
  auto u = torch::ones({1});
  again.all_reduce(u);
  EXPECT_EQ(u.item<double>(), 2.0);
  world.barrier();
}

TEST(DistCollective, SubgroupsOfRanks) { expect_all_ok(run_workers(4, "subgroups")); }

// -- failures -----------------------------------------------------------------------------

PUSH_DIST_WORKER(dies_mid_collective) {
  auto world = World(WorldOptions::from_env().timeout(5s).shutdown_timeout(2s));
  auto group = world.collective();
  group.barrier();
  if (world.rank() == world.size() - 1) {
    // Die while the others are inside the all_reduce, waiting for this rank's data: real time
    // is the point, since what is timed is other processes reaching Gloo's wait.
    std::this_thread::sleep_for(300ms);
    std::raise(SIGKILL);
  }
  auto t = torch::ones({1 << 20});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_PUSH_ERROR(group.all_reduce(t), "all_reduce");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s + 5s);
}

TEST(DistFailure, RankKilledMidCollective) {
  auto codes = run_workers(3, "dies_mid_collective", 60s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

TEST(DistStartup, NobodyListeningOnMasterPort) {
  const int port = push::dist::free_port();
  EXPECT_PUSH_ERROR(World(WorldOptions().rank(1).world_size(2).master_port(port).init_timeout(1500ms)),
                    "cannot reach the store at 127.0.0.1:" + std::to_string(port));
}

TEST(DistStartup, UnresolvableMasterAddress) {
  EXPECT_PUSH_ERROR(World(WorldOptions()
                              .rank(1)
                              .world_size(2)
                              .master_addr("no-such-host.invalid")
                              .master_port(push::dist::free_port())
                              .init_timeout(1500ms)),
                    "no-such-host.invalid");
}

TEST(DistStartup, MissingRankNeverJoins) {
  // Rank 0 of 2 alone: the store starts, the second rank never comes.
  EXPECT_PUSH_ERROR(
      World(WorldOptions().rank(0).world_size(2).master_port(push::dist::free_port()).init_timeout(1500ms)),
      "rank 1 did not join at 127.0.0.1:");
}

TEST(DistStartup, EnvironmentErrors) {
  auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const std::string& key) -> std::optional<std::string> {
      auto it = vars.find(key);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  EXPECT_PUSH_ERROR(WorldOptions::from_env(env({{"RANK", "0"}})), "WORLD_SIZE is not set");
  EXPECT_PUSH_ERROR(WorldOptions::from_env(env({{"WORLD_SIZE", "2"}})), "RANK is not set");
  EXPECT_PUSH_ERROR(WorldOptions::from_env(env({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                    "rank 2 is out of range for world size 2");
  EXPECT_PUSH_ERROR(WorldOptions::from_env(env({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), "RANK='x' is not an integer");
  EXPECT_PUSH_ERROR(WorldOptions::from_env(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}})),
                    "not in 1..65535");
  auto torchrun = WorldOptions::from_env(env(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(torchrun.rank(), 1);
  EXPECT_EQ(torchrun.world_size(), 4);
  EXPECT_EQ(torchrun.master_addr(), "10.0.0.1");
  EXPECT_EQ(torchrun.master_port(), 1234);
  auto mpi = WorldOptions::from_env(
      env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(mpi.rank(), 3);
  EXPECT_EQ(mpi.world_size(), 8);
  EXPECT_EQ(mpi.local_rank(), 1);
  auto slurm = WorldOptions::from_env(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}}));
  EXPECT_EQ(slurm.rank(), 5);
  EXPECT_EQ(slurm.world_size(), 6);
  EXPECT_PUSH_ERROR(World(WorldOptions().rank(3).world_size(2)), "out of range");
}

TEST(DistCollective, AllReduce_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // One process: a world of one still runs the CUDA path end to end.
  World world(WorldOptions().master_port(push::dist::free_port()));
  auto t = torch::ones({4}, torch::kCUDA);
  world.collective().all_reduce(t);
  EXPECT_EQ(t.sum().item<double>(), 4.0);
}
