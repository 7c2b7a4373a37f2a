#pragma once
// The codec registry: one record per codec, holding everything the rest of the tree asks about a
// codec by name: its spec name, the wire id its payloads carry, its factory, its help line and its
// traits (sectioned, backward mode 'shared', the knob adaptive(...) turns, receiver state, and
// whether it may compress data-parallel gradients and tensor-parallel partial sums). Every list
// of codecs elsewhere (error messages, adaptive's knobs, the payload id table) is read from here.
// tapeline's own records are in compression/codecs/register.cpp and
// compression/stateful/register.cpp; tests/compression/registry_test.cpp checks each record's
// traits against the codec it builds.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compression/compressor.h"

namespace tl {

class SpecArgs;
using CompressorFactory = std::function<CompressorPtr(SpecArgs&)>;

/// A yes/no capability of a codec, or, for a codec around others (ef(C), schedule(C0, p, C1),
/// ...), "as the codecs it wraps": shared mode when every one has it, receiver state when any has.
enum class Capability : uint8_t { kNo, kYes, kInner };

/// Whether a codec may compress a data-parallel gradient or a tensor-parallel partial sum, and if
/// not, why. A wrapper's own entry speaks for itself only: the codecs it wraps have their own
/// records, and CodecSpec::records() lists every codec of a spec.
enum class MessageUse : uint8_t {
  kYes,
  kNoDecoderState,  // its decoder keeps state per sender (one copy per peer would be needed)
  kNoSampleIds,     // it needs the micro-batch's sample ids, which an all-reduce does not carry
  kNoTransform,     // learned or projecting (ae, subspace): a pipeline boundary's forward codec
};

/// The argument adaptive(C) turns when no arg= is given: its name, whether it is a fraction (a
/// 1-2-5 ladder) or an integer (consecutive values), and the ladder's ends, most compressed first.
struct AdaptiveKnob {
  std::string arg;
  bool fraction = false;
  double from = 0, to = 0;
};

struct CodecTraits {
  /// A SectionedCodec: its value sections can go through the next stage of `a | b`.
  bool sectioned = false;
  /// Backward mode 'shared' (Compressor::supports_shared): the gradient on the forward payload's
  /// support or basis.
  Capability shared = Capability::kNo;
  /// Whether decode() changes receiver state (Compressor::decode_has_state).
  Capability decode_state = Capability::kNo;
  /// What adaptive(C) adapts by default; none: only with arg=NAME, from=A, to=B.
  std::optional<AdaptiveKnob> knob;
  MessageUse dp = MessageUse::kYes;  // dp.compression
  MessageUse tp = MessageUse::kYes;  // tp.forward, tp.backward
  /// tp.algorithm = reduce_scatter: defined per chunk, stateless (the sums are compressed again).
  bool reduce_scatter = false;
};

struct CodecRecord {
  std::string name;           // spec name, and the name of its payloads' codec id
  uint16_t wire_id = 0;       // payload.h's codec id; 0: its payloads carry another codec's id
  CompressorFactory factory;  // null: a wire id only (compose's payloads; register_codec_id)
  std::string help;           // one line: syntax and what it does
  /// A spec that builds this codec, for the tests; a wrapper's has "{}" where its inner codec
  /// goes (e.g. "ef({})"). Empty: a codec registered without traits (register_compressor).
  std::string example;
  CodecTraits traits;
};

/// Adds a record. Its name must be a spec name (a letter or '_', then letters, digits, '_', '-',
/// '.') when it has a factory; a name or wire id already taken is an error (wire ids are fixed:
/// never renumber one, payloads on disk and on other ranks carry them). A record with a factory
/// completes a wire-id-only record of the same name and id (register_codec_id first).
void register_codec(CodecRecord record);

/// A codec registered by name, factory and help only: default traits (not sectioned, no shared
/// mode, no receiver state, no knob, allowed on every message) and no example, which the
/// registry test flags for tapeline's own codecs. `wire_id` 0: its payloads carry another
/// codec's id (`cast` packs as fp16 or bf16).
void register_compressor(const std::string& name, CompressorFactory factory, const std::string& help,
                         uint16_t wire_id = 0);

/// Registers tapeline's own codecs, once (every lookup below calls it first).
void ensure_builtin_codecs();

/// The record of a name or a wire id; nullptr if there is none. Records are never removed.
const CodecRecord* find_codec(const std::string& name);
const CodecRecord* find_codec(uint16_t wire_id);
/// Every record, sorted by name.
std::vector<const CodecRecord*> codec_records();
/// The spec names (records with a factory) for which `pred` holds, sorted, joined by ", ": for
/// messages that list the codecs that can do something.
std::string codec_names(const std::function<bool(const CodecRecord&)>& pred);

/// Spec name -> help line, sorted.
std::map<std::string, std::string> known_compressors();

}  // namespace tl
