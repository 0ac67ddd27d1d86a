"""`push_to_hub`: a model written by `save_checkpoint` into a folder, uploaded to a Hugging Face Hub
repo in one commit, so that `keras_vit.load("hf://org/name")` reads it back."""

import json
import os
import tempfile

import httpx2  # huggingface_hub's HTTP client: a connection lost mid-commit is its error
import huggingface_hub

from keras_vit.checkpoints import save_checkpoint

# The repo layout of each format: the files that `keras_vit.hub` looks for.
_FORMATS = ("transformers", "keras_hub", "timm")


def push_to_hub(model, repo_id, format="transformers", private=None, commit_message=None, token=None):
    """Uploads `model` to the Hub repo `repo_id` ("org/name") in the layout of `format`.

    "transformers" and "keras_hub" upload the folder that `save_checkpoint` writes; "timm" a
    model.safetensors with a timm config.json beside it. The repo is created if missing
    (`private` as given); the files go up in one commit (`commit_message`), so a cut upload leaves
    the repo as it was. The token is `token`, else huggingface_hub's (HF_TOKEN, or a saved login);
    the endpoint is HF_ENDPOINT's, else the Hub. Returns the commit's URL.
    """
    if format not in _FORMATS:
        raise ValueError(f"format={format!r} is not supported by push_to_hub; use one of {_FORMATS}")
    api = huggingface_hub.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    with tempfile.TemporaryDirectory() as folder:
        if format == "timm":
            save_checkpoint(model, os.path.join(folder, "model.safetensors"), format="timm")
            with open(os.path.join(folder, "config.json"), "w") as f:  # what marks a timm repo
                json.dump({"architecture": "vit_keras_vit", "num_classes": model.num_classes}, f)
        else:
            save_checkpoint(model, folder, format=format)
        api.create_repo(repo_id, private=private, exist_ok=True)
        try:
            info = api.upload_folder(repo_id=repo_id, folder_path=folder,
                                     commit_message=commit_message or f"Upload {model.name} ({format}) from keras_vit")
        except (OSError, httpx2.HTTPError) as e:  # huggingface_hub's HTTP errors are both
            raise ConnectionError(f"pushing to {repo_id} failed ({e}); the repo is as it was, the commit is "
                                  "all or nothing") from e
    return info.commit_url
