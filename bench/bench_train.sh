#!/usr/bin/env bash
# just bench train: the trainer's loop over one epoch of the mixed bench
# set (bench/bench_gen_mixed.py: float16 whisper, float32 w2v, motion
# pickles, float32/float64 emotion, mixed byte orders), B=256, W=15,
# float32 delivered, with a simulated accelerator step of S = 0, 5, 20 ms:
# clipshard's loader against EpochDataset (0 and 2 DataLoader workers),
# the naive per-clip loader (0 and 2 workers) and preload + gather, warm,
# cold, under a memory cap below the data's size, and over sshfs to a
# loopback sshd (a real network filesystem, made and removed here).
# Every leg runs its rows interleaved in BENCH_ROUNDS rounds (3: each
# round runs every row at every S once, in turn), and the tables give the
# median and range of the rounds and the load average over them.
#   bench/bench_train.sh [WORKDIR]      (CLIPSHARD_PYTHON: a Python with numpy and torch)
# BENCH_LEGS (warm cold capped sshfs), BENCH_ROUNDS (3), BENCH_S (0 5 20),
# BENCH_ROWS (the warm and cold rows), BENCH_CAP_ROWS, BENCH_NET_ROWS (the
# capped and sshfs legs' rows), BENCH_CLIPS (400): fewer, for a quick run
# (TestBenchTrainRuns and TestBenchTrainLegsRun run it on 40 clips).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
"$PY" -c 'import numpy, torch' || { echo "bench-train needs numpy and torch in $PY (Debian: python3-numpy python3-torch)"; exit 1; }
go build -o "$W/" ./cmd/convert ./cmd/shuffle
# The mixed set with one huge clip (20x the median length).
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" "${BENCH_CLIPS:-400}" 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
[ -f "$W/mixed-huge-ds/dataset.json" ] || "$W/convert" --quiet --clips "$M/clips.txt" --out "$W/mixed-huge-ds" "${mods[@]}" >/dev/null
# As many epochs as a run reads (BENCH_PASSES, 5): each pass reads an
# epoch of its own, never bytes the pass before left in the page cache.
PASSES=${BENCH_PASSES:-5}
EP="$W/train-huge-ep-$PASSES"
[ -f "$EP/epochs.json" ] || "$W/shuffle" --dataset "$W/mixed-huge-ds" --out "$EP" --window 15 --epochs "$PASSES" --seed 3 >/dev/null
OUT="$W/train.jsonl"
[ -n "${BENCH_KEEP:-}" ] || : > "$OUT"
echo "$("$PY" -c 'import numpy, torch, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__)'); $(nproc) cores; epoch $(du -sh --apparent-size "$EP/epoch-0000" | cut -f1) ($PASSES of them), dataset $(du -sh --apparent-size "$W/mixed-huge-ds" | cut -f1), sources $(du -sh --apparent-size "$M" | cut -f1)"
one() {  # ROW S MODE [BATCHES] [SRC DS EP]
  local src=${5:-$M} ds=${6:-$W/mixed-huge-ds} ep=${7:-$EP}
  local rc=0
  BENCH_ROUND=$round "$PY" bench/bench_train.py one "$1" "$2" "$3" "$src" "$ds" "$ep" "${4:-all}" >> "$OUT" 2>"$W/train.err" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -3 "$W/train.err"; echo "{\"row\": \"$1\", \"S\": $2, \"mode\": \"$3\", \"round\": $round, \"killed\": \"exit $rc\"}" >> "$OUT"
  fi
}
# The naive loader: the first 6 batches of each pass (it takes seconds a batch).
ROWS=${BENCH_ROWS:-cat loader-f16 loader epochds-w0 epochds-w2 preload naive-w0 naive-w2}
SS=${BENCH_S:-0 5 20}
ROUNDS=${BENCH_ROUNDS:-3}
LEGS=${BENCH_LEGS:-warm cold capped sshfs}
for round in $(seq "$ROUNDS"); do
  for mode in warm cold; do
    case " $LEGS " in *" $mode "*) ;; *) continue ;; esac
    for S in $SS; do
      for row in $ROWS; do
        case $row in naive*) one "$row" "$S" "$mode" 6 ;; *) one "$row" "$S" "$mode" ;; esac
      done
    done
  done
done

# Under a memory cap below the dataset's size (root and a cgroup memory
# controller, v2 or v1), the rows that need numpy alone: importing torch
# 2.x alone takes ~660 MB of RSS here, more than the data. The loader
# with prefetch 1 (3 batches of float32 are 93 MiB: prefetch 4 would
# hold 201 MiB, more than the cap).
CAP=${CLIPSHARD_BENCH_CAP:-160M}
cg=""
case " $LEGS " in *" capped "*) capped=yes ;; *) capped=no ;; esac
if [ $capped = no ]; then
  :
elif [ "$(id -u)" = 0 ] && [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/clipshard-bench-train; mkdir -p "$cg" && echo "$CAP" > "$cg/memory.max" && { echo 0 > "$cg/memory.swap.max" 2>/dev/null || true; }
elif [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/clipshard-bench-train; mkdir -p "$cg" && numfmt --from=iec "$CAP" > "$cg/memory.limit_in_bytes"
fi
if [ -n "$cg" ]; then
  for round in $(seq "$ROUNDS"); do
    for S in 0 20; do
      for row in ${BENCH_CAP_ROWS:-loader-f16 loader-np reader-mmap reader-read preload naive-np}; do
        n=all; [ "$row" = naive-np ] && n=6
        BENCH_ROUND=$round BENCH_PREFETCH=1 sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$PY" bench/bench_train.py one "$row" "$S" "cold, memory capped at $CAP" "$M" "$W/mixed-huge-ds" "$EP" "$n" >> "$OUT" 2>"$W/train.err" ||
          echo "{\"row\": \"$row\", \"S\": $S, \"mode\": \"cold, memory capped at $CAP\", \"round\": $round, \"killed\": \"out of memory\"}" >> "$OUT"
      done
    done
  done
  rmdir "$cg" 2>/dev/null || true
elif [ $capped = yes ]; then
  echo "memory-capped leg skipped: needs root and a cgroup memory controller"
fi

# Over sshfs to a loopback sshd: the epochs and the sources on a network
# filesystem, remounted before every run (cold), against cat of the same files.
if ! case " $LEGS " in *" sshfs "*) true ;; *) false ;; esac; then
  :
elif command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ]; then
  N="$W/net"; rm -rf "$N"; mkdir -p "$N/mnt"
  ssh-keygen -q -t ed25519 -N '' -f "$N/host" && ssh-keygen -q -t ed25519 -N '' -f "$N/user"
  cat > "$N/sshd_config" <<CFG
Port 2299
ListenAddress 127.0.0.1
HostKey $N/host
AuthorizedKeysFile $N/user.pub
PasswordAuthentication no
PermitRootLogin prohibit-password
StrictModes no
PidFile $N/sshd.pid
Subsystem sftp internal-sftp
CFG
  mkdir -p /run/sshd
  /usr/sbin/sshd -f "$N/sshd_config"
  trap 'fusermount -u "$N/mnt" 2>/dev/null || umount "$N/mnt" 2>/dev/null || true; kill "$(cat "$N/sshd.pid")" 2>/dev/null || true' EXIT
  mount_net() {
    fusermount -u "$N/mnt" 2>/dev/null || true
    sshfs -p 2299 -o IdentityFile="$N/user",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR root@127.0.0.1:"$W" "$N/mnt"
  }
  for round in $(seq "$ROUNDS"); do
    for S in 0 20; do
      for row in ${BENCH_NET_ROWS:-cat loader-f16 loader reader-mmap reader-read epochds-w2 naive-w2}; do
        n=all; [ "$row" = naive-w2 ] && n=6
        mount_net
        BENCH_DROP="$EP:$M:$W/mixed-huge-ds" one "$row" "$S" "sshfs, cold" $n "$N/mnt/mixed-huge" "$N/mnt/mixed-huge-ds" "$N/mnt/${EP##*/}"
      done
    done
  done
  fusermount -u "$N/mnt"
  kill "$(cat "$N/sshd.pid")"; trap - EXIT
  echo "sshfs: $(sshfs --version 2>&1 | head -1)"
else
  echo "network-filesystem leg skipped: needs root, sshfs and openssh-server (Debian: apt install sshfs openssh-server)"
fi
"$PY" bench/bench_train.py table "$OUT"
