#!/usr/bin/env bash
# The ferry CLI: invalid settings give the library's exact messages and a non-zero exit;
# a small real bench verifies every byte and reports zero errors in its JSON.
set -u
ferry="$1"
fails=0

expect_fail() { # expected-message args...
    local want="$1"; shift
    local out
    out=$("$ferry" "$@" 2>&1 >/dev/null)
    local rc=$?
    if [ $rc -eq 0 ] || [[ "$out" != *"$want"* ]]; then
        echo "FAIL: ferry $* -> rc=$rc, stderr: $out (wanted: $want)"
        fails=$((fails + 1))
    fi
}

# Errors name the option the user typed; the library's messages for what only it can judge.
expect_fail "--pool-size must be positive" bench --pool-size 0 --quiet
expect_fail "--consumers must be positive" bench --consumers 0 --quiet
expect_fail "--max-inflight must be positive" bench --max-inflight 0 --quiet
expect_fail "--reclaim-interval-us must be positive" bench --reclaim-interval-us 0 --quiet
expect_fail "--iterations does not apply to --backend host" bench --iterations 5
expect_fail "--reclaim-rounds does not apply to --backend cuda_vmm" \
    bench --backend cuda_vmm --reclaim-rounds 3
expect_fail "host pool is too small after control metadata: pool=65536, control=81920" \
    bench --pool-size 64KiB --quiet
expect_fail "total_pool_size must be positive" split-budget 0 4
expect_fail "tokenizer_worker_num must be positive" split-budget 8GiB 0
expect_fail "" bench --item-size banana
expect_fail "" no-such-command

# --help everywhere, --version.
for cmd in "--help" "help" "bench --help" "doctor --help" "split-budget --help" "version --help" \
    "help bench"; do
    # shellcheck disable=SC2086 # the command is a list of words
    out=$("$ferry" $cmd 2>&1) || { echo "FAIL: ferry $cmd exited $?"; fails=$((fails + 1)); }
    [[ "$out" == *"usage: ferry"* ]] || { echo "FAIL: ferry $cmd: $out"; fails=$((fails + 1)); }
done
[ "$("$ferry" --version)" = "$("$ferry" version)" ] ||
    { echo "FAIL: ferry --version differs from ferry version"; fails=$((fails + 1)); }

share=$("$ferry" split-budget 10GiB 3)
[ "$share" = "3579139413" ] || { echo "FAIL: split-budget printed '$share'"; fails=$((fails + 1)); }

json=$("$ferry" bench --consumers 2 --items 200 --item-size 1KiB-256KiB --pool-size 4MiB \
    --reclaim-rounds 20 --rounds 2 --json 2>/dev/null)
rc=$?
for want in '"backend": "host"' '"verified_items": 200,' '"errors": 0' '"floor": {'; do
    if [ $rc -ne 0 ] || [[ "$json" != *"$want"* ]]; then
        echo "FAIL: bench --json (rc=$rc) lacks $want: $json"
        fails=$((fails + 1))
    fi
done

# --mode channel: send/recv, the floor and the socket hand-over, every item verified.
expect_fail "invalid --mode 'rtt': expected handover, channel or remote" bench --mode rtt
expect_fail "--mode channel takes one --item-size" bench --mode channel --item-size 1KiB-4KiB
json=$("$ferry" bench --mode channel --consumers 2 --items 300 --item-size 1KiB --rounds 3 \
    --json 2>/dev/null)
rc=$?
for want in '"mode": "channel"' '"channel": {"mean_us": ' '"floor": {' '"socket": {' \
    '"ratio_vs_floor": ' '"ratio_vs_socket": ' '"verified": 1980,' '"errors": 0}'; do
    if [ $rc -ne 0 ] || [[ "$json" != *"$want"* ]]; then
        echo "FAIL: bench --mode channel --json (rc=$rc) lacks $want: $json"
        fails=$((fails + 1))
    fi
done

# --mode remote takes options of its own (any backend), refused elsewhere, and refuses others'.
expect_fail "--listen does not apply to --backend host (it is an option of --mode remote)" \
    bench --listen 127.0.0.1:0
expect_fail "--worker-netns does not apply to --backend cuda_ipc (it is an option of --mode remote)" \
    bench --backend cuda_ipc --worker-netns x
expect_fail "--reclaim-rounds does not apply to --mode remote (it is an option of --backend host)" \
    bench --mode remote --reclaim-rounds 3
expect_fail "--control does not apply to --mode remote (it is an option of --backend cuda_ipc and cuda_vmm)" \
    bench --mode remote --control device
expect_fail "--consumer-memory device needs a GPU backend" bench --mode remote --consumer-memory device
expect_fail "--consumer-memory must be host, device or both" bench --mode remote --consumer-memory disk
expect_fail "--latency-size must be 16 bytes or more" bench --mode remote --latency-size 8
expect_fail "--rounds between 1 and --iterations and --items" bench --mode remote --items 2 --rounds 3
expect_fail "--producer-device and --consumer-device need a GPU backend" \
    bench --mode remote --consumer-device 1
out=$("$ferry" bench --help)
[[ "$out" == *"--listen HOST:PORT"*"[remote] where the pool listens"* ]] &&
    [[ "$out" == *"--iterations N"*"[GPU, remote] "* ]] ||
    { echo "FAIL: bench --help lacks the remote options: $out"; fails=$((fails + 1)); }

[ $fails -eq 0 ] && echo "cli tests passed"
exit $((fails > 0))
