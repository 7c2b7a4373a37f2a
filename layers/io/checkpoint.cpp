#include "layers/io/checkpoint.h"

#include "layers/nn/tensor_parallel.h"

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>
#include <set>

#include "layers/io/safetensors.h"

namespace tl {
namespace {

const char* const kFormat = "tapeline.checkpoint";
const char* const kVersion = "1";

int64_t cuda_device_count() {
  if (!at::hasCUDA() || !c10::impl::hasDeviceGuardImpl(at::kCUDA)) return 0;
  return c10::impl::getDeviceGuardImpl(at::kCUDA)->deviceCount();
}

at::Generator generator_for(const std::string& key) {
  if (key == "cpu") return at::globalContext().defaultGenerator(at::Device(at::kCPU));
  const auto idx = static_cast<c10::DeviceIndex>(std::stoi(key.substr(5)));  // "cuda.<i>"
  return at::globalContext().defaultGenerator(at::Device(at::kCUDA, idx));
}

at::Tensor get_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Splits "prefix.rest" entries into per-prefix maps with the prefix removed.
std::map<std::string, TensorMap> split(const TensorMap& all, const std::string& path) {
  static const std::set<std::string> known = {"model", "optim", "sched", "rng", "grid"};
  std::map<std::string, TensorMap> parts;
  for (const auto& [name, t] : all) {
    const auto dot = name.find('.');
    const std::string prefix = dot == std::string::npos ? name : name.substr(0, dot);
    TORCH_CHECK(dot != std::string::npos && known.count(prefix), "checkpoint '", path, "': unexpected entry '", name,
                "' (entries are model.*, optim.*, sched.*, rng.*, grid.*)");
    parts[prefix][name.substr(dot + 1)] = t;
  }
  return parts;
}

int64_t parse_counter(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  TORCH_CHECK(it != meta.end(), "checkpoint '", path, "': metadata has no '", key, "'");
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used == it->second.size() && used > 0 && v >= 0, "checkpoint '", path, "': metadata '", key, "' = '",
              it->second, "' is not a non-negative integer");
  return v;
}

CheckpointInfo info_from_metadata(const std::map<std::string, std::string>& meta, const std::string& path) {
  auto fmt = meta.find("format");
  TORCH_CHECK(fmt != meta.end() && fmt->second == kFormat, "checkpoint '", path,
              "': not a tapeline checkpoint (metadata 'format' is ",
              fmt == meta.end() ? std::string("absent") : "'" + fmt->second + "'", ", expected '", kFormat,
              "'); to read plain tensors use load_safetensors");
  auto ver = meta.find("version");
  TORCH_CHECK(ver != meta.end() && ver->second == kVersion, "checkpoint '", path, "': version ",
              ver == meta.end() ? std::string("absent") : "'" + ver->second + "'",
              " is not supported (this build reads ", kVersion, ")");
  CheckpointInfo info;
  info.step = parse_counter(meta, "step", path);
  info.epoch = parse_counter(meta, "epoch", path);
  for (const auto& [k, v] : meta)
    if (k.rfind("user.", 0) == 0) info.metadata[k.substr(5)] = v;
  return info;
}

void check_rng_state(const TensorMap& state) {
  const int64_t n_cuda = cuda_device_count();
  for (const auto& [key, t] : state) {
    const bool is_cpu = key == "cpu";
    bool is_cuda =
        key.rfind("cuda.", 0) == 0 && key.size() > 5 && key.find_first_not_of("0123456789", 5) == std::string::npos;
    TORCH_CHECK(is_cpu || is_cuda, "rng state: unexpected entry '", key, "' (expected cpu or cuda.<index>)");
    if (is_cuda && std::stoll(key.substr(5)) >= n_cuda) continue;  // device absent here: skipped
    TORCH_CHECK(t.scalar_type() == at::kByte && t.dim() == 1, "rng state '", key, "' must be a 1-D uint8 tensor, got ",
                t.scalar_type(), " ", t.sizes());
    const at::Tensor current = get_state(generator_for(key));
    TORCH_CHECK(t.numel() == current.numel(), "rng state '", key, "' has ", t.numel(),
                " bytes but this build's generator state has ", current.numel(),
                " (saved by a different libtorch version?)");
  }
}

}  // namespace

TensorMap rng_state() {
  TensorMap out;
  out["cpu"] = get_state(generator_for("cpu"));
  for (int64_t i = 0; i < cuda_device_count(); ++i) {
    const std::string key = "cuda." + std::to_string(i);
    out[key] = get_state(generator_for(key));
  }
  return out;
}

void set_rng_state(const TensorMap& state) {
  check_rng_state(state);
  const int64_t n_cuda = cuda_device_count();
  for (const auto& [key, t] : state) {
    if (key != "cpu" && std::stoll(key.substr(5)) >= n_cuda) continue;
    at::Generator gen = generator_for(key);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(t.contiguous());
  }
}

CheckpointContents checkpoint_contents(const Module& model, const Optimizer* optimizer, const LRScheduler* scheduler,
                                       const CheckpointInfo& info, bool save_rng) {
  TORCH_CHECK(info.step >= 0 && info.epoch >= 0, "checkpoint: step and epoch must be >= 0, got ", info.step, " and ",
              info.epoch);
  CheckpointContents c;
  for (const auto& [n, t] : model.state_dict()) c.tensors["model." + n] = t;
  c.metadata = {{"format", kFormat},
                {"version", kVersion},
                {"step", std::to_string(info.step)},
                {"epoch", std::to_string(info.epoch)}};
  if (optimizer) {
    for (const auto& [k, t] : optimizer->state_dict()) c.tensors["optim." + k] = t;
    c.metadata["optimizer"] = optimizer->name();
  }
  if (scheduler) {
    for (const auto& [k, t] : scheduler->state_dict()) c.tensors["sched." + k] = t;
    c.metadata["schedule"] = scheduler->schedule().describe();
  }
  if (save_rng)
    for (const auto& [k, t] : rng_state()) c.tensors["rng." + k] = t;
  for (const auto& [k, v] : info.metadata) c.metadata["user." + k] = v;
  return c;
}

void write_checkpoint(const std::string& path, const CheckpointContents& contents) {
  save_safetensors(path, contents.tensors, contents.metadata);
}

void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer,
                     const LRScheduler* scheduler, const CheckpointInfo& info, bool save_rng) {
  TORCH_CHECK(info.step >= 0 && info.epoch >= 0, "save_checkpoint('", path, "'): step and epoch must be >= 0, got ",
              info.step, " and ", info.epoch);
  write_checkpoint(path, checkpoint_contents(model, optimizer, scheduler, info, save_rng));
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  return info_from_metadata(safetensors_metadata(path), path);
}

CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                               const CheckpointLoadOptions& options) {
  const auto meta = safetensors_metadata(path);
  CheckpointInfo info = info_from_metadata(meta, path);
  auto parts = split(load_safetensors(path), path);
  if (options.part) {  // keep what the targets have
    const TensorMap own = model.state_dict();
    TensorMap& m = parts["model"];
    for (auto it = m.begin(); it != m.end();) it = own.count(it->first) ? std::next(it) : m.erase(it);
    if (optimizer) {
      std::set<std::string> names;
      for (const auto& g : optimizer->groups()) names.insert(g.names.begin(), g.names.end());
      static const std::string state = "state.";
      TensorMap& o = parts["optim"];
      for (auto it = o.begin(); it != o.end();) {
        const std::string& k = it->first;  // state.<parameter>.<slot> (slots have no dots) or groups.*
        const bool other = k.rfind(state, 0) == 0 && !names.count(k.substr(state.size(), k.rfind('.') - state.size()));
        it = other ? o.erase(it) : std::next(it);
      }
    }
  }

  if (options.tensor_size > 1) {  // whole tensors -> this tensor rank's parts
    TensorMap& m = parts["model"];
    TensorMap& o = parts["optim"];
    for (const auto& [name, shard] : options.shards) {
      auto it = m.find(name);
      if (it == m.end()) continue;  // reported as missing below
      const at::IntArrayRef whole = it->second.sizes();
      const std::string prefix = "state." + name + ".";
      for (auto& [k, t] : o)
        if (k.rfind(prefix, 0) == 0 && k.find('.', prefix.size()) == std::string::npos && t.sizes().equals(whole))
          t = shard_tensor(t, shard, options.tensor_rank, options.tensor_size).contiguous();
      it->second = shard_tensor(it->second, shard, options.tensor_rank, options.tensor_size).contiguous();
    }
  }

  // 1. Validate optimizer, scheduler and RNG state against their targets; nothing changes yet.
  //    (Optimizer state is checked against the parameters' current shapes.)
  if (optimizer) {
    auto it = meta.find("optimizer");
    TORCH_CHECK(it != meta.end(), "checkpoint '", path, "' holds no optimizer state, but an optimizer (",
                optimizer->name(), ") was given to restore; pass nullptr to load the model only");
    TORCH_CHECK(it->second == optimizer->name(), "checkpoint '", path, "' holds ", it->second,
                " state but the optimizer given is ", optimizer->name());
    try {
      optimizer->check_state_dict(parts["optim"]);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "checkpoint '", path, "': ", e.what_without_backtrace());
    }
  }
  if (scheduler) {
    TORCH_CHECK(!parts["sched"].empty(), "checkpoint '", path,
                "' holds no scheduler state, but a scheduler was given to restore; pass nullptr to skip it");
    try {
      scheduler->check_state_dict(parts["sched"]);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "checkpoint '", path, "': ", e.what_without_backtrace());
    }
  }
  if (options.restore_rng) {
    TORCH_CHECK(parts["rng"].count("cpu"), "checkpoint '", path,
                "' holds no RNG state (saved with save_rng=false); load with restore_rng=false");
    try {
      check_rng_state(parts["rng"]);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "checkpoint '", path, "': ", e.what_without_backtrace());
    }
  }

  // 2. The model validates everything before writing anything (missing, unexpected and
  //    mis-shaped entries), so a mismatch still leaves every target unchanged.
  try {
    model.load_state_dict(parts["model"], options.strict);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "': ", e.what_without_backtrace());
  }

  // 3. The rest was validated in step 1.
  if (optimizer) optimizer->load_state_dict(parts["optim"]);
  if (scheduler) scheduler->load_state_dict(parts["sched"]);  // after the optimizer: sets its lrs
  if (options.restore_rng) set_rng_state(parts["rng"]);
  return info;
}

}  // namespace tl
