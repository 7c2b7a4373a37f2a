#include "parallel/dist/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "autograd/autograd.h"
#include "layers/optim/grad_utils.h"
#include "parallel/dist/c10d_channel.h"
#include "parallel/interpreter.h"

namespace tl::dist {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string where(int64_t epoch, int64_t step) {
  return "epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step);
}

// ---- byte strings for the gathers: a few doubles, boundary statistics, tensor maps --------------

void put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <class T>
void put(std::string& out, T v) {
  put(out, &v, sizeof(T));
}
struct Reader {
  const std::string& s;
  size_t at = 0;
  const std::string& what;
  void get(void* p, size_t n) {
    TORCH_CHECK(at + n <= s.size(), "rank 0: ", what, ": a rank sent ", s.size(), " bytes, too few (garbled)");
    std::memcpy(p, s.data() + at, n);
    at += n;
  }
  template <class T>
  T get() {
    T v;
    get(&v, sizeof(T));
    return v;
  }
};

void put_stats(std::string& out, const DirectionStats& d) {
  for (int64_t v : {d.messages, d.bytes, d.raw_bytes, d.last_bytes, d.last_raw_bytes, d.measured}) put(out, v);
  for (double v : {d.rel_error_mean, d.rel_error_last, d.density_mean, d.density_last}) put(out, v);
}
DirectionStats get_stats(Reader& r) {
  DirectionStats d;
  for (int64_t* v : {&d.messages, &d.bytes, &d.raw_bytes, &d.last_bytes, &d.last_raw_bytes, &d.measured})
    *v = r.get<int64_t>();
  for (double* v : {&d.rel_error_mean, &d.rel_error_last, &d.density_mean, &d.density_last}) *v = r.get<double>();
  return d;
}

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
    TORCH_CHECK(n == static_cast<size_t>(t.numel() * t.element_size()), "rank 0: ", what, ": entry '", name,
                "' has ", n, " bytes for shape ", t.sizes(), " (garbled)");
    if (n) r.get(t.data_ptr(), n);
    map[name] = t;
  }
  return map;
}

bool same_tensor(const at::Tensor& a0, const at::Tensor& b0) {
  if (a0.scalar_type() != b0.scalar_type() || !a0.sizes().equals(b0.sizes())) return false;
  const at::Tensor a = a0.detach().to(at::kCPU).contiguous(), b = b0.detach().to(at::kCPU).contiguous();
  return std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;  // bitwise (NaN == NaN)
}

const at::TensorImpl* impl_of(const Variable& v) { return v.data().unsafeGetTensorImpl(); }

}  // namespace

DistExecutor::DistExecutor(Pipeline& pipeline, Transport& transport)
    : pipeline_(pipeline), transport_(transport), rank_(transport.rank()), world_(transport.world_size()) {
  const int stages = static_cast<int>(pipeline.num_stages()), v = pipeline.virtual_stages();
  TORCH_CHECK(world_ * v == stages, "multi-process pipeline: ", world_, " ranks (WORLD_SIZE) but the model has ", stages,
              " stage", stages == 1 ? "" : "s", " (", pipeline.boundaries().size(), " cuts, model.cuts)",
              v > 1 ? " in " + std::to_string(v) + " virtual stages per rank" : std::string(), ": run ", stages / v,
              " ranks");
  layout_ = StageLayout::of(stages, v);
  for (int r = 0; r < world_; ++r) ranks_.push_back(r);
  // Which stages hold each parameter and buffer, by identity (stages are views of the model).
  std::map<const at::TensorImpl*, std::set<int>> ranks_of;
  for (size_t s = 0; s < pipeline.num_stages(); ++s) {
    const int r = layout_.rank_of(static_cast<int>(s));
    for (const auto& [n, p] : pipeline.stage(s)->named_parameters()) ranks_of[impl_of(p)].insert(r);
    for (const auto& [n, b] : pipeline.stage(s)->named_buffers()) ranks_of[impl_of(b)].insert(r);
  }
  auto note = [&](const std::string& name, const Variable& v, bool parameter) {
    auto it = ranks_of.find(impl_of(v));
    if (it == ranks_of.end()) return;  // a boundary's (codec state, learned codec weights)
    owner_[name] = *it->second.begin();
    if (parameter && it->second.size() > 1) tied_.push_back(name), held_[name] = it->second;
  };
  for (const auto& [n, v] : pipeline.named_parameters()) note(n, v, true);
  for (const auto& [n, v] : pipeline.named_buffers()) note(n, v, false);
}

// ---- training -------------------------------------------------------------------------------------

StepResult DistExecutor::train_step(const Batch& batch, int64_t micro_batches, const std::string& schedule_name,
                                    const Pipeline::LossFn& loss_fn, int64_t epoch, int64_t step, StepTiming* timing) {
  const auto t_step = std::chrono::steady_clock::now();
  const MicroBatches split = split_micro_batches(batch, micro_batches, epoch);
  const std::string at_step = where(epoch, step);
  std::vector<bool> measured;
  for (const auto& b : pipeline_.boundaries()) measured.push_back(b->measures_error());
  C10dChannel channel(transport_, ranks_, step, C10dChannel::Phase::Train, measured, at_step, batch.input.device());
  RankInterpreter interpreter(pipeline_, layout_, rank_,
                              make_schedule(schedule_name, layout_, split.size()).at(static_cast<size_t>(rank_)), split,
                              loss_fn, channel, RankInterpreter::Mode::Train);
  interpreter.run();  // a process waits for its messages: it returns when the list is done
  const double step_s = seconds_since(t_step);

  // As Pipeline::train_step: the gradient of the mean loss over the batch's units, tied
  // parameters' two parts summed first.
  const Tally t = share_tally(interpreter.tally(), at_step + ", the step's loss");
  const double units = interpreter.units();
  TORCH_CHECK(units > 0, "train_step: the batch has no loss units (every target ignored)");
  reduce_tied_grads(step);
  scale_grads(pipeline_.parameters(), 1.0 / units);
  StepResult r;
  r.units = units;
  r.loss = t.loss_sum / units;
  r.correct = t.correct;
  r.rows = batch.rows();
  r.micro_batches = split.size();
  if (timing) {
    timing->step_s = step_s;
    timing->compute_s = {interpreter.compute_s()};
    timing->comm_s = {interpreter.comm_s()};
  }
  return r;
}

void DistExecutor::reduce_tied_grads(int64_t step) {
  if (tied_.empty()) return;
  NoGradGuard no_grad;
  std::map<std::string, Variable> params;
  for (const auto& [n, v] : pipeline_.named_parameters()) params[n] = v;
  // One flat all-reduce: every rank contributes each tied gradient, zeros where it has none.
  std::vector<at::Tensor> parts;
  for (const auto& name : tied_) {
    const Variable& p = params.at(name);
    at::Tensor g = p.grad();
    parts.push_back(g.defined() ? g.reshape(-1) : at::zeros({p.numel()}, p.options()));
  }
  at::Tensor flat = at::cat(parts);
  transport_.all_reduce_sum(flat, "step " + std::to_string(step) + ", summing tied parameters' gradients");
  int64_t at = 0;
  for (const auto& name : tied_) {
    Variable p = params.at(name);
    const int64_t n = p.numel();
    if (held_.at(name).count(rank_)) p.set_grad(flat.narrow(0, at, n).view(p.sizes()).clone());
    at += n;
  }
}

double DistExecutor::clip_grad_norm(const std::vector<Variable>& params, double max_norm, int64_t step) {
  NoGradGuard no_grad;
  // Tied parameters count on the first stage holding them (both holders have the summed gradient).
  std::set<const at::TensorImpl*> counted_elsewhere;
  for (const auto& [n, v] : pipeline_.named_parameters()) {
    auto held = held_.find(n);
    if (held != held_.end() && *held->second.begin() != rank_) counted_elsewhere.insert(impl_of(v));
  }
  // Every parameter's norm (and whether it has a gradient) on every rank: one slot per parameter,
  // filled by the one rank that counts it, zeros elsewhere, so the all-reduced sums are exact and
  // the total is formed as clip_grad_norm forms it in process (same order, same ops).
  const int64_t n = static_cast<int64_t>(params.size());
  std::vector<at::Tensor> grads, mine;
  std::vector<int64_t> index;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor g = params[static_cast<size_t>(i)].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (counted_elsewhere.count(impl_of(params[static_cast<size_t>(i)]))) continue;
    mine.push_back(g.norm(2.0).to(at::kFloat).reshape({1}));
    index.push_back(i);
  }
  // On the parameters' device (NCCL reduces device tensors).
  const at::Device dev = n > 0 ? params[0].device() : at::Device(at::kCPU);
  at::Tensor slots = at::zeros({2, n}, at::TensorOptions().dtype(at::kFloat).device(dev));  // norms; has a gradient
  if (!mine.empty()) {
    const at::Tensor idx = at::tensor(index, at::kLong).to(dev);
    slots[0].index_put_({idx}, at::cat(mine).to(dev));
    slots[1].index_fill_(0, idx, 1.0f);
  }
  transport_.all_reduce_sum(slots, "step " + std::to_string(step) + ", global gradient norm");
  std::vector<at::Tensor> norms;
  const at::Tensor has_grad = slots[1].to(at::kCPU).contiguous();  // the step's one read-back
  const float* has = has_grad.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    if (has[i] > 0) norms.push_back(slots[0][i]);
  if (norms.empty()) return 0.0;
  const at::Tensor norm = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2.0);
  const at::Tensor coef = at::clamp_max(max_norm / (norm + 1e-6), 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.device()));
  return norm.item<double>();
}

// ---- evaluation -----------------------------------------------------------------------------------

at::Tensor DistExecutor::evaluate_batch(const Batch& batch, bool compression, const Pipeline::LossFn& loss_fn,
                                        int64_t index) {
  NoGradGuard no_grad;
  ScopedInference inference(pipeline_, compression);
  const MicroBatches one = evaluation_batch(batch);
  C10dChannel channel(transport_, ranks_, index, C10dChannel::Phase::Evaluate,
                      std::vector<bool>(pipeline_.boundaries().size(), false),
                      "evaluation batch " + std::to_string(index + 1), batch.input.device());
  RankInterpreter interpreter(pipeline_, layout_, rank_, forward_only_schedule(layout_).at(static_cast<size_t>(rank_)),
                              one, loss_fn, channel, RankInterpreter::Mode::Evaluate);
  interpreter.run();
  return interpreter.tally();
}

Tally DistExecutor::share_tally(const at::Tensor& tally, const std::string& context) {
  std::string bytes;
  if (last() && tally.defined()) {
    const Tally t = Tally::from(tally);
    for (double v : {t.loss_sum, t.units, t.correct}) put(bytes, v);
  }
  const std::string got = transport_.broadcast_bytes(bytes, world_ - 1, context);
  Tally t;
  if (got.empty()) return t;
  const std::string what = context;
  Reader r{got, 0, what};
  t.loss_sum = r.get<double>(), t.units = r.get<double>(), t.correct = r.get<double>();
  return t;
}

DistExecutor::EpochTotals DistExecutor::gather_epoch(double train_time_s, double compute_s, double comm_s,
                                                     int64_t epoch) {
  std::string mine;
  for (double v : {train_time_s, compute_s, comm_s}) put(mine, v);
  for (const auto& b : pipeline_.boundaries()) {
    const BoundaryStats s = b->stats();
    put_stats(mine, s.forward);
    put_stats(mine, s.backward);
  }
  const std::string what = "end of epoch " + std::to_string(epoch + 1) + ", gathering statistics";
  const std::vector<std::string> all = transport_.gather_bytes(mine, 0, what);
  EpochTotals out;
  if (rank_ != 0) return out;
  std::vector<std::vector<BoundaryStats>> per_boundary(pipeline_.boundaries().size());
  for (const std::string& bytes : all) {
    Reader r{bytes, 0, what};
    out.train_time_s.push_back(r.get<double>());
    out.compute_s.push_back(r.get<double>());
    out.comm_s.push_back(r.get<double>());
    for (auto& b : per_boundary) {
      BoundaryStats s;
      s.forward = get_stats(r);
      s.backward = get_stats(r);
      b.push_back(s);
    }
  }
  // Each direction is counted by its sender only, so the sum over ranks is the boundary's.
  for (const auto& b : per_boundary) out.boundaries.push_back(sum_boundary_stats(b));
  return out;
}

// ---- checkpoints ----------------------------------------------------------------------------------

int DistExecutor::structural_owner(const std::string& key) const {
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

void DistExecutor::synchronized(const Optimizer& optimizer) {
  reference_.clear();
  const CheckpointContents c = checkpoint_contents(pipeline_, &optimizer, nullptr, CheckpointInfo{}, false);
  for (const auto& [k, t] : c.tensors)
    if (structural_owner(k) < 0 && k.rfind("optim.groups.", 0) != 0) reference_[k] = t.detach().to(at::kCPU).clone();
}

TensorMap DistExecutor::part_for_checkpoint(const TensorMap& all) const {
  TensorMap part;
  for (const auto& [k, t] : all) {
    if (k.rfind("optim.groups.", 0) == 0 || k.rfind("sched.", 0) == 0 || k.rfind("rng.", 0) == 0) continue;
    const int owner = structural_owner(k);
    if (owner >= 0) {
      if (owner == rank_) part[k] = t;
      continue;
    }
    auto ref = reference_.find(k);
    if (ref == reference_.end() || !same_tensor(ref->second, t)) part[k] = t;  // changed here
  }
  return part;
}

void DistExecutor::save_checkpoint(const std::string& path, const CheckpointContents& mine) {
  const std::string what = "checkpoint " + path;
  const std::vector<std::string> parts = transport_.gather_bytes(pack(part_for_checkpoint(mine.tensors)), 0, what);
  if (rank_ == 0) {
    CheckpointContents merged = mine;  // entries nobody changed, counters, rank 0's RNG state
    std::map<std::string, int> changed_by;
    for (int r = 0; r < world_; ++r) {
      for (auto& [k, t] : unpack(parts[static_cast<size_t>(r)], what)) {
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
    write_checkpoint(path, merged);
  }
  transport_.barrier(what + " written by rank 0");
}

}  // namespace tl::dist
