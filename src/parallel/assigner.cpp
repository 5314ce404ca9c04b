// Model placement. As machin: a softmax over devices per model, trained with Adam for
// `iterations` steps on a weighted cost: connection (data between models x distance of
// their devices), size (memory over a device's budget), complexity (each device's share of
// the work against its share of compute) and entropy (towards a definite choice); each model
// then takes its most likely device. Unlike machin, the result fits every budget: a model on
// a device over its budget is moved to the device with room where the cost rises least
// (machin's size term is only a penalty, and its argmax may overfill a device); when no
// single move can repair it, the models are packed again, largest first, each on the device
// the relaxation liked best among those with room. A problem that cannot fit is an error
// that says by how many bytes (packing is NP-hard: in a rare problem that does fit, the
// packing can still miss a fit, and the error says so too). Then, also unlike machin, moves
// of one model and swaps of two that lower the cost (within the budgets) are made while
// there are any: the relaxation's entropy term tends to freeze each model on whichever
// device its random start favoured, which on the tests' small problems was not the best
// placement. The start is seeded (machin's is not).
#include <push/parallel/assigner.h>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace push::parallel {
namespace {

constexpr const char* kOrigin = "push::parallel::ModelAssigner";
constexpr double kMiB = 1024.0 * 1024.0;

// The problem as tensors (double precision, sizes in MiB as machin's).
struct Problem {
  torch::Tensor size;       // [1, n]
  torch::Tensor capacity;   // [1, m]
  torch::Tensor conn;       // [n, n], normalised
  torch::Tensor dist;       // [m, m], normalised
  torch::Tensor cmplx;      // [1, n], normalised
  torch::Tensor cmplx_cap;  // [1, m], normalised
  ModelAssignerOptions options;

  // machin's cost of a placement P [n, m] (rows sum to 1).
  torch::Tensor cost(const torch::Tensor& p) const {
    const int64_t n = p.size(0);
    auto model_distance = p.matmul(dist).matmul(p.t());
    model_distance = model_distance * (1 - torch::eye(n, p.options()));  // none to itself
    auto connection = (conn * model_distance).mean();
    auto size_match = torch::relu(size.matmul(p) - capacity).mean();
    auto cmplx_match = (cmplx.matmul(p) - cmplx_cap).pow(2).mean();
    auto entropy = -torch::where(p > 0, p * p.clamp_min(1e-300).log(), torch::zeros_like(p)).sum(-1).mean();
    return connection * options.connection_weight() + size_match * options.size_match_weight() +
           cmplx_match * options.complexity_match_weight() + entropy * options.entropy_weight();
  }

  double cost_of(const std::vector<int>& a, int64_t m) const {
    auto p = torch::zeros({static_cast<int64_t>(a.size()), m}, torch::kFloat64);
    for (size_t i = 0; i < a.size(); ++i) p[static_cast<int64_t>(i)][a[i]] = 1.0;
    return cost(p).item<double>();
  }
};

torch::Tensor normalised(const torch::Tensor& t) {
  const double total = t.sum().item<double>();
  return total > 0 ? t / total : torch::zeros_like(t);
}

}  // namespace

int64_t estimate_model_bytes(const torch::nn::Module& module, double size_multiplier) {
  PUSH_CHECK(size_multiplier > 0, "push::parallel::estimate_model_bytes", "size_multiplier must be positive, got ",
             size_multiplier);
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  for (const auto& b : module.buffers()) bytes += b.numel() * static_cast<int64_t>(b.element_size());
  return static_cast<int64_t>(static_cast<double>(bytes) * size_multiplier);
}

std::vector<int> assign_models(const std::vector<int64_t>& model_bytes, const Connections& connections,
                               const std::vector<DeviceSpec>& devices, const ModelAssignerOptions& options) {
  const auto n = static_cast<int64_t>(model_bytes.size());
  const auto m = static_cast<int64_t>(devices.size());
  PUSH_CHECK(m > 0, kOrigin, "no devices to place models on");
  if (n == 0) return {};
  PUSH_CHECK(options.iterations() >= 0, kOrigin, "iterations must be >= 0, got ", options.iterations());
  PUSH_CHECK(options.gpu_gpu_distance() > 0 && options.cpu_gpu_distance() > 0, kOrigin,
             "device distances must be positive");
  double compute = 0;
  int64_t room = 0, largest = 0;
  for (int64_t d = 0; d < m; ++d) {
    PUSH_CHECK(devices[d].memory_bytes > 0, kOrigin, "device ", d, " (", devices[d].device, ") has a memory budget of ",
               devices[d].memory_bytes, " bytes");
    PUSH_CHECK(devices[d].compute >= 0, kOrigin, "device ", d, " (", devices[d].device, ") has negative compute");
    compute += devices[d].compute;
    room += devices[d].memory_bytes;
    largest = std::max(largest, devices[d].memory_bytes);
  }
  PUSH_CHECK(compute > 0, kOrigin, "every device has compute 0: nothing would run");
  int64_t need = 0;
  for (int64_t i = 0; i < n; ++i) {
    PUSH_CHECK(model_bytes[i] >= 0, kOrigin, "model ", i, " has a negative size");
    PUSH_CHECK(model_bytes[i] <= largest, kOrigin, "model ", i, " needs ", model_bytes[i],
               " bytes, the largest device budget is ", largest, ": ", model_bytes[i] - largest, " bytes too many");
    need += model_bytes[i];
  }
  PUSH_CHECK(need <= room, kOrigin, "the models need ", need, " bytes, the devices hold ", room, ": ", need - room,
             " bytes too many");

  torch::NoGradGuard outer;  // the problem's constants
  Problem pr;
  pr.options = options;
  auto dtype = torch::kFloat64;
  std::vector<double> sizes(model_bytes.begin(), model_bytes.end());
  for (double& s : sizes) s /= kMiB;
  pr.size = torch::tensor(sizes, dtype).view({1, n});
  std::vector<double> caps, comp;
  for (const auto& d : devices) {
    caps.push_back(static_cast<double>(d.memory_bytes) / kMiB);
    comp.push_back(d.compute);
  }
  pr.capacity = torch::tensor(caps, dtype).view({1, m});
  auto conn = torch::zeros({n, n}, dtype);
  for (const auto& [pair, weight] : connections) {
    const auto [i, j] = pair;
    PUSH_CHECK(i >= 0 && i < n && j >= 0 && j < n && i != j, kOrigin, "connection (", i, ", ", j,
               ") names no pair of the ", n, " models");
    PUSH_CHECK(weight >= 0, kOrigin, "connection (", i, ", ", j, ") has a negative weight");
    conn[i][j] += weight;
    conn[j][i] += weight;
  }
  pr.conn = normalised(conn);
  auto dist = torch::zeros({m, m}, dtype);
  for (int64_t a = 0; a < m; ++a) {
    for (int64_t b = 0; b < m; ++b) {
      if (a == b || devices[a].device == devices[b].device) continue;
      const bool cpu = devices[a].device.is_cpu() || devices[b].device.is_cpu();
      dist[a][b] = cpu ? options.cpu_gpu_distance() : options.gpu_gpu_distance();
    }
  }
  pr.dist = normalised(dist);
  pr.cmplx = normalised(pr.size);
  pr.cmplx_cap = normalised(torch::tensor(comp, dtype).view({1, m}));

  // The relaxation: logits per model and device, Adam on machin's cost.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed());
  auto logits = torch::randn({n, m}, gen, dtype).requires_grad_(true);
  {
    torch::AutoGradMode grad(true);
    torch::optim::Adam adam({logits}, torch::optim::AdamOptions(options.update_rate()));
    for (int64_t it = 0; it < options.iterations(); ++it) {
      adam.zero_grad();
      pr.cost(torch::softmax(logits, -1)).backward();
      adam.step();
    }
  }
  auto best = logits.detach().argmax(-1);
  std::vector<int> a(n);
  std::vector<int64_t> used(m, 0);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<int>(best[i].item<int64_t>());
    used[a[i]] += model_bytes[i];
  }
  // When single moves cannot repair it: largest model first, each to the device the
  // relaxation liked best among those with room. False when a model finds no room.
  const auto probs = torch::softmax(logits.detach(), -1);
  auto pack_decreasing = [&](std::vector<int>& out, std::vector<int64_t>& load) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return model_bytes[x] > model_bytes[y]; });
    std::vector<int> trial(n, -1);
    std::vector<int64_t> filled(m, 0);
    for (int64_t i : order) {
      int where = -1;
      for (int64_t d = 0; d < m; ++d) {
        if (filled[d] + model_bytes[i] > devices[d].memory_bytes) continue;
        if (where < 0 || probs[i][d].item<double>() > probs[i][where].item<double>()) where = static_cast<int>(d);
      }
      if (where < 0) return false;
      trial[i] = where;
      filled[where] += model_bytes[i];
    }
    out = trial;
    load = filled;
    return true;
  };
  // Repair: while a device is over budget, make the move off it that raises the cost least.
  for (;;) {
    int over = -1;
    for (int64_t d = 0; d < m; ++d) {
      if (used[d] > devices[d].memory_bytes) over = static_cast<int>(d);
    }
    if (over < 0) break;
    double best_cost = std::numeric_limits<double>::infinity();
    int move_model = -1, move_to = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (a[i] != over) continue;
      for (int64_t e = 0; e < m; ++e) {
        if (e == over || used[e] + model_bytes[i] > devices[e].memory_bytes) continue;
        auto trial = a;
        trial[i] = static_cast<int>(e);
        const double c = pr.cost_of(trial, m);
        if (c < best_cost) {
          best_cost = c;
          move_model = static_cast<int>(i);
          move_to = static_cast<int>(e);
        }
      }
    }
    if (move_model < 0 && pack_decreasing(a, used)) break;
    if (move_model < 0) {
      int64_t smallest = std::numeric_limits<int64_t>::max(), most_room = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (a[i] == over) smallest = std::min(smallest, model_bytes[i]);
      }
      for (int64_t e = 0; e < m; ++e) {
        if (e != over) most_room = std::max(most_room, devices[e].memory_bytes - used[e]);
      }
      PUSH_CHECK(false, kOrigin, "device ", over, " (", devices[over].device, ") is ",
                 used[over] - devices[over].memory_bytes, " bytes over its budget and no other device has room for",
                 " any of its models (the smallest needs ", smallest, " bytes, the most room elsewhere is ", most_room,
                 "): ", smallest - most_room, " bytes short (packing the models largest first found no fit",
                 " either)");
    }
    used[a[move_model]] -= model_bytes[move_model];
    used[move_to] += model_bytes[move_model];
    a[move_model] = move_to;
  }
  // Improve: the move of one model, or swap of two, that lowers the cost most (within the
  // budgets), while there is one. The relaxation's argmax often is not the best placement:
  // its entropy term pushes each model to whichever device its random start favoured.
  double current = pr.cost_of(a, m);
  auto fits = [&](const std::vector<int>& trial) {
    std::vector<int64_t> load(m, 0);
    for (int64_t i = 0; i < n; ++i) load[trial[i]] += model_bytes[i];
    for (int64_t d = 0; d < m; ++d) {
      if (load[d] > devices[d].memory_bytes) return false;
    }
    return true;
  };
  for (int64_t round = 0; round < 100 * n; ++round) {
    double best_cost = current - 1e-12;
    std::vector<int> best;
    auto consider = [&](const std::vector<int>& trial) {
      if (!fits(trial)) return;
      const double c = pr.cost_of(trial, m);
      if (c < best_cost) {
        best_cost = c;
        best = trial;
      }
    };
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < m; ++e) {
        if (e == a[i]) continue;
        auto trial = a;
        trial[i] = static_cast<int>(e);
        consider(trial);
      }
      for (int64_t j = i + 1; j < n; ++j) {
        if (a[i] == a[j]) continue;
        auto trial = a;
        std::swap(trial[i], trial[j]);
        consider(trial);
      }
    }
    if (best.empty()) break;
    a = best;
    current = best_cost;
  }
  return a;
}

ModelAssigner::ModelAssigner(const std::vector<torch::nn::Module*>& models, const Connections& connections,
                             ModelAssignerOptions options)
    : ModelAssigner(models, connections, detect_devices(options.max_mem_ratio(), options.cpu_weight()), options) {}

ModelAssigner::ModelAssigner(const std::vector<torch::nn::Module*>& models, const Connections& connections,
                             std::vector<DeviceSpec> devices, ModelAssignerOptions options) {
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < models.size(); ++i) {
    PUSH_CHECK(models[i] != nullptr, kOrigin, "model ", i, " is null");
    bytes.push_back(estimate_model_bytes(*models[i], options.size_multiplier()));
  }
  const auto where = assign_models(bytes, connections, devices, options);
  for (size_t i = 0; i < models.size(); ++i) {
    assignment_.push_back(devices[where[i]].device);
    if (options.move_models()) models[i]->to(assignment_.back());
  }
}

}  // namespace push::parallel
