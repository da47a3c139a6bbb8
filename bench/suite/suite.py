#!/usr/bin/env python3
"""The model suite (issue 40): fusebox against PyTorch eager, CUDA-graph replay and
torch.compile, per model and mode, one JSON per cell as it goes, then one merged JSON and a
markdown table with geometric means. bench/suite/run.sh is the one command; README.md says
what is measured and how.

    python3 bench/suite/suite.py --fusebox BIN [--out DIR] [--mode infer|train|both]
        [--models a,b] [--device cuda|cpu] [--dry-run] [--resume] [--time-limit S]
        [--variants eager,cuda_graph,compile] [--steps N] [--warmup N] [--keep-onnx]
    python3 bench/suite/suite.py --table --out DIR [--json F] [--markdown F]
    python3 bench/suite/suite.py --self-test
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import models  # noqa: E402
import report  # noqa: E402


def first_line(text):
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return "(no message)"


def fusebox_error(stderr):
    """A failed fusebox command's cell status: its error line, classified."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("fusebox: error:")]
    line = (errors[-1] if errors else (lines[-1] if lines else "(no message)"))[:300]
    lower = line.lower()
    if "onnx import" in lower:
        return "import refused: " + line
    if "out of memory" in lower:
        return "OOM: " + line
    return "run failed: " + line


def source_commit():
    """$GPU_CHECK_COMMIT, else the checkout's commit (as bench/common/torch_bench.py)."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class GpuMemorySampler:
    """The most device memory in use while a command runs, above what was in use before it,
    sampled from nvidia-smi every 0.2 s (for a `fusebox train` that prints no peak itself:
    it includes the CUDA context, and a peak shorter than a sample can be missed)."""

    def __init__(self, enabled):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.peak = None

    @staticmethod
    def used_bytes():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0")
                              .split(",")[0]], capture_output=True, text=True, timeout=10)
        return int(out.stdout.split()[0]) * 2**20

    def __enter__(self):
        if self.enabled:
            try:
                self.base = self.used_bytes()
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                self.enabled = False
                return self
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def _poll(self):
        while not self.stop.wait(0.2):
            try:
                used = self.used_bytes() - self.base
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue
            self.peak = max(self.peak or 0, used)

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()


def run_logged(command, log, timeout, env=None, first_marker=None):
    """Runs `command`, its stdout and stderr into `log`; returns (returncode, stdout, stderr,
    seconds, seconds until a stdout line matching the compiled regex `first_marker` arrived).
    A timeout is returncode None."""
    start = time.perf_counter()
    marker_s = None
    with open(log, "w") as log_file:
        log_file.write("$ " + " ".join(str(c) for c in command) + "\n")
        log_file.flush()
        proc = subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        err_chunks = []
        err_reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()),
                                      daemon=True)
        err_reader.start()
        out_lines = []
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                if first_marker and marker_s is None and first_marker.match(line):
                    marker_s = time.perf_counter() - start
                out_lines.append(line)
                log_file.write(line)
            proc.wait()
        finally:
            timed_out = not timer.is_alive() and proc.returncode not in (0,)
            timer.cancel()
        err_reader.join()
        stderr = "".join(err_chunks)
        log_file.write(stderr)
    seconds = time.perf_counter() - start
    rc = None if timed_out and proc.returncode < 0 else proc.returncode
    return rc, "".join(out_lines), stderr, seconds, marker_s


FIRST_STEP_LINE = re.compile(r"step +1/")  # fusebox train's progress line of step 1
STEADY = re.compile(r"steady state \(steps (\d+) to (\d+)\): ([\d.]+) \S+, ([\d.]+) ms/step")
# `fusebox train`'s peak on the GPU (its caching allocator's high-water mark, the whole run).
TRAIN_PEAK = re.compile(r"peak device memory: ([\d.]+) MiB")
TRAINED = re.compile(r"trained (\d+) steps .* in ([\d.]+) s, ([\d.]+) ")


def parse_train_output(stdout, batch):
    """ms/step and samples/s of `fusebox train`'s steady state (else its whole run)."""
    m = STEADY.search(stdout)
    if m:  # samples/s from the ms (the printed rate has one decimal)
        return {"ms_per_step": float(m.group(4)), "throughput": 1000 * batch / float(m.group(4)),
                "timed_steps": int(m.group(2)) - int(m.group(1)) + 1,
                "ms_source": "fusebox train: steady state (queued steps)"}
    m = TRAINED.search(stdout)
    if m:
        steps, seconds = int(m.group(1)), float(m.group(2))
        return {"ms_per_step": 1000 * seconds / steps, "throughput": batch * steps / seconds,
                "timed_steps": steps, "ms_source": "fusebox train: whole run (no steady state)"}
    return None


def train_steps_for(timed, warmup):
    """`fusebox train --steps` such that its steady state (after min(10, steps / 5) settling
    steps) holds at least `timed` steps, and at least `warmup` steps settle."""
    total = timed + 1
    while total - 1 - min(10, total // 5) < timed or min(10, total // 5) < min(warmup, 10):
        total += 1
    return total


class Suite:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = Path(args.work) if args.work else self.out / "work"
        for d in (self.out / "models", self.out / "logs", self.work):
            d.mkdir(parents=True, exist_ok=True)
        self.cuda = args.device == "cuda"
        self.commit = source_commit()

    def spec(self, name):
        s = models.BY_NAME[name]
        return s.for_cpu(self.args.cpu_batch) if not self.cuda else s

    def log(self, name):
        return self.out / "logs" / name

    # -- PyTorch's side ----------------------------------------------------------------------
    def torch_side(self, command, spec, mode, extra, log_name, timeout):
        cmd = [self.args.python, HERE / "torch_side.py", command, "--model", spec.name, "--mode",
               mode, "--device", self.args.device, "--cpu-batch", self.args.cpu_batch] + extra
        return run_logged(cmd, self.log(log_name), timeout)

    def export(self, spec, mode):
        path = self.work / f"{spec.name}_{mode}.onnx"
        rc, out, err, seconds, _ = self.torch_side("export", spec, mode, ["--out", path],
                                                   f"{spec.name}_{mode}_export.log",
                                                   self.args.export_timeout)
        if rc != 0:
            errors = [line for line in err.splitlines() if "Error" in line]
            why = "timeout" if rc is None else first_line(errors[-1] if errors else err)
            return {"status": f"export failed: {why}", "seconds": seconds}, None
        info = json.loads(out.strip().splitlines()[-1])
        return {"status": "ok", "seconds": seconds, "opset": info["opset"],
                "torch": info["torch"], "torchvision": info["torchvision"],
                "exporter": "torch.onnx.export, TorchScript-based (dynamo=False)",
                "training_form": mode == "train"}, path

    def torch_times(self, spec, mode):
        path = self.work / f"{spec.name}_{mode}_torch.json"
        rc, out, err, seconds, _ = self.torch_side(
            "time", spec, mode, ["--json", path, "--variants", self.args.variants, "--steps",
                                 self.args.steps, "--warmup", self.args.warmup],
            f"{spec.name}_{mode}_torch.log", self.args.torch_timeout)
        result = json.loads(path.read_text()) if path.exists() else {"variants": {}}
        if rc != 0:  # a crash (not a Python error: those are per variant) ends the rest
            why = "timeout" if rc is None else f"exit {rc}: {first_line(err[-2000:])}"
            for v in self.args.variants.split(","):
                result["variants"].setdefault(v, {"status": f"run failed: {why}"})
        result["seconds"] = seconds
        return result

    def reused_torch(self, spec, mode):
        """PyTorch's figures from --reuse-torch DIR's cell of the same model, mode, device and
        batch (PyTorch's side does not change with fusebox's commits), or None."""
        if not self.args.reuse_torch:
            return None
        path = report.cell_path(self.args.reuse_torch, spec.name, mode)
        if not path.exists():
            return None
        old = json.loads(path.read_text())
        same = (old.get("device") == self.args.device and old.get("precision") ==
                self.args.precision and old.get("config", {}).get("batch") ==
                spec.config(mode)["batch"] and old.get("torch", {}).get("variants"))
        if not same:
            return None
        return dict(old["torch"], reused_from=str(path))

    # -- fusebox's side ----------------------------------------------------------------------
    def fusebox_command(self, spec, mode, model_arg, runner, json_path, zoo, report=False):
        a = self.args
        batch = spec.train_batch if mode == "train" else spec.infer_batch
        common = ["--device", a.device, "--precision", a.precision]
        if runner == "bench":
            cmd = [a.fusebox, "bench", model_arg, "--mode", mode, "--steps", a.steps,
                   "--warmup", a.warmup, "--json", json_path] + common
            if report:  # profiled after the timed steps: the figures are the same
                cmd.append("--report")
            if zoo:  # bench has no --seq-len: a zoo decoder runs its own 1024 tokens
                cmd += ["--batch", batch] + ([] if spec.family == "gpt2" else [
                    "--image-size", spec.image_size, "--num-classes", spec.num_classes])
            return cmd
        cmd = [a.fusebox, "train", model_arg, "--synthetic", "--samples", 2 * batch,
               "--optimizer", spec.optimizer, "--log-every", 1,
               "--steps", train_steps_for(a.steps, a.warmup)] + common
        if zoo:
            cmd += ["--batch-size", batch]
            cmd += (["--seq-len", spec.image_size] if spec.family == "gpt2" else
                    ["--image-size", spec.image_size, "--num-classes", spec.num_classes])
        return cmd

    def fusebox_once(self, spec, mode, model_arg, runner, zoo, cache, tag):
        """One fusebox process; returns (figures, status)."""
        tag = f"zoo_{tag}" if zoo else tag  # a zoo run after a failed ONNX run keeps both logs
        json_path = self.work / f"{spec.name}_{mode}_fusebox_{tag}.json"
        json_path.unlink(missing_ok=True)
        report = self.args.report and runner == "bench" and tag.endswith("warm")
        cmd = self.fusebox_command(spec, mode, model_arg, runner, json_path, zoo, report)
        if runner == "train" and shutil.which("stdbuf"):  # each step's line as it comes
            cmd = ["stdbuf", "-oL"] + cmd
        env = dict(os.environ, FUSEBOX_CACHE_DIR=str(cache))
        with GpuMemorySampler(self.cuda and runner == "train") as sampler:
            rc, out, err, seconds, first_s = run_logged(
                cmd, self.log(f"{spec.name}_{mode}_fusebox_{tag}.log"), self.args.fusebox_timeout,
                env=env, first_marker=FIRST_STEP_LINE)
        if rc is None:
            return None, f"run failed: timeout after {self.args.fusebox_timeout} s"
        if rc != 0:
            return None, fusebox_error(err)
        if report:
            (self.out / "reports").mkdir(parents=True, exist_ok=True)
            (self.out / "reports" / f"{spec.name}_{mode}.txt").write_text(out)
        batch = spec.train_batch if mode == "train" else spec.infer_batch
        if runner == "bench":
            j = json.loads(json_path.read_text())
            return {"ms_per_step": 1000 * batch / j["images_per_s"],
                    "throughput": j["images_per_s"],
                    "ms_waited_median": j["step_ms_median"], "ms_min": j["step_ms_min"],
                    "ms_max": j["step_ms_max"], "host_us_per_step": j["host_us_per_step"],
                    "compile_s": j["compile_s"],
                    "peak_bytes": j["peak_device_bytes"] if self.cuda else None,
                    "ms_source": "fusebox bench: queued steps (batch / images_per_s)",
                    "seconds": seconds}, "ok"
        figures = parse_train_output(out, batch)
        if figures is None:
            return None, "run failed: no steady-state line in fusebox train's output"
        # The allocator's own peak where fusebox train prints it (comparable with PyTorch's
        # max_memory_allocated); else nvidia-smi's samples, which include the CUDA context.
        peak = TRAIN_PEAK.search(out)
        if peak:
            peak_bytes, peak_source = int(float(peak.group(1)) * 2**20), \
                "fusebox train: its allocator's peak (the whole run)"
        else:
            peak_bytes, peak_source = sampler.peak, (
                "nvidia-smi samples (includes the CUDA context)" if sampler.peak is not None
                else None)
        figures.update(compile_s=first_s if first_s is not None else seconds,
                       compile_s_source=("process start to step 1's loss line" if first_s
                                         is not None else "whole process (no step line seen)"),
                       peak_bytes=peak_bytes, peak_source=peak_source, seconds=seconds)
        return figures, "ok"

    def fusebox_side(self, spec, mode, model_arg, runner, zoo):
        """Cold (an empty plan cache) then warm (a second process with that cache)."""
        cache = self.work / f"{spec.name}_{mode}_cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        result = {"runner": f"fusebox {runner}", "source": f"zoo {model_arg}" if zoo else "onnx"}
        if zoo and runner == "bench" and spec.family == "gpt2" and spec.image_size != 1024:
            result["note"] = (f"fusebox bench has no --seq-len: the zoo's gpt2 ran 1024 tokens, "
                              f"PyTorch {spec.image_size}")
        cold, status = self.fusebox_once(spec, mode, model_arg, runner, zoo, cache, "cold")
        result["status"] = status
        if cold:
            result["cold"] = cold
            warm, status = self.fusebox_once(spec, mode, model_arg, runner, zoo, cache, "warm")
            result["warm"] = warm
            # The cold run's figures stand when the warm run fails; the status says so.
            result["status"] = "ok" if warm else f"ok (the warm run: {status})"
            best = warm or cold
            result.update(ms_per_step=best["ms_per_step"], throughput=best["throughput"],
                          peak_bytes=best.get("peak_bytes"), compile_s_cold=cold["compile_s"],
                          compile_s_warm=warm["compile_s"] if warm else None,
                          timed_run="warm" if warm else "cold")
        shutil.rmtree(cache, ignore_errors=True)
        return result

    def dry_import(self, spec, mode, path):
        rc, out, err, seconds, _ = run_logged(
            [self.args.fusebox, "inspect", path], self.log(f"{spec.name}_{mode}_inspect.log"),
            self.args.fusebox_timeout)
        status = "ok" if rc == 0 else ("run failed: timeout" if rc is None else fusebox_error(err))
        return {"status": status, "runner": "fusebox inspect (import only)", "seconds": seconds}

    # -- one cell ----------------------------------------------------------------------------
    def run_cell(self, spec, mode):
        a = self.args
        batch = spec.train_batch if mode == "train" else spec.infer_batch
        record = {"schema_version": report.SCHEMA_VERSION, "bench": "suite", "model": spec.name,
                  "mode": mode, "device": a.device, "commit": self.commit,
                  "precision": a.precision, "steps": a.steps, "warmup": a.warmup,
                  "dry_run": a.dry_run, "sides": a.sides, "config": spec.config(mode),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        record["config"]["optimizer_settings"] = (models.OPTIMIZERS[spec.optimizer]
                                                  if mode == "train" else None)
        record["config"]["unit"] = spec.unit
        start = time.perf_counter()
        fusebox_side = a.sides in ("both", "fusebox")
        zoo_only = a.fusebox_source == "zoo" and spec.zoo
        record["export"], path = (
            ({"status": "skipped: --sides torch"}, None) if not fusebox_side else
            ({"status": "skipped: --fusebox-source zoo"}, None) if zoo_only and not a.dry_run
            else self.export(spec, mode))
        runner = spec.fusebox_train if mode == "train" else "bench"
        if not fusebox_side:
            record["fusebox"] = {"status": "skipped: --sides torch"}
            record["torch"] = self.torch_times(spec, mode)
        elif a.dry_run:
            record["fusebox"] = (self.dry_import(spec, mode, path) if path
                                 else {"status": "skipped: no export"})
        else:
            fb = (self.fusebox_side(spec, mode, path, runner, zoo=False) if path
                  else {"status": "skipped: no export"})
            if zoo_only or (not report.is_ok(fb["status"]) and mode == "train" and spec.zoo):
                onnx_status = ("not tried: --fusebox-source zoo" if zoo_only else
                               fb["status"] if path else record["export"]["status"])
                fb = self.fusebox_side(spec, mode, spec.zoo, self.zoo_runner(spec, mode),
                                       zoo=True)
                fb["onnx_status"] = onnx_status
            record["fusebox"] = fb
            record["torch"] = self.reused_torch(spec, mode) or (
                self.torch_times(spec, mode) if a.sides == "both"
                else {"variants": {}, "status": "skipped: --sides fusebox"})
        if path and not a.keep_onnx:
            path.unlink(missing_ok=True)
        record["seconds"] = time.perf_counter() - start
        record["status"] = self.cell_status(record)
        record["batch"] = batch
        return record

    @staticmethod
    def zoo_runner(spec, mode):
        """How fusebox runs a zoo model: bench, except training that bench cannot do (AdamW,
        labels per pixel or per token)."""
        bench_trains = spec.family == "classifier" and spec.optimizer == "sgd"
        return "bench" if mode == "infer" or bench_trains else "train"

    @staticmethod
    def cell_status(record):
        """ok, or the first failing part: export, fusebox, then PyTorch's variants; a side
        left out (--sides) is not a failure."""
        def skipped(status):
            return str(status).startswith(("skipped: --sides", "skipped: --fusebox-source"))
        fb = record["fusebox"]
        zoo = fb.get("source", "").startswith("zoo")
        export = record["export"]["status"]
        if not report.is_ok(export) and not skipped(export) and not zoo:
            return export
        if not report.is_ok(fb["status"]) and not skipped(fb["status"]):
            return "fusebox " + fb["status"]
        for v, r in record.get("torch", {}).get("variants", {}).items():
            if not report.is_ok(r.get("status")) and not r.get("status", "").startswith("skipped"):
                return f"torch {v} {r['status']}"
        only = ("" if record.get("dry_run") or record.get("sides", "both") == "both"
                else f", {record['sides']} only")
        return ("ok (zoo" + only + ")" if zoo else "ok" + (f" ({only[2:]})" if only else ""))

    def run(self):
        a = self.args
        modes = ["infer", "train"] if a.mode == "both" else [a.mode]
        specs = models.select(a.models)
        start, longest = time.perf_counter(), 0.0
        skipped = []
        for spec in specs:
            for mode in modes:
                path = report.cell_path(self.out, spec.name, mode)
                if a.resume and path.exists():
                    print(f"{spec.name} {mode}: done before (--resume), skipped", flush=True)
                    continue
                elapsed = time.perf_counter() - start
                if a.time_limit and elapsed + longest > a.time_limit:
                    skipped.append(f"{spec.name} {mode}")
                    continue
                print(f"{spec.name} {mode}: ...", flush=True)
                record = self.run_cell(self.spec(spec.name), mode)
                longest = max(longest, record["seconds"])
                path.write_text(json.dumps(record, indent=1) + "\n")
                r = report.ratios(record)
                fb = record["fusebox"]
                if a.dry_run:
                    print(f"{spec.name} {mode}: export {record['export']['status']}; fusebox "
                          f"import {fb['status']} ({record['seconds']:.0f} s)", flush=True)
                    continue
                print(f"{spec.name} {mode}: {record['status']}; fusebox "
                      f"{report._ms(fb.get('ms_per_step'))} ms, x eager {report._x(r['vs_eager'])}"
                      f", x graph {report._x(r['vs_cuda_graph'])}, x compile "
                      f"{report._x(r['vs_compile'])} ({record['seconds']:.0f} s)", flush=True)
        if skipped:
            print(f"time limit ({a.time_limit} s) reached; not started: {', '.join(skipped)} "
                  "(run again with --resume)", flush=True)
        merged = report.merge(self.out, a.json, a.markdown)
        print(report.markdown(merged))
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="check the merge and table logic")
    ap.add_argument("--table", action="store_true",
                    help="only merge --out's per-model JSON files into the JSON and table")
    ap.add_argument("--fusebox", help="the fusebox binary")
    ap.add_argument("--out", help="the results folder (default bench/results/suite_<date>_"
                                  "<device>)")
    ap.add_argument("--work", help="exports, caches and raw JSON (default OUT/work)")
    ap.add_argument("--json", help="the merged JSON (default OUT/suite.json)")
    ap.add_argument("--markdown", help="the table (default OUT/suite.md)")
    ap.add_argument("--mode", choices=("infer", "train", "both"), default="both")
    ap.add_argument("--models", default="all", help="comma-separated names from models.py")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--precision", choices=("bf16", "f32"),
                    help="fusebox's --precision: bf16 (default), f32 on --device cpu (PyTorch: "
                         "bf16 on CUDA, f32 on the CPU)")
    ap.add_argument("--report", action="store_true",
                    help="the warm inference run with fusebox bench --report (fusion groups, "
                         "time by node and op, copies): OUT/reports/<model>_<mode>.txt")
    ap.add_argument("--dry-run", action="store_true",
                    help="only export and import (fusebox inspect): no timing")
    ap.add_argument("--resume", action="store_true",
                    help="skip the cells whose JSON is already in OUT/models")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="start no cell after this many seconds minus the longest cell so far")
    ap.add_argument("--sides", choices=("both", "fusebox", "torch"), default="both",
                    help="run one side only (fusebox: PyTorch's figures from --reuse-torch "
                         "or none)")
    ap.add_argument("--reuse-torch", metavar="DIR",
                    help="take PyTorch's figures from an earlier run's OUT (same model, mode, "
                         "device, precision and batch) instead of measuring them again")
    ap.add_argument("--fusebox-source", choices=("onnx", "zoo"), default="onnx",
                    help="zoo: fusebox runs its zoo model where models.py names one (both "
                         "modes), not the ONNX export")
    ap.add_argument("--variants", default="eager,cuda_graph,compile",
                    help="PyTorch's variants (eager, cuda_graph, compile)")
    ap.add_argument("--steps", type=int, help=f"timed steps (default {models.TIMED_STEPS}; "
                                              "cpu 3)")
    ap.add_argument("--warmup", type=int, help=f"warm-up steps (default {models.WARMUP_STEPS}; "
                                               "cpu 1)")
    ap.add_argument("--cpu-batch", type=int, default=2,
                    help="the batch on --device cpu (training's batch norms need 2)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    ap.add_argument("--keep-onnx", action="store_true", help="keep the exports in the work dir")
    ap.add_argument("--export-timeout", type=float, help="s (default 300; cpu 600)")
    ap.add_argument("--fusebox-timeout", type=float,
                    help="s, each fusebox process (default 300; cpu 900)")
    ap.add_argument("--torch-timeout", type=float,
                    help="s, PyTorch's variants together (default 480; cpu 900)")
    args = ap.parse_args()
    if args.self_test:
        import self_test
        return self_test.main()
    if not args.out:
        args.out = str(HERE.parent / "results" /
                       f"suite_{time.strftime('%Y-%m-%d', time.gmtime())}_{args.device}")
    if args.table:
        merged = report.merge(args.out, args.json, args.markdown)
        print(report.markdown(merged))
        return 0
    if not args.fusebox:
        ap.error("--fusebox BIN is needed to run (bench/suite/run.sh finds it)")
    try:
        models.select(args.models)
    except ValueError as e:
        ap.error(str(e))
    cpu = args.device == "cpu"
    args.precision = args.precision or ("f32" if cpu else "bf16")
    args.export_timeout = args.export_timeout or (600 if cpu else 300)
    args.fusebox_timeout = args.fusebox_timeout or (900 if cpu else 300)
    args.torch_timeout = args.torch_timeout or (900 if cpu else 480)
    args.steps = args.steps or (3 if cpu else models.TIMED_STEPS)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else models.WARMUP_STEPS)
    if cpu and args.variants == "eager,cuda_graph,compile":
        args.variants = "eager"  # CUDA graphs need CUDA; Inductor on a CPU takes minutes
    return Suite(args).run()


if __name__ == "__main__":
    sys.exit(main())
