"""Worker for test_dtensor_agreement: run every configuration of a graph's nodes on DTensors.

``python dtensor_check.py OUT.json`` under torchrun (gloo, CPU). For each node whose op DTensor
runs directly (the executor's explicit paths for conv2d, attention, batch norm and class-split
cross entropy are not exercised here), every configuration's operands are distributed with the
layouts it names and the op is run: the output placement DTensor chooses must equal the
configuration's raw output layout (``P`` on ``partial_axes``) and the values must match the
single-process reference. Rank 0 writes the mismatches to OUT.json.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from tensoropt.capture import capture, tensor_args
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh, shard_dim
from tensoropt.models import build_model, example_inputs

DIRECT_KINDS = {
    "linear",
    "matmul",
    "layer_norm",
    "elementwise",
    "softmax",
    "log_softmax",
    "embedding",
    "reduce",
    "cat",
    "pool",
    "adaptive_pool",
}


class Recorder(fx.Interpreter):
    """Runs the exported graph once and keeps every node's value."""

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def _placements(layout):
    out = []
    for p in layout:
        d = shard_dim(p)
        out.append(Shard(d) if d is not None else Replicate())
    return out


def _layout(dt: DTensor) -> tuple:
    out = []
    for p in dt.placements:
        if isinstance(p, Partial):
            out.append("P")
        elif isinstance(p, Shard):
            out.append(f"S({p.dim % dt.dim()})")
        else:
            out.append("R")
    return tuple(out)


class Scores(torch.nn.Module):
    """Attention written out: 4-D matmuls and a softmax."""

    def forward(self, q, k, v):
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def graphs():
    torch.manual_seed(0)
    gpt, spec = build_model("gpt", layers=1, width=16, heads=2, seq_len=8, vocab_size=32, dropout=0.0)
    yield "gpt", gpt, example_inputs(spec, 4)
    yield "scores", Scores(), (torch.randn(4, 4, 8, 4), torch.randn(4, 4, 8, 4), torch.randn(4, 4, 8, 4))


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = Mesh.for_cluster(world, devices_per_node=world)
    device_mesh = init_device_mesh("cpu", mesh.shape)
    problems, checked = [], 0
    for name, model, inputs in graphs():
        g = capture(model, inputs)
        ep = g.program
        rec = Recorder(ep.module())
        rec.values = {}
        rec.run(*inputs)
        fx_nodes = {n.name: n for n in ep.graph.nodes}
        state = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
        cs = configurations(g, mesh)
        for node, configs in cs.items():
            data = g.nx.nodes[node]
            if data["kind"] not in DIRECT_KINDS:
                continue
            n = fx_nodes[node]
            operands = tensor_args(n)
            reference = rec.values[node]
            for c in configs:
                params = dict(c.params)
                it = iter(zip(operands, data["operands"]))

                def load(a, it=it, c=c, params=params, state=state, rec=rec, inputs=inputs, ep=ep):
                    fx_arg, o = next(it)
                    if o["role"] == "param":
                        value = state[o["key"]].detach()
                        layout = params[o["key"]]
                    elif o["role"] == "input":
                        value = _value(rec, fx_arg, inputs, ep)
                        layout = c.inputs[o["index"]]
                    else:
                        value, layout = _value(rec, fx_arg, inputs, ep), ("R",) * len(mesh.shape)
                    # every rank holds the same values (same seed): slice locally, no scatter
                    return distribute_tensor(
                        value.detach(), device_mesh, _placements(layout), src_data_rank=None
                    )

                args = fx.node.map_arg(n.args, load)
                kwargs = fx.node.map_arg(n.kwargs, load)
                what = f"{name}:{node} ({data['op']}) {c.label}"
                try:
                    out = n.target(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    problems.append(f"{what}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                out = out[0] if isinstance(out, (tuple, list)) else out
                expected = tuple("P" if a in c.partial_axes else p for a, p in enumerate(c.output))
                if _layout(out) != expected:
                    problems.append(f"{what}: DTensor gives {_layout(out)}, configuration says {expected}")
                ref = reference[0] if isinstance(reference, (tuple, list)) else reference
                if any(type(p) not in (Shard, Replicate) for p in out.placements):
                    got = out.full_tensor()  # partial sums (or strided shards): compare reduced values
                else:  # compare this rank's shard with the same slice of the reference, locally
                    got = out.to_local()
                    ref = distribute_tensor(
                        ref.detach(), device_mesh, out.placements, src_data_rank=None
                    ).to_local()
                if not torch.allclose(got, ref, atol=1e-4, rtol=1e-4):
                    problems.append(f"{what}: values differ from the single-process run")
                checked += 1
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"checked": checked, "problems": problems}, f, indent=1)
    from tensoropt.executor.state.worker import end_process_group

    end_process_group()


def _value(rec, fx_arg, inputs, ep):
    if fx_arg.name in rec.values:
        return rec.values[fx_arg.name]
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    return inputs[user.index(fx_arg.name)]


if __name__ == "__main__":
    main(sys.argv[1])
