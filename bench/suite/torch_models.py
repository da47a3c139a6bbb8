"""The suite's PyTorch models: torchvision's by name, and the two it writes itself as their
users' code does -- a U-Net in the layout of the widely used PyTorch U-Net (milesial/
Pytorch-UNet, transposed-convolution upsampling: fusebox's zoo `unet`) and a GPT-2-small
decoder written as Hugging Face's GPT-2 (bench/real_models.py's HfStyleDecoder at GPT-2
small's size: fusebox's zoo `gpt2`). Random weights (weights=None: nothing is downloaded)."""
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from real_models import HfStyleDecoder, Logits  # noqa: E402


class DoubleConv(torch.nn.Sequential):
    def __init__(self, cin, cout, mid=None):
        mid = mid or cout
        super().__init__(torch.nn.Conv2d(cin, mid, 3, padding=1, bias=False),
                         torch.nn.BatchNorm2d(mid), torch.nn.ReLU(inplace=True),
                         torch.nn.Conv2d(mid, cout, 3, padding=1, bias=False),
                         torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True))


class UNet(torch.nn.Module):
    """Widths 64 .. 1024, 2x2 max-pool down, ConvTranspose2d(c, c/2, 2, stride 2) up, skip
    concatenated before the upsampled map, a 1x1 conv to the classes: 31M parameters."""

    def __init__(self, num_classes, widths=(64, 128, 256, 512, 1024)):
        super().__init__()
        self.inc = DoubleConv(3, widths[0])
        self.downs = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.MaxPool2d(2), DoubleConv(a, b))
            for a, b in zip(widths, widths[1:]))
        self.ups = torch.nn.ModuleList()
        self.up_convs = torch.nn.ModuleList()
        for deep, out in zip(reversed(widths[1:]), reversed(widths[:-1])):
            self.ups.append(torch.nn.ConvTranspose2d(deep, deep // 2, 2, stride=2))
            self.up_convs.append(DoubleConv(deep, out))
        self.outc = torch.nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x):
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        h = skips.pop()
        for up, conv in zip(self.ups, self.up_convs):
            h = conv(torch.cat([skips.pop(), up(h)], dim=1))
        return self.outc(h)


class Gpt2(HfStyleDecoder):
    """GPT-2 small (12 layers, width 768, 12 heads, vocabulary 50257, 1024 positions).
    `sdpa` picks the attention: True, torch's scaled_dot_product_attention with is_causal (what
    Hugging Face runs by default, and PyTorch's fastest); False, Hugging Face's eager form
    (matmul, where(causal mask), softmax, matmul), which is what the ONNX export holds.
    `vocab_first` returns the logits as [batch, vocab, tokens] (what `fusebox train` takes for
    next-token prediction) instead of [batch, tokens, vocab]."""

    def __init__(self, positions=1024, sdpa=True, vocab_first=False):
        super().__init__(vocab=50257, n_pos=positions, d=768, heads=12, layers=12)
        self.sdpa = sdpa
        self.vocab_first = vocab_first
        # GPT-2's initialisation (as fusebox's zoo gpt2): weights N(0, 0.02^2), positions
        # N(0, 0.01^2), biases 0; PyTorch's defaults would start the loss in the hundreds.
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                    m.weight.normal_(0.0, 0.01 if m is self.wpe else 0.02)
                if isinstance(m, torch.nn.Linear):
                    m.bias.zero_()

    def attention(self, blk, h):
        if not self.sdpa:
            return super().attention(blk, h)
        b, t, d = h.shape
        q, k, v = blk["c_attn"](h).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return blk["c_proj"](o.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, ids):
        logits = super().forward(ids)
        return logits.transpose(1, 2) if self.vocab_first else logits


def build(spec, training):
    """The PyTorch module of a models.py spec, f32 on the CPU, in train or eval mode. In
    training, dropout and stochastic depth are set to p=0 when the spec asks (fusebox has no
    random dropout), on PyTorch's side too, so that both sides run the same model."""
    torch.manual_seed(0)
    if spec.family == "gpt2":
        model = Gpt2(positions=spec.image_size)
    elif spec.family == "unet":
        model = UNet(spec.num_classes)
    else:
        kwargs = {"weights": None, "num_classes": spec.num_classes}
        if spec.family == "segmentation":
            kwargs.update(weights_backbone=None, aux_loss=False)
        model = Logits(torchvision.models.get_model(spec.builder, **kwargs))
    with torch.no_grad():  # zero-initialised weights (ViT's head) would make the logits 0
        for p in model.parameters():
            if p.dim() >= 2 and p.abs().max() == 0:
                p.normal_(0.0, 0.02)
    if training and spec.train_dropout_off:
        for m in model.modules():
            if isinstance(m, (torch.nn.Dropout, torchvision.ops.StochasticDepth)):
                m.p = 0.0
    return model.train(training)


def inputs(spec, batch, device, seed=1):
    """A random batch of the model's input (never zeros): images U(-1, 1) f32 [batch, 3, S, S],
    or token ids [batch, T] uniform over the vocabulary."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if spec.family == "gpt2":
        return torch.randint(0, 50257, (batch, spec.image_size), generator=gen).to(device)
    x = torch.rand(batch, 3, spec.image_size, spec.image_size, generator=gen) * 2 - 1
    return x.to(device)


def labels(spec, batch, device, seed=2):
    """Random targets: a class per image, per pixel (segmentation, U-Net) or per token."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if spec.family == "gpt2":
        shape = (batch, spec.image_size)
    elif spec.family in ("segmentation", "unet"):
        shape = (batch, spec.image_size, spec.image_size)
    else:
        shape = (batch,)
    return torch.randint(0, spec.vocab_or_classes, shape, generator=gen).to(device)


def export(spec, batch, training, path, device="cpu"):
    """torch.onnx.export (the TorchScript-based exporter, opset 17) of the model at a fixed
    batch, as a user exports it: input "input", output "logits". Training exports keep batch
    norm in its training form (TrainingMode.TRAINING, no constant folding); GPT-2's training
    export gives [batch, vocab, tokens] logits (what `fusebox train` takes). Returns the
    opset written."""
    import onnx

    model = build(spec, training)
    if spec.family == "gpt2":
        model.sdpa = False  # Hugging Face's eager attention: what an export of GPT-2 reads as
        model.vocab_first = training
    model = model.to(device)
    x = inputs(spec, batch, device)
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(model, (x,), str(path), opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamo=False, training=mode,
                      do_constant_folding=not training)
    return next(o.version for o in onnx.load(str(path), load_external_data=False).opset_import
                if o.domain in ("", "ai.onnx"))
