"""Turns the timings into the results table (Markdown), the targets, a JSON record and a plot.

    python -m benchmarks.report benchmarks/results/full.json --page docs/performance.md

re-renders a saved run (its .md, .json targets and .png, from the saved timings) and a docs page's
block between the `<!-- benchmarks:begin -->` and `<!-- benchmarks:end -->` markers (the run and
the per-library table; the targets stay in the run's own .md);
`benchmarks.run --page docs/performance.md` does the same after a run.
"""

import argparse
import json
import os
import statistics

import numpy as np
from benchmarks.cpu import replace_block
from commands import cli


def summarize(c):
    """Median step time and what follows from it, for one candidate."""
    t = c["times"]
    if not t:
        return dict(label=c["label"], error=c.get("error") or c["setup"].get("error", "no timings"))
    med, items = statistics.median(t), c["setup"]["items"]
    out = dict(label=c["label"], spec=c["spec"], median_s=med, best_s=min(t), n=len(t), rate=items / med,
               p50_ms=1e3 * med, p95_ms=1e3 * float(np.percentile(t, 95)), peak_rss_mb=c.get("peak_rss_mb"),
               setup_s=c["setup"].get("setup_s"))
    if c["flops"]:
        out["gflops"] = c["flops"] / med / 1e9
        out["best_gflops"] = c["flops"] / min(t) / 1e9
    return out


def peaks(results):
    """{dtype: the best GFLOP/s any backend reached on the matmul} (best repetition, not median)."""
    out = {}
    for case in results:
        for s in case["rows"]:
            if case["kind"] == "peak" and "gflops" in s:
                dt = s["spec"]["dtype"]
                out[dt] = max(out.get(dt, 0), s["best_gflops"])
    return out


# Variants that some records time beside the library's, shown, never counted as keras_vit: attention
# layouts (one (D, 3D) Q, K, V product; MHA's explicit einsum path), Keras' own LayerNormalization,
# Keras' own bf16 products and the attention core of `ops.dot_product_attention`.
PROTOTYPES = ("fused-qkv", "einsum-attn", "keras-layernorm", "keras-matmul", "keras-attention")


def _prototype(spec):
    """Whether `spec` is a variant timed beside the library that the library does not run: a
    prototype layout, or TensorFlow with its oneDNN kernels off."""
    return spec.get("variant") in PROTOTYPES or spec.get("onednn") is False


def _best(rows, impl, **match):
    ok = [r for r in rows if "rate" in r and r["spec"]["impl"] == impl and not _prototype(r["spec"])
          and all(r["spec"].get(k) == v for k, v in match.items())]
    return max(ok, key=lambda r: r["rate"]) if ok else None


def _find(results, text):
    return next((c for c in results if text in c["name"]), None)


def _target(name, value, goal, detail, at_most=False):
    met = value is not None and (value <= goal if at_most else value >= goal)
    return dict(target=name, value=value, goal=goal, met=met, detail=detail, at_most=at_most)


def targets(results, peak):
    """Each of the benchmark's targets with the measured value (reported in the run's own .md)."""
    out = []
    fp32, bf16 = _find(results, "infer ViT-S/16 224 b16 fp32"), _find(results, "infer ViT-S/16 224 b16 bf16")
    if fp32:
        ours, timm, hub = (_best(fp32["rows"], i) for i in ("keras_vit", "timm", "keras_hub"))
        if ours:
            for ref, name in ((timm, "timm"), (hub, "keras-hub")):
                if ref:
                    out.append(_target(f"fp32 ViT-S/16: best keras_vit / best {name}", ours["rate"] / ref["rate"], 1.10,
                                       f"{ours['label']} {ours['rate']:.2f} vs {ref['label']} {ref['rate']:.2f} img/s"))
            if peak.get("float32"):
                out.append(_target("fp32 ViT-S/16: share of matmul peak", ours["gflops"] / peak["float32"], 0.85,
                                   f"{ours['gflops']:.0f} of {peak['float32']:.0f} GFLOP/s"))
            out += _backend_spread(fp32["rows"], "fp32 ViT-S/16 inference")
        if bf16 and ours and _best(bf16["rows"], "keras_vit"):
            b = _best(bf16["rows"], "keras_vit")
            out.append(_target("bf16 / fp32 keras_vit (best backends)", b["rate"] / ours["rate"], 1.6,
                               f"{b['label']} {b['rate']:.2f} vs {ours['label']} {ours['rate']:.2f} img/s"))
    check = _find(results, "bf16 logits check")
    for r in check["rows"] if check else []:
        info = r.get("info") or {}
        if info.get("checkpoint"):
            out.append(_target(f"bf16 vs fp32 max |logit diff| ({r['label']})", info["max_abs_logit_diff"], 2e-2,
                               f"{info['images']} images of {info['checkpoint']}", at_most=True))
            out.append(_target(f"same, classifier head in float32 (proposed; {r['label']})",
                               info["max_abs_logit_diff_fp32_head"], 2e-2, "bf16 encoder, fp32 head", at_most=True))
            if "max_abs_logit_diff_fp32_residual" in info:  # a prototype that some records measured
                out.append(_target(f"same, float32 residual stream (prototype; {r['label']})",
                                   info["max_abs_logit_diff_fp32_residual"], 2e-2,
                                   "bf16 blocks, each branch added in float32", at_most=True))
    train = _find(results, "train ViT")
    if train and _best(train["rows"], "keras_vit") and _best(train["rows"], "timm"):
        ours, timm = _best(train["rows"], "keras_vit"), _best(train["rows"], "timm")
        out.append(_target("train step: best keras_vit / best timm", ours["rate"] / timm["rate"], 1.0,
                           f"{ours['label']} {ours['rate']:.1f} vs {timm['label']} {timm['rate']:.1f} img/s"))
        out += _backend_spread(train["rows"], "train step")
    for dtype in ("fp32", "bf16"):  # the JAX train step against timm's (issue target: 0.9x)
        case = _find(results, f"train ViT-S/16 224 b16 {dtype}")
        rows = case["rows"] if case else []
        jax_step, timm = _best(rows, "keras_vit", backend="jax"), _best(rows, "timm")
        if jax_step and timm:
            out.append(_target(f"{dtype} train step ViT-S/16: keras_vit jax / timm", jax_step["rate"] / timm["rate"],
                               0.9, f"{jax_step['rate']:.2f} vs {timm['label']} {timm['rate']:.2f} img/s"))
    fm = _find(results, "Fashion-MNIST")
    if fm and _best(fm["rows"], "pipeline") and _best(fm["rows"], "keras_vit"):
        pipe, step = _best(fm["rows"], "pipeline"), _best(fm["rows"], "keras_vit")
        out.append(_target("input pipeline / fastest Fashion-MNIST train step", pipe["rate"] / step["rate"], 5.0,
                           f"{pipe['rate']:.0f} vs {step['label']} {step['rate']:.0f} img/s"))
    return out


def _backend_spread(rows, what):
    """Every backend's best keras_vit within 1.3x of the best one."""
    per = {b: _best(rows, "keras_vit", backend=b) for b in ("tensorflow", "jax", "torch")}
    per = {b: r for b, r in per.items() if r}
    if not per:
        return []
    top = max(r["rate"] for r in per.values())
    return [_target(f"{what}: keras_vit {b} within 1.3x of best backend", r["rate"] / top, 1 / 1.3,
                    f"{r['rate']:.2f} vs {top:.2f} img/s") for b, r in per.items()]


def _ratio(r, ref):
    return f"{r['rate'] / ref['rate']:.2f}x" if ref and "rate" in r else ""


def case_table(case, peak):
    """Markdown lines for one case."""
    rows = case["rows"]
    lines = [f"**{case['name']}** (1-min load average {case['load_before']['loadavg_1m']:.1f} before, "
             f"{case['load_after']['loadavg_1m']:.1f} after)", ""]
    if case["kind"] == "peak":
        lines += ["| matmul | best GFLOP/s | median GFLOP/s |", "|---|---:|---:|"]
        lines += [f"| {r['label']} | {r['best_gflops']:.0f} | {r['gflops']:.0f} |" if "rate" in r
                  else f"| {r['label']} | failed: {r['error']} | |" for r in rows]
    elif case["kind"] == "latency":
        lines += ["| predict + overlay | p50 ms | p95 ms | calls | peak RSS MB |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['label']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['n']} | {r['peak_rss_mb']:.0f} |"
                  if "rate" in r else f"| {r['label']} | failed: {r['error']} | | | |" for r in rows]
    elif case["kind"] == "check":
        lines += [f"- {r['label']}: {r.get('info') or r.get('error')}" for r in rows]
    else:
        timm, hub = _best(rows, "timm"), _best(rows, "keras_hub")
        pk = peak.get("bfloat16" if "bf16" in case["name"] else "float32")
        lines += ["| candidate | median s/step | img/s | vs timm | vs keras-hub | GFLOP/s | % of peak | peak RSS MB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "rate" not in r:
                lines.append(f"| {r['label']} | failed: {r['error'][:120]} | | | | | | |")
                continue
            g = r.get("gflops")
            lines.append(f"| {r['label']} | {r['median_s']:.3f} | {r['rate']:.1f} | {_ratio(r, timm)} "
                         f"| {_ratio(r, hub)} | {'' if g is None else f'{g:.0f}'} "
                         f"| {'' if g is None or not pk else f'{100 * g / pk:.0f}%'} | "
                         f"{r['peak_rss_mb']:.0f} |")
    return lines + [""]


def _library_env(meta):
    """", TF_ENABLE_ONEDNN_OPTS=1": the library settings the run's workers had, where recorded."""
    return "".join(f", {k}={v}" for k, v in meta.get("library_env", {}).items())


def markdown(results, meta, peak, goals):
    lines = [f"Run: `{meta['command']}` ({meta['mode']}, {meta['device']}, {meta['cores']} cores, {cpu_text(meta)}"
             f"{', malloc ' + meta['malloc'] if 'malloc' in meta else ''}{_library_env(meta)}), "
             f"{meta['date']}, {meta['reps']} alternating repetitions after {meta['warmup']} warm-up, "
             f"{meta['wall_s'] / 60:.1f} min. Matmul peak: "
             + (", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peak.items()) or "not measured") + ".", ""]
    for case in results:
        lines += case_table(case, peak)
    lines += targets_table(goals)
    busy = {b["cmd"] for c in results for b in c["load_before"]["busy_processes"] + c["load_after"]["busy_processes"]}
    lines += ["", "Other processes using the CPU during the run: " + ("; ".join(sorted(busy)) or "none") + "."]
    return "\n".join(lines) + "\n"


def targets_table(goals):
    """Markdown lines: each target, its measured value and whether it is met."""
    return ["| target | measured | goal | met |", "|---|---:|---:|---|"] + [
        f"| {g['target']} ({g['detail']}) | {g['value']:.3g} | {'<=' if g['at_most'] else '>='} {g['goal']:.3g} | "
        f"{'yes' if g['met'] else 'NO'} |" for g in goals]


def plot(results, path):
    """Horizontal bars of images/s per candidate, one panel per throughput case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [c for c in results if c["kind"] == "throughput" and any("rate" in r for r in c["rows"])]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 + 0.45 * sum(len(c["rows"]) for c in panels)),
                             squeeze=False)
    for ax, case in zip(axes[:, 0], panels):
        rows = [r for r in case["rows"] if "rate" in r]
        colors = ["lightsteelblue" if _prototype(r["spec"])  # not in keras_vit
                  else "tab:blue" if r["spec"]["impl"] == "keras_vit" else "tab:gray" for r in rows]
        ax.barh([r["label"] for r in rows], [r["rate"] for r in rows], color=colors)
        ax.invert_yaxis()
        rates = [r["rate"] for r in rows]
        if max(rates) > 20 * min(rates):  # pipeline vs train step: orders of magnitude apart
            ax.set_xscale("log")
        ax.set_title(case["name"], fontsize=9)
        ax.set_xlabel("images/s (median)", fontsize=8)
        ax.tick_params(labelsize=8)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color="tab:blue", label="keras_vit"),
                        Patch(color="lightsteelblue", label="benchmark-only prototype"),
                        Patch(color="tab:gray", label="reference (timm, keras-hub) / pipeline")],
               fontsize=8, loc="upper center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_size_inches()[1]))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results, meta, out_dir):
    """Writes {mode}.json, {mode}.md and {mode}.png under out_dir; returns the Markdown."""
    for case in results:
        case["rows"] = [dict(summarize(c), info=c["setup"].get("info")) if case["kind"] == "check"
                        else summarize(c) for c in case["candidates"]]
    peak = peaks(results)
    goals = targets(results, peak)
    text = markdown(results, meta, peak, goals)
    base = os.path.join(out_dir, meta["mode"])
    with open(base + ".json", "w") as f:
        json.dump(dict(meta=meta, peak_gflops=peak, targets=goals, cases=results), f, indent=1, default=str)
    with open(base + ".md", "w") as f:
        f.write(text)
    plot(results, base + ".png")
    return text


PAGE_BEGIN, PAGE_END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


def cpu_text(meta):
    """The CPU as lscpu names it, and whether it has AMX (which decides the bf16 and int8 kernels)."""
    if "cpu_flags" not in meta:
        return meta["cpu"]
    return f"{meta['cpu']}, {'with' if 'amx_tile' in meta['cpu_flags'] else 'without'} AMX"


def _row_key(spec):
    return (spec["impl"], spec["backend"], bool(spec.get("compile")), spec.get("variant"), spec.get("onednn"))


def library_table(cases_):
    """Images/s per library and backend (rows) for each model case (columns); the best keras_vit of
    each column in bold."""
    cols = [c for c in cases_ if c["kind"] == "throughput" and c["name"].startswith(("infer", "train"))]
    keys, labels = [], {}
    for c in cols:
        for r in c["rows"]:
            if "spec" in r and _row_key(r["spec"]) not in labels:
                keys.append(_row_key(r["spec"]))
                labels[_row_key(r["spec"])] = r["label"]
    order = {"keras_vit": 0, "keras_hub": 1, "timm": 2}
    keys.sort(key=lambda k: order.get(k[0], 3))  # stable: keeps the run's order within a library
    lines = ["| img/s (median) | " + " | ".join(c["name"] for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    best = [_best(c["rows"], "keras_vit") for c in cols]
    for k in keys:
        cells = []
        for c, top in zip(cols, best):
            r = next((r for r in c["rows"] if "spec" in r and _row_key(r["spec"]) == k), None)
            if r is None:
                cells.append("")
            elif "rate" not in r:
                cells.append("failed")
            else:
                cells.append(f"**{r['rate']:.1f}**" if r is top else f"{r['rate']:.1f}")
        lines.append(f"| {labels[k]} | " + " | ".join(cells) + " |")
    return lines


def page_block(record, link):
    """A docs page's results block: the run and the per-library table, from a saved run.

    `link` is the record's URL relative to the page (e.g. "../benchmarks/results/full.json")."""
    meta, peak, cases_ = record["meta"], record["peak_gflops"], record["cases"]
    loads = [c[w]["loadavg_1m"] for c in cases_ for w in ("load_before", "load_after")]
    busy = sorted({b["cmd"] for c in cases_
                   for b in c["load_before"]["busy_processes"] + c["load_after"]["busy_processes"]})
    lines = [PAGE_BEGIN,
             f"Generated by `python -m benchmarks.report` from [`{meta['mode']}.json`]({link}): "
             f"`{meta['command']}` ({meta['mode']} run, {meta['device']}, {cpu_text(meta)}, {meta['cores']} cores, "
             f"{'malloc ' + meta['malloc'] + ', ' if 'malloc' in meta else ''}{meta['date']}, "
             f"{meta['reps']} alternating repetitions after {meta['warmup']} warm-up, "
             f"{meta['wall_s'] / 60:.1f} min; 1-minute load average {min(loads):.1f} to {max(loads):.1f}; "
             f"other processes on the CPU: {'; '.join(busy) or 'none'}). Matmul peak (best repetition): "
             + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peak.items()) + ".", ""]
    lines += library_table(cases_) + [""]
    for case in (c for c in cases_ if c["kind"] == "latency"):
        lines += [f"{case['name']}, p50 / p95: " + ", ".join(
            f"{r['label']} {r['p50_ms']:.0f} / {r['p95_ms']:.0f} ms" if "rate" in r else f"{r['label']} failed"
            for r in case["rows"]) + ".", ""]
    return "\n".join(lines[:-1] + [PAGE_END])


def update_page(page_path, record, record_path):
    """Replaces the block between the markers in `page_path` with `page_block` of the record saved
    at `record_path`."""
    link = os.path.relpath(os.path.abspath(record_path), os.path.dirname(os.path.abspath(page_path)))
    replace_block(page_path, PAGE_BEGIN, PAGE_END, page_block(record, link.replace(os.sep, "/")))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Re-render a saved benchmark run (and a docs page's block).",
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("record", help="a {quick,full}.json written by benchmarks.run")
    parser.add_argument("--page", help="also rewrite this page's results block, e.g. docs/performance.md "
                        "(default: none)")
    args = parser.parse_args(argv)
    with open(args.record) as f:
        record = json.load(f)
    print(write(record["cases"], record["meta"], os.path.dirname(os.path.abspath(args.record))))
    if args.page:
        with open(args.record) as f:  # as just rewritten, with the targets recomputed
            update_page(args.page, json.load(f), args.record)


if __name__ == "__main__":
    main()
