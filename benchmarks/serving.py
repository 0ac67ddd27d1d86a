"""Serving steps: a ViT exported to a runtime and run there on uint8 images (B, H, W, C).

Both libraries' graphs do the same work: uint8 pixels in, normalization, the ViT, softmax out.
keras_vit's comes from `keras_vit.export` in the torch worker (its graph is the lean one: for
ViT-S/16 the ONNX file has 439 nodes, against 1,322 from the TensorFlow backend's tf2onnx and 461
for timm's); timm's from `torch.onnx.export` (dynamo) of the same wrapper around timm's
VisionTransformer, which OpenVINO reads from the ONNX file. A spec: impl "serving", source "keras_vit" or "timm", runtime "onnxruntime" or
"openvino", precision "f32", "bf16" (OpenVINO's INFERENCE_PRECISION_HINT) or "int8" (NNCF,
calibrated on 32 random images: speed does not depend on the values).
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
        path = serving.quantize_int8(path, os.path.join(folder, "int8.xml"), rng.integers(0, 256, (32, *shape), dtype="uint8"))
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


def openvino_profile(path, pixels, precision="bf16", reps=3):
    """OpenVINO's per-node timings (PERF_COUNT) summed by (node type, kernel): {key: [ms per step,
    nodes]}, the 14 largest."""
    import collections

    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": precision, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    request.infer([pixels])  # warm-up
    totals, counts = collections.Counter(), collections.Counter()
    for _ in range(reps):
        request.infer([pixels])
        for info in request.profiling_info:
            totals[f"{info.node_type} [{info.exec_type}]"] += info.real_time.total_seconds() * 1e3 / reps
    for info in request.profiling_info:
        counts[f"{info.node_type} [{info.exec_type}]"] += 1
    return {k: [round(v, 1), counts[k]] for k, v in totals.most_common(14)}


def onnxruntime_profile(path, pixels, reps=3):
    """ONNX Runtime's per-node kernel times (its JSON profile) summed by op type: {op: [ms per step,
    nodes]}, the 14 largest."""
    import collections
    import json

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(_folder(), "ort")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for _ in range(reps + 1):
        session.run(None, {name: pixels})
    with open(session.end_profiling()) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    totals, nodes = collections.Counter(), collections.defaultdict(set)
    for e in events:
        totals[e["args"]["op_name"]] += e["dur"] / 1e3 / (reps + 1)  # microseconds -> ms per step
        nodes[e["args"]["op_name"]].add(e["name"])
    return {k: [round(v, 1), len(nodes[k])] for k, v in totals.most_common(14)}


def main(argv=None):
    """Prints the op counts of one library's ONNX serving graph, e.g.
    `KERAS_BACKEND=torch python -m benchmarks.serving --source keras_vit` and `--source timm`, or
    with `--profile` where the time goes, batch 16: `--profile openvino` (bf16), `--profile int8`
    (OpenVINO, NNCF) or `--profile onnxruntime` (f32). timm's exporter must not share a process
    with TensorFlow."""
    import argparse
    import json

    from benchmarks import cases

    parser = argparse.ArgumentParser(description=main.__doc__.split(",")[0])
    parser.add_argument("--source", choices=("keras_vit", "timm"), required=True)
    parser.add_argument("--preset", default="ViT-S/16")
    parser.add_argument("--profile", choices=("openvino", "int8", "onnxruntime"),
                        help="time by node type in this runtime instead, batch 16")
    args = parser.parse_args(argv)
    runtime = "onnxruntime" if args.profile in (None, "onnxruntime") else "openvino"
    spec = dict(source=args.source, runtime=runtime, model=cases.preset(args.preset), impl="serving")
    folder = _folder()
    path = (_keras_vit_artifact if args.source == "keras_vit" else _timm_artifact)(spec, folder)
    result = {"source": args.source, "preset": args.preset, "backend": os.environ.get("KERAS_BACKEND")}
    size = spec["model"]["image_size"]
    pixels = np.random.default_rng(0).integers(0, 256, (16, size, size, 3), dtype="uint8")
    if args.profile == "onnxruntime":
        result["ms_by_op"] = onnxruntime_profile(path, pixels)
    elif args.profile:
        if args.profile == "int8":
            from keras_vit import serving

            path = serving.quantize_int8(path, os.path.join(folder, "int8.xml"), pixels)
        result["ms_by_node"] = openvino_profile(path, pixels, "f32" if args.profile == "int8" else "bf16")
    else:
        counts = onnx_op_counts(path)
        result.update(nodes=sum(counts.values()), ops=counts)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
