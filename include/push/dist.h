#pragma once
// push::dist: processes that run collectives and call each other's named services.
//   push::dist::World world(push::dist::WorldOptions::from_env());
//   auto all = world.collective();             // every rank, Gloo for CPU tensors
//   all.all_reduce(t);                          // sum over ranks
//   auto rpc = world.rpc_group("ps", world.names());
//   rpc.rpc_sync("worker1", "add", {a, b});     // a function registered by name
//   world.store().set("myjob/ready", {1});      // the job's key-value store
// See docs/distributed.md for launching (push launch, torchrun --no-python, mpirun).
#include <push/dist/collective.h>
#include <push/dist/free_port.h>
#include <push/dist/rpc.h>
#include <push/dist/store.h>
#include <push/dist/world.h>
