#!/usr/bin/env bash
# scripts/vcluster checks its prefix (--prefix, ZERODP_VCLUSTER_PREFIX) and --hosts before it
# names, sweeps or removes anything: a path, a regex, an empty or an over-long prefix is refused
# with exit 2 (not 77, which ctest reads as skipped), and a sweep takes only the exact names and
# the marked state directory of its own prefix. No cluster is made.
# Usage: vcluster_prefix_test.sh [VCLUSTER] (default: this tree's scripts/vcluster).
#
# As root it reruns itself in a mount namespace of its own, over an empty /run/netns and state
# root (a /run of its own), so even a vcluster that ignores its prefix removes nothing outside this test.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
vcluster=$(realpath "${1:-$here/../../scripts/vcluster}")
state_root=/run/zerodp-vcluster

if [[ -z ${ZDP_VC_PRIVATE:-} && $(id -u) -eq 0 ]] &&
   unshare --mount --propagation private true 2>/dev/null; then
  exec unshare --mount --propagation private env ZDP_VC_PRIVATE=1 \
    bash "${BASH_SOURCE[0]}" "$vcluster"
fi
# Cases where a vcluster that ignored the prefix would delete a live cluster's state, or a
# namespace of the machine, run only where that cannot reach beyond the test.
contained=0
if [[ -n ${ZDP_VC_PRIVATE:-} ]]; then
  if ! mount -t tmpfs zdp-vc-test /run || ! mkdir -p /run/netns "$state_root"; then
    echo "FAIL: could not mount a private /run"
    exit 1
  fi
  contained=1
elif [[ $(id -u) -ne 0 ]]; then
  contained=1  # nothing under /run is this user's to remove
fi
netns=0
if [[ $contained -eq 1 && $(id -u) -eq 0 ]] && ip netns add zqv-probe-usable 2>/dev/null; then
  ip netns del zqv-probe-usable
  netns=1
fi

tmp=$(mktemp -d)
victim_pid=""
cleanup() {
  [[ -z $victim_pid ]] || kill -KILL "$victim_pid" 2>/dev/null
  if [[ $netns -eq 1 ]]; then
    # What a vcluster that took --hosts 010 for 8 made. Every namespace listed is the test's:
    # netns is 1 only over the private /run.
    "$vcluster" down --prefix zqh >/dev/null 2>&1
    local ns
    for ns in $(ip netns list | awk '{print $1}'); do ip netns del "$ns" 2>/dev/null; done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# refused LABEL MESSAGE COMMAND...: exits 2 saying MESSAGE.
refused() {
  local label=$1 message=$2
  shift 2
  local out code
  out=$("$@" 2>&1)
  code=$?
  if [[ $code -eq 2 && $out == *"$message"* ]]; then
    ok "$label: exit 2, $(head -c 160 <<<"$out")"
  else
    bad "$label: exit $code (want 2 saying \"$message\"): $(head -c 300 <<<"$out")"
  fi
}

# A directory of the user's that the state root's ../.. reaches: it must outlive every case.
decoy=$tmp/decoy
reset_decoy() { mkdir -p "$decoy" && echo keep >"$decoy/file"; }
decoy_intact() {
  if [[ -f $decoy/file ]]; then
    ok "$1: $decoy and its file are still there"
  else
    bad "$1: $decoy was removed"
    reset_decoy
  fi
}
reset_decoy
# The traversal needs the state root to exist, as it does once any cluster was up.
[[ -d $state_root ]] || mkdir -p "$state_root" 2>/dev/null
path_prefix=../..$decoy

refused "down --prefix $path_prefix" "--prefix '$path_prefix' is invalid" \
  "$vcluster" down --prefix "$path_prefix"
decoy_intact "down --prefix $path_prefix"
refused "ZERODP_VCLUSTER_PREFIX=$path_prefix down" \
  "ZERODP_VCLUSTER_PREFIX '$path_prefix' is invalid" \
  env ZERODP_VCLUSTER_PREFIX="$path_prefix" "$vcluster" down
decoy_intact "ZERODP_VCLUSTER_PREFIX=$path_prefix down"
refused "up --prefix $path_prefix" "--prefix '$path_prefix' is invalid" \
  "$vcluster" up --prefix "$path_prefix"
decoy_intact "up --prefix $path_prefix"
refused "run --prefix $path_prefix" "--prefix '$path_prefix' is invalid" \
  "$vcluster" run --prefix "$path_prefix" -- true
decoy_intact "run --prefix $path_prefix"

# Long, spaced and slashed prefixes: a usage error, never 77.
long14=abcdefghijklmn
long40=zdp-a-prefix-far-longer-than-links-allow
for bad_prefix in "$long14" "$long40" "a b" "a/b"; do
  refused "up --prefix '$bad_prefix'" "--prefix '$bad_prefix' is invalid" \
    "$vcluster" up --prefix "$bad_prefix"
done
refused "down --prefix $long14" "--prefix '$long14' is invalid" "$vcluster" down --prefix "$long14"
# Empty, regex, upper-case and dangling prefixes: one that ip would take makes or sweeps names,
# so these run contained only.
if [[ $contained -eq 1 ]]; then
  for bad_prefix in "" "a.v" "Zdp" "zdp-" "-zdp" "1zdp"; do
    refused "up --prefix '$bad_prefix'" "--prefix '$bad_prefix' is invalid" \
      "$vcluster" up --prefix "$bad_prefix"
    refused "down --prefix '$bad_prefix'" "--prefix '$bad_prefix' is invalid" \
      "$vcluster" down --prefix "$bad_prefix"
  done
  refused "ZERODP_VCLUSTER_PREFIX='' down" "ZERODP_VCLUSTER_PREFIX '' is invalid" \
    env ZERODP_VCLUSTER_PREFIX= "$vcluster" down
fi
refused "ZERODP_VCLUSTER_PREFIX='a b' check" "ZERODP_VCLUSTER_PREFIX 'a b' is invalid" \
  env ZERODP_VCLUSTER_PREFIX="a b" "$vcluster" check
refused "ZERODP_VCLUSTER_PREFIX=$long14 check" "ZERODP_VCLUSTER_PREFIX '$long14' is invalid" \
  env ZERODP_VCLUSTER_PREFIX="$long14" "$vcluster" check
refused "down --prefix (no value)" "--prefix needs a value" "$vcluster" down --prefix

# 13 characters is the longest a host's link name (PREFIX32) fits in 15.
out=$("$vcluster" down --prefix zqabcdefghijk 2>&1)
code=$?
if [[ $code -eq 0 ]]; then
  ok "down --prefix zqabcdefghijk (13 characters) is taken"
else
  bad "down --prefix zqabcdefghijk (13 characters): exit $code: $out"
fi

# --hosts 010 is not octal 8: refused before anything is made.
for hosts in 010 08 0 33 +2; do
  refused "up --hosts $hosts" "--hosts '$hosts' is invalid; use a whole number from 1 to 32" \
    "$vcluster" up --prefix zqh --hosts "$hosts"
done
made=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -c '^zqh-')
if [[ $made -eq 0 && ! -e $state_root/zqh ]]; then
  ok "up --hosts 010: no namespace and no state directory was made"
else
  bad "up --hosts 010: left $made namespaces zqh-*$([[ -e $state_root/zqh ]] && echo " and $state_root/zqh")"
fi

if [[ $contained -eq 1 ]]; then
  # --prefix "" under a live cluster: its state (another prefix's) stays.
  if mkdir -p "$state_root/zqlive/uts" 2>/dev/null; then
    echo "zqlive-h1 10.231.77.1 " >"$state_root/zqlive/hosts"
    refused "down --prefix '' under a live cluster" "--prefix '' is invalid" \
      "$vcluster" down --prefix ""
    if [[ -f $state_root/zqlive/hosts ]]; then
      ok "down --prefix '': the live cluster's $state_root/zqlive is still there"
    else
      bad "down --prefix '': removed the state root under a live cluster"
    fi
    refused "run --prefix '' --" "--prefix '' is invalid" "$vcluster" run --prefix "" -- true
    if [[ -f $state_root/zqlive/hosts ]]; then
      ok "run --prefix '': the live cluster's state is still there"
    else
      bad "run --prefix '': removed the state root under a live cluster"
    fi
    rm -rf "${state_root:?}/zqlive"

    # A directory in the state root that up did not make is not removed, nor what a link there
    # points at.
    mkdir -p "$state_root/zqforeign" && echo mine >"$state_root/zqforeign/notes"
    out=$("$vcluster" down --prefix zqforeign 2>&1)
    code=$?
    if [[ $code -ne 0 && -f $state_root/zqforeign/notes && $out == *"not a state directory vcluster made"* ]]; then
      ok "down --prefix zqforeign: exit $code, $out"
    else
      bad "down --prefix zqforeign: exit $code, notes $([[ -f $state_root/zqforeign/notes ]] && echo kept || echo removed): $out"
    fi
    ln -s "$decoy" "$state_root/zqlink"
    out=$("$vcluster" down --prefix zqlink 2>&1)
    code=$?
    if [[ $code -ne 0 && -L $state_root/zqlink ]]; then
      ok "down --prefix zqlink (a link to $decoy): exit $code, left as it is"
    else
      bad "down --prefix zqlink (a link to $decoy): exit $code, $out"
    fi
    decoy_intact "down --prefix zqlink"
  fi
fi

if [[ $netns -eq 1 ]]; then
  # A namespace the regex a.v matches, with a process in it.
  make_victim() {
    ip netns del adv-victim 2>/dev/null
    [[ -z $victim_pid ]] || kill -KILL "$victim_pid" 2>/dev/null
    ip netns add adv-victim
    ip netns exec adv-victim sleep 300 &
    victim_pid=$!
    disown "$victim_pid"
    local tries=0
    until ip netns pids adv-victim 2>/dev/null | grep -qx "$victim_pid"; do
      ((++tries < 100)) || break
      sleep 0.02
    done
  }
  victim_intact() {
    if ip netns list | awk '{print $1}' | grep -qx adv-victim && kill -0 "$victim_pid" 2>/dev/null; then
      ok "$1: namespace adv-victim and its process are still there"
    else
      bad "$1: deleted namespace adv-victim or killed its process"
      make_victim
    fi
  }
  make_victim
  refused "down --prefix a.v" "--prefix 'a.v' is invalid" "$vcluster" down --prefix a.v
  victim_intact "down --prefix a.v"
  refused "ZERODP_VCLUSTER_PREFIX=a.v down" "ZERODP_VCLUSTER_PREFIX 'a.v' is invalid" \
    env ZERODP_VCLUSTER_PREFIX=a.v "$vcluster" down
  victim_intact "ZERODP_VCLUSTER_PREFIX=a.v down"

  # A valid prefix sweeps its own names only: zqv-h1 and zqv-hub, not zqv-h1-hub (a cluster of
  # prefix zqv-h1), zqv-other or zqvx-h1.
  for ns in zqv-h1 zqv-hub zqv-h1-hub zqv-other zqvx-h1; do ip netns add "$ns"; done
  "$vcluster" down --prefix zqv >/dev/null 2>&1
  left=$(ip netns list | awk '{print $1}' | grep '^zqv' | sort | tr '\n' ' ')
  if [[ $left == "zqv-h1-hub zqv-other zqvx-h1 " ]]; then
    ok "down --prefix zqv: took zqv-h1 and zqv-hub, left $left"
  else
    bad "down --prefix zqv: left '$left' (want 'zqv-h1-hub zqv-other zqvx-h1 ')"
  fi

  # A run refused for its arguments leaves a cluster of its prefix that was already up.
  ip netns add zqr-h1
  mkdir -p "$state_root/zqr/uts" && echo "zqr-h1 10.231.77.1 " >"$state_root/zqr/hosts"
  refused "run --prefix zqr --hosts 0 -- true" "--hosts '0' is invalid" \
    "$vcluster" run --prefix zqr --hosts 0 -- true
  if ip netns list | awk '{print $1}' | grep -qx zqr-h1 && [[ -f $state_root/zqr/hosts ]]; then
    ok "run --hosts 0: the cluster zqr already up is still there"
  else
    bad "run --hosts 0: swept the cluster zqr that was already up"
  fi
  "$vcluster" down --prefix zqr >/dev/null 2>&1
  if ! ip netns list | awk '{print $1}' | grep -qx zqr-h1 && [[ ! -e $state_root/zqr ]]; then
    ok "down --prefix zqr: took its namespace and its state directory (made before the marker)"
  else
    bad "down --prefix zqr: left $(ip netns list | grep zqr) $(ls -d "$state_root/zqr" 2>/dev/null)"
  fi
else
  echo "skipped: the namespace cases (ip netns is not usable here without root)"
fi
exit $fail
