"""frontier: exact Pareto frontiers of parallel-plan cost graphs (the FT algorithm).

Pure numpy + networkx; imports neither torch nor tensoropt. One call for the common case::

    points = frontier.solve(G)             # exact
    points = frontier.solve(G, epsilon=0.01)  # (1 + 0.01)-approximate, real plans

See :mod:`frontier.driver` for the formulation and docs/algorithm.md for the proofs.
"""

from frontier.driver import SolveReport, solve
from frontier.memory_limit import SolverMemoryError
from frontier.point import Point

__all__ = ["Point", "SolveReport", "SolverMemoryError", "solve"]
