//! `fsdp-plan tune`: the fastest configuration that fits (see `fsdp_planner::tune` for the
//! space and the search), printed as the `plan` command to run, the runner-ups, the Pareto
//! front and the binding constraint; and `fsdp-plan fit`: the largest micro-batch that fits
//! one configuration, with the global batches around it.

use crate::cli::{options, Float8Opt, HwOpt, PlanOpts, Precision};
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::hardware::Hardware;
use fsdp_planner::print::{bytes, table};
use fsdp_planner::timeline;
use fsdp_planner::tune::{self, Config, Eval, Limit, Space, Tuned};
use fsdp_planner::{AttnImpl, Device, Optimizer, Options};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub(crate) struct TuneArgs {
    /// Model file (.ron, or an HF config.json imported on the fly).
    pub(crate) model: PathBuf,
    #[arg(long, default_value_t = 8)]
    pub(crate) world_size: u64,
    /// Sequences per optimizer step over all ranks (torchtitan's global batch size):
    /// micro-batch × gradient accumulation × world size.
    #[arg(long)]
    pub(crate) global_batch: u64,
    /// Tokens per sequence (default: 2048, or the model's learned positions if fewer).
    #[arg(long)]
    pub(crate) seq: Option<u64>,
    #[command(flatten)]
    pub(crate) precision: Precision,
    #[arg(long, default_value = "adamw", value_parser = ["adamw", "adam", "sgd", "none"])]
    pub(crate) optimizer: String,
    /// sdpa | eager | flash_attention_2 (default: the model file's, else sdpa).
    #[arg(long)]
    pub(crate) attn_implementation: Option<String>,
    /// The caching allocator runs with expandable segments (changes reserved memory only).
    #[arg(long)]
    pub(crate) expandable_segments: bool,
    /// Where the blocks' FSDP hooks sit relative to their checkpoints (`plan --ac-wrapper`):
    /// with --float8-all-gather, op-level SAC is searched under `torchtitan` only.
    #[arg(long, default_value = "hf", value_parser = ["hf", "torchtitan"])]
    pub(crate) ac_wrapper: String,
    /// Rank configurations as run under torchtitan's --compile (`plan --compile`: its time, and
    /// what the blocks save).
    #[arg(long)]
    pub(crate) compile: bool,
    /// Ranked with torchao float8 linears (`plan --float8`; numerics are the user's choice,
    /// not the tuner's).
    #[command(flatten)]
    pub(crate) float8: Float8Opt,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    #[command(flatten)]
    pub(crate) limit: LimitOpt,
    /// Leave op-level selective AC out of the space (full checkpointing only).
    #[arg(long)]
    pub(crate) no_sac: bool,
    /// Blocks per FSDP unit to search (unit groups, `plan --unit-group`: fewer, larger
    /// collectives), divisors of the number of blocks, e.g. `1` (one block per unit) or
    /// `1,2,4`: every one given is searched (default: every divisor, larger groups only while
    /// they make the step without checkpointing faster)
    #[arg(long, value_delimiter = ',')]
    pub(crate) unit_groups: Option<Vec<u32>>,
    /// Search the embeddings and the LM head as FSDP units of their own (both, as torchtitan
    /// wraps them), not only the root's (their params gathered only around their use). The
    /// default where they are untied; given, only these two choices are searched (where the
    /// embeddings and head hold 30% of the params or more, the default searches every edge
    /// choice: either alone, the final norm in the head's unit), and a model whose head is
    /// tied is refused.
    #[arg(long, conflicts_with = "no_embed_head_units")]
    pub(crate) embed_head_units: bool,
    /// Also search the embeddings alone and the head alone as units of their own, the other
    /// the root's (twice the search: up to 1.3% faster answers on a 2-block model, the same
    /// in the benchmark's real-size scenarios). Searched by default, with --norm-head-unit's,
    /// where the embeddings and the head hold 30% of the params or more.
    #[arg(long, conflicts_with = "no_embed_head_units")]
    pub(crate) separate_edge_units: bool,
    /// Also search the final norm and the LM head as one unit (torchtitan's
    /// `fully_shard([model.norm, model.output])`, `--policy …,model.norm+lm_head`), beside the
    /// norm left to the root (1.43 times the search: answers 0.007–0.22% faster in 30 of the
    /// zoo's 50 scenarios, the same in the rest, 2026-11-29). Searched by default, with
    /// --separate-edge-units', where the embeddings and the head hold 30% of the params or
    /// more.
    #[arg(long, conflicts_with = "no_embed_head_units")]
    pub(crate) norm_head_unit: bool,
    /// Leave the embeddings and the LM head to the root unit (about halves the search).
    #[arg(long)]
    pub(crate) no_embed_head_units: bool,
    /// Leave out keeping the last r units unsharded after forward for every r between all /
    /// all but the last / none (per unit `reshard_after_forward=False` from the end: `plan
    /// --unit-reshard 'model.layers.{24..31}=false'`), searched by default within 0.26% of the
    /// best over every count. It pays where the backward's all-gathers cost time the memory
    /// can buy back (many GPUs, short sequences: Llama-3-8B on 256 GPUs at seq 2048 under 36
    /// GiB, +3.0%) and costs up to a sixth more plans where it does not.
    #[arg(long)]
    pub(crate) no_keep_units: bool,
    /// (The kept-unit counts' opt-in before they were searched by default: accepted, no effect.)
    #[arg(long, hide = true, conflicts_with = "no_keep_units")]
    pub(crate) keep_units: bool,
    /// Under gradient accumulation, search only this gradient sync (`plan --grad-sync`):
    /// `last` (the micro-batches before the last keep their unsharded gradients:
    /// accelerate's `no_sync`, FSDP2's `set_requires_gradient_sync(False)`) or `each`
    /// (torchtitan's loop: every micro-batch reduce-scatters). Default: both
    #[arg(long, value_parser = ["last", "each"])]
    pub(crate) grad_sync: Option<String>,
    /// Runner-ups to list.
    #[arg(long, default_value_t = 5)]
    pub(crate) top: usize,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

/// The options tune does not decide, as `plan` options and as flags.
fn base_options(a: &TuneArgs, model: &fsdp_ir::Model) -> Result<(Options, Vec<String>)> {
    let mut flags = vec![];
    let (param_dtype, reduce_dtype, master_dtype) = a.precision.parse().map_err(user)?;
    flags.extend(a.precision.flags());
    let seq = a.seq.unwrap_or_else(|| crate::cli::default_seq(model));
    flags.extend(["--seq".into(), seq.to_string()]);
    let optimizer = match a.optimizer.as_str() {
        "adam" => Optimizer::Adam,
        "sgd" => Optimizer::Sgd,
        "none" => Optimizer::None,
        _ => Optimizer::AdamW,
    };
    if a.optimizer != "adamw" {
        flags.extend(["--optimizer".into(), a.optimizer.clone()]);
    }
    let attn = match &a.attn_implementation {
        None => None,
        Some(s) => {
            flags.extend(["--attn-implementation".into(), s.clone()]);
            Some(AttnImpl::parse(s).ok_or_else(|| user(format!("--attn-implementation `{s}`: expected sdpa, eager or flash_attention_2")))?)
        }
    };
    if a.expandable_segments {
        flags.push("--expandable-segments".into());
    }
    if a.ac_wrapper != "hf" {
        flags.extend(["--ac-wrapper".into(), a.ac_wrapper.clone()]);
    }
    if a.compile {
        flags.push("--compile".into());
    }
    flags.extend(a.float8.flags());
    flags.extend(["--hardware".into(), a.hw.hardware.clone()]);
    if let Some(h) = &a.hw.host_memory {
        flags.extend(["--host-memory".into(), h.clone()]);
    }
    // (so that `plan` judges the fit against the same limit, the same way)
    if let Some(m) = &a.limit.memory_limit {
        flags.extend(["--memory-limit".into(), m.clone()]);
    }
    if let Some(r) = &a.limit.reserve {
        flags.extend(["--reserve".into(), r.clone()]);
    }
    let o = Options {
        world_size: a.world_size,
        param_dtype,
        reduce_dtype,
        master_dtype,
        optimizer,
        seq,
        attn_implementation: attn,
        device: Device::Cuda,
        expandable_segments: a.expandable_segments,
        ac_wrapper: fsdp_planner::AcWrapper::parse(&a.ac_wrapper).unwrap_or_default(),
        compile: a.compile,
        float8: a.float8.get(),
        ..Options::default()
    };
    o.check().map_err(user)?;
    Ok((o, flags))
}

/// What "fits" means for `tune` and `fit`.
#[derive(Args)]
pub(crate) struct LimitOpt {
    /// Memory per GPU (default: the hardware profile's), e.g. 80GiB, 75GB, 8e10.
    #[arg(long)]
    pub(crate) memory_limit: Option<String>,
    /// Judge fit by the tensor peak plus this reserve (e.g. 4GiB) instead of the caching
    /// allocator model's reserved memory plus the CUDA context and NCCL buffers.
    #[arg(long)]
    pub(crate) reserve: Option<String>,
}

impl LimitOpt {
    /// The limit and how it is judged, in words.
    fn of(&self, hw: &Hardware) -> Result<(Limit, String)> {
        let (memory_limit, reserve) = (&self.memory_limit, &self.reserve);
        let bytes = match memory_limit {
            Some(s) => parse_size("--memory-limit", s)?,
            None => hw.memory_bytes,
        };
        let reserve = reserve.as_deref().map(|s| parse_size_or_zero("--reserve", s)).transpose()?;
        if let Some(r) = reserve.filter(|&r| r >= bytes) {
            // (nothing could fit: say so rather than plan the whole space to find it out)
            bail!(UserError(format!("--reserve {} leaves nothing of the memory limit {}: give a reserve below the limit", fsdp_planner::print::bytes(r), fsdp_planner::print::bytes(bytes))));
        }
        let how = match reserve {
            Some(r) => format!("tensor peak + {} reserve", fsdp_planner::print::bytes(r)),
            None => "caching allocator's reserved peak + CUDA context + NCCL buffers".into(),
        };
        Ok((Limit { bytes, reserve }, how))
    }
}

/// A configuration in a few words.
fn describe(space: &Space, world: u64, c: &Config) -> String {
    let o = &c.outer;
    let l = space.blocks.len() as u32;
    let mut v = vec![];
    v.push(if o.shard == world { "FSDP".to_string() } else { format!("HSDP shard {}", o.shard) });
    v.push(format!("micro-batch {} × {}{}", o.micro_batch, o.accum, if o.sync_each { " (sync each)" } else { "" }));
    v.push(format!("reshard {}", o.reshard.name()));
    if o.prefetch > 0 {
        v.push(format!("prefetch {}", o.prefetch));
    }
    if o.group > 1 {
        v.push(format!("{} blocks per unit", o.group));
    }
    match o.edges {
        tune::Edges::Root => {}
        tune::Edges::Embeddings => v.push("embeddings own unit".into()),
        tune::Edges::Head => v.push("head own unit".into()),
        tune::Edges::Both => v.push("embeddings and head own units".into()),
        tune::Edges::NormHead => v.push("norm and head one unit".into()),
        tune::Edges::EmbeddingsNormHead => v.push("embeddings a unit, norm and head another".into()),
    }
    if o.offload {
        v.push("CPU offload".into());
    }
    if !tune::shard_dims(space, o).is_empty() {
        v.push("short dim-0 params on dim 1".into());
    }
    let modes = tune::block_modes(space, c);
    let count = |m: u8| modes.iter().filter(|&&x| x == m).count() as u32;
    let (full, sac, none) = (count(1), count(2), count(0));
    v.push(match (full, sac, none) {
        (0, 0, _) => "no AC".into(),
        (f, 0, 0) if f == l => "full AC".into(),
        (0, s, 0) if s == l => "op-SAC".into(),
        // (not a count of the front or the back — the minor units' choice, or the blocks
        // alike counted around them: which blocks)
        (f, s, n) if modes != tune::Config::new(c.outer, f, s, c.back, l, 0).counted(l) => {
            format!("AC {f} full / {s} SAC / {n} none: {}", tune::checkpoint_entries_of(&space.blocks, &modes).join(", "))
        }
        // (in block order: counted from the back, the last blocks fully checkpointed)
        (f, s, n) if c.back => format!("AC {n} none / {s} SAC / {f} full"),
        (f, s, n) => format!("AC {f} full / {s} SAC / {n} none"),
    });
    v.join(" · ")
}

fn command(model: &std::path::Path, space: &Space, base: &Options, fixed: &[String], c: &Config) -> (Vec<String>, String) {
    let mut f = tune::flags(space, base, c);
    f.extend(fixed.iter().cloned());
    let quoted: Vec<String> = f.iter().map(|x| if x.contains(['{', '}', ' ']) { format!("'{x}'") } else { x.clone() }).collect();
    (f, format!("fsdp-plan plan {} {}", model.display(), quoted.join(" ")))
}

fn predicted(e: &Eval) -> serde_json::Value {
    serde_json::json!({
        "peak_bytes": e.peak_bytes,
        "needed_bytes": e.needed_bytes,
        "host_bytes": e.host_bytes,
        "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "step_time_s": e.step_time_s,
        "mfu": e.mfu,
        "exposed_comm_s": e.exposed_comm_s,
    })
}

/// The smallest change that makes the least-memory configuration fit: more GPUs (same
/// per-rank batch), or a shorter sequence; or the embeddings and head as units of their own
/// where the space left them to the root.
fn suggestions(model: &fsdp_ir::Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit) -> Vec<String> {
    // (the embeddings and the head as units of their own where the space has them)
    let searched_edges = if space.edges.contains(&tune::Edges::Both) { tune::Edges::Both } else { tune::Edges::Root };
    let least_with = |ws: u64, seq: u64, edges: tune::Edges| -> Option<Eval> {
        let b = Options { world_size: ws, seq, ..base.clone() };
        let s = Space { shards: vec![ws], ..space.clone() };
        let outer = |dim1| tune::Outer { shard: ws, micro_batch: 1, accum: 1, prefetch: 0, reshard: tune::Reshard::All, group: 1, edges, offload: false, sync_each: false, dim1 };
        let eval = |dim1: bool| {
            let c = Config::every_full(&s, outer(dim1));
            let plan = fsdp_planner::plan_unchecked(model, &tune::options(&b, &s, &c)).ok()?;
            Some(tune::evaluate(&plan, model, hw, limit, c))
        };
        // (with the params the group outnumbers on dim 0 sharded on dim 1 where that fits)
        match eval(false) {
            Some(e) if e.fits => Some(e),
            e0 => {
                let e1 = if tune::shard_dims(&s, &outer(true)).is_empty() { None } else { eval(true) };
                e1.filter(|e| e.fits).or(e0)
            }
        }
    };
    let least = |ws: u64, seq: u64| least_with(ws, seq, searched_edges);
    let mut out = vec![];
    if searched_edges == tune::Edges::Root && space.edge_policy.is_some() && least_with(base.world_size, base.seq, tune::Edges::Both).is_some_and(|e| e.fits) {
        out.push("the embeddings and the LM head as FSDP units of their own fit (micro-batch 1, every block checkpointed): leave out --no-embed-head-units".into());
    }
    let more_gpus = (1..=6).map(|k| base.world_size << k).find(|&ws| least(ws, base.seq).is_some_and(|e| e.fits));
    match more_gpus {
        Some(ws) => out.push(format!("{ws} GPUs (micro-batch 1, every block checkpointed) fit")),
        None => out.push(format!("even {} GPUs do not fit it", base.world_size << 6)),
    }
    let halvings: Vec<u64> = std::iter::successors(Some(base.seq / 2), |&s| Some(s / 2)).take_while(|&s| s >= 128).collect();
    let shorter = halvings.iter().copied().find(|&seq| least(base.world_size, seq).is_some_and(|e| e.fits));
    if let Some(seq) = shorter {
        out.push(format!("--seq {seq} fits on {} GPUs (micro-batch 1, every block checkpointed)", base.world_size));
    }
    if more_gpus.is_none() && shorter.is_none() {
        // neither alone: both — the longest sequence that fits on the fewest more GPUs
        // (the activations are a rank's, the shards the world's)
        let both = halvings.iter().find_map(|&seq| (1..=6).map(|k| base.world_size << k).find(|&ws| least(ws, seq).is_some_and(|e| e.fits)).map(|ws| (seq, ws)));
        out.push(match both {
            Some((seq, ws)) => format!("--seq {seq} on {ws} GPUs (micro-batch 1, every block checkpointed) fits"),
            None => format!("no sequence of 128 tokens or more fits on up to {} GPUs either", base.world_size << 6),
        });
    }
    out.push(if space.offload.contains(&true) {
        // the least-memory configuration under offload: the node's host may be what it is over
        let ws = base.world_size;
        let s = Space { shards: vec![ws], ..space.clone() };
        let c = Config::every_full(&s, tune::Outer { shard: ws, micro_batch: 1, accum: 1, prefetch: 0, reshard: tune::Reshard::All, group: 1, edges: searched_edges, offload: true, sync_each: false, dim1: false });
        let e = fsdp_planner::plan_unchecked(model, &tune::options(base, &s, &c)).ok().map(|p| tune::evaluate(&p, model, hw, limit, c));
        let over = e.filter(|e| e.host_over).and_then(|e| Some((e.needed_bytes, fsdp_planner::memory::HostNeed::of(e.host_bytes?, ws, hw))));
        match over {
            Some((needed, h @ fsdp_planner::memory::HostNeed { has: Some(has), .. })) => {
                let device = if needed.is_some_and(|n| n <= limit.bytes) { "fits the device but not" } else { "fits neither the device nor" };
                format!(
                    "CPU offload (FSDP2's CPUOffloadPolicy, in the space searched) {device} the node's host: {} of its {} (shards, grads and optimizer state; more GPUs shard them thinner)",
                    h.describe(),
                    bytes(has)
                )
            }
            _ => "CPU offload (FSDP2's CPUOffloadPolicy, in the space searched) does not fit either: the activations and the gathered params stay on the device".into(),
        }
    } else {
        "CPU offload (FSDP2's CPUOffloadPolicy) is not searched with these options (it needs the FSDP2 layout on a GPU, full-shard or hybrid-shard)".into()
    });
    out
}

pub(crate) fn run(a: TuneArgs) -> Result<()> {
    crate::allocator::no_huge_pages();
    let t0 = Instant::now();
    let model = load_model(&a.model)?;
    let hw = a.hw.load()?;
    let (base, fixed) = base_options(&a, &model)?;
    crate::io::check_float8(&hw, base.float8.is_some())?;
    let (limit, how) = a.limit.of(&hw)?;
    let mut space = tune::space(&model, &base, a.world_size, a.global_batch, hw.gpus_per_node).map_err(user)?;
    space.sac &= !a.no_sac;
    if hw.host.is_none() {
        // (a profile without a host behind the device, the CPU's: nothing to offload to)
        space.offload = vec![false];
    }
    if let Some(g) = &a.unit_groups {
        if g.iter().any(|&k| k == 0 || k > 1024) {
            bail!(UserError(format!("--unit-groups: blocks per unit are 1 to 1024, got {g:?}")));
        }
        // (the search takes identical units to cost the same wherever they are: a shorter
        // last group is cheaper to checkpoint than the first, which it would not try)
        let n = space.blocks.len() as u32;
        if let Some(k) = g.iter().find(|&&k| n > 0 && !n.is_multiple_of(k)) {
            bail!(UserError(format!("--unit-groups: {k} blocks per unit leaves a shorter last group ({n} blocks): tune searches groups of equal size, divisors of {n} ({})", tune::group_ladder(n).iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", "))));
        }
        space.groups = g.clone();
        space.groups.sort_unstable();
        space.groups.dedup();
        space.every_group = true;
    }
    if a.embed_head_units && space.edge_policy.is_none() {
        bail!(UserError(format!("--embed-head-units: {} has no untied embeddings and LM head to make units of their own (a tied head shares its weight with the embeddings: one unit)", a.model.display())));
    }
    if a.no_embed_head_units {
        space.edges = vec![tune::Edges::Root];
    }
    // (where the embeddings and the head are a large share of the params, every edge choice
    // by default: `tune::EDGE_SEARCH_SHARE`; `--embed-head-units` keeps both-or-neither, and
    // the two flags below add to either)
    if !(a.embed_head_units || a.no_embed_head_units) && tune::edge_share(&model) >= tune::EDGE_SEARCH_SHARE {
        if let Some(policy) = space.edge_policy.as_deref() {
            space.edges = tune::Edges::all(policy);
        }
    }
    if a.separate_edge_units {
        if space.edge_policy.is_none() {
            bail!(UserError(format!("--separate-edge-units: {} has no untied embeddings and LM head to make units of their own", a.model.display())));
        }
        space.edges.extend([tune::Edges::Embeddings, tune::Edges::Head]);
    }
    if a.norm_head_unit {
        let Some(policy) = space.edge_policy.as_deref().filter(|p| p.len() == 4) else {
            bail!(UserError(format!("--norm-head-unit: {} has no untied LM head with a final norm before it to make one unit of", a.model.display())));
        };
        // (beside each choice that makes the head a unit, the same with the norm in it)
        let norm: Vec<tune::Edges> = tune::Edges::all(policy).into_iter().filter(|e| e.norm() && space.edges.iter().any(|&x| x.embeddings() == e.embeddings() && x.head())).collect();
        space.edges.extend(norm);
    }
    // (in `Edges::ALL`'s order, each once)
    space.edges.sort_unstable();
    space.edges.dedup();
    space.keep = !a.no_keep_units;
    match a.grad_sync.as_deref() {
        Some("last") => space.sync = vec![false],
        Some(_) if !space.sync.contains(&true) => {
            let why = Options { grad_sync: fsdp_planner::GradSync::Each, grad_accum: 2, ..base.clone() }.check().err().map_or(String::new(), |e| format!(": {e}"));
            bail!(UserError(format!("--grad-sync each is not in this space{why}")));
        }
        Some(_) => space.sync = vec![true],
        None => {}
    }
    if space.blocks.is_empty() {
        bail!(UserError(format!("{}: no decoder blocks to tune (the transformer policy wraps none)", a.model.display())));
    }
    let last = std::sync::Mutex::new(Instant::now());
    let progress = |planned: usize, done: usize, of: usize| {
        let Ok(mut last) = last.lock() else { return };
        if t0.elapsed().as_secs_f64() > 1.0 && last.elapsed().as_secs_f64() > 1.0 {
            eprintln!("tune: {done}/{of} outer choices searched, {planned} plans built ({:.1} s)", t0.elapsed().as_secs_f64());
            *last = Instant::now();
        }
    };
    // two threads (their lanes, `tune::LANES_PER_THREAD` each) whatever the machine: the
    // planned set (runner-ups, Pareto front) is the same everywhere
    let threads = 2;
    let Tuned { best, mut per_outer, mut evaluated, mut plans_built } = tune::search(&model, &base, &hw, &space, limit, threads, &progress);
    // what is shown as `plan` predicts it (planned in full where a search planned fewer
    // micro-batches for it, `tune::SHORT_ACCUM`, and whatever ties with it)
    plans_built += tune::settle_first(&model, &base, &hw, &space, limit, &mut per_outer, 1 + a.top);
    let (pareto, settled) = tune::settled_pareto(&model, &base, &hw, &space, limit, &mut evaluated);
    plans_built += settled;
    let elapsed = t0.elapsed().as_secs_f64();
    let best_plan = match &best {
        Some(b) => Some(fsdp_planner::plan(&model, &tune::options(&base, &space, &b.config)).map_err(user)?),
        None => None,
    };
    let sugg = if best.is_none() { suggestions(&model, &base, &hw, &space, limit) } else { vec![] };
    if a.format == "json" {
        let entry = |e: &Eval| {
            let (flags, _) = command(&a.model, &space, &base, &fixed, &e.config);
            serde_json::json!({"flags": flags, "config": describe(&space, a.world_size, &e.config), "predicted": predicted(e)})
        };
        let doc = serde_json::json!({
            "model": model.name,
            "hardware": hw.name,
            "world_size": a.world_size,
            "global_batch": a.global_batch,
            "memory_limit_bytes": limit.bytes,
            "fit_judged_by": how,
            "best": best.as_ref().map(entry),
            "binding": best_plan.as_ref().map(|p| p.memory.peak_at.clone()),
            "runner_ups": per_outer.iter().skip(1).take(a.top).map(entry).collect::<Vec<_>>(),
            "pareto": pareto.iter().map(entry).collect::<Vec<_>>(),
            "does_not_fit": sugg,
            "searched": plans_built,
            "fully_evaluated": evaluated.len(),
            "plans_built": plans_built,
            "space_size": tune::size(&space),
            "elapsed_s": elapsed,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    eprintln!("tune: {plans_built} plans built in {elapsed:.2} s");
    let mut s = format!(
        "tune {} on {} × {} · global batch {} × seq {} · limit {} ({how})\nsearched the space's {} configurations with {plans_built} plans\n\n",
        model.name,
        a.world_size,
        hw.name,
        a.global_batch,
        base.seq,
        bytes(limit.bytes),
        tune::size(&space),
    );
    let Some(b) = &best else {
        s += "does not fit: no configuration in the space fits the limit\n";
        for x in &sugg {
            s += &format!("  - {x}\n");
        }
        out(format_args!("{s}"));
        return Ok(());
    };
    let (_, cmd) = command(&a.model, &space, &base, &fixed, &b.config);
    s += &format!(
        "best: {} tokens/s/GPU · step {} · MFU {} · needs {} (peak {})\n  {}\n  {cmd}\n",
        timeline::thousands(b.tokens_per_s_per_gpu),
        timeline::secs(b.step_time_s),
        timeline::pct(b.mfu),
        b.needed_bytes.map(bytes).unwrap_or_default(),
        bytes(b.peak_bytes),
        describe(&space, a.world_size, &b.config),
    );
    if let Some(p) = &best_plan {
        s += &format!("  binding: memory peaks at {}; exposed communication {}\n", p.memory.peak_at, timeline::secs(b.exposed_comm_s));
        // offloaded: what the node's host holds for it
        if let Some(h) = fsdp_planner::memory::host_need(p, &hw) {
            let of = h.has.map_or(String::new(), |has| format!(" of the node's {}", bytes(has)));
            s += &format!("  host (CPU offload): {}{of}\n", h.describe());
        }
    }
    let row = |e: &Eval| {
        vec![
            timeline::thousands(e.tokens_per_s_per_gpu),
            format!("{:+.1}%", 100.0 * (e.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1.0)),
            e.needed_bytes.map(bytes).unwrap_or_else(|| "-".into()),
            if e.fits { "yes".into() } else { "no".into() },
            describe(&space, a.world_size, &e.config),
        ]
    };
    let heads: Vec<String> = ["tokens/s/GPU", "vs best", "needs", "fits", "configuration"].iter().map(|x| x.to_string()).collect();
    let runners: Vec<Vec<String>> = per_outer.iter().skip(1).take(a.top).map(row).collect();
    if !runners.is_empty() {
        s += &format!("\nrunner-ups (the best of other choices):\n{}\n", table(&heads, &runners));
    }
    let front: Vec<Vec<String>> = pareto.iter().map(row).collect();
    s += &format!("\nPareto front of the configurations planned (memory needed vs tokens/s):\n{}\n", table(&heads, &front));
    out(format_args!("{s}"));
    Ok(())
}


#[derive(Args)]
pub(crate) struct FitArgs {
    /// Model file (.ron, or an HF config.json imported on the fly).
    pub(crate) model: PathBuf,
    #[command(flatten)]
    pub(crate) o: PlanOpts,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    #[command(flatten)]
    pub(crate) limit: LimitOpt,
    /// Find the longest sequence instead of the largest micro-batch.
    #[arg(long)]
    pub(crate) seq_len: bool,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

/// `fit`: the largest micro-batch (or sequence) that fits, by bisection (memory grows with
/// both), and the global batches gradient accumulation makes of it.
pub(crate) fn fit(a: FitArgs) -> Result<()> {
    crate::allocator::no_huge_pages();
    let model = load_model(&a.model)?;
    let hw = a.hw.load()?;
    let base = options(&a.o, &a.o.policy, &model).map_err(user)?;
    let (limit, how) = a.limit.of(&hw)?;
    let what = if a.seq_len { "sequence length" } else { "micro-batch" };
    let opts_at = |n: u64| if a.seq_len { Options { seq: n, ..base.clone() } } else { Options { batch: n, ..base.clone() } };
    // (past the first size, what the planner refuses — a sequence past the model's positions,
    // more tokens than it plans — bounds the search as what does not fit does)
    let try_nk = |n: u64, accum: u32| -> Option<Eval> {
        let opts = Options { grad_accum: accum, ..opts_at(n) };
        let plan = fsdp_planner::plan_unchecked(&model, &opts).ok()?;
        let c = Config::none(tune::Outer { shard: opts.world_size, micro_batch: opts.batch, accum: opts.grad_accum, prefetch: 0, reshard: tune::Reshard::All, group: opts.unit_group, edges: tune::Edges::Root, offload: opts.offload == fsdp_planner::Offload::Cpu, sync_each: opts.grad_sync == fsdp_planner::GradSync::Each, dim1: !opts.shard_dims.is_empty() });
        Some(tune::evaluate(&plan, &model, &hw, limit, c))
    };
    let try_n = |n: u64| try_nk(n, base.grad_accum);
    let fits = |n: u64| try_n(n).is_some_and(|e| e.fits);
    let unit = if a.seq_len { 128 } else { 1 };
    // options the planner refuses at the first size are the user's to mend, not a size that
    // does not fit
    fsdp_planner::plan_unchecked(&model, &opts_at(unit)).map_err(user)?;
    if !fits(unit) {
        let over = try_n(unit).filter(|e| e.host_over).and_then(|e| e.host_bytes).map(|per| fsdp_planner::memory::HostNeed::of(per, opts_at(unit).world_size, &hw));
        if let Some(h @ fsdp_planner::memory::HostNeed { has: Some(has), .. }) = over {
            bail!(UserError(format!("{}: under --offload cpu the node's host cannot hold its ranks' share: {} of its {} ({}): more GPUs shard it thinner", model.name, h.describe(), bytes(has), hw.name)));
        }
        bail!(UserError(format!("{}: not even {what} {unit} fits in {} ({how}): see `fsdp-plan tune` for checkpointing, HSDP and more GPUs", model.name, bytes(limit.bytes))));
    }
    // grow by doubling, then bisect
    let mut lo = unit;
    let mut hi = unit * 2;
    while fits(hi) {
        lo = hi;
        hi *= 2;
        if hi > (1 << 24) {
            break;
        }
    }
    while hi - lo > unit {
        let mid = (lo + (hi - lo) / 2) / unit * unit;
        if mid == lo {
            break;
        }
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let best = try_n(lo);
    let mut sizes: Vec<u64> = std::iter::successors(Some(unit), |&n| (n * 2 <= lo).then_some(n * 2)).collect();
    if sizes.last() != Some(&lo) {
        sizes.push(lo);
    }
    let rows: Vec<(u64, Eval)> = sizes.iter().filter_map(|&n| try_n(n).map(|e| (n, e))).collect();
    // The global batches accumulation makes of each size, each planned: a micro-batch without
    // gradient sync keeps its unsharded gradients until the last one's reduce-scatter
    // (FSDP2's `set_requires_gradient_sync(False)`), so a size that fits at one accumulation
    // may not at another.
    let mut accums = vec![1, 2, 4, 8];
    if !accums.contains(&base.grad_accum) {
        accums.push(base.grad_accum);
        accums.sort_unstable();
    }
    let ws = base.world_size;
    let global = |n: u64, k: u32| if a.seq_len { base.batch } else { n } * u64::from(k) * ws;
    let at_accum: Vec<Vec<(u32, Option<Eval>)>> = rows
        .iter()
        .map(|(n, e)| accums.iter().map(|&k| (k, if k == base.grad_accum { Some(e.clone()) } else { try_nk(*n, k) })).collect())
        .collect();
    if a.format == "json" {
        let doc = serde_json::json!({
            "model": model.name,
            "hardware": hw.name,
            "memory_limit_bytes": limit.bytes,
            "fit_judged_by": how,
            "largest": lo,
            "of": if a.seq_len { "seq" } else { "batch" },
            "grad_accum": base.grad_accum,
            "predicted": best.as_ref().map(predicted),
            "table": rows.iter().zip(&at_accum).map(|((n, e), ks)| serde_json::json!({
                "value": n,
                "predicted": predicted(e),
                "accumulation": ks.iter().map(|(k, e)| serde_json::json!({
                    "grad_accum": k,
                    "global_batch": global(*n, *k),
                    "fits": e.as_ref().is_some_and(|e| e.fits),
                    "predicted": e.as_ref().map(predicted),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let at = if base.grad_accum > 1 { format!(" at gradient accumulation {}", base.grad_accum) } else { String::new() };
    let mut s = format!("fit {} on {} × {} · limit {} ({how})\nlargest {what} that fits{at}: {lo}", model.name, ws, hw.name, bytes(limit.bytes));
    if let Some(e) = &best {
        s += &format!(" (needs {}, {} tokens/s/GPU)\n\n", e.needed_bytes.map(bytes).unwrap_or_default(), timeline::thousands(e.tokens_per_s_per_gpu));
    }
    let mut heads: Vec<String> = vec![what.to_string(), "needs".into(), "tokens/s/GPU".into()];
    heads.extend(accums.iter().enumerate().map(|(i, k)| if i == 0 { format!("global batch at accum {k}") } else { k.to_string() }));
    let mut over = false;
    let cells: Vec<Vec<String>> = rows
        .iter()
        .zip(&at_accum)
        .map(|((n, e), ks)| {
            let mut r = vec![n.to_string(), e.needed_bytes.map(bytes).unwrap_or_default(), timeline::thousands(e.tokens_per_s_per_gpu)];
            r.extend(ks.iter().map(|(k, e)| {
                if e.as_ref().is_some_and(|e| e.fits) {
                    global(*n, *k).to_string()
                } else {
                    over = true;
                    "-".to_string()
                }
            }));
            r
        })
        .collect();
    s += &table(&heads, &cells);
    if over {
        s += if base.grad_sync == fsdp_planner::GradSync::Each {
            "\n\n-: does not fit at that accumulation"
        } else {
            "\n\n-: does not fit at that accumulation (the micro-batches before the last keep their unsharded gradients: no gradient sync until the last; --grad-sync each reduces every one)"
        };
    }
    outln!("{s}");
    Ok(())
}
