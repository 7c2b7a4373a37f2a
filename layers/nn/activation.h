#pragma once
// Parameter-free layers: activations, dropout, flatten, identity.

#include "layers/module.h"
#include "layers/nn/init.h"
#include "layers/nn/rng.h"

namespace tl {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Variable forward(const Variable& x) override;
};

class GELU : public Module {
 public:
  /// approximate: "none" (x * Phi(x), erf form) or "tanh" (GPT-2's approximation).
  explicit GELU(const std::string& approximate = "none");
  Variable forward(const Variable& x) override;

 private:
  bool tanh_;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Variable forward(const Variable& x) override;
};

/// Inverted dropout, active in training mode only. With a generator (p > 0) the layer forks its
/// own mask stream off it and registers the stream's state as buffer "generator" (checkpointed);
/// without one it uses ATen's default generator of the input's device. Masks are drawn on the
/// input's device. See Note [generators per purpose] in layers/nn/rng.h.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, const init::Generator& gen = std::nullopt);
  Variable forward(const Variable& x) override;
  double p() const { return p_; }

 private:
  double p_;
  DropoutRng rng_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}
  Variable forward(const Variable& x) override;

 private:
  int64_t start_dim_, end_dim_;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Variable forward(const Variable& x) override { return x; }
};

}  // namespace tl
