#pragma once
// ResNets for small images (CIFAR-style: 3x3 stem, stride 1, no max-pool), for any number of
// input channels and any input size (global average pooling before the classifier).
//   resnet18 / resnet34: BasicBlocks [2,2,2,2] / [3,4,6,3], widths 64,128,256,512 (x width)
//   resnet8 / resnet20:  the 6n+2 family, n = 1 / 3, widths 16,32,64 (x width)
// Downsampling shortcuts are 1x1 conv + BatchNorm ("option B", as torchvision). Initialisation
// is PyTorch's layer defaults, each segment's modules drawing from their own generator (Note
// [initialisation by name] in layers/nn/init.h). Names follow torchvision: conv1, bn1, layer1.0.conv1, ...,
// layer2.0.downsample.0, fc.
//
// Cut points, in order: "stem", then after each block "layerS.i", where the last block of a
// stage is named by the stage itself ("layer1", the cut after the whole of layer1), e.g. for
// resnet18: stem, layer1.0, layer1, layer2.0, layer2, layer3.0, layer3, layer4.0, layer4.

#include "layers/models/splittable.h"
#include "layers/nn/activation.h"
#include "layers/nn/conv.h"
#include "layers/nn/linear.h"
#include "layers/nn/norm.h"
#include "layers/nn/sequential.h"

namespace tl {

/// conv3x3-BN-ReLU-conv3x3-BN plus the shortcut, then ReLU. Children: conv1, bn1, conv2, bn2 and
/// downsample (Sequential conv1x1, BN) when the stride or width changes.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, const init::Generator& gen = std::nullopt);
  /// x (N, in, H, W) -> (N, out, H / stride, W / stride)
  Variable forward(const Variable& x) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<Sequential> downsample_;
};

class ResNet : public Module, public Splittable {
 public:
  /// blocks[s] BasicBlocks in stage s (named layer{s+1}) of width widths[s]; stage 0 has
  /// stride 1, the others 2. The stem is a 3x3 conv to widths[0] channels.
  /// `build`: the stages to construct (Note [building only some stages]; every module is
  /// initialised from init::fork(gen, its path)).
  ResNet(std::vector<int64_t> blocks, std::vector<int64_t> widths, int64_t in_channels, int64_t num_classes,
         const init::Generator& gen = std::nullopt, const StageSelection& build = {});
  /// x (N, in_channels, H, W) -> logits (N, num_classes)
  Variable forward(const Variable& x) override;

  std::vector<std::string> cut_points() const override { return segment_cut_points(segments_); }
  std::vector<ModulePtr> split(const std::vector<std::string>& cuts) override {
    return split_segments("ResNet", segments_, cuts);
  }

  const std::vector<int64_t>& widths() const { return widths_; }

 private:
  std::vector<int64_t> widths_;
  std::vector<Segment> segments_;
};

/// name: resnet8, resnet20 (CIFAR 6n+2, widths 16/32/64) or resnet18, resnet34 (CIFAR-style,
/// widths 64..512); width multiplies every stage width (rounded, at least 1).
std::shared_ptr<ResNet> make_resnet(const std::string& name, int64_t in_channels, int64_t num_classes,
                                    double width = 1.0, const init::Generator& gen = std::nullopt,
                                    const StageSelection& build = {});

}  // namespace tl
