#!/usr/bin/env bash
# Real full disks: mounts a 64 MiB tmpfs and a 64 MiB loop-mounted ext4 image
# (root only), then runs, on each, full_disk_test (saves fill the disk, fail
# with ENOSPC, keep earlier checkpoints, resume once space returns) and the
# FileSystem conformance suite (every FS x queue combination, so io_uring and
# the thread pool). Exits 77 (ctest: skipped) where it cannot mount.
#   run.sh FULL_DISK_TEST CONFORMANCE_TEST
set -uo pipefail
full_disk_test=$1
conformance_test=$2
if [[ $(id -u) -ne 0 ]]; then echo "full_disk: not root, cannot mount: skipped"; exit 77; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-full-disk.XXXXXX")
mounts=()
loopimg="$work/ext4.img"
cleanup() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/tmpfs" "$work/ext4"
if ! mount -t tmpfs -o size=64m,mode=0755 ckpt-full-disk "$work/tmpfs"; then
  echo "full_disk: cannot mount a tmpfs here: skipped"; exit 77
fi
mounts+=("$work/tmpfs")
targets=("$work/tmpfs")
if truncate -s 64M "$loopimg" && mkfs.ext4 -q -F -m 0 "$loopimg" >/dev/null 2>&1 &&
   mount -o loop "$loopimg" "$work/ext4" 2>/dev/null; then
  mounts+=("$work/ext4")
  targets+=("$work/ext4")
else
  echo "full_disk: no loop device for an ext4 image here; tmpfs only"
fi

status=0
for t in "${targets[@]}"; do
  fstype=$(stat -f -c %T "$t")
  echo "== full_disk_test on $fstype ($t)"
  CKPT_FULL_DISK_DIR="$t" timeout 600 "$full_disk_test" --gtest_brief=1 || status=1
  echo "== file_system_conformance_test on $fstype ($t)"
  mkdir -p "$t/conformance"
  TEST_TMPDIR="$t/conformance" timeout 600 "$conformance_test" --gtest_brief=1 || status=1
  rm -rf "$t/conformance"
done
exit $status
