"""The variants page's example runs as written (it builds two ViT-B/16-size models: slow)."""

import re

import pytest

from tests import ROOT

PAGE = ROOT / "docs" / "variants.md"


@pytest.mark.slow
def test_variants_example_runs():
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    scope = {}
    exec(compile(code, "docs/variants.md", "exec"), scope)  # the page's own code, nothing else
    assert scope["hybrid"].grid_size == (24, 24) and scope["hybrid"].stem_layers == (3, 4, 9)
    assert scope["siglip_like"].head.map_head is not None
    assert scope["dinov2_like"].num_prefix_tokens == 5
