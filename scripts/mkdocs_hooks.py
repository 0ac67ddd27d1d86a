"""mkdocs hook: repository files that the pages link to outside docs/ (benchmark and experiment results, the shipped
checkpoint's curves) become files of the site.

mkdocs serves only docs_dir. With this hook one relative link, e.g. `../benchmarks/results/full.md`,
works both in a code host's view of docs/ and in the built site, and a link to a missing file still
fails `mkdocs build --strict`.
"""

import pathlib

from mkdocs.structure.files import File, InclusionLevel

# Folders of the repository, relative to its root, whose files the pages may link to.
LINKED = ("benchmarks/results", "experiments/results", "checkpoints/fashion-mnist-vit")
SUFFIXES = {".md", ".json", ".png"}


class RepoFile(File):
    """A file outside docs_dir, copied as it is: its Markdown is shown as text, not built as a page."""

    def is_documentation_page(self):
        return False


def on_files(files, config):
    """Adds each file under LINKED as `../<path>` (its path seen from docs/), copied to `repo/<path>`."""
    docs = pathlib.Path(config["docs_dir"]).resolve()
    root = docs.parent
    for folder in LINKED:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES:
                rel = path.relative_to(root).as_posix()
                files.append(RepoFile(f"../{rel}", str(docs), config["site_dir"], False, dest_uri=f"repo/{rel}",
                                      inclusion=InclusionLevel.INCLUDED))  # a "../" path counts as hidden
    return files
