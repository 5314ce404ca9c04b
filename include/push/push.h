#pragma once
// The push library, everything: many networks trained together, concurrently, on
// LibTorch. Each area also has an umbrella of its own (push/core.h, push/runtime.h,
// push/dist.h, push/bayes.h, ...) for a program that uses only some; docs/architecture.md
// has the map. Includes all of LibTorch's C++ frontend, as a push program uses it throughout.
#include <torch/torch.h>

#include <push/bayes.h>
#include <push/core.h>
#include <push/data.h>
#include <push/data_parallel.h>
#include <push/dist.h>
#include <push/metrics.h>
#include <push/parallel.h>
#include <push/runtime.h>
#include <push/server.h>
#include <push/version.h>
