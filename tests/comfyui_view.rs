//! The ComfyUI view `MOUNT/@comfyui` on a real mount, listed as ComfyUI's `folder_paths` lists
//! model folders (`tools/e2e/comfyui_scan.py`): each model once, in the folder of its kind,
//! as the lane's own inode; a folder's mtime moves when an import adds to it.

mod common;
mod fuse_support;
mod skip;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::T;
use safetensors::Dtype::F32;
use tensorfs::store::Store;

/// A safetensors file of F32 tensors named `keys`, each of 4 values.
fn weights(keys: &[&str]) -> Vec<u8> {
    let tensors: Vec<T> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| T(k, F32, vec![4], common::bytes(16, i as u8)))
        .collect();
    common::safetensors_file(&tensors, None)
}

/// ComfyUI's listing of every folder key of `yaml`, and which keys' caches a change since
/// `before` (an earlier listing's file) makes stale.
fn scan(python: &Path, yaml: &Path, before: Option<&Path>) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/e2e/comfyui_scan.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg("--yaml").arg(yaml);
    if let Some(before) = before {
        cmd.arg("--changed-after").arg(before);
    }
    let out = cmd.output().expect("python runs");
    assert!(
        out.status.success(),
        "comfyui_scan.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn comfyui_lists_each_model_once_in_the_folder_of_its_kind() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with PyYAML)");
        return;
    };
    let python = Path::new(&python);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files = [
        (
            "style",
            weights(&[
                "lora_unet_a.alpha",
                "lora_unet_a.lora_down.weight",
                "lora_unet_a.lora_up.weight",
            ]),
        ),
        (
            "sd15",
            weights(&[
                "cond_stage_model.transformer.text_model.embeddings.position_ids",
                "first_stage_model.decoder.conv_in.weight",
                "model.diffusion_model.input_blocks.0.0.weight",
            ]),
        ),
        (
            "ae",
            weights(&["decoder.conv_in.weight", "encoder.conv_in.weight"]),
        ),
        (
            "flux",
            weights(&["double_blocks.0.img_attn.qkv.weight", "img_in.weight"]),
        ),
        (
            "t5",
            weights(&[
                "encoder.block.0.layer.0.SelfAttention.k.weight",
                "shared.weight",
            ]),
        ),
        ("head", weights(&["classifier.weight"])),
    ];
    for (name, bytes) in &files {
        common::write_tree(&src, &[(&format!("{name}.safetensors"), bytes.clone())]);
    }
    let root = dir.path().join("store");
    for (name, _) in &files {
        let file = src.join(format!("{name}.safetensors"));
        common::ok(
            &root,
            &[
                "import",
                file.to_str().unwrap(),
                "--name",
                &format!("local/{name}"),
            ],
        );
    }
    // A Transformers folder is no ComfyUI model: its weights are left out.
    let bert = dir.path().join("bert");
    common::transformers_folder(&bert);
    common::ok(
        &root,
        &["import", bert.to_str().unwrap(), "--name", "local/bert"],
    );
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    let view = m.path("@comfyui");
    let yaml = dir.path().join("extra_model_paths.yaml");
    let template = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fs-layout/extra_model_paths.yaml"),
    )
    .unwrap();
    fs::write(
        &yaml,
        template.replace("~/models/@comfyui", view.to_str().unwrap()),
    )
    .unwrap();

    let listed = scan(python, &yaml, None);
    let lists = &listed["lists"];
    let names = |key: &str| -> Vec<String> {
        lists[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {lists}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names("loras"), ["local/style.safetensors"]);
    assert_eq!(names("checkpoints"), ["local/sd15.safetensors"]);
    assert_eq!(names("vae"), ["local/ae.safetensors"]);
    assert_eq!(
        names("diffusion_models"),
        ["local/flux.safetensors"],
        "unet/ and diffusion_models/ list one file once"
    );
    assert_eq!(names("text_encoders"), ["local/t5.safetensors"]);
    let total: usize = lists
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_array().unwrap().len())
        .sum();
    assert_eq!(total, 5, "each model once over every folder: {lists}");
    // The same inode as the lane folder's file.
    let lane = fuse_support::list(&m.path("local/style/latest")).remove(0);
    assert_eq!(
        fs::metadata(view.join("loras/local/style.safetensors"))
            .unwrap()
            .ino(),
        fs::metadata(m.path(&format!("local/style/latest/{lane}/style.safetensors")))
            .unwrap()
            .ino()
    );
    // What no rule takes is listed by `ls --comfyui`, with why.
    let said = common::ok(&root, &["ls", "--comfyui"]);
    assert!(
        said.lines()
            .any(|l| l.starts_with("left out\tlocal/head/latest/")
                && l.contains("classifier.weight")),
        "{said}"
    );
    assert!(said.contains("left out\tlocal/bert/latest/"), "{said}");
    assert!(
        said.contains("loras/local/style.safetensors\tlocal/style/latest/"),
        "{said}"
    );

    // An import while mounted moves the mtime of the folders it adds to, so ComfyUI lists
    // them again, and only them.
    let before = dir.path().join("before.json");
    fs::write(&before, serde_json::to_vec(&listed).unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let lora = src.join("detail.safetensors");
    fs::write(
        &lora,
        weights(&["lora_te_x.lora_down.weight", "lora_te_x.lora_up.weight"]),
    )
    .unwrap();
    common::ok(
        &root,
        &["import", lora.to_str().unwrap(), "--name", "local/detail"],
    );
    fuse_support::wait_for(
        || view.join("loras/local/detail.safetensors").exists(),
        "the new LoRA in the view",
    );
    let after = scan(python, &yaml, Some(&before));
    assert_eq!(after["stale"], serde_json::json!(["loras"]), "{after}");
    assert_eq!(
        after["lists"]["loras"],
        serde_json::json!(["local/detail.safetensors", "local/style.safetensors"])
    );

    // A repo's first lane keeps the bare name when it is imported again, and a name another
    // repo's lane would also take (`sd15.f16`) goes to the repo that comes first.
    let half = |keys: &[&str]| {
        let tensors: Vec<T> = keys
            .iter()
            .map(|k| T(k, safetensors::Dtype::F16, vec![4], common::bytes(8, 7)))
            .collect();
        common::safetensors_file(&tensors, None)
    };
    let ckpt = [
        "cond_stage_model.transformer.text_model.embeddings.position_ids",
        "first_stage_model.decoder.conv_in.weight",
        "model.diffusion_model.input_blocks.0.0.weight",
    ];
    let f16 = src.join("f16/sd15.safetensors");
    common::write_tree(&src.join("f16"), &[("sd15.safetensors", half(&ckpt))]);
    common::ok(
        &root,
        &["import", f16.to_str().unwrap(), "--name", "local/sd15"],
    );
    let v2 = src.join("v2/sd15.safetensors");
    let mut changed = weights(&ckpt);
    *changed.last_mut().unwrap() ^= 1;
    common::write_tree(&src.join("v2"), &[("sd15.safetensors", changed.clone())]);
    common::ok(
        &root,
        &["import", v2.to_str().unwrap(), "--name", "local/sd15"],
    );
    let clash = src.join("clash/x.safetensors");
    common::write_tree(&src.join("clash"), &[("x.safetensors", weights(&ckpt[..]))]);
    common::ok(
        &root,
        &[
            "import",
            clash.to_str().unwrap(),
            "--name",
            "local/sd15.f16",
        ],
    );
    let checkpoints = view.join("checkpoints/local");
    fuse_support::wait_for(
        || fs::read(checkpoints.join("sd15.safetensors")).is_ok_and(|b| b == changed),
        "the re-imported first lane under its bare name",
    );
    assert_eq!(
        fs::read(checkpoints.join("sd15.f16.safetensors")).unwrap(),
        half(&ckpt),
        "the name goes to local/sd15, the repo that comes first"
    );
    let said = common::ok(&root, &["ls", "--comfyui"]);
    assert!(
        said.lines()
            .any(|l| l.starts_with("left out\tlocal/sd15.f16/latest/")
                && l.contains("is taken by \"local/sd15\"")),
        "{said}"
    );
    m.unmount();
}

/// Where the blob of `id` (`sha256:<hex>`) lives in store `root`.
fn blob(root: &Path, id: &str) -> std::path::PathBuf {
    let hex = id.strip_prefix("sha256:").expect("an object id");
    root.join(format!("blobs/{}/{}/{hex}", &hex[..2], &hex[2..4]))
}

#[test]
fn a_lane_that_cannot_be_read_is_left_out_with_a_log_line_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let mut headers = Vec::new();
    for (name, key) in [("good", "lora_unet_a"), ("broken", "lora_unet_b")] {
        let file = dir.path().join(format!("{name}.safetensors"));
        let keys = [
            format!("{key}.lora_down.weight"),
            format!("{key}.lora_up.weight"),
        ];
        fs::write(&file, weights(&keys.each_ref().map(String::as_str))).unwrap();
        let said = common::ok(
            &root,
            &[
                "import",
                file.to_str().unwrap(),
                "--name",
                &format!("local/{name}"),
                "--json",
            ],
        );
        let said: serde_json::Value = serde_json::from_str(&said).unwrap();
        headers.push(said["lanes"][0]["header"].as_str().unwrap().to_owned());
    }
    // The header of local/broken is gone: its commit still names its lane, its files cannot
    // be shown.
    fs::remove_file(blob(&root, &headers[1])).unwrap();
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    assert_eq!(
        fuse_support::list(&m.path("@comfyui/loras/local")),
        ["good.safetensors"]
    );
    let logs = fuse_support::logs();
    let line = logs
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("left out of the ComfyUI view"))
        .unwrap_or_else(|| panic!("no line says the lane is left out:\n{logs}"));
    assert!(
        !line.contains("answering EIO"),
        "listing the view answered no error: {line}"
    );
    m.unmount();
}

/// The table against the libraries that write the models (`tools/fixtures/comfyui_producers.py`):
/// each tiny model saved by diffusers or transformers, imported as the component folder it is,
/// is shown once, in the ComfyUI folder of its class.
#[test]
fn models_saved_by_their_own_libraries_go_to_the_folder_of_their_class() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with diffusers and transformers)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/comfyui_producers.py");
    let out = Command::new(python)
        .arg(script)
        .arg(dir.path().join("made"))
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "comfyui_producers.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let made: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap();
    let made = made.as_object().unwrap();
    let root = dir.path().join("store");
    for (name, model) in made {
        common::ok(
            &root,
            &[
                "import",
                model["folder"].as_str().unwrap(),
                "--name",
                &format!("local/{name}"),
            ],
        );
    }
    let said = common::ok(&root, &["ls", "--comfyui"]);
    let wrong: Vec<String> = made
        .iter()
        .filter_map(|(name, model)| {
            let expect = model["expect"].as_str().unwrap();
            let want = format!("{expect}/local/{name}.safetensors\tlocal/{name}/latest/");
            let lines: Vec<&str> = said
                .lines()
                .filter(|l| l.contains(&format!("local/{name}/latest/")))
                .collect();
            (lines.len() != 1 || !lines[0].starts_with(&want))
                .then(|| format!("{} ({name}) wants {expect}/: {lines:?}", model["class"]))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// GGUF files go where ComfyUI-GGUF's loaders look: a diffusion model under
/// `diffusion_models/` (and `unet/`), a llama.cpp text model under `text_encoders/` (and
/// `clip/`), byte for byte.
#[test]
fn gguf_files_go_where_comfyui_gguf_looks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    for name in ["comfy-flux", "tiny-llama"] {
        let file = data.join(format!("{name}.gguf"));
        common::ok(
            &root,
            &[
                "import",
                file.to_str().unwrap(),
                "--name",
                &format!("local/{name}"),
            ],
        );
    }
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    for (folders, name) in [
        (["diffusion_models", "unet"], "comfy-flux"),
        (["text_encoders", "clip"], "tiny-llama"),
    ] {
        for folder in folders {
            let shown = m.path(&format!("@comfyui/{folder}/local/{name}.gguf"));
            assert_eq!(
                fs::read(&shown).unwrap_or_else(|e| panic!("{}: {e}", shown.display())),
                fs::read(data.join(format!("{name}.gguf"))).unwrap()
            );
        }
    }
    m.unmount();
}
