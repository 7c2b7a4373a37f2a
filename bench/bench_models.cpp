// Training-step time of tapeline models against the same models in torch::nn + torch::optim, in
// one process: forward, cross-entropy, backward, optimizer step (SGD with momentum 0.9; AdamW for
// the MiniLM fine-tuning step, as in configs/text/). Both models start
// from the same weights and see the same batch; steps are interleaved (tapeline, torch,
// tapeline, ...) after a warm-up so that drift in machine load hits both alike, and the median
// step time of each is reported. One JSON line per case:
//   {"bench": "models", "case": ..., "tapeline_s": ..., "reference_s": ..., "ratio": ...}
// ratio = tapeline_s / reference_s (target <= 1.05); cpu_ratio is the same on process CPU time,
// which a loaded machine disturbs less than wall time. Transformer cases also report tokens/s
// (tokens in the batch / median step time) for both.
//
// Usage: bench_models [steps (default 5)] [warmup (default 2)] [gpt2 vocabulary (default 50257)]
//                     [--device cpu|cuda] [--only resnet18,gpt2,minilm,gpt2_small,gpt2_small_explicit]
// With GPT-2's vocabulary the tied output projection is ~80% of the GPT-2 step's FLOPs; a small
// vocabulary (e.g. 512) puts the transformer blocks in the foreground.
// --device cuda runs both models on the GPU (float32, as tapeline trains; every step ends with the
// loss read back, so its kernels are done when its time is taken) with the cases resnet18 (batch
// 128 there) and gpt2_small (GPT-2 small, 124M: 12 x 768, 8 x 1024 tokens) by default, the latter
// twice: with tapeline's default attention (fused on a GPU: Note [fused attention] in
// autograd/ops/attention.cpp) and with its explicit one (gpt2_small_explicit). The torch::nn
// reference computes attention with explicit products and a softmax in both;
// bench/peer/torch_eager_models.py times the same steps in PyTorch's Python with
// scaled_dot_product_attention (what a PyTorch user would write) and with explicit attention.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "autograd/attention_path.h"
#include "layers/models/bert.h"
#include "layers/models/gpt2.h"
#include "layers/models/resnet.h"
#include "layers/optim/adam.h"
#include "layers/optim/sgd.h"
#include "tests/layers/models_reference.h"

namespace {

struct Timing {
  double wall, cpu;  // seconds; cpu = process CPU time (all threads), steadier on a loaded machine
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Timing measure(const std::function<void()>& fn) {
  const double c0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), process_cpu_seconds() - c0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void run_case(const std::string& name, const std::string& shape, const std::function<double()>& tl_step,
              const std::function<double()>& ref_step, int steps, int warmup, int64_t tokens = 0) {
  double tl_loss = 0, ref_loss = 0;
  for (int i = 0; i < warmup; ++i) {
    tl_loss = tl_step();
    ref_loss = ref_step();
  }
  std::vector<double> tl_wall, ref_wall, tl_cpu, ref_cpu;
  for (int i = 0; i < steps; ++i) {
    const Timing a = measure([&] { tl_loss = tl_step(); });
    const Timing b = measure([&] { ref_loss = ref_step(); });
    tl_wall.push_back(a.wall), tl_cpu.push_back(a.cpu);
    ref_wall.push_back(b.wall), ref_cpu.push_back(b.cpu);
  }
  const double a = median(tl_wall), b = median(ref_wall), ac = median(tl_cpu), bc = median(ref_cpu);
  std::printf(
      "{\"bench\": \"models\", \"case\": \"%s\", \"shape\": \"%s\", \"steps\": %d, \"warmup\": %d, \"threads\": %d, "
      "\"tapeline_s\": %.5f, \"reference_s\": %.5f, \"ratio\": %.4f, \"tapeline_cpu_s\": %.5f, "
      "\"reference_cpu_s\": %.5f, \"cpu_ratio\": %.4f, \"tapeline_loss\": %.5f, \"reference_loss\": %.5f",
      name.c_str(), shape.c_str(), steps, warmup, at::get_num_threads(), a, b, a / b, ac, bc, ac / bc, tl_loss,
      ref_loss);
  if (tokens > 0)
    std::printf(", \"tapeline_tokens_per_s\": %.1f, \"reference_tokens_per_s\": %.1f", tokens / a, tokens / b);
  std::printf("}\n");
  std::fflush(stdout);
}

/// Copies tapeline's parameters and buffers into the reference (same names); aborts on a mismatch.
void sync(torch::nn::Module& ref, const tl::Module& ours) {
  const auto absent = tl::reference::copy_into(ref, ours.state_dict());
  TORCH_CHECK(absent.empty() && ref.named_parameters().size() == ours.named_parameters().size(),
              "bench_models: the reference model's names differ from tapeline's");
}

void resnet18(int steps, int warmup, at::Device device) {
  at::manual_seed(0);
  const int64_t batch = device.is_cpu() ? 32 : 128;
  auto ours = tl::make_resnet("resnet18", 3, 10);
  tl::reference::ResNet ref(std::vector<int64_t>{2, 2, 2, 2}, std::vector<int64_t>{64, 128, 256, 512}, 3, 10);
  sync(*ref, *ours);
  ours->to(device), ref->to(device);
  const at::Tensor x = at::randn({batch, 3, 32, 32}).to(device);
  const at::Tensor y = at::randint(10, {batch}, at::kLong).to(device);
  const auto opt = tl::GroupOptions().set_lr(0.01).set_momentum(0.9);
  tl::SGD tl_opt(ours->parameters(), opt);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  run_case(
      device.is_cpu() ? "resnet18_cifar_train_step" : "resnet18_cifar_train_step_cuda",
      std::string("B").append(std::to_string(batch)).append(" 3x32x32"),  // not "B" + ...: GCC 12's -Wstringop-overflow
      [&] {
        tl_opt.zero_grad();
        tl::Variable loss = tl::cross_entropy(ours->forward(tl::Variable(x)), y);
        loss.backward();
        tl_opt.step();
        return loss.item<double>();
      },
      [&] {
        ref_opt.zero_grad();
        auto loss = torch::cross_entropy_loss(ref->forward(x), y);
        loss.backward();
        ref_opt.step();
        return loss.item<double>();
      },
      steps, warmup);
}

/// GPT-2 of `layers` x `width` (width / 64 heads) on batch x t tokens.
void gpt2(int steps, int warmup, int64_t vocab, at::Device device, const std::string& name, int64_t layers,
          int64_t width, int64_t batch, int64_t t) {
  at::manual_seed(1);
  tl::GPT2Config c;
  c.vocab_size = vocab;
  c.n_positions = t;
  c.n_embd = width;
  c.n_layer = layers;
  c.n_head = width / 64;
  c.dropout = 0.0;  // the torch reference has no dropout
  auto ours = std::make_shared<tl::GPT2>(c);
  tl::reference::GPT2 ref(vocab, t, width, layers, width / 64);
  sync(*ref, *ours);
  ours->to(device), ref->to(device);
  const at::Tensor ids = at::randint(vocab, {batch, t}, at::kLong).to(device);
  const at::Tensor target = at::randint(vocab, {batch * t}, at::kLong).to(device);
  const auto opt = tl::GroupOptions().set_lr(0.01).set_momentum(0.9);
  tl::SGD tl_opt(ours->parameters(), opt);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  run_case(
      name,
      std::string("B").append(std::to_string(batch)).append(" T").append(std::to_string(t)).append(" V").append(
          std::to_string(vocab)),
      [&] {
        tl_opt.zero_grad();
        tl::Variable logits = tl::reshape(ours->forward(ids), {batch * t, vocab});  // (B*T, V)
        tl::Variable loss = tl::cross_entropy(logits, target);
        loss.backward();
        tl_opt.step();
        return loss.item<double>();
      },
      [&] {
        ref_opt.zero_grad();
        auto loss = torch::cross_entropy_loss(ref->forward(ids).reshape({batch * t, vocab}), target);
        loss.backward();
        ref_opt.step();
        return loss.item<double>();
      },
      steps, warmup, batch * t);
}

/// The fine-tuning step of configs/text/: MiniLM's architecture (6 layers, d = 384, 12 heads,
/// WordPiece vocabulary) with a 45-way classifier, batch 32 x 32 tokens with padding, AdamW. The
/// weights are random (the step's cost does not depend on them; no model files needed).
void minilm(int steps, int warmup, at::Device device) {
  at::manual_seed(2);
  const int64_t batch = 32, t = 32, labels = 45;
  tl::BertConfig c;
  c.vocab_size = 30522;
  c.hidden_size = 384;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 12;
  c.intermediate_size = 1536;
  c.num_labels = labels;
  c.hidden_dropout = 0.0;  // the torch reference has no dropout
  c.attention_dropout = 0.0;
  auto ours = std::make_shared<tl::Bert>(c);
  tl::reference::Bert ref(tl::reference::BertSizes{c.vocab_size, c.max_position_embeddings, c.type_vocab_size,
                                                   c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                                                   c.intermediate_size, labels, c.layer_norm_eps});
  sync(*ref, *ours);
  ours->to(device), ref->to(device);
  const at::Tensor ids = at::randint(1, c.vocab_size, {batch, t}, at::kLong).to(device);
  const at::Tensor lengths = at::randint(8, t + 1, {batch, 1}, at::kLong);  // (B, 1) real tokens per row
  const at::Tensor mask = at::arange(t).view({1, t}).lt(lengths).to(at::kLong).to(device);  // (B, T) 1 = token
  const at::Tensor types = at::zeros({batch, t}, at::kLong).to(device);
  const at::Tensor y = at::randint(labels, {batch}, at::kLong).to(device);
  const auto opt = tl::GroupOptions().set_lr(1e-4).set_weight_decay(0.01);
  tl::AdamW tl_opt(ours->parameters(), opt);
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  run_case(
      "minilm_finetune_train_step", "B32 T32 L45 adamw",
      [&] {
        tl_opt.zero_grad();
        tl::Variable loss = tl::cross_entropy(ours->forward(ids, mask, types).logits, y);
        loss.backward();
        tl_opt.step();
        return loss.item<double>();
      },
      [&] {
        ref_opt.zero_grad();
        auto loss = torch::cross_entropy_loss(ref->forward(ids, mask, types), y);
        loss.backward();
        ref_opt.step();
        return loss.item<double>();
      },
      steps, warmup, mask.sum().item<int64_t>());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional, only;
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--device" || a == "--only") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--device") {
        device_name = v;
      } else {
        for (size_t p = 0, q; p <= v.size(); p = q + 1) {
          q = std::min(v.find(',', p), v.size());
          only.push_back(v.substr(p, q - p));
        }
      }
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr,
                   "bench_models: unknown option '%s'; usage: bench_models [steps] [warmup] [gpt2 vocabulary] "
                   "[--device cpu|cuda] [--only resnet18,gpt2,minilm,gpt2_small,gpt2_small_explicit]\n",
                   a.c_str());
      return 2;
    } else {
      positional.push_back(a);
    }
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "bench_models: --device %s: accepted: cpu, cuda\n", device_name.c_str());
    return 2;
  }
  const at::Device device(device_name == "cuda" ? at::kCUDA : at::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) {
    std::printf("{\"bench\": \"models\", \"device\": \"cuda\", \"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  const int steps = positional.size() > 0 ? std::max(1, std::atoi(positional[0].c_str())) : 5;
  const int warmup = positional.size() > 1 ? std::max(0, std::atoi(positional[1].c_str())) : 2;
  const int64_t vocab = positional.size() > 2 ? std::max<int64_t>(2, std::atoll(positional[2].c_str())) : 50257;
  if (only.empty())
    only = device.is_cpu() ? std::vector<std::string>{"resnet18", "gpt2", "minilm"}
                           : std::vector<std::string>{"resnet18", "gpt2_small", "gpt2_small_explicit"};
  for (const std::string& name : only) {
    if (name == "resnet18") {
      resnet18(steps, warmup, device);
    } else if (name == "gpt2") {
      gpt2(steps, warmup, vocab, device, "gpt2_4x256_train_step", 4, 256, 8, 128);
    } else if (name == "gpt2_small") {  // attention: tapeline's default (fused on a GPU with libtorch 2.x)
      gpt2(steps, warmup, vocab, device, "gpt2_small_train_step", 12, 768, 8, 1024);
    } else if (name == "gpt2_small_explicit") {  // tapeline's explicit attention (Note [fused attention])
      const tl::AttentionPath before = tl::attention_path();
      tl::set_attention_path(tl::AttentionPath::kExplicit);
      gpt2(steps, warmup, vocab, device, "gpt2_small_explicit_attention_train_step", 12, 768, 8, 1024);
      tl::set_attention_path(before);
    } else if (name == "minilm") {
      minilm(steps, warmup, device);
    } else {
      std::fprintf(stderr, "bench_models: --only %s: accepted: resnet18, gpt2, minilm, gpt2_small, gpt2_small_explicit\n", name.c_str());
      return 2;
    }
  }
  return 0;
}
