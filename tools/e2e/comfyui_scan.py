#!/usr/bin/env python3
"""List model folders as ComfyUI does, from an extra_model_paths.yaml.

    comfyui_scan.py --yaml FILE [--changed-after JSON]

ComfyUI is not on PyPI, so this does what its `folder_paths.py` does: every entry of each
section of the yaml (`base_path` joined with each folder, several folders a line apart, and the
old names `unet` → `diffusion_models`, `clip` → `text_encoders`), then for each folder key a
recursive listing that follows links (`os.listdir` and `os.path.isdir`, skipping `.git`), the
files kept by extension (`supported_pt_extensions`, and `.gguf` as ComfyUI-GGUF adds it for
`diffusion_models` and `text_encoders`), relative paths merged into one sorted set per key, and
the mtime of every folder seen recorded, as `get_filename_list_` caches them.

Prints one JSON object: {"lists": {key: [relative paths]}, "mtimes": {key: {folder: mtime}}}.
With `--changed-after` (an earlier run's output), also "stale": the keys whose cache
ComfyUI's `cached_filename_list_` would drop (a recorded folder's mtime changed, or a folder of
the key appeared).
"""

import argparse
import json
import os
import sys

SUPPORTED_PT_EXTENSIONS = {".ckpt", ".pt", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}
# ComfyUI-GGUF registers .gguf for these keys (its own unet_gguf/clip_gguf lists read them).
GGUF_KEYS = {"diffusion_models", "text_encoders"}
LEGACY = {"unet": "diffusion_models", "clip": "text_encoders"}


def folder_paths_from_yaml(path):
    import yaml

    with open(path) as f:
        config = yaml.safe_load(f)
    paths = {}
    for section in config.values():
        base = section.pop("base_path", None)
        base = os.path.expandvars(os.path.expanduser(base)) if base else None
        section.pop("is_default", None)
        for key, value in section.items():
            for folder in str(value).split("\n"):
                if not folder.strip():
                    continue
                full = os.path.join(base, folder.strip()) if base else folder.strip()
                paths.setdefault(LEGACY.get(key, key), []).append(os.path.normpath(full))
    return paths


def recursive_search(directory, excluded=(".git",)):
    if not os.path.isdir(directory):
        return [], {}
    result, dirs = [], {directory: os.path.getmtime(directory)}
    stack = [directory]
    while stack:
        current = stack.pop()
        for name in os.listdir(current):
            if name in excluded:
                continue
            path = os.path.join(current, name)
            if os.path.isdir(path):
                dirs[path] = os.path.getmtime(path)
                stack.append(path)
            else:
                result.append(os.path.relpath(path, directory))
    return result, dirs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--yaml", required=True)
    ap.add_argument("--changed-after")
    args = ap.parse_args()
    lists, mtimes = {}, {}
    paths = folder_paths_from_yaml(args.yaml)
    for key, folders in sorted(paths.items()):
        extensions = SUPPORTED_PT_EXTENSIONS | ({".gguf"} if key in GGUF_KEYS else set())
        if key == "diffusers":
            # ComfyUI lists Diffusers pipelines as the folders that hold a model_index.json.
            found, seen = set(), {}
            for folder in folders:
                files, dirs = recursive_search(folder)
                found.update(os.path.dirname(f) for f in files if os.path.basename(f) == "model_index.json")
                seen.update(dirs)
            lists[key], mtimes[key] = sorted(found), seen
            continue
        found, seen = set(), {}
        for folder in folders:
            files, dirs = recursive_search(folder)
            found.update(f for f in files if os.path.splitext(f)[-1].lower() in extensions)
            seen.update(dirs)
        lists[key], mtimes[key] = sorted(found), seen
    out = {"lists": lists, "mtimes": mtimes}
    if args.changed_after:
        with open(args.changed_after) as f:
            before = json.load(f)["mtimes"]
        stale = []
        for key, folders in before.items():
            changed = any(not os.path.isdir(d) or os.path.getmtime(d) != t for d, t in folders.items())
            new = any(os.path.isdir(d) and d not in folders for d in paths.get(key, []))
            if changed or new:
                stale.append(key)
        out["stale"] = sorted(stale)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
