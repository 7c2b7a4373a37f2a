#pragma once
// Random streams owned by modules: BufferedGenerator (a generator whose state is a checkpointed
// buffer, used on the host) and DropoutRng (the mask stream of one dropout site, drawing on the
// input's device).

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "layers/module.h"
#include "layers/nn/init.h"

namespace tl {

// Note [generators per purpose]
// A model's constructor takes one generator, for initialisation. A dropout site given that
// generator does not draw its masks from it: it forks its own stream at construction. The stream
// continues the generator's sequence from where it stands, and the generator itself is re-seeded
// from a hash of its state, so initialisation and masks never share numbers and two dropout sites
// never share a stream (a fresh createCPUGenerator(s) handed to a lone Dropout therefore draws
// exactly what torch draws after at::manual_seed(s)). Codecs own their RNG streams (RandK, quant's
// stochastic rounding: BufferedGenerator "generator" buffers), separate from both. A model built
// with a generator and dropout > 0 thus has "generator" buffers a pretrained checkpoint lacks:
// loaders that map foreign checkpoints should treat them as optional.
//
// The stream's state is a registered buffer of the owning module ("generator", uint8, the
// generator's get_state()), so state_dict() and checkpoints carry it and a resumed run draws the
// same masks. Without a generator a site has no stream and no buffer: it uses ATen's default
// generator of the input's device, as torch.nn.Dropout does (a checkpoint's rng.* entries hold
// that one).
//
// Masks are drawn on the input's device: a stream of the input's device type serves it directly;
// for any other device a generator of that device is seeded from the stream's next 64 bits, so a
// CUDA tensor never meets a CPU generator and the masks still follow from the checkpointed state.
// The state is written back to the buffer after each use (a new CPU tensor; a pinned,
// non-blocking copy when Module::to put the buffer on a GPU, so no host synchronisation) and read
// back only when something else changed the buffer (load_state_dict, Module::to), which is
// detected through the buffer's version counter and identity.

/// A generator used on the host whose state is a registered buffer of a module (so state_dict()
/// and checkpoints carry it). The generator object is the working copy: it is reloaded from the
/// buffer only when something else changed the buffer (load_state_dict, Module::to; seen through
/// the buffer's version counter and identity), and commit() writes it back, with a pinned
/// non-blocking copy when the buffer lives on a GPU. So a module on a GPU draws from its own
/// stream without a host synchronisation per call. Codecs (RandK, stochastic rounding) and
/// dropout sites use it.
class BufferedGenerator {
 public:
  BufferedGenerator() = default;
  /// Takes `gen` and registers its state (uint8, get_state()) on `owner` as buffer `name`.
  BufferedGenerator(at::Generator gen, Module& owner, const std::string& name);

  bool defined() const { return gen_.has_value(); }
  /// The generator, reloaded from the buffer first if the buffer changed.
  at::Generator& get();
  /// Writes the generator's state to the buffer.
  void commit();

 private:
  std::optional<at::Generator> gen_;
  Variable buffer_;
  const void* written_impl_ = nullptr;
  int64_t written_version_ = -1;
};

/// The mask stream of one dropout site (see the note).
class DropoutRng {
 public:
  DropoutRng() = default;
  /// Forks a stream off `gen` and registers its state on `owner` as buffer `name` (see the
  /// note); nullopt: no stream of its own and no buffer.
  DropoutRng(const init::Generator& gen, Module& owner, const std::string& name = "generator");

  bool has_stream() const { return stream_.defined(); }
  /// The generator for a mask on `device` (nullopt: ATen's default generator of `device`). Call
  /// commit() after drawing with it.
  std::optional<at::Generator> generator_for(at::Device device);
  /// Writes the stream's state to the buffer.
  void commit() { stream_.commit(); }
  /// Moves the stream to a sequence of its own for tensor-parallel rank `rank` (seeded from a hash
  /// of its state and the rank; rank 0 too), so the ranks' heads draw unrelated masks.
  void fork_for_rank(int64_t rank);

 private:
  BufferedGenerator stream_;
};

/// The next 64 random bits of `gen`, advancing it (CPU generators: their next draw; others: a
/// hash of the state, after which the generator is re-seeded).
uint64_t next_random64(at::Generator& gen);

}  // namespace tl
