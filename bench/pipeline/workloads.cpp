// bench_pipeline's workloads: ResNet-8, ResNet-18 and a small GPT-2 with fixed seeds.
#include "bench/pipeline/workloads.h"

#include <ATen/CPUGeneratorImpl.h>

#include "layers/models/gpt2.h"
#include "layers/models/resnet.h"

namespace tl::bench_pipeline {
namespace {

// A ResNet (make_resnet's `name`, weights from `seed`) on a batch of `b` 1x28x28 images in 10
// classes (from `batch_seed`); 4 stages: cuts layer1, layer2, layer3; 2 stages: cut `half`.
Workload resnet(const std::string& name, uint64_t seed, const std::string& half, int64_t b, uint64_t batch_seed) {
  Workload w;
  w.name = name;
  w.make = [name, seed] { return ModulePtr(make_resnet(name, 1, 10, 1.0, at::detail::createCPUGenerator(seed))); };
  w.cuts[4] = {"layer1", "layer2", "layer3"};
  w.cuts[2] = {half};
  at::Generator gen = at::detail::createCPUGenerator(batch_seed);
  w.batch.input = at::randn({b, 1, 28, 28}, gen);
  w.batch.target = at::randint(10, {b}, gen, at::kLong);
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::ones({b}, at::kLong);
  w.loss = classification_loss;
  return w;
}

// A GPT-2 of `layers` x `width` (width / 64 heads) on `b` x `t` tokens of a `vocab` vocabulary;
// 4 stages of layers / 4 blocks each (the first with the embeddings, the last with the head).
Workload gpt2(const std::string& name, int64_t layers, int64_t width, int64_t vocab, int64_t b, int64_t t) {
  Workload w;
  w.name = name;
  w.make = [=] {
    GPT2Config c;
    c.vocab_size = vocab;
    c.n_positions = t;
    c.n_embd = width;
    c.n_layer = layers;
    c.n_head = width / 64;
    c.dropout = 0.0;
    return ModulePtr(std::make_shared<GPT2>(c, at::detail::createCPUGenerator(2)));
  };
  const int64_t q = layers / 4;
  w.cuts[4] = {"h." + std::to_string(q - 1), "h." + std::to_string(2 * q - 1), "h." + std::to_string(3 * q - 1)};
  w.cuts[2] = {"h." + std::to_string(2 * q - 1)};
  at::Generator gen = at::detail::createCPUGenerator(12);
  w.batch.input = at::randint(vocab, {b, t}, gen, at::kLong);
  w.batch.target = at::randint(vocab, {b, t}, gen, at::kLong);
  w.batch.side.token_ids = w.batch.input;
  w.batch.sample_ids = at::arange(b, at::kLong);
  w.batch.units = at::full({b}, t, at::kLong);
  w.loss = next_token_loss;
  return w;
}

}  // namespace

Workload make_workload(const std::string& name) {
  if (name == "resnet8") return resnet("resnet8", 1, "layer1", 128, 11);
  if (name == "gpt2" || name == "gpt2_4x256") return gpt2("gpt2_4x256", 4, 256, 256, 32, 64);
  // GPT-2 small (124M), for the GPU calibration: 16 x 1024 tokens, 3 blocks a stage.
  if (name == "gpt2_12x768") return gpt2("gpt2_12x768", 12, 768, 50257, 16, 1024);
  // The same with the vocabulary padded to a multiple of 64 (50,304, as nanoGPT does).
  if (name == "gpt2_12x768_v50304") return gpt2("gpt2_12x768_v50304", 12, 768, 50304, 16, 1024);
  if (name == "resnet18") return resnet("resnet18", 3, "layer2", 32, 13);
  TORCH_CHECK(false, "unknown model '", name, "'; known: resnet8, gpt2, resnet18, gpt2_12x768, gpt2_12x768_v50304");
}

std::shared_ptr<Pipeline> build(const Workload& w, int stages, const std::string& fwd, const std::string& bwd) {
  BoundarySpec spec;
  spec.forward = fwd;
  spec.backward = bwd;
  const std::vector<std::string>& cuts = w.cuts.at(stages);
  auto p = Pipeline::build(w.make(), cuts, std::vector<BoundarySpec>(cuts.size(), spec));
  // A timing benchmark: no error statistics (across processes they would add a reference message
  // per compressed message: Note [reference tensors] in parallel/channel.h).
  p->set_measure_error(false);
  return p;
}

}  // namespace tl::bench_pipeline
