#include "bayes_bindings.h"

#include "handler_bridge.h"
#include "sequential.h"
#include "without_gil.h"

#include <push/bayes/ensemble.h>
#include <push/bayes/laplace.h>
#include <push/bayes/mc_dropout.h>
#include <push/bayes/mixing.h>
#include <push/bayes/models.h>
#include <push/bayes/randomized_prior.h>
#include <push/bayes/sgmcmc.h>
#include <push/bayes/svgd.h>
#include <push/bayes/swag.h>
#include <push/bayes/warnings.h>

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>

namespace py = pybind11;

namespace push::python {
namespace {

/// Infer.warnings: the particles whose loss rose by more than `rise` past their best, then,
/// with a test set, those whose test predictions are worse than the training mean's and a
/// regression predictive whose intervals are far too wide or narrow (push/bayes/warnings.h),
/// each as a dict.
py::list member_warnings(bayes::Infer& infer, double rise, std::optional<torch::Tensor> test_x,
                         std::optional<torch::Tensor> test_y, std::optional<torch::Tensor> train_x,
                         std::optional<torch::Tensor> train_y, bool classify) {
  std::vector<bayes::MemberWarning> found;
  {
    py::gil_scoped_release unlocked;
    found = bayes::loss_warnings(infer.particle_losses(), rise);
    if (test_x) {
      auto dataset = [classify](const torch::Tensor& x, const torch::Tensor& y) {
        data::Dataset d;
        d.x = x;
        d.y = y;
        d.task = classify ? data::Task::classification : data::Task::regression;
        return d;
      };
      const auto test = dataset(*test_x, *test_y), train = dataset(*train_x, *train_y);
      const auto pred = infer.predict(test.x);
      auto more = bayes::prediction_warnings(pred, test, train, infer.options().particles());
      found.insert(found.end(), more.begin(), more.end());
      auto wide = bayes::calibration_warnings(pred, test);
      found.insert(found.end(), wide.begin(), wide.end());
    }
  }
  py::list out;
  for (const auto& w : found) {
    py::dict one;
    if (w.particle == bayes::kWholePredictive) {
      one["particle"] = py::none();
    } else {
      one["particle"] = w.particle;
    }
    one["kind"] = bayes::to_string(w.kind);
    one["value"] = w.value;
    one["reference"] = w.reference;
    if (w.kind == bayes::MemberWarning::Kind::loss_rose) {
      one["epoch"] = w.epoch;
      one["best_epoch"] = w.best_epoch;
    }
    one["message"] = w.describe();
    out.append(one);
  }
  return out;
}

// An Infer is deleted with the GIL released: its lanes are joined.
using InferHolder = WithoutGil<bayes::Infer>;

// Options arrive as a dict of keyword arguments; each is taken once, and any left over is
// a TypeError naming it (a misspelt option never passes silently).
class Options {
 public:
  Options(std::string owner, py::dict d) : owner_(std::move(owner)), d_(std::move(d)) {}
  template <class T>
  std::optional<T> take(const char* key) {
    if (!d_.contains(key)) return std::nullopt;
    py::object v = d_[key];
    PyDict_DelItemString(d_.ptr(), key);
    if (v.is_none()) return std::nullopt;
    try {
      return v.cast<T>();
    } catch (const py::cast_error&) {
      throw py::type_error(owner_ + ": option " + key + " has the wrong type (" +
                           py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>() + ")");
    }
  }
  /// Whether `key` was given as None (for an option whose None means something).
  bool none(const char* key) const { return d_.contains(key) && d_[key].is_none(); }
  void finish() const {
    for (auto item : d_) {
      throw py::type_error(owner_ + ": unknown option '" + py::str(item.first).cast<std::string>() + "'");
    }
  }
  const std::string& owner() const { return owner_; }

 private:
  std::string owner_;
  py::dict d_;
};

bayes::Likelihood likelihood_of(const std::string& owner, const std::string& s) {
  if (s == "gaussian") return bayes::Likelihood::gaussian;
  if (s == "heteroscedastic") return bayes::Likelihood::heteroscedastic;
  if (s == "categorical") return bayes::Likelihood::categorical;
  if (s == "learned_noise") return bayes::Likelihood::learned_noise;
  throw py::value_error(owner + ": likelihood must be gaussian, heteroscedastic, categorical or learned_noise, got '" +
                        s + "'");
}

bayes::InferOptions infer_options(Options& o) {
  bayes::InferOptions io;
  PushOptions po;
  if (auto v = o.take<int>("particles")) io.particles(*v);
  if (auto v = o.take<std::string>("likelihood")) io.likelihood(likelihood_of(o.owner(), *v));
  if (auto v = o.take<double>("noise_std")) io.noise_std(*v);
  if (auto v = o.take<double>("prior_std")) io.prior_std(*v);
  if (auto v = o.take<int64_t>("batch_size")) io.batch_size(*v);
  if (auto v = o.take<double>("lr")) io.lr(*v);
  if (auto v = o.take<int64_t>("cosine_epochs")) io.cosine_epochs(*v);
  if (auto v = o.take<bool>("fuse")) io.fuse(*v);
  if (auto v = o.take<uint64_t>("seed")) po.seed(*v);
  if (auto v = o.take<int>("devices")) po.devices(*v);
  if (auto v = o.take<std::string>("device_type")) {
    if (*v != "cpu" && *v != "cuda") throw py::value_error(o.owner() + ": device_type must be 'cpu' or 'cuda'");
    po.device_type(*v == "cpu" ? torch::kCPU : torch::kCUDA);
  }
  if (auto v = o.take<int>("cache_size")) po.cache_size(*v);
  if (auto v = o.take<int>("intra_op_threads")) po.intra_op_threads(*v);
  io.distribution(po);
  // The particles' optimizer at io.lr(): Adam (the engine's default) or plain SGD, whose
  // step is θ -= lr·grad (PusH's SVGD moves its particles so), with an L2 weight_decay
  // added to the gradient as torch.optim's (PusH's MultiSWAG trains with it).
  const auto kind = o.take<std::string>("optimizer").value_or("adam");
  if (kind != "adam" && kind != "sgd") {
    throw py::value_error(o.owner() + ": optimizer must be 'adam' or 'sgd', got '" + kind + "'");
  }
  const double decay = o.take<double>("weight_decay").value_or(0.0);
  if (!(decay >= 0)) throw py::value_error(o.owner() + ": weight_decay must be >= 0");
  if (kind == "sgd" || decay > 0) {
    const double lr = io.lr();
    io.optimizer([kind, lr, decay](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == "sgd") {
        return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(lr).weight_decay(decay));
      }
      return std::make_unique<torch::optim::Adam>(std::move(ps), torch::optim::AdamOptions(lr).weight_decay(decay));
    });
  }
  return io;
}

// The model: a Python factory of an nn.Sequential, called (under each particle's seed, on
// the thread that runs fit) and rebuilt in C++ for every particle.
ModuleFactory rebuilt_factory(py::object model) {
  auto ref = std::make_shared<PyRef>(std::move(model));
  return [ref]() -> torch::nn::AnyModule {
    py::gil_scoped_acquire gil;
    return to_any_module(rebuild_sequential(ref->object()));
  };
}

InferHolder make_infer(const std::string& kind, py::object model, py::dict kwargs) {
  Options o("push.bayes." + kind, std::move(kwargs));
  bayes::InferOptions io = infer_options(o);
  ModuleFactory factory;
  if (py::isinstance<py::str>(model)) {
    // push's own model specs ("mlp:64,64", "cnn:16,32"), as push train takes them.
    auto shape = o.take<std::vector<int64_t>>("input_shape");
    auto outputs = o.take<int64_t>("outputs");
    if (!shape || !outputs) throw py::type_error(o.owner() + ": a model spec needs input_shape and outputs");
    factory = bayes::make_model(model.cast<std::string>(), *shape, *outputs, o.take<double>("dropout").value_or(0.0));
  } else {
    factory = rebuilt_factory(std::move(model));
  }
  if (auto v = o.take<double>("prior_scale"); v && *v != 0) factory = bayes::with_randomized_prior(factory, *v);
  InferHolder infer;
  if (kind == "Ensemble") {
    bayes::EnsembleOptions eo;
    if (auto v = o.take<bool>("bootstrap")) eo.bootstrap(*v);
    o.finish();
    infer.reset(new bayes::Ensemble(factory, io, eo));
  } else if (kind == "SVGD") {
    bayes::SVGDOptions so;
    if (auto v = o.take<double>("bandwidth")) so.bandwidth(*v);
    if (auto v = o.take<std::string>("bandwidth_rule")) {
      if (*v != "median" && *v != "median_log_n") {
        throw py::value_error(o.owner() + ": bandwidth_rule must be median or median_log_n, got '" + *v + "'");
      }
      so.bandwidth_rule(*v == "median" ? bayes::BandwidthRule::median : bayes::BandwidthRule::median_log_n);
    }
    if (auto v = o.take<bool>("repulsive")) so.repulsive(*v);
    if (auto v = o.take<double>("likelihood_weight")) so.likelihood_weight(*v);
    o.finish();
    infer.reset(new bayes::SVGD(factory, io, so));
  } else if (kind == "MultiSWAG") {
    bayes::SWAGOptions wo;
    if (auto v = o.take<int64_t>("pretrain_epochs")) wo.pretrain_epochs(*v);
    if (auto v = o.take<int64_t>("rank")) wo.rank(*v);
    if (auto v = o.take<int64_t>("collect_every_steps")) wo.collect_every_steps(*v);
    if (auto v = o.take<double>("swag_lr")) wo.swag_lr(*v);
    if (o.none("collect_momentum")) wo.collect_momentum(std::nullopt);  // the particles' own optimizer collects
    if (auto v = o.take<double>("collect_momentum")) wo.collect_momentum(*v);
    if (auto v = o.take<int64_t>("samples")) wo.samples(*v);
    if (auto v = o.take<double>("min_variance")) wo.min_variance(*v);
    o.finish();
    infer.reset(new bayes::MultiSWAG(factory, io, wo));
  } else if (kind == "MCDropout") {
    bayes::McDropoutOptions mo;
    if (auto v = o.take<int64_t>("samples")) mo.samples(*v);
    o.finish();
    infer.reset(new bayes::MCDropout(factory, io, mo));
  } else if (kind == "Laplace") {
    bayes::LaplaceOptions lo;
    bayes::EnsembleOptions eo;
    if (auto v = o.take<std::string>("structure")) {
      if (*v != "full" && *v != "diagonal") throw py::value_error(o.owner() + ": structure must be full or diagonal");
      lo.structure(*v == "full" ? bayes::LaplaceStructure::full : bayes::LaplaceStructure::diagonal);
    }
    if (auto v = o.take<std::string>("predictive")) {
      if (*v != "linearized" && *v != "sampling") {
        throw py::value_error(o.owner() + ": predictive must be linearized or sampling");
      }
      lo.predictive(*v == "linearized" ? bayes::LaplacePredictive::linearized : bayes::LaplacePredictive::sampling);
    }
    if (auto v = o.take<double>("prior_precision")) lo.prior_precision(*v);
    if (auto v = o.take<int64_t>("samples")) lo.samples(*v);
    if (auto v = o.take<bool>("bootstrap")) eo.bootstrap(*v);
    o.finish();
    infer.reset(new bayes::Laplace(factory, io, lo, eo));
  } else if (kind == "SGLD" || kind == "SGHMC") {
    bayes::SGMCMCOptions co;
    co.method(kind == "SGHMC" ? bayes::SGMCMCMethod::sghmc : bayes::SGMCMCMethod::sgld);
    if (auto v = o.take<double>("step_size")) co.step_size(*v);
    if (auto v = o.take<double>("friction")) co.friction(*v);
    if (auto v = o.take<bool>("preconditioned")) co.preconditioned(*v);
    if (auto v = o.take<double>("precondition_decay")) co.precondition_decay(*v);
    if (auto v = o.take<double>("precondition_eps")) co.precondition_eps(*v);
    if (auto v = o.take<bool>("hold_preconditioner")) co.hold_preconditioner(*v);
    if (auto v = o.take<double>("temperature")) co.temperature(*v);
    if (auto v = o.take<int64_t>("cycle_epochs")) co.cycle_epochs(*v);
    if (auto v = o.take<double>("exploration")) co.exploration(*v);
    if (auto v = o.take<int64_t>("burn_in_epochs")) co.burn_in_epochs(*v);
    if (auto v = o.take<int64_t>("thin")) co.thin(*v);
    if (auto v = o.take<int64_t>("samples")) co.samples(*v);
    o.finish();
    infer.reset(new bayes::SGMCMC(factory, io, co));
  } else {
    throw py::value_error("push.bayes: no algorithm named '" + kind + "'");
  }
  return infer;
}

py::object maybe(const torch::Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

}  // namespace

void bind_bayes(py::module_& parent) {
  py::module_ m = parent.def_submodule("bayes", "push's Bayesian algorithms in C++");
  m.def("rebuild_blocker", [](py::handle module) { return rebuild_blocker(module); });
  m.def("rebuild", [](py::handle module) {
    // The rebuilt C++ module's parameters, named as in C++: for tests and for users who
    // want to see what trains.
    auto seq = rebuild_sequential(module);
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : seq->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  });
  py::class_<bayes::Infer, InferHolder>(m, "Infer")
      .def(py::init(&make_infer), py::arg("kind"), py::arg("model"), py::arg("options"))
      .def(
          "fit",
          [](bayes::Infer& infer, const torch::Tensor& x, const torch::Tensor& y, int64_t epochs, bool classify,
             int64_t num_classes) {
            data::Dataset d;
            d.name = "python";
            d.x = x;
            d.y = y;
            d.task = classify ? data::Task::classification : data::Task::regression;
            d.num_classes = num_classes;
            py::gil_scoped_release unlocked;
            infer.fit(d, epochs);
          },
          py::arg("x"), py::arg("y"), py::arg("epochs"), py::arg("classify"), py::arg("num_classes"))
      .def("predict",
           [](bayes::Infer& infer, const torch::Tensor& x) {
             bayes::Predictive p;
             {
               py::gil_scoped_release unlocked;
               p = infer.predict(x);
             }
             py::dict out;
             out["classify"] = p.task == data::Task::classification;
             out["mean"] = maybe(p.mean);
             out["variance"] = maybe(p.variance);
             out["aleatoric"] = maybe(p.aleatoric);
             out["probs"] = maybe(p.probs);
             out["members"] = maybe(p.members);
             return out;
           })
      .def(
          "approximate",
          [](bayes::Infer& infer, const torch::Tensor& x, const torch::Tensor& y, bool classify) {
            auto* laplace = dynamic_cast<bayes::Laplace*>(&infer);
            if (laplace == nullptr) throw py::type_error("push.bayes: approximate is Laplace's");
            data::Dataset d;
            d.x = x;
            d.y = y;
            d.task = classify ? data::Task::classification : data::Task::regression;
            py::gil_scoped_release unlocked;
            laplace->approximate(d);
          },
          py::arg("x"), py::arg("y"), py::arg("classify"))
      .def("save",
           [](bayes::Infer& infer, const std::string& dir) {
             py::gil_scoped_release unlocked;
             infer.save(dir);
           })
      .def("load",
           [](bayes::Infer& infer, const std::string& dir) {
             py::gil_scoped_release unlocked;
             infer.load(dir);
           })
      .def("fused", &bayes::Infer::fused, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("name", [](const bayes::Infer& infer) { return infer.name(); })
      .def_property_readonly("epochs_done", &bayes::Infer::epochs_done)
      .def_property_readonly("losses", &bayes::Infer::losses)
      .def_property_readonly("particle_losses",
                             [](const bayes::Infer& infer) {
                               py::dict out;
                               for (const auto& [pid, l] : infer.particle_losses()) {
                                 py::dict one;
                                 one["best"] = l.best;
                                 one["best_epoch"] = l.best_epoch;
                                 one["last"] = l.last;
                                 one["last_epoch"] = l.last_epoch;
                                 out[py::int_(pid)] = one;
                               }
                               return out;
                             })
      .def("mixing",
           [](bayes::Infer& infer, const torch::Tensor& x) -> py::object {
             std::optional<bayes::ChainMixing> m;
             {
               py::gil_scoped_release unlocked;
               m = bayes::chain_mixing(infer.predict(x), infer.options().particles());
             }
             if (!m) return py::none();
             py::dict out;
             out["rhat_median"] = m->rhat_median;
             out["rhat_max"] = m->rhat_max;
             out["above_1.1"] = m->above;
             out["drift_median"] = m->drift_median;
             out["drift_max"] = m->drift_max;
             out["values"] = m->values;
             out["samples_per_chain"] = m->samples_per_chain;
             return out;
           })
      .def("warnings", &member_warnings, py::arg("rise"), py::arg("test_x"), py::arg("test_y"), py::arg("train_x"),
           py::arg("train_y"), py::arg("classify"))
      // distribution() may make the particles (the factory then takes the GIL): without it.
      .def(
          "particle_ids", [](bayes::Infer& infer) { return infer.distribution().particle_ids(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "swag_moments",
          [](bayes::Infer& infer, Pid pid) {
            auto* swag = dynamic_cast<bayes::MultiSWAG*>(&infer);
            if (swag == nullptr) throw py::type_error("push.bayes: swag_moments is MultiSWAG's");
            bayes::SWAGMoments m;
            {
              py::gil_scoped_release unlocked;
              m = swag->moments(pid);
            }
            if (m.count == 0)
              throw py::value_error("push.bayes: particle " + std::to_string(pid) + " has no SWAG moments yet");
            py::dict out;
            out["count"] = m.count;
            out["mean"] = m.mean;
            out["sq_mean"] = m.sq_mean;
            out["deviations"] = m.deviations;
            return out;
          },
          py::arg("pid"))
      .def(
          "particle_parameters",
          [](bayes::Infer& infer, Pid pid) { return infer.distribution().p_named_parameters(pid); },
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace push::python
