#pragma once
// What push train checks of a run before it trains, beyond each option's own range: that
// every option given applies to the run, that the particles fit in memory, and whether
// the threads asked for exceed the cores.
#include <cstdint>

#include "train_config.h"

namespace push::cli {

/// Options given for another algorithm (--bootstrap with svgd) or another likelihood
/// (--noise-std without gaussian): push::Error "[push train] --X is for ...".
void check_options_apply(const TrainConfig& c);

/// sgld / sghmc with `train_rows` training rows: --cycles, --burn-in and --thin checked
/// against the run (push::Error naming the option when no sample would be kept), and the
/// default --thin settled: --samples spread over the steps that keep samples.
void settle_chains(TrainConfig& c, int64_t train_rows);

/// mswag with --collect-every and `train_rows` training rows: push::Error when the
/// collecting epochs have fewer steps than --collect-every (nothing would be collected).
void check_collection(const TrainConfig& c, int64_t train_rows);

/// The host memory one rank's particles need, in bytes: `parameters` per network, in
/// float32, times the copies training keeps (weights, gradients, Adam's two moments,
/// MultiSWAG's moments and deviation columns, SG-MCMC's samples and buffer), plus each
/// particle's fixed cost; laplace adds each particle's posterior over its `last_layer`
/// parameters and what each lane's fit takes while it runs.
double particle_bytes(const TrainConfig& c, double parameters, int ranks, int64_t last_layer = 0);
/// push::Error naming the estimate and the memory available when the `ranks_on_host` ranks
/// of this host (of `ranks`) cannot fit on CPU lanes: checked before any network is built
/// (a run of 100,000 particles would otherwise grow until the kernel kills it). GPU lanes
/// are not checked.
void check_memory(const TrainConfig& c, double parameters, int ranks, int ranks_on_host, int64_t last_layer = 0);
/// push::Error naming ulimit -v when this process's address-space limit (RLIMIT_AS) is
/// below what it maps now plus what training maps: OpenBLAS's buffer per BLAS thread (a
/// failed one is retried forever: a hang), `particles_here` bytes, some working room.
/// check_memory calls it.
void check_address_space(const TrainConfig& c, double particles_here);

/// push::Error when the stack size limit (ulimit -s, which is also every thread's stack) is
/// below what training's threads need: LibTorch's deeper calls overflowed 128 KiB (a
/// segfault, not an error); 512 KiB leaves room.
void check_stack();

/// One warning line on stderr when --threads x lanes exceed the cores this process may run on.
void warn_about_threads(const TrainConfig& c);

}  // namespace push::cli
