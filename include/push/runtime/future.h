#pragma once
// Moved to the core layer (push/core/future.h); kept so that existing includes compile.
#include <push/core/future.h>
