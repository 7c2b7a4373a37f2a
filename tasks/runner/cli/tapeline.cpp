// tapeline: the command-line front end.
//   tapeline train --config FILE --out DIR [--resume DIR] [--with-baseline] [--nproc N] [--section.key=value ...]
//   tapeline eval --run DIR [--compression on|off|both] [--section.key=value ...]
//   tapeline sweep --configs A.ini B.ini --seeds 1,2,3 --out DIR [--jobs K] [--section.key=value ...]
// Exit status: 0 success, 2 usage or configuration error (nothing ran), 1 failure while running.
#include <boost/program_options.hpp>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/schedule.h"
#include "parallel/slack.h"
#include "tasks/runner/compare.h"
#include "tasks/runner/plan.h"
#include "tasks/config.h"
#include "tasks/runner/report.h"
#include "tasks/runner/sweep.h"
#include "tasks/runner/trainer.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace tl;

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kTopHelp = R"(tapeline: split-model training with compressed stage boundaries

usage:
  tapeline train --config FILE --out DIR [options] [--section.key=value ...]
  tapeline eval --run DIR [--compression on|off|both] [--section.key=value ...]
  tapeline compare RUN_DIR... [--plot OUT_DIR] [--target V | --target-from CONFIG [--target-delta D]] [--plan [CONFIG=]plan.json]
  tapeline plan --config FILE [--out plan.json] [--sweep key=v1,v2,...] [--section.key=value ...]
  tapeline sweep --configs A.ini B.ini ... --seeds 1,2,3 --out DIR [--jobs K] [--section.key=value ...]
  tapeline schedule [--schedule 1f1b|gpipe|interleaved|zbh1|zbv] [--stages S] [--virtual-stages V] [--micro-batches M] [--comm] [--slack]
  tapeline help [train|eval|compare|sweep|plan|schedule]

commands:
  train   train a model cut into stages with a compression boundary at each cut; writes DIR/
          (config.ini, metrics.csv, metrics.jsonl, summary.json, checkpoint.safetensors,
          curves.png) and prints test accuracy with and without compression and bytes per step
  eval    test accuracy of a run's last checkpoint with compression on or off
  compare one table of finished runs (final metric with compression on and off, bytes per step,
          wall time); --plot OUT_DIR also draws the figures (PNG and SVG, matplotlib). Seeds of one
          config are aggregated: mean and 95% interval of every metric, steps and time to target
  plan    one training step of the config on shapes only (no data, no arithmetic): step time on
          timeline.device, bytes and busy time per link, bubble, MFU, memory per rank; writes
          plan.json (docs/CONFIG.md, "tapeline plan"); --sweep prints a table over one key's values
  sweep   train every config with every seed (OUT/NAME.seedN), K at a time; run again to resume
  schedule print every rank's action list of one training step (compute only, or with --comm
          the sends and receives too: SA/RA activation, SG/RG gradient, ~ = sent uncompressed
          by epilogue-only boundaries), as pipeline.schedule runs it

Run `tapeline train --help` for the options and every configuration key (docs/CONFIG.md).
)";

std::string keys_table() {
  std::ostringstream s;
  s << "configuration keys (INI [section] key = value, or --section.key=value; docs/CONFIG.md):\n";
  std::string section;
  for (const auto& k : Config::keys()) {
    std::string sec = k.name.substr(0, k.name.find('.'));
    if (sec != section) s << "\n  [" << sec << "]\n", section = sec;
    s << "  " << std::left << std::setw(34) << k.name << " default "
      << (k.default_value.empty() ? "''" : k.default_value) << "; " << k.accepted << "\n      " << k.help << "\n";
  }
  return s.str();
}

po::options_description train_options() {
  po::options_description d("train options");
  d.add_options()("help,h", "show this help")("config", po::value<std::string>(), "INI file (configs/*.ini)")(
      "out", po::value<std::string>(), "run directory to write (created if missing)")(
      "resume", po::value<std::string>(),
      "continue the run in DIR from its last checkpoint (config from DIR/config.ini unless --config; --out "
      "defaults to DIR)")("with-baseline",
                          "also train the uncompressed baseline (same settings, identity boundaries) when no "
                          "comparable cached one exists")(
      "baseline", po::value<std::string>(),
      "baseline run directory to compare with (default: a sibling 'baseline' of --out, e.g. runs/baseline)")(
      "stop-after", po::value<int64_t>(), "stop after N epochs of this invocation (an interruption; resume later)")(
      "quiet", "no progress output (the final table is still printed)")(
      "no-plot", "do not draw DIR/curves.png at the end (it needs python3-matplotlib; skipped with a note "
                 "when missing)")(
      "nproc", po::value<int>(),
      "one process per pipeline rank: start N ranks of this program on this machine (N = the number of stages / "
      "pipeline.virtual_stages; "
      "default pipeline.nproc). Under torchrun, torchrun starts them instead (docs/PIPELINE.md)");
  return d;
}

po::options_description eval_options() {
  po::options_description d("eval options");
  d.add_options()("help,h", "show this help")("run", po::value<std::string>(), "run directory (from tapeline train)")(
      "compression", po::value<std::string>()->default_value("both"),
      "on: boundaries' forward codecs active; off: bypassed; both");
  return d;
}

po::variables_map parse(const std::vector<std::string>& args, const po::options_description& desc) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return vm;
}

// With --help: prints `usage`, a blank line and the options, and says so (the command returns 0).
bool printed_help(const po::variables_map& vm, const std::string& usage, const po::options_description& desc) {
  if (!vm.count("help")) return false;
  std::cout << usage << "\n\n" << desc;
  return true;
}

// Whether every boundary of `c` is uncompressed both ways (the run is itself a baseline).
bool all_identity(const Config& c) {
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const auto& [k, v] : c.resolved()) {
    bool spec_key = k.rfind("boundary.", 0) == 0 && (ends_with(k, ".forward") || ends_with(k, ".backward"));
    if (spec_key && v != "identity" && v != "none" && !v.empty()) return false;
  }
  return true;
}

// Set by `tapeline train --nproc` in its ranks: the launcher prints the table and draws the plot.
const char* kLaunchedByUs = "TAPELINE_LAUNCHER";

int cmd_train(const std::vector<std::string>& argv) {
  std::vector<std::string> args = argv;
  int nproc = 0;
  try {
    nproc = ranks::take_nproc_flag(args);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  std::vector<std::string> rest;
  auto overrides = split_overrides(args, rest);
  auto desc = train_options();
  po::variables_map vm = parse(rest, desc);
  if (vm.count("help")) {
    std::cout << "usage: tapeline train --config FILE --out DIR [options] [--section.key=value ...]\n\n"
              << desc << "\n"
              << keys_table();
    return 0;
  }
  TrainRequest req;
  if (vm.count("resume")) req.resume_dir = vm["resume"].as<std::string>();
  if (vm.count("config")) {
    req.config_path = vm["config"].as<std::string>();
  } else if (!req.resume_dir.empty()) {
    req.config_path = (fs::path(req.resume_dir) / "config.ini").string();
  } else {
    throw UsageError("--config FILE is required (e.g. --config configs/default.ini)");
  }
  if (vm.count("out"))
    req.out_dir = vm["out"].as<std::string>();
  else if (!req.resume_dir.empty())
    req.out_dir = req.resume_dir;
  else
    throw UsageError("--out DIR is required (e.g. --out runs/default)");
  if (vm.count("stop-after")) {
    req.stop_after_epochs = vm["stop-after"].as<int64_t>();
    if (req.stop_after_epochs < 1) throw UsageError("--stop-after must be >= 1");
  }
  req.quiet = vm.count("quiet") > 0;
  try {
    req.config = Config::load(req.config_path, overrides);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  // One process per stage. Started by torchrun (or by us): this process is one rank.
  const bool is_rank = ranks::DistEnv::one_of_several();
  if (!is_rank && nproc == 0) nproc = static_cast<int>(req.config.pipeline.nproc);
  if (is_rank && vm.count("with-baseline") && !std::getenv(kLaunchedByUs))
    throw UsageError("--with-baseline is not available under torchrun; train the baseline as its own run "
                     "(same config with --boundary.forward=identity --boundary.backward=identity)");
  RunSummary run;
  if (!is_rank && nproc > 1) {
    ranks::LaunchOptions launch;
    launch.nproc = nproc;
    launch.args = {"train"};
    for (const auto& a : args)
      if (a != "--with-baseline") launch.args.push_back(a);  // the baseline is trained here, afterwards
    if (!vm.count("no-plot")) launch.args.push_back("--no-plot");  // drawn here, once
    launch.env = {{kLaunchedByUs, "1"}};
    // OpenBLAS (Debian's libtorch's BLAS) starts a worker per core in every rank unless told
    // otherwise, and at::set_num_threads does not reach it: give each rank its share of the cores,
    // as torchrun does with OMP_NUM_THREADS.
    if (!std::getenv("OPENBLAS_NUM_THREADS")) {
      const unsigned cores = std::thread::hardware_concurrency();
      launch.env.emplace_back("OPENBLAS_NUM_THREADS", std::to_string(std::max(1, static_cast<int>(cores) / nproc)));
    }
    // A grid that cannot work is reported before any process starts.
    const std::string problem = grid_problem(req.config, nproc);
    if (!problem.empty()) throw UsageError(problem);
    if (!req.quiet) std::cerr << "starting " << nproc << " ranks"
                << (req.config.parallel.dp > 1 ? ", " + std::to_string(req.config.parallel.dp) + " replicas of the pipeline"
                                               : std::string(", one per pipeline rank"))
                << (req.config.parallel.tp > 1 ? ", each stage split over " + std::to_string(req.config.parallel.tp) +
                                                     " tensor-parallel ranks"
                                               : std::string())
                << " (output prefixed [rank r])\n";
    const ranks::LaunchResult result = ranks::launch_local(launch);
    if (!result.ok()) {
      std::cerr << "tapeline train: " << result.message << "\n";
      return result.exit_code == 2 ? 2 : 1;
    }
    auto summary = read_summary_json((fs::path(req.out_dir) / "summary.json").string());
    if (!summary) throw std::runtime_error("the ranks finished but " + req.out_dir + "/summary.json is missing");
    run = *summary;
  } else {
    run = run_training(req);
    if (is_rank && (ranks::DistEnv::from_env().rank != 0 || std::getenv(kLaunchedByUs))) return 0;
  }

  // The comparison table: this run, and the uncompressed baseline when one is available.
  std::vector<RunRecord> rows = {run_record(run, run.name, req.out_dir)};
  std::vector<std::string> notes;
  fs::path out = fs::absolute(req.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  fs::path baseline_dir =
      vm.count("baseline") ? fs::path(vm["baseline"].as<std::string>()) : out.parent_path() / "baseline";
  bool is_baseline = all_identity(req.config) || fs::absolute(baseline_dir).lexically_normal() == out;
  if (!is_baseline) {
    const std::string fp = config_fingerprint(req.config);
    std::optional<RunSummary> cached;
    try {
      cached = read_summary_json((baseline_dir / "summary.json").string());
    } catch (const std::exception& e) {
      notes.push_back(std::string("ignoring the cached baseline: ") + e.what());
    }
    bool usable = cached && cached->fingerprint == fp && cached->last.epoch == cached->epochs;
    if (!usable && vm.count("with-baseline")) {
      std::cerr << "training the uncompressed baseline into " << baseline_dir.string() << "\n";
      TrainRequest base;
      base.config = baseline_config(req.config);
      if (base.config.pipeline.nproc > 1) {  // trained here, in one process: the same numbers (docs/PIPELINE.md)
        auto kv = base.config.resolved();
        for (auto& [k, v] : kv)
          if (k == "pipeline.nproc") v = "1";
        base.config = Config::load("", kv);
      }
      base.config_path = req.config_path + " (boundaries uncompressed)";
      base.out_dir = baseline_dir.string();
      base.quiet = req.quiet;
      cached = run_training(base);
      usable = true;
    }
    if (usable) {
      rows.push_back(run_record(*cached, baseline_dir.filename().string() + " (uncompressed)", baseline_dir.string()));
    } else if (cached) {
      notes.push_back("the run in " + baseline_dir.string() +
                      " is not comparable (different settings or unfinished); --with-baseline retrains it");
    } else {
      notes.push_back("no baseline run in " + baseline_dir.string() +
                      "; add --with-baseline to train it (same settings, uncompressed boundaries)");
    }
  }
  const Comparison table = compare_runs(rows);
  std::cout << "\n" << table.table;
  for (const auto& n : table.notes) std::cout << "note: " << n << "\n";
  for (const auto& n : notes) std::cout << "note: " << n << "\n";
  // (An unfinished run is among compare's notes: "unfinished ...; tapeline train --resume DIR continues it".)
  if (!vm.count("no-plot")) {  // a picture of the run; never fails it
    std::string why;
    if (write_run_plot(req.out_dir, &why))
      std::cout << "curves: " << (fs::path(req.out_dir) / "curves.png").string() << "\n";
    else
      std::cout << "note: " << why << "\n";
  }
  std::cout << "run directory: " << req.out_dir << "\n";
  return 0;
}

const char* kCompareUsage =
    "usage: tapeline compare RUN_DIR... [--plot OUT_DIR] [--target V | --target-from CONFIG [--target-delta D]] "
    "[--plan [CONFIG=]plan.json ...]";

int cmd_compare(const std::vector<std::string>& argv) {
  po::options_description desc("compare options");
  desc.add_options()("help,h", "show this help")(
      "plot", po::value<std::string>(),
      "also write figures to OUT_DIR as PNG and SVG: metric per epoch (on solid, off dashed), final metric "
      "against bytes per step (log x), training loss per step, relative error and density over training; with "
      "seeds, the means with their 95% intervals (seeds.png)")(
      "target", po::value<double>(), "target test metric (compression on) for steps and time to target, instead of "
      "the runs' train.target (accuracy as a fraction)")(
      "target-from", po::value<std::string>(), "the target is this config's mean final metric (compression on) ...")(
      "target-delta", po::value<double>()->default_value(0.0), "... plus this (e.g. -0.01: one point of accuracy less)")(
      "plan", po::value<std::vector<std::string>>(),
      "plan.json of tapeline plan: planned time to target = steps to target (measured) x its step_s (modelled); "
      "CONFIG=FILE for one config, FILE for the others; repeatable")(
      "seeds", "show the table of seeds per config even when every config has one run");
  po::options_description all;
  all.add(desc).add_options()("runs", po::value<std::vector<std::string>>(), "run directories");
  po::positional_options_description pos;
  pos.add("runs", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (vm.count("help")) {
    std::cout << kCompareUsage << "\n(run directories written by tapeline train; runs of different tasks or settings "
              << "are flagged as not comparable)\n\n"
              << desc << "\n";
    return 0;
  }
  if (!vm.count("runs")) throw UsageError(std::string("no run directory given; ") + kCompareUsage);
  const auto dirs = vm["runs"].as<std::vector<std::string>>();
  std::vector<RunRecord> runs;
  for (const auto& d : dirs) {
    try {
      runs.push_back(read_run_record(d));
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
  }
  Comparison c = compare_runs(runs);
  std::cout << c.table;
  for (const auto& n : c.notes) std::cout << "note: " << n << "\n";

  // Seeds of one config: mean and interval (docs/CONFIG.md, `compare`).
  SeedOptions so;
  if (vm.count("target")) so.target = vm["target"].as<double>();
  if (vm.count("target-from")) so.target_from = vm["target-from"].as<std::string>();
  so.target_delta = vm["target-delta"].as<double>();
  if (so.target && !so.target_from.empty()) throw UsageError("--target and --target-from exclude each other");
  if (vm.count("plan"))
    for (const auto& p : vm["plan"].as<std::vector<std::string>>()) {
      const auto eq = p.find('=');
      const std::string label = eq == std::string::npos ? "" : p.substr(0, eq);
      try {
        so.plans.emplace_back(label, read_plan(eq == std::string::npos ? p : p.substr(eq + 1)));
      } catch (const std::runtime_error& e) {
        throw UsageError(std::string("--plan ") + e.what());
      }
    }
  SeedComparison seeds = compare_seeds(runs, so);
  const bool show_seeds = vm.count("seeds") || so.target || !so.target_from.empty() || !so.plans.empty() ||
                          seeds.groups.size() < runs.size();
  if (show_seeds) {
    std::cout << "\nby config, over seeds:\n" << seeds.table;
    for (const auto& n : seeds.notes) std::cout << "note: " << n << "\n";
  }
  if (vm.count("plot") && show_seeds) {
    PlotResult p = write_seed_plots(seeds, vm["plot"].as<std::string>());
    if (p.written) {
      std::cout << "figures:";
      for (const auto& f : p.files) std::cout << " " << f;
      std::cout << "\n";
    } else {
      std::cout << "note: " << p.note << "\n";
    }
  }
  if (vm.count("plot")) {
    PlotResult p = write_compare_plots(dirs, vm["plot"].as<std::string>());
    if (p.written) {
      std::cout << "figures:";
      for (const auto& f : p.files) std::cout << " " << f;
      std::cout << "\n";
    } else if (p.missing_matplotlib) {
      std::cout << "note: " << p.note << "\n";
    } else {
      std::cerr << "tapeline compare: error: " << p.note << "\n";
      return 1;
    }
  }
  return 0;
}

int cmd_sweep(const std::vector<std::string>& argv) {
  std::vector<std::string> rest;
  auto overrides = split_overrides(argv, rest);
  po::options_description d("sweep options");
  d.add_options()("help,h", "show this help")("configs", po::value<std::vector<std::string>>()->multitoken(),
                                              "INI files, one run directory per config and seed")(
      "seeds", po::value<std::string>(), "run.seed values: 1,2,3 or 1-3")(
      "out", po::value<std::string>(), "directory of the run directories (OUT/NAME.seedN)")(
      "jobs", po::value<int>()->default_value(default_jobs()), "runs at a time (default: half the cores)")(
      "stop-after", po::value<int64_t>(), "each run stops after N epochs of this invocation (run again to continue)")(
      "no-plot", "no curves.png per run");
  po::variables_map vm = parse(rest, d);
  if (printed_help(vm,
                   "usage: tapeline sweep --configs A.ini B.ini ... --seeds 1,2,3 --out DIR [--jobs K] "
                   "[--section.key=value ...]\n(each run is `tapeline train`, output in DIR/NAME.seedN/train.log; "
                   "running the same command again skips finished runs and resumes the others)",
                   d))
    return 0;
  if (!vm.count("configs")) throw UsageError("--configs A.ini [B.ini ...] is required");
  if (!vm.count("seeds")) throw UsageError("--seeds is required (e.g. --seeds 1,2,3)");
  if (!vm.count("out")) throw UsageError("--out DIR is required");
  SweepOptions o;
  o.configs = vm["configs"].as<std::vector<std::string>>();
  o.seeds = parse_seeds(vm["seeds"].as<std::string>());
  o.out_dir = vm["out"].as<std::string>();
  o.overrides = overrides;
  o.jobs = vm["jobs"].as<int>();
  if (o.jobs < 1) throw UsageError("--jobs must be >= 1, got " + std::to_string(o.jobs));
  if (vm.count("stop-after")) o.stop_after_epochs = vm["stop-after"].as<int64_t>();
  if (vm.count("stop-after") && o.stop_after_epochs < 1) throw UsageError("--stop-after must be >= 1");
  o.plot = !vm.count("no-plot");
  return run_sweep(o, std::cout) == 0 ? 0 : 1;
}

int cmd_schedule(const std::vector<std::string>& argv) {
  po::options_description d("schedule options");
  const std::string schedule_help = std::string(known_schedules()) + " (pipeline.schedule)";
  d.add_options()("help,h", "show this help")("schedule", po::value<std::string>()->default_value("1f1b"),
                                              schedule_help.c_str())("stages", po::value<int>()->default_value(4),
                                                                     "number of stages")(
      "virtual-stages", po::value<int>()->default_value(1),
      "stages per rank (pipeline.virtual_stages; > 1 with --schedule interleaved, 2 with zbv)")(
      "micro-batches", po::value<int>()->default_value(8), "micro-batches per step (train.micro_batches)")(
      "comm", "list the sends and receives too")(
      "slack",
      "also each gradient send's slack on the step's dependency graph (forward 1, backward 2, "
      "I and W 1 each, free links; 0 = on the critical path) beside Optimus-CC's epilogue-only flag");
  po::variables_map vm = parse(argv, d);
  if (printed_help(vm, "usage: tapeline schedule [options]", d)) return 0;
  const int stages = vm["stages"].as<int>(), m = vm["micro-batches"].as<int>(), v = vm["virtual-stages"].as<int>();
  if (stages < 1 || m < 1 || v < 1) throw UsageError("--stages, --virtual-stages and --micro-batches must be >= 1");
  std::vector<RankSchedule> lists;
  try {
    const std::string name = vm["schedule"].as<std::string>();
    lists = make_schedule(name, StageLayout::of(stages, v, placement_of(name)), m);
  } catch (const c10::Error& e) {
    throw UsageError(e.what_without_backtrace());
  }
  std::cout << format_schedule(lists, vm.count("comm") > 0);
  if (vm.count("slack")) {
    // Note [slack of a gradient send] (parallel/slack.h).
    std::cout << "\ngradient sends: slack in forward-times (0: on the critical path), ~ = off the critical path "
                 "by Optimus-CC's rule\n";
    const auto slack = gradient_send_slack(lists, SimCosts::uniform(stages, 1.0, 2.0));
    int rank = -1;
    for (const SendSlack& x : slack) {
      if (x.rank != rank) std::cout << (rank >= 0 ? "\n" : "") << "rank " << x.rank << ":", rank = x.rank;
      std::cout << " " << action_token(x.send, v > 1) << "=" << x.slack_s;
    }
    if (rank >= 0) std::cout << "\n";
  }
  return 0;
}

int cmd_eval(const std::vector<std::string>& argv) {
  std::vector<std::string> rest;
  auto overrides = split_overrides(argv, rest);
  auto desc = eval_options();
  po::variables_map vm = parse(rest, desc);
  if (printed_help(vm,
                   "usage: tapeline eval --run DIR [--compression on|off|both] [--section.key=value ...]\n"
                   "(overrides such as --data.root or --run.device change how the run is evaluated)",
                   desc))
    return 0;
  if (!vm.count("run")) throw UsageError("--run DIR is required");
  std::string run = vm["run"].as<std::string>(), mode = vm["compression"].as<std::string>();
  if (mode != "on" && mode != "off" && mode != "both")
    throw UsageError("--compression: '" + mode + "' is not accepted; use on, off or both");
  std::vector<bool> modes;
  if (mode != "off") modes.push_back(true);
  if (mode != "on") modes.push_back(false);
  std::string metric;
  std::vector<double> values = evaluate_run(run, modes, overrides, &metric);
  for (size_t i = 0; i < modes.size(); ++i)
    std::cout << "test " << metric << ", compression " << (modes[i] ? "on" : "off") << ": "
              << format_metric(metric, values[i]) << "\n";
  return 0;
}

int cmd_plan(const std::vector<std::string>& argv) {
  std::vector<std::string> rest;
  auto overrides = split_overrides(argv, rest);
  po::options_description desc("plan options");
  desc.add_options()("help,h", "this help")("config", po::value<std::string>(), "INI config file (as for train)")(
      "out", po::value<std::string>()->default_value("plan.json"), "where plan.json goes ('' : not written)")(
      "sweep", po::value<std::string>(), "key=v1,v2,...: one plan per value of a config key, as a table")(
      "quiet", "no progress lines");
  po::variables_map vm = parse(rest, desc);
  if (printed_help(vm,
                   "usage: tapeline plan --config FILE [--out plan.json] [--sweep key=v1,v2,...] "
                   "[--section.key=value ...]\n(timeline.device must name a device model; docs/CONFIG.md, "
                   "\"tapeline plan\")",
                   desc))
    return 0;
  const std::string config_path = vm.count("config") ? vm["config"].as<std::string>() : "";
  const bool quiet = vm.count("quiet") > 0;
  auto progress = [quiet](const std::string& s) {
    if (!quiet) std::cerr << "plan: " << s << std::endl;
  };
  if (vm.count("sweep")) {
    const std::string sweep = vm["sweep"].as<std::string>();
    const size_t eq = sweep.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == sweep.size())
      throw UsageError("--sweep '" + sweep + "': expected key=v1,v2,... (e.g. train.micro_batches=8,16,32)");
    const std::string key = sweep.substr(0, eq);
    std::vector<std::pair<std::string, Plan>> rows;
    // Values split at commas outside parentheses (codec specs hold commas: quant(4, scale=channel)).
    std::string cur;
    int depth = 0;
    std::vector<std::string> list;
    for (char c : sweep.substr(eq + 1)) {
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      if (c == ',' && depth == 0) list.push_back(cur), cur.clear();
      else cur += c;
    }
    list.push_back(cur);
    for (const std::string& value : list) {
      auto o = overrides;
      o.emplace_back(key, value);
      progress(key + " = " + value);
      rows.emplace_back(value, plan_step(Config::load(config_path, o), progress));
    }
    std::cout << sweep_table(key, rows);
    return 0;
  }
  const Plan plan = plan_step(Config::load(config_path, overrides), progress);
  std::cout << plan.to_text();
  const std::string out = vm["out"].as<std::string>();
  if (!out.empty()) {
    write_plan(plan, out);
    std::cout << "wrote " << out << "\n";
  }
  return 0;
}

// Note [a failed rank ends at once]. A rank of a multi-process run that failed may still hold
// connections to a peer that cannot be reached (a network partition): Gloo's teardown at exit then
// waits on them without a bound, and the rank would hang after printing its error. Nothing is left
// to write (run files are written whole, by temp file and rename), so such a rank leaves with
// _Exit once its output is flushed. Single-process runs exit normally.
int failed(int code) {
  if (!ranks::DistEnv::one_of_several()) return code;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // Note [allocator]. libtorch's CPU allocator does not cache, and glibc serves blocks above its
  // mmap threshold with fresh mappings and trims the heap top on free, so every step's activation
  // buffers (MBs each) would start with page faults: ~20% of a training run's time here. Keeping
  // freed memory in the heap (the process's footprint stays at its peak) avoids that.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string cmd = args.empty() ? "" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  try {
    if (cmd.empty() || cmd == "--help" || cmd == "-h" || cmd == "help") {
      if (cmd == "help" && !rest.empty())
        return rest[0] == "train"      ? cmd_train({"--help"})
               : rest[0] == "compare"  ? cmd_compare({"--help"})
               : rest[0] == "sweep"    ? cmd_sweep({"--help"})
               : rest[0] == "schedule" ? cmd_schedule({"--help"})
               : rest[0] == "plan"     ? cmd_plan({"--help"})
                                       : cmd_eval({"--help"});
      std::cout << kTopHelp;
      return cmd.empty() ? 2 : 0;
    }
    if (cmd == "train") return cmd_train(rest);
    if (cmd == "eval") return cmd_eval(rest);
    if (cmd == "compare") return cmd_compare(rest);
    if (cmd == "schedule") return cmd_schedule(rest);
    if (cmd == "plan") return cmd_plan(rest);
    if (cmd == "sweep") return cmd_sweep(rest);
    throw UsageError("unknown command '" + cmd + "'; commands: train, eval, compare, sweep, plan, schedule (tapeline --help)");
  } catch (const UsageError& e) {
    std::cerr << "tapeline " << cmd << ": error: " << e.what() << "\n";
    return failed(2);
  } catch (const std::invalid_argument& e) {
    std::cerr << "tapeline " << cmd << ": error: " << e.what() << "\n";
    return failed(2);
  } catch (const c10::Error& e) {
    std::cerr << "tapeline " << cmd << ": error: " << e.what_without_backtrace() << "\n";
    return failed(1);
  } catch (const std::exception& e) {
    std::cerr << "tapeline " << cmd << ": error: " << e.what() << "\n";
    return failed(1);
  }
}
