#!/usr/bin/env bash
# `make export-tools`: the cross toolchain and emulator that rlq.deploy.cortex_m builds and runs policies with.
#
# arm-none-eabi-gcc with newlib (its rdimon semihosting library) compiles an exported policy.c into a
# Cortex-M4 ELF; qemu-system-arm runs it on the emulated mps2-an386 board. All three are Debian packages;
# only those missing are installed.
set -euo pipefail
DEBS="gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"

missing=$(for deb in $DEBS; do dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "ok installed" || echo "$deb"; done)
if [ -n "$missing" ]; then
    echo "export-tools: installing Debian packages: $missing"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
arm-none-eabi-gcc --version | head -n 1
qemu-system-arm --version | head -n 1
