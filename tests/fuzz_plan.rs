//! Proptest "fuzz" target over RON parsing + planning: mutated model files and random
//! options never panic; they either plan (and pass the checker) or return an error.

use fsdp_planner::{Layout, Options, Policy};
use proptest::prelude::*;

fn base() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-gpt2.ron")).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn mutated_models_plan_or_error(
        pos in 0usize..20000, del in 0usize..8, ins in "[\\[\\](),:\"a-z0-9_. ]{0,8}",
        ws in 0u64..6, flat: bool, policy in 0usize..4, seq in 0u64..5,
    ) {
        let mut t = base();
        let pos = pos % t.len().max(1);
        if t.is_char_boundary(pos) && t.is_char_boundary((pos + del).min(t.len())) {
            t.replace_range(pos..(pos + del).min(t.len()), &ins);
        }
        let Ok(m) = fsdp_ir::parse_model(&t, "fuzz.ron") else { return Ok(()) };
        let opts = Options {
            world_size: ws,
            layout: if flat { Layout::Flat } else { Layout::Fsdp2 },
            policy: [Policy::Auto, Policy::None, Policy::Size(1000), Policy::Transformer(vec!["GPT2Block".into()])][policy].clone(),
            seq,
            batch: 1,
            ..Options::default()
        };
        let _ = fsdp_planner::plan(&m, &opts);
    }
}
