#!/usr/bin/env bash
# Checks that gossipcc's installed extension (gossipcc/_C*.so) is self-contained: it links Gloo
# and Abseil statically and privately (the wheel, tools/pep517), so that it loads no libgloo or
# libabsl of its own next to torch's Gloo, and exports none of their symbols.
#   tools/extension_isolation_check.sh PATH/TO/_C.cpython-311-x86_64-linux-gnu.so
# Fails (exit 1, saying what it found) when
#   - the extension itself needs (DT_NEEDED) a libgloo or libabsl;
#   - ldd of the extension names a libgloo or libabsl that torch's own libraries do not bring:
#     Debian's libtorch_cpu.so links Debian's shared libgloo (pip's torch bundles Gloo
#     statically), so under Debian's torch ldd names libgloo.so.0 through torch; that one is
#     torch's, reported and allowed;
#   - nm -D --defined-only -C lists a gloo:: or absl:: symbol (the extension would export them).
# Used by tools/wheel_test.sh on the installed wheel.
set -euo pipefail
ext=${1:?usage: $0 EXTENSION.so}
[ -f "$ext" ] || { echo "isolation check: no file $ext" >&2; exit 1; }
PATTERN='lib(gloo|absl)[^ ]*\.so'
failed=0
fail() { echo "isolation check FAILED: $*" >&2; failed=1; }

needed=$(readelf -d "$ext" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
own=$(grep -E "^$PATTERN" <<<"$needed" || true)
if [ -n "$own" ]; then
  fail "$(basename "$ext") itself needs (DT_NEEDED) $(echo $own | tr ' ' ',')"
fi

ldd_out=$(ldd "$ext")
libs() { grep -oE "^[[:space:]]*$PATTERN[^ ]*" | sed 's/^[[:space:]]*//' | sort -u | tr '\n' ' '; }
found=$(libs <<<"$ldd_out" || true)
via_torch=""
for lib in $(awk '$1 ~ /^lib(torch|c10)/ && $3 ~ /^\// {print $3}' <<<"$ldd_out"); do
  via_torch+=" $(ldd "$lib" | libs || true)"
done
stray=""
for lib in $found; do
  grep -qw -- "$lib" <<<"$via_torch" || stray+=" $lib"
done
if [ -n "$stray" ]; then
  fail "ldd $(basename "$ext") names$stray, which torch's libraries do not load (the extension brings them)"
fi

exported=$(nm -D --defined-only -C "$ext" | grep -E '(^|[^[:alnum:]_:])(gloo|absl)::' || true)
if [ -n "$exported" ]; then
  fail "nm -D --defined-only exports $(wc -l <<<"$exported") gloo::/absl:: symbols, e.g.:"
  head -n 5 <<<"$exported" | sed 's/^/    /' >&2
fi

[ "$failed" -eq 0 ] || exit 1
echo "   isolation: $(basename "$ext") needs no libgloo/libabsl (DT_NEEDED: $(echo $needed | tr ' ' ','))"
if [ -n "$found" ]; then
  echo "   isolation: ldd names only torch's own:$(for l in $found; do printf ' %s' "$l"; done) (through torch's libraries, not the extension)"
else
  echo "   isolation: ldd names no libgloo/libabsl"
fi
echo "   isolation: nm -D --defined-only: $(nm -D --defined-only "$ext" | wc -l) symbols, no gloo:: or absl::"
