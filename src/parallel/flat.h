#pragma once
// What the data-parallel classes share: rank 0's values everywhere, and parameters
// packed into one flat tensor and back.
#include <push/dist/collective.h>

#include <torch/types.h>

#include <vector>

#include "core/flat.h"

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
using push::detail::pack;
using push::detail::total_numel;
using push::detail::unpack;

/// Replaces the gradients of `params` with their average over `group` (an undefined
/// gradient counts as zero and is then defined), through one flat all_reduce in
/// `scratch` (resized as needed). In a fiber, the wait suspends it.
void average_gradients(const std::vector<torch::Tensor>& params, torch::Tensor& scratch,
                       const dist::CollectiveGroup& group);

}  // namespace push::parallel::detail
