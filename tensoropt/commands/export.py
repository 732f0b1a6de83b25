"""``tensoropt export CHECKPOINT_DIR --out DIR``: a run's checkpoint as one model others can load.

Reads the newest complete checkpoint of ``CHECKPOINT_DIR`` (a ``tensoropt run --checkpoint-dir``
directory, or one of its ``step-*`` directories), offline in one process, one tensor at a time,
and writes ``DIR/model.safetensors`` under the model's own state-dict keys (with the HF
``config.json`` beside it when the job's model is a ``transformers`` model), atomically:
``Model.from_pretrained(DIR)`` or ``model.load_state_dict(safetensors.torch.load_file(...))`` reads it.
"""

from __future__ import annotations

from tensoropt.commands import CommandError, command_parser

DTYPES = ("float32", "bfloat16", "float16")


def add_parser(subparsers) -> None:
    """Add the ``export`` subcommand."""
    p = command_parser(subparsers, "export", __doc__,
                       help="write a run's checkpoint as one consolidated model.safetensors")
    p.add_argument("checkpoint_dir",
                   help="a --checkpoint-dir of `tensoropt run` (or one step-* directory in it)")
    p.add_argument("--out", required=True, help="output directory (model.safetensors, config.json)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="cast floating-point tensors to this dtype (default: as stored)")


def run(args) -> int:
    """Export the checkpoint; returns the exit code."""
    import torch

    from tensoropt.parallel.save import SaveError, export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint_dir, args.out,
                                dtype=getattr(torch, args.dtype) if args.dtype else None)
    except (ValueError, SaveError) as err:
        raise CommandError(str(err)) from None
    print(f"wrote {out}/model.safetensors")
    return 0
