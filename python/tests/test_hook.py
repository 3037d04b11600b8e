"""The start-up hook (`COZYTENSORS_HOOK=1`): unmodified Transformers and Diffusers loads of a
mounted model read its tensors from the store's blobs, in worker processes too, and the hook
imports nothing heavy at start-up.

Needs the `tensorfs` binary and /dev/fuse (`mounts.py`).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mounts import prerequisites, status, tensorfs, unmount


def python(code, hook=True, **env):
    """Runs `code` in a new interpreter (the hook's `.pth` runs at its start); returns its
    last stdout line as JSON."""
    environ = {**os.environ, **env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    environ.pop("COZYTENSORS_HOOK", None)
    if hook:
        environ["COZYTENSORS_HOOK"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def bytes_served(mnt):
    return status(mnt)["bytes_served"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny BERT (Transformers), a tiny UNet (Diffusers) and a single-file checkpoint
    (ComfyUI), saved, imported and mounted without views (so every byte a loader reads through
    the mount reaches the daemon)."""
    prerequisites()
    import diffusers
    import safetensors.torch
    import torch
    import transformers

    work = tmp_path_factory.mktemp("hook")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=3000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512,
    )
    transformers.BertModel(config).save_pretrained(work / "bert")
    diffusers.UNet2DModel(
        sample_size=8, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
    ).save_pretrained(work / "unet")
    store, mnt = work / "store", work / "mnt"
    tensorfs(store, "import", work / "bert", "--name", "local/bert")
    tensorfs(store, "import", work / "unet", "--name", "local/unet")
    # A single-file checkpoint, as ComfyUI loads them.
    unet = safetensors.torch.load_file(work / "unet" / "diffusion_pytorch_model.safetensors")
    safetensors.torch.save_file(
        {f"model.diffusion_model.{k}": torch.randn_like(v) for k, v in unet.items()},
        str(work / "checkpoint.safetensors"),
    )
    tensorfs(store, "import", work / "checkpoint.safetensors", "--name", "local/checkpoint")
    mnt.mkdir()
    tensorfs(store, "mount", mnt, "--view-cache", "0", "--log-file", work / "mount.log")
    try:
        yield {"work": work, "mnt": mnt}
    finally:
        unmount(mnt)


def lane(mnt, name):
    latest = mnt / "local" / name / "latest"
    return latest / sorted(os.listdir(latest))[0]


def test_the_hook_imports_nothing_heavy_at_start_up():
    said = python(
        """
        import json, sys
        print(json.dumps({m: m in sys.modules for m in ["cozytensors._hook", "safetensors", "torch", "numpy"]}))
        """
    )
    assert said == {"cozytensors._hook": True, "safetensors": False, "torch": False, "numpy": False}
    said = python("import json, sys; print(json.dumps('cozytensors._hook' in sys.modules))", hook=False)
    assert said is False, "off unless asked for"


# What each loader runs, unmodified, giving `state` (name → tensor) from `PATH`.
LOADERS = {
    "transformers": """
        import transformers
        state = transformers.AutoModel.from_pretrained(PATH).state_dict()
    """,
    "diffusers": """
        import diffusers
        state = diffusers.UNet2DModel.from_pretrained(PATH).state_dict()
    """,
    # ComfyUI's comfy.utils.load_torch_file for a .safetensors checkpoint (its calls, as
    # its source makes them), and the `load_file` it used before.
    "comfyui": """
        import safetensors, safetensors.torch, torch
        device = torch.device("cpu")
        with safetensors.safe_open(PATH, framework="pt", device=device.type) as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
            metadata = f.metadata()
        assert state.keys() == safetensors.torch.load_file(PATH, device=device.type).keys()
    """,
}


@pytest.mark.parametrize("name,loader", [
    ("bert", "transformers"),
    ("unet", "diffusers"),
    ("checkpoint", "comfyui"),
])
def test_unmodified_loaders_read_mounted_tensors_from_the_blobs(models, name, loader):
    mounted = lane(models["mnt"], name)
    weights = next(p for p in mounted.iterdir() if p.suffix == ".safetensors")
    source = models["work"] / name
    if loader == "comfyui":  # a single file
        mounted, source = weights, source.with_suffix(".safetensors")
    code = textwrap.dedent(LOADERS[loader]) + textwrap.dedent("""
        import hashlib, json, torch
        digest = hashlib.sha256()
        for key, value in sorted(state.items()):
            digest.update(key.encode()); digest.update(value.contiguous().view(torch.uint8).numpy().tobytes())
        print(json.dumps({"digest": digest.hexdigest(),
                          "hooked": hasattr(safetensors.safe_open, "__wrapped__")}))
    """)
    code = "import safetensors\nPATH = " + repr(str(mounted)) + "\n" + code
    before = bytes_served(models["mnt"])
    ours = python(code)
    served = bytes_served(models["mnt"]) - before
    theirs = python(code.replace(repr(str(mounted)), repr(str(source))), hook=False)
    assert ours["hooked"]
    assert ours["digest"] == theirs["digest"], "the same weights"
    size = weights.stat().st_size
    # Configs and the safetensors header cross FUSE; the tensors do not.
    assert served < size / 4, f"{served} bytes served of a {size}-byte file"
    # Without the hook the same load reads the tensors through the mount (the first time: the
    # page cache keeps them after), which is what the count above would show.
    before = bytes_served(models["mnt"])
    python(code, hook=False)
    assert bytes_served(models["mnt"]) - before >= size / 2


def test_worker_processes_are_hooked_too(models):
    weights = lane(models["mnt"], "bert") / "model.safetensors"
    code = f"""
        import json, multiprocessing as mp

        def load(path):
            import hashlib, safetensors, safetensors.torch
            tensors = safetensors.torch.load_file(path)
            digest = hashlib.sha256(b"".join(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes() for _, t in sorted(tensors.items())))
            with safetensors.safe_open(path, framework="pt") as f:
                from_blobs = getattr(f, "_fast", False)  # cozytensors' own, on the mount
            return digest.hexdigest(), from_blobs

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(json.dumps(pool.apply(load, ({str(weights)!r},))))
    """
    path = models["work"] / "worker.py"
    path.write_text(textwrap.dedent(code))
    environ = {**os.environ, "COZYTENSORS_HOOK": "1"}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=environ)
    assert out.returncode == 0, out.stderr
    digest, from_blobs = json.loads(out.stdout.strip().splitlines()[-1])
    assert from_blobs, "the spawned worker ran the hook and read the blobs"
    import hashlib
    import safetensors.torch
    import torch

    expected = safetensors.torch.load_file(models["work"] / "bert" / "model.safetensors")
    want = hashlib.sha256(
        b"".join(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for _, t in sorted(expected.items()))
    ).hexdigest()
    assert digest == want


def test_the_patched_safe_open_is_still_a_class_for_isinstance(models):
    weights = lane(models["mnt"], "bert") / "model.safetensors"
    local = models["work"] / "bert" / "model.safetensors"
    said = python(
        f"""
        import json, safetensors, cozytensors
        mounted = safetensors.safe_open({str(weights)!r}, framework="pt")
        elsewhere = safetensors.safe_open({str(local)!r}, framework="pt")
        try:  # safetensors takes str paths only: its own TypeError
            safetensors.safe_open({os.fsencode(str(weights))!r}, framework="pt")
            as_bytes = "opened"
        except TypeError as e:
            as_bytes = "filename" in str(e)
        print(json.dumps([isinstance(mounted, safetensors.safe_open),
                          isinstance(elsewhere, safetensors.safe_open),
                          isinstance(mounted, cozytensors.safe_open),
                          getattr(mounted, "_fast", False),
                          isinstance(3, safetensors.safe_open),
                          as_bytes]))
        """
    )
    assert said == [True, True, True, True, False, True]
