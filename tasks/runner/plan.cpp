#include "tasks/runner/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "autograd/cost.h"
#include "layers/nn/init.h"
#include "layers/nn/tensor_parallel.h"
#include "parallel/device_model.h"
#include "parallel/executor.h"
#include "parallel/local_executor.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/tensor_parallel.h"
#include "parallel/stage_runtime.h"
#include "tasks/models.h"
#include "tasks/runner/experiment.h"
#include "tasks/runner/report.h"

namespace tl {

namespace {

at::TensorOptions meta(at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(at::kMeta); }

// A training batch of the task's shape: token ids (B, T) with next-token targets (lm) or class ids
// (text); images (B, C, H, W) with class ids (vision). On the meta device (`random` false: shapes
// only), or on the CPU with random ids and normal images. Units and sample ids stay on the CPU,
// as a real batch's do.
Batch shape_batch(const Config& config, const TaskShape& shape, bool random) {
  const int64_t B = config.train.batch_size;
  auto ids = [&](at::IntArrayRef size, int64_t high) {
    return random ? at::randint(high, size, at::kLong) : at::empty(size, meta(at::kLong));
  };
  Batch b;
  if (shape.input == TaskShape::Input::Tokens) {
    const bool lm = shape.output == TaskShape::Output::NextToken;
    const int64_t T = lm ? config.data.seq_len : config.data.max_length;
    b.input = ids({B, T}, shape.vocab_size);
    b.target = lm ? ids({B, T}, shape.vocab_size) : ids({B}, shape.num_classes);
    b.side.token_ids = b.input;
    b.units = lm ? at::full({B}, T, at::kLong) : at::ones({B}, at::kLong);
  } else {
    // The image side: data.image_size, else the dataset's (CIFAR 32, MNIST and Fashion-MNIST 28).
    const bool cifar = config.data.dataset.rfind("cifar", 0) == 0;
    TORCH_CHECK(config.data.image_size > 0 || cifar || config.data.dataset.find("mnist") != std::string::npos,
                "tapeline plan: data.dataset = ", config.data.dataset,
                " has no fixed image size; set data.image_size to plan it");
    const int64_t side = config.data.image_size > 0 ? config.data.image_size : (cifar ? 32 : 28);
    b.input = random ? at::randn({B, shape.channels, side, side})
                     : at::empty({B, shape.channels, side, side}, meta(at::kFloat));
    b.target = ids({B}, shape.num_classes);
    b.units = at::ones({B}, at::kLong);
  }
  b.sample_ids = at::arange(B, at::kLong);
  return b;
}

// Note [tensor parallelism in a plan]: one all-reduce as tensor rank 0 sends it.
struct TpAllReduce {
  int64_t bytes = 0, messages = 0;
  double seconds = 0;
  PayloadSize::Kind kind = PayloadSize::Kind::Exact;
};

// The communicator of a planned step's split blocks: counts each all-reduce (per pipeline stage of
// the site) and charges its time to the action running it; the sum is a meta tensor of the shape.
class PlanTpComm : public TensorParallelComm {
 public:
  explicit PlanTpComm(const Config& config)
      : T_(static_cast<int>(config.parallel.tp)),
        cuda_(config.run.device.rfind("cuda", 0) == 0),
        algorithm_(config.tp.algorithm),
        link_{config.tp.bandwidth_mbps, config.tp.latency_ms} {
    for (const auto& [key, spec] :
         {std::pair{"tp.forward", &config.tp.forward}, {"tp.backward", &config.tp.backward}}) {
      const std::string problem = ranks::tp_codec_problem(*spec, algorithm_);
      TORCH_CHECK(problem.empty(), "tapeline plan: ", key, " = ", *spec, ": ", problem);
      codecs_.push_back({key, *spec, spec->is_identity() ? nullptr : spec->build()});
    }
  }

  at::Tensor all_reduce(const at::Tensor& x, const std::string& site, TpDirection direction) override {
    const Codec& c = codecs_[direction == TpDirection::Forward ? 0 : 1];
    auto [it, fresh] = cache_.try_emplace({x.sizes().vec(), direction == TpDirection::Forward});
    if (fresh) it->second = cost(x.sizes().vec(), x.scalar_type(), c);
    const TpAllReduce& a = it->second;
    TpAllReduce& total = sites_[site];
    total.bytes += a.bytes, total.messages += a.messages, total.seconds += a.seconds;
    ++calls_[site];
    kind_ = PayloadSize::weaker(kind_, a.kind);
    // The rank waits for it inside the action that runs it: the action's clock moves by its time.
    if (CostMeter* m = CostMeter::current(); m && a.seconds > 0) m->add_seconds(a.seconds);
    return at::empty_like(x);
  }

  // Per site: tensor rank 0's bytes, messages and seconds, and the all-reduces, over the step.
  const std::map<std::string, TpAllReduce>& sites() const { return sites_; }
  int64_t calls(const std::string& site) const { return calls_.count(site) ? calls_.at(site) : 0; }
  PayloadSize::Kind kind() const { return kind_; }

 private:
  struct Codec {
    std::string key;
    CodecSpec spec;
    CompressorPtr codec;  // null: identity
  };

  double round_s(int64_t largest) const {  // a round: its messages side by side, one per link
    return (link_.bandwidth_mbps > 0 ? 8.0 * static_cast<double>(largest) / (link_.bandwidth_mbps * 1e6) : 0.0) +
           link_.latency_ms / 1e3;
  }

  PayloadSize size(const Codec& c, const std::vector<int64_t>& shape, at::ScalarType dtype) const {
    std::string why;
    try {
      return (c.codec ? c.codec : identity_compressor())->payload_size(shape, dtype);
    } catch (const c10::Error& e) {
      why = e.what_without_backtrace();
    }
    TORCH_CHECK(false, "tapeline plan: ", c.key, " = ", c.spec, " cannot be sized for a tensor-parallel all-reduce of ",
                c10::IntArrayRef(shape), " (Note [sizing a payload]): ", why);
    return {};
  }

  // parallel/ranks/tensor_parallel.cpp's all_reduce, as tensor rank 0 runs it in training.
  TpAllReduce cost(const std::vector<int64_t>& shape, at::ScalarType dtype, const Codec& c) const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
    TpAllReduce a;
    if (!c.codec && !cuda_) {  // Note [uncompressed tensor-parallel sums]: all_reduce_in_rank_order
      if (T_ == 2) {
        a.bytes = n * elem, a.messages = 1, a.seconds = round_s(n * elem);
      } else {  // chunk 0 is the smallest, the last the largest
        const int64_t own = n / T_, largest = n - n * (T_ - 1) / T_;
        a.bytes = (n - own + (T_ - 1) * own) * elem, a.messages = 2 * (T_ - 1), a.seconds = 2 * round_s(largest * elem);
      }
      return a;
    }
    if (!c.codec || algorithm_ == "allgather") {  // its payload to each of the others
      const PayloadSize p = size(c, shape, dtype);
      a.bytes = (T_ - 1) * p.bytes, a.messages = T_ - 1, a.seconds = round_s(p.bytes), a.kind = p.kind;
      return a;
    }
    // reduce_scatter: the (rows, C) chunks of rows r (j + 1) / T - r j / T.
    const int64_t cols = shape.empty() ? 1 : shape.back(), rows = n / std::max<int64_t>(cols, 1);
    TORCH_CHECK(rows >= T_, "tapeline plan: tp.algorithm = reduce_scatter needs at least ", T_,
                " rows (tokens) to cut into ", T_, " chunks, a tensor of ", c10::IntArrayRef(shape), " has ", rows,
                "; use tp.algorithm = allgather");
    int64_t largest = 0;
    for (int j = 0; j < T_; ++j) {
      const PayloadSize p = size(c, {rows * (j + 1) / T_ - rows * j / T_, cols}, dtype);
      a.bytes += (j == 0 ? T_ - 1 : 1) * p.bytes, a.kind = PayloadSize::weaker(a.kind, p.kind);
      largest = std::max(largest, p.bytes);
    }
    a.messages = 2 * (T_ - 1), a.seconds = 2 * round_s(largest);
    return a;
  }

  int T_;
  bool cuda_;
  std::string algorithm_;
  LinkSpec link_;
  std::vector<Codec> codecs_;                                           // forward, backward
  std::map<std::pair<std::vector<int64_t>, bool>, TpAllReduce> cache_;  // by shape and direction
  std::map<std::string, TpAllReduce> sites_;
  std::map<std::string, int64_t> calls_;
  PayloadSize::Kind kind_ = PayloadSize::Kind::Exact;
};

// What one step of a config runs on, assembled as `train` assembles it: the task, the model (on
// the meta device for a plan), the boundaries with their codecs, the pipeline and the in-process
// executor with the config's schedule, links and device model. Heap-held parts: the executor
// refers to the pipeline and the task.
struct StepSetup {
  std::unique_ptr<Task> task;
  TaskShape shape;
  BuiltModel built;
  int64_t parameters = 0;               // the whole model's (before a tensor-parallel split)
  std::shared_ptr<PlanTpComm> tp_comm;  // parallel.tp > 1 (Note [tensor parallelism in a plan])
  std::shared_ptr<Pipeline> pipeline;
  ScheduleSettings settings;
  std::unique_ptr<LocalExecutor> executor;
};

StepSetup assemble(const Config& config, bool on_meta, const std::function<void(const std::string&)>& say) {
  StepSetup s;
  s.task = make_task(config);
  s.shape = s.task->shape();
  const std::vector<std::string> cuts = configured_cuts(config, [&] { return s.shape; });
  say("building " + config.model.arch + (on_meta ? " on the meta device" : ""));
  at::Generator gen = at::detail::createCPUGenerator(0);
  {
    std::optional<init::MetaGuard> guard;  // Note [building on the meta device]
    if (on_meta) guard.emplace();
    s.built = build_model(config, s.shape, gen);
  }
  s.parameters = static_cast<int64_t>(s.built.model->num_parameters());
  if (config.parallel.tp > 1) {  // Note [tensor parallelism in a plan]: tensor rank 0's part of every block
    const std::string problem = tensor_parallel_problem(config);
    TORCH_CHECK(problem.empty(), "tapeline plan: ", problem);
    TORCH_CHECK(on_meta, "a real step of parallel.tp = ", config.parallel.tp,
                " runs in processes (tapeline train --nproc)");
    auto tp = std::make_shared<TensorParallel>(0, config.parallel.tp);
    shard_tensor_parallel(*s.built.model, tp, "model.arch = " + config.model.arch);
    s.tp_comm = std::make_shared<PlanTpComm>(config);
    tp->bind(s.tp_comm);
  }
  RunBoundaries rb = build_boundaries(config, cuts);
  if (on_meta)
    for (const auto& b : rb.boundaries) b->set_given_sizes(config.plan.forward_bytes, config.plan.backward_bytes);
  s.pipeline = std::make_shared<Pipeline>(s.built.model, cuts, rb.boundaries);
  s.pipeline->set_measure_error(false);
  s.pipeline->train();
  s.settings = schedule_settings(config, rb.links);
  Task* task = s.task.get();
  s.executor = std::make_unique<LocalExecutor>(
      *s.pipeline, [task](const Variable& out, const Batch& mb) { return task->loss(out, mb); }, s.settings);
  return s;
}

int64_t optimizer_states(const TrainSection& t) {
  if (t.optimizer == "adamw") return 2;  // exp_avg, exp_avg_sq
  return t.momentum > 0 ? 1 : 0;         // the momentum buffer
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s << std::setprecision(10) << v;
  return s.str();
}

// Note [data parallelism in a plan]: who holds each parameter, found once per plan.
struct DpHolders {
  ranks::ParameterStages stages;  // by identity
  std::set<std::string> tied;     // held by the stages of two or more ranks (Note [tied sums in a plan])
};

DpHolders dp_holders(const Pipeline& pipeline, const StageLayout& layout) {
  DpHolders h{ranks::parameter_stages(pipeline), {}};
  for (const auto& [n, p] : pipeline.named_parameters()) {
    auto it = h.stages.find(p.data().unsafeGetTensorImpl());
    if (it == h.stages.end()) continue;
    std::set<int> ranks;
    for (int s : it->second) ranks.insert(layout.rank_of(s));
    if (ranks.size() > 1) h.tied.insert(n);
  }
  return h;
}

// Note [data parallelism in a plan]: the sums of pipeline rank `r`'s data-parallel group after
// its pipeline part. Fills r's dp_bytes, dp_messages and dp_sum_s; returns how the compressed
// payloads were sized (the weakest kind among them).
PayloadSize::Kind plan_dp_sums(const Config& config, const Pipeline& pipeline, const StageLayout& layout,
                               const DpHolders& holders, int D, PlanRank& rank) {
  const DpSection& dp = config.dp;
  const LinkSpec link{dp.bandwidth_mbps, dp.latency_ms};
  auto round_s = [&](int64_t bytes) {  // one round: messages side by side, one per link
    return (link.bandwidth_mbps > 0 ? 8.0 * static_cast<double>(bytes) / (link.bandwidth_mbps * 1e6) : 0.0) +
           link.latency_ms / 1e3;
  };
  ranks::DataParallelOptions options;
  options.compression = dp.compression;
  options.compress_stages = dp.compress_stages;
  std::vector<int64_t> numel;
  std::vector<at::ScalarType> dtype;
  std::vector<bool> in_bucket;
  std::vector<PayloadSize> payloads;  // each parameter's in the packed message (a placeholder if in a bucket)
  bool packed = false;
  PayloadSize::Kind kind = PayloadSize::Kind::Exact;
  const PayloadSize placeholder = identity_compressor()->payload_size({0}, at::kFloat);
  // Note [the gradients a rank sums] in parallel/ranks/data_parallel.h, as DistExecutor picks them.
  for (const ranks::SummedParameter& sp : ranks::summed_parameters(
           pipeline, holders.stages, layout, rank.rank, [&](const std::string& n) { return holders.tied.count(n) > 0; },
           options)) {
    const Variable& p = sp.param;
    const std::string& n = sp.name;
    const bool compressed = sp.compressed;
    numel.push_back(p.numel()), dtype.push_back(p.scalar_type());
    // On the CPU (Gloo) every uncompressed floating gradient goes in a bucket.
    in_bucket.push_back(!compressed && p.requires_grad() && at::isFloatingType(p.scalar_type()));
    if (in_bucket.back()) {
      payloads.push_back(placeholder);
      continue;
    }
    packed = true;
    if (!compressed) {
      payloads.push_back(identity_compressor()->payload_size(p.sizes().vec(), p.scalar_type()));
      continue;
    }
    const std::vector<int64_t> matrix{p.size(0), p.numel() / std::max<int64_t>(p.size(0), 1)};
    CompressorPtr codec = dp.compression.build();
    PayloadSize size;
    try {
      size = codec->payload_size(matrix, p.scalar_type());
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "tapeline plan: dp.compression = ", dp.compression, " cannot be sized for the gradient of '", n,
                  "' (", matrix[0], " x ", matrix[1], "; Note [sizing a payload]); the data-parallel codecs it sizes: "
                  "identity, fp16, bf16, quant, hadquant, topk, randk, threshold (worst case), powersgd, "
                  "compositions of these, ef around them");
    }
    kind = PayloadSize::weaker(kind, size.kind);
    payloads.push_back(size);
  }
  const int64_t bucket_bytes = static_cast<int64_t>(dp.bucket_mib * double(1 << 20));
  for (const std::vector<size_t>& bucket : ranks::bucket_layout(numel, dtype, in_bucket, bucket_bytes)) {
    int64_t n = 0;
    for (size_t i : bucket) n += numel[i];
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype[bucket.front()]));
    if (D == 2) {  // the whole bucket each way
      rank.dp_bytes += n * elem, rank.dp_messages += 1, rank.dp_sum_s += round_s(n * elem);
      continue;
    }
    // Reduce-scatter, then all-gather (group_sum.h): chunk j, n (j + 1) / D - n j / D elements, to
    // member j; replica 0 sends the D - 1 chunks not its own, then its summed chunk 0 to each other.
    const int64_t own = n / D, largest = n - n * (D - 1) / D;  // chunk 0; the last chunk, the largest
    rank.dp_bytes += (n - own + (D - 1) * own) * elem, rank.dp_messages += 2 * (D - 1);
    rank.dp_sum_s += 2 * round_s(largest * elem);
  }
  if (packed) {  // count, lengths, then the payloads (data_parallel.cpp's pack)
    int64_t n = 8 * static_cast<int64_t>(1 + payloads.size());
    for (const PayloadSize& ps : payloads) n += ps.bytes;
    rank.dp_bytes += (D - 1) * n, rank.dp_messages += D - 1, rank.dp_sum_s += round_s(n);
  }
  // The stages' buffers, integer counters as float64.
  std::vector<int64_t> buffer_payloads;
  for (int s : rank.stages)
    for (const auto& [n, b] : pipeline.stage(static_cast<size_t>(s))->named_buffers()) {
      const at::ScalarType t = at::isFloatingType(b.scalar_type()) ? b.scalar_type() : at::kDouble;
      buffer_payloads.push_back(identity_compressor()->payload_size(b.sizes().vec(), t).bytes);
    }
  if (!buffer_payloads.empty()) {
    int64_t n = 8 * static_cast<int64_t>(1 + buffer_payloads.size());
    for (int64_t b : buffer_payloads) n += b;
    rank.dp_bytes += (D - 1) * n, rank.dp_messages += D - 1, rank.dp_sum_s += round_s(n);
  }
  return kind;
}

}  // namespace

Plan plan_step(const Config& config, const std::function<void(const std::string&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const std::string& what) {
    if (progress) progress(what);
  };
  TORCH_CHECK(config.timeline.device != "measured",
              "tapeline plan: timeline.device = measured has nothing to measure on shapes; set timeline.device to a "
              "device model (h100, a100, cpu; docs/TIME.md)");
  // Note [data parallelism in a plan]: one replica's share of the step's micro-batches.
  const int D = static_cast<int>(config.parallel.dp);
  const int64_t M = config.train.micro_batches;
  // (Config's validation has checked that M is a multiple of D.)
  Config replica = config;
  if (D > 1) {
    const auto slices = micro_batch_slices(config.train.batch_size, M);
    int64_t rows = 0;  // replica 0's: the largest share
    for (int64_t i = 0; i < M / D; ++i) rows += slices[static_cast<size_t>(i)].second;
    replica.train.batch_size = rows;
    replica.train.micro_batches = M / D;
  }
  Plan plan;
  plan.replicas = D;
  StepSetup setup = assemble(replica, true, say);
  LocalExecutor& executor = *setup.executor;
  const ScheduleSettings& settings = setup.settings;
  const auto& pipeline = setup.pipeline;
  plan.parameters = setup.parameters;
  plan.model = setup.built.describe(plan.parameters);
  const StageLayout& layout = executor.layout();
  plan.stages = layout.stages();
  plan.ranks = layout.ranks;
  plan.schedule = settings.schedule;
  plan.device = settings.device.name;
  plan.link_model = config.timeline.link_model;
  plan.unit = setup.task->unit_name();
  plan.micro_batches = config.train.micro_batches;
  plan.rows = config.train.batch_size;

  say("running one step: " + std::to_string(replica.train.micro_batches) + " micro-batches through " +
      std::to_string(plan.stages) + " stages on " + std::to_string(plan.ranks) + " ranks" +
      (D > 1 ? " (one replica of " + std::to_string(D) + ")" : ""));
  const Batch batch = shape_batch(replica, setup.shape, false);
  StepPosition at;
  at.step = 1;
  at.progress = 0;
  StepTiming timing;
  const StepResult result = executor.train_step(batch, replica.train.micro_batches, at, &timing);
  plan.units = result.units * D;
  plan.pipeline_s = plan.step_s = timing.step_s;
  plan.bubble = timing.bubble();

  const int64_t states = optimizer_states(config.train);
  for (int r = 0; r < layout.ranks; ++r) {
    PlanRank pr;
    pr.rank = r;
    pr.stages = layout.stages_of(r);
    pr.compute_s = timing.compute_s[r];
    pr.wait_s = timing.comm_s[r];
    pr.flops = timing.flops[r];
    for (int s : pr.stages) pr.parameter_bytes += parameter_bytes(*pipeline->stage(static_cast<size_t>(s)));
    pr.optimizer_bytes = states * pr.parameter_bytes;
    pr.activation_bytes = static_cast<int64_t>(timing.activation_bytes[r]);
    plan.flops += pr.flops;
    plan.rank_plans.push_back(pr);
  }
  const int T = static_cast<int>(config.parallel.tp);
  plan.tensor = T;
  if (setup.tp_comm) {  // Note [tensor parallelism in a plan]: each site's all-reduces on its stage's rank
    plan.tp_forward = config.tp.forward.text();
    plan.tp_backward = config.tp.backward.text();
    plan.tp_algorithm = config.tp.algorithm;
    plan.tp_link = LinkSpec{config.tp.bandwidth_mbps, config.tp.latency_ms};
    plan.tp_size = PayloadSize::word(setup.tp_comm->kind());
    std::map<const Module*, int> stage_of;
    for (size_t s = 0; s < pipeline->num_stages(); ++s)
      for (const auto& [path, m] : pipeline->stage(s)->named_modules()) stage_of.emplace(m.get(), static_cast<int>(s));
    std::map<std::string, const Module*> module_at;
    for (const auto& [path, m] : pipeline->model()->named_modules()) module_at.emplace(path, m.get());
    for (const auto& [site, a] : setup.tp_comm->sites()) {
      auto m = module_at.find(site);
      auto st = m == module_at.end() ? stage_of.end() : stage_of.find(m->second);
      TORCH_CHECK(st != stage_of.end(), "tapeline plan: the tensor-parallel sublayer '", site, "' is in no stage");
      PlanRank& pr = plan.rank_plans[static_cast<size_t>(layout.rank_of(st->second))];
      pr.tp_bytes += a.bytes, pr.tp_messages += a.messages, pr.tp_s += a.seconds;
      pr.tp_all_reduces += setup.tp_comm->calls(site);
    }
    plan.flops *= T;  // every tensor rank's (the replicated layers on each)
  }
  if (D > 1) {  // Note [data parallelism in a plan]
    plan.dp_codec = config.dp.compression.text();
    PayloadSize::Kind kind = PayloadSize::Kind::Exact;
    const DpHolders holders = dp_holders(*pipeline, layout);
    for (PlanRank& pr : plan.rank_plans) {
      kind = PayloadSize::weaker(kind, plan_dp_sums(config, *pipeline, layout, holders, D, pr));
      if (pr.dp_sum_s > 0) plan.step_s = std::max(plan.step_s, pr.compute_s + pr.wait_s + pr.dp_sum_s);
    }
    plan.dp_size = PayloadSize::word(kind);
    plan.dp_sum_s = plan.step_s - plan.pipeline_s;
    plan.flops *= D;
  }
  // Note [tied sums in a plan]: a parameter in the stages of two or more ranks.
  std::map<const void*, std::pair<int64_t, std::set<int>>> holders;
  for (int r = 0; r < layout.ranks; ++r)
    for (int s : layout.stages_of(r))
      for (const auto& p : pipeline->stage(static_cast<size_t>(s))->parameters()) {
        auto& h = holders[p.data().unsafeGetTensorImpl()];
        h.first = static_cast<int64_t>(p.numel()) * 4, h.second.insert(r);  // float32 gradients
      }
  std::set<int> tied_ranks;
  for (const auto& [impl, h] : holders)
    if (h.second.size() > 1) plan.tied_bytes += h.first, tied_ranks.insert(h.second.begin(), h.second.end());
  plan.tied_ranks = static_cast<int>(tied_ranks.size());
  if (plan.tied_ranks > 1) {
    LinkSpec slowest = settings.links.empty() ? LinkSpec{} : settings.links.front();
    for (const LinkSpec& l : settings.links)
      if (l.bandwidth_mbps > 0 && (slowest.bandwidth_mbps <= 0 || l.bandwidth_mbps < slowest.bandwidth_mbps))
        slowest = l;
    const double k = plan.tied_ranks, each_way = 2 * (k - 1) / k * static_cast<double>(plan.tied_bytes);
    plan.tied_sum_s = (slowest.bandwidth_mbps > 0 ? each_way * 8 / (slowest.bandwidth_mbps * 1e6) : 0) +
                      2 * (k - 1) * slowest.latency_ms / 1e3;
  }
  plan.mfu = plan.step_s > 0 ? plan.flops / (plan.step_s * plan.ranks * D * T * settings.device.peak_flops) : 0;

  for (const LocalExecutor::LinkUse& u : executor.last_links()) {
    PlanLink l;
    l.src = u.src, l.dst = u.dst, l.spec = u.spec, l.bytes = u.bytes, l.messages = u.messages, l.busy_s = u.busy_s;
    // What the link carries: activations of boundary s (stage s on src, s + 1 on dst), gradients
    // (s + 1 on src, s on dst), or both (a V placement's turn).
    bool acts = false, grads = false;
    for (int s = 0; s + 1 < plan.stages; ++s) {
      const bool a = layout.rank_of(s) == u.src && layout.rank_of(s + 1) == u.dst;
      const bool g = layout.rank_of(s + 1) == u.src && layout.rank_of(s) == u.dst;
      if ((a || g) && !acts && !grads) l.boundary = s + 1;
      acts = acts || a, grads = grads || g;
    }
    l.forward = acts;
    l.direction = acts && grads ? "both" : acts ? "forward" : "backward";
    const Boundary& b = *pipeline->boundary(static_cast<size_t>(std::max(l.boundary - 1, 0)));
    l.codec = acts ? b.forward_codec()->spec() : b.backward_codec()->spec();
    l.size = PayloadSize::word(acts ? b.forward_size_kind() : b.backward_size_kind());
    l.bytes_per_unit = plan.units > 0 ? static_cast<double>(l.bytes) * D / plan.units : 0;  // one replica's units
    (l.forward ? plan.forward_bytes_per_unit : plan.backward_bytes_per_unit) =
        std::max(l.forward ? plan.forward_bytes_per_unit : plan.backward_bytes_per_unit, l.bytes_per_unit);
    plan.links.push_back(l);
  }
  plan.planning_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say("planned in " + num(plan.planning_s) + " s");
  return plan;
}

std::string Plan::to_json() const {
  std::ostringstream o;
  o << "{\n  \"model\": " << json_string(model) << ",\n  \"parameters\": " << parameters
    << ",\n  \"stages\": " << stages << ",\n  \"ranks\": " << ranks << ",\n  \"schedule\": " << json_string(schedule)
    << ",\n  \"device\": " << json_string(device) << ",\n  \"link_model\": " << json_string(link_model)
    << ",\n  \"micro_batches\": " << micro_batches << ",\n  \"rows\": " << rows
    << ",\n  \"unit\": " << json_string(unit) << ",\n  \"units\": " << num(units) << ",\n  \"step_s\": " << num(step_s)
    << ",\n  \"replicas\": " << replicas << ",\n  \"pipeline_s\": " << num(pipeline_s)
    << ",\n  \"dp_sum_s\": " << num(dp_sum_s) << ",\n  \"dp_codec\": " << json_string(dp_codec)
    << ",\n  \"dp_size\": " << json_string(dp_size) << ",\n  \"tensor\": " << tensor
    << ",\n  \"tp_forward\": " << json_string(tp_forward) << ",\n  \"tp_backward\": " << json_string(tp_backward)
    << ",\n  \"tp_algorithm\": " << json_string(tp_algorithm) << ",\n  \"tp_size\": " << json_string(tp_size)
    << ",\n  \"tp_bandwidth_mbps\": " << num(tp_link.bandwidth_mbps)
    << ",\n  \"tp_latency_ms\": " << num(tp_link.latency_ms) << ",\n  \"bubble\": " << num(bubble)
    << ",\n  \"flops\": " << num(flops) << ",\n  \"mfu\": " << num(mfu)
    << ",\n  \"forward_bytes_per_unit\": " << num(forward_bytes_per_unit)
    << ",\n  \"backward_bytes_per_unit\": " << num(backward_bytes_per_unit) << ",\n  \"tied_bytes\": " << tied_bytes
    << ",\n  \"tied_ranks\": " << tied_ranks << ",\n  \"tied_sum_s\": " << num(tied_sum_s)
    << ",\n  \"planning_s\": " << num(planning_s) << ",\n  \"ranks_detail\": [";
  for (size_t i = 0; i < rank_plans.size(); ++i) {
    const PlanRank& r = rank_plans[i];
    o << (i ? "," : "") << "\n    {\"rank\": " << r.rank << ", \"stages\": [";
    for (size_t s = 0; s < r.stages.size(); ++s) o << (s ? ", " : "") << r.stages[s];
    o << "], \"compute_s\": " << num(r.compute_s) << ", \"wait_s\": " << num(r.wait_s)
      << ", \"flops\": " << num(r.flops) << ", \"parameter_bytes\": " << r.parameter_bytes
      << ", \"optimizer_bytes\": " << r.optimizer_bytes << ", \"activation_bytes\": " << r.activation_bytes
      << ", \"dp_bytes\": " << r.dp_bytes << ", \"dp_messages\": " << r.dp_messages
      << ", \"dp_sum_s\": " << num(r.dp_sum_s) << ", \"tp_all_reduces\": " << r.tp_all_reduces
      << ", \"tp_bytes\": " << r.tp_bytes << ", \"tp_messages\": " << r.tp_messages << ", \"tp_s\": " << num(r.tp_s)
      << "}";
  }
  o << "\n  ],\n  \"links\": [";
  for (size_t i = 0; i < links.size(); ++i) {
    const PlanLink& l = links[i];
    o << (i ? "," : "") << "\n    {\"boundary\": " << l.boundary << ", \"src\": " << l.src << ", \"dst\": " << l.dst
      << ", \"direction\": " << json_string(l.direction) << ", \"bandwidth_mbps\": " << num(l.spec.bandwidth_mbps)
      << ", \"latency_ms\": " << num(l.spec.latency_ms) << ", \"bytes\": " << l.bytes
      << ", \"messages\": " << l.messages << ", \"busy_s\": " << num(l.busy_s)
      << ", \"bytes_per_unit\": " << num(l.bytes_per_unit) << ", \"codec\": " << json_string(l.codec)
      << ", \"size\": " << json_string(l.size) << "}";
  }
  o << "\n  ]\n}\n";
  return o.str();
}

std::string Plan::to_text() const {
  std::ostringstream o;
  o << std::fixed;
  o << "model " << model << "\n"
    << stages << " stages on " << ranks << " ranks, " << schedule << ", " << micro_batches << " micro-batches of "
    << rows / std::max<int64_t>(micro_batches, 1) << " rows (" << std::setprecision(0) << units << " " << unit
    << " a step); device " << device << ", links " << link_model << "\n";
  if (replicas > 1)
    o << std::setprecision(3) << replicas << " replicas, each " << micro_batches / replicas
      << " of the micro-batches: pipeline part " << pipeline_s << " s, then the data-parallel sums (" << dp_codec
      << ", " << dp_size << ") add " << dp_sum_s << " s\n";
  if (tensor > 1) {
    const PlanRank* busiest = &rank_plans.front();
    for (const PlanRank& r : rank_plans)
      if (r.tp_s > busiest->tp_s) busiest = &r;
    o << std::setprecision(3) << "each stage split over " << tensor << " tensor ranks (tp.forward " << tp_forward
      << ", tp.backward " << tp_backward << ", "
      << (tp_forward == "identity" && tp_backward == "identity" ? "uncompressed" : tp_algorithm) << ", " << tp_size
      << "): rank " << busiest->rank
      << "'s " << busiest->tp_all_reduces << " all-reduces send " << std::setprecision(2) << busiest->tp_bytes / 1e6
      << " MB in " << busiest->tp_messages << " messages a tensor rank, " << std::setprecision(3) << busiest->tp_s
      << " s of its compute on the tp links\n";
  }
  o << std::setprecision(3) << "step " << step_s << " s, bubble " << 100 * bubble << "%, " << std::setprecision(3)
    << flops / 1e12 << " TFLOP, MFU " << std::setprecision(2) << 100 * mfu << "%\n";
  o << std::setprecision(1) << "bytes per " << unit << " on the busiest link: " << forward_bytes_per_unit
    << " forward, " << backward_bytes_per_unit << " backward\n";
  if (tied_ranks > 1)
    o << std::setprecision(2) << "tied parameters: " << tied_bytes / 1e6 << " MB of gradients summed over "
      << tied_ranks << " ranks after the backward, " << std::setprecision(3) << tied_sum_s
      << " s on the slowest link (not in the step: on a real network the step is " << step_s + tied_sum_s << " s)\n";
  o << "rank  stages  compute_s  wait_s   params_MB  optim_MB  activ_MB" << (replicas > 1 ? "  dp_MB  dp_sum_s" : "")
    << "\n";
  for (const PlanRank& r : rank_plans) {
    std::string st;
    for (int s : r.stages) {
      if (!st.empty()) st += ',';
      st += std::to_string(s);
    }
    o << std::setw(4) << r.rank << "  " << std::setw(6) << st << "  " << std::setprecision(4) << std::setw(9)
      << r.compute_s << "  " << std::setw(7) << r.wait_s << "  " << std::setprecision(1) << std::setw(9)
      << r.parameter_bytes / 1e6 << "  " << std::setw(8) << r.optimizer_bytes / 1e6 << "  " << std::setw(8)
      << r.activation_bytes / 1e6;
    if (replicas > 1)
      o << "  " << std::setprecision(2) << std::setw(5) << r.dp_bytes / 1e6 << "  " << std::setprecision(4) << std::setw(8)
        << r.dp_sum_s;
    o << "\n";
  }
  o << "link        way       MB/step  busy_s   size        codec\n";
  for (const PlanLink& l : links)
    o << std::setw(2) << l.src << " -> " << std::setw(2) << l.dst << "  " << std::setw(8) << l.direction << "  "
      << std::setprecision(2) << std::setw(8) << l.bytes / 1e6 << "  " << std::setprecision(3) << std::setw(6)
      << l.busy_s << "  " << std::setw(10) << l.size << "  " << l.codec << "\n";
  o << std::setprecision(2) << "planned in " << planning_s << " s\n";
  return o.str();
}

StepTiming real_step(const Config& config, double* units) {
  StepSetup setup = assemble(config, false, [](const std::string&) {});
  StepTiming timing;
  const StepResult r = setup.executor->train_step(shape_batch(config, setup.shape, true), config.train.micro_batches,
                                                  StepPosition(0, 1, 0.0), &timing);
  if (units) *units = r.units;
  return timing;
}

void write_plan(const Plan& plan, const std::string& path) { write_file_atomic(path, plan.to_json()); }

std::string sweep_table(const std::string& key, const std::vector<std::pair<std::string, Plan>>& rows) {
  std::ostringstream o;
  size_t w = key.size();
  for (const auto& [v, p] : rows) w = std::max(w, v.size());
  o << std::left << std::setw(static_cast<int>(w)) << key << std::right
    << "    step_s  vs_first  bubble     MFU   fwd_B/unit  bwd_B/unit  busiest_link_s  sizes\n";
  const double first = rows.empty() ? 0 : rows.front().second.step_s;
  for (const auto& [v, p] : rows) {
    double busiest = 0;
    std::string sizes = "exact";
    for (const PlanLink& l : p.links) {
      busiest = std::max(busiest, l.busy_s);
      if (l.size != "exact") sizes = l.size;
    }
    o << std::left << std::setw(static_cast<int>(w)) << v << std::right << std::fixed << std::setprecision(4)
      << std::setw(10) << p.step_s << std::setprecision(2) << std::setw(9) << (p.step_s > 0 ? first / p.step_s : 0)
      << "x" << std::setprecision(1) << std::setw(7) << 100 * p.bubble << "%" << std::setprecision(2) << std::setw(7)
      << 100 * p.mfu << "%" << std::setprecision(1) << std::setw(12) << p.forward_bytes_per_unit << std::setw(12)
      << p.backward_bytes_per_unit << std::setprecision(4) << std::setw(16) << busiest << "  " << sizes << "\n";
  }
  return o.str();
}

}  // namespace tl
