//! Validation reports every problem at once, naming the item; parsing never panics.

use fsdp_ir::{parse_model, IrError};

const GOOD: &str = r#"(
  name: "t", architecture: "toy",
  modules: [(path: "", class: "Toy"), (path: "emb", class: "Embedding"), (path: "head", class: "Linear")],
  params: [
    (name: "emb.weight", shape: [10, 4], dtype: float32),
    (name: "head.weight", shape: [10, 4], dtype: float32, tied_to: Some("emb.weight")),
  ],
  inputs: [(name: "ids", shape: ["batch", "seq"], dtype: int64), (name: "labels", shape: ["batch", "seq"], dtype: int64)],
  ops: [
    (name: "emb", kind: Embedding, module: "emb", inputs: ["ids"], params: ["emb.weight"], shape: ["batch", "seq", 4]),
    (name: "head", kind: Linear(bias: false, transposed: false), module: "head", inputs: ["emb"], params: ["head.weight"], shape: ["batch", "seq", 10]),
    (name: "loss", kind: CrossEntropy(vocab: 10), module: "", inputs: ["head", "labels"], shape: []),
  ],
)"#;

#[test]
fn good_model_parses() {
    let m = parse_model(GOOD, "good.ron").unwrap();
    assert_eq!(m.total_numel(), 40);
}

#[test]
fn all_problems_at_once() {
    let bad = GOOD
        .replace(r#"shape: [10, 4], dtype: float32, tied_to"#, r#"shape: [10, 5], dtype: float32, tied_to"#)
        .replace(r#"inputs: ["emb"], params: ["head.weight"]"#, r#"inputs: ["nope"], params: ["head.weight"]"#)
        .replace(r#"module: "emb", inputs"#, r#"module: "missing", inputs"#)
        .replace(r#"shape: ["batch", "seq", 4])"#, r#"shape: ["batch", "tokens", 4])"#);
    let e = parse_model(&bad, "bad.ron").unwrap_err();
    let text = e.to_string();
    for want in [
        "param head.weight: tied to `emb.weight` but shapes differ",
        "op head: unknown input `nope`",
        "op emb: module `missing` is not declared",
        "unknown symbolic dimension `tokens`",
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
    assert!(e.problems().len() >= 4);
}

#[test]
fn shape_mismatch_and_cycle_and_overflow() {
    let bad = GOOD.replace(r#"shape: ["batch", "seq", 10]),"#, r#"shape: ["batch", "seq", 11]),"#);
    let t = parse_model(&bad, "x.ron").unwrap_err().to_string();
    assert!(t.contains("op head: output: shape [batch, seq, 11] but expected [batch, seq, 10]"), "{t}");
    let cyc = GOOD.replace(r#"inputs: ["ids"], params: ["emb.weight"]"#, r#"inputs: ["head"], params: ["emb.weight"]"#);
    let t = parse_model(&cyc, "x.ron").unwrap_err().to_string();
    assert!(t.contains("cycle") || t.contains("produced later"), "{t}");
    let big = GOOD.replace("shape: [10, 4], dtype: float32)", "shape: [18446744073709551615, 4], dtype: float32)");
    let t = parse_model(&big, "x.ron").unwrap_err().to_string();
    assert!(t.contains("overflows"), "{t}");
    let dup = GOOD.replace(r#"(path: "head", class: "Linear")"#, r#"(path: "emb", class: "Linear")"#);
    let t = parse_model(&dup, "x.ron").unwrap_err().to_string();
    assert!(t.contains("module emb: duplicate name"), "{t}");
}

#[test]
fn syntax_errors_have_line_and_column() {
    match parse_model("(\n name: \"t\",\n architecture: 5,\n)", "f.ron") {
        Err(IrError::Syntax { file, line, .. }) => {
            assert_eq!(file, "f.ron");
            assert_eq!(line, 3);
        }
        other => panic!("{other:?}"),
    }
}

proptest::proptest! {
    #[test]
    fn parsing_never_panics(s in "\\PC{0,200}") {
        let _ = parse_model(&s, "fuzz.ron");
    }

    #[test]
    fn mutated_model_never_panics(cut in 0usize..1400, ins in "[\\[\\](),:\"a-z0-9 ]{0,6}") {
        let mut t = GOOD.to_string();
        let cut = cut.min(t.len());
        if t.is_char_boundary(cut) {
            t.insert_str(cut, &ins);
        }
        let _ = parse_model(&t, "fuzz.ron");
    }
}
