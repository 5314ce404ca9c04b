#pragma once
// push::bayes: deep ensembles, MultiSWAG, SVGD and MC dropout as particle programs,
// with the data sets and metrics they are evaluated on.
#include <push/bayes/ensemble.h>
#include <push/bayes/infer.h>
#include <push/bayes/mc_dropout.h>
#include <push/bayes/models.h>
#include <push/bayes/svgd.h>
#include <push/bayes/swag.h>
#include <push/data/dataset.h>
#include <push/metrics/metrics.h>
