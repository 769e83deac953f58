"""Tagger throughput against model-only throughput: ``python -m bench.tag_speed MODEL [MODEL ...]``.

A folder of ``--images`` JPEGs of ``--size`` px (the built-in images when cached, else random textures); per model file
(``.pt``: PyTorch, ``.onnx``: ONNX Runtime) the model-only images/s on preprocessed batches and the tagger's
(``serve.tag_folder``, decoding overlapping the model, JSONL written) end to end, ``--repeats`` times interleaved so a
change in load hits both: median (min-max) and the tagger / model-only ratio (target >= 90%). Section ``tag-cpu``.

``--photos DIR`` (real JPEGs, e.g. Debian's ``mate-backgrounds``) times random 4:3 crops of them at each of
``--photo-sizes`` (JPEG quality 90) and adds the loader alone (no model): where it is slower than the model, decoding
limits the tagger. Section ``tag-photos``.

``python -m bench.tag_speed decode``: milliseconds per image on one thread to decode and resize JPEGs (448 px, 1024 x
768, 4000 x 3000) to network inputs of 64, 224 and 448 px, every pixel decoded (``read_image(path)``) against the
package's reduced-scale decoding (``EvalTransform.decode_side``: libjpeg DCT scaling to no less than twice the input),
and how far apart the two images are (grey levels). Section ``decode-cpu``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import Spread, interleaved_order, time_interleaved
from models.preprocess import DECODE_MARGIN, read_image, resize_uint8
from serve import Predictor, tag_folder

#: Debian's mate-backgrounds photographs (``apt install mate-backgrounds``): the default ``--photos``.
DEBIAN_PHOTOS = Path("/usr/share/backgrounds/mate/nature")
DEFAULT_PHOTO_SIZES = "800x600,1920x1440,4000x3000"


def make_jpegs(folder: Path, count: int, size: int, seed: int = 0, height: int | None = None) -> list[Path]:
    """``count`` JPEGs of ``size`` x ``height`` px (default: square) in ``folder`` (upscaled built-in images when
    cached, else random textures)."""
    height = height or size
    from models.data.cache_folders import cache_root

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


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"800x600,4000x3000"`` -> ``[(800, 600), (4000, 3000)]``; raises ``ValueError`` on anything else."""
    sizes = []
    for part in text.split(","):
        width, sep, height = part.strip().lower().partition("x")
        if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
            raise ValueError(f"bad size {part.strip()!r}: expected WIDTHxHEIGHT, e.g. 800x600")
        sizes.append((int(width), int(height)))
    return sizes


def photo_jpegs(photos: list[Path], folder: Path, count: int, width: int, height: int,
                seed: int = 0) -> list[Path]:
    """``count`` JPEGs (quality 90) of ``width`` x ``height`` in ``folder``, each a random crop of the aspect
    ``width:height`` covering 70-100% of the largest such crop of one of ``photos`` (taken in turn), resized
    (Lanczos): distinct files with the content of real photographs."""
    rng = np.random.default_rng(seed)
    aspect = width / height
    paths = []
    for i in range(count):
        with Image.open(photos[i % len(photos)]) as img:
            image = img.convert("RGB")
        full_w, full_h = image.size
        crop_w = min(full_w, round(full_h * aspect))
        scale = float(np.sqrt(rng.uniform(0.7, 1.0)))
        cw, ch = max(1, round(crop_w * scale)), max(1, round(crop_w * scale / aspect))
        left, top = int(rng.integers(0, full_w - cw + 1)), int(rng.integers(0, full_h - ch + 1))
        image = image.crop((left, top, left + cw, top + ch)).resize((width, height), Image.Resampling.LANCZOS)
        path = folder / f"{i // 500:02d}" / f"photo{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, quality=90)
        paths.append(path)
    return paths


def decode_threads() -> int:
    """Decode threads of every tagger and loader run here: one per CPU (given to the tagger explicitly)."""
    return os.cpu_count() or 1


def loader_only(predictor: Predictor, paths: list[Path], batch_size: int) -> float:
    """Images/s of a loader alone: :func:`decode_threads` threads running the predictor's preprocessing (reduced-scale
    decoding, resize, normalisation) two batches ahead of the consumer, as the tagger reads, no model."""
    workers = decode_threads()
    window = max(2 * batch_size, 2 * workers)
    start = time.perf_counter()
    with ThreadPoolExecutor(workers, thread_name_prefix="decode") as pool:
        pending: deque[Future[np.ndarray]] = deque()
        for path in paths:
            pending.append(pool.submit(predictor.preprocess, path))
            if len(pending) >= window:
                pending.popleft().result()
        for future in pending:
            future.result()
    return len(paths) / (time.perf_counter() - start)


def model_only(predictor: Predictor, sample: list[Path], batch_size: int, seconds: float) -> float:
    """Images/s of the runtime alone on preprocessed batches (no decoding)."""
    batch = np.stack([predictor.preprocess(p) for p in sample[:batch_size]])
    predictor.scores_from_inputs(batch)  # warm-up
    done, start = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - start < seconds:
        predictor.scores_from_inputs(batch)
        done += len(batch)
    return done / (time.perf_counter() - start)


def measure(predictor: Predictor, folder: Path, paths: list[Path], output: Path, batch_size: int, seconds: float,
            repeats: int, with_loader: bool) -> dict[str, Spread]:
    """Model-only, tagger (and with ``with_loader`` loader-only) images/s over ``repeats`` interleaved rounds, and
    each round's tagger / model-only ``share`` (and tagger / loader-only ``decode_share``, and ``shared_bound``: the
    rate when decoding and the model each use every core in turn, 1 / (1 / model-only + 1 / loader-only), with the
    tagger's share of it, ``bound_share``)."""

    def tagger() -> float:
        start = time.perf_counter()
        summary = tag_folder(folder, predictor, output, batch_size=batch_size, progress=False, existing="overwrite",
                             workers=decode_threads())
        return summary.tagged / (time.perf_counter() - start)

    runs = {"model_only": lambda: model_only(predictor, paths, batch_size, seconds), "tagger": tagger}
    if with_loader:
        runs["loader_only"] = lambda: loader_only(predictor, paths, batch_size)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(repeats):
        for name in interleaved_order(list(runs), round_):
            rates[name].append(runs[name]())
    result = {name: Spread.of(values) for name, values in rates.items()}
    result["share"] = Spread.of([t / m for t, m in zip(rates["tagger"], rates["model_only"], strict=True)])
    if with_loader:
        result["decode_share"] = Spread.of([t / d for t, d in zip(rates["tagger"], rates["loader_only"], strict=True)])
        bounds = [1 / (1 / m + 1 / d) for m, d in zip(rates["model_only"], rates["loader_only"], strict=True)]
        result["shared_bound"] = Spread.of(bounds)
        result["bound_share"] = Spread.of([t / b for t, b in zip(rates["tagger"], bounds, strict=True)])
    return result


def synthetic_section(args: argparse.Namespace, argv: list[str] | None, tmp: Path) -> str:
    """Section ``tag-cpu``: every model on ``--images`` square JPEGs of ``--size`` px."""
    folder = tmp / "images"
    print(f"writing {args.images} JPEGs of {args.size} px ...", file=sys.stderr)
    paths = make_jpegs(folder, args.images, args.size)
    lines = ["## Tagger throughput vs model-only throughput (CPU)", "",
             f"Command: `{command_line('bench.tag_speed', argv)}`", "", machine_line(), "",
             f"{args.images} JPEGs of {args.size} px, batch {args.batch_size}. Tagger = `serve.tag_folder` end "
             "to end (discovery, decoding in a thread pool overlapping the model, JSONL written); model-only = the "
             f"same runtime on already-preprocessed batches. Both ran {args.repeats} time(s), interleaved: median "
             "(min-max) of the runs, and of each round's tagger / model-only share.", "",
             "| model | backend | network input | model-only img/s | tagger img/s | tagger / model-only |",
             "|---|---|---|---|---|---|"]
    for model, predictor in load_models(args):
        r = measure(predictor, folder, paths, tmp / f"tags-{model.stem}.jsonl", args.batch_size, args.seconds,
                    args.repeats, with_loader=False)
        print(model, r, file=sys.stderr, flush=True)
        lines.append(f"| {model.name} | {predictor.backend} | {predictor.meta.arch} @{predictor.meta.image_size} px | "
                     f"{r['model_only'].text('.1f')} | {r['tagger'].text('.1f')} | "
                     f"{r['share'].scaled(100).text('.0f', '%')} |")
    return "\n".join(lines) + "\n"


def photos_section(args: argparse.Namespace, argv: list[str] | None, tmp: Path, photos: list[Path]) -> str:
    """Section ``tag-photos``: every model on ``--images`` JPEGs made from real photos at each ``--photo-sizes``."""
    sizes = parse_sizes(args.photo_sizes)
    predictors = load_models(args)
    lines = ["## Tagging real photos with the default model (CPU, local engine)", "",
             f"Command: `{command_line('bench.tag_speed', argv)}`", "", machine_line(), "",
             f"{args.images} JPEGs per size, each a random 4:3 crop (70-100% of the largest) of one of {len(photos)} "
             f"photographs in `{args.photos}`, resized (Lanczos) and saved at quality 90; sizes above the photograph's "
             f"own are upscaled. Batch {args.batch_size}, {decode_threads()} decode threads. Model-only = the runtime "
             "on preprocessed batches; loader-only = as many decode threads with no model (reduced-scale JPEG "
             "decoding, resize, read-ahead window); tagger = `serve.tag_folder` end to end. The three ran "
             f"{args.repeats} time(s), interleaved: median (min-max). Decoding share = tagger img/s / loader-only "
             "img/s, the share of the tagger's time the loader alone needs (near 100%: decoding limits the tagger). "
             "Shared-core bound = 1 / (1 / model-only + 1 / loader-only): the rate when decoding and the model, each "
             "using every core, take turns on the same cores; a tagger cannot do better when both need all of them. "
             "What was tried to close the rest: [docs/tagging-at-scale.md](../docs/tagging-at-scale.md#memory-and-"
             "speed).", "", "| model | backend | photos | model-only img/s | loader-only img/s | tagger img/s | "
             "tagger / model-only | decoding share | shared-core bound img/s | tagger / bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for width, height in sizes:
        folder = tmp / f"photos-{width}x{height}"
        print(f"writing {args.images} JPEGs of {width} x {height} from {len(photos)} photos ...", file=sys.stderr)
        paths = photo_jpegs(photos, folder, args.images, width, height)
        for model, predictor in predictors:
            r = measure(predictor, folder, paths, tmp / f"tags-{model.stem}.jsonl", args.batch_size, args.seconds,
                        args.repeats, with_loader=True)
            print(model, width, height, r, file=sys.stderr, flush=True)
            lines.append(f"| {model.name} | {predictor.backend} | {width} x {height} | "
                         f"{r['model_only'].text('.1f')} | {r['loader_only'].text('.1f')} | {r['tagger'].text('.1f')} "
                         f"| {r['share'].scaled(100).text('.0f', '%')} | "
                         f"{r['decode_share'].scaled(100).text('.0f', '%')} | {r['shared_bound'].text('.1f')} | "
                         f"{r['bound_share'].scaled(100).text('.0f', '%')} |")
    return "\n".join(lines) + "\n"


def load_models(args: argparse.Namespace) -> list[tuple[Path, Predictor]]:
    """Every model of ``args.models`` with each runtime of ``--backends`` (``default``: the file's own choice)."""
    names = [None if b == "default" else b for b in args.backends.split(",")]
    return [(model, Predictor.load(model, backend=b)) for model in args.models for b in names]


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``decode ARGS`` -> :func:`decode_main`); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["decode"]:
        return decode_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.tag_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="decode's options: python -m bench.tag_speed decode --help")
    parser.add_argument("models", nargs="+", type=Path, help="model files (.pt checkpoint, .onnx export)")
    parser.add_argument("--images", type=int, default=2000, help="JPEGs to tag (per photo size) (default: %(default)s)")
    parser.add_argument("--size", type=int, default=448,
                        help="JPEG side in px, without --photos (default: %(default)s)")
    parser.add_argument("--photos", type=Path, default=None, metavar="DIR",
                        help=f"time JPEGs made from the real photos in DIR (e.g. {DEBIAN_PHOTOS}, from "
                             "`apt install mate-backgrounds`)")
    parser.add_argument("--photo-sizes", default=DEFAULT_PHOTO_SIZES,
                        help="WIDTHxHEIGHT sizes made from --photos (default: %(default)s)")
    parser.add_argument("--backends", default="default",
                        help="runtimes each model is timed with, e.g. onnxruntime,openvino (default: the file's own)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="model-only timing window (default: 5)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of model-only and of the tagger per model, interleaved (default: %(default)s)")
    add_page_options(parser, "tag-cpu or, with --photos, tag-photos")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.images < 1:
        parser.error("--images must be >= 1")
    try:
        parse_sizes(args.photo_sizes)
    except ValueError as exc:
        parser.error(f"--photo-sizes: {exc}")
    photos: list[Path] = []
    if args.photos is not None:
        if not args.photos.is_dir():
            hint = " (apt install mate-backgrounds)" if args.photos == DEBIAN_PHOTOS else ""
            parser.error(f"--photos: no folder {args.photos}{hint}")
        photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
        if not photos:
            parser.error(f"--photos: no .jpg/.jpeg file in {args.photos}")
    with tempfile.TemporaryDirectory() as tmp:
        if photos:
            publish(args.section or "tag-photos", photos_section(args, argv, Path(tmp), photos), args.page)
        else:
            publish(args.section or "tag-cpu", synthetic_section(args, argv, Path(tmp)), args.page)
    return 0


# ------------------------------------------------------------------------------------------------------------------
# decode: full-size against reduced-scale JPEG decoding

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


def measure_decoding(sizes: list[int], seconds: float) -> list[dict[str, float | int | str]]:
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


def decoding_markdown(rows: list[dict[str, float | int | str]], command: str) -> str:
    """Section ``decode-cpu``: command, machine, and the table."""
    lines = ["## Image loading: full-size vs reduced-scale JPEG decoding (CPU, one thread)", "",
             f"Command: `{command}`", "", machine_line(), "",
             "Time = median ms per image to decode (PIL) and resize to the network input (torchvision, bilinear, "
             "antialiased); full and reduced are timed in interleaved rounds. `reduced` is what training, evaluation, "
             "export checks, the tagger and the demo do: JPEGs are decoded at 1/2, 1/4 or 1/8 scale while both sides "
             f"stay >= {DECODE_MARGIN}x the network input. Difference = |reduced - full| of the resized uint8 pixels "
             "(0-255). Synthetic photo-like JPEGs, quality 90.",
             "", "| JPEG | network input | decoded at | full ms | reduced ms | speed-up | max diff | mean diff |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['photo']} | {r['input']} px | {r['decoded']} | {r['full_ms']:.2f} | {r['reduced_ms']:.2f} | "
              f"{float(r['full_ms']) / float(r['reduced_ms']):.1f}x | {r['max_diff']} | {float(r['mean_diff']):.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def decode_main(argv: list[str]) -> int:
    """``python -m bench.tag_speed decode ARGS``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.tag_speed decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,224,448", help="network inputs, comma-separated (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window per cell (default: 2)")
    add_page_options(parser, "decode-cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the cost of one decoding worker
    rows = measure_decoding([int(s) for s in args.sizes.split(",")], args.seconds)
    command = command_line("bench.tag_speed", ["decode", *argv])
    publish(args.section or "decode-cpu", decoding_markdown(rows, command), args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
