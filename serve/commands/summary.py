"""``python -m serve summary RUNFILE``: the summary of an existing run file (see :mod:`serve.outputs.run_summary`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models.command_line import UsageError, run_command

SUMMARY_EPILOG = """\
With the run file's manifest (<stem>.manifest.json, written by `serve tag` beside it) each record's selected
classes are chosen again from its scores: classes never predicted are counted per class, so caption rules
(renamed, excluded, weighted tags) do not hide them, and tags are counted by name (after exclude, replace,
spaces; without trigger words, escaping or weights). Without a manifest the tags are counted as written and a
class counts as predicted when its name is a tag.

writes beside RUNFILE: <stem>.summary.md (every tag with its count, the tags-per-image histogram, the classes
never predicted), <stem>.summary.json (the same numbers) and <stem>.summary.png (a bar plot of the most
frequent tags; needs matplotlib: pip install -e ".[bench]"), and prints a short table.

examples:
  python -m serve summary tags.jsonl
  python -m serve summary photos.csv --separator '; '
"""


def add_summary_parser(sub: argparse._SubParsersAction) -> None:
    """The ``summary`` subcommand's options."""
    from serve.outputs.records import DEFAULT_SEPARATOR

    summary = sub.add_parser(
        "summary",
        help="images per tag, tags per image and classes never predicted, for an existing run file",
        description="Summarise a run file written by `serve tag`: a short table, a Markdown/JSON report and a plot.",
        epilog=SUMMARY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    summary.add_argument("run_file", type=Path, metavar="RUNFILE", help="the run file (.jsonl, or .csv)")
    summary.add_argument("--separator", metavar="SEP",
                         help=f"tag separator of a CSV run file, e.g. --separator '; ' (default: the one its manifest "
                         f"records, else {DEFAULT_SEPARATOR!r})")


def run_summary(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``summary``: read the run file, print the table, write the reports; returns the exit status."""
    return run_command(f"{parser.prog} summary", lambda: _summary(args))


def _summary(args: argparse.Namespace) -> None:
    """Summarize ``args.run_file`` (the exceptions of :func:`models.command_line.run_command`)."""
    from serve.outputs.records import DEFAULT_SEPARATOR, OutputConflictError
    from serve.outputs.run_manifest import read_manifest
    from serve.outputs.run_summary import summarize_run_file, summary_table, write_summary_reports
    from serve.outputs.stage import TagSelector

    if not args.run_file.is_file():
        raise UsageError(f"run file not found: {args.run_file}")
    manifest = read_manifest(args.run_file)
    separator = args.separator or (manifest or {}).get("separator") or DEFAULT_SEPARATOR
    try:
        select = None  # without a manifest, the tags are counted as written
        if manifest is not None and isinstance(manifest.get("tagging"), dict):
            select = TagSelector.from_dict(manifest["tagging"], manifest["model"]["classes"])
        summary = summarize_run_file(args.run_file, separator, select)
    except (OutputConflictError, ValueError, KeyError) as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(summary))
    written = write_summary_reports(summary, args.run_file)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
