"""training.precision (issue 17 part 5): the job field, and what each precision costs in memory and time."""

from __future__ import annotations

import pytest
import torch

from estimators.compute import cast_time_s, optimizer_time_s
from estimators.memory import optimizer_factor
from estimators.profiles import load_cluster
from tensoropt.capture import capture
from tensoropt.config import ConfigError, Job, load_job
from tensoropt.cost_graph import cost_graph
from tensoropt.precision import PRECISIONS, get_precision

BATCH, IN, HIDDEN, OUT = 64, 256, 512, 128


class TwoLinear(torch.nn.Module):
    """x -> linear(IN->HIDDEN) -> layer_norm -> relu -> linear(HIDDEN->OUT) -> cross entropy."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(IN, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.b = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.b(torch.relu(self.norm(self.a(x)))), y)


def _graph(dtype: torch.dtype):
    model = TwoLinear().to(dtype)
    return capture(model, (torch.randn(BATCH, IN, dtype=dtype), torch.randint(0, OUT, (BATCH,))))


@pytest.fixture(scope="module")
def graphs():
    """precision -> cost graph on 2 devices (the graph captured in the precision's compute dtype)."""
    out = {}
    for name in ("fp32", "bf16", "bf16-mixed", "fp16-mixed"):
        dtype = getattr(torch, get_precision(name).compute_dtype)
        out[name] = cost_graph(_graph(dtype), "h100x8", 2, precision=name,
                               memory_options=("recompute", "zero1", "zero2", "zero3"))
    return out


def _row(G, node: str, label: str) -> int:
    return G.nodes[node]["configs"].index(label)


def _param_elements(G, node: str) -> int:
    return sum(p.numel() for name, p in TwoLinear().named_parameters() if name.startswith(
        {"linear": "a.", "linear_1": "b.", "layer_norm": "norm."}[node]))


# -- the job field -------------------------------------------------------------------------------------


def _job(training: dict) -> Job:
    return Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
                          "training": training})


def test_dtype_is_the_older_alias_of_a_pure_precision():
    assert _job({}).training.precision == "fp32"
    assert _job({"dtype": "bfloat16"}).training.precision == "bf16"
    assert _job({"dtype": "float16"}).training.precision == "fp16"
    assert _job({"precision": "bf16"}).training.dtype == "bfloat16"
    mixed = _job({"precision": "bf16-mixed"})
    assert mixed.training.dtype is None  # no dtype means a mixed precision
    assert _job({"precision": "bf16", "dtype": "bfloat16"}).training.precision == "bf16"
    for name in PRECISIONS:
        job = _job({"precision": name})
        assert Job.from_dict(job.to_dict()) == job


def test_dtype_and_precision_that_disagree_is_an_error_naming_both(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: {name: mlp}\ncluster: cpu-local\ndevices: [2]\n"
                    "training: {dtype: bfloat16, precision: bf16-mixed}\n")
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert "training.dtype" in str(e.value) and "training.precision" in str(e.value)
    assert str(path) in str(e.value)
    with pytest.raises(ConfigError, match=r"training\.precision.*fp32 \| bf16 \| fp16 \| bf16-mixed"):
        _job({"precision": "bf8"})


# -- memory ----------------------------------------------------------------------------------------------


def test_mixed_keeps_fp32_master_state_and_a_bf16_copy_where_the_op_saves_its_weight(graphs):
    adam = optimizer_factor("adamw")
    # elements of the copies kept: the second linear's weight (not its bias), both norm parameters
    for node, copied in (("linear", 0), ("linear_1", HIDDEN * OUT), ("layer_norm", 2 * HIDDEN)):
        n = _param_elements(graphs["fp32"], node)
        memory = {name: G.nodes[node]["memory_bytes"][_row(G, node, "batch=2")] for name, G in graphs.items()}
        # pure bf16 and bf16-mixed save the same bf16 activations; the parameter state differs:
        # 2 + 2 + 4 B (bf16 param, grad, Adam) against 4 + 4 + 8 B, + a 2 B copy of what the op keeps
        # for backward (the first linear's input needs no gradient: its weight is not kept)
        assert memory["bf16-mixed"] - memory["bf16"] == n * (4 - 2) * (2 + adam) + 2 * copied
        assert memory["bf16-mixed"] == memory["fp16-mixed"]


def test_mixed_activations_are_priced_in_the_compute_dtype(graphs):
    # relu keeps its output for backward: BATCH / 2 x HIDDEN elements per device
    kept = {name: G.nodes["relu"]["memory_bytes"][_row(G, "relu", "batch=2")] for name, G in graphs.items()}
    assert kept["fp32"] == BATCH // 2 * HIDDEN * 4
    assert kept["bf16-mixed"] == kept["fp16-mixed"] == kept["bf16"] == BATCH // 2 * HIDDEN * 2


def test_zero_options_split_each_mixed_term(graphs):
    G, adam = graphs["bf16-mixed"], optimizer_factor("adamw")
    node = "linear_1"
    base = G.nodes[node]["memory_bytes"][_row(G, node, "batch=2")]
    configs = G.nodes[node]["configurations"]
    by_option = {c.options: G.nodes[node]["memory_bytes"][i] for i, c in enumerate(configs)
                 if c.label.startswith("batch=2")}
    n = _param_elements(G, node)
    half = n // 2
    # zero1: half the Adam state (fp32, 8 B); zero2: + half the fp32 gradient; zero3: + half the fp32
    # master, and the bf16 copy of the weight is no longer kept (gathered again in backward)
    assert base - by_option[("zero1",)] == pytest.approx(half * 4 * adam, rel=0.02)
    assert base - by_option[("zero2",)] == pytest.approx(half * (4 * adam + 4), rel=0.02)
    assert base - by_option[("zero3",)] == pytest.approx(half * (4 * adam + 8) + 2 * HIDDEN * OUT, rel=0.02)


def test_a_recomputing_node_keeps_every_parameter_copy(graphs):
    # the recipe keeps every operand: the first linear's weight and bias copies (2 B each), which
    # the op alone does not keep (its input needs no gradient); zero3 gathers them again instead
    n = _param_elements(graphs["fp32"], "linear")
    rows = {}
    for name in ("bf16", "bf16-mixed"):
        G = graphs[name]
        labels = G.nodes["linear"]["configs"]
        rows[name] = {label: G.nodes["linear"]["memory_bytes"][labels.index(label)]
                      for label in ("batch=2", "batch=2,recompute", "batch=2,zero3,recompute")}
    state = n * (4 - 2) * (2 + optimizer_factor("adamw"))  # fp32 against bf16 parameter, gradient, Adam
    assert rows["bf16-mixed"]["batch=2"] - rows["bf16"]["batch=2"] == state
    assert rows["bf16-mixed"]["batch=2,recompute"] - rows["bf16"]["batch=2,recompute"] == state + 2 * n
    zero3 = rows["bf16-mixed"]["batch=2,zero3,recompute"] - rows["bf16"]["batch=2,zero3,recompute"]
    assert zero3 == pytest.approx(state / 2, rel=0.01)


# -- time -----------------------------------------------------------------------------------------------


def test_mixed_computes_at_the_bf16_peak_and_reduces_gradients_in_fp32():
    cluster = load_cluster("h100x8")
    ratio = cluster.device.peak_flops("float32") / cluster.device.peak_flops("bfloat16")
    big = torch.nn.Linear(4096, 4096)
    Gs = {}
    for name in ("fp32", "bf16", "bf16-mixed"):
        dtype = getattr(torch, get_precision(name).compute_dtype)
        g = capture(torch.nn.Sequential(big).to(dtype), (torch.randn(4096, 4096, dtype=dtype),))
        Gs[name] = cost_graph(g, cluster, 2, precision=name)
    node = next(n for n in Gs["fp32"] if Gs["fp32"].nodes[n]["kind"] == "linear")
    row = _row(Gs["fp32"], node, "batch=2")
    compute = {k: G.nodes[node]["compute_s"][row] for k, G in Gs.items()}
    comm = {k: G.nodes[node]["comm_s"][row] for k, G in Gs.items()}
    assert compute["bf16"] < 2 * ratio * compute["fp32"]  # matmul-bound: the bf16 peak
    # mixed = pure bf16 + the optimizer stepping fp32 (not bf16) state + the casts (forward: read the
    # 4 B master, write the 2 B copy; backward: read the 2 B gradient, write the 4 B one), 2 tensors
    n, device = 4096 * 4096 + 4096, cluster.device
    extra = (optimizer_time_s(device, 4 * n, 2, "adamw") - optimizer_time_s(device, 2 * n, 2, "adamw")
             + cast_time_s(device, 12 * n, 4))
    assert compute["bf16-mixed"] - compute["bf16"] == pytest.approx(extra, rel=1e-6)
    assert comm["bf16-mixed"] == pytest.approx(comm["fp32"])  # the fp32 gradient all-reduce
    assert comm["bf16"] < 0.6 * comm["fp32"]


def test_configuration_rows_are_unchanged_by_precision(graphs):
    labels = {name: [G.nodes[n]["configs"] for n in sorted(G)] for name, G in graphs.items()}
    assert labels["fp32"] == labels["bf16-mixed"]
