#include "layers/optim/optimizer.h"

#include <cmath>
#include <set>

namespace tl {
namespace {

// Group options as float64 scalars in the state dict (bools as 0/1).
struct OptionField {
  const char* name;
  double GroupOptions::*number;  // exactly one of these is set
  bool GroupOptions::*flag;
};
const OptionField kOptionFields[] = {
    {"lr", &GroupOptions::lr, nullptr},
    {"weight_decay", &GroupOptions::weight_decay, nullptr},
    {"momentum", &GroupOptions::momentum, nullptr},
    {"dampening", &GroupOptions::dampening, nullptr},
    {"nesterov", nullptr, &GroupOptions::nesterov},
    {"beta1", &GroupOptions::beta1, nullptr},
    {"beta2", &GroupOptions::beta2, nullptr},
    {"eps", &GroupOptions::eps, nullptr},
    {"amsgrad", nullptr, &GroupOptions::amsgrad},
};

const OptionField& option_field(const std::string& name) {
  for (const auto& f : kOptionFields)
    if (name == f.name) return f;
  TORCH_CHECK(false, "internal: unknown optimizer option '", name, "'");
}

double get_option(const GroupOptions& o, const std::string& name) {
  const OptionField& f = option_field(name);
  return f.number ? o.*f.number : (o.*f.flag ? 1.0 : 0.0);
}

void set_option(GroupOptions& o, const std::string& name, double v) {
  const OptionField& f = option_field(name);
  if (f.number)
    o.*f.number = v;
  else
    o.*f.flag = v != 0.0;
}

bool is_no_decay(const std::string& name, const Variable& p, const std::string& owner_type,
                 const std::vector<std::string>& extra) {
  if (p.dim() < 2) return true;
  const auto dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  if (leaf == "bias") return true;
  if (owner_type.find("Norm") != std::string::npos) return true;
  for (const auto& e : extra)
    if (!e.empty() && name.find(e) != std::string::npos) return true;
  return false;
}

const std::string kStatePrefix = "state.";
const std::string kGroupPrefix = "groups.";

}  // namespace

std::vector<ParamGroup> weight_decay_groups(Module& model, double weight_decay,
                                            const std::vector<std::string>& extra_no_decay) {
  TORCH_CHECK(weight_decay >= 0.0, "weight_decay_groups: weight_decay must be >= 0, got ", weight_decay);
  // Owner type of every parameter: the module that registered it directly.
  std::map<std::string, std::string> owner;
  for (auto& [prefix, m] : model.named_modules())
    for (auto& [n, _] : m->named_parameters(/*recurse=*/false))
      owner[prefix.empty() ? n : prefix + "." + n] = m->type_name();

  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0.0;
  for (auto& [n, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    ParamGroup& g = groups[is_no_decay(n, p, owner[n], extra_no_decay) ? 1 : 0];
    g.params.push_back(p);
    g.names.push_back(n);
  }
  return groups;
}

ParamGroup all_parameters(const Module& model) {
  ParamGroup g;
  for (auto& [n, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    g.params.push_back(p);
    g.names.push_back(n);
  }
  return g;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, const GroupOptions& defaults) {
  TORCH_CHECK(!groups.empty(), "optimizer: no parameter groups given");
  std::set<std::string> seen_names;
  std::set<const VariableImpl*> seen_params;
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& in = groups[g];
    TORCH_CHECK(in.names.empty() || in.names.size() == in.params.size(), "optimizer: group ", g, " has ",
                in.params.size(), " parameters but ", in.names.size(), " names (give one name per parameter, or none)");
    Group out;
    out.options = in.options.value_or(defaults);
    if (in.lr) out.options.lr = *in.lr;
    if (in.weight_decay) out.options.weight_decay = *in.weight_decay;
    for (size_t i = 0; i < in.params.size(); ++i) {
      const Variable& p = in.params[i];
      std::string name = in.names.empty() ? "group" + std::to_string(g) + ".param" + std::to_string(i) : in.names[i];
      TORCH_CHECK(p.defined(), "optimizer: parameter '", name, "' (group ", g, ") is undefined");
      TORCH_CHECK(p.is_leaf(), "optimizer: parameter '", name, "' (group ", g,
                  ") is not a leaf; optimizers update leaves (module parameters) only");
      TORCH_CHECK(at::isFloatingType(p.scalar_type()), "optimizer: parameter '", name, "' is ", p.scalar_type(),
                  "; only floating-point parameters can be optimized");
      TORCH_CHECK(!name.empty(), "optimizer: parameter ", i, " of group ", g, " has an empty name");
      TORCH_CHECK(seen_names.insert(name).second, "optimizer: parameter name '", name,
                  "' appears twice; names key the optimizer state and must be unique across groups");
      TORCH_CHECK(seen_params.insert(p.impl()).second, "optimizer: parameter '", name,
                  "' is already in this optimizer (a parameter may belong to one group only)");
      out.params.push_back(p);
      out.names.push_back(std::move(name));
    }
    groups_.push_back(std::move(out));
  }
}

void Optimizer::validate_group(const GroupOptions& o, const std::string& where) const {
  TORCH_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, where, ": lr must be finite and >= 0, got ", o.lr);
  TORCH_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, where,
              ": weight_decay must be finite and >= 0, got ", o.weight_decay);
  validate(o, where);
}

void Optimizer::validate_all() const {
  for (size_t g = 0; g < groups_.size(); ++g)
    validate_group(groups_[g].options, name() + " group " + std::to_string(g));
}

Optimizer::Group& Optimizer::group(size_t g) {
  TORCH_CHECK(g < groups_.size(), name(), ": group ", g, " out of range (", groups_.size(), " groups)");
  return groups_[g];
}
const Optimizer::Group& Optimizer::group(size_t g) const {
  TORCH_CHECK(g < groups_.size(), name(), ": group ", g, " out of range (", groups_.size(), " groups)");
  return groups_[g];
}

void Optimizer::set_lr(size_t g, double lr) {
  TORCH_CHECK(std::isfinite(lr) && lr >= 0.0, name(), ": lr must be finite and >= 0, got ", lr);
  group(g).options.lr = lr;
}

std::vector<Variable> Optimizer::parameters() const {
  std::vector<Variable> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (auto& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      Variable& p = g.params[i];
      at::Tensor grad = p.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(!grad.is_sparse(), name(), ": parameter '", g.names[i], "' has a sparse gradient; not supported");
      TORCH_CHECK(grad.sizes().equals(p.sizes()), name(), ": gradient of '", g.names[i], "' has shape ", grad.sizes(),
                  " but the parameter has shape ", p.sizes());
      update(p, grad, g.options, state_[g.names[i]]);
    }
  }
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.zero_grad();
}

const Optimizer::SlotMap* Optimizer::param_state(const std::string& param_name) const {
  auto it = state_.find(param_name);
  return it == state_.end() || it->second.empty() ? nullptr : &it->second;
}

TensorMap Optimizer::state_dict() const {
  TensorMap out;
  std::vector<std::string> opts = {"lr", "weight_decay"};
  for (const auto& o : option_names()) opts.push_back(o);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& o : opts)
      out[kGroupPrefix + std::to_string(g) + "." + o] =
          at::scalar_tensor(get_option(groups_[g].options, o), at::TensorOptions().dtype(at::kDouble));
    for (const auto& pname : groups_[g].names) {
      auto it = state_.find(pname);
      if (it == state_.end()) continue;
      for (const auto& [slot, t] : it->second) out[kStatePrefix + pname + "." + slot] = t;
    }
  }
  return out;
}

void Optimizer::check_state_dict(const TensorMap& state) const {
  std::vector<std::string> problems;
  std::set<std::string> used;
  std::vector<std::string> opts = {"lr", "weight_decay"};
  for (const auto& o : option_names()) opts.push_back(o);
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupOptions restored = groups_[g].options;
    for (const auto& o : opts) {
      const std::string key = kGroupPrefix + std::to_string(g) + "." + o;
      auto it = state.find(key);
      if (it == state.end()) {
        problems.push_back("missing " + key);
        continue;
      }
      used.insert(key);
      if (it->second.numel() != 1 || !at::isFloatingType(it->second.scalar_type())) {
        problems.push_back(key + ": expected a floating-point scalar, got " + c10::toString(it->second.scalar_type()) +
                           " of shape " + c10::str(it->second.sizes()));
        continue;
      }
      set_option(restored, o, it->second.item<double>());
    }
    try {
      validate_group(restored, name() + " group " + std::to_string(g) + " (from state dict)");
    } catch (const c10::Error& e) {
      problems.push_back(e.what_without_backtrace());
    }
    const auto slots = slot_names(restored);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const std::string& pname = groups_[g].names[i];
      const Variable& p = groups_[g].params[i];
      size_t present = 0;
      for (const auto& slot : slots) {
        const std::string key = kStatePrefix + pname + "." + slot;
        auto it = state.find(key);
        if (it == state.end()) continue;
        ++present;
        used.insert(key);
        const at::Tensor& t = it->second;
        if (slot == "step") {
          if (t.numel() != 1)
            problems.push_back(key + ": expected a scalar step count, got shape " + c10::str(t.sizes()));
        } else if (!t.sizes().equals(p.sizes())) {
          problems.push_back(key + ": shape " + c10::str(t.sizes()) + " but parameter '" + pname + "' has shape " +
                             c10::str(p.sizes()));
        }
      }
      if (present != 0 && present != slots.size()) {
        std::string want;
        for (const auto& s : slots) want += (want.empty() ? "" : ", ") + s;
        problems.push_back("incomplete state for parameter '" + pname + "': has " + std::to_string(present) + " of " +
                           std::to_string(slots.size()) + " slots (" + want + ")");
      }
    }
  }
  for (const auto& [k, _] : state)
    if (!used.count(k)) problems.push_back("unexpected " + k);
  if (problems.empty()) return;
  std::string msg;
  for (const auto& p : problems) msg += "\n  " + p;
  TORCH_CHECK(false, name(), ": optimizer state dict does not fit this optimizer (", groups_.size(),
              " groups; state keys are state.<param>.<slot> and groups.<g>.<option>):", msg);
}

void Optimizer::load_state_dict(const TensorMap& state) {
  check_state_dict(state);
  // Validated: build the new state first, then swap it in.
  std::vector<std::string> opts = {"lr", "weight_decay"};
  for (const auto& o : option_names()) opts.push_back(o);
  std::vector<GroupOptions> new_opts;
  std::unordered_map<std::string, SlotMap> new_state;
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupOptions o = groups_[g].options;
    for (const auto& opt_name : opts)
      set_option(o, opt_name, state.at(kGroupPrefix + std::to_string(g) + "." + opt_name).item<double>());
    new_opts.push_back(o);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const std::string& pname = groups_[g].names[i];
      const Variable& p = groups_[g].params[i];
      for (const auto& slot : slot_names(o)) {
        auto it = state.find(kStatePrefix + pname + "." + slot);
        if (it == state.end()) continue;
        at::Tensor t = it->second;
        t = slot == "step" ? t.reshape({}).to(at::kCPU, at::kLong)  // host-side counter
                           : t.to(p.device(), at::isFloatingType(t.scalar_type()) ? p.scalar_type() : t.scalar_type());
        // Own the memory: the state dict's tensors may be shared with the caller.
        new_state[pname][slot] = t.clone(at::MemoryFormat::Contiguous);
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = new_opts[g];
  state_ = std::move(new_state);
}

}  // namespace tl
