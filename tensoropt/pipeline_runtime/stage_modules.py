"""A pipelined plan's stage modules: the model's exported step cut at the plan's block boundaries.

The model is exported on meta at the micro-batch size (:func:`tensoropt.executor.job.meta_export.
export_on_meta`, the executor's export), and its operators are grouped into blocks exactly as the
planner grouped them (:func:`tensoropt.pipeline.stages.find_blocks` on the same graph). Stage ``s``
of ``{"blocks": [[first, last], ...]}`` runs the operators of blocks ``first..last`` plus every
view, getitem and constant-only operator they read (such operators are recomputed by each stage
that needs them: the causal mask, rotary tables); the one tensor the previous stage sends is its
first argument, the graph inputs it reads (the labels of the loss) are keyword arguments, and the
last stage returns the graph's loss.

Each stage is an ``fx.GraphModule`` built from ``ExportedProgram.module()`` (parameters as
attributes under the model's own names): torch copies into it only the parameters and buffers
its operators read and leaves the rest (torchtitan's "copy and delete what a stage does not hold"),
so ``stage.state_dict()`` keys are the model's (``blocks.0.attn.q.weight``) and a checkpoint
written at one stage count reads back at another. It runs eagerly (autograd through the aten ops);
tracing and replaying each stage as the executor does is a later step.

Example:
    >>> # not run here: see tests/pipeline_runtime/test_stage_modules.py
    >>> stages = build_stages(spec, {"stages": 2, "schedule": "1F1B", "micro_batches": 2,
    ...                              "blocks": [[0, 1], [2, 3]]}, micro_batch_rows=2)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from tensoropt.pipeline.schedules import PipelineError
from tensoropt.pipeline.stages import Blocks, find_blocks
from tensoropt.pipeline_runtime.tied import tied_parameters

RECEIVED = "received"
"""The name of a stage's first argument: the activation the previous stage sends."""


@dataclass
class StageModules:
    """Every stage of one pipelined plan, cut from one export (see the module docstring).

    Attributes:
        modules: one ``fx.GraphModule`` per stage (parameters on meta until
            :func:`load_initial_values`), in stage order.
        input_names: per stage, the graph inputs it takes as keyword arguments.
        boundary_meta: per stage but the last, the meta tensor it sends (shape and dtype at the
            micro-batch size).
        blocks: the export's :class:`~tensoropt.pipeline.stages.Blocks`.
        skeleton: the model the stages were cut from (parameters on meta, buffers real).
        ties: the parameters several stages read (tied weights), per tensor stage -> the key
            that stage holds it by (:func:`tensoropt.pipeline_runtime.tied.tied_parameters`).
    """

    modules: list[fx.GraphModule]
    input_names: list[list[str]]
    boundary_meta: list[torch.Tensor]
    blocks: Blocks
    skeleton: object
    ties: list[dict[int, str]] = field(default_factory=list)


def _stage_of_nodes(graph: fx.Graph, blocks: Blocks, ranges: list[list[int]]) -> dict[str, int]:
    """fx node name -> stage, for the compute operators of the blocks each stage holds."""
    out: dict[str, int] = {}
    for s, (first, last) in enumerate(ranges):
        for b in range(first, last + 1):
            for n in blocks.nodes[b]:
                out[n] = s
    return out


def check_ranges(pipeline: dict, blocks: Blocks, block_names: list[str] | None = None) -> list[list[int]]:
    """The plan's ``blocks`` checked against the export's blocks: consecutive, covering, cuttable.

    Example:
        >>> b = Blocks(["embedding", "l.0", "head"], [set(), set(), set()], [True, True], "l", {}, True)
        >>> check_ranges({"blocks": [[0, 1], [2, 2]]}, b)
        [[0, 1], [2, 2]]
        >>> try:
        ...     check_ranges({"blocks": [[0, 0], [2, 2]]}, b)
        ... except PipelineError as e:
        ...     print(e)
        plan pipeline.blocks [[0, 0], [2, 2]]: stages must hold consecutive blocks 0..2 (embedding, l.0, head)
    """
    ranges = [[int(a), int(z)] for a, z in pipeline["blocks"]]
    flat = [i for a, z in ranges for i in range(a, z + 1)]
    if flat != list(range(blocks.count)) or any(a > z for a, z in ranges):
        raise PipelineError(
            f"plan pipeline.blocks {ranges}: stages must hold consecutive blocks 0..{blocks.count - 1} "
            f"({', '.join(blocks.names)})")
    if block_names is not None and list(block_names) != list(blocks.names):
        raise PipelineError(
            f"plan pipeline_detail.block_names {block_names} differ from the model's blocks {blocks.names}: "
            "the plan was made for another model; plan the job again")
    for _, last in ranges[:-1]:
        if not blocks.can_cut(last):
            raise PipelineError(
                f"plan pipeline.blocks {ranges}: no single tensor crosses after block {last} "
                f"({blocks.names[last]}), so a stage cannot end there")
    return ranges


def cut_stages(gm: fx.GraphModule, blocks: Blocks, ranges: list[list[int]]) -> tuple[list[fx.GraphModule],
                                                                                     list[list[str]], list]:
    """Cut the unlifted exported module ``gm`` into one ``fx.GraphModule`` per stage.

    Returns:
        ``(modules, input_names, boundary_meta)`` as in :class:`StageModules`.

    A parameter read by operators of two stages (tied weights across stages) is in both stages'
    modules (:func:`tensoropt.pipeline_runtime.tied.tied_parameters` finds it), and every stage
    reads a tied parameter by its first name (:func:`canonical_names`: ``transformer.wte.weight``,
    not the alias ``lm_head.weight`` the export may read it by), as one process names it.

    Raises:
        PipelineError: a stage reading an activation of a stage other than the one before it.
    """
    stage_of = _stage_of_nodes(gm.graph, blocks, ranges)
    nodes = list(gm.graph.nodes)
    output = next(n for n in nodes if n.op == "output")
    loss = fx.node.map_arg(output.args[0], lambda n: n)
    while isinstance(loss, (tuple, list)):
        loss = loss[0]
    boundaries = [blocks.boundary[blocks.names[last]] for _, last in ranges[:-1]]
    named = canonical_names(gm)
    by_name = {n.name: n for n in nodes}
    modules, input_names, metas = [], [], []
    for s in range(len(ranges)):
        own = {n for n in nodes if stage_of.get(n.name) == s}
        received = by_name[boundaries[s - 1]] if s > 0 else None
        target = by_name[boundaries[s]] if s < len(ranges) - 1 else loss
        needed: list[fx.Node] = []
        seen: set[fx.Node] = set()
        stack = [target, *own]
        while stack:  # every node the stage's operators read, stopping at the received tensor
            n = stack.pop()
            if n in seen or n is received:
                continue
            other = stage_of.get(n.name)
            if other is not None and other != s:
                raise PipelineError(
                    f"stage {s} reads {n.name} of stage {other} (module {n.meta.get('nn_module_stack')}), "
                    "but a stage receives only the previous stage's one tensor; choose other cuts")
            seen.add(n)
            needed.append(n)
            stack.extend(n.all_input_nodes)
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        if received is not None:
            env[received] = g.placeholder(RECEIVED)
            metas.append(received.meta["val"])
        names = []
        for n in nodes:  # the graph's own order keeps it topological
            if n not in seen:
                continue
            if n.op == "placeholder":
                names.append(n.target)
                env[n] = g.placeholder(n.target)
                continue
            env[n] = g.node_copy(n, env.__getitem__)
            if n.op == "get_attr" and str(n.target) in named:  # a tied alias: the model's own name
                env[n].target = named[str(n.target)]
        g.output(env[target])
        g.lint()
        modules.append(fx.GraphModule(gm, g, class_name=f"Stage{s}"))
        input_names.append(names)
    return modules, input_names, metas


def canonical_names(root: nn.Module) -> dict[str, str]:
    """Each alias of a tied parameter of ``root`` -> the parameter's first name
    (``named_parameters()``'s, what one process, its optimizer and its checkpoints call it); names
    that are their parameter's first are left out.

    Example:
        >>> root = nn.Module(); root.emb = nn.Embedding(4, 2); root.head = nn.Linear(2, 4, bias=False)
        >>> root.head.weight = root.emb.weight
        >>> canonical_names(root)
        {'head.weight': 'emb.weight'}
    """
    first: dict[int, str] = {}
    out = {}
    for key, p in root.named_parameters(remove_duplicate=False):
        if first.setdefault(id(p), key) != key:
            out[key] = first[id(p)]
    return out


def build_stages(spec, pipeline: dict, micro_batch_rows: int, device: torch.device | None = None,
                 block_names: list[str] | None = None) -> StageModules:
    """Export ``spec``'s model at ``micro_batch_rows`` rows and cut it as ``pipeline`` says.

    Args:
        spec: the run's :class:`tensoropt.executor.job.spec.TrainSpec`.
        pipeline: the plan entry's ``"pipeline"`` (``stages``, ``blocks``...).
        micro_batch_rows: rows of one micro-batch on one data-parallel rank (the shapes are static).
        device: where tensors the graph creates go (default: the CPU).
        block_names: the plan's ``pipeline_detail.block_names``, checked against the export's.

    Example:
        >>> # not run here: see tests/pipeline_runtime/test_stage_modules.py
        >>> build_stages(spec, plan["pipeline"], 2).input_names  # doctest: +SKIP
        [['tokens'], ['labels']]
    """
    from tensoropt.capture.graph import build_graph
    from tensoropt.executor.job.materialize import build_skeleton
    from tensoropt.executor.job.meta_export import export_on_meta, meta_inputs

    device = device or torch.device("cpu")
    skeleton = build_skeleton(spec)
    micro = dataclasses.replace(spec, global_batch_size=micro_batch_rows)
    ep = export_on_meta(skeleton, meta_inputs(micro), device)
    blocks = find_blocks(build_graph(ep))
    ranges = check_ranges(pipeline, blocks, block_names)
    from tensoropt.pipeline.schedules import stages_per_rank

    chunks = stages_per_rank(pipeline.get("schedule", "1F1B"))
    if len(ranges) != int(pipeline["stages"]) * chunks:
        raise PipelineError(f"plan pipeline: {pipeline['stages']} stages under {pipeline.get('schedule')} "
                            f"need {int(pipeline['stages']) * chunks} block ranges (virtual stages), "
                            f"got {len(ranges)}")
    gm = ep.module()
    modules, names, metas = cut_stages(gm, blocks, ranges)
    reads = [{str(n.target) for n in m.graph.nodes if n.op == "get_attr"} for m in modules]
    return StageModules(modules, names, metas, blocks, skeleton, tied_parameters(gm, reads))


def load_initial_values(stages: StageModules, which: int, device: torch.device) -> fx.GraphModule:
    """Give stage ``which`` its initial parameters (the executor's init: same values as 1 process)
    and real buffers, on ``device``; the other stages' parameters are never made in full.

    Example:
        >>> # not run here: see tests/pipeline_runtime/test_stage_modules.py
        >>> module = load_initial_values(stages, 0, torch.device("cpu"))  # doctest: +SKIP
    """
    from tensoropt.executor.job.materialize import materialize

    module = stages.modules[which]
    params = dict(module.named_parameters())

    def keep(keys, value):
        for key in keys:
            if key in params:
                _set(module, key, nn.Parameter(value.detach().to(device).clone(), params[key].requires_grad))

    materialize(stages.skeleton, keep)
    real = stages.skeleton.buffers()
    for key, buf in list(module.named_buffers()):
        value = real.get(key)
        if value is not None:
            _set(module, key, value.to(device).clone(), buffer=True)
        elif buf.is_meta:
            raise PipelineError(f"buffer {key!r} of stage {which} has no value; "
                                "build it in the model's __init__")
    for key, p in module.named_parameters():
        if p.is_meta:
            raise PipelineError(f"parameter {key!r} of stage {which} got no initial value")
    return module


def merge_stage_modules(modules: list[nn.Module]) -> nn.Module:
    """One module holding every parameter and buffer of ``modules`` (the stages of one rank) under
    the model's own names: the same tensors, so the optimizer, the gradient sync and checkpoints
    see both stages as one (an interleaved rank's).

    Example:
        >>> a, b = nn.Module(), nn.Module()
        >>> a.blocks = nn.ModuleList([nn.Linear(2, 2)])
        >>> b.head = nn.Linear(2, 1)
        >>> merged = merge_stage_modules([a, b])
        >>> sorted(merged.state_dict()), merged.head.weight is b.head.weight
        (['blocks.0.bias', 'blocks.0.weight', 'head.bias', 'head.weight'], True)
    """
    merged = nn.Module()
    for module in modules:
        for key, value in module.named_parameters():
            _set(_owner_path(merged, key), key.rpartition(".")[2], value)
        for key, value in module.named_buffers():
            if key not in dict(merged.named_buffers()):
                _set(_owner_path(merged, key), key.rpartition(".")[2], value, buffer=True)
    return merged


def _owner_path(root: nn.Module, key: str) -> nn.Module:
    """The module owning ``key`` under ``root``, creating empty modules along the path."""
    owner = root
    for part in key.split(".")[:-1]:
        if part not in owner._modules:
            owner._modules[part] = nn.Module()
        owner = owner._modules[part]
    return owner


def _set(module: nn.Module, key: str, value: torch.Tensor, buffer: bool = False) -> None:
    owner_path, _, name = key.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if buffer:
        owner._buffers[name] = value
    else:
        owner._parameters[name] = value
