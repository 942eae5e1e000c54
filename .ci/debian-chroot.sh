#!/usr/bin/env bash
# A Debian chroot with extra packages, made once and reused (a cache: CI on the same machine
# finds it ready), for the interpreters that pyenv does not have (CPython 3.14 from Debian
# testing; an arm64 CPython under qemu-user-static).
#   debian-chroot.sh NAME                          one of the chroots below, in $BMQ_CI_CACHE
#                                                  (default /var/cache/bmq-ci)/debian-NAME
#   debian-chroot.sh DIR SUITE ARCH PACKAGE[,...]  any other
#   debian-chroot.sh --umount DIR                  unmount everything under DIR
# Makes DIR (debootstrap --variant=minbase) unless DIR/.bmq-ready says it holds SUITE/ARCH with
# these PACKAGES, and prepares it for use: the host's CA certificates (downloads go through a
# TLS-inspecting proxy, without them pip fails with CERTIFICATE_VERIFY_FAILED), /proc and a
# tmpfs on /dev/shm (multiprocessing needs it). A foreign ARCH runs its second stage under
# qemu-user-static, whose binfmt handler is enabled here. Prints DIR last.
set -euo pipefail

mounts() {  # the mount points under $1, deepest first
    awk -v root="$(realpath "$1")" '$2 == root || index($2, root "/") == 1 {print $2}' /proc/mounts | sort -r
}
if [ "${1:-}" = "--umount" ]; then
    for point in $(mounts "$2"); do umount -l "$point"; done
    exit 0
fi
cache=${BMQ_CI_CACHE:-/var/cache/bmq-ci}
case "$#:${1:-}" in
    # CPython 3.14 with a compiler (for the sdist), the real broker's libstdc++ and the TLS tests' tools.
    1:testing-amd64) set -- "$cache/debian-$1" testing amd64 \
        python3.14-dev,python3.14-venv,gcc,libc6-dev,libstdc++6,ca-certificates,openssl,stunnel4 ;;
    # aarch64 CPython 3.13 and 3.14 (their headers for the cross-build), no compiler.
    1:testing-arm64) set -- "$cache/debian-$1" testing arm64 \
        python3.13-dev,python3.13-venv,python3.14-dev,python3.14-venv,ca-certificates ;;
    # aarch64 CPython 3.11 (Debian 12), to run the cp311 aarch64 wheel; python3-distutils by name,
    # as debootstrap does not resolve python3.11-venv's virtual python3.11-distutils.
    1:bookworm-arm64) set -- "$cache/debian-$1" bookworm arm64 \
        python3.11-venv,python3-distutils,python3-setuptools-whl,python3-pip-whl,ca-certificates ;;
    4:*) ;;
    *) sed -n '2,15p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
dir=$1 suite=$2 arch=$3 packages=$4
stamp="$suite $arch $packages"

need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "$arch" != "$(dpkg --print-architecture)" ]; then
    command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static binfmt-support)
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "[chroot] installing ${need[*]}"
    # Other CI pieces may be installing packages right now: wait for the lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
fi
if [ "$arch" != "$(dpkg --print-architecture)" ]; then
    [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable "qemu-$(uname -m | sed 's/x86_64/aarch64/')" >/dev/null 2>&1 || true
fi

if [ "$(cat "$dir/.bmq-ready" 2>/dev/null)" != "$stamp" ]; then
    for point in $(mounts "$dir" 2>/dev/null); do umount -l "$point"; done
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    started=$SECONDS
    echo "[chroot] debootstrap $suite ($arch) into $dir: $packages"
    options=(--variant=minbase --arch="$arch" --include="$packages")
    if [ "$arch" = "$(dpkg --print-architecture)" ]; then
        debootstrap "${options[@]}" "$suite" "$dir" >"$dir.log" 2>&1 || { tail -30 "$dir.log"; exit 1; }
    else
        debootstrap "${options[@]}" --foreign "$suite" "$dir" >"$dir.log" 2>&1 || { tail -30 "$dir.log"; exit 1; }
        cp /usr/bin/qemu-aarch64-static "$dir/usr/bin/"
        chroot "$dir" /debootstrap/debootstrap --second-stage >>"$dir.log" 2>&1 || { tail -30 "$dir.log"; exit 1; }
    fi
    echo "$stamp" >"$dir/.bmq-ready"
    echo "[chroot] made in $((SECONDS - started)) s"
fi

if [ -d /usr/local/share/ca-certificates ] && [ -n "$(ls -A /usr/local/share/ca-certificates)" ]; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp -r /usr/local/share/ca-certificates/. "$dir/usr/local/share/ca-certificates/"
    chroot "$dir" update-ca-certificates >/dev/null 2>&1 || echo "[chroot] update-ca-certificates failed in $dir" >&2
fi
# The host's names: bmqbrkr resolves this machine's hostname at start and aborts if it cannot.
for file in resolv.conf hosts hostname; do cp "/etc/$file" "$dir/etc/$file" 2>/dev/null || true; done
mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
mkdir -p "$dir/dev/shm"
mountpoint -q "$dir/dev/shm" || mount -t tmpfs -o mode=1777 shm "$dir/dev/shm"
echo "$dir"
