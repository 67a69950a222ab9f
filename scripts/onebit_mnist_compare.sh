#!/usr/bin/env bash
# The MNIST CNN of train_mnist on 2 DDP ranks (threads), same seed and
# one-cycle schedule, under Adam and the three compressed optimizers
# (variance frozen after FREEZE steps, a quarter of the run by default),
# then 1-bit Adam with the automatic variance mask off (DeepSpeed's
# behaviour). Prints each run's last epoch line; the runs' logs are in
# OUT/<optimizer>/. Issue 16's oracle: 1-bit Adam within 0.5 points of Adam.
#
# usage: scripts/onebit_mnist_compare.sh [EPOCHS] [FREEZE] [LR] [OUT]
set -euo pipefail
epochs=${1:-4}
freeze=${2:-62}
lr=${3:-0.002}
out=${4:-runs/onebit_compare}
bin=${BIN:-target/release/examples/train_mnist}
run() {
    local name=$1
    shift
    "$bin" --ddp --world 2 --epochs "$epochs" --lr "$lr" --seed 0 \
        --freeze-step "$freeze" --out "$out/$name" "$@" >"$out/$name.log" 2>&1 || true
    echo "$name: $(grep '^epoch' "$out/$name.log" | tail -1)"
}
mkdir -p "$out"
run adam --optim adam
run onebit-adam --optim onebit-adam
run onebit-lamb --optim onebit-lamb
run zero-one-adam --optim zero-one-adam
run onebit-adam-mask-off --optim onebit-adam --variance-mask off
