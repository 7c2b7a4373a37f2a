#pragma once
// The model of a run, by model.arch, sized for the task (tasks/task.h TaskShape):
//
//   resnet8 | resnet20 | resnet18 | resnet34   vision: CIFAR-style ResNets (model.width scales channels)
//   minilm                                     text: all-MiniLM-L6-v2 (BERT-style, 6 layers, d = 384) with a
//                                              classification head; pretrained weights from model.weights
//                                              (model.pretrained = false: the same architecture, random init)
//   gpt2-tiny | gpt2-mini | gpt2-small         lm: GPT-2 with 2 x 128 (4 heads), 4 x 256 (4 heads) or the
//                                              124M 12 x 768 (12 heads); context = data.seq_len
//
// model.init_from then replaces the weights by those of an earlier tapeline run (its
// checkpoint's model part; the architecture must match exactly).

#include <string>
#include <vector>

#include "layers/module.h"
#include "parallel/pipeline.h"
#include "tasks/config.h"
#include "tasks/task.h"

namespace tl {

struct BuiltModel {
  ModulePtr model;           // implements Splittable
  std::string weights_dir;   // minilm: where the pretrained files were found
  std::string head, tail;    // of describe()
  /// e.g. "minilm (pretrained from ..., 22.7M parameters)", given the whole model's parameter
  /// count (a model built in part does not hold it).
  std::string describe(int64_t parameters) const;
};

/// Architectures known to build_model, for messages.
const std::vector<std::string>& known_architectures();

/// Builds (and initialises) the model of `config` for a task of shape `shape`, or only the stages
/// `build` selects (Note [building only some stages]: the same numbers either way). Errors name
/// model.arch and say which task it fits, or name the missing weights and how to get them.
BuiltModel build_model(const Config& config, const TaskShape& shape, const at::Generator& gen,
                       const StageSelection& build = {});

/// Lets codecs that constrain the model (Protocol Models' subspace: a frozen token table added to
/// the input embedding, residual-stream writers kept in span(U)) apply their constraints, once,
/// after the pipeline is on its device and before the optimizer is built. Only GPT-2 supports
/// them; another model with such a codec is an error naming the boundary.
void apply_codec_constraints(Pipeline& pipeline);

/// Why parallel.tp cannot split config's model ("" if it can, and for parallel.tp = 1), from the
/// config alone (nothing built; the launcher checks it before starting any process): ResNets have
/// no transformer blocks, and T must divide the attention heads and the MLP width.
std::string tensor_parallel_problem(const Config& config);

/// Loads the model weights of a tapeline checkpoint (a run directory or a checkpoint file) into
/// `model`; every parameter and buffer must match by name and shape. `part`: the model is built in
/// part (a rank's stages); the checkpoint's other entries are skipped.
void init_model_from(Module& model, const std::string& run_or_checkpoint, bool part = false);

}  // namespace tl
