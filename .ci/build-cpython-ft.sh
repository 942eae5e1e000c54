#!/usr/bin/env bash
# Builds a free-threaded CPython 3.13 (PEP 703, `--disable-gil`) into a prefix, from Debian
# trixie's python3.13 source package (the only 3.13 source Debian's archive serves to this
# bookworm machine; 3.14's answers 404). Used by .ci/freethreaded.sh and by hand:
#
#   .ci/build-cpython-ft.sh [PREFIX]      # default PREFIX: /work/cpython-3.13t
#
# Cache-aware: does nothing when PREFIX/bin/python3.13t already runs with the GIL disabled.
# The build (about 7 minutes with make -j2 on 2 cores) runs under `nice -n 10` so that it
# shares the machine with whatever else runs. Debian's patches are not applied: the upstream
# tarball inside the source package is built as python.org ships it.
# Needs: gcc, make, the -dev packages of openssl, zlib, libffi, bz2, lzma, sqlite3, readline
# (installed with apt-get when missing), network access to deb.debian.org.
set -euo pipefail

prefix=${1:-/work/cpython-3.13t}
python="$prefix/bin/python3.13t"
jobs=${BMQ_FT_JOBS:-$(nproc)}

if [ -x "$python" ] && "$python" -c 'import sys; sys.exit(sys._is_gil_enabled())' 2>/dev/null; then
    echo "[ft-build] $("$python" -VV | head -1) already at $prefix: nothing to build"
    exit 0
fi

# What the build needs for ssl, zlib, ctypes, bz2, lzma, sqlite3 and readline.
missing=()
for pkg in build-essential libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev \
           libsqlite3-dev libreadline-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[ft-build] installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
fi

work=$(mktemp -d -t bmq-cpython-ft.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A private apt configuration: a deb-src line for trixie that leaves the machine's own
# sources and package lists untouched.
mkdir -p "$work/apt/lists/partial" "$work/src"
cat > "$work/apt/sources.list" <<'EOF'
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
EOF
apt_private=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
             -o "Dir::State::Lists=$work/apt/lists" -o "APT::Sandbox::User=root")
echo "[ft-build] fetching python3.13's source package (Debian trixie)"
apt-get "${apt_private[@]}" update -qq
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only -qq python3.13)

tarball=$(ls "$work"/src/python3.13_*.orig.tar.* | head -1)
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -type d -name 'Python-3.13*' | head -1)
echo "[ft-build] building $(basename "$srcdir") --disable-gil into $prefix (make -j$jobs)"

cd "$srcdir"
nice -n 10 ./configure --disable-gil --prefix="$prefix" --with-ensurepip=install >"$work/configure.log" 2>&1 \
    || { tail -40 "$work/configure.log"; exit 1; }
nice -n 10 make -j"$jobs" >"$work/make.log" 2>&1 || { tail -60 "$work/make.log"; exit 1; }
nice -n 10 make install >"$work/install.log" 2>&1 || { tail -40 "$work/install.log"; exit 1; }

"$python" -c 'import sys, ssl, zlib, ctypes, bz2, lzma, sqlite3; assert not sys._is_gil_enabled(), "GIL enabled"'
echo "[ft-build] $("$python" -VV | head -1) installed at $prefix"
