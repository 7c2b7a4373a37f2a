// Models: ResNet, GPT-2 and BERT against torch::nn references with the same weights, shapes at
// every cut point, split-vs-unsplit equality (outputs and gradients), errors.
#include "layers/models/bert.h"
#include "layers/models/gpt2.h"
#include "layers/models/resnet.h"
#include "tests/layers/models_reference.h"
#include "tests/layers/parity.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
using testing::all_close;
using testing::expect_parity;

using testing::error_of;

std::set<std::string> param_names(const Module& m) {
  std::set<std::string> s;
  for (auto& [n, _] : m.named_parameters()) s.insert(n);
  return s;
}

/// Runs `stages` one after another, backpropagates sum(out * g), and compares the output and every
/// parameter gradient with the unsplit model's. Stage parameters must carry the model's names.
// `unsplit` runs the whole model (default: model.forward(input)); the stages get `inputs`.
void expect_split_equals_unsplit(Module& model, const std::vector<ModulePtr>& stages, const Variable& input,
                                 const std::string& label, double atol = 1e-6, const StageInputs& inputs = {},
                                 std::function<Variable()> unsplit = nullptr) {
  model.zero_grad();
  Variable y = unsplit ? unsplit() : model.forward(input);
  const at::Tensor g = at::randn_like(y.data());
  y.backward(g);
  std::map<std::string, at::Tensor> grads;
  for (auto& [n, p] : model.named_parameters())
    if (p.grad().defined()) grads[n] = p.grad().clone();
  model.zero_grad();

  Variable x = input;
  for (auto& s : stages) x = std::static_pointer_cast<Stage>(s)->forward(x, inputs);
  EXPECT_TRUE(all_close(x.data(), y.data(), label + " split output", atol, 1e-5));
  x.backward(g);
  std::set<std::string> union_names;
  const auto model_params = model.named_parameters();
  for (auto& s : stages) {
    for (auto& [n, p] : s->named_parameters()) {
      union_names.insert(n);
      bool same = false;
      for (auto& [mn, mp] : model_params) same = same || (mn == n && mp.impl() == p.impl());
      EXPECT_TRUE(same) << label << ": stage parameter '" << n << "' is not the model's parameter of that name";
    }
  }
  EXPECT_EQ(union_names, param_names(model)) << label << ": stages must cover every parameter";
  for (auto& [n, p] : model.named_parameters()) {
    ASSERT_TRUE(grads.count(n) == p.grad().defined()) << label << " " << n;
    if (grads.count(n)) {
      EXPECT_TRUE(all_close(p.grad(), grads[n], label + " d/d(" + n + ")", atol, 1e-5));
    }
  }
}

// ---- ResNet -------------------------------------------------------------------------------------
TEST(ModelsResNet, CutPointsAndShapesAtEveryCut) {
  at::manual_seed(0);
  auto net = make_resnet("resnet18", 3, 10, /*width=*/0.25);  // widths 16, 32, 64, 128
  const std::vector<std::string> expected = {"stem",     "layer1.0", "layer1",   "layer2.0", "layer2",
                                             "layer3.0", "layer3",   "layer4.0", "layer4"};
  ASSERT_EQ(net->cut_points(), expected);
  const std::vector<std::vector<int64_t>> shapes = {{2, 16, 32, 32}, {2, 16, 32, 32}, {2, 16, 32, 32}, {2, 32, 16, 16},
                                                    {2, 32, 16, 16}, {2, 64, 8, 8},   {2, 64, 8, 8},   {2, 128, 4, 4},
                                                    {2, 128, 4, 4},  {2, 10}};
  auto stages = net->split(expected);
  ASSERT_EQ(stages.size(), expected.size() + 1);
  Variable x(at::randn({2, 3, 32, 32}));
  for (size_t i = 0; i < stages.size(); ++i) {
    x = stages[i]->forward(x);
    EXPECT_EQ(x.sizes().vec(), shapes[i])
        << "after stage " << i << (i < expected.size() ? " (" + expected[i] + ")" : "");
  }
  // Stage parameters keep the model's dotted names.
  EXPECT_EQ(param_names(*stages[4]),
            (std::set<std::string>{"layer2.1.conv1.weight", "layer2.1.bn1.weight", "layer2.1.bn1.bias",
                                   "layer2.1.conv2.weight", "layer2.1.bn2.weight", "layer2.1.bn2.bias"}));
  EXPECT_TRUE(param_names(*stages[3]).count("layer2.0.downsample.0.weight"));
  EXPECT_EQ(stages[3]->named_buffers().size(), 9u);  // bn1, bn2, downsample.1: 3 buffers each
}

TEST(ModelsResNet, ResearchCutsOfResNet18) {
  at::manual_seed(1);
  auto net = make_resnet("resnet18", 3, 10);
  net->eval();
  NoGradGuard no_grad;
  auto stages = net->split({"layer1", "layer2", "layer3"});
  ASSERT_EQ(stages.size(), 4u);
  Variable x(at::randn({2, 3, 32, 32}));
  const std::vector<std::vector<int64_t>> shapes = {{2, 64, 32, 32}, {2, 128, 16, 16}, {2, 256, 8, 8}, {2, 10}};
  for (size_t i = 0; i < 4; ++i) {
    x = stages[i]->forward(x);
    EXPECT_EQ(x.sizes().vec(), shapes[i]);
  }
  EXPECT_EQ(net->num_parameters(), 11173962u);  // CIFAR ResNet-18 with a 10-class head
}

TEST(ModelsResNet, SplitEqualsUnsplitForwardAndBackward) {
  at::manual_seed(2);
  auto net = make_resnet("resnet20", 3, 7, /*width=*/0.5);
  const Variable x(at::randn({3, 3, 16, 16}));
  expect_split_equals_unsplit(*net, net->split({"layer1", "layer2.1", "layer3"}), x, "resnet20 train");
  net->eval();
  expect_split_equals_unsplit(*net, net->split({"stem", "layer3.1"}), x, "resnet20 eval");
  expect_split_equals_unsplit(*net, net->split({}), x, "resnet20 one stage");
}

TEST(ModelsResNet, MatchesTorchReference) {
  at::manual_seed(3);
  auto ours = make_resnet("resnet8", 3, 5);
  reference::ResNet ref(std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{16, 32, 64}, 3, 5);
  {  // non-trivial BatchNorm parameters and statistics, so eval mode tests them too
    torch::NoGradGuard g;
    for (auto& p : ref->named_parameters())
      if (p.key().find("bn") != std::string::npos || p.key().find("downsample.1") != std::string::npos)
        p.value().uniform_(0.5, 1.5);
    for (auto& b : ref->named_buffers())
      if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 1.5);
  }
  expect_parity(*ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({4, 3, 12, 12}), "resnet8 train",
                {1e-4, 1e-4});
  ours->eval();
  ref->eval();
  expect_parity(*ours, *ref, [&](const at::Tensor& x) { return ref(x); }, at::randn({4, 3, 12, 12}), "resnet8 eval",
                {1e-4, 1e-4});
}

TEST(ModelsResNet, AnyChannelsAndSizes) {
  at::manual_seed(4);
  auto fmnist = make_resnet("resnet8", 1, 10);
  EXPECT_EQ(fmnist->forward(Variable(at::randn({5, 1, 28, 28}))).sizes().vec(), (std::vector<int64_t>{5, 10}));
  auto odd = make_resnet("resnet20", 3, 4, 0.25);
  EXPECT_EQ(odd->forward(Variable(at::randn({2, 3, 19, 23}))).sizes().vec(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(make_resnet("resnet8", 3, 10, 2.0)->widths(), (std::vector<int64_t>{32, 64, 128}));
  EXPECT_EQ(make_resnet("resnet34", 3, 10, 0.125)->cut_points().size(), 1u + 3 + 4 + 6 + 3);
}

TEST(ModelsResNet, ErrorsNameTheProblemAndTheChoices) {
  auto net = make_resnet("resnet8", 3, 10);
  std::string msg = error_of([&] { net->split({"layer5"}); });
  EXPECT_NE(msg.find("'layer5'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stem, layer1, layer2, layer3"), std::string::npos) << msg;
  msg = error_of([&] { net->split({"layer2", "layer1"}); });
  EXPECT_NE(msg.find("'layer1'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("order"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { net->split({"layer1", "layer1"}); }).find("twice"), std::string::npos);
  msg = error_of([] { make_resnet("resnet50", 3, 10); });
  EXPECT_NE(msg.find("resnet8, resnet20, resnet18, resnet34"), std::string::npos) << msg;
  EXPECT_THROW(net->forward(Variable(at::randn({2, 1, 8, 8}))), c10::Error);  // wrong channels
  EXPECT_THROW(make_resnet("resnet8", 3, 10, 0.0), c10::Error);
}

// ---- GPT-2 --------------------------------------------------------------------------------------
GPT2Config tiny_gpt2() {
  GPT2Config c;
  c.vocab_size = 37;
  c.n_positions = 12;
  c.n_embd = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.dropout = 0.0;
  return c;
}

TEST(ModelsGpt2, MatchesTorchReferenceIncludingTiedEmbedding) {
  at::manual_seed(5);
  GPT2 ours(tiny_gpt2());
  reference::GPT2 ref(37, 12, 16, 3, 4);
  // Copy ours into the reference by name (GPT-2's init is ours), then compare everything.
  EXPECT_TRUE(reference::copy_into(*ref, ours.state_dict()).empty());
  EXPECT_EQ(ref->named_parameters().size(), ours.named_parameters().size());
  const at::Tensor ids = at::randint(37, {3, 10}, at::kLong);
  testing::ParityOptions opt;
  opt.atol = 2e-5;
  opt.copy_weights = false;
  expect_parity(
      ours, *ref, [&](const at::Tensor& x) { return ref(x); }, ids, "GPT-2 (3 layers)", opt);
  EXPECT_EQ(ours.forward(ids).sizes().vec(), (std::vector<int64_t>{3, 10, 37}));
}

TEST(ModelsGpt2, Gpt2InitialisationScheme) {
  GPT2Config c = tiny_gpt2();
  c.n_embd = 128;
  c.n_layer = 8;
  c.vocab_size = 500;
  c.n_positions = 64;
  GPT2 m(c, at::detail::createCPUGenerator(0));
  auto std_of = [](const Variable& v) { return v.data().std().item<double>(); };
  EXPECT_NEAR(std_of(m.wte()->weight()), 0.02, 0.001);
  EXPECT_NEAR(std_of(m.wpe()->weight()), 0.02, 0.002);
  EXPECT_NEAR(std_of(m.block(0)->attn()->qkv()->weight()), 0.02, 0.001);
  EXPECT_NEAR(std_of(m.block(3)->mlp()->fc()->weight()), 0.02, 0.001);
  EXPECT_NEAR(std_of(m.block(1)->attn()->out()->weight()), 0.02 / 4.0, 0.0005);  // sqrt(2 * 8) = 4
  EXPECT_NEAR(std_of(m.block(7)->mlp()->proj()->weight()), 0.02 / 4.0, 0.0003);
  EXPECT_EQ(m.block(2)->attn()->qkv()->bias().data().abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(m.ln_f()->weight().data().equal(at::ones({128})));
  // Tied: no separate output projection parameter.
  for (auto& [n, _] : m.named_parameters()) EXPECT_EQ(n.find("lm_head"), std::string::npos);
}

TEST(ModelsGpt2, SplitEqualsUnsplitWithTiedEmbeddingAcrossStages) {
  at::manual_seed(6);
  GPT2 m(tiny_gpt2());
  EXPECT_EQ(m.cut_points(), (std::vector<std::string>{"embed", "h.0", "h.1", "h.2"}));
  const Variable ids(at::randint(37, {2, 9}, at::kLong));
  auto stages = m.split({"h.0", "h.1"});
  EXPECT_TRUE(param_names(*stages[0]).count("wte.weight"));
  EXPECT_TRUE(param_names(*stages[2]).count("wte.weight")) << "the tied output projection lives in the last stage";
  EXPECT_TRUE(param_names(*stages[2]).count("ln_f.weight"));
  EXPECT_FALSE(param_names(*stages[1]).count("wte.weight"));
  expect_split_equals_unsplit(m, stages, ids, "GPT-2 split h.0, h.1", 1e-5);
  expect_split_equals_unsplit(m, m.split({"embed", "h.2"}), ids, "GPT-2 split embed, h.2", 1e-5);
}

TEST(ModelsGpt2, Errors) {
  GPT2 m(tiny_gpt2());
  EXPECT_NE(error_of([&] { m.forward(at::zeros({1, 13}, at::kLong)); }).find("n_positions"), std::string::npos);
  EXPECT_THROW(m.forward(at::zeros({2, 3})), c10::Error);  // float ids
  std::string msg = error_of([&] { m.split({"h.3"}); });
  EXPECT_NE(msg.find("embed, h.0, h.1, h.2"), std::string::npos) << msg;
  GPT2Config bad = tiny_gpt2();
  bad.n_head = 5;
  EXPECT_THROW(GPT2{bad}, c10::Error);
}

// ---- BERT ---------------------------------------------------------------------------------------
BertConfig tiny_bert() {
  BertConfig c;
  c.vocab_size = 41;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 24;
  c.max_position_embeddings = 20;
  c.type_vocab_size = 2;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  c.num_labels = 3;
  return c;
}

/// The torch::nn BERT of models_reference.h with tiny_bert's sizes.
reference::Bert ref_bert(const BertConfig& c) {
  return reference::Bert(reference::BertSizes{c.vocab_size, c.max_position_embeddings, c.type_vocab_size,
                                              c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                                              c.intermediate_size, c.num_labels, c.layer_norm_eps});
}

TEST(ModelsBert, MatchesTorchReferenceWithPaddingAndTokenTypes) {
  at::manual_seed(7);
  const BertConfig c = tiny_bert();
  Bert ours(c);
  reference::Bert ref = ref_bert(c);
  EXPECT_TRUE(reference::copy_into(*ref, ours.state_dict()).empty());
  EXPECT_EQ(ref->named_parameters().size(), ours.named_parameters().size());
  const at::Tensor ids = at::randint(1, 41, {2, 7}, at::kLong);
  const at::Tensor mask = at::arange(7).view({1, 7}).lt(at::tensor({7, 5}).view({2, 1})).to(at::kLong);
  const at::Tensor types = at::arange(7).view({1, 7}).ge(3).to(at::kLong).expand({2, 7}).contiguous();
  testing::ParityOptions opt;
  opt.atol = 2e-5;
  opt.copy_weights = false;
  expect_parity(
      ours, *ref, [&](const Variable& x) { return ours.forward(x.data(), mask, types).logits; },
      [&](const at::Tensor& x) { return ref->forward(x, mask, types); }, ids, "BERT (2 layers)", opt);
  const BertOutput out = ours.forward(ids, mask, types);
  EXPECT_EQ(out.hidden.sizes().vec(), (std::vector<int64_t>{2, 7, 16}));
  EXPECT_EQ(out.pooled.sizes().vec(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(out.logits.sizes().vec(), (std::vector<int64_t>{2, 3}));
}

// pooling = mean: the classifier reads the mean of the last hidden states over the real tokens
// (no pooler is built), in the whole model and in its split stages alike.
TEST(ModelsBert, MeanPoolingAveragesTheRealTokensOnly) {
  at::manual_seed(9);
  BertConfig c = tiny_bert();
  c.pooling = "mean";
  Bert m(c);
  EXPECT_EQ(m.pooler(), nullptr);
  const at::Tensor ids = at::randint(1, 41, {2, 6}, at::kLong);
  const at::Tensor mask = at::arange(6).view({1, 6}).lt(at::tensor({6, 4}).view({2, 1})).to(at::kLong);  // (2, 6)
  const BertOutput out = m.forward(ids, mask);
  const at::Tensor h = out.hidden.data();  // (2, 6, 16)
  const at::Tensor expect = at::stack({h[0].mean(0), h[1].narrow(0, 0, 4).mean(0)});
  EXPECT_TRUE(at::allclose(out.pooled.data(), expect, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(out.logits.data(), m.classifier()->forward(Variable(expect)).data(), 1e-5, 1e-6));
  StageInputs in;
  in.attention_mask = mask;
  in.token_ids = ids;
  EXPECT_TRUE(at::allclose(m.forward(Variable(ids), in).data(), out.logits.data(), 1e-5, 1e-6));
  c.pooling = "max";
  EXPECT_THROW(Bert{c}, c10::Error);
}

TEST(ModelsBert, PaddingDoesNotLeakAndInitIsHuggingFaces) {
  at::manual_seed(8);
  BertConfig c = tiny_bert();
  Bert m(c);
  m.eval();
  at::Tensor ids = at::randint(1, 41, {1, 8}, at::kLong);
  const at::Tensor mask = at::arange(8).lt(5).view({1, 8});
  at::Tensor ids2 = ids.clone();
  ids2.narrow(1, 5, 3).fill_(7);
  auto h1 = m.forward(ids, mask).hidden.data(), h2 = m.forward(ids2, mask).hidden.data();
  EXPECT_TRUE(all_close(h1.narrow(1, 0, 5), h2.narrow(1, 0, 5), "unpadded hidden states"));
  EXPECT_EQ(m.embeddings()->word()->weight().data()[0].abs().max().item<float>(), 0.0f);  // pad row
  EXPECT_NEAR(m.embeddings()->word()->weight().data().std().item<double>(), 0.02, 0.003);
  EXPECT_EQ(m.layer(1)->attn()->query()->bias().data().abs().max().item<float>(), 0.0f);
  EXPECT_THROW(m.forward(ids, mask.narrow(1, 0, 4)), c10::Error);
  EXPECT_THROW(m.forward(at::zeros({1, 21}, at::kLong)), c10::Error);  // longer than max positions
}

TEST(ModelsBert, SplitStagesReadTheirSideInputs) {
  at::manual_seed(9);
  Bert m(tiny_bert());
  EXPECT_EQ(m.cut_points(), (std::vector<std::string>{"embeddings", "layers.0", "layers.1"}));
  const at::Tensor ids = at::randint(1, 41, {3, 6}, at::kLong);
  const at::Tensor mask = at::arange(6).view({1, 6}).lt(at::tensor({6, 4, 2}).view({3, 1}));
  const at::Tensor types = at::randint(2, {3, 6}, at::kLong);
  const StageInputs inputs{ids, mask, types};
  m.eval();  // no dropout: the three forms below must agree exactly
  const at::Tensor logits = m.forward(ids, mask, types).logits.data();
  EXPECT_TRUE(all_close(m.forward(Variable(ids), inputs).data(), logits, "pipeline-form forward"));
  EXPECT_GT(testing::max_diff(m.forward(Variable(ids)).data(), logits), 1e-4);  // without them: another result
  expect_split_equals_unsplit(m, m.split({"embeddings", "layers.0"}), Variable(ids), "BERT split", 1e-5, inputs,
                              [&] { return m.forward(ids, mask, types).logits; });
  auto stages = m.split({"layers.1"});
  EXPECT_TRUE(param_names(*stages[1]).count("classifier.weight"));
  EXPECT_TRUE(param_names(*stages[1]).count("pooler.weight"));
}

// ---- building only some stages (Note [building only some stages]) ------------------------------

/// Builds `make(selection)` for every single stage of `cuts`, and for pairs of stages, and checks
/// that each holds exactly the whole model's parameters and buffers of those stages, bit for bit.
template <class Make>
void expect_parts_hold_the_whole_models_numbers(const Make& make, const std::vector<std::string>& cuts,
                                                const std::string& label) {
  auto whole = make(StageSelection::whole());
  const auto stages = whole->split(cuts);
  const TensorMap all = whole->state_dict();
  const auto n = static_cast<int64_t>(stages.size());
  std::vector<std::set<int64_t>> selections;
  for (int64_t s = 0; s < n; ++s) selections.push_back({s});
  selections.push_back({0, n - 1});  // first and last: GPT-2's tied embedding built once
  for (const auto& selection : selections) {
    auto part = make(StageSelection::of(cuts, selection));
    std::set<std::string> expected;
    for (int64_t s : selection)
      for (const auto& [name, _] : stages[static_cast<size_t>(s)]->state_dict()) expected.insert(name);
    std::set<std::string> held;
    for (const auto& [name, t] : part->state_dict()) {
      held.insert(name);
      ASSERT_TRUE(all.count(name)) << label << ": " << name;
      EXPECT_TRUE(t.equal(all.at(name))) << label << ": '" << name << "' differs from the whole model's";
    }
    EXPECT_EQ(held, expected) << label << ": stages " << *selection.begin() << ".." << *selection.rbegin();
    // Its own stages run; another's is an error naming its segment.
    auto parts = part->split(cuts);
    const int64_t absent = selection.count(0) ? -1 : 0;
    if (absent == 0) {
      const std::string e = error_of([&] { std::static_pointer_cast<Stage>(parts[0])->forward(Variable(at::zeros({1}))); });
      EXPECT_NE(e.find("was not built in this process"), std::string::npos) << label << ": " << e;
    }
  }
}

TEST(ModelsInPart, AStageBuiltAloneHoldsTheWholeModelsNumbers) {
  const at::Generator gen = at::detail::createCPUGenerator(11);
  expect_parts_hold_the_whole_models_numbers(
      [&](const StageSelection& s) { return make_resnet("resnet8", 3, 10, 1.0, gen, s); }, {"stem", "layer2"},
      "resnet8");
  expect_parts_hold_the_whole_models_numbers(
      [&](const StageSelection& s) { return std::make_shared<GPT2>(tiny_gpt2(), gen, s); }, {"embed", "h.1"}, "gpt2");
  BertConfig bc = tiny_bert();
  bc.num_labels = 3;
  bc.hidden_dropout = bc.attention_dropout = 0.1;  // dropout streams are buffers: built in part too
  expect_parts_hold_the_whole_models_numbers(
      [&](const StageSelection& s) { return std::make_shared<Bert>(bc, gen, s); }, {"layers.0", "layers.1"}, "bert");
}

TEST(ModelsInPart, ASkeletonHasTheCutPointsAndNoParameters) {
  auto skeleton = make_resnet("resnet8", 3, 10, 1.0, at::detail::createCPUGenerator(0), StageSelection::skeleton());
  EXPECT_EQ(skeleton->num_parameters(), 0);
  EXPECT_EQ(skeleton->cut_points(), make_resnet("resnet8", 3, 10)->cut_points());
}

TEST(ModelsInPart, ErrorsNameTheProblem) {
  const at::Generator gen = at::detail::createCPUGenerator(0);
  EXPECT_NE(error_of([&] { make_resnet("resnet8", 3, 10, 1.0, gen, StageSelection::of({"stem"}, {2})); })
                .find("stage 2 does not exist; 1 cuts make stages 0 .. 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_resnet("resnet8", 3, 10, 1.0, gen, StageSelection::of({"nowhere"}, {0})); })
                .find("unknown cut point 'nowhere'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_resnet("resnet8", 3, 10, 1.0, std::nullopt, StageSelection::of({"stem"}, {0})); })
                .find("needs a generator"),
            std::string::npos);
}

// ---- split backward --------------------------------------------------------------------------
// Note [split backward] (autograd/engine.cpp): B (the input's gradient) then W (the weights') gives
// one backward's gradients bit for bit, on every model family, whole and as a stage whose input
// is a leaf (what a pipeline stage receives).
void expect_split_backward_is_one_backward(Module& model, const std::function<Variable(const Variable&)>& loss_of,
                                           const at::Tensor& input, bool input_is_leaf, const std::string& label) {
  auto grads = [&](bool split) {
    model.zero_grad();
    Variable x = input_is_leaf ? Variable(input.clone(), true) : Variable(input);
    Variable loss = loss_of(x);
    if (split) {
      DeferredWeightGrads later = backward_inputs({loss}, {}, input_is_leaf ? variable_list{x} : variable_list{});
      for (const auto& [n, p] : model.named_parameters())
        EXPECT_FALSE(p.grad().defined()) << label << ": '" << n << "' has a gradient before W";
      later.run();
    } else {
      loss.backward();
    }
    std::map<std::string, at::Tensor> out;
    for (const auto& [n, p] : model.named_parameters()) out[n] = p.grad();
    if (input_is_leaf) out["(input)"] = x.grad();
    return out;
  };
  const auto whole = grads(false), parts = grads(true);
  ASSERT_EQ(whole.size(), parts.size()) << label;
  for (const auto& [n, g] : whole) {
    ASSERT_TRUE(g.defined()) << label << ": " << n;
    ASSERT_TRUE(parts.at(n).defined()) << label << ": " << n << " has no gradient after W";
    EXPECT_TRUE(g.equal(parts.at(n))) << label << ": '" << n << "' differs by " << (g - parts.at(n)).abs().max().item<double>();
  }
}

TEST(SplitBackward, ThreeModelFamiliesGetOneBackwardsGradientsBitForBit) {
  const at::Generator gen = at::detail::createCPUGenerator(5);
  at::manual_seed(5);
  {
    auto net = make_resnet("resnet8", 3, 4, 0.5, gen);
    const at::Tensor images = at::randn({4, 3, 12, 12}), labels = at::tensor({0, 3, 1, 2}, at::kLong);
    expect_split_backward_is_one_backward(*net, [&](const Variable& x) { return cross_entropy(net->forward(x), labels); },
                                          images, true, "resnet8");
    auto stages = net->split({"stem", "layer2"});
    const at::Tensor h = [&] {
      NoGradGuard no_grad;
      return stages[0]->forward(Variable(images)).data();
    }();
    expect_split_backward_is_one_backward(*stages[1], [&](const Variable& x) { return sum(pow(stages[1]->forward(x), 2.0)); },
                                          h, true, "resnet8 stage 1");
  }
  {
    GPT2 m(tiny_gpt2(), gen);
    const at::Tensor ids = at::randint(37, {2, 9}, at::kLong), next = at::randint(37, {18}, at::kLong);
    expect_split_backward_is_one_backward(
        m, [&](const Variable& x) { return cross_entropy(reshape(m.forward(x), {18, 37}), next); }, ids, false, "gpt2");
    auto stages = m.split({"embed"});
    auto last = std::static_pointer_cast<Stage>(stages[1]);
    StageInputs in;
    in.token_ids = ids;
    const at::Tensor h = [&] {
      NoGradGuard no_grad;
      return std::static_pointer_cast<Stage>(stages[0])->forward(Variable(ids), in).data();
    }();
    expect_split_backward_is_one_backward(
        *last, [&](const Variable& x) { return cross_entropy(reshape(last->forward(x, in), {18, 37}), next); }, h, true,
        "gpt2 blocks");
  }
  {
    Bert m(tiny_bert(), gen);
    const at::Tensor ids = at::randint(41, {3, 7}, at::kLong), labels = at::tensor({2, 0, 1}, at::kLong);
    StageInputs in;
    in.token_ids = ids;
    in.attention_mask = at::ones({3, 7}, at::kLong);
    in.attention_mask[2][6] = 0;
    expect_split_backward_is_one_backward(
        m, [&](const Variable& x) { return cross_entropy(m.forward(x, in), labels); }, ids, false, "bert");
    auto stages = m.split({"layers.0"});
    auto last = std::static_pointer_cast<Stage>(stages[1]);
    const at::Tensor h = [&] {
      NoGradGuard no_grad;
      return std::static_pointer_cast<Stage>(stages[0])->forward(Variable(ids), in).data();
    }();
    expect_split_backward_is_one_backward(
        *last, [&](const Variable& x) { return cross_entropy(last->forward(x, in), labels); }, h, true, "bert layer 1");
  }
}

}  // namespace
}  // namespace tl
