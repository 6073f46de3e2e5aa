#!/usr/bin/env bash
# The issue's GPU check as one command that ends within a time limit: experiments.gpu_check
# at qwen3-0.6b and qwen3-1.7b shapes, 2k and 8k tokens (prompt + response), each part
# under its own `timeout`, and the tables of every part that finished in one markdown
# file beside the parts' JSON.
#
# Usage:
#   launch/gpu_check.sh OUT_DIR
#
# Writes OUT_DIR/<preset>_<tokens>.json and .log per part and OUT_DIR/gpu_check.md (device,
# command, commit, each part's tables, or "timed out" / "failed" with its exit status).
# Environment (defaults in brackets):
#   PYTHON [python3]; PART_SECONDS [140]: each part's limit (4 parts: ~9.5 min in all with
#   start-up); PARTS ["qwen3-0.6b:256:1792:16,64 qwen3-0.6b:256:7936:16
#   qwen3-1.7b:256:1792:16,64 qwen3-1.7b:256:7936:16"]: preset:P:R:batches per part;
#   EXTRA_FLAGS [--repeats=1]: passed to every part (e.g. --bandwidth=... --peak_flops=...).
#   MESH_PLATFORM [cpu]: where the mesh case runs: `cpu` (4 fake host devices, any
#   machine) or the accelerator's platform (e.g. `cuda`, `tpu`) on a host with >= 4 chips.
# After the parts, the mesh case (experiments.gpu_check --mesh_check): both engines with
# top-p and top-k + top-p on data x tensor and data x fsdp meshes at lengths that make the
# data shards run different step counts; its lines (or "timed out" / "failed") in the md.
# The budgets were not tried on an accelerator (none was lent while this was written):
# a part that runs past PART_SECONDS is reported as timed out; lower its batches or R.
set -u
out=${1:?usage: launch/gpu_check.sh OUT_DIR}
python=${PYTHON:-python3}
part_seconds=${PART_SECONDS:-140}
parts=${PARTS:-"qwen3-0.6b:256:1792:16,64 qwen3-0.6b:256:7936:16 qwen3-1.7b:256:1792:16,64 qwen3-1.7b:256:7936:16"}
extra=${EXTRA_FLAGS:---repeats=1}
mkdir -p "$out"
md="$out/gpu_check.md"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
  echo "# GPU check"
  echo
  echo "commit $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(hostname), load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "command: launch/gpu_check.sh $out (PART_SECONDS=$part_seconds, EXTRA_FLAGS=$extra)"
} > "$md"
for part in $parts; do
  IFS=: read -r preset p r batches <<< "$part"
  name="${preset}_$((p + r))"
  echo "[gpu_check] $name: P=$p R=$r batches $batches (limit ${part_seconds}s)"
  # shellcheck disable=SC2086
  timeout "$part_seconds" "$python" -m experiments.gpu_check --preset="$preset" \
    --prompt_len="$p" --response_len="$r" --batches="$batches" --out="$out/$name.json" \
    $extra > "$out/$name.log" 2>&1
  rc=$?
  {
    echo
    echo "## $preset, P + R = $p + $r, batches $batches"
    echo
    if [ $rc -eq 0 ]; then
      grep -m1 '^gpu_check:' "$out/$name.log"
      echo
      awk '/^\| B \| max\/mean/ {print ""} /^\|/ {print}' "$out/$name.log"
    elif [ $rc -eq 124 ]; then
      echo "timed out after ${part_seconds}s (log: $name.log)"
    else
      echo "failed with exit status $rc (log: $name.log): $(tail -n 1 "$out/$name.log")"
    fi
  } >> "$md"
done
mesh_platform=${MESH_PLATFORM:-cpu}
echo "[gpu_check] mesh: both engines, top-p, data x tensor and data x fsdp on $mesh_platform"
if [ "$mesh_platform" = cpu ]; then
  mesh_env=(JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4)
else
  mesh_env=(JAX_PLATFORMS="$mesh_platform")
fi
env "${mesh_env[@]}" timeout "$part_seconds" "$python" -m experiments.gpu_check --mesh_check \
  --out="$out/mesh.json" > "$out/mesh.log" 2>&1
rc=$?
{
  echo
  echo "## mesh: both engines, top-p and top-k + top-p, data x tensor and data x fsdp ($mesh_platform)"
  echo
  if [ $rc -eq 0 ]; then
    grep '^mesh_check' "$out/mesh.log"
  elif [ $rc -eq 124 ]; then
    echo "timed out after ${part_seconds}s (log: mesh.log)"
  else
    echo "failed with exit status $rc (134: an XLA rendezvous abort; log: mesh.log): $(tail -n 1 "$out/mesh.log")"
  fi
} >> "$md"
echo "[gpu_check] wrote $md"
