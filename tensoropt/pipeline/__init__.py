"""Pipeline parallelism in the planner (issue 27): schedules, stages and the pipelined frontier.

* :mod:`tensoropt.pipeline.schedules`: the micro-batches each stage keeps in flight, read from
  torch.distributed.pipelining's own schedule order, and the schedules' micro-batch rules;
* :mod:`tensoropt.pipeline.stages`: the blocks of a captured graph and where a cut may go;
* :mod:`tensoropt.pipeline.search`: each stage's intra-operator frontier (the FT solve on
  ``devices / p``) and the exact DP across stages (:mod:`frontier.pipeline`), as plans.
"""
