#!/bin/bash
# Fails when an #include runs against the layering (docs/architecture.md, "The rooms of comm/"):
#  1. a file under comm/, algorithms/ or compression/ includes a torch header (torch/, c10/,
#     ATen/): only torch_backend/ sees torch;
#  2. a room of comm/ includes only what its rule allows (ROOM_MAY_INCLUDE): core/ nothing else
#     of comm/; gloo/ core/; p2p/ core/ and gloo/ (its messages ride Gloo's pairs); nccl/ and
#     sched/ core/;
#     the facade (comm/ itself) every room; comm/examples/ the public surface, comm/bench/ that
#     and gloo/ (the packing codec's benchmark);
#  3. outside comm/ (algorithms/, compression/, torch_backend/), only comm's public surface is
#     included: the facade (comm/communicator.h, comm/cuda_support.h), comm/host_groups.h,
#     comm/core/, comm/sched/ and comm/bench/'s helpers;
#  4. inside comm/ only the facade's own users include comm/communicator.h: its implementation,
#     comm/host_groups (composed on its public API) and the programs in comm/bench/ and
#     comm/examples/;
#  5. within one folder of comm/ every include runs down (LAYER below), so there is no circle.
#     foo.cc has foo.h's layer and may include it.
# A new header in a folder of comm/ must be added to LAYER.
# Usage (Bazel passes the files): include_layers_test.sh FILE...
set -u

# Rule 2: the folders a room's files may include from (comm/<room>/...).
declare -A ROOM_MAY_INCLUDE=(
  [core]="core"
  [gloo]="core gloo"
  [p2p]="core gloo p2p"
  [nccl]="core nccl"
  [sched]="core sched"
  [facade]="core gloo p2p nccl facade"
  [bench]="core gloo facade bench"
  [examples]="core facade"
)
PUBLIC_RE='^comm/(communicator\.h|cuda_support\.h|host_groups\.h|core/[^/]+\.h|sched/[^/]+\.h|bench/[^/]+\.h)$'

# Rule 5: layers within each folder (paths relative to comm/).
declare -A LAYER=(
  # core/: values and interfaces first, then what is built of them
  [core/errors.h]=0 [core/types.h]=0 [core/call_options.h]=0 [core/deadline.h]=0
  [core/transfer_progress.h]=0
  [core/listen_address.h]=1 [core/store.h]=1 [core/options.h]=1 [core/topology.h]=1 [core/work.h]=1
  [core/reduce.h]=1 [core/op_spec.h]=1 [core/p2p_op.h]=1
  # gloo/: plans and Gloo glue, the signature check, the algorithms, the dispatch over them
  [gloo/ring_plan.h]=0 [gloo/float32_packing.h]=0 [gloo/slots.h]=0 [gloo/gloo_error.h]=0
  [gloo/deadline_wait.h]=1 [gloo/posted_buffers.h]=1 [gloo/pair_teardown.h]=1 [gloo/rendezvous.h]=1
  [gloo/striping.h]=1 [gloo/call.h]=1 [gloo/fingerprint.h]=1
  [gloo/consistency_check.h]=2 [gloo/ring_common.h]=2
  [gloo/eager_collectives.h]=3 [gloo/direct_allreduce.h]=3 [gloo/ring_allreduce.h]=3
  [gloo/packed_ring_allreduce.h]=3 [gloo/ring_reduce_scatter.h]=3
  [gloo/hierarchical_allreduce.h]=4
  [gloo/collectives.h]=5
  # p2p/: the wire format and receive turns, then the exchange over them
  [p2p/wire.h]=0 [p2p/turns.h]=0
  [p2p/exchange.h]=1
  # nccl/
  [nccl/nccl_transport.h]=0
  # sched/: the lane and the executor, then how a collective is issued beside them
  [sched/op_lane.h]=0 [sched/callback_executor.h]=0
  [sched/collective_issue.h]=1
  # the facade: the Communicator's parts, the plan of a call, the facade, groups split from it
  [cuda_support.h]=0 [argument_checks.h]=0 [failure_state.h]=0 [lanes.h]=0 [peer_health.h]=0 [staged_work.h]=0 [meshes.h]=0
  [collective_plan.h]=1
  [communicator.h]=2
  [host_groups.h]=3
)
FACADE_USERS_RE='^comm/(communicator\.cc|host_groups\.(h|cc)|bench/.*|examples/.*)$'

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# The room of a path under comm/ (comm/gloo/x.h -> gloo, comm/x.h -> facade).
room_of() {
  local rest="${1#comm/}"
  if [[ "$rest" == */* ]]; then echo "${rest%%/*}"; else echo facade; fi
}

checked=0
for f in "$@"; do
  rel="$f"  # workspace-relative (the test runs at the runfiles' workspace root)
  case "$rel" in comm/* | algorithms/* | compression/* | torch_backend/*) ;; *) continue ;; esac
  checked=$((checked + 1))
  own_room=""
  [[ "$rel" == comm/* ]] && own_room="$(room_of "$rel")"
  # The included paths, one sed per file (a process per line made the test take over a minute
  # on a loaded 2-core machine).
  while IFS= read -r inc; do
    if [[ "$rel" != torch_backend/* ]]; then
      case "$inc" in
        torch/* | c10/* | ATen/*) fail "$rel includes torch header <$inc> (only torch_backend/ may)" ;;
      esac
    fi
    [[ "$inc" == comm/* ]] || continue
    if [[ -z "$own_room" ]]; then  # rule 3
      [[ "$inc" =~ $PUBLIC_RE ]] || fail "$rel includes $inc, inside comm/ (outside comm/ only comm/communicator.h, comm/cuda_support.h, comm/host_groups.h, comm/core/, comm/sched/ and comm/bench/ helpers may be included)"
      continue
    fi
    target_room="$(room_of "$inc")"
    if [[ " ${ROOM_MAY_INCLUDE[$own_room]:-} " != *" $target_room "* ]]; then  # rule 2
      fail "$rel (room $own_room) includes $inc (room $target_room): $own_room/ may include only ${ROOM_MAY_INCLUDE[$own_room]:-nothing}"
      continue
    fi
    if [[ "$inc" == comm/communicator.h && ! "$rel" =~ $FACADE_USERS_RE ]]; then  # rule 4
      fail "$rel includes comm/communicator.h (only the facade's users may: comm/communicator.cc, comm/host_groups, comm/bench/, comm/examples/)"
    fi
    # Rule 5: within one folder, not for the programs of bench/ and examples/.
    [[ "$own_room" == "$target_room" && "$own_room" != bench && "$own_room" != examples ]] || continue
    key="${rel#comm/}"
    own="${key%.*}.h"
    target="${inc#comm/}"
    [[ "$own" == "$target" ]] && continue
    if [[ -z "${LAYER[$own]+x}" ]]; then
      fail "$rel: comm/$own has no layer in tests/layering/include_layers_test.sh"
    elif [[ -z "${LAYER[$target]+x}" ]]; then
      fail "$rel includes $inc, which has no layer in tests/layering/include_layers_test.sh"
    elif ((LAYER[$target] >= LAYER[$own])); then
      fail "$rel (layer ${LAYER[$own]} of $own_room/) includes $inc (layer ${LAYER[$target]}): includes must run down"
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">].*/\1/p' "$f")
done

if ((checked == 0)); then
  echo "FAIL: no file under comm/, algorithms/, compression/ or torch_backend/ was given"
  exit 1
fi
echo "checked $checked files, $failures problem(s)"
((failures == 0))
