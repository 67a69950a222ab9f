#!/usr/bin/env bash
# Fails when a release build of tessera's examples (and the train_step bench)
# contains out-of-line `core::core_arch` functions: SIMD intrinsics compiled
# as calls because the code using them was not inlined into a
# `#[target_feature]` function (a closure, or a function passed as `impl Fn`,
# compiled without the caller's features). Each such call costs more than the
# one instruction it wraps; see tensor/src/simd/kernels.rs.
#
# Not part of .ci/run: a release build of the examples takes about as long as
# CI's whole test build. Run it after touching SIMD code:
#   scripts/check_inlined_intrinsics.sh            # builds, then checks
#   scripts/check_inlined_intrinsics.sh --no-build # checks the existing build
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != "--no-build" ]; then
  cargo build --release --examples --quiet
  cargo bench --bench train_step --no-run --quiet
fi

bins=$(find target/release/examples target/release/deps -maxdepth 1 -type f -perm -u+x \
  ! -name '*.so' ! -name '*.d' 2>/dev/null | grep -v -- '-[0-9a-f]*\.[a-z]*$' || true)
if [ -z "$bins" ]; then
  echo "check_inlined_intrinsics: no release binaries under target/release" >&2
  exit 2
fi
status=0
for b in $bins; do
  # Defined text symbols only: `nm -C --defined-only`, kept when the
  # demangled name is a core::arch intrinsic. CPU feature detection in the
  # precompiled std (cpuid, xgetbv) is not ours and is called once.
  found=$(nm -C --defined-only "$b" 2>/dev/null | grep -E ' [tTwW] .*core::core_arch::' \
    | grep -v -E '::(_xgetbv|__cpuid|__cpuid_count|has_cpuid)' || true)
  if [ -n "$found" ]; then
    echo "$b: out-of-line SIMD intrinsics:"
    echo "$found" | sed 's/^[0-9a-f]* [tTwW] /  /' | sort | uniq -c | sort -rn | head -40
    status=1
  fi
done
if [ "$status" = 0 ]; then
  echo "check_inlined_intrinsics: no out-of-line core::core_arch intrinsics in $(echo "$bins" | wc -w) binaries"
fi
exit "$status"
