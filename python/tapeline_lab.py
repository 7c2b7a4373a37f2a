"""What the course notebooks (notebooks/*.ipynb) share: where the repository, the built binaries
and the lab's runs are, quick or full settings, and running the `tapeline` CLI.

Environment (all optional):
  TAPELINE_LAB_QUICK=1   quick settings (small data subsets, few epochs, and no curves.png per run:
                         drawing one starts matplotlib, 1.5 s of a core, and the notebooks draw
                         their own figures): what CI runs
  TAPELINE_BUILD_DIR     the CMake build folder (default: build/ at the repository root)
  TAPELINE_BIN           the tapeline executable (default: $TAPELINE_BUILD_DIR/tapeline)
  TAPELINE_LAB_WORK      where the lab's runs and figures go (default: runs/ at the repository root)
"""

import os
import pathlib
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICK = os.environ.get("TAPELINE_LAB_QUICK", "").strip().lower() not in ("", "0", "false", "no", "off")
BUILD = pathlib.Path(os.environ.get("TAPELINE_BUILD_DIR") or ROOT / "build")
TAPELINE = pathlib.Path(os.environ.get("TAPELINE_BIN") or BUILD / "tapeline")
WORK = pathlib.Path(os.environ.get("TAPELINE_LAB_WORK") or ROOT / "runs")

if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))


def pick(full, quick):
    """The full value for class, the quick one under TAPELINE_LAB_QUICK=1."""
    return quick if QUICK else full


def require(path, how):
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {how}")
    return path


def tapeline():
    return require(TAPELINE, "build tapeline first (scripts/build, or cmake --build build --target tapeline)")


def _tail(text, lines=40):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(args, show=True, check=True):
    """Runs a command; prints its output when `show`; raises with the output's end when it fails."""
    args = [str(a) for a in args]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, CI="true"))
    if show:
        print(r.stdout.rstrip())
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} failed with exit status {r.returncode}:\n{_tail(r.stdout)}")
    return r


def train(config, name, *overrides, settings=(), baseline="baseline", show_table=True):
    """`tapeline train --config configs/CONFIG --out WORK/NAME SETTINGS OVERRIDES --quiet`, compared
    with the run WORK/BASELINE; returns the run directory. A finished run with the same command
    line is reused (delete its folder to train it again)."""
    out = WORK / name
    given = [str(a) for a in (*settings, *overrides)]
    no_plot = ["--no-plot"] if QUICK and "--no-plot" not in given else []  # the CLI takes it once
    cmd = [tapeline(), "train", "--config", ROOT / "configs" / config, "--out", out, "--quiet",
           "--baseline", WORK / baseline, *no_plot, *settings, *overrides]
    key = shlex.join(str(c) for c in cmd)
    stamp = out / "lab_command.txt"
    if (out / "summary.json").exists() and stamp.exists() and stamp.read_text() == key:
        print(f"{name}: reusing the finished run in {out} (delete it to train again)")
        return out
    print(f"{name}: tapeline train --config configs/{config} --out {out.name} " + " ".join(map(str, (*settings, *overrides))))
    r = run(cmd, show=False)
    out.mkdir(parents=True, exist_ok=True)
    stamp.write_text(key)
    if show_table:
        # The end-of-run table only (the progress lines are in the run's metrics.jsonl).
        lines = r.stdout.rstrip().splitlines()
        start = next((i for i, l in enumerate(lines) if l.startswith("run ")), 0)
        print("\n".join(lines[start:]))
    return out


def compare(*run_dirs, plot=None):
    """`tapeline compare RUN_DIR... [--plot DIR]`: prints the table (and where the figures went)."""
    args = [tapeline(), "compare", *run_dirs]
    if plot:
        args += ["--plot", plot]
    run(args)


def show_image(path):
    """Displays a PNG in the notebook (and says where it is)."""
    from IPython.display import Image, display
    display(Image(filename=str(path)))


def figure(fig, name):
    """Saves a matplotlib Figure as WORK/figures/NAME.png and .svg and displays the PNG."""
    import tapeline_plots
    folder = WORK / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    png, _ = tapeline_plots.save(fig, folder / name)
    show_image(png)


# ---- lab 4: pipeline schedules and emulated links --------------------------------------------------
# The action lists come from `tapeline schedule` (parallel/schedule.h, what the runner executes);
# the timing below is a transcription, small enough to read, of how the in-process executor times a
# step (parallel/executor.cpp with the link model of parallel/link.h). An action is a (kind,
# micro_batch, compress) triple: kind "F" or "B" (compute), "SA" / "RA" (send / receive an
# activation), "SG" / "RG" (a gradient); compress is False on the 1F1B gradient sends that
# Optimus-CC's epilogue-only mode leaves uncompressed ("~").

# (tapeline binary, its mtime, name, stages, micro_batches) -> `tapeline schedule --comm`'s output
_schedule_text = {}


def pipeline_schedule(name, stages, micro_batches):
    """Every rank's action list for one training step of `name` ("gpipe" or "1f1b"), rank = stage,
    as `tapeline schedule --comm` prints it. Each schedule is asked for once per process: lab 4's
    predictions ask for the same one over a hundred times, and each `tapeline` start costs ~0.6 s of
    a core (loading libtorch); the lists are parsed afresh every call, so a caller may change them."""
    binary = tapeline()
    key = (str(binary), binary.stat().st_mtime_ns, name, int(stages), int(micro_batches))  # rebuilt: asked again
    if key not in _schedule_text:
        _schedule_text[key] = run([key[0], "schedule", "--schedule", name, "--stages", str(stages),
                                   "--micro-batches", str(micro_batches), "--comm"], show=False).stdout
    lists = []
    for line in _schedule_text[key].splitlines():
        if not line.startswith("rank "):
            continue
        actions = []
        for tok in line.split(":", 1)[1].split():
            compress = not tok.endswith("~")
            tok = tok.rstrip("~")
            kind = tok.rstrip("0123456789")
            actions.append((kind, int(tok[len(kind):]), compress))
        lists.append(actions)
    return lists


def action_token(action):
    kind, mb, compress = action
    return f"{kind}{mb}" + ("~" if kind == "SG" and not compress else "")


def format_schedule(lists, with_comm=False):
    """One row per rank, "rank 0: F0 F1 ..." (with_comm: the messages too), as tapeline prints it."""
    return "".join(f"rank {r}: " + " ".join(action_token(a) for a in l if with_comm or a[0] in ("F", "B")) + "\n"
                   for r, l in enumerate(lists))


def _per(value, n):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def simulate_pipeline(lists, forward_s, backward_s, activation_bytes=0, gradient_bytes=None,
                      bandwidth_mbps=0, latency_ms=0):
    """One step of the action lists on the in-process executor's timeline: every stage has its own
    clock, advanced by its compute (forward_s / backward_s per micro-batch: a number, or one per
    stage) and by waits for messages. A message of n bytes (activation_bytes / gradient_bytes per
    micro-batch: a number, or one per cut) sent at t on a cut's link starts when the link (one per
    direction) is free, occupies it for 8 n / bandwidth and arrives latency later; bandwidth 0 is
    unlimited. Returns a dict: step_s, compute_s and comm_s per stage, bubble (1 - mean compute /
    step, as metrics.csv) and spans (per stage: (token, start, end) of every compute action)."""
    import collections
    S = len(lists)
    fwd, bwd = _per(forward_s, S), _per(backward_s, S)
    act = _per(activation_bytes, max(S - 1, 1))
    grad = act if gradient_bytes is None else _per(gradient_bytes, max(S - 1, 1))
    wire = collections.defaultdict(collections.deque)  # (cut, direction) -> (micro-batch, arrival)
    free_at = collections.defaultdict(float)

    def transmit(key, sent_s, nbytes):
        if bandwidth_mbps <= 0:
            return sent_s + latency_ms / 1e3
        start = max(sent_s, free_at[key])
        free_at[key] = start + 8.0 * nbytes / (bandwidth_mbps * 1e6)
        return free_at[key] + latency_ms / 1e3

    clock, compute, comm = [0.0] * S, [0.0] * S, [0.0] * S
    spans = [[] for _ in range(S)]
    pc = [0] * S
    remaining = sum(len(l) for l in lists)
    while remaining:
        progressed = False
        for s in range(S):
            while pc[s] < len(lists[s]):
                kind, mb, _ = a = lists[s][pc[s]]
                if kind in ("F", "B"):
                    d = fwd[s] if kind == "F" else bwd[s]
                    spans[s].append((action_token(a), clock[s], clock[s] + d))
                    clock[s] += d
                    compute[s] += d
                elif kind == "SA":
                    wire[(s, "fwd")].append((mb, transmit((s, "fwd"), clock[s], act[s])))
                elif kind == "SG":
                    wire[(s - 1, "bwd")].append((mb, transmit((s - 1, "bwd"), clock[s], grad[s - 1])))
                else:  # a receive waits for its message
                    q = wire[(s - 1, "fwd")] if kind == "RA" else wire[(s, "bwd")]
                    if not q:
                        break
                    got, arrival = q.popleft()
                    assert got == mb, f"stage {s} expected {action_token(a)} but the link delivers micro-batch {got}"
                    if arrival > clock[s]:
                        comm[s] += arrival - clock[s]
                        clock[s] = arrival
                pc[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule cannot proceed: a stage waits for a message no stage sends")
    step = max(clock)
    return {"step_s": step, "compute_s": compute, "comm_s": comm, "spans": spans,
            "bubble": 1.0 - sum(compute) / (S * step) if step > 0 else 0.0}


def format_timeline(result, slot_s):
    """The simulated step as text: one row per stage, one column per slot_s of time, ".." idle."""
    slots = int(round(result["step_s"] / slot_s + 0.4999))
    width = max([2] + [len(tok) for spans in result["spans"] for tok, _, _ in spans])
    rows = []
    for r, spans in enumerate(result["spans"]):
        cells = ["." * width] * slots
        for tok, a, b in spans:
            for k in range(int(round(a / slot_s)), min(int(round(b / slot_s)), slots)):
                cells[k] = tok.ljust(width)
        rows.append(f"rank {r}: " + " ".join(cells))
    return "\n".join(rows) + "\n"


def schedule_figure(results, unit="s"):
    """A Gantt chart per simulated step ({title: simulate_pipeline(...)}): forwards light, backwards
    dark, idle white; returns a matplotlib Figure (show it with figure(fig, name))."""
    from matplotlib.figure import Figure
    n = len(results)
    fig = Figure(figsize=(11, 1.0 + 1.9 * n))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, (title, res) in zip(axes, results.items()):
        S = len(res["spans"])
        for r, spans in enumerate(res["spans"]):
            for tok, a, b in spans:
                color = "#9ecae1" if tok.startswith("F") else "#3182bd"
                ax.broken_barh([(a, b - a)], (S - 1 - r - 0.4, 0.8), facecolors=color, edgecolors="white")
                if b - a > 0.025 * res["step_s"]:
                    ax.text((a + b) / 2, S - 1 - r, tok, ha="center", va="center", fontsize=7)
        ax.set_yticks(range(S))
        ax.set_yticklabels([f"stage {S - 1 - i}" for i in range(S)])
        ax.set_xlim(0, res["step_s"])
        ax.set_title(f"{title}: step {res['step_s']:.3g} {unit}, bubble {100 * res['bubble']:.0f}%", fontsize=10)
    axes[-1].set_xlabel(f"time ({unit})")
    fig.tight_layout()
    return fig


def read_metrics(run_dir):
    """metrics.csv of a run: one dict per epoch, numbers as floats."""
    import csv
    with open(pathlib.Path(run_dir) / "metrics.csv", newline="") as f:
        return [{k: float(v) if v not in ("", None) else None for k, v in row.items()} for row in csv.DictReader(f)]


def read_summary(run_dir):
    """summary.json of a run."""
    import json
    return json.loads((pathlib.Path(run_dir) / "summary.json").read_text())


def read_boundaries(run_dir):
    """Per cut, the bytes sent in the last epoch: [{"index", "bytes_forward", "bytes_backward"}] from
    metrics.jsonl's last epoch_end line."""
    import json
    last = []
    for line in (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        if '"epoch_end"' in line:
            last = json.loads(line).get("boundaries", [])
    return last
