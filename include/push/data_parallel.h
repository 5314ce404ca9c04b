#pragma once
// push::data_parallel: one model trained on several ranks (heat's blocking and
// non-blocking DataParallel and DASO, jactorch's synchronized batch norm), and the pieces
// they share to keep replicas equal.
//   push::data_parallel::DataParallel dp(*net, world.collective());   // gradients averaged
#include <push/data_parallel/daso.h>
#include <push/data_parallel/daso_schedule.h>
#include <push/data_parallel/data_parallel.h>
#include <push/data_parallel/non_blocking_data_parallel.h>
#include <push/data_parallel/replicas.h>
#include <push/data_parallel/sync_batch_norm.h>
