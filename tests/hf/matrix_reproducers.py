"""Small reproducers of the crash classes the support matrix found (benchmarks/model_matrix.py).

* :class:`ExpertRouter`: mixture-of-experts routing as transformers' ``integrations/moe.py`` and
  Mixtral's router write it: ``histc`` on int ids off the CPU (a meta export records that branch)
  and ``weights /= weights.sum(-1, keepdim=True)``, an in-place ``aten.div_`` that the executor's
  fallback runs on DTensor's local views (Mixtral, Qwen2-MoE);
* :class:`TensorOfSize`: ``torch.tensor(x.size(-1), dtype=torch.float)`` in forward, copied with
  ``aten.lift_fresh_copy`` (DeBERTa's attention scale), which DTensor has no strategy for;
* :class:`SplitRotary`: a fused projection's ``split`` whose outputs do not all reach the loss on
  one replay, rotated as CodeGen does: its backward's ``cat`` met plain zeros (CodeGen);
* :class:`InvertedResidual`: MobileNetV2's ops (TF "same" padding, depthwise convolution, batch
  norm, ReLU6) under a channel-splitting plan, in float32 and in float64.
"""

from __future__ import annotations

import torch
from torch import nn


class ExpertRouter(nn.Module):
    """Top-2 routing over 4 experts, the experts' outputs weighed and scaled by each expert's load."""

    def __init__(self, width: int = 16, experts: int = 4, classes: int = 4):
        super().__init__()
        self.experts = experts
        self.gate = nn.Linear(width, experts)
        self.expert = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        logits = self.gate(x)
        weights, ids = torch.topk(logits.softmax(-1), 2, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        flat = ids.flatten()
        counts_in = flat.float() if x.device.type in ("cpu", "mps") else flat.int()
        load = torch.histc(counts_in, bins=self.experts, min=0, max=self.experts - 1)
        scale = 1 + load.to(x.dtype).max() / flat.numel()
        h = self.expert(x) * weights.sum(-1, keepdim=True) * scale
        return self.head(h)


class TensorOfSize(nn.Module):
    """Attention-style scores scaled by ``sqrt(torch.tensor(width))``, as DeBERTa does."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, classes)

    def forward(self, x):
        h = self.fc1(x)
        scale = torch.sqrt(torch.tensor(h.size(-1), dtype=torch.float) * 1)
        return self.fc2(h / scale.to(dtype=h.dtype))


class Activations(nn.Module):
    """ReLU6, Hardswish, ELU, LeakyReLU, Softplus and Mish between linear layers: their backward ops
    (``hardtanh_backward``, ...) had no DTensor strategy (MobileNetV2's ReLU6)."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        acts = (nn.ReLU6(), nn.Hardswish(), nn.ELU(), nn.LeakyReLU(0.1), nn.Softplus(), nn.Mish())
        self.body = nn.Sequential(*(m for act in acts for m in (nn.Linear(width, width), act)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


class SplitRotary(nn.Module):
    """A fused projection split into q, k, v and a piece no one reads, k rotated by CodeGen's
    ``rotate_every_two`` (``aten.stack``: no parallel rule, replicated): backward of a split whose
    outputs do not all get a gradient (the interpreter replays the split once per layout its
    consumers need, and one output is never read) met plain zeros (CodeGen: "aten.cat.default got
    mixed torch.Tensor and DTensor")."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        self.width = width
        self.qkv = nn.Linear(width, 4 * width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        q, k, v, _ = self.qkv(x).split(self.width, dim=-1)
        rotated = torch.stack((-k[..., 1::2], k[..., ::2]), dim=-1).flatten(-2)
        return self.head(torch.tanh(q) * v + rotated)


class InvertedResidual(nn.Module):
    """MobileNetV2's stem and an inverted residual in miniature: TF-style "same" padding (``F.pad``),
    convolutions initialised with std 0.02 under batch norm, ReLU6, a depthwise (grouped)
    convolution and 1x1 convolutions. MobileNetV2's matrix row drifted from
    step 1 in float32 with these ops split; the 2-process plan matches 1 process in float32 here
    and in float64 on MobileNetV2 itself: the drift is float32 rounding that MobileNetV2's 17
    scale-invariant layers and its first step (an update larger than the weights) amplify, which
    this 4-layer model is too small to show (its float32 run stays within 1e-6 of float64)."""

    def __init__(self, channels: int = 32, classes: int = 4):
        super().__init__()
        c = channels
        self.stem = nn.Conv2d(3, c, 3, stride=2, bias=False)
        self.depthwise = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.project = nn.Conv2d(c, 2 * c, 1, bias=False)
        self.expand = nn.Conv2d(2 * c, 4 * c, 1, bias=False)
        self.norms = nn.ModuleList(nn.BatchNorm2d(n, eps=1e-3) for n in (c, c, 2 * c, 4 * c))
        self.head = nn.Linear(4 * c, classes)
        for conv in (self.stem, self.depthwise, self.project, self.expand):
            nn.init.normal_(conv.weight, std=0.02)

    def forward(self, x):
        x = nn.functional.pad(x, (0, 1, 0, 1))  # TF "same" for a stride-2 3x3 on an even size
        x = nn.functional.relu6(self.norms[0](self.stem(x)))
        x = nn.functional.relu6(self.norms[1](self.depthwise(x)))
        x = nn.functional.relu6(self.norms[2](self.project(x)))  # without: the bias's gradient is 0
        x = nn.functional.relu6(self.norms[3](self.expand(x)))
        return self.head(x.mean(dim=(2, 3)))
