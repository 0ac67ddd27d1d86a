"""The ResNet stem of Google's hybrid `.npz` checkpoints (R50+ViT-B/16, R50+ViT-L/32).

The stem's tensors sit at the top level of the file, next to the ViT's: "conv_root/kernel",
"gn_root/{scale,bias}" and "block{stage}/unit{unit}/{conv1,conv2,conv3,conv_proj}/kernel" with
"gn1".."gn3", "gn_proj". Kernels are (kh, kw, C_in, C_out), Keras' layout. Google's pre-Linen code
stored GroupNorm parameters as (1, 1, 1, C); they are squeezed to (C,). The ViT part is read by
`google` as usual, except that the patch embedding sees F feature channels instead of C.
Shapes: C image channels, F feature width, M bottleneck width.
"""

import re

from keras_vit.layers.resnet import ROOT_WIDTH, STAGE_WIDTHS

_UNIT = re.compile(r"block(\d+)/unit(\d+)/")
_NORMS = ("gn1", "gn2", "gn3", "gn_proj")
_OPTIONS = dict(qk_norm=False, parallel_block=False, use_bias=True, stem=None)


def is_stem_tensor(name):
    return name.startswith(("conv_root/", "gn_root/")) or _UNIT.match(name) is not None


def squeeze_norms(tensors):
    """GroupNorm scales and biases of shape (1, 1, 1, C) -> (C,); everything else unchanged."""
    def squeeze(name, value):
        if is_stem_tensor(name) and "/gn" in "/" + name and value.ndim == 4:
            return value.reshape(value.shape[-1])
        return value

    return {k: squeeze(k, v) for k, v in tensors.items()}


def stem_spec(tensors):
    """{} for a plain ViT; for a hybrid, the stem's units per stage and the image channels."""
    if "conv_root/kernel" not in tensors:
        return {}
    units = {}
    for name in tensors:
        match = _UNIT.match(name)
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    if sorted(units) != list(range(1, len(units) + 1)) or len(units) > len(STAGE_WIDTHS):
        raise ValueError(f"the ResNet stem's stages are {sorted(units)}; expected 1 to 4 consecutive stages from block1")
    return dict(stem_layers=tuple(units[s] for s in sorted(units)), image_channels=int(tensors["conv_root/kernel"].shape[2]))


def stem_shapes(spec):
    """Name -> shape of the stem's tensors ({} without a stem)."""
    if "stem_layers" not in spec:
        return {}
    shapes = {"conv_root/kernel": (7, 7, spec["image_channels"], ROOT_WIDTH)}
    shapes.update(_norm("gn_root/", ROOT_WIDTH))
    width = ROOT_WIDTH
    for stage, n in enumerate(spec["stem_layers"]):
        out = STAGE_WIDTHS[stage]
        mid = out // 4
        for unit in range(n):
            b = f"block{stage + 1}/unit{unit + 1}/"
            cin = width if unit == 0 else out
            shapes.update({b + "conv1/kernel": (1, 1, cin, mid), b + "conv2/kernel": (3, 3, mid, mid),
                           b + "conv3/kernel": (1, 1, mid, out)})
            for norm, c in (("gn1/", mid), ("gn2/", mid), ("gn3/", out)):
                shapes.update(_norm(b + norm, c))
            if unit == 0:  # the first unit changes width or stride, so it projects the shortcut
                shapes[b + "conv_proj/kernel"] = (1, 1, cin, out)
                shapes.update(_norm(b + "gn_proj/", out))
        width = out
    return shapes


def _norm(prefix, c):
    return {prefix + "scale": (c,), prefix + "bias": (c,)}


def stem_variables(model):
    """Canonical name -> Keras variable of the model's stem ({} without one)."""
    if model.stem is None:
        return {}
    stem = model.stem
    v = {"conv_root/kernel": stem.conv_root.kernel, "gn_root/scale": stem.gn_root.gamma, "gn_root/bias": stem.gn_root.beta}
    for i, stage in enumerate(stem.stages):
        for j, unit in enumerate(stage):
            b = f"block{i + 1}/unit{j + 1}/"
            for name in ("conv1", "conv2", "conv3", "conv_proj"):
                if getattr(unit, name) is not None:
                    v[f"{b}{name}/kernel"] = getattr(unit, name).kernel
            for name in _NORMS:
                if getattr(unit, name) is not None:
                    v.update({f"{b}{name}/scale": getattr(unit, name).gamma, f"{b}{name}/bias": getattr(unit, name).beta})
    return v


def stem_config(spec):
    """The `ViT` arguments that a hybrid spec adds: the stem, its image channels and image size."""
    if "stem_layers" not in spec:
        return {}
    stride = 4 * 2 ** (len(spec["stem_layers"]) - 1)
    cell = stride * spec["patch_size"]
    return dict(stem="resnet50", stem_layers=spec["stem_layers"], num_channels=spec["image_channels"],
                image_size=(spec["grid"][0] * cell, spec["grid"][1] * cell))


def unsupported_options(model):
    """The options of `model` that the timm state-dict writer cannot express, as "name=value"."""
    config = model.get_config()
    return [f"{k}={config[k]!r}" for k, default in _OPTIONS.items() if config[k] != default]
