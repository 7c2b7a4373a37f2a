// WordPiece vocabularies (vocab.txt) and text: the tokenizer built from a vocabulary chunk, then
// the rest of the input tokenized and encoded; every id is in the vocabulary.
#include "layers/models/wordpiece.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(wordpiece) {
  tl::fuzz::Reader in(data, size);
  const bool lower = in.byte() % 2;
  const std::string vocab = in.chunk();
  const std::string text = in.rest();
  const tl::WordPieceTokenizer tok(tl::fuzz::write_file("vocab.txt", vocab), lower);
  const int64_t n = static_cast<int64_t>(tok.vocab_size());
  for (int64_t id : tok.encode(text)) TL_FUZZ_CHECK(id >= 0 && id < n, "an id outside the vocabulary");
  const tl::EncodedBatch b = tok.encode_batch({text, text.substr(0, text.size() / 2)}, 16);
  TL_FUZZ_CHECK(b.ids.dim() == 2 && b.ids.size(0) == 2 && b.ids.size(1) <= 16, "encode_batch's shape");
  TL_FUZZ_CHECK(b.ids.sizes() == b.attention_mask.sizes(), "ids and mask differ in shape");
}
