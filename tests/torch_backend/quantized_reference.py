"""The quantized all-reduce (compression/quantized_allreduce.h) computed with torch from its format's
definition: block scale max|x| / Q, round half to even, float32 sums in node order."""
import torch


def round_trip(x, bits, block):
    """Quantize and dequantize a float32 vector block by block (the wire format's values)."""
    q_levels = float(2 ** (bits - 1) - 1)
    out = torch.empty_like(x)
    for start in range(0, x.numel(), block):
        v = x[start:start + block]
        m = v.abs().max()
        if not torch.isfinite(v).all():
            out[start:start + block] = float("nan")
        elif m < 2.0 ** -100:
            out[start:start + block] = 0.0
        else:
            scale = m / q_levels
            inverse = torch.tensor(q_levels, dtype=torch.float32) / m
            q = torch.round(v * inverse).clamp(-q_levels, q_levels)  # torch.round: half to even
            out[start:start + block] = scale * (q + 0.0)             # + 0.0: integers carry no -0
    return out


def reference(inputs, bits, block, average):
    s = round_trip(inputs[0], bits, block)
    for x in inputs[1:]:
        s = s + round_trip(x, bits, block)
    if average:
        s = s / float(len(inputs))
    return round_trip(s, bits, block)
