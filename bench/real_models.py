#!/usr/bin/env python3
"""Real-model suite (issue 15): torchvision models exported by PyTorch's own ONNX exporter
(TorchScript-based, opset 17; or with --exporter dynamo the torch.export-based exporter that
torch.onnx.export uses by default since PyTorch 2.9, at its default opset), each run through
`fusebox run` and compared with PyTorch on the same input. What a new user does first:
`fusebox run their_model.onnx`.

    python3 bench/real_models.py --fusebox build/release/tools/fusebox [--device cpu|cuda]
        [--models resnet18,vit_b_16,...] [--batch 1] [--json FILE] [--work DIR] [--keep]

Per model: random weights (weights=None: no download; parameters torchvision initialises to
zero, e.g. ViT's head, drawn N(0, 0.02^2) so the logits are not trivially 0), eval mode, an
input U(-1, 1) of the
model's usual size; PyTorch computes the reference in f32 with TF32 off on --device; the
export is fed the same input (`--input input=x.npy`). DECODERS: a GPT-2-style decoder written
as Hugging Face's GPT-2 (HfStyleDecoder), fed random token ids of its sequence length; ENCODERS: a BERT-style encoder
with a padding mask (HfStyleEncoder), fed token ids and an attention_mask. Status: `match` (relative L2 error of the
logits <= 1e-3, the issue's bar), `mismatch`, `import` (fusebox refused or failed the model:
the first line of its error), `run` (fusebox failed after import), `export` (PyTorch could not
export it). Prints a table and a summary; --json writes the rows.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision

# name, input size; the segmentation models return {"out": ...}: their "out" is compared.
CLASSIFIERS = [
    ("alexnet", 224), ("vgg11", 224), ("resnet18", 224), ("resnet50", 224),
    ("resnext50_32x4d", 224), ("wide_resnet50_2", 224), ("densenet121", 224),
    ("squeezenet1_0", 224), ("googlenet", 224), ("inception_v3", 299), ("mobilenet_v2", 224),
    ("mobilenet_v3_small", 224), ("mnasnet0_5", 224), ("shufflenet_v2_x1_0", 224),
    ("efficientnet_b0", 224), ("efficientnet_v2_s", 384), ("regnet_y_400mf", 224),
    ("convnext_tiny", 224), ("vit_b_16", 224), ("swin_t", 224), ("swin_v2_t", 256),
    ("maxvit_t", 224),
]
SEGMENTATION = [
    ("fcn_resnet50", 224), ("deeplabv3_mobilenet_v3_large", 224),
    ("lraspp_mobilenet_v3_large", 224),
]


class Logits(torch.nn.Module):
    """A model whose forward returns one tensor (segmentation: the "out" map)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        if isinstance(y, dict):
            return y["out"]
        if isinstance(y, tuple):  # googlenet / inception aux outputs in eval are off
            return y[0]
        return y


def build(name):
    if name == "hf_style_bert":
        return HfStyleEncoder()
    if name == "hf_style_gpt2":
        return HfStyleDecoder()
    if any(name == n for n, _ in SEGMENTATION):
        kwargs = {"weights": None, "weights_backbone": None}
        if name != "lraspp_mobilenet_v3_large":
            kwargs["aux_loss"] = False
        return Logits(torchvision.models.segmentation.__dict__[name](**kwargs))
    kwargs = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return Logits(torchvision.models.__dict__[name](**kwargs))


class HfStyleDecoder(torch.nn.Module):
    """A GPT-2-style decoder written as Hugging Face's GPT2Model (eager attention): token and
    position embeddings, pre-norm blocks with fused qkv projection, the causal mask applied by
    torch.where with a boolean tril buffer and finfo.min, gelu_new (the tanh form), a tied
    lm_head. Its export holds what a transformer's does: Gather of token ids at run time,
    Where on run-time scores, Shape -> Slice of the mask buffer, Range for the positions."""

    def __init__(self, vocab=1000, n_pos=128, d=128, heads=4, layers=2):
        super().__init__()
        self.heads = heads
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(n_pos, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict({
                "ln_1": torch.nn.LayerNorm(d), "c_attn": torch.nn.Linear(d, 3 * d),
                "c_proj": torch.nn.Linear(d, d), "ln_2": torch.nn.LayerNorm(d),
                "c_fc": torch.nn.Linear(d, 4 * d), "mlp_proj": torch.nn.Linear(4 * d, d)}))
        self.ln_f = torch.nn.LayerNorm(d)
        self.register_buffer("bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))
                             .view(1, 1, n_pos, n_pos), persistent=False)

    @staticmethod
    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

    def attention(self, blk, h):
        b, t, d = h.shape
        q, k, v = blk["c_attn"](h).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5)
        mask = self.bias[:, :, :t, :t]
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, device=w.device))
        o = torch.matmul(torch.softmax(w, dim=-1), v)
        return blk["c_proj"](o.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.wte(ids) + self.wpe(pos)
        for blk in self.blocks:
            h = h + self.attention(blk, blk["ln_1"](h))
            h = h + blk["mlp_proj"](self.gelu_new(blk["c_fc"](blk["ln_2"](h))))
        return torch.matmul(self.ln_f(h), self.wte.weight.t())  # tied lm_head


class HfStyleEncoder(torch.nn.Module):
    """A BERT-style encoder written as Hugging Face's BertModel (eager attention) with a padding
    mask: the (B, T) 0/1 attention_mask becomes (1 - mask[:, None, None, :]) * finfo.min, added
    to the scaled scores. Its export adds a second run-time input and the mask arithmetic
    (Unsqueeze, Cast, Sub, Mul, Add) before the softmax: the additive-bias attention."""

    def __init__(self, vocab=1000, n_pos=128, d=128, heads=4, layers=2):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(n_pos, d)
        self.ln = torch.nn.LayerNorm(d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict({
                "q": torch.nn.Linear(d, d), "k": torch.nn.Linear(d, d), "v": torch.nn.Linear(d, d),
                "o": torch.nn.Linear(d, d), "ln_1": torch.nn.LayerNorm(d),
                "fc": torch.nn.Linear(d, 4 * d), "proj": torch.nn.Linear(4 * d, d),
                "ln_2": torch.nn.LayerNorm(d)}))
        self.head = torch.nn.Linear(d, 16)

    def attention(self, blk, h, bias):
        b, t, d = h.shape
        q, k, v = (blk[n](h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for n in ("q", "k", "v"))
        w = torch.matmul(q, k.transpose(-1, -2)) / (d // self.heads) ** 0.5 + bias
        o = torch.matmul(torch.softmax(w, dim=-1), v)
        return blk["o"](o.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, ids, attention_mask):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.ln(self.embed(ids) + self.pos(pos))
        extended = attention_mask[:, None, None, :].to(h.dtype)
        bias = (1.0 - extended) * torch.finfo(h.dtype).min
        for blk in self.blocks:
            h = blk["ln_1"](h + self.attention(blk, h, bias))
            h = blk["ln_2"](h + blk["proj"](torch.nn.functional.gelu(blk["fc"](h))))
        return self.head(h)


# name, sequence length: models fed token ids (i64) instead of images; the encoders also an
# attention_mask (i64 0/1: the last quarter of the sequence padded in every other sequence).
DECODERS = [("hf_style_gpt2", 64)]
ENCODERS = [("hf_style_bert", 64)]


def first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def run_one(name, size, args, work):
    row = {"model": name, "input": [args.batch, 3, size, size]}
    torch.manual_seed(0)
    model = build(name).eval()
    with torch.no_grad():  # zero-initialised layers (ViT's head) would make the logits 0
        for p in model.parameters():
            if p.abs().max() == 0:
                p.normal_(0.0, 0.02)
    model = model.to(args.device)
    if any(name == n for n, _ in DECODERS + ENCODERS):  # size: the sequence length
        row["input"] = [args.batch, size]
        vocab = model.wte if hasattr(model, "wte") else model.embed
        x = torch.randint(0, vocab.num_embeddings, (args.batch, size), device=args.device)
    else:
        x = torch.rand(args.batch, 3, size, size, device=args.device) * 2 - 1
    inputs = {"input": x}
    if any(name == n for n, _ in ENCODERS):
        mask = torch.ones(args.batch, size, dtype=torch.int64, device=args.device)
        mask[::2, size - size // 4:] = 0
        inputs["attention_mask"] = mask
    with torch.no_grad():
        want = model(*inputs.values()).float().cpu().numpy()
    path = work / f"{name}.onnx"
    try:
        if args.exporter == "dynamo":  # what torch.onnx.export does by default since 2.9
            torch.onnx.export(model, tuple(inputs.values()), str(path),
                              input_names=list(inputs), output_names=["logits"], dynamo=True)
        else:
            torch.onnx.export(model, tuple(inputs.values()), str(path), opset_version=17,
                              input_names=list(inputs), output_names=["logits"], dynamo=False)
        import onnx  # the opset the exporter wrote
        row["opset"] = next(o.version for o in onnx.load(str(path), load_external_data=False)
                            .opset_import if o.domain in ("", "ai.onnx"))
    except Exception as e:  # noqa: BLE001 -- the exporter's own failures are data here
        row.update(status="export", detail=first_line(str(e)))
        return row
    out_dir = work / f"{name}_out"
    command = [args.fusebox, "run", str(path), "--device", args.device, "--output-dir",
               str(out_dir)]
    for input_name, value in inputs.items():
        np.save(work / f"{name}_{input_name}.npy", value.cpu().numpy())
        command += ["--input", f"{input_name}={work / f'{name}_{input_name}.npy'}"]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True)
    row["fusebox_seconds"] = round(time.time() - start, 2)
    if proc.returncode != 0:
        err = proc.stderr
        row.update(status="import" if "onnx import" in err else "run", detail=first_line(err))
        return row
    got = np.load(out_dir / "logits.npy").astype(np.float64)
    ref = want.astype(np.float64)
    if got.shape != ref.shape:
        row.update(status="mismatch", detail=f"shape {got.shape} vs {ref.shape}")
        return row
    if np.linalg.norm(ref) == 0:
        row.update(status="mismatch", detail="the reference output is all zeros")
        return row
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    row.update(rel_l2=rel, max_abs=float(np.max(np.abs(got - ref))),
               status="match" if rel <= 1e-3 else "mismatch")
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fusebox", required=True, help="the fusebox binary")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                        help="torchscript: opset 17, dynamo=False; dynamo: torch.onnx.export's "
                             "default since PyTorch 2.9 (torch.export, its default opset)")
    parser.add_argument("--json")
    parser.add_argument("--work", help="directory for the exports (default: a temporary one)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    table = CLASSIFIERS + SEGMENTATION + DECODERS + ENCODERS
    if args.models:
        wanted = args.models.split(",")
        unknown = set(wanted) - {n for n, _ in table}
        if unknown:
            parser.error(f"unknown models: {', '.join(sorted(unknown))}")
        table = [(n, s) for n, s in table if n in wanted]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fusebox_models_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, device "
          f"{args.device}, exporter {args.exporter}, work dir {work}", flush=True)
    rows = []
    for name, size in table:
        row = run_one(name, size, args, work)
        rows.append(row)
        detail = (f"rel {row['rel_l2']:.2e}" if "rel_l2" in row else row.get("detail", ""))
        print(f"{name:30s} {row['status']:9s} opset {row.get('opset', '?'):<3} {detail}",
              flush=True)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "real_models", "exporter": args.exporter,
                       "torch": torch.__version__,
                       "torchvision": torchvision.__version__, "device": args.device,
                       "rows": rows}, f, indent=1)
    return 0 if counts.get("mismatch", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
