#pragma once
// Sequential: children run one after another, each through its forward(Variable).

#include "layers/module.h"

namespace tl {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<ModulePtr> modules);

  /// Appends under the name "<index>" (as torch.nn.Sequential) and returns the module.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    push_back(std::to_string(modules_.size()), module);
    return module;
  }
  /// Appends under an explicit name.
  void push_back(const std::string& name, ModulePtr module);

  Variable forward(const Variable& x) override;

  size_t size() const { return modules_.size(); }
  const ModulePtr& operator[](size_t i) const;
  const std::vector<ModulePtr>& modules() const { return modules_; }

 private:
  std::vector<ModulePtr> modules_;
};

}  // namespace tl
