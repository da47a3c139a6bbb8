#!/usr/bin/env python3
"""fusebox's CPU backends against onnxruntime (issue 43's benchmark): zoo models exported by
`fusebox zoo`, run by `fusebox bench --device cpu` (the fast kernels where they take a node) and
`--device cpu-ref` (the reference kernels), and by onnxruntime's CPU provider in the same run
with the same number of threads. Median latency per step, one table and one JSON.

    .venv/bin/python bench/cpu_vs_onnxruntime.py [--fusebox BIN] [--models resnet50,...]
        [--batches 1,8] [--steps N] [--rounds R] [--threads T] [--json F] [--no-reference]
        [--bf16] [--seq-len T] [--whole-process N]

--rounds R (default 1): R rounds per model and batch, each a fusebox run then an onnxruntime
run (one session, made once) of --steps steps, interleaved so that a shared machine's slow
spells fall on both sides alike; each side's figure is the median of its rounds' medians, and
`round_ratios` lists each round's onnxruntime / fusebox.

Decoders (gpt2*) run `--seq-len` tokens per sequence (default 128), random token ids.

--bf16 adds fusebox's `--precision bf16` run (oneDNN's bf16 kernels where the CPU has AVX-512
BF16 / AMX) beside the f32 one; onnxruntime runs the f32 model either way.

--whole-process N adds the whole process of one inference, start-up included, as a user meets
it: `fusebox run MODEL --device cpu` against a Python process that imports onnxruntime, makes a
session and runs it once (its usual front end); median wall time of N processes each, and the
largest resident memory (GNU time's max RSS; n/a without /usr/bin/time).

Needs onnxruntime and numpy (scripts/setup.sh puts them in .venv)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_MODELS = "resnet50,mobilenet_v3_small,vit_b_16"


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-2000:]}")
    return done.stdout


def fusebox_ms(binary, model, device, steps, json_path, precision="f32"):
    run([binary, "bench", model, "--device", device, "--precision", precision, "--steps", str(steps),
         "--warmup", "2", "--json", json_path])
    with open(json_path) as f:
        j = json.load(f)
    return j["step_ms_median"], j.get("fast_nodes"), j.get("compile_s")


def onnxruntime_session(model, threads):
    """A session of `model` and its feeds, and the seconds to its first run's end."""
    import numpy as np
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    start = time.perf_counter()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {}
    rng = np.random.default_rng(0)
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 10, size=shape).astype(np.int64)
        else:
            feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    session.run(None, feeds)
    return session, feeds, time.perf_counter() - start


def onnxruntime_ms(session, feeds, steps):
    """Median ms of `steps` runs after two warm-up runs."""
    for _ in range(2):
        session.run(None, feeds)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


ORT_ONE_RUN = """
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = int(sys.argv[2]); o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {i.name: (rng.integers(0, 10, size=[d if isinstance(d, int) else 1 for d in i.shape])
                  .astype(np.int64) if "int" in i.type else
                  rng.uniform(-1, 1, size=[d if isinstance(d, int) else 1 for d in i.shape])
                  .astype(np.float32)) for i in s.get_inputs()}
s.run(None, feeds)
"""


GNU_TIME = "/usr/bin/time"


def whole_process(cmd, runs):
    """Median wall seconds of `runs` processes of cmd, and the largest max RSS (MiB) among them
    (None without GNU time). The RSS is GNU time's: a child forked from this process would
    count this process's own resident pages (this benchmark's onnxruntime sessions) in its
    ru_maxrss, which survives the exec; time's child is forked from time, a small process."""
    walls, rss = [], None
    timed = os.access(GNU_TIME, os.X_OK)
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(([GNU_TIME, "-f", "fusebox-max-rss-kib %M"] if timed else []) + cmd,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        for line in done.stderr.splitlines():
            if line.startswith("fusebox-max-rss-kib "):
                rss = max(rss or 0, int(line.split()[1]) / 1024)
    return statistics.median(walls), rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fusebox", default="build/release/tools/fusebox")
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved fusebox / onnxruntime rounds (medians of rounds)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    ap.add_argument("--no-reference", action="store_true", help="skip --device cpu-ref (slow)")
    ap.add_argument("--bf16", action="store_true", help="also fusebox --precision bf16")
    ap.add_argument("--seq-len", type=int, default=128, help="decoders' tokens per sequence")
    ap.add_argument("--whole-process", type=int, default=0, metavar="N",
                    help="also time N whole processes of one inference each side")
    a = ap.parse_args()
    # fusebox's reference and oneDNN's OpenMP threads: the same count as onnxruntime's.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            for batch in [int(b) for b in a.batches.split(",")]:
                model = os.path.join(tmp, f"{name}_b{batch}.onnx")
                decoder = name.startswith("gpt2")
                run([a.fusebox, "zoo", name, "--out", model, "--batch", str(batch), "--seed", "0"]
                    + (["--seq-len", str(a.seq_len)] if decoder else []))
                row = {"model": name, "batch": batch, "threads": a.threads}
                if decoder:
                    row["seq_len"] = a.seq_len
                try:
                    session, feeds, row["onnxruntime_first_s"] = onnxruntime_session(
                        model, a.threads)
                    fast, ort_ms = [], []
                    for _ in range(max(1, a.rounds)):
                        ms, row["fast_nodes"], row["fast_compile_s"] = fusebox_ms(
                            a.fusebox, model, "cpu", a.steps, os.path.join(tmp, "f.json"))
                        fast.append(ms)
                        ort_ms.append(onnxruntime_ms(session, feeds, a.steps))
                    del session
                    row["fast_ms"] = statistics.median(fast)
                    row["onnxruntime_ms"] = statistics.median(ort_ms)
                    row["rounds"] = len(fast)
                    row["round_ratios"] = [round(o / f, 3) for o, f in zip(ort_ms, fast)]
                    if a.bf16:
                        row["fast_bf16_ms"], _, _ = fusebox_ms(
                            a.fusebox, model, "cpu", a.steps, os.path.join(tmp, "b.json"), "bf16")
                    if not a.no_reference:
                        row["reference_ms"], _, _ = fusebox_ms(
                            a.fusebox, model, "cpu-ref", max(2, a.steps // 4),
                            os.path.join(tmp, "r.json"))
                    row["fast_vs_onnxruntime"] = row["onnxruntime_ms"] / row["fast_ms"]
                    if a.whole_process:
                        row["process_s"], row["process_rss_mib"] = whole_process(
                            [a.fusebox, "run", model, "--device", "cpu"], a.whole_process)
                        row["onnxruntime_process_s"], row["onnxruntime_process_rss_mib"] = (
                            whole_process([sys.executable, "-c", ORT_ONE_RUN, model,
                                           str(a.threads)], a.whole_process))
                        row["process_vs_onnxruntime"] = (row["onnxruntime_process_s"]
                                                         / row["process_s"])
                    if a.bf16:
                        row["fast_bf16_vs_onnxruntime"] = row["onnxruntime_ms"] / row["fast_bf16_ms"]
                except RuntimeError as e:
                    row["error"] = str(e)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'model':<20}{'batch':>6}{'fast ms':>10}{'ref ms':>10}{'ort ms':>10}{'ort/fast':>10}"
          f"{'fast nodes':>14}{'bf16 ms':>10}{'ort/bf16':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<20}{r['batch']:>6}  error: {r['error'].splitlines()[0]}")
            continue
        ref = f"{r['reference_ms']:.1f}" if "reference_ms" in r else "-"
        bf16 = (f"{r['fast_bf16_ms']:>10.1f}{r['fast_bf16_vs_onnxruntime']:>9.2f}x"
                if "fast_bf16_ms" in r else "")
        print(f"{r['model']:<20}{r['batch']:>6}{r['fast_ms']:>10.1f}{ref:>10}"
              f"{r['onnxruntime_ms']:>10.1f}{r['fast_vs_onnxruntime']:>9.2f}x{r['fast_nodes']:>14}"
              f"{bf16}")
    def mib(v):
        return "n/a" if v is None else f"{v:.0f}"

    if any("process_s" in r for r in rows):
        print(f"\nwhole process (one inference, start-up included): median s, max RSS MiB\n"
              f"{'model':<20}{'batch':>6}{'fusebox s':>11}{'ort s':>9}{'ort/fb':>8}"
              f"{'fusebox MiB':>13}{'ort MiB':>9}")
        for r in rows:
            if "process_s" in r:
                print(f"{r['model']:<20}{r['batch']:>6}{r['process_s']:>11.3f}"
                      f"{r['onnxruntime_process_s']:>9.3f}{r['process_vs_onnxruntime']:>7.2f}x"
                      f"{mib(r['process_rss_mib']):>13}{mib(r['onnxruntime_process_rss_mib']):>9}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema_version": 1, "bench": "cpu_vs_onnxruntime", "rows": rows}, f,
                      indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
