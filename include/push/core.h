#pragma once
// push::core: errors, futures and seeds, what every other area builds on.
//   push::Promise<int> p;  push::Future<int> f = p.future();  p.set_value(1);  f.wait();
#include <push/core/cores.h>
#include <push/core/errors.h>
#include <push/core/future.h>
#include <push/core/seed.h>
