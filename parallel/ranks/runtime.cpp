#include "parallel/ranks/runtime.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "autograd/autograd.h"
#include "layers/nn/norm.h"
#include "layers/optim/grad_utils.h"
#include "parallel/ranks/bytes.h"
#include "parallel/ranks/c10d_channel.h"
#include "parallel/ranks/fault.h"
#include "parallel/interpreter.h"

namespace tl::ranks {

namespace {

std::string where(int64_t epoch, int64_t step) {
  return "epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step);
}

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
const at::TensorImpl* impl_of(const Variable& v) { return v.data().unsafeGetTensorImpl(); }

// Transport errors say where the ranks they name sit in the grid (Note [rank layout]):
// "stage 1 of replica 0", "stages 1, 3" with virtual stages.
void name_ranks(Transport& transport, const Grid& grid, const StageLayout& layout) {
  transport.set_rank_names([grid, layout](int rank) {
    const std::vector<int> stages = layout.stages_of(grid.pipeline_rank(rank));
    std::string s = stages.size() > 1 ? "stages " : "stage ";
    for (size_t i = 0; i < stages.size(); ++i) s += (i ? ", " : "") + std::to_string(stages[i]);
    return s + (grid.data > 1 ? " of replica " + std::to_string(grid.replica(rank)) : std::string()) +
           (grid.tensor > 1 ? ", tensor rank " + std::to_string(grid.tensor_rank(rank)) : std::string());
  });
}

}  // namespace

DistExecutor::DistExecutor(Pipeline& pipeline, Transport& transport, LossFn loss_fn, const ScheduleSettings& settings,
                           const DataParallelOptions& dp, TensorParallelSync* tp)
    : pipeline_(pipeline), transport_(transport), loss_fn_(std::move(loss_fn)), schedule_(settings.schedule), tp_(tp) {
  const int stages = static_cast<int>(pipeline.num_stages()), v = settings.virtual_stages;
  TORCH_CHECK(stages % v == 0, "multi-process pipeline: ", v, " virtual stages per rank do not divide the model's ",
              stages, " stages");
  grid_ = Grid::of(transport.world_size(), stages / v, dp.replicas, tp ? tp->size() : 1);
  rank_ = grid_.pipeline_rank(transport.rank());
  replica_ = grid_.replica(transport.rank());
  tensor_rank_ = grid_.tensor_rank(transport.rank());
  shards_ = pipeline.named_shards();
  std::map<std::string, std::vector<int64_t>> split_shape;  // this rank's parts of split parameters
  for (const auto& [n, p] : pipeline.named_parameters())
    if (shards_.count(n)) split_shape[n] = p.sizes().vec();
  layout_ = settings.layout(stages);
  name_ranks(transport_, grid_, layout_);
  if (!pipeline.parameters().empty()) device_ = pipeline.parameters().front().device();
  ranks_ = grid_.pipeline_group(replica_, tensor_rank_);
  learn_structure();
  if (grid_.data > 1) {
    // Note [the gradients a rank sums] (data_parallel.h): its stages' parameters, tied ones left
    // out (summed over the world), the boundaries' learned codec weights in; its stages' buffers.
    std::vector<std::pair<std::string, Variable>> params, buffers;
    std::vector<bool> compressed;
    std::vector<std::vector<int>> holders;  // per parameter, the stages holding it (none: a codec's)
    for (SummedParameter& p : summed_parameters(
             pipeline, parameter_stages(pipeline), layout_, rank_,
             [this](const std::string& n) { return held_.count(n) > 0; }, dp)) {
      params.emplace_back(std::move(p.name), std::move(p.param));
      compressed.push_back(p.compressed);
      holders.push_back(std::move(p.stages));
    }
    std::set<const at::TensorImpl*> own_buffers;
    for (int s : layout_.stages_of(rank_))
      for (const auto& [n, b] : pipeline.stage(static_cast<size_t>(s))->named_buffers()) own_buffers.insert(impl_of(b));
    // Running averages and their decay (Note [running statistics across replicas]).
    std::map<const at::TensorImpl*, double> decay_of;
    for (size_t s = 0; s < pipeline.num_stages(); ++s)
      for (const auto& [n, m] : pipeline.stage(s)->named_modules())
        if (const auto* bn = dynamic_cast<const BatchNorm2d*>(m.get()))
          for (const Variable* b : {&bn->running_mean(), &bn->running_var()})
            if (b->defined()) decay_of[impl_of(*b)] = 1.0 - bn->momentum();
    std::vector<double> decay;
    for (const auto& [n, b] : pipeline.named_buffers()) {
      if (!own_buffers.count(impl_of(b))) continue;
      buffers.emplace_back(n, b);
      auto d = decay_of.find(impl_of(b));
      decay.push_back(d == decay_of.end() ? 0.0 : d->second);
    }
    dp_ = std::make_unique<DataParallelSync>(transport_, grid_.data_group(rank_, tensor_rank_), replica_, std::move(params),
                                             compressed, std::move(buffers), std::move(decay), dp.compression);
    dp_->set_bucket_bytes(dp.bucket_bytes);
    // Note [sums started during the backward]: on Gloo (NCCL: device gradients go by all-gather).
    if (dp.overlap && device_.is_cpu()) dp_->sum_during_backward(std::move(holders));
  } else {
    const std::string problem = dp_codec_problem(dp.compression);
    TORCH_CHECK(problem.empty(), "dp.compression = ", dp.compression, ": ", problem);
  }
  checkpoint_ = std::make_unique<GridCheckpoint>(pipeline_, transport_, grid_, layout_, owner_, shards_,
                                                 std::move(split_shape), dp_.get(), tp_);
}

void DistExecutor::learn_structure() {
  // Note [the grid's parameters]. Each rank built only its stages (Note [building only some
  // stages]), so no rank sees the whole model: every rank lists, per stage it holds, its
  // parameters (name, numel) and buffers, and its boundaries' learned weights; every rank then
  // knows which pipeline rank owns each entry (checkpoints), which parameters are tied between
  // ranks (GPT-2's wte), and every parameter's slot in the in-process order (model parameters by
  // first stage holding them, then the boundaries' by boundary), which the global gradient norm
  // sums in.
  std::string mine;
  const std::vector<int> own = layout_.stages_of(rank_);
  put(mine, static_cast<int64_t>(own.size()));
  for (int s : own) {
    put(mine, static_cast<int64_t>(s));
    for (const bool parameters : {true, false}) {
      const auto entries = parameters ? pipeline_.stage(static_cast<size_t>(s))->named_parameters()
                                      : pipeline_.stage(static_cast<size_t>(s))->named_buffers();
      put(mine, static_cast<int64_t>(entries.size()));
      for (const auto& [n, v] : entries) {
        put(mine, static_cast<int64_t>(n.size()));
        put(mine, n.data(), n.size());
        // A parameter split over the tensor ranks counts whole (Note [tensor-parallel blocks]).
        const bool split = parameters && shards_.count("model." + n);
        put(mine, static_cast<int64_t>(v.numel()) * (split ? grid_.tensor : 1));
      }
    }
  }
  std::vector<std::pair<std::string, int64_t>> codec_params;  // this rank's boundaries' learned weights
  for (const auto& [n, p] : pipeline_.named_parameters())
    if (n.rfind("model.", 0) != 0) codec_params.emplace_back(n, p.numel());
  put(mine, static_cast<int64_t>(codec_params.size()));
  for (const auto& [n, numel] : codec_params) {
    put(mine, static_cast<int64_t>(n.size()));
    put(mine, n.data(), n.size());
    put(mine, numel);
  }
  put(mine, static_cast<int64_t>(shards_.size()));  // how this rank's split parameters are split
  for (const auto& [n, shard] : shards_) {
    put(mine, static_cast<int64_t>(n.size()));
    put(mine, n.data(), n.size());
    put(mine, shard.dim);
    put(mine, shard.groups);
  }
  const std::string what = "building the grid: which ranks hold which parameters";
  const std::vector<std::string> gathered = transport_.gather_bytes(mine, 0, what);
  std::string all;
  for (const auto& g : gathered) put(all, static_cast<int64_t>(g.size())), put(all, g.data(), g.size());
  all = transport_.broadcast_bytes(all, 0, what);

  // Replica 0's lists (every replica holds the same stages).
  std::map<int, std::vector<std::pair<std::string, int64_t>>> params_of_stage;  // stage -> (name, numel)
  std::map<int, std::vector<std::string>> buffers_of_stage;
  std::map<std::string, std::vector<std::string>> codec_lists;  // "boundaries.<i>" -> names, from the first rank
  Reader top{all, 0, what};
  for (int r = 0; r < grid_.world(); ++r) {
    std::string bytes(static_cast<size_t>(top.get<int64_t>()), '\0');
    top.get(bytes.data(), bytes.size());
    Reader in{bytes, 0, what};
    auto get_name = [&] {
      std::string n(static_cast<size_t>(in.get<int64_t>()), '\0');
      in.get(n.data(), n.size());
      return n;
    };
    for (int64_t k = 0, stages = in.get<int64_t>(); k < stages; ++k) {
      const int s = static_cast<int>(in.get<int64_t>());
      for (const bool parameters : {true, false}) {
        for (int64_t e = 0, count = in.get<int64_t>(); e < count; ++e) {
          std::string n = "model." + get_name();
          const int64_t numel = in.get<int64_t>();
          if (grid_.replica(r) != 0 || grid_.tensor_rank(r) != 0) continue;
          if (parameters)
            params_of_stage[s].emplace_back(std::move(n), numel);
          else
            buffers_of_stage[s].push_back(std::move(n));
        }
      }
    }
    std::map<std::string, std::vector<std::string>> lists;
    for (int64_t e = 0, count = in.get<int64_t>(); e < count; ++e) {
      std::string n = get_name();
      const int64_t numel = in.get<int64_t>();
      numel_[n] = numel;
      const size_t dot = n.find('.', std::string("boundaries.").size());
      lists[n.substr(0, dot)].push_back(n);
    }
    for (int64_t e = 0, count = in.get<int64_t>(); e < count; ++e) {
      std::string n = get_name();
      TensorShard shard;
      shard.dim = in.get<int64_t>();
      shard.groups = in.get<int64_t>();
      shards_.emplace(std::move(n), shard);  // every rank's, so rank 0 can assemble checkpoints
    }
    for (auto& [b, names] : lists) {
      auto [it, fresh] = codec_lists.emplace(b, names);
      TORCH_CHECK(fresh || it->second == names, what, ": ", b, "'s learned weights differ between ranks (rank ", r,
                  " holds ", names.size(), ", an earlier rank ", it->second.size(), ")");
    }
  }
  order_.clear();
  owner_.clear();
  held_.clear();
  tied_.clear();
  model_parameters_ = 0;
  std::set<std::string> seen;
  for (const auto& [s, entries] : params_of_stage) {
    const int r = layout_.rank_of(s);
    for (const auto& [n, numel] : entries) {
      held_[n].insert(r);
      if (!seen.insert(n).second) continue;
      owner_[n] = r;
      numel_[n] = numel;
      order_.push_back(n);
      model_parameters_ += numel;
    }
  }
  for (const auto& [s, names] : buffers_of_stage)
    for (const auto& n : names) owner_.emplace(n, layout_.rank_of(s));
  // Boundaries in their order (Pipeline registers them "1", "2", ...: numerically).
  std::vector<std::pair<int, std::string>> boundaries;
  for (const auto& [b, names] : codec_lists) boundaries.emplace_back(std::stoi(b.substr(11)), b);
  std::sort(boundaries.begin(), boundaries.end());
  for (const auto& [i, b] : boundaries)
    for (const auto& n : codec_lists.at(b)) order_.push_back(n);
  for (const auto& n : order_)
    if (held_.count(n) && held_.at(n).size() > 1) tied_.push_back(n);
  for (auto it = held_.begin(); it != held_.end();) it = it->second.size() > 1 ? std::next(it) : held_.erase(it);
  for (size_t i = 0; i < order_.size(); ++i) slot_[order_[i]] = static_cast<int64_t>(i);
}

void run_probe(Pipeline& pipeline, const StageLayout& layout, Transport& transport, int replicas, const Batch& batch,
               const LossFn& loss_fn, int tensor) try {
  NoGradGuard no_grad;
  const Grid grid = Grid::of(transport.world_size(), layout.ranks, replicas, tensor);
  const int rank = grid.pipeline_rank(transport.rank());
  name_ranks(transport, grid, layout);
  C10dChannel channel(transport, grid.pipeline_group(grid.replica(transport.rank()), grid.tensor_rank(transport.rank())), 0,
                      C10dChannel::Phase::Evaluate, std::vector<bool>(pipeline.boundaries().size(), false),
                      "checking the model on two training samples", batch.input.device());
  const MicroBatches one = evaluation_batch(batch);  // the interpreter keeps a reference
  RankInterpreter interpreter(pipeline, layout, rank,
                              cached_forward_only_schedule(layout).at(static_cast<size_t>(rank)), loss_fn, channel,
                              RankInterpreter::Mode::Evaluate);
  interpreter.begin(one);
  interpreter.run();
  transport.barrier("checking the model on two training samples");
} catch (const TransportError& e) {
  throw TransportError(std::string(e.what()) + " [before training: checking the model on two training samples]",
                       e.peer(), e.context(), e.suspects());
}

// ---- training -------------------------------------------------------------------------------------

struct DistExecutor::TrainRank {
  C10dChannel channel;
  std::unique_ptr<RankInterpreter> interpreter;
};

DistExecutor::~DistExecutor() = default;

DistExecutor::TrainRank& DistExecutor::train_rank(int micro_batches, at::Device device) {
  std::unique_ptr<TrainRank>& kept = train_ranks_[micro_batches];
  if (kept && kept->channel.device() == device) return *kept;
  kept.reset(new TrainRank{C10dChannel(transport_, ranks_, 0, C10dChannel::Phase::Train, {}, "", device), nullptr});
  kept->interpreter = std::make_unique<RankInterpreter>(
      pipeline_, layout_, rank_, cached_schedule(schedule_, layout_, micro_batches).at(static_cast<size_t>(rank_)),
      loss_fn_, kept->channel, RankInterpreter::Mode::Train);
  if (dp_ && dp_->sums_during_backward()) {
    kept->interpreter->set_on_stage_done([this](int s) { dp_->stage_done(s); });
    kept->interpreter->set_on_leaf_final([this](int s, VariableImpl* leaf) { dp_->leaf_final(s, leaf); });
  }
  return *kept;
}

StepResult DistExecutor::train_step(const Batch& batch, int64_t micro_batches, const StepPosition& at,
                                    StepTiming* timing) {
  const auto t_step = std::chrono::steady_clock::now();
  const int64_t step = at.step;
  const MicroBatches all = split_micro_batches(batch, micro_batches, at);
  const std::string at_step = where(at.epoch, step);
  last_step_ = step;
  set_fault_step(step);  // Note [fault injection]
  // Note [data parallelism]: this replica's share of the micro-batches.
  const int D = grid_.data;
  TORCH_CHECK(all.size() % D == 0, "parallel.dp = ", D, ": the step's ", all.size(),
              " micro-batches (train.micro_batches) do not split evenly among the replicas; use a multiple of ", D);
  MicroBatches split;
  const int share = all.size() / D;
  for (int i = replica_ * share; i < (replica_ + 1) * share; ++i) {
    split.batches.push_back(all.batches[static_cast<size_t>(i)]);
    split.contexts.push_back(all.contexts[static_cast<size_t>(i)]);
  }
  // The step's loss units, from the batch every rank holds (integer counts: the same sum in any
  // order as the replicas' sum below), so that gradients can be scaled as soon as they are final
  // (Note [sums started during the backward] in data_parallel.h).
  double batch_units = 0;
  for (const Batch& mb : all.batches) batch_units += mb.weight();
  TORCH_CHECK(batch_units > 0, "train_step: the batch has no loss units (every target ignored)");
  if (dp_) dp_->begin_step(step, at_step, 1.0 / batch_units);
  std::vector<at::Tensor> buffers_before;
  if (dp_ && dp_->has_buffers()) buffers_before = dp_->snapshot_buffers();
  std::vector<bool> measured;
  for (const auto& b : pipeline_.boundaries()) measured.push_back(b->measures_error());
  TrainRank& kept = train_rank(split.size(), batch.input.device());
  kept.channel.set_step(step, std::move(measured), at_step);
  if (tp_) tp_->set_phase(step, at_step, true, true);
  RankInterpreter& interpreter = *kept.interpreter;
  interpreter.begin(split);
  interpreter.run();  // a process waits for its messages: it returns when the list is done

  // As Pipeline::train_step: the gradient of the mean loss over the batch's units (of every
  // replica), tied parameters' parts summed first; then the replicas' sum.
  const auto t_sync = std::chrono::steady_clock::now();
  fault_point(FaultPhase::AllReduce, step, &transport_, false, at_step + ", the step's loss tally");
  const auto [t, units] = sum_tallies(interpreter.tally(), interpreter.units(), at_step + ", the step's loss");
  TORCH_CHECK(units == batch_units, "train_step: the replicas' first stages counted ", units,
              " loss units; the batch holds ", batch_units, " (the ranks were given different batches)");
  reduce_tied_grads(step);
  std::vector<Variable> unscaled;  // those the data-parallel sum has not scaled already
  for (const Variable& p : pipeline_.parameters())
    if (!dp_ || !dp_->scaled(p)) unscaled.push_back(p);
  scale_grads(unscaled, 1.0 / units);
  if (dp_) {
    dp_->reduce_gradients(step, at_step);
    if (dp_->has_buffers()) dp_->sync_buffers(step, at_step, buffers_before, share);
  }
  const double sync_s = seconds_since(t_sync);
  const double step_s = seconds_since(t_step);
  StepResult r;
  r.units = units;
  r.loss = t.loss_sum / units;
  r.correct = t.correct;
  r.rows = batch.rows();
  r.micro_batches = split.size();
  if (timing) {
    timing->step_s = step_s;
    timing->compute_s = {interpreter.compute_s()};
    timing->comm_s = {interpreter.comm_s() + (dp_ ? sync_s : 0.0)};  // TP all-reduces count as compute (inside the blocks)
    timing->forward_s = {interpreter.forward_s()};
    timing->weight_s = {interpreter.weight_s()};
    timing->held_for_weights_bytes = {interpreter.held_for_weights_peak()};
  }
  return r;
}

void DistExecutor::reduce_tied_grads(int64_t step) {
  if (tied_.empty()) return;
  NoGradGuard no_grad;
  std::map<std::string, Variable> params;
  for (const auto& [n, v] : pipeline_.named_parameters()) params[n] = v;
  // One flat all-reduce over the world: every rank contributes each tied gradient, zeros where it
  // has none (or does not hold the parameter: Note [the grid's parameters]).
  std::vector<at::Tensor> parts;
  for (const auto& name : tied_) {
    auto it = params.find(name);
    // The tensor ranks of a stage hold the same gradient of a replicated parameter: one counts.
    at::Tensor g = it != params.end() && tensor_rank_ == 0 ? it->second.grad() : at::Tensor();
    parts.push_back(g.defined() ? g.reshape(-1)
                                : at::zeros({numel_.at(name)}, at::TensorOptions().dtype(at::kFloat).device(device_)));
  }
  at::Tensor flat = at::cat(parts);
  transport_.all_reduce_sum(flat, "step " + std::to_string(step) + ", summing tied parameters' gradients");
  int64_t at = 0;
  for (const auto& name : tied_) {
    const int64_t n = numel_.at(name);
    auto it = params.find(name);
    if (it != params.end()) {
      Variable p = it->second;
      p.set_grad(flat.narrow(0, at, n).view(p.sizes()).clone());
    }
    at += n;
  }
}

double DistExecutor::clip_grad_norm(double max_norm, int64_t step) {
  NoGradGuard no_grad;
  // Every parameter of the whole pipeline has a slot, in the in-process order (Note [the grid's
  // parameters]); the one rank that counts a parameter fills its slot (its norm, and that it has a
  // gradient), zeros elsewhere, so the all-reduced sums are exact and the total is formed as
  // clip_grad_norm forms it in one process over Pipeline::parameters() (same order, same ops).
  // Tied parameters count on the first rank holding them (every holder has the summed gradient);
  // replicas hold equal gradients after the data-parallel sum: replica 0's count. A parameter
  // split over the tensor ranks counts the squares of every rank's part (its norm is the root of
  // their sum); a replicated one counts on tensor rank 0.
  const int64_t n = static_cast<int64_t>(order_.size());
  std::vector<at::Tensor> grads, mine, mine_split;
  std::vector<int64_t> index, index_split;
  for (const auto& [name, p] : pipeline_.named_parameters()) {
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    auto held = held_.find(name);
    const bool split = shards_.count(name) > 0;
    if (replica_ != 0 || (held != held_.end() && *held->second.begin() != rank_) || (!split && tensor_rank_ != 0))
      continue;
    auto slot = slot_.find(name);
    TORCH_CHECK(slot != slot_.end(), "clip_grad_norm: parameter '", name,
                "' has a gradient but was not listed when the grid was built");
    const at::Tensor norm = g.norm(2.0).to(at::kFloat).reshape({1});
    (split ? mine_split : mine).push_back(split ? norm * norm : norm);
    (split ? index_split : index).push_back(slot->second);
  }
  // On the parameters' device (NCCL reduces device tensors).
  at::Tensor slots = at::zeros({3, n}, at::TensorOptions().dtype(at::kFloat).device(device_));  // norms; has a gradient; squares of split ones
  if (!mine.empty()) {
    const at::Tensor idx = at::tensor(index, at::kLong).to(device_);
    slots[0].index_put_({idx}, at::cat(mine).to(device_));
    slots[1].index_fill_(0, idx, 1.0f);
  }
  if (!mine_split.empty()) {
    const at::Tensor idx = at::tensor(index_split, at::kLong).to(device_);
    slots[2].index_put_({idx}, at::cat(mine_split).to(device_));
    slots[1].index_fill_(0, idx, 1.0f);
  }
  transport_.all_reduce_sum(slots, "step " + std::to_string(step) + ", global gradient norm");
  if (grid_.tensor > 1) slots[0] += slots[2].sqrt();  // the has-gradient row counts ranks, not 0/1: tested > 0
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

Tally DistExecutor::evaluate(int64_t count, const std::function<Batch(int64_t)>& batch_at, bool compression) {
  at::Tensor tally;
  for (int64_t b = 0; b < count; ++b) {
    if (!evaluates(b)) continue;  // another replica's share
    const at::Tensor t = evaluate_batch(batch_at(b), compression, b);
    if (t.defined()) tally = tally.defined() ? tally + t : t;
  }
  return share_tally(tally, std::string("evaluation with compression ") + (compression ? "on" : "off"));
}

at::Tensor DistExecutor::evaluate_batch(const Batch& batch, bool compression, int64_t index) {
  NoGradGuard no_grad;
  ScopedInference inference(pipeline_, compression);
  const MicroBatches one = evaluation_batch(batch);
  C10dChannel channel(transport_, ranks_, index, C10dChannel::Phase::Evaluate,
                      std::vector<bool>(pipeline_.boundaries().size(), false),
                      "evaluation batch " + std::to_string(index + 1) + " after step " + std::to_string(last_step_),
                      batch.input.device());
  if (tp_)
    tp_->set_phase(index, "evaluation batch " + std::to_string(index + 1) + " after step " + std::to_string(last_step_),
                   false, compression);
  RankInterpreter interpreter(pipeline_, layout_, rank_,
                              cached_forward_only_schedule(layout_).at(static_cast<size_t>(rank_)), loss_fn_, channel,
                              RankInterpreter::Mode::Evaluate);
  interpreter.begin(one);
  interpreter.run();
  return interpreter.tally();
}

Tally DistExecutor::share_tally(const at::Tensor& tally, const std::string& context) {
  return sum_tallies(tally, 0.0, context).first;
}

std::pair<Tally, double> DistExecutor::sum_tallies(const at::Tensor& tally, double first_units,
                                                   const std::string& context) {
  // One all-reduce over the world: the last pipeline rank of each replica adds its tally, pipeline
  // rank 0 of each replica its first stage's units, every other rank zeros (with one replica the
  // sums are the contributions exactly).
  at::Tensor slots = at::zeros({4}, at::kDouble);
  double* w = slots.data_ptr<double>();
  if (last() && tally.defined() && tensor_rank_ == 0) {  // the tensor ranks of a stage hold the same tally
    const Tally t = Tally::from(tally);
    w[0] = t.loss_sum, w[1] = t.units, w[2] = t.correct;
  }
  if (rank_ == 0 && tensor_rank_ == 0) w[3] = first_units;
  at::Tensor on_device = slots.to(device_);
  transport_.all_reduce_sum(on_device, context);
  slots = on_device.to(at::kCPU);
  const double* r = slots.data_ptr<double>();
  Tally t;
  t.loss_sum = r[0], t.units = r[1], t.correct = r[2];
  return {t, r[3]};
}

EpochTotals DistExecutor::finish_epoch(const RankEpoch& epoch_here, int64_t epoch) {
  std::string mine;
  for (double v : {epoch_here.train_time_s, epoch_here.compute_s, epoch_here.comm_s}) put(mine, v);
  const DataParallelStats dp = dp_ ? dp_->stats() : DataParallelStats{};
  for (int64_t v : {dp.messages, dp.bytes, dp.raw_bytes}) put(mine, v);
  const TensorParallelStats tps = tp_ ? tp_->stats() : TensorParallelStats{};
  for (int64_t v : {tps.messages, tps.bytes, tps.raw_bytes, tps.all_reduces}) put(mine, v);
  put(mine, stages_hash());
  put(mine, peak_resident_bytes());
  put(mine, parameter_bytes(pipeline_));
  put(mine, epoch_here.optimizer_bytes);
  for (const auto& b : pipeline_.boundaries()) {
    const BoundaryStats s = b->stats();
    put_stats(mine, s.forward);
    put_stats(mine, s.backward);
  }
  if (dp_) dp_->reset_stats();
  if (tp_) tp_->reset_stats();
  const std::string what = "end of epoch " + std::to_string(epoch + 1) + ", gathering statistics";
  const std::vector<std::string> all = transport_.gather_bytes(mine, 0, what);
  EpochTotals out;
  std::string verdict;  // rank 0: empty, or why the replicas disagree
  if (transport_.rank() == 0) {
    std::vector<std::vector<BoundaryStats>> per_boundary(pipeline_.boundaries().size());
    std::vector<uint64_t> hashes;
    for (size_t rank = 0; rank < all.size(); ++rank) {
      Reader r{all[rank], 0, what};
      out.train_time_s.push_back(r.get<double>());
      out.compute_s.push_back(r.get<double>());
      out.comm_s.push_back(r.get<double>());
      out.data_parallel.messages += r.get<int64_t>();
      out.data_parallel.bytes += r.get<int64_t>();
      out.data_parallel.raw_bytes += r.get<int64_t>();
      out.tensor_parallel.messages += r.get<int64_t>();
      out.tensor_parallel.bytes += r.get<int64_t>();
      out.tensor_parallel.raw_bytes += r.get<int64_t>();
      r.get<int64_t>();  // the tensor-parallel all-reduces: counted, not reported per epoch
      hashes.push_back(r.get<uint64_t>());
      out.peak_rss_bytes.push_back(r.get<int64_t>());
      out.parameter_bytes.push_back(r.get<int64_t>());
      out.optimizer_bytes.push_back(r.get<int64_t>());
      for (auto& b : per_boundary) {
        BoundaryStats s;
        s.forward = get_stats(r);
        s.backward = get_stats(r);
        // The tensor ranks of a stage send the same boundary messages: tensor rank 0's count.
        if (grid_.tensor_rank(static_cast<int>(rank)) == 0) b.push_back(s);
      }
    }
    // Each direction is counted by its sender only, so the sum over ranks is the boundary's.
    for (const auto& b : per_boundary) out.boundaries.push_back(sum_boundary_stats(b));
    for (int p = 0; p < grid_.pipeline && verdict.empty(); ++p)
      for (int t = 0; t < grid_.tensor && verdict.empty(); ++t)
        for (int d = 1; d < grid_.data && verdict.empty(); ++d)
          if (hashes.at(static_cast<size_t>(grid_.rank_of(p, d, t))) !=
              hashes.at(static_cast<size_t>(grid_.rank_of(p, 0, t))))
            verdict = "the replicas disagree at the end of epoch " + std::to_string(epoch + 1) + ": pipeline rank " +
                      std::to_string(p) + " of replica " + std::to_string(d) + " (rank " +
                      std::to_string(grid_.rank_of(p, d, t)) +
                      ") holds other parameters or buffers than replica 0's (rank " +
                      std::to_string(grid_.rank_of(p, 0, t)) + ")";
  }
  if (grid_.data > 1) verdict = transport_.broadcast_bytes(verdict, 0, what + ", checking the replicas agree");
  TORCH_CHECK(verdict.empty(), verdict);
  return out;
}

// Note [levels of a multi-process run]: each direction's codec lives on the rank that sends with
// it, so every rank keeps the rows of the directions it sent (a direction it did not send moved 0
// bytes there) and rank 0 gathers them once per epoch: no collective per step. Merged as one
// process would report them: bytes summed over the replicas (each sends its share of the
// micro-batches), the level and label of replica 0's codec (whose state the checkpoint holds; the
// replicas' codecs see different messages and may differ), a stage's tensor ranks once (they send
// the same messages). With one replica the rows equal the in-process run's
// (MultiProcessTrain.AdaptiveLevelsAreThoseOfOneProcess).
void DistExecutor::synchronized(const Optimizer& optimizer) { checkpoint_->synchronized(optimizer); }

void DistExecutor::save_checkpoint(const std::string& path, const CheckpointContents& mine) {
  checkpoint_->save(path, mine, last_step_);
}

std::string DistExecutor::restore_rank_state(const std::string& path) { return checkpoint_->restore(path); }

std::vector<LevelRow> DistExecutor::gather_levels(std::vector<LevelRow> mine, int64_t epoch) {
  using json = nlohmann::json;
  json out = json::array();
  if (tensor_rank_ == 0)
    for (const LevelRow& r : mine)
      if (r.bytes > 0) out.push_back({r.step, r.epoch, r.boundary, r.direction == "forward", r.level, r.label, r.bytes});
  const std::vector<std::string> all = transport_.gather_bytes(
      out.dump(), 0, "end of epoch " + std::to_string(epoch + 1) + ", gathering the codecs' levels");
  std::map<std::tuple<int64_t, int64_t, bool>, LevelRow> merged;  // (step, boundary, backward)
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const bool replica0 = grid_.replica(static_cast<int>(rank)) == 0;
    for (const json& j : json::parse(all[rank])) {
      LevelRow r;
      r.step = j[0], r.epoch = j[1], r.boundary = j[2];
      r.direction = j[3].get<bool>() ? "forward" : "backward";
      r.level = j[4], r.label = j[5], r.bytes = j[6];
      auto [it, fresh] = merged.try_emplace({r.step, r.boundary, r.direction == "backward"}, r);
      if (fresh) continue;
      it->second.bytes += r.bytes;
      if (replica0) it->second.level = r.level, it->second.label = r.label;
    }
  }
  std::vector<LevelRow> rows;
  for (auto& [key, r] : merged) rows.push_back(std::move(r));
  return rows;
}

uint64_t DistExecutor::stages_hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const at::Tensor& t0) {
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0, n = t.numel() * t.element_size(); i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (size_t s = 0; s < pipeline_.num_stages(); ++s) {
    if (layout_.rank_of(static_cast<int>(s)) != rank_) continue;
    for (const auto& [n, p] : pipeline_.stage(s)->named_parameters()) mix(p.data());
    for (const auto& [n, b] : pipeline_.stage(s)->named_buffers()) mix(b.data());
  }
  return h;
}

}  // namespace tl::ranks
