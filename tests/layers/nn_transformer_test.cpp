// Attention, MLP and transformer blocks against torch::nn::MultiheadAttention and against
// reference blocks built from torch::nn pieces (Linear, LayerNorm, explicit attention).
#include "layers/nn/nn.h"
#include "tests/layers/models_reference.h"
#include "tests/layers/parity.h"

namespace tl {
namespace {
using testing::all_close;
using testing::expect_parity;

/// Our attention against torch::nn::MultiheadAttention (which takes (T, B, C) inputs, an additive
/// attn_mask and a bool key_padding_mask marking padding keys).
void expect_mha_parity(bool fused, bool causal, bool padding, const std::string& label) {
  const int64_t b = 3, t = 5, c = 8, h = 2;
  MultiHeadAttention ours(AttentionOptions(c, h).fused_qkv(fused).causal(causal));
  torch::nn::MultiheadAttention ref(torch::nn::MultiheadAttentionOptions(c, h));
  {  // copy torch's weights in: in_proj rows are [q; k; v]
    NoGradGuard g;
    auto w = ref->in_proj_weight.detach(), bias = ref->in_proj_bias.detach();
    if (fused) {
      ours.qkv()->weight().data().copy_(w);
      ours.qkv()->bias().data().copy_(bias);
    } else {
      const std::shared_ptr<Linear> proj[] = {ours.query(), ours.key(), ours.value()};
      for (int i = 0; i < 3; ++i) {
        proj[i]->weight().data().copy_(w.narrow(0, i * c, c));
        proj[i]->bias().data().copy_(bias.narrow(0, i * c, c));
      }
    }
    ours.out()->weight().data().copy_(ref->out_proj->weight.detach());
    ours.out()->bias().data().copy_(ref->out_proj->bias.detach());
  }
  const at::Tensor x = at::randn({b, t, c});
  at::Tensor kpm;  // true = padding; every sequence keeps at least its first token
  if (padding) kpm = at::arange(t).view({1, t}).ge(at::tensor({5, 3, 1}).view({b, 1}));

  Variable xv(x.clone(), true);
  Variable y = ours.forward(xv, kpm);
  at::Tensor xr = x.clone().transpose(0, 1).contiguous().requires_grad_(true);  // (T, B, C)
  // torch's C++ MultiheadAttention adds attn_mask to the scores: an additive -inf mask.
  at::Tensor forbid;
  if (causal)
    forbid =
        at::zeros({t, t}).masked_fill(at::ones({t, t}, at::kBool).triu(1), -std::numeric_limits<float>::infinity());
  at::Tensor yr = std::get<0>(ref->forward(xr, xr, xr, kpm, /*need_weights=*/false, forbid)).transpose(0, 1);
  EXPECT_TRUE(all_close(y.data(), yr, label + " output"));
  const at::Tensor g = at::randn_like(yr);
  y.backward(g);
  yr.backward(g);
  EXPECT_TRUE(all_close(xv.grad(), xr.grad().transpose(0, 1), label + " d/dx"));
  at::Tensor in_grad =
      fused ? ours.qkv()->weight().grad()
            : at::cat({ours.query()->weight().grad(), ours.key()->weight().grad(), ours.value()->weight().grad()});
  at::Tensor in_bias_grad =
      fused ? ours.qkv()->bias().grad()
            : at::cat({ours.query()->bias().grad(), ours.key()->bias().grad(), ours.value()->bias().grad()});
  EXPECT_TRUE(all_close(in_grad, ref->in_proj_weight.grad(), label + " d/d(in_proj_weight)"));
  EXPECT_TRUE(all_close(in_bias_grad, ref->in_proj_bias.grad(), label + " d/d(in_proj_bias)"));
  EXPECT_TRUE(all_close(ours.out()->weight().grad(), ref->out_proj->weight.grad(), label + " d/d(out.weight)"));
  EXPECT_TRUE(all_close(ours.out()->bias().grad(), ref->out_proj->bias.grad(), label + " d/d(out.bias)"));
}

TEST(NnTransformer, MultiHeadAttentionMatchesTorch) {
  at::manual_seed(0);
  for (bool fused : {true, false})
    for (bool causal : {false, true})
      for (bool padding : {false, true})
        expect_mha_parity(fused, causal, padding,
                          std::string("MHA ") + (fused ? "fused" : "separate") + (causal ? " causal" : "") +
                              (padding ? " key-padding" : ""));
}

TEST(NnTransformer, AttentionMasksCutInformationFlow) {
  at::manual_seed(1);
  MultiHeadAttention causal(AttentionOptions(8, 2).causal(true));
  const at::Tensor x = at::randn({2, 6, 8});
  at::Tensor x2 = x.clone();
  x2.narrow(1, 4, 2).normal_();  // change the last two tokens
  // Causal: positions 0..3 cannot see tokens 4, 5.
  auto y = causal.forward(Variable(x)).data(), y2 = causal.forward(Variable(x2)).data();
  EXPECT_TRUE(all_close(y.narrow(1, 0, 4), y2.narrow(1, 0, 4), "causal prefix unchanged"));
  EXPECT_FALSE(y.narrow(1, 4, 2).allclose(y2.narrow(1, 4, 2)));
  // Key padding: padded tokens influence nobody else.
  MultiHeadAttention bidir(AttentionOptions(8, 2).fused_qkv(false));
  const at::Tensor kpm = at::arange(6).ge(4).view({1, 6}).expand({2, 6}).contiguous();
  auto z = bidir.forward(Variable(x), kpm).data(), z2 = bidir.forward(Variable(x2), kpm).data();
  EXPECT_TRUE(all_close(z.narrow(1, 0, 4), z2.narrow(1, 0, 4), "padding ignored"));
  EXPECT_THROW(bidir.forward(Variable(x), kpm.to(at::kFloat)), c10::Error);
  EXPECT_THROW(bidir.forward(Variable(x), kpm.narrow(1, 0, 5)), c10::Error);
  EXPECT_THROW(MultiHeadAttention(AttentionOptions(10, 3)), c10::Error);
}

TEST(NnTransformer, MLPMatchesTorch) {
  at::manual_seed(2);
  for (std::string act : {"gelu", "gelu_tanh"}) {
    MLP ours(6, 24, act);
    reference::MLP ref(6, 24, act == "gelu" ? "none" : "tanh");
    expect_parity(
        ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({2, 3, 6}), "MLP " + act);
  }
  EXPECT_THROW(MLP(4, 8, "swish"), c10::Error);
}

TEST(NnTransformer, Gpt2BlockMatchesTorchReference) {
  at::manual_seed(3);
  TransformerBlock ours(TransformerBlockOptions(16, 4).norm(NormPlacement::Pre).causal(true).activation("gelu_tanh"));
  reference::Block ref(16, 4, 64, /*pre=*/true, /*fused=*/true, /*causal=*/true, "tanh", 1e-5);
  {  // non-trivial LayerNorm affine parameters
    torch::NoGradGuard g;
    for (auto& p : ref->named_parameters())
      if (p.key().find("ln") != std::string::npos) p.value().normal_();
  }
  expect_parity(ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({2, 7, 16}), "GPT-2 block",
                {2e-5, 1e-4});
}

TEST(NnTransformer, BertLayerMatchesTorchReference) {
  at::manual_seed(4);
  TransformerBlock ours(TransformerBlockOptions(16, 4)
                            .hidden(40)
                            .norm(NormPlacement::Post)
                            .fused_qkv(false)
                            .activation("gelu")
                            .norm_eps(1e-12));
  reference::Block ref(16, 4, 40, /*pre=*/false, /*fused=*/false, /*causal=*/false, "none", 1e-12);
  {
    torch::NoGradGuard g;
    for (auto& p : ref->named_parameters())
      if (p.key().find("ln") != std::string::npos) p.value().normal_();
  }
  const at::Tensor kpm = at::arange(6).view({1, 6}).ge(at::tensor({6, 4}).view({2, 1}));  // row 1: 2 pads
  expect_parity(
      ours, *ref, [&](const Variable& x) { return ours.forward(x, kpm); },
      [&](const at::Tensor& x) { return ref(x, kpm); }, at::randn({2, 6, 16}), "BERT layer (padded)", {2e-5, 1e-4});
}

TEST(NnTransformer, DropoutOnlyInTraining) {
  at::manual_seed(5);
  TransformerBlock block(TransformerBlockOptions(8, 2).dropout(0.5).attention_dropout(0.5),
                         at::detail::createCPUGenerator(3));
  const at::Tensor x = at::randn({2, 4, 8});
  block.eval();
  auto a = block.forward(Variable(x)).data(), b = block.forward(Variable(x)).data();
  EXPECT_TRUE(a.equal(b)) << "eval must be deterministic";
  block.train();
  auto c = block.forward(Variable(x)).data();
  EXPECT_FALSE(c.allclose(a)) << "training with p = 0.5 must drop something";
}

}  // namespace
}  // namespace tl
