"""Reference solvers: baselines and test oracles, never used by the planner.

- :func:`brute_force`: enumerate every plan (tests);
- :func:`ilp_min_cost`: min one objective subject to budgets on the others (HiGHS);
- :func:`nsga2_frontier`: NSGA-II (pymoo) approximation of the frontier;
- :func:`mcmc_frontier`: FlexFlow-style Metropolis search.
"""

from frontier.reference.brute_force import brute_force
from frontier.reference.hypervolume import hypervolume_2d
from frontier.reference.ilp import ilp_min_cost
from frontier.reference.mcmc import mcmc_frontier
from frontier.reference.nsga2 import nsga2_frontier

__all__ = ["brute_force", "hypervolume_2d", "ilp_min_cost", "mcmc_frontier", "nsga2_frontier"]
