"""What the course notebooks (notebooks/*.ipynb) share: where the repository, the built binaries
and the lab's runs are, quick or full settings, and running the `tapeline` CLI.

Environment (all optional):
  TAPELINE_LAB_QUICK=1   quick settings (small data subsets, few epochs): what CI runs
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
    cmd = [tapeline(), "train", "--config", ROOT / "configs" / config, "--out", out, "--quiet",
           "--baseline", WORK / baseline, *settings, *overrides]
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
