"""Image loading cost, full-size against reduced-scale JPEG decoding: ``python -m bench.decode``.

For JPEGs of a few sizes (a 448 px square, a 1024 x 768 web image, a 4000 x 3000 camera photo) and network
inputs of 64, 224 and 448 px: milliseconds per image on one thread to decode and resize to the network input,
once with every pixel decoded (``read_image(path)``) and once the way training, evaluation, the tagger and the
demo load images (``EvalTransform.decode_side``: libjpeg DCT scaling down to no less than twice the network
input per side), plus how far apart the two resized images are (grey levels, 0-255). The table, the command
and the machine go to section ``decode-cpu`` of the results page.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import time_interleaved
from models.preprocess import DECODE_MARGIN, read_image, resize_uint8

PHOTO_SIZES = ((448, 448), (1024, 768), (4000, 3000))


def make_photo(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A JPEG (quality 90) with smooth structure and fine texture, so that it compresses like a photo."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    grain = rng.integers(-24, 25, (height, width, 3), dtype=np.int16)
    Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(path, quality=90)
    return path


def load_ms(path: Path, image_size: int, seconds: float) -> dict[str, float]:
    """Median milliseconds to load ``path`` and resize it to ``image_size``: ``full`` (full-size decode) and
    ``reduced`` (decoded at reduced scale), timed in interleaved rounds (:func:`bench.timing.time_interleaved`)."""
    side = DECODE_MARGIN * image_size
    seconds_per_call = time_interleaved({
        "full": lambda: resize_uint8(read_image(path), image_size),
        "reduced": lambda: resize_uint8(read_image(path, side), image_size),
    }, seconds, max_rounds=200)
    return {name: 1e3 * s for name, s in seconds_per_call.items()}


def measure(sizes: list[int], seconds: float) -> list[dict[str, float | int | str]]:
    """One row per (photo size, network input): full and reduced-scale load times and pixel differences."""
    rows: list[dict[str, float | int | str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for width, height in PHOTO_SIZES:
            path = make_photo(Path(tmp) / f"{width}x{height}.jpg", width, height)
            for size in sizes:
                side = DECODE_MARGIN * size
                full = resize_uint8(read_image(path), size).int()
                reduced_image = read_image(path, side)
                diff = (resize_uint8(reduced_image, size).int() - full).abs()
                row = {
                    "photo": f"{width} x {height}", "input": size,
                    "decoded": f"{reduced_image.shape[2]} x {reduced_image.shape[1]}",
                    **{f"{name}_ms": ms for name, ms in load_ms(path, size, seconds).items()},
                    "max_diff": int(diff.max()), "mean_diff": float(diff.float().mean()),
                }
                print(row, file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def to_markdown(rows: list[dict[str, float | int | str]], command: str) -> str:
    """The results section: command, machine, and the table."""
    lines = [
        "## Image loading: full-size vs reduced-scale JPEG decoding (CPU, one thread)", "",
        f"Command: `{command}`", "",
        machine_line(), "",
        "Time = median ms per image to decode "
        "(PIL) and resize to the network input (torchvision, bilinear, antialiased); full and reduced are timed in "
        "interleaved rounds. `reduced` is what training, "
        f"evaluation, export checks, the tagger and the demo do: JPEGs are decoded at 1/2, 1/4 or 1/8 scale while "
        f"both sides stay >= {DECODE_MARGIN}x the network input. Difference = |reduced - full| of the resized "
        "uint8 pixels (0-255). Synthetic photo-like JPEGs, quality 90.", "",
        "| JPEG | network input | decoded at | full ms | reduced ms | speed-up | max diff | mean diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['photo']} | {r['input']} px | {r['decoded']} | {r['full_ms']:.2f} | {r['reduced_ms']:.2f} | "
            f"{float(r['full_ms']) / float(r['reduced_ms']):.1f}x | {r['max_diff']} | {float(r['mean_diff']):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,224,448", help="network inputs, comma-separated (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window per cell (default: 2)")
    add_page_options(parser, "decode-cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the cost of one decoding worker
    rows = measure([int(s) for s in args.sizes.split(",")], args.seconds)
    publish(args.section or "decode-cpu", to_markdown(rows, command_line("bench.decode", argv)), args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
