#!/usr/bin/env bash
# A short coverage-guided fuzz of every target (tests/fuzz/targets.py) with the codec built
# under AddressSanitizer and UndefinedBehaviorSanitizer: ~2 s of fuzzing per target, two at a
# time, under 2 minutes in all once clang and atheris are installed. Installs what it needs
# (Debian's clang and its sanitizer runtimes; the fuzz extra) and exits non-zero on any crash
# or hang. The long run is `python scripts/fuzz.py --seconds 480 --runs 10000000` (docs/security.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v clang-14 >/dev/null 2>&1 || [ ! -d /usr/lib/llvm-14/lib/clang ]; then
    echo "[ci/fuzz] installing clang-14 and its sanitizer runtimes"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev
fi
# The fuzz extra (pyproject.toml), without reinstalling bmq itself.
python -c "import atheris" 2>/dev/null || python -m pip install -q "atheris>=2.3"
python scripts/fuzz.py --target all --seconds "${BMQ_FUZZ_SECONDS:-2}" --jobs 2 --no-leak-check \
    --json "${BMQ_FUZZ_JSON:-/tmp/bmq-fuzz-ci.json}"
