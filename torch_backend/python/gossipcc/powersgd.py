"""The "powersgd" allreduce policy: DDP's gradient buckets compressed by gossipcc's native
PowerSGD collective (compression/power_sgd.h), installed on unmodified DDP models.

Each parameter's gradient is compressed with its own shape (as PyTorch's powerSGD_hook does)
and its state (error feedback, warm-started Q, step counter) is keyed by the parameter's
position in the model, not by bucket: DDP rebuilds its buckets after the first iteration,
and keys that follow the parameter keep their state through the rebuild.
"""
import torch
import torch.distributed as dist

from . import _C


class PolicyHookState:
    """State of the policy hook of one DDP model (picklable through state_dict)."""

    def __init__(self, backend, module, options):
        self.backend = backend
        self.powersgd = _C.PowerSGD(options)
        params = list(module.parameters())
        self.param_index = {id(p): i for i, p in enumerate(params)}
        # What each key's gradient looks like: its parameter's shape and dtype.
        self._param_layout = [(tuple(p.shape), str(p.dtype).replace("torch.", "")) for p in params]

    def state_dict(self):
        """{"options", "powersgd"}: every parameter's error feedback, warm-start Q and step count."""
        return {"options": self.powersgd.options, "powersgd": self.powersgd.state_dict()}

    def load_state_dict(self, state):
        """Restores state_dict(). The state must come from a model with the same parameters:
        every saved key ("param<i>") must name a parameter of this model with the saved shape
        and dtype (ValueError naming the first that does not; nothing is loaded then). The
        options must agree in rank and error feedback (the native layer's check)."""
        if not isinstance(state, dict) or "powersgd" not in state:
            raise ValueError("PolicyHookState.load_state_dict: expected the dict state_dict() returns, "
                             "with key 'powersgd'")
        n = len(self._param_layout)
        saved = _C.PowerSGD.checkpoint_tensors(state["powersgd"])
        indices = {}
        for key in saved:  # first the keys (a model with other parameters), then their shapes
            index = int(key[5:]) if key.startswith("param") and key[5:].isdigit() else None
            if index is None or index >= n:
                raise ValueError(f"PolicyHookState.load_state_dict: the state has key {key!r} but this model has "
                                 f"{n} parameters (param0..param{n - 1}): a checkpoint of another model?")
            indices[key] = index
        for key, (shape, dtype, _) in saved.items():
            index = indices[key]
            want_shape, want_dtype = self._param_layout[index]
            if (tuple(shape), dtype) != (want_shape, want_dtype):
                raise ValueError(f"PolicyHookState.load_state_dict: the state's {key} has shape {list(shape)} "
                                 f"{dtype} but this model's parameter {index} has shape {list(want_shape)} "
                                 f"{want_dtype}: a checkpoint of another model?")
        self.powersgd.load_state_dict(state["powersgd"])


def policy_hook(state, bucket):
    """Issues the bucket's compressed all-reduce and returns at once: a future completed by the
    native asynchronous collective (on gossipcc's algorithm lane), so the compression and
    communication of this bucket overlap the rest of the backward pass, as DDP's buckets intend.
    Buckets are issued in DDP's bucket order on every rank, so their collectives pair up."""
    grads = bucket.gradients()
    keys = [f"param{state.param_index[id(p)]}" for p in bucket.parameters()]
    # Gradients are views into the bucket's flat buffer; compressing them in place averages
    # the buffer that DDP copies back into .grad. A non-contiguous view goes through a copy.
    contiguous = [g if g.is_contiguous() else g.contiguous() for g in grads]
    work = state.backend.powersgd_allreduce(contiguous, None, state.powersgd, keys)
    buffer = bucket.buffer()

    def finish(fut):
        fut.value()  # re-raises the collective's error
        for g, c in zip(grads, contiguous):
            if g is not c:
                g.copy_(c)
        return buffer

    return work.get_future().then(finish)


def install_policy_hook(ddp_model, backend):
    options = _C.powersgd_policy_options(backend.allreduce_policy)
    state = PolicyHookState(backend, ddp_model.module, options)
    ddp_model.register_comm_hook(state, policy_hook)
    ddp_model._gossipcc_policy_state = state
    return state
