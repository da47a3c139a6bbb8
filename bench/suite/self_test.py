"""suite.py --self-test: the suite's merge, geometric means, targets' verdicts, cell statuses,
reuse of PyTorch's figures and output parsing, on made-up JSON. Pure Python (no torch, no
fusebox, no GPU); not registered in ctest (CI has no torch), run by hand:

    python3 bench/suite/suite.py --self-test
"""
import argparse
import json
import math
import tempfile
from pathlib import Path

import models
import report
from suite import (FIRST_STEP_LINE, TRAIN_PEAK, Suite, fusebox_error, parse_train_output,
                   train_steps_for)


def fake_cell(model, mode, fb_ms, eager, graph, compiled, fb_peak=1 << 30, eager_peak=2 << 30,
              status="ok", source="onnx", cold=10.0, warm=2.0):
    def variant(ms):
        return {"status": "ok", "ms_per_step": ms, "peak_bytes": eager_peak,
                "first_step_s": 30.0} if ms else {"status": "run failed: X"}
    return {"schema_version": 1, "bench": "suite", "model": model, "mode": mode,
            "device": "fake", "commit": "abc", "config": {"batch": 8}, "status": status,
            "export": {"status": "ok"},
            "fusebox": {"status": "ok" if fb_ms else "import refused: fusebox: error: onnx",
                        "ms_per_step": fb_ms, "peak_bytes": fb_peak, "source": source,
                        "compile_s_cold": cold, "compile_s_warm": warm},
            "torch": {"torch": "0", "variants": {"eager": variant(eager),
                                                 "cuda_graph": variant(graph),
                                                 "compile": variant(compiled)}}}


def main():
    checks = []

    def check(name, cond):
        checks.append((name, bool(cond)))
        print(f"{'ok  ' if cond else 'FAIL'} {name}")

    with tempfile.TemporaryDirectory() as tmp:
        cells = [fake_cell("a", "infer", 10, 20, 15, 13, fb_peak=3 << 30),
                 fake_cell("b", "infer", 10, 40, 30, 20, cold=20.0, warm=6.0),
                 fake_cell("c", "infer", None, 10, 10, 10, status="fusebox import refused"),
                 fake_cell("d", "infer", 10, 12, 9, None),
                 fake_cell("a", "train", 10, 11, 10.5, 11, source="zoo resnet50")]
        (Path(tmp) / "models").mkdir()
        for c in cells:
            report.cell_path(tmp, c["model"], c["mode"]).write_text(json.dumps(c))
        merged = report.merge(tmp)
        s = merged["summary"]["infer"]
        check("geomean over complete models only", s["models_in_geomean"] == ["a", "b"])
        check("geomean vs compile", math.isclose(s["geomean_vs_compile"], math.sqrt(1.3 * 2.0)))
        check("geomean vs eager", math.isclose(s["geomean_vs_eager"], math.sqrt(2.0 * 4.0)))
        v = s["verdict"]
        check("geomean target verdict", v["geomean_vs_compile"]["met"] is True)
        check("below cuda graph", v["min_vs_cuda_graph"]["below"] == ["d"])
        check("none below compile", v["min_vs_compile"]["below"] == [])
        check("compile over targets", v["compile_s"]["over"] == {"warm": ["b"], "cold": ["b"]})
        check("memory over eager", v["memory_over_eager"] == ["a"])
        check("not ok listed", v["not_ok"] == ["c"])
        check("train summary", merged["summary"]["train"]["models_in_geomean"] == ["a"])
        check("train target missed",
              merged["summary"]["train"]["verdict"]["geomean_vs_compile"]["met"] is False)
        md = (Path(tmp) / "suite.md").read_text()
        check("markdown rows", md.count("\n| a") == 2 and "| c |" in md)
        check("markdown zoo mark", "| a* |" in md)
        check("markdown geomean", "geomean (2 models)" in md and "1.61x" in md)
        check("merged json written", json.loads((Path(tmp) / "suite.json").read_text())
              ["summary"]["infer"]["models_in_geomean"] == ["a", "b"])
    check("ratio None without fusebox", report.ratios(cells[2])["vs_eager"] is None)
    check("zoo runners", [Suite.zoo_runner(models.BY_NAME[n], m) for n, m in (
        ("resnet50", "train"), ("vit_b_16", "train"), ("gpt2", "infer"), ("unet", "train"))]
        == ["bench", "train", "bench", "train"])
    status = Suite.cell_status
    ok_torch = {"variants": {"eager": {"status": "ok"},
                             "cuda_graph": {"status": "skipped: CUDA graphs need a CUDA device"}}}
    check("status ok", status({"export": {"status": "ok"}, "fusebox": {"status": "ok"},
                               "torch": ok_torch}) == "ok")
    check("status export failed", status({"export": {"status": "export failed: E"},
                                          "fusebox": {"status": "skipped: no export"}})
          == "export failed: E")
    check("status zoo", status({"export": {"status": "export failed: E"}, "torch": ok_torch,
                                "fusebox": {"status": "ok", "source": "zoo gpt2"}}) == "ok (zoo)")
    check("status fusebox", status({"export": {"status": "ok"}, "fusebox": {
        "status": "import refused: fusebox: error: onnx import: x"}}).startswith(
            "fusebox import refused: "))
    check("status torch", status({"export": {"status": "ok"}, "fusebox": {"status": "ok"},
                                  "torch": {"variants": {"compile": {"status": "OOM: X"}}}})
          == "torch compile OOM: X")
    check("status one side", status({"export": {"status": "ok"}, "fusebox": {"status": "ok"},
                                      "sides": "fusebox", "torch": {"variants": {}}})
          == "ok (fusebox only)")
    with tempfile.TemporaryDirectory() as tmp:
        earlier = Path(tmp) / "earlier"
        (earlier / "models").mkdir(parents=True)
        cell = fake_cell("resnet50", "infer", 10, 20, 15, 13)
        cell.update(device="cuda", precision="bf16", config={"batch": 256})
        report.cell_path(earlier, "resnet50", "infer").write_text(json.dumps(cell))
        args = argparse.Namespace(out=str(Path(tmp) / "now"), work=None, device="cuda",
                                  precision="bf16", reuse_torch=str(earlier))
        suite = Suite(args)
        got = suite.reused_torch(models.BY_NAME["resnet50"], "infer")
        check("torch figures reused", got and got["variants"]["eager"]["ms_per_step"] == 20
              and got["reused_from"].endswith("resnet50_infer.json"))
        check("torch figures of another batch not reused",
              suite.reused_torch(models.BY_NAME["resnet50"], "train") is None)
        vars(args).update(fusebox="fb", steps=20, warmup=5)
        cmd = [str(c) for c in suite.fusebox_command(models.BY_NAME["gpt2"], "infer", "gpt2",
                                                     "bench", "f.json", zoo=True)]
        check("zoo gpt2 bench command", "--batch" in cmd and "--image-size" not in cmd)
        cmd = [str(c) for c in suite.fusebox_command(models.BY_NAME["gpt2"], "train", "gpt2",
                                                     "train", "f.json", zoo=True)]
        check("zoo gpt2 train command", cmd[:3] == ["fb", "train", "gpt2"] and
              cmd[cmd.index("--seq-len") + 1] == "1024" and "--optimizer" in cmd and
              cmd[cmd.index("--optimizer") + 1] == "adamw")
        cmd = [str(c) for c in suite.fusebox_command(models.BY_NAME["resnet50"], "infer",
                                                     "r.onnx", "bench", "f.json", zoo=False)]
        check("onnx bench command", "--batch" not in cmd and cmd[cmd.index("--precision") + 1]
              == "bf16")
        args.precision = "tf32"
        check("torch figures of another precision not reused",
              suite.reused_torch(models.BY_NAME["resnet50"], "infer") is None)
    check("classify import", fusebox_error("x\nfusebox: error: onnx import: node 'n' (Foo): "
                                           "unsupported\n").startswith("import refused: "))
    check("classify oom", fusebox_error("fusebox: error: cuda: out of memory asking 3 GiB")
          .startswith("OOM: "))
    check("classify run", fusebox_error("fusebox: error: cudnn: bad plan").startswith(
        "run failed: fusebox: error: cudnn"))
    out = ("trained 30 steps (1 to 30) in 12.00 s, 40.0 sequences/s; loss 10.8 -> 9.1\n"
           "  steady state (steps 7 to 30): 42.5 sequences/s, 376.47 ms/step\n")
    p = parse_train_output(out, 16)
    check("parse fusebox train steady state", p and p["ms_per_step"] == 376.47
          and p["timed_steps"] == 24 and math.isclose(p["throughput"], 16000 / 376.47))
    p = parse_train_output("trained 4 steps (1 to 4) in 2.00 s, 8.0 images/s; loss 1 -> 1\n", 4)
    check("parse fusebox train whole run", p and p["ms_per_step"] == 500.0)
    peak = TRAIN_PEAK.search(out + "  peak device memory: 5257.9 MiB (fusebox's allocator, the "
                             "whole run)\n")
    check("parse fusebox train's peak", peak and float(peak.group(1)) == 5257.9)
    check("step 1's line", FIRST_STEP_LINE.match("step  1/30  loss 6.9") and
          not FIRST_STEP_LINE.match("step 11/30  loss 6.9"))
    total = train_steps_for(20, 5)
    check("train steps hold 20 steady", total - 1 - min(10, total // 5) >= 20
          and min(10, total // 5) >= 5)
    check("select keeps table order", [m.name for m in models.select("gpt2,resnet50")]
          == ["resnet50", "gpt2"])
    try:
        models.select("resnet50,nope")
        check("unknown model refused", False)
    except ValueError as e:
        check("unknown model refused", "nope" in str(e))
    check("cpu spec", models.BY_NAME["gpt2"].for_cpu(2).image_size == 64
          and models.BY_NAME["gpt2"].for_cpu(2).train_batch == 2)
    failed = sum(1 for _, ok in checks if not ok)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0
