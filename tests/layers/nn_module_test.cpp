// Module state: dotted names, state_dict / load_state_dict (missing, unexpected and mis-shaped
// entries all listed, nothing written on error), train/eval propagation, to(dtype).
#include "layers/models/resnet.h"
#include "layers/nn/nn.h"
#include "tests/common/testing.h"

namespace tl {
namespace {

std::shared_ptr<Sequential> small_net() {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Conv2d>(Conv2dOptions(2, 4, 3).padding(1)));
  net->push_back(std::make_shared<BatchNorm2d>(4));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(4 * 5 * 5, 3));
  return net;
}

using testing::error_of;

TEST(NnModule, DottedNamesAndStateDict) {
  auto net = small_net();
  std::vector<std::string> names;
  for (auto& [n, _] : net->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}));
  const TensorMap sd = net->state_dict();
  EXPECT_EQ(sd.size(), 9u);  // 6 parameters + running_mean, running_var, num_batches_tracked
  EXPECT_TRUE(sd.count("1.num_batches_tracked"));
  // state_dict tensors share storage with the module.
  sd.at("4.bias").fill_(3.0);
  EXPECT_EQ(net->named_parameters()[5].second.data()[0].item<float>(), 3.0f);
}

TEST(NnModule, LoadStateDictRoundTripIntoAFreshModel) {
  at::manual_seed(0);
  auto a = make_resnet("resnet8", 1, 10);
  auto b = make_resnet("resnet8", 1, 10);
  b->load_state_dict(a->state_dict());
  for (auto& [n, t] : a->state_dict()) EXPECT_TRUE(t.equal(b->state_dict().at(n))) << n;
  // And the loaded model computes the same function.
  a->eval();
  b->eval();
  const at::Tensor x = at::randn({2, 1, 12, 12});
  EXPECT_TRUE(testing::all_close(a->forward(Variable(x)).data(), b->forward(Variable(x)).data(), "loaded resnet8"));
}

TEST(NnModule, LoadStateDictListsEveryProblemAndWritesNothing) {
  auto net = small_net();
  TensorMap sd;
  for (auto& [n, t] : net->state_dict()) sd[n] = t.clone();
  const at::Tensor before = net->state_dict().at("0.weight").clone();
  sd.at("0.weight").fill_(7.0);     // a valid change that must not be applied on failure
  sd.erase("1.running_var");        // missing
  sd.erase("4.bias");               // missing
  sd["5.weight"] = at::zeros({1});  // unexpected
  sd["1.bias"] = at::zeros({5});    // wrong shape
  const std::string msg = error_of([&] { net->load_state_dict(sd); });
  ASSERT_FALSE(msg.empty()) << "load_state_dict accepted a bad state";
  for (const char* part :
       {"missing", "1.running_var", "4.bias", "unexpected", "5.weight", "wrong shape", "1.bias", "[5]", "[4]"})
    EXPECT_NE(msg.find(part), std::string::npos) << "error lacks '" << part << "':\n" << msg;
  EXPECT_TRUE(net->state_dict().at("0.weight").equal(before)) << "a failed load wrote into the module";

  // Non-strict: missing and unexpected are tolerated, a wrong shape is not.
  sd["1.bias"] = at::zeros({4});
  net->load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(net->state_dict().at("0.weight").max().item<float>(), 7.0f);
  sd["1.bias"] = at::zeros({2, 2});
  EXPECT_NE(error_of([&] { net->load_state_dict(sd, false); }).find("1.bias"), std::string::npos);
}

TEST(NnModule, TrainEvalPropagatesAndIsSeparateFromGradMode) {
  auto net = small_net();
  net->eval();
  for (auto& [n, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << n;
  net->train();
  for (auto& [n, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << n;
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(net->is_training());
    Variable y = net->forward(Variable(at::randn({2, 2, 5, 5})));
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(net->state_dict().at("1.num_batches_tracked").item<int64_t>(), 1);
}

TEST(NnModule, ToDtypeKeepsHandlesAndIntegerBuffers) {
  auto net = small_net();
  Variable w = net->named_parameters()[0].second;
  net->to(at::kDouble);
  EXPECT_EQ(w.scalar_type(), at::kDouble) << "parameter handles must follow to()";
  EXPECT_EQ(net->state_dict().at("1.num_batches_tracked").scalar_type(), at::kLong);
  Variable y = net->forward(Variable(at::randn({2, 2, 5, 5}, at::kDouble)));
  EXPECT_EQ(y.scalar_type(), at::kDouble);
  EXPECT_EQ(net->num_parameters(), 2u * 4 * 9 + 4 + 4 + 4 + 100 * 3 + 3);
}

}  // namespace
}  // namespace tl
