"""Tagger throughput against model-only throughput: ``python -m bench.tag_speed MODEL [MODEL ...]``.

Writes a folder of JPEGs (``--images`` of ``--size`` px, made from the built-in dataset's images when it is
cached, else random textures), then for each model file (``.pt`` -> PyTorch, ``.onnx`` -> ONNX Runtime):

- model only: the runtime's images/s on already-preprocessed batches of ``--batch-size``;
- tagger: ``serve.tagging.tag_folder`` over the folder (decoding in a thread pool overlapping the model, JSONL
  written), images/s end to end.

The ratio tagger / model-only is the share of the model's speed the tagger keeps (target: >= 90%). Both run
``--repeats`` times, interleaved (model-only, tagger, then tagger, model-only, ...), so a change in the machine's load
hits both: the table gives the median (min-max) of the runs and of each round's ratio. The table, the command and
the machine (with its load average) go to section ``tag-cpu`` of the results page.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import Spread, interleaved_order
from serve.predictor import Predictor
from serve.tagging import tag_folder


def make_jpegs(folder: Path, count: int, size: int, seed: int = 0, height: int | None = None) -> list[Path]:
    """``count`` JPEGs of ``size`` x ``height`` px (default: square) in ``folder`` (upscaled built-in images when
    cached, else random textures)."""
    height = height or size
    from models.data.builtin import cache_root

    # the built-in dataset's training images when it is already generated (never generated here): random
    # textures otherwise; the tagger decodes either the same way
    folders = sorted((cache_root() / "builtin").glob("default-seed0-v*/images/train"))
    sources = sorted(folders[-1].glob("*.jpg"))[:count] if folders else []
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        if sources:
            with Image.open(sources[i % len(sources)]) as img:
                image = img.convert("RGB").resize((size, height), Image.Resampling.BILINEAR)
        else:
            coarse = rng.integers(0, 256, (max(1, height // 16), max(1, size // 16), 3), dtype=np.uint8)
            image = Image.fromarray(coarse).resize((size, height), Image.Resampling.BILINEAR)
        path = folder / f"{i // 500:02d}" / f"img{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, quality=90)
        paths.append(path)
    return paths


def model_only(predictor: Predictor, sample: list[Path], batch_size: int, seconds: float) -> float:
    """Images/s of the runtime alone on preprocessed batches (no decoding)."""
    batch = np.stack([predictor.preprocess(p) for p in sample[:batch_size]])
    predictor.scores_from_inputs(batch)  # warm-up
    done, start = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - start < seconds:
        predictor.scores_from_inputs(batch)
        done += len(batch)
    return done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.tag_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="model files (.pt checkpoint, .onnx export)")
    parser.add_argument("--images", type=int, default=2000, help="JPEGs to tag (default: %(default)s)")
    parser.add_argument("--size", type=int, default=448, help="JPEG side in px (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="model-only timing window (default: 5)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of model-only and of the tagger per model, interleaved (default: %(default)s)")
    add_page_options(parser, "tag-cpu")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "images"
        print(f"writing {args.images} JPEGs of {args.size} px ...", file=sys.stderr)
        paths = make_jpegs(folder, args.images, args.size)
        for model in args.models:
            predictor = Predictor.load(model)

            def tagger(predictor: Predictor = predictor, model: Path = model) -> float:
                start = time.perf_counter()
                summary = tag_folder(folder, predictor, Path(tmp) / f"tags-{model.stem}.jsonl",
                                     batch_size=args.batch_size, progress=False, existing="overwrite")
                return summary.tagged / (time.perf_counter() - start)

            runs = {"model_only": lambda p=predictor: model_only(p, paths, args.batch_size, args.seconds),
                    "tagger": tagger}
            rates: dict[str, list[float]] = {name: [] for name in runs}
            for round_ in range(args.repeats):
                for name in interleaved_order(list(runs), round_):
                    rates[name].append(runs[name]())
            rows.append({"model": str(model), "backend": predictor.backend, "arch": predictor.meta.arch,
                         "input": predictor.meta.image_size, "model_only": Spread.of(rates["model_only"]),
                         "tagger": Spread.of(rates["tagger"]),
                         "share": Spread.of([t / m for t, m in zip(rates["tagger"], rates["model_only"],
                                                                   strict=True)])})
            print(rows[-1], file=sys.stderr, flush=True)
    lines = ["## Tagger throughput vs model-only throughput (CPU)", "",
             f"Command: `{command_line('bench.tag_speed', argv)}`", "", machine_line(), "",
             f"{args.images} JPEGs of {args.size} px, batch {args.batch_size}. Tagger = `serve.tagging.tag_folder` end "
             "to end (discovery, decoding in a thread pool overlapping the model, JSONL written); model-only = the "
             f"same runtime on already-preprocessed batches. Both ran {args.repeats} time(s), interleaved: median "
             "(min-max) of the runs, and of each round's tagger / model-only share.", "",
             "| model | backend | network input | model-only img/s | tagger img/s | tagger / model-only |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        share = r["share"].scaled(100)
        lines.append(f"| {Path(r['model']).name} | {r['backend']} | {r['arch']} @{r['input']} px | "
                     f"{r['model_only'].text('.1f')} | {r['tagger'].text('.1f')} | {share.text('.0f', '%')} |")
    publish(args.section or "tag-cpu", "\n".join(lines) + "\n", args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
