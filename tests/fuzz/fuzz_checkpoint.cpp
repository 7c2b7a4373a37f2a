// Checkpoints (tapeline train --resume, eval, compare): the info reader, and a load into a small
// model and optimizer; a load that fails leaves the model as it was (load_checkpoint validates
// everything first).
#include <ATen/ATen.h>

#include "layers/io/checkpoint.h"
#include "layers/nn/linear.h"
#include "layers/optim/sgd.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(checkpoint) {
  const std::string path = tl::fuzz::write_file("checkpoint.safetensors", data, size);
  tl::read_checkpoint_info(path);
  tl::Linear model(3, 2, true, at::detail::createCPUGenerator(1));
  tl::GroupOptions o;
  o.lr = 0.1, o.momentum = 0.9;
  tl::SGD sgd(model.parameters(), o);
  const at::Tensor before = model.parameters()[0].data().clone();
  tl::CheckpointLoadOptions lo;
  lo.restore_rng = false;
  try {
    tl::load_checkpoint(path, model, &sgd, nullptr, lo);
  } catch (const std::exception&) {
    TL_FUZZ_CHECK(at::equal(before, model.parameters()[0].data()), "a failed load changed the model");
    throw;
  }
  TL_FUZZ_CHECK(model.parameters()[0].data().sizes() == before.sizes(), "a load changed a parameter's shape");
}
