// Memory of one rank of a pipeline against one process holding the whole model: GPT-2 small's
// shape (12 x 768, context 1024; a byte-level vocabulary of 256 as tapeline's lm task uses) cut
// into P stages (default 4, at h.2, h.5, h.8 for P = 4: equal blocks per stage), each rank building
// only its stages (Note [building only some stages]). Every case runs in a fresh child process
// (this program, re-run with --case), which builds the model or its stage, takes one AdamW step on
// 2 sequences of 64 tokens (so gradients and optimizer state exist) and reports what it holds and
// its peak resident memory. One JSON line per rank:
//   {"bench": "memory", "rank": r, "parameter_bytes": ..., "optimizer_bytes": ...,
//    "peak_rss_bytes": ..., "state_ratio": ..., "rss_ratio": ...}
// state_ratio = (parameters + optimizer state) of the rank / of one process (ideal: about 1 / P);
// rss_ratio the same for peak resident memory (libtorch's own footprint and the activations make
// it larger).
//
// Usage: bench_memory [stages (default 4)]
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "layers/models/gpt2.h"
#include "layers/optim/adam.h"
#include "parallel/executor.h"

namespace {
using namespace tl;

struct Held {
  long long parameter_bytes = 0, optimizer_bytes = 0, peak_rss_bytes = 0;
};

std::vector<std::string> even_cuts(int stages, int layers) {
  std::vector<std::string> cuts;
  for (int s = 1; s < stages; ++s) cuts.push_back("h." + std::to_string(s * layers / stages - 1));
  return cuts;
}

// One case, in this process: stage < 0 builds the whole model.
Held run_case(int stages, int stage) {
  GPT2Config c;
  c.vocab_size = 256;
  c.n_positions = 1024;
  const StageSelection build = stage < 0 ? StageSelection::whole()
                                         : StageSelection::of(even_cuts(stages, static_cast<int>(c.n_layer)), {stage});
  auto model = std::make_shared<GPT2>(c, at::detail::createCPUGenerator(0), build);
  auto parts = model->split(even_cuts(stages, static_cast<int>(c.n_layer)));
  AdamW opt(weight_decay_groups(*model, 0.01), GroupOptions{});
  // One step: the rank's stages forward and backward on a batch of 2 x 64 tokens (the first stage
  // takes the ids, the others an activation of the right shape).
  const at::Tensor ids = at::randint(256, {2, 64}, at::kLong);
  Variable x(ids);
  const int first = stage < 0 ? 0 : stage, last = stage < 0 ? stages - 1 : stage;
  if (first > 0) x = Variable(at::randn({2, 64, c.n_embd}), /*requires_grad=*/true);
  for (int s = first; s <= last; ++s) x = std::static_pointer_cast<Stage>(parts[static_cast<size_t>(s)])->forward(x);
  sum(x).backward();
  opt.step();
  Held h;
  h.parameter_bytes = parameter_bytes(*model);
  h.optimizer_bytes = optimizer_state_bytes(opt);
  h.peak_rss_bytes = peak_resident_bytes();
  return h;
}

Held run_child(const char* self, int stages, int stage) {
  const std::string cmd = std::string(self) + " --case " + std::to_string(stages) + " " + std::to_string(stage);
  FILE* p = popen(cmd.c_str(), "r");
  Held h;
  if (!p || std::fscanf(p, "%lld %lld %lld", &h.parameter_bytes, &h.optimizer_bytes, &h.peak_rss_bytes) != 3) {
    std::fprintf(stderr, "bench_memory: the case '%s' printed no result\n", cmd.c_str());
    std::exit(1);
  }
  pclose(p);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  if (argc == 4 && std::string(argv[1]) == "--case") {
    const Held h = run_case(std::stoi(argv[2]), std::stoi(argv[3]));
    std::printf("%lld %lld %lld\n", h.parameter_bytes, h.optimizer_bytes, h.peak_rss_bytes);
    return 0;
  }
  const int stages = argc > 1 ? std::stoi(argv[1]) : 4;
  if (stages < 1 || stages > 12) {
    std::fprintf(stderr, "bench_memory: stages must be 1 .. 12 (GPT-2 small has 12 blocks), got %d\n", stages);
    return 2;
  }
  const Held whole = run_child(argv[0], stages, -1);
  const double whole_state = static_cast<double>(whole.parameter_bytes + whole.optimizer_bytes);
  std::printf("{\"bench\":\"memory\",\"model\":\"gpt2-small (vocab 256)\",\"case\":\"one process\","
              "\"parameter_bytes\":%lld,\"optimizer_bytes\":%lld,\"peak_rss_bytes\":%lld}\n",
              whole.parameter_bytes, whole.optimizer_bytes, whole.peak_rss_bytes);
  for (int r = 0; r < stages; ++r) {
    const Held h = run_child(argv[0], stages, r);
    std::printf("{\"bench\":\"memory\",\"model\":\"gpt2-small (vocab 256)\",\"stages\":%d,\"rank\":%d,"
                "\"parameter_bytes\":%lld,\"optimizer_bytes\":%lld,\"peak_rss_bytes\":%lld,"
                "\"state_ratio\":%.3f,\"rss_ratio\":%.3f,\"ideal_state_ratio\":%.3f}\n",
                stages, r, h.parameter_bytes, h.optimizer_bytes, h.peak_rss_bytes,
                static_cast<double>(h.parameter_bytes + h.optimizer_bytes) / whole_state,
                static_cast<double>(h.peak_rss_bytes) / static_cast<double>(whole.peak_rss_bytes), 1.0 / stages);
  }
  return 0;
}
