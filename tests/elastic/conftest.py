"""Fixtures of the elastic tests (defined in elastic_helpers)."""

from elastic_helpers import agents, frontier_file, reference_params  # noqa: F401
