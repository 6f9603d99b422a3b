#!/usr/bin/env bash
# Installation, end to end: installs the build tree into a temporary prefix and checks what
# is there, then builds examples/c out of tree against that prefix (find_package(ferry) through
# CMAKE_PREFIX_PATH, shared and static; pkg-config through PKG_CONFIG_PATH with a plain
# compiler) and runs `producer | consumer` each time.
#   usage: install_test.sh BUILD_DIR SOURCE_DIR CC LIBDIR VERSION [CMAKE]
# FERRY_EXAMPLE_CFLAGS: more flags for the examples (the sanitizer builds pass theirs).
set -euo pipefail
build=$1 src=$2 cc=$3 libdir=$4 version=$5 cmake=${6:-cmake}
extra=${FERRY_EXAMPLE_CFLAGS:-}
major=${version%%.*}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
lib=$prefix/$libdir

fail() {
    echo "install_test: $*" >&2
    exit 1
}

# Runs producer | consumer from folder $1 (with environment $2...) and checks what they say.
run_pair() {
    local dir=$1
    shift
    if ! (cd "$dir" && env "$@" timeout 60 ./producer 2>"$tmp/producer.err" |
        env "$@" timeout 60 ./consumer >"$tmp/consumer.out" 2>"$tmp/consumer.err"); then
        cat "$tmp/producer.err" "$tmp/consumer.out" "$tmp/consumer.err" >&2
        fail "$dir: producer | consumer failed"
    fi
    grep -q '^producer: all 4 tensors acknowledged$' "$tmp/producer.err" ||
        fail "$dir: unexpected producer output: $(cat "$tmp/producer.err")"
    if [ "$(grep -c '^consumer: tensor [0-3] \[64 x 128\] float32 ok$' "$tmp/consumer.out")" != 4 ] ||
        ! grep -q '^consumer: 4 tensors read, checked and acknowledged$' "$tmp/consumer.out"; then
        fail "$dir: unexpected consumer output: $(cat "$tmp/consumer.out")"
    fi
    echo "install_test: $dir: producer | consumer ok"
}

# 1. cmake --install, and what it put where.
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
    { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }
for f in include/ferry.h bin/ferry "$libdir/libferry.a" "$libdir/libferry.so.$version" \
    "$libdir/cmake/ferry/ferryConfig.cmake" "$libdir/cmake/ferry/ferryConfigVersion.cmake" \
    "$libdir/cmake/ferry/ferryTargets.cmake" "$libdir/pkgconfig/ferry.pc"; do
    [ -f "$prefix/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$lib/libferry.so.$major")" = "libferry.so.$version" ] ||
    fail "libferry.so.$major is not a link to libferry.so.$version"
[ "$(readlink "$lib/libferry.so")" = "libferry.so.$major" ] ||
    fail "libferry.so is not a link to libferry.so.$major"
if command -v readelf >/dev/null; then
    dynamic=$(readelf -d "$lib/libferry.so.$version")
    grep -q "SONAME.*\[libferry.so.$major\]" <<<"$dynamic" ||
        fail "libferry.so.$version has no SONAME libferry.so.$major"
fi
"$prefix/bin/ferry" version >/dev/null || fail "the installed CLI does not run"
if grep -F -l -e "$src" -e "$build" "$lib/cmake/ferry/"*.cmake "$lib/pkgconfig/ferry.pc"; then
    fail "the installed package names the source or build tree"
fi

# 2. The examples with CMake: find_package(ferry), ferry::ferry then ferry::ferry_static.
for variant in shared static; do
    static=OFF
    [ $variant = static ] && static=ON
    out=$tmp/cmake-$variant
    if ! { "$cmake" -S "$src/examples/c" -B "$out" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="-Werror $extra" \
        -DFERRY_EXAMPLES_STATIC=$static && "$cmake" --build "$out"; } >"$tmp/cmake.log" 2>&1; then
        cat "$tmp/cmake.log" >&2
        fail "building examples/c with find_package(ferry) ($variant) failed"
    fi
    if command -v ldd >/dev/null; then
        libs=$(ldd "$out/consumer")
        if [ $variant = shared ] && ! grep -q "libferry\.so.* => $lib/libferry\.so" <<<"$libs"; then
            fail "the shared consumer does not load $lib/libferry.so: $libs"
        fi
        if [ $variant = static ] && grep -q 'libferry\.so' <<<"$libs"; then
            fail "the static consumer loads libferry.so: $libs"
        fi
    fi
    run_pair "$out"
done

# 3. The examples with pkg-config and a plain compiler (examples/c/README.md).
if ! command -v pkg-config >/dev/null; then
    echo "install_test: pkg-config is not installed: the pkg-config half is skipped" >&2
    exit 77
fi
export PKG_CONFIG_PATH=$lib/pkgconfig
[ "$(pkg-config --modversion ferry)" = "$version" ] || fail "pkg-config: wrong version"
libs=$(pkg-config --static --libs ferry)
grep -q -- '-lferry -lpthread -ldl' <<<"$libs" || fail "pkg-config --static --libs ferry: $libs"
mkdir "$tmp/pc"
for example in producer consumer; do
    # shellcheck disable=SC2046,SC2086
    "$cc" -std=c11 -Wall -Wextra -Werror $extra "$src/examples/c/$example.c" \
        -o "$tmp/pc/$example" $(pkg-config --cflags --libs ferry) ||
        fail "building examples/c/$example.c with pkg-config failed"
done
run_pair "$tmp/pc" LD_LIBRARY_PATH="$lib"
