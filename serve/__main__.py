"""``python -m serve``: the subcommands ``tag``, ``demo``, ``api`` and ``summary`` (:mod:`serve.commands`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from serve.commands.api import add_api_parser, run_api
from serve.commands.demo import add_demo_parser, run_demo
from serve.commands.summary import add_summary_parser, run_summary
from serve.commands.tag import add_tag_parser, run_tag


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose epilog may contain ``%(exts)s``, filled in only for --help."""

    def format_help(self) -> str:
        if self.epilog and "%(exts)s" in self.epilog:
            from models.files.image_extensions import IMAGE_EXTENSIONS

            self.epilog = self.epilog % {"exts": " ".join(sorted(IMAGE_EXTENSIONS))}
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m serve`` (subcommands ``tag``, ``demo``, ``api`` and ``summary``)."""
    parser = _Parser(
        prog="python -m serve",
        description="Serve trained multi-label tagging models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    add_tag_parser(sub)
    add_demo_parser(sub)
    add_api_parser(sub)
    add_summary_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    if args.command == "tag":
        return run_tag(args, parser)
    if args.command == "demo":
        return run_demo(args, parser)
    if args.command == "api":
        return run_api(args, parser)
    return run_summary(args, parser)


if __name__ == "__main__":
    sys.exit(main())
