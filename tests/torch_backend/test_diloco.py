"""gossipcc.DiLoCo (torch_backend/python/gossipcc/diloco.py) against references computed here.

- H = 1, outer SGD lr 1 without momentum, exact: equals DDP step for step (to rounding).
- Streaming (fragments, overlap, mix) with outer Nesterov SGD: every rank's parameters after
  every step equal a single-process simulation of all ranks written from the paper's update
  (inner SGD per rank, the outer step and the mixing by hand), to float32 rounding.
- Fragments cover every parameter once, each synchronised once per H steps.
- A checkpoint taken with an averaging in flight resumes bit for bit, for every transport
  (quantized: its error-feedback residuals are in the checkpoint).
- Quantized transport: every rank holds bitwise the same parameters after a synchronisation, close
  to the exact transport's, and the residuals carry what quantization dropped.
- PowerSGD transport at rank 1 (lossy): two outer steps against PowerSGD simulated here (P = M Q,
  normalise, Q = M^T P averaged, P Q^T, error feedback, warm start, which matrices stay exact).
- Bad arguments and ranks that disagree: a ValueError on every rank, naming what differs.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import run_ranks
from wrapper_common import batch, flat_params, gather, init, make_model

import pytest


INNER_LR = 0.1


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def inner_step(model, opt, rank, step):
    opt.zero_grad()
    loss_of(model, rank, step).backward()
    opt.step()


def h1_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    model, ref = make_model(0), make_model(0)
    inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
    outer = torch.optim.SGD(model.parameters(), lr=1.0)
    diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=1)
    ddp = DDP(ref)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=INNER_LR)
    worst = 0.0
    for step in range(6):
        inner_step(model, inner, rank, step)
        diloco.step()
        inner_step(ddp, ddp_opt, rank, step)
        worst = max(worst, (flat_params(model) - flat_params(ref)).abs().max().item())
    dist.destroy_process_group()
    return worst


def test_h1_equals_ddp():
    for worst in run_ranks(h1_worker, 3):
        assert worst < 1e-6, worst


# ---- streaming DiLoCo against a simulation ----------------------------------------------
H, FRAGMENTS, OVERLAP, MIX, OUTER_LR, MOMENTUM, STEPS = 4, 2, 1, 0.25, 0.7, 0.9, 13


def outer_step(fragment, avg, buf, glob, params, mix):
    """The simulations' outer step of one fragment on every rank r: Nesterov SGD (OUTER_LR,
    MOMENTUM) from glob[r] with gradient avg[r], then params[r] <- mix * params + (1 - mix) * glob."""
    for r in range(len(params)):
        for i in fragment:
            g = avg[r][i]
            buf[r][i] = g.clone() if i not in buf[r] else MOMENTUM * buf[r][i] + g
            glob[r][i] = glob[r][i] - OUTER_LR * (g + MOMENTUM * buf[r][i])
            with torch.no_grad():
                params[r][i].copy_(mix * params[r][i] + (1 - mix) * glob[r][i])


def simulate(world_size, transport="exact"):
    """Every rank's flat parameters after every step, from the paper's update, by hand.
    transport "gossip": each rank keeps its own theta_global, and the outer gradient of rank r at
    outer round k is (delta_r + delta_s) / 2 with s = r - 2^(k mod T) (push-sum on the one-peer
    exponential graph, docs/gossip.md: out(i, k) = i + 2^(k mod T), T = floor(log2(n - 1)) + 1,
    half kept, half sent; the weights stay 1)."""
    models = [make_model(0) for _ in range(world_size)]
    opts = [torch.optim.SGD(m.parameters(), lr=INNER_LR) for m in models]
    params = [list(m.parameters()) for m in models]
    n_params = len(params[0])
    # The fragments gossipcc makes for this model (checked separately in test_fragments).
    from gossipcc.diloco import split_fragments
    frags = split_fragments(params[0], FRAGMENTS)
    offsets = [f * H // FRAGMENTS for f in range(FRAGMENTS)]
    period = (world_size - 1).bit_length()  # floor(log2(n - 1)) + 1
    glob = [{i: params[0][i].detach().clone() for i in range(n_params)} for _ in range(world_size)]
    buf = [{} for _ in range(world_size)]  # Nesterov momentum per rank and parameter
    pending = {}  # fragment -> (apply_at, averaged delta per rank and parameter)
    rounds = [0] * FRAGMENTS
    history = []
    for t in range(1, STEPS + 1):
        for r in range(world_size):
            inner_step(models[r], opts[r], r, t - 1)
        for f in sorted(pending):
            if pending[f][0] <= t:
                _, avg = pending.pop(f)
                outer_step(frags[f], avg, buf, glob, params, MIX)
        for f in range(FRAGMENTS):
            if (t + offsets[f]) % H == 0:
                delta = [{i: glob[r][i] - params[r][i].detach() for i in frags[f]} for r in range(world_size)]
                if transport == "exact":
                    mean = {i: sum(d[i] for d in delta) / world_size for i in frags[f]}
                    avg = [mean] * world_size
                else:
                    k = rounds[f] * FRAGMENTS + f
                    shift = 2 ** (k % period)
                    avg = [{i: (delta[r][i] + delta[(r - shift) % world_size][i]) / 2 for i in frags[f]}
                           for r in range(world_size)]
                rounds[f] += 1
                pending[f] = (t + OVERLAP, avg)
        history.append([flat_params(m) for m in models])
    return history


def streaming_worker(rank, world_size, transport="exact"):
    import gossipcc
    init(rank, world_size)
    model = make_model(0)
    inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
    outer = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
    diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=H, fragments=FRAGMENTS, overlap=OVERLAP, mix=MIX,
                             outer_sync=transport)
    history, launches = [], []  # launches: (inner step, fragment) of every synchronisation started
    launch = diloco._launch
    diloco._launch = lambda f: (launches.append((diloco.inner_steps, f)), launch(f))[1]
    for step in range(STEPS):
        inner_step(model, inner, rank, step)
        diloco.step()
        history.append(flat_params(model).tolist())
    dist.destroy_process_group()
    return history, launches, diloco.fragment_params


@pytest.mark.parametrize("transport, world_size", [("exact", 3), ("gossip", 4)])
def test_streaming_matches_simulation(transport, world_size):
    results = run_ranks(streaming_worker, world_size, transport)
    reference = simulate(world_size, transport)
    for rank, (history, launches, fragments) in enumerate(results):
        for t, (got, want) in enumerate(zip(history, reference)):
            diff = (torch.tensor(got) - want[rank]).abs().max().item()
            assert diff < 2e-5, f"{transport}, rank {rank}, after inner step {t + 1}: max |diff| {diff}"
        # What DiLoCo did, observed: every parameter tensor in exactly one fragment; each fragment
        # synchronised once in every window of H consecutive steps, H apart.
        assert sorted(i for f in fragments for i in f) == list(range(len(list(make_model(0).parameters()))))
        for f in range(FRAGMENTS):
            steps = [t for t, g in launches if g == f]
            assert all(b - a == H for a, b in zip(steps, steps[1:])) and steps[0] <= H, (f, steps)
            assert len(steps) == len(range(steps[0], STEPS + 1, H)), (f, steps)
    # The averaging did something: the ranks' parameters moved towards each other.
    assert (torch.tensor(results[0][0][-1]) - torch.tensor(results[1][0][-1])).abs().max() > 0


def test_fragments_cover_every_parameter_and_sync_once_per_h():
    from gossipcc.diloco import split_fragments
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(5)])  # 10 tensors, uneven sizes
    params = list(model.parameters())
    for fragments in range(1, len(params) + 1):
        frags = split_fragments(params, fragments)
        assert len(frags) == fragments and all(frags)
        assert sorted(i for f in frags for i in f) == list(range(len(params)))
    for h in (1, 3, 8):
        for fragments in (1, 2, 3):
            offsets = [f * h // fragments for f in range(fragments)]
            for f in range(fragments):
                syncs = [t for t in range(1, 5 * h + 1) if (t + offsets[f]) % h == 0]
                assert len(syncs) == 5, (h, fragments, f, syncs)


# ---- checkpoint --------------------------------------------------------------------------
def checkpoint_worker(rank, world_size, outer_sync, stop_at):
    import gossipcc
    if not dist.is_initialized():
        init(rank, world_size)

    def make(state=None):
        model = make_model(0)
        inner = torch.optim.SGD(model.parameters(), lr=INNER_LR, momentum=0.5)
        outer = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
        diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=3, fragments=2, overlap=1, mix=0.25,
                                 outer_sync=outer_sync)
        if state is not None:
            model.load_state_dict(state["model"])
            inner.load_state_dict(state["inner"])
            diloco.load_state_dict(state["diloco"])
        return model, inner, diloco

    model, inner, diloco = make()
    for step in range(10):
        inner_step(model, inner, rank, step)
        diloco.step()
    uninterrupted = flat_params(model)

    model, inner, diloco = make()
    saved = None
    for step in range(stop_at):
        inner_step(model, inner, rank, step)
        diloco.step()
    in_flight = len(diloco._pending)
    import copy
    saved = copy.deepcopy({"model": model.state_dict(), "inner": inner.state_dict(), "diloco": diloco.state_dict()})
    del model, inner, diloco
    model, inner, diloco = make(saved)
    for step in range(stop_at, 10):
        inner_step(model, inner, rank, step)
        diloco.step()
    resumed = flat_params(model)
    return torch.equal(uninterrupted, resumed), in_flight


def checkpoint_all_worker(rank, world_size):
    return {t: checkpoint_worker(rank, world_size, t, 6)
            for t in ("exact", "powersgd:rank=2", "gossip", "quantized:bits=8", "quantized:bits=4")}


def test_checkpoint_resumes_bit_for_bit():
    # H = 3, offsets 0 and 1, overlap 1: fragment 0 starts at steps 3, 6, 9, fragment 1 at 2, 5, 8,
    # each applied one step later. Stopped after step 6: fragment 0's averaging is in flight.
    for rank, by_transport in enumerate(run_ranks(checkpoint_all_worker, 2)):
        for transport, (equal, in_flight) in by_transport.items():
            assert equal, f"{transport}, rank {rank}: the resumed run differs from the uninterrupted one"
            assert in_flight == 1, f"{transport}, rank {rank}: {in_flight} averagings in flight at the checkpoint"


# ---- quantized transport ---------------------------------------------------------------------
def quantized_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    finals = {}
    for outer_sync in ("exact", "quantized:bits=8", "quantized:bits=4"):
        model = make_model(0)
        inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
        diloco = gossipcc.DiLoCo(model, inner, sync_every=3, outer_sync=outer_sync)  # mix 0: reset to theta_global
        for step in range(9):
            inner_step(model, inner, rank, step)
            diloco.step()
        finals[outer_sync] = flat_params(model)
        if diloco.transport.residuals is not None:
            finals[outer_sync + " residual"] = max(r.abs().max().item() for r, _ in diloco.transport.residuals)
    # Plain lists back to the test: tensors would travel as shared memory of an exiting process.
    everyone = {k: [t.tolist() for t in gather(v)] for k, v in finals.items() if isinstance(v, torch.Tensor)}
    finals = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in finals.items()}
    dist.destroy_process_group()
    return finals, everyone


def test_quantized_transport_same_bits_everywhere_and_close_to_exact():
    for rank, (finals, everyone) in enumerate(run_ranks(quantized_worker, 3)):
        exact = torch.tensor(finals["exact"])
        for bits, tolerance in ((8, 0.02), (4, 0.3)):
            key = f"quantized:bits={bits}"
            # After the last outer step (step 9) every rank holds theta_global: the same bits.
            for other, theirs in enumerate(everyone[key]):
                assert theirs == everyone[key][0], f"{key}: rank {other} differs from rank 0"
            moved = (exact - make_flat_init()).abs().max().item()
            diff = (torch.tensor(finals[key]) - exact).abs().max().item()
            print(f"{key}: max |quantized - exact| {diff:.3g}, parameters moved {moved:.3g}")
            assert 0 < diff <= tolerance * moved, f"{key}, rank {rank}: {diff} from exact (moved {moved})"
            assert finals[key + " residual"] > 0, f"{key}: no residual kept"


def make_flat_init():
    return flat_params(make_model(0))


# ---- bad input ---------------------------------------------------------------------------
BAD_CASES = {  # case: (DiLoCo arguments on `rank`, words the error must contain)
    "H < 1": (lambda rank: dict(sync_every=0), "sync_every"),
    "P too large": (lambda rank: dict(fragments=5), "fragments"),
    "alpha > 1": (lambda rank: dict(mix=1.5), "mix"),
    "tau >= H": (lambda rank: dict(sync_every=4, overlap=4), "overlap"),
    "unknown transport": (lambda rank: dict(outer_sync="carrier-pigeon"), "unknown outer_sync"),
    "powersgd without rank": (lambda rank: dict(outer_sync="powersgd"), "rank=<r>"),
    "quantized bits 3": (lambda rank: dict(outer_sync="quantized:bits=3"), "bits=8 or bits=4, got '3'"),
    "quantized bits 16": (lambda rank: dict(outer_sync="quantized:bits=16"), "bits=8 or bits=4, got '16'"),
    "quantized without bits": (lambda rank: dict(outer_sync="quantized"), "bits=8 or bits=4"),
    "quantized unknown key": (lambda rank: dict(outer_sync="quantized:bits=8,rank=2"), "unknown key"),
    "quantized bits differ": (lambda rank: dict(outer_sync=f"quantized:bits={8 if rank == 0 else 4}"),
                              "disagree on outer_sync"),
    "H differs": (lambda rank: dict(sync_every=4 + rank), "disagree on sync_every"),
    "P differs": (lambda rank: dict(fragments=1 + rank), "disagree on fragments"),
    "transport differs": (lambda rank: dict(outer_sync="exact" if rank == 0 else "gossip"), "disagree on outer_sync"),
    "params differ": (lambda rank: dict(), "disagree on parameters"),
    # Invalid on one rank only: that rank names its argument, the others name that rank (no one
    # waits for the timeout).
    "H invalid on rank 0 only": (lambda rank: dict(sync_every=0 if rank == 0 else 4),
                                 lambda rank: "sync_every (H) must be" if rank == 0 else "rank(s) [0] passed invalid"),
}


def bad_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    outcomes = {}
    for case, (kwargs, _) in BAD_CASES.items():
        model = make_model(rank if case == "params differ" else 0)
        inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
        before = flat_params(model)
        try:
            gossipcc.DiLoCo(model, inner, **kwargs(rank))
            outcome = "no error"
        except ValueError as e:
            outcome = str(e)
        outcomes[case] = (outcome, torch.equal(before, flat_params(model)))
    dist.destroy_process_group()
    return outcomes


def test_bad_input_is_a_clear_error_on_every_rank():
    for rank, outcomes in enumerate(run_ranks(bad_worker, 2)):
        for case, (outcome, unchanged) in outcomes.items():
            words = BAD_CASES[case][1]
            words = words(rank) if callable(words) else words
            assert words in outcome, f"{case}, rank {rank}: {outcome}"
            assert unchanged, f"{case}, rank {rank}: the model was modified"


# ---- sync(): every rank ends on one model -----------------------------------------------------
# (sync_every, fragments, overlap, mix, inner steps before sync()):
SYNC_CASES = {
    # Fewer inner steps than sync_every: no scheduled synchronisation ever happens; sync() takes
    # the one outer step over all of them.
    "short run": (10, 2, 0, 0.0, 3),
    # H = 4, offsets 0 and 2, overlap 2: fragment 0 launched at 4 and 8 (applied at 6, 10),
    # fragment 1 at 2 and 6 (applied at 4, 8). At step 9 fragment 0's averaging is in flight
    # (sync() applies it), fragment 1 has 3 inner steps since its last synchronisation (sync()
    # takes an outer step over them).
    "mid overlap": (4, 2, 2, 0.25, 9),
}
SYNC_TRANSPORTS = ("exact", "powersgd:rank=32", "quantized:bits=8", "gossip")
SYNC_WORLD = 3


def simulate_sync(world_size, transport, h, fragments, overlap, mix, steps):
    """Every rank's flat parameters after `steps` inner steps and DiLoCo.sync(), from its
    definition, by hand (the schedule as in simulate() above). "powersgd:rank=32" (rank >= every
    matrix's smaller side) and "quantized" average as "exact" does here; "gossip" as there."""
    models = [make_model(0) for _ in range(world_size)]
    opts = [torch.optim.SGD(m.parameters(), lr=INNER_LR) for m in models]
    params = [list(m.parameters()) for m in models]
    from gossipcc.diloco import split_fragments
    frags = split_fragments(params[0], fragments)
    offsets = [f * h // fragments for f in range(fragments)]
    period = (world_size - 1).bit_length()
    glob = [{i: p.detach().clone() for i, p in enumerate(params[0])} for _ in range(world_size)]
    buf = [{} for _ in range(world_size)]
    pending, rounds, last_launch = {}, [0] * fragments, [0] * fragments

    def launch(f, t):
        delta = [{i: glob[r][i] - params[r][i].detach() for i in frags[f]} for r in range(world_size)]
        if transport != "gossip":
            mean = {i: sum(d[i] for d in delta) / world_size for i in frags[f]}
            avg = [mean] * world_size
        else:
            shift = 2 ** ((rounds[f] * fragments + f) % period)
            avg = [{i: (delta[r][i] + delta[(r - shift) % world_size][i]) / 2 for i in frags[f]}
                   for r in range(world_size)]
        rounds[f] += 1
        last_launch[f] = t
        pending[f] = (t + overlap, avg)

    def apply(f):
        _, avg = pending.pop(f)
        outer_step(frags[f], avg, buf, glob, params, mix)

    for t in range(1, steps + 1):
        for r in range(world_size):
            inner_step(models[r], opts[r], r, t - 1)
        for f in sorted(pending):
            if pending[f][0] <= t:
                apply(f)
        for f in range(fragments):
            if (t + offsets[f]) % h == 0:
                launch(f, t)
                if overlap == 0:
                    apply(f)
    before = [flat_params(m) for m in models]
    # sync(): in-flight averagings applied; an outer step over the inner steps not yet sent;
    # parameters <- theta_global (gossip: the ranks' mean of it).
    for f in range(fragments):
        if f in pending:
            apply(f)
        elif last_launch[f] < steps:
            launch(f, steps)
            apply(f)
    final = torch.cat([(sum(glob[r][i] for r in range(world_size)) / world_size if transport == "gossip"
                        else glob[0][i]).reshape(-1) for i in range(len(params[0]))])
    return before, final


def sync_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    out = {}
    for case, (h, fragments, overlap, mix, steps) in SYNC_CASES.items():
        for transport in SYNC_TRANSPORTS:
            model = make_model(0)
            inner = torch.optim.SGD(model.parameters(), lr=INNER_LR)
            outer = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
            diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=h, fragments=fragments, overlap=overlap,
                                     mix=mix, outer_sync=transport)
            for step in range(steps):
                inner_step(model, inner, rank, step)
                diloco.step()
            in_flight = sorted(diloco._pending)
            before = flat_params(model)
            diloco.sync()
            after = flat_params(model)
            out[(case, transport)] = {"in_flight": in_flight, "before": before.tolist(), "after": after.tolist(),
                                      "before_everyone": [t.tolist() for t in gather(before)],
                                      "everyone": [t.tolist() for t in gather(after)]}
            # Training goes on after sync(): the next scheduled synchronisation works as usual.
            inner_step(model, inner, rank, steps)
            diloco.step()
    dist.destroy_process_group()
    return out


def test_sync_ends_every_rank_on_one_model():
    results = run_ranks(sync_worker, SYNC_WORLD)
    for case, (h, fragments, overlap, mix, steps) in SYNC_CASES.items():
        expected_in_flight = [0] if case == "mid overlap" else []
        for transport in SYNC_TRANSPORTS:
            ref_before, ref_final = simulate_sync(SYNC_WORLD, transport, h, fragments, overlap, mix, steps)
            moved = (ref_final - flat_params(make_model(0))).abs().max().item()
            # quantized: 8-bit averages, within ~1/127 of the blocks' largest |delta| per outer step.
            tolerance = 0.02 * moved if transport.startswith("quantized") else 1e-4 if "powersgd" in transport else 2e-5
            for rank, out in enumerate(results):
                got = out[(case, transport)]
                where = f"{case}, {transport}, rank {rank}"
                assert got["in_flight"] == expected_in_flight, where
                # Before sync() the ranks differ (each trained on its own data since its last
                # synchronisation), as the reference says.
                if transport in ("exact", "gossip"):
                    assert (torch.tensor(got["before"]) - ref_before[rank]).abs().max().item() < 2e-5, where
                assert got["before_everyone"][0] != got["before_everyone"][1], f"{where}: ranks equal before sync()"
                # After: bitwise the same on every rank, and the reference's theta_global.
                assert all(theirs == got["everyone"][0] for theirs in got["everyone"]), f"{where}: ranks differ"
                diff = (torch.tensor(got["after"]) - ref_final).abs().max().item()
                assert diff <= tolerance, f"{where}: max |sync() - reference| {diff} (tolerance {tolerance})"


# ---- mistakes caught where they are made -----------------------------------------------------
def _adamw(params):
    return torch.optim.AdamW(params, lr=4e-4)


def _nesterov(params):
    return torch.optim.SGD(params, lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)


MISUSE_CASES = {  # case: (model, inner, outer) from a fresh model -> words the ValueError must contain
    "DDP-wrapped model": (lambda m: (DDP(m), _adamw(m.parameters()), _nesterov(m.parameters())),
                          ["wrapped in DistributedDataParallel", "pass the bare module"]),
    "DDP inside the model": (lambda m: (torch.nn.Sequential(DDP(m)), _adamw(m.parameters()), None),
                             ["submodule '0' is wrapped in DistributedDataParallel"]),
    "inner over another model": (lambda m: (m, _adamw(make_model(0).parameters()), None),
                                 ["inner_optimizer must be constructed over the parameters",
                                  "lacks the model's parameter(s) ['0.weight', '0.bias', '2.weight', '2.bias']",
                                  "4 tensor(s) that are not the model's"]),
    "outer lacks one": (lambda m: (m, _adamw(m.parameters()), _nesterov(list(m.parameters())[:-1])),
                        ["outer_optimizer must be constructed over", "lacks the model's parameter(s) ['2.bias']"]),
    "outer has an extra tensor": (lambda m: (m, _adamw(m.parameters()),
                                             _nesterov(list(m.parameters()) + [torch.zeros(3, requires_grad=True)])),
                                  ["outer_optimizer must be", "1 tensor(s) that are not the model's (shapes [(3,)])"]),
    "inner is outer": (lambda m: (m,) + (_adamw(m.parameters()),) * 2, ["the same object"]),
    "not an optimizer": (lambda m: (m, list(m.parameters()), None), ["inner_optimizer must be a torch.optim.Optimizer"]),
}


def misuse_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    out = {}
    for case, (make, _) in MISUSE_CASES.items():
        model = make_model(0)
        wrapped, inner, outer = make(model)
        try:
            gossipcc.DiLoCo(wrapped, inner, outer, sync_every=2)
            out[case] = "no error"
        except ValueError as e:
            out[case] = str(e)
    # Frozen parameters may be left out of the optimizers (they never change).
    model = make_model(0)
    model[0].bias.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    gossipcc.DiLoCo(model, _adamw(trainable), _nesterov(trainable), sync_every=2)

    # Swapped optimizers: the loop steps the one given as outer_optimizer. Refused at the first
    # DiLoCo.step(), on every rank, before anything is synchronised (sync_every=1: step 1 would).
    model = make_model(0)
    adamw, nesterov = _adamw(model.parameters()), _nesterov(model.parameters())
    diloco = gossipcc.DiLoCo(model, nesterov, adamw, sync_every=1)
    loss_of(model, rank, 0).backward()
    adamw.step()  # the user's inner step, on what DiLoCo was told is the outer optimizer
    try:
        diloco.step()
        out["swapped"] = "no error"
    except ValueError as e:
        out["swapped"] = str(e)
    out["swapped synchronised"] = diloco.outer_steps

    # The right order, with an LR scheduler on each optimizer (they wrap step() too): no complaint
    # (neither DiLoCo's nor a scheduler's warning about step() being overridden or called late).
    import warnings
    warnings.simplefilter("error")
    model = make_model(0)
    inner, outer = _adamw(model.parameters()), _nesterov(model.parameters())
    before = torch.optim.lr_scheduler.StepLR(outer, step_size=1, gamma=0.5)
    diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=2)
    inner_sched = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
    for step in range(4):
        inner_step(model, inner, rank, step)
        inner_sched.step()
        diloco.step()
        if diloco.inner_steps % 2 == 0:
            before.step()
    diloco.sync()
    out["scheduled lrs"] = (inner.param_groups[0]["lr"], outer.param_groups[0]["lr"], diloco.outer_steps)

    # outer_sync is case-insensitive; ranks spelling it differently agree.
    spellings = {}
    for text in ("EXACT" if rank == 0 else "exact", "Gossip", "PowerSGD:Rank=2", "Quantized:Bits=8"):
        model = make_model(0)
        spellings[text] = gossipcc.DiLoCo(model, _adamw(model.parameters()), outer_sync=text).outer_sync
    out["spellings"] = spellings
    dist.destroy_process_group()
    return out


def test_misuse_is_refused_on_every_rank_saying_what_to_do():
    for rank, out in enumerate(run_ranks(misuse_worker, 2)):
        for case, (_, words) in MISUSE_CASES.items():
            for w in words:
                assert w in out[case], f"{case}, rank {rank}: {out[case]}"
        assert "outer_optimizer.step() was called 1 time(s) outside DiLoCo" in out["swapped"], out["swapped"]
        assert "inner_optimizer=<the optimizer your loop steps" in out["swapped"], out["swapped"]
        assert out["swapped synchronised"] == [0], out["swapped synchronised"]
        assert out["scheduled lrs"] == (4e-4 / 16, OUTER_LR / 4, [2]), out["scheduled lrs"]
        first = "EXACT" if rank == 0 else "exact"
        assert out["spellings"] == {first: "exact", "Gossip": "gossip", "PowerSGD:Rank=2": "powersgd:rank=2",
                                    "Quantized:Bits=8": "quantized:bits=8"}, out["spellings"]


# ----------------------------------------------- powersgd below full rank, against a simulation
# outer_sync="powersgd:rank=1,start_iter=0" on 3 ranks, outer SGD at lr 1 (so the applied update
# is the transported average itself), H = 2, two outer steps. Per parameter, viewed as
# n x m = shape[0] x rest: 8x6 and 3x8 are compressed at rank 1 ((n + m) * 1 * 2 < n * m),
# 2x3 is not (10 >= 6) and the biases are 1-D: those are averaged exactly. Simulated here:
# M = delta + error; P = sum_i M_i Q; p = P / |P|; Q' = mean_i M_i^T p; out = p Q'^T;
# error <- M - out; Q' kept (warm start). The first outer step's Q is PowerSGD's own seeded draw,
# so it is checked by what holds for any start (out = p p^T mean(delta), |p| = 1,
# Q' = mean(delta)^T p, error = delta - out); the second starts from the Q and error memory the
# first left (read from the PowerSGD state) and is simulated in full.
PSGD_WORLD, PSGD_H = 3, 2


def psgd_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2))


def psgd_state(blob):
    """{key: (error, q)} from PowerSGD.state_dict()'s bytes (compression/power_sgd_checkpoint.cc)."""
    import struct
    pos = 8

    def pod(fmt):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, blob, pos)
        pos += struct.calcsize(fmt)
        return v

    def floats():
        nonlocal pos
        n = pod("<Q")
        t = torch.tensor(struct.unpack_from(f"<{n}f", blob, pos), dtype=torch.float64)
        pos += 4 * n
        return t

    def string():
        nonlocal pos
        n = pod("<Q")
        pos += n
        return blob[pos - n:pos].decode()

    assert blob[:8] == b"GSPSGD01"
    string()
    out = {}
    for _ in range(pod("<Q")):
        key = string()
        pod("<B")
        dims = pod("<Q")
        [pod("<q") for _ in range(dims)]
        pod("<q")
        error, q = floats(), floats()
        out[key] = (error, q)
    assert pos == len(blob)
    return out


def psgd_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    model = psgd_model()
    params = list(model.parameters())
    inner = torch.optim.SGD(params, lr=0.2)
    diloco = gossipcc.DiLoCo(model, inner, torch.optim.SGD(params, lr=1.0), sync_every=PSGD_H,
                             outer_sync="powersgd:rank=1,start_iter=0")
    records = []  # per outer step: (global before, local before the step, global after, PowerSGD state)
    glob = [p.detach().clone().double() for p in params]
    for step in range(2 * PSGD_H):
        g = torch.Generator().manual_seed(77 + 10 * step + rank)
        x = torch.randn(16, 6, generator=g)
        y = torch.randn(16, 2, generator=g) + rank
        inner.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        inner.step()
        local = [p.detach().clone().double() for p in params]
        diloco.step()
        if (step + 1) % PSGD_H == 0:
            after = [p.detach().clone().double() for p in params]
            records.append((glob, local, after, psgd_state(bytes(diloco.transport.powersgd.state_dict()))))
            glob = after
    dist.destroy_process_group()
    return records


def test_powersgd_rank1_matches_simulation():
    results = run_ranks(psgd_worker, PSGD_WORLD)
    shapes = [tuple(p.shape) for p in psgd_model().parameters()]
    compressed = {0, 2}  # 8x6, 3x8
    tol = 2e-5
    for k in range(2):
        g0 = results[0][k][0]
        for r in range(PSGD_WORLD):  # one theta_global on every rank, before and after
            assert all(torch.equal(a, b) for a, b in zip(results[r][k][0], g0))
            assert all(torch.equal(a, b) for a, b in zip(results[r][k][2], results[0][k][2]))
        state = results[0][k][3]  # Q (and error memory) only for the compressed matrices
        assert sorted(key for key, (_, q) in state.items() if q.numel()) == [f"param{i}" for i in sorted(compressed)]
        for i, shape in enumerate(shapes):
            n = shape[0]
            deltas = [(g0[i] - results[r][k][1][i]).reshape(n, -1) for r in range(PSGD_WORLD)]
            applied = (g0[i] - results[0][k][2][i]).reshape(n, -1)  # outer SGD at lr 1
            mean = sum(deltas) / PSGD_WORLD
            if i not in compressed:
                assert torch.allclose(applied, mean, rtol=0, atol=tol), (k, i, (applied - mean).abs().max())
                continue
            key = f"param{i}"
            errors = [results[r][k][3][key][0].reshape(n, -1) for r in range(PSGD_WORLD)]
            q_after = results[0][k][3][key][1].reshape(-1, 1)
            if k == 0:
                ms = deltas  # no error memory yet
                p = applied @ q_after / (q_after.T @ q_after)
                assert abs(p.norm().item() - 1) < 1e-4, (i, p.norm())
                assert torch.allclose(q_after, mean.T @ p, rtol=0, atol=tol), (i, (q_after - mean.T @ p).abs().max())
                expected = p @ p.T @ mean
            else:
                prev = [results[r][0][3][key] for r in range(PSGD_WORLD)]
                ms = [deltas[r] + prev[r][0].reshape(n, -1) for r in range(PSGD_WORLD)]
                q = prev[0][1].reshape(-1, 1)
                big_p = sum(m @ q for m in ms)
                p = big_p / big_p.norm()
                q_new = sum(m.T @ p for m in ms) / PSGD_WORLD
                assert torch.allclose(q_after, q_new, rtol=0, atol=tol), (i, (q_after - q_new).abs().max())
                expected = p @ q_new.T
            assert torch.allclose(applied, expected, rtol=0, atol=tol), (k, i, (applied - expected).abs().max())
            # Lossy: rank 1 drops a real part of the average (else the comparison proves little).
            assert (expected - sum(ms) / PSGD_WORLD).abs().max() > 100 * tol, (k, i)
            for r in range(PSGD_WORLD):  # error feedback: what this rank's M lost
                assert torch.allclose(errors[r], ms[r] - expected, rtol=0, atol=tol), \
                    (k, i, r, (errors[r] - (ms[r] - expected)).abs().max())
