"""Tests of python/tapeline_plots.py on synthetic run directories in the first vision schema
(test_acc_*) and the task-generic one (test_metric_*, task/metric in summary.json, per-boundary
statistics). Runs with the first Python that has matplotlib (python3, then /usr/bin/python3);
exit 77 (ctest: skipped) when none has it, with the reason."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

try:
    import matplotlib  # noqa: F401
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") \
            and not os.environ.get("TAPELINE_PLOTS_TEST_REEXEC"):
        os.environ["TAPELINE_PLOTS_TEST_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", __file__] + sys.argv[1:])
    print("skipped: matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    sys.exit(77)

import tapeline_plots as tp  # noqa: E402

OLD_HEADER = "epoch,train_loss,test_acc_compressed,test_acc_uncompressed,bytes_forward,bytes_backward," \
             "bytes_uncompressed,wall_s,train_acc,steps,lr"
NEW_HEADER = "epoch,train_loss,train_metric,test_loss_compressed,test_loss_uncompressed,test_metric_compressed," \
             "test_metric_uncompressed,bytes_forward,bytes_backward,bytes_uncompressed,steps,lr,wall_s"


def write_old_run(d, acc_on=(0.6, 0.8), acc_off=(0.3, 0.4), fwd=1000, bwd=1000, raw=20000):
    d.mkdir(parents=True)
    rows = [OLD_HEADER]
    for e, (on, off) in enumerate(zip(acc_on, acc_off), 1):
        rows.append(f"{e},{1.0 / e},{on},{off},{fwd},{bwd},{raw},{10.0 * e},0.5,10,0.01")
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")
    steps = [json.dumps({"step": s, "epoch": 1 + (s - 1) // 10, "loss": 2.0 / s, "lr": 0.01}) for s in range(1, 21)]
    ends = [json.dumps({"epoch_end": e, "step": 10 * e, "forward_rel_error": 0.5 / e, "backward_rel_error": 0.6 / e,
                        "forward_density": 0.1, "backward_density": 0.1}) for e in (1, 2)]
    (d / "metrics.jsonl").write_text("\n".join(steps[:10] + ends[:1] + steps[10:] + ends[1:]) + "\n")
    (d / "summary.json").write_text(json.dumps({
        "name": d.name, "forward": "topk(0.1)", "backward": "topk(0.1)", "epochs": 2, "epoch": 2,
        "test_acc_compressed": acc_on[-1], "test_acc_uncompressed": acc_off[-1], "fingerprint": "abc"}))


def write_new_run(d):
    d.mkdir(parents=True)
    rows = [NEW_HEADER]
    for e in (1, 2, 3):
        rows.append(f"{e},{3.0 / e},{50.0 / e},{3.1 / e},{3.2 / e},{60.0 / e},{70.0 / e},4000,4000,16000,20,0.001,{5.0 * e}")
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")
    lines = []
    for e in (1, 2, 3):
        lines += [json.dumps({"step": 20 * (e - 1) + s, "epoch": e, "loss": 3.0 / (e + s)}) for s in (10, 20)]
        lines.append(json.dumps({"epoch_end": e, "step": 20 * e, "forward_rel_error": 0.2, "backward_rel_error": 0.3,
                                 "forward_density": 1.0, "backward_density": 1.0,
                                 "boundaries": [{"index": i, "forward_rel_error": 0.1 * i, "backward_rel_error": 0.2,
                                                 "forward_density": 1.0, "backward_density": 1.0} for i in (1, 2)]}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (d / "summary.json").write_text(json.dumps({
        "name": d.name, "task": "lm", "metric": "perplexity", "higher_is_better": False, "forward": "quant(bits=4)",
        "backward": "identity", "epochs": 3, "epoch": 3, "test_metric_compressed": 20.0,
        "test_metric_uncompressed": 23.3, "fingerprint": "def"}))


def write_timed_run(d, times, perplexities, steps=16):
    """An lm run whose metrics.csv has the pipeline's timeline (train_time_s) and a target."""
    d.mkdir(parents=True)
    rows = [NEW_HEADER + ",train_time_s"]
    for e, (t, p) in enumerate(zip(times, perplexities), 1):
        rows.append(f"{e},1.0,{p},1.0,1.0,{p},{p},100,100,400,{steps},0.001,{10.0 * e},{t}")
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")
    (d / "summary.json").write_text(json.dumps({
        "name": d.name, "task": "lm", "metric": "perplexity", "higher_is_better": False, "forward": "bf16",
        "backward": "bf16", "target": 8.0, "timeline_device": "h100", "fingerprint": "t"}))


class PlotModuleTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_reads_both_schemas_by_column_name(self):
        write_old_run(self.dir / "old")
        write_new_run(self.dir / "new")
        old, new = tp.read_run(self.dir / "old"), tp.read_run(self.dir / "new")
        self.assertEqual((old.task, old.metric, old.higher_is_better), ("vision", "accuracy", True))
        self.assertEqual((new.task, new.metric, new.higher_is_better), ("lm", "perplexity", False))
        self.assertAlmostEqual(old.final("metric_on"), 0.8)
        self.assertAlmostEqual(new.final("metric_off"), 70.0 / 3)
        self.assertEqual(len(old.steps), 20)
        self.assertEqual(len(old.epoch_ends), 2)
        self.assertEqual(old.bytes_per_step(), (200.0, 2000.0))
        series = tp._boundary_series(new, "forward_rel_error")
        self.assertEqual([s[0] for s in series], ["cut 1", "cut 2"])  # per boundary when present
        self.assertEqual([s[0] for s in tp._boundary_series(old, "forward_rel_error")], ["all cuts"])

    def test_time_figure_plots_the_metric_against_the_timeline_and_the_steps(self):
        write_timed_run(self.dir / "dense", [10.0, 20.0, 30.0], [12.0, 9.0, 7.5])
        write_timed_run(self.dir / "quant4", [5.0, 10.0, 15.0], [13.0, 9.5, 8.5])
        write_old_run(self.dir / "untimed")
        runs = tp.load_runs([self.dir / "dense", self.dir / "quant4", self.dir / "untimed"])
        self.assertEqual([tp.has_timeline(r) for r in runs], [True, True, False])
        fig = tp.time_figure(runs)
        by_time, by_steps = fig.axes[0], fig.axes[1]
        curves = [l for l in by_time.lines if l.get_label() == "quant4"]
        self.assertEqual(list(curves[0].get_xdata())[1:], [5.0, 10.0, 15.0])
        steps = [l for l in by_steps.lines if l.get_label() == "dense"][0]
        self.assertEqual(list(steps.get_xdata()), [16, 32, 48])
        self.assertTrue(any(l.get_label() == "target" for l in by_time.lines))
        # Steps to the target (8.0: dense at step 48, quant4 never) against time per step.
        points = {c.get_label(): c.get_offsets()[0] for c in fig.axes[2].collections}
        self.assertEqual(list(points["dense"]), [30.0 / 48, 48])
        self.assertIn("quant4 (missed)", points)
        files = tp.write_compare_plots([self.dir / "dense", self.dir / "quant4"], self.dir / "figs")
        self.assertIn("metric_vs_time.png", [os.path.basename(f) for f in files])

    def test_writes_run_and_compare_figures(self):
        write_old_run(self.dir / "a")
        write_old_run(self.dir / "b", acc_on=(0.7, 0.85), acc_off=(0.7, 0.86), fwd=10000, bwd=10000)
        write_new_run(self.dir / "lm")
        png = tp.write_run_plot(self.dir / "a")
        self.assertTrue(png.endswith("curves.png"))
        self.assertGreater(os.path.getsize(png), 10000)
        files = tp.write_compare_plots([self.dir / "a", self.dir / "b", self.dir / "lm"], self.dir / "figs")
        names = sorted(os.path.basename(f) for f in files)
        for stem in ("boundary_stats", "frontier", "metric_per_epoch", "train_loss"):
            self.assertIn(stem + ".png", names)
            self.assertIn(stem + ".svg", names)
        for f in files:
            self.assertGreater(os.path.getsize(f), 1000, f)
        self.assertNotIn("metric_vs_time.png", names)  # none of them has a timeline
        # Two tasks: one metric panel each.
        fig = tp.metric_per_epoch_figure(tp.load_runs([self.dir / "a", self.dir / "lm"]))
        self.assertEqual(len(fig.axes), 2)
        # The bytes chart: an uncompressed run reaches 1 (forward and backward stacked over both).
        raw = self.dir / "raw"
        write_old_run(raw, fwd=10000, bwd=10000, raw=20000)
        fig = tp.bytes_figure(tp.load_runs([raw]))
        heights = [p.get_height() for p in fig.axes[0].patches]
        self.assertAlmostEqual(sum(heights), 1.0)

    def test_levels_figure(self):
        write_new_run(self.dir / "adaptive")
        rows = ["step,epoch,boundary,direction,level,label,bytes"]
        for step in range(1, 41):
            rows.append(f'{step},1,1,forward,{0 if step <= 12 else 1},"{"quant(2, scale=tensor)" if step <= 12 else "quant(4)"}",'
                        f'{1000 if step <= 12 else 2000}')
            rows.append(f'{step},1,1,backward,{0.1 * (1 + step % 3)},k=0.{1 + step % 3},{500 + step}')
        (self.dir / "adaptive" / "levels.csv").write_text("\n".join(rows) + "\n")
        run = tp.read_run(self.dir / "adaptive")
        self.assertEqual(len(run.levels), 80)
        self.assertEqual(run.levels[0]["label"], "quant(2, scale=tensor)")  # quoted commas kept
        self.assertEqual(run.levels[-1]["bytes"], 540)
        fig = tp.run_figure(run)
        self.assertEqual(len(fig.axes), 6)  # a third row: levels and bytes per step
        self.assertEqual(len(fig.axes[4].get_lines()), 2)  # forward and backward
        write_old_run(self.dir / "fixed")
        self.assertEqual(len(tp.run_figure(tp.read_run(self.dir / "fixed")).axes), 4)
        (self.dir / "adaptive" / "levels.csv").write_text("step,epoch,boundary\n1,1,x\n")
        with self.assertRaises(ValueError):
            tp.read_run(self.dir / "adaptive")

    def test_command_line(self):
        write_old_run(self.dir / "a")
        script = str(ROOT / "python" / "tapeline_plots.py")
        r = subprocess.run([sys.executable, script, "run", str(self.dir / "a")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue((self.dir / "a" / "curves.png").exists())
        r = subprocess.run([sys.executable, script, "run", str(self.dir / "missing")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a directory", r.stderr)
        r = subprocess.run([sys.executable, script, "compare", str(self.dir / "a")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--out", r.stderr)
        r = subprocess.run([sys.executable, script, "check"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
