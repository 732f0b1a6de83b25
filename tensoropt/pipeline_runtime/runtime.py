"""One rank of a pipelined plan: its stage on a ``(pp, dp)`` mesh, driven by torch.distributed.pipelining.

Ranks are laid out stage-major (rank ``s * dp + d`` holds stage ``s`` for data-parallel replica
``d``), as the plan's ``pipeline_detail.stages[s].devices`` reads. Each step:

1. this replica's rows of the step's global batch (rows ``d * B/dp ..``) are split by the schedule
   into ``m`` micro-batches; stage 0 gets the inputs it reads, the other stages the activation of
   the stage before and the inputs they read (the labels) as keyword arguments;
2. ``Schedule1F1B`` or ``ScheduleGPipe`` (``scale_grads=False``) runs the micro-batches; the last
   stage's module returns the graph's own loss of a micro-batch, which the schedule's ``loss_fn``
   scales: by ``n_i · dp / N`` where the loss is a token mean (a plain-mean cross entropy: ``n_i``
   the micro-batch's counted labels, ``N`` the step's over every micro-batch and replica, one
   all-reduce of one number over the replicas; :mod:`tensoropt.pipeline_runtime.token_count`), so
   the gradients are those of the whole batch's token mean however the labels fall; else by
   ``1/m``;
3. the gradients of the stage's parameters are averaged over its data-parallel group, once per
   step (one flat all-reduce); a weight tied across stages (GPT-2's embedding and head) has a copy
   on each of its stages, whose gradients one all-reduce between those stages then sums
   (:mod:`tensoropt.pipeline_runtime.tied`);
4. the job's optimizer (AdamW...) steps the stage's parameters.

``Interleaved1F1B`` plans list ``2 p`` virtual stages in ``blocks``: rank ``r`` of the ``pp``
dimension builds virtual stages ``r`` and ``r + p`` (two ``PipelineStage`` objects, each replayed)
and ``ScheduleInterleaved1F1B`` drives both; every stage of a rank is handed the rank's inputs and
takes only the ones it reads (:class:`OwnInputs`). :attr:`PipelineRuntime.module` is then one
module holding both stages' parameters under the model's names (:func:`~tensoropt.pipeline_runtime.
stage_modules.merge_stage_modules`): the optimizer, the gradient sync and the checkpoints see it.

Example:
    >>> # not run here: needs a process group; see tests/pipeline_runtime/
    >>> rt = PipelineRuntime(spec, plan)  # doctest: +SKIP
    >>> loss = rt.train_step(0)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from tensoropt.pipeline.schedules import PipelineError, check_pipeline, stages_per_rank
from tensoropt.pipeline_runtime.stage_modules import build_stages, load_initial_values, merge_stage_modules
from tensoropt.pipeline_runtime.tied import TiedGradients, share_on_rank

SCHEDULE_CLASSES = ("1F1B", "GPipe", "Interleaved1F1B")
"""Schedules this runtime drives (``Interleaved1F1B``: two virtual stages per rank)."""


def schedule_class(name: str):
    """torch's schedule class for a plan's ``schedule``.

    Example:
        >>> schedule_class("GPipe").__name__
        'ScheduleGPipe'
    """
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    classes = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe, "Interleaved1F1B": ScheduleInterleaved1F1B}
    if name not in classes:
        raise PipelineError(f"plan pipeline.schedule: {name!r} is not run yet; the runtime runs "
                            f"{', '.join(SCHEDULE_CLASSES)}")
    return classes[name]


def stage_layout(rank: int, world_size: int, stages: int) -> tuple[int, int, int]:
    """``(stage, data-parallel index, data-parallel degree)`` of ``rank``: stage-major.

    Example:
        >>> [stage_layout(r, 4, 2) for r in range(4)]
        [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    """
    if world_size % stages:
        raise PipelineError(f"plan pipeline.stages: {stages} stages do not divide {world_size} processes")
    dp = world_size // stages
    return rank // dp, rank % dp, dp


class PipelineRuntime:
    """This rank's stage of ``plan`` (see the module docstring); the process group must exist.

    Args:
        spec: the run's :class:`tensoropt.executor.job.spec.TrainSpec`.
        plan: the plan entry (plan.json): ``pipeline`` and, optionally, ``pipeline_detail``.
        device: where the stage runs (default: this rank's CUDA device, else the CPU).
        replay: run the stage as traced forward and backward programs (default), else eagerly
            (autograd through each operator: the reference).
        timeout_s: the limit of the collectives of the process groups it makes (tied weights').
        compile: ``"none"`` or ``"inductor"``: the replayed programs compiled by Inductor
            (:class:`~tensoropt.pipeline_runtime.replay.ReplayedStage`; needs ``replay``).
    """

    def __init__(self, spec, plan: dict, device: torch.device | None = None, replay: bool = True,
                 timeout_s: float = 120.0, compile: str = "none"):
        pipe = plan.get("pipeline")
        if not pipe:
            raise PipelineError(f"plan {plan.get('id')}: \"pipeline\" is null; "
                                "this runtime runs pipelined plans")
        self.spec, self.plan = spec, plan
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.num_stages, self.m = int(pipe["stages"]), int(pipe["micro_batches"])
        self.stage_index, self.dp_index, self.dp = stage_layout(self.rank, self.world, self.num_stages)
        check_pipeline(pipe["schedule"], self.num_stages, self.m, self.world, spec.global_batch_size)
        if spec.global_batch_size % (self.dp * self.m):
            raise PipelineError(
                f"training.global_batch_size {spec.global_batch_size} does not divide into {self.dp} "
                f"data-parallel replicas x {self.m} micro-batches")
        self.rows = spec.global_batch_size // self.dp
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
                else torch.device("cpu")
        self.device = device
        from tensoropt.executor.program.replay import check_compile_backend

        check_compile_backend(compile, device.type)
        if compile != "none" and not replay:
            raise PipelineError(f"executor.compile: {compile} compiles the replayed stages: it needs "
                                "replay (the run entry's replay: true)")
        self.compile = compile
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(device.type, (self.num_stages, self.dp), mesh_dim_names=("pp", "dp"))
        detail = plan.get("pipeline_detail") or {}
        stages = build_stages(spec, pipe, self.rows // self.m, device, detail.get("block_names"))
        self.blocks = stages.blocks
        self.chunks = stages_per_rank(pipe["schedule"])
        self.virtual_stages = [self.stage_index + c * self.num_stages for c in range(self.chunks)]
        """The (virtual) stages this rank runs, in chain order: ``[r]``, or ``[r, r + p]`` interleaved."""
        total = self.num_stages * self.chunks
        self.is_first, self.is_last = self.stage_index == 0, self.virtual_stages[-1] == total - 1
        from torch.distributed.pipelining import PipelineStage

        from tensoropt.pipeline_runtime.replay import ReplayedStage

        loaded = {v: load_initial_values(stages, v, device) for v in self.virtual_stages}
        share_on_rank(loaded, stages.ties)  # an interleaved rank's stages reading one tied tensor
        self.tied = TiedGradients(stages.ties, self.virtual_stages, self.num_stages, self.dp_index, self.dp,
                                  self.mesh.get_group("pp"), timeout_s)
        """The once-per-step sum of the copies of weights tied across stages (:mod:`tensoropt.
        pipeline_runtime.tied`; nothing to do for a model without such weights)."""
        modules, self.stage_modules, self.stages, names = [], [], [], []
        for v in self.virtual_stages:
            module = loaded[v]
            own = stages.input_names[v]
            wrapped = ReplayedStage(module, own, received=v > 0, compile=compile) if replay else module
            modules.append(module)
            self.stage_modules.append(wrapped)
            names += [n for n in own if n not in names]
            inputs = stages.boundary_meta[v - 1] if v > 0 else None
            # the last stage's loss described too: with every stage's inputs and outputs given, torch
            # skips its metadata inference (a forward and backward on uninitialised tensors, whose
            # gradients a replayed stage would add to its parameters)
            outputs = stages.boundary_meta[v] if v < total - 1 else _output_meta(module)
            driven = OwnInputs(wrapped, own) if self.chunks > 1 else wrapped
            self.stages.append(PipelineStage(
                driven, v, total, device,
                input_args=_like(inputs, device) if inputs is not None else (),
                output_args=_like(outputs, device),
                group=self.mesh.get_group("pp")))
        self.module = modules[0] if self.chunks == 1 else merge_stage_modules(modules)
        """The rank's parameters under the model's names (its one stage, or its stages merged)."""
        self.stage_module = self.stage_modules[0]
        """What the schedule drives (the first of :attr:`stage_modules`): the stage replaying its
        traced forward and backward programs
        (:class:`~tensoropt.pipeline_runtime.replay.ReplayedStage`), or the module itself (eager)."""
        self.stage = self.stages[0]
        self.input_names = names
        from tensoropt.pipeline_runtime.token_count import label_counter

        self.counter = label_counter(modules[-1]) if self.is_last else None
        """The last stage's count of its loss's valid labels (None: not a token mean; scale 1/m)."""
        schedule_cls = schedule_class(pipe["schedule"])
        self.schedule = schedule_cls(self.stages if self.chunks > 1 else self.stage, self.m,
                                     loss_fn=_scaled_loss, scale_grads=False)
        self.optimizer = spec.make_optimizer(list(self.module.parameters()))
        self.batches = spec.batch_source()
        del stages

    def local_batch(self, step: int, source=None) -> dict[str, torch.Tensor]:
        """This replica's rows of ``step``'s global batch, by input name (of ``source``, a batch
        source of the spec's inputs such as a held-out set's; default the run's training data).

        Example:
            >>> # not run here: needs a process group
            >>> rt.local_batch(0)["labels"].shape  # doctest: +SKIP
            torch.Size([4, 8])
        """
        first = self.dp_index * self.rows
        shapes = [(self.spec.global_batch_size, *s.shape) for s in self.spec.inputs]
        regions = [((first, self.rows), *((0, n) for n in shape[1:])) for shape in shapes]
        names = self.spec.input_names or tuple(f"input{i}" for i in range(len(shapes)))
        values = (source if source is not None else self.batches).local(step, regions)
        return {n: v.to(self.device) for n, v in zip(names, values)}

    def eval_loss(self, step: int, source) -> float | None:
        """The forward-only loss of ``source``'s batch ``step`` (the schedule's ``eval``: every
        micro-batch forward through the stages, nothing kept for backward); the last stage returns
        this replica's loss, scaled as a training step's, the others None.

        Example:
            >>> # not run here: needs a process group
            >>> rt.eval_loss(0, held_out_source)  # doctest: +SKIP
        """
        kwargs = {n: v for n, v in self.local_batch(step, source).items() if n in self.input_names}
        losses: list[torch.Tensor] = []
        target = self.loss_scale_rows(kwargs) if self.is_last else None
        with torch.no_grad():
            self.schedule.eval(target=target, losses=losses, return_outputs=False, **kwargs)
        return float(sum(loss.detach() for loss in losses)) if self.is_last else None

    def train_step(self, step: int, before_update=None) -> float | None:
        """One optimizer step over ``step``'s batch; the last stage returns this replica's loss
        (the mean of its micro-batches' losses), the others None. ``before_update()`` runs between
        the gradient sync and the optimizer step (the trainer's clipping)."""
        batch = self.local_batch(step)
        kwargs = {n: batch[n] for n in self.input_names}
        self.optimizer.zero_grad(set_to_none=False)
        losses: list[torch.Tensor] = []
        target = self.loss_scale_rows(kwargs) if self.is_last else None
        self.schedule.step(target=target, losses=losses, return_outputs=False, **kwargs)
        self.sync_gradients()
        if before_update is not None:
            before_update()
        self.optimizer.step()
        if self.is_last:
            return float(sum(loss.detach() for loss in losses))
        return None

    def loss_scales(self, inputs: dict[str, torch.Tensor]) -> list[float]:
        """Each micro-batch's loss scale this step: ``n_i · dp / N`` for a token-mean loss (see the
        module docstring; a collective over the replicas), else ``1/m``.

        Example:
            >>> # not run here: needs a process group
            >>> rt.loss_scales(kwargs)  # doctest: +SKIP
            [0.625, 0.375]
        """
        if self.counter is None:
            return [1.0 / self.m] * self.m
        counts = self.counter.per_micro_batch(inputs, self.m)
        total = torch.tensor([float(sum(counts))], dtype=torch.float64)
        if self.dp > 1:
            dist.all_reduce(total, group=self.mesh.get_group("dp"))
        if total.item() == 0:  # no counted label in the whole step: every loss is nan alike
            return [1.0 / self.m] * self.m
        return [c * self.dp / total.item() for c in counts]

    def loss_scale_rows(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The schedule's ``target``: each row holds its micro-batch's loss scale (the schedule
        splits it into micro-batches as it splits the inputs; ``loss_fn`` reads the first row)."""
        scales = torch.tensor(self.loss_scales(inputs), dtype=torch.float64)
        return scales.repeat_interleave(self.rows // self.m)

    def sync_gradients(self) -> None:
        """Average the stage's gradients over its data-parallel group (one flat all-reduce), copied
        back into each ``.grad`` in place: one flat copy of the gradients alive at once, not two
        (:mod:`tensoropt.pipeline.stage_memory` prices it); then sum the copies of weights tied
        across stages with their other stages' (:class:`~tensoropt.pipeline_runtime.tied.TiedGradients`)."""
        self._average_over_replicas()
        self.tied.all_reduce(self.module)

    def _average_over_replicas(self) -> None:
        if self.dp == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.module.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.mesh.get_group("dp"))
        flat /= self.dp
        offset = 0
        for p, g in zip(self.module.parameters(), grads):
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            p.grad = g
            offset += n

    def global_losses(self, losses: list[float | None]) -> list[float]:
        """Every rank's view of the global loss per step (the last stage's, averaged over replicas).

        Example:
            >>> # not run here: a collective
            >>> rt.global_losses(local)  # doctest: +SKIP
        """
        values = torch.tensor([v if v is not None else 0.0 for v in losses], dtype=torch.float64)
        dist.all_reduce(values)
        return (values / self.dp).tolist()


class OwnInputs(nn.Module):
    """A stage handed every input of its rank that passes on only the keyword arguments it reads
    (the stages of an interleaved rank share the schedule's ``kwargs``).

    Example:
        >>> class Add(nn.Module):
        ...     def forward(self, x, bias):
        ...         return x + bias
        >>> OwnInputs(Add(), ["bias"])(torch.ones(2), bias=torch.ones(2), labels=torch.zeros(2))
        tensor([2., 2.])
    """

    def __init__(self, stage: nn.Module, input_names: list[str]):
        super().__init__()
        self.stage, self.input_names = stage, list(input_names)

    def forward(self, *args, **kwargs):
        return self.stage(*args, **{n: kwargs[n] for n in self.input_names})


def _scaled_loss(loss: torch.Tensor, scale_rows: torch.Tensor) -> torch.Tensor:
    """A micro-batch's loss times its scale (the first row of its slice of the scale rows)."""
    return loss * float(scale_rows[0])


def _output_meta(module: torch.fx.GraphModule) -> torch.Tensor:
    """The meta value of a stage graph's output (the last stage's loss)."""
    output = next(n for n in module.graph.nodes if n.op == "output").args[0]
    return output.meta["val"]


def _like(meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An example of a stage's input or output for torch's static metadata: floating ones carry a
    gradient (the activation's goes back a stage; the loss's starts backward)."""
    return torch.empty(meta.shape, dtype=meta.dtype, device=device,
                       requires_grad=meta.dtype.is_floating_point)
