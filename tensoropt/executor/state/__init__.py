"""What a rank holds for a plan and how it is kept: weights, gradients, optimizer state, activations.

Its shards of the weights (``local_state``, initial values from ``model_checkpoint``), sharded
optimizer state (``zero``) and the optimizer step on local shards (``local_optim``), gradient
synchronisation (``gradsync``), mixed precision's master weights and loss scaling, saved
activations' memory options (``options``, ``block_checkpoint``), memory accounting and peaks
(``memory``, ``peak_memory``, ``tensor_peak``), the mesh, the process group (``worker``) and
restarts (``restart``). Imports :mod:`tensoropt.executor.job` and :mod:`tensoropt.executor.ops`.
"""
