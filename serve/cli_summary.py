"""``python -m serve summary RUNFILE``: the summary of an existing run file (see :mod:`serve.run_summary`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serve import EXIT_OK, EXIT_USAGE

SUMMARY_EPILOG = """\
writes beside RUNFILE: <stem>.summary.md (every tag with its count, the tags-per-image histogram, the classes
never predicted), <stem>.summary.json (the same numbers) and <stem>.summary.png (a bar plot of the most
frequent tags; needs matplotlib: pip install -e ".[bench]"), and prints a short table.

examples:
  python -m serve summary tags.jsonl
  python -m serve summary photos.csv --separator '; '
"""


def add_summary_parser(sub: argparse._SubParsersAction) -> None:
    """The ``summary`` subcommand's options."""
    from serve.records import DEFAULT_SEPARATOR

    summary = sub.add_parser(
        "summary",
        help="images per tag, tags per image and classes never predicted, for an existing run file",
        description="Summarise a run file written by `serve tag`: a short table, a Markdown/JSON report and a plot.",
        epilog=SUMMARY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    summary.add_argument("run_file", type=Path, metavar="RUNFILE", help="the run file (.jsonl, or .csv)")
    summary.add_argument("--separator", default=DEFAULT_SEPARATOR, metavar="SEP",
                         help="tag separator of a CSV run file (default: %(default)r)")


def run_summary(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``summary``: read the run file, print the table, write the reports; returns the exit status."""
    from serve.records import OutputConflictError, read_run_file
    from serve.run_summary import summarize, summary_table, write_summary_reports

    prog = f"{parser.prog} summary"
    if not args.run_file.is_file():
        print(f"{prog}: error: run file not found: {args.run_file}", file=sys.stderr)
        return EXIT_USAGE
    try:
        records = read_run_file(args.run_file, args.separator)
    except OutputConflictError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summary = summarize(sorted(records.values(), key=lambda r: r["path"]))
    print(summary_table(summary))
    written = write_summary_reports(summary, args.run_file)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return EXIT_OK
