#!/usr/bin/env bash
# ferry inside another project: a throwaway project takes the ferry tree with
# add_subdirectory(), builds a program against ferry::ferry and one against
# ferry::ferry_static and runs them; neither ferry's tests, nor -Werror on its sources, nor
# its install rules come along. Then the same project takes ferry through FetchContent (a
# local source folder, no network) with FERRY_TESTS=ON, which must configure and build too.
#   usage: subproject_test.sh SOURCE_DIR CC [CMAKE [CMOCKA_LIBRARY CMOCKA_INCLUDE_DIR]]
set -euo pipefail
src=$1 cc=$2 cmake=${3:-cmake} cmocka_lib=${4:-} cmocka_inc=${5:-}
jobs=$(nproc 2>/dev/null || echo 2)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-subproject.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "subproject_test: $*" >&2
    exit 1
}

mkdir "$tmp/app"
cat >"$tmp/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(app LANGUAGES C)
if(APP_FETCH)
  include(FetchContent)
  FetchContent_Declare(ferry GIT_REPOSITORY https://invalid.example/ferry.git GIT_TAG main)
  FetchContent_MakeAvailable(ferry) # FETCHCONTENT_SOURCE_DIR_FERRY: no download
else()
  add_subdirectory("${FERRY_DIR}" ferry)
endif()
add_executable(app app.c)
target_link_libraries(app PRIVATE ferry::ferry)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE ferry::ferry_static)
CMAKE
cat >"$tmp/app/app.c" <<'C'
#include <ferry.h>

#include <stdio.h>
#include <string.h>

/* One tensor through a host pool and back, in one process. */
int main(void)
{
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 1 << 20;
    cfg.consumer_count = 1;
    ferry_pool *pool = NULL;
    ferry_consumer *consumer = NULL;
    char in[] = "through the pool", out[sizeof(in)] = "";
    ferry_tensor t = ferry_tensor_bytes(sizeof(in));
    ferry_descriptor d;
    ferry_status st = ferry_pool_create(&cfg, &pool);
    if (st == FERRY_OK)
        st = ferry_pool_publish(pool, &t, in, FERRY_NO_WAIT, &d);
    if (st == FERRY_OK)
        st = ferry_consumer_create(0, &consumer);
    if (st == FERRY_OK)
        st = ferry_consumer_read(consumer, &d, out, sizeof(out), 1000000000ull);
    if (st == FERRY_OK)
        st = ferry_consumer_ack(consumer, &d);
    if (st != FERRY_OK)
        fprintf(stderr, "app: %s: %s\n", ferry_status_name(st), ferry_last_error());
    ferry_consumer_destroy(consumer);
    ferry_pool_destroy(pool);
    if (st != FERRY_OK || strcmp(in, out) != 0)
        return 1;
    printf("app: ferry %s ok\n", ferry_version());
    return 0;
}
C

# Configures the app in $1 with the options that follow and builds it (only the targets in
# the array targets, if any).
targets=()
build_app() {
    local out=$1
    shift
    if ! { "$cmake" -S "$tmp/app" -B "$out" -DCMAKE_C_COMPILER="$cc" \
        -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@" &&
        "$cmake" --build "$out" -j "$jobs" "${targets[@]}"; } >"$tmp/build.log" 2>&1; then
        cat "$tmp/build.log" >&2
        fail "$out: configuring or building the app failed"
    fi
}

check_runs() {
    for exe in "$@"; do
        "$exe" | grep -q '^app: ferry .* ok$' || fail "$exe did not run"
    done
}

# add_subdirectory(), the whole build.
b=$tmp/sub
build_app "$b" -DFERRY_DIR="$src"
check_runs "$b/app" "$b/app_static"
[ ! -e "$b/ferry/tests" ] || fail "add_subdirectory: ferry's tests were configured"
grep -q -- '-Wall' "$b/compile_commands.json" || fail "no compile commands?"
if grep -q -- '-Werror' "$b/compile_commands.json"; then
    fail "add_subdirectory: ferry's sources are built with -Werror"
fi
"$cmake" --install "$b" --prefix "$tmp/prefix" >/dev/null || fail "cmake --install failed"
[ -z "$(ls -A "$tmp/prefix" 2>/dev/null)" ] || fail "add_subdirectory: ferry installed files"

# FetchContent, with ferry's tests on: the app and the fake CUDA driver (which includes
# ferry's src/) build.
b=$tmp/fetch
targets=(--target app ferry_fakecuda)
# cmocka where the parent build found it (a machine may have it outside the system paths).
cmocka=()
[ -n "$cmocka_lib" ] && cmocka+=(-DCMOCKA_LIBRARY="$cmocka_lib")
[ -n "$cmocka_inc" ] && cmocka+=(-DCMOCKA_INCLUDE_DIR="$cmocka_inc")
build_app "$b" -DAPP_FETCH=ON -DFETCHCONTENT_SOURCE_DIR_FERRY="$src" -DFERRY_TESTS=ON "${cmocka[@]}"
check_runs "$b/app"
echo "subproject_test: add_subdirectory and FetchContent ok"
