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
    let err = decide(family, &mut marked, None).unwrap_err();
    assert!(
        err.contains("--prediction-type epsilon|v_prediction"),
        "{err}"
    );
    decide(family, &mut marked, Some("v_prediction")).unwrap();
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
    decide(family, &mut marked, None).unwrap();
    assert_eq!(marked["unet"]["sample_size"], 64);
    decide(family, &mut marked, Some("v_prediction")).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    // A family that knows what its files predict takes the flag as a scheduler value.
    let mut marked = Marked::new();
    decide(&t.families["sd1"], &mut marked, Some("v_prediction")).unwrap();
    assert_eq!(marked["scheduler"]["prediction_type"], "v_prediction");
    assert!(!marked.contains_key("unet"));
}
