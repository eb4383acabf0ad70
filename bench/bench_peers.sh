#!/usr/bin/env bash
# just bench peers: clipshard against LitData, Mosaic Streaming and
# WebDataset (their current releases, in a venv of this script's own) on
# the mixed bench set: prepare (wall, peak RSS, bytes; each writer's
# parallel option where it has one), a sweep of each peer's documented
# read knobs, then each peer's default and best configuration beside
# clipshard's Loaders and the floor (the best raw read of the same shard
# bytes) at S = 0, 5, 20 ms, warm and cold, in interleaved rounds;
# resume after kill -9 with another world size; over sshfs; under a
# memory cap. docs/BENCHMARKS.md has the tables.
#   bench/bench_peers.sh [WORKDIR]
# Environment: BENCH_LEGS (default "prepare sweep main resume sshfs
# capped"), BENCH_ROUNDS (3), BENCH_EPOCHS (epochs a process, 3),
# BENCH_S ("0 5 20"), BENCH_MODES ("warm cold"), BENCH_SWEEP (the sweep's
# configurations, e.g. "w0 w2p": only those), BENCH_CLIPS (400),
# BENCH_BIG_CLIPS (the capped leg's set, 4000),
# BENCH_PEERS_PYTHON (a Python that has the peers and torch: no venv made).
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"
if [ -n "${BENCH_PEERS_PYTHON:-}" ]; then
  PY=$BENCH_PEERS_PYTHON
else
  V="$W/peers-venv"
  if [ ! -x "$V/bin/python" ]; then
    python3 -m venv "$V"
    "$V/bin/pip" install --quiet --disable-pip-version-check litdata mosaicml-streaming webdataset torch
  fi
  PY="$V/bin/python"
fi
LEGS=" ${BENCH_LEGS:-prepare sweep main resume sshfs capped} "
leg() { case "$LEGS" in *" $1 "*) true ;; *) false ;; esac; }
"$PY" -c 'import importlib.metadata as m, sys; print("python", sys.version.split()[0], *["%s %s" % (p, m.version(p)) for p in ("litdata", "mosaicml-streaming", "webdataset", "torch", "numpy")])'
echo "$(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
go build -o "$W/" ./cmd/clipshard
# The mixed set with one huge clip (20x the median length).
CLIPS=${BENCH_CLIPS:-400}
M="$W/mixed-huge"; [ "$CLIPS" = 400 ] || M="$W/mixed-huge-$CLIPS"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" "$CLIPS" 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
OUT="$W/peers.jsonl"
P="$W/peers-huge"; [ "$CLIPS" = 400 ] || P="$W/peers-huge-$CLIPS"
mkdir -p "$P"
timed() {  # LABEL TOOL COMMAND...: wall and peak RSS (of the command and its children)
  local label=$1 tool=$2; shift 2
  sync
  local t0 t1; t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$W/peers-time.txt" "$@" > /dev/null 2> "$W/peers-err.txt" || { tail -5 "$W/peers-err.txt"; exit 1; }
  t1=$(date +%s%N)
  echo "{\"prepare\": \"$label\", \"tool\": \"$tool\", \"wall_s\": $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", (b-a)/1e9}'), \"rss_MB\": $(( $(cat "$W/peers-time.txt") / 1024 ))}" >> "$OUT"
}
# TOOL's data; with MODE cold, clipshard's epochs folder of BENCH_EPOCHS
# epochs: each epoch a process reads is one of its own (a replay of one
# epoch would have the Loader read the next epoch's first batches ahead
# from the cache the epoch before filled, before that epoch's drop; the
# peers re-read their own shards after each drop, all cold).
E=${BENCH_EPOCHS:-3}
data() {  # TOOL [MODE]
  case $1 in
    clipshard|clipshard-f16) if [ "${2:-}" = cold ]; then echo "$P/ep-cold-$E"; else echo "$P/ep"; fi ;;
    clipshard-drawn) echo "$P/ds" ;;
    *) echo "$P/${1%%:*}" ;;
  esac
}
PEERS="litdata mosaic webdataset webdataset-1"
SS=${BENCH_S:-0 5 20}
ROUNDS=${BENCH_ROUNDS:-3}
read1() {  # TOOL CONFIG S MODE [DATA]: one read, its JSON line appended to $OUT
  "$PY" bench/bench_peers.py read "$1" "$2" "$3" "$4" "${5:-$(data "$1" "$4")}" >> "$OUT" 2>"$W/peers-err.txt" ||
    { tail -3 "$W/peers-err.txt"; echo "{\"tool\": \"$1\", \"config\": \"$2\", \"S\": $3, \"mode\": \"$4\", \"failed\": true}" >> "$OUT"; }
}
if leg prepare; then
  : > "$OUT"
  # clipshard's convert + shuffle (one epoch, W=15), then each peer's
  # writer over the same windows.
  rm -rf "$P/ds" "$P/ep" "$P"/ep-cold-*
  timed convert clipshard "$W/clipshard" convert --quiet --workers 2 --clips "$M/clips.txt" --out "$P/ds" "${mods[@]}"
  timed shuffle clipshard "$W/clipshard" shuffle --quiet --workers 2 --dataset "$P/ds" --out "$P/ep" --window 15 --epochs 1 --seed 3
  for t in $PEERS; do
    rm -rf "${P:?}/$t"
    timed write "$t" "$PY" bench/bench_peers.py prepare "$t" "$M" "$P/ep" "$P/$t"
  done
  for t in ep ds $PEERS; do
    echo "{\"bytes\": \"$t\", \"MB\": $(( $(du -sb "$P/$t" | cut -f1) / 1000000 ))}" >> "$OUT"
  done
fi
# (untimed: the cold rows' epochs, one a pass; not part of the prepare
# figures, which time the one epoch every tool writes)
if leg main && [ ! -f "$P/ep-cold-$E/epochs.json" ] && [ -f "$P/ds/dataset.json" ]; then
  "$W/clipshard" shuffle --quiet --workers 2 --dataset "$P/ds" --out "$P/ep-cold-$E" --window 15 --epochs "$E" --seed 3
fi
if leg sweep; then
  # Every peer's documented knobs (CONFIGS in bench_peers.py: workers
  # 0/1/2, persistent workers, WebDataset's two layouts), warm, S=0,
  # BENCH_EPOCHS epochs a process; each round runs every configuration once.
  configs() { "$PY" -c 'import sys; sys.path.insert(0, "bench"); import bench_peers as b; print(" ".join(b.CONFIGS[sys.argv[1]]))' "$1"; }
  for round in $(seq "$ROUNDS"); do
    for t in $PEERS; do
      for c in $(configs "$t"); do
        case " ${BENCH_SWEEP:-$c} " in *" $c "*) read1 "$t" "$c" 0 "sweep, warm" ;; esac
      done
    done
  done
fi
# The rows of the main table: clipshard's, each peer's default (the
# setting of #27) and its best (the sweep's highest median samples/s).
ROWS=$("$PY" bench/bench_peers.py best "$OUT")
BEST=$("$PY" bench/bench_peers.py best "$OUT" --best-only)
if leg main; then
  # Warm and cold, S = 0, 5, 20 ms; each round: the floor (the best raw
  # read of the epoch's shard bytes, bench_peers.py floor), then every row.
  echo "rows: $ROWS"
  for round in $(seq "$ROUNDS"); do
    for mode in ${BENCH_MODES:-warm cold}; do
      "$PY" bench/bench_peers.py floor "$mode" "$P/ep" >> "$OUT"
      for S in $SS; do
        for row in $ROWS; do read1 "${row%%:*}" "${row#*:}" "$S" "$mode"; done
      done
    done
  done
fi
if leg resume; then
  # 2 ranks killed at 40% of the epoch, resumed on 1 (drawn epochs'
  # resume: testdata/check_drawn.py).
  for t in clipshard litdata mosaic webdataset; do
    rm -rf "${W:?}/peers-resume/$t"
    "$PY" bench/bench_peers.py resume "$t" "$(data "$t")" "$W/peers-resume/$t" "$(python3 -c "import json; print(json.load(open('$P/ep/epochs.json'))['epochs'][0]['samples'])")" >> "$OUT"
  done
fi
# Over sshfs to a loopback sshd (root, sshfs, openssh-server), cold, S=0,
# each row in its best configuration, every row once a round.
if ! leg sshfs; then
  :
elif command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ]; then
  N="$W/peers-net"; rm -rf "$N"; mkdir -p "$N/mnt"
  ssh-keygen -q -t ed25519 -N '' -f "$N/host" && ssh-keygen -q -t ed25519 -N '' -f "$N/user"
  printf 'Port 2298\nListenAddress 127.0.0.1\nHostKey %s/host\nAuthorizedKeysFile %s/user.pub\nPasswordAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nPidFile %s/sshd.pid\nSubsystem sftp internal-sftp\n' "$N" "$N" "$N" > "$N/sshd_config"
  mkdir -p /run/sshd
  /usr/sbin/sshd -f "$N/sshd_config"
  trap 'fusermount -u "$N/mnt" 2>/dev/null || true; kill "$(cat "$N/sshd.pid")" 2>/dev/null || true' EXIT
  for round in $(seq "$ROUNDS"); do
    # the floor: the epoch's shard files read whole over a fresh mount
    fusermount -u "$N/mnt" 2>/dev/null || true
    sshfs -p 2298 -o IdentityFile="$N/user",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR root@127.0.0.1:"$P" "$N/mnt"
    BENCH_DROP="$P/ep" "$PY" bench/bench_peers.py floor "sshfs, cold" "$N/mnt/ep" >> "$OUT"
    for row in $BEST; do
      t=${row%%:*}
      fusermount -u "$N/mnt" 2>/dev/null || true
      sshfs -p 2298 -o IdentityFile="$N/user",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR root@127.0.0.1:"$P" "$N/mnt"
      d=$(data "$t"); d="$N/mnt/${d#"$P"/}"
      BENCH_EPOCHS=1 BENCH_DROP="$(data "$t")" read1 "$t" "${row#*:}" 0 "sshfs, cold" "$d"
    done
  done
  fusermount -u "$N/mnt"; kill "$(cat "$N/sshd.pid")"; trap - EXIT
else
  echo "network-filesystem leg skipped: needs root, sshfs and openssh-server (Debian: apt install sshfs openssh-server)"
fi
# Under a memory cap below the data's size: a set 10x larger (4000 clips:
# ~2.2 GB an epoch) read with the page cache and every process of the
# reader capped at 1200M (root, a cgroup v1 or v2 memory controller): the
# cap must hold torch itself (~660 MB of RSS for its import here) and
# still be well below the data.
CAP=${CLIPSHARD_BENCH_CAP:-1200M}
cg=""
if ! leg capped; then
  :
elif [ "$(id -u)" = 0 ] && [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/clipshard-bench-peers; mkdir -p "$cg" && echo "$CAP" > "$cg/memory.max"
elif [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/clipshard-bench-peers; mkdir -p "$cg" && numfmt --from=iec "$CAP" > "$cg/memory.limit_in_bytes"
else
  echo "memory-capped leg skipped: needs root and a cgroup memory controller"
fi
if [ -n "$cg" ]; then
  NB=${BENCH_BIG_CLIPS:-4000}
  BM="$W/mixed-big-huge"; BP="$W/peers-big-huge"; [ "$NB" = 4000 ] || { BM="$BM-$NB"; BP="$BP-$NB"; }
  mkdir -p "$BP"
  [ -f "$BM/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$BM" "$NB" 20
  [ -f "$BP/ds/dataset.json" ] || "$W/clipshard" convert --quiet --workers 2 --clips "$BM/clips.txt" --out "$BP/ds" "${mods[@]}"
  [ -f "$BP/ep/epochs.json" ] || "$W/clipshard" shuffle --quiet --workers 2 --dataset "$BP/ds" --out "$BP/ep" --window 15 --epochs 1 --seed 3
  for t in $PEERS; do
    [ -e "$BP/$t.done" ] || { rm -rf "${BP:?}/$t"; "$PY" bench/bench_peers.py prepare "$t" "$BM" "$BP/ep" "$BP/$t" > /dev/null 2>&1 && touch "$BP/$t.done"; }
  done
  echo "{\"bytes\": \"big epoch\", \"MB\": $(( $(du -sb "$BP/ep" | cut -f1) / 1000000 ))}" >> "$OUT"
  for round in $(seq "$ROUNDS"); do
    for row in $BEST; do
      t=${row%%:*}; d="$BP/$t"
      case $t in clipshard|clipshard-f16) d="$BP/ep" ;; clipshard-drawn) d="$BP/ds" ;; esac
      BENCH_EPOCHS=1 sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$PY" bench/bench_peers.py read "$t" "${row#*:}" 20 "capped $CAP, cold" "$d" >> "$OUT" 2>"$W/peers-err.txt" ||
        echo "{\"tool\": \"$t\", \"config\": \"${row#*:}\", \"S\": 20, \"mode\": \"capped $CAP, cold\", \"killed\": true}" >> "$OUT"
    done
  done
  rmdir "$cg" 2>/dev/null || true
fi
"$PY" bench/bench_peers.py table "$OUT"
