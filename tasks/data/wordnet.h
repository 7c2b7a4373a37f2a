#pragma once
// WordNet 3.0 as real English text data (Debian's wordnet-base: /usr/share/wordnet).
//
// The four data files data.{noun,verb,adj,adv} hold one synset per line (wndb(5WN)):
//   synset_offset lex_filenum ss_type w_cnt {word lex_id}*w_cnt p_cnt
//     {pointer_symbol synset_offset pos source/target}*p_cnt [frames, verbs only] | gloss
// after a license header whose lines start with two spaces. The reader validates every field and
// fails with the file, the line and what was expected.
//
// Two data sets are built from it:
//  - supersense classification: text = the synset's gloss (optionally "lemma: gloss"), label = its
//    lexicographer file (the 45 supersenses of lexnames(5WN): adj.all, noun.animal, verb.motion...);
//  - a running-text corpus for language modelling: the same texts, one per line.
//
// Note [WordNet split]: a synset is in the test split when
//   u(pos, offset) = (splitmix64(key ^ 0x746170656c696e65) >> 11) * 2^-53 < test_fraction,
//   key = (pos << 32) | offset, pos the data file's letter ('n', 'v', 'a', 'r'; adjective
//   satellites 's' are in 'a');
// so the split depends on nothing but the synset and the fraction (a larger fraction's test set
// contains a smaller one's), never on file order or on the other synsets. Within each split the
// order is by splitmix64 of that hash: a fixed pseudo-random order, so head(n) (data.train_limit)
// is a uniform sample of every part of speech, not the first nouns of data.noun.

#include <cstdint>
#include <string>
#include <vector>

namespace tl {

/// Labelled texts for classification.
struct TextExamples {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;           // in [0, label_names.size())
  std::vector<std::string> label_names;  // all classes, whether present or not
  std::string description;

  size_t size() const { return texts.size(); }
  int64_t num_classes() const { return static_cast<int64_t>(label_names.size()); }
  /// The first n examples; n <= 0 or n >= size() returns all.
  TextExamples head(int64_t n) const;
  /// Examples per class (num_classes() entries).
  std::vector<int64_t> label_counts() const;
};

struct TextSplits {
  TextExamples train, test;
};

/// Running text for language modelling.
struct TextCorpus {
  std::string train, test;
  std::string description;
};

/// One synset of a data file.
struct WordNetSynset {
  char pos = 'n';       // the data file: 'n', 'v', 'a' or 'r'
  char ss_type = 'n';   // as recorded: n, v, a, s (adjective satellite) or r
  int64_t offset = 0;   // synset_offset
  int64_t lexfile = 0;  // lex_filenum, 0..44
  std::string lemma;    // the first word, '_' as ' ', adjective markers "(a)" "(p)" "(ip)" removed
  std::string gloss;    // definition and examples as in the file, trailing spaces removed
};

/// The 45 supersenses: WordNet 3.0's lexicographer file names (lexnames(5WN); hard-coded, as
/// Debian's package ships no lexnames file), indexed by lex_filenum.
const std::vector<std::string>& wordnet_supersense_names();
/// /usr/share/wordnet (Debian's wordnet-base).
std::string default_wordnet_root();

/// Reads and validates one data file; `pos` is 'n', 'v', 'a' or 'r' (which ss_type and
/// lex_filenum values it may hold). Records in file order.
std::vector<WordNetSynset> read_wordnet_data_file(const std::string& path, char pos);
/// All four data files of `root` ("" = default_wordnet_root()), nouns, verbs, adjectives, adverbs.
std::vector<WordNetSynset> read_wordnet(const std::string& root = "");

/// True when the synset (data-file pos, offset) is in the test split (Note [WordNet split]).
bool wordnet_in_test(char pos, int64_t offset, double test_fraction);

struct WordNetTextOptions {
  /// Text is "lemma: gloss" (true) or the gloss alone. The lemma helps (e.g. "dog: a member of
  /// the genus Canis...") but is not needed: the gloss alone names the class in most cases.
  bool include_lemma = true;
  /// Keep the quoted usage examples after the definition ("...; \"the dog barked all night\"").
  bool include_examples = true;
};

/// The text of one synset under `options`.
std::string wordnet_text(const WordNetSynset& synset, const WordNetTextOptions& options = {});

/// Supersense classification on all synsets (117,659 in WordNet 3.0): label = lex_filenum, the 45
/// wordnet_supersense_names() as label names. test_fraction in [0, 1].
TextSplits wordnet_supersenses(const std::string& root = "", double test_fraction = 0.1,
                               const WordNetTextOptions& options = {});

/// The same texts as running text, one synset per line ('\n'-terminated), same split and order.
TextCorpus wordnet_gloss_corpus(const std::string& root = "", double test_fraction = 0.1,
                                const WordNetTextOptions& options = {});

}  // namespace tl
