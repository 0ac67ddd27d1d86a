"""Serving steps: a ViT exported to a runtime and run there on uint8 images (B, H, W, C).

Both libraries' graphs do the same work: uint8 pixels in, normalization, the ViT, softmax out.
keras_vit's comes from `keras_vit.export` in the torch worker (its graph is the lean one: for
ViT-S/16 the ONNX file has 439 nodes, against 1,322 from the TensorFlow backend's tf2onnx and 461
for timm's); timm's from `torch.onnx.export` (dynamo) of the same wrapper around timm's
VisionTransformer, which OpenVINO reads from the ONNX file. A spec: impl "serving", source
"keras_vit" or "timm", runtime "onnxruntime" or "openvino", precision "f32", "bf16" (OpenVINO's
INFERENCE_PRECISION_HINT) or "int8" (NNCF, calibrated on 32 random images: speed does not depend
on the values).
"""

import os
import tempfile

import numpy as np

from benchmarks import models

FORMAT = {"onnxruntime": "onnx", "openvino": "openvino"}


def serving_step(spec):
    """() -> probabilities for one batch of random uint8 images, through the spec's artifact."""
    from keras_vit import serving

    m = spec["model"]
    shape = (m["image_size"], m["image_size"], m.get("num_channels", 3))
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (spec["batch"], *shape), dtype="uint8")
    folder = _folder()
    path = (_keras_vit_artifact if spec["source"] == "keras_vit" else _timm_artifact)(spec, folder)
    precision = spec["precision"]
    if precision == "int8":
        path = serving.quantize_int8(path, os.path.join(folder, "int8.xml"),
                                     rng.integers(0, 256, (32, *shape), dtype="uint8"))
        precision = "f32"  # the int8 matmuls run as int8; the rest stays f32
    fn = serving.load(path, FORMAT[spec["runtime"]], precision=precision)
    return lambda: fn(pixels)


def _folder():
    """A temporary folder for the artifacts, removed when the process exits (a runtime may still map
    the files it loaded, so not before)."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix="serving-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _keras_vit_artifact(spec, folder):
    import keras_vit

    model = models.keras_model({**spec, "impl": "keras_vit", "dtype": "float32"})
    suffix = ".xml" if spec["runtime"] == "openvino" else ".onnx"
    return keras_vit.export(model, os.path.join(folder, "model" + suffix), format=FORMAT[spec["runtime"]])


def _timm_artifact(spec, folder):
    """timm's model behind the same uint8 -> probabilities wrapper, as ONNX (and OpenVINO IR)."""
    import torch

    net = models.timm_model(spec["model"]).eval()

    class Serving(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, pixels):  # (B, H, W, C) uint8, normalized with mean = std = 0.5 as keras_vit's default
            x = (pixels.permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5  # -> (B, C, H, W)
            return torch.softmax(self.net(x), dim=-1)

    m = spec["model"]
    sample = torch.zeros((2, m["image_size"], m["image_size"], m.get("num_channels", 3)), dtype=torch.uint8)
    onnx_path = os.path.join(folder, "timm.onnx")
    program = torch.onnx.export(Serving().eval(), (sample,), dynamo=True, input_names=["pixels"],
                                dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    program.optimize()
    program.save(onnx_path)
    if spec["runtime"] == "onnxruntime":
        return onnx_path
    import openvino as ov

    xml = os.path.join(folder, "timm.xml")
    ov.save_model(ov.convert_model(onnx_path), xml, compress_to_fp16=False)
    return xml


def onnx_op_counts(path):
    """{op type: count} of an ONNX graph (nodes of the main graph and of its local functions)."""
    import collections

    import onnx

    proto = onnx.load(path)
    nodes = list(proto.graph.node) + [n for f in proto.functions for n in f.node]
    return dict(collections.Counter(n.op_type for n in nodes).most_common())


def openvino_profiler(path, pixels, precision="bf16"):
    """(step, totals): `step()` runs one batch and adds OpenVINO's per-node times (PERF_COUNT) to
    `totals`, {(node type, kernel): ms}."""
    import collections

    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": precision, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    request.infer([pixels])  # warm-up
    totals = collections.Counter()

    def step():
        request.infer([pixels])
        for info in request.profiling_info:
            totals[f"{info.node_type} [{info.exec_type}]"] += info.real_time.total_seconds() * 1e3

    return step, totals


def onnxruntime_profiler(path, pixels):
    """(step, totals) as `openvino_profiler`, from ONNX Runtime's JSON profile, by op type; `totals`
    is filled when `step(final=True)` ends the profile."""
    import collections
    import json

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(_folder(), "ort")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    session.run(None, {name: pixels})  # warm-up (its times are dropped below, by the step count)
    totals, runs = collections.Counter(), []

    def step(final=False):
        if not final:
            runs.append(session.run(None, {name: pixels}))
            return
        with open(session.end_profiling()) as f:
            events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
        for e in events:  # microseconds, warm-up included: scaled to the timed steps below
            totals[e["args"]["op_name"]] += e["dur"] / 1e3 * len(runs) / (len(runs) + 1)

    return step, totals


def profile(runtime, preset, reps=4, batch=16):
    """keras_vit's and timm's graphs run in turn (A B B A ...) under the runtime's profiler:
    {source: {"median_s", "ms_by_node": {node type: ms per step}}} (the 14 largest)."""
    import collections
    import statistics
    import time

    from benchmarks import cases

    model = cases.preset(preset)
    size = model["image_size"]
    pixels = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype="uint8")
    folder, steps = _folder(), {}
    for source in ("keras_vit", "timm"):
        spec = dict(source=source, runtime="onnxruntime" if runtime == "onnxruntime" else "openvino", model=model)
        path = (_keras_vit_artifact if source == "keras_vit" else _timm_artifact)(spec, folder)
        if runtime == "onnxruntime":
            steps[source] = onnxruntime_profiler(path, pixels)
            continue
        if runtime == "int8":
            from keras_vit import serving

            path = serving.quantize_int8(path, os.path.join(folder, source + "-int8.xml"), pixels)
        steps[source] = openvino_profiler(path, pixels, "f32" if runtime == "int8" else "bf16")
    times = collections.defaultdict(list)
    for rep in range(reps):
        for source in list(steps) if rep % 2 == 0 else list(steps)[::-1]:
            start = time.perf_counter()
            steps[source][0]()
            times[source].append(time.perf_counter() - start)
    out = {}
    for source, (step, totals) in steps.items():
        if runtime == "onnxruntime":
            step(final=True)
        ranked = collections.Counter({k: v / reps for k, v in totals.items()}).most_common(14)
        out[source] = {"median_s": round(statistics.median(times[source]), 3),
                       "ms_by_node": {k: round(v, 1) for k, v in ranked}}
    return out


def main(argv=None):
    """Prints the op counts of one library's ONNX serving graph, e.g.
    `KERAS_BACKEND=torch python -m benchmarks.serving --source keras_vit` and `--source timm`, or
    with `--profile RUNTIME` where both graphs spend their time, run in turn at batch 16:
    `openvino` (bf16), `int8` (OpenVINO, NNCF) or `onnxruntime` (f32). timm's exporter must not
    share a process with TensorFlow."""
    import argparse
    import json

    from benchmarks import cases

    parser = argparse.ArgumentParser(description=main.__doc__.split(",")[0])
    parser.add_argument("--source", choices=("keras_vit", "timm"), default="keras_vit")
    parser.add_argument("--preset", default="ViT-S/16")
    parser.add_argument("--profile", choices=("openvino", "int8", "onnxruntime"),
                        help="time by node type of both graphs in this runtime instead, batch 16")
    args = parser.parse_args(argv)
    result = {"preset": args.preset, "backend": os.environ.get("KERAS_BACKEND")}
    if args.profile:
        result.update(runtime=args.profile, load_average=os.getloadavg()[0], **profile(args.profile, args.preset))
    else:
        spec = dict(source=args.source, runtime="onnxruntime", model=cases.preset(args.preset))
        path = (_keras_vit_artifact if args.source == "keras_vit" else _timm_artifact)(spec, _folder())
        counts = onnx_op_counts(path)
        result.update(source=args.source, nodes=sum(counts.values()), ops=counts)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
