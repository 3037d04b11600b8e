use super::*;
use crate::layout::convert::table;

#[test]
fn the_clip_vocabulary_has_clips_ids() {
    let vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&configs::clip_vocab(include_str!(
            "../../../fs-layout/tokenizers/clip/merges.txt"
        )))
        .unwrap();
    assert_eq!(vocab.len(), 49408);
    assert_eq!(vocab["!"], 0);
    assert_eq!(vocab["<|startoftext|>"], 49406);
    assert_eq!(vocab["<|endoftext|>"], 49407);
    assert_eq!(
        vocab["in"], 512,
        "the first merge follows the 512 byte tokens"
    );
}

#[test]
fn an_sd2_file_needs_its_prediction_type_declared_or_marked() {
    let t = table();
    let family = &t.families["sd2"];
    let mut marked = Marked::new();
    let err = decide(family, &mut marked, None, &[]).unwrap_err();
    assert!(
        err.contains("--prediction-type epsilon|v_prediction"),
        "{err}"
    );
    decide(family, &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    assert_eq!(marked["unet"]["sample_size"], 96);
    assert_eq!(marked["vae"]["sample_size"], 768);
    // A file's marker answers too (`v_pred`, modelspec.prediction_type), and the flag
    // overrides it.
    let mut marked = Marked::new();
    marked
        .entry("scheduler".into())
        .or_default()
        .insert("prediction_type".into(), "epsilon".into());
    decide(family, &mut marked, None, &[]).unwrap();
    assert_eq!(marked["unet"]["sample_size"], 64);
    decide(family, &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    // A family that knows what its files predict takes the flag as a scheduler value.
    let mut marked = Marked::new();
    decide(&t.families["sd1"], &mut marked, Some("v_prediction"), &[]).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    assert!(!marked.contains_key("unet"));
}

#[test]
fn a_prediction_type_the_table_does_not_know_is_named() {
    let t = table();
    let metadata = [("modelspec.prediction_type".to_owned(), "eps".to_owned())];
    let err = decide(&t.families["sd2"], &mut Marked::new(), None, &metadata).unwrap_err();
    assert!(
        err.contains("modelspec.prediction_type \"eps\" is none the table knows"),
        "{err}"
    );
    assert!(
        err.contains("--prediction-type epsilon|v_prediction"),
        "{err}"
    );
}

#[test]
fn a_text_encoder_with_projection_needs_its_projection() {
    use crate::layout::convert::Renamed;
    let tensor = |key: &str, shape: &[u64]| Renamed {
        source: 0,
        key: key.to_owned(),
        shape: shape.to_vec(),
        part: None,
        transposed: false,
    };
    let mut tensors = vec![
        tensor("text_model.embeddings.token_embedding.weight", &[100, 64]),
        tensor("text_model.embeddings.position_embedding.weight", &[77, 64]),
        tensor("text_model.encoder.layers.0.mlp.fc1.weight", &[128, 64]),
    ];
    let family = &table().families["sdxl"];
    let class = (
        "transformers".to_owned(),
        "CLIPTextModelWithProjection".to_owned(),
    );
    let config = |tensors: &[Renamed]| {
        configs::config(
            &class,
            family,
            &Default::default(),
            "text_encoder_2",
            tensors,
            "F32",
        )
    };
    let err = config(&tensors).unwrap_err();
    assert!(err.contains("no text projection"), "{err}");
    tensors.push(tensor("text_projection.weight", &[32, 64]));
    assert_eq!(config(&tensors).unwrap()["projection_dim"], 32);
    // No layers left (an SD 2.x encoder of one layer, which is the unused last one).
    let plain = ("transformers".to_owned(), "CLIPTextModel".to_owned());
    let err = configs::config(
        &plain,
        family,
        &Default::default(),
        "text_encoder",
        &tensors[..2],
        "F32",
    )
    .unwrap_err();
    assert!(err.contains("no encoder layers"), "{err}");
}
