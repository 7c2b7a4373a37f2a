"""Figures of tapeline run directories, drawn with matplotlib.

One module shared by the `tapeline` CLI (which runs it as a script: `tapeline compare --plot` and
the curves.png every `tapeline train` writes) and by the notebooks (which import it). It reads
what a run directory holds:

  metrics.csv    one row per epoch; columns read by name, old and new names accepted
                 (test_metric_compressed / test_acc_compressed, ...)
  metrics.jsonl  {"step", "loss", ...} every log interval; {"epoch_end", "step",
                 "forward_rel_error", ..., optionally "boundaries": [{"index", ...}]} per epoch
  summary.json   the last epoch plus "task", "metric", "higher_is_better" (missing: vision,
                 accuracy, true), "time_to_target_s", "target"
  levels.csv     (runs with adaptive codecs: schedule, adaptive, budget) one row per training step,
                 boundary and direction: step, epoch, boundary, direction, level, label, bytes

Figures are built on matplotlib.figure.Figure objects (no pyplot state, any backend) and saved
as PNG and SVG.

Command line (exit status 0: written; 2: bad input, named; 3: matplotlib is not installed for
this Python, so the caller can try another interpreter or skip with a note):

  python3 tapeline_plots.py run RUN_DIR [--out FILE.png]      # RUN_DIR/curves.png by default
  python3 tapeline_plots.py compare --out DIR RUN_DIR...      # DIR/*.png and DIR/*.svg
  python3 tapeline_plots.py seeds --out DIR SEEDS.json        # DIR/seeds.png and .svg: means, 95% intervals
  python3 tapeline_plots.py check                             # exit 0 when matplotlib imports
"""

import csv
import json
import math
import os
import sys

__all__ = [
    "Run", "read_run", "load_runs", "run_figure", "metric_per_epoch_figure", "frontier_figure",
    "train_loss_figure", "boundary_stats_figure", "bytes_figure", "levels_axes", "write_run_plot",
    "write_compare_plots", "seeds_figure", "write_seed_plots",
    "have_matplotlib", "save",
]

# Column names of metrics.csv (new name first, then the names older runs used).
_COLUMNS = {
    "epoch": ["epoch"],
    "train_loss": ["train_loss"],
    "train_metric": ["train_metric", "train_acc"],
    "metric_on": ["test_metric_compressed", "test_acc_compressed"],
    "metric_off": ["test_metric_uncompressed", "test_acc_uncompressed"],
    "loss_on": ["test_loss_compressed"],
    "loss_off": ["test_loss_uncompressed"],
    "bytes_forward": ["bytes_forward"],
    "bytes_backward": ["bytes_backward"],
    "bytes_uncompressed": ["bytes_uncompressed"],
    "steps": ["steps"],
    "lr": ["lr"],
    "wall_s": ["wall_s"],
    "train_time_s": ["train_time_s"],
}


def have_matplotlib():
    """True when matplotlib can be imported by this Python."""
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _number(text):
    if text is None:
        return None
    text = str(text).strip()
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _pick(row, key):
    for name in _COLUMNS[key]:
        if name in row:
            return _number(row[name])
    return None


class Run:
    """What one run directory holds, with column names normalised.

    epochs: list of dicts with the keys of _COLUMNS (None where the run lacks a column).
    steps: the jsonl lines with a "step" and a "loss" (training log lines).
    epoch_ends: the jsonl lines with "epoch_end".
    levels: the rows of levels.csv (empty without one): dicts with step, boundary, level, bytes
      (numbers), direction and label (text).
    """

    def __init__(self, path, label=None):
        self.path = os.path.normpath(str(path))
        self.summary = {}
        self.epochs = []
        self.steps = []
        self.epoch_ends = []
        self.levels = []
        summary_path = os.path.join(self.path, "summary.json")
        csv_path = os.path.join(self.path, "metrics.csv")
        if not os.path.isdir(self.path):
            raise ValueError(f"{self.path}: not a directory (expected a tapeline run directory)")
        if not os.path.exists(summary_path) and not os.path.exists(csv_path):
            raise ValueError(f"{self.path}: neither summary.json nor metrics.csv found "
                             "(expected a directory written by tapeline train)")
        if os.path.exists(summary_path):
            try:
                with open(summary_path) as f:
                    self.summary = json.load(f)
            except (ValueError, OSError) as e:
                raise ValueError(f"{summary_path}: not a tapeline summary.json ({e})")
            if not isinstance(self.summary, dict):
                raise ValueError(f"{summary_path}: not a tapeline summary.json (not a JSON object)")
        if os.path.exists(csv_path):
            with open(csv_path, newline="") as f:
                for row in csv.DictReader(f):
                    self.epochs.append({k: _pick(row, k) for k in _COLUMNS})
        jsonl_path = os.path.join(self.path, "metrics.jsonl")
        if os.path.exists(jsonl_path):
            with open(jsonl_path) as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise ValueError(f"{jsonl_path}:{n}: not a JSON object ({e})")
                    if "epoch_end" in obj:
                        self.epoch_ends.append(obj)
                    elif "step" in obj and "loss" in obj:
                        self.steps.append(obj)
        levels_path = os.path.join(self.path, "levels.csv")
        if os.path.exists(levels_path):
            with open(levels_path, newline="") as f:
                for n, row in enumerate(csv.DictReader(f), 2):
                    try:
                        self.levels.append({"step": int(row["step"]), "boundary": int(row["boundary"]),
                                            "direction": row["direction"], "level": float(row["level"]),
                                            "label": row["label"], "bytes": int(row["bytes"])})
                    except (KeyError, TypeError, ValueError) as e:
                        raise ValueError(f"{levels_path}:{n}: not a levels.csv row ({e!r})")
        self.label = label or self.summary.get("name") or os.path.basename(self.path)

    # What the run measured.
    @property
    def task(self):
        return self.summary.get("task", "vision")

    @property
    def metric(self):
        return self.summary.get("metric", "accuracy")

    @property
    def higher_is_better(self):
        return bool(self.summary.get("higher_is_better", True))

    @property
    def codecs(self):
        return f"{self.summary.get('forward', '?')} / {self.summary.get('backward', '?')}"

    def final(self, key):
        """The last epoch's value of a normalised column (None if unknown)."""
        for row in reversed(self.epochs):
            if row.get(key) is not None:
                return row[key]
        return None

    def bytes_per_step(self):
        """(forward + backward bytes) / steps of the last epoch, and the uncompressed size."""
        if self.epochs:
            last = self.epochs[-1]
            steps = last.get("steps") or 0
            if steps > 0:
                sent = (last.get("bytes_forward") or 0) + (last.get("bytes_backward") or 0)
                return sent / steps, (last.get("bytes_uncompressed") or 0) / steps
        return self.summary.get("bytes_per_step"), self.summary.get("uncompressed_bytes_per_step")


def read_run(path, label=None):
    return Run(path, label)


def load_runs(paths, labels=None):
    labels = labels or [None] * len(paths)
    return [Run(p, l) for p, l in zip(paths, labels)]


# ---- formatting ---------------------------------------------------------------------------------
def _metric_label(metric):
    return {"accuracy": "test accuracy (%)", "perplexity": "test perplexity"}.get(metric, f"test {metric}")


def _scale(metric):
    # Accuracies are stored as fractions and shown in percent.
    return 100.0 if metric == "accuracy" else 1.0


def _integer_epochs(ax):
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _colors(n):
    import matplotlib
    cmap = matplotlib.colormaps["tab10"] if hasattr(matplotlib, "colormaps") else matplotlib.cm.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def _figure(ncols, nrows=1, width=5.0, height=3.6):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained") \
        if _has_layout_kw() else Figure(figsize=(width * ncols, height * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _has_layout_kw():
    import matplotlib
    major, minor = (int(x) for x in matplotlib.__version__.split(".")[:2])
    return (major, minor) >= (3, 5)


def _metric_panels(runs):
    """A figure of one panel per (task, metric), in first-seen order, and a color per run (by id).
    Returns (fig, panels, colors), each panel (ax, task, metric, its runs, the metric's scale)."""
    groups = {}
    for r in runs:
        groups.setdefault((r.task, r.metric), []).append(r)
    fig, axes = _figure(len(groups))
    colors = dict(zip([id(r) for r in runs], _colors(len(runs))))
    panels = [(ax, task, metric, members, _scale(metric))
              for ax, ((task, metric), members) in zip(axes[0], groups.items())]
    return fig, panels, colors


# ---- figures ------------------------------------------------------------------------------------
def metric_per_epoch_figure(runs):
    """Test metric after every epoch: compression on solid, off dashed, one color per run."""
    fig, panels, colors = _metric_panels(runs)
    for ax, task, metric, members, s in panels:
        for r in members:
            ep = [row["epoch"] for row in r.epochs if row["epoch"] is not None]
            on = [row["metric_on"] for row in r.epochs]
            off = [row["metric_off"] for row in r.epochs]
            c = colors[id(r)]
            if any(v is not None for v in on):
                ax.plot(ep, [v * s if v is not None else math.nan for v in on], color=c, marker="o",
                        label=f"{r.label} (on)")
            if any(v is not None for v in off):
                ax.plot(ep, [v * s if v is not None else math.nan for v in off], color=c, ls="--", marker="x",
                        label=f"{r.label} (off)")
        ax.set_xlabel("epoch")
        ax.set_ylabel(_metric_label(metric))
        ax.set_title(f"{task}: compression on (solid) / off (dashed)", fontsize=9)
        _integer_epochs(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def has_timeline(run):
    """Whether the run's metrics.csv carries the pipeline's timeline (train_time_s > 0)."""
    return any((row.get("train_time_s") or 0) > 0 for row in run.epochs)


def time_figure(runs):
    """Test metric (compression on) against the pipeline's timeline (train_time_s at each epoch's
    end), one curve per run with a timeline; the target (train.target) as a horizontal line. Left:
    against time; middle: against optimizer steps; right: steps to the target against time per
    step (runs that missed it at the top, hollow), so that the two factors of time to target read
    apart."""
    timed = [r for r in runs if has_timeline(r)]
    fig, axes = _figure(3)
    colors = dict(zip([id(r) for r in timed], _colors(len(timed))))
    if not timed:
        axes[0][0].text(0.5, 0.5, "no run with a timeline (train_time_s)", ha="center", va="center")
        return fig
    metric = timed[0].metric
    s = _scale(metric)
    for r in timed:
        rows = [row for row in r.epochs if row.get("metric_on") is not None]
        t = [row["train_time_s"] or 0 for row in rows]
        steps, total = [], 0
        for row in rows:
            total += row.get("steps") or 0
            steps.append(total)
        y = [row["metric_on"] * s for row in rows]
        c = colors[id(r)]
        axes[0][0].plot([0] + t, [math.nan] + y, color=c, marker="o", label=r.label)
        axes[0][1].plot(steps, y, color=c, marker="o", label=r.label)
    target = timed[0].summary.get("target") or 0
    scatter = axes[0][2]
    if target > 0:
        better = (lambda v: v >= target) if timed[0].higher_is_better else (lambda v: v <= target)
        points = []
        for r in timed:
            total, reached = 0, None
            for row in r.epochs:
                total += row.get("steps") or 0
                if reached is None and row.get("metric_on") is not None and better(row["metric_on"]):
                    reached = total
            per_step = (r.epochs[-1].get("train_time_s") or 0) / total if total else 0
            points.append((r, per_step, reached, total))
        top = max(p[3] for p in points) * 1.1
        for r, per_step, reached, total in points:
            c = colors[id(r)]
            if reached is None:
                scatter.scatter([per_step], [top], edgecolors=c, facecolors="none", s=60, label=f"{r.label} (missed)")
            else:
                scatter.scatter([per_step], [reached], color=c, s=60, label=r.label)
        scatter.set_xlabel("time per step (s)")
        scatter.set_ylabel("steps to target")
        scatter.grid(alpha=0.3)
        scatter.legend(fontsize=7)
    else:
        scatter.text(0.5, 0.5, "no train.target", ha="center", va="center")
    device = timed[0].summary.get("timeline_device", "measured")
    for ax, xlabel in ((axes[0][0], f"training time on the pipeline's timeline (s; compute: {device})"),
                       (axes[0][1], "optimizer steps")):
        if target > 0:
            ax.axhline(target * s, color="gray", ls=":", lw=1, label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(_metric_label(metric) + " (compression on)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if metric == "perplexity":
        for ax in axes[0][:2]:
            ax.set_yscale("log")
    return fig


def frontier_figure(runs):
    """Final metric against bytes per training step (log x): the trade-off frontier."""
    fig, panels, colors = _metric_panels(runs)
    for ax, task, metric, members, s in panels:
        for r in members:
            bps, _ = r.bytes_per_step()
            on, off = r.final("metric_on"), r.final("metric_off")
            if not bps or on is None:
                continue
            c = colors[id(r)]
            ax.scatter([bps], [on * s], color=c, marker="o", s=40, zorder=3)
            if off is not None:
                ax.scatter([bps], [off * s], facecolors="none", edgecolors=[c], marker="o", s=40, zorder=3)
                ax.plot([bps, bps], [on * s, off * s], color=c, lw=0.8, ls=":")
            ax.annotate(r.label, (bps, on * s), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("bytes sent per training step (forward + backward)")
        ax.set_ylabel(_metric_label(metric))
        ax.set_title(f"{task}: final metric, compression on (filled) / off (hollow)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    return fig


def train_loss_figure(runs):
    """Training loss per logged step (metrics.jsonl)."""
    fig, axes = _figure(1)
    ax = axes[0][0]
    for r, c in zip(runs, _colors(len(runs))):
        if r.steps:
            ax.plot([p["step"] for p in r.steps], [p["loss"] for p in r.steps], color=c, label=r.label, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over the log interval)")
    ax.grid(alpha=0.3)
    if any(r.steps for r in runs):
        ax.legend(fontsize=7)
    return fig


def _boundary_series(r, key):
    """[(label, steps, values)] for `key` (forward_rel_error, ...): one series per boundary when the
    jsonl carries "boundaries", else the total over all cuts."""
    per = {}
    for e in r.epoch_ends:
        for b in e.get("boundaries") or []:
            if key in b and b[key] is not None:
                per.setdefault(b.get("index", "?"), []).append((e.get("step", e["epoch_end"]), b[key]))
    if per:
        return [(f"cut {i}", [p[0] for p in pts], [p[1] for p in pts]) for i, pts in sorted(per.items(), key=str)]
    pts = [(e.get("step", e["epoch_end"]), e[key]) for e in r.epoch_ends if e.get(key) is not None]
    return [("all cuts", [p[0] for p in pts], [p[1] for p in pts])] if pts else []


def boundary_stats_figure(runs):
    """Relative error ||x - x^|| / ||x|| and density of what crossed the cuts, per epoch end."""
    fig, axes = _figure(2, 2, width=4.6, height=3.0)
    panels = [("forward_rel_error", "forward relative error"), ("backward_rel_error", "backward relative error"),
              ("forward_density", "forward density"), ("backward_density", "backward density")]
    styles = ["-", "--", "-.", ":"]
    for (key, title), ax in zip(panels, [axes[0][0], axes[0][1], axes[1][0], axes[1][1]]):
        drawn = False
        for r, c in zip(runs, _colors(len(runs))):
            for k, (name, xs, ys) in enumerate(_boundary_series(r, key)):
                label = r.label if name == "all cuts" else f"{r.label}, {name}"
                ax.plot(xs, ys, color=c, ls=styles[k % len(styles)], marker="o", ms=3, label=label)
                drawn = True
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step (end of epoch)")
        if key.endswith("density"):
            ax.set_ylim(0, 1.05)  # a fraction: a constant line is not zoomed into noise
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6)
    return fig


def bytes_figure(runs):
    """Bytes per step of each run as a fraction of what its messages would cost uncompressed (fp32),
    stacked forward + backward: an uncompressed run reaches 1."""
    fig, axes = _figure(1)
    ax = axes[0][0]
    names, fwd, bwd = [], [], []
    for r in runs:
        if not r.epochs:
            continue
        last = r.epochs[-1]
        raw = last.get("bytes_uncompressed") or 0  # both directions
        if raw <= 0:
            continue
        names.append(r.label)
        fwd.append((last.get("bytes_forward") or 0) / raw)
        bwd.append((last.get("bytes_backward") or 0) / raw)
    xs = list(range(len(names)))
    ax.bar(xs, fwd, width=0.6, label="forward")
    ax.bar(xs, bwd, width=0.6, bottom=fwd, label="backward")
    for x, f, b in zip(xs, fwd, bwd):
        ax.annotate(f"{f + b:.3f}", (x, f + b), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("sent / uncompressed bytes")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    return fig


def levels_axes(run, ax_level, ax_bytes):
    """Draws levels.csv: each adaptive codec's level per step (the schedule's phase, adaptive's
    argument, budget's candidate) on ax_level, and its boundary direction's bytes per step on
    ax_bytes; one line per boundary and direction."""
    series = {}
    for row in run.levels:
        series.setdefault((row["boundary"], row["direction"]), []).append(row)
    for (boundary, direction), rows in sorted(series.items()):
        ls = "-" if direction == "forward" else "--"
        name = f"{direction}, cut {boundary}"
        steps = [r["step"] for r in rows]
        ax_level.step(steps, [r["level"] for r in rows], where="post", ls=ls, label=name)
        ax_bytes.plot(steps, [r["bytes"] for r in rows], ls=ls, lw=1, label=name)
        # Name each level where it is first reached (its spec or argument value).
        seen = set()
        for r in rows:
            if r["label"] not in seen:
                seen.add(r["label"])
                ax_level.annotate(r["label"], (r["step"], r["level"]), fontsize=5, alpha=0.7,
                                  xytext=(2, 2), textcoords="offset points")
    ax_level.set_xlabel("step")
    ax_level.set_ylabel("codec level (phase, argument or candidate)")
    ax_level.grid(alpha=0.3)
    ax_bytes.set_xlabel("step")
    ax_bytes.set_ylabel("bytes sent per step")
    ax_bytes.grid(alpha=0.3)
    if series:
        ax_level.legend(fontsize=6)
        ax_bytes.legend(fontsize=6)


def run_figure(run):
    """The one-page picture of a run (curves.png): metric per epoch, training loss, relative error
    and density over training; with a levels.csv, the adaptive codecs' levels and bytes per step."""
    fig, axes = _figure(2, 3 if run.levels else 2, width=4.8, height=3.2)
    s = _scale(run.metric)
    ax = axes[0][0]
    ep = [row["epoch"] for row in run.epochs]
    if any(row["metric_on"] is not None for row in run.epochs):
        ax.plot(ep, [row["metric_on"] * s if row["metric_on"] is not None else math.nan for row in run.epochs],
                marker="o", label="compression on")
    if any(row["metric_off"] is not None for row in run.epochs):
        ax.plot(ep, [row["metric_off"] * s if row["metric_off"] is not None else math.nan for row in run.epochs],
                marker="x", ls="--", label="compression off")
    ax.set_xlabel("epoch")
    ax.set_ylabel(_metric_label(run.metric))
    _integer_epochs(ax)
    ax.grid(alpha=0.3)
    if run.epochs:
        ax.legend(fontsize=7)
    ax = axes[0][1]
    if run.steps:
        ax.plot([p["step"] for p in run.steps], [p["loss"] for p in run.steps], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    for ax, kind in ((axes[1][0], "rel_error"), (axes[1][1], "density")):
        drawn = False
        for direction, ls in (("forward", "-"), ("backward", "--")):
            for name, xs, ys in _boundary_series(run, f"{direction}_{kind}"):
                ax.plot(xs, ys, ls=ls, marker="o", ms=3, label=f"{direction}, {name}")
                drawn = True
        ax.set_xlabel("step (end of epoch)")
        ax.set_ylabel("relative error ||x - x^|| / ||x||" if kind == "rel_error" else "density (nonzero fraction)")
        if kind == "density":
            ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6)
    if run.levels:
        levels_axes(run, axes[2][0], axes[2][1])
    fig.suptitle(f"{run.label}: {run.codecs}", fontsize=10)
    return fig


def save(fig, path_without_ext, formats=("png", "svg")):
    """Saves fig as path.png and path.svg (or the given formats); returns the paths."""
    out = []
    for fmt in formats:
        p = f"{path_without_ext}.{fmt}"
        fig.savefig(p, dpi=120)
        out.append(p)
    return out


def write_run_plot(run_dir, out=None):
    """RUN_DIR/curves.png (or `out`); returns the path."""
    run = Run(run_dir)
    out = out or os.path.join(run.path, "curves.png")
    run_figure(run).savefig(out, dpi=110)
    return out


def write_compare_plots(run_dirs, out_dir, labels=None):
    """The comparison figures as PNG and SVG in out_dir; returns the paths written."""
    runs = load_runs(run_dirs, labels)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    written += save(metric_per_epoch_figure(runs), os.path.join(out_dir, "metric_per_epoch"))
    written += save(frontier_figure(runs), os.path.join(out_dir, "frontier"))
    written += save(train_loss_figure(runs), os.path.join(out_dir, "train_loss"))
    written += save(boundary_stats_figure(runs), os.path.join(out_dir, "boundary_stats"))
    if any(has_timeline(r) for r in runs):
        written += save(time_figure(runs), os.path.join(out_dir, "metric_vs_time"))
    return written


# ---- seeds of one config (error bars) -------------------------------------------------------------
def _ci(entry):
    """(mean, half-width or 0, n) of one statistic of seeds.json (the C++ side computed them)."""
    if not isinstance(entry, dict) or entry.get("n", 0) == 0:
        return None
    half = entry.get("half_width")
    return float(entry["mean"]), float(half) if half is not None else 0.0, int(entry["n"])


def seeds_figure(groups):
    """Per config: the final metric (compression on), steps to target and time to target, each a
    mean with its 95% interval as an error bar (none where n = 1, marked "n=1"). Configs with seeds
    that missed the target say "k missed" over their bar. `groups` is seeds.json's "groups"."""
    if not groups:
        raise ValueError("seeds.json has no groups")
    panels = [("metric_on", None), ("steps_to_target", "steps to target"), ("time_to_target_s", "time to target (s)")]
    if any("planned_time_to_target_s" in g for g in groups):
        panels.append(("planned_time_to_target_s", "planned time to target (s)"))
    if not any(g.get("target") is not None for g in groups):
        panels = panels[:1]
    fig, axes = _figure(len(panels), width=max(4.0, 0.6 * len(groups) + 2.0))
    colors = _colors(len(groups))
    x = list(range(len(groups)))
    labels = [g["label"] for g in groups]
    metric = groups[0].get("metric", "accuracy")
    for ax, (key, title) in zip(axes[0], panels):
        scale = _scale(metric) if key == "metric_on" else 1.0
        for i, g in enumerate(groups):
            ci = _ci(g.get(key))
            if ci is None:
                why = "no plan" if key == "planned_time_to_target_s" and "plan" not in g else \
                    f"{g['missed']} missed" if key != "metric_on" and g.get("missed") else "-"
                ax.text(i, 0, why, ha="center", va="bottom", fontsize=7)
                continue
            mean, half, n = ci
            if key == "metric_on":  # a point: the axis does not start at 0
                ax.errorbar(i, mean * scale, yerr=half * scale if n > 1 else None, color=colors[i], fmt="o",
                            capsize=4, lw=1.2)
            else:
                ax.bar(i, mean * scale, color=colors[i], alpha=0.75)
                if n > 1:
                    ax.errorbar(i, mean * scale, yerr=half * scale, color="black", capsize=4, lw=1)
            notes = []
            if n == 1:
                notes.append("n=1")
            if key != "metric_on" and g.get("missed"):
                notes.append(f"{g['missed']} missed")
            if notes:
                ax.annotate(", ".join(notes), (i, (mean + half) * scale), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_xlim(-0.6, len(groups) - 0.4)
        if key != "metric_on":
            ax.set_ylim(bottom=0)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(title or _metric_label(metric).replace("test", "final test") + ", on")
        if key == "metric_on":
            targets = {g.get("target") for g in groups if g.get("target") is not None}
            if len(targets) == 1:
                ax.axhline(targets.pop() * scale, color="gray", ls="--", lw=1, label="target")
                ax.legend(fontsize=7)
    fig.suptitle("mean over seeds, 95% interval (Student t)", fontsize=10)
    return fig


def write_seed_plots(seeds_json, out_dir):
    """DIR/seeds.png and seeds.svg from the seeds.json `tapeline compare` writes; returns the paths."""
    try:
        with open(seeds_json) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{seeds_json}: not a seeds.json ({e})")
    if not isinstance(data, dict) or "groups" not in data:
        raise ValueError(f"{seeds_json}: no \"groups\" (not a seeds.json written by tapeline compare)")
    os.makedirs(out_dir, exist_ok=True)
    return save(seeds_figure(data["groups"]), os.path.join(out_dir, "seeds"))


# ---- command line -------------------------------------------------------------------------------
_USAGE = """usage:
  tapeline_plots.py run RUN_DIR [--out FILE.png]
  tapeline_plots.py compare --out DIR RUN_DIR...
  tapeline_plots.py seeds --out DIR SEEDS.json
  tapeline_plots.py check"""


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    out = None
    if "--out" in rest:
        i = rest.index("--out")
        if i + 1 >= len(rest):
            print("tapeline_plots: --out needs a path", file=sys.stderr)
            return 2
        out = rest[i + 1]
        rest = rest[:i] + rest[i + 2:]
    if cmd not in ("run", "compare", "seeds", "check"):
        print(f"tapeline_plots: unknown command '{cmd}'; accepted: run, compare, seeds, check\n{_USAGE}",
              file=sys.stderr)
        return 2
    if not have_matplotlib():
        print(f"tapeline_plots: matplotlib is not installed for {sys.executable} "
              "(Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 3
    if cmd == "check":
        return 0
    import matplotlib
    matplotlib.use("Agg")
    try:
        if cmd == "run":
            if len(rest) != 1:
                print(f"tapeline_plots run: expected one RUN_DIR, got {len(rest)}\n{_USAGE}", file=sys.stderr)
                return 2
            print(write_run_plot(rest[0], out))
        elif cmd == "seeds":
            if out is None or len(rest) != 1:
                print(f"tapeline_plots seeds: needs --out DIR and one SEEDS.json\n{_USAGE}", file=sys.stderr)
                return 2
            for p in write_seed_plots(rest[0], out):
                print(p)
        else:
            if out is None or not rest:
                print(f"tapeline_plots compare: needs --out DIR and at least one RUN_DIR\n{_USAGE}", file=sys.stderr)
                return 2
            for p in write_compare_plots(rest, out):
                print(p)
    except ValueError as e:
        print(f"tapeline_plots {cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
