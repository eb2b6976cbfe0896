#!/usr/bin/env bash
# The whole test suite: installs what is missing, then formatting, lints, and every test
# (unit tests, golden images against e2fsprogs, and the POSIX suite through a real FUSE mount,
# which needs root and /dev/fuse; without them those tests print why they are skipped, except
# under TIDEFS_CI=1, set by .ci/run, where a missing prerequisite fails the test).
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
