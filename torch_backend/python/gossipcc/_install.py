"""What `import gossipcc` does (__init__ calls install()): registers the backend with
torch.distributed under the name "gossipcc" and applies the patches of _torch_patches that this
torch needs at import; the ones that matter only once a gossipcc process group exists are
applied when the first one is created (create_backend)."""
import torch.distributed as dist

from . import _C
from . import _torch_patches
from . import backend as _backend
from . import ddp as _ddp


def create_backend(store, rank, size, timeout):
    """Called by torch.distributed.init_process_group / new_group for backend "gossipcc"."""
    backend = _backend.create(store, rank, size, timeout, _torch_patches.init_started_at())
    _torch_patches.shut_down_on_destroy(_backend.shutdown_group, _backend.shutdown_all)
    _ddp.patch_for_group(backend)
    return backend


def _register():
    name = _backend.BACKEND_NAME
    if name.upper() in dist.Backend.__dict__ or name in getattr(dist.Backend, "backend_list", []):
        return  # already registered (register_backend raises on a second call)
    if _C.TORCH_HAS_BACKEND_CLASS:
        dist.Backend.register_backend(name, create_backend, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(name, create_backend)


def install():
    _torch_patches.apply_at_import()
    _register()
    _ddp.patch_for_policy()  # GOSSIPCC_ALLREDUCE asks for a policy already
