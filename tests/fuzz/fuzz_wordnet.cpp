// WordNet data files (data.noun, data.verb, ...): the record reader, with the file's part of
// speech picked by the first byte.
#include "tasks/data/wordnet.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(wordnet) {
  tl::fuzz::Reader in(data, size);
  const char pos = "nvar"[in.byte() % 4];
  const std::string path = tl::fuzz::write_file("data.pos", in.ptr(), in.left());
  for (const tl::WordNetSynset& s : tl::read_wordnet_data_file(path, pos)) {
    TL_FUZZ_CHECK(s.lexfile >= 0 && s.lexfile < 45, "lex_filenum out of range accepted");
    TL_FUZZ_CHECK(s.offset >= 0, "a negative offset accepted");
  }
}
