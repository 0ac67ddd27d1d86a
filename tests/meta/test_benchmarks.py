"""The benchmark harness on toy inputs, so that it keeps working; no timing is asserted."""

import json
import os
import re
import time

import pytest
from tests import ROOT
from tests.conftest import TINY

from benchmarks import cases, impls, report, timing


def _run_step(task):
    step, items, info = impls.build(dict(backend="any", impl="keras_vit", task=task, model=TINY, batch=2), "cpu")
    step()
    assert items == 2 and info is None


def test_keras_vit_inference_step_runs_on_this_backend():
    _run_step("infer")


@pytest.mark.slow  # compiles a training step with XLA: tens of seconds on a busy 2-core machine
def test_keras_vit_train_step_runs_on_this_backend():
    _run_step("train")


def test_timing_warms_up_then_alternates_reversing_each_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = timing.samples(fns, 3, warmup=2)
    assert "".join(calls) == "aabbcc" + "abc" + "cba" + "abc"  # two warm-up calls each, then A B C, C B A, ...
    assert {name: len(t) for name, t in times.items()} == dict.fromkeys("abc", 3)
    assert all(s >= 0 for t in times.values() for s in t)
    medians = timing.alternate({"a": lambda: None}, 5, warmup=0)
    assert list(medians) == ["a"] and medians["a"] >= 0


def _cand(spec, times, items=16):
    return dict(spec=spec, label=cases.label(spec), flops=cases.step_flops(spec), times=times,
                setup=dict(ok=True, items=items), peak_rss_mb=100.0)


def test_report_ratios_and_targets(tmp_path):
    s16 = cases.preset("ViT-S/16")
    ours = dict(backend="jax", impl="keras_vit", task="infer", model=s16, batch=16, dtype="float32")
    timm = dict(ours, backend="torch", impl="timm")
    gemm = dict(backend="torch", impl="gemm", dtype="float32", repeat=1)
    load = dict(loadavg_1m=1.0, busy_processes=[])
    results = [
        dict(name="matmul peak", kind="peak", candidates=[_cand(gemm, [2 * 2048**3 / 200e9, 1.0], 1)],
             load_before=load, load_after=load),
        dict(name="infer ViT-S/16 224 b16 fp32", kind="throughput", load_before=load, load_after=load,
             candidates=[_cand(ours, [1.0, 1.0, 3.0]), _cand(timm, [2.0, 2.0, 2.0])]),
    ]
    meta = dict(mode="toy", device="cpu", reps=3, warmup=1, wall_s=1.0, cpu="x", cores=2, date="d", command="c")
    text = report.write(results, meta, str(tmp_path))
    goals = {g["target"]: g for g in report.targets(results, report.peaks(results))}
    assert goals["fp32 ViT-S/16: best keras_vit / best timm"]["value"] == pytest.approx(2.0)
    gflops = 2 * keras_vit_macs(s16) * 16 / 1e9
    assert goals["fp32 ViT-S/16: share of matmul peak"]["value"] == pytest.approx(gflops / 200, rel=1e-6)
    assert "2.00x" in text and (tmp_path / "toy.png").exists() and (tmp_path / "toy.json").exists()


def keras_vit_macs(config):
    import keras_vit

    return keras_vit.model_macs(config)["total"]


def test_page_block_is_rendered_between_the_markers(tmp_path):
    s16 = cases.preset("ViT-S/16")
    ours = dict(backend="tensorflow", impl="keras_vit", task="infer", model=s16, batch=16, dtype="float32")
    hub = dict(ours, impl="keras_hub")
    load = dict(loadavg_1m=0.5, busy_processes=[])
    results = [dict(name="infer ViT-S/16 224 b16 fp32", kind="throughput", load_before=load, load_after=load,
                    candidates=[_cand(ours, [1.0, 1.0, 1.0]), _cand(hub, [2.0, 2.0, 2.0])])]
    meta = dict(mode="toy", device="cpu", reps=3, warmup=1, wall_s=60.0, cpu="x", cores=2, date="d", command="c")
    report.write(results, meta, str(tmp_path))
    record = json.loads((tmp_path / "toy.json").read_text())
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(f"intro\n{report.PAGE_BEGIN}\nold figures\n{report.PAGE_END}\noutro\n")
    report.update_page(str(page), record, str(tmp_path / "toy.json"))
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old figures" not in text
    assert "| keras_vit (tensorflow) | **16.0** |" in text and "| keras_hub (tensorflow) | 8.0 |" in text
    assert "[`toy.json`](../toy.json)" in text  # linked relative to the page
    # The targets stay in the run's own report, not on the page.
    assert "best keras_vit / best keras-hub" not in text and "| 2 | >= 1.1 | yes |" in (tmp_path / "toy.md").read_text()
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="must hold <!-- benchmarks:begin -->"):
        report.update_page(str(page), record, str(tmp_path / "toy.json"))


def test_the_performance_page_block_is_the_committed_full_run():
    """docs/performance.md's figures are exactly what `benchmarks.report` renders from the committed run."""
    with open(os.path.join(ROOT, "benchmarks", "results", "full.json")) as f:
        block = report.page_block(json.load(f), "../benchmarks/results/full.json")
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        assert block in f.read()


def test_jax_profile_counts_overlapping_operations_once():
    from benchmarks.studies import jax_profile

    spans = [dict(ts=0, dur=10), dict(ts=5, dur=10), dict(ts=30, dur=5), dict(ts=31, dur=2)]  # microseconds
    assert jax_profile._covered(spans) == pytest.approx(20e-6)  # [0, 15) and [30, 35)
    assert jax_profile._covered([]) == 0.0


def test_hlo_names_each_operation_and_its_keras_layer():
    import jax
    import jax.numpy as jnp

    from benchmarks import hlo as hlo_text

    def loss(w, x):
        with jax.named_scope("encoder"), jax.named_scope("block_3"), jax.named_scope("fc1"):
            return jnp.sum(jnp.tanh(x @ w))  # (8, 16) x (16, 32) -> (8, 32)

    args = jnp.ones((16, 32)), jnp.ones((8, 16))
    hlo = hlo_text.parse_hlo(jax.jit(jax.grad(loss)).lower(*args).compile().as_text())
    ops = [name for name, h in hlo.items() if name and h["computation"].startswith("main")]
    dots = [n for n in ops if hlo_text.kind(hlo, n).startswith("dot f32")]
    assert dots, [(n, hlo_text.kind(hlo, n)) for n in ops]
    for name in dots:  # the forward product and the gradient's, named by their scope
        assert re.match(r"^(fwd|bwd) block_3/fc1: ", hlo_text.describe(hlo, name)), hlo_text.describe(hlo, name)
    assert hlo_text._phase_and_path("jit(train_step)/transpose(jvp(encoder))/block_1/attn/vmap()/div") == (
        "bwd", "block_1/attn", "div")
    assert hlo_text._phase_and_path("jit(train_step)/adam_w/mul") == ("", "adam_w", "mul")


@pytest.mark.parametrize("flags", [["--quick"], ["--only", "train"]])
def test_the_page_is_only_rewritten_by_a_full_run(flags, capsys):
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.main(flags + ["--page", "docs/performance.md"])
    assert "--page rewrites the docs' table of the full run" in capsys.readouterr().err


def test_the_recorded_command_names_no_machine_paths(tmp_path, monkeypatch):
    from benchmarks import run

    monkeypatch.chdir(tmp_path)
    argv = ["--only", "ViT-S/16 224", "--out", str(tmp_path / "results" / "x"), "--page", "/elsewhere/perf.md"]
    assert run.command(argv) == "python -m benchmarks.run --only 'ViT-S/16 224' --out results/x --page perf.md"


def test_the_fashion_mnist_case_is_the_recipe_model():
    from training import recipes

    recipe = recipes.FashionMnist()
    assert ({k: cases.FMNIST[k] for k in ("image_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim", "pooling")}
            == {k: getattr(recipe, k)
                for k in ("image_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim", "pooling")})


@pytest.mark.parametrize("value", ["tf", "", "jax,mxnet"])
def test_backends_outside_the_three_are_refused(value, capsys):
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.main(["--backends", value])
    assert f"--backends {value!r}: give some of tensorflow, jax, torch" in capsys.readouterr().err


def test_only_keeps_the_matmul_peaks_measured_in_the_same_run():
    from benchmarks import run

    names = [c["name"] for c in run.selected(cases.cases(full=True), "ViT-S/16 224 b16 ")]
    assert names[:2] == ["matmul peak 2048^2 fp32", "matmul peak 2048^2 bf16"]
    assert names[2:] and all("ViT-S/16 224 b16 " in n for n in names[2:])
    assert len(run.selected(cases.cases(full=True), None)) == len(cases.cases(full=True))


def test_a_run_without_a_bf16_case_leaves_out_the_bf16_peak():
    from benchmarks import run

    names = [c["name"] for c in run.selected(cases.cases(full=True), "ViT-S/16 224 b16 fp32")]
    assert names == ["matmul peak 2048^2 fp32", "infer ViT-S/16 224 b16 fp32", "train ViT-S/16 224 b16 fp32"]


def test_the_train_step_cases_time_bf16_against_timm_autocast():
    s16 = {c["name"]: c for c in cases.cases(full=True)}["train ViT-S/16 224 b16 bf16"]
    assert {(s["backend"], s["impl"], s.get("variant")) for s in s16["candidates"]} == {
        ("tensorflow", "keras_vit", None), ("jax", "keras_vit", None), ("torch", "keras_vit", None),
        ("torch", "timm", None), ("jax", "keras_vit", "keras-layernorm"), ("tensorflow", "keras_vit", "no-xla"),
        ("jax", "keras_vit", "keras-matmul"), ("jax", "keras_vit", "keras-attention")}
    assert {s["dtype"] for s in s16["candidates"]} == {"mixed_bfloat16"}
    fp32 = {c["name"]: c for c in cases.cases(full=True)}["train ViT-S/16 224 b16 fp32"]
    assert "keras-matmul" not in {s.get("variant") for s in fp32["candidates"]}  # the products differ in bf16 only


def _variant_pair(variant, dtype="float32"):
    """The benchmark's keras_vit model and its `variant`, with the same weights, and an input."""
    import numpy as np

    from benchmarks import models

    spec = dict(impl="keras_vit", model=TINY, dtype=dtype)
    ours, theirs = models.keras_model(spec), models.keras_model(dict(spec, variant=variant))
    x = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype("float32")
    ours(x)
    theirs.set_weights(ours.get_weights())
    return ours, theirs, x


def _outputs(*models, x):
    import keras

    return [keras.ops.convert_to_numpy(keras.ops.cast(m(x), "float32")) for m in models]


def test_the_keras_matmul_variant_takes_keras_products_with_the_same_outputs():
    import keras
    import numpy as np

    from keras_vit.layers import Attention
    from keras_vit.layers.dense import Dense

    ours, theirs, x = _variant_pair("keras-matmul", "mixed_bfloat16")
    layers = list(theirs._flatten_layers())
    assert all(layer.call.__func__ is keras.layers.Dense.call for layer in layers if isinstance(layer, Dense))
    assert all(not layer._fused_path() for layer in layers if isinstance(layer, Attention))
    a, b = _outputs(theirs, ours, x=x)
    np.testing.assert_allclose(a, b, atol=0.05 * np.abs(b).max())


def test_the_keras_attention_variant_takes_dot_product_attention_with_the_same_outputs():
    import numpy as np

    from keras_vit.layers import Attention

    ours, theirs, x = _variant_pair("keras-attention")
    layers = [layer for layer in theirs._flatten_layers() if isinstance(layer, Attention)]
    assert layers and all("_attend" in vars(layer) for layer in layers)  # the instance's own core
    np.testing.assert_allclose(*_outputs(theirs, ours, x=x), atol=1e-5)
    fp32 = {c["name"]: c for c in cases.cases(full=True)}["infer ViT-S/16 224 b16 fp32"]
    assert ("jax", "keras-attention") in {(s["backend"], s.get("variant")) for s in fp32["candidates"]}


def test_the_keras_layernorm_variant_computes_as_keras_with_the_same_outputs():
    import keras
    import numpy as np

    from keras_vit.layers import LayerNormalization

    ours, theirs, x = _variant_pair("keras-layernorm")
    norms = [layer for layer in theirs._flatten_layers() if isinstance(layer, LayerNormalization)]
    assert norms and all(layer.call.__func__ is keras.layers.LayerNormalization.call for layer in norms)
    np.testing.assert_allclose(*_outputs(theirs, ours, x=x), atol=1e-5)



def test_a_worker_that_does_not_quit_is_killed(tmp_path):
    import subprocess
    import sys

    from benchmarks import run

    worker = run.Worker.__new__(run.Worker)
    worker.log = open(tmp_path / "log", "w")
    worker.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.PIPE,
                                   text=True)
    worker.close()  # the sleeping process never reads "quit"
    assert worker.proc.returncode is not None and worker.log.closed


def test_a_worker_that_died_answers_an_error_instead_of_raising(tmp_path):
    import subprocess
    import sys

    from benchmarks import run

    worker = run.Worker.__new__(run.Worker)
    worker.backend, worker.log = "torch", open(tmp_path / "log", "w")
    # Still running but no longer reading: as a worker that crashed and is not reaped yet.
    worker.proc = subprocess.Popen([sys.executable, "-c", "import os, time; os.close(0); time.sleep(600)"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    reply = worker.ask(5, cmd="setup", key="0")
    assert not reply["ok"] and "torch worker died" in reply["error"]
    worker.proc.kill()
    worker.proc.wait()
    assert not worker.alive() and "exited" in worker.ask(5, cmd="time", key="0")["error"]
    worker.close()


def test_tensorflow_without_onednn_runs_in_a_worker_of_its_own(tmp_path, monkeypatch):
    import subprocess

    from benchmarks import run

    fp32 = [c for c in run.selected(cases.cases(full=True), "ViT-S/16 224 b16 fp32") if c["kind"] != "peak"]
    off = [s for c in fp32 for s in c["candidates"] if s.get("onednn") is False]
    assert {cases.label(s) for s in off} == {"keras_vit (tensorflow) [no oneDNN]",
                                            "keras_vit (tensorflow) [no-xla, no oneDNN]"}
    assert {cases.worker_name(s) for s in off} == {"tensorflow-no-onednn"}
    assert not any(s.get("onednn") is False for c in cases.cases(full=True) if "bf16" in c["name"]
                   for s in c["candidates"])
    started = {}

    class Popen:
        def __init__(self, args, env=None, **kwargs):
            started[env["KERAS_BACKEND"], env["TF_ENABLE_ONEDNN_OPTS"]] = args

    monkeypatch.setattr(run.malloc, "find_tcmalloc", lambda: None)  # no `ldconfig` run under the fake Popen
    monkeypatch.setattr(subprocess, "Popen", Popen)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    for name in ("tensorflow", "tensorflow-no-onednn", "jax"):
        run.Worker(name, "cpu", str(tmp_path))
    assert set(started) == {("tensorflow", "1"), ("tensorflow", "0"), ("jax", "1")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-jax.log", "worker-tensorflow-no-onednn.log",
                                                          "worker-tensorflow.log"]
