"""The README's examples run as written: the one-screen model, and export and serving."""

import re
import runpy

from tests import ROOT


def test_readme_core_example_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    core = readme.split("<!-- section: core -->")[1].split("<!-- /section: core -->")[0]
    script = tmp_path / "readme_example.py"
    script.write_text(re.search(r"```python\n(.*?)```", core, re.S).group(1))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / "vit.keras").exists()


def test_readme_export_example_runs(tmp_path, monkeypatch):
    """The README's export example, run as written (after the imports of the core example) from a
    folder that holds the shipped checkpoint; its artifact gives the model's probabilities."""
    import keras
    import numpy as np

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"\*\*Export and serving\*\*.*?```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "checkpoints").symlink_to(ROOT / "checkpoints")
    monkeypatch.chdir(tmp_path)
    names = runpy.run_path(_script(tmp_path, "import keras\nimport keras_vit\n" + block), run_name="__main__")
    pixels = np.random.default_rng(0).integers(0, 256, (3, 28, 28, 1)).astype("uint8")
    model = names["model"]
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(model.normalize(pixels)), axis=-1))
    np.testing.assert_allclose(names["predict"](pixels), expected, atol=1e-4)


def _script(folder, text):
    path = folder / "readme_block.py"
    path.write_text(text)
    return str(path)
