"""Hand-chosen plans for the toy models (data, tensor and mixed parallelism).

Each builder returns plan.json-style dicts; node names are torch.export's for the models in
``toy_models``.
"""

from __future__ import annotations

from tensoropt.configspace.configuration import Configuration
from tensoropt.executor.job.data import InputSpec
from tensoropt.executor.job.spec import TrainSpec


def cfg(inputs, output, params=(), partial=(), sync=(), label="hand"):
    """A Configuration in JSON form from layouts given as lists of placement strings."""
    return Configuration(
        label, (), tuple(tuple(i) for i in inputs), tuple((k, tuple(v)) for k, v in params),
        tuple(output), tuple(partial), tuple((k, tuple(a)) for k, a in sync),
    ).to_json()


def plan(plan_id, shape, placements):
    """A plan.json dict on a mesh of ``shape`` (all axes of level gpu)."""
    mesh = {"shape": list(shape), "levels": ["gpu"] * len(shape)}
    return {"id": plan_id, "devices": _prod(shape), "mesh": mesh, "placements": placements}


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


SPECS = {
    "mlp": TrainSpec("toy_models:MLP", (InputSpec((8,)), InputSpec((), "int64", 4)), 8,
                     optimizer="adamw", lr=0.01),
    "cnn": TrainSpec("toy_models:CNN", (InputSpec((3, 8, 8)), InputSpec((), "int64", 4)), 8,
                     optimizer="momentum", lr=0.05),
    "gpt": TrainSpec("toy_models:GPT", (InputSpec((4,), "int64", 16), InputSpec((4,), "int64", 16)), 4,
                     optimizer="momentum", lr=0.1),
    "cls": TrainSpec("toy_models:CLSHead", (InputSpec((6, 8)), InputSpec((), "int64", 4)), 8,
                     optimizer="momentum", lr=0.1),
}


def mlp_plans(n: int) -> list[dict]:
    """Data parallel, Megatron (column then row), and on 4 devices a 2x2 dp x tp mix."""
    S0, S1, R = ["S(0)"] * 1, ["S(1)"], ["R"]
    if n == 2:
        dp = plan("mlp-dp", (2,), {
            "x": cfg([], S0), "y": cfg([], S0),
            "linear": cfg([S0], S0, [("fc1.weight", R), ("fc1.bias", R)], sync=[("fc1.weight", (0,))]),
            "relu": cfg([S0], S0), "linear_1": cfg([S0], S0, [("fc2.weight", R), ("fc2.bias", R)]),
            "cross_entropy_loss": cfg([S0, S0], R, partial=(0,))})
        tp = plan("mlp-tp", (2,), {
            "x": cfg([], R), "y": cfg([], R),
            "linear": cfg([R], S1, [("fc1.weight", S0), ("fc1.bias", S0)]),
            "relu": cfg([S1], S1),
            "linear_1": cfg([S1], R, [("fc2.weight", S1), ("fc2.bias", R)], partial=(0,)),
            "cross_entropy_loss": cfg([R, R], R)})
        return [dp, tp]
    a, b = ["S(0)", "R"], ["S(0)", "S(1)"]
    mixed = plan("mlp-dp2tp2", (2, 2), {
        "x": cfg([], a), "y": cfg([], a),
        "linear": cfg([a], b, [("fc1.weight", ["R", "S(0)"]), ("fc1.bias", ["R", "S(0)"])]),
        "relu": cfg([b], b),
        "linear_1": cfg([b], a, [("fc2.weight", ["R", "S(1)"]), ("fc2.bias", ["R", "R"])], partial=(1,)),
        "cross_entropy_loss": cfg([a, a], ["R", "R"], partial=(0,))})
    return [mixed]


def cnn_plans(n: int) -> list[dict]:
    """Batch split everywhere; conv output channels split; conv input channels split."""
    if n == 2:
        S0, S1, R = ["S(0)"], ["S(1)"], ["R"]
        dp = plan("cnn-dp", (2,), {
            "x": cfg([], S0), "y": cfg([], S0),
            "conv2d": cfg([S0], S0, [("conv.weight", R), ("conv.bias", R)]),
            "batch_norm": cfg([S0], S0, [("bn.weight", R), ("bn.bias", R)]),
            "relu": cfg([S0], S0), "max_pool2d": cfg([S0], S0),
            "linear": cfg([S0], S0, [("fc.weight", R), ("fc.bias", R)]),
            "cross_entropy_loss": cfg([S0, S0], R, partial=(0,))})
        outc = plan("cnn-convout", (2,), {
            "x": cfg([], R), "y": cfg([], R),
            "conv2d": cfg([R], S1, [("conv.weight", S0), ("conv.bias", S0)]),
            "batch_norm": cfg([S1], S1, [("bn.weight", S0), ("bn.bias", S0)]),
            "relu": cfg([S1], S1), "max_pool2d": cfg([S1], S1),
            "linear": cfg([S1], R, [("fc.weight", S1), ("fc.bias", R)], partial=(0,)),
            "cross_entropy_loss": cfg([R, R], R)})
        inc = plan("cnn-convin", (2,), {
            "x": cfg([], S1), "y": cfg([], R),
            "conv2d": cfg([S1], R, [("conv.weight", S1), ("conv.bias", R)], partial=(0,)),
            "batch_norm": cfg([R], R, [("bn.weight", R), ("bn.bias", R)]),
            "relu": cfg([R], R), "max_pool2d": cfg([R], R),
            "linear": cfg([R], S1, [("fc.weight", S0), ("fc.bias", S0)]),
            "cross_entropy_loss": cfg([S1, R], R)})
        return [dp, outc, inc]
    a, b = ["S(0)", "R"], ["S(0)", "S(1)"]
    mixed = plan("cnn-dp2out2", (2, 2), {
        "x": cfg([], a), "y": cfg([], a),
        "conv2d": cfg([a], b, [("conv.weight", ["R", "S(0)"]), ("conv.bias", ["R", "S(0)"])]),
        "batch_norm": cfg([b], b, [("bn.weight", ["R", "S(0)"]), ("bn.bias", ["R", "S(0)"])]),
        "relu": cfg([b], b), "max_pool2d": cfg([b], b),
        "linear": cfg([b], a, [("fc.weight", ["R", "S(1)"]), ("fc.bias", ["R", "R"])], partial=(1,)),
        "cross_entropy_loss": cfg([a, a], ["R", "R"], partial=(0,))})
    return [mixed]


_GPT_LINEARS = {"linear": "qkv", "linear_1": "proj", "linear_2": "fc", "linear_3": "out"}
_GPT_LNS = {"layer_norm": "ln1", "layer_norm_1": "ln2", "layer_norm_2": "lnf"}


def gpt_plans(n: int) -> list[dict]:
    """Data parallel; Megatron-style heads/mlp/vocab split; on 4 devices dp x heads."""
    if n == 2:
        return [_gpt_dp(("S(0)",), "gpt-dp"), _gpt_tp()]
    return [_gpt_dp(("S(0)", "R"), "gpt-dp4-part", partial_extra=True)]


def _gpt_dp(b, plan_id, partial_extra=False):
    nd = len(b)
    R = ["R"] * nd
    pl = {"idx": cfg([], b), "labels": cfg([], b),
          "embedding": cfg([b], b, [("head.weight", R)]),
          "embedding_1": cfg([], R, [("pos.weight", R)]),
          "add": cfg([b, R], b), "add_1": cfg([b, b], b), "add_2": cfg([b, b], b), "gelu": cfg([b], b),
          "scaled_dot_product_attention": cfg([b, b, b], b),
          "linear_4": cfg([b], b, [("head.weight", R)]),
          "cross_entropy_loss": cfg([b, b], R, partial=tuple(i for i, p in enumerate(b) if p != "R"))}
    for node, mod in _GPT_LINEARS.items():
        pl[node] = cfg([b], b, [(f"{mod}.weight", R), (f"{mod}.bias", R)])
    for node, mod in _GPT_LNS.items():
        pl[node] = cfg([b], b, [(f"{mod}.weight", R), (f"{mod}.bias", R)])
    if partial_extra:  # second axis: the 4-head-wide mlp split on the hidden dim
        mixed_in, mixed_out = list(b[:1]) + ["S(2)"], list(b[:1]) + ["R"]
        pl["linear_2"] = cfg([b], mixed_in, [("fc.weight", ["R", "S(0)"]), ("fc.bias", ["R", "S(0)"])])
        pl["gelu"] = cfg([mixed_in], mixed_in)
        pl["linear_3"] = cfg([mixed_in], mixed_out, [("out.weight", ["R", "S(1)"]), ("out.bias", ["R", "R"])],
                             partial=(1,))
        pl["scaled_dot_product_attention"] = cfg([["S(0)", "S(1)"]] * 3, ["S(0)", "S(1)"])
    return plan(plan_id, (2,) * nd, pl)


def _gpt_tp():
    S0, S1, S2, R = ["S(0)"], ["S(1)"], ["S(2)"], ["R"]
    pl = {"idx": cfg([], R), "labels": cfg([], R),
          "embedding": cfg([R], R, [("head.weight", S0)], partial=(0,)),
          "embedding_1": cfg([], R, [("pos.weight", R)]),
          "add": cfg([R, R], R), "add_1": cfg([R, R], R), "add_2": cfg([R, R], R),
          "layer_norm": cfg([R], R, [("ln1.weight", R), ("ln1.bias", R)]),
          "layer_norm_1": cfg([R], R, [("ln2.weight", R), ("ln2.bias", R)]),
          "layer_norm_2": cfg([R], R, [("lnf.weight", R), ("lnf.bias", R)]),
          "linear": cfg([R], R, [("qkv.weight", R), ("qkv.bias", R)]),
          "scaled_dot_product_attention": cfg([S1, S1, S1], S1),
          "linear_1": cfg([S2], R, [("proj.weight", S1), ("proj.bias", R)], partial=(0,)),
          "linear_2": cfg([R], S2, [("fc.weight", S0), ("fc.bias", S0)]),
          "gelu": cfg([S2], S2),
          "linear_3": cfg([S2], R, [("out.weight", S1), ("out.bias", R)], partial=(0,)),
          "linear_4": cfg([R], S2, [("head.weight", S0)]),
          "cross_entropy_loss": cfg([S1, R], R)}
    return plan("gpt-tp", (2,), pl)


def cls_plans() -> list[dict]:
    """The CLS head's body batch-split, its head replicated: the first token's rows gathered (2 devices)."""
    S0, R = ["S(0)"], ["R"]
    return [plan("cls-dp-head", (2,), {
        "x": cfg([], S0), "y": cfg([], R),
        "linear": cfg([S0], S0, [("body.weight", R), ("body.bias", R)], sync=[("body.weight", (0,)),
                                                                             ("body.bias", (0,))]),
        "linear_1": cfg([R], R, [("head.weight", R), ("head.bias", R)]),
        "cross_entropy_loss": cfg([R, R], R)})]


def all_plans(n: int) -> list[tuple[str, dict]]:
    """(model, plan) pairs for ``n`` devices."""
    return ([("mlp", p) for p in mlp_plans(n)] + [("cnn", p) for p in cnn_plans(n)]
            + [("gpt", p) for p in gpt_plans(n)])
