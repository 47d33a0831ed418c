#!/usr/bin/env bash
# Emulated hosts on one machine: network namespaces joined by veth pairs to a bridge in a "switch"
# namespace, private addresses, and shaped links (to test hierarchical algorithms and TCP across hosts). Nothing outside this machine is
# touched or reachable: the root namespace gets no interface, address or route.
#
#   scripts/netns_hosts.sh up N [flags]     create hosts PREFIX-h0 .. PREFIX-h{N-1} and switch PREFIX-sw
#   scripts/netns_hosts.sh down [N] [flags] delete them (every PREFIX-h* and PREFIX-sw when N is omitted)
#   scripts/netns_hosts.sh status [flags]   list them, their addresses and qdiscs
#
# Flags: --prefix P (default trident), --subnet A.B.C (default 10.77.0; host i is A.B.C.(10+i)/24),
#        --rate R (default 1gbit; tc rate syntax), --delay D (default 200us; one way, added on each
#        host's egress), --burst B (default 256kb: the bytes the rate limit lets through at once after
#        an idle spell, without netem), --no-shape (plain veth links).
# Shaping: each host's link is rate-limited in both directions (host egress on its eth0, host ingress on
# the switch side of its veth), so a host's ranks share R each way like one NIC. The delay needs the
# netem qdisc; a kernel without it (sch_netem not built or not loadable) gets the rate limit only (tbf),
# and the script says so on stderr and prints "shaping: rate R, no delay (netem unavailable)".
# Usage in a rank: ip netns exec PREFIX-h1 env TRIDENT_HOST_ID=h1 MASTER_ADDR=A.B.C.10 ... trident ...
# Needs root, iproute2 (ip, tc). Exit status: 0 done, 1 failed (what failed is printed), 2 bad usage.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

cmd=${1:-}; [[ -z "$cmd" ]] && usage; shift
n=""
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then n=$1; shift; fi
prefix=trident subnet=10.77.0 rate=1gbit delay=200us burst=256kb shape=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --no-shape) shape=0; shift ;;
    -h|--help) usage ;;
    *) echo "netns_hosts.sh: unknown flag '$1'" >&2; usage ;;
  esac
done
[[ "$prefix" =~ ^[A-Za-z0-9_-]{1,20}$ ]] || { echo "netns_hosts.sh: --prefix '$prefix': use 1-20 letters, digits, - or _" >&2; exit 2; }
[[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "netns_hosts.sh: --subnet '$subnet': expected A.B.C" >&2; exit 2; }
for tool in ip tc; do command -v $tool >/dev/null || { echo "netns_hosts.sh: '$tool' not found; install iproute2" >&2; exit 1; }; done
[[ $(id -u) -eq 0 ]] || { echo "netns_hosts.sh: network namespaces need root (run as root or with sudo)" >&2; exit 1; }

sw="$prefix-sw"
host() { echo "$prefix-h$1"; }

down() {
  local names
  if [[ -n "$n" ]]; then
    names="$sw"; for ((i = 0; i < n; i++)); do names+=" $(host $i)"; done
  else
    names=$(ip netns list | awk '{print $1}' | grep -E "^${prefix}-(sw|h[0-9]+)$" || true)
  fi
  for ns in $names; do
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then ip netns del "$ns"; fi
  done
}

# Shapes the egress of $2 inside namespace $1: rate, plus delay when $3 = delay and netem works.
shape_dev() {
  local ns=$1 dev=$2 with_delay=$3
  if [[ $with_delay == delay && $delay != 0 && $delay != 0us ]] &&
      ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "$delay" rate "$rate" limit 100000 2>/dev/null; then
    return 0
  fi
  if [[ $with_delay == delay && $delay != 0 && $delay != 0us ]]; then netem_missing=1; fi
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 5ms
}

up() {
  [[ -n "$n" && "$n" -ge 1 && "$n" -le 200 ]] || { echo "netns_hosts.sh up: give the number of hosts (1-200)" >&2; exit 2; }
  down  # a clean slate: leftovers of an interrupted run are removed first
  trap 'echo "netns_hosts.sh: setup failed; removing what was created" >&2; down' ERR
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  netem_missing=0
  for ((i = 0; i < n; i++)); do
    local h; h=$(host $i)
    ip netns add "$h"
    ip -n "$h" link set lo up
    ip link add eth0 netns "$h" type veth peer name "v$i" netns "$sw"
    ip -n "$sw" link set "v$i" master br0
    ip -n "$sw" link set "v$i" up
    ip -n "$h" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$h" link set eth0 up
    if [[ $shape -eq 1 ]]; then
      shape_dev "$h" eth0 delay
      shape_dev "$sw" "v$i" nodelay
    fi
  done
  trap - ERR
  if [[ $shape -eq 0 ]]; then echo "shaping: none"
  elif [[ $netem_missing -eq 1 ]]; then
    echo "netns_hosts.sh: the netem qdisc is not available in this kernel: links are rate-limited (tbf) but get no added delay" >&2
    echo "shaping: rate $rate, no delay (netem unavailable)"
  else echo "shaping: rate $rate, delay $delay one way"; fi
  for ((i = 0; i < n; i++)); do echo "$(host $i) $subnet.$((10 + i))"; done
}

status() {
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}-(sw|h[0-9]+)$" | sort); do
    echo "== $ns"
    ip -n "$ns" -brief addr
    ip netns exec "$ns" tc qdisc show | grep -v noqueue || true
  done
}

case $cmd in
  up) up ;;
  down) down ;;
  status) status ;;
  *) usage ;;
esac
