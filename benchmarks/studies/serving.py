"""The exported serving graphs of keras_vit and timm: their ONNX op counts, and where each runtime
spends their time.

    KERAS_BACKEND=torch python -m benchmarks.studies.serving --source keras_vit   # or --source timm
    KERAS_BACKEND=torch python -m benchmarks.studies.serving --profile openvino   # or int8, onnxruntime

The graphs are those that `benchmarks.run` times (`benchmarks.impls.serving_step`): uint8 pixels in,
normalization, the ViT, softmax out.
"""

import os

import numpy as np

from benchmarks import impls, timing


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
    options.profile_file_prefix = os.path.join(impls.serving_folder(), "ort")
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

    from benchmarks import cases

    model = cases.preset(preset)
    size = model["image_size"]
    pixels = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype="uint8")
    folder, steps = impls.serving_folder(), {}
    for source in ("keras_vit", "timm"):
        spec = dict(source=source, runtime="onnxruntime" if runtime == "onnxruntime" else "openvino", model=model)
        path = impls.serving_artifact(spec, folder)
        if runtime == "onnxruntime":
            steps[source] = onnxruntime_profiler(path, pixels)
            continue
        if runtime == "int8":
            from keras_vit import serving

            path = serving.quantize_int8(path, os.path.join(folder, source + "-int8.xml"), pixels)
        steps[source] = openvino_profiler(path, pixels, "f32" if runtime == "int8" else "bf16")
    # No warm-up: each profiler has run a batch already, and every call of a step adds to its totals.
    medians = timing.alternate({source: step for source, (step, _) in steps.items()}, reps, warmup=0)
    out = {}
    for source, (step, totals) in steps.items():
        if runtime == "onnxruntime":
            step(final=True)
        ranked = collections.Counter({k: v / reps for k, v in totals.items()}).most_common(14)
        out[source] = {"median_s": round(medians[source], 3),
                       "ms_by_node": {k: round(v, 1) for k, v in ranked}}
    return out


def main(argv=None):
    """Prints the op counts of one library's ONNX serving graph, e.g.
    `KERAS_BACKEND=torch python -m benchmarks.studies.serving --source keras_vit` and `--source timm`, or
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
        path = impls.serving_artifact(spec, impls.serving_folder())
        counts = onnx_op_counts(path)
        result.update(source=args.source, nodes=sum(counts.values()), ops=counts)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
