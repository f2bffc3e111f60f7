"""The main job's language-model workload: the data, the model and the methods (lm_job.py runs
them, lm_worker.py is one rank).

Data: the text of Debian's `fortunes` package (/usr/share/games/fortunes, about 2.6 MB of
English quotations, jokes and poems in 43 files; tools/setup.sh installs it). Every file is
split once, at a fixed point: its first 90% of bytes go to the training text, its last 10% to
the validation text (so every category is in both, and no validation byte is ever trained on).
Tokens are bytes (vocabulary 256).

Model: a GPT-style character (byte) model, pure torch: token and position embeddings, `layers`
pre-norm transformer blocks (causal multi-head self-attention, a 4x GELU MLP), a final layer
norm and a linear head. Validation loss: mean cross-entropy (nats per byte) on fixed windows of
the validation text, the same windows for every method and every evaluation.

Methods: every method of the digits job (methods.REGISTRY: DDP on gloo and on gossipcc,
PowerSGD, SGP, OSGP, D-PSGD, AD-PSGD, PyTorch's own alternatives torch-*, the diagnostics) with
the same wrapping, plus the DiLoCo variants of DILOCO below (gossipcc.DiLoCo around an AdamW
inner optimizer) and `torch-diloco` (TorchDiLoCo: DiLoCo in plain torch over gloo). To add a DiLoCo
transport, add a line to DILOCO; one the installed gossipcc rejects (say quantized:bits=4
before the quantized all-reduce exists) is skipped with the package's reason.
"""
import math
import os

import torch
import torch.nn.functional as F

import methods

FORTUNES_DIR = "/usr/share/games/fortunes"
VAL_FRACTION = 0.1
VOCAB = 256


# ---- data -------------------------------------------------------------------------------------
def fortune_files(directory=FORTUNES_DIR):
    """The package's text files, sorted by name: regular files without a dot in their name
    (leaves out the index files *.dat and the *.u8 symbolic links to the texts)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory} not found: the LM workload trains on Debian's `fortunes` package "
                                "(tools/setup.sh installs it; or apt-get install fortunes)")
    names = sorted(n for n in os.listdir(directory)
                   if "." not in n and os.path.isfile(os.path.join(directory, n))
                   and not os.path.islink(os.path.join(directory, n)))
    if not names:
        raise FileNotFoundError(f"{directory} holds no fortune files")
    return [os.path.join(directory, n) for n in names]


def load_text(directory=FORTUNES_DIR, val_fraction=VAL_FRACTION):
    """(train, val): uint8 tensors of bytes; each file's last val_fraction goes to val."""
    train, val = bytearray(), bytearray()
    for path in fortune_files(directory):
        with open(path, "rb") as f:
            data = f.read()
        cut = len(data) - int(len(data) * val_fraction)
        train += data[:cut]
        val += data[cut:]
    return (torch.frombuffer(train, dtype=torch.uint8).clone(),
            torch.frombuffer(val, dtype=torch.uint8).clone())


class Sampler:
    """This rank's training batches: windows of context+1 bytes at random offsets of the training
    text, from a generator seeded by (seed, rank): every rank draws its own windows."""

    def __init__(self, text, context, batch, rank, seed):
        self.text, self.context, self.batch = text.long(), context, batch
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank + 1)

    def next(self):
        starts = torch.randint(0, len(self.text) - self.context - 1, (self.batch,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.context + 1)[None, :]
        w = self.text[idx]
        return w[:, :-1], w[:, 1:]


def val_windows(val, context, count):
    """`count` windows of context+1 bytes spread evenly over the validation text (fixed)."""
    count = max(1, min(count, (len(val) - 1) // context))
    starts = torch.linspace(0, len(val) - context - 1, count).long()
    idx = starts[:, None] + torch.arange(context + 1)[None, :]
    w = val.long()[idx]
    return w[:, :-1], w[:, 1:]


# ---- model ------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, d, heads, context):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)
        # A plain attribute, not a buffer: DDP would broadcast buffers from rank 0 at every forward.
        self.mask = torch.full((context, context), float("-inf")).triu(1)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h)) + self.mask[:t, :t]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    """Byte-level GPT: embeddings, `layers` blocks of width d with `heads` heads, head."""

    def __init__(self, d=128, layers=4, heads=4, context=64):
        super().__init__()
        self.context = context
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList([Block(d, heads, context) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, VOCAB)
        for m in self.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    torch.nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_model(d, layers, heads, context, seed):
    torch.manual_seed(seed)  # the same initial model on every rank
    return GPT(d, layers, heads, context)


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def evaluate(model, windows, chunk=32):
    """Mean cross-entropy (nats per byte) over the validation windows."""
    x, y = windows
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), chunk):
            total += loss_of(model, x[i:i + chunk], y[i:i + chunk]).item() * len(x[i:i + chunk])
    model.train(was_training)
    return total / len(x)


# ---- methods ----------------------------------------------------------------------------------
class DiLoCoMethod:
    """A DiLoCo variant: gossipcc.DiLoCo(module, inner AdamW, outer SGD(lr, momentum 0.9,
    Nesterov), sync_every=H, fragments, overlap, mix, outer_sync). fragments/overlap/mix None:
    the job's --fragments/--overlap/--mix (Streaming DiLoCo's), else fixed."""

    backend = "gossipcc"
    average = None

    def __init__(self, name, description, outer_sync="exact", streaming=False):
        self.name, self.description = name, description
        self.outer_sync, self.streaming = outer_sync, streaming

    def configure(self, gossipcc):
        gossipcc.configure(allreduce="exact")

    def options(self, args):
        if self.streaming:
            return {"sync_every": args.sync_every, "fragments": args.fragments, "overlap": args.overlap,
                    "mix": args.mix, "outer_sync": self.outer_sync}
        return {"sync_every": args.sync_every, "fragments": 1, "overlap": 0, "mix": 0.0,
                "outer_sync": self.outer_sync}


# The DiLoCo variants: (name, description, outer_sync, streaming). One line each.
DILOCO = [
    ("diloco", "DiLoCo: H inner AdamW steps, then the outer step (Nesterov) on the exact average", "exact", False),
    ("streaming-diloco", "Streaming DiLoCo: fragments synchronised in turn, the average in flight for "
     "`overlap` inner steps, mixed in with `mix`; exact", "exact", True),
    ("diloco-powersgd", "DiLoCo, outer gradients through gossipcc's PowerSGD (rank 4)", "powersgd:rank=4", False),
    ("diloco-gossip", "DiLoCo, outer gradients mixed by one push-sum round with one peer (decentralised)",
     "gossip", False),
    ("diloco-q8", "DiLoCo, outer gradients through the quantized all-reduce, 8 bits", "quantized:bits=8", False),
    ("streaming-diloco-q4", "Streaming DiLoCo, outer gradients through the quantized all-reduce, 4 bits",
     "quantized:bits=4", True),
    ("diloco-q4", "DiLoCo, outer gradients through the quantized all-reduce, 4 bits", "quantized:bits=4", False),
]
DILOCO_METHODS = {name: DiLoCoMethod(name, desc, sync, streaming) for name, desc, sync, streaming in DILOCO}

class TorchDiLoCo:
    """DiLoCo in plain torch over the process group's all-reduce, as torchft's DiLoCo and the
    paper's reference do, independent of gossipcc.DiLoCo: the loop steps the inner optimizer;
    step() counts inner steps and every `sync_every` of them
      1. delta = theta_global - theta_local for every parameter (theta_global: the parameters
         at the last synchronisation, kept here), all of them in one flat tensor;
      2. one all-reduce (sum) of it, divided by the group's size;
      3. the parameters are reset to theta_global, their .grad set to the averaged delta, and
         `outer` (an optimizer over the module's parameters) steps once;
      4. theta_global <- the parameters.
    Every rank ends a synchronisation with the same parameters."""

    def __init__(self, module, outer, sync_every, group=None):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.outer, self.sync_every, self.group = outer, sync_every, group
        self.saved = [p.detach().clone() for p in self.params]
        self.inner_steps = 0

    def step(self):
        import torch.distributed as dist
        self.inner_steps += 1
        if self.inner_steps % self.sync_every:
            return
        with torch.no_grad():
            flat = torch.cat([(g - p).reshape(-1) for p, g in zip(self.params, self.saved)])
            dist.all_reduce(flat, group=self.group)
            flat /= dist.get_world_size(self.group)
            offset = 0
            for p, g in zip(self.params, self.saved):
                p.copy_(g)
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        self.outer.step()
        with torch.no_grad():
            for p, g in zip(self.params, self.saved):
                g.copy_(p)
                p.grad = None  # the outer gradient is not the next inner step's


class TorchDiLoCoMethod:
    """The `torch-diloco` baseline: TorchDiLoCo on backend gloo, inner AdamW, outer SGD (the
    job's --outer-lr, momentum 0.9, Nesterov), H = the job's --sync-every."""

    backend = "gloo"
    average = None
    name = "torch-diloco"
    description = ("DiLoCo in plain torch over gloo's all-reduce (torchft's way): H inner AdamW steps, then "
                   "an outer Nesterov step on the averaged parameter delta")

    def configure(self, gossipcc):
        pass

    def options(self, args):
        return {"sync_every": args.sync_every, "outer_lr": args.outer_lr}


TORCH_DILOCO = TorchDiLoCoMethod()

# What `--methods all` runs, in this order: the no-communication reference, DDP on gloo and
# PyTorch's own alternatives (fp16 compression, PowerSGD, post-local SGD, DiLoCo in plain torch),
# every method of the project, then the DiLoCo variants.
ALL = ["diag-compute", "allreduce-gloo", "torch-fp16", "torch-powersgd-r2", "torch-postlocal", "torch-diloco",
       "allreduce", "powersgd-r2", "sgp", "osgp", "dpsgd", "adpsgd"] + [name for name, *_ in DILOCO]


def resolve(name):
    """A method by name: a DiLoCo variant, torch-diloco, or one of methods.REGISTRY."""
    if name in DILOCO_METHODS:
        return DILOCO_METHODS[name]
    if name == TORCH_DILOCO.name:
        return TORCH_DILOCO
    if name in methods.REGISTRY:
        return methods.REGISTRY[name]
    raise ValueError(f"unknown method {name!r}; known: {', '.join(known())}")


def known():
    return list(DILOCO_METHODS) + [TORCH_DILOCO.name] + [n for n in methods.REGISTRY if n not in DILOCO_METHODS]


def has_outer_lr(method):
    """Whether the method has an outer learning rate (the DiLoCo variants, torch-diloco)."""
    return isinstance(method, (DiLoCoMethod, TorchDiLoCoMethod))


def names(spec):
    """"all" or a comma list -> list of names (ValueError naming an unknown one)."""
    if spec == "all":
        return list(ALL)
    out = [n.strip() for n in spec.split(",") if n.strip()]
    for n in out:
        resolve(n)
    return out


def unsupported_reason(method):
    """Why the installed gossipcc rejects this method's DiLoCo transport, or None (also None for
    methods that are not DiLoCo, or when the package cannot be asked)."""
    if not isinstance(method, DiLoCoMethod):
        return None
    try:
        from gossipcc import outer_sync
    except Exception as e:  # noqa: BLE001 - the worker will say it again
        return f"gossipcc cannot be imported ({e})"
    parse = getattr(outer_sync, "parse", None)
    if parse is None:
        return None
    try:
        parse(method.outer_sync)
    except ValueError as e:
        return str(e)
    return None
