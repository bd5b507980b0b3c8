//! fsdp-planner: lowers a model + options into a plan.
//!
//! Passes, one per file, each a plain function: [`wrap`] (policy → wrapped modules),
//! [`units`] (ownership and shard layout), [`schedule`] (the step's ops and buffers),
//! [`buffers`] (arena offsets), [`memory`] (peak and breakdown). [`verify`] runs between
//! passes; [`checker`] simulates the finished schedule. No IO: callers pass models in and
//! print plans out.

pub mod activation;
pub mod buffers;
pub mod calibrate;
pub mod checker;
pub mod cost;
pub mod diff;
pub mod error;
pub mod float8;
pub mod hardware;
pub mod ids;
pub mod layout;
pub mod memory;
pub mod options;
pub mod plan;
pub mod plot;
pub mod print;
pub mod refit;
pub mod reserved;
pub mod schedule;
pub mod timeline;
pub mod trace;
pub mod tune;
pub mod units;
pub mod verify;
pub mod wrap;

pub use error::PlanError;
pub use options::*;
pub use plan::*;

use fsdp_ir::Model;
use sha2::{Digest, Sha256};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the model's canonical serialization (compact JSON of the IR).
pub fn model_hash(model: &Model) -> String {
    struct W(Sha256);
    impl std::io::Write for W {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = W(Sha256::new());
    // Serializing plain data into a hasher cannot fail.
    let _ = serde_json::to_writer(&mut w, model);
    hex(&w.0.finalize())
}

/// The most bytes the buffers of one plan may add up to (2^62), so that no sum overflows.
pub const MAX_PLAN_BYTES: u64 = 1 << 62;

/// `--unit-reshard UNIT=BOOL`: each named unit (its module path — or a pattern of paths,
/// `model.layers.{24..31}`, every unit with a module it matches — `root`, or `last`: the
/// last non-root unit, units being in forward pre-order) gets that `reshard_after_forward`.
fn apply_unit_reshard(units: &mut [units::Unit], overrides: &[(String, bool)]) -> Result<(), PlanError> {
    for (name, value) in overrides {
        for i in units_named(units, name)? {
            units[i].reshard_after_forward = *value;
        }
    }
    Ok(())
}

/// The units `--unit-reshard` names by `name`: a module path (or a unit group's member), a
/// pattern of paths (every non-root unit it matches), `root` or `last` (the last non-root
/// unit in forward order).
fn units_named(units: &[units::Unit], name: &str) -> Result<Vec<usize>, PlanError> {
    let at: Vec<usize> = match name {
        "last" => units.iter().rposition(|u| !u.is_root()).into_iter().collect(),
        "root" => units.iter().position(|u| u.is_root()).into_iter().collect(),
        // (a unit of several modules by all of them, as `plan` prints it: `model.norm+lm_head`)
        n if n.contains('+') => units.iter().position(|u| !u.is_root() && u.name() == n).into_iter().collect(),
        n if n.contains(['*', '{']) => (0..units.len()).filter(|&i| !units[i].is_root() && (wrap::glob_match(n, &units[i].module) || units[i].group.iter().any(|g| wrap::glob_match(n, g)))).collect(),
        n => units.iter().position(|u| u.module == n || u.group.iter().any(|g| g == n)).into_iter().collect(),
    };
    if at.is_empty() {
        let known: Vec<String> = units.iter().filter(|u| !u.is_root()).map(|u| u.name()).take(6).collect();
        if known.is_empty() {
            // (a wrap policy that wraps nothing: `last` and every path name nothing)
            return Err(error::opt_err("--unit-reshard", format!("`{name}`: this plan has no FSDP unit but the root (its wrap policy wraps no module): only `root` can be set")));
        }
        return Err(error::opt_err("--unit-reshard", format!("`{name}` is not an FSDP unit of this plan (units: root, {}{}; or `last`)", known.join(", "), if units.len() > 7 { ", …" } else { "" })));
    }
    Ok(at)
}

/// Runs every pass and the checker.
pub fn plan(model: &Model, opts: &Options) -> Result<Plan, PlanError> {
    opts.check()?;
    // `--master-dtype`: the passes see the parameters in it; the plan names the model file's
    // hash (a compiled plan is checked against the file it came from)
    let recast = recast(model, opts);
    let planned = recast.as_ref().unwrap_or(model);
    // The model hash (a full serialization) runs on a second thread beside the passes.
    std::thread::scope(|s| {
        let hash = s.spawn(|| model_hash(model));
        plan_with_hash(planned, opts, || hash.join().unwrap_or_else(|_| model_hash(model)))
    })
}

/// The passes without the checker, the arena offsets and the hashes: the same schedule,
/// buffers, memory and collectives as [`plan`] (a test holds them equal), for searches that
/// plan thousands of candidates (`tune`) and re-plan their answer with [`plan`].
pub fn plan_unchecked(model: &Model, opts: &Options) -> Result<Plan, PlanError> {
    opts.check()?;
    let recast = recast(model, opts);
    plan_passes(recast.as_ref().unwrap_or(model), opts, None, None)
}

fn plan_with_hash(model: &Model, opts: &Options, model_hash: impl FnOnce() -> String) -> Result<Plan, PlanError> {
    plan_passes(model, opts, Some(Box::new(model_hash)), None)
}

/// What the passes before the schedule make of the model: the attention kernel, the wrap
/// policy's FSDP units with their reshard settings, and each op's unit. They read neither the
/// checkpointed modules nor the batch: `tune` prepares once per outer point and plans each of
/// its configurations from it ([`plan_prepared`]; with the schedule's prelude it also shares,
/// [`plan_prepared_with`]).
pub struct Prepared {
    attn: AttnImpl,
    policy: String,
    wrapped: Vec<Vec<String>>,
    units: std::sync::Arc<Vec<units::Unit>>,
    unit_of_op: Vec<ids::UnitId>,
}

/// The model with its parameters in `--master-dtype`, when they are in another: what the
/// passes plan with.
pub(crate) fn recast(model: &Model, opts: &Options) -> Option<Model> {
    opts.master_dtype.filter(|&d| model.params.iter().any(|p| p.dtype.is_float() && p.dtype != d)).map(|d| model.with_param_dtype(d))
}

/// The passes up to the units (see [`Prepared`]).
pub fn prepare(model: &Model, opts: &Options) -> Result<Prepared, PlanError> {
    match recast(model, opts) {
        Some(m) => prepare_passes(&m, opts),
        None => prepare_passes(model, opts),
    }
}

fn prepare_passes(model: &Model, opts: &Options) -> Result<Prepared, PlanError> {
    let attn = match opts.attn_implementation {
        Some(a) => a,
        None => match model.attn_implementation.as_deref() {
            None => AttnImpl::Sdpa,
            Some(s) => AttnImpl::parse(s).ok_or_else(|| {
                error::opt_err("attn_implementation", format!("model file names unknown `{s}` (sdpa, eager, flash_attention_2)"))
            })?,
        },
    };
    let policy = wrap::resolve(model, &opts.policy);
    let wrapped = wrap::group(model, &wrap::wrap(model, &policy)?, &policy, opts.unit_group)?;
    let mut units = units::build_units(model, &wrapped, opts)?;
    let raf = opts.reshard_after_forward.unwrap_or(!matches!(
        opts.strategy,
        Strategy::ShardGradOp | Strategy::NoShard
    ));
    for u in units.iter_mut() {
        u.reshard_after_forward = if u.is_root() {
            opts.root_reshard_after_forward.unwrap_or(false)
        } else {
            raf
        };
    }
    apply_unit_reshard(&mut units, &opts.unit_reshard)?;
    for u in units.iter_mut().filter(|u| !u.is_root() && u.reshard_after_forward) {
        u.reshard_to = opts.reshard_to;
    }
    // per-unit ints, over the rest (FSDP2's `fully_shard(unit, reshard_after_forward=N)`)
    for (name, n) in &opts.unit_reshard_to {
        for i in units_named(&units, name)? {
            if units[i].is_root() {
                return Err(error::opt_err("--unit-reshard", format!("{name}={n}: the root's reshard_after_forward is true or false")));
            }
            units[i].reshard_after_forward = true;
            units[i].reshard_to = Some(*n);
        }
    }
    verify::verify_units(model, &units, opts.shard_size(), opts.layout)?;
    let unit_of_op = verify::unit_of_ops(model, &units);
    Ok(Prepared { attn, policy: policy.to_string(), wrapped, units: std::sync::Arc::new(units), unit_of_op })
}

/// [`plan_unchecked`] from the units `prep` made for these options (the same but for the
/// checkpointed modules and the batch: the caller's to keep so).
pub fn plan_prepared(model: &Model, opts: &Options, prep: &Prepared) -> Result<Plan, PlanError> {
    opts.check()?;
    match recast(model, opts) {
        // (`tune` gives the model recast once: this is for other callers)
        Some(m) => plan_passes(&m, opts, None, Some(prep)),
        None => plan_passes(model, opts, None, Some(prep)),
    }
}

/// [`plan_prepared`] with the schedule's prelude given: `tune`'s, made once for the outer
/// points whose options differ in nothing it reads (the micro-batch, the units' modules and
/// params, whether anything is checkpointed: the tune tests hold the plans equal).
pub(crate) fn plan_prepared_with(model: &Model, opts: &Options, prep: &Prepared, prelude: &schedule::Prelude) -> Result<Plan, PlanError> {
    opts.check()?;
    plan_passes_with(model, opts, None, Some(prep), Some(prelude))
}

/// Every pass (from `prep` on, when given); with a model hash, the arena and the checker too.
fn plan_passes(model: &Model, opts: &Options, model_hash: Option<Box<dyn FnOnce() -> String + '_>>, prep: Option<&Prepared>) -> Result<Plan, PlanError> {
    plan_passes_with(model, opts, model_hash, prep, None)
}

fn plan_passes_with(model: &Model, opts: &Options, model_hash: Option<Box<dyn FnOnce() -> String + '_>>, prep: Option<&Prepared>, prelude: Option<&schedule::Prelude>) -> Result<Plan, PlanError> {
    // learned positions (GPT-2's wpe) bound the sequence length
    for op in model.ops.iter().filter(|o| matches!(o.kind, fsdp_ir::OpKind::PositionEmbedding)) {
        let table = op.params.first().and_then(|n| model.params.iter().find(|p| &p.name == n));
        if let Some(p) = table.filter(|p| p.shape.first().is_some_and(|&n| opts.seq > n)) {
            return Err(error::opt_err("--seq", format!("{} exceeds the model's {} learned positions (`{}`, n_positions)", opts.seq, p.shape[0], p.name)));
        }
    }
    float8::check_even_gather(model, opts)?;
    // activation checkpointing names module classes, as FSDP's apply_activation_checkpointing
    // check_fn does: one the model lacks would silently checkpoint nothing
    let specs = opts.checkpoints();
    let named: rustc_hash::FxHashSet<&str> = match specs.is_empty() {
        true => Default::default(),
        false => model.modules.iter().filter(|m| !m.path.is_empty()).flat_map(|m| [m.class.as_str(), m.path.as_str()]).collect(),
    };
    for (c, _) in &specs {
        if !named.contains(c.as_str()) {
            let mut classes: Vec<&str> = model.modules.iter().filter(|m| !m.path.is_empty()).map(|m| m.class.as_str()).collect();
            classes.sort();
            classes.dedup();
            return Err(error::opt_err("--checkpoint", format!("`{c}` is neither a module class nor a module path of {} (its classes: {})", model.name, classes.join(", "))));
        }
    }
    let made;
    let (prep, units) = match prep {
        Some(p) => (p, p.units.clone()),
        None => {
            made = prepare_passes(model, opts)?;
            (&made, made.units.clone())
        }
    };
    let Prepared { attn, ref policy, ref wrapped, ref unit_of_op, .. } = *prep;
    // a unit group's members are checkpointed alike: FSDP2's group hooks count the members
    // that ran forward, and a member not recomputed in backward leaves the count short: the
    // group's post-forward does not run in that backward (PyTorch 2.11 warns "1 of the 2
    // modules passed to fully_shard did not run forward before backward, which is
    // error-prone" and resets the count at the end of the backward)
    if !opts.checkpoint.is_empty() && wrapped.iter().any(|g| g.len() > 1) {
        let cks = &specs;
        let mode_of = |path: &str| {
            let class = model.modules.iter().find(|m| m.path == path).map(|m| m.class.as_str()).unwrap_or("");
            cks.iter().rev().find(|(n, _)| n == path || n == class).map(|(_, m)| *m)
        };
        for g in wrapped.iter().filter(|g| g.len() > 1) {
            let modes: Vec<_> = g.iter().map(|p| mode_of(p)).collect();
            if modes.iter().any(|m| *m != modes[0]) {
                let each: Vec<String> = g.iter().zip(&modes).map(|(p, m)| format!("{p}: {}", m.map_or("none", |m| m.name()))).collect();
                return Err(error::opt_err("--checkpoint", format!("the unit group {} is checkpointed unlike ({}): checkpoint a group's blocks alike (FSDP2's group hooks then skip the group's post-forward in backward; PyTorch warns that it is error-prone)", g.join(" + "), each.join(", "))));
            }
        }
    }
    let sched = match prelude {
        Some(pre) => schedule::build_with(pre, model, opts, &units, unit_of_op, attn),
        None => schedule::build(model, opts, &units, unit_of_op, attn),
    };
    // every byte count below (live bytes, arena offsets) is at most the sum of all buffers
    if sched.buffers.iter().try_fold(0u64, |a, b| a.checked_add(b.bytes)).is_none_or(|t| t > MAX_PLAN_BYTES) {
        return Err(error::opt_err("--batch", format!("the step's buffers add up to more than {} EiB (batch {} × seq {}): far past any device", MAX_PLAN_BYTES >> 60, opts.batch, opts.seq)));
    }
    // Arena offsets and the arena half of the checker run on a second thread, beside the
    // memory replay and the rest of the checker (neither reads offsets).
    let bare = |units, sched: schedule::Schedule, collectives, memory| Plan {
        format_version: FORMAT_VERSION,
        model_name: model.name.clone(),
        model_hash: String::new(),
        plan_hash: String::new(),
        options: opts.clone(),
        attn_implementation: attn.name().to_string(),
        policy: policy.clone(),
        units,
        schedule: sched.ops,
        buffers: sched.buffers,
        collectives,
        memory,
        shared: vec![],
        steady: sched.steady,
    };
    let host = memory::host(&units, opts);
    let Some(model_hash) = model_hash else {
        let memory = Memory { host, ..memory::simulate(&sched.ops, &sched.buffers, &units)? };
        // (`tune`'s plans, built without names, read no collective list)
        let collectives = if schedule::naming() { memory::collectives(&sched.ops, &units) } else { vec![] };
        return Ok(bare(units, sched, collectives, memory));
    };
    let spans = buffers::spans(opts, &units, &sched.buffers);
    let (offsets, memory, collectives) = std::thread::scope(|s| {
        let arena = s.spawn(|| {
            let offs = buffers::offsets(&sched.ops, &spans);
            checker::check_arena(&sched.ops, &spans, &offs, opts.device.alignment()).map(|()| offs)
        });
        let rules = memory::simulate(&sched.ops, &sched.buffers, &units)
            .and_then(|m| checker::check_schedule(model, &sched.ops, &sched.buffers, &units, opts, &m).map(|()| m));
        let collectives = memory::collectives(&sched.ops, &units);
        let offsets = arena.join().unwrap_or_else(|_| Err(PlanError::Check("arena thread panicked".into())));
        let memory = rules?;
        Ok::<_, PlanError>((offsets?, memory, collectives))
    })?;
    let mut plan = bare(units, sched, collectives, Memory { host, ..memory });
    for (b, o) in plan.buffers.iter_mut().zip(offsets) {
        b.offset = o;
    }
    plan.memory.arena_bytes = memory::arena_bytes(&plan.buffers, &spans);
    plan.shared = plan
        .units
        .iter()
        .flat_map(|u| {
            u.params.iter().filter(|p| !p.aliases.is_empty()).map(move |p| SharedParam {
                param: p.name.clone(),
                aliases: p.aliases.clone(),
                unit: u.label().to_string(),
                modules: std::iter::once(&p.name)
                    .chain(&p.aliases)
                    .map(|n| n.rsplit_once('.').map(|x| x.0).unwrap_or("").to_string())
                    .collect(),
            })
        })
        .collect();
    plan.model_hash = model_hash();
    let opt_text = serde_json::to_string(opts).unwrap_or_default();
    plan.plan_hash = hex(&Sha256::digest(format!("{FORMAT_VERSION}\n{}\n{opt_text}\n{}", plan.model_hash, attn.name()).as_bytes()));
    Ok(plan)
}
