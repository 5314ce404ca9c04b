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
    PUSH_CHECK(participants >= 1, "push::parallel::SyncMaster", "participants must be >= 1, got ", participants);
    reset_locked();
  }
  int participants() const { return n_; }

  /// Participant `index`'s message of this round; returns its result once all arrived.
  Result exchange(int index, Msg message) {
    PUSH_CHECK(index >= 0 && index < n_, "push::parallel::SyncMaster", "participant ", index, " of ", n_);
    std::shared_ptr<Round> round;
    bool last = false;
    {
      std::lock_guard lock(mutex_);
      round = round_;
      PUSH_CHECK(!round->messages[index].has_value(), "push::parallel::SyncMaster", "participant ", index,
                 " arrived twice in one round");
      round->messages[index] = std::move(message);
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
        PUSH_CHECK(static_cast<int>(results.size()) == n_, "push::parallel::SyncMaster", "the callback returned ",
                   results.size(), " results for ", n_, " participants");
      } catch (...) {
        error = std::current_exception();
      }
      try {
        if (!error) {
          // Each participant takes its own result out (below), so that no other thread
          // holds it when its owner is done with it.
          std::lock_guard lock(mutex_);
          for (int i = 0; i < n_; ++i) round->taken[i] = std::move(results[i]);
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
        for (int i = 0; i < n_; ++i) {
          if (!round->messages[i].has_value()) missing.push_back(i);
        }
        if (round_ == round && !missing.empty()) reset_locked();  // abandon the broken round
      }
      // Everyone came and the callback (a collective across ranks, say) is still running:
      // the round is whole, so wait for it.
      if (missing.empty()) return take(*round, future, index);
      std::string names;
      for (int i : missing) names += (names.empty() ? "" : ", ") + std::to_string(i);
      auto error = std::make_exception_ptr(
          Error(c10::str("[push::parallel::SyncMaster] participant", missing.size() == 1 ? " " : "s ", names, " of ",
                         n_, " did not arrive within ", timeout_.count(), " ms")));
      try {
        round->results.set_error(error);  // the others waiting fail with the same error
      } catch (...) {
        // completed meanwhile
      }
    }
    return take(*round, future, index);
  }

 private:
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

  const int n_;
  Callback callback_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::shared_ptr<Round> round_;
};

}  // namespace push::parallel
