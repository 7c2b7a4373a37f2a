#include "parallel/ranks/grid_checkpoint.h"

#include <cstring>

#include "layers/io/safetensors.h"
#include "parallel/ranks/bytes.h"
#include "parallel/ranks/fault.h"

namespace tl::ranks {

namespace {

// A tensor map between ranks of one build: name, dtype, shape, bytes (CPU copies).
std::string pack(const TensorMap& map) {
  std::string out;
  put(out, static_cast<int64_t>(map.size()));
  for (const auto& [name, t0] : map) {
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    put(out, static_cast<int64_t>(name.size()));
    put(out, name.data(), name.size());
    put(out, static_cast<int64_t>(t.scalar_type()));
    put(out, static_cast<int64_t>(t.dim()));
    for (int64_t s : t.sizes()) put(out, s);
    const size_t n = t.numel() * t.element_size();
    put(out, static_cast<int64_t>(n));
    if (n) put(out, t.data_ptr(), n);
  }
  return out;
}
TensorMap unpack(const std::string& bytes, const std::string& what) {
  Reader r{bytes, 0, what};
  TensorMap map;
  const int64_t count = r.get<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    std::string name(static_cast<size_t>(r.get<int64_t>()), '\0');
    r.get(name.data(), name.size());
    const auto dtype = static_cast<at::ScalarType>(r.get<int64_t>());
    std::vector<int64_t> shape(static_cast<size_t>(r.get<int64_t>()));
    for (auto& s : shape) s = r.get<int64_t>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
    const auto n = static_cast<size_t>(r.get<int64_t>());
    TORCH_CHECK(n == static_cast<size_t>(t.numel() * t.element_size()), "rank 0: ", what, ": entry '", name, "' has ",
                n, " bytes for shape ", t.sizes(), " (garbled)");
    if (n) r.get(t.data_ptr(), n);
    map[name] = t;
  }
  return map;
}

bool same_tensor(const at::Tensor& a0, const at::Tensor& b0) {
  if (a0.scalar_type() != b0.scalar_type() || !a0.sizes().equals(b0.sizes())) return false;
  if (a0.numel() == 0) return true;  // an empty tensor's data_ptr() is null, and memcmp(null, ...) is undefined
  const at::Tensor a = a0.detach().to(at::kCPU).contiguous(), b = b0.detach().to(at::kCPU).contiguous();
  return std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;  // bitwise (NaN == NaN)
}

}  // namespace

GridCheckpoint::GridCheckpoint(Pipeline& pipeline, Transport& transport, const Grid& grid, const StageLayout& layout,
                               const std::map<std::string, int>& owner,
                               const std::map<std::string, TensorShard>& shards,
                               std::map<std::string, std::vector<int64_t>> split_shape, DataParallelSync* dp,
                               TensorParallelSync* tp)
    : pipeline_(pipeline),
      transport_(transport),
      grid_(grid),
      layout_(layout),
      owner_(owner),
      shards_(shards),
      split_shape_(std::move(split_shape)),
      dp_(dp),
      tp_(tp) {
  rank_ = grid_.pipeline_rank(transport.rank());
  replica_ = grid_.replica(transport.rank());
  tensor_rank_ = grid_.tensor_rank(transport.rank());
}

at::Tensor GridCheckpoint::grid_shape() const {
  std::vector<int64_t> shape{grid_.pipeline, grid_.data, layout_.virtual_stages,
                             static_cast<int64_t>(layout_.placement)};
  if (grid_.tensor > 1) shape.push_back(grid_.tensor);
  return at::tensor(shape, at::kLong);
}

int GridCheckpoint::structural_owner(const std::string& key) const {
  if (key.rfind("model.", 0) == 0) {
    auto it = owner_.find(key.substr(6));
    return it == owner_.end() ? -1 : it->second;
  }
  static const std::string state = "optim.state.";
  if (key.rfind(state, 0) == 0) {
    const size_t dot = key.rfind('.');  // state.<parameter>.<slot>: slots have no dots
    auto it = owner_.find(key.substr(state.size(), dot - state.size()));
    return it == owner_.end() ? -1 : it->second;
  }
  return -1;
}

std::string GridCheckpoint::split_parameter(const std::string& key, const at::Tensor& value) const {
  if (shards_.empty()) return "";
  if (key.rfind("model.", 0) == 0) return shards_.count(key.substr(6)) ? key.substr(6) : "";
  static const std::string state = "optim.state.";
  if (key.rfind(state, 0) != 0) return "";
  const size_t dot = key.rfind('.');
  const std::string name = key.substr(state.size(), dot - state.size());
  auto it = split_shape_.find(name);
  return it != split_shape_.end() && value.sizes().equals(it->second) ? name : "";
}

void GridCheckpoint::synchronized(const Optimizer& optimizer) {
  reference_.clear();
  const CheckpointContents c = checkpoint_contents(pipeline_, &optimizer, nullptr, CheckpointInfo{}, false);
  for (const auto& [k, t] : c.tensors)
    if (structural_owner(k) < 0 && k.rfind("optim.groups.", 0) != 0) reference_[k] = t.detach().to(at::kCPU).clone();
}

TensorMap GridCheckpoint::part_for_checkpoint(const TensorMap& all) const {
  // Note [grid state in checkpoints]. Replica 0's state is the checkpoint's ordinary entries.
  // What other replicas hold differently, their boundary codecs' state, goes under
  // grid.replica<d>., and every rank's data-parallel codec state under grid.dp.<p>.<d>.
  TensorMap part;
  const std::string prefix = replica_ == 0 ? "" : "grid.replica" + std::to_string(replica_) + ".";
  for (const auto& [k, t] : all) {
    if (k.rfind("optim.groups.", 0) == 0 || k.rfind("sched.", 0) == 0 || k.rfind("rng.", 0) == 0) continue;
    const int owner = structural_owner(k);
    if (owner >= 0) {  // parameters, buffers, their optimizer state: equal on every replica
      if (owner != rank_ || replica_ != 0) continue;
      const std::string split = split_parameter(k, t);
      if (!split.empty())  // every tensor rank's part, assembled by rank 0
        part["grid.tpshard." + std::to_string(tensor_rank_) + "." + k] = t;
      else if (tensor_rank_ == 0)
        part[k] = t;
      continue;
    }
    if (tensor_rank_ != 0) continue;                           // codec state: the same on every tensor rank of a stage
    if (replica_ != 0 && k.rfind("model.", 0) != 0) continue;  // codec weights' optimizer state: equal too
    auto ref = reference_.find(k);
    if (ref == reference_.end() || !same_tensor(ref->second, t))
      part[prefix + k] = t;  // changed here
    else if (restored_.count(k))
      part["grid.base." + prefix.substr(5) + k] = t;  // as resumed: kept unless a rank of the replica changed it
  }
  if (dp_)
    for (const auto& [k, t] : dp_->codec_state())
      part["grid.dp." + std::to_string(rank_) + "." + std::to_string(replica_) +
           (grid_.tensor > 1 ? "." + std::to_string(tensor_rank_) : std::string()) + "." + k] = t;
  if (tp_)
    for (const auto& [k, t] : tp_->codec_state()) part["grid.tp." + std::to_string(transport_.rank()) + "." + k] = t;
  return part;
}

std::string GridCheckpoint::restore(const std::string& path) {
  restored_.clear();
  TensorMap mine, dp, tp;
  at::Tensor shape;
  const std::string replica_prefix = "grid.replica" + std::to_string(replica_) + ".";
  const std::string dp_prefix = "grid.dp." + std::to_string(rank_) + "." + std::to_string(replica_) +
                                (grid_.tensor > 1 ? "." + std::to_string(tensor_rank_) : std::string()) + ".";
  const std::string tp_prefix = "grid.tp." + std::to_string(transport_.rank()) + ".";
  for (auto& [k, t] : load_safetensors(path)) {
    if (k == "grid.shape") shape = t;
    if (replica_ != 0 && k.rfind(replica_prefix, 0) == 0) mine[k.substr(replica_prefix.size())] = t;
    if (k.rfind(dp_prefix, 0) == 0) dp[k.substr(dp_prefix.size())] = t;
    if (k.rfind(tp_prefix, 0) == 0) tp[k.substr(tp_prefix.size())] = t;
  }
  // (P, D, v, placement, T); checkpoints written before ZB-V have no placement (round robin),
  // before tensor parallelism no T (1).
  const int v = layout_.virtual_stages;
  const bool known = shape.defined() && shape.numel() >= 3 && shape.numel() <= 5;
  const int64_t placement = known && shape.numel() >= 4 ? shape[3].item<int64_t>() : 0;
  const int64_t saved_tensor = known && shape.numel() == 5 ? shape[4].item<int64_t>() : 1;
  const bool same_grid = known && shape[0].item<int64_t>() == grid_.pipeline &&
                         shape[1].item<int64_t>() == grid_.data && shape[2].item<int64_t>() == v &&
                         placement == static_cast<int64_t>(layout_.placement) && saved_tensor == grid_.tensor;
  const int64_t saved_replicas = known ? shape[1].item<int64_t>() : 1;
  if (!same_grid) {
    if (grid_.data == 1 && saved_replicas == 1 && grid_.tensor == 1 && saved_tensor == 1)
      return "";  // nothing per rank
    return "the checkpoint was written by " +
           (shape.defined() ? std::to_string(saved_replicas) + " replica(s) x " + std::to_string(saved_tensor) +
                                  " tensor rank(s) of another grid"
                            : std::string("one replica of one tensor rank")) +
           ", this run has " + std::to_string(grid_.data) + " replica(s) x " + std::to_string(grid_.tensor) +
           " tensor rank(s): every replica continues from replica 0's boundary codec state, and the state of "
           "dp.compression and tp.forward / tp.backward (error feedback, PowerSGD warm starts) starts from zero; "
           "resuming with the same grid, or with stateless codecs, is exact (docs/GRID.md)";
  }
  if (tp_) tp_->load_codec_state(tp);
  if (!mine.empty()) {
    TensorMap model_part;
    for (auto& [k, t] : mine) {
      TORCH_CHECK(k.rfind("model.", 0) == 0, "checkpoint ", path, ": grid entry '", replica_prefix, k,
                  "' is not a model entry");
      model_part[k.substr(6)] = t;
      restored_.insert(k);
    }
    try {
      pipeline_.load_state_dict(model_part, /*strict=*/false);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "checkpoint ", path, ": replica ", replica_, "'s codec state: ", e.what_without_backtrace());
    }
  }
  if (dp_) dp_->load_codec_state(dp);
  return "";
}

void GridCheckpoint::save(const std::string& path, const CheckpointContents& mine, int64_t last_step) {
  const std::string what = "checkpoint " + path + " after step " + std::to_string(last_step);
  // Note [fault injection]: rank 0 halfway through writing the file, the others as they send.
  if (transport_.rank() != 0) fault_point(FaultPhase::Checkpoint, -1, &transport_, true, what);
  const std::vector<std::string> parts = transport_.gather_bytes(pack(part_for_checkpoint(mine.tensors)), 0, what);
  if (transport_.rank() == 0) {
    CheckpointContents merged = mine;  // entries nobody changed, counters, rank 0's RNG state
    if (grid_.data > 1)                // one replica: nothing differs between ranks, the in-process file exactly
      merged.tensors["grid.shape"] = grid_shape();
    if (grid_.tensor > 1) merged.tensors["grid.shape"] = grid_shape();
    std::map<std::string, int> changed_by;
    TensorMap base;  // grid.base.<key>: a replica's state as resumed, under what its ranks changed
    std::map<std::string, std::vector<at::Tensor>> split;  // key -> every tensor rank's part
    for (int r = 0; r < grid_.world(); ++r) {
      for (auto& [k, t] : unpack(parts[static_cast<size_t>(r)], what)) {
        if (k.rfind("grid.base.", 0) == 0) {
          base["grid." + k.substr(10)] = t;
          continue;
        }
        if (k.rfind("grid.tpshard.", 0) == 0) {  // grid.tpshard.<t>.<key>
          const size_t dot = k.find('.', 13);
          auto& ps = split[k.substr(dot + 1)];
          ps.resize(static_cast<size_t>(grid_.tensor));
          ps.at(std::stoul(k.substr(13, dot - 13))) = t;
          continue;
        }
        if (structural_owner(k) < 0) {
          auto prev = changed_by.find(k);
          TORCH_CHECK(prev == changed_by.end() || same_tensor(merged.tensors.at(k), t), what, ": '", k,
                      "' was changed on rank ", prev == changed_by.end() ? -1 : prev->second, " and on rank ", r,
                      " to different values; a codec keeps one state entry on both ends of a boundary but updates "
                      "it differently, so no single checkpoint can hold it");
          changed_by[k] = r;
        }
        merged.tensors[k] = t;
      }
    }
    for (auto& [k, t] : base) merged.tensors.emplace(k, t);  // only where no rank sent a change
    for (auto& [k, ps] : split) {                            // whole tensors (Note [tensor-parallel blocks])
      const std::string name = k.rfind("model.", 0) == 0 ? k.substr(6) : k.substr(12, k.rfind('.') - 12);
      for (size_t t = 0; t < ps.size(); ++t)
        TORCH_CHECK(ps[t].defined(), what, ": tensor rank ", t, " sent no part of '", k, "'");
      auto shard = shards_.find(name);
      TORCH_CHECK(shard != shards_.end(), what, ": '", k, "' came in parts but '", name, "' is not split here");
      merged.tensors[k] = unshard_tensor(ps, shard->second);
    }
    MidWriteHook hook([&] { fault_point(FaultPhase::Checkpoint, -1, &transport_, false, what + ", half written"); });
    write_checkpoint(path, merged);
  }
  transport_.barrier(what + " written by rank 0");
}

}  // namespace tl::ranks
