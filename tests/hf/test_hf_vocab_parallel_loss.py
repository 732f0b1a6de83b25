"""HuggingFace's own causal-LM loss (``loss: model``) split by vocabulary (issue 26, item 2).

transformers 5's ``ForCausalLMLoss`` upcasts the logits (``.float()``), pads the labels with -100 and
shifts them, flattens the logits to ``[tokens, vocabulary]`` and calls ``cross_entropy(ignore_index=
-100)``. The capture folds the upcast and the flattening into the edge from ``lm_head`` to the loss,
so the class dim of the loss's logits is the head's ``out`` dim: the configuration space offers the
class split there, and the executor runs it as its vocabulary-parallel cross entropy
(tensoropt/executor/ops/vocab_parallel.py). Here GPT-2 and Llama (tiny configs) train on 2 gloo
processes under a plan whose head and loss are split by vocabulary, on labels with -100 positions,
and match 1 process; the run's measured memory is the planner's prediction of that plan within 2 %.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

from tensoropt.config import DataConfig, Job, load_job  # noqa: E402
from tensoropt.configspace import configurations, parallel_dims  # noqa: E402
from tensoropt.configspace.configuration import Mesh  # noqa: E402
from tensoropt.executor.job.spec import TrainSpec  # noqa: E402
from tensoropt.planner import capture_job, job_cost_graph, load_job_cluster  # noqa: E402

JOBS_DIR = Path(__file__).resolve().parents[2] / "configs" / "jobs"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "executor"))
from launch_helpers import outputs, run_and_compare  # noqa: E402

MODELS = ("gpt2", "llama")
STEPS = 3


def _job(model: str, precision: str = "fp32") -> Job:
    """The example job on labels with -100 positions (tests/executor/masked_tokens.py), SGD + momentum."""
    job = load_job(JOBS_DIR / f"hf-{model}.yaml")
    data = DataConfig("masked_tokens:masked_tokens",
                    {"num_samples": 64, "seq_len": 32, "vocab_size": job.model.kwargs["vocab_size"]})
    training = dataclasses.replace(job.training, optimizer="momentum", learning_rate=0.05,
                                   precision=precision, dtype=None)
    return dataclasses.replace(job, devices=[2], data=data, training=training)


def _loss_and_head(graph) -> tuple[str, str]:
    """(the cross-entropy node, the node producing its logits)."""
    (loss,) = [n for n, d in graph.nx.nodes(data=True) if d["kind"] == "cross_entropy"]
    return loss, graph.nx.nodes[loss]["inputs"][0]["source"]


def vocab_split_plan(job: Job) -> dict:
    """A 2-device plan.json: the head and the loss split by vocabulary (``out=2``), every other
    operator split by batch where it can be (else replicated)."""
    graph = capture_job(job)
    cluster = load_job_cluster(job)
    G = job_cost_graph(graph, job, cluster, 2)
    loss, head = _loss_and_head(graph)
    placements, index = {}, {}
    for node in G.nodes:
        labels = list(G.nodes[node]["configs"])
        want = "out=2" if node in (loss, head) else "batch=2"
        index[node] = labels.index(want) if want in labels else 0
        placements[node] = G.nodes[node]["configurations"][index[node]].to_json()
    assert placements[loss]["inputs"][0] == ["S(1)"], placements[loss]
    # the planner's memory of this choice: node and edge costs add up (what the solver sums)
    memory = sum(float(G.nodes[n]["cost"][index[n]][1]) for n in G.nodes)
    memory += sum(float(d["cost"][index[u]][index[v]][1]) for u, v, d in G.edges(data=True))
    mesh = G.graph["mesh"]
    return {"id": "d2-vocab", "devices": 2, "mesh": {"shape": list(mesh.shape), "levels": list(mesh.levels)},
            "placements": placements, "memory_bytes": memory}


@pytest.mark.parametrize("model", MODELS)
def test_the_class_split_is_offered_for_the_hf_causal_lm_loss(model):
    """The loss's logits come from the head through ``.float()`` and the flattening, as the head's
    [batch, seq, vocabulary] output; the loss's class dim is the head's ``out`` dim."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = capture_job(_job(model, "bf16-mixed"))
    loss, head = _loss_and_head(graph)
    data = graph.nx.nodes[loss]
    logits, labels = data["inputs"]
    vocab = data["inputs"][0]["shape"][1]
    assert graph.nx.nodes[head]["module"].endswith("lm_head")
    assert logits["dim_map"] == [0, None, 1]  # [batch, seq, vocab] -> [batch * seq, vocab]
    assert graph.nx.nodes[labels["source"]]["kind"] == "pad"  # the -100 padding of the shifted labels
    dims = {d.name: d for d in parallel_dims(graph.nx, loss)}
    assert dims["out"].size == vocab and dims["out"].operand_dims == (1, None)
    head_out = {d.name: d for d in parallel_dims(graph.nx, head)}["out"]
    assert head_out.size == vocab and head_out.out_dim == 2
    configs = configurations(graph, Mesh.for_cluster(2, 2))
    assert "out=2" in [c.label for c in configs[loss]]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hf_losses_split_by_vocabulary_match_one_process(tmp_path):
    """Losses and final parameters within 1e-5 of 1 process (fp32), labels with -100 positions; the
    measured memory within 2 % of the cost graph's."""
    runs = []
    for model in MODELS:
        job = _job(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = vocab_split_plan(job)
        runs.append((model, TrainSpec.from_job(job, steps=STEPS), plan))
    rc, errors = run_and_compare(runs, tmp_path, env={}, steps=STEPS, timeout_s=800)
    for model, _, plan in runs:  # the class-split loss's pricing against the run's measured memory
        metrics, _ = outputs(tmp_path, model, plan["id"])
        measured, predicted = metrics["measured"]["memory_bytes"], plan["memory_bytes"]
        print(f"{model}: measured memory {measured} B, predicted {predicted:.0f} B "
              f"({(measured / predicted - 1) * 100:+.2f} %)")
        if abs(measured - predicted) > 0.02 * predicted:
            errors.append(f"{model}: measured memory {measured} B, predicted {predicted:.0f} B")
    assert not errors, "\n".join(errors)
    assert rc == 0
