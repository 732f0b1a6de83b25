"""The step a parallel model runs: interpreted on DTensors, traced, lowered, simplified, replayed.

``interpreter`` runs the exported graph node by node as the plan lays it out; ``lowering`` traces
one step of it into a local program, ``graph_passes`` and ``graph_simplify`` reschedule and
simplify that program, ``replay`` runs it every step; ``eval_graph`` is the forward-only form.
The highest of the executor's sub-packages: it may import every other.
"""
