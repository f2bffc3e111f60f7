"""tools/bench/model_shapes.py: the shape generators' totals (ResNet-50's 25,557,032 and GPT-2
small's 124,439,808 parameters), the scaled shapes, DDP's buckets against PyTorch's own
assignment, each method's check failing on a wrong result, and one smoke run (--scale 0.001,
2 trials, 2 local ranks) in which every method ran and was checked."""
import json
import os
import subprocess
import sys

import pytest

import bench_script


def load():
    return bench_script.load("model_shapes")


def test_shape_totals():
    m = load()
    assert sum(m.numel(s) for _, s in m.resnet50_shapes()) == m.RESNET50_PARAMETERS == 25_557_032
    assert sum(m.numel(s) for _, s in m.gpt2_shapes()) == m.GPT2_PARAMETERS == 124_439_808
    names = [n for n, _ in m.resnet50_shapes()]
    assert names[0] == "conv1.weight" and names[-1] == "fc.bias" and len(names) == 161
    assert sum(".conv2.weight" in n for n in names) == 3 + 4 + 6 + 3
    assert sum("downsample.0" in n for n in names) == 4
    g = dict(m.gpt2_shapes())
    assert g["wte.weight"] == (50257, 768) and g["wpe.weight"] == (1024, 768) and len(g) == 2 + 12 * 12 + 2


def test_scaled_shapes_keep_about_the_fraction():
    m = load()
    assert m.scaled_shape((64, 3, 7, 7), 1.0) == (64, 3, 7, 7)
    assert m.scaled_shape((1000,), 0.01) == (10,)
    assert m.scaled_shape((64,), 0.001) == (1,)
    assert m.scaled_shape((2048, 1000), 0.01) == (205, 100)
    for model, total in (("resnet50", 25_557_032), ("gpt2", 124_439_808)):
        scaled = sum(m.numel(s) for _, s in m.model_shapes(model, 0.1))
        assert 0.09 * total < scaled < 0.11 * total


def test_buckets_are_ddps():
    import torch
    import torch.distributed as dist
    m = load()
    for model, scale in (("resnet50", 0.01), ("gpt2", 0.01), ("resnet50", 1.0)):
        shapes = [s for _, s in m.model_shapes(model, scale)]
        cap, first = round(25 * (1 << 20) * scale), round((1 << 20) * scale)
        order = list(reversed(range(len(shapes))))
        torch_buckets, _ = dist._compute_bucket_assignment_by_size(
            [torch.empty(*shapes[i], device="meta") for i in order], [first, cap], [False] * len(shapes))
        assert [[order[j] for j in b] for b in torch_buckets] == m.ddp_buckets(shapes, cap, first)
    layout = m.Layout("resnet50", 1.0, 25)
    assert len(layout.buckets) == 5 and layout.total == 25_557_032
    assert layout.bucket_range[0][0] == 0 and layout.bucket_range[-1][1] == layout.total
    assert layout.buckets[0][0] == len(layout.shapes) - 1  # fc.bias first, as DDP's gradients arrive


def small_reference(n=3):
    m = load()
    layout = m.Layout("resnet50", 0.001, 25)
    return m, layout, m.Reference(layout, n)


def test_exact_and_quantized_checks_fail_on_a_wrong_result():
    import torch
    m, layout, ref = small_reference()
    a, b = layout.bucket_range[1]
    avg = ref.average[a:b].float()
    assert m.check_exact("x", avg.clone(), ref, a, b) <= 1.0
    wrong = avg.clone()
    wrong[5] += 1e-3
    with pytest.raises(m.CheckFailed, match="element 5"):
        m.check_exact("x", wrong, ref, a, b)
    with pytest.raises(m.CheckFailed):  # the sum instead of the average
        m.check_exact("x", ref.sum[a:b].float(), ref, a, b)
    # Quantized: a result off by more than the bound fails, one within it passes.
    bound = m.quantized_bound(ref, 8, a, b)
    assert m.check_quantized("q", (ref.average[a:b] + 0.9 * bound).float(), ref, 8, a, b) <= 1.0
    with pytest.raises(m.CheckFailed):
        m.check_quantized("q", (ref.average[a:b] + 1.5 * bound).float(), ref, 8, a, b)
    # The 4-bit bound is looser than the 8-bit one.
    assert torch.all(m.quantized_bound(ref, 4, a, b) > bound)


def test_powersgd_check_wants_the_projection_of_the_average():
    import torch
    m, layout, ref = small_reference()
    k = next(k for k, b in enumerate(layout.buckets) if any(m.psgd_compressed(layout.shapes[i]) for i in b))
    a0, b0 = layout.bucket_range[k]

    def result(project):
        out = torch.empty(b0 - a0)
        for i in layout.buckets[k]:
            shape = layout.shapes[i]
            a, b = layout.offset[i], layout.offset[i] + m.numel(shape)
            avg = ref.average[a:b]
            if m.psgd_compressed(shape):
                nn, mm = shape[0], m.numel(shape) // shape[0]
                avg = project(avg.view(nn, mm), min(nn, mm, m.PSGD_RANK)).reshape(-1)
            out[a - a0:b - a0] = avg.float()
        return out

    def power_iteration(mat, r):
        q = torch.randn(mat.shape[1], r, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        p, _ = torch.linalg.qr(mat @ q)
        return p @ (p.T @ mat)

    assert m.check_powersgd("psgd", result(power_iteration), ref, layout, k) <= 1.0
    with pytest.raises(m.CheckFailed, match="not of rank"):  # the exact average: full rank
        m.check_powersgd("psgd", result(lambda mat, r: mat), ref, layout, k)
    with pytest.raises(m.CheckFailed, match="not of rank"):  # nothing
        m.check_powersgd("psgd", result(lambda mat, r: 0 * mat), ref, layout, k)
    # Of rank r but not the average's projection: one rank's own matrix projected.
    one_rank = m.rank_data(0, layout.total).double()

    def local(mat, r):
        start = next(layout.offset[i] for i in layout.buckets[k] if m.psgd_compressed(layout.shapes[i])
                     and layout.shapes[i][0] == mat.shape[0] and m.numel(layout.shapes[i]) == mat.numel())
        own = one_rank[start:start + mat.numel()].view_as(mat)
        q = torch.randn(mat.shape[1], r, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        p, _ = torch.linalg.qr(own @ q)
        return p @ (p.T @ own)

    with pytest.raises(m.CheckFailed, match="projection of the float64 average"):
        m.check_powersgd("psgd", result(local), ref, layout, k)


def test_smoke_run_on_two_local_ranks(tmp_path):
    m = load()
    script = os.path.join(bench_script.TOOLS, "bench", "model_shapes.py")
    out = subprocess.run([sys.executable, script, "--network", "local", "--ranks", "2", "--scale", "0.001",
                          "--trials", "2", "--allow-load", "--results-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (d,) = os.listdir(tmp_path)
    with open(tmp_path / d / "results.json") as f:
        doc = json.load(f)
    assert len(doc["trials"]) == 4  # 2 trials per model
    for model in m.MODELS:
        for section, _, methods in m.SECTIONS:
            cell = m.cell_name(model, section)
            summary = doc["summary"]["cells"][cell]
            assert sorted(summary["methods"]) == sorted(methods)
            for method in methods:
                assert summary["methods"][method]["time"]["n"] == 2
                assert 0 <= doc["cells"][cell]["checks"][method] <= 1.0, (cell, method)
            assert cell in out.stdout
    first = [t["order"] for t in doc["trials"] if t["group"] == "resnet50"]
    assert first == [list(m.DDP_METHODS), list(m.DDP_METHODS[1:]) + [m.DDP_METHODS[0]]]


def test_bad_arguments_are_named(tmp_path):
    script = os.path.join(bench_script.TOOLS, "bench", "model_shapes.py")
    for argv, words in ((["--scale", "0"], "--scale"), (["--scale", "1.5"], "--scale"),
                        (["--ranks", "4", "--hosts", "3"], "--ranks N means N hosts of one rank each"),
                        (["--network", "fast"], "network 'fast'"), (["--ranks", "1", "--network", "local"], "2 ranks")):
        out = subprocess.run([sys.executable, script, "--results-dir", str(tmp_path)] + argv, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and words in out.stderr, (argv, out.stderr)
