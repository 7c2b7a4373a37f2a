#pragma once
// TensorParallelSync: the all-reduces of one tensor-parallel group (the T ranks that hold the same
// stages of one replica, split as Note [tensor-parallel blocks] in layers/nn/tensor_parallel.h
// says), over the transport, each optionally compressed by any codec: config tp.forward for the
// row-parallel outputs' sums (g), tp.backward for the column-parallel inputs' gradient sums (f).
//
// Note [compressed all-reduce]. Two definitions (config tp.algorithm):
//   allgather (every codec): each rank encodes its own partial sum, sends the payload to the
//     T - 1 others, decodes all T payloads (its own too) and adds them in rank order 0 .. T - 1.
//     Every rank forms the same sum of the same decoded tensors, so all hold the same bits.
//     Sent per rank and all-reduce: (T - 1) payloads of the whole tensor.
//   reduce_scatter (quant(...) only): the tensor, as (rows, C), is cut into T chunks of rows; rank
//     e's chunk j goes encoded to rank j, which decodes the T chunks j (its own too) and adds them
//     in rank order (reduce-scatter); then each rank encodes its summed chunk and sends it to the
//     others, and every rank decodes all T summed chunks, its own too (all-gather). Sent per rank:
//     (T - 1) chunk payloads twice, about 2 (T - 1) / T of one payload of the whole tensor: for
//     T = 4, 1.5 payloads instead of 3. The sum is quantised twice (once per partial sum, once as
//     a sum), as in EQuARX and Flash Communication.
// Note [uncompressed tensor-parallel sums]. Uncompressed (identity, or compression off), a CPU
// tensor is summed by all_reduce_in_rank_order (group_sum.h): reduce-scatter then all-gather over
// the group's messages, 2 (T - 1) / T of the tensor out of each rank as Gloo's ring all-reduce
// sends, and the sum in rank order, the same bits on every rank and as one process. (Gloo's own
// ring all-reduce would sum each chunk starting at a different rank, and the transport's
// collectives span the whole world, not a group.) Elsewhere (a CUDA tensor) allgather is used.
// Stateful codecs: each rank keeps, per site and direction, one codec per rank of the group. It
// encodes with its own (the sender's state: an ef(...) residual of its partial sum) and decodes
// rank e's payloads with the instance of e (the receiver's state of e's stream: EF21's A). All are
// deterministic functions of the payloads, so the copies agree. Codecs that need the micro-batch's
// sample ids (aqsgd) or transform activations (ae, subspace) are rejected (tp_codec_problem, from
// the traits of their registry records: compression/registry.h).
// The state of every instance is this rank's and goes into checkpoints under
// grid.tp.<rank>.<site>.<direction>.<sender>.<entry> (Note [grid state in checkpoints]).
//
// Evaluation: with compression off (the inference toggle, or tp.active_at_inference = false), the
// sums go uncompressed.

#include <map>
#include <string>
#include <vector>

#include "compression/codec_spec.h"
#include "compression/compressor.h"
#include "layers/nn/tensor_parallel.h"
#include "parallel/ranks/transport.h"

namespace tl::ranks {

/// Config [parallel] tp and [tp].
struct TensorParallelOptions {
  int size = 1;                         // parallel.tp: T
  CodecSpec forward;   // tp.forward: codec of the row-parallel outputs' all-reduce (identity)
  CodecSpec backward;  // tp.backward: codec of the column-parallel inputs' gradient all-reduce (identity)
  bool active_at_inference = true;      // tp.active_at_inference: tp.forward at evaluation
  std::string algorithm = "allgather";  // tp.algorithm: allgather | reduce_scatter (Note [compressed all-reduce])
};

/// Why `spec` cannot compress a tensor-parallel all-reduce with `algorithm` ("" if it can).
std::string tp_codec_problem(const CodecSpec& spec, const std::string& algorithm);
/// The same of a spec's text (its parse error, when it does not parse or build).
std::string tp_codec_problem(const std::string& text, const std::string& algorithm);

/// Bytes of tensor-parallel messages sent by this rank in training steps (evaluation and the
/// probe before training are not counted, as for the boundaries).
struct TensorParallelStats {
  int64_t messages = 0;
  int64_t bytes = 0;      // payload bytes sent (header and body, Payload::nbytes)
  int64_t raw_bytes = 0;  // what the same messages would have been uncompressed (float32 bodies)
  int64_t all_reduces = 0;
};

class TensorParallelSync : public TensorParallelComm {
 public:
  /// `group`: transport ranks of the group by tensor rank; `rank`: this rank's index in it;
  /// `sites`: the sublayers split here (TensorParallel::sites()). Errors: a codec that
  /// tp_codec_problem rejects.
  TensorParallelSync(Transport& transport, std::vector<int> group, int rank, const std::vector<std::string>& sites,
                     const TensorParallelOptions& options);

  at::Tensor all_reduce(const at::Tensor& x, const std::string& site, TpDirection direction) override;
  /// T, and this rank's index in the group.
  int size() const { return static_cast<int>(group_.size()); }
  int rank() const { return rank_; }

  /// What the next all-reduces belong to: `step` tags their messages, `where` names them in
  /// errors ("epoch 1 step 12"), `training` says whether codecs see training calls, `compress`
  /// whether the codecs apply at all (evaluation with compression off: no).
  void set_phase(int64_t step, const std::string& where, bool training, bool compress);

  const TensorParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  /// Every codec instance's state, keyed "<site>.<forward|backward>.<sender>.<entry>".
  TensorMap codec_state() const;
  /// Restores codec_state()'s entries; an unknown entry is an error (raised before anything changes).
  void load_codec_state(const TensorMap& state);

 private:
  struct Site {
    std::vector<CompressorPtr> forward, backward;  // one per sender rank
  };
  at::Tensor all_gather_sum(const at::Tensor& x, std::vector<CompressorPtr>* codecs, const std::string& what,
                            const CodecContext& ctx);
  at::Tensor reduce_scatter_sum(const at::Tensor& x, Compressor& codec, const std::string& what,
                                const CodecContext& ctx);
  // Sends `mine` to every other rank of the group and returns every rank's payload, by rank.
  void send_to(int peer, const Payload& p, const std::string& what, int64_t raw_bytes);
  Payload recv_from(int peer, const std::string& what);

  Transport& transport_;
  std::vector<int> group_;
  int rank_;
  TensorParallelOptions options_;
  std::map<std::string, Site> sites_;
  int64_t step_ = 0, calls_ = 0;
  std::string where_ = "before training";
  bool training_ = true, compress_ = true;
  TensorParallelStats stats_;
};

}  // namespace tl::ranks
