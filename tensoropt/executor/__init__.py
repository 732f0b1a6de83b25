"""The DTensor executor: runs a selected plan on torch.distributed ranks (docs/architecture.md).

Four sub-packages, each importing only those listed before it (``tests/api/test_layers.py``):

* :mod:`tensoropt.executor.job`: what the executor is given: the plan (``plan``), the training
  spec and its data (``spec``, ``data``), the model built on meta and exported (``materialize``,
  ``meta_export``), and the exported program's node names (``program``);
* :mod:`tensoropt.executor.ops`: the operator implementations the program runs where DTensor has
  no rule or the wrong one (local ops, explicit ops, DTensor rules, vocabulary-parallel loss,
  batch norm, gloo gathers, the local fallback) and the plan's layouts as placements;
* :mod:`tensoropt.executor.state`: what a rank holds and how it is kept: its shards of the weights
  (``local_state``, ``model_checkpoint``), optimizer state and its step (``zero``, ``local_optim``),
  gradients (``gradsync``), mixed precision, saved activations (``options``, ``block_checkpoint``),
  memory accounting and peaks, the mesh, the process group and restarts;
* :mod:`tensoropt.executor.program`: the step the parallel model runs: interpreted on DTensors
  (``interpreter``), traced and lowered to a local program (``lowering``, ``graph_passes``,
  ``graph_simplify``), replayed every step (``replay``), and its evaluation form (``eval_graph``).

Regular packages (not namespace ones) so that their modules import under their full names,
e.g. when ``pytest --doctest-modules`` collects ``tensoropt/executor/job/data.py``.
"""
