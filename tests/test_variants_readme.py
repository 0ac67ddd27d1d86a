"""The README's variants example runs as written (it builds two ViT-B/16-size models: slow)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_variants_example_runs():
    section = README.read_text().split("<!-- section: variants -->")[1].split("<!-- /section: variants -->")[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    exec(compile(code, "README variants", "exec"), scope)  # the README's own code, nothing else
    assert scope["hybrid"].grid_size == (24, 24) and scope["hybrid"].stem_layers == (3, 4, 9)
    assert scope["siglip_like"].head.map_head is not None
    assert scope["dinov2_like"].num_prefix_tokens == 5
