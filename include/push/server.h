#pragma once
// push::server: services on the ranks of an RpcGroup (machin.parallel.server and pool):
// ordered, model and gradient servers one member hosts, pools of ranks, hosted queues.
//   push::server::RankPool pool(rpc, {"worker1", "worker2"});
//   auto all = pool.map("square", {1, 2, 3});
#include <push/server/grad_server.h>
#include <push/server/model_server.h>
#include <push/server/ordered_server.h>
#include <push/server/ordered_server_base.h>
#include <push/server/queue_host.h>
#include <push/server/rank_pool.h>
