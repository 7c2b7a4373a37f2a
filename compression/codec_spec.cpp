#include "compression/codec_spec.h"

namespace tl {

namespace {

void collect(const SpecCall& call, std::vector<const CodecRecord*>& out) {
  for (const SpecCall* c = &call; c; c = c->next.get()) {
    out.push_back(&record_of(*c));
    auto nested = [&](const SpecValue& v) {
      if (const auto* p = std::get_if<std::shared_ptr<SpecCall>>(&v.v)) collect(**p, out);
    };
    for (const SpecValue& v : c->positional) nested(v);
    for (const auto& [_, v] : c->named) nested(v);
  }
}

}  // namespace

CodecSpec::CodecSpec() : CodecSpec("identity") {}

CodecSpec::CodecSpec(const std::string& text) : text_(text), call_(parse_spec(text)) { collect(*call_, records_); }

}  // namespace tl
