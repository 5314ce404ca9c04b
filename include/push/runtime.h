#pragma once
// push::runtime: the distribution of particles (push::Push), what a handler sees
// (push::Particle), views of other particles, and their options.
//   push::Push dist(make_net, push::PushOptions().devices(2));
//   auto pid = dist.p_create(push::ParticleOptions().on("train", train));
//   dist.p_launch(pid, "train").wait();
#include <push/runtime/options.h>
#include <push/runtime/particle.h>
#include <push/runtime/push.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>
