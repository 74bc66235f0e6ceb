"""Models by name. No pretrained weights are ever loaded (clusters are often offline)."""
from __future__ import annotations

import functools

import torch
from torch import nn

from . import flops
from .config import ConfigError


def resnet18(num_classes: int, stem: str = "cifar") -> nn.Module:
    """torchvision's ResNet-18. The CIFAR stem (3x3 conv, stride 1, no max-pool) keeps 32x32 inputs at
    32x32 in the first stage; the ImageNet stem (7x7 stride 2 + max-pool) shrinks them to 8x8 at once."""
    import torchvision  # about a second to import: only the ResNets need it

    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


class MnistCNN(nn.Module):
    """The small CNN of the PyTorch MNIST example (two convolutions, dropout, two linear layers)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build(name: str, num_classes: int) -> nn.Module:
    """A fresh model by name, never pretrained (notebook 01 teaches it)."""
    if name == "resnet18":
        return resnet18(num_classes, stem="cifar")
    if name == "resnet18_imagenet":
        return resnet18(num_classes, stem="imagenet")
    if name == "mnist_cnn":
        return MnistCNN(num_classes)
    raise ConfigError(f"model={name!r} is not one of resnet18, resnet18_imagenet, mnist_cnn")


def count_parameters(model: nn.Module) -> int:
    """How many numbers the model learns (notebook 01 teaches it)."""
    return sum(p.numel() for p in model.parameters())


def param_checksum(model: nn.Module) -> float:
    """Sum of all parameters in float64: equal on every DDP rank when the replicas are in sync. A sharded
    parameter (parallel=fsdp) is gathered whole first: every rank must call it."""
    with torch.no_grad():
        whole = (p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters())
        return float(sum(p.detach().double().sum().item() for p in whole))


def train_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs of one training step's forward + cross-entropy + backward on (x, y), counted by
    torch.utils.flop_counter (matmuls and convolutions, 2 FLOPs per multiply-add) and checked by the workbook's one
    rule (flops.py: grouped convolutions' backward per group), not typed by hand."""
    with flops.Counter() as counter:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        counter.forward_done()
        loss.backward()
    return counter.result().train


@functools.lru_cache(maxsize=None)
def flops_per_image(name: str, num_classes: int, image_shape: tuple[int, ...], n: int = 2) -> float:
    """Training FLOPs per image of model `name`, counted on the meta device: no memory, no compute, and the
    run's own model (its weights, batch-norm statistics, gradients) is left untouched."""
    with torch.device("meta"):
        model = build(name, num_classes)
        x = torch.empty(n, *image_shape)
        y = torch.zeros(n, dtype=torch.long)
    return train_flops(model, x, y) / n


@functools.lru_cache(maxsize=None)
def norm_elements_per_image(name: str, num_classes: int, image_shape: tuple[int, ...], n: int = 2) -> float:
    """Elements per image of every BatchNorm layer's output (the activations the memory-bound normalisation
    kernels read and write), counted with forward hooks on the meta device."""
    total = [0]
    with torch.device("meta"):
        model = build(name, num_classes)
        hooks = [m.register_forward_hook(lambda mod, inp, out: total.__setitem__(0, total[0] + out.numel()))
                 for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        model(torch.empty(n, *image_shape))
    for h in hooks:
        h.remove()
    return total[0] / n
