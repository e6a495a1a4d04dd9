#!/usr/bin/env bash
# What rocmft prints, and its exit code, on the built-in default and on a sample of refusals, normalised
# (temporary paths, timings, dates) so that two checkouts' captures can be diffed:
#   bash bench/capture_outputs.sh DIR    (run from the checkout; VENV=the virtual environment, default .venv)
#   diff -r BEFORE AFTER                 (issue 17: the refactor changes no output)
set -u
out=${1:?give the folder to write the captures to}
mkdir -p "$out"
here=$(pwd)
shared=$(cd "${SHARED_DIR:-$here/../shared}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
norm() {
  sed -E -e "s#$work#<TMP>#g" -e "s#$here#<CHECKOUT>#g" -e "s#$shared#<SHARED>#g" -e "s#$HOME#<HOME>#g" \
    -e 's/[0-9]+(\.[0-9]+)? ?(s|ms|min)\b/<T>\2/g' -e 's/20[0-9]{2}-[0-9]{2}-[0-9]{2}[T ][0-9:.+Z-]+/<DATE>/g' \
    -e 's/pid [0-9]+/pid <N>/g' -e 's/port [0-9]+/port <N>/g' -e 's/[0-9]+\.[0-9]+ GiB free/<N> GiB free/g' \
    -e 's/\(settings [0-9.]+, device probe [^)]*\)/(<timings>)/g'
}
run() {  # NAME ENV... -- ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  rm -rf "$work/out"
  (cd "$work" && env -u MODEL_NAME_OR_PATH OUTPUT_DIR="$work/out" "${envs[@]}" PYTHONPATH="$here/entrypoint" "${VENV:-$here/.venv}/bin/python" -m rocmft "$@") \
    >"$work/stdout" 2>"$work/stderr" </dev/null
  local rc=$?
  { echo "exit $rc"; echo "--- stdout"; norm <"$work/stdout"; echo "--- stderr"; norm <"$work/stderr"
    echo "--- files"; (cd "$work" && find out -type f 2>/dev/null | sort); } >"$out/$name.txt"
}
run plan-default -- plan
run render-default -- render
run check-default -- check
run env-docs -- env --docs
run bad-number LEARNING_RATE=abc -- render
run misspelled LERNING_RATE=1e-4 -- render
run bad-stage ROCMFT_ZERO_STAGE=5 ROCMFT_DISTRIBUTED=deepspeed -- render
run bad-precision ROCMFT_PRECISION=fp8 -- render
run no-config ROCMFT_CONFIG=/nonexistent/my.yaml -- render
run no-dataset DATASET=not_a_dataset -- render
run bad-lora-target FINETUNING_TYPE=lora LORA_TARGET=not_a_module -- render
run bf16-and-fp16 BF16=true FP16=true -- render
run bad-lr-range LEARNING_RATE=5 -- render
run nnodes-no-master NNODES=2 -- render
run quoted-value 'TEMPLATE="qwen"' -- render
run bad-cutoff CUTOFF_LEN=-3 -- render
run export-no-run -- export /nonexistent/run
run report-no-run -- report /nonexistent/run
run chat-no-model -- chat /nonexistent/model -p hi
run bad-command -- frobnicate
M=(MODEL_NAME_OR_PATH="$HOME/.cache/rocmft/tiny-qwen2-v2" DATASET_DIR="$shared/data" TEMPLATE=qwen)
run model-render "${M[@]}" DATASET=alpaca_en_demo -- render
run model-check "${M[@]}" DATASET=alpaca_en_demo MAX_SAMPLES=20 -- check
run model-no-dataset "${M[@]}" DATASET=not_a_dataset -- render
run model-dpo-on-sft "${M[@]}" DATASET=alpaca_en_demo STAGE=dpo -- render
run model-lora-target "${M[@]}" DATASET=alpaca_en_demo FINETUNING_TYPE=lora LORA_TARGET=qkv -- render
run model-ds-offload "${M[@]}" DATASET=alpaca_en_demo ROCMFT_DISTRIBUTED=deepspeed ROCMFT_ZERO_STAGE=2 ROCMFT_OFFLOAD=parameters -- render
run model-output-is-input "${M[@]}" DATASET=alpaca_en_demo OUTPUT_DIR="$HOME/.cache/rocmft/tiny-qwen2-v2" -- render
run model-bad-template "${M[@]}" DATASET=alpaca_en_demo TEMPLATE=not_a_template -- render
run model-two-mistakes "${M[@]}" DATASET=not_a_dataset LORA_TARGET=qkv FINETUNING_TYPE=lora -- render
run model-fsdp-world "${M[@]}" DATASET=alpaca_en_demo ROCMFT_DISTRIBUTED=fsdp NPROC_PER_NODE=3 -- render
# issue 17: the refusals whose home moved into the rules registry (inputs, rendered and launch phases)
run zero-no-deepspeed ROCMFT_ZERO_STAGE=2 -- render
run precision-contradicts ROCMFT_PRECISION=fp32 BF16=true -- render
run world-size WORLD_SIZE=5 -- render
run node-rank NNODES=2 NODE_RANK=3 -- render
run model-fsdp-8bit "${M[@]}" DATASET=alpaca_en_demo ROCMFT_DISTRIBUTED=fsdp QUANTIZATION_BIT=8 -- render
run model-two-strategies "${M[@]}" DATASET=alpaca_en_demo ROCMFT_DISTRIBUTED=deepspeed DEEPSPEED=/nonexistent/ds.json -- render
run model-spaced-dataset "${M[@]}" "DATASET=alpaca_en_demo " -- render
run model-warnings "${M[@]}" DATASET=alpaca_en_demo LEARNING_RATE=5 EVAL_DATASET=alpaca_en_demo SAVE_TOTAL_LIMIT=0 -- render
run model-fraction-and-spaces "${M[@]}" DATASET=alpaca_en_demo LORA_DROPOUT=5 "TEMPLATE=qwen " -- render
echo "captured $(ls "$out" | wc -l) outputs in $out"
