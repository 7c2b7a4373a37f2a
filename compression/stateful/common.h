#pragma once
// Shared pieces of the stateful and learned codecs (error feedback, EF21, AQ-SGD, Optimus-CC lazy
// error propagation, autoencoder, subspace):
//  - WrappingCompressor: a codec around an inner codec C (ef(C), ef21(C), ...). The inner codec is
//    a registered child named "inner", so its own state (PowerSGD warm start, RNG) is
//    checkpointed and moved with the wrapper.
//  - StateBuffer: a registered, resizable buffer shaped like the messages it meets (the EF
//    residual, EF21's A), reset to zeros when the message shape changes.
//  - SampleCache: one row per training sample keyed by sample id (AQ-SGD's m(id), per-sample EF),
//    in memory or memory-mapped from a file.
//  - small helpers for nested specs and argument checks.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "compression/compressor.h"
#include "compression/spec.h"

namespace tl {
namespace stateful {

/// Sizes a learned codec (ae, subspace) may declare, so that a spec cannot ask for terabytes: widths
/// up to 65,536, vocabularies up to 4,194,304, and a weight or embedding table of at most 2^26
/// elements (256 MB in float32; GPT-2 large's 50257 x 1280 fits).
constexpr int64_t kMaxWidth = int64_t(1) << 16;
constexpr int64_t kMaxVocab = int64_t(1) << 22;
constexpr int64_t kMaxTableElements = int64_t(1) << 26;

/// Builds the nested codec argument `key` (or positional `pos`) of a wrapper's spec.
CompressorPtr build_inner(SpecArgs& args, size_t pos, const std::string& key, const std::string& wrapper);

/// Accumulation dtype for state kept next to a tensor of type `t`: at least float32 (float64
/// stays float64, so gradient checks in double precision stay exact).
at::ScalarType accumulation_type(at::ScalarType t);

/// Checks ctx.sample_ids against a micro-batch of `batch` rows: defined, int64 (or int32),
/// 1-D, one id per row, non-negative, no duplicates. Returns them as int64. `who` names the codec.
at::Tensor checked_sample_ids(const CodecContext& ctx, int64_t batch, const std::string& who);

/// A codec around an inner codec C; the inner codec is registered as child "inner".
/// Backward mode `shared` is delegated to C (the wrapper sends C's payloads).
class WrappingCompressor : public Compressor {
 public:
  WrappingCompressor(std::string type_name, CompressorPtr inner);
  const CompressorPtr& inner() const { return inner_; }

  bool supports_shared() const override { return inner_->supports_shared(); }
  Payload encode_shared(const at::Tensor& g, const Payload& fwd, const CodecContext& ctx) override {
    return inner_->encode_shared(g, fwd, ctx);
  }
  at::Tensor decode_shared(const Payload& p, const Payload& fwd, const CodecContext& ctx) override {
    return inner_->decode_shared(p, fwd, ctx);
  }
  void after_optimizer_step() override { inner_->after_optimizer_step(); }
  std::optional<CodecLevel> level() const override { return inner_->level(); }
  bool decode_has_state() const override { return inner_->decode_has_state(); }

 protected:
  CompressorPtr inner_;
};

/// A registered buffer shaped like the messages it meets. get() returns it with `shape`, dtype
/// `dtype` and on `device`: created (zeros) on first use, reset to zeros when the shape changes
/// (documented policy: e.g. the smaller last micro-batch of an epoch restarts the state), and
/// converted when the module was moved or cast. It is marked resizable, so a checkpoint restores
/// it whatever shape it had.
class StateBuffer {
 public:
  StateBuffer(Module& owner, const std::string& name);
  at::Tensor get(at::IntArrayRef shape, at::ScalarType dtype, at::Device device);
  /// The current value (may be empty: never used or reset).
  const at::Tensor& value() const { return var_.data(); }
  void reset();

 private:
  Variable var_;
};

struct SampleCacheOptions {
  /// Sample ids 0..capacity-1 (0: any id). In memory the rows grow as larger ids appear, at most
  /// to the capacity; a file holds all of them.
  int64_t capacity = 0;
  /// Storage type of the rows: kFloat, kHalf or kBFloat16 (a quantised cache).
  at::ScalarType dtype = at::kFloat;
  /// Non-empty: rows live in a memory-mapped file of capacity x D values of `dtype` (host memory,
  /// for datasets whose cache does not fit in RAM or GPU memory). Requires capacity > 0. The file is
  /// created atomically (temporary name, then rename) and reused when it exists with the right size.
  std::string file;
};

/// One row of D values per sample id. Registers `<name>_rows` (in-memory rows, resizable; empty when
/// file-backed, the file being the rows' storage) and `<name>_seen` (uint8 per id: written at least
/// once) on `owner`. D is fixed by the first write; a different row size later is an error.
class SampleCache {
 public:
  SampleCache(Module& owner, const std::string& name, SampleCacheOptions opt, std::string who);
  ~SampleCache();
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  /// Rows for ids (B) as (B, D) of `dtype` on `device`; rows never written are zeros.
  at::Tensor gather(const at::Tensor& ids, int64_t row_numel, at::ScalarType dtype, at::Device device);
  /// rows (B, D): cache[ids] <- rows (stored in the cache dtype), and marks them seen.
  void set(const at::Tensor& ids, const at::Tensor& rows);
  /// The rows (N, D) themselves, for kernels that update them in place (rows ids, D = row_numel):
  /// when they are in memory, contiguous and on `device`; else undefined (file-backed, elsewhere).
  at::Tensor rows_in_place(const at::Tensor& ids, int64_t row_numel, at::Device device);
  /// Whether every id was written before (ids beyond the current size: no).
  bool all_seen(const at::Tensor& ids);
  /// Forgets every row (the file, if any, is kept; its rows count as unwritten).
  void reset();
  const SampleCacheOptions& options() const { return opt_; }
  /// Row size D (0 before the first write).
  int64_t row_numel() const;

 private:
  void ensure(int64_t row_numel, int64_t max_id, at::Device device);
  void map_file(int64_t row_numel);
  at::Tensor rows() const;  // (N, D) in memory or over the mapping

  SampleCacheOptions opt_;
  std::string who_;
  Variable rows_;  // (N, D) in memory; empty when file-backed
  Variable seen_;  // (N) uint8
  // File backing.
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  int64_t map_row_numel_ = 0;
  int fd_ = -1;
};

}  // namespace stateful
}  // namespace tl
