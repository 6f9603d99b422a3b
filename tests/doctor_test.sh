#!/usr/bin/env bash
# ferry doctor: without a driver it says "no GPU" plainly and exits 0; with the fake CUDA
# driver (second argument, skipped when missing) the real probes run and report FABRIC
# refused, POSIX_FD working, stream memory operations working and peers 0 <-> 1.
set -u
ferry="$1"
fake="${2:-}"
fails=0

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

expect() { # name output rc wanted-substrings...
    local name="$1" out="$2" rc="$3"
    shift 3
    [ "$rc" -eq 0 ] || fail "$name: exit $rc"
    for want in "$@"; do
        [[ "$out" == *"$want"* ]] || fail "$name lacks '$want': $out"
    done
}

out=$(FERRY_CUDA_DRIVER=/nonexistent/libcuda.so "$ferry" doctor 2>&1)
expect "doctor without a driver" "$out" $? "no GPU: no CUDA driver" "/nonexistent/libcuda.so" \
    "transport: host (shared memory)" "MPS: "

out=$(FERRY_CUDA_DRIVER=/nonexistent/libcuda.so "$ferry" doctor --json 2>/dev/null)
expect "doctor --json without a driver" "$out" $? '"loaded": false' '"devices": []' \
    '"choice": "host"' '"version": null'
if command -v python3 >/dev/null; then
    echo "$out" | python3 -c 'import json, sys; json.load(sys.stdin)' ||
        fail "doctor --json without a driver is not JSON: $out"
fi

"$ferry" doctor --bogus >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "doctor --bogus exited $rc, not 2"
"$ferry" doctor extra >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "doctor extra exited $rc, not 2"

if [ -n "$fake" ] && [ -f "$fake" ]; then
    out=$(FERRY_CUDA_DRIVER="$fake" FERRY_FAKE_CUDA_DEVICES=2 "$ferry" doctor 2>&1)
    expect "doctor with the fake driver" "$out" $? "GPU 0:" "GPU 1:" "FABRIC" \
        "CUDA_ERROR_NOT_PERMITTED" "POSIX_FILE_DESCRIPTOR: attribute 1; probe: works" \
        "transport: cuda_ipc" "cuda_vmm: POSIX_FD (FABRIC refused: cuMemCreate failed"
    [[ "$out" == *"stream memory operations"*"probe: works"* ]] ||
        fail "doctor with the fake driver: stream memory operations do not work: $out"

    out=$(FERRY_CUDA_DRIVER="$fake" FERRY_FAKE_CUDA_DEVICES=2 "$ferry" doctor --json 2>/dev/null)
    expect "doctor --json with the fake driver" "$out" $? '"loaded": true' '"choice": "cuda_ipc"' \
        '"stream_mem_ops": {"attribute": true, "works": true, "probe": "works"}' \
        '"peers": [1]' '"peers": [0]' "CUDA_ERROR_NOT_PERMITTED"
    if command -v python3 >/dev/null; then
        echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
d = r["devices"]
assert len(d) == 2, d
for i, g in enumerate(d):
    assert g["vmm"]["posix_fd"]["works"] is True, g
    assert g["vmm"]["fabric"]["works"] is False, g
    assert "CUDA_ERROR_NOT_PERMITTED" in g["vmm"]["fabric"]["probe"], g
    assert g["stream_mem_ops"]["works"] is True, g
    assert g["peers"] == [1 - i], g
' || fail "doctor --json with the fake driver: $out"
    fi

    # A driver without the VMM entry points, and one whose host registration fails.
    out=$(FERRY_CUDA_DRIVER="$fake" FERRY_FAKE_CUDA_HIDE=cuMemCreate "$ferry" doctor 2>&1)
    expect "doctor without the VMM API" "$out" $? "probe: VMM API not in this driver" \
        "cuda_vmm: unavailable (VMM API not in this driver)" "transport: cuda_ipc"
    out=$(FERRY_CUDA_DRIVER="$fake" FERRY_FAKE_CUDA_FAIL=cuMemHostRegister:0:801 \
        "$ferry" doctor 2>&1)
    expect "doctor with cuMemHostRegister failing" "$out" $? \
        "cuMemHostRegister failed: CUDA_ERROR_NOT_SUPPORTED" "transport: host (shared memory: "
else
    echo "doctor: no fake CUDA driver at '${fake}', its part skipped"
fi

[ $fails -eq 0 ] && echo "doctor tests passed"
exit $((fails > 0))
