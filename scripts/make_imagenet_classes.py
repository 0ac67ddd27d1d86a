"""Writes keras_vit/data/imagenet_classes.txt: the 1000 ImageNet-1k class names in label order.

The names are data that timm ships (timm/data/_info, Apache-2.0): the synsets in index order and
each synset's WordNet lemmas. Run once: `python scripts/make_imagenet_classes.py`.
"""

import pathlib

import timm.data

info = pathlib.Path(timm.data.__file__).parent / "_info"
lemmas = dict(line.split("\t", 1) for line in (info / "imagenet_synset_to_lemma.txt").read_text().splitlines())
synsets = (info / "imagenet_synsets.txt").read_text().split()
assert len(synsets) == 1000, len(synsets)
out = pathlib.Path(__file__).resolve().parents[1] / "keras_vit" / "data" / "imagenet_classes.txt"
out.write_text("".join(lemmas[s].strip() + "\n" for s in synsets))
print(f"wrote {out}")
