#!/usr/bin/env bash
# ferry bench --backend cuda_ipc against the fake CUDA driver (ctest sets FERRY_CUDA_DRIVER
# and FERRY_FAKE_CUDA_DEVICES=2): every mode with tiny sizes and counts reports errors 0 in
# its JSON; without a driver, with a bad setting, or with a consumer whose driver call fails,
# it exits non-zero with the library's message, and never hangs.
set -u
ferry="$1"
fails=0
limit="timeout 120"

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

expect_fail() { # wanted-rc wanted-message environment ("" for none) args...
    local want_rc="$1" want="$2" environment="$3"
    shift 3
    local out rc
    # shellcheck disable=SC2086 # the environment is a list of VAR=VALUE words
    out=$($limit env $environment "$ferry" "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne "$want_rc" ] || [[ "$out" != *"$want"* ]]; then
        fail "ferry $* -> rc=$rc (wanted $want_rc), stderr: $out (wanted: $want)"
    fi
}

expect_json() { # name wanted-substrings ('!TEXT': TEXT must be absent)... -- args...
    local name="$1"
    shift
    local wants=()
    while [ "$1" != "--" ]; do
        wants+=("$1")
        shift
    done
    shift
    local out rc
    out=$($limit "$ferry" bench --backend cuda_ipc --json "$@" 2>/tmp/gpu_bench_test.$$)
    rc=$?
    [ $rc -eq 0 ] || fail "$name: exit $rc: $(cat /tmp/gpu_bench_test.$$)"
    for want in '"backend": "cuda_' "${wants[@]}"; do
        if [[ "$want" == '!'* ]]; then
            [[ "$out" != *"${want#!}"* ]] || fail "$name has '${want#!}': $out"
        else
            [[ "$out" == *"$want"* ]] || fail "$name lacks '$want': $out"
        fi
    done
    [[ "$out" == *'"errors": 0}' ]] || fail "$name: errors are not 0: $out"
    [[ "$out" == *'"verified": 0,'* ]] && fail "$name verified nothing: $out"
    if command -v python3 >/dev/null; then
        echo "$out" | python3 -c 'import json, sys; json.load(sys.stdin)' ||
            fail "$name: not JSON: $out"
    fi
    rm -f /tmp/gpu_bench_test.$$
}

# Without a driver: the library's message, exit 1.
expect_fail 1 "CUDA IPC pool needs the CUDA driver: no CUDA driver: /nonexistent/libcuda.so" \
    FERRY_CUDA_DRIVER=/nonexistent/libcuda.so bench --backend cuda_ipc --quiet

# Bad settings: the library's messages (exit 1) or the command line's (exit 2).
expect_fail 1 "CUDA IPC pool is too small after control metadata: pool=16384, control=32768" "" \
    bench --backend cuda_ipc --pool-size 16KiB --max-inflight 4096 --quiet
expect_fail 2 "--pool-size must be positive" "" bench --backend cuda_ipc --pool-size 0 --quiet
expect_fail 1 "do not fit in the pool" "" \
    bench --backend cuda_ipc --mode stream --item-size 8MiB --pool-size 4MiB --quiet
expect_fail 1 "device 5 does not exist" "" bench --backend cuda_ipc --producer-device 5 --quiet
expect_fail 1 "consumer device 3 does not exist" "" \
    bench --backend cuda_ipc --consumer-device 3 --quiet
expect_fail 2 "invalid --mode" "" bench --backend cuda_ipc --mode banana
expect_fail 2 "runs one consumer" "" bench --backend cuda_ipc --mode cpu --consumers 2
expect_fail 2 "lists 2 devices for 3 consumers" "" \
    bench --backend cuda_ipc --mode rtt --consumers 3 --consumer-devices 0,1
expect_fail 2 "--no-floor does not apply to --backend cuda_ipc" "" \
    bench --backend cuda_ipc --no-floor
expect_fail 2 "--reclaim-rounds does not apply to --backend cuda_vmm" "" \
    bench --backend cuda_vmm --reclaim-rounds 5

# Every mode, both control placements, tiny counts.
expect_json "rtt same GPU" '"mode": "rtt"' '"control": "host", "item_size": 4096' \
    '"control": "device", "item_size": 65536' '"floor": {"mean_us": ' -- \
    --mode rtt --item-size 4KiB,64KiB --iterations 12 --warmup 4 --verify-every 4 --rounds 2 \
    --control both
expect_json "rtt other GPU" '"consumer_devices": [1]' -- \
    --mode rtt --item-size 4KiB --iterations 10 --warmup 2 --verify-every 3 --consumer-device 1
# Tensor parallel: one consumer per GPU, the round trip ends at the last acknowledgement.
expect_json "rtt 2 consumers" '"consumers": 2' '"consumer_devices": [0, 1]' \
    '"control": "host", "item_size": 4096' '"control": "device", "item_size": 65536' \
    '"floor": {"mean_us": ' '"items_per_s": ' -- \
    --mode rtt --consumers 2 --consumer-devices 0,1 --item-size 4KiB,64KiB --iterations 12 \
    --warmup 4 --verify-every 4 --rounds 2 --control both
expect_json "rtt 2 consumers implied" '"consumers": 2' '"consumer_devices": [1, 0]' -- \
    --backend cuda_vmm --mode rtt --consumer-devices 1,0 --item-size 4KiB --iterations 6 \
    --warmup 2 --verify-every 2
expect_json "stream 2 consumers" '"mode": "stream"' '"consumers": 2' '"effective_gbytes_per_s": ' \
    '"control": "device"' '"consumer_read_gbytes_per_s": ' '"peer_floor": [{"device": 1, ' \
    '"ratio_vs_peer_floor": null' -- \
    --mode stream --consumers 2 --consumer-devices 0,1 --item-size 3MiB --items 6 --warmup 2 \
    --pool-size 16MiB --control both --floor-copies 4
expect_json "stream 2 consumers on the other GPU" '"consumer_devices": [1, 1]' \
    '"peer_floor": [{"device": 1, "copies": 3, ' '"ratio_vs_peer_floor": ' \
    '!"ratio_vs_peer_floor": null' '!}, {"device"' '"control": "device"' -- \
    --mode stream --consumers 2 --consumer-devices 1,1 --item-size 1MiB --items 6 --warmup 2 \
    --pool-size 8MiB --control both --floor-copies 3
expect_json "stream same GPU" '"peer_floor": [], "ratio_vs_peer_floor": null' -- \
    --mode stream --consumers 2 --consumer-devices 0 --item-size 64KiB --items 6 --warmup 2 \
    --pool-size 1MiB --floor-copies 4
expect_json "stream 4 consumers" '"consumers": 4' '"consumer_devices": [1, 1, 1, 1]' -- \
    --mode stream --consumers 4 --consumer-devices 1 --item-size 64KiB --items 30 --warmup 2 \
    --pool-size 1MiB --floor-copies 16
# The CUDA VMM transport through the same benchmarks (the fake refuses FABRIC: POSIX_FD).
expect_json "rtt cuda_vmm" '"backend": "cuda_vmm"' '"mode": "rtt"' -- \
    --backend cuda_vmm --mode rtt --item-size 4KiB --iterations 10 --warmup 2 --control both
expect_json "stream cuda_vmm" '"backend": "cuda_vmm"' '"mode": "stream"' -- \
    --backend cuda_vmm --mode stream --consumers 2 --item-size 1MiB --items 6 --warmup 2 \
    --pool-size 8MiB --floor-copies 4
expect_json "cpu" '"mode": "cpu"' '"publish_ferry_ns": ' '"read_ferry_ns": ' -- \
    --mode cpu --iterations 300 --item-size 4KiB --control both

# The cpu mode's raw side makes the driver calls ferry's read makes: with control words in host
# memory, no stream wait (here every cuStreamWaitValue32 fails).
out=$($limit env FERRY_FAKE_CUDA_FAIL=cuStreamWaitValue32:0:1 "$ferry" bench --backend cuda_ipc \
    --mode cpu --iterations 300 --item-size 4KiB --json 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ "$out" == *'"errors": 0}' ]] ||
    fail "cpu, host control: a stream wait that ferry's read does not make (rc=$rc): $out"

# The text report.
out=$($limit "$ferry" bench --backend cuda_ipc --mode rtt --item-size 4KiB --iterations 5 \
    --warmup 1 --quiet 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ "$out" == *"ferry/floor mean: "* ]] || fail "rtt text report (rc=$rc): $out"
out=$($limit "$ferry" bench --backend cuda_ipc --mode rtt --consumer-devices 0,1 --item-size 4KiB \
    --iterations 5 --warmup 1 --quiet 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ "$out" == *"items/s"* ]] &&
    [[ "$out" == *"acknowledgement of the last of the 2 consumers"* ]] ||
    fail "rtt text report, 2 consumers (rc=$rc): $out"
out=$($limit "$ferry" bench --backend cuda_ipc --mode stream --consumer-devices 1,1 \
    --item-size 64KiB --items 6 --warmup 2 --pool-size 1MiB --floor-copies 4 --quiet 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ "$out" == *"peer floor GPU 1: "* ]] &&
    [[ "$out" == *"consumer read / peer floor: "* ]] || fail "stream text report (rc=$rc): $out"

# A consumer whose driver call fails: reported with its rank, exit 1, no hang.
expect_fail 1 "consumer rank 0" FERRY_FAKE_CUDA_FAIL=cuStreamWaitValue32:3:1 \
    bench --backend cuda_ipc --mode rtt --item-size 4KiB --iterations 5 --warmup 1 \
    --timeout-ms 5000 --quiet

# A consumer that cannot open the producer's buffer for the peer floor: its rank, exit 1.
expect_fail 1 "consumer rank 1 failed: cuIpcOpenMemHandle failed" \
    FERRY_FAKE_CUDA_FAIL=cuIpcOpenMemHandle:1:1 \
    bench --backend cuda_ipc --mode stream --consumer-devices 0,1 --item-size 64KiB --items 4 \
    --warmup 1 --pool-size 1MiB --floor-copies 2 --timeout-ms 5000 --quiet
# One of two rtt consumers whose driver call fails: no hang.
expect_fail 1 "consumer rank " FERRY_FAKE_CUDA_FAIL=cuStreamWaitValue32:3:1 \
    bench --backend cuda_ipc --mode rtt --consumer-devices 0,1 --item-size 4KiB --iterations 5 \
    --warmup 1 --timeout-ms 5000 --quiet

[ $fails -eq 0 ] && echo "gpu bench tests passed"
exit $((fails > 0))
