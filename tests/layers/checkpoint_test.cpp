// Training checkpoints: a round trip restores parameters, buffers (module-registered state),
// optimizer and scheduler state, counters, metadata and the RNG (draws after restore equal draws
// after save), so training resumes exactly; a load that does not fit changes nothing; a failed
// save (bad tensor, or a write cut off mid-file) leaves the previous checkpoint intact.
#include "layers/io/checkpoint.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "layers/io/safetensors.h"
#include "layers/optim/adam.h"
#include "layers/optim/sgd.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;

// fc (Linear-like), norm (LayerNorm-like) and a buffer standing in for compression state.
std::shared_ptr<Module> make_net(int64_t width = 4) {
  auto net = std::make_shared<Module>("Net");
  auto fc = net->register_module("fc", std::make_shared<Module>("Linear"));
  fc->register_parameter("weight", at::randn({3, width}));
  fc->register_parameter("bias", at::randn({3}));
  auto norm = net->register_module("norm", std::make_shared<Module>("LayerNorm"));
  norm->register_parameter("weight", at::randn({3}));
  auto boundary = net->register_module("boundary", std::make_shared<Module>("Boundary"));
  boundary->register_buffer("ef_residual", at::randn({2, 3}));
  boundary->register_buffer("calls", at::zeros({}, at::kLong));
  return net;
}

// One training step with random gradients (drawn from the default generator).
void train_step(Module& net, Optimizer& opt, LRScheduler& sched) {
  for (auto& [_, p] : net.named_parameters()) p.set_grad(at::randn(p.sizes()));
  opt.step();
  opt.zero_grad();
  sched.step();
  for (auto& [n, b] : net.named_buffers()) {
    if (n == "boundary.calls")
      b.mutable_data().add_(1);
    else
      b.mutable_data().mul_(0.5).add_(at::randn(b.sizes()));
  }
}

struct Trainer {
  std::shared_ptr<Module> net;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<LRScheduler> sched;
  explicit Trainer(int64_t width = 4) {
    net = make_net(width);
    opt = std::make_unique<AdamW>(weight_decay_groups(*net, 0.1), GroupOptions().set_lr(0.01));
    sched = std::make_unique<LRScheduler>(*opt, warmup_cosine_schedule(2, 20, 1e-4));
  }
};

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tl_checkpoint_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  size_t num_files() const {
    size_t n = 0;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }
  std::string dir_;
};

void expect_same_state(const TensorMap& a, const TensorMap& b, const std::string& label) {
  ASSERT_EQ(a.size(), b.size()) << label;
  for (const auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << label << ": missing " << k;
    EXPECT_TRUE(v.sizes().equals(b.at(k).sizes()) && v.to(b.at(k).scalar_type()).equal(b.at(k)))
        << label << ": " << k << " differs";
  }
}

TEST_F(Checkpoint, RoundTripRestoresEverythingAndResumesExactly) {
  at::manual_seed(1);
  Trainer a;
  for (int i = 0; i < 5; ++i) train_step(*a.net, *a.opt, *a.sched);
  CheckpointInfo info;
  info.step = 5;
  info.epoch = 1;
  info.metadata = {{"config", "model=tiny lr=0.01"}, {"loader_position", "1234"}};
  save_checkpoint(path("ck.safetensors"), *a.net, a.opt.get(), a.sched.get(), info);
  const at::Tensor draws_after_save = at::randn({8});  // advances the generator past the saved state

  at::manual_seed(999);  // a different model, optimizer state and RNG
  Trainer b;
  train_step(*b.net, *b.opt, *b.sched);
  const CheckpointInfo got = load_checkpoint(path("ck.safetensors"), *b.net, b.opt.get(), b.sched.get());

  EXPECT_EQ(got.step, 5);
  EXPECT_EQ(got.epoch, 1);
  EXPECT_EQ(got.metadata, info.metadata);
  EXPECT_TRUE(at::randn({8}).equal(draws_after_save)) << "RNG restored: the same draws as right after the save";
  expect_same_state(b.net->state_dict(), a.net->state_dict(), "model");
  expect_same_state(b.opt->state_dict(), a.opt->state_dict(), "optimizer");
  expect_same_state(b.sched->state_dict(), a.sched->state_dict(), "scheduler");
  EXPECT_EQ(b.opt->lr(0), a.opt->lr(0));
  EXPECT_EQ(b.net->named_buffers()[1].second.item<int64_t>(), 5) << "module-registered buffers carried";

  // Both continue identically (same gradients: the RNG streams are aligned).
  at::manual_seed(42);
  for (int i = 0; i < 3; ++i) train_step(*a.net, *a.opt, *a.sched);
  at::manual_seed(42);
  for (int i = 0; i < 3; ++i) train_step(*b.net, *b.opt, *b.sched);
  for (auto& [n, t] : a.net->state_dict()) EXPECT_TRUE(all_close(b.net->state_dict().at(n), t, "resumed " + n, 0, 0));

  const CheckpointInfo peek = read_checkpoint_info(path("ck.safetensors"));
  EXPECT_EQ(peek.step, 5);
  EXPECT_EQ(peek.metadata.at("config"), "model=tiny lr=0.01");
  const auto meta = safetensors_metadata(path("ck.safetensors"));
  EXPECT_EQ(meta.at("optimizer"), "AdamW");
  EXPECT_EQ(meta.at("schedule"), "warmup_cosine(warmup_steps=2, total_steps=20, min_lr=0.0001)");
  const auto tensors = read_safetensors_header(path("ck.safetensors")).tensors;
  std::set<std::string> names;
  for (const auto& e : tensors) names.insert(e.name);
  for (const char* k : {"model.fc.weight", "model.boundary.ef_residual", "optim.state.fc.weight.exp_avg",
                        "optim.groups.1.weight_decay", "sched.step", "rng.cpu"})
    EXPECT_TRUE(names.count(k)) << "missing " << k;
}

TEST_F(Checkpoint, ModelOnlyAndOptionalParts) {
  at::manual_seed(2);
  Trainer a;
  train_step(*a.net, *a.opt, *a.sched);
  save_checkpoint(path("weights"), *a.net, nullptr, nullptr, {}, /*save_rng=*/false);
  auto net = make_net();
  CheckpointLoadOptions no_rng;
  no_rng.restore_rng = false;
  load_checkpoint(path("weights"), *net, nullptr, nullptr, no_rng);
  expect_same_state(net->state_dict(), a.net->state_dict(), "weights only");

  Trainer b;
  EXPECT_NE(testing::what_of([&] {
              load_checkpoint(path("weights"), *b.net, b.opt.get(), nullptr, no_rng);
            }).find("holds no optimizer state, but an optimizer (AdamW) was given"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] {
              load_checkpoint(path("weights"), *b.net, nullptr, b.sched.get(), no_rng);
            }).find("holds no scheduler state"),
            std::string::npos);
  EXPECT_NE(
      testing::what_of([&] { load_checkpoint(path("weights"), *b.net, nullptr, nullptr); }).find("holds no RNG state"),
      std::string::npos);
  // A plain safetensors file is not a checkpoint.
  save_safetensors(path("plain"), {{"w", at::zeros({1})}});
  EXPECT_NE(testing::what_of([&] { read_checkpoint_info(path("plain")); }).find("not a tapeline checkpoint"),
            std::string::npos);
}

// Snapshot of everything a load could change.
struct Snapshot {
  TensorMap model, optim, sched;
  at::Tensor rng;
  explicit Snapshot(const Trainer& t)
      : optim(t.opt->state_dict()), sched(t.sched->state_dict()), rng(rng_state().at("cpu").clone()) {
    for (auto& [k, v] : t.net->state_dict()) model[k] = v.clone();
    for (auto& [k, v] : optim) v = v.clone();
  }
};

void expect_unchanged(const Trainer& t, const Snapshot& s, const std::string& label) {
  expect_same_state(t.net->state_dict(), s.model, label + " model");
  expect_same_state(t.opt->state_dict(), s.optim, label + " optimizer");
  expect_same_state(t.sched->state_dict(), s.sched, label + " scheduler");
  EXPECT_TRUE(rng_state().at("cpu").equal(s.rng)) << label << " rng";
}

TEST_F(Checkpoint, LoadThatDoesNotFitChangesNothing) {
  at::manual_seed(3);
  Trainer wide(/*width=*/6);
  for (int i = 0; i < 3; ++i) train_step(*wide.net, *wide.opt, *wide.sched);
  save_checkpoint(path("wide"), *wide.net, wide.opt.get(), wide.sched.get(), {});

  // An SGD checkpoint (for the optimizer-type check below).
  auto net = make_net();
  SGD sgd(weight_decay_groups(*net, 0.1), GroupOptions().set_lr(0.1).set_momentum(0.9));
  LRScheduler sched(sgd, constant_schedule());
  save_checkpoint(path("sgd"), *net, &sgd, &sched, {});

  Trainer t;
  train_step(*t.net, *t.opt, *t.sched);
  const Snapshot before(t);  // nothing below draws random numbers
  // fc.weight is (3, 6) in the file: the optimizer state check fails first, then the model's.
  std::string msg = testing::what_of([&] { load_checkpoint(path("wide"), *t.net, t.opt.get(), t.sched.get()); });
  EXPECT_NE(msg.find("state.fc.weight.exp_avg: shape [3, 6] but parameter 'fc.weight' has shape [3, 4]"),
            std::string::npos)
      << msg;
  expect_unchanged(t, before, "after optimizer mismatch");
  CheckpointLoadOptions no_rng;
  no_rng.restore_rng = false;
  msg = testing::what_of([&] { load_checkpoint(path("wide"), *t.net, nullptr, nullptr, no_rng); });
  EXPECT_NE(msg.find("fc.weight (checkpoint [3, 6], model [3, 4])"), std::string::npos) << msg;
  expect_unchanged(t, before, "after model mismatch");

  // An SGD checkpoint into an AdamW optimizer.
  msg = testing::what_of([&] { load_checkpoint(path("sgd"), *t.net, t.opt.get(), t.sched.get()); });
  EXPECT_NE(msg.find("holds SGD state but the optimizer given is AdamW"), std::string::npos) << msg;
  expect_unchanged(t, before, "after optimizer type mismatch");

  // A corrupt RNG entry (wrong size) is found before anything is written.
  TensorMap raw = load_safetensors(path("wide"));
  auto meta = safetensors_metadata(path("wide"));
  raw["rng.cpu"] = raw["rng.cpu"].slice(0, 0, 10).clone();
  for (auto it = raw.begin(); it != raw.end();) it = it->first.rfind("model.", 0) == 0 ? raw.erase(it) : std::next(it);
  for (auto& [k, v] : t.net->state_dict()) raw["model." + k] = v;
  raw.erase("optim.state.fc.weight.exp_avg");  // keep the file fitting the model but not the rest
  save_safetensors(path("badrng"), raw, meta);
  msg = testing::what_of([&] { load_checkpoint(path("badrng"), *t.net, nullptr, nullptr); });
  EXPECT_NE(msg.find("rng state 'cpu' has 10 bytes"), std::string::npos) << msg;
  expect_unchanged(t, before, "after rng mismatch");
}

TEST_F(Checkpoint, FailedSaveLeavesThePreviousFileIntact) {
  at::manual_seed(4);
  Trainer t;
  train_step(*t.net, *t.opt, *t.sched);
  save_checkpoint(path("ck"), *t.net, t.opt.get(), t.sched.get(), {});
  const TensorMap saved = load_safetensors(path("ck"));
  train_step(*t.net, *t.opt, *t.sched);  // the model moves on

  // 1. A tensor the format cannot hold: rejected before anything is written.
  t.net->submodule("boundary")->register_buffer("phase", at::randn({2}, at::kComplexFloat));
  std::string msg = testing::what_of([&] { save_checkpoint(path("ck"), *t.net, t.opt.get(), t.sched.get(), {}); });
  EXPECT_NE(msg.find("tensor 'model.boundary.phase'"), std::string::npos) << msg;
  expect_same_state(load_safetensors(path("ck")), saved, "after rejected save");
  EXPECT_EQ(num_files(), 1u);

  // 2. A write cut off mid-file (file size limit: EFBIG after 4 KiB; the checkpoint is larger).
  auto net = make_net();
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  if (::setrlimit(RLIMIT_FSIZE, &small) != 0) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE here";
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  msg =
      testing::what_of([&] { save_checkpoint(path("ck"), *net, nullptr, nullptr, {}); });  // > 4 KiB with the RNG state
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("failed: File too large"), std::string::npos) << msg;
  expect_same_state(load_safetensors(path("ck")), saved, "after a save cut off mid-file");
  EXPECT_EQ(num_files(), 1u) << "the temporary file was removed";
}

}  // namespace
}  // namespace tl
