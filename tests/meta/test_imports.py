"""The import graph of the repository's packages, read from the source with `ast` (imports inside
functions included, since a deferred import is still a dependency): it has no cycles, no module
imports from a layer above its own or from a sibling of its layer (keras_vit -> commands ->
training | apps -> benchmarks -> experiments: apps and training import nothing of each other), and
no study imports another."""

import ast
import os

import pytest
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

# Lowest first: a package may import itself and the layers before its own, not its layer's others.
LAYERS = (("keras_vit",), ("commands",), ("training", "apps"), ("benchmarks",), ("experiments",))
PACKAGES = tuple(p for layer in LAYERS for p in layer)


def modules(root=ROOT):
    """{dotted module name: source path} of every .py file of the packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), root)[: -len(".py")]
                    found[rel.replace(os.sep, ".").removesuffix(".__init__")] = os.path.join(folder, name)
    return found


def _known(name, known):
    """The module that `name` (a module, or an attribute of one) is defined in, or None."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node, module, is_package, known):
    """The modules of the packages that one `import` or `from ... import` statement loads."""
    if isinstance(node, ast.Import):
        return [_known(alias.name, known) for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1 more
        parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join(parts + ([base] if base else []))
    # `from a.b import c` loads a.b.c when c is a module, else a.b.
    return [_known(f"{base}.{alias.name}", known) for alias in node.names]


def import_graph(root=ROOT):
    """{module: {imported module: "path:line" of the first such import}} within the packages."""
    known = modules(root)
    graph = {}
    for module, path in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges = graph.setdefault(module, {})
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, path.endswith("__init__.py"), known):
                if target and target != module:
                    edges.setdefault(target, f"{os.path.relpath(path, root)}:{node.lineno}")
    return graph


def cycles(graph):
    """For each set of modules that import one another in a circle: the imports inside it,
    ["a -> b (path:line)", ...]."""
    return [[f"{a} -> {b} ({graph[a][b]})" for a in sorted(c) for b in sorted(graph[a]) if b in c]
            for c in _components(graph)]


def _components(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        result.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


def upward_imports(graph):
    """["where: a imports b (a's package may import only ...)"] for each import from a higher layer
    or from another package of the same layer."""
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    bad = []
    for module, edges in sorted(graph.items()):
        package = module.split(".")[0]
        allowed = (package, *(p for names in LAYERS[: layer[package]] for p in names))
        for target, where in sorted(edges.items()):
            if target.split(".")[0] not in allowed:
                bad.append(f"{where}: {module} imports {target} ({package} may import only {', '.join(allowed)})")
    return bad


def study_of(module):
    """The study that `module` belongs to, or None: a module or folder of benchmarks.studies or of
    experiments (whose helper module, experiments.common, is no study)."""
    parts = module.split(".")
    if parts[:2] == ["benchmarks", "studies"] and len(parts) > 2:
        return ".".join(parts[:3])
    if parts[0] == "experiments" and len(parts) > 1 and parts[1] != "common":
        return ".".join(parts[:2])
    return None


def cross_study_imports(graph):
    """["where: a imports b"] for each study that imports another study."""
    return [f"{where}: {module} imports {target}" for module, edges in sorted(graph.items())
            for target, where in sorted(edges.items())
            if study_of(module) and study_of(target) and study_of(target) != study_of(module)]


def test_the_graph_is_read_from_the_source():
    # Guards the test itself: known edges, a deferred one among them, are found.
    graph = import_graph()
    assert "keras_vit.layers.attention" in graph["keras_vit.layers"]
    assert "training.recipes" in graph["training.train"]
    assert "training.distribute" in graph["training.train"]  # imported inside a function
    assert "keras_vit" in graph["apps.sources"]
    assert "experiments.common" in graph["experiments.ood.__main__"]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (deferred imports included):\n" + "\n".join("; ".join(c) for c in found)


def test_no_upward_or_sideways_imports():
    # apps/ and training/ share only keras_vit and commands/: the demo never loads training's modules.
    bad = upward_imports(import_graph())
    assert not bad, ("imports from a higher layer or a sibling (keras_vit -> commands -> training | apps -> "
                     "benchmarks -> experiments):\n" + "\n".join(bad))


def test_no_study_imports_another():
    # What two studies share lives in the library, experiments.common or the benchmark harness.
    bad = cross_study_imports(import_graph())
    assert not bad, "a study imports another study:\n" + "\n".join(bad)


def test_a_cycle_and_an_upward_import_are_caught(tmp_path):
    files = {"keras_vit/__init__.py": "", "keras_vit/a.py": "def f():\n    from keras_vit import b\n",
             "keras_vit/b.py": "from . import a\nimport training.t\n", "training/t.py": "",
             "apps/x.py": "from training import t\n", "experiments/one.py": "import experiments.two\n",
             "experiments/two.py": "from experiments import common\n", "experiments/common.py": ""}
    for module, source in files.items():
        (tmp_path / module).parent.mkdir(exist_ok=True)
        (tmp_path / module).write_text(source)
    graph = import_graph(str(tmp_path))
    assert cycles(graph) == [[f"keras_vit.a -> keras_vit.b ({os.path.join('keras_vit', 'a.py')}:2)",
                              f"keras_vit.b -> keras_vit.a ({os.path.join('keras_vit', 'b.py')}:1)"]]
    assert upward_imports(graph) == [
        f"{os.path.join('apps', 'x.py')}:1: apps.x imports training.t (apps may import only apps, keras_vit, commands)",
        f"{os.path.join('keras_vit', 'b.py')}:2: keras_vit.b imports training.t (keras_vit may import only keras_vit)"]
    assert cross_study_imports(graph) == [
        f"{os.path.join('experiments', 'one.py')}:1: experiments.one imports experiments.two"]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_import_keras_vit_loads_no_publishing_client_and_no_other_backend(backend):
    import subprocess
    import sys

    # Keras itself imports huggingface_hub (keras.src.saving.saving_lib), so what keras_vit adds is
    # measured against a process that imported Keras.
    code = ("import sys, keras\n"
            "top = lambda: {m.split('.')[0] for m in sys.modules}\n"
            "keras_only = top()\n"
            "import keras_vit\n"
            "before = top() - keras_only\n"
            "assert 'push_to_hub' in dir(keras_vit) and 'push_to_hub' in keras_vit.__all__\n"
            "push = keras_vit.push_to_hub\n"
            "after = top()\n"
            "try:\n"
            "    keras_vit.no_such_name\n"
            "except AttributeError as e:\n"
            "    missing = str(e)\n"
            "print(sorted(before & {'httpx', 'httpx2', 'huggingface_hub', 'jax', 'tensorflow', 'torch'}), "
            "sorted(after & {'httpx2'}), push.__module__, missing)\n")
    env = {**os.environ, "KERAS_BACKEND": backend}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == (
        "[] ['httpx2'] keras_vit.checkpoints.publish module 'keras_vit' has no attribute 'no_such_name'"), run.stdout


def test_a_jax_process_saves_for_transformers_without_tensorflow_and_transformers_loads_it(tmp_path):
    # With TensorFlow imported, a JAX process dies (SIGSEGV) when transformers then imports torch.
    import subprocess
    import sys

    code = ("import sys, numpy as np, keras_vit\n"
            "model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,"
            " num_classes=3)\n"
            f"keras_vit.save_checkpoint(model, {str(tmp_path / 'hf')!r}, format='transformers')\n"
            "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
            "import torch, transformers\n"
            f"theirs = transformers.ViTForImageClassification.from_pretrained({str(tmp_path / 'hf')!r}).eval()\n"
            "x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype('float32')\n"
            "with torch.no_grad():\n"
            "    logits = theirs(pixel_values=torch.from_numpy((x / 127.5 - 1).transpose(0, 3, 1, 2))).logits.numpy()\n"
            "print('difference:', float(np.abs(np.asarray(model(model.normalize(x))) - logits).max()))\n")
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "tensorflow imported: False" in lines, run.stdout
    assert float(lines[-1].split()[-1]) < 1e-4, run.stdout


def test_the_benchmark_harness_imports_no_study():
    # The studies build on the harness; what the harness needs from a study belongs in the harness.
    def study(name):
        return name == "benchmarks.studies" or name.startswith("benchmarks.studies.")

    bad = [f"{where}: {module} imports {target}" for module, edges in sorted(import_graph().items())
           if module.split(".")[0] == "benchmarks" and not study(module)
           for target, where in sorted(edges.items()) if study(target)]
    assert not bad, "the benchmark harness imports a study:\n" + "\n".join(bad)


def test_training_help_and_flag_checks_load_no_deep_learning_library():
    # `--help` and a bad flag are answered before Keras or a backend loads: the CLI's modules import
    # them inside the functions that need them (training.distribute's flags live beside its engines).
    import subprocess
    import sys

    code = ("import runpy, sys\n"
            "heavy = {'keras', 'keras_vit', 'tensorflow', 'jax', 'torch'}\n"
            "for argv in (['--help'], ['--distribution', 'nope'], ['--checkpoint-format', 'nope']):\n"
            "    sys.argv = ['train', *argv]\n"
            "    try:\n"
            "        runpy.run_module('training.train', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        print('exit', e.code, sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    exits = [line for line in run.stdout.splitlines() if line.startswith("exit")]
    assert exits == ["exit 0 []", "exit 2 []", "exit 2 []"], run.stdout[-2000:]
    assert "--checkpoint-format {keras,orbax}" in run.stdout and "--distribution {none,mirrored" in run.stdout
    assert "invalid choice: 'nope'" in run.stderr
