"""The model suite's one table: every model, its batch sizes, input size, PyTorch settings and
how fusebox trains it. Pure Python (no torch): the driver and the self-test read it too.

Fields of a Spec:
  family         classifier (torchvision, logits [N, classes]), segmentation (torchvision,
                 per-pixel logits [N, classes, S, S]), unet, gpt2 (token ids [N, T] in)
  builder        the torchvision name (torchvision.models.get_model); unused for unet/gpt2
  image_size     square input side (gpt2: tokens per sequence)
  infer_batch    batch of the inference runs (GPU)
  train_batch    batch of the training runs (GPU)
  num_classes    classes (gpt2: the vocabulary, 50257)
  channels_last  PyTorch runs the model and its input channels_last (convnets)
  optimizer      sgd (momentum 0.9, lr 0.05: fusebox bench's) or adamw (lr 1e-3, weight decay
                 0.01: fusebox train's defaults), the same on both sides
  fusebox_train  how fusebox trains it: "bench" (`fusebox bench X.onnx --mode train`: SGD
                 momentum, labels [N] only) or "train" (`fusebox train X.onnx --synthetic`:
                 AdamW or SGD, labels per image, per pixel or per token)
  zoo            fusebox's zoo model of the same architecture, used for training (labelled
                 as such) where fusebox cannot train the ONNX export
  train_dropout_off  in training, dropout and stochastic depth at p=0 on both sides (fusebox
                 has no random dropout); the JSON says so
  cpu_image_size / the CPU dry run's input size (the batch there is 1 or --cpu-batch)
"""
from dataclasses import dataclass, asdict, replace


@dataclass(frozen=True)
class Spec:
    name: str
    family: str
    builder: str
    image_size: int
    infer_batch: int
    train_batch: int
    num_classes: int = 1000
    channels_last: bool = True
    optimizer: str = "sgd"
    fusebox_train: str = "bench"
    zoo: str = ""
    train_dropout_off: bool = True
    cpu_image_size: int = 0  # 0: image_size

    @property
    def vocab_or_classes(self):
        return self.num_classes

    @property
    def unit(self):
        return "sequences/s" if self.family == "gpt2" else "images/s"

    def for_cpu(self, batch):
        """The CPU dry run's configuration: tiny batches, smaller inputs where the model allows."""
        size = self.cpu_image_size or self.image_size
        return replace(self, image_size=size, infer_batch=batch, train_batch=batch)

    def config(self, mode):
        """The configuration the JSON records for one mode."""
        d = asdict(self)
        d["batch"] = self.train_batch if mode == "train" else self.infer_batch
        return d


def _classifier(name, infer_batch=256, train_batch=128, **kw):
    return Spec(name=name, family="classifier", builder=name, image_size=224,
                infer_batch=infer_batch, train_batch=train_batch, **kw)


# Batches: convnets 256 inference / 128 training at 224x224 (ResNet-50 trains at 256: issue
# 40's ResNet-50 target names that batch); ViT and Swin 128 / 64 (AdamW, as they are trained);
# segmentation 16 at 512x512; GPT-2 small 16 x 1024 tokens both ways.
MODELS = [
    _classifier("resnet50", train_batch=256, zoo="resnet50"),
    _classifier("resnext50_32x4d"),
    _classifier("vit_b_16", 128, 64, channels_last=False, optimizer="adamw",
                fusebox_train="train", zoo="vit_b_16"),
    _classifier("swin_t", 128, 64, channels_last=False, optimizer="adamw",
                fusebox_train="train"),
    _classifier("convnext_tiny", zoo="convnext_tiny"),
    _classifier("efficientnet_b0"),
    _classifier("mobilenet_v3_large"),
    _classifier("regnet_y_1_6gf"),
    _classifier("densenet121"),
    Spec("deeplabv3_resnet50", "segmentation", "deeplabv3_resnet50", image_size=512,
         infer_batch=16, train_batch=16, num_classes=21, fusebox_train="train",
         cpu_image_size=128),
    Spec("unet", "unet", "", image_size=512, infer_batch=16, train_batch=16, num_classes=2,
         fusebox_train="train", zoo="unet", cpu_image_size=64),
    Spec("gpt2", "gpt2", "", image_size=1024, infer_batch=16, train_batch=16, num_classes=50257,
         channels_last=False, optimizer="adamw", fusebox_train="train", zoo="gpt2",
         cpu_image_size=64),
]

BY_NAME = {m.name: m for m in MODELS}

# The hyper-parameters of each optimizer, the same on both sides (fusebox's defaults).
OPTIMIZERS = {
    "sgd": {"lr": 0.05, "momentum": 0.9},
    "adamw": {"lr": 1e-3, "weight_decay": 0.01},
}

# Timing defaults: warm-up steps after the first, then timed steps (the median of them).
WARMUP_STEPS = 5
TIMED_STEPS = 20


def select(names):
    """The specs named in a comma-separated list (all for None or "all"), in table order; an
    unknown name is a ValueError listing the known ones."""
    if not names or names == "all":
        return list(MODELS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: "
                         f"{', '.join(BY_NAME)}")
    return [m for m in MODELS if m.name in wanted]
