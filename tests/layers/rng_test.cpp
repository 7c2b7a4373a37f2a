// Generators per purpose (Note [generators per purpose], layers/nn/rng.h): a dropout site forks its
// own stream off the initialisation generator, its state is a checkpointed buffer, a CUDA input
// gets a CUDA generator; BufferedGenerator reloads only when the buffer changed.
#include <ATen/CPUGeneratorImpl.h>

#include "layers/models/gpt2.h"
#include "layers/nn/nn.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

at::Generator cpu_gen(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

TEST(GeneratorsPerPurpose, DropoutForksItsOwnStreamOffTheInitialisationGenerator) {
  const at::Tensor x = at::ones({16, 64});
  at::Generator init = cpu_gen(11);
  Dropout a(0.5, init);
  Dropout b(0.5, init);  // the same generator handed on: still a different stream
  const at::Tensor ya = a.forward(Variable(x)).data(), yb = b.forward(Variable(x)).data();
  EXPECT_FALSE(ya.equal(yb)) << "two dropout sites built from one generator must not share a stream";

  // Initialisation after the fork does not repeat the numbers the mask stream draws: the first
  // mask of `a` came from the generator's state at the fork, not from what init draws next.
  at::Generator probe = cpu_gen(11);
  const at::Tensor next_init = at::empty({16, 64}).bernoulli_(0.5, probe);  // what `a` drew
  EXPECT_TRUE(ya.ne(0).equal(next_init.ne(0)));
  const at::Tensor after = at::empty({16, 64}).bernoulli_(0.5, init);  // what init draws now
  EXPECT_FALSE(after.equal(next_init));

  // Drawing masks does not touch the initialisation generator.
  const at::Tensor before_state = init.get_state().clone();
  a.forward(Variable(x));
  EXPECT_TRUE(init.get_state().equal(before_state));
}

TEST(GeneratorsPerPurpose, DropoutStreamIsCheckpointedAndResumes) {
  const at::Tensor x = at::ones({8, 32});
  Dropout d(0.3, cpu_gen(5));
  const auto names = d.named_buffers();
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].first, "generator");
  d.forward(Variable(x));
  const TensorMap saved = d.state_dict();  // after one mask
  const at::Tensor second = d.forward(Variable(x)).data();
  const at::Tensor third = d.forward(Variable(x)).data();
  EXPECT_FALSE(second.equal(third));
  // A fresh layer loaded from the checkpoint draws the same masks as the original did.
  Dropout resumed(0.3, cpu_gen(999));
  resumed.load_state_dict(saved);
  EXPECT_TRUE(resumed.forward(Variable(x)).data().equal(second));
  EXPECT_TRUE(resumed.forward(Variable(x)).data().equal(third));
  // And loading into the original rewinds it.
  d.load_state_dict(saved);
  EXPECT_TRUE(d.forward(Variable(x)).data().equal(second));
}

TEST(GeneratorsPerPurpose, WithoutAGeneratorDropoutUsesTheDefaultOneAndHasNoBuffer) {
  Dropout d(0.3);
  EXPECT_TRUE(d.named_buffers().empty());
  const at::Tensor x = at::ones({8, 32});
  at::manual_seed(3);
  const at::Tensor y1 = d.forward(Variable(x)).data();
  at::manual_seed(3);
  EXPECT_TRUE(d.forward(Variable(x)).data().equal(y1));
  EXPECT_TRUE(Dropout(0.0, cpu_gen(1)).named_buffers().empty()) << "p = 0 draws nothing";
}

TEST(GeneratorsPerPurpose, AttentionDropoutHasItsOwnStream) {
  at::Generator init = cpu_gen(21);
  MultiHeadAttention attn(AttentionOptions(8, 2).dropout(0.5), init);
  bool found = false;
  for (const auto& [name, _] : attn.named_buffers()) found = found || name == "generator";
  EXPECT_TRUE(found);
  const at::Tensor x = at::randn({2, 5, 8});
  const at::Tensor y1 = attn.forward(Variable(x)).data(), y2 = attn.forward(Variable(x)).data();
  EXPECT_FALSE(y1.equal(y2)) << "successive masks differ";
  attn.eval();
  EXPECT_TRUE(attn.forward(Variable(x)).data().equal(attn.forward(Variable(x)).data()));
}

TEST(GeneratorsPerPurpose, ModelWithDropoutReproducesFromItsCheckpoint) {
  GPT2Config c;
  c.vocab_size = 31;
  c.n_positions = 8;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.dropout = 0.2;
  GPT2 a(c, cpu_gen(4));
  const at::Tensor ids = at::randint(31, {2, 8}, at::kLong);
  a.forward(ids);
  const TensorMap state = [&] {
    TensorMap m;
    for (const auto& [k, v] : a.state_dict()) m[k] = v.clone();
    return m;
  }();
  const at::Tensor next = a.forward(ids).data();
  GPT2 b(c, cpu_gen(77));
  b.load_state_dict(state);
  EXPECT_TRUE(b.forward(ids).data().equal(next)) << "weights and every dropout stream come from the checkpoint";
}

TEST(GeneratorsPerPurpose, ACpuGeneratorNeverMeetsACudaTensor) {
  // The op refuses a generator of another device type with a clear error...
  const at::Tensor x = at::ones({4});
  if (at::hasCUDA()) {
    EXPECT_THROW(dropout(Variable(x.to(at::kCUDA)), 0.5, true, cpu_gen(1)), c10::Error);
  }
  EXPECT_NO_THROW(dropout(Variable(x), 0.5, true, cpu_gen(1)));
}

TEST(GeneratorsPerPurpose, CudaInputsDrawFromACudaGeneratorSeededByTheStream) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor x = at::ones({64, 64});
  Dropout a(0.5, cpu_gen(8)), b(0.5, cpu_gen(8));
  a.to(at::kCUDA);
  b.to(at::kCUDA);
  const at::Tensor ya = a.forward(Variable(x.to(at::kCUDA))).data();
  EXPECT_TRUE(ya.is_cuda());
  EXPECT_TRUE(ya.equal(b.forward(Variable(x.to(at::kCUDA))).data())) << "same stream, same masks";
  EXPECT_TRUE(a.named_buffers()[0].second.data().is_cuda());
}

TEST(GeneratorsPerPurpose, BufferedGeneratorReloadsOnlyWhenItsBufferChanged) {
  Module owner;
  BufferedGenerator g(cpu_gen(3), owner, "generator");
  const uint64_t first = next_random64(g.get());
  g.commit();
  const TensorMap saved = [&] {
    TensorMap m;
    for (const auto& [k, v] : owner.state_dict()) m[k] = v.clone();
    return m;
  }();
  const uint64_t second = next_random64(g.get());
  g.commit();
  EXPECT_NE(first, second);
  owner.load_state_dict(saved);
  EXPECT_EQ(next_random64(g.get()), second) << "the state loaded into the buffer is picked up";
  g.commit();
  EXPECT_NE(next_random64(g.get()), second) << "and then the stream moves on";
}

}  // namespace
}  // namespace tl
