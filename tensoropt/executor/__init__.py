"""The DTensor executor: trains a selected plan on torch.distributed ranks (docs/architecture.md).

A regular package (not a namespace one) so that its modules import under their full names,
e.g. when ``pytest --doctest-modules`` collects ``tensoropt/executor/data.py``.
"""
