"""Rebuild the fixtures of this folder: fabricate the inputs, run the reference scripts on them, store both.

    python tests/data/reference_protocol/regenerate.py --reference PATH/single-positive-multi-label

PATH is a git clone of github.com/elijahcole/single-positive-multi-label (with its ``spml-bias`` branch). The
reference code is exported (``git archive``) into a scratch folder outside this repository and run there
unchanged, except for two adaptations that only concern the inputs: ``preproc/format_cub.py``'s release-size
constants (11,788 images, 312 attributes) are set to the miniature's, and the label-bias branch's
``preproc/semantic_distribution.py`` (which derives per-class weights from crowdsourced click data that the
repository does not ship) is replaced by a module holding the fabricated weights of ``coco_weights.json``.
Nothing of the reference is stored here: only the fabricated inputs and the arrays the reference wrote.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from reference_layouts import VOC_NAMES, build_coco, build_cub, build_voc  # noqa: E402

MAIN_COMMIT = "89152d52ba59a65d75b19cbe32254a037b557a57"  # main
BIAS_COMMIT = "c70d34273006fcd7dcbf4456a6ca669c4d1adb13"  # spml-bias
UNIFORM_SETTINGS = [(1200, 1, 0), (1200, 1, 3), (1200, 2, 0), (1200, -1, 0), (1200, 1, -1), (1200, 0, 2), (7, 1, 0),
                    (31, 3, 5)]
BIAS_SEEDS = (1200, 5)
COCO_CATEGORIES = [(1, "person"), (2, "bicycle"), (3, "car"), (4, "motorcycle"), (5, "airplane"), (6, "bus"),
                   (7, "train"), (8, "truck"), (9, "boat"), (10, "traffic light"), (11, "fire hydrant"),
                   (13, "stop sign")]
CUB_ATTRIBUTES = ["has_bill_shape::curved_(up_or_down)", "has_bill_shape::dagger", "has_wing_color::blue",
                  "has_wing_color::brown", "has_upperparts_color::grey", "has_breast_pattern::solid",
                  "has_back_color::black", "has_tail_shape::notched_tail", "has_head_pattern::spotted",
                  "has_size::small_(5_-_9_in)", "has_shape::duck-like", "has_eye_color::red",
                  "has_bill_length::shorter_than_head", "has_leg_color::buff", "has_crown_color::white"]


# ------------------------------------------------------------------------------------------ fabricated inputs

def uniform_inputs() -> dict[str, np.ndarray]:
    """Label matrices shaped like VOC, COCO, NUS-WIDE (a fifth of the rows without a positive) and CUB."""
    rng = np.random.RandomState(2024)

    def rows(n: int, c: int, counts: list[int], p: list[float]) -> np.ndarray:
        y = np.zeros((n, c), dtype=np.uint8)
        for i in range(n):
            y[i, rng.choice(c, rng.choice(counts, p=p), replace=False)] = 1
        return y

    out: dict[str, np.ndarray] = {}
    for phase, n in (("train", 1), ("val", 0)):
        out[f"voc_{phase}"] = rows(40 + 20 * n, 20, [1, 2, 3, 4], [0.6, 0.25, 0.1, 0.05])
        out[f"coco_{phase}"] = rows(25 + 15 * n, 80, [1, 2, 3, 5, 8], [0.3, 0.25, 0.2, 0.15, 0.1])
        out[f"nus_{phase}"] = rows(30 + 20 * n, 81, [0, 1, 2, 4], [0.22, 0.4, 0.25, 0.13])
        out[f"cub_{phase}"] = (rng.random_sample((10 + 6 * n, 312)) < 0.1).astype(np.uint8)
    out["voc_train"][3] = 1  # a row with every label positive: no negative to observe
    return out


def voc_description() -> dict[str, Any]:
    """30 train and 12 val images: several objects, difficult ones, images with none or difficult ones only."""
    rng = np.random.RandomState(7)
    description: dict[str, Any] = {}
    for phase, count, start in (("train", 30, 8), ("val", 12, 400)):
        images: dict[str, list[list[Any]]] = {}
        for k in range(count):
            image_id = f"20{8 + k % 4:02d}_{start + 7 * k:06d}"
            n = rng.choice([0, 1, 1, 2, 2, 3, 4])
            images[image_id] = [[str(VOC_NAMES[rng.randint(20)]), int(rng.random_sample() < 0.2)] for _ in range(n)]
        first = next(iter(images))
        images[first] = [["bird", 1], ["bird", 1]]  # difficult only: not an image of the formatted files
        order = list(images)
        rng.shuffle(order)  # the list files in another order than sorted: the reference sorts
        description[phase], description[f"{phase}_order"] = images, order
    return description


def coco_description() -> dict[str, Any]:
    """Train 44 / val 16 images (4 / 2 without annotations), ids whose string order is not their number order,
    areas and boxes for the label-bias protocols, and the location bias's special cases."""
    rng = np.random.RandomState(11)
    categories = [{"id": i, "name": name, "supercategory": "thing"} for i, name in COCO_CATEGORIES]
    pool = rng.permutation(np.concatenate([rng.choice(np.arange(6, 100), 20, replace=False),
                                           rng.choice(np.arange(100, 600_000), 60, replace=False)]))
    description: dict[str, Any] = {}
    next_ann = 1
    for phase, count, empty, offset in (("train", 44, 4, 0), ("val", 16, 2, 44)):
        images, annotations = [], []
        for k in range(count):
            # the images of zero-weight classes only get ids 1, 3 and 5, early in string order: their uniform draws
            # (random.choice) consume other random numbers than weighted ones, so the later images check that path
            special = {empty + 2: 1, empty + 3: 3, empty + 4: 5} if phase == "train" else {}
            image_id = special.get(k, int(pool[offset + k]))
            width, height = int(rng.randint(200, 641)), int(rng.randint(200, 641))
            images.append({"id": image_id, "file_name": f"COCO_{phase}2014_{image_id:012d}.jpg", "width": width,
                           "height": height})
            if k < empty:
                continue
            boxes = []
            for _ in range(rng.choice([1, 1, 2, 3, 4, 6])):
                w, h = round(float(rng.uniform(5, width / 2)), 2), round(float(rng.uniform(5, height / 2)), 2)
                x, y = round(float(rng.uniform(0, width - w)), 2), round(float(rng.uniform(0, height - h)), 2)
                category = COCO_CATEGORIES[min(int(rng.exponential(3.0)), 11)][0]
                boxes.append((category, [x, y, w, h]))
            if phase == "train" and k == empty:  # a box centred on the image centre: distance 0
                boxes.append((3, [width / 2 - 20, height / 2 - 10, 40, 20]))
            if phase == "train" and k == empty + 1:  # a box centred on (width, height), the normaliser's centre
                boxes.append((6, [width - 30, height - 15, 60, 30]))
            if phase == "train" and k in (empty + 2, empty + 3, empty + 4):  # only classes of empirical weight 0
                zero = {empty + 2: (13, 13), empty + 3: (13, 11), empty + 4: (11, 11)}[k]
                boxes = [(zero[0], [10.0, 10.0, 50.0, 40.0]), (zero[1], [100.0, 20.0, 30.5, 30.0])]
            for number, (category, bbox) in enumerate(boxes):
                annotations.append({"id": next_ann, "image_id": image_id, "category_id": category,
                                    "area": round(bbox[2] * bbox[3] * float(rng.uniform(0.3, 0.9)), 4),
                                    "bbox": bbox, "iscrowd": int(number == 0 and k % 9 == 5)})
                next_ann += 1
        order = rng.permutation(len(annotations))  # annotations of one image are not contiguous in the json
        description[phase] = {"images": images, "annotations": [annotations[i] for i in order],
                              "categories": categories}
    return description


def coco_weights() -> dict[str, float]:
    """Fabricated per-class empirical weights (the reference derives its own from crowdsourced clicks)."""
    rng = np.random.RandomState(3)
    weights = {name: round(float(rng.uniform(0.05, 1.0)), 6) for _, name in COCO_CATEGORIES}
    weights["stop sign"] = weights["fire hydrant"] = 0.0
    return weights


def cub_description() -> dict[str, Any]:
    """24 images over 15 attributes (one image without a present attribute, two label lines with an extra
    field), in the official file order."""
    rng = np.random.RandomState(5)
    images = [[i, f"{1 + (i - 1) // 4:03d}.Species_{1 + (i - 1) // 4}/Species_{i:04d}_{rng.randint(10**5)}.jpg",
               int(rng.random_sample() < 0.55)] for i in range(1, 25)]
    labels = (rng.random_sample((24, len(CUB_ATTRIBUTES))) < 0.3).astype(int)
    labels[6] = 0
    return {"attributes": CUB_ATTRIBUTES, "images": images, "labels": labels.tolist(), "extra_field_lines": [5, 100]}


# ------------------------------------------------------------------------------------------ running the reference

def export(reference: Path, commit: str, target: Path) -> Path:
    """The Python files of ``commit`` written into ``target`` (its data archives are not needed)."""
    listing = subprocess.run(["git", "-C", str(reference), "ls-tree", "-r", "--name-only", commit], check=True,
                             capture_output=True, text=True).stdout.split()
    for name in (n for n in listing if n.endswith(".py")):
        text = subprocess.run(["git", "-C", str(reference), "show", f"{commit}:{name}"], check=True,
                              capture_output=True).stdout
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(text)
    return target


def run(cwd: Path, *args: str) -> None:
    """Run ``python ARGS`` in ``cwd``."""
    subprocess.run([sys.executable, *args], cwd=cwd, check=True, capture_output=True)


def observe(ref: Path, dataset: str, seed: int, num_pos: int = 1, num_neg: int = 0, bias: str = "") -> None:
    """The reference's ``preproc/generate_observed_labels.py`` for ``data/<dataset>``."""
    extra = ["--bias-type", bias] if bias else []
    run(ref / "preproc", "generate_observed_labels.py", "--dataset", dataset, "--seed", str(seed), "--num-pos",
        str(num_pos), "--num-neg", str(num_neg), *extra)


CHAIN = """
import json, sys
import numpy as np
from datasets import multilabel
P = {'dataset': sys.argv[1], 'val_frac': 0.2, 'split_seed': 1200, 'ss_seed': 999, 'ss_frac_train': 1.0,
     'ss_frac_val': 1.0, 'use_feats': False, 'bias_type': sys.argv[2]}
ds = multilabel(P, {'train': None, 'val': None, 'test': None}).get_datasets()
np.savez(sys.argv[3], **{f'{k}_{v}': getattr(ds[k], a) for k in ('train', 'val', 'test')
                          for v, a in (('images', 'image_ids'), ('obs', 'label_matrix_obs'))})
"""


def chain(ref: Path, dataset: str, bias: str = "uniform") -> dict[str, np.ndarray]:
    """The reference's ``datasets.py`` (``multilabel``: the 80/20 split, seed 1200) over ``data/<dataset>``."""
    out = ref / f"chain-{dataset}-{bias}.npz"
    run(ref, "-c", CHAIN, dataset, bias, str(out))
    with np.load(out) as data:
        return {f"chain_{key}": data[key] for key in data.files}


def formatted(folder: Path) -> dict[str, np.ndarray]:
    """The format script's outputs (``val`` renamed ``test``: it is the test split) and the observed labels."""
    out = {}
    for phase, name in (("train", "train"), ("val", "test")):
        out[f"{name}_images"] = np.load(folder / f"formatted_{phase}_images.npy")
        out[f"{name}_labels"] = np.load(folder / f"formatted_{phase}_labels.npy").astype(np.uint8)
    return out


def small(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Observed matrices as int8 (-1 / 0 / 1; the reference writes float64, or int64 for CUB) and the rest as it
    is."""
    return {k: v.astype(np.int8) if "obs" in k else v for k, v in arrays.items()}


def main() -> None:
    """Fabricate, run, store."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a clone of single-positive-multi-label")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="spml-reference-"))
    ref = export(args.reference, MAIN_COMMIT, scratch / "main")
    bias_ref = export(args.reference, BIAS_COMMIT, scratch / "bias")

    inputs = uniform_inputs()
    results: dict[str, np.ndarray] = {f"{k}_labels": v for k, v in inputs.items()}
    for case in ("voc", "coco", "nus", "cub"):
        folder = ref / "data" / "pascal"
        folder.mkdir(parents=True, exist_ok=True)
        for phase in ("train", "val"):  # the format scripts write float64 0/1
            np.save(folder / f"formatted_{phase}_labels.npy", inputs[f"{case}_{phase}"].astype(np.float64))
        for seed, num_pos, num_neg in UNIFORM_SETTINGS:
            observe(ref, "pascal", seed, num_pos, num_neg)
            for phase in ("train", "val"):
                obs = np.load(folder / f"formatted_{phase}_labels_obs.npy")
                results[f"{case}_{phase}__seed{seed}_pos{num_pos}_neg{num_neg}"] = obs.astype(np.int8)
    np.savez_compressed(HERE / "uniform.npz", **results)

    voc = voc_description()
    (HERE / "voc.json").write_text(json.dumps(voc, indent=0) + "\n")
    pascal = ref / "data" / "pascal"
    for old in pascal.glob("*.npy"):
        old.unlink()
    build_voc(pascal, voc)
    run(ref / "preproc", "format_pascal.py")
    observe(ref, "pascal", 1200)
    np.savez_compressed(HERE / "voc.npz", **small({**formatted(pascal), **chain(ref, "pascal")}))

    cub = cub_description()
    (HERE / "cub.json").write_text(json.dumps(cub, indent=0) + "\n")
    build_cub(ref / "data" / "cub", cub)
    script = (ref / "preproc" / "format_cub.py").read_text()
    script = script.replace("NUM_ATTRIBUTES = 312", f"NUM_ATTRIBUTES = {len(CUB_ATTRIBUTES)}")
    script = script.replace("NUM_INSTANCES = 11788", f"NUM_INSTANCES = {len(cub['images'])}")
    script = script.replace("assert len(classes_np) == 312", f"assert len(classes_np) == {len(CUB_ATTRIBUTES)}")
    (ref / "preproc" / "format_cub_miniature.py").write_text(script)
    run(ref / "preproc", "format_cub_miniature.py")
    observe(ref, "cub", 1200)
    np.savez_compressed(HERE / "cub.npz", **small({**formatted(ref / "data" / "cub"), **chain(ref, "cub")}))

    coco = coco_description()
    (HERE / "coco.json").write_text(json.dumps(coco, indent=0) + "\n")
    weights = coco_weights()
    (HERE / "coco_weights.json").write_text(json.dumps(weights, indent=1) + "\n")
    for target in (ref, bias_ref):
        build_coco(target / "data" / "coco", coco)
    run(ref / "preproc", "format_coco.py")
    observe(ref, "coco", 1200)
    coco_out = {**formatted(ref / "data" / "coco"), **chain(ref, "coco")}
    (bias_ref / "preproc" / "semantic_distribution.py").write_text(
        f"import json\ncat_name_to_weights = json.load(open({str(HERE / 'coco_weights.json')!r}))\n")
    run(bias_ref / "preproc", "format_coco.py")
    for seed in BIAS_SEEDS:
        for bias in ("size", "loc", "semantic"):
            observe(bias_ref, "coco", seed, bias=bias)
            obs = np.load(bias_ref / "data" / "coco" / f"formatted_train_{bias}_labels_obs.npy")
            coco_out[f"{bias}_seed{seed}_train_obs"] = obs
            if seed == 1200:
                coco_out.update({f"{k}_{bias}": v for k, v in chain(bias_ref, "coco", bias).items()})
    shuffled = json.loads(json.dumps(coco))
    for phase in ("train", "val"):
        shuffled[phase]["categories"].reverse()
    build_coco(ref / "data" / "coco", shuffled)
    run(ref / "preproc", "format_coco.py")
    coco_out.update({f"shuffled_{k}": v for k, v in formatted(ref / "data" / "coco").items()})
    np.savez_compressed(HERE / "coco.npz", **small(coco_out))
    print(f"fixtures written to {HERE}; scratch copy in {scratch}")


if __name__ == "__main__":
    main()
