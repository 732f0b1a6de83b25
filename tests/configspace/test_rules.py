"""Per-kind rules: which dims split, where partial sums and gradient syncs arise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensoropt.capture import capture
from tensoropt.configspace import configurations, parallel_dims
from tensoropt.configspace.configuration import Mesh

MESH2 = Mesh.for_cluster(2, devices_per_node=2)


def _by_label(g, node, mesh=MESH2):
    return {c.label: c for c in configurations(g, mesh)[node]}


def test_embedding_vocab_split_is_partial_and_out_split_shards_width():
    g = capture(nn.Embedding(16, 8), (torch.randint(0, 16, (4, 6)),))
    cs = _by_label(g, "embedding")
    assert set(cs) == {"replicate", "batch=2", "seq=2", "vocab=2", "out=2"}
    assert cs["vocab=2"].partial_axes == (0,) and dict(cs["vocab=2"].params) == {"weight": ("S(0)",)}
    assert cs["vocab=2"].output == ("R",) and cs["vocab=2"].inputs == (("R",),)
    assert cs["out=2"].output == ("S(2)",) and dict(cs["out=2"].params) == {"weight": ("S(1)",)}
    assert dict(cs["seq=2"].grad_sync_axes) == {"weight": (0,)}
    assert cs["seq=2"].inputs == (("S(1)",),)


def test_token_input_offers_batch_and_seq():
    g = capture(nn.Embedding(16, 8), (torch.randint(0, 16, (4, 6)),))
    assert set(_by_label(g, "input")) == {"replicate", "batch=2", "seq=2"}


def test_layer_norm_never_splits_the_normalised_dim():
    g = capture(nn.LayerNorm(8), (torch.randn(4, 6, 8),))
    cs = _by_label(g, "layer_norm")
    assert set(cs) == {"replicate", "batch=2", "seq=2"}
    assert dict(cs["batch=2"].params) == {"weight": ("R",), "bias": ("R",)}
    assert dict(cs["batch=2"].grad_sync_axes) == {"weight": (0,), "bias": (0,)}


def test_softmax_skips_its_dim_and_cross_entropy_is_partial_over_batch():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 6)

        def forward(self, x, y):
            h = self.fc(x)
            return F.cross_entropy(h, y) + h.softmax(dim=-1).sum()

    g = capture(Net(), (torch.randn(4, 8), torch.randint(0, 6, (4,))))
    soft = _by_label(g, "softmax")
    assert set(soft) == {"replicate", "batch=2"}
    ce = _by_label(g, "cross_entropy_loss")
    assert set(ce) == {"replicate", "batch=2", "out=2"}
    assert ce["batch=2"].inputs == (("S(0)",), ("S(0)",)) and ce["batch=2"].partial_axes == (0,)
    # class-split logits (loss_parallel): labels replicated, the loss comes out replicated
    assert ce["out=2"].inputs == (("S(1)",), ("R",)) and ce["out=2"].partial_axes == ()
    assert ce["out=2"].output == ("R",)
    total = _by_label(g, "sum_1")
    assert total["batch=2"].partial_axes == (0,) and total["batch=2"].output == ("R",)


def test_batch_norm_splits_batch_or_channels():
    g = capture(nn.BatchNorm2d(4), (torch.randn(2, 4, 3, 3),))
    cs = _by_label(g, "batch_norm")
    assert set(cs) == {"replicate", "batch=2", "out=2"}
    assert dict(cs["batch=2"].grad_sync_axes) == {"weight": (0,), "bias": (0,)}
    assert dict(cs["out=2"].params) == {"weight": ("S(0)",), "bias": ("S(0)",)}
    assert cs["out=2"].inputs == (("S(1)",),) and cs["out=2"].output == ("S(1)",)
    assert cs["out=2"].grad_sync_axes == ()


def test_sdpa_with_a_4d_mask_input_splits_it_with_batch_and_heads():
    class Attn(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q = torch.randn(2, 4, 6, 8)
    g = capture(Attn(), (q, q, q, torch.ones(2, 1, 6, 6, dtype=torch.bool)))
    cs = _by_label(g, "scaled_dot_product_attention")
    assert set(cs) == {"replicate", "batch=2", "heads=2"}
    assert cs["batch=2"].inputs == (("S(0)",),) * 4
    assert cs["heads=2"].inputs == (("S(1)",),) * 3 + (("R",),)  # the mask broadcasts over heads


def test_conv_channel_splits_place_weight_and_bias():
    g = capture(nn.Conv2d(4, 6, 3), (torch.randn(2, 4, 5, 5),))
    cs = _by_label(g, "conv2d")
    assert set(cs) == {"replicate", "batch=2", "out=2", "in=2"}
    assert dict(cs["out=2"].params) == {"weight": ("S(0)",), "bias": ("S(0)",)}
    assert cs["out=2"].output == ("S(1)",) and cs["out=2"].inputs == (("R",),)
    assert dict(cs["in=2"].params) == {"weight": ("S(1)",), "bias": ("R",)}
    assert cs["in=2"].inputs == (("S(1)",),) and cs["in=2"].partial_axes == (0,)
    assert cs["in=2"].grad_sync_axes == ()


def test_residual_add_aligns_broadcast_operands():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(6, 8))

        def forward(self, x):
            return x + self.pos

    g = capture(Net(), (torch.randn(4, 6, 8),))
    dims = {d.name: d for d in parallel_dims(g.nx, "add")}
    assert set(dims) == {"batch", "seq"}  # a float [B, T, C] input names batch and seq
    cs = _by_label(g, "add")
    assert dict(cs["batch=2"].params) == {"pos": ("R",)}
    assert dict(cs["batch=2"].grad_sync_axes) == {"pos": (0,)}
    # the [T, C] parameter broadcasts over batch: a seq split shards its dim 0, no gradient sync
    assert dict(cs["seq=2"].params) == {"pos": ("S(0)",)} and cs["seq=2"].grad_sync_axes == ()
    assert cs["seq=2"].inputs == (("S(1)",),)


def test_opaque_offers_batch_only_where_shape_safe_and_sample_local():
    class Net(nn.Module):
        def forward(self, x, idx):
            return (
                torch.cumsum(x, dim=1),  # along features: batch split is safe
                torch.cumsum(x, dim=0),  # along the batch: a local scan would be wrong
                x.flip(-2),  # dims=[-2] is dim 0 of a 2-D tensor
                torch.sort(x)[0],  # default dim -1
                x[idx],  # indexes samples
                torch.stack([x, x]),  # a new leading dim: its own kind now, the operands' batch split
            )

    with pytest.warns(UserWarning):
        g = capture(Net(), (torch.randn(4, 6), torch.tensor([3, 2, 1, 0])))
    kinds = {n: g.nx.nodes[n]["op"] for n in g.compute_nodes()}
    offered = {kinds[n]: set(_by_label(g, n)) for n in kinds}
    assert offered["aten.cumsum.default"] <= {"replicate", "batch=2"}
    assert set(_by_label(g, "cumsum")) == {"replicate", "batch=2"}
    assert set(_by_label(g, "cumsum_1")) == {"replicate"}
    assert offered["aten.flip.default"] == {"replicate"}
    assert offered["aten.sort.default"] == {"replicate", "batch=2"}
    assert offered["aten.index.Tensor"] == {"replicate"}
    assert offered["aten.stack.default"] == {"replicate", "batch=2"}  # stack's rule (not opaque)


def test_scalar_nodes_only_replicate():
    class Net(nn.Module):
        def forward(self, x):
            return x.sum() * 2

    g = capture(Net(), (torch.randn(4, 6),))
    assert set(_by_label(g, "mul")) == {"replicate"}
