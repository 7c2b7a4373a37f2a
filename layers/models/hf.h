#pragma once
// Hugging Face checkpoints into this project's GPT-2 and BERT.
//
// GPT-2 (GPT2Model / GPT2LMHeadModel names, with or without the "transformer." prefix):
//   wte, wpe, ln_f                          -> wte, wpe, ln_f
//   h.{i}.ln_1 / ln_2                       -> h.{i}.ln1 / ln2
//   h.{i}.attn.c_attn / attn.c_proj          -> h.{i}.attn.qkv / attn.out
//   h.{i}.mlp.c_fc / mlp.c_proj              -> h.{i}.mlp.fc / mlp.proj
// Conv1D weights are stored (in, out) and are transposed to Linear's (out, in). The causal-mask
// buffers h.{i}.attn.bias / attn.masked_bias are skipped; lm_head.weight, when present, must
// equal wte (GPT-2 ties them) and is skipped.
//
// BERT (BertModel names, with or without the "bert." prefix; TF-era LayerNorm.gamma/beta read
// as weight/bias):
//   embeddings.{word,position,token_type}_embeddings -> embeddings.{word,position,token_type}
//   embeddings.LayerNorm                              -> embeddings.norm
//   encoder.layer.{i}.attention.self.{query,key,value} -> layers.{i}.attn.{query,key,value}
//   encoder.layer.{i}.attention.output.dense / LayerNorm -> layers.{i}.attn.out / ln1
//   encoder.layer.{i}.intermediate.dense              -> layers.{i}.mlp.fc
//   encoder.layer.{i}.output.dense / LayerNorm        -> layers.{i}.mlp.proj / ln2
//   pooler.dense -> pooler;  classifier -> classifier
// embeddings.position_ids (a buffer) is skipped.
//
// Every load checks the whole mapping first and fails with one error listing the checkpoint names
// no rule maps, mapped names the model lacks, and model entries the checkpoint lacks; shapes are
// then checked by Module::load_state_dict. Nothing is written unless everything matches.

#include <string>
#include <vector>

#include "layers/models/bert.h"
#include "layers/models/gpt2.h"

namespace tl {

/// Loads Hugging Face GPT-2 tensors (any float dtype; converted to the model's) into `model`.
void load_hf_gpt2(GPT2& model, const TensorMap& checkpoint);
/// The same from a model.safetensors file.
void load_hf_gpt2(GPT2& model, const std::string& safetensors_path);
/// GPT2Config from a Hugging Face config.json (n_layer, n_head, n_embd, n_positions, vocab_size,
/// layer_norm_epsilon, *_pdrop, initializer_range; absent keys keep the defaults).
GPT2Config gpt2_config_from_hf(const std::string& config_json_path);

struct HfBertOptions {
  /// The checkpoint may lack the pooler (the model's keeps its initialisation), or the model may
  /// have none (the checkpoint's is dropped).
  bool allow_pooler_mismatch = false;
  /// The checkpoint may lack the classifier (fine-tuning from a base checkpoint).
  bool allow_missing_classifier = false;
  /// Checkpoint names starting with these are ignored (pre-training heads).
  std::vector<std::string> ignore_prefixes = {"cls."};
};

void load_hf_bert(Bert& model, const TensorMap& checkpoint, const HfBertOptions& options = {});
void load_hf_bert(Bert& model, const std::string& safetensors_path, const HfBertOptions& options = {});
/// BertConfig from a Hugging Face config.json (sizes, layer_norm_eps, dropouts, hidden_act
/// gelu | gelu_new | relu, pad_token_id, initializer_range; absent keys keep the defaults).
BertConfig bert_config_from_hf(const std::string& config_json_path);

/// The project name of one Hugging Face GPT-2 / BERT name ("" when no rule maps it). Exposed for
/// tests and tools; skipped names (mask buffers, position_ids) map to "".
std::string hf_gpt2_name(const std::string& hf_name);
std::string hf_bert_name(const std::string& hf_name);

}  // namespace tl
