"""PowerSGD for DDP through gossipcc's native collective (filled in with the PowerSGD binding)."""


def install_policy_hook(ddp_model, backend):
    raise NotImplementedError("gossipcc: powersgd policy needs the PowerSGD collective")
