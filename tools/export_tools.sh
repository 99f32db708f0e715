#!/usr/bin/env bash
# `make export-tools`: the cross toolchain and emulator that rlq.deploy.cortex_m builds and runs policies with.
#
# arm-none-eabi-gcc with newlib (its rdimon semihosting library) compiles an exported policy.c into a
# Cortex-M4 ELF; qemu-system-arm runs it on the emulated mps2-an386 board. All three are Debian packages;
# only those missing are installed.
set -euo pipefail
DEBS="gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"

source "$(dirname "${BASH_SOURCE[0]}")/apt_missing.sh"
# shellcheck disable=SC2086
install_missing export-tools $DEBS
arm-none-eabi-gcc --version | head -n 1
qemu-system-arm --version | head -n 1
