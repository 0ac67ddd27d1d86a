"""The README's one-screen example runs as written."""

import pathlib
import re
import runpy


def test_readme_core_example_runs(tmp_path, monkeypatch):
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    core = readme.split("<!-- section: core -->")[1].split("<!-- /section: core -->")[0]
    script = tmp_path / "readme_example.py"
    script.write_text(re.search(r"```python\n(.*?)```", core, re.S).group(1))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / "vit.keras").exists()
