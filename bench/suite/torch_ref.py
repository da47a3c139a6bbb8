"""PyTorch's side of earlier suite runs, gathered for `--reuse-torch`: for each model and mode, the
newest cell of the committed results (`bench/results/**/suite.json`) whose PyTorch side ran (not
one reused itself), written as DIR/models/<model>_<mode>.json.

    python3 bench/suite/torch_ref.py DIR [--results bench/results]
    bench/suite/run.sh --sides fusebox --reuse-torch DIR ...

The suite takes a cell only where device, precision and batch match (suite.py reused_torch)."""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import report  # noqa: E402  (cell_path: the one place a cell's file name is made)


def newest_cells(results):
    best = {}
    for path in sorted(pathlib.Path(results).glob("**/suite.json")):
        for cell in json.loads(path.read_text()).get("cells", []):
            torch = cell.get("torch") or {}
            if not torch.get("variants") or torch.get("reused_from"):
                continue
            key = (cell["model"], cell["mode"])
            if key not in best or cell.get("started", "") > best[key][0].get("started", ""):
                best[key] = (cell, path)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the folder --reuse-torch is given")
    ap.add_argument("--results", default="bench/results", help="where the suite.json files are")
    args = ap.parse_args()
    best = newest_cells(args.results)
    if not best:
        sys.exit(f"torch_ref: no suite cell with PyTorch's side under {args.results}")
    for (model, mode), (cell, path) in sorted(best.items()):
        target = report.cell_path(args.out, model, mode)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(cell, indent=1))
        print(f"{model} {mode} batch {cell.get('config', {}).get('batch')}: {path}")


if __name__ == "__main__":
    main()
