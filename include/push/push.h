#pragma once
// The push library: many networks trained together, concurrently, on LibTorch.
// Includes all of LibTorch's C++ frontend, as a push program uses it throughout.
#include <torch/torch.h>

#include <push/core/errors.h>
#include <push/core/future.h>
#include <push/runtime/options.h>
#include <push/runtime/particle.h>
#include <push/runtime/push.h>
#include <push/runtime/types.h>
#include <push/runtime/view.h>
#include <push/version.h>
#include <push/bayes.h>
#include <push/dist.h>
