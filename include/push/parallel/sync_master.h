#pragma once
// SyncMaster: an in-process rendezvous of N participants (threads, device lanes, fibers),
// jactorch's SyncMaster / SlavePipe. Each participant hands in one message per round; the
// last to arrive runs `callback` on all of them (in participant order) and every
// participant gets its own result back.
//
//   push::parallel::SyncMaster<torch::Tensor, torch::Tensor> sum(4, [](std::vector<torch::Tensor> parts) {
//     auto total = torch::stack(parts).sum(0);
//     return std::vector<torch::Tensor>(parts.size(), total);
//   });
//   // on participant i's thread:  auto total = sum.exchange(i, my_part);
//
// Unlike jactorch: a participant that waits longer than `timeout` for the others to arrive
// fails with a push::Error naming the participants that never arrived (the round is then
// broken for everyone: each waiting participant fails too; once all have arrived, the
// callback may take as long as it takes); a callback that throws fails every participant
// of the round with its error. A wait inside a fiber suspends the fiber.
// Rounds repeat: each participant calls exchange once per round.
//
// Participants may also join at run time, as jactorch's replicas do when DataParallel
// replicates a module: a SyncMaster built from the callback alone has the master as
// participant 0 (run_master), and each register_slave() adds one and returns its pipe:
//
//   push::parallel::SyncMaster<int, int> sum(callback);
//   auto pipe = sum.register_slave();           // participant 1
//   // on the slave's thread: pipe.run_slave(msg); on the master's: sum.run_master(msg)
//
// As in jactorch, registering after a round has run starts a new set of slaves (the
// replicas of the next replication): the earlier pipes are retired, and using one is a
// push::Error. Registering while a round is under way is a push::Error. The SyncMaster
// must outlive its pipes.
#include <push/core/errors.h>
#include <push/core/future.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace push::parallel {

template <class Msg, class Result>
class SyncMaster {
 public:
  using Callback = std::function<std::vector<Result>(std::vector<Msg>)>;

  SyncMaster(int participants, Callback callback, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : n_(participants), callback_(std::move(callback)), timeout_(timeout) {
    PUSH_CHECK(participants >= 1, kOrigin, "participants must be >= 1, got ", participants);
    reset_locked();
  }
  /// jactorch's SyncMaster(master_callback): the master alone, slaves register at run time.
  explicit SyncMaster(Callback callback, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : n_(1), registering_(true), callback_(std::move(callback)), timeout_(timeout) {
    reset_locked();
  }
  SyncMaster(const SyncMaster&) = delete;
  SyncMaster& operator=(const SyncMaster&) = delete;

  int participants() const {
    std::lock_guard lock(mutex_);
    return n_;
  }
  /// jactorch's nr_slaves: the participants besides the master.
  int slaves() const { return participants() - 1; }

  /// A registered participant's end (jactorch's SlavePipe); cheap to copy.
  class SlavePipe {
   public:
    /// Its place in the callback's messages and results (the master is 0).
    int index() const { return index_; }
    /// Hands in this slave's message of the round; returns its result once all arrived.
    Result run_slave(Msg message) const { return master_->arrive(index_, generation_, std::move(message)); }

   private:
    friend class SyncMaster;
    SlavePipe(SyncMaster* master, int index, uint64_t generation)
        : master_(master), index_(index), generation_(generation) {}
    SyncMaster* master_;
    int index_;
    uint64_t generation_;
  };

  /// Adds a participant (jactorch's register_slave); the first after a round has run
  /// starts a new set of slaves.
  SlavePipe register_slave() {
    std::lock_guard lock(mutex_);
    PUSH_CHECK(registering_, kOrigin, "register_slave: this SyncMaster has a fixed ", n_,
               " participants (build it from the callback alone to register them)");
    PUSH_CHECK(round_->arrived == 0, kOrigin, "register_slave: a round is under way (", round_->arrived, " of ", n_,
               " have arrived)");
    if (ran_) {  // a new replication: the earlier slaves are retired
      ++generation_;
      n_ = 1;
      ran_ = false;
    }
    ++n_;
    reset_locked();
    return SlavePipe(this, n_ - 1, generation_);
  }
  /// The master's message of this round (participant 0); returns its result.
  Result run_master(Msg message) { return exchange(0, std::move(message)); }

  /// Participant `index`'s message of this round; returns its result once all arrived.
  Result exchange(int index, Msg message) { return arrive(index, std::nullopt, std::move(message)); }

 private:
  static constexpr const char* kOrigin = "push::parallel::SyncMaster";

  Result arrive(int index, std::optional<uint64_t> generation, Msg message) {
    std::shared_ptr<Round> round;
    bool last = false;
    {
      std::lock_guard lock(mutex_);
      PUSH_CHECK(!generation || *generation == generation_, kOrigin, "the pipe of participant ", index,
                 " was retired: slaves registered after it began a new set (register again)");
      PUSH_CHECK(index >= 0 && index < n_, kOrigin, "participant ", index, " of ", n_);
      round = round_;
      PUSH_CHECK(!round->messages[index].has_value(), kOrigin, "participant ", index, " arrived twice in one round");
      round->messages[index] = std::move(message);
      ran_ = true;
      last = ++round->arrived == n_;
      if (last) reset_locked();  // the next round starts clean
    }
    if (last) {
      std::exception_ptr error;
      std::vector<Result> results;
      try {
        std::vector<Msg> all;
        for (auto& m : round->messages) all.push_back(std::move(*m));
        results = callback_(std::move(all));
        const auto n = round->messages.size();
        PUSH_CHECK(results.size() == n, kOrigin, "the callback returned ", results.size(), " results for ", n,
                   " participants");
      } catch (...) {
        error = std::current_exception();
      }
      try {
        if (!error) {
          // Each participant takes its own result out (below), so that no other thread
          // holds it when its owner is done with it.
          std::lock_guard lock(mutex_);
          for (size_t i = 0; i < results.size(); ++i) round->taken[i] = std::move(results[i]);
        }
        if (error) {
          round->results.set_error(error);
        } else {
          round->results.set_value(true);
        }
      } catch (const Error&) {
        // A participant gave up on the round first: it already failed everyone.
      }
    }
    auto future = round->results.future();
    if (!future.wait_for(timeout_)) {
      std::vector<int> missing;
      {
        std::lock_guard lock(mutex_);
        for (size_t i = 0; i < round->messages.size(); ++i) {
          if (!round->messages[i].has_value()) missing.push_back(static_cast<int>(i));
        }
        if (round_ == round && !missing.empty()) reset_locked();  // abandon the broken round
      }
      // Everyone came and the callback (a collective across ranks, say) is still running:
      // the round is whole, so wait for it.
      if (missing.empty()) return take(*round, future, index);
      std::string names;
      for (int i : missing) names += (names.empty() ? "" : ", ") + std::to_string(i);
      auto error = std::make_exception_ptr(
          Error(c10::str("[", kOrigin, "] participant", missing.size() == 1 ? " " : "s ", names, " of ",
                         round->messages.size(), " did not arrive within ", timeout_.count(), " ms")));
      try {
        round->results.set_error(error);  // the others waiting fail with the same error
      } catch (...) {
        // completed meanwhile
      }
    }
    return take(*round, future, index);
  }

  struct Round {
    std::vector<std::optional<Msg>> messages;
    std::vector<std::optional<Result>> taken;
    int arrived = 0;
    Promise<bool> results;  // set once `taken` is filled (or failed)
  };
  void reset_locked() {
    round_ = std::make_shared<Round>();
    round_->messages.resize(n_);
    round_->taken.resize(n_);
  }
  Result take(Round& round, const Future<bool>& future, int index) {
    future.wait();  // rethrows the round's failure
    std::lock_guard lock(mutex_);
    Result mine = std::move(*round.taken[index]);
    round.taken[index].reset();
    return mine;
  }

  int n_;                     // participants of the next round
  bool registering_ = false;  // built from the callback alone: slaves register
  bool ran_ = false;          // a round began since the last registration
  uint64_t generation_ = 0;   // the set of slaves pipes belong to
  Callback callback_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::shared_ptr<Round> round_;
};

}  // namespace push::parallel
