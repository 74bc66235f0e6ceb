"""Models and batches to run the card on (notebook 07, the GPU commands of docs/performance.md), sized by the one
switch (lessons.size): a GPT-style transformer on synthetic tokens (scaled_dot_product_attention), and synthetic
images for torchvision's models. Never pretrained weights.

    python -m tutorial_lib card tutorial_lib.lessons.card_examples:gpt --batch tutorial_lib.lessons.card_examples:tokens
    python -m tutorial_lib card tutorial_lib.lessons.card_examples:resnet50 --batch tutorial_lib.lessons.card_examples:images
    python -m tutorial_lib card tutorial_lib.lessons.card_examples:vit_b_16 --batch tutorial_lib.lessons.card_examples:images
    python -m tutorial_lib card tutorial_lib.lessons.card_examples:mobilenet_v3_small --batch tutorial_lib.lessons.card_examples:images

The batches come from a pool of a few distinct ones made once on the device (not one batch reused): a synthetic
input pipeline that costs nothing, so the card's IO is not the limit and its rungs measure the step.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import size as size_switch


@dataclass(frozen=True)
class GPTSize:
    vocab: int
    width: int
    heads: int
    layers: int
    seq: int
    batch: int


GPT_FULL = GPTSize(vocab=8192, width=512, heads=8, layers=6, seq=512, batch=32)
GPT_SMALL = GPTSize(vocab=256, width=64, heads=4, layers=2, seq=32, batch=4)
IMAGES_FULL, IMAGES_SMALL = (224, 128), (32, 4)  # (side, batch)
POOL = 4  # distinct batches per source


def gpt_size() -> GPTSize:
    return size_switch.current().pick(GPT_SMALL, GPT_FULL)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (F.scaled_dot_product_attention) and an MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT: token and position embeddings, `layers` blocks, a head over the vocabulary (logits per
    position: the card's default loss is cross-entropy against the next tokens)."""

    def __init__(self, s: GPTSize):
        super().__init__()
        self.tok, self.pos = nn.Embedding(s.vocab, s.width), nn.Embedding(s.seq, s.width)
        self.blocks = nn.Sequential(*[Block(s.width, s.heads) for _ in range(s.layers)])
        self.ln, self.head = nn.LayerNorm(s.width), nn.Linear(s.width, s.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def gpt() -> GPT:
    return GPT(gpt_size())


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.lru_cache(maxsize=None)
def _pool(kind: str, small: bool, batch: int | None):
    gen = torch.Generator().manual_seed(0)
    if kind == "tokens":
        s = GPT_SMALL if small else GPT_FULL
        made = [torch.randint(0, s.vocab, (batch or s.batch, s.seq + 1), generator=gen) for _ in range(POOL)]
        pairs = [(t[:, :-1].to(_device()), t[:, 1:].to(_device())) for t in made]
    else:
        side, n = IMAGES_SMALL if small else IMAGES_FULL
        n = batch or n
        pairs = [(torch.randn(n, 3, side, side, generator=gen).to(_device()),
                  torch.randint(0, 1000, (n,), generator=gen).to(_device())) for _ in range(POOL)]
    return itertools.cycle(pairs)


def tokens(batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, the next tokens): one batch of the pool for gpt() (`batch` sequences; None: the size's)."""
    return next(_pool("tokens", size_switch.current().small, batch))


def images(batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels of 1000 classes): 224x224 at full size, 32x32 small (`batch` images; None: the size's)."""
    return next(_pool("images", size_switch.current().small, batch))


def resnet50() -> nn.Module:
    import torchvision

    return torchvision.models.resnet50(weights=None)


def vit_b_16() -> nn.Module:
    """ViT-B/16 at the images' side (224 at full size)."""
    import torchvision

    side = size_switch.current().pick(IMAGES_SMALL, IMAGES_FULL)[0]
    return torchvision.models.vit_b_16(weights=None, image_size=side)


def mobilenet_v3_small() -> nn.Module:
    """MobileNetV3-Small: depthwise convolutions (grouped, one channel per group), whose FLOPs torch's counter
    overcounts in the backward pass (flops.py counts them per group)."""
    import torchvision

    return torchvision.models.mobilenet_v3_small(weights=None)
