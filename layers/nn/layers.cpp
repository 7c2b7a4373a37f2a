// Initialisation and the basic layers: Linear, Conv2d, pooling, BatchNorm2d, LayerNorm,
// Embedding, activations, Dropout, Flatten, Sequential.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <mutex>

#include "layers/nn/activation.h"
#include "layers/nn/conv.h"
#include "layers/nn/embedding.h"
#include "layers/nn/init.h"
#include "layers/nn/linear.h"
#include "layers/nn/norm.h"
#include "layers/nn/sequential.h"

namespace tl {

// ---- init -----------------------------------------------------------------------------------------
namespace init {
namespace {
c10::optional<at::Generator> c10_gen(const Generator& gen) {
  return gen ? c10::optional<at::Generator>(*gen) : c10::nullopt;
}
}  // namespace

Generator fork(const Generator& gen, const std::string& path) {
  if (!gen) return std::nullopt;
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the path, then splitmix64 with the seed
  for (unsigned char c : path) h = (h ^ c) * 1099511628211ull;
  uint64_t z = gen->current_seed() ^ h;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return at::detail::createCPUGenerator(z ^ (z >> 31));
}

int64_t fan_in(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() >= 1, "init::fan_in: needs a tensor with at least one dim, got a scalar");
  if (weight.dim() == 1) return weight.size(0);
  return weight.numel() / weight.size(0);  // in * prod(kernel)
}

namespace {
thread_local bool meta_build = false;
}  // namespace

MetaGuard::MetaGuard() : was_(meta_build) { meta_build = true; }
MetaGuard::~MetaGuard() { meta_build = was_; }
bool building_on_meta() { return meta_build; }
at::TensorOptions options(std::optional<at::ScalarType> dtype) {
  at::TensorOptions o = at::TensorOptions().device(meta_build ? at::Device(at::kMeta) : at::Device(at::kCPU));
  return dtype ? o.dtype(*dtype) : o;  // no dtype: ATen's default, as before
}

at::Tensor uniform_(at::Tensor t, double low, double high, const Generator& gen) {
  if (t.is_meta()) return t;  // shapes only: nothing to fill (Note [building on the meta device])
  return t.uniform_(low, high, c10_gen(gen));
}

at::Tensor normal_(at::Tensor t, double mean, double std, const Generator& gen) {
  if (t.is_meta()) return t;
  return t.normal_(mean, std, c10_gen(gen));
}

at::Tensor kaiming_uniform_(at::Tensor t, double a, const Generator& gen) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in(t)));
  return uniform_(t, -bound, bound, gen);
}

void default_linear_(at::Tensor weight, at::Tensor bias, const Generator& gen) {
  kaiming_uniform_(weight, std::sqrt(5.0), gen);
  if (bias.defined()) {
    const int64_t fi = fan_in(weight);
    const double bound = fi > 0 ? 1.0 / std::sqrt(static_cast<double>(fi)) : 0.0;
    uniform_(bias, -bound, bound, gen);
  }
}
}  // namespace init

// ---- Linear ---------------------------------------------------------------------------------------
Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const init::Generator& gen)
    : Linear("Linear", in_features, out_features, bias, gen) {}

Linear::Linear(const char* type_name, int64_t in_features, int64_t out_features, bool bias, const init::Generator& gen)
    : Module(type_name), in_features_(in_features), out_features_(out_features) {
  TORCH_CHECK(in_features > 0 && out_features > 0, type_name, ": in_features and out_features must be positive, got ",
              in_features, " and ", out_features);
  at::Tensor w = at::empty({out_features, in_features}, init::options());
  at::Tensor b = bias ? at::empty({out_features}, init::options()) : at::Tensor();
  init::default_linear_(w, b, gen);
  weight_ = register_parameter("weight", w);
  if (bias) bias_ = register_parameter("bias", b);
}

void Linear::check_input(const Variable& x) const {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, type_name(), "(", in_features_, " -> ", out_features_,
              "): input must be (..., ", in_features_, "), got ", x.sizes());
}

Variable Linear::forward(const Variable& x) {
  check_input(x);
  return linear(x, weight_, bias_);
}

// ---- Conv2d and pooling ---------------------------------------------------------------------------
Conv2d::Conv2d(const Conv2dOptions& o, const init::Generator& gen) : Module("Conv2d"), options_(o) {
  TORCH_CHECK(o.in_channels_ > 0 && o.out_channels_ > 0 && o.groups_ > 0 && o.in_channels_ % o.groups_ == 0 &&
                  o.out_channels_ % o.groups_ == 0,
              "Conv2d: channels must be positive and divisible by groups, got in ", o.in_channels_, ", out ",
              o.out_channels_, ", groups ", o.groups_);
  at::Tensor w = at::empty({o.out_channels_, o.in_channels_ / o.groups_, o.kernel_[0], o.kernel_[1]}, init::options());
  at::Tensor b = o.bias_ ? at::empty({o.out_channels_}, init::options()) : at::Tensor();
  init::default_linear_(w, b, gen);
  weight_ = register_parameter("weight", w);
  if (o.bias_) bias_ = register_parameter("bias", b);
}

Variable Conv2d::forward(const Variable& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == options_.in_channels_, "Conv2d(", options_.in_channels_, " -> ",
              options_.out_channels_, "): input must be (N, ", options_.in_channels_, ", H, W), got ", x.sizes());
  return conv2d(x, weight_, bias_, options_.stride_, options_.padding_, options_.dilation_, options_.groups_);
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : Module("MaxPool2d"), kernel_(kernel), stride_(stride > 0 ? stride : kernel), padding_(padding) {}

Variable MaxPool2d::forward(const Variable& x) {
  return max_pool2d(x, {kernel_, kernel_}, {stride_, stride_}, {padding_, padding_});
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : Module("AvgPool2d"), kernel_(kernel), stride_(stride > 0 ? stride : kernel), padding_(padding) {}

Variable AvgPool2d::forward(const Variable& x) {
  return avg_pool2d(x, {kernel_, kernel_}, {stride_, stride_}, {padding_, padding_});
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> output_size)
    : Module("AdaptiveAvgPool2d"), output_size_(output_size) {}

Variable AdaptiveAvgPool2d::forward(const Variable& x) { return adaptive_avg_pool2d(x, output_size_); }

// ---- normalisation ------------------------------------------------------------------------------
BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
    : Module("BatchNorm2d"),
      num_features_(num_features),
      eps_(eps),
      momentum_(momentum),
      track_running_stats_(track_running_stats) {
  TORCH_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got ", num_features);
  if (affine) {
    weight_ = register_parameter("weight", at::ones({num_features}, init::options()));
    bias_ = register_parameter("bias", at::zeros({num_features}, init::options()));
  }
  if (track_running_stats) {
    running_mean_ = register_buffer("running_mean", at::zeros({num_features}, init::options()));
    running_var_ = register_buffer("running_var", at::ones({num_features}, init::options()));
    num_batches_tracked_ = register_buffer("num_batches_tracked", at::zeros({}, init::options(at::kLong)));
  }
}

Variable BatchNorm2d::forward(const Variable& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == num_features_, "BatchNorm2d(", num_features_, "): input must be (N, ",
              num_features_, ", H, W), got ", x.sizes());
  // Batch statistics in training, and in eval when no running statistics are tracked (as torch).
  // running_mean/var are undefined when not tracked; in training they are updated in place.
  const bool batch_stats = is_training() || !track_running_stats_;
  if (track_running_stats_ && is_training()) num_batches_tracked_.mutable_data().add_(1);
  const at::Tensor none;
  return batch_norm(x, weight_, bias_, track_running_stats_ ? running_mean_.data() : none,
                    track_running_stats_ ? running_var_.data() : none, batch_stats, momentum_, eps_);
}

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  TORCH_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must have at least one dim");
  if (elementwise_affine) {
    weight_ = register_parameter("weight", at::ones(normalized_shape_, init::options()));
    bias_ = register_parameter("bias", at::zeros(normalized_shape_, init::options()));
  }
}

Variable LayerNorm::forward(const Variable& x) { return layer_norm(x, normalized_shape_, weight_, bias_, eps_); }

// ---- Embedding ----------------------------------------------------------------------------------
Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx, const init::Generator& gen)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim), padding_idx_(padding_idx) {
  TORCH_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got ", num_embeddings, " x ",
              embedding_dim);
  TORCH_CHECK(padding_idx >= -1 && padding_idx < num_embeddings, "Embedding: padding_idx must be in [0, ",
              num_embeddings, ") or -1 (none), got ", padding_idx);
  at::Tensor w = init::normal_(at::empty({num_embeddings, embedding_dim}, init::options()), 0.0, 1.0, gen);
  if (padding_idx >= 0) w[padding_idx].zero_();
  weight_ = register_parameter("weight", w);
}

Variable Embedding::forward(const at::Tensor& ids) {
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt,
              "Embedding: indices must be int64 or int32, got ", ids.scalar_type());
  return embedding(weight_, ids.scalar_type() == at::kLong ? ids : ids.to(at::kLong), padding_idx_);
}

Variable Embedding::forward(const Variable& ids) { return forward(ids.data()); }

// ---- parameter-free layers ------------------------------------------------------------------------
Variable ReLU::forward(const Variable& x) { return relu(x); }

GELU::GELU(const std::string& approximate) : Module("GELU"), tanh_(approximate == "tanh") {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "GELU: approximate must be 'none' or 'tanh', got '",
              approximate, "'");
}

Variable GELU::forward(const Variable& x) { return gelu(x, tanh_); }

Variable Tanh::forward(const Variable& x) { return tanh(x); }

Dropout::Dropout(double p, const init::Generator& gen) : Module("Dropout"), p_(p) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
  if (p > 0.0) rng_ = DropoutRng(gen, *this);
}

Variable Dropout::forward(const Variable& x) {
  if (!is_training() || p_ == 0.0) return x;
  TORCH_CHECK(x.defined(), "Dropout: undefined input");
  Variable y = dropout(x, p_, /*training=*/true, rng_.generator_for(x.device()));
  rng_.commit();
  return y;
}

// ---- DropoutRng (Note [generators per purpose]) --------------------------------------------------
namespace {
uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 bits that depend on all of a generator's state (FNV-1a over its bytes, then mixed).
uint64_t state_hash(const at::Generator& gen) {
  const at::Tensor state = gen.get_state().contiguous();  // uint8 on the CPU for every device type
  const uint8_t* p = state.data_ptr<uint8_t>();
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < state.numel(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return splitmix64(h);
}

}  // namespace

BufferedGenerator::BufferedGenerator(at::Generator gen, Module& owner, const std::string& name) : gen_(gen) {
  buffer_ = owner.register_buffer(name, gen.get_state());
  written_impl_ = buffer_.data().unsafeGetTensorImpl();
  written_version_ = buffer_.data()._version();
}

at::Generator& BufferedGenerator::get() {
  TORCH_CHECK(gen_, "BufferedGenerator: no generator");
  const at::Tensor& b = buffer_.data();
  if (b.unsafeGetTensorImpl() != written_impl_ || b._version() != written_version_) {
    // load_state_dict or Module::to replaced or rewrote the state: one copy to the host.
    gen_->set_state(b.to(at::kCPU).contiguous());
    written_impl_ = b.unsafeGetTensorImpl();
    written_version_ = b._version();
  }
  return *gen_;
}

void BufferedGenerator::commit() {
  if (!gen_) return;
  // A new tensor each time (not an in-place copy): a state_dict() taken earlier keeps its values.
  at::Tensor state = gen_->get_state();
  const at::Device device = buffer_.data().device();
  if (!device.is_cpu()) {
    state = state.pin_memory().to(device, /*non_blocking=*/true);  // the caching host allocator keeps the source alive
  }
  buffer_.set_data(state);
  written_impl_ = state.unsafeGetTensorImpl();
  written_version_ = state._version();
}

uint64_t next_random64(at::Generator& gen) {
  if (gen.device().is_cpu()) {
    std::lock_guard<std::mutex> lock(gen.mutex());  // as ATen's kernels do around their draws
    return gen.get<at::CPUGeneratorImpl>()->random64();
  }
  // Other devices' generators expose no host-side draw: derive from the state and re-seed.
  const uint64_t seed = state_hash(gen);
  gen.set_current_seed(splitmix64(seed ^ 0x5eedull));
  return seed;
}

DropoutRng::DropoutRng(const init::Generator& gen, Module& owner, const std::string& name) {
  if (!gen) return;
  at::Generator parent = *gen;
  at::Generator stream = parent.clone();
  // The parent moves to an unrelated sequence, so later initialisation never repeats the numbers
  // this stream will draw.
  parent.set_current_seed(splitmix64(state_hash(parent) ^ 0xd50f0u));
  stream_ = BufferedGenerator(stream, owner, name);
}

void DropoutRng::fork_for_rank(int64_t rank) {
  if (!stream_.defined()) return;
  at::Generator& stream = stream_.get();
  stream.set_current_seed(splitmix64(state_hash(stream) ^ (0x7e45u + static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull)));
  stream_.commit();
}

std::optional<at::Generator> DropoutRng::generator_for(at::Device device) {
  if (!stream_.defined() || device.is_meta()) return std::nullopt;  // meta: nothing is drawn
  at::Generator& stream = stream_.get();
  if (stream.device().type() == device.type() &&
      (device.is_cpu() || !device.has_index() || stream.device().index() == device.index())) {
    return stream;
  }
  // Another device: a generator of that device, seeded from this stream.
  at::Generator g = at::globalContext().defaultGenerator(device).clone();
  g.set_current_seed(next_random64(stream));
  return g;
}

Variable Flatten::forward(const Variable& x) { return flatten(x, start_dim_, end_dim_); }

// ---- Sequential ---------------------------------------------------------------------------------
Sequential::Sequential(std::vector<ModulePtr> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(std::to_string(modules_.size()), m);
}

void Sequential::push_back(const std::string& name, ModulePtr module) {
  register_module(name, module);
  modules_.push_back(std::move(module));
}

const ModulePtr& Sequential::operator[](size_t i) const {
  TORCH_CHECK(i < modules_.size(), "Sequential: index ", i, " out of range (size ", modules_.size(), ")");
  return modules_[i];
}

Variable Sequential::forward(const Variable& x) {
  Variable y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

}  // namespace tl
