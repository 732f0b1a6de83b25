"""Ops that carry no data are dropped at capture; ops that cannot run are planning-time errors."""

from __future__ import annotations

import pytest
import torch

from tensoropt.capture import capture
from tensoropt.capture.runnable import unrunnable_ops
from tensoropt.config import Job
from tensoropt.planner import PlanningError, plan_job


class Casts(torch.nn.Module):
    """``.to(dtype)`` records ``aten._assert_tensor_metadata`` in the training IR (HF models do it)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x.to(torch.float32)).to(torch.float32).sum()


def test_assertions_are_dropped_at_capture_and_counted():
    g = capture(Casts(), (torch.randn(2, 4, dtype=torch.float64),))
    ops = {str(n.target) for n in g.program.graph.nodes if n.op == "call_function"}
    assert not any("_assert" in op for op in ops)
    assert not any("_assert" in d["op"] for _, d in g.nx.nodes(data=True))
    assert g.nx.graph["dropped_ops"].get("aten._assert_tensor_metadata.default", 0) >= 1
    # the program without them still computes what the model does
    x = torch.randn(2, 4, dtype=torch.float64)
    model = Casts()
    torch.testing.assert_close(capture(model, (x,)).program.module()(x), model(x))


def _job(factory: str) -> Job:
    return Job.from_dict({"model": {"factory": f"runnable_models:{factory}", "inputs": {"x": {"shape": [4]}},
                                    "loss": "model"},
                          "cluster": "cpu-local", "devices": [1, 2], "training": {"global_batch_size": 4}})


def test_an_op_without_a_cpu_kernel_is_a_planning_error_naming_op_module_and_fix():
    with pytest.raises(PlanningError) as err:
        plan_job(_job("MetaOnly"))
    text = str(err.value)
    assert "tensoropt_test.meta_only.default" in text and "model.act" in text
    assert "no kernel for CPU processes" in text and "torch.library" in text and "GPU cluster" in text


def test_an_op_without_a_backward_is_a_planning_error():
    with pytest.raises(PlanningError) as err:
        plan_job(_job("NoBackward"))
    text = str(err.value)
    assert "tensoropt_test.no_backward.default" in text and "model.act" in text
    assert "no backward" in text and "register_autograd" in text


def test_an_op_without_a_backward_is_fine_where_no_gradient_flows():
    class Detached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.ops.tensoropt_test.no_backward(x)).sum()

    import runnable_models  # noqa: F401 - registers the op

    assert unrunnable_ops(capture(Detached(), (torch.randn(2, 4),)).program, "cpu") == []
