"""Sharded models on backend "gossipcc", CPU, side by side with gloo: FullyShardedDataParallel
(FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD) and fully_shard (FSDP2) on a 1-D and a 2-D
DeviceMesh train the same model on the same data for a few steps, with gradient accumulation,
on each backend; every loss and the final parameters equal gloo's at rounding level (the
largest difference is printed). Each run also saves its sharded state dict with
torch.distributed.checkpoint to a directory and loads it into a freshly initialised model,
which must then hold exactly the trained parameters.

torch 1.13 (Python 3.11) and torch 2.6 cannot run these on CPU on any backend (their reasons in
SKIP_REASON); the tests skip there."""
import contextlib
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from launcher import init_method, run_ranks

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
SKIP_REASON = None
if TORCH < (2, 0):
    SKIP_REASON = ("torch 1.13 under Python 3.11: importing FSDP fails inside torch (a dataclass with a "
                   "mutable default, TensorProperties), on gloo as on every backend")
elif TORCH < (2, 14):
    SKIP_REASON = (f"torch {torch.__version__}: FullyShardedDataParallel asks for a non-CPU accelerator and "
                   "fully_shard fails on CPU inside torch ('Stream' object has no attribute 'record_event'), "
                   "on gloo as on every backend; these tests run on torch 2.14 (tools/in_forky.sh)")
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")

STEPS = 3
MICRO = 2  # micro-batches per step: the first without gradient synchronisation
TOLERANCE = 1e-5  # float32 sums in another order: differences of a few ulps


def _init(rank, world_size, backend):
    if backend == "gossipcc":
        import gossipcc  # noqa: F401 - registers the backend
    dist.init_process_group(backend, init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4))


def _batch(rank, step, micro):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _train(model, rank, no_sync):
    """STEPS steps of MICRO micro-batches; `no_sync()` wraps the ones that skip synchronisation."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        for micro in range(MICRO):
            x, y = _batch(rank, step, micro)
            with no_sync() if micro < MICRO - 1 else contextlib.nullcontext():
                loss = F.mse_loss(model(x), y)
                loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def fsdp1_worker(rank, world_size, backend, strategy, checkpoint_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import FullStateDictConfig, ShardingStrategy, StateDictType
    import torch.distributed.checkpoint as dcp

    _init(rank, world_size, backend)
    kwargs = dict(sharding_strategy=getattr(ShardingStrategy, strategy), device_id=torch.device("cpu"),
                  use_orig_params=True)
    if strategy == "HYBRID_SHARD":  # shard inside pairs of ranks, replicate across them
        kwargs["device_mesh"] = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("replicate", "shard"))
    model = FSDP(_model(0), **kwargs)
    losses = _train(model, rank, model.no_sync)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)):
        trained = {k: v.clone() for k, v in model.state_dict().items()}
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(checkpoint_dir, backend))
    fresh = FSDP(_model(1), **kwargs)
    with FSDP.state_dict_type(fresh, StateDictType.SHARDED_STATE_DICT):
        state = {"model": fresh.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(checkpoint_dir, backend))
        fresh.load_state_dict(state["model"])
    with FSDP.state_dict_type(fresh, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)):
        loaded = fresh.state_dict()
    reloaded_equal = all(torch.equal(loaded[k], trained[k]) for k in trained)
    dist.barrier()
    dist.destroy_process_group()
    return losses, trained, reloaded_equal


def fsdp2_worker(rank, world_size, backend, mesh_shape, reshard_after_forward, checkpoint_dir):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed.checkpoint as dcp

    _init(rank, world_size, backend)
    names = ("shard",) if len(mesh_shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)

    def shard(model):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)

    model = shard(_model(0))

    @contextlib.contextmanager
    def no_sync():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    losses = _train(model, rank, no_sync)
    trained = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    path = os.path.join(checkpoint_dir, backend)
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
    fresh = shard(_model(1))
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(fresh, state["model"])
    loaded = {k: v.full_tensor() for k, v in fresh.state_dict().items()}
    reloaded_equal = all(torch.equal(loaded[k], trained[k]) for k in trained)
    dist.barrier()
    dist.destroy_process_group()
    return losses, trained, reloaded_equal


def _compare(what, worker, world_size, tmp_path, *args):
    runs = {backend: run_ranks(worker, world_size, backend, *args, str(tmp_path), timeout=600)
            for backend in ("gloo", "gossipcc")}
    worst = 0.0
    for rank in range(world_size):
        (g_losses, g_params, g_reload), (c_losses, c_params, c_reload) = runs["gloo"][rank], runs["gossipcc"][rank]
        assert g_reload, f"{what}: gloo's checkpoint did not load back on rank {rank}"
        assert c_reload, f"{what}: gossipcc's checkpoint did not load back the trained parameters on rank {rank}"
        assert len(c_losses) == len(g_losses) == STEPS * MICRO
        worst = max(worst, max(abs(a - b) for a, b in zip(c_losses, g_losses)))
        assert sorted(c_params) == sorted(g_params), f"{what}: parameter names differ"
        for name in g_params:
            assert c_params[name].shape == g_params[name].shape, f"{what}: {name} shape"
            worst = max(worst, (c_params[name] - g_params[name]).abs().max().item())
    print(f"{what}: largest difference from gloo (losses and parameters, every rank): {worst:.3g}")
    assert worst <= TOLERANCE, f"{what}: gossipcc differs from gloo by {worst:.3g} (> {TOLERANCE})"
    initial = _model(0).state_dict()
    assert sorted(initial) == sorted(runs["gloo"][0][1]), f"{what}: unexpected parameter names"
    assert all(not torch.equal(runs["gloo"][0][1][k], initial[k]) for k in initial), \
        f"{what}: training left a parameter unchanged"


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp_strategies_equal_gloo(strategy, tmp_path):
    _compare(f"FSDP {strategy}, 2 ranks", fsdp1_worker, 2, tmp_path, strategy)


def test_fsdp_hybrid_shard_equals_gloo(tmp_path):
    _compare("FSDP HYBRID_SHARD, 2 x 2 ranks", fsdp1_worker, 4, tmp_path, "HYBRID_SHARD")


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_fully_shard_1d_mesh_equals_gloo(reshard_after_forward, tmp_path):
    _compare(f"fully_shard, 1-D mesh of 2, reshard_after_forward={reshard_after_forward}", fsdp2_worker, 2,
             tmp_path, (2,), reshard_after_forward)


def test_fully_shard_2d_mesh_equals_gloo(tmp_path):
    _compare("fully_shard, 2-D mesh (replicate 2 x shard 2)", fsdp2_worker, 4, tmp_path, (2, 2), True)
