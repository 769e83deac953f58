"""``python -m train.methods``: the registered methods as a markdown table; ``--write FILE`` puts it into FILE."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models.files.atomic_writes import atomic_write_text
from train.methods import methods_table

BEGIN, END = "<!-- methods-table -->", "<!-- /methods-table -->"


def write_table(path: Path) -> bool:
    """Replace the methods table between the markers of ``path`` by the registry's; False when it has no markers."""
    text = path.read_text(encoding="utf-8")
    i, j = text.find(BEGIN), text.find(END)
    if not 0 <= i < j:
        return False
    atomic_write_text(path, text[:i + len(BEGIN)] + "\n" + methods_table() + text[j:])
    return True


def main(argv: list[str] | None = None) -> int:
    """Print the table, or write it into each ``--write`` file; exit 2 when a file has no markers."""
    parser = argparse.ArgumentParser(prog="python -m train.methods", description=__doc__,
                                     epilog="example: python -m train.methods --write README.md --write "
                                            "docs/methods.md")
    parser.add_argument("--write", type=Path, action="append", default=[], metavar="FILE",
                        help=f"replace the table between {BEGIN} and {END} in FILE (repeatable)")
    args = parser.parse_args(argv)
    if not args.write:
        print(methods_table(), end="")
        return 0
    missing = [str(path) for path in args.write if not write_table(path)]
    for path in missing:
        print(f"error: {path} has no {BEGIN} ... {END} markers", file=sys.stderr)
    return 2 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
