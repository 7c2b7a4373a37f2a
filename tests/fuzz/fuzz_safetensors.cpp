// safetensors files (pretrained weights, checkpoints): the header reader and the loader; every
// tensor loaded has the shape and dtype its header declares, and no more bytes than the file.
#include "layers/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(safetensors) {
  const std::string path = tl::fuzz::write_file("model.safetensors", data, size);
  const tl::SafetensorsHeader header = tl::read_safetensors_header(path);
  tl::safetensors_metadata(path);
  const tl::TensorMap tensors = tl::load_safetensors(path);
  TL_FUZZ_CHECK(tensors.size() == header.tensors.size(), "loaded a different number of tensors than the header lists");
  for (const tl::SafetensorsEntry& e : header.tensors) {
    auto it = tensors.find(e.name);
    TL_FUZZ_CHECK(it != tensors.end(), e.name + " is in the header but was not loaded");
    const at::Tensor& t = it->second;
    TL_FUZZ_CHECK(t.sizes() == at::IntArrayRef(e.shape) && t.scalar_type() == e.dtype, e.name + ": shape or dtype differs");
    TL_FUZZ_CHECK(static_cast<uint64_t>(t.nbytes()) == e.end - e.begin && e.end <= size, e.name + ": byte range");
  }
}
