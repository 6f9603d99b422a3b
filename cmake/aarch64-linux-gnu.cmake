# Cross build for aarch64 Linux with Debian's cross compiler (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross): `make check-aarch64`, or
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Libraries for the target (cmocka, for the tests) come from Debian's multiarch packages
# (libcmocka-dev:arm64 in /usr/lib/aarch64-linux-gnu). Where qemu-user is installed, ctest
# runs the test binaries under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

find_program(FERRY_QEMU_AARCH64 qemu-aarch64)
if(FERRY_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FERRY_QEMU_AARCH64})
endif()
