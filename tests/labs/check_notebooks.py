"""The notebooks in git carry no outputs: every code cell has no outputs and no execution count.
(Executed copies go to build/labs/; clear a notebook with
 jupyter nbconvert --clear-output --inplace notebooks/NAME.ipynb.)"""
import json
import pathlib
import sys


def main(folder):
    notebooks = sorted(pathlib.Path(folder).glob("*.ipynb"))
    if not notebooks:
        print(f"no notebooks in {folder}")
        return 1
    bad = []
    for nb in notebooks:
        try:
            cells = json.loads(nb.read_text())["cells"]
        except (ValueError, KeyError) as e:
            bad.append(f"{nb}: not a notebook ({e})")
            continue
        for i, c in enumerate(cells):
            if c.get("cell_type") != "code":
                continue
            if c.get("outputs"):
                bad.append(f"{nb}: cell {i} has {len(c['outputs'])} outputs")
            if c.get("execution_count") is not None:
                bad.append(f"{nb}: cell {i} has execution_count {c['execution_count']}")
        print(f"{nb.name}: {len(cells)} cells checked")
    for b in bad:
        print(b)
    if bad:
        print("clear them with: jupyter nbconvert --clear-output --inplace notebooks/*.ipynb")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
