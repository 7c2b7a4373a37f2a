"""Executes one lab notebook in quick mode, as a student would (jupyter nbconvert --execute),
failing on any cell error. The executed copy (with outputs and figures) goes to OUT_DIR, and the
lab's runs and figures to OUT_DIR/work.

usage: run_notebook.py NOTEBOOK OUT_DIR --tapeline PATH --build-dir DIR
Exit 77 (ctest: skipped) when jupyter nbconvert is not installed, with the reason."""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("notebook")
    ap.add_argument("out_dir")
    ap.add_argument("--tapeline", required=True)
    ap.add_argument("--build-dir", required=True)
    a = ap.parse_args()
    nbconvert = shutil.which("jupyter-nbconvert")
    cmd = [nbconvert] if nbconvert else None
    if cmd is None and shutil.which("jupyter"):
        cmd = [shutil.which("jupyter"), "nbconvert"]
    if cmd is None:
        print("skipped: jupyter nbconvert is not installed (Debian: apt-get install jupyter-nbconvert "
              "python3-ipykernel; scripts/setup installs them)")
        return 77
    nb = pathlib.Path(a.notebook).resolve()
    out = pathlib.Path(a.out_dir).resolve()
    if not nb.is_file():
        print(f"{nb}: no such notebook")
        return 1
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TAPELINE_LAB_QUICK="1", TAPELINE_BIN=str(pathlib.Path(a.tapeline).resolve()),
               TAPELINE_BUILD_DIR=str(pathlib.Path(a.build_dir).resolve()), TAPELINE_LAB_WORK=str(work.resolve()),
               CI="true", PYDEVD_DISABLE_FILE_VALIDATION="1")
    cmd += ["--to", "notebook", "--execute", "--ExecutePreprocessor.timeout=3000",
            "--ExecutePreprocessor.kernel_name=python3", "--output-dir", str(out), "--output", nb.name, str(nb)]
    print(" ".join(cmd), flush=True)
    # The notebook's own folder is the kernel's working directory, as when a student opens it.
    executed = out / nb.name
    if executed.exists():
        executed.unlink()
    rc = subprocess.run(cmd, env=env, cwd=str(nb.parent)).returncode
    if rc == 0 and not executed.exists():
        print(f"jupyter nbconvert exited 0 but wrote no {executed}")
        return 1
    if rc == 0:
        print(f"executed copy: {executed}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
