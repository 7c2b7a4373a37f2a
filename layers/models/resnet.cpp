#include "layers/models/resnet.h"

#include <cmath>

namespace tl {

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, const init::Generator& gen)
    : Module("BasicBlock") {
  conv1_ = register_module(
      "conv1",
      std::make_shared<Conv2d>(Conv2dOptions(in_channels, out_channels, 3).stride(stride).padding(1).bias(false), gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(out_channels));
  conv2_ = register_module(
      "conv2", std::make_shared<Conv2d>(Conv2dOptions(out_channels, out_channels, 3).padding(1).bias(false), gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = register_module("downsample", std::make_shared<Sequential>());
    downsample_->push_back(
        std::make_shared<Conv2d>(Conv2dOptions(in_channels, out_channels, 1).stride(stride).bias(false), gen));
    downsample_->push_back(std::make_shared<BatchNorm2d>(out_channels));
  }
}

Variable BasicBlock::forward(const Variable& x) {
  Variable y = relu(bn1_->forward(conv1_->forward(x)));
  y = bn2_->forward(conv2_->forward(y));
  return relu(y + (downsample_ ? downsample_->forward(x) : x));
}

ResNet::ResNet(std::vector<int64_t> blocks, std::vector<int64_t> widths, int64_t in_channels, int64_t num_classes,
               const init::Generator& gen, const StageSelection& build)
    : Module("ResNet"), widths_(std::move(widths)) {
  TORCH_CHECK(!blocks.empty() && blocks.size() == widths_.size(), "ResNet: need one width per stage, got ",
              blocks.size(), " stages and ", widths_.size(), " widths");
  TORCH_CHECK(in_channels > 0 && num_classes > 0, "ResNet: in_channels and num_classes must be positive, got ",
              in_channels, " and ", num_classes);
  for (size_t s = 0; s < blocks.size(); ++s)
    TORCH_CHECK(blocks[s] > 0 && widths_[s] > 0, "ResNet: stage ", s + 1, " needs positive blocks and width, got ",
                blocks[s], " and ", widths_[s]);
  TORCH_CHECK(build.is_whole() || gen, "ResNet: building some stages needs a generator (Note [initialisation by name])");

  // Segment ends: the stem, every block (the last of a stage named by the stage), the head.
  std::vector<std::string> ends = {"stem"};
  for (size_t s = 0; s < blocks.size(); ++s)
    for (int64_t i = 0; i < blocks[s]; ++i)
      ends.push_back(i + 1 == blocks[s] ? "layer" + std::to_string(s + 1)
                                        : "layer" + std::to_string(s + 1) + "." + std::to_string(i));
  ends.push_back("");
  const std::vector<bool> built = build.built("ResNet", ends);
  size_t k = 0;  // the segment being built

  if (built[k]) {
    auto conv1 = register_module(
        "conv1", std::make_shared<Conv2d>(Conv2dOptions(in_channels, widths_[0], 3).padding(1).bias(false),
                                          init::fork(gen, "conv1")));
    auto bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(widths_[0]));
    segments_.push_back({"stem", {{"conv1", conv1}, {"bn1", bn1}}, [conv1, bn1](const Variable& x, const StageInputs&) {
                           return relu(bn1->forward(conv1->forward(x)));
                         }});
  } else {
    segments_.push_back(unbuilt_segment("ResNet", ends[k]));
  }
  ++k;

  int64_t channels = widths_[0];
  for (size_t s = 0; s < blocks.size(); ++s) {
    const std::string stage = "layer" + std::to_string(s + 1);
    std::shared_ptr<Sequential> layer;
    for (int64_t i = 0; i < blocks[s]; ++i, ++k) {
      const int64_t stride = (s > 0 && i == 0) ? 2 : 1;
      const int64_t in = channels;
      channels = widths_[s];
      if (!built[k]) {
        segments_.push_back(unbuilt_segment("ResNet", ends[k]));
        continue;
      }
      if (!layer) layer = register_module(stage, std::make_shared<Sequential>());
      const std::string path = stage + "." + std::to_string(i);
      auto block = std::make_shared<BasicBlock>(in, widths_[s], stride, init::fork(gen, path));
      layer->push_back(std::to_string(i), block);
      segments_.push_back({ends[k], {{path, block}}, [block](const Variable& x, const StageInputs&) {
                             return block->forward(x);
                           }});
    }
  }

  if (built[k]) {
    auto avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
    auto fc = register_module("fc", std::make_shared<Linear>(channels, num_classes, true, init::fork(gen, "fc")));
    segments_.push_back({"", {{"avgpool", avgpool}, {"fc", fc}}, [avgpool, fc](const Variable& x, const StageInputs&) {
                           return fc->forward(flatten(avgpool->forward(x), 1));  // (N, C, 1, 1) -> (N, C)
                         }});
  } else {
    segments_.push_back(unbuilt_segment("ResNet", ends[k]));
  }
}

Variable ResNet::forward(const Variable& x) {
  TORCH_CHECK(x.dim() == 4, "ResNet: input must be (N, C, H, W), got ", x.sizes());
  return run_segments(segments_, x);
}

std::shared_ptr<ResNet> make_resnet(const std::string& name, int64_t in_channels, int64_t num_classes, double width,
                                    const init::Generator& gen, const StageSelection& build) {
  TORCH_CHECK(width > 0.0, "make_resnet: width multiplier must be positive, got ", width);
  auto scaled = [width](std::vector<int64_t> w) {
    for (auto& c : w) c = std::max<int64_t>(1, std::llround(static_cast<double>(c) * width));
    return w;
  };
  if (name == "resnet8")
    return std::make_shared<ResNet>(std::vector<int64_t>{1, 1, 1}, scaled({16, 32, 64}), in_channels, num_classes, gen, build);
  if (name == "resnet20")
    return std::make_shared<ResNet>(std::vector<int64_t>{3, 3, 3}, scaled({16, 32, 64}), in_channels, num_classes, gen, build);
  if (name == "resnet18")
    return std::make_shared<ResNet>(std::vector<int64_t>{2, 2, 2, 2}, scaled({64, 128, 256, 512}), in_channels,
                                    num_classes, gen, build);
  if (name == "resnet34")
    return std::make_shared<ResNet>(std::vector<int64_t>{3, 4, 6, 3}, scaled({64, 128, 256, 512}), in_channels,
                                    num_classes, gen, build);
  TORCH_CHECK(false, "make_resnet: unknown model '", name, "'; known: resnet8, resnet20, resnet18, resnet34");
}

}  // namespace tl
