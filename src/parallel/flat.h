#pragma once
// What the data-parallel classes share: rank 0's values everywhere, and parameters
// packed into one flat tensor and back.
#include <push/dist/collective.h>

#include <torch/types.h>

#include <vector>

namespace push::parallel::detail {

/// A group of every rank of `world`, this caller's own (so that its collectives never
/// interleave with another user's of the world's default group). Collective.
dist::CollectiveGroup group_of_everyone(const dist::World& world);
/// Waits for `work`, whatever became of it (before its buffers go, or are reused).
void wait_quietly(const dist::Work& work);
/// Rank `rank`'s share of `rows` among `size` ranks: every size-th row from its position,
/// the rows repeated from the start to a multiple of the ranks (every rank gets as many).
torch::Tensor share_of(const torch::Tensor& rows, int rank, int size);
/// Every tensor of `tensors` takes the value it has on the group's first rank.
void broadcast_from_first(const std::vector<torch::Tensor>& tensors, const dist::CollectiveGroup& group);
/// Total elements of `tensors`.
int64_t total_numel(const std::vector<torch::Tensor>& tensors);
/// Copies `tensors` one after another into `flat` (cast to its dtype).
void pack(const std::vector<torch::Tensor>& tensors, const torch::Tensor& flat);
/// Copies `flat`'s consecutive slices back into `tensors` (cast to theirs).
void unpack(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors);

/// Replaces the gradients of `params` with their average over `group` (an undefined
/// gradient counts as zero and is then defined), through one flat all_reduce in
/// `scratch` (resized as needed). In a fiber, the wait suspends it.
void average_gradients(const std::vector<torch::Tensor>& params, torch::Tensor& scratch,
                       const dist::CollectiveGroup& group);

}  // namespace push::parallel::detail
