// A model's state through an ordered server: push = compare-and-set of version + 1.
#include <push/server/model_server.h>

#include <push/core/errors.h>

#include <torch/torch.h>

namespace push::server {
namespace {
constexpr const char* kModelServer = "push::server::ModelServer";
}  // namespace

c10::Dict<std::string, at::Tensor> state_of(const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters())
    out.insert(item.key(), item.value().detach().to(torch::kCPU).clone());
  for (const auto& item : module.named_buffers()) out.insert(item.key(), item.value().detach().to(torch::kCPU).clone());
  return out;
}

void load_state(torch::nn::Module& module, const c10::Dict<std::string, at::Tensor>& state, const char* origin) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (to, from), all checked before any copy
  auto check = [&](const std::string& name, const at::Tensor& to) {
    auto it = state.find(name);
    PUSH_CHECK(it != state.end(), origin, "'", name, "' of the module is not in the server's model");
    const auto& from = it->value();
    PUSH_CHECK(from.sizes() == to.sizes(), origin, "'", name, "' has shape ", from.sizes(), " on the server, ",
               to.sizes(), " in the module");
    copies.emplace_back(to, from);
  };
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  for (const auto& item : params) check(item.key(), item.value());
  for (const auto& item : buffers) check(item.key(), item.value());
  for (const auto& entry : state) {
    PUSH_CHECK(params.contains(entry.key()) || buffers.contains(entry.key()), origin, "'", entry.key(),
               "' of the server's model is not in the module");
  }
  for (auto& [to, from] : copies) to.copy_(from);
}

ModelServer::ModelServer(OrderedServer server, std::string model_name)
    : ModelServer(std::make_shared<OrderedServer>(std::move(server)), std::move(model_name)) {}

ModelServer::ModelServer(std::shared_ptr<const OrderedServerBase> server, std::string model_name)
    : server_(std::move(server)), model_name_(std::move(model_name)) {
  PUSH_CHECK(server_ != nullptr, kModelServer, "no ordered server given (a null pointer)");
  PUSH_CHECK(!model_name_.empty(), kModelServer, "the model needs a name");
}

bool ModelServer::push(torch::nn::Module& module, bool pull_on_fail) {
  const std::optional<int64_t> prev = version_ == 0 ? std::nullopt : std::optional<int64_t>(version_);
  if (server_->push(model_name_, state_of(module), version_ + 1, prev)) {
    ++version_;
    return true;
  }
  if (pull_on_fail) {
    PUSH_CHECK(pull(module), kModelServer, "push of '", model_name_, "' lost, and the server has no version of it");
  }
  return false;
}

bool ModelServer::pull(torch::nn::Module& module) {
  auto newest = server_->pull(model_name_);
  if (!newest) return false;
  PUSH_CHECK(newest->value.isGenericDict(), kModelServer, "key '", model_name_, "' of server '", server_->name(),
             "' holds no model");
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& entry : newest->value.toGenericDict())
    state.insert(entry.key().toStringRef(), entry.value().toTensor());
  load_state(module, state, kModelServer);
  version_ = newest->version;
  return true;
}

}  // namespace push::server
