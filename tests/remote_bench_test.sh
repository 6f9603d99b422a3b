#!/usr/bin/env bash
# ferry bench --mode remote end to end: the producer in one network namespace, its consumers in
# another, joined by a veth pair that this script makes and removes (as root; on loopback
# where namespaces cannot be made), UCX over tcp. Checks the report's shape and that every item
# was received and verified byte for byte, never its timings (speed is what benchmarks
# measure). Without UCX: the library's reason, exit 1, then the test skips (77). Argument 2,
# where the fake CUDA driver is built: a GPU pool refused with the reason (Debian's UCX has no
# CUDA support) rather than a hang.
set -u
ferry="$1"
fake_cuda="${2:-}"
fails=0
limit="timeout 300"
out_file=/tmp/remote_bench_test.$$

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# Without UCX the run fails at once with the library's reason.
out=$($limit env FERRY_UCX_LIBRARY=/nonexistent/libucp.so.0 "$ferry" bench --mode remote \
    --quiet 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"remote pools need UCX: /nonexistent/libucp.so.0"* ]] ||
    fail "without UCX: rc=$rc, stderr: $out"
probe=$($limit "$ferry" bench --mode remote --iterations 1 --warmup 0 --rounds 1 \
    --item-size 64KiB --items 1 --pool-size 1MiB --quiet 2>&1 >/dev/null)
if [[ "$probe" == *"remote pools need UCX"* ]]; then
    echo "remote bench test: skipped: $probe"
    exit 77
fi

# The network: two namespaces and a veth pair, or loopback.
ns_a="fyrb-$$-a" ns_b="fyrb-$$-b" dev_a="fba$$" dev_b="fbb$$" x=$(($$ % 250 + 1))
ip_a="10.232.$x.1"
netns=0
cleanup() {
    rm -f "$out_file"
    if [ $netns -eq 1 ]; then
        ip netns del "$ns_a" 2>/dev/null
        ip netns del "$ns_b" 2>/dev/null
    fi
}
trap cleanup EXIT
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null 2>&1 &&
    ip netns add "$ns_a" 2>/dev/null; then
    netns=1
    if ! { ip netns add "$ns_b" && ip link add "$dev_a" type veth peer name "$dev_b" &&
        ip link set "$dev_a" netns "$ns_a" && ip link set "$dev_b" netns "$ns_b" &&
        ip -n "$ns_a" addr add "$ip_a/30" dev "$dev_a" &&
        ip -n "$ns_b" addr add "10.232.$x.2/30" dev "$dev_b" &&
        ip -n "$ns_a" link set "$dev_a" up && ip -n "$ns_b" link set "$dev_b" up &&
        ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up; }; then
        fail "making the namespaces and their veth pair failed"
        exit 1
    fi
else
    echo "remote bench test: no network namespaces here (not root, or no ip): on loopback"
fi

# ferry bench --mode remote ARGS..., the producer in the first namespace and the consumers in
# the second (their UCX_NET_DEVICES found by the workers themselves), or both on loopback.
bench() {
    if [ $netns -eq 1 ]; then
        $limit ip netns exec "$ns_a" env FERRY_REMOTE_LOCAL=0 UCX_TLS=tcp \
            UCX_NET_DEVICES="$dev_a" "$ferry" bench --mode remote --listen "$ip_a:0" --worker-netns "$ns_b" "$@"
    else
        $limit env FERRY_REMOTE_LOCAL=0 UCX_TLS=tcp UCX_NET_DEVICES=lo "$ferry" bench --mode remote \
            --listen 127.0.0.1:0 "$@"
    fi
}

# Tiny counts, every item checked in full: 2 consumers, latency at 4 KiB and throughput at
# 64 KiB and 1 MiB (4 of 1 MiB, as many bytes of 64 KiB: 64 items).
small=(--consumers 2 --iterations 60 --warmup 6 --rounds 2 --item-size 64KiB,1MiB --items 4
    --pool-size 8MiB --verify-every 1 --timeout-ms 20000)
# Items each consumer receives: latency 2 x (60 + 6); throughput 2 x (64 + 1 + 4 + 1).
expected=$((2 * (2 * (60 + 6) + 2 * (64 + 1 + 4 + 1))))

json=$(bench "${small[@]}" --json 2>"$out_file")
rc=$?
[ $rc -eq 0 ] || fail "bench --json: exit $rc: $(cat "$out_file")"
wants=('"mode": "remote"' '"backend": "host"' '"consumers": 2'
    '"latency": [{"memory": "host", "item_size": 4096, "iterations": 60, "ferry": {"mean_us": '
    '"floor": {"mean_us": ' '"ratio_p50": ' '"ratio_p99": '
    '"throughput": [{"memory": "host", "item_size": 65536, "items": 64, "ferry_seconds": '
    '{"memory": "host", "item_size": 1048576, "items": 4, ' '"floor_gbytes_per_s": '
    '"ratio_vs_floor": ' '"read_ratio_vs_floor": ' '"read_path": "emulated over active messages (tcp/'
    '"ferry_over_ucx": 2, "ferry_emulated": 2,' "\"received\": $expected, \"verified\": $expected, \"verified_in_full\": $expected, \"errors\": 0}")
if [ $netns -eq 1 ]; then
    wants+=("\"worker_netns\": \"$ns_b\"" "tcp/$dev_b")
fi
for want in "${wants[@]}"; do
    [[ "$json" == *"$want"* ]] || fail "bench --json lacks '$want': $json"
done
if command -v python3 >/dev/null; then
    echo "$json" | python3 -c 'import json, sys; json.load(sys.stdin)' || fail "not JSON: $json"
fi

# The text report: one consumer, the devices named by hand.
devices=()
[ $netns -eq 1 ] && devices=(--worker-net-devices "$dev_b")
out=$(bench --iterations 20 --warmup 2 --rounds 1 --item-size 256KiB --items 3 \
    --pool-size 4MiB --verify-every 1 "${devices[@]}" --quiet 2>&1)
rc=$?
for want in "ferry bench: remote, backend host, 1 consumer" "ferry/floor p50: " \
    "memory       size   items  ferry GB/s  floor GB/s  ferry/floor   read GB/s  read/floor" \
    "received: 52 items, verified: 52 (52 byte for byte), errors: 0"; do
    [ $rc -eq 0 ] && [[ "$out" == *"$want"* ]] || fail "text report (rc=$rc) lacks '$want': $out"
done

# Consumers on the producer's host and in its namespace, FERRY_REMOTE_LOCAL unset: ferry's open
# the pool through its broker (none over UCX); the floor's reads are UCX's as before.
json=$($limit env -u FERRY_REMOTE_LOCAL UCX_TLS=tcp UCX_NET_DEVICES=lo "$ferry" bench \
    --mode remote --listen 127.0.0.1:0 --iterations 20 --warmup 2 --rounds 1 --item-size 256KiB \
    --items 3 --pool-size 4MiB --verify-every 1 --json 2>"$out_file")
rc=$?
for want in '"ferry_over_ucx": 0, "ferry_emulated": 0,' '"verified": 52, "verified_in_full": 52'; do
    [ $rc -eq 0 ] && [[ "$json" == *"$want"* ]] ||
        fail "same host (rc=$rc) lacks '$want': $json $(cat "$out_file")"
done

# Consumers in a namespace that does not exist: their rank and exit status, exit 1, no hang.
if [ $netns -eq 1 ]; then
    out=$($limit ip netns exec "$ns_a" env UCX_TLS=tcp UCX_NET_DEVICES="$dev_a" "$ferry" bench \
        --mode remote --listen "$ip_a:0" --worker-netns "fyrb-$$-none" --timeout-ms 5000 \
        --quiet 2>&1 >/dev/null)
    rc=$?
    [ $rc -eq 1 ] && [[ "$out" == *"consumer rank 0 (pid "*") exited with status"* ]] ||
        fail "a namespace that does not exist: rc=$rc, stderr: $out"
fi

# A GPU pool where UCX has no CUDA support (the fake driver's memory is not CUDA's to UCX):
# refused with the reason, exit 1.
if [ -n "$fake_cuda" ]; then
    out=$($limit env FERRY_CUDA_DRIVER="$fake_cuda" FERRY_FAKE_CUDA_DEVICES=2 UCX_TLS=tcp \
        "$ferry" bench --backend cuda_ipc --mode remote --pool-size 8MiB --item-size 64KiB \
        --quiet 2>&1 >/dev/null)
    rc=$?
    [ $rc -eq 1 ] && [[ "$out" == *"need a UCX with CUDA support"* ]] ||
        fail "a GPU pool without CUDA-enabled UCX: rc=$rc, stderr: $out"
fi

[ $fails -eq 0 ] && echo "remote bench tests passed"
exit $((fails > 0))
