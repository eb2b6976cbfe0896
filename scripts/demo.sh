#!/usr/bin/env bash
# The main job: installs what is missing, builds tidefs (release), installs the mount(8) helper
# /sbin/mount.fuse.tidefs when run as root, then runs `tidefs demo`:
# creates tidefs-demo.img (1 GiB, sparse) if missing, mounts it, runs a short workload,
# prints `tidefs stats`, unmounts, and checks the image with `tidefs fsck -n`.
# Arguments are passed to `tidefs demo` (e.g. --image /var/tmp/x.img --size 2G).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
cargo build --release --quiet
# The mount(8) helper, so that `mount -t fuse.tidefs` and fstab lines work (root only).
if [ "$(id -u)" -eq 0 ]; then
    ./target/release/tidefs install-helper >/dev/null
fi
exec ./target/release/tidefs demo "$@"
