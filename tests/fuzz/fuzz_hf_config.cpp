// Hugging Face config.json files of pretrained checkpoints: BERT's and GPT-2's readers.
#include "layers/models/hf.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(hf_config) {
  tl::fuzz::Reader in(data, size);
  const bool bert = in.byte() % 2;
  const std::string path = tl::fuzz::write_file("config.json", in.ptr(), in.left());
  if (bert) {
    const tl::BertConfig c = tl::bert_config_from_hf(path);
    TL_FUZZ_CHECK(c.hidden_size > 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0,
                  "an unusable BERT config accepted");
  } else {
    const tl::GPT2Config c = tl::gpt2_config_from_hf(path);
    TL_FUZZ_CHECK(c.n_embd > 0 && c.n_head > 0 && c.n_embd % c.n_head == 0, "an unusable GPT-2 config accepted");
  }
}
