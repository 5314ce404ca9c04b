#pragma once
// push::parallel: machin's in-process tools: thread pools whose workers are fiber event
// loops, the results of their tasks, a rendezvous of N participants, a queue, and model
// placement over devices.
//   push::parallel::ThreadPool pool(4);
//   auto squares = pool.map([](int x) { return x * x; }, std::vector<int>{1, 2, 3});
#include <push/parallel/assigner.h>
#include <push/parallel/queue.h>
#include <push/parallel/results.h>
#include <push/parallel/sync_master.h>
#include <push/parallel/thread_pool.h>
