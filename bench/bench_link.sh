# bench/bench_link.sh, sourced (bench_s3.sh's BENCH_LINKS leg, and
# TestBenchLinkRuns): an S3 server behind a link of a given rate, on this
# box. The server runs in a network namespace of this shell's own, reached
# over a veth pair whose two ends are shaped by tc's token bucket (tbf):
# the network, not the two cores the server shares with the client, then
# bounds a row, as with a server on other hosts. Nothing else on the box is
# shaped (loopback is not touched); the pair's addresses are a private /30
# (100.127.N.0/30, the first N from 213 on that no interface here has).
# Needs root, iproute2's ip and tc.
#   link_up                 the namespace and the pair (LINK_NS, LINK_HOST, LINK_PEER)
#   link_rate RATE [BURST]  both ends shaped to RATE (tc's units: 2gbit, 500mbit),
#                           a bucket of BURST (default 1mb); or none
#   link_serve VGW ROOT LOG versitygw (ROOT_ACCESS_KEY/ROOT_SECRET_KEY from the
#                           environment) in the namespace on a random port, its
#                           output to LOG:
#                           LINK_PID, LINK_ENDPOINT (http://ADDR:PORT)
#   link_down               the server stopped (by PID), the namespace deleted
#                           (with it the pair); idempotent
# A run killed before link_down leaves its namespace (csb-PID): the next
# link_up deletes those whose shell is gone.

link_up() {
  local ns pid n
  for ns in $(ip netns list 2>/dev/null | grep -o '^csb-[0-9]*'); do
    pid=${ns#csb-}
    kill -0 "$pid" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
  done
  for n in $(seq 213 250); do
    ip -4 -o addr show | grep -q " 100\.127\.$n\." || break
  done
  LINK_NET="100.127.$n"
  LINK_NS="csb-$$"; LINK_HOST="csb$$h"; LINK_PEER="csb$$p"
  ip netns add "$LINK_NS" || return 1
  ip link add "$LINK_HOST" type veth peer name "$LINK_PEER" || { link_down; return 1; }
  ip link set "$LINK_PEER" netns "$LINK_NS" &&
    ip addr add "$LINK_NET.1/30" dev "$LINK_HOST" && ip link set "$LINK_HOST" up &&
    ip netns exec "$LINK_NS" ip addr add "$LINK_NET.2/30" dev "$LINK_PEER" &&
    ip netns exec "$LINK_NS" ip link set "$LINK_PEER" up &&
    ip netns exec "$LINK_NS" ip link set lo up || { link_down; return 1; }
}

link_rate() {
  local r=$1 b=${2:-1mb}
  if [ "$r" = none ]; then
    tc qdisc del dev "$LINK_HOST" root 2>/dev/null || true
    ip netns exec "$LINK_NS" tc qdisc del dev "$LINK_PEER" root 2>/dev/null || true
    return 0
  fi
  # (tbf: a bucket of b bytes; 20 ms of queue before it drops)
  tc qdisc replace dev "$LINK_HOST" root tbf rate "$r" burst "$b" latency 20ms &&
    ip netns exec "$LINK_NS" tc qdisc replace dev "$LINK_PEER" root tbf rate "$r" burst "$b" latency 20ms
}

link_serve() {
  local vgw=$1 root=$2 log=$3 port i
  port=$(( 20000 + RANDOM % 20000 ))
  ip netns exec "$LINK_NS" "$vgw" --port "$LINK_NET.2:$port" posix "$root" > "$log" 2>&1 &
  LINK_PID=$!  # (ip netns exec execs the server: the same PID)
  LINK_ENDPOINT="http://$LINK_NET.2:$port"
  for i in $(seq 100); do
    (exec 3<>"/dev/tcp/$LINK_NET.2/$port") 2>/dev/null && return 0
    kill -0 "$LINK_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "versitygw did not answer on $LINK_ENDPOINT: $(tail -3 "$log")" >&2
  return 1
}

link_down() {
  if [ -n "${LINK_PID:-}" ]; then
    kill "$LINK_PID" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$LINK_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$LINK_PID" 2>/dev/null || true
    LINK_PID=""
  fi
  if [ -n "${LINK_NS:-}" ]; then
    ip netns del "$LINK_NS" 2>/dev/null || true
    ip link del "$LINK_HOST" 2>/dev/null || true
    LINK_NS=""
  fi
}
