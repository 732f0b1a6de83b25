"""The operator implementations a plan's program runs, where DTensor has no rule or the wrong one.

Local ops (losses on local rows), explicit ops (conv on channels, attention, batch norm),
DTensor rules for untagged pointwise backward ops, the vocabulary-parallel loss, synchronised
batch norm, gloo-safe all-gathers, the local fallback for ops with no parallel rule, and the
plan's layout strings as DTensor placements. Imports only :mod:`tensoropt.executor.job`.
"""
