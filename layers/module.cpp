#include "layers/module.h"

#include <set>
#include <sstream>

namespace tl {

Variable Module::forward(const Variable&) {
  TORCH_CHECK(false, type_name_, " has no single-input forward(Variable); call its own forward");
}

void Module::check_name(const std::string& name) const {
  TORCH_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid member name '", name,
              "' (must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  TORCH_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": name '", name,
              "' is already registered");
}

Variable Module::register_parameter(const std::string& name, at::Tensor value, bool requires_grad) {
  check_name(name);
  Variable v(std::move(value), requires_grad);
  params_.emplace_back(name, v);
  return v;
}

Variable Module::register_buffer(const std::string& name, at::Tensor value) {
  check_name(name);
  Variable v(std::move(value), false);
  buffers_.emplace_back(name, v);
  return v;
}

void Module::mark_resizable(const std::string& name) {
  for (const auto* list : {&params_, &buffers_})
    for (const auto& [n, v] : *list)
      if (n == name) {
        resizable_.push_back(v.impl());
        return;
      }
  TORCH_CHECK(false, type_name_, ": mark_resizable('", name, "'): no parameter or buffer of that name");
}

void Module::mark_sharded(const std::string& name, TensorShard shard) {
  for (const auto& [n, v] : params_)
    if (n == name) {
      shards_[name] = shard;
      return;
    }
  TORCH_CHECK(false, type_name_, ": mark_sharded('", name, "'): no parameter of that name");
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_name(name);
  TORCH_CHECK(child, type_name_, ": child '", name, "' is null");
  children_.emplace_back(name, std::move(child));
}

namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

std::vector<std::pair<std::string, Variable>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Variable>> out(params_.begin(), params_.end());
  if (recurse) {
    for (const auto& [cname, child] : children_)
      for (auto& [n, v] : child->named_parameters(true)) out.emplace_back(join(cname, n), v);
  }
  return out;
}

std::vector<Variable> Module::parameters(bool recurse) const {
  std::vector<Variable> out;
  for (auto& [_, v] : named_parameters(recurse)) out.push_back(v);
  return out;
}

std::vector<std::pair<std::string, Variable>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Variable>> out(buffers_.begin(), buffers_.end());
  if (recurse) {
    for (const auto& [cname, child] : children_)
      for (auto& [n, v] : child->named_buffers(true)) out.emplace_back(join(cname, n), v);
  }
  return out;
}

std::map<std::string, TensorShard> Module::named_shards() const {
  std::map<std::string, TensorShard> out(shards_.begin(), shards_.end());
  for (const auto& [cname, child] : children_)
    for (const auto& [n, s] : child->named_shards()) out.emplace(join(cname, n), s);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back("", shared_from_this());
  for (size_t i = 0; i < out.size(); ++i) {  // breadth-first, iterative
    auto [prefix, m] = out[i];
    for (const auto& [cname, child] : m->children_) out.emplace_back(join(prefix, cname), child);
  }
  return out;
}

std::shared_ptr<Module> Module::submodule(const std::string& path) {
  std::shared_ptr<Module> m = shared_from_this();
  std::string walked;
  std::istringstream is(path);
  std::string part;
  while (std::getline(is, part, '.')) {
    std::shared_ptr<Module> next;
    for (const auto& [n, c] : m->children_)
      if (n == part) next = c;
    if (!next) {
      std::string known;
      for (const auto& [n, _] : m->children_) known += (known.empty() ? "" : ", ") + n;
      TORCH_CHECK(false, type_name_, ": no submodule '", part, "' under '", walked, "' (path '", path,
                  "'); children there: ", known.empty() ? "none" : known);
    }
    walked = join(walked, part);
    m = next;
  }
  return m;
}

TensorMap Module::state_dict() const {
  TensorMap out;
  for (auto& [n, v] : named_parameters()) out[n] = v.data();
  for (auto& [n, v] : named_buffers()) out[n] = v.data();
  return out;
}

void Module::load_state_dict(const TensorMap& state, bool strict) {
  std::vector<std::string> missing, unexpected, misshaped;
  std::set<std::string> seen;
  std::vector<std::pair<Variable, at::Tensor>> copies, replacements;
  std::set<const VariableImpl*> resizable;
  std::vector<const Module*> walk{this};
  for (size_t i = 0; i < walk.size(); ++i) {
    resizable.insert(walk[i]->resizable_.begin(), walk[i]->resizable_.end());
    for (const auto& [_, c] : walk[i]->children_) walk.push_back(c.get());
  }
  auto visit = [&](const std::string& n, Variable v) {
    seen.insert(n);
    auto it = state.find(n);
    if (it == state.end()) {
      missing.push_back(n);
      return;
    }
    if (!it->second.sizes().equals(v.sizes()) && resizable.count(v.impl())) {
      replacements.emplace_back(v, it->second);
      return;
    }
    if (!it->second.sizes().equals(v.sizes())) {
      misshaped.push_back(n + " (checkpoint " + c10::str(it->second.sizes()) + ", model " + c10::str(v.sizes()) + ")");
      return;
    }
    copies.emplace_back(v, it->second);
  };
  for (auto& [n, v] : named_parameters()) visit(n, v);
  for (auto& [n, v] : named_buffers()) visit(n, v);
  for (const auto& [n, _] : state)
    if (!seen.count(n)) unexpected.push_back(n);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += "\n    " + x;
    return s;
  };
  const bool bad = !misshaped.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  TORCH_CHECK(!bad, "load_state_dict into ", type_name_,
              " failed:", missing.empty() || !strict ? "" : "\n  missing:", strict ? list(missing) : "",
              unexpected.empty() || !strict ? "" : "\n  unexpected:", strict ? list(unexpected) : "",
              misshaped.empty() ? "" : "\n  wrong shape:", list(misshaped));
  // Everything validated: only now is anything written.
  NoGradGuard no_grad;
  for (auto& [v, t] : copies) v.mutable_data().copy_(t);
  for (auto& [v, t] : replacements) v.set_data(t.to(v.options(), /*non_blocking=*/false, /*copy=*/true));
}

void Module::train(bool on) {
  // Raw-pointer walk (not named_modules(), which needs shared_from_this): modules held by value
  // or on the stack can switch mode too.
  std::vector<Module*> walk{this};
  for (size_t i = 0; i < walk.size(); ++i) {
    walk[i]->training_ = on;
    walk[i]->on_train(on);
    for (const auto& [_, c] : walk[i]->children_) walk.push_back(c.get());
  }
}

void Module::to(at::Device device, std::optional<at::ScalarType> dtype) {
  auto move = [&](Variable v) {
    at::Tensor t = v.data();
    const bool floating = at::isFloatingType(t.scalar_type());
    at::Tensor moved = dtype && floating ? t.to(device, *dtype) : t.to(device);
    v.set_data(moved);
    if (v.grad().defined()) v.set_grad(dtype && floating ? v.grad().to(device, *dtype) : v.grad().to(device));
  };
  for (auto& [_, v] : named_parameters()) move(v);
  for (auto& [_, v] : named_buffers()) move(v);
}

void Module::to(at::ScalarType dtype) {
  auto params = named_parameters();
  at::Device dev = params.empty() ? at::Device(at::kCPU) : params.front().second.device();
  to(dev, dtype);
}

void Module::zero_grad() {
  for (auto& [_, v] : named_parameters()) v.zero_grad();
}

size_t Module::num_parameters() const {
  size_t n = 0;
  for (auto& [_, v] : named_parameters()) n += v.numel();
  return n;
}

}  // namespace tl
