"""The figures of ``python -m bench.choices report``: what the package's choices give on every development set,
read from the measurements of ``python -m bench.choices measure`` (per epoch and candidate) and ``measure --crossfit``
(cross-fitted scores). Every figure applies the package's own rules (imported, not copied): the selection criterion
of ``--select auto``, the chooser's candidates and switching rule (:func:`train.choose_on_scores`), the k estimate
and the threshold rule (:func:`export.calibrate`); the chooser's criterion comes from the command line
(``report --criterion``) and its learning rates from the measurements (``measure --lrs``). Test labels (and the
hidden full labels of train and val) only score.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.evaluation.criteria import LABEL_FREE_CRITERIA, LABEL_FREE_DEFAULT
from models.evaluation.metrics import mean_average_precision
from train import CHOICE_CRITERION, Candidate, CandidateResult, TrainConfig, candidate_methods, choose_on_scores

FULL_VAL = "val_mAP_full"
#: The run's defaults: the method every comparison starts from (``an``), the batch size and learning rate.
BASELINE = TrainConfig().method
DEFAULT_BATCH = TrainConfig().batch_size
DEFAULT_LR = TrainConfig().lr
AUDIT_SIZE = 20


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std of the finite values (std NaN for one value)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def fmt(pair: tuple[float, float], digits: int = 2) -> str:
    """``mean ± std`` (``mean`` alone for one value, ``n/a`` for none)."""
    mean, std = pair
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f}" if math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


@dataclass
class Measurement:
    """One ``measure`` file: a dev set, seed and batch size, every candidate's per-epoch record, and its logits."""

    path: Path
    record: dict[str, Any]
    _arrays: Any = None

    @property
    def arrays(self) -> Any:
        """The ``.npz`` beside the record (loaded on first use)."""
        if self._arrays is None:
            self._arrays = np.load(self.path.with_suffix(".npz"))
        return self._arrays

    def entry(self, method: str, lr: float) -> dict[str, Any] | None:
        """The candidate's record, None when it was not measured or failed."""
        entry = self.record["candidates"].get(f"{method}@{lr:g}")
        return None if entry is None or entry.get("failed") else entry

    def test_at(self, method: str, lr: float, criterion: str = LABEL_FREE_DEFAULT) -> float:
        """Test mAP of the epoch ``criterion`` picks (NaN when not measured)."""
        entry = self.entry(method, lr)
        if entry is None or criterion not in entry["picks"]:
            return math.nan
        return float(entry["test_mAP"][entry["picks"][criterion] - 1])

    def logits_at(self, method: str, lr: float, split: str, criterion: str = LABEL_FREE_DEFAULT) -> np.ndarray:
        """The ``split`` (val, test) logits of the epoch ``criterion`` picks."""
        entry = self.entry(method, lr)
        assert entry is not None
        return self.arrays[f"{method}@{lr:g}/e{entry['picks'][criterion]}/{split}"].astype(np.float32)

    @property
    def methods(self) -> list[str]:
        """The methods measured, in measurement order."""
        return list(dict.fromkeys(e["method"] for e in self.record["candidates"].values()))

    @property
    def lrs(self) -> list[float]:
        """The learning rates measured."""
        return sorted({float(e["lr"]) for e in self.record["candidates"].values()}, reverse=True)


@dataclass
class DevData:
    """Everything measured on one dev set: per seed, the per-batch measurements and the cross-fitted record."""

    name: str
    criterion: str = CHOICE_CRITERION  # the chooser's criterion
    by_seed: dict[int, dict[int, Measurement]] = field(default_factory=dict)
    crossfit: dict[int, Measurement] = field(default_factory=dict)
    scored: dict[int, list[CandidateResult]] = field(default_factory=dict)  # per seed, as the label-free pick left them

    @property
    def seeds(self) -> list[int]:
        """Seeds with a measurement at the default batch size."""
        return sorted(s for s, batches in self.by_seed.items() if DEFAULT_BATCH in batches)

    @property
    def lrs(self) -> tuple[float, ...]:
        """The chooser's learning rates: those of the cross-fitted measurements."""
        return tuple(sorted({lr for m in self.crossfit.values() for lr in m.lrs}, reverse=True))


def load(folder: Path, criterion: str = CHOICE_CRITERION) -> dict[str, DevData]:
    """Every measurement in ``folder`` (``<dev>-seed<S>-b<B>.json`` and ``<dev>-seed<S>-crossfit.json``); the chooser
    compares candidates by ``criterion``."""
    out: dict[str, DevData] = {}
    for path in sorted(Path(folder).glob("*.json")):
        record = json.loads(path.read_text())
        dev = out.setdefault(record["dev_set"], DevData(record["dev_set"], criterion))
        if path.stem.endswith("-crossfit"):
            dev.crossfit[int(record["seed"])] = Measurement(path, record)
        elif "-b" in path.stem and path.stem.split("-b")[-1].isdigit():
            dev.by_seed.setdefault(int(record["seed"]), {})[int(record["batch_size"])] = Measurement(path, record)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Methods with the defaults, and searched


def default_rows(dev: DevData, lr: float = DEFAULT_LR, batch: int = DEFAULT_BATCH,
                 criterion: str = LABEL_FREE_DEFAULT) -> list[dict[str, Any]]:
    """Per method: test mAP at the defaults (batch, lr, the selection criterion's epoch) over seeds, the same-seed
    difference to ``an``, and the searched optimum (the batch and lr with the best val mAP on the hidden full val
    labels, at the epoch that picks: what the method can reach)."""
    rows = []
    seeds = dev.seeds
    methods = dev.by_seed[seeds[0]][batch].methods if seeds else []
    for method in methods:
        tests = {s: dev.by_seed[s][batch].test_at(method, lr, criterion) for s in seeds}
        an = {s: dev.by_seed[s][batch].test_at(BASELINE, lr, criterion) for s in seeds}
        diffs = [tests[s] - an[s] for s in seeds if not math.isnan(tests[s] - an[s])]
        searched = []
        for s in seeds:
            best = None
            for m in dev.by_seed[s].values():
                for grid_lr in m.lrs:
                    entry = m.entry(method, grid_lr)
                    if entry is None:
                        continue
                    pick = entry["picks"][FULL_VAL] - 1
                    val = entry["val"][FULL_VAL][pick]
                    if best is None or val > best[0]:
                        best = (val, entry["test_mAP"][pick], f"{m.record['batch_size']},{grid_lr:g}")
            if best is not None:
                searched.append(best)
        rows.append({"method": method, "test": mean_std(list(tests.values())), "diffs": diffs,
                     "searched": mean_std([b[1] for b in searched]), "searched_at": [b[2] for b in searched]})
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Selection of the epoch


def selection_losses(dev: DevData, lrs: tuple[float, ...], batch: int = DEFAULT_BATCH) -> dict[str, dict[str, float]]:
    """Per criterion (every label-free one, and the last epoch) and method: the test mAP lost against the epoch the
    val mAP on full labels picks (the papers' rule), mean over seeds and the chooser's learning rates."""
    out: dict[str, dict[str, list[float]]] = {}
    for seed in dev.seeds:
        m = dev.by_seed[seed][batch]
        for method in m.methods:
            for lr in lrs:
                reference = m.test_at(method, lr, FULL_VAL)
                for criterion in [*LABEL_FREE_CRITERIA, "last"]:
                    loss = reference - m.test_at(method, lr, criterion)
                    if not math.isnan(loss):
                        out.setdefault(criterion, {}).setdefault(method, []).append(loss)
    return {c: {m: statistics.fmean(v) for m, v in per.items()} for c, per in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# The chooser


@dataclass
class ChooserOutcome:
    """The chooser on one dev set and seed: its pick, the pick's test mAP, the best method's and ``an``'s."""

    seed: int
    chosen: str
    test: float
    best_method: str
    best_method_test: float
    best_candidate: str
    best_candidate_test: float
    an_test: float
    held_out: tuple[float, float] = (math.nan, math.nan)  # with an audit: val mAP of the val images not audited,
    # the choice's minus the label-free pick's and minus an's (the figures the audit margins were picked by)


def _candidate(name: str) -> Candidate:
    """``method@lr`` as a candidate."""
    method, lr = name.rsplit("@", 1)
    return Candidate(method, float(lr))


def crossfit_results(cf: Measurement, criterion: str) -> list[CandidateResult]:
    """The candidates ``--method auto`` compares (the product's :func:`train.candidate_methods` at the measured
    learning rates) with their cross-fitted scores of one measurement, scored by ``criterion`` against the observed
    labels."""
    labels = cf.arrays["pool_observed"]
    allowed = {BASELINE, *candidate_methods(labels)}
    results = []
    for name, entry in cf.record["candidates"].items():
        if (candidate := _candidate(name)).method not in allowed:
            continue
        result = CandidateResult(candidate, failed=entry.get("failed", ""))
        if not result.failed:
            result.val_logits = cf.arrays[f"{name}/oof"].astype(np.float32)
            keep = ~np.isnan(result.val_logits).any(1)
            result.score = float(LABEL_FREE_CRITERIA[criterion](result.val_logits[keep], labels[keep]))
        results.append(result)
    return results


def chooser_outcome(dev: DevData, seed: int, audit_rows: np.ndarray | None = None,
                    selection: str = LABEL_FREE_DEFAULT, label_free: str | None = None,
                    margins: tuple[float, float] | None = None) -> ChooserOutcome | None:
    """What ``--method auto`` picks on one dev set and seed - the package's own rule (:func:`train.choose_on_scores`)
    on the measured cross-fitted scores, with the pool rows ``audit_rows`` as the audit list (their hidden full labels)
    when given (``label_free``: the pick without it, made before on ``dev.scored``) - and the test mAP of the head a
    ``--trainable head`` run of the pick trains, against the best candidate by test and ``an`` at the default."""
    m = dev.by_seed.get(seed, {}).get(DEFAULT_BATCH)
    cf = dev.crossfit.get(seed)
    if m is None or cf is None:
        return None
    results = dev.scored[seed] = dev.scored[seed] if label_free is not None else crossfit_results(cf, dev.criterion)
    audit = None if audit_rows is None else (audit_rows, cf.arrays["pool_full"][audit_rows])
    known = None if label_free is None else _candidate(label_free)
    chosen, _ = choose_on_scores(results, Candidate(BASELINE, DEFAULT_LR), cf.arrays["pool_observed"], audit,
                                 dev.criterion, known, **({"margins": margins} if margins else {}))
    tests = {r.candidate.name: m.test_at(r.candidate.method, r.candidate.lr, selection) for r in results
             if not r.failed}
    per_method: dict[str, tuple[str, float]] = {}
    for name, value in tests.items():
        method = name.rsplit("@", 1)[0]
        if method not in per_method or value > per_method[method][1]:
            per_method[method] = (name, value)
    best_method = max(per_method.values(), key=lambda x: x[1])
    best_candidate = max(tests.items(), key=lambda x: x[1])
    held_out = (math.nan, math.nan)
    if audit_rows is not None and label_free is not None:  # the validation images the audit did not see
        full = m.arrays["val_full"]
        rest = np.setdiff1d(np.arange(len(full)), audit_rows - int(m.record["train"]))
        val = {name: mean_average_precision(m.logits_at(*astuple(_candidate(name)), "val", selection)[rest], full[rest])
               for name in (chosen.name, label_free, f"{BASELINE}@{DEFAULT_LR:g}")}
        held_out = (val[chosen.name] - val[label_free], val[chosen.name] - val[f"{BASELINE}@{DEFAULT_LR:g}"])
    return ChooserOutcome(seed, chosen.name, tests[chosen.name], best_method[0], best_method[1], best_candidate[0],
                          best_candidate[1], m.test_at(BASELINE, DEFAULT_LR, selection), held_out)


#: Audit lists the chooser is measured with: images drawn at random from the validation split, each size drawn
#: :data:`AUDIT_DRAWS` times per seed.
AUDIT_SIZES = (20, 50, 100)
AUDIT_DRAWS = 20


def audit_draws(dev: DevData, seed: int, size: int, draws: int = AUDIT_DRAWS) -> list[np.ndarray]:
    """``draws`` random audit lists of ``size`` validation images (pool rows: the training images come first), the
    same for every rule compared (seeded by the seed and the size)."""
    cf, m = dev.crossfit[seed], dev.by_seed[seed][DEFAULT_BATCH]
    n_train = int(m.record["train"])
    val_rows = np.arange(n_train, len(cf.arrays["pool_observed"]))
    oof = cf.arrays[f"{BASELINE}@{DEFAULT_LR:g}/oof"]
    val_rows = val_rows[~np.isnan(oof[val_rows]).any(1)]
    rng = np.random.default_rng(1000 * seed + size)
    return [np.sort(rng.choice(val_rows, min(size, len(val_rows)), replace=False)) for _ in range(draws)]


def audit_outcomes(dev: DevData, size: int, draws: int = AUDIT_DRAWS,
                   margins: tuple[float, float] | None = None) -> dict[int, list[ChooserOutcome]]:
    """Per seed, the chooser's outcome with each of ``draws`` random audit lists of ``size`` validation images (0:
    no audit), at the audit's ``margins`` (default: the package's)."""
    out: dict[int, list[ChooserOutcome]] = {}
    for seed in sorted(dev.crossfit):
        if seed not in dev.seeds:
            continue
        first = chooser_outcome(dev, seed)
        if first is None:
            continue
        if size == 0:
            out[seed] = [first]
            continue
        outcomes = (chooser_outcome(dev, seed, rows, label_free=first.chosen, margins=margins)
                    for rows in audit_draws(dev, seed, size, draws))
        out[seed] = [o for o in outcomes if o is not None]
    return out


def audit_table(devs: dict[str, DevData], titles: dict[str, str], fitted_on: tuple[str, ...],
                sizes: tuple[int, ...] = (0, *AUDIT_SIZES), margins: tuple[float, float] | None = None,
                ) -> tuple[list[str], list[str]]:
    """Two markdown tables, per development set and audit size. Test: the chooser's test mAP against the best
    candidate (mean over seeds and draws), its worst seed against ``an`` (mean over that seed's draws) and the share
    of draws more than 0.3 below ``an``. Held out: on the validation images each list leaves out, the choice's mAP
    over the label-free pick's (mean), its worst seed against ``an``, and the label-free pick's."""
    head = ["| development set | " + " | ".join("no audit" if n == 0 else f"{n} audited" for n in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    audited = [n for n in sizes if n]
    test, held = list(head), ["| development set | " + " | ".join(f"{n} audited" for n in audited) + " |",
                              "|---|" + "---|" * len(audited)]
    for name, dev in devs.items():
        if not dev.crossfit or not dev.seeds:
            continue
        best = best_method_by_mean(dev)[1]
        cells, held_cells = [], []
        for size in sizes:
            per_seed = {s: o for s, o in audit_outcomes(dev, size, margins=margins).items() if o}
            outcomes = [o for seed_outcomes in per_seed.values() for o in seed_outcomes]
            if not outcomes:
                cells.append("n/a")
                held_cells += ["n/a"] if size else []
                continue
            worst_an = min(statistics.fmean(o.test - o.an_test for o in x) for x in per_seed.values())
            below = statistics.fmean(o.test - o.an_test < -0.3 for o in outcomes)
            cells.append(f"{statistics.fmean(o.test for o in outcomes) - best:+.2f} / {worst_an:+.2f} / "
                         f"{100 * below:.0f}%")
            if size:
                worst = [min(statistics.fmean(o.held_out[1] - shift * o.held_out[0] for o in x)
                             for x in per_seed.values()) for shift in (0, 1)]
                held_cells.append(f"{statistics.fmean(o.held_out[0] for o in outcomes):+.2f} / {worst[0]:+.2f} "
                                  f"({worst[1]:+.2f})")
        title = titles.get(name, name) + ("" if name in fitted_on else " (out of sample)")
        test.append(f"| {title} | " + " | ".join(cells) + " |")
        held.append(f"| {title} | " + " | ".join(held_cells) + " |")
    return test, held


# ----------------------------------------------------------------------------------------------------------------
# k and tags per image


def audit_k(full: np.ndarray, size: int = AUDIT_SIZE, draws: int = 1000, seed: int = 0) -> np.ndarray:
    """k from ``draws`` random audit lists of ``size`` fully labelled images."""
    rng = np.random.default_rng(seed)
    counts = full.sum(1)
    return np.array([counts[rng.choice(len(counts), size, replace=False)].mean() for _ in range(draws)])


def k_row(dev: DevData, seed: int) -> dict[str, Any] | None:
    """k as ``--method auto`` estimates it (models/evaluation/expected_positives.py, from the cross-fitted scores of
    the chooser's best ``an`` head) against the truth of the labelled pool, whether the rule claims it within 25%,
    and the share of 20-image audit lists that land within 25%."""
    from models.evaluation.expected_positives import estimate_k

    cf = dev.crossfit.get(seed)
    if cf is None:
        return None
    an = {name: e for name, e in cf.record["candidates"].items()
          if e["method"] == BASELINE and not e.get("failed")}
    if not an:
        return None
    best = max(an, key=lambda n: an[n]["criteria"][dev.criterion])
    logits = cf.arrays[f"{best}/oof"].astype(np.float32)
    keep = ~np.isnan(logits).any(1)
    estimate = estimate_k(logits[keep], cf.arrays["pool_observed"][keep])
    truth = float(cf.arrays["pool_full"].sum(1).mean())
    audits = audit_k(cf.arrays["pool_full"])
    return {"true": truth, "k": estimate.k, "low": estimate.low, "high": estimate.high,
            "uninformed": estimate.uninformed, "rank": estimate.rank, "claimed": estimate.within_25,
            "error": estimate.k / truth - 1,
            "audit_within_25": float(np.mean(np.abs(audits / truth - 1) <= 0.25))}


def tags_row(dev: DevData, seed: int, chosen: str, k: float, mode: str = "rate",
             selection: str = LABEL_FREE_DEFAULT) -> dict[str, float] | None:
    """Test tags per image and OF1 / CF1 of the chosen head at thresholds calibrated on its single-positive val
    scores with ``mode`` and K = ``k``, against the true tags per image of the test split."""
    from export import calibrate
    from models.evaluation.metrics import f1_scores

    m = dev.by_seed.get(seed, {}).get(DEFAULT_BATCH)
    if m is None:
        return None
    val, test = (m.logits_at(*astuple(_candidate(chosen)), split, selection) for split in ("val", "test"))
    val_p, test_p = 1 / (1 + np.exp(-val.astype(np.float64))), 1 / (1 + np.exp(-test.astype(np.float64)))
    thresholds = np.asarray(calibrate(val_p, m.arrays["val_observed"], f"{mode}:{k:g}").thresholds)
    labels = m.arrays["test_labels"]
    f1 = f1_scores(test_p, labels, thresholds)
    tags = float((test_p >= thresholds).sum(1).mean())
    truth = float(labels.sum(1).mean())
    return {"tags": tags, "true": truth, "error": tags / truth - 1, "OF1": f1["OF1"], "CF1": f1["CF1"]}


# ----------------------------------------------------------------------------------------------------------------
# Markdown


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.0f}%"


def dev_section(dev: DevData, title: str, command: str, machine: str) -> str:
    """One dev set's section: every method with the defaults (and searched), the chooser per seed, k, tags per image
    and the selection losses."""
    rows = default_rows(dev)
    grid = sorted({lr for seed in dev.seeds for m in dev.by_seed[seed].values() for lr in m.lrs}, reverse=True)
    batches = sorted({b for seed in dev.seeds for b in dev.by_seed[seed]})
    lines = [f"## Choices that hold: {title}", "", machine, "", "Commands:", "", "```", command, "```", "",
             f"One positive per training and validation image, test fully labelled (it only scores). Heads on fixed "
             f"EfficientNet-Lite0 ImageNet features; the defaults: batch {DEFAULT_BATCH}, lr {DEFAULT_LR:g} (Adam, "
             f"one-cycle), 25 epochs, the epoch `--select auto` ({LABEL_FREE_DEFAULT}) picks. Searched = the batch "
             f"({', '.join(map(str, batches))}) and lr ({', '.join(f'{lr:g}' for lr in grid)}) with the best val "
             "mAP on the hidden full val labels, at its best epoch: what the method can reach, for reference. Test "
             "mAP mean ± std over the seeds.", "",
             "| method | test mAP, defaults | vs an, same seed | test mAP, searched | selection loss |",
             "|---|---|---|---|---|"]
    losses = selection_losses(dev, lrs=(DEFAULT_LR,)).get(LABEL_FREE_DEFAULT, {})
    for r in sorted(rows, key=lambda r: -r["test"][0]):
        diffs = r["diffs"]
        versus = "0" if r["method"] == BASELINE else (
            f"{statistics.fmean(diffs):+.2f} ({sum(d > 0 for d in diffs)}/{len(diffs)} above)" if diffs else "n/a")
        loss = losses.get(r["method"], math.nan)
        lines.append(f"| {r['method']} | {fmt(r['test'])} | {versus} | {fmt(r['searched'])} | "
                     f"{'n/a' if math.isnan(loss) else f'{loss:.2f}'} |")
    outcomes = [o for o in (chooser_outcome(dev, s) for s in sorted(dev.crossfit)) if o is not None]
    if outcomes:
        lines += ["", f"`--method auto` without an audit (nested cross-fitting; among its candidates, a candidate "
                  f"replaces `an@{DEFAULT_LR:g}` only when it beats it beyond the noise by {dev.criterion} and "
                  "passes the guard: the rule of docs/choosing.md):",
                  "",
                  "| seed | chosen | its test mAP | best method by test (its mean over seeds) | an |",
                  "|---|---|---|---|---|"]
        best = best_method_by_mean(dev)
        for o in outcomes:
            lines.append(f"| {o.seed} | `{o.chosen}` | {o.test:.2f} | `{best[0]}` {best[1]:.2f} | {o.an_test:.2f} |")
        mean = statistics.fmean(o.test for o in outcomes)
        an_mean = statistics.fmean(o.an_test for o in outcomes)
        lines += ["", f"Mean over seeds: the choice {mean:.2f}, {mean - best[1]:+.2f} against the best method "
                  f"(`{best[0]}`), {mean - an_mean:+.2f} against `an`."]
    ks = [k for k in (k_row(dev, s) for s in sorted(dev.crossfit)) if k is not None]
    if ks:
        lines += ["", "k (labels per image), estimated from the cross-fitted `an` scores "
                  "(models/evaluation/expected_positives.py):",
                  "", "| seed | true | low / high | k | error | `an`'s observed-rank | claimed within 25% | "
                  "audit lists of 20 within 25% |", "|---|---|---|---|---|---|---|---|"]
        for seed, k in zip(sorted(dev.crossfit), ks, strict=False):
            lines.append(f"| {seed} | {k['true']:.2f} | {k['low']:.2f} / {k['high']:.2f} | {k['k']:.2f} | "
                         f"{_pct(k['error'])} | {k['rank']:.1f} | "
                         f"{'yes' if k['claimed'] else 'no: asks for an audit list'} | "
                         f"{100 * k['audit_within_25']:.0f}% |")
    return "\n".join(lines) + "\n"


def best_method_by_mean(dev: DevData) -> tuple[str, float]:
    """The candidate (method at a chooser learning rate) with the best mean test mAP over the seeds: "the best method
    by test" of the chooser's target."""
    means: dict[str, float] = {}
    lrs = dev.lrs or dev.by_seed[dev.seeds[0]][DEFAULT_BATCH].lrs
    seeds = dev.seeds
    m0 = dev.by_seed[seeds[0]][DEFAULT_BATCH]
    for method in m0.methods:
        for lr in lrs:
            values = [dev.by_seed[s][DEFAULT_BATCH].test_at(method, lr) for s in seeds]
            if all(not math.isnan(v) for v in values):
                means[f"{method}@{lr:g}"] = statistics.fmean(values)
    name = max(means, key=means.get)  # type: ignore[arg-type]
    return name, means[name]


def summary_section(devs: dict[str, DevData], titles: dict[str, str], command: str, machine: str,
                    fitted_on: tuple[str, ...], audit_fitted_on: tuple[str, ...],
                    margins: tuple[float, float] | None = None) -> str:
    """The one table over every development set (those not in ``fitted_on`` marked out of sample: the rule was not
    fitted on them): the chooser's loss, k and tags per image, the worst selection loss; the chooser with audit lists
    of each size (out of sample: not in ``audit_fitted_on``, the sets the audit's margins were picked on)."""
    lines = ["## Choices that hold: summary over the development sets", "", machine, "", "Commands:", "", "```",
             command, "```", "",
             "Each development set as a user holds it: one label per training and validation image, test fully "
             "labelled (it only scores). The chooser is the package's own code run on the measured cross-fitted "
             "scores: its candidates (methods left out: each method's `left_out_of_auto`), its rule and constants. "
             "Targets: the choice within 0.5 test mAP of the best method and never more than 0.3 below `an` "
             "(issue 60: on sets the rule was not fitted on too, marked out of sample); k within 25% or the run says "
             "it cannot tell; tags per image within 30%; no method losing more than 1.5 test mAP to the epoch "
             "selection on average.", "",
             "| development set | choice (per seed) | choice - best, mean | choice - an, worst seed | k: error "
             "(claimed?) | tags per image: error, K estimated / K from 20 audited | worst selection loss |",
             "|---|---|---|---|---|---|---|"]
    for name, dev in devs.items():
        if not dev.seeds:
            continue
        outcomes = [o for o in (chooser_outcome(dev, s) for s in sorted(dev.crossfit)) if o is not None]
        best = best_method_by_mean(dev)
        choice = " / ".join(f"`{o.chosen}`" for o in outcomes) or "n/a"
        loss = f"{statistics.fmean(o.test for o in outcomes) - best[1]:+.2f}" if outcomes else "n/a"
        worst_an = f"{min(o.test - o.an_test for o in outcomes):+.2f}" if outcomes else "n/a"
        ks = [k_row(dev, s) for s in sorted(dev.crossfit)]
        ks = [k for k in ks if k is not None]
        k_text = ", ".join(f"{_pct(k['error'])} ({'yes' if k['claimed'] else 'no'})" for k in ks) or "n/a"
        tags = []
        for o, k in zip(outcomes, ks, strict=False):
            estimated = tags_row(dev, o.seed, o.chosen, k["k"])
            audited = tags_row(dev, o.seed, o.chosen, float(np.median(audit_k(dev.crossfit[o.seed].arrays[
                "pool_full"]))))
            if estimated and audited:
                tags.append(f"{_pct(estimated['error'])} / {_pct(audited['error'])}")
        losses = selection_losses(dev, lrs=(DEFAULT_LR,)).get(LABEL_FREE_DEFAULT, {})
        worst = max(losses, key=losses.get) if losses else None  # type: ignore[arg-type]
        worst_text = f"{losses[worst]:.2f} (`{worst}`)" if worst else "n/a"
        title = titles.get(name, name) + ("" if name in fitted_on else " (out of sample)")
        lines.append(f"| {title} | {choice} | {loss} | {worst_an} | {k_text} | "
                     f"{', '.join(tags) or 'n/a'} | {worst_text} |")
    test, held = audit_table(devs, titles, audit_fitted_on, margins=margins)
    how = "the margins of docs/choosing.md" if margins is None else f"margins {margins[0]:g} and {margins[1]:g}"
    lines += ["", f"With an audit list (`--method auto --audit FILE`): {AUDIT_DRAWS} lists of each size drawn at "
              "random from the validation images of every seed, their hidden full labels as the user's answers. The "
              "label-free pick stands unless a candidate that passed the label-free test, then `an`, beats it by the "
              f"class AUC of the audited images (paired bootstrap, {how}). Each cell: choice - best method by test "
              "mAP (mean over seeds and lists) / worst seed - `an` (mean over its lists) / lists more than 0.3 below "
              "`an`.", "", *test, "", "The margins were picked on what the audit did not see: the validation images "
              "left out of each list, scored by their hidden full labels (test only scores). Each cell: val mAP of "
              "the choice - the label-free pick's (mean over seeds and lists) / worst seed: choice - `an` (the "
              "label-free pick - `an` on the same images); `report --audit-margins Z,V --page FILE` measures other "
              "margins.", "", *held]
    lines += ["", "How the switching rule was picked: `python -m bench.choices report --rules` compared seven rules on "
              "these measurements (docs/choosing.md); that generator was removed at commit eafb47c."]
    return "\n".join(lines) + "\n"
