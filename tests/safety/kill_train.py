#!/usr/bin/env python3
"""SIGTERM or SIGKILL at any moment of `fusebox train --checkpoint-every N` (issue 38).

Each round starts a training run that writes a checkpoint every few steps, sends it SIGTERM or
SIGKILL after a random delay (seeded: compiling, training, or while a checkpoint is written),
then checks what a user would rely on:
- SIGTERM: exit 143, and the final checkpoint written; SIGKILL: exit -9 (killed);
- the checkpoint file (if any step reached one) resumes: a second run `--resume`s it for one
  step, exits 0 and writes the checkpoint again;
- after that second run no `*.tmp.*` file is left beside the checkpoint.

    kill_train.py --fusebox build/release/tools/fusebox --device cuda --rounds 8 \\
        --model resnet18 --extra "--precision bf16 --batch-size 64"

Prints one line per round and "N passed, N failed"; exits 1 when a round failed.
"""
import argparse
import os
import pathlib
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fusebox", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="small_cnn")
    ap.add_argument("--extra", default="", help="more train options, one string")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--every", type=int, default=3, help="--checkpoint-every")
    ap.add_argument("--max-delay", type=float, default=8.0, help="seconds, at most, before the kill")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    fusebox = os.path.abspath(args.fusebox)
    base = [fusebox, "train", args.model, "--synthetic", "--device", args.device] + \
        shlex.split(args.extra)
    passed, failed = 0, 0
    with tempfile.TemporaryDirectory(prefix="fusebox_kill_train_") as tmp:
        folder = pathlib.Path(tmp)
        checkpoint = folder / "ck.npz"
        for r in range(args.rounds):
            sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
            delay = rng.uniform(0.2, args.max_delay)
            cmd = base + ["--steps", "1000000", "--checkpoint", str(checkpoint),
                          "--checkpoint-every", str(args.every)]
            if checkpoint.exists():
                cmd += ["--resume", str(checkpoint)]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(delay)
            p.send_signal(sig)
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                print(f"round {r}: FAILED: no exit within 120 s of {sig.name}")
                failed += 1
                continue
            problems = []
            if sig == signal.SIGTERM:
                # Before its first step a run may die at once (nothing trained, --help says so).
                if p.returncode not in (143, -signal.SIGTERM):
                    problems.append(f"exit {p.returncode} after SIGTERM (want 143): "
                                    f"{err.strip()[-300:]!r}")
                if p.returncode == 143 and "wrote checkpoint" not in out:
                    problems.append("exit 143 without 'wrote checkpoint'")
            elif p.returncode != -signal.SIGKILL:
                problems.append(f"exit {p.returncode} after SIGKILL")
            # The checkpoint as it stands must resume, and that run leaves no temporaries.
            if checkpoint.exists():
                resume = subprocess.run(base + ["--steps", "1", "--resume", str(checkpoint),
                                                "--checkpoint", str(checkpoint)],
                                        capture_output=True, text=True, timeout=600)
                if resume.returncode != 0:
                    problems.append(f"the checkpoint does not resume: {resume.stderr.strip()!r}")
            else:
                # No checkpoint yet: only possible when killed before the first one was due.
                pass
            stray = sorted(f.name for f in folder.iterdir() if ".tmp." in f.name)
            if checkpoint.exists() and stray:
                problems.append(f"stray files after the next run: {stray}")
            state = "checkpoint" if checkpoint.exists() else "no checkpoint yet"
            if problems:
                failed += 1
                print(f"round {r}: {sig.name} after {delay:.1f} s: FAILED: {'; '.join(problems)}")
            else:
                passed += 1
                print(f"round {r}: {sig.name} after {delay:.1f} s: exit {p.returncode}, {state}, "
                      f"resumes, no stray files")
            sys.stdout.flush()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
