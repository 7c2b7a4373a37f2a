// Every harness of tests/fuzz/ over every file of its corpus (tests/fuzz/corpus/<name>/): the
// seeds from real files and each input a fuzzer once found a bug with. A finding aborts the run
// with the harness's message after naming the file (docs/FUZZING.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "compression/registry.h"
#include "tests/fuzz/fuzz.h"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> harness_names() {
  std::vector<std::string> names;
  for (const auto& [name, h] : tl::fuzz::harnesses()) names.push_back(name);
  return names;
}

class Corpus : public testing::TestWithParam<std::string> {};

TEST_P(Corpus, EveryInputIsAcceptedOrRejectedCleanly) {
  const std::string name = GetParam();
  const fs::path dir = fs::path(TL_FUZZ_CORPUS) / name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir << ": every harness needs a seed corpus";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << dir << " is empty";
  int accepted = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    const bool ok = tl::fuzz::run_one(tl::fuzz::harnesses().at(name), reinterpret_cast<const uint8_t*>(bytes.data()),
                                      bytes.size(), &why);
    accepted += ok;
    std::printf("%s: %s (%zu bytes): %s\n", name.c_str(), f.filename().c_str(), bytes.size(),
                ok ? "accepted" : ("rejected: " + why.substr(0, why.find('\n'))).c_str());
  }
  // The seeds are real inputs: a harness that rejects them all never reaches the code past the
  // first check (a wrong file name, a changed format).
  EXPECT_GT(accepted, 0) << name << ": no input of the corpus was accepted";
}

INSTANTIATE_TEST_SUITE_P(Fuzz, Corpus, testing::ValuesIn(harness_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// The bugs fuzzing found, each rejected with an error that says what is wrong (the corpus keeps the
// inputs; this keeps the reasons).
TEST(FuzzRegressions, FoundInputsAreRejectedSayingWhy) {
  struct Case {
    std::string harness, file, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"hf_config", "crash-heads-do-not-divide-width", "hidden_size = 385 is not a multiple of num_attention_heads"},
           {"hf_config", "ubsan-integer-longer-than-uint64", "key 'intermediate_size' = 1.77777777777"},
           {"idx", "oom-header-claims-gigabytes", "the file ends after 12"},
           {"idx", "ubsan-dimensions-overflow", "implausible size"},
           {"image", "asan-jpeg-scan-uses-an-undefined-huffman-table", "Huffman table 0, which no DHT segment before it defines"},
           {"image", "crash-jpeg-huffman-over-256", "Huffman table of 517 symbols; at most 256"},
           {"image", "timeout-bmp-declares-31-mpixels-in-90-bytes", "truncated BMP: its 655408x48 pixels at 1 bits"},
           {"image", "timeout-jpeg-declares-31-mpixels-in-718-bytes", "truncated JPEG: its 493x64307 pixels need at least 30960 bytes"},
           {"image", "oom-png-idat-declares-1.8-gb", "truncated PNG: chunk 'IDAT' at byte 145 declares 1824049146 bytes"},
           {"image", "timeout-bmp-compression-0xa7000000-read-as-uncompressed", "truncated BMP: its 655408x48 pixels at 1 bits"},
           {"spec", "oom-subspace-vocab-9999999256", "vocab up to 4194304"},
           {"payload", "oom-sparse-huge-shape", "declares 44445139608 elements; accepted at most"},
           {"payload", "ubsan-empty-shape-partial-product-overflow", "overflows int64"},
       }) {
    std::ifstream in(fs::path(TL_FUZZ_CORPUS) / c.harness / c.file, std::ios::binary);
    ASSERT_TRUE(in) << c.harness << "/" << c.file;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    EXPECT_FALSE(tl::fuzz::run_one(tl::fuzz::harnesses().at(c.harness),
                                   reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &why))
        << c.file;
    EXPECT_NE(why.find(c.expected), std::string::npos) << c.file << ": " << why;
  }
}

// The harnesses catch what they should: a finding is an abort, a rejection is not.
TEST(FuzzHarness, ARejectionReturnsAndAnUnboundedAllocationIsAFinding) {
  tl::fuzz::run_one([](const uint8_t*, size_t) { throw std::invalid_argument("bad input"); }, nullptr, 0);
  EXPECT_DEATH(tl::fuzz::run_one([](const uint8_t*, size_t) { throw std::bad_alloc(); }, nullptr, 0),
               "an allocation sized by the input");
  EXPECT_DEATH(tl::fuzz::run_one([](const uint8_t*, size_t) { TL_FUZZ_CHECK(1 + 1 == 3, "arithmetic"); }, nullptr, 0),
               "invariant broken");
}

// The spec dictionary names every codec of the registry and the argument adaptive turns in it, so
// that a new codec reaches the fuzzer as a word.
TEST(FuzzDictionary, SpecDictionaryNamesEveryCodec) {
  std::ifstream in(fs::path(TL_FUZZ_DICT) / "spec.dict");
  ASSERT_TRUE(in) << TL_FUZZ_DICT << "/spec.dict";
  std::vector<std::string> words;
  for (std::string line; std::getline(in, line);)
    if (line.size() >= 2 && line.front() == '"' && line.back() == '"') words.push_back(line.substr(1, line.size() - 2));
  auto has = [&](const std::string& w) { return std::find(words.begin(), words.end(), w) != words.end(); };
  for (const tl::CodecRecord* r : tl::codec_records()) {
    if (!r->factory) continue;
    EXPECT_TRUE(has(r->name)) << "tests/fuzz/dict/spec.dict lacks \"" << r->name << "\"";
    if (r->traits.knob) {
      EXPECT_TRUE(has(r->traits.knob->arg + "=")) << "spec.dict lacks \"" << r->traits.knob->arg << "=\"";
    }
  }
}

}  // namespace
