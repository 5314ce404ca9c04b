#pragma once
// Moved to the core layer (push/core/errors.h); kept so that existing includes compile.
#include <push/core/errors.h>
