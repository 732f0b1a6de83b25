"""What the executor is given: the plan, the training spec and its data, and the model it exports.

The lowest of the executor's sub-packages (it imports none of the others): the plan's mesh and
configurations (``plan``), the spec of what is trained (``spec``) and each rank's region of the
batch (``data``), the model built on meta and materialised one module at a time (``materialize``),
exported on meta (``meta_export``), and the exported program's node names (``program``).
"""
