#!/usr/bin/env python3
"""Hostile models through the fusebox CLI, as a user would meet them (issue 38).

Every model (*.onnx under the given folders: the fuzz corpus and its regressions) goes through
`fusebox run` on each device asked for, and through `fusebox train ... --synthetic` on the
first. Each command must end in one of three ways: exit 0; exit 1 with exactly one line on
stderr, "fusebox: error: [where] what", that is not a bare std::bad_alloc; or exit 2 (a usage
error). A signal, a hang past --timeout, or anything else is a failure. A model refused on one
device is refused with the same message on the others when the refusal comes before the device
is involved (import, shape inference): the errors a user gets do not depend on --device.

    cli_models.py --fusebox build/release/tools/fusebox --devices cpu,cuda \\
        tests/data/fuzz/corpus tests/data/fuzz/regressions

Prints one line per failure and a summary; exits 1 when anything failed, 77 (skipped) when a
device asked for is absent (`--devices cpu,cuda` on a machine without a GPU).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

# Messages from before any device is involved: the same on every device.
DEVICE_FREE_PREFIXES = ("fusebox: error: [onnx import", "fusebox: error: [graph ")


def run(cmd, timeout, cwd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                           errors="replace")
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        return None, "timed out"


def verdict(rc, err, usage_allowed):
    """None when the ending is one a user may get; else what is wrong."""
    if rc is None:
        return "hang (no exit within the timeout)"
    if rc < 0:
        return f"killed by signal {-rc}"
    if rc == 0 or (rc == 2 and usage_allowed):
        return None
    if rc == 2:
        return f"a usage error for a well-formed command line: {err.strip()[:300]!r}"
    if rc != 1:
        return f"exit {rc}"
    lines = [l for l in err.splitlines() if l.strip()]
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr, not one: {err[:300]!r}"
    if not lines[0].startswith("fusebox: error: "):
        return f"the error line does not start 'fusebox: error: ': {lines[0][:200]!r}"
    if lines[0].rstrip().endswith("std::bad_alloc"):
        return f"a bare std::bad_alloc: {lines[0]!r}"
    return None


def cuda_present(fusebox):
    # `run --device auto` is not a probe: ask nvidia-smi, as a user would.
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="folders of *.onnx models")
    ap.add_argument("--fusebox", required=True)
    ap.add_argument("--devices", default="cpu", help="cpu, cuda or cpu,cuda (default cpu)")
    ap.add_argument("--no-train", action="store_true", help="skip `fusebox train`")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per command")
    ap.add_argument("--memory-limit", default="4G",
                    help="--memory-limit for every command (default 4G; '' gives none)")
    ap.add_argument("--json", help="write the outcome of every command here")
    args = ap.parse_args()
    args.devices = args.devices.split(",")
    if not args.devices or any(d not in ("cpu", "cuda") for d in args.devices):
        ap.error(f"--devices takes cpu, cuda or cpu,cuda; got {','.join(args.devices)!r}")

    if "cuda" in args.devices and not cuda_present(args.fusebox):
        print("cli_models: skipped: --devices cuda, and this machine has no CUDA device")
        return 77
    models = sorted(p for f in args.folders for p in pathlib.Path(f).glob("*.onnx"))
    if not models:
        print(f"cli_models: no *.onnx under {args.folders}")
        return 1
    fusebox = os.path.abspath(args.fusebox)
    failures, outcomes = [], []
    counts = {"ok": 0, "refused": 0, "usage": 0}
    with tempfile.TemporaryDirectory(prefix="fusebox_cli_models_") as tmp:
        for model in models:
            first_error = None
            limit = ["--memory-limit", args.memory_limit] if args.memory_limit else []
            commands = [(d, [fusebox, "run", str(model.resolve()), "--device", d,
                             "--output-dir", os.path.join(tmp, "out")] + limit)
                        for d in args.devices]
            if not args.no_train:
                commands.append((f"train-{args.devices[0]}",
                                 [fusebox, "train", str(model.resolve()), "--synthetic",
                                  "--steps", "1", "--samples", "4", "--device", args.devices[0]] +
                                 limit))
            for label, cmd in commands:
                rc, err = run(cmd, args.timeout, tmp)
                # `run` is given a well-formed command line; `train` may find the model has
                # nothing to train (a usage error, exit 2).
                wrong = verdict(rc, err, usage_allowed=label.startswith("train"))
                line = err.strip().splitlines()[0] if rc == 1 and err.strip() else ""
                outcomes.append({"model": model.name, "command": label, "exit": rc,
                                 "error": line[:500]})
                if wrong is None and not label.startswith("train") and rc == 1 and \
                        line.startswith(DEVICE_FREE_PREFIXES):
                    if first_error is None:
                        first_error = (label, line)
                    elif line != first_error[1]:
                        wrong = (f"refused differently than on {first_error[0]}: "
                                 f"{first_error[1][:200]!r} vs {line[:200]!r}")
                if wrong:
                    failures.append(f"{model.name} [{label}]: {wrong}")
                    print(f"FAILED {model.name} [{label}]: {wrong}", flush=True)
                else:
                    counts["ok" if rc == 0 else "refused" if rc == 1 else "usage"] += 1
    total = len(outcomes)
    print(f"cli_models: {len(models)} models, {total} commands ({', '.join(args.devices)}"
          f"{'' if args.no_train else ', train'}): {counts['ok']} ran, {counts['refused']} "
          f"refused with one clear line, {counts['usage']} usage errors, {len(failures)} failed")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"models": len(models), "commands": total, "counts": counts,
             "failures": failures, "outcomes": outcomes}, indent=1))
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
