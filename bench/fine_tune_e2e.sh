#!/usr/bin/env bash
# End-to-end fine-tune candidates on a CUDA machine, in one command (bench/fine_tune_e2e.py writes the bundle):
#   bash bench/fine_tune_e2e.sh BUNDLE [OUT] [SECONDS] [PARALLEL]
# First the head alone on every set and seed (the reference, and the label-free k of the methods that need it),
# then each candidate on every set and seed, the most telling first; no run starts after SECONDS (default 480), so a
# lease ends with whole runs. Each run writes OUT/<set>-seed<S>-<tag>.json; a rerun skips the ones done.
# SETS, SEEDS, TAGS (candidates), COMMON and HEAD in the environment override the sets, the seeds and the shared arguments.
set -uo pipefail
BUNDLE=${1:?usage: bash bench/fine_tune_e2e.sh BUNDLE [OUT] [SECONDS] [PARALLEL]}
OUT=${2:-runs/fine-tune-e2e}
END=$(( $(date +%s) + ${3:-480} ))
PARALLEL=${4:-8}
SETS=${SETS:-$(ls "$BUNDLE")}
SEEDS=${SEEDS:-0 1 2}
COMMON=${COMMON:---linear-init 25 --epochs 15 --workers 2}
HEAD=${HEAD:---epochs 25 --workers 2}
# tag | k from the head alone | the run's arguments (epr-own-k: the run's own estimate, as `--method epr` alone)
CANDIDATES=(
  "an||--method an $COMMON"
  "epr-own-k||--method epr $COMMON"
  "epr-crop|k|--method epr --train-crop 0.5 $COMMON"
  "an-crop||--method an --train-crop 0.5 $COMMON"
  "wan-crop||--method wan --train-crop 0.5 $COMMON"
  "epr|k|--method epr $COMMON"
  "epr-crop-slow|k|--method epr --train-crop 0.5 --lr 1e-4 --head-lr-mult 10 --scheduler onecycle $COMMON"
  "ll-r-crop||--method ll-r --train-crop 0.5 $COMMON"
  "epr-crop-ema|k|--method epr --train-crop 0.5 --ema 0.99 $COMMON"
)

one() {  # set seed tag k args...
  local set=$1 seed=$2 tag=$3 k=$4; shift 4
  if (( $(date +%s) > END )); then echo "$set-seed$seed-$tag: not started (time)"; return 0; fi
  python3 -m bench.fine_tune_e2e measure --bundle "$BUNDLE" --set "$set" --seed "$seed" --tag "$tag" \
    ${k:+--k} --out "$OUT" -- "$@" > "$OUT/logs/$set-seed$seed-$tag.log" 2>&1 \
    || { echo "$set-seed$seed-$tag: failed"; tail -5 "$OUT/logs/$set-seed$seed-$tag.log"; }
  grep -h "picked test" "$OUT/logs/$set-seed$seed-$tag.log"
}
export -f one
export BUNDLE OUT END
mkdir -p "$OUT/logs"

plan() { local tag=$1 k=${2:-"''"}; shift 2; for seed in $SEEDS; do for set in $SETS; do echo "$set $seed $tag $k $*"; done; done; }
plan head "" --trainable head --method an --lr 0.002 $HEAD \
  | xargs -P "$PARALLEL" -L 1 bash -c 'one "$@"' _
ls "$OUT"/*-head.json > /dev/null 2>&1 || { echo "no head-alone run finished: stopping"; exit 1; }
for row in "${CANDIDATES[@]}"; do
  IFS='|' read -r tag k args <<< "$row"
  [[ -z "${TAGS:-}" || " $TAGS " == *" $tag "* ]] || continue
  plan "$tag" "$k" $args
done | xargs -P "$PARALLEL" -L 1 bash -c 'one "$@"' _
