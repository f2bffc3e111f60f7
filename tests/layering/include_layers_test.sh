#!/bin/bash
# Fails when an #include runs against the layering (docs/architecture.md):
#  1. a file under comm/, algorithms/ or compression/ includes a torch header (torch/, c10/,
#     ATen/): only torch_backend/ sees torch;
#  2. a file in comm/ includes communicator.h other than the facade's own users: the
#     facade's implementation (comm/communicator.cc), what is composed on its public API
#     (layer 10: comm/quantized_allreduce, comm/host_groups) and the programs in comm/bench/ and
#     comm/examples/, which use the public API from above;
#  3. a file in comm/ includes a comm/ header of its own layer or above (LAYER below): every
#     include runs down, so there is no circle. foo.cc has foo.h's layer and may include it.
# A new file in comm/ must be added to LAYER.
# Usage (Bazel passes the files): include_layers_test.sh FILE...
set -u

declare -A LAYER=(
  # 0: no comm/ include
  [errors.h]=0 [types.h]=0 [cuda_stream.h]=0 [issue_time.h]=0 [quantized_blocks.h]=0 [float32_packing.h]=0 [transfer_progress.h]=0 [ring_plan.h]=0
  # 1: values and interfaces
  [listen_address.h]=1 [reduce.h]=1 [work.h]=1 [store.h]=1 [options.h]=1 [op_spec.h]=1 [striping.h]=1 [topology.h]=1
  # 2: what the data paths are handed; a collective's fingerprint (encoding, comparison)
  [p2p_op.h]=2 [gloo_util.h]=2 [gloo_call.h]=2 [fingerprint.h]=2
  # 3: the signature check, the rings' shared plan
  [consistency_check.h]=3 [ring_common.h]=3
  # 4: the algorithms; point-to-point's wire format (header, segments) and receive turns
  [eager_collectives.h]=4 [direct_allreduce.h]=4 [ring_allreduce.h]=4 [packed_ring_allreduce.h]=4
  [ring_reduce_scatter.h]=4 [p2p_wire.h]=4 [p2p_turns.h]=4
  # 5: algorithms composed of those (the two-level all-reduce: rings inside and across hosts)
  [hierarchical_allreduce.h]=5
  # 6: the data paths (Gloo collectives, point-to-point, NCCL)
  [gloo_collectives.h]=6 [p2p_exchange.h]=6 [nccl_transport.h]=6
  # 7: the Communicator's parts, one job each
  [argument_checks.h]=7 [failure_state.h]=7 [lanes.h]=7 [peer_health.h]=7 [staged_work.h]=7 [meshes.h]=7
  # 8: what a collective call is (its description and data paths), built on the parts above
  [collective_plan.h]=8
  # 9: the facade
  [communicator.h]=9
  # 10: collectives composed on the facade's public API; groups split from a communicator
  [quantized_allreduce.h]=10 [host_groups.h]=10
  # 11: two-level forms of those, on the groups of host_groups.h
  [hierarchical_quantized_allreduce.h]=11
)
FACADE_USERS_RE='^comm/(communicator\.cc|quantized_allreduce\.(h|cc)|host_groups\.(h|cc)|bench/.*|examples/.*)$'

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

checked=0
for f in "$@"; do
  rel="$f"  # workspace-relative (the test runs at the runfiles' workspace root)
  case "$rel" in comm/* | algorithms/* | compression/*) ;; *) continue ;; esac
  checked=$((checked + 1))
  # The included paths, one sed per file (a process per line made the test take over a minute
  # on a loaded 2-core machine).
  while IFS= read -r inc; do
    case "$inc" in
      torch/* | c10/* | ATen/*) fail "$rel includes torch header <$inc> (only torch_backend/ may)" ;;
    esac
    [[ "$rel" == comm/* ]] || continue
    if [[ "$inc" == comm/communicator.h && ! "$rel" =~ $FACADE_USERS_RE ]]; then
      fail "$rel includes comm/communicator.h (only the facade's users may: comm/communicator.cc, comm/quantized_allreduce, comm/host_groups, comm/bench/, comm/examples/)"
    fi
    # Layers apply to the files of comm/ itself, not to its bench/ and examples/ programs.
    [[ "$rel" =~ ^comm/[^/]+$ && "$inc" =~ ^comm/[^/]+\.h$ ]] || continue
    base="$(basename "$rel")"
    own="${base%.*}.h"
    [[ "comm/$own" == "$inc" ]] && continue
    if [[ -z "${LAYER[$own]+x}" ]]; then
      fail "$rel: comm/$own has no layer in tests/layering/include_layers_test.sh"
      continue
    fi
    target="${inc#comm/}"
    if [[ -z "${LAYER[$target]+x}" ]]; then
      fail "$rel includes $inc, which has no layer in tests/layering/include_layers_test.sh"
    elif ((LAYER[$target] >= LAYER[$own])); then
      fail "$rel (layer ${LAYER[$own]}) includes $inc (layer ${LAYER[$target]}): includes must run down"
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">].*/\1/p' "$f")
done

if ((checked == 0)); then
  echo "FAIL: no file under comm/, algorithms/ or compression/ was given"
  exit 1
fi
echo "checked $checked files, $failures problem(s)"
((failures == 0))
