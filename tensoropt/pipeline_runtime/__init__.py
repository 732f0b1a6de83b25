"""The runtime of pipelined plans (issue 27, item 2): stage modules and the pipelined training loop.

* :mod:`tensoropt.pipeline_runtime.stage_modules`: the model's exported step cut into one module
  per stage at the plan's block boundaries, under the model's own parameter names;
* :mod:`tensoropt.pipeline_runtime.runtime`: one rank's stage on the ``(pp, dp)`` mesh, driven
  by torch.distributed.pipelining (1F1B, GPipe), gradients averaged over the stage's replicas;
* :mod:`tensoropt.pipeline_runtime.checkpoint`: DCP checkpoints readable at any stage count;
* :mod:`tensoropt.pipeline_runtime.worker`: the torchrun worker ``tensoropt run`` starts for a
  plan whose ``"pipeline"`` is set;
* :mod:`tensoropt.pipeline_runtime.reference`: the same training on one process, unpipelined.
"""
