#!/usr/bin/env bash
# Installs what tidefs needs to build, run and test on Debian/Ubuntu: FUSE 3, e2fsprogs (mke2fs,
# e2fsck), fuse2fs (a peer for comparisons), postmark (for `tidefs bench postmark`), pkg-config,
# a C toolchain for linking, for SQLite's C source (`tidefs bench sqlite`) and for mimalloc (the
# `tidefs` binary's allocator), and Rust (via
# rustup when reachable, else Debian's cargo). Quiet unless something fails. Safe to run again.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v mke2fs >/dev/null 2>&1 || [ -x /sbin/mke2fs ] || [ -x /usr/sbin/mke2fs ] || need_apt+=(e2fsprogs)
command -v fuse2fs >/dev/null 2>&1 || [ -x /sbin/fuse2fs ] || [ -x /usr/sbin/fuse2fs ] || need_apt+=(fuse2fs)
command -v postmark >/dev/null 2>&1 || need_apt+=(postmark)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v setfattr >/dev/null 2>&1 || need_apt+=(attr)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v losetup >/dev/null 2>&1 || [ -x /sbin/losetup ] || [ -x /usr/sbin/losetup ] || need_apt+=(mount)
command -v curl >/dev/null 2>&1 || command -v cargo >/dev/null 2>&1 || need_apt+=(curl ca-certificates)

if [ "${#need_apt[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-deps: missing ${need_apt[*]} and apt-get is not available; install them by hand" >&2
        exit 1
    fi
    echo "install-deps: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The FUSE device: load the module if it is not there yet (needs root; harmless if built in).
if [ ! -e /dev/fuse ]; then
    $SUDO modprobe fuse 2>/dev/null || true
fi

# Rust: rustup's stable toolchain if cargo is missing; Debian's cargo when rustup is unreachable.
if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: installing Rust"
    if curl --proto '=https' --tlsv1.2 -sSf --max-time 60 https://sh.rustup.rs -o /tmp/rustup-init.sh 2>/dev/null \
        && sh /tmp/rustup-init.sh -y -q --profile minimal --component rustfmt,clippy >/dev/null 2>&1; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    else
        echo "install-deps: rustup unreachable; installing Debian's cargo (tidefs needs Rust >= 1.85)"
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get update -qq >/dev/null
        $SUDO apt-get install -y -qq --no-install-recommends cargo rustc rustfmt rust-clippy >/dev/null \
            || $SUDO apt-get install -y -qq --no-install-recommends cargo rustc >/dev/null
    fi
fi
if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
