#pragma once
// C10dChannel: the Channel (parallel/channel.h) of one process per pipeline rank, on a Transport
// (transport.h). A message is the payload as one Transport message, tagged with (step, kind,
// boundary, micro-batch) so that a receive that gets another message is an error naming both
// instead of a wrong decode; with statistics on, the reference tensor follows as a second,
// uncompressed message whose tag carries wire::kTagNoLink: not delayed by the emulated link, not
// counted in the boundary's bytes (Note [reference tensors]).

#include <string>
#include <vector>

#include "parallel/channel.h"
#include "parallel/ranks/transport.h"

namespace tl::ranks {

class C10dChannel final : public Channel {
 public:
  enum class Phase { Train, Evaluate };
  /// `ranks[p]`: the transport rank of pipeline rank p. `step`: the global step (training) or the
  /// evaluation batch's index, in tags and errors. `measured[b]`: whether boundary b's messages
  /// carry a reference (its measures_error() in training; all false in evaluation). `where`:
  /// "epoch 2 step 14", for error messages. Payloads are decoded onto `device`.
  C10dChannel(Transport& transport, std::vector<int> ranks, int64_t step, Phase phase, std::vector<bool> measured,
              std::string where, at::Device device);

  /// The next step's (or evaluation batch's) `step`, `measured` and `where`, as the constructor
  /// takes them: a channel made once runs step after step (Note [interpreters are kept]).
  void set_step(int64_t step, std::vector<bool> measured, std::string where);
  /// Where received payloads are decoded.
  at::Device device() const { return device_; }

  void send(int src, int dst, const MessageKey& key, StageMessage message, double now_s) override;
  std::optional<Delivered> recv(int src, int dst, const MessageKey& key, double now_s) override;

  /// The tag of a message: (step, kind, boundary, micro-batch) in 62 bits.
  static int64_t tag(int64_t step, Phase phase, const MessageKey& key, bool reference);

 private:
  std::string context(const MessageKey& key) const;
  Transport& transport_;
  std::vector<int> ranks_;
  int64_t step_;
  Phase phase_;
  std::vector<bool> measured_;
  std::string where_;
  at::Device device_;
};

}  // namespace tl::ranks
