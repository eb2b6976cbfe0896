#!/usr/bin/env bash
# The whole test suite: installs what is missing, then formatting, lints, and every test
# (unit tests, golden images against e2fsprogs, and the POSIX suite through a real FUSE mount,
# which needs root and /dev/fuse; without them those tests print why they are skipped, except
# under TIDEFS_CI=1, set by .ci/run, where a missing prerequisite fails the test); then the
# POSIX and lifecycle suites again through FUSE over io_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
export PATH="$PATH:/usr/sbin:/sbin"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace
# The POSIX and lifecycle suites once more, every mount served through FUSE over io_uring
# (`-o fuse_uring`): the kernel's switch is turned on for this run and put back after it.
switch=/sys/module/fuse/parameters/enable_uring
if [ -w "$switch" ]; then
    before=$(cat "$switch")
    trap 'echo "$before" > "$switch"' EXIT
    echo Y > "$switch"
    TIDEFS_TEST_FUSE_URING=1 cargo test -p tidefs-cli --test posix --test lifecycle
elif [ "${TIDEFS_CI:-}" = 1 ]; then
    echo "FUSE over io_uring cannot be tested: $switch is missing or not writable" >&2
    exit 1
else
    echo "skipped: the POSIX suite through FUSE over io_uring ($switch is missing or not" \
        "writable: it needs root and Linux 6.14 or later with CONFIG_FUSE_IO_URING)"
fi
