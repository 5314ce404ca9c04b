#pragma once
// How many CPUs this process may run on: what push sizes its thread pools, lanes and the
// threads that look for a value before sleeping by.

namespace push {

/// The CPUs the calling thread may run on (its affinity mask, which `taskset`, cgroup
/// cpusets, Slurm's and mpirun's binding set), at least 1. Falls back to the CPUs online
/// when the mask cannot be read.
int usable_cores();

}  // namespace push
