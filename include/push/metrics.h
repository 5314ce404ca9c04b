#pragma once
// push::metrics: how good a predictive distribution is (RMSE, NLL, accuracy, Brier, ECE).
#include <push/metrics/metrics.h>
