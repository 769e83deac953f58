"""``python -m train``: see ``python -m train --help``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TextIO

from models.command_line import CommandFailed, ExitCode, UsageError, run_command
from models.data.types import DataError
from train.config import MACHINE_FIELDS, METHOD_AUTO, run_config
from train.options import build_parser, config_from_args


def say(message: str, file: TextIO | None = None) -> None:
    """Print an informational line once per job: in the first process under torchrun (errors print on all)."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=file)


def main(argv: list[str] | None = None, trainer_class: type | None = None) -> int:
    """Parse arguments, train (or resume) with ``trainer_class``, print the summary; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["suggest"]:
        from train.suggestions import main as suggest

        return suggest(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_archs is not None:
        from models.backbones import list_archs

        names = list_archs(args.list_archs)
        print("\n".join(names) if names else f"no architecture matches {args.list_archs!r}")
        return int(ExitCode.OK if names else ExitCode.USAGE)
    from train.distributed import shutdown

    started: list[Any] = []  # the trainer, once made: where an interrupted or failed run continues

    def interrupted() -> str:
        where = f"; continue with: python -m train --resume {started[0].run.run_dir}" if started else ""
        return "interrupted" + where

    try:
        return run_command("", lambda: _train(args, trainer_class, started), interrupted)
    finally:
        shutdown()  # leave the torchrun process group (no-op in one process)


def _train(args: argparse.Namespace, trainer_class: type | None, started: list[Any]) -> None:
    """Train or resume as ``args`` say; the trainer is appended to ``started`` once made."""
    from models.files.run_folder import SUMMARY_FILE
    from train.trainer import Trainer

    make_trainer = trainer_class or Trainer
    try:
        if args.resume:
            try:
                run_dir, cfg = run_config(args.resume, args.runs_dir)
            except ValueError as exc:
                raise UsageError(f"--resume {exc}") from None
            for machine_specific in MACHINE_FIELDS:
                if getattr(args, machine_specific) is not None:
                    setattr(cfg, machine_specific, getattr(args, machine_specific))
            started.append(make_trainer(cfg, run_dir=run_dir, resume=True))
            if started[0].done_training:
                if (run_dir / SUMMARY_FILE).is_file():
                    say(f"{run_dir} has finished training already")
                    return
                # stopped after its last epoch but before the final evaluation: do that part only
                say(f"{run_dir} has finished training but has no {SUMMARY_FILE}; evaluating its best checkpoint")
                started[0].finish()
                return
        else:
            cfg = config_from_args(args)  # the run prints every setting and its source when it starts
            if cfg.method == METHOD_AUTO:
                from train.choose import apply_choice, choice_table, choose, describe_choice

                choice = choose(cfg)
                say(choice_table(choice))
                say(describe_choice(choice))
                cfg = apply_choice(cfg, choice)
            started.append(make_trainer(cfg))
        started[0].fit()
    except (DataError, ValueError, FileExistsError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    except (FloatingPointError, OSError) as exc:  # diverged loss, unreadable image during training
        hint = f" (the last good epoch is in {started[0].run.run_dir / 'last.pt'})" if started else ""
        raise CommandFailed(f"{exc}{hint}") from exc


if __name__ == "__main__":
    sys.exit(main())
